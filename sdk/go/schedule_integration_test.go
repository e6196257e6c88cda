package asyncd_test

// Schedules (/v1/schedules) against the real `asyncd dev` of integration_test.go: the
// job go-sched-job, whose spec.cron entry "nightly" is a read-only schedule.

import (
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"testing"
	"time"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

const schedJob = "go-sched-job"

// waitSchedule polls the schedule until ok holds, failing with its last seen shape.
func (e *devEnv) waitSchedule(t *testing.T, name string, timeout time.Duration, ok func(*asyncd.Schedule) bool) *asyncd.Schedule {
	t.Helper()
	var last *asyncd.Schedule
	var lastErr error
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		last, lastErr = e.client.GetSchedule(ctx(t), schedJob, name)
		if lastErr == nil && ok(last) {
			return last
		}
	}
	t.Fatalf("schedule %s not as wanted within %v: last %+v, err %v\nasyncd log:\n%s", name, timeout, last, lastErr, e.logTail())
	return nil
}

// A schedule every second fires: its task, with the payload's templates rendered, runs
// on the executor. Deleted, it is gone; the task it created stays.
func TestIntegrationScheduleFires(t *testing.T) {
	e := itEnv(t)
	c := e.client
	name := uniq("every-second")
	s, err := c.CreateSchedule(ctx(t), schedJob, name, asyncd.ScheduleSpec{
		Every:   time.Second,
		Payload: map[string]any{"customer": 42, "at": "{{scheduled_at}}", "schedule": "{{schedule}}"},
		// Each firing created when due, none while the previous one runs.
		Overlap: asyncd.OverlapSkip,
	})
	if err != nil {
		t.Fatal(err)
	}
	if s.Job != schedJob || s.Name != name || s.Type != "go_sched" || s.Source != asyncd.ScheduleSourceAPI ||
		s.Every != time.Second || s.Overlap != asyncd.OverlapSkip || s.Paused || s.CreatedAt.IsZero() {
		t.Fatalf("created %+v", s)
	}
	fired := e.waitSchedule(t, name, 30*time.Second, func(s *asyncd.Schedule) bool { return s.Fired >= 1 && s.LastTaskID != "" })
	if fired.LastFiring == nil {
		t.Fatalf("fired without a last firing: %+v", fired)
	}
	task, err := c.Get(ctx(t), fired.LastTaskID)
	if err != nil {
		t.Fatal(err)
	}
	var payload struct {
		Customer int    `json:"customer"`
		At       string `json:"at"`
		Schedule string `json:"schedule"`
	}
	if err := json.Unmarshal(task.Payload, &payload); err != nil || task.Type != "go_sched" || payload.Customer != 42 || payload.Schedule != name {
		t.Fatalf("the firing's task: %+v (%v)", task, err)
	}
	if at, err := time.Parse(time.RFC3339Nano, payload.At); err != nil || !strings.HasSuffix(payload.At, "Z") {
		t.Fatalf("{{scheduled_at}} rendered as %q (%v, %v)", payload.At, at, err)
	}
	e.waitState(t, task.ID, asyncd.StateSucceeded, 20*time.Second)

	if err := c.DeleteSchedule(ctx(t), schedJob, name); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetSchedule(ctx(t), schedJob, name)
	wantAPIError(t, err, asyncd.ErrNotFound, 404, "name")
	wantAPIError(t, c.DeleteSchedule(ctx(t), schedJob, name), asyncd.ErrNotFound, 404, "name")
	if _, err := c.Get(ctx(t), task.ID); err != nil {
		t.Fatalf("the deleted schedule's task: %v", err)
	}
}

// Put, create, change, pause, resume, trigger and the refusals, on one schedule.
func TestIntegrationScheduleLifecycle(t *testing.T) {
	e := itEnv(t)
	c := e.client
	name := uniq("customer")
	// Hourly from a start in the future, so that nothing fires during the test.
	start := time.Now().Add(24 * time.Hour).Truncate(time.Second)
	spec := asyncd.ScheduleSpec{Every: time.Hour, StartAt: &start, Payload: map[string]any{"customer": 7},
		Priority: 2, CatchUp: asyncd.CatchUpFor(0), Jitter: 90 * time.Second}
	s, created, err := c.PutSchedule(ctx(t), schedJob, name, spec)
	if err != nil || !created {
		t.Fatalf("first put: created %v, %v", created, err)
	}
	if s.Priority != 2 || s.CatchUp == nil || *s.CatchUp != 0 || s.Jitter != 90*time.Second || s.StartAt == nil ||
		!s.StartAt.Equal(start) || s.EndAt != nil || s.NextFiring == nil || s.NextFiring.Before(start) {
		t.Fatalf("put %+v", s)
	}
	spec.Priority = 4
	s, created, err = c.PutSchedule(ctx(t), schedJob, name, spec)
	if err != nil || created || s.Priority != 4 {
		t.Fatalf("second put: %+v, created %v, %v", s, created, err)
	}

	_, err = c.CreateSchedule(ctx(t), schedJob, name, spec)
	if apiErr := wantAPIError(t, err, asyncd.ErrScheduleExists, 409, "name"); asyncd.IsRetryable(apiErr) {
		t.Fatalf("schedule_exists is retryable: %v", apiErr)
	}

	s, err = c.ChangeSchedule(ctx(t), schedJob, name, asyncd.SchedulePatch{"priority": 6, "jitter": nil})
	if err != nil || s.Priority != 6 || s.Jitter != 0 || s.Every != time.Hour {
		t.Fatalf("change: %+v, %v", s, err)
	}
	if got, err := c.GetSchedule(ctx(t), schedJob, name); err != nil || got.Priority != 6 || got.Jitter != 0 {
		t.Fatalf("after the change: %+v, %v", got, err)
	}
	// cron replaces every.
	s, err = c.ChangeSchedule(ctx(t), schedJob, name, asyncd.SchedulePatch{"cron": "CRON_TZ=Europe/Berlin 0 9 * * MON"})
	if err != nil || s.Cron != "CRON_TZ=Europe/Berlin 0 9 * * MON" || s.Every != 0 {
		t.Fatalf("cron change: %+v, %v", s, err)
	}

	s, err = c.PauseSchedule(ctx(t), schedJob, name)
	if err != nil || !s.Paused || s.NextFiring != nil {
		t.Fatalf("pause: %+v, %v", s, err)
	}
	if got, err := c.GetSchedule(ctx(t), schedJob, name); err != nil || !got.Paused || got.NextFiring != nil {
		t.Fatalf("paused: %+v, %v", got, err)
	}
	s, err = c.ResumeSchedule(ctx(t), schedJob, name)
	if err != nil || s.Paused || s.NextFiring == nil {
		t.Fatalf("resume: %+v, %v", s, err)
	}

	before := time.Now()
	fired, err := c.TriggerSchedule(ctx(t), schedJob, name)
	if err != nil {
		t.Fatal(err)
	}
	if fired.ID == "" || fired.Job != schedJob || fired.Entry != name || fired.Type != "go_sched" ||
		fired.ETA.Before(before.Add(-time.Second)) || fired.ETA.After(time.Now().Add(time.Second)) {
		t.Fatalf("trigger = %+v", fired)
	}
	task, err := c.Get(ctx(t), fired.ID)
	if err != nil || task.Type != "go_sched" || task.Priority != 6 {
		t.Fatalf("the triggered task: %+v, %v", task, err)
	}
	e.waitState(t, fired.ID, asyncd.StateSucceeded, 20*time.Second)
	if runs := e.rec.get(fired.ID); len(runs) != 1 || runs[0].payload != `{"customer":7}` {
		t.Fatalf("runs of the triggered task: %+v", runs)
	}

	// A bad spec is refused naming the member; nothing is created.
	bad := uniq("bad")
	_, err = c.CreateSchedule(ctx(t), schedJob, bad, asyncd.ScheduleSpec{Cron: "0 9 * * MON"})
	wantAPIError(t, err, asyncd.ErrInvalidField, 400, "cron")
	_, _, err = c.PutSchedule(ctx(t), schedJob, bad, asyncd.ScheduleSpec{Every: 500 * time.Millisecond})
	wantAPIError(t, err, asyncd.ErrInvalidField, 400, "every")
	_, err = c.ChangeSchedule(ctx(t), schedJob, name, asyncd.SchedulePatch{"no_such_member": 1})
	wantAPIError(t, err, asyncd.ErrMalformedJSON, 400, "no_such_member")
	_, err = c.GetSchedule(ctx(t), schedJob, bad)
	wantAPIError(t, err, asyncd.ErrNotFound, 404, "name")
	_, err = c.CreateSchedule(ctx(t), "no-such-job", bad, asyncd.ScheduleSpec{Every: time.Hour})
	wantAPIError(t, err, asyncd.ErrNotFound, 404, "job")

	if err := c.DeleteSchedule(ctx(t), schedJob, name); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetSchedule(ctx(t), schedJob, name)
	wantAPIError(t, err, asyncd.ErrNotFound, 404, "name")
}

// Pages of one schedule each, followed by their cursors, list every schedule of the
// job once — the config's entry among them — as one page and WalkSchedules do.
func TestIntegrationListSchedules(t *testing.T) {
	e := itEnv(t)
	c := e.client
	prefix := uniq("list")
	mine := []string{prefix + "-a", prefix + "-b", prefix + "-c"}
	for _, name := range mine {
		if _, err := c.CreateSchedule(ctx(t), schedJob, name, asyncd.ScheduleSpec{Every: time.Hour, Paused: true}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, name := range mine {
			_ = c.DeleteSchedule(ctx(t), schedJob, name)
		}
	})

	var paged []string
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 1000 {
			t.Fatalf("no last page after %d pages: %v", pages, paged)
		}
		page, err := c.ListSchedules(ctx(t), schedJob, cursor, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Items) > 1 {
			t.Fatalf("a page of limit 1 has %d items", len(page.Items))
		}
		for _, s := range page.Items {
			if s.Job != schedJob {
				t.Fatalf("another job's schedule: %+v", s)
			}
			paged = append(paged, s.Name)
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	if !sort.StringsAreSorted(paged) {
		t.Fatalf("pages not by name: %v", paged)
	}
	seen := map[string]int{}
	for _, n := range paged {
		seen[n]++
		if seen[n] > 1 {
			t.Fatalf("%s listed twice: %v", n, paged)
		}
	}
	for _, n := range append([]string{"nightly"}, mine...) {
		if seen[n] != 1 {
			t.Fatalf("%s not listed: %v", n, paged)
		}
	}

	whole, err := c.ListSchedules(ctx(t), schedJob, "", asyncd.MaxSchedulePage)
	if err != nil || whole.NextCursor != "" {
		t.Fatalf("one page: %+v, %v", whole, err)
	}
	var walked []string
	if err := c.WalkSchedules(ctx(t), schedJob, func(s *asyncd.Schedule) error {
		walked = append(walked, s.Name)
		if s.Name == "nightly" && s.Source != asyncd.ScheduleSourceConfig {
			t.Errorf("the config entry's source is %q", s.Source)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var all []string
	for _, s := range whole.Items {
		all = append(all, s.Name)
	}
	if strings.Join(all, ",") != strings.Join(paged, ",") || strings.Join(walked, ",") != strings.Join(paged, ",") {
		t.Fatalf("paged %v, one page %v, walked %v", paged, all, walked)
	}
	_, err = c.ListSchedules(ctx(t), schedJob, "", asyncd.MaxSchedulePage+1)
	wantAPIError(t, err, asyncd.ErrInvalidField, 400, "limit")
}

// A backfill creates the firings of a past range once: repeated, it creates none.
func TestIntegrationBackfillSchedule(t *testing.T) {
	e := itEnv(t)
	c := e.client
	name := uniq("backfill")
	// Hourly since a start a month ago (an Every schedule has no firing before its start).
	start := time.Now().UTC().Add(-30 * 24 * time.Hour).Truncate(time.Hour)
	if _, err := c.CreateSchedule(ctx(t), schedJob, name, asyncd.ScheduleSpec{
		Every: time.Hour, StartAt: &start, CatchUp: asyncd.CatchUpFor(0), Payload: map[string]any{"at": "{{scheduled_at}}"},
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeleteSchedule(ctx(t), schedJob, name) })
	from := start.Add(24 * time.Hour)
	to := from.Add(5 * time.Hour)
	first, err := c.BackfillSchedule(ctx(t), schedJob, name, from, to)
	if err != nil || first.Firings != 5 || first.Created != first.Firings {
		t.Fatalf("first backfill: %+v, %v", first, err)
	}
	again, err := c.BackfillSchedule(ctx(t), schedJob, name, from, to)
	if err != nil || again.Firings != 5 || again.Created != 0 {
		t.Fatalf("second backfill: %+v, %v", again, err)
	}
	// One more hour: one new firing.
	more, err := c.BackfillSchedule(ctx(t), schedJob, name, from, to.Add(time.Hour))
	if err != nil || more.Firings != 6 || more.Created != 1 {
		t.Fatalf("a longer backfill: %+v, %v", more, err)
	}
	_, err = c.BackfillSchedule(ctx(t), schedJob, name, to, from)
	wantAPIError(t, err, asyncd.ErrInvalidField, 400, "to")
	_, err = c.BackfillSchedule(ctx(t), schedJob, name, start, start.Add((asyncd.MaxBackfill+1)*time.Hour))
	wantAPIError(t, err, asyncd.ErrInvalidField, 400, "to")
}

// The job's spec.cron entry is a schedule of source config: read-only here, but it can
// be triggered and backfilled.
func TestIntegrationConfigScheduleIsReadOnly(t *testing.T) {
	e := itEnv(t)
	c := e.client
	s, err := c.GetSchedule(ctx(t), schedJob, "nightly")
	if err != nil {
		t.Fatal(err)
	}
	if s.Source != asyncd.ScheduleSourceConfig || s.Cron != "CRON_TZ=UTC 0 0 1 1 *" || s.Type != "go_sched" {
		t.Fatalf("the config entry: %+v", s)
	}
	for what, call := range map[string]func() error{
		"change": func() error {
			_, err := c.ChangeSchedule(ctx(t), schedJob, "nightly", asyncd.SchedulePatch{"priority": 5})
			return err
		},
		"pause":  func() error { _, err := c.PauseSchedule(ctx(t), schedJob, "nightly"); return err },
		"resume": func() error { _, err := c.ResumeSchedule(ctx(t), schedJob, "nightly"); return err },
		"delete": func() error { return c.DeleteSchedule(ctx(t), schedJob, "nightly") },
		"put": func() error {
			_, _, err := c.PutSchedule(ctx(t), schedJob, "nightly", asyncd.ScheduleSpec{Every: time.Hour})
			return err
		},
	} {
		err := call()
		var apiErr *asyncd.APIError
		if !errors.Is(err, asyncd.ErrScheduleReadOnly) || !errors.As(err, &apiErr) || apiErr.Status != 409 || asyncd.IsRetryable(err) {
			t.Errorf("%s of the config entry: %v", what, err)
		}
	}
	// Creating its name is schedule_exists.
	_, err = c.CreateSchedule(ctx(t), schedJob, "nightly", asyncd.ScheduleSpec{Every: time.Hour})
	wantAPIError(t, err, asyncd.ErrScheduleExists, 409, "name")

	fired, err := c.TriggerSchedule(ctx(t), schedJob, "nightly")
	if err != nil || fired.Entry != "nightly" || fired.Type != "go_sched" {
		t.Fatalf("trigger of the config entry: %+v, %v", fired, err)
	}
	e.waitState(t, fired.ID, asyncd.StateSucceeded, 20*time.Second)
	if runs := e.rec.get(fired.ID); len(runs) != 1 || runs[0].payload != `{"report":"annual"}` {
		t.Fatalf("runs of the triggered entry: %+v", runs)
	}
	// Two new years in [2020, 2022); a repeat creates none.
	from, to := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2022, 1, 1, 0, 0, 0, 0, time.UTC)
	if res, err := c.BackfillSchedule(ctx(t), schedJob, "nightly", from, to); err != nil || res.Firings != 2 {
		t.Fatalf("backfill of the config entry: %+v, %v", res, err)
	}
	if res, err := c.BackfillSchedule(ctx(t), schedJob, "nightly", from, to); err != nil || res.Firings != 2 || res.Created != 0 {
		t.Fatalf("a repeated backfill of the config entry: %+v, %v", res, err)
	}
	if after, err := c.GetSchedule(ctx(t), schedJob, "nightly"); err != nil || after.Priority != s.Priority || after.Paused {
		t.Fatalf("the config entry after the refusals: %+v, %v", after, err)
	}
}

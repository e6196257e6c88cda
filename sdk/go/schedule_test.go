package asyncd_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

const scheduleAnswer = `{"job":"send-email","name":"weekly-42","type":"email","source":"api",
 "every":"15m","payload":{"customer":42},"priority":3,"overlap":"Skip","catch_up":"0s","jitter":"1m 30s",
 "start_at":"2026-11-30T07:45:00.000Z","end_at":"2027-01-01T00:00:00.000Z","paused":false,
 "next_firing":"2026-11-30T08:00:00.123Z","last_firing":null,"last_task_id":null,"buffered_firing":null,
 "fired":0,"created_at":"2026-11-29T07:45:00.000Z","updated_at":"2026-11-29T07:45:00.000Z"}`

func TestCreateScheduleSendsTheSpecAndDecodesTheSchedule(t *testing.T) {
	f, c := newFake(t, 201, scheduleAnswer)
	loc := time.FixedZone("x", 8*3600)
	start := time.Date(2026, 11, 30, 15, 45, 0, 0, loc)
	end := time.Date(2027, 1, 1, 8, 0, 0, 500e6, loc)
	s, err := c.CreateSchedule(context.Background(), "send-email", "weekly-42", asyncd.ScheduleSpec{
		Every: 15 * time.Minute, Payload: map[string]any{"customer": 42}, Priority: 3, Overlap: asyncd.OverlapSkip,
		CatchUp: asyncd.CatchUpFor(0), StartAt: &start, EndAt: &end, Jitter: 90 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	r := f.last(t)
	if r.method != "POST" || r.path != "/v1/schedules" || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("%s %s (%s)", r.method, r.path, r.header.Get("Content-Type"))
	}
	want := map[string]any{
		"job": "send-email", "name": "weekly-42", "every": "15m", "payload": map[string]any{"customer": 42.0},
		"priority": 3.0, "overlap": "Skip", "catch_up": "0s", "start_at": "2026-11-30T07:45:00.000Z",
		"end_at": "2027-01-01T00:00:00.500Z", "jitter": "1m 30s", "paused": false,
	}
	if !reflect.DeepEqual(r.body, want) {
		t.Fatalf("body = %v\nwant %v", r.body, want)
	}
	if s.Job != "send-email" || s.Name != "weekly-42" || s.Type != "email" || s.Source != asyncd.ScheduleSourceAPI ||
		s.Every != 15*time.Minute || s.Cron != "" || s.Priority != 3 || s.Overlap != asyncd.OverlapSkip ||
		s.CatchUp == nil || *s.CatchUp != 0 || s.Jitter != 90*time.Second || !s.StartAt.Equal(start) ||
		s.EndAt == nil || s.NextFiring == nil || s.LastFiring != nil || s.LastTaskID != "" || s.Fired != 0 {
		t.Fatalf("schedule = %+v", s)
	}
	if p, ok := s.Payload.(json.RawMessage); !ok || string(p) != `{"customer":42}` {
		t.Fatalf("payload = %#v", s.Payload)
	}

	// A bare spec sends only what it sets (and the members the API always reads).
	if _, err := c.CreateSchedule(context.Background(), "j", "n", asyncd.ScheduleSpec{Cron: "CRON_TZ=UTC 0 * * * *"}); err != nil {
		t.Fatal(err)
	}
	want = map[string]any{"job": "j", "name": "n", "cron": "CRON_TZ=UTC 0 * * * *", "payload": nil, "priority": 0.0, "paused": false}
	if b := f.last(t).body; !reflect.DeepEqual(b, want) {
		t.Fatalf("body = %v\nwant %v", b, want)
	}
}

// The path's segments are escaped; PUT sends the spec alone and says whether it
// created the schedule.
func TestPutScheduleEscapesThePathAndReportsCreated(t *testing.T) {
	f, c := newFake(t, 201, scheduleAnswer)
	s, created, err := c.PutSchedule(context.Background(), "send email", "customer/42 ü", asyncd.ScheduleSpec{Every: time.Hour, Paused: true})
	if err != nil || !created || s.Name != "weekly-42" {
		t.Fatalf("put = %+v, %v, %v", s, created, err)
	}
	r := f.last(t)
	if r.method != "PUT" || r.rawPath != "/v1/schedules/send%20email/customer%2F42%20%C3%BC" {
		t.Fatalf("%s %s", r.method, r.rawPath)
	}
	if want := map[string]any{"every": "1h", "payload": nil, "priority": 0.0, "paused": true}; !reflect.DeepEqual(r.body, want) {
		t.Fatalf("body = %v, want %v", r.body, want)
	}
	f.status = 200
	if _, created, err := c.PutSchedule(context.Background(), "j", "n", asyncd.ScheduleSpec{Every: time.Hour}); err != nil || created {
		t.Fatalf("a 200 put: created %v, %v", created, err)
	}
}

// Under WithRetry the created flag is the answer's to the attempt that went through.
func TestPutScheduleCreatedUnderRetry(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if calls.Add(1) == 1 {
			w.WriteHeader(503)
			fmt.Fprint(w, `{"error":{"code":"store_unavailable","message":"m"}}`)
			return
		}
		w.WriteHeader(201)
		fmt.Fprint(w, scheduleAnswer)
	}))
	t.Cleanup(srv.Close)
	c := asyncd.NewClient(asyncd.WithEndpoint(srv.URL), asyncd.WithRetry(asyncd.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond, MaxBackoff: time.Millisecond}))
	_, created, err := c.PutSchedule(context.Background(), "j", "n", asyncd.ScheduleSpec{Every: time.Hour})
	if err != nil || !created || calls.Load() != 2 {
		t.Fatalf("created %v, err %v, %d calls", created, err, calls.Load())
	}
}

func TestScheduleCallsSendTheirMethodAndPath(t *testing.T) {
	f, c := newFake(t, 200, scheduleAnswer)
	ctx := context.Background()
	for _, tc := range []struct {
		call         func() error
		method, path string
	}{
		{func() error { _, err := c.GetSchedule(ctx, "a/b", "c"); return err }, "GET", "/v1/schedules/a%2Fb/c"},
		{func() error { _, err := c.PauseSchedule(ctx, "j", "n:1@x"); return err }, "POST", "/v1/schedules/j/n:1@x/pause"},
		{func() error { _, err := c.ResumeSchedule(ctx, "j", "n"); return err }, "POST", "/v1/schedules/j/n/resume"},
		{func() error {
			_, err := c.ChangeSchedule(ctx, "j", "n?", asyncd.SchedulePatch{"priority": 1})
			return err
		}, "PATCH", "/v1/schedules/j/n%3F"},
	} {
		if err := tc.call(); err != nil {
			t.Fatal(err)
		}
		if r := f.last(t); r.method != tc.method || r.rawPath != tc.path || r.query != "" {
			t.Errorf("%s %s?%s, want %s %s", r.method, r.rawPath, r.query, tc.method, tc.path)
		}
	}
	// A call without a body sends no Content-Type.
	if _, err := c.PauseSchedule(ctx, "j", "n"); err != nil || f.last(t).body != nil || f.last(t).header.Get("Content-Type") != "" {
		t.Fatalf("pause sent %v (%v)", f.last(t).body, err)
	}

	f.status, f.body = 204, ""
	if err := c.DeleteSchedule(ctx, "j", "n 1"); err != nil {
		t.Fatal(err)
	}
	if r := f.last(t); r.method != "DELETE" || r.rawPath != "/v1/schedules/j/n%201" {
		t.Fatalf("%s %s", r.method, r.rawPath)
	}

	f.status, f.body = 201, `{"id":"0193a","job":"j","entry":"n","type":"t","eta":"2026-11-30T08:00:00.123Z"}`
	fired, err := c.TriggerSchedule(ctx, "j", "n")
	if err != nil {
		t.Fatal(err)
	}
	if r := f.last(t); r.method != "POST" || r.rawPath != "/v1/schedules/j/n/trigger" {
		t.Fatalf("%s %s", r.method, r.rawPath)
	}
	if *fired != (asyncd.CronTrigger{ID: "0193a", Job: "j", Entry: "n", Type: "t", ETA: time.Date(2026, 11, 30, 8, 0, 0, 123e6, time.UTC)}) {
		t.Fatalf("trigger = %+v", fired)
	}

	f.status, f.body = 200, `{"firings":7,"created":6}`
	loc := time.FixedZone("x", -5*3600)
	res, err := c.BackfillSchedule(ctx, "j", "n", time.Date(2026, 11, 23, 2, 45, 0, 0, loc), time.Date(2026, 11, 30, 2, 45, 0, 1e6, loc))
	if err != nil || *res != (asyncd.BackfillResult{Firings: 7, Created: 6}) {
		t.Fatalf("backfill = %+v, %v", res, err)
	}
	r := f.last(t)
	want := map[string]any{"from": "2026-11-23T07:45:00.000Z", "to": "2026-11-30T07:45:00.001Z"}
	if r.method != "POST" || r.rawPath != "/v1/schedules/j/n/backfill" || !reflect.DeepEqual(r.body, want) {
		t.Fatalf("%s %s %v", r.method, r.rawPath, r.body)
	}
}

// A patch sends the members it gives, durations and times as the API reads them, nil
// as null; an empty one is refused before anything is sent.
func TestChangeScheduleSendsThePatch(t *testing.T) {
	f, c := newFake(t, 200, scheduleAnswer)
	var noEnd *time.Time
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.FixedZone("x", 3600))
	_, err := c.ChangeSchedule(context.Background(), "j", "n", asyncd.SchedulePatch{
		"every": 15 * time.Minute, "catch_up": asyncd.CatchUpFor(0), "jitter": nil, "end_at": noEnd,
		"start_at": at, "priority": 5, "overlap": asyncd.OverlapCancelOther, "payload": json.RawMessage(`{"a":[1]}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"every": "15m", "catch_up": "0s", "jitter": nil, "end_at": nil, "start_at": "2026-12-01T08:00:00.000Z",
		"priority": 5.0, "overlap": "CancelOther", "payload": map[string]any{"a": []any{1.0}},
	}
	if r := f.last(t); r.method != "PATCH" || !reflect.DeepEqual(r.body, want) {
		t.Fatalf("%s %v\nwant %v", r.method, r.body, want)
	}
	n := len(f.reqs)
	if _, err := c.ChangeSchedule(context.Background(), "j", "n", nil); err == nil {
		t.Fatal("an empty patch was accepted")
	}
	if _, err := c.ChangeSchedule(context.Background(), "j", "n", asyncd.SchedulePatch{"payload": json.RawMessage(`{`)}); err == nil {
		t.Fatal("a patch with bad raw JSON was accepted")
	}
	if len(f.reqs) != n {
		t.Fatalf("%d requests sent for refused patches", len(f.reqs)-n)
	}
}

// ListSchedules sends job, cursor and limit; WalkSchedules follows the cursors to the
// last page and stops at fn's error.
func TestListAndWalkSchedules(t *testing.T) {
	names := []string{"a", "b", "c", "d", "e"}
	var mu sync.Mutex
	var queries []url.Values
	sent := func() []url.Values {
		mu.Lock()
		defer mu.Unlock()
		return append([]url.Values(nil), queries...)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		mu.Lock()
		queries = append(queries, q)
		mu.Unlock()
		limit, _ := strconv.Atoi(q.Get("limit"))
		if limit == 0 {
			limit = 100
		}
		limit = min(limit, 2) // a server answering in pages of at most two
		var page asyncd.SchedulePage
		for _, n := range names {
			if n > q.Get("cursor") && len(page.Items) < limit {
				page.Items = append(page.Items, asyncd.Schedule{Job: q.Get("job"), Name: n})
			}
		}
		if len(page.Items) == limit {
			page.NextCursor = page.Items[len(page.Items)-1].Name
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(page)
	}))
	t.Cleanup(srv.Close)
	c := asyncd.NewClient(asyncd.WithEndpoint(srv.URL))
	ctx := context.Background()

	page, err := c.ListSchedules(ctx, "my job", "", 0)
	if err != nil || len(page.Items) != 2 || page.NextCursor != "b" || page.Items[0].Job != "my job" {
		t.Fatalf("first page %+v, %v", page, err)
	}
	if q := sent()[0]; !reflect.DeepEqual(q, url.Values{"job": {"my job"}}) {
		t.Fatalf("query %v", q)
	}
	if _, err := c.ListSchedules(ctx, "j", "b", 2); err != nil {
		t.Fatal(err)
	}
	if q := sent()[1]; !reflect.DeepEqual(q, url.Values{"job": {"j"}, "cursor": {"b"}, "limit": {"2"}}) {
		t.Fatalf("query %v", q)
	}

	mu.Lock()
	queries = nil
	mu.Unlock()
	var seen []string
	err = c.WalkSchedules(ctx, "j", func(s *asyncd.Schedule) error {
		seen = append(seen, s.Name)
		return nil
	})
	if err != nil || !reflect.DeepEqual(seen, names) {
		t.Fatalf("walked %v, %v", seen, err)
	}
	if q := sent(); len(q) != 3 || q[0].Get("limit") != strconv.Itoa(asyncd.MaxSchedulePage) || q[2].Get("cursor") != "d" {
		t.Fatalf("walk queries %v", q)
	}
	stop := errors.New("enough")
	seen = nil
	err = c.WalkSchedules(ctx, "j", func(s *asyncd.Schedule) error {
		seen = append(seen, s.Name)
		if s.Name == "c" {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || !reflect.DeepEqual(seen, []string{"a", "b", "c"}) {
		t.Fatalf("walk stopped with %v after %v", err, seen)
	}
}

func TestScheduleErrorsMatchTheirSentinels(t *testing.T) {
	ctx := context.Background()
	f, c := newFake(t, 409, `{"error":{"code":"schedule_exists","message":"name: job j already has a schedule named n","field":"name"}}`)
	_, err := c.CreateSchedule(ctx, "j", "n", asyncd.ScheduleSpec{Every: time.Hour})
	var apiErr *asyncd.APIError
	if !errors.Is(err, asyncd.ErrScheduleExists) || !errors.As(err, &apiErr) || apiErr.Status != 409 || apiErr.Field != "name" ||
		asyncd.IsRetryable(err) || errors.Is(err, asyncd.ErrScheduleReadOnly) {
		t.Fatalf("err = %v", err)
	}
	f.body = `{"error":{"code":"schedule_read_only","message":"schedule nightly of job j is its config's spec.cron entry: change the config"}}`
	for _, call := range []func() error{
		func() error {
			_, err := c.ChangeSchedule(ctx, "j", "nightly", asyncd.SchedulePatch{"paused": true})
			return err
		},
		func() error { _, err := c.PauseSchedule(ctx, "j", "nightly"); return err },
		func() error { return c.DeleteSchedule(ctx, "j", "nightly") },
		func() error {
			_, _, err := c.PutSchedule(ctx, "j", "nightly", asyncd.ScheduleSpec{Every: time.Hour})
			return err
		},
	} {
		if err := call(); !errors.Is(err, asyncd.ErrScheduleReadOnly) || asyncd.IsRetryable(err) {
			t.Errorf("err = %v", err)
		}
	}
	f.status, f.body = 404, `{"error":{"code":"not_found","message":"job j has no schedule \"x\"","field":"name"}}`
	if _, err := c.GetSchedule(ctx, "j", "x"); !errors.Is(err, asyncd.ErrNotFound) || !errors.As(err, &apiErr) || apiErr.Field != "name" {
		t.Fatalf("err = %v", err)
	}
	f.status, f.body = 400, `{"error":{"code":"invalid_field","message":"cron: must start with CRON_TZ=","field":"cron"}}`
	if _, err := c.CreateSchedule(ctx, "j", "n", asyncd.ScheduleSpec{Cron: "0 9 * * *"}); !errors.Is(err, asyncd.ErrInvalidField) ||
		!errors.As(err, &apiErr) || apiErr.Field != "cron" {
		t.Fatalf("err = %v", err)
	}
	// An answer whose durations do not read is an error, not a zero value.
	f.status, f.body = 200, `{"job":"j","name":"n","every":"1 fortnight","fired":0}`
	if _, err := c.GetSchedule(ctx, "j", "n"); err == nil {
		t.Fatal("an unreadable every decoded")
	}
}

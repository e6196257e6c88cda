package asyncd_test

// Debounce and throttle against a real `asyncd dev` (see integration_test.go).

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

// tasksOf returns the tasks of taskType created after since, newest first.
func tasksOf(t *testing.T, e *devEnv, taskType string, since time.Time) []asyncd.TaskStatus {
	t.Helper()
	page, err := e.client.SearchTasks(ctx(t), asyncd.SearchFilter{Type: taskType, CreatedAfter: since, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if page.NextCursor != "" {
		t.Fatalf("more than 1000 %s tasks since %v", taskType, since)
	}
	return page.Items
}

// wantNoTaskWithKey fails if a task of taskType holds idempotency key: a submit that was
// held back or refused stored nothing.
func wantNoTaskWithKey(t *testing.T, e *devEnv, taskType, key string) {
	t.Helper()
	for _, it := range tasksOf(t, e, taskType, time.Time{}) {
		if it.IdempotencyKey == key {
			t.Fatalf("a task was stored for the submit with key %s: %+v", key, it)
		}
	}
}

// wantETANear checks a due time the server set to its clock at the submit plus d: the
// submit happened between before and after on this machine's clock, and the API keeps
// milliseconds.
func wantETANear(t *testing.T, what string, eta, before, after time.Time, d time.Duration) {
	t.Helper()
	lo, hi := before.Truncate(time.Millisecond).Add(d), after.Add(d)
	if eta.Before(lo) || eta.After(hi) {
		t.Fatalf("%s: eta %v, want between %v and %v", what, eta, lo, hi)
	}
}

func payloadOf(t *testing.T, raw string) map[string]any {
	t.Helper()
	var p map[string]any
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		t.Fatalf("payload %s: %v", raw, err)
	}
	return p
}

// Trailing debounce, end to end. With the job paused nothing can begin, so every
// submit of the key lands while its task waits: the first stores the task (not
// debounced), the next two are folded into it (Debounced, the same id, the due time
// moved to the period after each), and the task holds the last payload. Once the job
// resumes the executor runs that one task exactly once, with the last payload; no
// other task was stored for the three submits.
func TestIntegrationDebounceTrailing(t *testing.T) {
	e := itEnv(t)
	const job = "go-debounce-job"
	if st, err := e.client.PauseJob(ctx(t), job); err != nil || !st.Paused {
		t.Fatalf("pause %s = %+v, %v", job, st, err)
	}
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			_, _ = e.client.ResumeJob(context.Background(), job)
		}
	})

	since := time.Now().Add(-time.Millisecond)
	const period = 500 * time.Millisecond
	debounce := &asyncd.Debounce{Key: uniq("user"), Period: period, MaxDelay: time.Minute}
	payloads := []map[string]any{
		{"user_id": 7, "edit": "first"},
		{"user_id": 7, "edit": "second"},
		{"user_id": 7, "edit": "third"},
	}
	var results []*asyncd.SubmitResult
	for i, p := range payloads {
		before := time.Now()
		res := submit(t, e, &asyncd.Task{Type: "go_debounce", Payload: p, Debounce: debounce})
		wantETANear(t, "submit "+p["edit"].(string), res.ETA, before, time.Now(), period)
		if res.Dropped || res.Duplicate || res.Debounced != (i > 0) {
			t.Fatalf("submit %d = %+v, want debounced %v", i, res, i > 0)
		}
		results = append(results, res)
	}
	first, last := results[0], results[len(results)-1]
	for _, r := range results[1:] {
		if r.ID != first.ID {
			t.Fatalf("a debounced submit answered task %s, the key's waiting task is %s", r.ID, first.ID)
		}
	}

	// Still waiting: one task for the three submits, carrying the last payload, due when
	// the last answer said.
	got, err := e.client.Get(ctx(t), first.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != asyncd.StatePending && got.State != asyncd.StateClaimed {
		t.Fatalf("the waiting task is %s while its job is paused", got.State)
	}
	if p := payloadOf(t, string(got.Payload)); !reflect.DeepEqual(p, map[string]any{"user_id": 7.0, "edit": "third"}) ||
		!got.ETA.Equal(last.ETA) {
		t.Fatalf("the waiting task = %+v (payload %s), want the last payload, due %v", got, got.Payload, last.ETA)
	}
	if items := tasksOf(t, e, "go_debounce", since); len(items) != 1 || items[0].ID != first.ID {
		t.Fatalf("tasks stored for the three submits: %+v", items)
	}

	if _, err := e.client.ResumeJob(ctx(t), job); err != nil {
		t.Fatal(err)
	}
	resumed = true
	done := e.waitState(t, first.ID, asyncd.StateSucceeded, 20*time.Second)
	if done.Attempt != 1 {
		t.Fatalf("the debounced task succeeded after %d attempts", done.Attempt)
	}
	runs := e.rec.get(first.ID)
	if len(runs) != 1 {
		t.Fatalf("the executor ran the debounced task %d times: %+v", len(runs), runs)
	}
	if p := payloadOf(t, runs[0].payload); p["edit"] != "third" {
		t.Fatalf("the executor got %s, want the last payload", runs[0].payload)
	}
	if items := tasksOf(t, e, "go_debounce", since); len(items) != 1 {
		t.Fatalf("tasks stored for the three submits after the run: %+v", items)
	}
}

// Leading debounce: the first submit of a key is stored and runs as submitted; one
// within the period of it stores nothing and answers Dropped with the stored task's id
// and the end of the quiet period it extended.
func TestIntegrationDebounceLeading(t *testing.T) {
	e := itEnv(t)
	debounce := &asyncd.Debounce{Key: uniq("user"), Period: time.Minute, Mode: asyncd.DebounceLeading}
	first := submit(t, e, &asyncd.Task{Type: "go_window", Payload: "leading-first", Debounce: debounce})
	if first.Dropped || first.Debounced {
		t.Fatalf("the first submit = %+v, want it stored", first)
	}
	key := uniq("k")
	before := time.Now()
	again := submit(t, e, &asyncd.Task{Type: "go_window", Payload: "leading-second", IdempotencyKey: key, Debounce: debounce})
	if !again.Dropped || again.Debounced || again.Duplicate || again.ID != first.ID {
		t.Fatalf("the second submit = %+v, want dropped naming %s", again, first.ID)
	}
	wantETANear(t, "the dropped submit", again.ETA, before, time.Now(), time.Minute)
	wantNoTaskWithKey(t, e, "go_window", key)
	e.waitState(t, first.ID, asyncd.StateSucceeded, 20*time.Second)
	if runs := e.rec.get(first.ID); len(runs) != 1 || runs[0].payload != `"leading-first"` {
		t.Fatalf("the executor saw %+v, want the first payload once", runs)
	}
}

// Throttle: within the period of the key's stored task, a submit with OnLimitRefuse is
// an error matching ErrThrottled (409, field throttle) whose ExistingID is that task;
// with OnLimitDrop it answers Dropped with that task's id and the window's end. Neither
// stores anything; the stored tasks run with their own payloads.
func TestIntegrationThrottle(t *testing.T) {
	e := itEnv(t)

	refuse := &asyncd.Throttle{Key: uniq("user"), Period: time.Minute}
	first := submit(t, e, &asyncd.Task{Type: "go_window", Payload: "throttle-first", Throttle: refuse})
	if first.Dropped || first.Debounced {
		t.Fatalf("the first submit = %+v, want it stored", first)
	}
	key := uniq("k")
	_, err := e.client.Submit(ctx(t), &asyncd.Task{Type: "go_window", Payload: "throttle-second", IdempotencyKey: key, Throttle: refuse})
	apiErr := wantAPIError(t, err, asyncd.ErrThrottled, 409, "throttle")
	if apiErr.ExistingID != first.ID || asyncd.IsRetryable(err) {
		t.Fatalf("throttled: %+v, want existing id %s, not retryable", apiErr, first.ID)
	}
	wantNoTaskWithKey(t, e, "go_window", key)

	drop := &asyncd.Throttle{Key: uniq("user"), Period: time.Minute, OnLimit: asyncd.OnLimitDrop}
	before := time.Now()
	kept := submit(t, e, &asyncd.Task{Type: "go_window", Payload: "throttle-kept", Throttle: drop})
	after := time.Now()
	if kept.Dropped || kept.Debounced {
		t.Fatalf("the first submit = %+v, want it stored", kept)
	}
	key = uniq("k")
	dropped := submit(t, e, &asyncd.Task{Type: "go_window", Payload: "throttle-dropped", IdempotencyKey: key, Throttle: drop})
	if !dropped.Dropped || dropped.Debounced || dropped.Duplicate || dropped.ID != kept.ID {
		t.Fatalf("the second submit = %+v, want dropped naming %s", dropped, kept.ID)
	}
	// A throttle's window is counted from the submit that stored the task.
	wantETANear(t, "the dropped submit", dropped.ETA, before, after, time.Minute)
	wantNoTaskWithKey(t, e, "go_window", key)

	for id, payload := range map[string]string{first.ID: `"throttle-first"`, kept.ID: `"throttle-kept"`} {
		e.waitState(t, id, asyncd.StateSucceeded, 20*time.Second)
		if runs := e.rec.get(id); len(runs) != 1 || runs[0].payload != payload {
			t.Fatalf("task %s: the executor saw %+v, want %s once", id, runs, payload)
		}
	}
}

// A Debounce with a Throttle never reaches the server (whose own refusal would be an
// *APIError naming throttle): nothing is stored under the key. The values are the
// server's to refuse, each naming its field: a trailing debounce with a delay, a
// debounce waiting on another task, a cap below the period.
func TestIntegrationDebounceRefusals(t *testing.T) {
	e := itEnv(t)
	key := uniq("both")
	_, err := e.client.Submit(ctx(t), &asyncd.Task{Type: "go_window", IdempotencyKey: key,
		Debounce: &asyncd.Debounce{Key: "u", Period: time.Second},
		Throttle: &asyncd.Throttle{Key: "u", Period: time.Second}})
	var apiErr *asyncd.APIError
	if err == nil || errors.As(err, &apiErr) {
		t.Fatalf("debounce and throttle: err = %v, want the SDK's refusal before sending", err)
	}
	wantNoTaskWithKey(t, e, "go_window", key)

	trailing := &asyncd.Debounce{Key: uniq("user"), Period: time.Second}
	_, err = e.client.SubmitDelayed(ctx(t), &asyncd.Task{Type: "go_window", IdempotencyKey: uniq("k"), Debounce: trailing}, time.Minute)
	wantAPIError(t, err, asyncd.ErrInvalidField, 400, "delay")
	_, err = e.client.Submit(ctx(t), &asyncd.Task{Type: "go_window", IdempotencyKey: uniq("k"), Debounce: trailing,
		DependsOn: []string{unknownID}})
	wantAPIError(t, err, asyncd.ErrInvalidField, 400, "depends_on")
	_, err = e.client.Submit(ctx(t), &asyncd.Task{Type: "go_window", IdempotencyKey: uniq("k"),
		Debounce: &asyncd.Debounce{Key: uniq("user"), Period: time.Minute, MaxDelay: time.Second}})
	wantAPIError(t, err, asyncd.ErrInvalidField, 400, "debounce.max_delay")
}

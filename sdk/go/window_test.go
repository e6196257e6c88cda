package asyncd_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

// Debounce and Throttle go out as the submit body's "debounce" and "throttle" objects,
// periods in humantime as Delay is, a zero MaxDelay, Mode and OnLimit left out (the
// server's defaults: no cap, trailing, refuse); a task with neither carries neither, alone
// or in a batch.
func TestSubmitSendsDebounceAndThrottle(t *testing.T) {
	f, c := newFake(t, 201, `{"id":"a","eta":"2026-12-01T00:00:00Z","route":"store"}`)
	bg := context.Background()
	cases := []struct {
		name     string
		task     asyncd.Task
		debounce map[string]any
		throttle map[string]any
	}{
		{"trailing", asyncd.Task{Debounce: &asyncd.Debounce{Key: "user:7", Period: 30 * time.Second, MaxDelay: 5 * time.Minute}},
			map[string]any{"key": "user:7", "period": "30s", "max_delay": "5m"}, nil},
		{"trailing, explicit", asyncd.Task{Debounce: &asyncd.Debounce{Key: "user:7", Period: 90 * time.Second, Mode: asyncd.DebounceTrailing}},
			map[string]any{"key": "user:7", "period": "1m 30s", "mode": "trailing"}, nil},
		{"leading", asyncd.Task{Debounce: &asyncd.Debounce{Key: "user:8", Period: 1500 * time.Millisecond, Mode: asyncd.DebounceLeading}},
			map[string]any{"key": "user:8", "period": "1s 500ms", "mode": "leading"}, nil},
		{"throttle", asyncd.Task{Throttle: &asyncd.Throttle{Key: "user:9", Period: time.Minute}},
			nil, map[string]any{"key": "user:9", "period": "1m"}},
		{"throttle, drop", asyncd.Task{Throttle: &asyncd.Throttle{Key: "user:9", Period: time.Hour, OnLimit: asyncd.OnLimitDrop}},
			nil, map[string]any{"key": "user:9", "period": "1h", "on_limit": "drop"}},
		{"neither", asyncd.Task{}, nil, nil},
	}
	for _, tc := range cases {
		task := tc.task
		task.Type, task.IdempotencyKey = "t", "k"
		if _, err := c.Submit(bg, &task); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		b := f.last(t).body
		for field, want := range map[string]map[string]any{"debounce": tc.debounce, "throttle": tc.throttle} {
			got, sent := b[field]
			if want == nil && sent {
				t.Errorf("%s: %s sent though unset: %v", tc.name, field, got)
			}
			if want != nil && !reflect.DeepEqual(got, want) {
				t.Errorf("%s: %s = %v, want %v", tc.name, field, got, want)
			}
		}
	}

	f.body = `{"results":[{"status":201,"id":"a","eta":"2026-12-01T00:00:00Z","route":"store"},` +
		`{"status":201,"id":"b","eta":"2026-12-01T00:00:00Z","route":"store"}]}`
	if _, err := c.SubmitBatch(bg, []*asyncd.Task{
		{Type: "t", IdempotencyKey: "k1", Throttle: &asyncd.Throttle{Key: "x", Period: time.Second, OnLimit: asyncd.OnLimitRefuse}},
		{Type: "t", IdempotencyKey: "k2"},
	}); err != nil {
		t.Fatal(err)
	}
	items := f.last(t).body["tasks"].([]any)
	first, second := items[0].(map[string]any), items[1].(map[string]any)
	if want := (map[string]any{"key": "x", "period": "1s", "on_limit": "refuse"}); !reflect.DeepEqual(first["throttle"], want) {
		t.Fatalf("batch item 0 throttle = %v, want %v", first["throttle"], want)
	}
	for _, k := range []string{"debounce", "throttle"} {
		if _, ok := second[k]; ok {
			t.Fatalf("batch item 1 carries %s though unset: %v", k, second)
		}
	}
}

// The answers' "debounced" and "dropped" land in SubmitResult, alone and per batch
// item; an answer without them reads false.
func TestSubmitResultReadsDebouncedAndDropped(t *testing.T) {
	f, c := newFake(t, 200, `{"id":"w","eta":"2026-12-01T00:00:30Z","route":"store","duplicate":false,"debounced":true}`)
	bg := context.Background()
	task := &asyncd.Task{Type: "t", IdempotencyKey: "k", Debounce: &asyncd.Debounce{Key: "u", Period: 30 * time.Second}}
	res, err := c.Submit(bg, task)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Debounced || res.Dropped || res.Duplicate || res.ID != "w" || !res.ETA.Equal(time.Date(2026, 12, 1, 0, 0, 30, 0, time.UTC)) {
		t.Fatalf("debounced answer = %+v", res)
	}
	f.body = `{"id":"s","eta":"2026-12-01T00:01:00Z","route":"store","duplicate":false,"dropped":true}`
	if res, err = c.Submit(bg, task); err != nil || !res.Dropped || res.Debounced || res.ID != "s" {
		t.Fatalf("dropped answer = %+v, %v", res, err)
	}
	f.status, f.body = 201, `{"id":"n","eta":"2026-12-01T00:00:30Z","route":"store","duplicate":false}`
	if res, err = c.Submit(bg, task); err != nil || res.Dropped || res.Debounced || res.ID != "n" {
		t.Fatalf("new task's answer = %+v, %v", res, err)
	}

	f.status = 200
	f.body = `{"results":[` +
		`{"status":201,"id":"n","eta":"2026-12-01T00:00:00Z","route":"store","duplicate":false},` +
		`{"status":200,"id":"n","eta":"2026-12-01T00:00:05Z","route":"store","duplicate":false,"debounced":true},` +
		`{"status":200,"id":"m","eta":"2026-12-01T00:01:00Z","route":"store","duplicate":false,"dropped":true},` +
		`{"status":409,"error":{"code":"throttled","message":"window open","field":"throttle","existing_id":"m"}}]}`
	results, err := c.SubmitBatch(bg, []*asyncd.Task{
		{Type: "t", IdempotencyKey: "k1"}, {Type: "t", IdempotencyKey: "k2"},
		{Type: "t", IdempotencyKey: "k3"}, {Type: "t", IdempotencyKey: "k4"},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := [][2]bool{}
	for _, r := range results[:3] {
		got = append(got, [2]bool{r.Debounced, r.Dropped})
	}
	if want := [][2]bool{{false, false}, {true, false}, {false, true}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("batch (debounced, dropped) = %v, want %v", got, want)
	}
	if results[1].Status != 200 || results[1].ID != "n" || results[2].ID != "m" {
		t.Fatalf("batch results = %+v", results)
	}
	if e := results[3].Err; e == nil || !errors.Is(e, asyncd.ErrThrottled) || e.ExistingID != "m" || e.Field != "throttle" || e.Status != 409 {
		t.Fatalf("batch item 3 = %+v (err %+v)", results[3], results[3].Err)
	}
}

// A 409 throttled is ErrThrottled (and no other sentinel), naming the key's task, and
// not retryable: the same submit is refused until the window closes.
func TestThrottledError(t *testing.T) {
	_, c := newFake(t, 409, `{"error":{"code":"throttled","message":"throttle: task 0193e was stored under this key within the throttle's period","field":"throttle","existing_id":"0193e"}}`)
	_, err := c.Submit(context.Background(), &asyncd.Task{Type: "t", IdempotencyKey: "k",
		Throttle: &asyncd.Throttle{Key: "user:7", Period: time.Minute}})
	var apiErr *asyncd.APIError
	if !errors.As(err, &apiErr) || !errors.Is(err, asyncd.ErrThrottled) {
		t.Fatalf("err = %T %v", err, err)
	}
	if apiErr.Status != 409 || apiErr.Code != asyncd.CodeThrottled || apiErr.ExistingID != "0193e" || apiErr.Field != "throttle" {
		t.Fatalf("%+v", apiErr)
	}
	if errors.Is(err, asyncd.ErrUniqueConflict) || errors.Is(err, asyncd.ErrTaskStarted) || asyncd.IsRetryable(err) {
		t.Fatalf("%v matches another sentinel or is retryable", err)
	}
}

// A task with both a Debounce and a Throttle is refused by the SDK before anything is
// sent (the server would refuse it too, naming throttle), alone or in a batch, and
// through SubmitDelayed and SubmitAt, which keep both.
func TestSubmitRefusesDebounceWithThrottleBeforeSending(t *testing.T) {
	f, c := newFake(t, 201, `{}`)
	bg := context.Background()
	both := &asyncd.Task{Type: "t", IdempotencyKey: "k",
		Debounce: &asyncd.Debounce{Key: "u", Period: time.Second},
		Throttle: &asyncd.Throttle{Key: "u", Period: time.Second}}
	calls := []struct {
		name   string
		submit func() error
		want   []string
	}{
		{"Submit", func() error { _, err := c.Submit(bg, both); return err }, []string{"Debounce", "Throttle"}},
		{"SubmitDelayed", func() error { _, err := c.SubmitDelayed(bg, both, time.Minute); return err }, []string{"Debounce", "Throttle"}},
		{"SubmitAt", func() error { _, err := c.SubmitAt(bg, both, time.Now().Add(time.Minute)); return err }, []string{"Debounce", "Throttle"}},
		{"SubmitBatch", func() error {
			_, err := c.SubmitBatch(bg, []*asyncd.Task{{Type: "t", IdempotencyKey: "k0"}, both})
			return err
		}, []string{"task 1", "Debounce", "Throttle"}},
	}
	for _, call := range calls {
		err := call.submit()
		var apiErr *asyncd.APIError
		if err == nil || errors.As(err, &apiErr) {
			t.Errorf("%s: err = %v, want the SDK's own refusal", call.name, err)
			continue
		}
		for _, w := range call.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: err %q does not name %s", call.name, err, w)
			}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) != 0 {
		t.Fatalf("%d requests sent", len(f.reqs))
	}
}

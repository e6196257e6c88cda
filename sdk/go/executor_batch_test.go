package asyncd_test

// Batch calls (docs/api.md, "Batch delivery"): one POST carrying several tasks, each
// run by the same handler a single call runs, answered with one result per task.

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

const batchKey = "batch-s3cret"

// batchEntry is one task of a batch call's body, as asyncd sends it.
type batchEntry struct {
	ID             string          `json:"id"`
	Type           string          `json:"type"`
	Payload        json.RawMessage `json:"payload"`
	Attempt        int             `json:"attempt"`
	ETA            string          `json:"eta"`
	IdempotencyKey string          `json:"idempotency_key"`
	LeaseToken     string          `json:"lease_token"`
	TraceParent    string          `json:"traceparent,omitempty"`
	TraceState     string          `json:"tracestate,omitempty"`
}

func entry(id, taskType string, attempt int) batchEntry {
	return batchEntry{ID: id, Type: taskType, Payload: json.RawMessage(`{"n":1}`), Attempt: attempt,
		ETA: "2026-11-30T06:00:00.123Z", IdempotencyKey: "key-" + id, LeaseToken: "tok-" + id + "-" + strconv.Itoa(attempt)}
}

// batchHeaders signs a batch call as asyncd does: Asyncd-Batch, no per-task headers,
// the canonical string's per-task fields empty. An empty key leaves it unsigned.
func batchHeaders(t *testing.T, key string, ts int64, callbackURL string, body string) map[string]string {
	t.Helper()
	var call struct {
		Tasks []json.RawMessage `json:"tasks"`
	}
	_ = json.Unmarshal([]byte(body), &call)
	h := http.Header{}
	h.Set(asyncd.HeaderBatch, strconv.Itoa(len(call.Tasks)))
	h.Set(asyncd.HeaderCallbackURL, callbackURL)
	if key != "" {
		h.Set(asyncd.HeaderTimestamp, strconv.FormatInt(ts, 10))
		h.Set(asyncd.HeaderSignature, asyncd.Sign([][]byte{[]byte(key)}, h, []byte(body)))
	}
	out := map[string]string{}
	for k := range h {
		out[k] = h.Get(k)
	}
	return out
}

func batchBody(t *testing.T, entries ...batchEntry) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"tasks": entries})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type batchResult struct {
	ID         string `json:"id"`
	Status     string `json:"status"`
	Error      string `json:"error"`
	RetryAfter string `json:"retry_after"`
	Lease      string `json:"lease"`
}

// postBatch sends a signed batch call and returns its results by task id, checking
// that it answered 200 with exactly one result per task.
func postBatch(t *testing.T, h http.Handler, ts int64, callbackURL string, entries ...batchEntry) map[string]batchResult {
	t.Helper()
	body := batchBody(t, entries...)
	rec := call(t, h, body, batchHeaders(t, batchKey, ts, callbackURL, body))
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("batch answered %d %s", rec.Code, rec.Body)
	}
	var answer struct {
		Results []batchResult `json:"results"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &answer); err != nil {
		t.Fatalf("answer %s: %v", rec.Body, err)
	}
	if len(answer.Results) != len(entries) {
		t.Fatalf("%d results for %d tasks: %s", len(answer.Results), len(entries), rec.Body)
	}
	byID := map[string]batchResult{}
	for _, r := range answer.Results {
		byID[r.ID] = r
	}
	return byID
}

// infos records the TaskInfo (and the ctx's trace context) each handler run saw.
type infos struct {
	mu    sync.Mutex
	byID  map[string][]asyncd.TaskInfo
	trace map[string][2]string
}

func (in *infos) add(ctx context.Context) asyncd.TaskInfo {
	info, _ := asyncd.TaskInfoFrom(ctx)
	parent, state := asyncd.TraceParent(ctx)
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.byID == nil {
		in.byID, in.trace = map[string][]asyncd.TaskInfo{}, map[string][2]string{}
	}
	in.byID[info.ID] = append(in.byID[info.ID], info)
	in.trace[info.ID] = [2]string{parent, state}
	return info
}

func (in *infos) runs(id string) []asyncd.TaskInfo {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]asyncd.TaskInfo(nil), in.byID[id]...)
}

// One batch of every kind of outcome: each task gets the result its handler's outcome
// gets in a single call, one task's panic spoils no other result, the handlers run
// concurrently, and the long-running one heartbeats and posts its result with its own
// lease token.
func TestExecutorBatchMixedOutcomes(t *testing.T) {
	api := &callbackAPI{}
	srv := httptest.NewServer(api)
	defer srv.Close()
	c, logs := loggedClient(asyncd.WithSigningSecret(batchKey))
	var seen infos
	c.RegisterExecutor("ok", func(ctx context.Context, payload string) error {
		if info := seen.add(ctx); payload != `{"n":1}` {
			t.Errorf("%s: payload %q", info.ID, payload)
		}
		return nil
	})
	c.RegisterExecutor("retry_later", func(ctx context.Context, _ string) error {
		seen.add(ctx)
		return &asyncd.RetryError{After: 30 * time.Second, Err: errors.New("downstream busy")}
	})
	c.RegisterExecutor("transient", func(ctx context.Context, _ string) error {
		seen.add(ctx)
		return errors.New("db down")
	})
	c.RegisterExecutor("permanent", func(ctx context.Context, _ string) error {
		seen.add(ctx)
		return asyncd.Permanent(errors.New("no such image"))
	})
	c.RegisterExecutor("panics", func(ctx context.Context, _ string) error {
		seen.add(ctx)
		panic("nil map")
	})
	asyncd.Handle(c, "typed", func(ctx context.Context, p struct{ N string }) (struct{}, error) {
		t.Error("ran with a payload that does not decode")
		return struct{}{}, nil
	})
	release := make(chan struct{})
	c.RegisterExecutor("long", func(ctx context.Context, _ string) error {
		seen.add(ctx)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}, asyncd.LongRunning(300*time.Millisecond))
	// Two tasks that each wait for the other: they finish only if run at once.
	var meet sync.WaitGroup
	meet.Add(2)
	c.RegisterExecutor("meet", func(ctx context.Context, _ string) error {
		seen.add(ctx)
		meet.Done()
		done := make(chan struct{})
		go func() { meet.Wait(); close(done) }()
		select {
		case <-done:
			return nil
		case <-time.After(5 * time.Second):
			return errors.New("the other task of the batch never ran alongside")
		}
	})

	traced := entry("t-ok", "ok", 3)
	traced.TraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	traced.TraceState = "vendor=1"
	noKey := entry("t-nokey", "ok", 1)
	noKey.IdempotencyKey = ""
	entries := []batchEntry{
		traced, noKey,
		entry("t-retry", "retry_later", 1),
		entry("t-transient", "transient", 2),
		entry("t-permanent", "permanent", 1),
		entry("t-panics", "panics", 1),
		entry("t-typed", "typed", 1),
		entry("t-long", "long", 1),
		entry("t-nobody", "unregistered", 1),
		entry("t-meet1", "meet", 1),
		entry("t-meet2", "meet", 1),
	}
	got := postBatch(t, c, time.Now().Unix(), srv.URL, entries...)
	want := map[string]batchResult{
		"t-ok":        {Status: "success"},
		"t-nokey":     {Status: "success"},
		"t-retry":     {Status: "retry", Error: "retry after 30s: downstream busy", RetryAfter: "30s"},
		"t-transient": {Status: "retry", Error: "db down"},
		"t-permanent": {Status: "failed", Error: "no such image"},
		"t-panics":    {Status: "retry", Error: "panic: nil map"},
		"t-typed":     {Status: "failed", Error: "payload does not decode into struct { N string }: json: cannot unmarshal number into Go struct field .N of type string"},
		"t-long":      {Status: "accepted", Lease: "300ms"},
		"t-nobody":    {Status: "retry", Error: `no executor for task type "unregistered"`},
		"t-meet1":     {Status: "success"},
		"t-meet2":     {Status: "success"},
	}
	for id, w := range want {
		w.ID = id
		if got[id] != w {
			t.Errorf("%s: %+v\nwant %+v", id, got[id], w)
		}
	}

	// Each handler saw its own task as a single call would have shown it.
	wantInfo := asyncd.TaskInfo{ID: "t-ok", Type: "ok", IdempotencyKey: "key-t-ok", Attempt: 3, LeaseToken: "tok-t-ok-3",
		ETA: time.Date(2026, 11, 30, 6, 0, 0, 123e6, time.UTC), CallbackURL: srv.URL,
		TraceParent: traced.TraceParent, TraceState: "vendor=1"}
	if runs := seen.runs("t-ok"); len(runs) != 1 || runs[0] != wantInfo {
		t.Errorf("t-ok saw %+v\nwant %+v", runs, wantInfo)
	}
	if tr := seen.trace["t-ok"]; tr != [2]string{traced.TraceParent, "vendor=1"} {
		t.Errorf("t-ok's ctx carries trace %v", tr)
	}
	if runs := seen.runs("t-nokey"); len(runs) != 1 || runs[0].IdempotencyKey != "t-nokey" || runs[0].TraceParent != "" {
		t.Errorf("t-nokey saw %+v: the idempotency key falls back to the id", runs)
	}
	if runs := seen.runs("t-transient"); len(runs) != 1 || runs[0].Attempt != 2 || runs[0].LeaseToken != "tok-t-transient-2" {
		t.Errorf("t-transient saw %+v", runs)
	}
	for _, id := range []string{"t-retry", "t-permanent", "t-panics", "t-meet1", "t-meet2"} {
		if n := len(seen.runs(id)); n != 1 {
			t.Errorf("%s ran %d times", id, n)
		}
	}

	// The accepted task keeps its lease, then posts its result, with its own token.
	waitUntil(t, 5*time.Second, "two heartbeats of t-long", func() bool { hb, _ := api.counts(); return hb >= 2 })
	close(release)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	for i, p := range api.paths {
		want := "/v1/tasks/t-long/heartbeat"
		if i == len(api.paths)-1 {
			want = "/v1/tasks/t-long/result"
		}
		if p != want {
			t.Errorf("callback %d to %s, want %s", i, p, want)
		}
	}
	if hb := api.heartbeats[0]; hb["lease_token"] != "tok-t-long-1" || hb["lease"] != "300ms" {
		t.Errorf("heartbeat %v", hb)
	}
	if len(api.results) != 1 || api.results[0]["lease_token"] != "tok-t-long-1" || api.results[0]["status"] != "success" {
		t.Errorf("results %v", api.results)
	}
	// What went wrong is logged per task, as for single calls.
	for _, w := range []string{`"task_id":"t-transient"`, `"task_id":"t-permanent"`, `"task_id":"t-panics"`, `"task_id":"t-nobody"`} {
		if !strings.Contains(logs.String(), w) {
			t.Errorf("no log record with %s:\n%s", w, logs)
		}
	}
}

// A batch call is refused as a whole, as a single call would be, when its signature
// does not hold (401) or its body is not a batch (400); no handler runs.
func TestExecutorBatchRefusals(t *testing.T) {
	c, logs := loggedClient(asyncd.WithSigningSecret(batchKey))
	ran := 0
	c.RegisterExecutor("ok", func(context.Context, string) error { ran++; return nil })
	now := time.Now().Unix()
	body := batchBody(t, entry("a", "ok", 1))

	for name, hdr := range map[string]map[string]string{
		"unsigned":   batchHeaders(t, "", now, "http://127.0.0.1:7700", body),
		"other key":  batchHeaders(t, "other", now, "http://127.0.0.1:7700", body),
		"stale":      batchHeaders(t, batchKey, now-301, "http://127.0.0.1:7700", body),
		"other body": batchHeaders(t, batchKey, now, "http://127.0.0.1:7700", batchBody(t, entry("a", "ok", 2))),
		// Signed as a single call of task a would be: a batch call's signature leaves
		// the per-task fields out, whatever headers come with it.
		"signed as a single call": func() map[string]string {
			h := http.Header{}
			h.Set(asyncd.HeaderTimestamp, strconv.FormatInt(now, 10))
			h.Set(asyncd.HeaderTaskID, "a")
			h.Set(asyncd.HeaderAttempt, "1")
			h.Set(asyncd.HeaderCallbackURL, "http://127.0.0.1:7700")
			h.Set(asyncd.HeaderSignature, asyncd.Sign([][]byte{[]byte(batchKey)}, h, []byte(body)))
			h.Set(asyncd.HeaderBatch, "1")
			out := map[string]string{}
			for k := range h {
				out[k] = h.Get(k)
			}
			return out
		}(),
	} {
		if rec := call(t, c, body, hdr); rec.Code != 401 {
			t.Errorf("%s: %d %s", name, rec.Code, rec.Body)
		}
	}
	for _, bad := range []string{`not json`, `{"tasks":[{"id":"a"}]}`, `{"task":[]}`} {
		if rec := call(t, c, bad, batchHeaders(t, batchKey, now, "http://127.0.0.1:7700", bad)); rec.Code != 400 {
			t.Errorf("%s: %d %s", bad, rec.Code, rec.Body)
		}
	}
	if ran != 0 {
		t.Fatalf("a handler ran %d times for refused calls", ran)
	}
	if !strings.Contains(logs.String(), "401") || !strings.Contains(logs.String(), "(400)") {
		t.Errorf("refusals not logged:\n%s", logs)
	}
	// Without a signing key, an unsigned batch runs (asyncd dev without signing).
	open := asyncd.NewClient()
	open.RegisterExecutor("ok", func(context.Context, string) error { ran++; return nil })
	if got := postBatchUnsigned(t, open, body); got["a"].Status != "success" || ran != 1 {
		t.Fatalf("unsigned batch without a key: %+v, ran %d", got, ran)
	}
	if rec := call(t, open, `{"tasks":7}`, map[string]string{asyncd.HeaderBatch: "1"}); rec.Code != 400 {
		t.Fatalf("garbage without a key: %d", rec.Code)
	}
}

func postBatchUnsigned(t *testing.T, h http.Handler, body string) map[string]batchResult {
	t.Helper()
	rec := call(t, h, body, batchHeaders(t, "", 0, "", body))
	var answer struct {
		Results []batchResult `json:"results"`
	}
	if rec.Code != 200 || json.Unmarshal(rec.Body.Bytes(), &answer) != nil {
		t.Fatalf("answered %d %s", rec.Code, rec.Body)
	}
	byID := map[string]batchResult{}
	for _, r := range answer.Results {
		byID[r.ID] = r
	}
	return byID
}

// A (task, attempt, lease token) delivered before — in a batch or a single call — is
// answered "failed" with the single call's 401 message, without running its handler;
// the other tasks of the batch run.
func TestExecutorBatchRefusesReplayedEntry(t *testing.T) {
	c, logs := loggedClient(asyncd.WithSigningSecret(batchKey))
	var seen infos
	c.RegisterExecutor("ok", func(ctx context.Context, _ string) error { seen.add(ctx); return nil })
	now := time.Now().Unix()
	first := postBatch(t, c, now, "http://127.0.0.1:7700", entry("a", "ok", 1), entry("b", "ok", 1))
	if first["a"].Status != "success" || first["b"].Status != "success" {
		t.Fatalf("first batch %+v", first)
	}
	// A single call of task c, attempt 1.
	single := `{"id":"c","type":"ok","payload":{},"attempt":1,"eta":"2026-11-30T06:00:00.123Z"}`
	h := http.Header{}
	h.Set(asyncd.HeaderTimestamp, strconv.FormatInt(now, 10))
	h.Set(asyncd.HeaderTaskID, "c")
	h.Set(asyncd.HeaderAttempt, "1")
	h.Set(asyncd.HeaderLeaseToken, "tok-c-1")
	h.Set(asyncd.HeaderSignature, asyncd.Sign([][]byte{[]byte(batchKey)}, h, []byte(single)))
	hdr := map[string]string{}
	for k := range h {
		hdr[k] = h.Get(k)
	}
	if rec := call(t, c, single, hdr); rec.Code != 200 {
		t.Fatalf("single call: %d %s", rec.Code, rec.Body)
	}
	// Signed anew, later: a and c again (replays), a's next attempt and a new task d.
	second := postBatch(t, c, now+1, "http://127.0.0.1:7700",
		entry("a", "ok", 1), entry("c", "ok", 1), entry("d", "ok", 1))
	refused := "asyncd: bad signature: this task attempt was already delivered"
	for _, id := range []string{"a", "c"} {
		if second[id] != (batchResult{ID: id, Status: "failed", Error: refused}) {
			t.Errorf("replayed %s: %+v", id, second[id])
		}
	}
	if second["d"].Status != "success" {
		t.Errorf("d: %+v", second["d"])
	}
	third := postBatch(t, c, now+2, "http://127.0.0.1:7700", entry("a", "ok", 2))
	if third["a"].Status != "success" {
		t.Errorf("a's attempt 2: %+v", third["a"])
	}
	if runs := seen.runs("a"); len(runs) != 2 || runs[0].Attempt != 1 || runs[1].Attempt != 2 {
		t.Errorf("a ran %+v, want attempts 1 and 2 once each", runs)
	}
	// c ran once, as its single call.
	for id, n := range map[string]int{"b": 1, "c": 1, "d": 1} {
		if got := len(seen.runs(id)); got != n {
			t.Errorf("%s ran %d times, want %d", id, got, n)
		}
	}
	var replays int
	for _, rec := range logs.records(t) {
		if strings.Contains(rec["msg"].(string), "401") && rec["hint"] == "this attempt was delivered before (a replayed call)" {
			replays++
		}
	}
	if replays != 2 {
		t.Errorf("%d replay refusals logged, want 2:\n%s", replays, logs)
	}
}

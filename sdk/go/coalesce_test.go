package asyncd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

// batchingAPI answers POST /v1/tasks and POST /v1/tasks:batch item by item: the id of
// a task is its idempotency key, and type "nope" is refused. Every call waits until
// gate is closed (or nil), so a test can hold the calls in flight busy.
type batchingAPI struct {
	mu         sync.Mutex
	calls      []string // path and task count of each call answered, in order
	arrived    int      // calls that reached the API, held at the gate or not
	gate       chan struct{}
	batchLimit int // a batch with more tasks answers 413; 0: no limit
	status     int // answers every call with this status when set
}

func (a *batchingAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	a.mu.Lock()
	a.arrived++
	gate, limit, status := a.gate, a.batchLimit, a.status
	a.mu.Unlock()
	if gate != nil {
		<-gate
	}
	item := func(t map[string]any) map[string]any {
		if t["type"] == "nope" {
			return map[string]any{"status": 400, "error": map[string]any{"code": "unknown_task_type", "message": "no job", "field": "type"}}
		}
		return map[string]any{"status": 201, "id": t["idempotency_key"], "eta": "2026-12-01T00:00:00Z", "route": "store"}
	}
	w.Header().Set("Content-Type", "application/json")
	var answer any
	var count int
	if r.URL.Path == "/v1/tasks:batch" {
		var body struct{ Tasks []map[string]any }
		_ = json.Unmarshal(raw, &body)
		count = len(body.Tasks)
		results := []any{}
		for _, t := range body.Tasks {
			results = append(results, item(t))
		}
		answer = map[string]any{"results": results}
		if limit > 0 && count > limit {
			status = http.StatusRequestEntityTooLarge
		}
	} else {
		var t map[string]any
		_ = json.Unmarshal(raw, &t)
		count = 1
		it := item(t)
		if it["status"] != 201 {
			w.WriteHeader(400)
			_ = json.NewEncoder(w).Encode(it)
			return
		}
		answer = it
	}
	a.mu.Lock()
	a.calls = append(a.calls, fmt.Sprintf("%s %d", r.URL.Path, count))
	a.mu.Unlock()
	if status != 0 {
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"error":{"code":"store_unavailable","message":"down"}}`)
		return
	}
	w.WriteHeader(201)
	_ = json.NewEncoder(w).Encode(answer)
}

func (a *batchingAPI) callLog() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.calls...)
}

func newBatchingClient(t *testing.T, api *batchingAPI, calls int) *Client {
	t.Helper()
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return NewClient(WithEndpoint(srv.URL), WithToken(""), WithSubmitCoalescing(calls))
}

// waitQueued waits until n submits are queued behind the calls in flight.
func waitQueued(t *testing.T, c *Client, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.coalesce.mu.Lock()
		got := len(c.coalesce.queue)
		c.coalesce.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d submits queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitFor waits until cond holds, read under the coalescer's lock.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitBusy waits until every one of the client's calls is in flight.
func waitBusy(t *testing.T, c *Client) {
	t.Helper()
	waitFor(t, "the calls to be in flight", func() bool {
		c.coalesce.mu.Lock()
		defer c.coalesce.mu.Unlock()
		return c.coalesce.senders == c.coalesce.maxCalls && len(c.coalesce.queue) == 0
	})
}

type outcome struct {
	key string
	res *SubmitResult
	err error
}

// submitAll starts one Submit per key and returns a channel of their outcomes.
func submitAll(ctx context.Context, c *Client, types map[string]string, keys ...string) <-chan outcome {
	out := make(chan outcome, len(keys))
	for _, k := range keys {
		typ := types[k]
		if typ == "" {
			typ = "t"
		}
		go func() {
			res, err := c.Submit(ctx, &Task{Type: typ, IdempotencyKey: k, Payload: map[string]string{"k": k}})
			out <- outcome{k, res, err}
		}()
	}
	return out
}

func TestConcurrentSubmitsShareTheNextCallAndEachGetsItsOwnResult(t *testing.T) {
	gate := make(chan struct{})
	api := &batchingAPI{gate: gate}
	c := newBatchingClient(t, api, 1)
	first := submitAll(context.Background(), c, nil, "first")
	waitBusy(t, c) // the first went alone: a call was free
	rest := submitAll(context.Background(), c, map[string]string{"bad": "nope"}, "a", "b", "bad", "c")
	waitQueued(t, c, 4)
	close(gate)

	if o := <-first; o.err != nil || o.res.ID != "first" {
		t.Fatalf("first: %+v %v", o.res, o.err)
	}
	for range 4 {
		o := <-rest
		if o.key == "bad" {
			var apiErr *APIError
			if !errors.As(o.err, &apiErr) || !errors.Is(o.err, ErrUnknownTaskType) || apiErr.Field != "type" || apiErr.Status != 400 {
				t.Fatalf("the refused item answered %+v, %v", o.res, o.err)
			}
			continue
		}
		if o.err != nil || o.res.ID != o.key || o.res.Route != "store" {
			t.Fatalf("%s: %+v %v", o.key, o.res, o.err)
		}
	}
	if got := api.callLog(); len(got) != 2 || got[0] != "/v1/tasks 1" || got[1] != "/v1/tasks:batch 4" {
		t.Fatalf("calls = %q, want one alone then one batch of the four queued", got)
	}
}

func TestAFailedSharedCallFailsEverySubmitInIt(t *testing.T) {
	gate := make(chan struct{})
	api := &batchingAPI{gate: gate}
	c := newBatchingClient(t, api, 1)
	first := submitAll(context.Background(), c, nil, "first")
	waitBusy(t, c)
	rest := submitAll(context.Background(), c, nil, "a", "b")
	waitQueued(t, c, 2)
	api.mu.Lock()
	api.status = http.StatusServiceUnavailable
	api.mu.Unlock()
	close(gate)
	<-first
	for range 2 {
		if o := <-rest; !errors.Is(o.err, ErrStoreUnavailable) {
			t.Fatalf("%s: %+v %v, want store_unavailable", o.key, o.res, o.err)
		}
	}
}

func TestASharedCallTheAPIFindsTooLargeIsSentTaskByTask(t *testing.T) {
	gate := make(chan struct{})
	api := &batchingAPI{gate: gate, batchLimit: 1}
	c := newBatchingClient(t, api, 1)
	first := submitAll(context.Background(), c, nil, "first")
	waitBusy(t, c)
	rest := submitAll(context.Background(), c, nil, "a", "b", "c")
	waitQueued(t, c, 3)
	close(gate)
	<-first
	for range 3 {
		if o := <-rest; o.err != nil || o.res.ID != o.key {
			t.Fatalf("%s: %+v %v", o.key, o.res, o.err)
		}
	}
	if got := api.callLog(); len(got) != 5 || got[1] != "/v1/tasks:batch 3" || got[2] != "/v1/tasks 1" || got[4] != "/v1/tasks 1" {
		t.Fatalf("calls = %q, want the batch refused then each task alone", got)
	}
}

func TestASubmitThatGivesUpWhileQueuedIsNeverSent(t *testing.T) {
	gate := make(chan struct{})
	api := &batchingAPI{gate: gate}
	c := newBatchingClient(t, api, 1)
	first := submitAll(context.Background(), c, nil, "first")
	waitBusy(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := submitAll(ctx, c, nil, "gave-up")
	kept := submitAll(context.Background(), c, nil, "kept")
	waitQueued(t, c, 2)
	cancel()
	if o := <-gaveUp; !errors.Is(o.err, context.Canceled) {
		t.Fatalf("cancelled submit answered %+v, %v", o.res, o.err)
	}
	waitQueued(t, c, 1)
	close(gate)
	<-first
	if o := <-kept; o.err != nil || o.res.ID != "kept" {
		t.Fatalf("kept: %+v %v", o.res, o.err)
	}
	if got := api.callLog(); len(got) != 2 || got[1] != "/v1/tasks 1" {
		t.Fatalf("calls = %q, want the kept task alone after the first", got)
	}
}

func TestATracedSubmitIsNeverShared(t *testing.T) {
	gate := make(chan struct{})
	api := &batchingAPI{gate: gate}
	c := newBatchingClient(t, api, 1)
	first := submitAll(context.Background(), c, nil, "first")
	waitBusy(t, c)
	traced := ContextWithTraceParent(context.Background(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "")
	done := submitAll(traced, c, nil, "traced")
	// Its own call reaches the API while the first is held, and it was never queued.
	waitFor(t, "the traced submit's own call", func() bool {
		api.mu.Lock()
		defer api.mu.Unlock()
		return api.arrived == 2
	})
	c.coalesce.mu.Lock()
	queued := len(c.coalesce.queue)
	c.coalesce.mu.Unlock()
	if queued != 0 {
		t.Fatalf("%d submits queued, want the traced one sent alone", queued)
	}
	close(gate)
	<-first
	if o := <-done; o.err != nil || o.res.ID != "traced" {
		t.Fatalf("traced: %+v %v", o.res, o.err)
	}
}

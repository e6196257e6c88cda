package asyncd_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

const testTraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// A handler sees the call's trace context, and a task it submits with its ctx carries
// the same trace to asyncd.
func TestExecutorContinuesTheTrace(t *testing.T) {
	var mu sync.Mutex
	var submitted http.Header
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		submitted = r.Header.Clone()
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"t2","eta":"2026-11-30T06:00:00Z","route":"store","duplicate":false}`))
	}))
	defer api.Close()
	c := asyncd.NewClient(asyncd.WithEndpoint(api.URL))
	var parent, state string
	var info asyncd.TaskInfo
	c.RegisterExecutor("traced", func(ctx context.Context, payload string) error {
		parent, state = asyncd.TraceParent(ctx)
		info, _ = asyncd.TaskInfoFrom(ctx)
		_, err := c.Submit(ctx, &asyncd.Task{Type: "next", IdempotencyKey: "k"})
		return err
	})
	rec := call(t, c, taskBody("traced", "{}"), map[string]string{
		"traceparent": testTraceParent, "tracestate": "vendor=1",
	})
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if parent != testTraceParent || state != "vendor=1" {
		t.Fatalf("TraceParent(ctx) = %q, %q", parent, state)
	}
	if info.TraceParent != testTraceParent || info.TraceState != "vendor=1" {
		t.Fatalf("TaskInfo = %+v", info)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := submitted.Get("traceparent"); got != testTraceParent {
		t.Fatalf("the follow-up submit sent traceparent %q", got)
	}
	if got := submitted.Get("tracestate"); got != "vendor=1" {
		t.Fatalf("the follow-up submit sent tracestate %q", got)
	}
}

// Without a trace in ctx, nothing is sent; ContextWithTraceParent sets one.
func TestSubmitSendsTheContextsTraceParent(t *testing.T) {
	headers := make(chan http.Header, 2)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		headers <- r.Header.Clone()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"t","eta":"2026-11-30T06:00:00Z","route":"store","duplicate":false}`))
	}))
	defer api.Close()
	c := asyncd.NewClient(asyncd.WithEndpoint(api.URL))
	task := &asyncd.Task{Type: "x", IdempotencyKey: "k"}
	if _, err := c.Submit(context.Background(), task); err != nil {
		t.Fatal(err)
	}
	if h := <-headers; h.Get("traceparent") != "" || h.Get("tracestate") != "" {
		t.Fatalf("sent a trace without one: %v", h)
	}
	ctx := asyncd.ContextWithTraceParent(context.Background(), testTraceParent, "")
	if _, err := c.Submit(ctx, task); err != nil {
		t.Fatal(err)
	}
	h := <-headers
	if h.Get("traceparent") != testTraceParent || h.Get("tracestate") != "" {
		t.Fatalf("headers %v", h)
	}
}

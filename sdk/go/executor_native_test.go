package asyncd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

// syncBuffer is a bytes.Buffer safe to write from handler goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// records is every JSON log record written so far.
func (b *syncBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if line == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, rec)
	}
	return out
}

func loggedClient(opts ...asyncd.Option) (*asyncd.Client, *syncBuffer) {
	buf := &syncBuffer{}
	logger := slog.New(slog.NewJSONHandler(buf, nil))
	return asyncd.NewClient(append(opts, asyncd.WithLogger(logger))...), buf
}

// Every attempt that did not succeed is logged with its task, and at a level that
// says whether asyncd will retry it; a success is not logged.
func TestExecutorLogsEveryFailedRefusedAndTimedOutTask(t *testing.T) {
	c, logs := loggedClient()
	c.RegisterExecutor("ok", func(context.Context, string) error { return nil })
	c.RegisterExecutor("flaky", func(context.Context, string) error { return errors.New("db down") })
	c.RegisterExecutor("bad", func(context.Context, string) error { return asyncd.Permanent(errors.New("card declined")) })
	c.RegisterExecutor("slow", func(ctx context.Context, _ string) error {
		<-ctx.Done() // asyncd gave up on the call: its timeout
		return ctx.Err()
	})
	hdr := map[string]string{"Asyncd-Task-Id": "0193t", "Asyncd-Attempt": "2"}
	call(t, c, taskBody("ok", "{}"), hdr)
	if got := logs.String(); got != "" {
		t.Fatalf("a success was logged: %s", got)
	}
	call(t, c, taskBody("flaky", "{}"), hdr)
	call(t, c, taskBody("bad", "{}"), hdr)
	call(t, c, taskBody("nobody", "{}"), hdr)
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(taskBody("slow", "{}"))).WithContext(ctx)
	cancel()
	c.ServeHTTP(httptest.NewRecorder(), req)

	recs := logs.records(t)
	want := []struct{ level, msg, taskType, err string }{
		{"WARN", "task failed; asyncd will retry it", "flaky", "db down"},
		{"ERROR", "task failed permanently", "bad", "card declined"},
		{"WARN", "no executor for this task type", "nobody", ""},
		{"ERROR", "task timed out", "slow", "context canceled"},
	}
	if len(recs) != len(want) {
		t.Fatalf("%d records, want %d: %v", len(recs), len(want), recs)
	}
	for i, w := range want {
		r := recs[i]
		if r["level"] != w.level || !strings.Contains(r["msg"].(string), w.msg) || r["task_type"] != w.taskType ||
			r["task_id"] != "0193t" || (w.err != "" && !strings.Contains(r["error"].(string), w.err)) {
			t.Errorf("record %d = %v, want %+v", i, r, w)
		}
	}
}

// A job without spec.executor.signing sends unsigned calls; an
// executor without a key (its variable unset) refuses everything. Both are logged with
// what to fix.
func TestExecutorLogsRefusedCallsWithAHint(t *testing.T) {
	c, logs := loggedClient(asyncd.WithSigningSecret("s3cret"))
	c.RegisterExecutor("ok", func(context.Context, string) error { return nil })
	if rec := call(t, c, taskBody("ok", "{}"), map[string]string{"Asyncd-Task-Id": "0193t"}); rec.Code != 401 {
		t.Fatalf("unsigned call answered %d", rec.Code)
	}
	c2, logs2 := loggedClient(asyncd.WithSigningSecret(""))
	c2.RegisterExecutor("ok", func(context.Context, string) error { return nil })
	call(t, c2, taskBody("ok", "{}"), map[string]string{"Asyncd-Task-Id": "0193u"})

	for _, tc := range []struct {
		logs *syncBuffer
		id   string
		hint string
	}{{logs, "0193t", "no spec.executor.signing"}, {logs2, "0193u", "no usable signing key"}} {
		recs := tc.logs.records(t)
		if len(recs) != 1 || recs[0]["level"] != "ERROR" || recs[0]["task_id"] != tc.id ||
			!strings.Contains(recs[0]["msg"].(string), "401") || !strings.Contains(recs[0]["hint"].(string), tc.hint) {
			t.Errorf("records %v, want one 401 refusal of %s hinting %q", recs, tc.id, tc.hint)
		}
	}
}

type order struct {
	OrderID int    `json:"order_id"`
	Note    string `json:"note"`
}

type receipt struct {
	Charged int `json:"charged"`
}

func TestHandleDecodesThePayloadAndPostsTheOutput(t *testing.T) {
	api := &callbackAPI{}
	srv := httptest.NewServer(api)
	defer srv.Close()
	c, logs := loggedClient()
	got := make(chan order, 1)
	asyncd.Handle(c, "charge", func(ctx context.Context, o order) (receipt, error) {
		got <- o
		return receipt{Charged: o.OrderID * 100}, nil
	}, asyncd.LongRunning(time.Second))
	asyncd.Handle(c, "plain", func(ctx context.Context, o order) (receipt, error) {
		return receipt{Charged: 1}, nil
	})
	hdr := map[string]string{"Asyncd-Lease-Token": "tok", "Asyncd-Callback-Url": srv.URL}
	if rec := call(t, c, taskBody("charge", `{"order_id":42,"note":"n"}`), hdr); rec.Code != 202 {
		t.Fatalf("answer %d", rec.Code)
	}
	if o := <-got; o != (order{42, "n"}) {
		t.Fatalf("decoded %+v", o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	api.mu.Lock()
	res := api.results
	api.mu.Unlock()
	if len(res) != 1 || res[0]["status"] != "success" || res[0]["output"].(map[string]any)["charged"] != float64(4200) {
		t.Fatalf("results %v", res)
	}
	if rec := call(t, c, taskBody("plain", `{"order_id":1}`), hdr); rec.Code != 200 || !strings.Contains(rec.Body.String(), `"charged":1`) {
		t.Fatalf("plain answer %d %s", rec.Code, rec.Body)
	}
	// A payload that cannot decode fails permanently (422), and is logged.
	if rec := call(t, c, taskBody("plain", `{"order_id":"x"}`), hdr); rec.Code != 422 {
		t.Fatalf("undecodable payload answered %d", rec.Code)
	}
	if !strings.Contains(logs.String(), "does not decode into asyncd_test.order") {
		t.Fatalf("logs %s", logs)
	}
}

func TestShutdownCancelsHandlersAfterItsGracePeriod(t *testing.T) {
	api := &callbackAPI{}
	srv := httptest.NewServer(api)
	defer srv.Close()
	c, _ := loggedClient()
	started := make(chan struct{})
	c.RegisterExecutor("long", func(ctx context.Context, _ string) error {
		close(started)
		<-ctx.Done()
		return ctx.Err()
	}, asyncd.LongRunning(time.Minute))
	call(t, c, taskBody("long", "{}"), map[string]string{"Asyncd-Lease-Token": "tok", "Asyncd-Callback-Url": srv.URL})
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown = %v, want the grace period's end", err)
	}
	// The cancelled handler returns, and its attempt is reported for a retry.
	waitUntil(t, 5*time.Second, "the cancelled handler's result", func() bool { _, n := api.counts(); return n == 1 })
	api.mu.Lock()
	res := api.results[0]
	api.mu.Unlock()
	if res["status"] != "retry" || !strings.Contains(res["error"].(string), "shutting down") {
		t.Fatalf("result %v", res)
	}
}

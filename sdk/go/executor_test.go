package asyncd_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

func TestSignKnownVector(t *testing.T) {
	// printf '1700000000\nt1\n1\nk1\ntok\nhttp://asyncd:7700\n{}' | openssl dgst -sha256 -hmac secret
	h := http.Header{}
	for k, v := range map[string]string{
		"Asyncd-Timestamp": "1700000000", "Asyncd-Task-Id": "t1", "Asyncd-Attempt": "1",
		"Idempotency-Key": "k1", "Asyncd-Lease-Token": "tok", "Asyncd-Callback-Url": "http://asyncd:7700",
	} {
		h.Set(k, v)
	}
	got := asyncd.Sign([][]byte{[]byte("secret")}, h, []byte(`{}`))
	want := "v2=cd88cff69ddbc13aa5456dcec7bb570ba5b8bf34c7bd1cc5e47a2821be952234"
	if got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
}

// call posts an executor call as asyncd would.
func call(t *testing.T, h http.Handler, body string, hdr map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/tasks/run", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func taskBody(taskType, payload string) string {
	return fmt.Sprintf(`{"id":"0193t","type":%q,"payload":%s,"attempt":2,"eta":"2026-11-30T06:00:00.123Z"}`, taskType, payload)
}

func TestExecutorOutcomeMapping(t *testing.T) {
	c := asyncd.NewClient()
	var gotPayload string
	var gotInfo asyncd.TaskInfo
	c.RegisterExecutor("ok", func(ctx context.Context, payload string) error {
		gotPayload = payload
		gotInfo, _ = asyncd.TaskInfoFrom(ctx)
		return nil
	})
	c.RegisterExecutor("retry_later", func(context.Context, string) error { return asyncd.Retry(1500 * time.Millisecond) })
	c.RegisterExecutor("retry_backoff", func(context.Context, string) error { return asyncd.Retry(0) })
	c.RegisterExecutor("permanent", func(context.Context, string) error {
		return fmt.Errorf("charging: %w", asyncd.Permanent(errors.New("card declined")))
	})
	c.RegisterExecutor("transient", func(context.Context, string) error { return errors.New("db down") })
	c.RegisterExecutor("panics", func(context.Context, string) error { panic("nil map") })

	hdr := map[string]string{
		"Idempotency-Key": "order-42", "Asyncd-Task-Id": "0193t", "Asyncd-Attempt": "2",
		"Asyncd-Lease-Token": "tok-7", "Asyncd-Callback-Url": "http://127.0.0.1:7700",
	}
	rec := call(t, c, taskBody("ok", `{"order_id":42}`), hdr)
	if rec.Code != 200 {
		t.Fatalf("ok: %d %s", rec.Code, rec.Body)
	}
	if gotPayload != `{"order_id":42}` {
		t.Fatalf("payload = %q", gotPayload)
	}
	want := asyncd.TaskInfo{ID: "0193t", Type: "ok", IdempotencyKey: "order-42", Attempt: 2, LeaseToken: "tok-7",
		ETA: time.Date(2026, 11, 30, 6, 0, 0, 123e6, time.UTC), CallbackURL: "http://127.0.0.1:7700"}
	if gotInfo != want {
		t.Fatalf("info = %+v\nwant %+v", gotInfo, want)
	}

	cases := []struct {
		taskType   string
		status     int
		retryAfter string
	}{
		{"retry_later", 503, "2"},
		{"retry_backoff", 503, ""},
		{"permanent", 422, ""},
		{"transient", 500, ""},
		{"panics", 500, ""},
		{"unregistered", 501, ""},
	}
	for _, cs := range cases {
		rec := call(t, c, taskBody(cs.taskType, "null"), hdr)
		if rec.Code != cs.status || rec.Header().Get("Retry-After") != cs.retryAfter {
			t.Errorf("%s: %d Retry-After %q, want %d %q (%s)", cs.taskType, rec.Code, rec.Header().Get("Retry-After"), cs.status, cs.retryAfter, rec.Body)
		}
	}
	if rec := call(t, c, taskBody("permanent", "null"), hdr); !strings.Contains(rec.Body.String(), "card declined") {
		t.Errorf("permanent body %s", rec.Body)
	}
	if rec := call(t, c, `not json`, hdr); rec.Code != 400 {
		t.Errorf("garbage: %d", rec.Code)
	}
	rec = httptest.NewRecorder()
	c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != 405 {
		t.Errorf("GET: %d", rec.Code)
	}
}

func TestExecutorIdempotencyKeyFallsBackToID(t *testing.T) {
	c := asyncd.NewClient()
	var info asyncd.TaskInfo
	c.RegisterExecutor("ok", func(ctx context.Context, _ string) error {
		info, _ = asyncd.TaskInfoFrom(ctx)
		return nil
	})
	if rec := call(t, c, taskBody("ok", "1"), nil); rec.Code != 200 {
		t.Fatal(rec.Code)
	}
	if info.IdempotencyKey != "0193t" || info.Attempt != 2 {
		t.Fatalf("info = %+v", info)
	}
}

func TestExecutorSignature(t *testing.T) {
	c := asyncd.NewClient(asyncd.WithSigningSecret("new", "old"))
	calls := 0
	c.RegisterExecutor("ok", func(context.Context, string) error { calls++; return nil })
	body := taskBody("ok", "{}")
	now := time.Now().Unix()
	signed := func(key string, ts int64, attempt, b string) map[string]string {
		h := http.Header{}
		h.Set("Asyncd-Timestamp", strconv.FormatInt(ts, 10))
		h.Set("Asyncd-Task-Id", "0193t")
		h.Set("Asyncd-Attempt", attempt)
		h.Set("Asyncd-Lease-Token", "tok")
		out := map[string]string{"Asyncd-Signature": asyncd.Sign([][]byte{[]byte(key)}, h, []byte(b))}
		for k := range h {
			out[k] = h.Get(k)
		}
		return out
	}
	for _, ok := range []map[string]string{signed("new", now, "1", body), signed("old", now, "2", body)} {
		if rec := call(t, c, body, ok); rec.Code != 200 {
			t.Fatalf("signed: %d %s", rec.Code, rec.Body)
		}
	}
	for name, hdr := range map[string]map[string]string{
		"unsigned":    nil,
		"replay":      signed("new", now, "1", body),
		"mismatch":    signed("new", now, "3", body+" "),
		"unknown key": signed("other", now, "3", body),
		"stale":       signed("new", now-301, "3", body),
		// A minute past the bound: the executor reads its own clock later than now.
		"future":         signed("new", now+360, "3", body),
		"bad stamp":      {"Asyncd-Timestamp": "soon", "Asyncd-Signature": "v2=00"},
		"empty key only": signed("", now, "3", body),
	} {
		if rec := call(t, c, body, hdr); rec.Code != 401 {
			t.Errorf("%s: %d", name, rec.Code)
		}
	}
	if calls != 2 {
		t.Fatalf("handler ran %d times", calls)
	}
	empty := asyncd.NewClient(asyncd.WithSigningSecret(""))
	empty.RegisterExecutor("ok", func(context.Context, string) error { t.Error("ran with an empty key"); return nil })
	if rec := call(t, empty, body, signed("", now, "1", body)); rec.Code != 401 {
		t.Fatalf("an empty key accepted a call: %d", rec.Code)
	}
}

// callbackAPI stands in for asyncd's heartbeat and result endpoints.
type callbackAPI struct {
	mu         sync.Mutex
	heartbeats []map[string]any
	results    []map[string]any
	paths      []string // of every heartbeat and result, in order
	staleAfter int      // refuse heartbeats as stale after this many (0: never)
	// answer heartbeats with 410 task_cancelled after this many (0: never)
	cancelledAfter int
}

func (a *callbackAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var body map[string]any
	_ = json.Unmarshal(raw, &body)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.paths = append(a.paths, r.URL.Path)
	switch {
	case strings.HasSuffix(r.URL.Path, "/heartbeat"):
		a.heartbeats = append(a.heartbeats, body)
		if a.staleAfter > 0 && len(a.heartbeats) > a.staleAfter {
			w.WriteHeader(409)
			_, _ = io.WriteString(w, `{"error":{"code":"stale_lease","message":"lease lapsed"}}`)
			return
		}
		if a.cancelledAfter > 0 && len(a.heartbeats) > a.cancelledAfter {
			w.WriteHeader(410)
			_, _ = io.WriteString(w, `{"error":{"code":"task_cancelled","message":"task was cancelled","state":"cancelled"}}`)
			return
		}
		_, _ = io.WriteString(w, `{"lease_until":"2026-11-30T06:00:00.000Z"}`)
	case strings.HasSuffix(r.URL.Path, "/result"):
		a.results = append(a.results, body)
		_, _ = io.WriteString(w, `{"id":"0193t","state":"succeeded"}`)
	default:
		w.WriteHeader(404)
	}
}

func (a *callbackAPI) counts() (int, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.heartbeats), len(a.results)
}

func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestLongRunningHeartbeatsAndPostsResult(t *testing.T) {
	cases := []struct {
		name       string
		err        error
		status     string
		retryAfter string
	}{
		{"success", nil, "success", ""},
		{"permanent", asyncd.Permanent(errors.New("bad input")), "failed", ""},
		{"retry", asyncd.Retry(10 * time.Second), "retry", "10s"},
		{"error", errors.New("flaky"), "retry", ""},
	}
	for _, cs := range cases {
		t.Run(cs.name, func(t *testing.T) {
			api := &callbackAPI{}
			srv := httptest.NewServer(api)
			defer srv.Close()
			c := asyncd.NewClient(asyncd.WithEndpoint("http://127.0.0.1:1"))
			release := make(chan struct{})
			c.RegisterExecutor("long", func(ctx context.Context, payload string) error {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
				return cs.err
			}, asyncd.LongRunning(300*time.Millisecond))
			rec := call(t, c, taskBody("long", "{}"), map[string]string{
				"Asyncd-Lease-Token": "tok-7", "Asyncd-Callback-Url": srv.URL,
			})
			if rec.Code != 202 || strings.TrimSpace(rec.Body.String()) != `{"lease":"300ms"}` {
				t.Fatalf("answer %d %s", rec.Code, rec.Body)
			}
			waitUntil(t, 5*time.Second, "two heartbeats", func() bool { hb, _ := api.counts(); return hb >= 2 })
			close(release)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := c.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			api.mu.Lock()
			defer api.mu.Unlock()
			hb := api.heartbeats[0]
			if hb["lease_token"] != "tok-7" || hb["lease"] != "300ms" {
				t.Fatalf("heartbeat %v", hb)
			}
			if len(api.results) != 1 {
				t.Fatalf("%d results", len(api.results))
			}
			res := api.results[0]
			if res["lease_token"] != "tok-7" || res["status"] != cs.status {
				t.Fatalf("result %v", res)
			}
			if ra, _ := res["retry_after"].(string); ra != cs.retryAfter {
				t.Fatalf("retry_after %q", ra)
			}
			if cs.err != nil && !strings.Contains(fmt.Sprint(res["error"]), cs.err.Error()) {
				t.Fatalf("error %v", res["error"])
			}
		})
	}
}

func TestLongRunningStaleLeaseCancelsHandler(t *testing.T) {
	testRefusedHeartbeatCancelsHandler(t, &callbackAPI{staleAfter: 1})
}

// Issue 15: a task cancelled while it runs is told on the next heartbeat (410
// task_cancelled); the handler's context is cancelled and no result is posted.
func TestLongRunningCancelledTaskCancelsHandler(t *testing.T) {
	testRefusedHeartbeatCancelsHandler(t, &callbackAPI{cancelledAfter: 1})
}

func testRefusedHeartbeatCancelsHandler(t *testing.T, api *callbackAPI) {
	srv := httptest.NewServer(api)
	defer srv.Close()
	c := asyncd.NewClient()
	cancelled := make(chan error, 1)
	c.RegisterExecutor("long", func(ctx context.Context, _ string) error {
		<-ctx.Done()
		cancelled <- ctx.Err()
		return ctx.Err()
	}, asyncd.LongRunning(150*time.Millisecond))
	if rec := call(t, c, taskBody("long", "{}"), map[string]string{"Asyncd-Lease-Token": "3", "Asyncd-Callback-Url": srv.URL}); rec.Code != 202 {
		t.Fatal(rec.Code)
	}
	select {
	case err := <-cancelled:
		if !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("handler context not cancelled after a refused heartbeat")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, results := api.counts(); results != 0 {
		t.Fatalf("a result was posted for a lost lease or a cancelled task")
	}
}

func TestDurationFormatOnTheWire(t *testing.T) {
	f, c := newFake(t, 201, `{"id":"a","eta":"2026-12-01T00:00:00Z","route":"store"}`)
	for d, want := range map[time.Duration]string{
		90 * time.Second:                             "1m 30s",
		3 * 24 * time.Hour:                           "3d",
		400 * 24 * time.Hour:                         "400d",
		time.Hour + 500*time.Millisecond:             "1h 500ms",
		1500 * time.Microsecond:                      "1ms 500us",
		26*time.Hour + 3*time.Minute + 4*time.Second: "1d 2h 3m 4s",
	} {
		if _, err := c.SubmitDelayed(context.Background(), &asyncd.Task{Type: "t", IdempotencyKey: "k"}, d); err != nil {
			t.Fatal(err)
		}
		if got := f.last(t).body["delay"]; got != want {
			t.Errorf("%v on the wire as %v, want %s", d, got, want)
		}
	}
}

package asyncd_test

// Integration tests against a real `asyncd dev` process, started here from
// $ASYNCD_BIN. Without the binary they fail (they never skip): a green run must mean
// the SDK was checked against the server.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

const (
	itSecret     = "go-it-signing-secret"
	itSecretName = "go-it-signing"
	itLease      = 2 * time.Second
)

type execRecord struct {
	info    asyncd.TaskInfo
	payload string
	at      time.Time
}

// recorder keeps every executor call the tests' executor served, by task id.
type recorder struct {
	mu   sync.Mutex
	byID map[string][]execRecord
	// release unblocks go_long handlers, by task id.
	release map[string]chan struct{}
	// ctxDone is closed when a go_long handler saw its context end, by task id.
	ctxDone map[string]chan struct{}
}

func (r *recorder) add(ctx context.Context, payload string) asyncd.TaskInfo {
	info, _ := asyncd.TaskInfoFrom(ctx)
	r.mu.Lock()
	r.byID[info.ID] = append(r.byID[info.ID], execRecord{info, payload, time.Now()})
	r.mu.Unlock()
	return info
}

func (r *recorder) get(id string) []execRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]execRecord(nil), r.byID[id]...)
}

func (r *recorder) releaseChan(id string) chan struct{} {
	return r.chanOf(r.release, id)
}

func (r *recorder) ctxDoneChan(id string) chan struct{} {
	return r.chanOf(r.ctxDone, id)
}

func (r *recorder) chanOf(chans map[string]chan struct{}, id string) chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch, ok := chans[id]
	if !ok {
		ch = make(chan struct{})
		chans[id] = ch
	}
	return ch
}

type devEnv struct {
	endpoint string
	client   *asyncd.Client
	rec      *recorder
	exec     *httptest.Server
	cmd      *exec.Cmd
	exited   chan struct{}
	dir      string
	logPath  string
}

var dev struct {
	once sync.Once
	env  *devEnv
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if dev.env != nil {
		dev.env.stop()
	}
	os.Exit(code)
}

// itEnv starts (once) the asyncd dev process and the tests' executor.
func itEnv(t *testing.T) *devEnv {
	t.Helper()
	dev.once.Do(func() { dev.env, dev.err = startDev() })
	if dev.err != nil {
		t.Fatalf("integration environment: %v", dev.err)
	}
	return dev.env
}

func startDev() (*devEnv, error) {
	bin := os.Getenv("ASYNCD_BIN")
	if bin == "" {
		return nil, errors.New("ASYNCD_BIN is not set: the integration tests run a real `asyncd dev`; " +
			"build it (cargo build, binary at /var/cache/asyncd/target/debug/asyncd) and export ASYNCD_BIN")
	}
	if st, err := os.Stat(bin); err != nil || st.IsDir() {
		return nil, fmt.Errorf("ASYNCD_BIN=%s is not an asyncd binary (%v): build it first", bin, err)
	}
	dir, err := os.MkdirTemp("", "asyncd-go-it-")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	e := &devEnv{
		endpoint: fmt.Sprintf("http://127.0.0.1:%d", port),
		rec:      &recorder{byID: map[string][]execRecord{}, release: map[string]chan struct{}{}, ctxDone: map[string]chan struct{}{}},
		dir:      dir,
		logPath:  filepath.Join(dir, "asyncd.log"),
		exited:   make(chan struct{}),
	}
	e.client = asyncd.NewClient(
		asyncd.WithEndpoint(e.endpoint),
		asyncd.WithServiceName("go-it"),
		asyncd.WithSigningSecret(itSecret),
		asyncd.WithHTTPClient(&http.Client{Timeout: 10 * time.Second}),
	)
	e.registerExecutors()
	e.exec = httptest.NewServer(e.client)

	cfgDir := filepath.Join(dir, "config")
	if err := os.Mkdir(cfgDir, 0o755); err != nil {
		return nil, err
	}
	cron := e.job("go_cron", "")
	// Fires once a year, so only TriggerCron runs it within a test.
	cron.Cron = []asyncd.CronSchedule{{Name: "yearly", Schedule: "CRON_TZ=UTC 0 0 1 1 *", Payload: map[string]any{"report": "annual"}}}
	// The job of the schedule tests (schedule_integration_test.go); its spec.cron entry
	// fires once a year and is the read-only schedule "nightly" of /v1/schedules.
	sched := e.job("go_sched", "")
	sched.Cron = []asyncd.CronSchedule{{Name: "nightly", Schedule: "CRON_TZ=UTC 0 0 1 1 *", Payload: map[string]any{"report": "annual"}}}
	for _, j := range []asyncd.JobConfig{
		e.job("go_ok", ""),
		e.job("go_permanent", ""),
		e.job("go_flaky", ""),
		e.job("go_retry_after", ""),
		e.job("go_always_fails", ""),
		e.job("go_long", ""),
		e.job("go_unique", "order:{order_id}"),
		e.job("go_kafka", ""),
		// Paused by TestIntegrationExpiry while its tasks expire.
		e.job("go_expiry", ""),
		// Paused by TestIntegrationDebounceTrailing while its submits are folded.
		e.job("go_debounce", ""),
		// Throttled and leading-debounced submits (window_integration_test.go).
		e.job("go_window", ""),
		cron,
		sched,
	} {
		doc, err := j.YAML()
		if err != nil {
			return nil, err
		}
		if j.TaskType == "go_kafka" {
			// A Kafka-routed job (JobConfig has no field for it). asyncd dev has no
			// brokers, so its tasks still go to the store, but the API treats an id of
			// it that is not in the store as a task not consumed yet.
			doc += "  kafka:\n    topic: asyncd-go-it-kafka\n    partitions: 1\n"
		}
		if err := os.WriteFile(filepath.Join(cfgDir, j.Name+".yaml"), []byte(doc), 0o644); err != nil {
			return nil, err
		}
	}

	logf, err := os.Create(e.logPath)
	if err != nil {
		return nil, err
	}
	// The job's signing Secret as the operator mounts it: DIR/<secret name>/<key>.
	signingDir := filepath.Join(dir, "signing")
	if err := os.MkdirAll(filepath.Join(signingDir, itSecretName), 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(signingDir, itSecretName, "key"), []byte(itSecret), 0o600); err != nil {
		return nil, err
	}
	e.cmd = exec.Command(bin, "dev", "--config", cfgDir, "--db", filepath.Join(dir, "asyncd.db"),
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--signing-dir", signingDir)
	e.cmd.Stdout, e.cmd.Stderr = logf, logf
	if err := e.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		_ = e.cmd.Wait()
		logf.Close()
		close(e.exited)
	}()
	for _, path := range []string{"/healthz", "/readyz"} {
		if err := e.waitHTTP200(path, 60*time.Second); err != nil {
			e.stop()
			return nil, fmt.Errorf("%w\nasyncd log:\n%s", err, e.logTail())
		}
	}
	return e, nil
}

func (e *devEnv) job(taskType, uniqueKey string) asyncd.JobConfig {
	return asyncd.JobConfig{
		Name:           strings.ReplaceAll(taskType, "_", "-") + "-job",
		TaskType:       taskType,
		ExecutorURL:    e.exec.URL + "/tasks/" + taskType,
		Timeout:        10 * time.Second,
		ErrorBodies:    true,
		SigningSecret:  itSecretName,
		MaxRetries:     asyncd.Retries(2),
		Backoff:        "exponential",
		InitialBackoff: 100 * time.Millisecond,
		MaxBackoff:     500 * time.Millisecond,
		UniqueKey:      uniqueKey,
	}
}

func (e *devEnv) registerExecutors() {
	c, rec := e.client, e.rec
	c.RegisterExecutor("go_ok", func(ctx context.Context, payload string) error {
		rec.add(ctx, payload)
		return nil
	})
	c.RegisterExecutor("go_unique", func(ctx context.Context, payload string) error {
		rec.add(ctx, payload)
		return nil
	})
	c.RegisterExecutor("go_expiry", func(ctx context.Context, payload string) error {
		// A "retry" task asks for its retry well after its expiry.
		if rec.add(ctx, payload).Attempt == 1 && payload == `"retry"` {
			return asyncd.Retry(30 * time.Second)
		}
		return nil
	})
	for _, taskType := range []string{"go_debounce", "go_window"} {
		c.RegisterExecutor(taskType, func(ctx context.Context, payload string) error {
			rec.add(ctx, payload)
			return nil
		})
	}
	for _, taskType := range []string{"go_cron", "go_sched"} {
		c.RegisterExecutor(taskType, func(ctx context.Context, payload string) error {
			rec.add(ctx, payload)
			return nil
		})
	}
	c.RegisterExecutor("go_permanent", func(ctx context.Context, payload string) error {
		rec.add(ctx, payload)
		return asyncd.Permanent(errors.New("bad order"))
	})
	c.RegisterExecutor("go_flaky", func(ctx context.Context, payload string) error {
		if rec.add(ctx, payload).Attempt == 1 {
			return errors.New("flaky dependency")
		}
		return nil
	})
	c.RegisterExecutor("go_retry_after", func(ctx context.Context, payload string) error {
		if rec.add(ctx, payload).Attempt == 1 {
			return asyncd.Retry(time.Second)
		}
		return nil
	})
	c.RegisterExecutor("go_always_fails", func(ctx context.Context, payload string) error {
		rec.add(ctx, payload)
		return errors.New("always down")
	})
	c.RegisterExecutor("go_long", func(ctx context.Context, payload string) error {
		info := rec.add(ctx, payload)
		select {
		case <-rec.releaseChan(info.ID):
			return nil
		case <-ctx.Done():
			close(rec.ctxDoneChan(info.ID))
			return ctx.Err()
		}
	}, asyncd.LongRunning(itLease))
}

func (e *devEnv) waitHTTP200(path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	hc := &http.Client{Timeout: time.Second}
	last := "no answer"
	for time.Now().Before(deadline) {
		select {
		case <-e.exited:
			return fmt.Errorf("asyncd dev exited before %s answered 200", path)
		default:
		}
		resp, err := hc.Get(e.endpoint + path)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("GET %s did not answer 200 within %v (last: %s)", path, timeout, last)
}

func (e *devEnv) stop() {
	if e.cmd != nil && e.cmd.Process != nil {
		_ = e.cmd.Process.Kill()
		<-e.exited
	}
	if e.exec != nil {
		e.exec.Close()
	}
	_ = os.RemoveAll(e.dir)
}

func (e *devEnv) logTail() string {
	raw, _ := os.ReadFile(e.logPath)
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitState polls the task until it is in state, failing with its last seen shape.
func (e *devEnv) waitState(t *testing.T, id, state string, timeout time.Duration) *asyncd.TaskStatus {
	t.Helper()
	var last *asyncd.TaskStatus
	var lastErr error
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		last, lastErr = e.client.Get(context.Background(), id)
		if lastErr == nil && last.State == state {
			return last
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("task %s not %s within %v: last %+v, err %v\nasyncd log:\n%s", id, state, timeout, last, lastErr, e.logTail())
	return nil
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func uniq(prefix string) string { return fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano()) }

func submit(t *testing.T, e *devEnv, task *asyncd.Task) *asyncd.SubmitResult {
	t.Helper()
	if task.IdempotencyKey == "" {
		task.IdempotencyKey = uniq("k")
	}
	res, err := e.client.Submit(ctx(t), task)
	if err != nil {
		t.Fatalf("submit %s: %v", task.Type, err)
	}
	return res
}

func wantAPIError(t *testing.T, err error, sentinel *asyncd.APIError, status int, field string) *asyncd.APIError {
	t.Helper()
	var apiErr *asyncd.APIError
	if !errors.As(err, &apiErr) || !errors.Is(err, sentinel) {
		t.Fatalf("err = %v, want code %s", err, sentinel.Code)
	}
	if apiErr.Status != status || (field != "" && apiErr.Field != field) {
		t.Fatalf("err = %+v, want status %d field %q", apiErr, status, field)
	}
	return apiErr
}

var unknownID = "01934a6e-0000-7000-8000-000000000000"

func TestIntegrationSubmitRunsExecutor(t *testing.T) {
	e := itEnv(t)
	payload := map[string]any{"order_id": 42, "note": "héllo"}
	key, err := asyncd.IdempotencyKeyFrom("go_ok", payload, "order_id", "note")
	if err != nil {
		t.Fatal(err)
	}
	key += uniq("")
	res := submit(t, e, &asyncd.Task{Type: "go_ok", Payload: payload, IdempotencyKey: key, Priority: 3})
	if res.ID == "" || res.Duplicate || (res.Route != "store" && res.Route != "kafka") {
		t.Fatalf("submit = %+v", res)
	}
	got := e.waitState(t, res.ID, asyncd.StateSucceeded, 20*time.Second)
	if got.Type != "go_ok" || got.Attempt != 1 || got.IdempotencyKey != key || got.Priority != 3 || got.CreatedAt.IsZero() {
		t.Fatalf("task = %+v", got)
	}
	var gotPayload map[string]any
	if err := json.Unmarshal(got.Payload, &gotPayload); err != nil || gotPayload["note"] != "héllo" {
		t.Fatalf("payload %s (%v)", got.Payload, err)
	}
	runs := e.rec.get(res.ID)
	if len(runs) != 1 {
		t.Fatalf("%d executions", len(runs))
	}
	r := runs[0]
	if r.info.IdempotencyKey != key || r.info.Attempt != 1 || r.info.Type != "go_ok" || r.info.CallbackURL == "" {
		t.Fatalf("executor saw %+v", r.info)
	}
	if err := json.Unmarshal([]byte(r.payload), &gotPayload); err != nil || gotPayload["order_id"] != 42.0 {
		t.Fatalf("executor payload %s", r.payload)
	}
	if r.at.Before(res.ETA.Add(-time.Millisecond)) {
		t.Fatalf("ran at %v, before its ETA %v", r.at, res.ETA)
	}
}

func TestIntegrationIdempotentDuplicateReturnsFirstID(t *testing.T) {
	e := itEnv(t)
	key := uniq("dup")
	first := submit(t, e, &asyncd.Task{Type: "go_ok", Payload: 1, IdempotencyKey: key})
	second := submit(t, e, &asyncd.Task{Type: "go_ok", Payload: 1, IdempotencyKey: key})
	if first.Duplicate || !second.Duplicate || second.ID != first.ID || !second.ETA.Equal(first.ETA) {
		t.Fatalf("first %+v, second %+v", first, second)
	}
	// The key with another payload is another request: refused, naming the first task.
	_, err := e.client.Submit(ctx(t), &asyncd.Task{Type: "go_ok", Payload: 2, IdempotencyKey: key})
	var apiErr *asyncd.APIError
	if !errors.Is(err, asyncd.ErrIdempotencyMismatch) || !errors.As(err, &apiErr) || apiErr.Status != 409 ||
		apiErr.ExistingID != first.ID || apiErr.Field != "idempotency_key" || asyncd.IsRetryable(err) {
		t.Fatalf("another payload under the key: %v", err)
	}
	e.waitState(t, first.ID, asyncd.StateSucceeded, 20*time.Second)
	if n := len(e.rec.get(first.ID)); n != 1 {
		t.Fatalf("executed %d times", n)
	}
}

func TestIntegrationDelayedAtAndCancel(t *testing.T) {
	e := itEnv(t)
	before := time.Now()
	res, err := e.client.SubmitDelayed(ctx(t), &asyncd.Task{Type: "go_ok", IdempotencyKey: uniq("delayed")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if d := res.ETA.Sub(before); d < time.Hour-time.Second || d > time.Hour+10*time.Second {
		t.Fatalf("eta %v is %v away, want 1h", res.ETA, d)
	}
	got, err := e.client.Get(ctx(t), res.ID)
	if err != nil || (got.State != asyncd.StatePending && got.State != asyncd.StateClaimed) {
		t.Fatalf("get = %+v, %v", got, err)
	}
	if err := e.client.Cancel(ctx(t), res.ID); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, res.ID, asyncd.StateCancelled, 5*time.Second)
	apiErr := wantAPIError(t, e.client.Cancel(ctx(t), res.ID), asyncd.ErrNotCancellable, 409, "")
	if apiErr.State != "" && apiErr.State != asyncd.StateCancelled {
		t.Fatalf("not_cancellable names state %q", apiErr.State)
	}

	eta := time.Now().Add(2 * time.Hour).Truncate(time.Millisecond)
	at, err := e.client.SubmitAt(ctx(t), &asyncd.Task{Type: "go_ok", IdempotencyKey: uniq("at")}, eta)
	if err != nil {
		t.Fatal(err)
	}
	if !at.ETA.Equal(eta) {
		t.Fatalf("eta %v, asked %v", at.ETA, eta)
	}
	if err := e.client.Cancel(ctx(t), at.ID); err != nil {
		t.Fatal(err)
	}

	soon, err := e.client.SubmitDelayed(ctx(t), &asyncd.Task{Type: "go_ok", IdempotencyKey: uniq("soon")}, 700*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	e.waitState(t, soon.ID, asyncd.StateSucceeded, 20*time.Second)
	if runs := e.rec.get(soon.ID); len(runs) != 1 || runs[0].at.Before(soon.ETA) {
		t.Fatalf("runs %+v before ETA %v", runs, soon.ETA)
	}
}

// Change moves a waiting task's due time and replaces its payload and priority, its id
// kept; the attempt then runs with the new values, and a change after it is refused.
func TestIntegrationChange(t *testing.T) {
	e := itEnv(t)
	res, err := e.client.SubmitDelayed(ctx(t), &asyncd.Task{Type: "go_ok", Payload: map[string]any{"v": 1}, IdempotencyKey: uniq("change")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	five := 5
	got, err := e.client.Change(ctx(t), res.ID, asyncd.Change{Payload: map[string]any{"v": 2}, Priority: &five})
	if err != nil || got.ID != res.ID || got.Priority != 5 || string(got.Payload) != `{"v":2}` || !got.ETA.Equal(res.ETA) {
		t.Fatalf("change = %+v, %v", got, err)
	}
	if n := len(e.rec.get(res.ID)); n != 0 {
		t.Fatalf("ran %d times an hour early", n)
	}
	if _, err := e.client.Change(ctx(t), res.ID, asyncd.Change{RunNow: true}); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, res.ID, asyncd.StateSucceeded, 20*time.Second)
	runs := e.rec.get(res.ID)
	if len(runs) != 1 || runs[0].payload != `{"v":2}` {
		t.Fatalf("runs %+v, want one with the changed payload", runs)
	}
	_, err = e.client.Change(ctx(t), res.ID, asyncd.Change{RunNow: true})
	apiErr := wantAPIError(t, err, asyncd.ErrTaskStarted, 409, "")
	if apiErr.State != asyncd.StateSucceeded {
		t.Fatalf("task_started names state %q", apiErr.State)
	}
	_, err = e.client.Change(ctx(t), res.ID, asyncd.Change{Delay: time.Minute, ETA: time.Now()})
	if err == nil {
		t.Fatal("a change with both a delay and an ETA was sent")
	}
}

// Issue 15: Cancel with CancelInJob reaches a Kafka-routed task that no dispatcher has
// consumed (an id never submitted to go_kafka stands for one, as asyncd dev has no
// brokers): a plain Cancel cannot tell it from an unknown id; with the job it is
// recorded as cancelled. A stored task is cancelled with the job as without it, and a
// job no config declares is refused.
func TestIntegrationCancelInJob(t *testing.T) {
	e := itEnv(t)
	unconsumed := fmt.Sprintf("01934a6e-0000-7000-8000-%012x", time.Now().UnixNano()&0xffffffffffff)
	wantAPIError(t, e.client.Cancel(ctx(t), unconsumed), asyncd.ErrNotFound, 404, "")
	if err := e.client.Cancel(ctx(t), unconsumed, asyncd.CancelInJob("go-kafka-job")); err != nil {
		t.Fatal(err)
	}
	got, err := e.client.Get(ctx(t), unconsumed)
	if err != nil || got.State != asyncd.StateCancelled || !strings.Contains(got.LastError, "before it was consumed from Kafka") {
		t.Fatalf("get %s = %+v, %v", unconsumed, got, err)
	}

	waiting, err := e.client.SubmitDelayed(ctx(t), &asyncd.Task{Type: "go_ok", IdempotencyKey: uniq("in-job")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	wantAPIError(t, e.client.Cancel(ctx(t), waiting.ID, asyncd.CancelInJob("no-such-job")), asyncd.ErrInvalidField, 400, "job")
	if err := e.client.Cancel(ctx(t), waiting.ID, asyncd.CancelInJob("go-ok-job")); err != nil {
		t.Fatal(err)
	}
	e.waitState(t, waiting.ID, asyncd.StateCancelled, 5*time.Second)
}

// ChangeInJob reaches a Kafka-routed task that no dispatcher has consumed (an id never
// submitted to go_kafka stands for one, as asyncd dev has no brokers): Change cannot tell
// it from an unknown id; with the job the change is recorded (202, Pending), and a second
// one too. A stored task is changed with the job as without it (200, Task) — asyncd dev
// ignores ?job= for a job without Kafka — and a job no config declares is refused.
func TestIntegrationChangeInJob(t *testing.T) {
	e := itEnv(t)
	unconsumed := fmt.Sprintf("01934a6e-0001-7000-8000-%012x", time.Now().UnixNano()&0xffffffffffff)
	seven := 7
	_, err := e.client.Change(ctx(t), unconsumed, asyncd.Change{Priority: &seven})
	wantAPIError(t, err, asyncd.ErrNotFound, 404, "")
	want := asyncd.PendingChange{ID: unconsumed, Job: "go-kafka-job", Type: "go_kafka"}
	for _, change := range []asyncd.Change{{Priority: &seven}, {Delay: time.Hour, Payload: map[string]any{"v": 2}}} {
		res, err := e.client.ChangeInJob(ctx(t), "go-kafka-job", unconsumed, change)
		if err != nil || res.Task != nil || res.Pending == nil || *res.Pending != want {
			t.Fatalf("change in job of an unconsumed task = %+v, %v", res, err)
		}
	}

	waiting, err := e.client.SubmitDelayed(ctx(t), &asyncd.Task{Type: "go_ok", Payload: map[string]any{"v": 1}, IdempotencyKey: uniq("change-in-job")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.client.ChangeInJob(ctx(t), "go-ok-job", waiting.ID, asyncd.Change{Payload: map[string]any{"v": 2}, Priority: &seven})
	if err != nil || res.Pending != nil || res.Task == nil || res.Task.ID != waiting.ID || res.Task.Priority != 7 ||
		string(res.Task.Payload) != `{"v":2}` || res.Task.State != asyncd.StatePending {
		t.Fatalf("change in job of a stored task = %+v, %v", res, err)
	}
	_, err = e.client.ChangeInJob(ctx(t), "no-such-job", waiting.ID, asyncd.Change{RunNow: true})
	wantAPIError(t, err, asyncd.ErrInvalidField, 400, "job")
	if err := e.client.Cancel(ctx(t), waiting.ID); err != nil {
		t.Fatal(err)
	}
}

// CancelUnique cancels the job's unfinished task holding the key, and only that one.
func TestIntegrationCancelUnique(t *testing.T) {
	e := itEnv(t)
	ukey := uniq("cancel-by-key")
	held, err := e.client.SubmitDelayed(ctx(t), &asyncd.Task{Type: "go_ok", UniqueKey: ukey, IdempotencyKey: uniq("u")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := e.client.SubmitDelayed(ctx(t), &asyncd.Task{Type: "go_ok", UniqueKey: uniq("other-key"), IdempotencyKey: uniq("u")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// Another job's name: its tasks hold no such key.
	_, err = e.client.CancelUnique(ctx(t), "go-unique-job", ukey)
	wantAPIError(t, err, asyncd.ErrNotFound, 404, "")
	res, err := e.client.CancelUnique(ctx(t), "go-ok-job", ukey)
	if err != nil || res.ID != held.ID || res.State != asyncd.StateCancelled {
		t.Fatalf("cancel unique = %+v, %v; want %s cancelled", res, err, held.ID)
	}
	e.waitState(t, held.ID, asyncd.StateCancelled, 5*time.Second)
	if got, err := e.client.Get(ctx(t), other.ID); err != nil || got.State == asyncd.StateCancelled {
		t.Fatalf("the task holding another key: %+v, %v", got, err)
	}
	_, err = e.client.CancelUnique(ctx(t), "go-ok-job", ukey)
	wantAPIError(t, err, asyncd.ErrNotFound, 404, "")
	if err := e.client.Cancel(ctx(t), other.ID); err != nil {
		t.Fatal(err)
	}
}

// TriggerCron fires the entry now: a task of the job's type with the entry's payload,
// which the executor runs.
func TestIntegrationTriggerCron(t *testing.T) {
	e := itEnv(t)
	before := time.Now()
	fired, err := e.client.TriggerCron(ctx(t), "go-cron-job", "yearly")
	if err != nil {
		t.Fatal(err)
	}
	if fired.ID == "" || fired.Job != "go-cron-job" || fired.Entry != "yearly" || fired.Type != "go_cron" ||
		fired.ETA.Before(before.Add(-time.Second)) || fired.ETA.After(time.Now().Add(time.Second)) {
		t.Fatalf("trigger = %+v, want a go_cron task due now", fired)
	}
	e.waitState(t, fired.ID, asyncd.StateSucceeded, 20*time.Second)
	runs := e.rec.get(fired.ID)
	if len(runs) != 1 || runs[0].payload != `{"report":"annual"}` {
		t.Fatalf("runs of the fired task: %+v", runs)
	}
	again, err := e.client.TriggerCron(ctx(t), "go-cron-job", "yearly")
	if err != nil || again.ID == fired.ID {
		t.Fatalf("a second trigger = %+v, %v; want a new task", again, err)
	}
	e.waitState(t, again.ID, asyncd.StateSucceeded, 20*time.Second)

	_, err = e.client.TriggerCron(ctx(t), "go-cron-job", "hourly")
	wantAPIError(t, err, asyncd.ErrNotFound, 404, "entry")
	_, err = e.client.TriggerCron(ctx(t), "no-such-job", "yearly")
	wantAPIError(t, err, asyncd.ErrNotFound, 404, "name")
}

func TestIntegrationCancelFinishedTask(t *testing.T) {
	e := itEnv(t)
	res := submit(t, e, &asyncd.Task{Type: "go_ok"})
	e.waitState(t, res.ID, asyncd.StateSucceeded, 20*time.Second)
	apiErr := wantAPIError(t, e.client.Cancel(ctx(t), res.ID), asyncd.ErrNotCancellable, 409, "")
	if apiErr.State != "" && apiErr.State != asyncd.StateSucceeded {
		t.Fatalf("not_cancellable names state %q", apiErr.State)
	}
	wantAPIError(t, func() error { _, err := e.client.Redrive(ctx(t), res.ID); return err }(), asyncd.ErrNotDead, 409, "")
}

func TestIntegrationRequestErrors(t *testing.T) {
	e := itEnv(t)
	c := e.client
	_, err := c.Submit(ctx(t), &asyncd.Task{Type: "no_such_type", IdempotencyKey: uniq("k")})
	wantAPIError(t, err, asyncd.ErrUnknownTaskType, 400, "type")

	_, err = c.Submit(ctx(t), &asyncd.Task{Type: "go_ok", IdempotencyKey: uniq("k"), Priority: 10})
	wantAPIError(t, err, asyncd.ErrInvalidField, 400, "priority")

	_, err = c.Submit(ctx(t), &asyncd.Task{Type: "go_ok", IdempotencyKey: uniq("k"), MaxRetries: asyncd.Retries(101)})
	wantAPIError(t, err, asyncd.ErrInvalidField, 400, "max_retries")

	_, err = c.Submit(ctx(t), &asyncd.Task{Type: "go_ok", IdempotencyKey: strings.Repeat("k", 256)})
	wantAPIError(t, err, asyncd.ErrInvalidField, 400, "idempotency_key")

	_, err = c.SubmitDelayed(ctx(t), &asyncd.Task{Type: "go_ok", IdempotencyKey: uniq("k")}, 401*24*time.Hour)
	wantAPIError(t, err, asyncd.ErrInvalidField, 400, "delay")

	_, err = c.Submit(ctx(t), &asyncd.Task{Type: "go_ok", IdempotencyKey: uniq("k"), Payload: strings.Repeat("x", 1<<20+1024)}) // over the 1 MiB payload limit, within the body limit
	wantAPIError(t, err, asyncd.ErrPayloadTooLarge, 413, "payload")

	_, err = c.Get(ctx(t), unknownID)
	wantAPIError(t, err, asyncd.ErrNotFound, 404, "")
	wantAPIError(t, c.Cancel(ctx(t), unknownID), asyncd.ErrNotFound, 404, "")
	_, err = c.Redrive(ctx(t), unknownID)
	wantAPIError(t, err, asyncd.ErrNotFound, 404, "")

	// Missing idempotency key never reaches the server.
	_, err = c.Submit(ctx(t), &asyncd.Task{Type: "go_ok"})
	if !errors.Is(err, asyncd.ErrMissingIdempotencyKey) {
		t.Fatalf("err = %v", err)
	}
}

func TestIntegrationUniqueConflict(t *testing.T) {
	e := itEnv(t)
	order := time.Now().UnixNano()
	first, err := e.client.SubmitDelayed(ctx(t), &asyncd.Task{Type: "go_unique", Payload: map[string]any{"order_id": order}, IdempotencyKey: uniq("u1")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.client.SubmitDelayed(ctx(t), &asyncd.Task{Type: "go_unique", Payload: map[string]any{"order_id": order}, IdempotencyKey: uniq("u2")}, time.Hour)
	apiErr := wantAPIError(t, err, asyncd.ErrUniqueConflict, 409, "")
	if apiErr.ExistingID != first.ID {
		t.Fatalf("existing_id %q, want %q", apiErr.ExistingID, first.ID)
	}
	got, err := e.client.Get(ctx(t), first.ID)
	if err != nil || got.UniqueKey != fmt.Sprintf("order:%d", order) {
		t.Fatalf("rendered unique key %q (%v)", got.UniqueKey, err)
	}

	// An explicit unique key, freed again once its holder is no longer pending.
	ukey := uniq("explicit")
	held, err := e.client.SubmitDelayed(ctx(t), &asyncd.Task{Type: "go_ok", UniqueKey: ukey, IdempotencyKey: uniq("u3")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.client.Submit(ctx(t), &asyncd.Task{Type: "go_ok", UniqueKey: ukey, IdempotencyKey: uniq("u4")})
	wantAPIError(t, err, asyncd.ErrUniqueConflict, 409, "")
	if err := e.client.Cancel(ctx(t), held.ID); err != nil {
		t.Fatal(err)
	}
	again := submit(t, e, &asyncd.Task{Type: "go_ok", UniqueKey: ukey})
	e.waitState(t, again.ID, asyncd.StateSucceeded, 20*time.Second)
	if err := e.client.Cancel(ctx(t), first.ID); err != nil {
		t.Fatal(err)
	}
}

func TestIntegrationPermanentFailureDeadLettersAndRedrive(t *testing.T) {
	e := itEnv(t)
	res := submit(t, e, &asyncd.Task{Type: "go_permanent", Payload: map[string]any{"order_id": 9}})
	dead := e.waitState(t, res.ID, asyncd.StateDead, 20*time.Second)
	if dead.Attempt != 1 || !strings.Contains(dead.LastError, "bad order") {
		t.Fatalf("dead task %+v: a 422 must not be retried and its error kept", dead)
	}
	items, err := e.client.DeadLetters(ctx(t), "go_permanent", 1000)
	if err != nil {
		t.Fatal(err)
	}
	if !containsID(items, res.ID) {
		t.Fatalf("dead letters %+v lack %s", items, res.ID)
	}
	for _, it := range items {
		if it.Type != "go_permanent" || it.State != asyncd.StateDead {
			t.Fatalf("dead letters filtered by type hold %+v", it)
		}
	}
	if one, err := e.client.DeadLetters(ctx(t), "", 1); err != nil || len(one) != 1 {
		t.Fatalf("limit 1 gave %d items (%v)", len(one), err)
	}

	rd, err := e.client.Redrive(ctx(t), res.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rd.ID != res.ID || rd.State != asyncd.StatePending {
		t.Fatalf("redrive = %+v", rd)
	}
	// It runs again (attempts reset) and, failing permanently again, is dead again.
	waitUntil(t, 20*time.Second, "the redriven task to run", func() bool { return len(e.rec.get(res.ID)) == 2 })
	again := e.waitState(t, res.ID, asyncd.StateDead, 20*time.Second)
	if again.Attempt != 1 {
		t.Fatalf("attempt after redrive = %d, want 1 (reset)", again.Attempt)
	}
	if runs := e.rec.get(res.ID); runs[1].info.Attempt != 1 {
		t.Fatalf("executor saw attempt %d after redrive", runs[1].info.Attempt)
	}
}

func containsID(items []asyncd.TaskStatus, id string) bool {
	for _, it := range items {
		if it.ID == id {
			return true
		}
	}
	return false
}

func TestIntegrationRetries(t *testing.T) {
	e := itEnv(t)
	flaky := submit(t, e, &asyncd.Task{Type: "go_flaky"})
	after := submit(t, e, &asyncd.Task{Type: "go_retry_after"})
	always := submit(t, e, &asyncd.Task{Type: "go_always_fails", MaxRetries: asyncd.Retries(1)})

	if got := e.waitState(t, flaky.ID, asyncd.StateSucceeded, 20*time.Second); got.Attempt != 2 {
		t.Fatalf("flaky attempts = %d", got.Attempt)
	}
	if got := e.waitState(t, after.ID, asyncd.StateSucceeded, 20*time.Second); got.Attempt != 2 {
		t.Fatalf("retry-after attempts = %d", got.Attempt)
	}
	runs := e.rec.get(after.ID)
	if len(runs) != 2 || runs[1].at.Sub(runs[0].at) < 900*time.Millisecond {
		t.Fatalf("Retry(1s) not honoured: runs %v apart", runs[1].at.Sub(runs[0].at))
	}
	dead := e.waitState(t, always.ID, asyncd.StateDead, 20*time.Second)
	if dead.Attempt != 2 || len(e.rec.get(always.ID)) != 2 || dead.MaxRetries != 1 {
		t.Fatalf("max_retries 1: %+v after %d runs", dead, len(e.rec.get(always.ID)))
	}
}

func TestIntegrationSubmitBatch(t *testing.T) {
	e := itEnv(t)
	seen := submit(t, e, &asyncd.Task{Type: "go_ok", Payload: "first"})
	res, err := e.client.SubmitBatch(ctx(t), []*asyncd.Task{
		{Type: "go_ok", Payload: map[string]any{"n": 1}, IdempotencyKey: uniq("b1")},
		{Type: "no_such_type", IdempotencyKey: uniq("b2")},
		{Type: "go_ok", IdempotencyKey: uniq("b3"), Delay: time.Hour},
		{Type: "go_ok", Payload: "first", IdempotencyKey: func() string { got, _ := e.client.Get(ctx(t), seen.ID); return got.IdempotencyKey }()},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Status != 201 || res[0].Err != nil || res[0].ID == "" {
		t.Fatalf("item 0 %+v", res[0])
	}
	if res[1].Status != 400 || res[1].Err == nil || res[1].Err.Code != asyncd.CodeUnknownTaskType || res[1].Err.Field != "type" {
		t.Fatalf("item 1 %+v", res[1])
	}
	if res[2].Status != 201 || res[2].ETA.Before(time.Now().Add(59*time.Minute)) {
		t.Fatalf("item 2 %+v", res[2])
	}
	if res[3].Status != 200 || !res[3].Duplicate || res[3].ID != seen.ID {
		t.Fatalf("item 3 %+v", res[3])
	}
	e.waitState(t, res[0].ID, asyncd.StateSucceeded, 20*time.Second)
	if err := e.client.Cancel(ctx(t), res[2].ID); err != nil {
		t.Fatal(err)
	}
}

func TestIntegrationDependsOn(t *testing.T) {
	e := itEnv(t)
	parent, err := e.client.SubmitDelayed(ctx(t), &asyncd.Task{Type: "go_ok", IdempotencyKey: uniq("parent")}, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	child := submit(t, e, &asyncd.Task{Type: "go_ok", DependsOn: []string{parent.ID}})
	got, err := e.client.Get(ctx(t), child.ID)
	if err != nil || got.State != asyncd.StateBlocked || len(got.DependsOn) != 1 || got.DependsOn[0] != parent.ID {
		t.Fatalf("child = %+v (%v)", got, err)
	}
	e.waitState(t, child.ID, asyncd.StateSucceeded, 20*time.Second)
	p, c := e.rec.get(parent.ID), e.rec.get(child.ID)
	if len(p) != 1 || len(c) != 1 || c[0].at.Before(p[0].at) {
		t.Fatalf("child ran before its dependency")
	}

	doomed, err := e.client.SubmitDelayed(ctx(t), &asyncd.Task{Type: "go_ok", IdempotencyKey: uniq("doomed")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	orphan := submit(t, e, &asyncd.Task{Type: "go_ok", DependsOn: []string{doomed.ID}})
	if err := e.client.Cancel(ctx(t), doomed.ID); err != nil {
		t.Fatal(err)
	}
	dead := e.waitState(t, orphan.ID, asyncd.StateDead, 20*time.Second)
	if !strings.Contains(dead.LastError, "dependency") || len(e.rec.get(orphan.ID)) != 0 {
		t.Fatalf("orphan %+v", dead)
	}
}

func TestIntegrationLongRunningKeepsLease(t *testing.T) {
	e := itEnv(t)
	// A short timeout keeps the attempt's first lease (timeout + the dispatcher's
	// grace) short enough to outlast here.
	res := submit(t, e, &asyncd.Task{Type: "go_long", Timeout: time.Second})
	waitUntil(t, 20*time.Second, "the long-running handler to start", func() bool { return len(e.rec.get(res.ID)) == 1 })
	// Hold the handler until its first lease has lapsed by a margin longer than the
	// rescuer's pass: only heartbeats keep the attempt alive past it (a lapsed lease
	// would start attempt 2), and they move lease_until forward.
	first := e.lease(t, res.ID)
	if first.State != asyncd.StateRunning || first.Attempt != 1 || first.LeaseUntil == nil {
		t.Fatalf("the started long task is %+v", first)
	}
	firstUntil := *first.LeaseUntil
	deadline := firstUntil.Add(20 * time.Second)
	for {
		got := e.lease(t, res.ID)
		if got.State != asyncd.StateRunning || got.Attempt != 1 || got.LeaseUntil == nil {
			t.Fatalf("while the handler works (first lease until %v) the task is %+v\nasyncd log:\n%s", firstUntil, got, e.logTail())
		}
		if now := time.Now(); now.After(firstUntil.Add(time.Second)) {
			if !got.LeaseUntil.After(now) {
				t.Fatalf("the lease was not extended past %v: %+v", now, got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("first lease_until %v never passed", firstUntil)
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(e.rec.releaseChan(res.ID))
	got := e.waitState(t, res.ID, asyncd.StateSucceeded, 20*time.Second)
	if got.Attempt != 1 || len(e.rec.get(res.ID)) != 1 {
		t.Fatalf("long task %+v ran %d times", got, len(e.rec.get(res.ID)))
	}
}

// Issue 15: a task cancelled while its handler runs is cancelled in the handler. The
// executor helper learns it on its next heartbeat (410 task_cancelled) and cancels the
// handler's context; the task ends cancelled after its one attempt.
func TestIntegrationCancelRunningTaskCancelsTheHandlersContext(t *testing.T) {
	e := itEnv(t)
	res := submit(t, e, &asyncd.Task{Type: "go_long"})
	waitUntil(t, 20*time.Second, "the long-running handler to start", func() bool { return len(e.rec.get(res.ID)) == 1 })
	if got := e.lease(t, res.ID); got.State != asyncd.StateRunning {
		t.Fatalf("the started long task is %+v", got)
	}
	if err := e.client.Cancel(ctx(t), res.ID); err != nil {
		t.Fatalf("cancel the running task: %v", err)
	}
	select {
	case <-e.rec.ctxDoneChan(res.ID):
	case <-time.After(20 * time.Second):
		t.Fatalf("the handler's context was not cancelled within 20s of the cancel\nasyncd log:\n%s", e.logTail())
	}
	got := e.waitState(t, res.ID, asyncd.StateCancelled, 5*time.Second)
	if got.Attempt != 1 || len(e.rec.get(res.ID)) != 1 {
		t.Fatalf("cancelled task %+v ran %d times", got, len(e.rec.get(res.ID)))
	}
}

// leaseView is the part of GET /v1/tasks/{id} the lease test watches; TaskStatus
// leaves lease_until out.
type leaseView struct {
	State      string     `json:"state"`
	Attempt    int        `json:"attempt"`
	LeaseUntil *time.Time `json:"lease_until"`
}

func (e *devEnv) lease(t *testing.T, id string) leaseView {
	t.Helper()
	resp, err := http.Get(e.endpoint + "/v1/tasks/" + id)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var v leaseView
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET task %s: %s %s", id, resp.Status, raw)
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("GET task %s: %v in %s", id, err, raw)
	}
	return v
}

func TestIntegrationSourceServiceMetric(t *testing.T) {
	e := itEnv(t)
	submit(t, e, &asyncd.Task{Type: "go_ok"})
	resp, err := http.Get(e.endpoint + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "asyncd_task_submitted_total{") && strings.Contains(line, `source_service="go-it"`) && strings.Contains(line, `task_type="go_ok"`) {
			return
		}
	}
	t.Fatalf("no asyncd_task_submitted_total sample for source_service go-it:\n%s", raw)
}

// Expiry, end to end: while its job is paused no attempt can begin, so a task given
// StartWithin or ExpiresAt ends expired once that passes, with the expires_at the
// server computed from what the SDK sent, and search finds it by state. After the job
// resumes, a task submitted beside them without expiry runs, and the expired ones
// never reach the executor.
func TestIntegrationExpiry(t *testing.T) {
	e := itEnv(t)
	const job = "go-expiry-job"
	if st, err := e.client.PauseJob(ctx(t), job); err != nil || !st.Paused {
		t.Fatalf("pause %s = %+v, %v", job, st, err)
	}
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			_, _ = e.client.ResumeJob(context.Background(), job)
		}
	})

	within := submit(t, e, &asyncd.Task{Type: "go_expiry", Payload: "within", StartWithin: time.Second})
	// Milliseconds, as the API keeps times.
	at := time.Now().Add(1500 * time.Millisecond).Truncate(time.Millisecond)
	until := submit(t, e, &asyncd.Task{Type: "go_expiry", Payload: "until", ExpiresAt: at})
	control := submit(t, e, &asyncd.Task{Type: "go_expiry", Payload: "control"})

	// Before expiring: waiting, with expires_at start_within after its due time, or
	// the time asked; the control task never expires.
	wantExpiry := map[string]time.Time{within.ID: within.ETA.Add(time.Second), until.ID: at}
	for id, want := range wantExpiry {
		got, err := e.client.Get(ctx(t), id)
		if err != nil {
			t.Fatal(err)
		}
		if got.ExpiresAt == nil || !got.ExpiresAt.Equal(want) {
			t.Fatalf("task %s: expires_at %v, want %v", id, got.ExpiresAt, want)
		}
		if got.State == asyncd.StateExpired && time.Now().Before(want) {
			t.Fatalf("task %s expired before its expires_at %v", id, want)
		}
	}
	if got, err := e.client.Get(ctx(t), control.ID); err != nil || got.ExpiresAt != nil ||
		(got.State != asyncd.StatePending && got.State != asyncd.StateClaimed) {
		t.Fatalf("the control task = %+v (expires_at %v), %v", got, got.ExpiresAt, err)
	}

	for id, want := range wantExpiry {
		got := e.waitState(t, id, asyncd.StateExpired, 20*time.Second)
		if got.ExpiresAt == nil || !got.ExpiresAt.Equal(want) || got.Attempt != 0 || got.UpdatedAt.Before(want) {
			t.Fatalf("expired task %+v (expires_at %v), want expires_at %v, no attempt, ended after it", got, got.ExpiresAt, want)
		}
	}
	page, err := e.client.SearchTasks(ctx(t), asyncd.SearchFilter{Type: "go_expiry", State: asyncd.StateExpired, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for id := range wantExpiry {
		if !containsID(page.Items, id) {
			t.Fatalf("search state=expired lacks %s: %+v", id, page.Items)
		}
	}
	for _, it := range page.Items {
		if it.State != asyncd.StateExpired {
			t.Fatalf("search state=expired holds %+v", it)
		}
	}

	if _, err := e.client.ResumeJob(ctx(t), job); err != nil {
		t.Fatal(err)
	}
	resumed = true
	e.waitState(t, control.ID, asyncd.StateSucceeded, 20*time.Second)
	if runs := e.rec.get(control.ID); len(runs) != 1 {
		t.Fatalf("the control task ran %d times", len(runs))
	}
	for id := range wantExpiry {
		if runs := e.rec.get(id); len(runs) != 0 {
			t.Fatalf("expired task %s reached the executor: %+v", id, runs)
		}
		if got, err := e.client.Get(ctx(t), id); err != nil || got.State != asyncd.StateExpired {
			t.Fatalf("task %s after the resume = %+v, %v", id, got, err)
		}
	}
}

// Expiry counts retries: a task whose first attempt asks to be retried after its
// expiry ends expired after that one attempt, without a second call.
func TestIntegrationExpiryEndsARetry(t *testing.T) {
	e := itEnv(t)
	// Long enough for the first attempt to begin on a loaded machine; the retry asked
	// for is due 30 s after it, past the expiry.
	res := submit(t, e, &asyncd.Task{Type: "go_expiry", Payload: "retry", StartWithin: 5 * time.Second})
	got := e.waitState(t, res.ID, asyncd.StateExpired, 30*time.Second)
	want := res.ETA.Add(5 * time.Second)
	if got.Attempt != 1 || got.ExpiresAt == nil || !got.ExpiresAt.Equal(want) {
		t.Fatalf("expired task %+v (expires_at %v), want one attempt and expires_at %v", got, got.ExpiresAt, want)
	}
	if runs := e.rec.get(res.ID); len(runs) != 1 || runs[0].info.Attempt != 1 {
		t.Fatalf("the executor saw %+v, want attempt 1 only", runs)
	}
}

// ExpiresAt and StartWithin together never reach the server (whose own refusal would be
// an *APIError naming start_within): no task is stored under the key. An ExpiresAt not
// after the task is due is the server's to refuse, naming expires_at.
func TestIntegrationExpiryRefusals(t *testing.T) {
	e := itEnv(t)
	key := uniq("both")
	_, err := e.client.Submit(ctx(t), &asyncd.Task{Type: "go_ok", IdempotencyKey: key,
		ExpiresAt: time.Now().Add(time.Hour), StartWithin: time.Minute})
	var apiErr *asyncd.APIError
	if err == nil || errors.As(err, &apiErr) {
		t.Fatalf("both expiries: err = %v, want the SDK's refusal before sending", err)
	}
	page, err := e.client.SearchTasks(ctx(t), asyncd.SearchFilter{Type: "go_ok", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range page.Items {
		if it.IdempotencyKey == key {
			t.Fatalf("the refused task was stored: %+v", it)
		}
	}

	_, err = e.client.Submit(ctx(t), &asyncd.Task{Type: "go_ok", IdempotencyKey: uniq("k"), ExpiresAt: time.Now().Add(-time.Minute)})
	wantAPIError(t, err, asyncd.ErrInvalidField, 400, "expires_at")
	_, err = e.client.SubmitDelayed(ctx(t), &asyncd.Task{Type: "go_ok", IdempotencyKey: uniq("k"), ExpiresAt: time.Now().Add(time.Minute)}, time.Hour)
	wantAPIError(t, err, asyncd.ErrInvalidField, 400, "expires_at")
}

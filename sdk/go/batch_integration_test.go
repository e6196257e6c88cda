package asyncd_test

// Batch delivery (docs/api.md, "Batch delivery") against a real `asyncd dev`: its own
// process, since a job with executor.batch is one the shared environment's asyncd
// must be able to load.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

// batchCalls wraps the executor Client to see the calls asyncd makes.
type batchCalls struct {
	next http.Handler

	mu        sync.Mutex
	sizes     []int // Asyncd-Batch of each batch call
	singles   int   // calls without Asyncd-Batch
	perTaskOn int   // batch calls that carried a per-task header
}

func (b *batchCalls) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	if v := r.Header.Get(asyncd.HeaderBatch); v != "" {
		n, _ := strconv.Atoi(v)
		b.sizes = append(b.sizes, n)
		if r.Header.Get(asyncd.HeaderTaskID) != "" || r.Header.Get(asyncd.HeaderLeaseToken) != "" {
			b.perTaskOn++
		}
	} else {
		b.singles++
	}
	b.mu.Unlock()
	b.next.ServeHTTP(w, r)
}

func startBatchDev(t *testing.T, executorSrv *httptest.Server, job asyncd.JobConfig) *devEnv {
	t.Helper()
	bin := os.Getenv("ASYNCD_BIN")
	if bin == "" {
		t.Fatal("ASYNCD_BIN is not set: this test runs a real `asyncd dev` with a batch job")
	}
	dir := t.TempDir()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	e := &devEnv{
		endpoint: fmt.Sprintf("http://127.0.0.1:%d", port),
		exec:     executorSrv,
		dir:      dir,
		logPath:  filepath.Join(dir, "asyncd.log"),
		exited:   make(chan struct{}),
	}
	cfg := filepath.Join(dir, "config")
	if err := os.Mkdir(cfg, 0o755); err != nil {
		t.Fatal(err)
	}
	doc, err := job.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg, job.Name+".yaml"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	signingDir := filepath.Join(dir, "signing")
	if err := os.MkdirAll(filepath.Join(signingDir, itSecretName), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(signingDir, itSecretName, "key"), []byte(itSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(e.logPath)
	if err != nil {
		t.Fatal(err)
	}
	e.cmd = exec.Command(bin, "dev", "--config", cfg, "--db", filepath.Join(dir, "asyncd.db"),
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--signing-dir", signingDir)
	e.cmd.Stdout, e.cmd.Stderr = logf, logf
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = e.cmd.Wait()
		logf.Close()
		close(e.exited)
	}()
	t.Cleanup(e.stop)
	for _, path := range []string{"/healthz", "/readyz"} {
		if err := e.waitHTTP200(path, 60*time.Second); err != nil {
			t.Fatalf("%v\nasyncd log:\n%s", err, e.logTail())
		}
	}
	return e
}

// A job with executor.batch: 25 tasks submitted at once reach the unchanged handler in
// calls of several tasks (at most maxTasks each), signed, and all succeed.
func TestIntegrationBatchDelivery(t *testing.T) {
	rec := &recorder{byID: map[string][]execRecord{}}
	executor := asyncd.NewClient(asyncd.WithSigningSecret(itSecret))
	executor.RegisterExecutor("go_batch", func(ctx context.Context, payload string) error {
		rec.add(ctx, payload)
		return nil
	})
	calls := &batchCalls{next: executor}
	srv := httptest.NewServer(calls)
	e := startBatchDev(t, srv, asyncd.JobConfig{
		Name:          "go-batch-job",
		TaskType:      "go_batch",
		ExecutorURL:   srv.URL + "/tasks/go_batch",
		Timeout:       10 * time.Second,
		SigningSecret: itSecretName,
		Batch:         &asyncd.BatchDelivery{MaxTasks: 10, MaxWait: 200 * time.Millisecond},
		MaxRetries:    asyncd.Retries(2),
	})
	e.client = asyncd.NewClient(asyncd.WithEndpoint(e.endpoint), asyncd.WithServiceName("go-it-batch"))

	const n = 25
	tasks := make([]*asyncd.Task, n)
	keys := map[string]string{} // task id → idempotency key
	for i := range tasks {
		tasks[i] = &asyncd.Task{Type: "go_batch", Payload: map[string]int{"n": i}, IdempotencyKey: uniq(fmt.Sprintf("batch-%d", i))}
	}
	res, err := e.client.SubmitBatch(ctx(t), tasks)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil || r.ID == "" {
			t.Fatalf("submit %d: %+v", i, r)
		}
		keys[r.ID] = tasks[i].IdempotencyKey
	}
	for id, key := range keys {
		got := e.waitState(t, id, asyncd.StateSucceeded, 30*time.Second)
		if got.Attempt != 1 {
			t.Errorf("task %s succeeded at attempt %d", id, got.Attempt)
		}
		runs := rec.get(id)
		if len(runs) == 0 {
			t.Fatalf("task %s succeeded without reaching the handler", id)
		}
		info := runs[0].info
		if info.IdempotencyKey != key || info.Attempt != 1 || info.Type != "go_batch" || info.LeaseToken == "" || info.CallbackURL == "" {
			t.Errorf("task %s: the handler saw %+v", id, info)
		}
	}
	calls.mu.Lock()
	defer calls.mu.Unlock()
	largest := 0
	for _, size := range calls.sizes {
		largest = max(largest, size)
	}
	t.Logf("batch calls of %v tasks, %d single calls", calls.sizes, calls.singles)
	if largest < 2 || largest > 10 {
		t.Fatalf("batch calls of %v tasks (and %d single calls): want at least one of 2..10 tasks\nasyncd log:\n%s",
			calls.sizes, calls.singles, e.logTail())
	}
	if calls.perTaskOn > 0 {
		t.Errorf("%d batch calls carried per-task headers", calls.perTaskOn)
	}
}

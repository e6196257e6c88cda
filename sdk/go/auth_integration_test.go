package asyncd_test

// The client's bearer token against a real `asyncd dev --auth tokens` (its own process,
// not the shared one of integration_test.go, which runs without auth).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

const (
	authToken      = "go-it-token-for-auth-job"
	authOtherToken = "go-it-token-for-nothing-much"
)

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func startAuthDev(t *testing.T) *devEnv {
	t.Helper()
	bin := os.Getenv("ASYNCD_BIN")
	if bin == "" {
		t.Fatal("ASYNCD_BIN is not set: this test runs a real `asyncd dev --auth tokens`")
	}
	dir := t.TempDir()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	e := &devEnv{
		endpoint: fmt.Sprintf("http://127.0.0.1:%d", port),
		dir:      dir,
		logPath:  filepath.Join(dir, "asyncd.log"),
		exited:   make(chan struct{}),
	}
	cfg := filepath.Join(dir, "config")
	if err := os.Mkdir(cfg, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, j := range []asyncd.JobConfig{
		{Name: "go-auth-job", TaskType: "go_auth", ExecutorURL: "http://127.0.0.1:9/run"},
		{Name: "go-other-job", TaskType: "go_other", ExecutorURL: "http://127.0.0.1:9/run"},
	} {
		doc, err := j.YAML()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(cfg, j.Name+".yaml"), []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tokens := fmt.Sprintf("tokens:\n"+
		"  - {name: go-it, sha256: %q, jobs: [go-auth-job], verbs: [\"*\"]}\n"+
		"  - {name: go-it-other, sha256: %q, jobs: [go-other-job], verbs: [read]}\n",
		sha256Hex(authToken), sha256Hex(authOtherToken))
	tokensFile := filepath.Join(dir, "tokens.yaml")
	if err := os.WriteFile(tokensFile, []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(e.logPath)
	if err != nil {
		t.Fatal(err)
	}
	e.cmd = exec.Command(bin, "dev", "--config", cfg, "--db", filepath.Join(dir, "asyncd.db"),
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--auth", "tokens", "--auth-tokens-file", tokensFile)
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
	if err := e.waitHTTP200("/healthz", 60*time.Second); err != nil {
		t.Fatalf("%v\nasyncd log:\n%s", err, e.logTail())
	}
	return e
}

func TestIntegrationBearerToken(t *testing.T) {
	e := startAuthDev(t)
	ctx := context.Background()
	task := func(taskType string) *asyncd.Task {
		return &asyncd.Task{Type: taskType, Payload: map[string]int{"n": 1},
			IdempotencyKey: fmt.Sprintf("go-auth-%d", time.Now().UnixNano())}
	}

	withToken := asyncd.NewClient(asyncd.WithEndpoint(e.endpoint), asyncd.WithToken(authToken))
	res, err := withToken.SubmitDelayed(ctx, task("go_auth"), time.Hour)
	if err != nil {
		t.Fatalf("submit with the token: %v", err)
	}
	if st, err := withToken.Get(ctx, res.ID); err != nil || st.State != "pending" {
		t.Fatalf("get with the token: %+v, %v", st, err)
	}

	// A token file (as a projected ServiceAccount token is mounted) works the same.
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(authToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fromFile := asyncd.NewClient(asyncd.WithEndpoint(e.endpoint), asyncd.WithTokenFile(file))
	if _, err := fromFile.Get(ctx, res.ID); err != nil {
		t.Fatalf("get with the token file: %v", err)
	}

	for name, c := range map[string]*asyncd.Client{
		"no token":         asyncd.NewClient(asyncd.WithEndpoint(e.endpoint), asyncd.WithTokenFile(filepath.Join(t.TempDir(), "none"))),
		"a wrong token":    asyncd.NewClient(asyncd.WithEndpoint(e.endpoint), asyncd.WithToken("not-the-token")),
		"the token's hash": asyncd.NewClient(asyncd.WithEndpoint(e.endpoint), asyncd.WithToken(sha256Hex(authToken))),
	} {
		_, err := c.Submit(ctx, task("go_auth"))
		var apiErr *asyncd.APIError
		if !errors.Is(err, asyncd.ErrUnauthenticated) || !errors.As(err, &apiErr) || apiErr.Status != 401 {
			t.Errorf("submit with %s: got %v, want a 401 unauthenticated", name, err)
		}
		if _, err := c.Get(ctx, res.ID); !errors.Is(err, asyncd.ErrUnauthenticated) {
			t.Errorf("get with %s: got %v, want unauthenticated", name, err)
		}
	}

	// In scope for another job only: 403 on submit, and the task looks unknown.
	other := asyncd.NewClient(asyncd.WithEndpoint(e.endpoint), asyncd.WithToken(authOtherToken))
	if _, err := other.Submit(ctx, task("go_auth")); !errors.Is(err, asyncd.ErrForbidden) {
		t.Errorf("submit out of scope: got %v, want forbidden", err)
	}
	if _, err := other.Get(ctx, res.ID); !errors.Is(err, asyncd.ErrNotFound) {
		t.Errorf("get out of scope: got %v, want not_found", err)
	}
	if err := withToken.Cancel(ctx, res.ID); err != nil {
		t.Fatalf("cancel with the token: %v", err)
	}
}

package main

// The River peer (github.com/riverqueue/river with its pgx v5 driver): the same three
// commands as the Node peers (bench/peers/{graphile,bullmq}/peer.mjs): setup, insert,
// work. Each prints one JSON line the driver reads.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// NoopArgs is the job: the same body every system's handler POSTs to the executor.
type NoopArgs struct {
	ETA     string         `json:"eta"`
	Payload map[string]int `json:"payload"`
}

func (NoopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[NoopArgs]
	handle func(ctx context.Context, args NoopArgs) error
}

func (w *noopWorker) Work(ctx context.Context, job *river.Job[NoopArgs]) error {
	return w.handle(ctx, job.Args)
}

// peerFlags are the flags every peer command takes (the Node peers take the same).
type peerFlags struct {
	db          string
	count       int
	mode        string
	concurrency int
	batch       int
	inflight    int
	delayMin    int64
	delayMax    int64
	etaMs       int64
	handler     string
	url         string
	expect      int
	pool        int
	cooldown    time.Duration
}

func parsePeerFlags(name string, args []string) *peerFlags {
	f := &peerFlags{}
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	fs.StringVar(&f.db, "db", "", "PostgreSQL database URL")
	fs.IntVar(&f.count, "count", 0, "tasks to insert")
	fs.StringVar(&f.mode, "mode", "batch", "single or batch inserts")
	fs.IntVar(&f.concurrency, "concurrency", 64, "single inserts in flight; jobs worked at once")
	fs.IntVar(&f.batch, "batch", 1000, "tasks per batch insert")
	fs.IntVar(&f.inflight, "inflight", 4, "batch inserts in flight")
	fs.Int64Var(&f.delayMin, "delay-min-ms", 0, "smallest delay")
	fs.Int64Var(&f.delayMax, "delay-max-ms", 0, "largest delay (uniform between)")
	fs.Int64Var(&f.etaMs, "eta-ms", 0, "one ETA for all (Unix ms) instead of delays")
	fs.StringVar(&f.handler, "handler", "http", "http: POST each task to --url; noop: return at once")
	fs.StringVar(&f.url, "url", "", "the executor's URL")
	fs.IntVar(&f.expect, "expect", 0, "exit once this many tasks are done (0: run until SIGTERM)")
	fs.IntVar(&f.pool, "pool", 10, "database connections")
	fs.DurationVar(&f.cooldown, "fetch-cooldown", 0, "River's FetchCooldown (0: River's default, 100 ms)")
	_ = fs.Parse(args)
	return f
}

func emit(v any) {
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}

// etaFor gives the i-th task's ETA in Unix ms.
func (f *peerFlags) etaFor(now int64) int64 {
	if f.etaMs > 0 {
		return f.etaMs
	}
	d := f.delayMin
	if f.delayMax > f.delayMin {
		d += rand.Int64N(f.delayMax - f.delayMin + 1)
	}
	return now + d
}

func isoMs(ms int64) string {
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

func riverPool(ctx context.Context, f *peerFlags) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(f.db)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(f.pool)
	return pgxpool.NewWithConfig(ctx, cfg)
}

func runRiver(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: river setup|insert|work [flags]")
	}
	f := parsePeerFlags("river "+args[0], args[1:])
	ctx := context.Background()
	pool, err := riverPool(ctx, f)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch args[0] {
	case "setup":
		m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
		if err != nil {
			return err
		}
		if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
			return err
		}
		emit(map[string]any{"ok": true})
		return nil
	case "insert":
		return riverInsert(ctx, pool, f)
	case "work":
		return riverWork(ctx, pool, f)
	}
	return fmt.Errorf("unknown river command %q", args[0])
}

func riverInsert(ctx context.Context, pool *pgxpool.Pool, f *peerFlags) error {
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: quietLogger()})
	if err != nil {
		return err
	}
	params := func(now int64) river.InsertManyParams {
		eta := f.etaFor(now)
		return river.InsertManyParams{
			Args:       NoopArgs{ETA: isoMs(eta), Payload: map[string]int{"n": 1}},
			InsertOpts: &river.InsertOpts{ScheduledAt: time.UnixMilli(eta)},
		}
	}
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, f.concurrency+f.inflight)
	if f.mode == "single" {
		for range f.concurrency {
			wg.Go(func() {
				for next.Add(1) <= int64(f.count) {
					p := params(time.Now().UnixMilli())
					if _, err := client.Insert(ctx, p.Args, p.InsertOpts); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	} else {
		batches := (f.count + f.batch - 1) / f.batch
		for range f.inflight {
			wg.Go(func() {
				for {
					b := int(next.Add(1)) - 1
					if b >= batches {
						return
					}
					n := min(f.batch, f.count-b*f.batch)
					now := time.Now().UnixMilli()
					ps := make([]river.InsertManyParams, n)
					for i := range ps {
						ps[i] = params(now)
					}
					if _, err := client.InsertManyFast(ctx, ps); err != nil {
						errs <- err
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	emit(map[string]any{"seconds": time.Since(start).Seconds()})
	return nil
}

// lateRecorder keeps the lateness of each task a no-op handler ran, bounded.
type lateRecorder struct {
	mu    sync.Mutex
	late  []int64
	first int64
}

func (r *lateRecorder) add(etaIso string) {
	t, err := time.Parse(time.RFC3339Nano, etaIso)
	if err != nil {
		return
	}
	now := time.Now().UnixMilli()
	l := now - t.UnixMilli()
	r.mu.Lock()
	if r.first == 0 {
		r.first = now
	}
	if len(r.late) < maxRecords {
		r.late = append(r.late, l)
	}
	r.mu.Unlock()
}

func httpHandler(url string, concurrency int) func(ctx context.Context, body []byte) error {
	client := &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: concurrency, MaxConnsPerHost: concurrency},
		Timeout:   30 * time.Second,
	}
	return func(ctx context.Context, body []byte) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("content-type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("executor answered %d", resp.StatusCode)
		}
		return nil
	}
}

func riverWork(ctx context.Context, pool *pgxpool.Pool, f *peerFlags) error {
	var done atomic.Int64
	finished := make(chan struct{})
	rec := &lateRecorder{}
	post := httpHandler(f.url, f.concurrency)
	count := func() {
		if n := done.Add(1); f.expect > 0 && n == int64(f.expect) {
			close(finished)
		}
	}
	worker := &noopWorker{handle: func(ctx context.Context, a NoopArgs) error {
		if f.handler == "noop" {
			rec.add(a.ETA)
			count()
			return nil
		}
		body, _ := json.Marshal(a)
		if err := post(ctx, body); err != nil {
			return err
		}
		count()
		return nil
	}}
	workers := river.NewWorkers()
	river.AddWorker(workers, worker)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: f.concurrency}},
		Workers:       workers,
		Logger:        quietLogger(),
		FetchCooldown: f.cooldown,
	})
	if err != nil {
		return err
	}
	started := time.Now().UnixMilli()
	if err := client.Start(ctx); err != nil {
		return err
	}
	emit(map[string]any{"started_ms": started})
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-finished:
	case <-stop:
	}
	doneMs := time.Now().UnixMilli()
	rec.mu.Lock()
	p50, p99, mx, early := quantiles(rec.late)
	first := rec.first
	rec.mu.Unlock()
	emit(map[string]any{"first_ms": first, "done_ms": doneMs, "count": done.Load(), "p50": p50, "p99": p99, "max": mx, "early": early})
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = client.Stop(stopCtx)
	return nil
}

// quietLogger: warnings and errors only, like the other peers.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

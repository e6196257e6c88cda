package main

// `peers run`: the workloads, each system behind one interface (target), and the table.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	sdk "github.com/asyncd/asyncd/sdk/go"
	"github.com/jackc/pgx/v5"
)

type config struct {
	scale       float64
	concurrency int
	batch       int
	inflight    int
	pool        int
	cooldown    time.Duration
	lead        time.Duration
	idleWindow  time.Duration
	asyncd      string
	peersDir    string
	node        string
	createdb    string
	redis       string
	redisPid    string
	systems     []string
	workloads   []string
	drain       int
	enqueue     int
	burst       int
	random      int
	pending     int
}

// errNA marks a cell a system has no figure for (the reason goes in the notes).
var errNA = errors.New("n/a")

func runBench(args []string) error {
	c := &config{}
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	fs.Float64Var(&c.scale, "scale", 1, "multiplies every task count (0.02 for a smoke run)")
	fs.IntVar(&c.concurrency, "concurrency", 64, "tasks worked at once, and single enqueues in flight, for every system")
	fs.IntVar(&c.batch, "batch", 1000, "tasks per batch enqueue, for every system")
	fs.IntVar(&c.inflight, "inflight", 4, "batch enqueues in flight, for every system")
	fs.IntVar(&c.pool, "pool", 10, "PostgreSQL connections of each peer process (asyncd's pool is 10)")
	fs.DurationVar(&c.cooldown, "river-fetch-cooldown", 0, "River's FetchCooldown (0: River's default, 100 ms, which caps a River worker at MaxWorkers jobs per 100 ms)")
	fs.DurationVar(&c.lead, "lead", 8*time.Second, "same-second burst: how far ahead of the insert its ETA lies")
	fs.DurationVar(&c.idleWindow, "idle-window", 10*time.Second, "how long CPU is sampled with the pending tasks not yet due")
	fs.StringVar(&c.asyncd, "asyncd", "", "the release asyncd binary")
	fs.StringVar(&c.peersDir, "peers-dir", "", "folder holding common.mjs and {graphile,bullmq}/peer.mjs with their node_modules")
	fs.StringVar(&c.node, "node", "node", "the node binary")
	fs.StringVar(&c.createdb, "createdb", "e2e/services/postgres.sh", "script whose `createdb NAME` prints a fresh PostgreSQL database's URL")
	fs.StringVar(&c.redis, "redis", "redis://127.0.0.1:16379", "Redis URL for BullMQ")
	fs.StringVar(&c.redisPid, "redis-pid-file", "", "redis-server's pid file, to count its CPU with BullMQ's")
	systems := fs.String("systems", "asyncd-dev,asyncd-pg,river,graphile,bullmq", "systems to run")
	workloads := fs.String("workloads", "drain,drain-noop,enqueue-single,enqueue-single-http,burst,random,idle", "workloads to run")
	_ = fs.Parse(args)
	c.systems = strings.Split(*systems, ",")
	c.workloads = strings.Split(*workloads, ",")
	scaled := func(n float64) int { return max(1, int(math.Round(n*c.scale))) }
	c.drain, c.enqueue, c.burst, c.random, c.pending = scaled(1e5), scaled(1e5), scaled(1e4), scaled(2e3), scaled(1e6)

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	defer killChildren()

	ex, err := startExecutor()
	if err != nil {
		return err
	}
	var targets []target
	for _, s := range c.systems {
		t, err := newTarget(s, c, ex)
		if err != nil {
			return err
		}
		targets = append(targets, t)
	}
	res := results{}
	for _, w := range c.workloads {
		for _, t := range targets {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			logf("%s: %s", t.Name(), w)
			start := time.Now()
			err := runWorkload(ctx, c, ex, t, w, res)
			t.Stop()
			if err != nil && !errors.Is(err, errNA) {
				logf("%s: %s failed: %v", t.Name(), w, err)
				res.set(w, t.Name(), cell{text: "failed"})
				if w == "drain" {
					res.set("enqueue-batch", t.Name(), cell{text: "failed"})
				}
			}
			logf("%s: %s took %.1f s", t.Name(), w, time.Since(start).Seconds())
		}
	}
	printTable(c, targets, res)
	return nil
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "[peers %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, a...))
}

// ---- results ----

// cell is one figure: text as printed, value for the ratios, lower: whether less is better.
type cell struct {
	text  string
	value float64
	lower bool
}

type results map[string]map[string]cell

func (r results) set(workload, system string, c cell) {
	if r[workload] == nil {
		r[workload] = map[string]cell{}
	}
	r[workload][system] = c
}

func rateCell(n int, seconds float64) cell {
	v := float64(n) / seconds
	return cell{text: fmt.Sprintf("%s/s", thousands(v)), value: v}
}

func latenessCell(s Stats) cell {
	return cell{
		text:  fmt.Sprintf("%d / %d / %d ms", s.P50, s.P99, s.Max),
		value: float64(max(s.P99, 1)), lower: true,
	}
}

func thousands(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	var b strings.Builder
	for i, ch := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(' ')
		}
		b.WriteRune(ch)
	}
	return b.String()
}

// ---- the executor process ----

type executorProc struct {
	url string
}

func startExecutor() (*executorProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "executor")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := startChild(cmd); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("executor: %w", err)
	}
	return &executorProc{url: strings.TrimSpace(line)}, nil
}

var httpc = &http.Client{
	Transport: &http.Transport{MaxIdleConnsPerHost: 256},
	Timeout:   120 * time.Second,
}

func (e *executorProc) reset() error {
	resp, err := httpc.Post(e.url+"reset", "text/plain", nil)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

func (e *executorProc) stats() (Stats, error) { return e.get("stats") }

// count: the calls so far and the last one's arrival, without the quantiles.
func (e *executorProc) count() (Stats, error) { return e.get("count") }

func (e *executorProc) get(path string) (Stats, error) {
	var s Stats
	resp, err := httpc.Get(e.url + path)
	if err != nil {
		return s, err
	}
	defer resp.Body.Close()
	return s, json.NewDecoder(resp.Body).Decode(&s)
}

// waitCount waits until the executor has seen n calls.
func (e *executorProc) waitCount(ctx context.Context, n int, deadline time.Duration) (Stats, error) {
	end := time.Now().Add(deadline)
	for {
		s, err := e.count()
		if err != nil {
			return s, err
		}
		if s.Count >= n {
			return e.stats()
		}
		if time.Now().After(end) {
			return s, fmt.Errorf("only %d of %d tasks reached the executor within %s", s.Count, n, deadline)
		}
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// ---- children ----

var (
	childrenMu sync.Mutex
	children   = map[*exec.Cmd]bool{}
)

func startChild(cmd *exec.Cmd) error {
	childrenMu.Lock()
	defer childrenMu.Unlock()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", cmd.Path, err)
	}
	children[cmd] = true
	return nil
}

func reap(cmd *exec.Cmd) {
	childrenMu.Lock()
	delete(children, cmd)
	childrenMu.Unlock()
}

// stopChild sends SIGTERM, then SIGKILL after grace, and waits.
func stopChild(cmd *exec.Cmd, grace time.Duration) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
	}
	reap(cmd)
}

func killChildren() {
	childrenMu.Lock()
	list := make([]*exec.Cmd, 0, len(children))
	for c := range children {
		list = append(list, c)
	}
	childrenMu.Unlock()
	for _, c := range list {
		stopChild(c, 5*time.Second)
	}
}

// ---- /proc ----

// cpuSeconds is the user+system CPU time of a process so far.
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	k, _ := strconv.ParseFloat(f[12], 64)
	return (u + k) / 100
}

// rssMiB is a process's resident memory now.
func rssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			return kb / 1024
		}
	}
	return 0
}

// pgBackends lists the server processes connected to one database.
func pgBackends(ctx context.Context, url string) []int {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")
	if err != nil {
		return nil
	}
	pids, _ := pgx.CollectRows(rows, pgx.RowTo[int32])
	out := make([]int, len(pids))
	for i, p := range pids {
		out[i] = int(p)
	}
	return out
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func freshPostgres(c *config, name string) (string, error) {
	out, err := exec.Command(c.createdb, "createdb", name).Output()
	if err != nil {
		return "", fmt.Errorf("%s createdb %s: %w", c.createdb, name, err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1]), nil
}

// ---- targets ----

// insertSpec: count tasks, single or batch, all at etaMs or each after a uniform delay.
type insertSpec struct {
	count              int
	single             bool
	rawHTTP            bool // asyncd: one HTTP request per single submit, not its SDK
	etaMs              int64
	delayMin, delayMax int64
}

// workResult: when consuming started and, for the in-process handler, the lateness the
// handler saw and when the last task was done.
type workResult struct {
	firstMs int64
	doneMs  int64
	count   int
	late    Stats
}

type target interface {
	Name() string
	// Reset leaves a fresh, empty store and nothing consuming it.
	Reset(ctx context.Context) error
	// Insert enqueues and answers how long it took.
	Insert(ctx context.Context, s insertSpec) (float64, error)
	// Start begins consuming with the given handler ("http" or "noop"); expect: how many
	// tasks to wait for (0: until Stop).
	Start(ctx context.Context, handler string, expect int) (int64, error)
	// Wait waits for the expected tasks.
	Wait(ctx context.Context, deadline time.Duration) (workResult, error)
	// Pids: the worker process(es) whose memory is reported, then processes whose CPU also counts.
	Pids(ctx context.Context) (worker []int, extra []int)
	Stop()
}

func newTarget(name string, c *config, e *executorProc) (target, error) {
	switch name {
	case "asyncd-dev", "asyncd-pg":
		return &asyncdTarget{name: name, c: c, exec: e}, nil
	case "river":
		self, err := os.Executable()
		if err != nil {
			return nil, err
		}
		argv := []string{self, "river"}
		if c.cooldown > 0 {
			argv = append(argv, "--fetch-cooldown", c.cooldown.String())
		}
		return &peerTarget{name: "River", c: c, exec: e, argv: argv, db: "peers_river"}, nil
	case "graphile":
		return &peerTarget{name: "graphile-worker", c: c, exec: e, argv: []string{c.node, filepath.Join(c.peersDir, "graphile", "peer.mjs")}, db: "peers_graphile"}, nil
	case "bullmq":
		return &peerTarget{name: "BullMQ", c: c, exec: e, argv: []string{c.node, filepath.Join(c.peersDir, "bullmq", "peer.mjs")}, redis: true}, nil
	}
	return nil, fmt.Errorf("unknown system %q", name)
}

// ---- a peer: setup/insert/work processes ----

type peerTarget struct {
	name  string
	c     *config
	exec  *executorProc
	argv  []string
	db    string // PostgreSQL database name, or
	redis bool   // Redis
	url   string
	work  *exec.Cmd
	lines *bufio.Scanner
}

func (p *peerTarget) Name() string { return p.name }

func (p *peerTarget) command(sub string, extra ...string) *exec.Cmd {
	// argv: the program, its script or subcommand, then flags that go after sub.
	args := []string{p.argv[1], sub}
	args = append(args, p.argv[2:]...)
	args = append(args, "--db", p.url, "--pool", strconv.Itoa(p.c.pool),
		"--concurrency", strconv.Itoa(p.c.concurrency), "--batch", strconv.Itoa(p.c.batch),
		"--inflight", strconv.Itoa(p.c.inflight))
	args = append(args, extra...)
	cmd := exec.Command(p.argv[0], args...)
	cmd.Stderr = os.Stderr
	return cmd
}

// runJSON runs a peer command to its end and decodes its last stdout line.
func (p *peerTarget) runJSON(ctx context.Context, cmd *exec.Cmd, v any) error {
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := startChild(cmd); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		reap(cmd)
		if err != nil {
			return fmt.Errorf("%s %s: %w", p.name, cmd.Args[1:3], err)
		}
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		reap(cmd)
		return ctx.Err()
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	return json.Unmarshal([]byte(lines[len(lines)-1]), v)
}

func (p *peerTarget) Reset(ctx context.Context) error {
	p.Stop()
	if p.redis {
		p.url = p.c.redis
	} else {
		url, err := freshPostgres(p.c, p.db)
		if err != nil {
			return err
		}
		p.url = url
	}
	var ok map[string]any
	return p.runJSON(ctx, p.command("setup"), &ok)
}

func (p *peerTarget) Insert(ctx context.Context, s insertSpec) (float64, error) {
	mode := "batch"
	if s.single {
		mode = "single"
	}
	cmd := p.command("insert", "--count", strconv.Itoa(s.count), "--mode", mode,
		"--eta-ms", strconv.FormatInt(s.etaMs, 10),
		"--delay-min-ms", strconv.FormatInt(s.delayMin, 10),
		"--delay-max-ms", strconv.FormatInt(s.delayMax, 10))
	var r struct{ Seconds float64 }
	err := p.runJSON(ctx, cmd, &r)
	return r.Seconds, err
}

func (p *peerTarget) Start(ctx context.Context, handler string, expect int) (int64, error) {
	cmd := p.command("work", "--handler", handler, "--url", p.exec.url, "--expect", strconv.Itoa(expect))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := startChild(cmd); err != nil {
		return 0, err
	}
	p.work = cmd
	p.lines = bufio.NewScanner(out)
	var r struct {
		StartedMs int64 `json:"started_ms"`
	}
	if !p.lines.Scan() {
		return 0, fmt.Errorf("%s work ended before it started", p.name)
	}
	if err := json.Unmarshal(p.lines.Bytes(), &r); err != nil {
		return 0, fmt.Errorf("%s work: %q: %w", p.name, p.lines.Text(), err)
	}
	return r.StartedMs, nil
}

func (p *peerTarget) summary() (workResult, error) {
	var r struct {
		FirstMs int64 `json:"first_ms"`
		DoneMs  int64 `json:"done_ms"`
		Count   int   `json:"count"`
		P50     int64 `json:"p50"`
		P99     int64 `json:"p99"`
		Max     int64 `json:"max"`
		Early   int   `json:"early"`
	}
	if !p.lines.Scan() {
		return workResult{}, fmt.Errorf("%s work ended without a summary", p.name)
	}
	if err := json.Unmarshal(p.lines.Bytes(), &r); err != nil {
		return workResult{}, err
	}
	return workResult{firstMs: r.FirstMs, doneMs: r.DoneMs, count: r.Count, late: Stats{Count: r.Count, P50: r.P50, P99: r.P99, Max: r.Max, Early: r.Early}}, nil
}

func (p *peerTarget) Wait(ctx context.Context, deadline time.Duration) (workResult, error) {
	type res struct {
		r   workResult
		err error
	}
	ch := make(chan res, 1)
	go func() { r, err := p.summary(); ch <- res{r, err} }()
	select {
	case r := <-ch:
		return r.r, r.err
	case <-time.After(deadline):
		return workResult{}, fmt.Errorf("%s: not done within %s", p.name, deadline)
	case <-ctx.Done():
		return workResult{}, ctx.Err()
	}
}

func (p *peerTarget) Pids(ctx context.Context) ([]int, []int) {
	if p.work == nil {
		return nil, nil
	}
	worker := []int{p.work.Process.Pid}
	if p.redis {
		if b, err := os.ReadFile(p.c.redisPid); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				return worker, []int{pid}
			}
		}
		return worker, nil
	}
	return worker, pgBackends(ctx, p.url)
}

func (p *peerTarget) Stop() {
	if p.work != nil {
		stopChild(p.work, 15*time.Second)
		p.work = nil
	}
}

// ---- asyncd ----

type asyncdTarget struct {
	name   string
	c      *config
	exec   *executorProc
	dir    string
	store  string
	base   string
	procs  []*exec.Cmd // dev; or api, dispatcher
	expect int
}

func (a *asyncdTarget) Name() string {
	if a.name == "asyncd-dev" {
		return "asyncd dev (SQLite)"
	}
	return "asyncd api + dispatcher (PostgreSQL)"
}

func (a *asyncdTarget) spawn(role string, listen int, extra ...string) (*exec.Cmd, error) {
	args := append([]string{role, "--config", filepath.Join(a.dir, "jobs"), "--listen", fmt.Sprintf("127.0.0.1:%d", listen)}, extra...)
	cmd := exec.Command(a.c.asyncd, args...)
	cmd.Env = append(os.Environ(), "ASYNCD_LOG=warn")
	if a.store != "" {
		cmd.Env = append(cmd.Env, "ASYNCD_STORE="+a.store)
	}
	cmd.Stderr = os.Stderr
	if err := startChild(cmd); err != nil {
		return nil, err
	}
	a.procs = append(a.procs, cmd)
	base := fmt.Sprintf("http://127.0.0.1:%d", listen)
	end := time.Now().Add(30 * time.Second)
	for {
		resp, err := httpc.Get(base + "/healthz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == 200 {
				return cmd, nil
			}
		}
		if time.Now().After(end) {
			return nil, fmt.Errorf("asyncd %s did not come up", role)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (a *asyncdTarget) Reset(ctx context.Context) error {
	a.Stop()
	dir, err := os.MkdirTemp("", "asyncd-peers-")
	if err != nil {
		return err
	}
	a.dir = dir
	if err := os.MkdirAll(filepath.Join(dir, "jobs"), 0o755); err != nil {
		return err
	}
	spec := fmt.Sprintf("apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata: {name: bench}\nspec:\n  taskType: noop\n  executor: {url: '%s', timeout: 30s}\n  concurrency: %d\n", a.exec.url, a.c.concurrency)
	if err := os.WriteFile(filepath.Join(dir, "jobs", "bench.yaml"), []byte(spec), 0o644); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	a.base = fmt.Sprintf("http://127.0.0.1:%d", port)
	if a.name == "asyncd-dev" {
		a.store = ""
		if _, err := a.spawn("dev", port, "--db", filepath.Join(dir, "bench.db")); err != nil {
			return err
		}
	} else {
		if a.store, err = freshPostgres(a.c, "peers_asyncd"); err != nil {
			return err
		}
		mig := exec.Command(a.c.asyncd, "migrate")
		mig.Env = append(os.Environ(), "ASYNCD_LOG=warn", "ASYNCD_STORE="+a.store)
		if out, err := mig.CombinedOutput(); err != nil {
			return fmt.Errorf("asyncd migrate: %w: %s", err, out)
		}
		if _, err := a.spawn("api", port); err != nil {
			return err
		}
		dport, err := freePort()
		if err != nil {
			return err
		}
		if _, err := a.spawn("dispatcher", dport); err != nil {
			return err
		}
	}
	return a.post(ctx, "/v1/jobs/bench/pause", nil, nil)
}

func (a *asyncdTarget) post(ctx context.Context, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := httpc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s answered %d: %.200s", path, resp.StatusCode, b)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

func (a *asyncdTarget) Insert(ctx context.Context, s insertSpec) (float64, error) {
	f := &peerFlags{etaMs: s.etaMs, delayMin: s.delayMin, delayMax: s.delayMax}
	task := func(now int64) map[string]any {
		return map[string]any{"type": "noop", "payload": map[string]int{"n": 1}, "eta": isoMs(f.etaFor(now))}
	}
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var mu sync.Mutex
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	if s.single && s.rawHTTP {
		for range a.c.concurrency {
			wg.Go(func() {
				for next.Add(1) <= int64(s.count) {
					if err := a.post(ctx, "/v1/tasks", task(time.Now().UnixMilli()), nil); err != nil {
						fail(err)
						return
					}
				}
			})
		}
	} else if s.single {
		client := sdk.NewClient(sdk.WithEndpoint(a.base), sdk.WithToken(""))
		for range a.c.concurrency {
			wg.Go(func() {
				for {
					n := next.Add(1)
					if n > int64(s.count) {
						return
					}
					// The SDK asks for an idempotency key, which the raw requests do
					// without: asyncd stores and indexes it, a cost the peers do not pay.
					_, err := client.Submit(ctx, &sdk.Task{Type: "noop", Payload: map[string]int{"n": 1},
						IdempotencyKey: "bench-" + strconv.FormatInt(n, 10), ETA: time.UnixMilli(f.etaFor(time.Now().UnixMilli()))})
					if err != nil {
						fail(err)
						return
					}
				}
			})
		}
	} else {
		batches := (s.count + a.c.batch - 1) / a.c.batch
		for range a.c.inflight {
			wg.Go(func() {
				for {
					b := int(next.Add(1)) - 1
					if b >= batches {
						return
					}
					n := min(a.c.batch, s.count-b*a.c.batch)
					now := time.Now().UnixMilli()
					tasks := make([]map[string]any, n)
					for i := range tasks {
						tasks[i] = task(now)
					}
					var out struct {
						Results []struct {
							Status int `json:"status"`
						} `json:"results"`
					}
					if err := a.post(ctx, "/v1/tasks:batch", map[string]any{"tasks": tasks}, &out); err != nil {
						fail(err)
						return
					}
					for _, r := range out.Results {
						if r.Status != 201 {
							fail(fmt.Errorf("batch item answered %d", r.Status))
							return
						}
					}
				}
			})
		}
	}
	wg.Wait()
	return time.Since(start).Seconds(), firstErr
}

func (a *asyncdTarget) Start(ctx context.Context, handler string, expect int) (int64, error) {
	if handler != "http" {
		return 0, errNA
	}
	a.expect = expect
	started := time.Now().UnixMilli()
	return started, a.post(ctx, "/v1/jobs/bench/resume", nil, nil)
}

func (a *asyncdTarget) Wait(ctx context.Context, deadline time.Duration) (workResult, error) {
	s, err := a.exec.waitCount(ctx, a.expect, deadline)
	return workResult{firstMs: s.FirstMs, doneMs: s.LastMs, count: s.Count, late: s}, err
}

func (a *asyncdTarget) Pids(ctx context.Context) ([]int, []int) {
	if len(a.procs) == 0 {
		return nil, nil
	}
	if a.name == "asyncd-dev" {
		return []int{a.procs[0].Process.Pid}, nil
	}
	// api, dispatcher: the dispatcher is the worker; the database backends count too.
	return []int{a.procs[1].Process.Pid}, pgBackends(ctx, a.store)
}

func (a *asyncdTarget) Stop() {
	for i := len(a.procs) - 1; i >= 0; i-- {
		stopChild(a.procs[i], 10*time.Second)
	}
	a.procs = nil
	if a.dir != "" {
		_ = os.RemoveAll(a.dir)
		a.dir = ""
	}
}

// ---- workloads ----

// reset: Reset, tried once more after a pause if it fails (the shared PostgreSQL server
// may be restarting under another user of the machine).
func reset(ctx context.Context, t target) error {
	err := t.Reset(ctx)
	if err == nil {
		return nil
	}
	logf("%s: reset failed (%v); trying again in 5 s", t.Name(), err)
	select {
	case <-time.After(5 * time.Second):
	case <-ctx.Done():
		return ctx.Err()
	}
	return t.Reset(ctx)
}

func deadlineFor(n int) time.Duration {
	return max(120*time.Second, time.Duration(n)*5*time.Millisecond)
}

func runWorkload(ctx context.Context, c *config, e *executorProc, t target, w string, res results) error {
	sys := t.Name()
	if err := e.reset(); err != nil {
		return err
	}
	switch w {
	case "drain", "drain-noop":
		handler := "http"
		if w == "drain-noop" {
			handler = "noop"
			if _, ok := t.(*asyncdTarget); ok {
				res.set(w, sys, cell{text: "n/a"})
				return errNA
			}
		}
		if err := reset(ctx, t); err != nil {
			return err
		}
		secs, err := t.Insert(ctx, insertSpec{count: c.drain})
		if err != nil {
			return err
		}
		if w == "drain" {
			res.set("enqueue-batch", sys, rateCell(c.drain, secs))
		}
		if _, err := t.Start(ctx, handler, c.drain); err != nil {
			return err
		}
		r, err := t.Wait(ctx, deadlineFor(c.drain))
		if err != nil {
			return err
		}
		first, end := r.firstMs, r.doneMs
		if handler == "http" {
			s, err := e.stats()
			if err != nil {
				return err
			}
			if s.Count < c.drain {
				return fmt.Errorf("the executor saw %d of %d calls", s.Count, c.drain)
			}
			first, end = s.FirstMs, s.LastMs
		}
		// From the first call to the last: start-up (a worker process, leader
		// election, noticing the resume) is left out for every system alike.
		res.set(w, sys, rateCell(c.drain-1, float64(max(end-first, 1))/1000))
	case "enqueue-single", "enqueue-single-http":
		// Each system's client library submits one task per call; for asyncd that is the
		// Go SDK, whose concurrent Submits share calls as BullMQ's adds share a pipelined
		// Redis connection. enqueue-single-http is asyncd without its SDK: one HTTP
		// request per task, the floor any HTTP client gets.
		rawHTTP := w == "enqueue-single-http"
		if _, ok := t.(*asyncdTarget); rawHTTP && !ok {
			res.set(w, sys, cell{text: "n/a"})
			return errNA
		}
		if err := reset(ctx, t); err != nil {
			return err
		}
		secs, err := t.Insert(ctx, insertSpec{count: c.enqueue, single: true, rawHTTP: rawHTTP, delayMin: 3_600_000, delayMax: 3_600_000})
		if err != nil {
			return err
		}
		res.set(w, sys, rateCell(c.enqueue, secs))
	case "burst", "random":
		n := c.burst
		spec := insertSpec{count: n}
		if w == "random" {
			n = c.random
			spec = insertSpec{count: n, delayMin: 1000, delayMax: 10_000}
		}
		if err := reset(ctx, t); err != nil {
			return err
		}
		if _, err := t.Start(ctx, "http", n); err != nil {
			return err
		}
		if w == "burst" {
			// At least --lead ahead, more if this system's batch enqueue (measured by the
			// drain row) would take longer than half of that.
			lead := c.lead
			if b, ok := res["enqueue-batch"][sys]; ok && b.value > 0 {
				lead = max(lead, 2*time.Duration(float64(n)/b.value*float64(time.Second))+2*time.Second)
			}
			spec.etaMs = (time.Now().Add(lead).UnixMilli()/1000 + 1) * 1000
		}
		if _, err := t.Insert(ctx, spec); err != nil {
			return err
		}
		if w == "burst" && time.Now().UnixMilli() >= spec.etaMs {
			return fmt.Errorf("inserting the burst took past its ETA (raise --lead)")
		}
		deadline := deadlineFor(n) + time.Duration(spec.delayMax)*time.Millisecond + 10*time.Second
		if spec.etaMs > 0 {
			deadline += max(0, time.Until(time.UnixMilli(spec.etaMs)))
		}
		if _, err := t.Wait(ctx, deadline); err != nil {
			return err
		}
		s, err := e.stats()
		if err != nil {
			return err
		}
		if s.Early > 0 {
			return fmt.Errorf("%d tasks ran before their ETA", s.Early)
		}
		res.set(w, sys, latenessCell(s))
	case "idle":
		if err := reset(ctx, t); err != nil {
			return err
		}
		if _, err := t.Insert(ctx, insertSpec{count: c.pending, delayMin: 3_600_000, delayMax: 3_600_000}); err != nil {
			return err
		}
		if _, err := t.Start(ctx, "http", 0); err != nil {
			return err
		}
		// Let start-up work (first fetches, leader election, heap loads) pass.
		select {
		case <-time.After(5 * time.Second):
		case <-ctx.Done():
			return ctx.Err()
		}
		worker, extra := t.Pids(ctx)
		all := append(append([]int{}, worker...), extra...)
		before := make([]float64, len(all))
		for i, p := range all {
			before[i] = cpuSeconds(p)
		}
		start := time.Now()
		select {
		case <-time.After(c.idleWindow):
		case <-ctx.Done():
			return ctx.Err()
		}
		cpu := 0.0
		for i, p := range all {
			cpu += max(0, cpuSeconds(p)-before[i])
		}
		pct := 100 * cpu / time.Since(start).Seconds()
		rss := 0.0
		for _, p := range worker {
			rss += rssMiB(p)
		}
		res.set("idle-rss", sys, cell{text: fmt.Sprintf("%.0f MiB", rss), value: max(rss, 0.1), lower: true})
		res.set("idle-cpu", sys, cell{text: fmt.Sprintf("%.1f %%", pct), value: max(pct, 0.05), lower: true})
		if s, err := e.stats(); err == nil && s.Count > 0 {
			return fmt.Errorf("%d tasks ran an hour early", s.Count)
		}
	default:
		return fmt.Errorf("unknown workload %q", w)
	}
	return nil
}

// ---- the table ----

func printTable(c *config, targets []target, res results) {
	rows := []struct{ key, label string }{
		{"drain", fmt.Sprintf("drain %s ready tasks, HTTP handler", thousands(float64(c.drain)))},
		{"drain-noop", fmt.Sprintf("drain %s ready tasks, in-process no-op handler", thousands(float64(c.drain)))},
		{"enqueue-single", fmt.Sprintf("enqueue %s, single (%d in flight)", thousands(float64(c.enqueue)), c.concurrency)},
		{"enqueue-single-http", fmt.Sprintf("enqueue %s, single, one HTTP request each (%d in flight; asyncd without its SDK)", thousands(float64(c.enqueue)), c.concurrency)},
		{"enqueue-batch", fmt.Sprintf("enqueue %s, batches of %d (%d in flight)", thousands(float64(c.drain)), c.batch, c.inflight)},
		{"burst", fmt.Sprintf("%s due in the same second: lateness p50 / p99 / max", thousands(float64(c.burst)))},
		{"random", fmt.Sprintf("%s with random 1–10 s delays: lateness p50 / p99 / max", thousands(float64(c.random)))},
		{"idle-rss", fmt.Sprintf("%s pending, not due: worker RSS", thousands(float64(c.pending)))},
		{"idle-cpu", fmt.Sprintf("%s pending, not due: CPU while idle (worker + its store)", thousands(float64(c.pending)))},
	}
	var asyncds, peers []target
	for _, t := range targets {
		if _, ok := t.(*asyncdTarget); ok {
			asyncds = append(asyncds, t)
		} else {
			peers = append(peers, t)
		}
	}
	head := []string{"workload"}
	for _, t := range targets {
		head = append(head, t.Name())
	}
	for _, a := range asyncds {
		short := "asyncd dev"
		if a.(*asyncdTarget).name == "asyncd-pg" {
			short = "asyncd PG"
		}
		for _, p := range peers {
			head = append(head, short+" vs "+p.Name())
		}
	}
	fmt.Println("| " + strings.Join(head, " | ") + " |")
	fmt.Println("|---" + strings.Repeat("|---:", len(head)-1) + "|")
	for _, r := range rows {
		cells := res[r.key]
		if cells == nil {
			continue
		}
		line := []string{r.label}
		for _, t := range targets {
			v, ok := cells[t.Name()]
			if !ok {
				v.text = "–"
			}
			line = append(line, v.text)
		}
		for _, a := range asyncds {
			for _, p := range peers {
				av, aok := cells[a.Name()]
				pv, pok := cells[p.Name()]
				if !aok || !pok || av.value == 0 || pv.value == 0 {
					line = append(line, "–")
					continue
				}
				ratio := av.value / pv.value
				if av.lower {
					ratio = pv.value / av.value
				}
				line = append(line, fmt.Sprintf("%.2f×", ratio))
			}
		}
		fmt.Println("| " + strings.Join(line, " | ") + " |")
	}
	fmt.Printf(`
Ratios: asyncd's figure against the peer's, oriented so that above 1× means asyncd is
better (rates: asyncd ÷ peer; lateness (by p99), memory and CPU: peer ÷ asyncd).
Settings, the same for every system: %d tasks worked at once (asyncd: the job's
concurrency; River: MaxWorkers; graphile-worker: concurrency; BullMQ: Worker
concurrency); single enqueues %d in flight; batch enqueues of %d, %d in flight; %d
PostgreSQL connections per peer process (asyncd's pool: 10); every handler POSTs the task's
JSON body to one no-op HTTP executor (a separate Go process) over keep-alive
connections; lateness is the executor's arrival time minus the task's ETA; the drain rate is
taken from the executor's first call to its last (in-process no-op: the handler's first
and last call), after starting to consume (asyncd: resuming the paused job; a peer:
starting its worker process), so start-up is left out alike. Poll intervals and
retention are each system's defaults%s. asyncd has no in-process handler (every task is an
HTTP call to an executor), so it has no figure on that row. Idle CPU counts the worker
process and its store's server processes (PostgreSQL: the backends connected to the
system's database; Redis: redis-server; asyncd dev: SQLite is in the process) over %s,
after 5 s for start-up; RSS is the worker process's (asyncd PG: the dispatcher).
`, c.concurrency, c.concurrency, c.batch, c.inflight, c.pool, riverNote(c), c.idleWindow)
}

func riverNote(c *config) string {
	if c.cooldown > 0 {
		return fmt.Sprintf(", except River's FetchCooldown, set to %s", c.cooldown)
	}
	return " (River's FetchCooldown of 100 ms lets one River worker fetch at most its MaxWorkers jobs per 100 ms)"
}

package main

// The no-op HTTP executor every system's handler POSTs each task to: it answers 200 at
// once and notes, per call, the task's ETA (the "eta" field of the JSON body, RFC 3339)
// and the arrival time, so that drain rate and lateness are measured at the same point
// for asyncd and for every peer.

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"
)

// maxRecords bounds the arrivals kept; calls beyond it are counted but not kept.
const maxRecords = 4_000_000

type arrival struct{ eta, at int64 }

type executor struct {
	mu      sync.Mutex
	seen    []arrival
	count   int
	first   int64
	last    int64
	badBody int
}

// Stats is what GET /stats answers.
type Stats struct {
	Count   int   `json:"count"`
	FirstMs int64 `json:"first_ms"`
	LastMs  int64 `json:"last_ms"`
	P50     int64 `json:"p50"`
	P99     int64 `json:"p99"`
	Max     int64 `json:"max"`
	Early   int   `json:"early"`
	BadBody int   `json:"bad_body"`
}

func (e *executor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/stats":
		w.Header().Set("content-type", "application/json")
		_ = json.NewEncoder(w).Encode(e.stats())
		return
	case r.Method == http.MethodGet && r.URL.Path == "/count":
		// Polled while waiting, so it sorts nothing.
		e.mu.Lock()
		s := Stats{Count: e.count, LastMs: e.last}
		e.mu.Unlock()
		w.Header().Set("content-type", "application/json")
		_ = json.NewEncoder(w).Encode(s)
		return
	case r.Method == http.MethodPost && r.URL.Path == "/reset":
		e.mu.Lock()
		e.seen, e.count, e.first, e.last, e.badBody = e.seen[:0], 0, 0, 0, 0
		e.mu.Unlock()
		return
	}
	now := time.Now().UnixMilli()
	body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	var task struct {
		ETA string `json:"eta"`
	}
	eta := int64(-1)
	if json.Unmarshal(body, &task) == nil {
		if t, err := time.Parse(time.RFC3339Nano, task.ETA); err == nil {
			eta = t.UnixMilli()
		}
	}
	e.mu.Lock()
	e.count++
	if e.first == 0 {
		e.first = now
	}
	e.last = now
	if eta < 0 {
		e.badBody++
	} else if len(e.seen) < maxRecords {
		e.seen = append(e.seen, arrival{eta, now})
	}
	e.mu.Unlock()
}

func (e *executor) stats() Stats {
	e.mu.Lock()
	late := make([]int64, len(e.seen))
	for i, a := range e.seen {
		late[i] = a.at - a.eta
	}
	s := Stats{Count: e.count, FirstMs: e.first, LastMs: e.last, BadBody: e.badBody}
	e.mu.Unlock()
	s.P50, s.P99, s.Max, s.Early = quantiles(late)
	return s
}

// quantiles sorts late (ms) and returns p50, p99, max and how many were negative.
func quantiles(late []int64) (p50, p99, most int64, early int) {
	if len(late) == 0 {
		return 0, 0, 0, 0
	}
	sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
	pick := func(q float64) int64 {
		i := int(float64(len(late)) * q)
		if i >= len(late) {
			i = len(late) - 1
		}
		return late[i]
	}
	for _, l := range late {
		if l < 0 {
			early++
		}
	}
	return pick(0.50), pick(0.99), late[len(late)-1], early
}

func runExecutor(args []string) error {
	fs := flag.NewFlagSet("executor", flag.ExitOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on")
	_ = fs.Parse(args)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	// The first line on stdout is the base URL, for whoever started this process.
	fmt.Printf("http://%s/\n", ln.Addr())
	_ = os.Stdout.Sync()
	srv := &http.Server{Handler: &executor{}, ReadHeaderTimeout: 10 * time.Second}
	return srv.Serve(ln)
}

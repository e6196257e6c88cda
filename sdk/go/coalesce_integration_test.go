package asyncd_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

// pathCounter counts the API calls by path.
type pathCounter struct {
	mu    sync.Mutex
	paths map[string]int
}

func (p *pathCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	p.mu.Lock()
	p.paths[r.URL.Path]++
	p.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

// Many goroutines submitting through one call at a time against a real asyncd dev:
// the submits share batch calls, and each still gets exactly what it would alone.
func TestIntegrationConcurrentSubmitsShareCallsAndKeepTheirOwnAnswers(t *testing.T) {
	e := itEnv(t)
	counter := &pathCounter{paths: map[string]int{}}
	c := asyncd.NewClient(asyncd.WithEndpoint(e.endpoint), asyncd.WithSubmitCoalescing(1),
		asyncd.WithHTTPClient(&http.Client{Transport: counter, Timeout: 30 * time.Second}))
	base := uniq("co")
	const n = 200
	type answer struct {
		res *asyncd.SubmitResult
		err error
	}
	answers := make([]answer, n)
	task := func(i int) *asyncd.Task {
		t := &asyncd.Task{Type: "go_ok", Payload: map[string]int{"n": i}, IdempotencyKey: fmt.Sprintf("%s-%d", base, i), Delay: time.Hour}
		switch i {
		case 7: // the same key and payload as task 6: the same task
			t.Payload, t.IdempotencyKey = map[string]int{"n": 6}, fmt.Sprintf("%s-6", base)
		case 8: // the same key as task 6 with another payload: refused
			t.IdempotencyKey = fmt.Sprintf("%s-6", base)
		case 9:
			t.Type = "no_such_type"
		}
		return t
	}
	// Task 6 goes first, so that 7 and 8 repeat its key whatever order the rest take.
	res, err := c.Submit(context.Background(), task(6))
	answers[6] = answer{res, err}
	var wg sync.WaitGroup
	for i := range n {
		if i == 6 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.Submit(context.Background(), task(i))
			answers[i] = answer{res, err}
		}()
	}
	wg.Wait()

	ids := map[string]int{}
	for i, a := range answers {
		switch i {
		case 7, 8, 9:
			continue
		}
		if a.err != nil || a.res.ID == "" {
			t.Fatalf("submit %d: %+v %v", i, a.res, a.err)
		}
		if prev, ok := ids[a.res.ID]; ok {
			t.Fatalf("submits %d and %d answered the same id %s", prev, i, a.res.ID)
		}
		ids[a.res.ID] = i
	}
	if a := answers[7]; a.err != nil || a.res.ID != answers[6].res.ID || a.res.Duplicate == answers[6].res.Duplicate {
		t.Fatalf("a repeat of task 6 answered %+v %v; task 6 %+v", a.res, a.err, answers[6].res)
	}
	var apiErr *asyncd.APIError
	if err := answers[8].err; !errors.Is(err, asyncd.ErrIdempotencyMismatch) || !errors.As(err, &apiErr) || apiErr.Field != "idempotency_key" {
		t.Fatalf("another payload under task 6's key answered %v", err)
	}
	wantAPIError(t, answers[9].err, asyncd.ErrUnknownTaskType, 400, "type")
	for _, i := range []int{0, 6, 150, n - 1} {
		got, err := e.client.Get(ctx(t), answers[i].res.ID)
		if err != nil || string(got.Payload) != fmt.Sprintf(`{"n":%d}`, i) || got.State != asyncd.StatePending {
			t.Fatalf("task %d: %+v %v", i, got, err)
		}
	}
	counter.mu.Lock()
	batches, singles := counter.paths["/v1/tasks:batch"], counter.paths["/v1/tasks"]
	counter.mu.Unlock()
	if batches == 0 || batches+singles >= n/2 {
		t.Fatalf("%d batch calls and %d single calls for %d concurrent submits: they did not share calls", batches, singles, n)
	}
	for id := range ids {
		if err := e.client.Cancel(ctx(t), id); err != nil && !errors.Is(err, asyncd.ErrNotCancellable) {
			t.Fatal(err)
		}
	}
}

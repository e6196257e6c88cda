package asyncd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"sync"
	"time"
)

// DefaultSubmitCalls is how many submit calls a Client has in flight at once before
// further concurrent Submits wait and share the next call (WithSubmitCoalescing).
const DefaultSubmitCalls = 4

// A coalesced call carries at most this many tasks and, past its first task, at most
// coalesceMaxBytes of them: the API's batch limits are 1000 items and 16 MiB by
// default, and an operator may lower the byte limit to the single-task body limit.
const (
	coalesceMaxTasks = 1000
	coalesceMaxBytes = 1 << 20
)

// WithSubmitCoalescing sets how many submit calls a Client has in flight at once
// (default DefaultSubmitCalls). While they are all busy, further Submits from other
// goroutines queue and go together in the next free call, as one POST /v1/tasks:batch
// whose items are judged one by one: each Submit still returns its own task's result
// or error, exactly as alone. A Submit that finds a call free is sent at once, alone,
// as POST /v1/tasks, so a caller submitting one task at a time sees no difference.
// This is how a Kafka producer or a pipelining Redis client (BullMQ's) turns many
// small concurrent writes into few round trips; with 64 goroutines submitting it cuts
// the API's and the caller's work per task several times over.
//
// n <= 0 turns coalescing off: every Submit is its own call. A Submit whose context
// carries a trace (TraceParent) is always its own call, because a batch's tasks all
// join the batch request's trace.
func WithSubmitCoalescing(n int) Option {
	return func(c *Client) {
		if n <= 0 {
			c.coalesce = nil
			return
		}
		c.coalesce = &coalescer{maxCalls: n}
	}
}

// coalescer queues concurrent submits while maxCalls calls are in flight. Each call
// is made by a sender goroutine that, once its call is answered, takes the next
// queued submits, and ends when the queue is empty; so there are never more than
// maxCalls senders, and none outlives the work queued for it.
type coalescer struct {
	maxCalls int

	mu      sync.Mutex
	queue   []*queuedSubmit // bounded by the goroutines blocked in Submit
	senders int
}

type queuedSubmit struct {
	ctx  context.Context
	body json.RawMessage
	// done receives the outcome once; buffered, so a sender never waits for a
	// Submit that gave up.
	done chan submitOutcome
}

type submitOutcome struct {
	res *SubmitResult
	err error
}

func (k *coalescer) submit(ctx context.Context, c *Client, body *submitBody) (*SubmitResult, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("asyncd: marshal request: %w", err)
	}
	q := &queuedSubmit{ctx: ctx, body: raw, done: make(chan submitOutcome, 1)}
	k.mu.Lock()
	k.queue = append(k.queue, q)
	start := k.senders < k.maxCalls
	if start {
		k.senders++
	}
	k.mu.Unlock()
	if start {
		go k.send(c)
	}
	select {
	case o := <-q.done:
		return o.res, o.err
	case <-ctx.Done():
		k.mu.Lock()
		if i := slices.Index(k.queue, q); i >= 0 {
			k.queue = slices.Delete(k.queue, i, i+1)
		}
		k.mu.Unlock()
		// Already taken into a call, the task may still be stored, as when a lone
		// call is cancelled after it was sent; its idempotency key makes a retry safe.
		return nil, ctx.Err()
	}
}

// send makes calls until the queue is empty.
func (k *coalescer) send(c *Client) {
	for {
		k.mu.Lock()
		n, size := 0, 0
		for n < len(k.queue) && n < coalesceMaxTasks {
			size += len(k.queue[n].body) + 1
			if n > 0 && size > coalesceMaxBytes {
				break
			}
			n++
		}
		if n == 0 {
			k.senders--
			k.mu.Unlock()
			return
		}
		call := make([]*queuedSubmit, 0, n)
		for _, q := range k.queue[:n] {
			// A submitter that gave up after its task was taken is not stored for.
			if q.ctx.Err() == nil {
				call = append(call, q)
			}
		}
		k.queue = slices.Delete(k.queue, 0, n)
		k.mu.Unlock()
		if len(call) > 0 {
			c.sendCoalesced(call)
			// The submitters just answered usually submit again at once. Letting them
			// run before looking at the queue puts their next tasks in this sender's
			// next call, instead of finding the queue empty, ending, and leaving the
			// first of them to go alone: a third fewer calls, and 12 % more submits a
			// second from 64 goroutines (docs/benchmarks.md, "What a key cost").
			runtime.Gosched()
		}
	}
}

// callContext outlives any one submitter's context, since the call carries the others'
// tasks too: it ends at the latest of their deadlines, or has none if one has none.
func callContext(call []*queuedSubmit) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, q := range call {
		d, ok := q.ctx.Deadline()
		if !ok {
			return context.WithCancel(context.Background())
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

func (c *Client) sendCoalesced(call []*queuedSubmit) {
	ctx, cancel := callContext(call)
	defer cancel()
	if len(call) == 1 {
		c.sendAlone(ctx, call[0])
		return
	}
	var buf bytes.Buffer
	buf.WriteString(`{"tasks":[`)
	for i, q := range call {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.Write(q.body)
	}
	buf.WriteString(`]}`)
	var answer submitBatchAnswer
	err := c.do(ctx, http.MethodPost, "/v1/tasks:batch", json.RawMessage(buf.Bytes()), &answer)
	var apiErr *APIError
	if errors.As(err, &apiErr) && apiErr.Status == http.StatusRequestEntityTooLarge {
		// The API's batch body limit is below what this call carried: each task alone
		// fits whatever a single submit of it would.
		for _, q := range call {
			c.sendAlone(ctx, q)
		}
		return
	}
	if err == nil && len(answer.Results) != len(call) {
		err = fmt.Errorf("asyncd: batch of %d answered with %d results", len(call), len(answer.Results))
	}
	if err != nil {
		for _, q := range call {
			q.done <- submitOutcome{err: err}
		}
		return
	}
	for i, r := range answer.Results {
		item := r.result()
		if item.Err != nil {
			call[i].done <- submitOutcome{err: item.Err}
		} else {
			res := item.SubmitResult
			call[i].done <- submitOutcome{res: &res}
		}
	}
}

func (c *Client) sendAlone(ctx context.Context, q *queuedSubmit) {
	var res SubmitResult
	if err := c.do(ctx, http.MethodPost, "/v1/tasks", q.body, &res); err != nil {
		q.done <- submitOutcome{err: err}
		return
	}
	q.done <- submitOutcome{res: &res}
}

// submitBatchAnswer is the answer of POST /v1/tasks:batch.
type submitBatchAnswer struct {
	Results []submitBatchItem `json:"results"`
}

type submitBatchItem struct {
	Status int `json:"status"`
	SubmitResult
	Error *errorFields `json:"error"`
}

func (r submitBatchItem) result() BatchResult {
	out := BatchResult{Status: r.Status}
	if r.Error != nil {
		out.Err = r.Error.apiError(r.Status)
	} else {
		out.SubmitResult = r.SubmitResult
	}
	return out
}

package asyncd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// DefaultLease is the lease a LongRunning executor asks for when given none.
const DefaultLease = 30 * time.Second

// maxExecutorBody bounds what the handler reads; asyncd's own payload limit is 1 MiB
// by default, so this only stops garbage.
const maxExecutorBody = 32 << 20

// HandlerFunc executes one task. payload is the task's JSON payload as sent
// (e.g. `{"order_id":42}`, or `null`); TaskInfoFrom(ctx) tells which task and attempt.
type HandlerFunc func(ctx context.Context, payload string) error

// TaskInfo describes the task and attempt a handler is running.
type TaskInfo struct {
	ID   string
	Type string
	// IdempotencyKey is the task's idempotency key, else its id: key side effects on it,
	// since asyncd delivers at least once.
	IdempotencyKey string
	Attempt        int    // 1-based
	LeaseToken     string // opaque: echo it in callbacks
	ETA            time.Time
	CallbackURL    string
	// TraceParent and TraceState are the call's W3C trace context (empty without one);
	// the handler's ctx carries them too (see TraceParent).
	TraceParent string
	TraceState  string
}

type taskInfoKey struct{}

// TaskInfoFrom returns the TaskInfo of the task a handler's ctx belongs to.
func TaskInfoFrom(ctx context.Context) (TaskInfo, bool) {
	ti, ok := ctx.Value(taskInfoKey{}).(TaskInfo)
	return ti, ok
}

// RetryError asks asyncd to retry the task after After (503 with Retry-After). With
// After <= 0 asyncd picks the time with its exponential backoff.
type RetryError struct {
	After time.Duration
	Err   error
}

func (e *RetryError) Error() string {
	msg := "retry"
	if e.After > 0 {
		msg += " after " + formatDuration(e.After)
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *RetryError) Unwrap() error { return e.Err }

// Retry returns an error that makes asyncd retry the task after the given time.
func Retry(after time.Duration) error { return &RetryError{After: after} }

// PermanentError marks a failure that no retry can fix: the task goes to dead letters.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string {
	if e.Err == nil {
		return "permanent failure"
	}
	return e.Err.Error()
}

func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err so that the task goes straight to dead letters (422).
func Permanent(err error) error { return &PermanentError{Err: err} }

// ExecutorOption configures one registered executor.
type ExecutorOption func(*executor)

// LongRunning makes the executor answer 202 {"lease": lease} at once and run the
// handler in the background, heartbeating every lease/3 and posting the outcome to
// the task's result endpoint. Use it for work that may outlast the job's timeout.
// The handler's ctx is cancelled if asyncd refuses a heartbeat: the task was cancelled
// (ErrTaskCancelled) or the lease lapsed and a newer attempt owns it (ErrStaleLease).
// Zero means DefaultLease.
func LongRunning(lease time.Duration) ExecutorOption {
	return func(e *executor) {
		if lease <= 0 {
			lease = DefaultLease
		}
		e.lease = lease
	}
}

// outputHandler is what every registration becomes: the payload as sent in, the
// output (JSON, or nil for none) out.
type outputHandler func(ctx context.Context, payload string) (json.RawMessage, error)

type executor struct {
	handler outputHandler
	lease   time.Duration // > 0: long-running
}

// RegisterExecutor makes the Client, as an http.Handler, run h for tasks of taskType.
// Registering a type again replaces its handler. Handle is the typed form.
func (c *Client) RegisterExecutor(taskType string, h func(ctx context.Context, payload string) error, opts ...ExecutorOption) {
	c.register(taskType, func(ctx context.Context, payload string) (json.RawMessage, error) {
		return nil, h(ctx, payload)
	}, opts)
}

// Handle registers h for tasks of taskType on c with the payload decoded into P (with
// encoding/json) and h's output O kept as the task's result: a LongRunning executor
// posts it as the result's output, which GET /v1/tasks/{id} shows as "result" (the
// body of a plain 2xx answer is not stored, so a plain executor's output is only
// sent). A payload that does not decode into P fails the task permanently: the same
// payload would fail again. Use struct{} for O when there is no output.
func Handle[P, O any](c *Client, taskType string, h func(ctx context.Context, payload P) (O, error), opts ...ExecutorOption) {
	c.register(taskType, func(ctx context.Context, raw string) (json.RawMessage, error) {
		var p P
		if err := json.Unmarshal([]byte(raw), &p); err != nil {
			return nil, Permanent(fmt.Errorf("payload does not decode into %T: %w", p, err))
		}
		out, err := h(ctx, p)
		if err != nil {
			return nil, err
		}
		encoded, err := json.Marshal(out)
		if err != nil {
			return nil, Permanent(fmt.Errorf("output does not encode: %w", err))
		}
		return encoded, nil
	}, opts)
}

func (c *Client) register(taskType string, h outputHandler, opts []ExecutorOption) {
	ex := executor{handler: h}
	for _, o := range opts {
		o(&ex)
	}
	c.mu.Lock()
	c.executors[taskType] = ex
	c.mu.Unlock()
}

type envelope struct {
	ID      string          `json:"id"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload"`
	Attempt int             `json:"attempt"`
	ETA     string          `json:"eta"`
}

// taskCall is one task as a call delivers it: a single call's body with what its
// headers carry, or one entry of a batch call's body (docs/api.md, "Batch delivery").
type taskCall struct {
	envelope
	IdempotencyKey string `json:"idempotency_key"`
	LeaseToken     string `json:"lease_token"`
	TraceParent    string `json:"traceparent,omitempty"`
	TraceState     string `json:"tracestate,omitempty"`
}

// batchCall is the body of a batch call.
type batchCall struct {
	Tasks []taskCall `json:"tasks"`
}

// batchResult is one task's entry in the answer to a batch call.
type batchResult struct {
	ID         string `json:"id"`
	Status     string `json:"status"` // success, accepted, retry or failed
	Error      string `json:"error,omitempty"`
	RetryAfter string `json:"retry_after,omitempty"`
	Lease      string `json:"lease,omitempty"`
}

// batchAnswer is the 200 answer to a batch call: one result per task of the call.
type batchAnswer struct {
	Results []batchResult `json:"results"`
}

// maxBatchHandlers bounds the handlers one batch call runs at once.
const maxBatchHandlers = 64

// decodeBatch reads a batch call's body: every task needs an id and a type, since
// each result names its task and the type picks the handler.
func decodeBatch(body []byte) (*batchCall, error) {
	var call batchCall
	if err := json.Unmarshal(body, &call); err != nil || call.Tasks == nil {
		return nil, ErrMalformedBatch
	}
	for _, t := range call.Tasks {
		if t.ID == "" || t.Type == "" {
			return nil, ErrMalformedBatch
		}
	}
	return &call, nil
}

// ServeHTTP serves the executor contract for the registered executors, whatever
// the request path: single calls, and batch calls (Asyncd-Batch), whose tasks run the
// same handlers, each as if it had come alone.
func (c *Client) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSON(w, http.StatusMethodNotAllowed, errJSON("method not allowed"))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxExecutorBody))
	if err != nil {
		writeJSON(w, http.StatusRequestEntityTooLarge, errJSON("body too large"))
		return
	}
	if r.Header.Get(HeaderBatch) != "" {
		c.serveBatch(w, r, body)
		return
	}
	if c.verifier != nil {
		if err := c.verifier.Verify(r.Header, body, c.now()); err != nil {
			c.logRefusal(r.Header, err, "task_id", r.Header.Get(HeaderTaskID), "attempt", r.Header.Get(HeaderAttempt))
			writeJSON(w, http.StatusUnauthorized, errJSON(err.Error()))
			return
		}
	}
	var env envelope
	if err := json.Unmarshal(body, &env); err != nil || env.Type == "" {
		// The same body would come again on a retry, so this is permanent (400).
		c.logger().Error("asyncd: refused an executor call (400): the body is not an asyncd task",
			"task_id", r.Header.Get(HeaderTaskID))
		writeJSON(w, http.StatusBadRequest, errJSON("body is not an asyncd task"))
		return
	}
	writeOutcome(w, c.runTask(r.Context(), singleTask(r, env), r.Header.Get(HeaderCallbackURL)))
}

// serveBatch answers a batch call: 401 or 400 for the whole call as a single call
// would be, else 200 with one result per task, each task run by runTask like a single
// call's, at most maxBatchHandlers at once.
func (c *Client) serveBatch(w http.ResponseWriter, r *http.Request, body []byte) {
	var ts int64
	if c.verifier != nil {
		var err error
		if ts, err = c.verifier.verifyBatchCall(r.Header, body, c.now()); err != nil {
			c.logRefusal(r.Header, err, "batch", r.Header.Get(HeaderBatch))
			writeJSON(w, http.StatusUnauthorized, errJSON(err.Error()))
			return
		}
	}
	call, err := decodeBatch(body)
	if err != nil {
		// The same body would come again on a retry, so this is permanent (400).
		c.logger().Error("asyncd: refused a batch executor call (400): the body is not a batch of asyncd tasks",
			"batch", r.Header.Get(HeaderBatch))
		writeJSON(w, http.StatusBadRequest, errJSON(err.Error()))
		return
	}
	replayed := make([]error, len(call.Tasks))
	if c.verifier != nil {
		replayed = c.verifier.admitBatch(call.Tasks, ts, c.now())
	}
	callbackURL := r.Header.Get(HeaderCallbackURL)
	results := make([]batchResult, len(call.Tasks))
	sem := make(chan struct{}, max(1, min(len(call.Tasks), maxBatchHandlers)))
	var wg sync.WaitGroup
	for i, t := range call.Tasks {
		if err := replayed[i]; err != nil {
			// What a single call gets as a 401 (a permanent failure), for this task only.
			c.logRefusal(r.Header, err, "task_id", t.ID, "attempt", t.Attempt)
			results[i] = batchResultOf(t.ID, taskOutcome{err: &PermanentError{Err: err}})
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			results[i] = batchResultOf(t.ID, c.runTask(r.Context(), t, callbackURL))
		}()
	}
	wg.Wait()
	writeJSON(w, http.StatusOK, batchAnswer{Results: results})
}

// logRefusal logs a call, or a task of a batch call, refused for its signature.
func (c *Client) logRefusal(h http.Header, err error, attrs ...any) {
	attrs = append(attrs, "reason", err.Error(), "hint", refusalHint(h, err))
	c.logger().Error("asyncd: refused an executor call (401: asyncd will not retry it; redrive the task once fixed)", attrs...)
}

// taskOutcome is how one task of a call ended: the handler's output and error, or
// accepted as long-running (lease > 0). A single call answers it with a status code
// (writeOutcome), a batch call with a result entry (batchResultOf).
type taskOutcome struct {
	out   json.RawMessage
	err   error
	lease time.Duration
}

// noExecutorError: no handler is registered for the task's type.
type noExecutorError struct{ taskType string }

func (e *noExecutorError) Error() string {
	return fmt.Sprintf("no executor for task type %q", e.taskType)
}

// runTask runs one task of a call, single or batch: its registered handler with its
// TaskInfo in ctx, or, for a LongRunning executor, in the background (heartbeats, then
// the result posted with the task's lease token).
func (c *Client) runTask(ctx context.Context, t taskCall, callbackURL string) taskOutcome {
	c.mu.RLock()
	ex, ok := c.executors[t.Type]
	c.mu.RUnlock()
	if !ok {
		// 501, not 404 (a "retry" in a batch, not "failed"): a 4xx would dead-letter the
		// task, while the usual cause is a rollout that has not reached this replica
		// yet; a 5xx is retried.
		c.logger().Warn("asyncd: refused an executor call (501): no executor for this task type; asyncd will retry",
			"task_id", t.ID, "task_type", t.Type, "attempt", t.Attempt)
		return taskOutcome{err: &noExecutorError{t.Type}}
	}
	info := c.taskInfo(t, callbackURL)
	payload := string(t.Payload)
	if payload == "" {
		payload = "null"
	}
	if ex.lease > 0 {
		c.inflight.Add(1)
		go c.runLongRunning(info, ex, payload)
		return taskOutcome{lease: ex.lease}
	}
	started := time.Now()
	out, err := safeCall(withTaskInfo(ctx, info), ex.handler, payload)
	c.logOutcome(info, err, ctx.Err() != nil, time.Since(started))
	return taskOutcome{out: out, err: err}
}

// refusalHint says what usually causes a signature refusal.
func refusalHint(h http.Header, err error) string {
	switch {
	case errors.Is(err, ErrNoSigningKey):
		return "this executor has no usable signing key (is the variable holding the job's signing secret empty?): it refuses every call"
	case h.Get(HeaderSignature) == "":
		return "the call is unsigned: the job has no spec.executor.signing (asyncd signs the calls of jobs that configure it), or the caller is not asyncd"
	case errors.Is(err, ErrStaleTimestamp):
		return "the clocks of asyncd and this executor differ by more than 5 minutes"
	case errors.Is(err, ErrReplayed):
		return "this attempt was delivered before (a replayed call)"
	default:
		return "the signing key differs from the job's signing Secret"
	}
}

// logOutcome logs a task attempt that did not succeed: how asyncd will treat it, and
// whether asyncd had already given up on the call (its executor timeout).
func (c *Client) logOutcome(info TaskInfo, err error, timedOut bool, took time.Duration) {
	if err == nil && !timedOut {
		return
	}
	attrs := []any{"task_id", info.ID, "task_type", info.Type, "attempt", info.Attempt, "took", took}
	if err != nil {
		attrs = append(attrs, "error", err.Error())
	}
	var perm *PermanentError
	switch {
	case timedOut:
		c.logger().Error("asyncd: task timed out: asyncd closed the call before the handler returned (the job's executor timeout is shorter than the handler); it counts as a failed attempt and may run again", attrs...)
	case errors.As(err, &perm):
		c.logger().Error("asyncd: task failed permanently; it goes to dead letters", attrs...)
	default:
		c.logger().Warn("asyncd: task failed; asyncd will retry it", attrs...)
	}
}

// singleTask is a single call's task: its body, with the id and attempt from the
// headers when the body lacks them, and what only the headers carry.
func singleTask(r *http.Request, env envelope) taskCall {
	t := taskCall{
		envelope:       env,
		IdempotencyKey: r.Header.Get(HeaderIdempotencyKey),
		LeaseToken:     r.Header.Get(HeaderLeaseToken),
		TraceParent:    r.Header.Get(TraceParentHeader),
		TraceState:     r.Header.Get(TraceStateHeader),
	}
	if t.ID == "" {
		t.ID = r.Header.Get(HeaderTaskID)
	}
	if n, err := strconv.Atoi(r.Header.Get(HeaderAttempt)); err == nil && t.Attempt == 0 {
		t.Attempt = n
	}
	return t
}

func (c *Client) taskInfo(t taskCall, callbackURL string) TaskInfo {
	info := TaskInfo{
		ID:             t.ID,
		Type:           t.Type,
		IdempotencyKey: t.IdempotencyKey,
		Attempt:        t.Attempt,
		LeaseToken:     t.LeaseToken,
		CallbackURL:    callbackURL,
		TraceParent:    t.TraceParent,
		TraceState:     t.TraceState,
	}
	if info.IdempotencyKey == "" {
		info.IdempotencyKey = info.ID
	}
	if info.CallbackURL == "" {
		info.CallbackURL = c.endpoint
	}
	info.ETA, _ = time.Parse(time.RFC3339Nano, t.ETA)
	return info
}

func withTaskInfo(ctx context.Context, info TaskInfo) context.Context {
	ctx = ContextWithTraceParent(ctx, info.TraceParent, info.TraceState)
	return context.WithValue(ctx, taskInfoKey{}, info)
}

// safeCall runs h, turning a panic into an ordinary (retryable) error so that one bad
// task cannot take the executor process down.
func safeCall(ctx context.Context, h outputHandler, payload string) (out json.RawMessage, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return h(ctx, payload)
}

func writeOutcome(w http.ResponseWriter, o taskOutcome) {
	var retry *RetryError
	var perm *PermanentError
	var noExec *noExecutorError
	err := o.err
	switch {
	case o.lease > 0:
		writeJSON(w, http.StatusAccepted, map[string]string{"lease": formatDuration(o.lease)})
	case err == nil && o.out != nil:
		writeJSON(w, http.StatusOK, o.out)
	case err == nil:
		writeJSON(w, http.StatusOK, map[string]any{})
	case errors.As(err, &retry):
		if retry.After > 0 {
			w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(retry.After), 10))
		}
		writeJSON(w, http.StatusServiceUnavailable, errJSON(err.Error()))
	case errors.As(err, &perm):
		writeJSON(w, http.StatusUnprocessableEntity, errJSON(err.Error()))
	case errors.As(err, &noExec):
		writeJSON(w, http.StatusNotImplemented, errJSON(err.Error()))
	default:
		writeJSON(w, http.StatusInternalServerError, errJSON(err.Error()))
	}
}

// batchResultOf is a task's entry in a batch answer: what writeOutcome answers a
// single call, as a status (a 503 and a 5xx are both "retry", a 422 is "failed").
func batchResultOf(id string, o taskOutcome) batchResult {
	if o.lease > 0 {
		return batchResult{ID: id, Status: "accepted", Lease: formatDuration(o.lease)}
	}
	status, msg, retryAfter := resultStatus(o.err)
	return batchResult{ID: id, Status: status, Error: msg, RetryAfter: retryAfter}
}

// resultStatus maps a handler's error onto the status of a posted result or of a batch
// answer's entry: success, retry (with retry_after for Retry(d)) or failed.
func resultStatus(err error) (status, msg, retryAfter string) {
	var retry *RetryError
	var perm *PermanentError
	switch {
	case err == nil:
		return "success", "", ""
	case errors.As(err, &retry): // first, as writeOutcome checks it
		if retry.After > 0 {
			retryAfter = formatDuration(retry.After)
		}
		return "retry", err.Error(), retryAfter
	case errors.As(err, &perm):
		return "failed", err.Error(), ""
	default:
		return "retry", err.Error(), ""
	}
}

// retryAfterSeconds rounds up: Retry-After has whole seconds and retrying early is
// what the handler asked not to happen.
func retryAfterSeconds(d time.Duration) int64 {
	return int64(math.Ceil(d.Seconds()))
}

func errJSON(msg string) map[string]string { return map[string]string{"error": msg} }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

type resultBody struct {
	LeaseToken string          `json:"lease_token"`
	Status     string          `json:"status"`
	Error      string          `json:"error,omitempty"`
	Output     json.RawMessage `json:"output,omitempty"`
	RetryAfter string          `json:"retry_after,omitempty"`
}

func (c *Client) runLongRunning(info TaskInfo, ex executor, payload string) {
	defer c.inflight.Done()
	// Cancelled by a refused heartbeat (the task was cancelled, or a newer attempt owns
	// it), or by Shutdown when its grace period ends.
	ctx, cancel := context.WithCancel(c.handlerCtx)
	defer cancel()

	var mu sync.Mutex
	leaseUntil := c.now().Add(ex.lease)
	lost, cancelled := false, false
	stop := make(chan struct{})
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		t := time.NewTicker(ex.lease / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			err := c.heartbeat(info, ex.lease)
			mu.Lock()
			switch {
			case err == nil:
				leaseUntil = c.now().Add(ex.lease)
			case errors.Is(err, ErrTaskCancelled):
				lost, cancelled = true, true
				cancel()
			case errors.Is(err, ErrStaleLease) || errors.Is(err, ErrNotFound):
				lost = true
				cancel()
			}
			mu.Unlock()
			if lost {
				return
			}
		}
	}()

	started := time.Now()
	out, err := safeCall(withTaskInfo(ctx, info), ex.handler, payload)
	close(stop)
	<-hbDone
	mu.Lock()
	defer mu.Unlock()
	if cancelled {
		c.logger().Info("asyncd: task was cancelled while it ran (its heartbeat said so); the handler's context was cancelled and its result is dropped",
			"task_id", info.ID, "task_type", info.Type, "attempt", info.Attempt)
		return
	}
	if lost {
		c.logger().Warn("asyncd: long-running task lost its lease (a heartbeat was refused): a newer attempt owns it; this attempt's result is dropped",
			"task_id", info.ID, "task_type", info.Type, "attempt", info.Attempt)
		return // a newer attempt owns the task; asyncd would refuse our result
	}
	if c.handlerCtx.Err() != nil && err != nil {
		err = fmt.Errorf("executor shutting down: %w", err)
	}
	c.logOutcome(info, err, false, time.Since(started))
	res := resultBody{LeaseToken: info.LeaseToken, Output: out}
	res.Status, res.Error, res.RetryAfter = resultStatus(err)
	c.postResult(info, res, leaseUntil)
}

func (c *Client) heartbeat(info TaskInfo, lease time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), lease/3)
	defer cancel()
	body := map[string]any{"lease_token": info.LeaseToken, "lease": formatDuration(lease)}
	return c.doAt(ctx, info.CallbackURL, http.MethodPost, "/v1/tasks/"+url.PathEscape(info.ID)+"/heartbeat", body, nil)
}

// postResult retries transport failures and 5xx until the lease would have lapsed
// anyway; after that asyncd retries the task itself.
func (c *Client) postResult(info TaskInfo, res resultBody, leaseUntil time.Time) {
	backoff := 100 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.doAt(ctx, info.CallbackURL, http.MethodPost, "/v1/tasks/"+url.PathEscape(info.ID)+"/result", res, nil)
		cancel()
		var apiErr *APIError
		if err == nil || (errors.As(err, &apiErr) && apiErr.Status < 500) {
			return
		}
		if c.now().Add(backoff).After(leaseUntil) {
			return
		}
		time.Sleep(backoff)
		backoff = min(backoff*2, 5*time.Second)
	}
}

// Shutdown waits until the long-running handlers still at work have posted their
// results, or ctx ends (the grace period). Then it cancels the contexts of the handlers
// still running, so they can stop (a handler that returns posts a "retry" result, and
// asyncd runs the task again), and returns ctx's error. Stop the HTTP server first so
// no new ones start.
func (c *Client) Shutdown(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		c.inflight.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		c.logger().Warn("asyncd: shutdown grace period over: cancelling the long-running handlers still at work")
		c.stopHandlers()
		return ctx.Err()
	}
}

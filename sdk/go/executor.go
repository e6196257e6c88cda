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

// ServeHTTP serves the executor contract for the registered executors, whatever
// the request path.
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
	if c.verifier != nil {
		if err := c.verifier.Verify(r.Header, body, c.now()); err != nil {
			c.logger().Error("asyncd: refused an executor call (401: asyncd will not retry it; redrive the task once fixed)",
				"task_id", r.Header.Get(HeaderTaskID), "attempt", r.Header.Get(HeaderAttempt),
				"reason", err.Error(), "hint", refusalHint(r.Header, err))
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
	c.mu.RLock()
	ex, ok := c.executors[env.Type]
	c.mu.RUnlock()
	if !ok {
		// 501, not 404: a 4xx would dead-letter the task, while the usual cause is a
		// rollout that has not reached this replica yet; a 5xx is retried.
		c.logger().Warn("asyncd: refused an executor call (501): no executor for this task type; asyncd will retry",
			"task_id", env.ID, "task_type", env.Type, "attempt", env.Attempt)
		writeJSON(w, http.StatusNotImplemented, errJSON(fmt.Sprintf("no executor for task type %q", env.Type)))
		return
	}
	info := taskInfoFromRequest(r, &env)
	if info.CallbackURL == "" {
		info.CallbackURL = c.endpoint
	}
	payload := string(env.Payload)
	if payload == "" {
		payload = "null"
	}
	if ex.lease > 0 {
		c.inflight.Add(1)
		go c.runLongRunning(info, ex, payload)
		writeJSON(w, http.StatusAccepted, map[string]string{"lease": formatDuration(ex.lease)})
		return
	}
	started := time.Now()
	out, err := safeCall(withTaskInfo(r.Context(), info), ex.handler, payload)
	c.logOutcome(info, err, r.Context().Err() != nil, time.Since(started))
	writeOutcome(w, out, err)
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

func taskInfoFromRequest(r *http.Request, env *envelope) TaskInfo {
	info := TaskInfo{
		ID:             env.ID,
		Type:           env.Type,
		IdempotencyKey: r.Header.Get(HeaderIdempotencyKey),
		Attempt:        env.Attempt,
		CallbackURL:    r.Header.Get(HeaderCallbackURL),
	}
	if info.ID == "" {
		info.ID = r.Header.Get(HeaderTaskID)
	}
	if info.IdempotencyKey == "" {
		info.IdempotencyKey = info.ID
	}
	if n, err := strconv.Atoi(r.Header.Get(HeaderAttempt)); err == nil && info.Attempt == 0 {
		info.Attempt = n
	}
	info.LeaseToken = r.Header.Get(HeaderLeaseToken)
	info.TraceParent = r.Header.Get(TraceParentHeader)
	info.TraceState = r.Header.Get(TraceStateHeader)
	info.ETA, _ = time.Parse(time.RFC3339Nano, env.ETA)
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

func writeOutcome(w http.ResponseWriter, out json.RawMessage, err error) {
	var retry *RetryError
	var perm *PermanentError
	switch {
	case err == nil && out != nil:
		writeJSON(w, http.StatusOK, out)
	case err == nil:
		writeJSON(w, http.StatusOK, map[string]any{})
	case errors.As(err, &retry):
		if retry.After > 0 {
			w.Header().Set("Retry-After", strconv.FormatInt(retryAfterSeconds(retry.After), 10))
		}
		writeJSON(w, http.StatusServiceUnavailable, errJSON(err.Error()))
	case errors.As(err, &perm):
		writeJSON(w, http.StatusUnprocessableEntity, errJSON(err.Error()))
	default:
		writeJSON(w, http.StatusInternalServerError, errJSON(err.Error()))
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
	res := resultBody{LeaseToken: info.LeaseToken, Status: "success", Output: out}
	var retry *RetryError
	var perm *PermanentError
	switch {
	case err == nil:
	case errors.As(err, &perm):
		res.Status, res.Error = "failed", err.Error()
	case errors.As(err, &retry):
		res.Status, res.Error = "retry", err.Error()
		if retry.After > 0 {
			res.RetryAfter = formatDuration(retry.After)
		}
	default:
		res.Status, res.Error = "retry", err.Error()
	}
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

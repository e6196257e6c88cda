package asyncd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultEndpoint is where `asyncd dev` listens unless told otherwise.
const DefaultEndpoint = "http://127.0.0.1:7700"

// SourceServiceHeader labels submits for asyncd_task_submitted_total.
const SourceServiceHeader = "Asyncd-Source-Service"

// Client talks to the asyncd API and serves registered executors (it is an
// http.Handler). It is safe for concurrent use.
type Client struct {
	endpoint    string
	serviceName string
	httpClient  *http.Client
	verifier    *Verifier
	token       *tokenSource
	now         func() time.Time

	retry *RetryPolicy
	// coalesce shares calls between concurrent Submits; nil sends each alone.
	coalesce *coalescer
	log      *slog.Logger
	// stopHandlers cancels the contexts of long-running handlers still at work when
	// Shutdown's grace period ends.
	handlerCtx   context.Context
	stopHandlers context.CancelFunc

	mu        sync.RWMutex
	executors map[string]executor
	inflight  sync.WaitGroup // long-running handlers still at work
}

// Option configures a Client.
type Option func(*Client)

// WithEndpoint sets the base URL of the asyncd API (default DefaultEndpoint).
func WithEndpoint(endpoint string) Option {
	return func(c *Client) { c.endpoint = strings.TrimRight(endpoint, "/") }
}

// WithServiceName names the submitting service; it is sent as Asyncd-Source-Service.
func WithServiceName(name string) Option {
	return func(c *Client) { c.serviceName = name }
}

// WithHTTPClient replaces the HTTP client used for API calls, heartbeats and results.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.httpClient = hc }
}

// WithSigningSecret makes the executor handler refuse (401) any call whose
// Asyncd-Signature verifies with none of the keys — the values in the job's signing
// Secret (spec.executor.signing.secretRef) — whose Asyncd-Timestamp is more than
// SignatureTolerance off, or that repeats a (task, attempt) already delivered within
// that window. Pass two keys while rotating. An empty key is never accepted: with no
// usable key every call is refused.
func WithSigningSecret(key string, more ...string) Option {
	return func(c *Client) {
		keys := [][]byte{[]byte(key)}
		for _, k := range more {
			keys = append(keys, []byte(k))
		}
		c.verifier = NewVerifier(keys...)
	}
}

// WithLogger sets where the executor helper logs every task it did not run to success
// (failed, refused, timed out). Default: slog.Default() at the time of logging.
func WithLogger(l *slog.Logger) Option {
	return func(c *Client) { c.log = l }
}

func (c *Client) logger() *slog.Logger {
	if c.log != nil {
		return c.log
	}
	return slog.Default()
}

// WithToken sends token as "Authorization: Bearer <token>" on every API call (an API
// token of `asyncd api --auth tokens`, or a Kubernetes token for --auth kubernetes).
func WithToken(token string) Option {
	return func(c *Client) { c.token = &tokenSource{static: token} }
}

// WithTokenFile sends the token read from path, re-read every TokenFileRefresh (a
// projected ServiceAccount token rotates), as "Authorization: Bearer <token>". A missing
// file sends no token.
func WithTokenFile(path string) Option {
	return func(c *Client) { c.token = &tokenSource{path: path} }
}

// NewClient returns a Client; without options it talks to DefaultEndpoint, with the token
// in DefaultTokenFile when that file exists.
func NewClient(opts ...Option) *Client {
	handlerCtx, stopHandlers := context.WithCancel(context.Background())
	c := &Client{
		handlerCtx:   handlerCtx,
		stopHandlers: stopHandlers,
		endpoint:     DefaultEndpoint,
		httpClient:   &http.Client{Timeout: 30 * time.Second, Transport: apiTransport()},
		token:        &tokenSource{path: DefaultTokenFile},
		now:          time.Now,
		executors:    map[string]executor{},
		coalesce:     &coalescer{maxCalls: DefaultSubmitCalls},
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// apiTransport is http.DefaultTransport keeping more idle connections to the API: the
// default's 2 per host closes and reopens connections as soon as more than two
// goroutines call at once, which a busy submitter always does.
func apiTransport() http.RoundTripper {
	t, ok := http.DefaultTransport.(*http.Transport)
	if !ok {
		return http.DefaultTransport
	}
	t = t.Clone()
	t.MaxIdleConnsPerHost = 64
	return t
}

// Task is one unit of work to submit.
type Task struct {
	// Type is an AsyncJobConfig's spec.taskType.
	Type string
	// Payload is marshalled with encoding/json; a json.RawMessage is sent as is.
	Payload any
	// IdempotencyKey is required: a repeat of it returns the first task instead of
	// enqueueing a second. IdempotencyKeyFrom derives one from payload fields.
	IdempotencyKey string
	// UniqueKey refuses the submit (ErrUniqueConflict) while a task holding it is pending.
	UniqueKey string
	// Priority 0..9, higher first among equal ETAs.
	Priority int
	// MaxRetries overrides the job's spec.retry.maxRetries when non-nil; 0 is valid.
	MaxRetries *int
	// Timeout overrides the job's per-attempt executor timeout when non-zero.
	Timeout time.Duration
	// DependsOn holds task ids that must all succeed before this one runs.
	DependsOn []string
	// Delay and ETA postpone the task; set at most one. SubmitDelayed and SubmitAt set
	// them on a copy; in a batch set them here.
	Delay time.Duration
	ETA   time.Time
	// ExpiresAt and StartWithin (set at most one) bound when the task may begin: if no
	// attempt has begun by ExpiresAt, or StartWithin after the task is due (now, or its
	// Delay or ETA), it is never begun (nor retried) and ends StateExpired without
	// reaching the executor. ExpiresAt must be after the task is due. With neither, the
	// job's spec.startWithin applies, if it has one.
	ExpiresAt   time.Time
	StartWithin time.Duration
	// Debounce and Throttle (set at most one) combine the task with the job's other
	// submits of the same key: see Debounce and Throttle. With neither, the job's
	// spec.debounce or spec.throttle applies, if it has one. Not with DependsOn; a
	// trailing Debounce not with Delay or ETA either.
	Debounce *Debounce
	Throttle *Throttle
}

// Retries returns a pointer to n, for Task.MaxRetries.
func Retries(n int) *int { return &n }

// SubmitResult is the API's answer to a submit.
type SubmitResult struct {
	ID  string    `json:"id"`
	ETA time.Time `json:"eta"`
	// Route is "store" or "kafka".
	Route string `json:"route"`
	// Duplicate is true when the idempotency key was seen before; ID is the first task's.
	Duplicate bool `json:"duplicate"`
	// Debounced: a trailing Debounce folded the submit into its key's waiting task
	// (answered 200): ID is that task's, ETA its new due time, and it now carries this
	// submit's payload.
	Debounced bool `json:"debounced,omitempty"`
	// Dropped: a leading Debounce or a Throttle with OnLimitDrop held the submit back and
	// stored nothing (answered 200): ID is the task the key last stored, ETA when its
	// window closes.
	Dropped bool `json:"dropped,omitempty"`
}

// BatchResult is one item of a SubmitBatch answer: either Err is set or the rest is.
type BatchResult struct {
	Status int
	SubmitResult
	Err *APIError
}

// TaskStatus is a task as GET /v1/tasks/{id} shows it.
type TaskStatus struct {
	ID             string          `json:"id"`
	Type           string          `json:"type"`
	Payload        json.RawMessage `json:"payload"`
	State          string          `json:"state"`
	Priority       int             `json:"priority"`
	ETA            time.Time       `json:"eta"`
	Attempt        int             `json:"attempt"`
	MaxRetries     int             `json:"max_retries"`
	IdempotencyKey string          `json:"-"`
	UniqueKey      string          `json:"-"`
	DependsOn      []string        `json:"depends_on"`
	LastError      string          `json:"-"`
	Result         json.RawMessage `json:"result"`
	// ExpiresAt is when the task expires unless an attempt has begun by then; nil when
	// it never expires.
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	UpdatedAt time.Time  `json:"updated_at"`
}

// UnmarshalJSON maps the API's nulls onto empty strings.
func (s *TaskStatus) UnmarshalJSON(b []byte) error {
	type plain TaskStatus
	var w struct {
		*plain
		IdempotencyKey *string `json:"idempotency_key"`
		UniqueKey      *string `json:"unique_key"`
		LastError      *string `json:"last_error"`
	}
	w.plain = (*plain)(s)
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	s.IdempotencyKey = deref(w.IdempotencyKey)
	s.UniqueKey = deref(w.UniqueKey)
	s.LastError = deref(w.LastError)
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Task states.
const (
	StateBlocked   = "blocked"
	StatePending   = "pending"
	StateClaimed   = "claimed"
	StateRunning   = "running"
	StateSucceeded = "succeeded"
	StateDead      = "dead"
	StateCancelled = "cancelled"
	// StateExpired: no attempt had begun by the task's ExpiresAt; it never reached the
	// executor.
	StateExpired = "expired"
)

// RedriveResult is the API's answer to a redrive.
type RedriveResult struct {
	ID    string    `json:"id"`
	State string    `json:"state"`
	ETA   time.Time `json:"eta"`
}

type submitBody struct {
	Type           string          `json:"type"`
	Payload        json.RawMessage `json:"payload"`
	Delay          string          `json:"delay,omitempty"`
	ETA            string          `json:"eta,omitempty"`
	ExpiresAt      string          `json:"expires_at,omitempty"`
	StartWithin    string          `json:"start_within,omitempty"`
	Priority       int             `json:"priority,omitempty"`
	IdempotencyKey string          `json:"idempotency_key"`
	UniqueKey      string          `json:"unique_key,omitempty"`
	MaxRetries     *int            `json:"max_retries,omitempty"`
	Timeout        string          `json:"timeout,omitempty"`
	DependsOn      []string        `json:"depends_on,omitempty"`
	Debounce       *debounceBody   `json:"debounce,omitempty"`
	Throttle       *throttleBody   `json:"throttle,omitempty"`
	SourceService  string          `json:"source_service,omitempty"`
}

func (c *Client) body(t *Task) (*submitBody, error) {
	if t == nil {
		return nil, errors.New("asyncd: nil task")
	}
	if t.Type == "" {
		return nil, errors.New("asyncd: task has no type")
	}
	if t.IdempotencyKey == "" {
		return nil, ErrMissingIdempotencyKey
	}
	if t.Delay != 0 && !t.ETA.IsZero() {
		return nil, errors.New("asyncd: task has both a delay and an ETA")
	}
	if t.Delay < 0 {
		return nil, fmt.Errorf("asyncd: negative delay %v", t.Delay)
	}
	if !t.ExpiresAt.IsZero() && t.StartWithin != 0 {
		return nil, errors.New("asyncd: task has both an ExpiresAt and a StartWithin")
	}
	if t.StartWithin < 0 {
		return nil, fmt.Errorf("asyncd: negative StartWithin %v", t.StartWithin)
	}
	if t.Debounce != nil && t.Throttle != nil {
		return nil, errors.New("asyncd: task has both a Debounce and a Throttle")
	}
	payload, err := marshalPayload(t.Payload)
	if err != nil {
		return nil, err
	}
	b := &submitBody{
		Type:           t.Type,
		Payload:        payload,
		Priority:       t.Priority,
		IdempotencyKey: t.IdempotencyKey,
		UniqueKey:      t.UniqueKey,
		MaxRetries:     t.MaxRetries,
		DependsOn:      t.DependsOn,
		SourceService:  c.serviceName,
	}
	if t.Delay > 0 {
		b.Delay = formatDuration(t.Delay)
	}
	if !t.ETA.IsZero() {
		b.ETA = formatTime(t.ETA)
	}
	if !t.ExpiresAt.IsZero() {
		b.ExpiresAt = formatTime(t.ExpiresAt)
	}
	if t.StartWithin > 0 {
		b.StartWithin = formatDuration(t.StartWithin)
	}
	if t.Timeout != 0 {
		b.Timeout = formatDuration(t.Timeout)
	}
	if t.Debounce != nil {
		b.Debounce = t.Debounce.body()
	}
	if t.Throttle != nil {
		b.Throttle = t.Throttle.body()
	}
	return b, nil
}

func marshalPayload(p any) (json.RawMessage, error) {
	if raw, ok := p.(json.RawMessage); ok && raw != nil {
		if !json.Valid(raw) {
			return nil, errors.New("asyncd: payload is not valid JSON")
		}
		return raw, nil
	}
	raw, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("asyncd: marshal payload: %w", err)
	}
	return raw, nil
}

// Submit enqueues t to run as soon as possible (or at t.Delay / t.ETA when set).
// Concurrent Submits may share a call (WithSubmitCoalescing).
func (c *Client) Submit(ctx context.Context, t *Task) (*SubmitResult, error) {
	b, err := c.body(t)
	if err != nil {
		return nil, err
	}
	if parent, _ := TraceParent(ctx); c.coalesce != nil && parent == "" {
		return c.coalesce.submit(ctx, c, b)
	}
	var res SubmitResult
	if err := c.do(ctx, http.MethodPost, "/v1/tasks", b, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// SubmitDelayed enqueues t to run after delay (0..400 days).
func (c *Client) SubmitDelayed(ctx context.Context, t *Task, delay time.Duration) (*SubmitResult, error) {
	if t == nil {
		return nil, errors.New("asyncd: nil task")
	}
	cp := *t
	cp.Delay, cp.ETA = delay, time.Time{}
	return c.Submit(ctx, &cp)
}

// SubmitAt enqueues t to run at eta.
func (c *Client) SubmitAt(ctx context.Context, t *Task, eta time.Time) (*SubmitResult, error) {
	if t == nil {
		return nil, errors.New("asyncd: nil task")
	}
	cp := *t
	cp.Delay, cp.ETA = 0, eta
	return c.Submit(ctx, &cp)
}

// SubmitBatch enqueues up to 1000 tasks in one call. Items are judged one by one: the
// error is for the call as a whole, and each BatchResult says how its item fared.
func (c *Client) SubmitBatch(ctx context.Context, tasks []*Task) ([]BatchResult, error) {
	req := struct {
		Tasks []*submitBody `json:"tasks"`
	}{Tasks: make([]*submitBody, 0, len(tasks))}
	for i, t := range tasks {
		b, err := c.body(t)
		if err != nil {
			return nil, fmt.Errorf("task %d: %w", i, err)
		}
		req.Tasks = append(req.Tasks, b)
	}
	var res submitBatchAnswer
	if err := c.do(ctx, http.MethodPost, "/v1/tasks:batch", req, &res); err != nil {
		return nil, err
	}
	if len(res.Results) != len(tasks) {
		return nil, fmt.Errorf("asyncd: batch of %d answered with %d results", len(tasks), len(res.Results))
	}
	out := make([]BatchResult, len(res.Results))
	for i, r := range res.Results {
		out[i] = r.result()
	}
	return out, nil
}

// Get returns the task with id, or an error matching ErrNotFound.
func (c *Client) Get(ctx context.Context, id string) (*TaskStatus, error) {
	var s TaskStatus
	if err := c.do(ctx, http.MethodGet, "/v1/tasks/"+url.PathEscape(id), nil, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// Cancel cancels a task that has not finished (blocked, pending, claimed or running;
// a running attempt is told on its next heartbeat). A finished task gets an error
// matching ErrNotCancellable whose State names where it is. A Kafka-routed task that
// no dispatcher has consumed yet is not in the store, so it gets ErrNotFound unless
// CancelInJob names its job.
func (c *Client) Cancel(ctx context.Context, id string, opts ...CancelOption) error {
	var o cancelOptions
	for _, opt := range opts {
		opt(&o)
	}
	path := "/v1/tasks/" + url.PathEscape(id)
	if o.job != "" {
		path += "?" + url.Values{"job": {o.job}}.Encode()
	}
	return c.do(ctx, http.MethodDelete, path, nil, nil)
}

// Change is what Client.Change and Client.ChangeInJob change in a task that has not
// begun. A zero field keeps the task's value; at least one must be set.
type Change struct {
	// Payload, when non-nil, replaces the task's (marshalled with encoding/json; a
	// json.RawMessage is sent as is).
	Payload any
	// Delay or ETA (at most one) is the new due time; RunNow (alone) makes it due now.
	Delay  time.Duration
	ETA    time.Time
	RunNow bool
	// Priority, when non-nil, is the new priority 0..9.
	Priority *int
}

type changeBody struct {
	Payload  json.RawMessage `json:"payload,omitempty"`
	Delay    string          `json:"delay,omitempty"`
	ETA      string          `json:"eta,omitempty"`
	RunNow   bool            `json:"run_now,omitempty"`
	Priority *int            `json:"priority,omitempty"`
}

// Change changes a task that has not begun (blocked, pending or claimed) in place, its id
// kept (PATCH /v1/tasks/{id}), and returns it as Get would. A dispatcher that claimed it
// loses the claim, so no attempt begins with the values replaced. Once an attempt has
// begun, or the task ended, it is an error matching ErrTaskStarted whose State says which;
// a payload from which the job renders another uniqueKey or concurrencyKey matches
// ErrInvalidField (cancel the task and submit a new one instead).
func (c *Client) Change(ctx context.Context, id string, change Change) (*TaskStatus, error) {
	b, err := change.body()
	if err != nil {
		return nil, err
	}
	var s TaskStatus
	if err := c.do(ctx, http.MethodPatch, "/v1/tasks/"+url.PathEscape(id), b, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// body is the PATCH body of the change, or why it cannot be sent.
func (change Change) body() (*changeBody, error) {
	if change.Delay != 0 && !change.ETA.IsZero() {
		return nil, errors.New("asyncd: change has both a delay and an ETA")
	}
	if change.Delay < 0 {
		return nil, fmt.Errorf("asyncd: negative delay %v", change.Delay)
	}
	b := changeBody{RunNow: change.RunNow, Priority: change.Priority}
	if change.Payload != nil {
		payload, err := marshalPayload(change.Payload)
		if err != nil {
			return nil, err
		}
		b.Payload = payload
	}
	if change.Delay > 0 {
		b.Delay = formatDuration(change.Delay)
	}
	if !change.ETA.IsZero() {
		b.ETA = formatTime(change.ETA)
	}
	return &b, nil
}

// PendingChange is ChangeInJob's answer for a task of a Kafka-routed job that no
// dispatcher has consumed yet: the change is recorded under the task's id and the task
// takes it when it is stored. Consumed is always false.
type PendingChange struct {
	ID       string `json:"id"`
	Job      string `json:"job"` // the AsyncJobConfig's name
	Type     string `json:"type"`
	Consumed bool   `json:"consumed"`
}

// ChangeResult is what ChangeInJob changed: Task, the task as Get shows it, when it was in
// the store (200); Pending when the change waits for the task's message to be consumed
// (202). Exactly one is set.
type ChangeResult struct {
	Task    *TaskStatus
	Pending *PendingChange
}

// ChangeInJob is Change naming the task's job (its AsyncJobConfig's name; PATCH
// /v1/tasks/{id}?job=JOB). A stored task is changed as Change changes it (Task set). A
// task of a Kafka-routed job whose message no dispatcher has consumed yet — which Change
// answers ErrNotFound — gets the change recorded, and takes it when it is stored
// (Pending set); a second change before then adds to the first. The server recognizes
// such a task by a time-ordered id, the id it gives a task submitted without an
// idempotency key: a task submitted with a key (as every submit of this SDK is) has an id
// derived from the key, and is found only once stored. A new payload before consumption
// matches ErrInvalidField (Field "payload") when the job renders keys from the payload;
// a job no config declares matches ErrInvalidField, Field "job".
func (c *Client) ChangeInJob(ctx context.Context, job, id string, change Change) (*ChangeResult, error) {
	if job == "" {
		return nil, errors.New("asyncd: ChangeInJob needs a job")
	}
	b, err := change.body()
	if err != nil {
		return nil, err
	}
	path := "/v1/tasks/" + url.PathEscape(id) + "?" + url.Values{"job": {job}}.Encode()
	return c.changeResult(ctx, path, b)
}

// changeResult sends a change whose answer is a task (200) or a PendingChange (202).
func (c *Client) changeResult(ctx context.Context, path string, b *changeBody) (*ChangeResult, error) {
	var raw json.RawMessage
	status, err := c.doStatus(ctx, http.MethodPatch, path, b, &raw)
	if err != nil {
		return nil, err
	}
	decode := func(v any) error {
		if err := json.Unmarshal(raw, v); err != nil {
			return fmt.Errorf("asyncd: PATCH %s: decode answer: %w", path, err)
		}
		return nil
	}
	if status == http.StatusAccepted {
		var p PendingChange
		if err := decode(&p); err != nil {
			return nil, err
		}
		return &ChangeResult{Pending: &p}, nil
	}
	var s TaskStatus
	if err := decode(&s); err != nil {
		return nil, err
	}
	return &ChangeResult{Task: &s}, nil
}

// CancelOption changes what Cancel sends.
type CancelOption func(*cancelOptions)

type cancelOptions struct {
	job string
}

// CancelInJob names the job (its AsyncJobConfig's name) of the task Cancel cancels
// (DELETE /v1/tasks/{id}?job=JOB): besides what Cancel does, a task of a Kafka-routed
// job that no dispatcher has consumed yet is recorded as cancelled, so that it never
// runs. A job no config declares is an error matching ErrInvalidField, Field "job".
func CancelInJob(job string) CancelOption {
	return func(o *cancelOptions) { o.job = job }
}

// CancelResult names the task a CancelUnique cancelled.
type CancelResult struct {
	ID    string `json:"id"`
	State string `json:"state"` // StateCancelled
}

// CancelUnique cancels the unfinished task of job (its AsyncJobConfig's name) that
// holds uniqueKey (DELETE /v1/tasks?job=&unique_key=); an error matching ErrNotFound
// when no unfinished task holds it.
func (c *Client) CancelUnique(ctx context.Context, job, uniqueKey string) (*CancelResult, error) {
	q := url.Values{"job": {job}, "unique_key": {uniqueKey}}
	var res CancelResult
	if err := c.do(ctx, http.MethodDelete, "/v1/tasks?"+q.Encode(), nil, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// CronTrigger is the task TriggerCron fired.
type CronTrigger struct {
	ID    string    `json:"id"`
	Job   string    `json:"job"`
	Entry string    `json:"entry"`
	Type  string    `json:"type"`
	ETA   time.Time `json:"eta"`
}

// TriggerCron fires the cron entry named entry (its spec.cron[].name) of job once, now,
// besides its schedule (POST /v1/jobs/{job}/cron/{entry}/trigger): a new task with the
// entry's payload, due now; the schedule goes on unchanged. An unknown job or entry is
// an error matching ErrNotFound whose Field says which.
func (c *Client) TriggerCron(ctx context.Context, job, entry string) (*CronTrigger, error) {
	var res CronTrigger
	path := "/v1/jobs/" + url.PathEscape(job) + "/cron/" + url.PathEscape(entry) + "/trigger"
	if err := c.do(ctx, http.MethodPost, path, nil, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// DeadLetters lists dead tasks, newest first. An empty taskType lists every type;
// limit 0 takes the server's default (100).
func (c *Client) DeadLetters(ctx context.Context, taskType string, limit int) ([]TaskStatus, error) {
	q := url.Values{}
	if taskType != "" {
		q.Set("type", taskType)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	path := "/v1/dead-letters"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var res struct {
		Items []TaskStatus `json:"items"`
	}
	if err := c.do(ctx, http.MethodGet, path, nil, &res); err != nil {
		return nil, err
	}
	return res.Items, nil
}

// SearchFilter narrows SearchTasks; zero fields do not filter.
type SearchFilter struct {
	Job          string // an AsyncJobConfig's name
	Type         string // a task type
	State        string // one of the task states (PENDING, DEAD, ...)
	UniqueKey    string
	CreatedAfter time.Time // exclusive
	EtaBefore    time.Time // exclusive
	Limit        int       // 1..1000; 0 takes the server's default (100)
	Cursor       string    // the previous page's NextCursor
}

// TaskPage is one page of SearchTasks, newest first. NextCursor is set while there may
// be more: pass it as SearchFilter.Cursor.
type TaskPage struct {
	Items      []TaskStatus `json:"items"`
	Truncated  bool         `json:"truncated"`
	NextCursor string       `json:"next_cursor"`
}

// SearchTasks lists the tasks matching every filter given, newest first, one page at a
// time (GET /v1/tasks).
func (c *Client) SearchTasks(ctx context.Context, f SearchFilter) (*TaskPage, error) {
	q := url.Values{}
	for k, v := range map[string]string{"job": f.Job, "type": f.Type, "state": f.State, "unique_key": f.UniqueKey, "cursor": f.Cursor} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if !f.CreatedAfter.IsZero() {
		q.Set("created_after", f.CreatedAfter.UTC().Format(time.RFC3339Nano))
	}
	if !f.EtaBefore.IsZero() {
		q.Set("eta_before", f.EtaBefore.UTC().Format(time.RFC3339Nano))
	}
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	path := "/v1/tasks"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var page TaskPage
	if err := c.do(ctx, http.MethodGet, path, nil, &page); err != nil {
		return nil, err
	}
	return &page, nil
}

// DeadLetterFilter says which dead letters RedriveDeadLetters and PurgeDeadLetters act
// on. Job or Type is required. DeadBefore zero means the instant of the call; pass the
// previous answer's DeadBefore on the following calls of one bulk action.
type DeadLetterFilter struct {
	Job         string     `json:"job,omitempty"`
	Type        string     `json:"type,omitempty"`
	ErrorPrefix string     `json:"error_prefix,omitempty"`
	DeadAfter   *time.Time `json:"dead_after,omitempty"`
	DeadBefore  *time.Time `json:"dead_before,omitempty"`
	DryRun      bool       `json:"dry_run,omitempty"`
	Limit       int        `json:"limit,omitempty"` // 1..1000; 0 takes 1000
}

// BulkResult is the answer to one call of RedriveDeadLetters or PurgeDeadLetters.
type BulkResult struct {
	Matched    uint64    `json:"matched"`
	Affected   uint64    `json:"affected"`
	Skipped    uint64    `json:"skipped"`
	Remaining  uint64    `json:"remaining"`
	DryRun     bool      `json:"dry_run"`
	DeadBefore time.Time `json:"dead_before"`
}

// RedriveDeadLetters redrives up to f.Limit dead letters matching f, oldest death
// first. Call it again with the answer's DeadBefore until Remaining is 0 (or Affected
// is 0): every call is idempotent, so an interrupted loop is finished by running it again.
func (c *Client) RedriveDeadLetters(ctx context.Context, f DeadLetterFilter) (*BulkResult, error) {
	return c.bulk(ctx, "redrive", f)
}

// PurgeDeadLetters deletes up to f.Limit dead letters matching f, oldest death first;
// loop as with RedriveDeadLetters.
func (c *Client) PurgeDeadLetters(ctx context.Context, f DeadLetterFilter) (*BulkResult, error) {
	return c.bulk(ctx, "purge", f)
}

func (c *Client) bulk(ctx context.Context, action string, f DeadLetterFilter) (*BulkResult, error) {
	var res BulkResult
	if err := c.do(ctx, http.MethodPost, "/v1/dead-letters/"+action, f, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// JobStatus is the API's answer to PauseJob and ResumeJob: whether the job's attempts
// may begin. PausedAt is set while it is paused through the API; PausedByConfig while
// its AsyncJobConfig says spec.paused.
type JobStatus struct {
	Job            string     `json:"job"`
	TaskType       string     `json:"task_type"`
	Paused         bool       `json:"paused"`
	PausedAt       *time.Time `json:"paused_at"`
	PausedByConfig bool       `json:"paused_by_config"`
}

// PauseJob pauses the job named job (its AsyncJobConfig's name): no attempt of it begins
// and its tasks wait in the store until ResumeJob. Idempotent.
func (c *Client) PauseJob(ctx context.Context, job string) (*JobStatus, error) {
	return c.jobCall(ctx, job, "pause")
}

// ResumeJob lifts the API's pause of job; the answer still says Paused while its config
// pauses it.
func (c *Client) ResumeJob(ctx context.Context, job string) (*JobStatus, error) {
	return c.jobCall(ctx, job, "resume")
}

func (c *Client) jobCall(ctx context.Context, job, action string) (*JobStatus, error) {
	var res JobStatus
	if err := c.do(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(job)+"/"+action, nil, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Redrive puts a dead task back to pending, due now, with its attempts reset.
func (c *Client) Redrive(ctx context.Context, id string) (*RedriveResult, error) {
	var res RedriveResult
	if err := c.do(ctx, http.MethodPost, "/v1/dead-letters/"+url.PathEscape(id)+"/redrive", nil, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// do sends one API call to base+path (base defaults to the client's endpoint) and
// decodes a 2xx answer into out.
// With WithRetry, a retryable failure is sent again (see RetryPolicy).
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	_, err := c.doStatus(ctx, method, path, in, out)
	return err
}

// doStatus is do that also returns the status of the 2xx answer (of the last attempt,
// under WithRetry), for calls whose answer differs by it (PutSchedule's 201 or 200).
func (c *Client) doStatus(ctx context.Context, method, path string, in, out any) (int, error) {
	if c.retry == nil {
		return c.sendStatus(ctx, c.endpoint, method, path, in, out, true)
	}
	var status int
	err := c.retry.run(ctx, func() error {
		var err error
		status, err = c.sendStatus(ctx, c.endpoint, method, path, in, out, true)
		return err
	})
	return status, err
}

// doAt is for the executor callbacks, which the lease token authenticates: the API token
// is not sent to the dispatcher they go to.
func (c *Client) doAt(ctx context.Context, base, method, path string, in, out any) error {
	return c.send(ctx, base, method, path, in, out, false)
}

func (c *Client) send(ctx context.Context, base, method, path string, in, out any, withToken bool) error {
	_, err := c.sendStatus(ctx, base, method, path, in, out, withToken)
	return err
}

// sendStatus is send that also returns the status of a 2xx answer.
func (c *Client) sendStatus(ctx context.Context, base, method, path string, in, out any, withToken bool) (int, error) {
	var body io.Reader
	if in != nil {
		raw, err := json.Marshal(in)
		if err != nil {
			return 0, fmt.Errorf("asyncd: marshal request: %w", err)
		}
		body = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(base, "/")+path, body)
	if err != nil {
		return 0, fmt.Errorf("asyncd: %w", err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.serviceName != "" {
		req.Header.Set(SourceServiceHeader, c.serviceName)
	}
	if parent, state := TraceParent(ctx); parent != "" {
		req.Header.Set(TraceParentHeader, parent)
		if state != "" {
			req.Header.Set(TraceStateHeader, state)
		}
	}
	if withToken && c.token != nil {
		if token := c.token.get(c.now()); token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
	}
	resp, err := c.httpClient.Do(req)
	if err != nil {
		return 0, &TransportError{Method: method, Path: path, Err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return 0, fmt.Errorf("asyncd: %s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		apiErr := parseAPIError(resp.StatusCode, raw)
		apiErr.RetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), c.now())
		return 0, apiErr
	}
	if out == nil || len(bytes.TrimSpace(raw)) == 0 {
		return resp.StatusCode, nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return 0, fmt.Errorf("asyncd: %s %s: decode answer: %w", method, path, err)
	}
	return resp.StatusCode, nil
}

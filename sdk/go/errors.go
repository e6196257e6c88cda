package asyncd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Error codes the API answers with (docs/api.md, "Errors").
const (
	CodeMalformedJSON   = "malformed_json"
	CodeInvalidField    = "invalid_field"
	CodeUnknownTaskType = "unknown_task_type"
	CodePayloadTooLarge = "payload_too_large"
	// CodeUnauthenticated (401): no bearer token, or one the server does not accept
	// (unknown, expired, for another audience).
	CodeUnauthenticated = "unauthenticated"
	// CodeForbidden (403): the caller may not do this to this job.
	CodeForbidden      = "forbidden"
	CodeNotFound       = "not_found"
	CodeUniqueConflict = "unique_conflict"
	// CodeIdempotencyMismatch (409): the idempotency key belongs to a task with another
	// type or payload; ExistingID names it. Use a new key for a new request.
	CodeIdempotencyMismatch = "idempotency_mismatch"
	CodeNotCancellable      = "not_cancellable"
	CodeStaleLease          = "stale_lease"
	CodeNotDead             = "not_dead"
	// CodeTaskStarted (409): a change (Client.Change) of a task that is no longer
	// waiting to begin; State says whether it is running or ended.
	CodeTaskStarted = "task_started"
	// CodeThrottled (409): a submit under a Throttle with OnLimitRefuse while its key's
	// window is open; ExistingID names the task the key last stored, Field is
	// "throttle". Nothing was stored.
	CodeThrottled = "throttled"
	// CodeScheduleExists (409): CreateSchedule of a name the job already has a schedule
	// of; Field is "name". PutSchedule writes over it instead.
	CodeScheduleExists = "schedule_exists"
	// CodeScheduleReadOnly (409): a change, pause, resume, delete or put of a schedule
	// that is its job's spec.cron entry (Source "config"): change the AsyncJobConfig.
	CodeScheduleReadOnly = "schedule_read_only"
	// CodeTaskCancelled (410): a heartbeat or result of an attempt whose task was
	// cancelled while it ran; the executor helpers cancel the handler's context.
	CodeTaskCancelled = "task_cancelled"
	// CodeStoreUnavailable (503): the task store did not answer; nothing was accepted.
	CodeStoreUnavailable = "store_unavailable"
	// CodeKafkaUnavailable (503): Kafka did not acknowledge the task in time and the store
	// did not answer either; it was not accepted.
	CodeKafkaUnavailable = "kafka_unavailable"
	// CodeAuthUnavailable (503): the Kubernetes API did not answer the server's token or
	// access review; nothing was done.
	CodeAuthUnavailable = "auth_unavailable"
	// CodeClockSkew (503, /readyz only): the process's clock is too far from the store's;
	// it does not dispatch.
	CodeClockSkew = "clock_skew"
	// CodeSigningUnavailable (503, /readyz only): a job the dispatcher serves lacks its
	// signing keys; that job is not dispatched.
	CodeSigningUnavailable = "signing_unavailable"
	// CodeHTTPError is set when an answer carried no error body of the API's shape,
	// e.g. a proxy's 502 page.
	CodeHTTPError = "http_error"
)

// APIError is a refusal by the asyncd API. Match it with errors.As, or by code with
// errors.Is against the Err* values below.
type APIError struct {
	Status  int    // HTTP status
	Code    string // one of the Code* constants
	Message string
	Field   string // the field at fault, when there is one
	// ExistingID names the task holding the key (unique_conflict,
	// idempotency_mismatch, throttled).
	ExistingID string
	// State names the task's current state (not_cancellable, not_dead, task_started).
	State string
	// RetryAfter is the answer's Retry-After (the 503s and 429s send one); 0 when
	// absent or unreadable.
	RetryAfter time.Duration
}

// Retryable reports whether the same call may succeed if sent again: the 503s
// (store_unavailable, kafka_unavailable, auth_unavailable), every 429 (ErrRateLimited,
// whatever its code) and a proxy's 502 or 504. Every other refusal is about the request
// and answers the same again.
func (e *APIError) Retryable() bool {
	switch e.Status {
	// asyncd answers 429 (auth_unavailable, under --auth kubernetes, when one address
	// sends too many new tokens) while authenticating the caller, before the handler
	// reads the body, so nothing was stored or changed; a proxy's 429 did not forward the
	// call at all. Sending it again is safe for a submit on both counts, as it is anyway
	// with its idempotency key.
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		return true
	case http.StatusBadGateway, http.StatusGatewayTimeout:
		return e.Code == CodeHTTPError
	}
	return false
}

// TransportError is a call that got no answer: connection refused, a timeout, TLS.
// Err is the cause (errors.Is(err, context.DeadlineExceeded) works through it).
type TransportError struct {
	Method, Path string
	Err          error
}

func (e *TransportError) Error() string {
	return fmt.Sprintf("asyncd: %s %s: %v", e.Method, e.Path, e.Err)
}

func (e *TransportError) Unwrap() error { return e.Err }

// IsRetryable reports whether err is worth retrying: a retryable APIError (see
// APIError.Retryable) or a TransportError (a timeout included) that the caller did not
// cause by cancelling. Retrying a submit is safe because it carries its idempotency key.
func IsRetryable(err error) bool {
	var api *APIError
	if errors.As(err, &api) {
		return api.Retryable()
	}
	var tr *TransportError
	if errors.As(err, &tr) {
		return !errors.Is(err, context.Canceled)
	}
	return false
}

// RetryAfter returns the Retry-After of an API refusal in err, and whether it had one.
func RetryAfter(err error) (time.Duration, bool) {
	var api *APIError
	if errors.As(err, &api) && api.RetryAfter > 0 {
		return api.RetryAfter, true
	}
	return 0, false
}

// parseRetryAfter reads a Retry-After header: seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0
		}
		// Past this a Duration overflows; RetryPolicy caps the wait at MaxBackoff anyway.
		if secs > math.MaxInt64/int64(time.Second) {
			return math.MaxInt64
		}
		return time.Duration(secs) * time.Second
	}
	if at, err := http.ParseTime(v); err == nil && at.After(now) {
		return at.Sub(now)
	}
	return 0
}

func (e *APIError) Error() string {
	var b strings.Builder
	b.WriteString("asyncd: ")
	if e.Status == http.StatusTooManyRequests {
		// The code alone (asyncd's is auth_unavailable) does not say the server wants
		// this client to slow down.
		b.WriteString("rate limited: ")
	}
	fmt.Fprintf(&b, "%s (%d)", e.Code, e.Status)
	if e.Field != "" {
		fmt.Fprintf(&b, " field %s", e.Field)
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	return b.String()
}

// Is reports whether target is an *APIError with the same Code, so that
// errors.Is(err, asyncd.ErrNotFound) works whatever the message; ErrRateLimited matches
// every 429, whatever its code.
func (e *APIError) Is(target error) bool {
	var t *APIError
	if !errors.As(target, &t) {
		return false
	}
	if t == ErrRateLimited {
		return e.Status == http.StatusTooManyRequests
	}
	return t.Code == e.Code
}

// Sentinels for errors.Is.
var (
	ErrMalformedJSON   = &APIError{Code: CodeMalformedJSON}
	ErrInvalidField    = &APIError{Code: CodeInvalidField}
	ErrUnknownTaskType = &APIError{Code: CodeUnknownTaskType}
	ErrPayloadTooLarge = &APIError{Code: CodePayloadTooLarge}
	ErrUnauthenticated = &APIError{Code: CodeUnauthenticated}
	ErrForbidden       = &APIError{Code: CodeForbidden}
	ErrNotFound        = &APIError{Code: CodeNotFound}
	ErrUniqueConflict  = &APIError{Code: CodeUniqueConflict}
	// ErrIdempotencyMismatch: the key was used before with another type or payload.
	ErrIdempotencyMismatch = &APIError{Code: CodeIdempotencyMismatch}
	ErrNotCancellable      = &APIError{Code: CodeNotCancellable}
	ErrStaleLease          = &APIError{Code: CodeStaleLease}
	ErrNotDead             = &APIError{Code: CodeNotDead}
	// ErrTaskStarted: the task began (or ended) before the change; nothing changed.
	ErrTaskStarted = &APIError{Code: CodeTaskStarted}
	// ErrThrottled: a Throttle's key stored a task within its period; nothing was
	// stored, ExistingID names that task. Not retryable as is: the same submit is
	// refused until the window closes.
	ErrThrottled = &APIError{Code: CodeThrottled}
	// ErrScheduleExists: CreateSchedule of a name the job already has; nothing changed.
	ErrScheduleExists = &APIError{Code: CodeScheduleExists}
	// ErrScheduleReadOnly: the schedule is its job's spec.cron entry; change the config.
	ErrScheduleReadOnly = &APIError{Code: CodeScheduleReadOnly}
	// ErrTaskCancelled: the task was cancelled while this attempt ran; stop.
	ErrTaskCancelled = &APIError{Code: CodeTaskCancelled}
	// ErrStoreUnavailable, ErrKafkaUnavailable, ErrAuthUnavailable: 503s; retry
	// (IsRetryable says so; WithRetry does it).
	ErrStoreUnavailable   = &APIError{Code: CodeStoreUnavailable}
	ErrKafkaUnavailable   = &APIError{Code: CodeKafkaUnavailable}
	ErrAuthUnavailable    = &APIError{Code: CodeAuthUnavailable}
	ErrClockSkew          = &APIError{Code: CodeClockSkew}
	ErrSigningUnavailable = &APIError{Code: CodeSigningUnavailable}
	// ErrRateLimited matches any 429: asyncd's own (code auth_unavailable: too many new
	// bearer tokens from one address under --auth kubernetes) or a proxy's. Retryable;
	// WithRetry waits the answer's Retry-After (at most MaxBackoff) before sending again,
	// so a call that still gets it has used up its attempts.
	ErrRateLimited = &APIError{Status: http.StatusTooManyRequests}
)

// ErrMissingIdempotencyKey is returned, before anything is sent, for a task without
// an idempotency key: without one a retried submit could enqueue the task twice.
var ErrMissingIdempotencyKey = errors.New("asyncd: task has no idempotency key (set Task.IdempotencyKey, e.g. with IdempotencyKeyFrom)")

// errorFields is the API's "error" object, in an error answer and in a refused batch item.
type errorFields struct {
	Code       string `json:"code"`
	Message    string `json:"message"`
	Field      string `json:"field"`
	ExistingID string `json:"existing_id"`
	State      string `json:"state"`
}

func (f *errorFields) apiError(status int) *APIError {
	return &APIError{Status: status, Code: f.Code, Message: f.Message, Field: f.Field,
		ExistingID: f.ExistingID, State: f.State}
}

type errorBody struct {
	Error *errorFields `json:"error"`
	// docs/api.md does not say whether existing_id and state sit inside "error" or
	// beside it; accept both.
	ExistingID string `json:"existing_id"`
	State      string `json:"state"`
}

func parseAPIError(status int, body []byte) *APIError {
	var eb errorBody
	if json.Unmarshal(body, &eb) == nil && eb.Error != nil && eb.Error.Code != "" {
		e := eb.Error.apiError(status)
		if e.ExistingID == "" {
			e.ExistingID = eb.ExistingID
		}
		if e.State == "" {
			e.State = eb.State
		}
		return e
	}
	msg := strings.TrimSpace(string(body))
	if len(msg) > 512 {
		msg = msg[:512] + "…"
	}
	return &APIError{Status: status, Code: CodeHTTPError, Message: msg}
}

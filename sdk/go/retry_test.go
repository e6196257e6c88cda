package asyncd_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

// sentinels maps each server code to the value errors.Is matches it with.
var sentinels = map[string]error{
	"malformed_json":       asyncd.ErrMalformedJSON,
	"invalid_field":        asyncd.ErrInvalidField,
	"unknown_task_type":    asyncd.ErrUnknownTaskType,
	"payload_too_large":    asyncd.ErrPayloadTooLarge,
	"unauthenticated":      asyncd.ErrUnauthenticated,
	"forbidden":            asyncd.ErrForbidden,
	"not_found":            asyncd.ErrNotFound,
	"unique_conflict":      asyncd.ErrUniqueConflict,
	"idempotency_mismatch": asyncd.ErrIdempotencyMismatch,
	"not_cancellable":      asyncd.ErrNotCancellable,
	"stale_lease":          asyncd.ErrStaleLease,
	"not_dead":             asyncd.ErrNotDead,
	"task_started":         asyncd.ErrTaskStarted,
	"throttled":            asyncd.ErrThrottled,
	"schedule_exists":      asyncd.ErrScheduleExists,
	"schedule_read_only":   asyncd.ErrScheduleReadOnly,
	"task_cancelled":       asyncd.ErrTaskCancelled,
	"store_unavailable":    asyncd.ErrStoreUnavailable,
	"kafka_unavailable":    asyncd.ErrKafkaUnavailable,
	"auth_unavailable":     asyncd.ErrAuthUnavailable,
	"clock_skew":           asyncd.ErrClockSkew,
	"signing_unavailable":  asyncd.ErrSigningUnavailable,
}

type taxonomy struct {
	Codes []struct {
		Code      string `json:"code"`
		Status    int    `json:"status"`
		Retryable bool   `json:"retryable"`
	} `json:"codes"`
	HTTPErrors []struct {
		Status    int  `json:"status"`
		Retryable bool `json:"retryable"`
	} `json:"http_errors"`
	RateLimited []struct {
		Code   string `json:"code"`
		Status int    `json:"status"`
	} `json:"rate_limited"`
}

// The shared table (sdk/testdata/errors.json): every code has its sentinel, its
// retryability and, where the server sends one, its Retry-After.
func TestErrorTaxonomyMatchesTheSharedTable(t *testing.T) {
	raw, err := os.ReadFile("../testdata/errors.json")
	if err != nil {
		t.Fatal(err)
	}
	var tax taxonomy
	if err := json.Unmarshal(raw, &tax); err != nil {
		t.Fatal(err)
	}
	if len(tax.Codes) != len(sentinels) {
		t.Fatalf("the table has %d codes, the SDK %d sentinels", len(tax.Codes), len(sentinels))
	}
	for _, row := range tax.Codes {
		f, c := newFake(t, row.Status, fmt.Sprintf(`{"error":{"code":%q,"message":"m"}}`, row.Code))
		if row.Retryable {
			f.header = http.Header{"Retry-After": {"1"}}
		}
		_, err := c.Get(context.Background(), "x")
		sentinel, ok := sentinels[row.Code]
		if !ok || !errors.Is(err, sentinel) {
			t.Errorf("%s: %v is not its sentinel", row.Code, err)
		}
		if asyncd.IsRetryable(err) != row.Retryable {
			t.Errorf("%s: IsRetryable = %v, want %v", row.Code, !row.Retryable, row.Retryable)
		}
		if d, ok := asyncd.RetryAfter(err); ok != row.Retryable || (ok && d != time.Second) {
			t.Errorf("%s: RetryAfter = %v, %v", row.Code, d, ok)
		}
	}
	for _, row := range tax.HTTPErrors {
		_, c := newFake(t, row.Status, `<html>proxy</html>`)
		_, err := c.Get(context.Background(), "x")
		var apiErr *asyncd.APIError
		if !errors.As(err, &apiErr) || apiErr.Code != asyncd.CodeHTTPError || asyncd.IsRetryable(err) != row.Retryable {
			t.Errorf("%d without an error body: %v, IsRetryable %v, want %v", row.Status, err, asyncd.IsRetryable(err), row.Retryable)
		}
		if errors.Is(err, asyncd.ErrRateLimited) != (row.Status == http.StatusTooManyRequests) {
			t.Errorf("%d without an error body: errors.Is(ErrRateLimited) = %v", row.Status, row.Status != http.StatusTooManyRequests)
		}
	}
	if len(tax.RateLimited) == 0 {
		t.Fatal("the table has no rate_limited rows")
	}
	for _, row := range tax.RateLimited {
		f, c := newFake(t, row.Status, fmt.Sprintf(`{"error":{"code":%q,"message":"slow down"}}`, row.Code))
		f.header = http.Header{"Retry-After": {"1"}}
		_, err := c.Get(context.Background(), "x")
		var apiErr *asyncd.APIError
		if !errors.Is(err, asyncd.ErrRateLimited) || !errors.As(err, &apiErr) || apiErr.Code != row.Code || !asyncd.IsRetryable(err) {
			t.Errorf("%s (%d): %v is not a retryable rate-limit error keeping its code", row.Code, row.Status, err)
		}
		if sentinel, ok := sentinels[row.Code]; ok && !errors.Is(err, sentinel) {
			t.Errorf("%s (%d): %v does not match its code's sentinel", row.Code, row.Status, err)
		}
		if d, ok := asyncd.RetryAfter(err); !ok || d != time.Second {
			t.Errorf("%s (%d): RetryAfter = %v, %v", row.Code, row.Status, d, ok)
		}
		if !strings.HasPrefix(err.Error(), "asyncd: rate limited: "+row.Code+" (429): slow down") {
			t.Errorf("%s (%d): the message does not say it is a rate limit: %q", row.Code, row.Status, err)
		}
	}
	// Only a 429 is ErrRateLimited.
	_, c := newFake(t, 503, unavailable)
	if _, err := c.Get(context.Background(), "x"); errors.Is(err, asyncd.ErrRateLimited) {
		t.Errorf("a 503 matches ErrRateLimited: %v", err)
	}
}

func TestTransportErrorsAreRetryableAndNameTheirCause(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	endpoint := srv.URL
	srv.Close() // nothing listens there any more
	c := asyncd.NewClient(asyncd.WithEndpoint(endpoint))
	_, err := c.Get(context.Background(), "x")
	var tr *asyncd.TransportError
	if !errors.As(err, &tr) || !asyncd.IsRetryable(err) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("err = %T %v", err, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Get(ctx, "x"); asyncd.IsRetryable(err) {
		t.Fatalf("a call the caller cancelled is retryable: %v", err)
	}
}

// scripted answers each request with the next canned answer, then keeps the last.
type scripted struct {
	mu      sync.Mutex
	answers []answer
	calls   int
	keys    []string
}

type answer struct {
	status     int
	retryAfter string
	body       string
}

func (s *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Key string `json:"idempotency_key"`
	}
	_ = json.NewDecoder(r.Body).Decode(&body)
	s.mu.Lock()
	a := s.answers[min(s.calls, len(s.answers)-1)]
	s.calls++
	s.keys = append(s.keys, body.Key)
	s.mu.Unlock()
	if a.retryAfter != "" {
		w.Header().Set("Retry-After", a.retryAfter)
	}
	w.WriteHeader(a.status)
	_, _ = w.Write([]byte(a.body))
}

const unavailable = `{"error":{"code":"store_unavailable","message":"the store did not answer"}}`

func retryingClient(t *testing.T, s *scripted, waits *[]time.Duration) *asyncd.Client {
	return retryingClientWith(t, s, waits, func(*asyncd.RetryPolicy) {})
}

// retryingClientWith: 4 attempts, 100ms doubling to 3s, each wait recorded in waits
// instead of slept; edit changes the policy.
func retryingClientWith(t *testing.T, s *scripted, waits *[]time.Duration, edit func(*asyncd.RetryPolicy)) *asyncd.Client {
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	p := asyncd.RetryPolicy{
		MaxAttempts: 4, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 3 * time.Second,
		Sleep: func(_ context.Context, d time.Duration) error { *waits = append(*waits, d); return nil },
	}
	edit(&p)
	return asyncd.NewClient(asyncd.WithEndpoint(srv.URL), asyncd.WithRetry(p))
}

func TestRetryHonoursRetryAfterAndResendsTheSameKey(t *testing.T) {
	s := &scripted{answers: []answer{
		{503, "2", unavailable},
		{503, "", `{"error":{"code":"kafka_unavailable","message":"no ack"}}`},
		{201, "", `{"id":"t1","eta":"2026-12-01T00:00:00Z","route":"store","duplicate":false}`},
	}}
	var waits []time.Duration
	c := retryingClient(t, s, &waits)
	res, err := c.Submit(context.Background(), &asyncd.Task{Type: "t", IdempotencyKey: "k-1"})
	if err != nil || res.ID != "t1" {
		t.Fatalf("res %+v err %v", res, err)
	}
	if s.calls != 3 || s.keys[0] != "k-1" || s.keys[1] != "k-1" || s.keys[2] != "k-1" {
		t.Fatalf("%d calls with keys %v", s.calls, s.keys)
	}
	// The first wait is the server's Retry-After; the second, without one, the
	// backoff's second step (200ms, equal jitter: 100..200ms).
	if len(waits) != 2 || waits[0] != 2*time.Second || waits[1] < 100*time.Millisecond || waits[1] > 200*time.Millisecond {
		t.Fatalf("waits %v", waits)
	}
}

func TestRetryGivesUpAfterMaxAttemptsAndNeverRetriesARefusal(t *testing.T) {
	s := &scripted{answers: []answer{{503, "1", unavailable}}}
	var waits []time.Duration
	c := retryingClient(t, s, &waits)
	_, err := c.Submit(context.Background(), &asyncd.Task{Type: "t", IdempotencyKey: "k"})
	if !errors.Is(err, asyncd.ErrStoreUnavailable) || s.calls != 4 || len(waits) != 3 {
		t.Fatalf("err %v after %d calls, waits %v", err, s.calls, waits)
	}

	s = &scripted{answers: []answer{{409, "", `{"error":{"code":"idempotency_mismatch","message":"m","existing_id":"t0"}}`}}}
	waits = nil
	c = retryingClient(t, s, &waits)
	_, err = c.Submit(context.Background(), &asyncd.Task{Type: "t", IdempotencyKey: "k"})
	if !errors.Is(err, asyncd.ErrIdempotencyMismatch) || s.calls != 1 || len(waits) != 0 {
		t.Fatalf("err %v after %d calls", err, s.calls)
	}
}

func TestWithoutRetryA503IsReturnedAtOnce(t *testing.T) {
	s := &scripted{answers: []answer{{503, "1", unavailable}}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	_, err := asyncd.NewClient(asyncd.WithEndpoint(srv.URL)).Submit(context.Background(), &asyncd.Task{Type: "t", IdempotencyKey: "k"})
	if !errors.Is(err, asyncd.ErrStoreUnavailable) || s.calls != 1 {
		t.Fatalf("err %v after %d calls", err, s.calls)
	}
}

// asyncd's own 429 (--auth kubernetes: too many new tokens from one address).
const rateLimited = `{"error":{"code":"auth_unavailable","message":"Authorization: too many new bearer tokens from 127.0.0.1; retry in a second"}}`

const created = `{"id":"t1","eta":"2026-12-01T00:00:00Z","route":"store","duplicate":false}`

func TestA429IsRetriedAfterItsRetryAfter(t *testing.T) {
	s := &scripted{answers: []answer{{429, "2", rateLimited}, {201, "", created}}}
	var waits []time.Duration
	var retried []string
	c := retryingClientWith(t, s, &waits, func(p *asyncd.RetryPolicy) {
		p.OnRetry = func(attempt int, err error, wait time.Duration) {
			retried = append(retried, fmt.Sprintf("%d:%v:%v", attempt, errors.Is(err, asyncd.ErrRateLimited), wait))
		}
	})
	res, err := c.Submit(context.Background(), &asyncd.Task{Type: "t", IdempotencyKey: "k-429"})
	if err != nil || res.ID != "t1" {
		t.Fatalf("res %+v err %v", res, err)
	}
	// One wait, the server's 2s (not the policy's 100ms backoff), then the same submit.
	if s.calls != 2 || s.keys[0] != "k-429" || s.keys[1] != "k-429" {
		t.Fatalf("%d calls with keys %v", s.calls, s.keys)
	}
	if len(waits) != 1 || waits[0] != 2*time.Second || len(retried) != 1 || retried[0] != "1:true:2s" {
		t.Fatalf("waits %v, retries %v", waits, retried)
	}

	// The other calls the client retries get the same treatment.
	s = &scripted{answers: []answer{{429, "1", rateLimited}, {200, "", `{"id":"t1","type":"t","state":"pending"}`}}}
	waits = nil
	c = retryingClient(t, s, &waits)
	if st, err := c.Get(context.Background(), "t1"); err != nil || st.ID != "t1" || s.calls != 2 || len(waits) != 1 || waits[0] != time.Second {
		t.Fatalf("get: %+v, %v after %d calls, waits %v", st, err, s.calls, waits)
	}
}

func TestA429ThatOutlastsTheAttemptsIsARateLimitError(t *testing.T) {
	// Retry-After 30s is more than the policy's MaxBackoff (3s): each wait is cut to it.
	s := &scripted{answers: []answer{{429, "30", rateLimited}}}
	var waits []time.Duration
	c := retryingClient(t, s, &waits)
	_, err := c.Submit(context.Background(), &asyncd.Task{Type: "t", IdempotencyKey: "k"})
	var apiErr *asyncd.APIError
	if !errors.Is(err, asyncd.ErrRateLimited) || !errors.As(err, &apiErr) || apiErr.Status != 429 {
		t.Fatalf("err %v, want ErrRateLimited", err)
	}
	if want := "asyncd: rate limited: auth_unavailable (429): Authorization: too many new bearer tokens"; !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("err %q, want it to start %q", err, want)
	}
	if s.calls != 4 || len(waits) != 3 || waits[0] != 3*time.Second || waits[1] != 3*time.Second || waits[2] != 3*time.Second {
		t.Fatalf("%d calls, waits %v", s.calls, waits)
	}
}

func TestA429WithoutAReadableRetryAfterWaitsTheBackoff(t *testing.T) {
	for _, retryAfter := range []string{"", "soon", "-5"} {
		s := &scripted{answers: []answer{{429, retryAfter, rateLimited}, {429, retryAfter, `<html>proxy: slow down</html>`}, {201, "", created}}}
		var waits []time.Duration
		c := retryingClient(t, s, &waits)
		if _, err := c.Submit(context.Background(), &asyncd.Task{Type: "t", IdempotencyKey: "k"}); err != nil || s.calls != 3 {
			t.Fatalf("Retry-After %q: err %v after %d calls", retryAfter, err, s.calls)
		}
		// The backoff's first two steps, 100ms and 200ms, with equal jitter.
		if len(waits) != 2 || waits[0] < 50*time.Millisecond || waits[0] > 100*time.Millisecond ||
			waits[1] < 100*time.Millisecond || waits[1] > 200*time.Millisecond {
			t.Fatalf("Retry-After %q: waits %v", retryAfter, waits)
		}
	}
}

func TestA429WhoseRetryAfterOutlastsTheDeadlineIsReturnedAtOnce(t *testing.T) {
	s := &scripted{answers: []answer{{429, "2", rateLimited}, {201, "", created}}}
	var waits []time.Duration
	c := retryingClient(t, s, &waits)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := c.Submit(ctx, &asyncd.Task{Type: "t", IdempotencyKey: "k"})
	if !errors.Is(err, asyncd.ErrRateLimited) || s.calls != 1 || len(waits) != 0 {
		t.Fatalf("err %v after %d calls, waits %v", err, s.calls, waits)
	}
}

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
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return asyncd.NewClient(asyncd.WithEndpoint(srv.URL), asyncd.WithRetry(asyncd.RetryPolicy{
		MaxAttempts: 4, InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second,
		Sleep: func(_ context.Context, d time.Duration) error { *waits = append(*waits, d); return nil },
	}))
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

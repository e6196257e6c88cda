package asyncd

import (
	"context"
	"math/rand/v2"
	"time"
)

// RetryPolicy makes a Client send an API call again after a retryable failure
// (IsRetryable: the 503s store_unavailable, kafka_unavailable and auth_unavailable, any
// 429, a proxy's 502/503/504, a connection that failed). Retrying a submit is safe: it
// carries its idempotency key, so a submit that was stored before its answer was lost
// answers the first task (Duplicate) instead of enqueueing a second.
type RetryPolicy struct {
	// MaxAttempts counts the first call; 1 or less means no retry.
	MaxAttempts int
	// InitialBackoff is the wait before the first retry, doubled for each retry after,
	// up to MaxBackoff; each wait is drawn between half and all of it (equal jitter).
	// An answer's Retry-After (a 429's, a 503's) replaces the backoff: the server says
	// when to come back. It too is cut to MaxBackoff, so that a proxy asking for an hour
	// cannot hold a call that long. No wait outlasts the context's deadline: a call that
	// would have to wait past it returns its last error at once.
	InitialBackoff, MaxBackoff time.Duration
	// OnRetry, when set, is called before each wait with the failed attempt (1-based),
	// its error and the wait.
	OnRetry func(attempt int, err error, wait time.Duration)
	// Sleep waits d or until ctx ends (default: a timer); tests replace it.
	Sleep func(ctx context.Context, d time.Duration) error
}

// DefaultRetryPolicy: 5 attempts, 200ms doubling to 5s (a Retry-After up to 5s wins).
var DefaultRetryPolicy = RetryPolicy{MaxAttempts: 5, InitialBackoff: 200 * time.Millisecond, MaxBackoff: 5 * time.Second}

// WithRetry retries retryable API calls under p (submit, get, cancel, dead letters,
// redrive; not the executor callbacks). Off unless given.
func WithRetry(p RetryPolicy) Option {
	return func(c *Client) { c.retry = &p }
}

// Wait returns how long to wait after failed attempt (1-based) that failed with err:
// its Retry-After when it had one, at most MaxBackoff; otherwise the backoff.
func (p *RetryPolicy) Wait(attempt int, err error) time.Duration {
	if d, ok := RetryAfter(err); ok {
		if p.MaxBackoff > 0 && d > p.MaxBackoff {
			return p.MaxBackoff
		}
		return d
	}
	backoff := p.InitialBackoff
	for i := 1; i < attempt && backoff < p.MaxBackoff; i++ {
		backoff *= 2
	}
	if p.MaxBackoff > 0 && backoff > p.MaxBackoff {
		backoff = p.MaxBackoff
	}
	if backoff <= 0 {
		return 0
	}
	half := backoff / 2
	return half + rand.N(backoff-half+1)
}

func (p *RetryPolicy) run(ctx context.Context, call func() error) error {
	for attempt := 1; ; attempt++ {
		err := call()
		// The caller's own deadline or cancellation ends the retries too.
		if err == nil || attempt >= p.MaxAttempts || !IsRetryable(err) || ctx.Err() != nil {
			return err
		}
		wait := p.Wait(attempt, err)
		// A wait that outlasts the caller's deadline would end in it and return this same
		// error (a 429 naming the rate limit, say), only later: return it now.
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return err
		}
		if p.OnRetry != nil {
			p.OnRetry(attempt, err, wait)
		}
		sleep := p.Sleep
		if sleep == nil {
			sleep = sleepCtx
		}
		if serr := sleep(ctx, wait); serr != nil {
			return err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

//! Opt-in retries of API calls ([`ClientBuilder::retry`](crate::ClientBuilder::retry)).

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::Error;

type Sleep = Arc<dyn Fn(Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;
type OnRetry = Arc<dyn Fn(u32, &Error, Duration) + Send + Sync>;

/// Sends an API call again after a retryable failure ([`Error::is_retryable`]: the 503s
/// `store_unavailable`, `kafka_unavailable`, `auth_unavailable`, any 429
/// ([`Error::is_rate_limited`]), a proxy's 502/503/504, a connection that failed).
/// Retrying a submit is safe: it carries its idempotency key, so a submit stored before
/// its answer was lost answers the first task (`duplicate`) instead of enqueueing a
/// second.
///
/// The wait before retry `n` is `initial_backoff * 2^(n-1)`, capped at `max_backoff`,
/// drawn between half and all of it (equal jitter) — unless the answer carried
/// `Retry-After` (a 429's, a 503's), which replaces it, also capped at `max_backoff` so
/// that a proxy asking for an hour cannot hold a call that long.
///
/// ```
/// use asyncd_client::{Client, RetryPolicy};
/// use std::time::Duration;
///
/// let client = Client::builder()
///     .endpoint("http://127.0.0.1:7700")
///     .retry(RetryPolicy::new(5).backoff(Duration::from_millis(200), Duration::from_secs(5)))
///     .build()?;
/// # Ok::<(), asyncd_client::Error>(())
/// ```
#[derive(Clone)]
pub struct RetryPolicy {
    max_attempts: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
    sleep: Option<Sleep>,
    on_retry: Option<OnRetry>,
}

impl Default for RetryPolicy {
    /// 5 attempts, 200 ms doubling up to 5 s.
    fn default() -> Self {
        Self::new(5)
    }
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("initial_backoff", &self.initial_backoff)
            .field("max_backoff", &self.max_backoff)
            .finish_non_exhaustive()
    }
}

impl RetryPolicy {
    /// At most `max_attempts` calls in all (the first included), 200 ms doubling to 5 s.
    pub fn new(max_attempts: u32) -> Self {
        Self {
            max_attempts,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
            sleep: None,
            on_retry: None,
        }
    }

    /// The first wait and the cap of the doubling waits.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }

    /// Calls `f(attempt, error, wait)` before each wait (1-based failed attempt), e.g.
    /// to log it.
    pub fn on_retry(mut self, f: impl Fn(u32, &Error, Duration) + Send + Sync + 'static) -> Self {
        self.on_retry = Some(Arc::new(f));
        self
    }

    /// Waits with `f` instead of `tokio::time::sleep` (tests record the waits).
    pub fn sleep_with<F, Fut>(mut self, f: F) -> Self
    where
        F: Fn(Duration) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.sleep = Some(Arc::new(move |d| Box::pin(f(d))));
        self
    }

    /// How long to wait after failed attempt `attempt` (1-based) that failed with `err`:
    /// its `Retry-After` when it had one, at most the maximum backoff; otherwise the
    /// backoff.
    pub fn wait(&self, attempt: u32, err: &Error) -> Duration {
        if let Some(after) = err.retry_after() {
            return after.min(self.max_backoff);
        }
        let doublings = attempt.saturating_sub(1).min(30);
        let backoff = self
            .initial_backoff
            .saturating_mul(1 << doublings)
            .min(self.max_backoff);
        let half = backoff / 2;
        // Jitter needs no cryptographic randomness: a fresh RandomState is seeded per
        // process and per call.
        let r = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let spread = (backoff - half).as_nanos() as u64;
        half + Duration::from_nanos(if spread == 0 { 0 } else { r % (spread + 1) })
    }

    pub(crate) async fn run<T, F, Fut>(&self, mut call: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let mut attempt = 1;
        loop {
            let err = match call().await {
                Ok(v) => return Ok(v),
                Err(err) => err,
            };
            if attempt >= self.max_attempts || !err.is_retryable() {
                return Err(err);
            }
            let wait = self.wait(attempt, &err);
            if let Some(f) = &self.on_retry {
                f(attempt, &err, wait);
            }
            match &self.sleep {
                Some(sleep) => sleep(wait).await,
                None => tokio::time::sleep(wait).await,
            }
            attempt += 1;
        }
    }
}

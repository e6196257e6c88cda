//! What a handler is given and what it answers: the task it runs and its outcome.

use super::*;

/// The task and attempt a handler is running.
///
/// Two contexts are equal when their fields other than [`cancellation`] are: a token
/// has no value to compare.
///
/// [`cancellation`]: TaskContext::cancellation
#[derive(Debug, Clone)]
pub struct TaskContext {
    pub id: String,
    pub task_type: String,
    /// 1-based attempt number.
    pub attempt: u32,
    /// The task's idempotency key, else its id: key your side effects on it, since
    /// asyncd delivers at least once.
    pub idempotency_key: String,
    /// This attempt's lease token (opaque), for heartbeats and results.
    pub lease_token: String,
    /// Base URL of the asyncd API that sent the call (for heartbeats and results).
    pub callback_url: String,
    /// The task's due time.
    pub eta: Option<DateTime<Utc>>,
    /// The dispatcher instance that made the call, for logs.
    pub dispatcher: Option<String>,
    /// The call's W3C `traceparent` (the submitter's trace, under the attempt's span
    /// when asyncd exports spans) and `tracestate`: give them to
    /// [`crate::Task::trace`] (or an OpenTelemetry propagator) to continue the trace.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    /// Cancelled when this attempt should stop: for a long-running handler, when a
    /// heartbeat answers `task_cancelled` (the task was cancelled while it ran) or
    /// `stale_lease` (a newer attempt owns it); for a handler within the call, when
    /// asyncd hangs up on the call (the job's executor timeout passed). A long-running
    /// handler that does not return within [`Executor::cancel_grace`] of it is
    /// dropped; whatever it returns then is not posted. Await
    /// `ctx.cancellation.cancelled()` in a `tokio::select!` (or poll
    /// `is_cancelled()`) to stop cleanly, e.g. roll back or release a lock.
    pub cancellation: CancellationToken,
}

impl PartialEq for TaskContext {
    fn eq(&self, other: &Self) -> bool {
        // Every field but `cancellation`; listed by destructuring, so a new field
        // cannot be forgotten here.
        let Self {
            id,
            task_type,
            attempt,
            idempotency_key,
            lease_token,
            callback_url,
            eta,
            dispatcher,
            traceparent,
            tracestate,
            cancellation: _,
        } = self;
        (
            id,
            task_type,
            attempt,
            idempotency_key,
            lease_token,
            callback_url,
            eta,
            dispatcher,
            traceparent,
            tracestate,
        ) == (
            &other.id,
            &other.task_type,
            &other.attempt,
            &other.idempotency_key,
            &other.lease_token,
            &other.callback_url,
            &other.eta,
            &other.dispatcher,
            &other.traceparent,
            &other.tracestate,
        )
    }
}

impl Eq for TaskContext {}

/// Any error a handler may fail with: it becomes a 500 (retried with backoff).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// How a handler failed; `Ok` means the task succeeded.
///
/// | handler returns | answer | asyncd does |
/// |---|---|---|
/// | `Ok(_)` | 200 | task succeeded |
/// | `Err(Outcome::Retry { after: Some(d) })` | 503, `Retry-After: ⌈d⌉` s | retries after `d` (counts as an attempt) |
/// | `Err(Outcome::Retry { after: None })` | 503 without `Retry-After` | retries with exponential backoff |
/// | `Err(Outcome::Permanent(msg))` | 422 | dead letters, no retry |
/// | `Err(Outcome::Error(e))`, any `?`-converted error, a panic | 500 | retries with backoff until `max_retries`, then dead letters |
///
/// Every `std::error::Error` converts into `Outcome::Error`, so `?` works in handlers.
///
/// In a batch call (`Asyncd-Batch`) the same handler runs once per task, and each
/// task's result says what the single call's answer would: `success`, `retry` (with
/// `retry_after` for `Retry { after: Some(d) }`; also for `Error` and a panic),
/// `failed` for `Permanent`, `accepted` with its `lease` for a long-running handler.
#[derive(Debug)]
pub enum Outcome {
    /// A transient failure: retry after `after`, or with asyncd's backoff when `None`.
    Retry { after: Option<Duration> },
    /// No retry can fix it: the task goes to dead letters.
    Permanent(String),
    /// An unexpected failure: retried with backoff.
    Error(BoxError),
}

impl Outcome {
    /// Retry after `after` (`Duration::ZERO`: at once).
    pub fn retry_after(after: Duration) -> Self {
        Self::Retry { after: Some(after) }
    }

    /// Retry with asyncd's exponential backoff.
    pub fn retry() -> Self {
        Self::Retry { after: None }
    }

    /// Send the task to dead letters with `message` as its `last_error`.
    pub fn permanent(message: impl fmt::Display) -> Self {
        Self::Permanent(message.to_string())
    }

    /// An unexpected failure, e.g. from `anyhow::Error` (which is not a
    /// `std::error::Error` and so does not convert with `?`).
    pub fn error(err: impl Into<BoxError>) -> Self {
        Self::Error(err.into())
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Retry { after: None } => f.write_str("retry"),
            Self::Retry { after: Some(d) } => write!(f, "retry after {}", format_duration(*d)),
            Self::Permanent(msg) if msg.is_empty() => f.write_str("permanent failure"),
            Self::Permanent(msg) => f.write_str(msg),
            Self::Error(e) => write!(f, "{e}"),
        }
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for Outcome {
    fn from(err: E) -> Self {
        Self::Error(Box::new(err))
    }
}

/// A handler that panicked (or whose task was cancelled) fails its attempt with this.
pub(super) fn panic_message(e: tokio::task::JoinError) -> String {
    if !e.is_panic() {
        return "handler cancelled".to_string();
    }
    panic_text(e.into_panic())
}

pub(super) fn panic_text(p: Box<dyn Any + Send>) -> String {
    let msg = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown payload".into());
    format!("handler panicked: {msg}")
}

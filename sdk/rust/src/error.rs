//! Errors: refusals by the asyncd API ([`ApiError`], one per `docs/api.md` error
//! code) and everything that can go wrong before or around a call ([`Error`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use asyncd_contract::ErrorCode;
use asyncd_contract::{ErrorObject, TaskState};
use serde::Deserialize;

/// A refusal by the asyncd API: a non-2xx answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    pub code: ErrorCode,
    pub message: String,
    /// The field at fault, when there is one.
    pub field: Option<String>,
    /// The task holding the key (`unique_conflict`, `idempotency_mismatch`).
    pub existing_id: Option<String>,
    /// The task's current state (`not_cancellable`, `not_dead`, `task_started`).
    pub state: Option<TaskState>,
    /// The answer's `Retry-After` (the 503s and 429s send one); `None` when absent or
    /// unreadable.
    pub retry_after: Option<Duration>,
}

impl ApiError {
    /// Whether the same call may succeed if sent again: the 503s (`store_unavailable`,
    /// `kafka_unavailable`, `auth_unavailable`, `clock_skew`), every 429
    /// ([`is_rate_limited`](Self::is_rate_limited)) and a proxy's 502 or 504 without the
    /// API's error body. Every other refusal is about the request and answers the same
    /// again.
    pub fn is_retryable(&self) -> bool {
        match self.status {
            // asyncd answers 429 (auth_unavailable, under --auth kubernetes, when one
            // address sends too many new tokens) while authenticating the caller, before
            // the handler reads the body, so nothing was stored or changed; a proxy's 429
            // did not forward the call at all. Sending it again is safe for a submit on
            // both counts, as it is anyway with its idempotency key.
            429 | 503 => true,
            502 | 504 => self.code == ErrorCode::HttpError,
            _ => false,
        }
    }

    /// Whether this is a 429: the server, or a proxy before it, asks this client to slow
    /// down, whatever the code (asyncd's own is `auth_unavailable`: too many new bearer
    /// tokens from one address under `--auth kubernetes`). Retryable:
    /// [`RetryPolicy`](crate::RetryPolicy) waits its `retry_after` (at most the policy's
    /// maximum backoff) and sends the call again, so a call that still gets it has used
    /// up its attempts.
    pub fn is_rate_limited(&self) -> bool {
        self.status == 429
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("asyncd: ")?;
        if self.is_rate_limited() {
            // The code alone (asyncd's is auth_unavailable) does not say the server wants
            // this client to slow down.
            f.write_str("rate limited: ")?;
        }
        write!(f, "{} ({})", self.code, self.status)?;
        if let Some(field) = &self.field {
            write!(f, " field {field}")?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    pub(crate) fn new(status: u16, error: ErrorObject) -> Self {
        ApiError {
            status,
            code: error.code,
            message: error.message,
            field: error.field,
            existing_id: error.existing_id,
            state: error.state,
            retry_after: None,
        }
    }
}

/// [`asyncd_contract::ErrorBody`], more forgiving.
#[derive(Deserialize)]
struct ErrorBody {
    error: Option<ErrorObject>,
    // docs/api.md puts existing_id and state inside "error"; accept them beside it too.
    #[serde(default)]
    existing_id: Option<String>,
    #[serde(default)]
    state: Option<TaskState>,
}

impl ApiError {
    /// Builds the error for a non-2xx answer from its status and body.
    pub(crate) fn from_response(status: u16, body: &[u8]) -> Self {
        if let Ok(ErrorBody {
            error: Some(mut obj),
            existing_id,
            state,
        }) = serde_json::from_slice::<ErrorBody>(body)
            && !obj.code.as_str().is_empty()
        {
            obj.existing_id = obj.existing_id.or(existing_id);
            obj.state = obj.state.or(state);
            return ApiError::new(status, obj);
        }
        let text = String::from_utf8_lossy(body);
        let mut message = text.trim().to_string();
        if message.chars().count() > 512 {
            message = message.chars().take(512).collect::<String>() + "…";
        }
        ApiError {
            status,
            code: ErrorCode::HttpError,
            message,
            field: None,
            existing_id: None,
            state: None,
            retry_after: None,
        }
    }
}

/// A `Retry-After` value: seconds or an HTTP date (`now` is the current time).
pub(crate) fn parse_retry_after(
    value: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    Some(
        (at.with_timezone(&chrono::Utc) - now)
            .to_std()
            .unwrap_or_default(),
    )
}

/// `err` and its sources, joined by ": ", as a transport error shows them: reqwest's own
/// text ("error sending request for url …") names no cause.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Everything a [`Client`](crate::Client) call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A submit without an idempotency key, refused before anything is sent: without
    /// one a retried submit could enqueue the task twice.
    #[error(
        "asyncd: task has no idempotency key (set Task::idempotency_key, e.g. with idempotency_key_from)"
    )]
    MissingIdempotencyKey,
    /// A task refused before sending for another reason (no type, delay and eta both set).
    #[error("asyncd: invalid task: {0}")]
    InvalidTask(String),
    /// One task of a batch was refused before sending; nothing was sent.
    #[error("asyncd: batch task {index}: {source}")]
    BatchTask {
        index: usize,
        #[source]
        source: Box<Error>,
    },
    /// The API refused the call (boxed: it is the largest variant).
    #[error(transparent)]
    Api(Box<ApiError>),
    /// The call did not get an answer: connection refused, timeout, TLS, … Its text
    /// includes the cause ("… Connection refused").
    #[error("asyncd: {method} {url}: {}", chain(.source))]
    Transport {
        method: String,
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// A 2xx answer that does not decode as documented.
    #[error("asyncd: {method} {url}: decode answer: {source}")]
    Decode {
        method: String,
        url: String,
        #[source]
        source: serde_json::Error,
    },
    /// A payload that does not serialize to JSON.
    #[error("asyncd: payload: {0}")]
    Payload(#[source] serde_json::Error),
    /// [`idempotency_key_from`](crate::idempotency_key_from) could not derive a key.
    #[error("asyncd: idempotency key: {0}")]
    IdempotencyKey(String),
    /// A batch answer that does not hold one result per task.
    #[error("asyncd: batch of {sent} tasks answered with {received} results")]
    BatchLength { sent: usize, received: usize },
    /// The client could not be built.
    #[error("asyncd: client: {0}")]
    Config(String),
    /// A call that carried several concurrent submits together
    /// ([`ClientBuilder::submit_coalescing`](crate::ClientBuilder::submit_coalescing))
    /// failed with an error that cannot be copied (a [`Transport`](Self::Transport) or
    /// [`Decode`](Self::Decode) failure): each of those submits gets the call's error,
    /// shared. Its text, [`api`](Self::api), [`is_retryable`](Self::is_retryable) and
    /// [`retry_after`](Self::retry_after) are the call's. (An API refusal of the call is
    /// copied to each submit as [`Api`](Self::Api).)
    #[error(transparent)]
    Shared(Arc<Error>),
}

impl From<ApiError> for Error {
    fn from(err: ApiError) -> Self {
        Self::Api(Box::new(err))
    }
}

impl Error {
    /// The API refusal, when this is one.
    pub fn api(&self) -> Option<&ApiError> {
        match self {
            Self::Api(e) => Some(e),
            Self::Shared(e) => e.api(),
            _ => None,
        }
    }

    /// The API error code, when this is an API refusal.
    pub fn code(&self) -> Option<&ErrorCode> {
        self.api().map(|e| &e.code)
    }

    /// The HTTP status, when this is an API refusal.
    pub fn status(&self) -> Option<u16> {
        self.api().map(|e| e.status)
    }

    /// Whether this is an API refusal with `code`.
    pub fn is(&self, code: &ErrorCode) -> bool {
        self.code() == Some(code)
    }

    /// Whether sending the same call again may succeed: a retryable API refusal
    /// ([`ApiError::is_retryable`]) or a transport failure. Retrying a submit is safe: it
    /// carries its idempotency key. [`RetryPolicy`](crate::RetryPolicy) does it for you.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Api(e) => e.is_retryable(),
            Self::Transport { .. } => true,
            Self::Shared(e) => e.is_retryable(),
            _ => false,
        }
    }

    /// The `Retry-After` of an API refusal, when it carried one.
    pub fn retry_after(&self) -> Option<Duration> {
        self.api().and_then(|e| e.retry_after)
    }

    /// Whether this is a 429 ([`ApiError::is_rate_limited`]).
    pub fn is_rate_limited(&self) -> bool {
        self.api().is_some_and(ApiError::is_rate_limited)
    }

    /// This error of a call, once for each of the `n` submits the call carried: a copy
    /// where it can be copied, so that each reads as if its submit had been sent alone.
    pub(crate) fn shared(self, n: usize) -> Vec<Error> {
        match self {
            Self::Api(api) => (0..n).map(|_| Self::Api(api.clone())).collect(),
            Self::BatchLength { sent, received } => (0..n)
                .map(|_| Self::BatchLength { sent, received })
                .collect(),
            other => {
                let other = Arc::new(other);
                (0..n).map(|_| Self::Shared(other.clone())).collect()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_error_body_inside_and_beside() {
        let e = ApiError::from_response(
            409,
            br#"{"error":{"code":"unique_conflict","message":"order:42 is pending","field":"unique_key","existing_id":"0193e"}}"#,
        );
        assert_eq!(e.status, 409);
        assert_eq!(e.code, ErrorCode::UniqueConflict);
        assert_eq!(e.field.as_deref(), Some("unique_key"));
        assert_eq!(e.existing_id.as_deref(), Some("0193e"));
        let text = e.to_string();
        assert!(
            text.contains("unique_conflict") && text.contains("order:42 is pending"),
            "{text}"
        );

        let e = ApiError::from_response(
            409,
            br#"{"error":{"code":"not_cancellable","message":"task is running"},"state":"running"}"#,
        );
        assert_eq!(e.code, ErrorCode::NotCancellable);
        assert_eq!(e.state, Some(TaskState::Running));

        let e = ApiError::from_response(409, br#"{"error":{"code":"brand_new","message":"m"}}"#);
        assert_eq!(e.code, ErrorCode::Other("brand_new".into()));
        assert_eq!(e.code.as_str(), "brand_new");
    }

    #[test]
    fn non_api_bodies_are_http_errors() {
        let e = ApiError::from_response(502, b"<html>bad gateway</html>\n");
        assert_eq!((e.status, &e.code), (502, &ErrorCode::HttpError));
        assert_eq!(e.message, "<html>bad gateway</html>");
        let e = ApiError::from_response(500, "x".repeat(2000).as_bytes());
        assert_eq!(e.message.chars().count(), 513);
        let e = ApiError::from_response(400, br#"{"error":"plain string"}"#);
        assert_eq!(e.code, ErrorCode::HttpError);
    }

    #[test]
    fn codes_round_trip() {
        for code in [
            "malformed_json",
            "invalid_field",
            "unknown_task_type",
            "payload_too_large",
            "not_found",
            "unique_conflict",
            "idempotency_mismatch",
            "store_unavailable",
            "kafka_unavailable",
            "not_cancellable",
            "stale_lease",
            "not_dead",
            "task_started",
            "schedule_exists",
            "schedule_read_only",
            "http_error",
        ] {
            let parsed = ErrorCode::parse(code);
            assert!(!matches!(parsed, ErrorCode::Other(_)), "{code}");
            assert_eq!(parsed.as_str(), code);
        }
    }
}

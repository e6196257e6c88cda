//! Errors: refusals by the asyncd API ([`ApiError`], one per `docs/api.md` error
//! code) and everything that can go wrong before or around a call ([`Error`]).

use std::fmt;

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
    /// The pending task holding the unique key (`unique_conflict`).
    pub existing_id: Option<String>,
    /// The task's current state (`not_cancellable`, `not_dead`).
    pub state: Option<TaskState>,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "asyncd: {} ({})", self.code, self.status)?;
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
        }
    }
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
    /// The call did not get an answer: connection refused, timeout, TLS, …
    #[error("asyncd: {method} {url}: {source}")]
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
            "not_cancellable",
            "stale_lease",
            "not_dead",
            "http_error",
        ] {
            let parsed = ErrorCode::parse(code);
            assert!(!matches!(parsed, ErrorCode::Other(_)), "{code}");
            assert_eq!(parsed.as_str(), code);
        }
    }
}

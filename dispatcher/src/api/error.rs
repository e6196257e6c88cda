//! The API's one error shape ([`asyncd_contract::ErrorBody`]) with its status, so every
//! client can tell what was wrong and with which field.

use asyncd_contract::{ErrorBody, ErrorCode, ErrorObject, TaskState};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::auth::AuthError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub error: ErrorObject,
}

impl ApiError {
    /// A refusal with the status `docs/api.md` gives `code`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        let status = code
            .status()
            .and_then(|s| StatusCode::from_u16(s).ok())
            .expect("the server sends only codes with a status");
        Self {
            status,
            error: ErrorObject::new(code, message),
        }
    }

    /// `invalid_field` naming the field; the message is prefixed with it.
    pub fn field(field: impl Into<String>, message: impl std::fmt::Display) -> Self {
        let field = field.into();
        Self::new(ErrorCode::InvalidField, format!("{field}: {message}")).with_field(field)
    }

    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.error.field = Some(field.into());
        self
    }

    pub fn with_existing_id(mut self, id: impl Into<String>) -> Self {
        self.error.existing_id = Some(id.into());
        self
    }

    pub fn with_state(mut self, state: TaskState) -> Self {
        self.error.state = Some(state);
        self
    }

    pub fn not_found(id: &str) -> Self {
        Self::new(ErrorCode::NotFound, format!("no task {id}"))
    }

    pub fn body(self) -> ErrorBody {
        ErrorBody { error: self.error }
    }
}

impl From<asyncd_store::StoreError> for ApiError {
    fn from(err: asyncd_store::StoreError) -> Self {
        Self::from(&err)
    }
}

/// A store error several requests share (a group commit's, see `group_commit`).
impl From<std::sync::Arc<asyncd_store::StoreError>> for ApiError {
    fn from(err: std::sync::Arc<asyncd_store::StoreError>) -> Self {
        Self::from(&*err)
    }
}

impl From<&asyncd_store::StoreError> for ApiError {
    fn from(err: &asyncd_store::StoreError) -> Self {
        // The one non-4xx answer: the store is down, which the client may retry.
        tracing::error!(%err, "store error while serving a request");
        Self::new(
            ErrorCode::StoreUnavailable,
            "the task store is unavailable; retry",
        )
    }
}

/// A refusal of `auth`: its message is the answer's, under the code of its kind.
impl From<AuthError> for ApiError {
    fn from(err: AuthError) -> Self {
        let code = match err {
            AuthError::Unauthenticated(_) => ErrorCode::Unauthenticated,
            AuthError::Forbidden { .. } => ErrorCode::Forbidden,
            AuthError::Unavailable(_) => ErrorCode::AuthUnavailable,
            // Authentication is not available to this caller for now, as with a 503, but
            // the API server is fine: the caller is the one to slow down.
            AuthError::RateLimited(_) => {
                return Self::new(ErrorCode::AuthUnavailable, err.to_string())
                    .with_status(StatusCode::TOO_MANY_REQUESTS);
            }
        };
        Self::new(code, err.to_string())
    }
}

/// How long a client is asked to wait before repeating a request refused with 503 or 429:
/// the store's connection wait is 2 s, so a second is enough to try again without piling
/// up, and a token bucket refills more than one review a second.
pub const RETRY_AFTER_SECONDS: u32 = 1;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status;
        let mut response = (status, axum::Json(self.body())).into_response();
        if matches!(
            status,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS
        ) {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(RETRY_AFTER_SECONDS),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unavailable_store_answers_503_with_retry_after() {
        let err = ApiError::from(asyncd_store::StoreError::UnsupportedUrl("x".into()));
        let response = err.into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            response.headers()[axum::http::header::RETRY_AFTER],
            RETRY_AFTER_SECONDS.to_string()
        );
    }

    /// The answers `auth` refusals had when `auth` built them as API errors itself.
    #[test]
    fn auth_refusals_answer_as_before() {
        use crate::auth::{Verb, forbidden, unauthenticated};
        let answer = |err: AuthError| {
            let err = ApiError::from(err);
            (err.status.as_u16(), err.error.code, err.error.message)
        };
        assert_eq!(
            answer(unauthenticated("a bearer token is required")),
            (
                401,
                ErrorCode::Unauthenticated,
                "Authorization: a bearer token is required".into()
            )
        );
        assert_eq!(
            answer(forbidden(Verb::Redrive, Some("orders"))),
            (
                403,
                ErrorCode::Forbidden,
                "not allowed to redrive dead letters of job orders".into()
            )
        );
        assert_eq!(
            answer(forbidden(Verb::Get, None)),
            (
                403,
                ErrorCode::Forbidden,
                "not allowed to read tasks of every job (name a task type to narrow the request)"
                    .into()
            )
        );
        assert_eq!(
            answer(AuthError::Unavailable("token review")),
            (
                503,
                ErrorCode::AuthUnavailable,
                "the Kubernetes API did not answer the token review; retry".into()
            )
        );
        let response = ApiError::from(AuthError::Unavailable("access review")).into_response();
        assert_eq!(
            response.headers()[axum::http::header::RETRY_AFTER],
            RETRY_AFTER_SECONDS.to_string(),
            "an unavailable review is retried like an unavailable store"
        );
        let limited = ApiError::from(AuthError::RateLimited([10, 0, 0, 1].into())).into_response();
        assert_eq!(limited.status(), 429);
        assert_eq!(
            limited.headers()[axum::http::header::RETRY_AFTER],
            RETRY_AFTER_SECONDS.to_string()
        );
    }
}

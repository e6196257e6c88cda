//! The API's one error shape: `{"error": {"code", "message", "field"?}}` with a 4xx
//! status, so every client can tell what was wrong and with which field.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
    /// One more member of the error object, e.g. `existing_id` or `state`.
    pub extra: Option<(&'static str, String)>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            field: None,
            extra: None,
        }
    }

    /// `invalid_field` naming the field; the message is prefixed with it.
    pub fn field(field: impl Into<String>, message: impl std::fmt::Display) -> Self {
        let field = field.into();
        Self {
            status: StatusCode::BAD_REQUEST,
            code: "invalid_field",
            message: format!("{field}: {message}"),
            field: Some(field),
            extra: None,
        }
    }

    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    pub fn with(mut self, key: &'static str, value: impl Into<String>) -> Self {
        self.extra = Some((key, value.into()));
        self
    }

    pub fn not_found(id: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", format!("no task {id}"))
    }

    pub fn body(&self) -> serde_json::Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(field) = &self.field {
            error["field"] = json!(field);
        }
        if let Some((key, value)) = &self.extra {
            error[*key] = json!(value);
        }
        json!({ "error": error })
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(err: crate::store::StoreError) -> Self {
        // The one non-4xx answer: the store is down, which the client may retry.
        tracing::error!(%err, "store error while serving a request");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "the task store is unavailable; retry",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

//! The operational endpoints, served by every role: health, readiness, metrics and the
//! OpenAPI document.

use asyncd_contract::ErrorCode;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;

/// `GET /healthz`: the process answers.
pub(super) async fn health() -> &'static str {
    "ok"
}

/// `GET /metrics`: the Prometheus text format.
pub(super) async fn metrics(State(state): AppState) -> Response {
    (
        [("content-type", "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

/// `GET /readyz`: 503 while the store does not answer, this process's clock is too far
/// from the store's, or a job's calls cannot be signed.
pub(super) async fn ready(State(state): AppState) -> Result<&'static str, ApiError> {
    state.store.ping().await?;
    if let Some(why) = state.clock_check.as_ref().and_then(|check| check.skew()) {
        return Err(ApiError::new(ErrorCode::ClockSkew, why));
    }
    if let Some(status) = &state.signing_status {
        let routes = state.routes.borrow().clone();
        let unavailable = status.unavailable(|job| routes.jobs().any(|j| j.name == job));
        if !unavailable.is_empty() {
            return Err(ApiError::new(
                ErrorCode::SigningUnavailable,
                unavailable.join("; "),
            ));
        }
    }
    Ok("ready")
}

/// `docs/openapi.json`, generated from the contract types once per process.
pub(super) async fn openapi() -> Response {
    static DOCUMENT: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(asyncd_contract::openapi::text);
    ([("content-type", "application/json")], DOCUMENT.as_str()).into_response()
}

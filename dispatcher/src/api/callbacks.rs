//! The executor callbacks: `POST /v1/tasks/{id}/heartbeat` and `POST
//! /v1/tasks/{id}/result`. They need no credential: the attempt's lease token is what
//! authenticates them, and a token that is not the current attempt's gets the one
//! [`stale`] answer, which tells nothing about the task.

use asyncd_contract::{
    ErrorCode, HeartbeatRequest, HeartbeatResponse, ResultAck, ResultRequest, ResultStatus, headers,
};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;

use super::extract::Path;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use super::error::ApiError;
use super::submit::MAX_TIMEOUT;
use super::{ApiState, AppState, body_bytes};
use crate::clock::from_millis;
use crate::executor::AttemptOutcome;
use crate::retry;
use asyncd_store::{Finish, FinishKind, TaskRecord, TaskState};

/// A heartbeat or result body, and its lease token, which may come as the
/// `Asyncd-Lease-Token` header instead. An empty body is an empty object.
fn parse_callback<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
    body_token: impl FnOnce(&mut T) -> Option<String>,
) -> Result<(T, String), ApiError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let mut callback: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        ApiError::new(
            ErrorCode::MalformedJson,
            format!("{path}: {}", e.into_inner()),
        )
        .with_field(path)
    })?;
    let header_token = || {
        headers
            .get(headers::LEASE_TOKEN)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_string())
    };
    let token = body_token(&mut callback)
        .or_else(header_token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ApiError::field(
                "lease_token",
                "is required (or the Asyncd-Lease-Token header)",
            )
        })?;
    Ok((callback, token))
}

/// The attempt a callback's token belongs to: the running one — or, for a success, an
/// attempt that was given up (queued again, or dead-lettered on its last try) with no
/// new attempt claimed since, because that work did succeed (the store's `succeed`
/// fences the same way). An unknown task, any other state, and a token that is not the
/// current one all answer the same [`stale`]: a caller without the token learns nothing,
/// not even whether the task exists. The token is compared in constant time
/// ([`asyncd_store::lease::matches`]).
async fn current_attempt(
    state: &ApiState,
    id: &str,
    token: &str,
    success: bool,
) -> Result<TaskRecord, ApiError> {
    match state.store.get(id).await? {
        Some(task)
            if (task.state == TaskState::Running
                || (success && matches!(task.state, TaskState::Pending | TaskState::Dead)))
                && asyncd_store::lease::matches(
                    &task.lease_secret,
                    id,
                    task.lease_token,
                    token,
                ) =>
        {
            Ok(task)
        }
        // A cancel moves the token on by one: the attempt it stopped holds the one before.
        // Only that attempt's holder learns it was cancelled; anyone else gets `stale`.
        Some(task)
            if task.state == TaskState::Cancelled
                && asyncd_store::lease::matches(
                    &task.lease_secret,
                    id,
                    task.lease_token - 1,
                    token,
                ) =>
        {
            Err(ApiError::new(
                ErrorCode::TaskCancelled,
                format!(
                    "task {id} was cancelled while this attempt ran; stop, nothing is recorded"
                ),
            )
            .with_state(TaskState::Cancelled))
        }
        _ => Err(stale()),
    }
}

/// The one answer to every refused callback. It names nothing from the store, so its
/// bytes are the same for an unknown task, a finished one, and a wrong token.
fn stale() -> ApiError {
    ApiError::new(
        ErrorCode::StaleLease,
        "lease_token: not the current attempt of this task",
    )
    .with_field("lease_token")
}

/// `POST /v1/tasks/{id}/heartbeat`: extends the running attempt's lease.
pub(super) async fn heartbeat(
    State(state): AppState,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(body, state.limits.body_bytes())?;
    let (callback, token) = parse_callback(&headers, &body, |c: &mut HeartbeatRequest| {
        c.lease_token.take()
    })?;
    let task = current_attempt(&state, &id, &token, false).await?;
    let lease = match callback.lease {
        Some(text) => {
            asyncd_spec::parse_duration(&text).map_err(|m| ApiError::field("lease", m))?
        }
        None => std::time::Duration::from_millis(task.timeout_ms as u64),
    };
    if lease > MAX_TIMEOUT {
        return Err(ApiError::field("lease", "must be at most 24h"));
    }
    let now = state.clock.now_millis();
    let until = now + lease;
    // The counter read with the token fences the write: if a newer attempt began in
    // between, this changes nothing.
    let finish = Finish {
        id: id.clone(),
        lease_token: task.lease_token,
        kind: FinishKind::Extend { until },
    };
    if !state.store.finish(&[finish], now).await?[0] {
        return Err(stale());
    }
    Ok(Json(HeartbeatResponse {
        lease_until: from_millis(until.max(task.lease_until.unwrap_or_default())),
    })
    .into_response())
}

/// `POST /v1/tasks/{id}/result`: the attempt's outcome, which finishes the task or queues
/// it again ([`retry::settle`]).
pub(super) async fn result(
    State(state): AppState,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(body, state.limits.body_bytes())?;
    let (callback, token) =
        parse_callback(&headers, &body, |c: &mut ResultRequest<Box<RawValue>>| {
            c.lease_token.take()
        })
        // An unknown status is a bad value, as a missing one is, not a JSON type error.
        .map_err(|e| match e.error.field.as_deref() {
            Some("status") => status_required(),
            _ => e,
        })?;
    let reason = || {
        callback.error.as_deref().map_or_else(
            || "executor reported failure".into(),
            crate::executor::sanitize_reason,
        )
    };
    let outcome = match callback.status {
        Some(ResultStatus::Success) => AttemptOutcome::Succeeded,
        Some(ResultStatus::Failed) => AttemptOutcome::Permanent { reason: reason() },
        Some(ResultStatus::Retry) => match &callback.retry_after {
            Some(text) => AttemptOutcome::RetryAfter {
                after: asyncd_spec::parse_duration(text)
                    .map_err(|m| ApiError::field("retry_after", m))?,
                reason: reason(),
            },
            None => AttemptOutcome::Retry {
                reason: reason(),
                timed_out: false,
            },
        },
        None => return Err(status_required()),
    };
    let success = matches!(outcome, AttemptOutcome::Succeeded);
    let task = current_attempt(&state, &id, &token, success).await?;
    let now = state.clock.now_millis();
    let routes = state.routes.borrow().clone();
    state
        .metrics
        .executed
        .with_label_values(&[task.task_type.as_str(), outcome.status_label()])
        .inc();
    let mut kind = retry::settle(
        outcome,
        task.attempt,
        task.max_retries,
        routes.job(&task.task_type).map(|j| j.as_ref()),
        now,
    );
    if let FinishKind::Succeeded { result } = &mut kind {
        *result = callback.output;
    }
    let new_state = match &kind {
        FinishKind::Succeeded { .. } => TaskState::Succeeded,
        FinishKind::Dead { .. } => TaskState::Dead,
        _ => {
            state
                .metrics
                .retries
                .with_label_values(&[task.task_type.as_str()])
                .inc();
            TaskState::Pending
        }
    };
    if !state
        .store
        .finish(
            &[Finish {
                id: id.clone(),
                lease_token: task.lease_token,
                kind,
            }],
            now,
        )
        .await?[0]
    {
        return Err(stale());
    }
    if let Some(waker) = &state.waker {
        waker.wake();
    }
    Ok(Json(ResultAck {
        id,
        state: new_state,
    })
    .into_response())
}

fn status_required() -> ApiError {
    ApiError::field("status", "must be \"success\", \"retry\" or \"failed\"")
}

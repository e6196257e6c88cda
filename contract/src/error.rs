//! The API's one error shape: `{"error": {"code", "message", "field"?, ...}}`.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::TaskState;

/// The `code` of an API refusal (`docs/api.md`, "Errors").
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
#[non_exhaustive]
pub enum ErrorCode {
    /// 400: the body is not JSON, or a field has the wrong JSON type.
    MalformedJson,
    /// 400: a field's value is out of range or malformed; `field` names it.
    InvalidField,
    /// 400: no AsyncJobConfig declares this task type.
    UnknownTaskType,
    /// 413: the payload, or the whole request body, is over the server's limit.
    PayloadTooLarge,
    /// 401: the request carries no credential (`Authorization: Bearer …`), or one the
    /// server does not accept (unknown, expired, for another audience).
    Unauthenticated,
    /// 403: the caller is authenticated but not allowed this action on this job.
    Forbidden,
    /// 404: no task with that id (or one the caller may not see).
    NotFound,
    /// 409: a pending task already holds this unique key; `existing_id` names it.
    UniqueConflict,
    /// 409: this idempotency key belongs to a task with another type or payload;
    /// `existing_id` names it.
    IdempotencyMismatch,
    /// 409: the task is no longer pending; `state` names its state.
    NotCancellable,
    /// 409: a heartbeat or result carried a lease token that is not the current attempt's.
    StaleLease,
    /// 409: redrive of a task that is not in dead letters.
    NotDead,
    /// 409: a change of a task that is no longer waiting to begin: an attempt is running
    /// or it has ended; `state` names its state.
    TaskStarted,
    /// 409: a submit under a throttle with `on_limit: refuse` while the key's window is
    /// open; `existing_id` names the task the window last stored.
    Throttled,
    /// 409: `POST /v1/schedules` of a name the job already has a schedule of.
    ScheduleExists,
    /// 409: a change, pause or delete of a schedule its job's AsyncJobConfig manages
    /// (`spec.cron`): change the config instead.
    ScheduleReadOnly,
    /// 410: a heartbeat or result of an attempt whose task was cancelled while it ran:
    /// stop the work, nothing will be recorded.
    TaskCancelled,
    /// 503: the task store did not answer; nothing was accepted.
    StoreUnavailable,
    /// 503: Kafka did not acknowledge a Kafka-route task in time and the store, tried
    /// next, did not answer either; it was not accepted.
    KafkaUnavailable,
    /// 503: in `--auth kubernetes` mode the Kubernetes API did not answer the token or
    /// access review; nothing was done. Also sent with 429 when the caller's address is
    /// over its rate of token reviews.
    AuthUnavailable,
    /// 503, from `/readyz` only: this process's clock is too far from the store's, so it
    /// does not dispatch (`docs/design.md`, "Clocks").
    ClockSkew,
    /// 503, from `/readyz` only: a job this process dispatches has a signing Secret
    /// (`spec.executor.signing`) that is missing or lacks a listed key, so that job's
    /// tasks are not dispatched; the message names the job, the Secret and the key.
    SigningUnavailable,
    /// Never sent by the server: what a client calls an answer without this error
    /// shape (a proxy's 502 page, say).
    HttpError,
    /// A code this version does not know yet.
    Other(String),
}

impl ErrorCode {
    /// Every code the server sends.
    pub const SERVER: [ErrorCode; 22] = [
        Self::MalformedJson,
        Self::InvalidField,
        Self::UnknownTaskType,
        Self::PayloadTooLarge,
        Self::Unauthenticated,
        Self::Forbidden,
        Self::NotFound,
        Self::UniqueConflict,
        Self::IdempotencyMismatch,
        Self::NotCancellable,
        Self::StaleLease,
        Self::NotDead,
        Self::TaskStarted,
        Self::Throttled,
        Self::ScheduleExists,
        Self::ScheduleReadOnly,
        Self::TaskCancelled,
        Self::StoreUnavailable,
        Self::KafkaUnavailable,
        Self::AuthUnavailable,
        Self::ClockSkew,
        Self::SigningUnavailable,
    ];

    /// The code as it appears on the wire.
    pub fn as_str(&self) -> &str {
        match self {
            Self::MalformedJson => "malformed_json",
            Self::InvalidField => "invalid_field",
            Self::UnknownTaskType => "unknown_task_type",
            Self::PayloadTooLarge => "payload_too_large",
            Self::Unauthenticated => "unauthenticated",
            Self::Forbidden => "forbidden",
            Self::NotFound => "not_found",
            Self::UniqueConflict => "unique_conflict",
            Self::IdempotencyMismatch => "idempotency_mismatch",
            Self::NotCancellable => "not_cancellable",
            Self::StaleLease => "stale_lease",
            Self::NotDead => "not_dead",
            Self::TaskStarted => "task_started",
            Self::Throttled => "throttled",
            Self::ScheduleExists => "schedule_exists",
            Self::ScheduleReadOnly => "schedule_read_only",
            Self::TaskCancelled => "task_cancelled",
            Self::StoreUnavailable => "store_unavailable",
            Self::KafkaUnavailable => "kafka_unavailable",
            Self::AuthUnavailable => "auth_unavailable",
            Self::ClockSkew => "clock_skew",
            Self::SigningUnavailable => "signing_unavailable",
            Self::HttpError => "http_error",
            Self::Other(code) => code,
        }
    }

    /// Parses a wire code; unknown codes become [`ErrorCode::Other`].
    pub fn parse(code: &str) -> Self {
        Self::SERVER
            .into_iter()
            .chain([Self::HttpError])
            .find(|c| c.as_str() == code)
            .unwrap_or_else(|| Self::Other(code.to_string()))
    }

    /// The HTTP status the server answers this code with (`None` for codes it never sends).
    pub fn status(&self) -> Option<u16> {
        Some(match self {
            Self::MalformedJson | Self::InvalidField | Self::UnknownTaskType => 400,
            Self::Unauthenticated => 401,
            Self::Forbidden => 403,
            Self::NotFound => 404,
            Self::UniqueConflict
            | Self::IdempotencyMismatch
            | Self::NotCancellable
            | Self::StaleLease
            | Self::NotDead
            | Self::TaskStarted
            | Self::Throttled
            | Self::ScheduleExists
            | Self::ScheduleReadOnly => 409,
            Self::TaskCancelled => 410,
            Self::PayloadTooLarge => 413,
            Self::StoreUnavailable
            | Self::KafkaUnavailable
            | Self::AuthUnavailable
            | Self::ClockSkew
            | Self::SigningUnavailable => 503,
            Self::HttpError | Self::Other(_) => return None,
        })
    }
}

impl From<String> for ErrorCode {
    fn from(code: String) -> Self {
        match Self::parse(&code) {
            Self::Other(_) => Self::Other(code),
            known => known,
        }
    }
}

impl From<ErrorCode> for String {
    fn from(code: ErrorCode) -> Self {
        code.as_str().to_string()
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(feature = "openapi")]
impl schemars::JsonSchema for ErrorCode {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ErrorCode".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let codes: Vec<&str> = Self::SERVER.iter().map(ErrorCode::as_str).collect();
        schemars::json_schema!({"type": "string", "enum": codes})
    }
}

/// The `error` object of a refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct ErrorObject {
    pub code: ErrorCode,
    pub message: String,
    /// The field at fault, when one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// `unique_conflict`: the pending task holding the unique key;
    /// `idempotency_mismatch`: the task holding the idempotency key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub existing_id: Option<String>,
    /// `not_cancellable`, `not_dead`, `task_started`: the state the task is in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TaskState>,
}

impl ErrorObject {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            field: None,
            existing_id: None,
            state: None,
        }
    }
}

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct ErrorBody {
    pub error: ErrorObject,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_ones_are_kept() {
        for code in ErrorCode::SERVER {
            let wire = serde_json::to_string(&code).unwrap();
            assert_eq!(wire, format!("\"{code}\""));
            assert_eq!(serde_json::from_str::<ErrorCode>(&wire).unwrap(), code);
            assert!(code.status().is_some(), "{code}");
        }
        assert_eq!(
            ErrorCode::parse("rate_limited"),
            ErrorCode::Other("rate_limited".into())
        );
    }

    #[test]
    fn optional_members_are_left_out() {
        let body = ErrorBody {
            error: ErrorObject::new(ErrorCode::NotFound, "no task x"),
        };
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"error":{"code":"not_found","message":"no task x"}}"#
        );
    }
}

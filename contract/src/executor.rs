//! The executor contract: the call asyncd makes, the 202 an executor may answer, and
//! the heartbeat and result callbacks of a long-running attempt.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::TaskState;

/// The body of `POST <executor url>`. `P` is the payload's type: the server sends the
/// stored JSON as it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "openapi", schemars(rename = "ExecutorCall"))]
pub struct ExecutorCall<P = Value> {
    /// Also in `Asyncd-Task-Id`.
    #[serde(default)]
    pub id: String,
    #[serde(rename = "type")]
    pub task_type: String,
    /// Any JSON value.
    pub payload: P,
    /// 1-based; also in `Asyncd-Attempt`.
    #[serde(default)]
    pub attempt: u32,
    /// When the task was due.
    #[serde(
        default,
        with = "crate::time::rfc3339_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema"))]
    pub eta: Option<DateTime<Utc>>,
}

/// An executor's 202 body: accepted as long-running, with this lease (default: the
/// task's timeout). `lease` wins over `lease_seconds`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct ExecutorAccepted {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::duration_option_schema")
    )]
    pub lease: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_seconds: Option<f64>,
}

/// `POST /v1/tasks/{id}/heartbeat`: keeps a long-running attempt's lease.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    /// The attempt's `Asyncd-Lease-Token`; required here or in that header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_token: Option<String>,
    /// The new lease from now (humantime, at most 24h); default the task's timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::duration_option_schema")
    )]
    pub lease: Option<String>,
}

/// The answer to a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct HeartbeatResponse {
    #[serde(with = "crate::time::rfc3339")]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema"))]
    pub lease_until: DateTime<Utc>,
}

/// How a long-running attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum ResultStatus {
    /// The task succeeded.
    Success,
    /// A transient failure: retried with backoff, or after `retry_after`.
    Retry,
    /// A permanent failure: dead letters.
    Failed,
}

impl ResultStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Retry => "retry",
            Self::Failed => "failed",
        }
    }
}

/// `POST /v1/tasks/{id}/result`. `P` is the output's type: the server stores it as sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "openapi", schemars(rename = "ResultRequest"))]
#[serde(deny_unknown_fields)]
pub struct ResultRequest<P = Value> {
    /// The attempt's `Asyncd-Lease-Token`; required here or in that header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_token: Option<String>,
    /// Required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ResultStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Stored as the task's `result` on success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<P>,
    /// With `retry`: when to retry (humantime) instead of the backoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::duration_option_schema")
    )]
    pub retry_after: Option<String>,
}

/// The answer to a result: the state the task moved to (`succeeded`, `pending` for a
/// retry, or `dead`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct ResultAck {
    pub id: String,
    pub state: TaskState,
}

/// The body of a batch call, `POST <executor url>` with `Asyncd-Batch` (a job with
/// `executor.batch`): several due tasks of one job, each its own attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "openapi", schemars(rename = "ExecutorBatchCall"))]
pub struct ExecutorBatchCall<P = Value> {
    pub tasks: Vec<ExecutorBatchTask<P>>,
}

/// One task of a batch call: the single call's body plus what a single call carries in
/// headers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "openapi", schemars(rename = "ExecutorBatchTask"))]
pub struct ExecutorBatchTask<P = Value> {
    pub id: String,
    #[serde(rename = "type")]
    pub task_type: String,
    /// Any JSON value.
    pub payload: P,
    /// 1-based.
    pub attempt: u32,
    /// When the task was due.
    #[serde(
        default,
        with = "crate::time::rfc3339_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema"))]
    pub eta: Option<DateTime<Utc>>,
    /// The task's `idempotency_key`, else its id.
    pub idempotency_key: String,
    /// This attempt's lease token, for heartbeats and the result of an accepted task.
    pub lease_token: String,
    /// The W3C trace context the task was submitted with, under the attempt's span.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

/// An executor's 2xx answer to a batch call: one result per task, in any order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct ExecutorBatchAnswer {
    pub results: Vec<ExecutorBatchResult>,
}

/// The outcome of one task of a batch call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct ExecutorBatchResult {
    pub id: String,
    pub status: ExecutorBatchStatus,
    /// Why the attempt failed (`retry`, `failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `retry`: when to try again (humantime, at most 24h); default the job's backoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::duration_option_schema")
    )]
    pub retry_after: Option<String>,
    /// `accepted`: the lease the executor keeps with heartbeats (humantime); default the
    /// task's timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::duration_option_schema")
    )]
    pub lease: Option<String>,
}

/// What became of one task of a batch call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ExecutorBatchStatus {
    /// Done: the task succeeded.
    Success,
    /// Long-running, as a single call's 202: heartbeats keep `lease`, the result is
    /// posted later.
    Accepted,
    /// A transient failure: retried at `retry_after` or with backoff.
    Retry,
    /// A permanent failure: dead letters.
    Failed,
}

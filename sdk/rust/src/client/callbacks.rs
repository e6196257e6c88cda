//! The calls of an attempt that answered `202` and runs on: its heartbeats and its
//! result (`POST /v1/tasks/{id}/heartbeat|result`). [`Executor`](crate::Executor) makes
//! them for you.

use std::time::Duration;

use asyncd_contract::{
    HeartbeatRequest, HeartbeatResponse, ResultAck, ResultRequest, ResultStatus,
};
use chrono::{DateTime, Utc};
use reqwest::Method;
use serde_json::Value;

use super::{Client, escape};
use crate::error::Error;
use crate::time::format_duration;

/// The body of `POST /v1/tasks/{id}/result`.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskResult {
    /// The `Asyncd-Lease-Token` of the attempt.
    pub lease_token: String,
    pub status: ResultStatus,
    pub error: Option<String>,
    /// Stored as the task's `result` on success.
    pub output: Option<Value>,
    /// With [`ResultStatus::Retry`]: when to retry instead of the backoff.
    pub retry_after: Option<Duration>,
}

impl Client {
    /// Keeps a long-running attempt's lease (`None`: the task's timeout); returns the
    /// new `lease_until`. A token that is not the current attempt's is refused with
    /// `stale_lease`. [`Executor`](crate::Executor) sends these for you.
    pub async fn heartbeat(
        &self,
        id: &str,
        lease_token: &str,
        lease: Option<Duration>,
    ) -> Result<DateTime<Utc>, Error> {
        let resp: HeartbeatResponse = self
            .callback(
                Method::POST,
                &format!("/v1/tasks/{}/heartbeat", escape(id)),
                Some(&HeartbeatRequest {
                    lease_token: Some(lease_token.to_string()),
                    lease: lease.map(format_duration),
                }),
            )
            .await?;
        Ok(resp.lease_until)
    }

    /// Reports how a long-running attempt ended. [`Executor`](crate::Executor) posts
    /// these for you.
    pub async fn post_result(&self, id: &str, result: &TaskResult) -> Result<ResultAck, Error> {
        let body = ResultRequest {
            lease_token: Some(result.lease_token.clone()),
            status: Some(result.status),
            error: result.error.clone(),
            output: result.output.as_ref(),
            retry_after: result.retry_after.map(format_duration),
        };
        self.callback(
            Method::POST,
            &format!("/v1/tasks/{}/result", escape(id)),
            Some(&body),
        )
        .await
    }
}

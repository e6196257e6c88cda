//! Changing a task that has not begun, in place and keeping its id (`PATCH
//! /v1/tasks/{id}`, docs/api.md), including a Kafka-routed task not consumed yet.

use std::time::Duration;

use asyncd_contract::{ChangeRequest, PendingChange, TaskStatus};
use chrono::{DateTime, Utc};
use reqwest::Method;
use serde_json::Value;

use super::{Client, escape};
use crate::error::Error;
use crate::time::{format_duration, format_time};

/// What [`Client::change`] and [`Client::change_in_job`] change in a task that has not
/// begun. What is `None` (or `false`) keeps the task's value; set at least one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Change {
    /// The new payload (any JSON value but null).
    pub payload: Option<Value>,
    /// The new due time, this long from now; not together with `eta`.
    pub delay: Option<Duration>,
    /// The new due time (the past means now); not together with `delay`.
    pub eta: Option<DateTime<Utc>>,
    /// Due now (promote); not together with `delay` or `eta`.
    pub run_now: bool,
    /// The new priority, 0..=9.
    pub priority: Option<u8>,
}

/// What [`Client::change_in_job`] changed.
#[derive(Debug, Clone, PartialEq)]
pub enum Changed {
    /// The task was in the store: changed, as [`Client::get`] shows it (`200`).
    Stored(TaskStatus),
    /// A task of a Kafka-routed job whose message no dispatcher has consumed yet: the
    /// change is recorded, and the task takes it when it is stored (`202`).
    Pending(PendingChange),
}

/// The body of `PATCH /v1/tasks/{id}`, or why `change` cannot be sent.
fn change_body(change: &Change) -> Result<ChangeRequest<Value>, Error> {
    if change.delay.is_some() && change.eta.is_some() {
        return Err(Error::InvalidTask(
            "a change takes a delay or an eta, not both".into(),
        ));
    }
    Ok(ChangeRequest {
        payload: change.payload.clone(),
        delay: change.delay.map(format_duration),
        eta: change.eta.map(format_time),
        run_now: change.run_now.then_some(true),
        priority: change.priority.map(i64::from),
    })
}

impl Client {
    /// Changes a task that has not begun (blocked, pending or claimed) in place, its id
    /// kept (`PATCH /v1/tasks/{id}`), and answers it as [`get`](Self::get) would. A
    /// dispatcher that claimed it loses the claim, so no attempt begins with the values
    /// replaced. Once an attempt has begun, or the task ended, it is refused with
    /// `task_started`, whose [`ApiError::state`](crate::ApiError::state) says which; a payload from which the job
    /// renders another unique or concurrency key with `invalid_field`.
    pub async fn change(&self, id: &str, change: &Change) -> Result<TaskStatus, Error> {
        let body = change_body(change)?;
        self.call(
            Method::PATCH,
            &format!("/v1/tasks/{}", escape(id)),
            Some(&body),
        )
        .await
    }

    /// [`change`](Self::change) naming the task's job (its AsyncJobConfig's name)
    /// (`PATCH /v1/tasks/{id}?job=J`). A stored task is changed as `change` changes it
    /// ([`Changed::Stored`]). A task of a Kafka-routed job whose message no dispatcher
    /// has consumed yet — which `change` answers `not_found` — gets the change recorded,
    /// and takes it when it is stored ([`Changed::Pending`]); a second change before then
    /// adds to the first. The server recognizes such a task by a time-ordered id, the id
    /// it gives a task submitted without an idempotency key: a task submitted with a key
    /// (as every submit of this SDK is) has an id derived from the key, and is found only
    /// once stored. A new payload before consumption is `invalid_field` naming `payload`
    /// when the job renders keys from the payload; a job no config declares is
    /// `invalid_field` naming `job`.
    pub async fn change_in_job(
        &self,
        job: &str,
        id: &str,
        change: &Change,
    ) -> Result<Changed, Error> {
        if job.is_empty() {
            return Err(Error::InvalidTask("change_in_job needs a job".into()));
        }
        let body = change_body(change)?;
        let path = format!("/v1/tasks/{}?job={}", escape(id), escape(job));
        let method = Method::PATCH;
        self.retrying(|| async {
            let (status, raw) = self
                .exchange(method.clone(), &path, Some(&body), true, &[])
                .await?;
            Ok(match status {
                202 => Changed::Pending(self.decode(&method, &path, &raw)?),
                _ => Changed::Stored(self.decode(&method, &path, &raw)?),
            })
        })
        .await
    }
}

//! A task to submit: what it carries and the setters that build it.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::error::Error;
use crate::idempotency::idempotency_key_from;
use crate::time::format_duration;
use asyncd_contract::{Debounce, DebounceMode, OnLimit, Throttle};

use super::headers;

/// One unit of work to submit. Build it with [`Task::new`] and the setters:
///
/// ```
/// # use asyncd_client::Task;
/// # use std::time::Duration;
/// let task = Task::new("cancel_expired_order", serde_json::json!({"order_id": 42}))
///     .derive_idempotency_key(&["order_id"])
///     .unwrap()
///     .priority(5)
///     .max_retries(3)
///     .timeout(Duration::from_secs(30));
/// assert_eq!(task.idempotency_key.as_deref().unwrap().len(), 64);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Task {
    /// An AsyncJobConfig's `spec.taskType`.
    pub task_type: String,
    /// Any JSON value; `null` by default.
    pub payload: Value,
    /// Required: a repeat of it returns the first task instead of enqueueing a second.
    /// [`idempotency_key_from`] derives one from payload fields.
    pub idempotency_key: Option<String>,
    /// Refuses the submit (`unique_conflict`) while a task holding it is pending.
    pub unique_key: Option<String>,
    /// 0..=9, higher first among equal ETAs.
    pub priority: u8,
    /// Overrides the job's `spec.retry.maxRetries`; `Some(0)` is valid.
    pub max_retries: Option<u32>,
    /// Overrides the job's per-attempt executor timeout.
    pub timeout: Option<Duration>,
    /// Ids of tasks that must all succeed before this one runs.
    pub depends_on: Vec<String>,
    /// Postpones the task (0..=400 days). Set at most one of `delay` and `eta`;
    /// [`Client::submit_delayed`](super::Client::submit_delayed) and [`Client::submit_at`](super::Client::submit_at) set them on a copy.
    pub delay: Option<Duration>,
    pub eta: Option<DateTime<Utc>>,
    /// The task expires, never reaching the executor, if no attempt has begun by then
    /// (retries included). Set at most one of `expires_at` and `start_within`.
    pub expires_at: Option<DateTime<Utc>>,
    /// `expires_at` as a span after the task is due; without either, the job's
    /// `spec.startWithin` applies, if it has one.
    pub start_within: Option<Duration>,
    /// Combines the task with the job's other submits of the same key (set at most one
    /// of `debounce` and `throttle`): [`Task::debounce`], [`Task::debounce_leading`],
    /// [`Task::throttle`]. Without either, the job's `spec.debounce` or `spec.throttle`
    /// applies, if it has one.
    pub debounce: Option<Debounce>,
    pub throttle: Option<Throttle>,
    /// W3C Trace Context: the task joins this trace (sent as the `traceparent` and
    /// `tracestate` headers) and every executor call receives it. asyncd ignores a
    /// malformed one. The tasks of one batch share one.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

impl Task {
    /// A task of `task_type` with `payload` (anything `serde_json::Value` converts from,
    /// e.g. `json!({...})`; see [`Task::with_payload`] for your own types).
    pub fn new(task_type: impl Into<String>, payload: impl Into<Value>) -> Self {
        Self {
            task_type: task_type.into(),
            payload: payload.into(),
            ..Self::default()
        }
    }

    /// A task whose payload is `payload` serialized with serde.
    pub fn with_payload<T: Serialize + ?Sized>(
        task_type: impl Into<String>,
        payload: &T,
    ) -> Result<Self, Error> {
        Ok(Self::new(
            task_type,
            serde_json::to_value(payload).map_err(Error::Payload)?,
        ))
    }

    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Sets the idempotency key to [`idempotency_key_from`] this task's type, payload
    /// and `fields` (the whole payload when `fields` is empty).
    pub fn derive_idempotency_key(mut self, fields: &[&str]) -> Result<Self, Error> {
        self.idempotency_key = Some(idempotency_key_from(
            &self.task_type,
            &self.payload,
            fields,
        )?);
        Ok(self)
    }

    pub fn unique_key(mut self, key: impl Into<String>) -> Self {
        self.unique_key = Some(key.into());
        self
    }

    pub fn priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }

    pub fn max_retries(mut self, max_retries: u32) -> Self {
        self.max_retries = Some(max_retries);
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    pub fn depends_on<I, S>(mut self, ids: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.depends_on = ids.into_iter().map(Into::into).collect();
        self
    }

    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self.eta = None;
        self
    }

    pub fn eta(mut self, eta: DateTime<Utc>) -> Self {
        self.eta = Some(eta);
        self.delay = None;
        self
    }

    /// Expires the task at `at` unless an attempt has begun by then.
    pub fn expires_at(mut self, at: DateTime<Utc>) -> Self {
        self.expires_at = Some(at);
        self.start_within = None;
        self
    }

    /// Expires the task `within` after it falls due unless an attempt has begun by then.
    pub fn start_within(mut self, within: Duration) -> Self {
        self.start_within = Some(within);
        self.expires_at = None;
        self
    }

    /// Trailing debounce on `key`: the job keeps one waiting task of the key, due
    /// `period` after the latest submit and never later than `max_delay` after the
    /// first (`None`: no cap), carrying the latest payload. A submit folded into that
    /// task is answered with its id and `debounced: true`.
    pub fn debounce(
        mut self,
        key: impl Into<String>,
        period: Duration,
        max_delay: Option<Duration>,
    ) -> Self {
        self.debounce = Some(Debounce {
            key: key.into(),
            period: format_duration(period),
            max_delay: max_delay.map(format_duration),
            mode: DebounceMode::Trailing,
        });
        self.throttle = None;
        self
    }

    /// Leading debounce on `key`: the task is stored (and runs as submitted) only after
    /// `period` without a submit of the key; otherwise it is dropped (`dropped: true`).
    pub fn debounce_leading(mut self, key: impl Into<String>, period: Duration) -> Self {
        self.debounce = Some(Debounce {
            key: key.into(),
            period: format_duration(period),
            max_delay: None,
            mode: DebounceMode::Leading,
        });
        self.throttle = None;
        self
    }

    /// At most one task of `key` stored per `period`; a submit over it is refused
    /// ([`crate::ErrorCode::Throttled`]) or dropped (`dropped: true`), as `on_limit` says.
    pub fn throttle(mut self, key: impl Into<String>, period: Duration, on_limit: OnLimit) -> Self {
        self.throttle = Some(Throttle {
            key: key.into(),
            period: format_duration(period),
            on_limit,
        });
        self.debounce = None;
        self
    }

    /// Puts the task in the trace `traceparent` names (see [`Task::traceparent`]); in an
    /// executor, pass the [`crate::TaskContext`]'s to continue the call's trace.
    pub fn trace(mut self, traceparent: impl Into<String>, tracestate: Option<String>) -> Self {
        self.traceparent = Some(traceparent.into());
        self.tracestate = tracestate;
        self
    }
}

/// The trace headers of `tasks`, which must agree: one request carries one trace.
pub(super) fn trace_headers(tasks: &[Task]) -> Result<Vec<(&'static str, String)>, Error> {
    let Some(first) = tasks.first() else {
        return Ok(Vec::new());
    };
    if tasks
        .iter()
        .any(|t| (&t.traceparent, &t.tracestate) != (&first.traceparent, &first.tracestate))
    {
        return Err(Error::InvalidTask(
            "the tasks of one batch must share one traceparent and tracestate".into(),
        ));
    }
    let mut out = Vec::new();
    if let Some(parent) = &first.traceparent {
        out.push((headers::TRACEPARENT, parent.clone()));
        if let Some(state) = &first.tracestate {
            out.push((headers::TRACESTATE, state.clone()));
        }
    }
    Ok(out)
}

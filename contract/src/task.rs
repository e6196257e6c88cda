//! Submit, inspect, cancel, dead letters and redrive: the client side of the API.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{ErrorBody, TaskState};

/// Most tasks one `POST /v1/tasks:batch` takes.
pub const MAX_BATCH: usize = 1000;

/// Most ids one task's `depends_on` may name.
pub const MAX_DEPENDENCIES: usize = 100;

/// `POST /v1/tasks`, and each item of a batch. `P` is the payload's type: a
/// [`Value`] for clients, a raw JSON slice for the server, which stores it as sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "openapi", schemars(rename = "SubmitRequest"))]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest<P = Value> {
    /// An AsyncJobConfig's `spec.taskType`.
    #[serde(rename = "type")]
    pub task_type: String,
    /// Any JSON value; default null.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<P>,
    /// Run after this long (humantime); not together with `eta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::duration_option_schema")
    )]
    pub delay: Option<String>,
    /// Run at this RFC 3339 time (the past means now); not together with `delay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::schema_option")
    )]
    pub eta: Option<String>,
    /// The RFC 3339 time by which an attempt must have begun: past it the task is not
    /// begun (nor retried) but ends `expired`, never reaching the executor. After the
    /// task is due; not together with `start_within`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::schema_option")
    )]
    pub expires_at: Option<String>,
    /// `expires_at` as a span after the task is due (humantime, at least 1ms): `"10m"`
    /// with `delay: "1h"` expires it 70 minutes after the submit. Default the job's
    /// `spec.startWithin`, else no expiry; not together with `expires_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::duration_option_schema")
    )]
    pub start_within: Option<String>,
    /// 0..=9, default 0. Among due tasks of a job each level counts as 10 s of waiting: a
    /// priority-9 task goes before the lower-priority tasks due up to 90 s before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schemars(range(min = 0, max = 9)))]
    pub priority: Option<i64>,
    /// A repeat of the key answers with the first task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schemars(length(min = 1, max = 255)))]
    pub idempotency_key: Option<String>,
    /// Refused (409) while a task with this key is pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schemars(length(min = 1, max = 255)))]
    pub unique_key: Option<String>,
    /// 0..=100; default the job's `spec.retry.maxRetries`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schemars(range(min = 0, max = 100)))]
    pub max_retries: Option<i64>,
    /// Per-attempt executor timeout (humantime, at least 1ms, at most 24h); default the
    /// job's `executor.timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::duration_option_schema")
    )]
    pub timeout: Option<String>,
    /// Task ids (at most 100); the task waits until all of them succeeded.
    // Deserializing keeps at most the first 101 ids and skips the rest without storing
    // them: 101 are enough to refuse the list, and a body of a million ids then costs no
    // more memory than one of 101.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "dependencies"
    )]
    #[cfg_attr(feature = "openapi", schemars(length(max = 100)))]
    pub depends_on: Option<Vec<String>>,
    /// In a batch only: this item's name within the batch (at most 64 characters, unique
    /// in it), for other items' `depends_on_refs`. A batch with refs is a workflow:
    /// stored all together or not at all.
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schemars(length(max = 64)))]
    pub reference: Option<String>,
    /// In a batch only: the `ref`s of items of the same batch this task waits on, as
    /// `depends_on` waits on stored tasks (the two together at most 100).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "dependencies"
    )]
    #[cfg_attr(feature = "openapi", schemars(length(max = 100)))]
    pub depends_on_refs: Option<Vec<String>>,
    /// Combines this submit with the job's others of the same key (see [`Debounce`]);
    /// default the job's `spec.debounce`. Not together with `throttle`, `depends_on`,
    /// or (trailing) a `delay` or `eta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce: Option<Debounce>,
    /// At most one task of the key per period (see [`Throttle`]); default the job's
    /// `spec.throttle`. Not together with `debounce` or `depends_on`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle: Option<Throttle>,
    /// Label for `asyncd_task_submitted_total` (at most 128 bytes); wins over the
    /// `Asyncd-Source-Service` header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schemars(length(max = 128)))]
    pub source_service: Option<String>,
}

impl<P> SubmitRequest<P> {
    /// A request for `task_type` with nothing else set.
    pub fn new(task_type: impl Into<String>) -> Self {
        Self {
            task_type: task_type.into(),
            payload: None,
            delay: None,
            eta: None,
            expires_at: None,
            start_within: None,
            priority: None,
            idempotency_key: None,
            unique_key: None,
            max_retries: None,
            timeout: None,
            depends_on: None,
            reference: None,
            depends_on_refs: None,
            debounce: None,
            throttle: None,
            source_service: None,
        }
    }
}

/// A submit's `debounce`: the job's submits with the same `key` are combined.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Debounce {
    /// 1 to 255 bytes, within the job.
    #[cfg_attr(feature = "openapi", schemars(length(min = 1, max = 255)))]
    pub key: String,
    /// Humantime, 1ms to 400 days. Trailing: the task is due this long after the
    /// latest submit. Leading: the quiet period after which a submit runs again.
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::duration_schema")
    )]
    pub period: String,
    /// Trailing only: the task is due at most this long after the first submit of the
    /// burst, however the submits keep coming (humantime, at least `period`); default
    /// no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::duration_option_schema")
    )]
    pub max_delay: Option<String>,
    #[serde(default)]
    pub mode: DebounceMode,
}

/// How a [`Debounce`] combines its key's submits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum DebounceMode {
    /// One waiting task per key: each submit replaces its payload and moves it to
    /// `period` after the submit (within `max_delay`); answered `200` with
    /// `"debounced": true` and the waiting task's id.
    #[default]
    Trailing,
    /// A submit after `period` of quiet is stored and runs as submitted; the others are
    /// dropped (`200`, `"dropped": true`), each extending the quiet.
    Leading,
}

/// A submit's `throttle`: at most one task of the job's `key` stored per `period`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Throttle {
    /// 1 to 255 bytes, within the job.
    #[cfg_attr(feature = "openapi", schemars(length(min = 1, max = 255)))]
    pub key: String,
    /// Humantime, 1ms to 400 days, counted from the submit that stored the key's task.
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::duration_schema")
    )]
    pub period: String,
    #[serde(default)]
    pub on_limit: OnLimit,
}

/// What a submit over its [`Throttle`] gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum OnLimit {
    /// `409 throttled`, naming the key's task in `existing_id`.
    #[default]
    Refuse,
    /// `200` with `"dropped": true` and the key's task's id: nothing is stored.
    Drop,
}

/// `depends_on` as [`SubmitRequest`] reads it: up to `MAX_DEPENDENCIES + 1` ids.
fn dependencies<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Vec<String>>, D::Error> {
    struct AtMost(Vec<String>);

    impl<'de> Deserialize<'de> for AtMost {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_seq(AtMostVisitor)
        }
    }

    struct AtMostVisitor;

    impl<'de> serde::de::Visitor<'de> for AtMostVisitor {
        type Value = AtMost;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an array of task ids")
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<AtMost, A::Error> {
            let keep = MAX_DEPENDENCIES + 1;
            let mut ids = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(keep));
            while ids.len() < keep {
                match seq.next_element::<String>()? {
                    Some(id) => ids.push(id),
                    None => return Ok(AtMost(ids)),
                }
            }
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            Ok(AtMost(ids))
        }
    }

    Ok(Option::<AtMost>::deserialize(deserializer)?.map(|ids| ids.0))
}

/// Which path a submitted task took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Route {
    /// Stored in the task store.
    #[default]
    Store,
    /// Produced to the job's Kafka topic.
    Kafka,
}

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Store => "store",
            Self::Kafka => "kafka",
        }
    }
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The answer to a submit: 201, or 200 for a repeated idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct SubmitResult {
    pub id: String,
    #[serde(with = "crate::time::rfc3339")]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema"))]
    pub eta: DateTime<Utc>,
    #[serde(default)]
    pub route: Route,
    /// The idempotency key was seen before; `id` is the first task's.
    #[serde(default)]
    pub duplicate: bool,
    /// A trailing debounce folded the submit into its key's waiting task: `id` is that
    /// task's, `eta` its new due time (`200`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub debounced: bool,
    /// A leading debounce or a throttle held the submit back and stored nothing: `id`
    /// is the task the key's window last stored, `eta` when the window closes (`200`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dropped: bool,
}

/// `POST /v1/tasks:batch`. `T` is an item: a [`SubmitRequest`] for clients, a raw JSON
/// slice for the server, which refuses items one by one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "openapi", schemars(rename = "BatchRequest"))]
pub struct BatchRequest<T = SubmitRequest> {
    #[cfg_attr(feature = "openapi", schemars(length(max = 1000)))]
    pub tasks: Vec<T>,
}

/// One item of a batch answer, in the order of the request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct BatchItemResult {
    /// 201 (stored), 200 (duplicate), or the status the item alone would have got.
    pub status: u16,
    #[serde(flatten)]
    pub outcome: BatchOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum BatchOutcome {
    Accepted(SubmitResult),
    Refused(ErrorBody),
}

/// The answer to a batch: `200`, one result per item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct BatchResponse {
    pub results: Vec<BatchItemResult>,
}

/// A task as `GET /v1/tasks/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct TaskStatus {
    pub id: String,
    #[serde(rename = "type")]
    pub task_type: String,
    #[serde(default)]
    pub payload: Value,
    pub state: TaskState,
    #[serde(default)]
    pub priority: u8,
    #[serde(with = "crate::time::rfc3339")]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema"))]
    pub eta: DateTime<Utc>,
    /// Attempts started so far.
    #[serde(default)]
    pub attempt: u32,
    #[serde(default)]
    pub max_retries: u32,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub unique_key: Option<String>,
    #[serde(default)]
    pub depends_on: Vec<String>,
    #[serde(default)]
    pub last_error: Option<String>,
    /// The `output` of a long-running attempt's result callback.
    #[serde(default)]
    pub result: Option<Value>,
    /// Set while the task is claimed or running.
    #[serde(default, with = "crate::time::rfc3339_option")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::schema_option")
    )]
    pub lease_until: Option<DateTime<Utc>>,
    /// Not begun by then, the task ends `expired`; null when it never expires.
    #[serde(default, with = "crate::time::rfc3339_option")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::schema_option")
    )]
    pub expires_at: Option<DateTime<Utc>>,
    #[serde(with = "crate::time::rfc3339")]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema"))]
    pub created_at: DateTime<Utc>,
    #[serde(with = "crate::time::rfc3339")]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema"))]
    pub updated_at: DateTime<Utc>,
}

/// `PATCH /v1/tasks/{id}`: what to change in a task that has not begun, its id kept. A
/// field left out keeps the task's value. `P` is the payload's type, as in
/// [`SubmitRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "openapi", schemars(rename = "ChangeRequest"))]
#[serde(deny_unknown_fields)]
pub struct ChangeRequest<P = Value> {
    /// The new payload (any JSON value but null), stored as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<P>,
    /// Run this long from now (humantime); not together with `eta` or `run_now`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::duration_option_schema")
    )]
    pub delay: Option<String>,
    /// Run at this RFC 3339 time (the past means now); not together with `delay` or
    /// `run_now`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::schema_option")
    )]
    pub eta: Option<String>,
    /// `true`: due now (promote), as an `eta` in the past is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_now: Option<bool>,
    /// 0..=9, as in [`SubmitRequest::priority`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schemars(range(min = 0, max = 9)))]
    pub priority: Option<i64>,
}

impl<P> Default for ChangeRequest<P> {
    fn default() -> Self {
        Self {
            payload: None,
            delay: None,
            eta: None,
            run_now: None,
            priority: None,
        }
    }
}

/// The answer to `DELETE /v1/tasks/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct CancelResult {
    pub id: String,
    pub state: TaskState,
}

/// Most bytes of items one `GET /v1/dead-letters` answer carries (one item is always
/// sent, however large).
pub const MAX_LISTING_BYTES: usize = 8 << 20;

/// A page of a listing — `GET /v1/tasks` (newest first) and `GET /v1/dead-letters`
/// (latest due first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct TaskPage {
    pub items: Vec<TaskStatus>,
    /// Items were left out to keep the answer within 8 MiB: fewer than `limit` are
    /// listed although more exist.
    #[serde(default)]
    pub truncated: bool,
    /// There may be more: pass this as `cursor` for the next page. Absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// The answer to `GET /v1/dead-letters`.
pub type DeadLetters = TaskPage;

/// One Kafka message the consumer could not make a task of (bytes that are no task
/// envelope, or a task the store refused), as `GET /v1/kafka-dead-letters` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct KafkaDeadLetterStatus {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The message's value as read, in standard base64 (padded): at most 8 MiB of it.
    pub message_base64: String,
    /// The value's length as read, in bytes: more than `message_base64` holds when the
    /// value was cut at 8 MiB.
    pub message_size: i64,
    /// Why it is no task: the decode error, or the store's refusal.
    pub reason: String,
    #[serde(with = "crate::time::rfc3339")]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema"))]
    pub recorded_at: DateTime<Utc>,
}

/// The answer to `GET /v1/kafka-dead-letters`: latest recorded first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct KafkaDeadLetterPage {
    pub items: Vec<KafkaDeadLetterStatus>,
    /// Items were left out to keep the answer within 8 MiB: fewer than `limit` are
    /// listed although more exist.
    #[serde(default)]
    pub truncated: bool,
    /// There may be more: pass this as `cursor` for the next page. Absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// The body of `POST /v1/kafka-dead-letters/purge`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct KafkaDeadLetterPurge {
    /// Delete the Kafka dead letters recorded before this instant.
    #[serde(with = "crate::time::rfc3339")]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema"))]
    pub recorded_before: DateTime<Utc>,
    /// The most this call deletes, oldest first (1 to 1000, default 1000); repeat the
    /// call until `purged` is below it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// The answer to `POST /v1/kafka-dead-letters/purge`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct KafkaDeadLetterPurgeResult {
    /// Deleted by this call.
    pub purged: u64,
}

/// The answer to `POST /v1/dead-letters/{id}/redrive`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct RedriveResult {
    pub id: String,
    pub state: TaskState,
    #[serde(with = "crate::time::rfc3339")]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema"))]
    pub eta: DateTime<Utc>,
}

/// The most dead letters one `POST /v1/dead-letters/redrive` or `…/purge` acts on: each
/// call is one short pass over the store, so a bulk action over millions of dead letters
/// never holds locks or a request for long; the client loops.
pub const MAX_BULK: u32 = 1000;

/// The body of `POST /v1/dead-letters/redrive` and `POST /v1/dead-letters/purge`: which
/// dead letters to act on. Naming a job or a task type is required.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DeadLetterBulk {
    /// Only this AsyncJobConfig's dead letters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Only this task type's (if `job` is given too, it must be that job's type).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub task_type: Option<String>,
    /// Only dead letters whose last error starts with this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_prefix: Option<String>,
    /// Only dead letters that died at or after this instant.
    #[serde(
        default,
        with = "crate::time::rfc3339_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::schema_option")
    )]
    pub dead_after: Option<DateTime<Utc>>,
    /// Only dead letters that died before this instant. Without it, the instant of the
    /// call; the answer carries the instant used, and a client passes it back on the
    /// following calls of one bulk action, so a task that dies again after its redrive
    /// is not redriven a second time.
    #[serde(
        default,
        with = "crate::time::rfc3339_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::schema_option")
    )]
    pub dead_before: Option<DateTime<Utc>>,
    /// Count only: change nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// The most dead letters this call acts on (1 to 1000, default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// The answer to `POST /v1/dead-letters/redrive` and `POST /v1/dead-letters/purge`. A
/// client repeats the call (with the same filter and `dead_before`) until `remaining` is
/// 0 or `affected` is 0; every call is idempotent, so an interrupted loop is resumed by
/// running it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct DeadLetterBulkResult {
    /// Dead letters matching the filter before this call.
    pub matched: u64,
    /// Redriven or purged by this call (0 on a dry run).
    pub affected: u64,
    /// Matching dead letters left untouched by this call because another task holds
    /// their unique key (redrive) or a blocked task still waits on them (purge).
    pub skipped: u64,
    /// Dead letters still matching after this call.
    pub remaining: u64,
    pub dry_run: bool,
    /// The `dead_before` instant this call used.
    #[serde(with = "crate::time::rfc3339")]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema"))]
    pub dead_before: DateTime<Utc>,
}

/// The answer to `GET /v1/jobs/{name}`, `POST /v1/jobs/{name}/pause` and
/// `POST /v1/jobs/{name}/resume`: whether the job's attempts may begin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct JobStatus {
    /// The AsyncJobConfig's name.
    pub job: String,
    pub task_type: String,
    /// No attempt of the job begins: it is paused through the API, by its config, or
    /// both. Its tasks wait in the store.
    pub paused: bool,
    /// When it was paused through the API; null while it is not.
    #[serde(default, with = "crate::time::rfc3339_option")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::schema_option")
    )]
    pub paused_at: Option<DateTime<Utc>>,
    /// The config says `spec.paused: true`: only a change of the config resumes it.
    pub paused_by_config: bool,
}

/// The answer (202) to a change (`PATCH /v1/tasks/{id}?job=…`, or by idempotency key) of
/// a Kafka-routed task whose message has not been consumed yet: the change is recorded,
/// and the task takes it when the consumer stores it (docs/api.md, "Change a task that
/// has not begun").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct PendingChange {
    pub id: String,
    /// The AsyncJobConfig's name.
    pub job: String,
    #[serde(rename = "type")]
    pub task_type: String,
    /// Always false: the task is not in the store yet. `GET /v1/tasks/{id}` shows a
    /// cancelled placeholder until it is, then the task, changed.
    pub consumed: bool,
}

/// The answer to `POST /v1/jobs/{name}/cron/{entry}/trigger`: the task the cron entry
/// fired, now, once, besides its schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct CronTriggerResult {
    /// The new task's id.
    pub id: String,
    /// The AsyncJobConfig's name.
    pub job: String,
    /// The cron entry's name.
    pub entry: String,
    #[serde(rename = "type")]
    pub task_type: String,
    /// When it is due: the time of the trigger.
    #[serde(with = "crate::time::rfc3339")]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema"))]
    pub eta: DateTime<Utc>,
}

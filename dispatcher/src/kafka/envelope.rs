//! The message format of the Kafka route: a task as one JSON object in the message's
//! value, everything the store row will need. The only header is the API's signature,
//! when a Kafka signing key is configured (`signature.rs`); the key is the producer's
//! choice (`producer.rs`).
//!
//! A message is trusted no more than a submit: whoever may produce to a job's topic is
//! not thereby the API. [`decode`] takes only tasks of the topic's own job, holds every
//! field to the bounds the API's submit holds a request to (`api::submit::bounds`), and
//! refuses rather than changes a value out of them, naming the field, as the API does
//! (docs/security.md, "Kafka envelope trust").

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::signature::SignatureError;
use crate::api::error::ApiError;
use crate::api::submit::{bounds, key_id, legacy_task_id};
use crate::trace::TraceContext;
use asyncd_store::{Millis, NewTask};

/// A task as it travels through Kafka: everything the store row will need.
#[derive(Debug, Serialize, Deserialize)]
struct Envelope {
    id: String,
    #[serde(rename = "type")]
    task_type: String,
    payload: Box<RawValue>,
    priority: u8,
    trigger_at: Millis,
    max_retries: u32,
    timeout_ms: i64,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    source_service: Option<String>,
    /// Rendered at submit, so the consumer need not know the job's template (and a
    /// message written before the job had one carries none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    concurrency_key: Option<String>,
    /// The submitter's `traceparent` and `tracestate`, so the Kafka route keeps the
    /// trace as the store route does; absent in envelopes written before they existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tracestate: Option<String>,
    /// See `NewTask::expires_at`; absent in envelopes written before tasks expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_at: Option<Millis>,
}

impl Envelope {
    fn from_task(task: &NewTask) -> Self {
        Self {
            id: task.id.clone(),
            task_type: task.task_type.clone(),
            payload: task.payload.clone(),
            priority: task.priority,
            trigger_at: task.trigger_at,
            max_retries: task.max_retries,
            timeout_ms: task.timeout_ms,
            idempotency_key: task.idempotency_key.clone(),
            source_service: task.source_service.clone(),
            concurrency_key: task.concurrency_key.clone(),
            traceparent: task.trace.as_ref().map(TraceContext::traceparent),
            tracestate: task.trace.as_ref().and_then(|t| t.state.clone()),
            expires_at: task.expires_at,
        }
    }

    /// The task, if it is one the API could have produced to the topic of `job` by `now`.
    fn into_task(self, job: &TopicJob, now: Millis) -> Result<NewTask, DecodeError> {
        if self.task_type != job.task_type {
            return Err(DecodeError::ForeignType {
                found: self.task_type,
                job: job.name.clone(),
                expected: job.task_type.clone(),
            });
        }
        let refused = |err: ApiError| DecodeError::Refused(err.error.message);
        // A past trigger is kept as it is (it is due, as the API's clamp to "now" would
        // make it), so the row keeps the instant of its submit.
        let trigger_at =
            bounds::not_too_far("trigger_at", self.trigger_at, now).map_err(refused)?;
        let priority = bounds::priority(i64::from(self.priority)).map_err(refused)?;
        let max_retries = bounds::max_retries(i64::from(self.max_retries)).map_err(refused)?;
        let timeout = std::time::Duration::from_millis(self.timeout_ms.max(0) as u64);
        let timeout_ms = bounds::timeout(timeout).map_err(refused)?.as_millis() as i64;
        let idempotency_key =
            bounds::key("idempotency_key", self.idempotency_key).map_err(refused)?;
        let concurrency_key =
            bounds::key("concurrency_key", self.concurrency_key).map_err(refused)?;
        let source_service = bounds::source_service(self.source_service).map_err(refused)?;
        let expires_at = self
            .expires_at
            .map(|at| bounds::after_due(at, trigger_at))
            .transpose()
            .map_err(refused)?;
        check_id(&self.id, &self.task_type, idempotency_key.as_deref())?;
        Ok(NewTask {
            id: self.id,
            task_type: self.task_type,
            payload: self.payload,
            priority,
            trigger_at,
            max_retries,
            timeout_ms,
            idempotency_key,
            unique_key: None,
            unique_for: std::time::Duration::ZERO,
            cron_key: None,
            depends_on: Vec::new(),
            source_service,
            concurrency_key,
            // Validated at submit; an envelope is as untrusted as a header, though.
            trace: self
                .traceparent
                .and_then(|parent| TraceContext::parse(&parent, self.tracestate.as_deref())),
            expires_at,
            // Such tasks never take the Kafka route.
            window: None,
        })
    }
}

/// The API gives a task of a job with a topic the id derived from its idempotency key
/// (`task_id`), and any other a time-ordered one: a message claiming another id could
/// plant a row under the id a keyed submit will derive, which that submit would then run
/// into. The id the release before derived from the key alone is still read, so that
/// messages produced before an upgrade are not dead-lettered by it: under the topic's own
/// type, such a row can hold no id that a submit now derives.
fn check_id(id: &str, task_type: &str, idempotency_key: Option<&str>) -> Result<(), DecodeError> {
    let refused = |why: &str| DecodeError::Refused(format!("id: {id:?} {why}"));
    match idempotency_key {
        Some(key) if id != key_id(task_type, key) && id != legacy_task_id(key) => Err(refused(
            "is not the id the API derives from the idempotency key",
        )),
        Some(_) => Ok(()),
        None => match uuid::Uuid::parse_str(id) {
            Ok(uuid) if uuid.get_version_num() == 7 => Ok(()),
            _ => Err(refused("is not a time-ordered task id (UUIDv7)")),
        },
    }
}

/// The job whose topic a consumer reads: the only one its messages may be tasks of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TopicJob {
    pub name: String,
    pub task_type: String,
}

/// The message value for `task`.
pub(super) fn encode(task: &NewTask) -> Vec<u8> {
    serde_json::to_vec(&Envelope::from_task(task)).expect("envelope serializes")
}

/// Why a consumed message is no task; its text is the reason its dead letter records.
#[derive(Debug, thiserror::Error)]
pub(super) enum DecodeError {
    #[error("the message has no value")]
    NoValue,
    #[error("not an asyncd task envelope: {0}")]
    NotAnEnvelope(#[from] serde_json::Error),
    #[error(
        "type {found:?} is not the task type of job {job:?} ({expected:?}), whose topic this is"
    )]
    ForeignType {
        found: String,
        job: String,
        expected: String,
    },
    /// A field out of the submit's bounds; the text names the field.
    #[error("refused as a submit would be: {0}")]
    Refused(String),
    /// A signing key is configured and the message is not signed with it; checked
    /// before the value is read at all.
    #[error(transparent)]
    Signature(#[from] SignatureError),
}

impl DecodeError {
    /// The `reason` label of `asyncd_kafka_dead_letters_total` for this error.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            DecodeError::NoValue | DecodeError::NotAnEnvelope(_) => "unreadable",
            DecodeError::ForeignType { .. } => "foreign_type",
            DecodeError::Refused(_) => "refused",
            DecodeError::Signature(SignatureError::Unsigned) => "unsigned",
            DecodeError::Signature(SignatureError::Mismatch(_)) => "bad_signature",
        }
    }
}

/// The task a consumed message's value (`None` for a message without one) carries, read
/// from the topic of `job` at `now`.
pub(super) fn decode(
    value: Option<&[u8]>,
    job: &TopicJob,
    now: Millis,
) -> Result<NewTask, DecodeError> {
    let envelope: Envelope = serde_json::from_slice(value.ok_or(DecodeError::NoValue)?)?;
    envelope.into_task(job, now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use asyncd_store::NewTask;

    const NOW: Millis = Millis::new(1_800_000_000_000);

    /// The topic of job `work`, whose task type is `work`.
    fn work() -> TopicJob {
        TopicJob {
            name: "work".into(),
            task_type: "work".into(),
        }
    }

    /// The task as the API would produce it (`test_task` under an id it gives).
    fn task() -> NewTask {
        crate::kafka::test_task(&uuid::Uuid::now_v7().to_string(), "{}", NOW)
    }

    fn read(task: &NewTask) -> Result<NewTask, DecodeError> {
        decode(Some(&encode(task)), &work(), NOW)
    }

    /// `task`'s envelope with `field` set to `value`, as a producer other than the API
    /// may write it, read from job `work`'s topic.
    fn forged(field: &str, value: serde_json::Value) -> Result<NewTask, DecodeError> {
        let mut envelope: serde_json::Value = serde_json::from_slice(&encode(&task())).unwrap();
        envelope[field] = value;
        decode(Some(&serde_json::to_vec(&envelope).unwrap()), &work(), NOW)
    }

    #[test]
    fn the_envelope_carries_the_concurrency_key_and_reads_one_without_it() {
        let mut keyed = task();
        keyed.concurrency_key = Some("merchant:7".into());
        let read_back = read(&keyed).unwrap();
        assert_eq!(read_back.concurrency_key.as_deref(), Some("merchant:7"));
        // Written by a dispatcher from before the field, or for a job without a key.
        let plain = encode(&task());
        assert!(!String::from_utf8_lossy(&plain).contains("concurrency_key"));
        assert_eq!(
            decode(Some(&plain), &work(), NOW).unwrap().concurrency_key,
            None
        );
    }

    /// What the API produces is read back as it was, bounds included.
    #[test]
    fn a_task_the_api_could_produce_is_read_unchanged() {
        let mut keyed = task().priority(9).max_retries(100).timeout_ms(86_400_000);
        keyed.idempotency_key = Some("order-42".into());
        keyed.id = key_id("work", "order-42");
        keyed.trigger_at = NOW + crate::api::submit::bounds::MAX_DELAY;
        keyed.source_service = Some("s".repeat(128));
        let read_back = read(&keyed).unwrap();
        assert_eq!(
            (
                read_back.id.clone(),
                read_back.priority,
                read_back.max_retries,
                read_back.timeout_ms,
                read_back.trigger_at,
                read_back.source_service
            ),
            (
                keyed.id,
                9,
                100,
                86_400_000,
                keyed.trigger_at,
                keyed.source_service
            )
        );
        let mut expiring = task();
        expiring.expires_at = Some(expiring.trigger_at + crate::api::submit::bounds::MAX_DELAY);
        assert_eq!(read(&expiring).unwrap().expires_at, expiring.expires_at);
        assert_eq!(read(&task()).unwrap().expires_at, None);
        // Produced a while ago: a past trigger is due, and kept as the submit's instant.
        let mut late = task();
        late.trigger_at = Millis::new(NOW.as_i64() - 3_600_000);
        assert_eq!(read(&late).unwrap().trigger_at, late.trigger_at);
    }

    /// The reasons a dead letter records for a message that is no task.
    #[test]
    fn a_message_without_an_envelope_says_why() {
        let reason = |value: Option<&[u8]>| decode(value, &work(), NOW).unwrap_err().to_string();
        assert_eq!(reason(None), "the message has no value");
        assert!(
            reason(Some(b"{\"id\":")).starts_with("not an asyncd task envelope: EOF"),
            "{}",
            reason(Some(b"{\"id\":"))
        );
    }

    /// The `reason` label each refusal is counted under in
    /// `asyncd_kafka_dead_letters_total`, one per kind, as docs/operations.md lists them.
    #[test]
    fn each_refusal_is_counted_under_its_kind() {
        let kind = |result: Result<NewTask, DecodeError>| result.unwrap_err().kind();
        assert_eq!(kind(decode(None, &work(), NOW)), "unreadable");
        assert_eq!(kind(decode(Some(b"[]"), &work(), NOW)), "unreadable");
        assert_eq!(kind(forged("type", "payments".into())), "foreign_type");
        assert_eq!(kind(forged("priority", 10.into())), "refused");
        assert_eq!(kind(forged("id", "not-a-uuid".into())), "refused");
        assert_eq!(
            DecodeError::from(SignatureError::Unsigned).kind(),
            "unsigned"
        );
        assert_eq!(
            DecodeError::from(SignatureError::Mismatch("work".into())).kind(),
            "bad_signature"
        );
    }

    /// Whoever may produce to a job's topic gets no other job's tasks, and no field a
    /// submit would be refused: each is refused naming what is wrong, never changed.
    #[test]
    fn a_message_the_api_would_not_produce_to_this_topic_is_refused_naming_the_field() {
        let reason = |field: &str, value: serde_json::Value| {
            forged(field, value.clone())
                .map(|_| ())
                .expect_err(&format!("{field}: {value}"))
                .to_string()
        };
        assert_eq!(
            reason("type", "payments".into()),
            "type \"payments\" is not the task type of job \"work\" (\"work\"), whose topic this is"
        );
        for (field, value, message) in [
            ("priority", serde_json::json!(10), "priority: must be 0..=9"),
            (
                "max_retries",
                serde_json::json!(101),
                "max_retries: must be 0..=100",
            ),
            (
                "timeout_ms",
                serde_json::json!(86_400_001),
                "timeout: must be at least 1ms and at most 24h",
            ),
            (
                "timeout_ms",
                serde_json::json!(0),
                "timeout: must be at least 1ms and at most 24h",
            ),
            (
                "timeout_ms",
                serde_json::json!(-5),
                "timeout: must be at least 1ms and at most 24h",
            ),
            (
                "trigger_at",
                serde_json::json!(NOW.as_i64() + 401 * 86_400_000),
                "trigger_at: must be at most 400 days ahead",
            ),
            (
                "expires_at",
                serde_json::json!(NOW.as_i64()),
                "expires_at: must be after the task is due (now, or its delay or eta)",
            ),
            (
                "idempotency_key",
                serde_json::json!(""),
                "idempotency_key: must be 1 to 255 bytes",
            ),
            (
                "concurrency_key",
                serde_json::json!("k".repeat(256)),
                "concurrency_key: must be 1 to 255 bytes",
            ),
            (
                "concurrency_key",
                serde_json::json!("a\u{1}b"),
                "concurrency_key: must not contain control characters (found U+0001)",
            ),
            (
                "source_service",
                serde_json::json!("s".repeat(129)),
                "source_service: must be at most 128 bytes",
            ),
        ] {
            assert_eq!(
                reason(field, value),
                format!("refused as a submit would be: {message}")
            );
        }
    }

    /// An id the API would not give: planted, it could take the id a keyed submit will
    /// derive.
    #[test]
    fn an_id_the_api_would_not_give_is_refused() {
        let planted = key_id("work", "order-77");
        let reason = forged("id", planted.clone().into())
            .unwrap_err()
            .to_string();
        assert_eq!(
            reason,
            format!(
                "refused as a submit would be: id: {planted:?} is not a time-ordered task id (UUIDv7)"
            )
        );
        let mut keyed = task();
        keyed.idempotency_key = Some("order-42".into());
        keyed.id = uuid::Uuid::now_v7().to_string();
        assert!(
            read(&keyed)
                .unwrap_err()
                .to_string()
                .ends_with("is not the id the API derives from the idempotency key")
        );
        assert!(forged("id", "not-a-uuid".into()).is_err());
        // The id another job's submit derives from the same key: a message on this
        // topic cannot take it.
        keyed.id = key_id("other", "order-42");
        assert!(read(&keyed).is_err());
        // What the release before derived from the key alone is still read.
        keyed.id = legacy_task_id("order-42");
        assert_eq!(read(&keyed).unwrap().id, keyed.id);
    }
}

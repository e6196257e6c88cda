//! The message format of the Kafka route: a task as one JSON object in the message's
//! value, everything the store row will need. Messages carry no headers; the key is the
//! producer's choice (`producer.rs`).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

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
        }
    }

    fn into_task(self) -> NewTask {
        NewTask {
            id: self.id,
            task_type: self.task_type,
            payload: self.payload,
            priority: self.priority,
            trigger_at: self.trigger_at,
            max_retries: self.max_retries,
            timeout_ms: self.timeout_ms,
            idempotency_key: self.idempotency_key,
            unique_key: None,
            unique_for: std::time::Duration::ZERO,
            cron_key: None,
            depends_on: Vec::new(),
            source_service: self.source_service,
            concurrency_key: self.concurrency_key,
            // Validated at submit; an envelope is as untrusted as a header, though.
            trace: self
                .traceparent
                .and_then(|parent| TraceContext::parse(&parent, self.tracestate.as_deref())),
        }
    }
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
}

/// The task a consumed message's value (`None` for a message without one) carries.
pub(super) fn decode(value: Option<&[u8]>) -> Result<NewTask, DecodeError> {
    let envelope: Envelope = serde_json::from_slice(value.ok_or(DecodeError::NoValue)?)?;
    Ok(envelope.into_task())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::test_task as task;

    #[test]
    fn the_envelope_carries_the_concurrency_key_and_reads_one_without_it() {
        let mut keyed = task("a", "{}", Millis::new(0));
        keyed.concurrency_key = Some("merchant:7".into());
        let read = decode(Some(&encode(&keyed))).unwrap();
        assert_eq!(read.concurrency_key.as_deref(), Some("merchant:7"));
        // Written by a dispatcher from before the field, or for a job without a key.
        let plain = encode(&task("b", "{}", Millis::new(0)));
        assert!(!String::from_utf8_lossy(&plain).contains("concurrency_key"));
        assert_eq!(decode(Some(&plain)).unwrap().concurrency_key, None);
    }

    /// The reasons a dead letter records for a message that is no task.
    #[test]
    fn a_message_without_an_envelope_says_why() {
        let reason = |value: Option<&[u8]>| decode(value).unwrap_err().to_string();
        assert_eq!(reason(None), "the message has no value");
        assert!(
            reason(Some(b"{\"id\":")).starts_with("not an asyncd task envelope: EOF"),
            "{}",
            reason(Some(b"{\"id\":"))
        );
    }
}

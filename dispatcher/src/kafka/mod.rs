//! The Kafka path: tasks due within the threshold (default 10 min) travel through their
//! job's topic instead of being written by the API — tasks of priority 5 and above
//! through the job's high-priority topic, which a consumer of its own reads, so a
//! lagging flood of lower-priority messages does not hold them up (docs/design.md,
//! "Priority").
//!
//! - `producer.rs`: the API's side — which tasks take this route, producing them, and
//!   making the topics exist (`--create-topics`).
//! - `consumer.rs`: the dispatcher's side — a consumer per topic that makes each batch
//!   durable in the store (claiming what is due soon into the heap) and only then commits
//!   its offsets; a message it cannot make a task of becomes a Kafka dead letter.
//! - `envelope.rs`: the message format both sides share.

mod consumer;
mod envelope;
mod producer;

use std::time::Duration;

use asyncd_kafka_admin::{AdminError, KafkaAdmin, KafkaSecurity};

pub use consumer::{ConsumerConfig, supervise};
pub use producer::{PAUSE_AFTER_FAILURE, ProduceError, Producer, create_topics};

/// The admin client for `--create-topics`: created topics get one replica.
fn topic_admin(brokers: &str, security: &KafkaSecurity) -> Result<KafkaAdmin, AdminError> {
    KafkaAdmin::new(brokers, security, "asyncd", 1, Duration::from_secs(10))
}

/// A task due at `now` whose payload is the JSON string `payload`.
#[cfg(test)]
fn test_task(id: &str, payload: &str, now: crate::store::Millis) -> crate::store::NewTask {
    crate::store::NewTask {
        id: id.into(),
        task_type: "work".into(),
        payload: serde_json::value::RawValue::from_string(format!("\"{payload}\"")).unwrap(),
        priority: 0,
        trigger_at: now,
        max_retries: 0,
        timeout_ms: 1000,
        idempotency_key: None,
        unique_key: None,
        unique_for: Duration::ZERO,
        cron_key: None,
        depends_on: Vec::new(),
        source_service: None,
        concurrency_key: None,
        trace: None,
    }
}

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
//! - `signature.rs`: with a Kafka signing key, the API's signature over each message,
//!   which the consumers check before reading it.

mod consumer;
mod envelope;
mod producer;
mod signature;

use std::time::Duration;

use asyncd_kafka_admin::{AdminError, KafkaAdmin, KafkaSecurity};

pub use consumer::{ConsumerConfig, supervise};
pub use producer::{PAUSE_AFTER_FAILURE, ProduceError, Producer, create_topics};
pub use signature::{KeyError, MIN_KEY_BYTES, MessageKeys, SIGNATURE_HEADER};

/// The admin client for `--create-topics`: created topics get one replica.
fn topic_admin(brokers: &str, security: &KafkaSecurity) -> Result<KafkaAdmin, AdminError> {
    KafkaAdmin::new(brokers, security, "asyncd", 1, Duration::from_secs(10))
}

/// A task due at `now` whose payload is the JSON string `payload`.
#[cfg(test)]
fn test_task(id: &str, payload: &str, now: asyncd_store::Millis) -> asyncd_store::NewTask {
    asyncd_store::NewTask::test("work", now)
        .id(id)
        .payload(format!("\"{payload}\""))
        .max_retries(0)
}

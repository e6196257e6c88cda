//! Kafka topics: what the reconciler may ask of a broker.
//!
//! [`TopicAdmin`] is the seam: [`KafkaAdmin`] (the workspace's `asyncd-kafka-admin`,
//! shared with the dispatcher) talks to real brokers, tests use a fake.

use async_trait::async_trait;
pub use asyncd_kafka_admin::KafkaAdmin;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TopicError(pub String);

impl From<asyncd_kafka_admin::AdminError> for TopicError {
    fn from(err: asyncd_kafka_admin::AdminError) -> Self {
        TopicError(err.to_string())
    }
}

#[async_trait]
pub trait TopicAdmin: Send + Sync {
    /// The topic's partition count, or `None` when it does not exist.
    async fn partitions(&self, topic: &str) -> Result<Option<u32>, TopicError>;
    async fn create(&self, topic: &str, partitions: u32) -> Result<(), TopicError>;
    /// Grows the topic to `total` partitions (Kafka cannot shrink one).
    async fn grow(&self, topic: &str, total: u32) -> Result<(), TopicError>;
    async fn delete(&self, topic: &str) -> Result<(), TopicError>;
}

#[async_trait]
impl TopicAdmin for KafkaAdmin {
    async fn partitions(&self, topic: &str) -> Result<Option<u32>, TopicError> {
        Ok(KafkaAdmin::partitions(self, topic).await?)
    }
    async fn create(&self, topic: &str, partitions: u32) -> Result<(), TopicError> {
        Ok(KafkaAdmin::create(self, topic, partitions).await?)
    }
    async fn grow(&self, topic: &str, total: u32) -> Result<(), TopicError> {
        Ok(KafkaAdmin::grow(self, topic, total).await?)
    }
    async fn delete(&self, topic: &str) -> Result<(), TopicError> {
        Ok(KafkaAdmin::delete(self, topic).await?)
    }
}

#[cfg(test)]
pub mod fake {
    //! An in-memory broker for tests.
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use super::*;

    #[derive(Default)]
    pub struct FakeAdmin {
        pub topics: Mutex<BTreeMap<String, u32>>,
        pub calls: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl TopicAdmin for FakeAdmin {
        async fn partitions(&self, topic: &str) -> Result<Option<u32>, TopicError> {
            Ok(self.topics.lock().unwrap().get(topic).copied())
        }
        async fn create(&self, topic: &str, partitions: u32) -> Result<(), TopicError> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("create {topic} {partitions}"));
            self.topics.lock().unwrap().insert(topic.into(), partitions);
            Ok(())
        }
        async fn grow(&self, topic: &str, total: u32) -> Result<(), TopicError> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("grow {topic} {total}"));
            let mut topics = self.topics.lock().unwrap();
            let current = topics.get_mut(topic).ok_or(TopicError("no topic".into()))?;
            if total <= *current {
                return Err(TopicError("InvalidPartitions".into()));
            }
            *current = total;
            Ok(())
        }
        async fn delete(&self, topic: &str) -> Result<(), TopicError> {
            self.calls.lock().unwrap().push(format!("delete {topic}"));
            self.topics.lock().unwrap().remove(topic);
            Ok(())
        }
    }
}

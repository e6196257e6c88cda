//! Kafka topics: what the reconciler may ask of a broker.
//!
//! [`TopicAdmin`] is the seam: [`Broker`] (the workspace's `asyncd-kafka-admin`, shared
//! with the dispatcher, and its owner registry) talks to real brokers, tests use a fake.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
pub use asyncd_kafka_admin::{KafkaAdmin, TopicOwners};

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
    /// Creates the topic: `true` when this call created it, `false` when it existed.
    async fn create(&self, topic: &str, partitions: u32) -> Result<bool, TopicError>;
    /// Grows the topic to `total` partitions (Kafka cannot shrink one).
    async fn grow(&self, topic: &str, total: u32) -> Result<(), TopicError>;
    async fn delete(&self, topic: &str) -> Result<(), TopicError>;
    /// Every recorded topic owner (`namespace/config`), by topic.
    async fn owners(&self) -> Result<BTreeMap<String, String>, TopicError>;
    /// Records the topic's owner; `None` removes the record.
    async fn set_owner(&self, topic: &str, owner: Option<&str>) -> Result<(), TopicError>;
}

/// The real broker: topic admin plus the owner registry
/// ([`asyncd_kafka_admin::owners`]), created on first use rather than at startup, so the
/// operator starts (and serves its probes) while Kafka is away.
pub struct Broker {
    admin: KafkaAdmin,
    owners: TopicOwners,
    registry_ready: AtomicBool,
}

impl Broker {
    pub fn new(admin: KafkaAdmin, owners: TopicOwners) -> Self {
        Self {
            admin,
            owners,
            registry_ready: AtomicBool::new(false),
        }
    }

    /// The owner registry, created first if this process has not seen it yet.
    pub async fn registry(&self) -> Result<&TopicOwners, TopicError> {
        if !self.registry_ready.load(Ordering::Acquire) {
            self.owners.ensure_registry(&self.admin).await?;
            self.registry_ready.store(true, Ordering::Release);
        }
        Ok(&self.owners)
    }
}

#[async_trait]
impl TopicAdmin for Broker {
    async fn partitions(&self, topic: &str) -> Result<Option<u32>, TopicError> {
        Ok(self.admin.partitions(topic).await?)
    }
    async fn create(&self, topic: &str, partitions: u32) -> Result<bool, TopicError> {
        Ok(self.admin.create_configured(topic, partitions, &[]).await?)
    }
    async fn grow(&self, topic: &str, total: u32) -> Result<(), TopicError> {
        Ok(self.admin.grow(topic, total).await?)
    }
    async fn delete(&self, topic: &str) -> Result<(), TopicError> {
        Ok(self.admin.delete(topic).await?)
    }
    async fn owners(&self) -> Result<BTreeMap<String, String>, TopicError> {
        Ok(self.registry().await?.read().await?)
    }
    async fn set_owner(&self, topic: &str, owner: Option<&str>) -> Result<(), TopicError> {
        Ok(self.registry().await?.record(topic, owner).await?)
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
        /// The owner registry.
        pub owners: Mutex<BTreeMap<String, String>>,
        pub calls: Mutex<Vec<String>>,
    }

    impl FakeAdmin {
        /// Topics of 6 partitions recorded as `owner`'s.
        pub fn own(&self, topics: &[&str], owner: &str) {
            for topic in topics {
                self.topics.lock().unwrap().insert(topic.to_string(), 6);
                self.owners
                    .lock()
                    .unwrap()
                    .insert(topic.to_string(), owner.to_string());
            }
        }
    }

    #[async_trait]
    impl TopicAdmin for FakeAdmin {
        async fn partitions(&self, topic: &str) -> Result<Option<u32>, TopicError> {
            Ok(self.topics.lock().unwrap().get(topic).copied())
        }
        async fn create(&self, topic: &str, partitions: u32) -> Result<bool, TopicError> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("create {topic} {partitions}"));
            let mut topics = self.topics.lock().unwrap();
            if topics.contains_key(topic) {
                return Ok(false);
            }
            topics.insert(topic.into(), partitions);
            Ok(true)
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
        async fn owners(&self) -> Result<BTreeMap<String, String>, TopicError> {
            Ok(self.owners.lock().unwrap().clone())
        }
        async fn set_owner(&self, topic: &str, owner: Option<&str>) -> Result<(), TopicError> {
            let mut owners = self.owners.lock().unwrap();
            match owner {
                Some(owner) => {
                    self.calls
                        .lock()
                        .unwrap()
                        .push(format!("own {topic} {owner}"));
                    owners.insert(topic.into(), owner.into())
                }
                None => {
                    self.calls.lock().unwrap().push(format!("disown {topic}"));
                    owners.remove(topic)
                }
            };
            Ok(())
        }
    }
}

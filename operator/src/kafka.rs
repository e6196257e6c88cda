//! Kafka topics through the admin API: what the reconciler may ask of a broker.
//!
//! [`TopicAdmin`] is the seam: [`RdKafkaAdmin`] talks to real brokers (rdkafka's
//! `AdminClient` on the bundled librdkafka), tests use a fake.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

#[derive(Debug, thiserror::Error)]
#[error("kafka: {0}")]
pub struct TopicError(pub String);

impl From<KafkaError> for TopicError {
    fn from(err: KafkaError) -> Self {
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

pub struct RdKafkaAdmin {
    admin: Arc<AdminClient<DefaultClientContext>>,
    replication_factor: i32,
    timeout: Duration,
}

impl RdKafkaAdmin {
    /// `replication_factor` -1 leaves it to the broker's `default.replication.factor`.
    pub fn new(brokers: &str, replication_factor: i32) -> Result<Self, TopicError> {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("client.id", "asyncd-operator")
            .create()?;
        Ok(Self {
            admin: Arc::new(admin),
            replication_factor,
            timeout: Duration::from_secs(15),
        })
    }

    fn options(&self) -> AdminOptions {
        AdminOptions::new()
            .request_timeout(Some(self.timeout))
            .operation_timeout(Some(self.timeout))
    }
}

fn single(
    results: Vec<Result<String, (String, RDKafkaErrorCode)>>,
    ok: &[RDKafkaErrorCode],
) -> Result<(), TopicError> {
    for result in results {
        match result {
            Ok(_) => {}
            Err((_, code)) if ok.contains(&code) => {}
            Err((topic, code)) => return Err(TopicError(format!("{topic}: {code}"))),
        }
    }
    Ok(())
}

#[async_trait]
impl TopicAdmin for RdKafkaAdmin {
    async fn partitions(&self, topic: &str) -> Result<Option<u32>, TopicError> {
        let admin = self.admin.clone();
        let name = topic.to_string();
        let timeout = self.timeout;
        tokio::task::spawn_blocking(move || {
            let metadata = admin.inner().fetch_metadata(Some(&name), timeout)?;
            let Some(found) = metadata.topics().iter().find(|t| t.name() == name) else {
                return Ok(None);
            };
            match found.error() {
                None => Ok(Some(found.partitions().len() as u32)),
                Some(code) => match RDKafkaErrorCode::from(code) {
                    RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic => {
                        Ok(None)
                    }
                    // a topic being created or deleted: ask again on the next pass
                    other => Err(TopicError(format!("{name}: {other}"))),
                },
            }
        })
        .await
        .map_err(|e| TopicError(e.to_string()))?
    }

    async fn create(&self, topic: &str, partitions: u32) -> Result<(), TopicError> {
        let new = NewTopic::new(
            topic,
            partitions as i32,
            TopicReplication::Fixed(self.replication_factor),
        );
        let results = self.admin.create_topics([&new], &self.options()).await?;
        single(results, &[RDKafkaErrorCode::TopicAlreadyExists])
    }

    async fn grow(&self, topic: &str, total: u32) -> Result<(), TopicError> {
        let new = NewPartitions::new(topic, total as usize);
        let results = self
            .admin
            .create_partitions([&new], &self.options())
            .await?;
        single(results, &[])
    }

    async fn delete(&self, topic: &str) -> Result<(), TopicError> {
        let results = self.admin.delete_topics(&[topic], &self.options()).await?;
        single(results, &[RDKafkaErrorCode::UnknownTopicOrPartition])
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

//! Kafka topic admin, shared by the dispatcher (`--create-topics`, `asyncd dev`) and the
//! operator: how many partitions a topic has, create it, grow it, delete it; and, for
//! the operator, who owns a topic ([`owners`]).
//!
//! librdkafka's metadata request is a blocking call that can wait out its whole timeout
//! on an unreachable broker, so [`KafkaAdmin::partitions`] runs it on tokio's blocking
//! pool rather than on a runtime thread. The admin operations use rdkafka's async admin
//! API, which waits on a background thread of its own. Dropping the admin client joins
//! that thread, so [`KafkaAdmin`]'s own drop hands the client to the blocking pool.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

pub mod owners;
pub mod security;
pub use owners::TopicOwners;
pub use security::KafkaSecurity;

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("kafka: {0}")]
    Client(#[from] KafkaError),
    #[error("kafka: {topic}: {code}")]
    Topic {
        topic: String,
        code: RDKafkaErrorCode,
    },
    #[error("kafka: the metadata request did not finish: {0}")]
    Blocking(#[from] tokio::task::JoinError),
    #[error("kafka: {topic}: not ready in time")]
    Incomplete { topic: String },
}

pub struct KafkaAdmin {
    /// Taken only by `Drop`.
    admin: Option<Arc<AdminClient<DefaultClientContext>>>,
    replication_factor: i32,
    timeout: Duration,
}

impl KafkaAdmin {
    /// `replication_factor` -1 leaves it to the broker's `default.replication.factor`;
    /// `timeout` bounds every request; `security` says how to reach the brokers.
    pub fn new(
        brokers: &str,
        security: &KafkaSecurity,
        client_id: &str,
        replication_factor: i32,
        timeout: Duration,
    ) -> Result<Self, AdminError> {
        let admin: AdminClient<DefaultClientContext> = security
            .client_config(brokers)
            .set("client.id", client_id)
            .create()?;
        Ok(Self {
            admin: Some(Arc::new(admin)),
            replication_factor,
            timeout,
        })
    }

    fn client(&self) -> &Arc<AdminClient<DefaultClientContext>> {
        self.admin.as_ref().expect("present until drop")
    }

    fn options(&self) -> AdminOptions {
        AdminOptions::new()
            .request_timeout(Some(self.timeout))
            .operation_timeout(Some(self.timeout))
    }

    /// The topic's partition count, or `None` when it does not exist.
    pub async fn partitions(&self, topic: &str) -> Result<Option<u32>, AdminError> {
        let admin = self.client().clone();
        let name = topic.to_string();
        let timeout = self.timeout;
        tokio::task::spawn_blocking(move || {
            let metadata = admin.inner().fetch_metadata(Some(&name), timeout)?;
            let Some(found) = metadata.topics().iter().find(|t| t.name() == name) else {
                return Ok(None);
            };
            match found.error().map(RDKafkaErrorCode::from) {
                None => Ok(Some(found.partitions().len() as u32)),
                Some(
                    RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic,
                ) => Ok(None),
                // a topic being created or deleted: the caller asks again later
                Some(code) => Err(AdminError::Topic { topic: name, code }),
            }
        })
        .await?
    }

    /// Creates the topic; one that exists already is left as it is.
    pub async fn create(&self, topic: &str, partitions: u32) -> Result<(), AdminError> {
        self.create_configured(topic, partitions, &[])
            .await
            .map(|_| ())
    }

    /// Creates the topic with these topic configs; `true` when this call created it,
    /// `false` when it existed already (and is left as it is). Kafka creates a topic
    /// once, so of two callers racing exactly one gets `true`.
    pub async fn create_configured(
        &self,
        topic: &str,
        partitions: u32,
        configs: &[(&str, &str)],
    ) -> Result<bool, AdminError> {
        let mut new = NewTopic::new(
            topic,
            partitions as i32,
            TopicReplication::Fixed(self.replication_factor),
        );
        for (key, value) in configs {
            new = new.set(key, value);
        }
        let results = self.client().create_topics([&new], &self.options()).await?;
        let existed = results
            .iter()
            .any(|r| matches!(r, Err((_, RDKafkaErrorCode::TopicAlreadyExists))));
        check(results, &[RDKafkaErrorCode::TopicAlreadyExists])?;
        Ok(!existed)
    }

    /// Grows the topic to `total` partitions (Kafka cannot shrink one).
    pub async fn grow(&self, topic: &str, total: u32) -> Result<(), AdminError> {
        let new = NewPartitions::new(topic, total as usize);
        let results = self
            .client()
            .create_partitions([&new], &self.options())
            .await?;
        check(results, &[])
    }

    /// Deletes the topic; one already gone is fine.
    pub async fn delete(&self, topic: &str) -> Result<(), AdminError> {
        let results = self
            .client()
            .delete_topics(&[topic], &self.options())
            .await?;
        check(results, &[RDKafkaErrorCode::UnknownTopicOrPartition])
    }

    /// Creates the topic with `partitions`, or grows it to that many; never shrinks it.
    pub async fn ensure(&self, topic: &str, partitions: u32) -> Result<(), AdminError> {
        match self.partitions(topic).await? {
            None => self.create(topic, partitions).await,
            Some(current) if current < partitions => self.grow(topic, partitions).await,
            Some(_) => Ok(()),
        }
    }
}

impl Drop for KafkaAdmin {
    fn drop(&mut self) {
        // the last handle joins librdkafka's polling thread: do that on the blocking pool
        if let Some(admin) = self.admin.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn_blocking(move || drop(admin));
        }
    }
}

fn check(
    results: Vec<Result<String, (String, RDKafkaErrorCode)>>,
    fine: &[RDKafkaErrorCode],
) -> Result<(), AdminError> {
    for result in results {
        match result {
            Ok(_) => {}
            Err((_, code)) if fine.contains(&code) => {}
            Err((topic, code)) => return Err(AdminError::Topic { topic, code }),
        }
    }
    Ok(())
}

//! Who owns a Kafka topic, as a record the broker keeps.
//!
//! Kafka refuses topic configs it does not know (`InvalidConfigurationException: Unknown
//! topic config name`), so an owner cannot ride on the topic itself. It is kept in a
//! registry topic instead: compacted, one partition (one order for every record), key the
//! topic's name, value its owner (the operator writes `namespace/config`), a tombstone
//! once the owner gave the topic up. The last record of a key names the topic's owner;
//! compaction keeps exactly that record.
//!
//! Reading runs librdkafka's blocking consumer calls on tokio's blocking pool, as
//! [`KafkaAdmin::partitions`](crate::KafkaAdmin::partitions) does.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

use crate::{AdminError, KafkaAdmin, KafkaSecurity};

/// The registry's name unless told otherwise.
pub const DEFAULT_REGISTRY: &str = "asyncd-topic-owners";

pub struct TopicOwners {
    producer: FutureProducer,
    consumer_config: rdkafka::ClientConfig,
    registry: String,
    timeout: Duration,
}

impl TopicOwners {
    /// `registry` is the registry topic's name; `timeout` bounds every request.
    pub fn new(
        brokers: &str,
        security: &KafkaSecurity,
        registry: &str,
        timeout: Duration,
    ) -> Result<Self, AdminError> {
        let producer: FutureProducer = security
            .client_config(brokers)
            .set("client.id", "asyncd-topic-owners")
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .create()?;
        let mut consumer_config = security.client_config(brokers);
        // assigned, never subscribed, never committed: no group on the broker
        consumer_config
            .set("client.id", "asyncd-topic-owners")
            .set("group.id", "asyncd-topic-owners-reader")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "false");
        Ok(Self {
            producer,
            consumer_config,
            registry: registry.to_string(),
            timeout,
        })
    }

    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// Creates the registry topic when it is missing (one partition, compacted), and
    /// returns once the broker's metadata shows it, so the first read finds it.
    pub async fn ensure_registry(&self, admin: &KafkaAdmin) -> Result<(), AdminError> {
        admin
            .create_configured(&self.registry, 1, &[("cleanup.policy", "compact")])
            .await?;
        let deadline = tokio::time::Instant::now() + self.timeout;
        while admin.partitions(&self.registry).await?.is_none() {
            if tokio::time::Instant::now() >= deadline {
                return Err(AdminError::Incomplete {
                    topic: self.registry.clone(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Every topic's owner, as the registry says now.
    pub async fn read(&self) -> Result<BTreeMap<String, String>, AdminError> {
        let config = self.consumer_config.clone();
        let registry = self.registry.clone();
        let timeout = self.timeout;
        tokio::task::spawn_blocking(move || read_to_end(&config, &registry, timeout)).await?
    }

    /// Records `owner` as the topic's owner; `None` gives the topic up (a tombstone).
    /// Returns once the broker has the record, so the next [`read`](Self::read) sees it.
    pub async fn record(&self, topic: &str, owner: Option<&str>) -> Result<(), AdminError> {
        let mut record = FutureRecord::<str, str>::to(&self.registry).key(topic);
        if let Some(owner) = owner {
            record = record.payload(owner);
        }
        self.producer
            .send(record, self.timeout)
            .await
            .map_err(|(err, _)| AdminError::Client(err))?;
        Ok(())
    }
}

fn read_to_end(
    config: &rdkafka::ClientConfig,
    registry: &str,
    timeout: Duration,
) -> Result<BTreeMap<String, String>, AdminError> {
    let consumer: BaseConsumer = config.create()?;
    let (low, high) = consumer.fetch_watermarks(registry, 0, timeout)?;
    let mut owners = BTreeMap::new();
    if high <= low {
        return Ok(owners);
    }
    let mut from = TopicPartitionList::new();
    from.add_partition_offset(registry, 0, Offset::Beginning)?;
    consumer.assign(&from)?;
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(AdminError::Incomplete {
                topic: registry.to_string(),
            });
        }
        let Some(message) = consumer.poll(left) else {
            continue;
        };
        let message = message?;
        if let Some(topic) = message.key().map(String::from_utf8_lossy) {
            match message.payload() {
                Some(owner) => {
                    owners.insert(
                        topic.into_owned(),
                        String::from_utf8_lossy(owner).into_owned(),
                    );
                }
                None => {
                    owners.remove(topic.as_ref());
                }
            }
        }
        // compaction may leave gaps, never the last record: stop at the end seen above
        if message.offset() + 1 >= high {
            return Ok(owners);
        }
    }
}

//! The API's side of the Kafka route: which tasks go to a topic, producing them, and
//! (`--create-topics`) making the topics exist.
//!
//! The API waits for a produce's acknowledgement at most `--kafka-delivery-timeout`
//! (default 5 s); a task the broker did not acknowledge by then is stored instead under
//! the same id (`api::ApiState`), so if the produce lands after all, the consumer's
//! insert finds the id taken and the copy changes nothing. For
//! [`PAUSE_AFTER_FAILURE`] after such a failure, the API sends tasks to the store
//! without trying Kafka.
//!
//! With a Kafka signing key, each message carries the `asyncd-signature` header over its
//! value and topic (`signature.rs`).

use std::borrow::Cow;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use asyncd_kafka_admin::KafkaSecurity;
use asyncd_spec::Job;
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio_util::sync::CancellationToken;

use super::signature::{MessageKeys, SIGNATURE_HEADER};
use super::{envelope, topic_admin};
use crate::job_table::Routes;
use asyncd_store::{Millis, NewTask};

/// After a produce failed, how long Kafka-route tasks go straight to the store: with the
/// broker away, each submit would otherwise wait out the delivery timeout first. The
/// store route serves any delay, so this only trades Kafka's throughput for a fast answer.
pub const PAUSE_AFTER_FAILURE: Duration = Duration::from_secs(10);

/// The API's side: decides the route and produces.
pub struct Producer {
    inner: FutureProducer,
    threshold_ms: i64,
    delivery_timeout: Duration,
    /// Until when (epoch ms) the store takes Kafka-route tasks; see [`PAUSE_AFTER_FAILURE`].
    paused_until: AtomicI64,
    /// Signs each message when set.
    signing: Option<MessageKeys>,
}

/// A produce the broker did not acknowledge in time.
#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    #[error("no acknowledgement within {0:?}")]
    TimedOut(Duration),
}

impl Producer {
    /// `delivery_timeout` bounds how long a submit waits for the broker's
    /// acknowledgement (librdkafka's `message.timeout.ms`) before the API stores the
    /// task instead. A message that timed out may still land later; it carries the id
    /// the store row got, so the consumer's insert drops it by the primary key. With
    /// `signing`, every message is signed with its first key.
    pub fn new(
        brokers: &str,
        security: &KafkaSecurity,
        threshold: Duration,
        delivery_timeout: Duration,
        signing: Option<MessageKeys>,
    ) -> Result<Self, KafkaError> {
        // librdkafka wants at least 1 ms, and a request to outlive no message.
        let timeout_ms = delivery_timeout.as_millis().clamp(1, i32::MAX as u128);
        let inner = security
            .client_config(brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "5")
            .set("message.timeout.ms", timeout_ms.to_string())
            .set("request.timeout.ms", timeout_ms.min(30_000).to_string())
            .create()?;
        Ok(Self {
            inner,
            threshold_ms: threshold.as_millis() as i64,
            delivery_timeout,
            paused_until: AtomicI64::new(i64::MIN),
            signing,
        })
    }

    /// A produce failed at `now`: send no task to Kafka for [`PAUSE_AFTER_FAILURE`].
    pub fn pause(&self, now: Millis) {
        self.paused_until
            .fetch_max((now + PAUSE_AFTER_FAILURE).as_i64(), Ordering::Relaxed);
    }

    /// The topic a task goes to, or `None` for the store: the job's high-priority topic
    /// for priority [`asyncd_spec::HIGH_PRIORITY`] and above, its main topic otherwise.
    /// Tasks that need the store's constraints at submit time — a unique key,
    /// dependencies, a key window — always go to the store. While paused after a failure, every task
    /// goes to the store.
    pub fn topic_for<'a>(&self, task: &NewTask, job: &'a Job, now: Millis) -> Option<Cow<'a, str>> {
        if now.as_i64() < self.paused_until.load(Ordering::Relaxed) {
            return None;
        }
        let kafka = job.kafka.as_ref()?;
        let eligible = task.trigger_at.as_i64() - now.as_i64() <= self.threshold_ms
            && task.unique_key.is_none()
            && task.depends_on.is_empty()
            && task.window.is_none()
            && task.cron_key.is_none()
            // An ordered key's tasks are numbered in the store from their submit on, and
            // tenants are shared by the store's claim.
            && job
                .concurrency_key
                .as_ref()
                .is_none_or(|key| key.fifo.is_none() && key.tenants.is_none());
        eligible.then(|| kafka.topic_for(task.priority))
    }

    /// Produces and waits for the broker's acknowledgement (acks=all), at most the
    /// delivery timeout (and a second's grace, should librdkafka's own report be late).
    pub async fn send(&self, topic: &str, task: &NewTask) -> Result<(), ProduceError> {
        let body = envelope::encode(task);
        let key = task.unique_key.as_deref().unwrap_or(&task.id);
        let mut record = FutureRecord::to(topic).key(key).payload(&body);
        if let Some(keys) = &self.signing {
            let signature = keys.sign(topic, &body);
            record = record.headers(OwnedHeaders::new().insert(Header {
                key: SIGNATURE_HEADER,
                value: Some(signature.as_str()),
            }));
        }
        let send = self.inner.send(
            record,
            // How long to wait for room in librdkafka's local queue, which fills when
            // the broker is away: no longer than for the acknowledgement itself.
            self.delivery_timeout,
        );
        match tokio::time::timeout(self.delivery_timeout + Duration::from_secs(1), send).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((err, _))) => Err(err.into()),
            Err(_) => Err(ProduceError::TimedOut(self.delivery_timeout)),
        }
    }
}

/// For `--create-topics` on the API: makes every routed job's topics exist, again after
/// each routing change, so the first produce does not fail on a missing topic.
pub async fn create_topics(
    brokers: String,
    security: KafkaSecurity,
    mut routes: Routes,
    shutdown: CancellationToken,
) {
    let admin = match topic_admin(&brokers, &security) {
        Ok(admin) => admin,
        Err(err) => {
            tracing::error!(%err, "cannot create the Kafka admin client; topics are not created");
            return;
        }
    };
    loop {
        let table = routes.borrow_and_update().clone();
        for kafka in table.jobs().filter_map(|job| job.kafka.as_ref()) {
            for topic in kafka.topics() {
                if let Err(err) = admin.ensure(&topic, kafka.partitions).await {
                    tracing::warn!(%topic, %err, "could not create the topic");
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = routes.changed() => if changed.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::test_task;

    #[test]
    fn after_a_failure_tasks_go_to_the_store_for_a_while() {
        let (_, job) = asyncd_spec::AsyncJobConfig::from_yaml(include_str!(
            "../../../config/samples/order-cancel-job.yaml"
        ))
        .unwrap();
        // Nothing listens there; creating the client connects to nothing yet.
        let producer = Producer::new(
            "127.0.0.1:9",
            &KafkaSecurity::default(),
            Duration::from_secs(600),
            Duration::from_secs(5),
            None,
        )
        .unwrap();
        let now = Millis::new(1_700_000_000_000);
        let task = NewTask {
            task_type: job.task_type.clone(),
            ..test_task("t", "any", now)
        };
        let topic = job.kafka.as_ref().unwrap().topic.as_str();
        assert_eq!(producer.topic_for(&task, &job, now).as_deref(), Some(topic));
        let high = NewTask {
            priority: asyncd_spec::HIGH_PRIORITY,
            ..task.clone()
        };
        assert_eq!(
            producer.topic_for(&high, &job, now).as_deref(),
            Some(format!("{topic}-high").as_str()),
            "high priority has a topic of its own"
        );
        let ordered = asyncd_spec::Job {
            concurrency_key: Some(asyncd_spec::ConcurrencyKey {
                template: "{order_id}".into(),
                limit: 1,
                rate: None,
                adaptive: false,
                fifo: Some(asyncd_spec::OnDead::Block),
                tenants: None,
            }),
            ..job.clone()
        };
        assert_eq!(
            producer.topic_for(&task, &ordered, now),
            None,
            "an ordered job's tasks are numbered in the store"
        );
        let shared = asyncd_spec::Job {
            concurrency_key: Some(asyncd_spec::ConcurrencyKey {
                template: String::new(),
                limit: 100,
                rate: None,
                adaptive: false,
                fifo: None,
                tenants: Some(asyncd_spec::Tenants {
                    template: "{customer}".into(),
                    weights: Default::default(),
                    default_weight: 1,
                }),
            }),
            ..job.clone()
        };
        assert_eq!(
            producer.topic_for(&task, &shared, now),
            None,
            "a job shared between tenants is shared by the store's claim"
        );
        producer.pause(now);
        let end = now + PAUSE_AFTER_FAILURE;
        assert_eq!(
            producer
                .topic_for(&task, &job, Millis::new(end.as_i64() - 1))
                .as_deref(),
            None
        );
        assert_eq!(producer.topic_for(&task, &job, end).as_deref(), Some(topic));
        // An earlier failure reported late does not shorten the pause.
        producer.pause(Millis::new(now.as_i64() - 5_000));
        assert_eq!(
            producer
                .topic_for(&task, &job, Millis::new(end.as_i64() - 1))
                .as_deref(),
            None
        );
    }
}

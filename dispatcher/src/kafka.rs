//! The Kafka path: tasks due within the threshold (default 10 min) travel through their
//! job's topic instead of being written by the API — tasks of priority 5 and above
//! through the job's high-priority topic, which a consumer of its own reads, so a
//! lagging flood of lower-priority messages does not hold them up (docs/design.md,
//! "Priority").
//!
//! The reference system kept consumed tasks in the dispatcher's heap and committed
//! offsets right away, so a dispatcher that died lost its heap. Here a consumer first
//! makes each polled batch durable in the store — one bulk write, claimed at once by this
//! dispatcher when due within `horizon` (default 30 s), plain pending otherwise — and
//! only then commits the batch's offsets. The commit watermark is therefore never pinned
//! by a task due in nine minutes, a crash re-delivers at most the uncommitted batch (and
//! the store's primary key drops what was already written), and a dispatcher that dies
//! holding claims loses nothing: the rescuer hands them on when their hold lapses.
//! Retries, 202 leases and dead letters then work exactly as for store-path tasks.
//!
//! A message the consumer cannot make a task of never blocks the partition: one that is
//! no task envelope, or whose task the store refuses (found by splitting the batch, see
//! `adopt_isolating`), is kept in the store's Kafka dead-letter table with its bytes
//! and the reason, and its offset is committed with the rest of the batch.
//!
//! The API waits for a produce's acknowledgement at most `--kafka-delivery-timeout`
//! (default 5 s); a task the broker did not acknowledge by then is stored instead under
//! the same id (`api::ApiState`), so if the produce lands after all, the consumer's
//! insert finds the id taken and the copy changes nothing. For
//! [`PAUSE_AFTER_FAILURE`] after such a failure, the API sends tasks to the store
//! without trying Kafka.
//!
//! Consumer settings: `session.timeout.ms` 10 s and `heartbeat.interval.ms` 3 s so a
//! dead consumer's partitions move within seconds; the poll loop never waits on an
//! executor (those run on their own tasks), so `max.poll.interval.ms` keeps its
//! default; offsets are committed by hand after the store write
//! (`enable.auto.commit=false`); a new group starts from the earliest offset.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use asyncd_kafka_admin::{AdminError, KafkaAdmin, KafkaSecurity};
use asyncd_spec::Job;
use asyncd_spec::job::HIGH_TOPIC_SUFFIX;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::SharedClock;
use crate::dispatcher::HeapSink;
use crate::executor::sanitize_reason;
use crate::metrics::Metrics;
use crate::routing::Routes;
use crate::store::{AdoptParams, ClaimedTask, KafkaDeadLetter, Millis, NewTask, Store};
use crate::trace::TraceContext;

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
    /// the store row got, so the consumer's insert drops it by the primary key.
    pub fn new(
        brokers: &str,
        security: &KafkaSecurity,
        threshold: Duration,
        delivery_timeout: Duration,
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
    /// dependencies — always go to the store. While paused after a failure, every task
    /// goes to the store.
    pub fn topic_for<'a>(&self, task: &NewTask, job: &'a Job, now: Millis) -> Option<Cow<'a, str>> {
        if now.as_i64() < self.paused_until.load(Ordering::Relaxed) {
            return None;
        }
        let kafka = job.kafka.as_ref()?;
        let eligible = task.trigger_at.as_i64() - now.as_i64() <= self.threshold_ms
            && task.unique_key.is_none()
            && task.depends_on.is_empty()
            && task.cron_key.is_none();
        eligible.then(|| kafka.topic_for(task.priority))
    }

    /// Produces and waits for the broker's acknowledgement (acks=all), at most the
    /// delivery timeout (and a second's grace, should librdkafka's own report be late).
    pub async fn send(&self, topic: &str, task: &NewTask) -> Result<(), ProduceError> {
        let body = serde_json::to_vec(&Envelope::from_task(task)).expect("envelope serializes");
        let key = task.unique_key.as_deref().unwrap_or(&task.id);
        let send = self.inner.send(
            FutureRecord::to(topic).key(key).payload(&body),
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

/// The admin client for `--create-topics`: created topics get one replica.
fn topic_admin(brokers: &str, security: &KafkaSecurity) -> Result<KafkaAdmin, AdminError> {
    KafkaAdmin::new(brokers, security, "asyncd", 1, Duration::from_secs(10))
}

#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    pub brokers: String,
    pub security: KafkaSecurity,
    pub owner: String,
    /// Consumed tasks due within this are claimed into the heap at once.
    pub horizon: Duration,
    pub hold: Duration,
    /// Outside a cluster: create missing topics with the config's partitions.
    pub create_topics: bool,
}

/// Runs a consumer for each topic of each routed job that has one — the main topic and
/// the high-priority topic — starting and stopping them as the routing table changes,
/// until `shutdown`.
#[allow(clippy::too_many_arguments)]
pub async fn supervise(
    config: ConsumerConfig,
    mut routes: Routes,
    store: Arc<dyn Store>,
    sink: HeapSink,
    clock: SharedClock,
    metrics: Arc<Metrics>,
    // The role's tracker: the role waits for the consumers, not just for this loop.
    tasks: TaskTracker,
    shutdown: CancellationToken,
) {
    // (job name, topic) → (group, the consumer's own stop signal).
    let mut running: HashMap<(String, String), (String, CancellationToken)> = HashMap::new();
    loop {
        let table = routes.borrow_and_update().clone();
        let mut wanted = HashMap::new();
        for job in table.jobs() {
            if let Some(kafka) = &job.kafka {
                let group = kafka
                    .consumer_group
                    .clone()
                    .unwrap_or_else(|| format!("asyncd-{}", job.name));
                // Each priority class has a consumer, and a group, of its own: the
                // high-priority topic is read as soon as a message lands in it, however
                // far the main topic's consumer lags, and neither's rebalances stop the
                // other.
                let [main, high] = kafka.topics();
                let high_group = format!("{group}{HIGH_TOPIC_SUFFIX}");
                wanted.insert((job.name.clone(), main), (group, kafka.partitions));
                wanted.insert((job.name.clone(), high), (high_group, kafka.partitions));
            }
        }
        running.retain(|(name, topic), (group, stop)| {
            let keep = wanted
                .get(&(name.clone(), topic.clone()))
                .is_some_and(|(g, _)| g == group);
            if !keep {
                tracing::info!(job = %name, %topic, "stopping consumer");
                stop.cancel();
            }
            keep
        });
        for ((name, topic), (group, partitions)) in wanted {
            let key = (name, topic);
            if running.contains_key(&key) {
                continue;
            }
            let stop = shutdown.child_token();
            running.insert(key.clone(), (group.clone(), stop.clone()));
            let (job, topic) = key;
            tasks.spawn(consume(
                Assignment {
                    job,
                    topic,
                    group,
                    partitions,
                },
                config.clone(),
                store.clone(),
                sink.clone(),
                clock.clone(),
                metrics.clone(),
                stop,
            ));
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = routes.changed() => if changed.is_err() { shutdown.cancelled().await; return },
        }
    }
}

struct Assignment {
    job: String,
    topic: String,
    group: String,
    partitions: u32,
}

async fn consume(
    assignment: Assignment,
    config: ConsumerConfig,
    store: Arc<dyn Store>,
    sink: HeapSink,
    clock: SharedClock,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let Assignment {
        job,
        topic,
        group,
        partitions,
    } = assignment;
    if config.create_topics {
        let created = match topic_admin(&config.brokers, &config.security) {
            Ok(admin) => admin.ensure(&topic, partitions).await,
            Err(err) => Err(err),
        };
        if let Err(err) = created {
            tracing::warn!(%job, %topic, %err, "could not create the topic");
        }
    }
    let consumer: StreamConsumer = match config
        .security
        .client_config(&config.brokers)
        .set("group.id", &group)
        .set("client.id", &config.owner)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "3000")
        .set("topic.metadata.refresh.interval.ms", "5000")
        .create()
    {
        Ok(consumer) => consumer,
        Err(err) => {
            tracing::error!(%job, %err, "cannot create the Kafka consumer");
            return;
        }
    };
    if let Err(err) = consumer.subscribe(&[&topic]) {
        tracing::error!(%job, %topic, %err, "cannot subscribe");
        return;
    }
    tracing::info!(%job, %topic, %group, "consuming");
    let consumer = Arc::new(consumer);
    let lag = tokio::spawn(report_lag(
        consumer.clone(),
        topic.clone(),
        metrics.clone(),
        stop.clone(),
    ));
    loop {
        // Wait for one message, then take whatever else is ready, up to 500.
        let first = tokio::select! {
            _ = stop.cancelled() => break,
            message = consumer.recv() => message,
        };
        let mut messages = vec![first];
        while messages.len() < 500 {
            match tokio::time::timeout(Duration::from_millis(2), consumer.recv()).await {
                Ok(message) => messages.push(message),
                Err(_) => break,
            }
        }
        let mut batch = Batch::default();
        let mut letters = Vec::new();
        let mut offsets: HashMap<i32, i64> = HashMap::new();
        for message in messages {
            let message = match message {
                Ok(message) => message,
                Err(err) => {
                    tracing::warn!(%job, %err, "Kafka receive error");
                    continue;
                }
            };
            let next = offsets.entry(message.partition()).or_insert(0);
            *next = (*next).max(message.offset() + 1);
            let origin = Origin {
                partition: message.partition(),
                offset: message.offset(),
                raw: message.payload().unwrap_or_default().to_vec(),
            };
            match serde_json::from_slice::<Envelope>(&origin.raw) {
                Ok(envelope) => batch.push(envelope.into_task(), origin),
                // A message no asyncd wrote: kept with its bytes, and its offset committed
                // with the batch, rather than wedge the partition or lose it.
                Err(err) => {
                    let reason = match message.payload() {
                        None => "the message has no value".to_string(),
                        Some(_) => format!("not an asyncd task envelope: {err}"),
                    };
                    letters.push(origin.dead_letter(&topic, reason, clock.now_millis()));
                }
            }
        }
        if offsets.is_empty() {
            // Only errors (the broker is away): don't spin while librdkafka reconnects.
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
            continue;
        }
        // Durable first, then commit: never the other way round. That includes the dead
        // letters, whose offsets are committed with the rest.
        let stored = async {
            let refused = adopt_isolating(
                store.as_ref(),
                batch,
                &topic,
                &config,
                &clock,
                &stop,
                |claimed| sink.push(claimed),
            )
            .await?;
            letters.extend(refused);
            record_dead_letters(store.as_ref(), &letters, &job, &metrics, &stop).await
        };
        if stored.await.is_err() {
            // this batch is not stored: leave without committing it
            close(consumer, lag, false).await;
            return;
        }
        let mut list = TopicPartitionList::new();
        for (partition, offset) in offsets {
            if let Err(err) = list.add_partition_offset(&topic, partition, Offset::Offset(offset)) {
                tracing::warn!(%err, "bad offset");
            }
        }
        if list.count() > 0
            && let Err(err) = consumer.commit(&list, CommitMode::Async)
        {
            // The next batch's commit covers this one; a crash before it re-delivers
            // tasks the store already holds, which it drops.
            tracing::warn!(%job, %err, "offset commit failed");
        }
    }
    // Commit what was consumed before leaving the group, so the next owner starts after it.
    close(consumer, lag, true).await;
    tracing::info!(%job, "consumer stopped");
}

/// Where a consumed task came from, kept with it so that a task the store refuses can
/// be recorded as the message it was.
struct Origin {
    partition: i32,
    offset: i64,
    /// The message's value as read.
    raw: Vec<u8>,
}

impl Origin {
    fn dead_letter(&self, topic: &str, reason: String, now: Millis) -> KafkaDeadLetter {
        KafkaDeadLetter::new(
            topic,
            self.partition,
            self.offset,
            &self.raw,
            sanitize_reason(&reason),
            now,
        )
    }
}

/// Consumed tasks and, index for index, the messages they came from: two vectors so the
/// store is handed the tasks as the slice it takes, without copying them.
#[derive(Default)]
struct Batch {
    tasks: Vec<NewTask>,
    origins: Vec<Origin>,
}

impl Batch {
    fn push(&mut self, task: NewTask, origin: Origin) {
        self.tasks.push(task);
        self.origins.push(origin);
    }

    fn split_off(&mut self, at: usize) -> Batch {
        Batch {
            tasks: self.tasks.split_off(at),
            origins: self.origins.split_off(at),
        }
    }
}

/// The consumer is stopping with a batch not (wholly) stored: its offsets stay
/// uncommitted, so the group's next owner reads it again.
#[derive(Debug)]
struct Stopped;

/// Stores a consumed batch (`Store::adopt`), handing what it claimed to `claimed` part by
/// part, and returns the dead letters of the tasks the store refused.
///
/// While the store is unavailable, the part at hand is tried again with backoff (up to
/// 2 s) until it is stored or `stop`. A part the store refuses for any other reason (a
/// value some backend cannot store, a constraint) is split in halves until the refused
/// task is alone; that one becomes a dead letter with the store's error, so one task
/// never blocks the partition behind it — nor, since the offsets of a batch are
/// committed together, the partitions batched with it. Parts already stored stay stored.
async fn adopt_isolating(
    store: &dyn Store,
    batch: Batch,
    topic: &str,
    config: &ConsumerConfig,
    clock: &SharedClock,
    stop: &CancellationToken,
    mut claimed: impl FnMut(Vec<ClaimedTask>),
) -> Result<Vec<KafkaDeadLetter>, Stopped> {
    let mut refused = Vec::new();
    // Parts still to store, the next one last.
    let mut parts = vec![batch];
    let mut backoff = Duration::from_millis(50);
    while let Some(mut part) = parts.pop() {
        if part.tasks.is_empty() {
            continue;
        }
        let now = clock.now_millis();
        let err = match store
            .adopt(AdoptParams {
                tasks: &part.tasks,
                horizon: now + config.horizon,
                now,
                hold: config.hold,
                owner: &config.owner,
            })
            .await
        {
            Ok(adopted) => {
                claimed(adopted);
                backoff = Duration::from_millis(50);
                continue;
            }
            Err(err) => err,
        };
        if err.is_unavailable() {
            tracing::warn!(%topic, %err, tasks = part.tasks.len(), "could not store consumed tasks; retrying");
            parts.push(part);
            tokio::select! {
                _ = stop.cancelled() => return Err(Stopped),
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
            continue;
        }
        if part.tasks.len() > 1 {
            let second = part.split_off(part.tasks.len() / 2);
            parts.push(second);
            parts.push(part);
            continue;
        }
        let origin = &part.origins[0];
        let id = &part.tasks[0].id;
        tracing::warn!(%topic, partition = origin.partition, offset = origin.offset, %id, %err,
            "the store refused a consumed task; keeping its message as a dead letter");
        refused.push(origin.dead_letter(topic, format!("the store refused task {id}: {err}"), now));
    }
    Ok(refused)
}

/// Records Kafka dead letters before their offsets are committed, waiting out an
/// unavailable store (until `stop`). A letter the store refuses for another reason is
/// logged and dropped: its bytes are lost, but keeping the offset uncommitted would
/// block the partition for good, the one thing this table exists to prevent.
async fn record_dead_letters(
    store: &dyn Store,
    letters: &[KafkaDeadLetter],
    job: &str,
    metrics: &Metrics,
    stop: &CancellationToken,
) -> Result<(), Stopped> {
    for letter in letters {
        let mut backoff = Duration::from_millis(50);
        loop {
            match store.record_kafka_dead_letter(letter).await {
                Ok(()) => {
                    metrics.kafka_dead_letters.with_label_values(&[job]).inc();
                    tracing::warn!(%job, topic = %letter.topic, partition = letter.partition,
                        offset = letter.offset, reason = %letter.reason, "kept a Kafka message as a dead letter");
                    break;
                }
                Err(err) if err.is_unavailable() => {
                    tracing::warn!(%job, %err, "could not record a Kafka dead letter; retrying");
                    tokio::select! {
                        _ = stop.cancelled() => return Err(Stopped),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(err) => {
                    tracing::error!(%job, topic = %letter.topic, partition = letter.partition,
                        offset = letter.offset, size = letter.message_size, reason = %letter.reason, %err,
                        "the store refused a Kafka dead letter; going on without it");
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Stops the lag reporter, then (on the blocking pool: librdkafka waits on the broker)
/// commits the consumer's position if `commit`, and closes it, leaving the group.
async fn close(consumer: Arc<StreamConsumer>, lag: tokio::task::JoinHandle<()>, commit: bool) {
    lag.abort();
    // the reporter holds a handle: closing happens where the last one is dropped
    let _ = lag.await;
    let closed = tokio::task::spawn_blocking(move || {
        if commit && let Err(err) = consumer.commit_consumer_state(CommitMode::Sync) {
            tracing::debug!(%err, "final offset commit");
        }
        drop(consumer);
    })
    .await;
    if let Err(err) = closed {
        tracing::warn!(%err, "closing the Kafka consumer");
    }
}

/// `asyncd_kafka_consumer_lag{topic,partition}`: end of the partition minus this
/// consumer's position, for the partitions it holds.
async fn report_lag(
    consumer: Arc<StreamConsumer>,
    topic: String,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        let consumer = consumer.clone();
        let name = topic.clone();
        let lags = tokio::task::spawn_blocking(move || {
            let position = consumer.position().ok()?;
            let mut lags = Vec::new();
            for element in position.elements_for_topic(&name) {
                let (_, high) = consumer
                    .fetch_watermarks(&name, element.partition(), Duration::from_secs(2))
                    .ok()?;
                let lag = match element.offset() {
                    Offset::Offset(at) => (high - at).max(0),
                    _ => high,
                };
                lags.push((element.partition(), lag));
            }
            Some(lags)
        })
        .await
        .ok()
        .flatten();
        for (partition, lag) in lags.unwrap_or_default() {
            metrics
                .kafka_lag
                .with_label_values(&[topic.as_str(), &partition.to_string()])
                .set(lag);
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

    fn task(id: &str, payload: &str, now: Millis) -> NewTask {
        NewTask {
            id: id.into(),
            task_type: "work".into(),
            payload: RawValue::from_string(format!("\"{payload}\"")).unwrap(),
            priority: 0,
            trigger_at: now,
            max_retries: 0,
            timeout_ms: 1000,
            idempotency_key: None,
            unique_key: None,
            unique_for: std::time::Duration::ZERO,
            cron_key: None,
            depends_on: Vec::new(),
            source_service: None,
            concurrency_key: None,
            trace: None,
        }
    }

    /// The store refuses two tasks of a batch (a trigger stands in for a value a backend
    /// cannot store): every other task is stored and claimed, and each refused one comes
    /// back alone as the dead letter of its own message.
    #[tokio::test]
    async fn a_batch_the_store_refuses_is_split_until_the_refused_task_is_alone() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/tasks.db", dir.path().display());
        let store = crate::store::open(&url).await.unwrap();
        store.migrate().await.unwrap();
        let mut db = <sqlx::SqliteConnection as sqlx::Connection>::connect(&url)
            .await
            .unwrap();
        sqlx::query(
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON tasks \
             WHEN NEW.payload LIKE '%POISON%' \
             BEGIN SELECT RAISE(ABORT, 'refused by the test trigger'); END",
        )
        .execute(&mut db)
        .await
        .unwrap();
        let now = Millis::new(1_800_000_000_000);
        let clock: SharedClock = crate::clock::ManualClock::at(
            chrono::DateTime::from_timestamp_millis(now.as_i64()).unwrap(),
        );
        let mut batch = Batch::default();
        for offset in 0..21 {
            let payload = if offset == 3 || offset == 17 {
                "POISON"
            } else {
                "ok"
            };
            let id = format!("t{offset:02}");
            let raw = format!("message {offset}\0\u{ff}").into_bytes();
            batch.push(
                task(&id, payload, now),
                Origin {
                    partition: offset % 2,
                    offset: i64::from(offset),
                    raw,
                },
            );
        }
        let config = ConsumerConfig {
            brokers: String::new(),
            security: KafkaSecurity::default(),
            owner: "me".into(),
            horizon: Duration::from_secs(30),
            hold: Duration::from_secs(30),
            create_topics: false,
        };
        let mut claimed = Vec::new();
        let refused = adopt_isolating(
            store.as_ref(),
            batch,
            "topic",
            &config,
            &clock,
            &CancellationToken::new(),
            |tasks| claimed.extend(tasks.into_iter().map(|t| t.id)),
        )
        .await
        .unwrap();

        claimed.sort();
        let expected: Vec<String> = (0..21)
            .filter(|o| *o != 3 && *o != 17)
            .map(|o| format!("t{o:02}"))
            .collect();
        assert_eq!(claimed, expected, "everything else stored and claimed");
        let places: Vec<(i32, i64, Vec<u8>)> = refused
            .iter()
            .map(|l| (l.partition, l.offset, l.message.clone()))
            .collect();
        assert_eq!(
            places,
            [
                (1, 3, b"message 3\0\xc3\xbf".to_vec()),
                (1, 17, b"message 17\0\xc3\xbf".to_vec())
            ]
        );
        assert!(
            refused
                .iter()
                .all(|l| l.reason.contains("refused by the test trigger")
                    && l.reason.starts_with("the store refused task t")),
            "{refused:?}"
        );
        assert!(store.get("t03").await.unwrap().is_none());
    }

    #[test]
    fn the_envelope_carries_the_concurrency_key_and_reads_one_without_it() {
        let mut keyed = task("a", "{}", Millis::new(0));
        keyed.concurrency_key = Some("merchant:7".into());
        let body = serde_json::to_vec(&Envelope::from_task(&keyed)).unwrap();
        let read: Envelope = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            read.into_task().concurrency_key.as_deref(),
            Some("merchant:7")
        );
        // Written by a dispatcher from before the field, or for a job without a key.
        let plain =
            serde_json::to_vec(&Envelope::from_task(&task("b", "{}", Millis::new(0)))).unwrap();
        assert!(!String::from_utf8_lossy(&plain).contains("concurrency_key"));
        let read: Envelope = serde_json::from_slice(&plain).unwrap();
        assert_eq!(read.into_task().concurrency_key, None);
    }

    #[test]
    fn after_a_failure_tasks_go_to_the_store_for_a_while() {
        let (_, job) = asyncd_spec::AsyncJobConfig::from_yaml(include_str!(
            "../../config/samples/order-cancel-job.yaml"
        ))
        .unwrap();
        // Nothing listens there; creating the client connects to nothing yet.
        let producer = Producer::new(
            "127.0.0.1:9",
            &KafkaSecurity::default(),
            Duration::from_secs(600),
            Duration::from_secs(5),
        )
        .unwrap();
        let now = Millis::new(1_700_000_000_000);
        let task = NewTask {
            id: "t".into(),
            task_type: job.task_type.clone(),
            payload: RawValue::from_string("null".into()).unwrap(),
            priority: 0,
            trigger_at: now,
            max_retries: 0,
            timeout_ms: 1000,
            idempotency_key: None,
            unique_key: None,
            unique_for: std::time::Duration::ZERO,
            cron_key: None,
            depends_on: Vec::new(),
            source_service: None,
            concurrency_key: None,
            trace: None,
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

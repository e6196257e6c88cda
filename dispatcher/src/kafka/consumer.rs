//! The dispatcher's side of the Kafka route: a consumer for each topic of each routed job.
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
//! not signed with the Kafka signing key when one is configured (`signature.rs`; checked
//! before anything else is read), that is no task envelope, or a task the API could not
//! have produced to this topic (another job's type, a field out of a submit's bounds:
//! `envelope.rs`), or whose task the store refuses (found by splitting the batch, see
//! `insert_consumed_isolating`), is kept in the store's Kafka dead-letter table with its
//! bytes and the reason, counted by reason, and its offset is committed with the rest of
//! the batch.
//!
//! Consumer settings: `session.timeout.ms` 10 s and `heartbeat.interval.ms` 3 s so a
//! dead consumer's partitions move within seconds; the poll loop never waits on an
//! executor (those run on their own tasks), so `max.poll.interval.ms` keeps its
//! default; offsets are committed by hand after the store write
//! (`enable.auto.commit=false`); a new group starts from the earliest offset.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use asyncd_kafka_admin::KafkaSecurity;
use asyncd_spec::job::HIGH_TOPIC_SUFFIX;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::envelope::{self, DecodeError, TopicJob};
use super::signature::{MessageKeys, SIGNATURE_HEADER};
use super::topic_admin;
use crate::clock::SharedClock;
use crate::dispatch::HeapSink;
use crate::executor::sanitize_reason;
use crate::job_table::Routes;
use crate::metrics::Metrics;
use asyncd_store::{
    ClaimedTask, InsertConsumedParams, InsertOutcome, KafkaDeadLetter, Millis, NewTask, Store,
};

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
    /// When set, only messages signed with one of these keys are read.
    pub signing: Option<MessageKeys>,
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
    // (job name, topic) → (group, the job's task type, the consumer's own stop signal).
    type Running = (String, String, CancellationToken);
    let mut running: HashMap<(String, String), Running> = HashMap::new();
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
                let task_type = &job.task_type;
                wanted.insert(
                    (job.name.clone(), main),
                    (group, task_type.clone(), kafka.partitions),
                );
                wanted.insert(
                    (job.name.clone(), high),
                    (high_group, task_type.clone(), kafka.partitions),
                );
            }
        }
        // A consumer takes only its job's task type: it is replaced when that changes.
        running.retain(|(name, topic), (group, task_type, stop)| {
            let keep = wanted
                .get(&(name.clone(), topic.clone()))
                .is_some_and(|(g, t, _)| g == group && t == task_type);
            if !keep {
                tracing::info!(job = %name, %topic, "stopping consumer");
                stop.cancel();
            }
            keep
        });
        for ((name, topic), (group, task_type, partitions)) in wanted {
            let key = (name, topic);
            if running.contains_key(&key) {
                continue;
            }
            let stop = shutdown.child_token();
            running.insert(
                key.clone(),
                (group.clone(), task_type.clone(), stop.clone()),
            );
            let (name, topic) = key;
            tasks.spawn(consume(
                Assignment {
                    job: TopicJob { name, task_type },
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
    job: TopicJob,
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
        job: topic_job,
        topic,
        group,
        partitions,
    } = assignment;
    let job = topic_job.name.clone();
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
            let decoded = verify(config.signing.as_ref(), &topic, &message)
                .and_then(|()| envelope::decode(message.payload(), &topic_job, clock.now_millis()));
            match decoded {
                Ok(task) => batch.push(task, origin),
                // A message no asyncd API wrote to this topic: kept with its bytes, and its
                // offset committed with the batch, rather than wedge the partition, lose it
                // or run it.
                Err(err) => letters.push((
                    origin.dead_letter(&topic, err.to_string(), clock.now_millis()),
                    err.kind(),
                )),
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
            let refused = insert_consumed_isolating(
                store.as_ref(),
                batch,
                &topic,
                &config,
                &clock,
                &stop,
                |claimed| sink.push(claimed),
            )
            .await?;
            letters.extend(refused.into_iter().map(|letter| (letter, STORE_REFUSED)));
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

/// With signing keys, whether `message` carries a signature of its value for `topic` by
/// one of them; without, every message passes.
fn verify(
    keys: Option<&MessageKeys>,
    topic: &str,
    message: &impl Message,
) -> Result<(), DecodeError> {
    let Some(keys) = keys else {
        return Ok(());
    };
    let signatures = message
        .headers()
        .into_iter()
        .flat_map(|headers| headers.iter())
        .filter(|header| header.key == SIGNATURE_HEADER)
        .map(|header| header.value);
    keys.verify(topic, message.payload().unwrap_or_default(), signatures)?;
    Ok(())
}

/// The `reason` label of a dead letter whose task the store refused.
const STORE_REFUSED: &str = "store_refused";

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

/// Stores a consumed batch (`Store::insert_consumed`), handing what it claimed to `claimed` part by
/// part, and returns the dead letters of the tasks the store refused.
///
/// While the store is unavailable, the part at hand is tried again with backoff (up to
/// 2 s) until it is stored or `stop`. A part the store refuses for any other reason (a
/// value some backend cannot store, a constraint) is split in halves until the refused
/// task is alone; that one becomes a dead letter with the store's error, so one task
/// never blocks the partition behind it — nor, since the offsets of a batch are
/// committed together, the partitions batched with it. Parts already stored stay stored.
async fn insert_consumed_isolating(
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
            .insert_consumed(InsertConsumedParams {
                tasks: &part.tasks,
                horizon: now + config.horizon,
                now,
                hold: config.hold,
                owner: &config.owner,
            })
            .await
        {
            Ok(consumed) => {
                claimed(consumed.claimed);
                for (index, outcome) in consumed.refused {
                    let origin = &part.origins[index];
                    let id = &part.tasks[index].id;
                    let why = refusal(&outcome);
                    tracing::warn!(%topic, partition = origin.partition, offset = origin.offset, %id, %why,
                        "the store refused a consumed task; keeping its message as a dead letter");
                    refused.push(origin.dead_letter(
                        topic,
                        format!("the store refused task {id}: {why}"),
                        now,
                    ));
                }
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

/// Why the store did not keep a consumed task ([`asyncd_store::Consumed::refused`]).
/// Two submits with one idempotency key and different payloads, both produced before
/// either was consumed, are both answered with the key's task; the second is refused
/// here, and its message kept, rather than dropped unseen.
fn refusal(outcome: &InsertOutcome) -> String {
    match outcome {
        InsertOutcome::IdempotencyMismatch { existing_id } => {
            format!("its idempotency key is held by task {existing_id}, of another type or payload")
        }
        InsertOutcome::UniqueConflict { existing_id } => {
            format!("its unique key is held by task {existing_id}")
        }
        InsertOutcome::UnknownDependency { id } => {
            format!("it depends on task {id}, which does not exist")
        }
        other => format!("{other:?}"),
    }
}

/// Records Kafka dead letters before their offsets are committed, waiting out an
/// unavailable store (until `stop`). A letter the store refuses for another reason is
/// logged and dropped: its bytes are lost, but keeping the offset uncommitted would
/// block the partition for good, the one thing this table exists to prevent.
async fn record_dead_letters(
    store: &dyn Store,
    letters: &[(KafkaDeadLetter, &'static str)],
    job: &str,
    metrics: &Metrics,
    stop: &CancellationToken,
) -> Result<(), Stopped> {
    for (letter, reason) in letters {
        let mut backoff = Duration::from_millis(50);
        loop {
            match store.record_kafka_dead_letter(letter).await {
                Ok(()) => {
                    metrics
                        .kafka_dead_letters
                        .with_label_values(&[job, reason])
                        .inc();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::test_task as task;

    /// With keys, a message passes only with an `asyncd-signature` header (the exact,
    /// case-sensitive name) signing its value for the topic read; without keys, every
    /// message passes as before.
    #[test]
    fn with_keys_only_a_message_signed_for_the_topic_read_passes() {
        use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
        let keys = MessageKeys::parse(&"k".repeat(32)).unwrap();
        let value = br#"{"id":"t1"}"#.to_vec();
        let signature = keys.sign("orders", &value);
        let message = |headers: &[(&str, &str)]| {
            let headers = headers
                .iter()
                .fold(OwnedHeaders::new(), |all, (key, value)| {
                    all.insert(Header {
                        key,
                        value: Some(*value),
                    })
                });
            OwnedMessage::new(
                Some(value.clone()),
                Some(b"t1".to_vec()),
                "orders".into(),
                rdkafka::Timestamp::NotAvailable,
                0,
                7,
                Some(headers),
            )
        };
        let kind = |keys: Option<&MessageKeys>, topic: &str, message: &OwnedMessage| {
            verify(keys, topic, message).err().map(|err| err.kind())
        };
        let signed = message(&[("trace", "x"), (SIGNATURE_HEADER, &signature)]);
        assert_eq!(kind(Some(&keys), "orders", &signed), None);
        assert_eq!(
            kind(Some(&keys), "orders-high", &signed),
            Some("bad_signature")
        );
        assert_eq!(
            kind(Some(&keys), "orders", &message(&[("trace", "x")])),
            Some("unsigned")
        );
        assert_eq!(
            kind(
                Some(&keys),
                "orders",
                &message(&[("Asyncd-Signature", &signature)])
            ),
            Some("unsigned")
        );
        let without_headers = OwnedMessage::new(
            Some(value.clone()),
            None,
            "orders".into(),
            rdkafka::Timestamp::NotAvailable,
            0,
            8,
            None,
        );
        assert_eq!(
            kind(Some(&keys), "orders", &without_headers),
            Some("unsigned")
        );
        assert_eq!(kind(None, "orders", &without_headers), None);
        assert_eq!(
            kind(None, "orders", &message(&[(SIGNATURE_HEADER, "v1=00")])),
            None
        );
    }

    /// Stores `batch` as the consumer does at `now` (a consumer `me`, a 30 s horizon):
    /// the ids it claimed and the dead letters of the messages it refused.
    async fn store_consumed(
        store: &dyn Store,
        batch: Batch,
        now: Millis,
    ) -> (Vec<String>, Vec<KafkaDeadLetter>) {
        let clock: SharedClock = crate::clock::ManualClock::at(
            chrono::DateTime::from_timestamp_millis(now.as_i64()).unwrap(),
        );
        let config = ConsumerConfig {
            brokers: String::new(),
            security: KafkaSecurity::default(),
            owner: "me".into(),
            horizon: Duration::from_secs(30),
            hold: Duration::from_secs(30),
            create_topics: false,
            signing: None,
        };
        let mut claimed = Vec::new();
        let refused = insert_consumed_isolating(
            store,
            batch,
            "topic",
            &config,
            &clock,
            &CancellationToken::new(),
            |tasks| claimed.extend(tasks.into_iter().map(|t| t.id)),
        )
        .await
        .unwrap();
        (claimed, refused)
    }

    /// Two copies of one keyed submit with different payloads reach the topic before
    /// either is consumed (both answered with the id the key derives): the second is
    /// not stored, and comes back as its message's dead letter naming the key's task,
    /// not dropped unseen. The first is stored and claimed.
    #[tokio::test]
    async fn a_second_payload_under_a_consumed_key_is_kept_as_a_dead_letter() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/tasks.db", dir.path().display());
        let store = asyncd_store::open(&url).await.unwrap();
        store.migrate().await.unwrap();
        let now = Millis::new(1_800_000_000_000);
        let keyed = |payload: &str| {
            let mut task = task("from-the-key", payload, now);
            task.idempotency_key = Some("idem".into());
            task
        };
        let mut batch = Batch::default();
        for (offset, payload) in [(40, "first"), (41, "second")] {
            batch.push(
                keyed(payload),
                Origin {
                    partition: 0,
                    offset,
                    raw: payload.as_bytes().to_vec(),
                },
            );
        }
        let (claimed, refused) = store_consumed(store.as_ref(), batch, now).await;

        assert_eq!(claimed, ["from-the-key"]);
        let letters: Vec<(i64, &[u8], &str)> = refused
            .iter()
            .map(|l| (l.offset, l.message.as_slice(), l.reason.as_str()))
            .collect();
        assert_eq!(
            letters,
            [(
                41,
                &b"second"[..],
                "the store refused task from-the-key: its idempotency key is held by task \
                 from-the-key, of another type or payload"
            )]
        );
        let stored = store.get("from-the-key").await.unwrap().unwrap();
        assert_eq!(stored.payload.get(), "\"first\"");
    }

    /// The store refuses two tasks of a batch (a trigger stands in for a value a backend
    /// cannot store): every other task is stored and claimed, and each refused one comes
    /// back alone as the dead letter of its own message.
    #[tokio::test]
    async fn a_batch_the_store_refuses_is_split_until_the_refused_task_is_alone() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/tasks.db", dir.path().display());
        let store = asyncd_store::open(&url).await.unwrap();
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
        let (mut claimed, refused) = store_consumed(store.as_ref(), batch, now).await;

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
}

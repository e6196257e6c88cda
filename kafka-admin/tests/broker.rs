//! Against a real broker: `e2e/services/kafka.sh start`, then
//! `ASYNCD_TEST_KAFKA_BROKERS=$(e2e/services/kafka.sh url)`; skipped without it, or failed
//! with `ASYNCD_TEST_REQUIRE_BACKENDS=1` (the asyncd tests' rule, from their file).

#[path = "../../dispatcher/tests/support/backends.rs"]
mod backends;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use asyncd_kafka_admin::{KafkaAdmin, KafkaSecurity, TopicOwners};

use backends::Service;

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}-{nanos}")
}

/// Metadata lags an admin operation a little: ask until `want` or the deadline.
async fn partitions_become(admin: &KafkaAdmin, topic: &str, want: Option<u32>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = admin.partitions(topic).await.ok().flatten();
        if now == want {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{topic}: {now:?} partitions, wanted {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn creates_grows_keeps_and_deletes_a_topic() {
    let Some(brokers) = Service::Kafka.address() else {
        return;
    };
    let admin = KafkaAdmin::new(
        &brokers,
        &KafkaSecurity::default(),
        "asyncd-kafka-admin-test",
        1,
        Duration::from_secs(15),
    )
    .unwrap();
    let topic = unique("admin-test");
    assert_eq!(admin.partitions(&topic).await.unwrap(), None);

    admin.ensure(&topic, 2).await.unwrap();
    partitions_become(&admin, &topic, Some(2)).await;
    // creating it again is not an error
    admin.create(&topic, 2).await.unwrap();

    admin.ensure(&topic, 4).await.unwrap();
    partitions_become(&admin, &topic, Some(4)).await;
    // ensure never shrinks
    admin.ensure(&topic, 1).await.unwrap();
    assert_eq!(admin.partitions(&topic).await.unwrap(), Some(4));

    admin.delete(&topic).await.unwrap();
    partitions_become(&admin, &topic, None).await;
    admin.delete(&topic).await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn an_unreachable_broker_does_not_stall_the_runtime() {
    // one runtime thread: if the metadata call blocked it, the ticker could not run
    let admin = KafkaAdmin::new(
        "127.0.0.1:1",
        &KafkaSecurity::default(),
        "asyncd-kafka-admin-test",
        1,
        Duration::from_secs(2),
    )
    .unwrap();
    let ticks = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counter = ticks.clone();
    let ticker = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    assert!(admin.partitions("anything").await.is_err());
    ticker.abort();
    assert!(ticks.load(std::sync::atomic::Ordering::SeqCst) >= 5);
}

#[tokio::test]
async fn the_owner_registry_keeps_the_last_record_per_topic_and_forgets_on_a_tombstone() {
    let Some(brokers) = Service::Kafka.address() else {
        return;
    };
    let security = KafkaSecurity::default();
    let admin = KafkaAdmin::new(
        &brokers,
        &security,
        "asyncd-kafka-admin-test",
        1,
        Duration::from_secs(15),
    )
    .unwrap();
    let registry = unique("owners-test");
    let owners = TopicOwners::new(&brokers, &security, &registry, Duration::from_secs(15)).unwrap();
    owners.ensure_registry(&admin).await.unwrap();
    partitions_become(&admin, &registry, Some(1)).await;
    // a second operator finds it there
    owners.ensure_registry(&admin).await.unwrap();
    assert!(owners.read().await.unwrap().is_empty());

    owners
        .record("orders", Some("team-a/orders"))
        .await
        .unwrap();
    owners
        .record("invoices", Some("team-b/invoices"))
        .await
        .unwrap();
    owners
        .record("orders", Some("team-c/orders"))
        .await
        .unwrap();
    let read = owners.read().await.unwrap();
    assert_eq!(
        read.get("orders").map(String::as_str),
        Some("team-c/orders")
    );
    assert_eq!(
        read.get("invoices").map(String::as_str),
        Some("team-b/invoices")
    );

    owners.record("orders", None).await.unwrap();
    let read = owners.read().await.unwrap();
    assert_eq!(read.get("orders"), None);
    assert_eq!(read.len(), 1);

    admin.delete(&registry).await.unwrap();
}

#[tokio::test]
async fn only_the_creating_call_is_told_it_created_the_topic() {
    let Some(brokers) = Service::Kafka.address() else {
        return;
    };
    let admin = KafkaAdmin::new(
        &brokers,
        &KafkaSecurity::default(),
        "asyncd-kafka-admin-test",
        1,
        Duration::from_secs(15),
    )
    .unwrap();
    let topic = unique("created-test");
    let (first, second) = tokio::join!(
        admin.create_configured(&topic, 1, &[]),
        admin.create_configured(&topic, 1, &[])
    );
    let mut told = [first.unwrap(), second.unwrap()];
    told.sort();
    assert_eq!(told, [false, true]);
    assert!(!admin.create_configured(&topic, 1, &[]).await.unwrap());
    admin.delete(&topic).await.unwrap();
}

//! Against a real broker: `e2e/services/kafka.sh start`, then
//! `ASYNCD_TEST_KAFKA_BROKERS=$(e2e/services/kafka.sh url)`; skipped without it, or failed
//! with `ASYNCD_TEST_REQUIRE_BACKENDS=1` (the asyncd tests' rule, from their file).

#[path = "../../dispatcher/tests/support/backends.rs"]
mod backends;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use asyncd_kafka_admin::{KafkaAdmin, KafkaSecurity};

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

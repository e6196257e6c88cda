//! Dispatchers as the store knows them: membership by heartbeat, the adaptive shares they
//! publish, and the server's clock they compare theirs with.

use asyncd_store::{MEMBER_RETENTION, Millis, Store};

use crate::{T0, at};

scenarios!(
    membership_by_heartbeat,
    a_beat_writes_the_heartbeat_and_reads_the_live_members,
    shares_are_summed_over_the_live_members,
    the_servers_clock_is_read_in_utc_milliseconds,
);

async fn membership_by_heartbeat(store: &dyn Store) {
    store
        .heartbeat_member("b", T0, &Default::default())
        .await
        .unwrap();
    store
        .heartbeat_member("a", at(1_000), &Default::default())
        .await
        .unwrap();
    store
        .heartbeat_member("c", at(-10_000), &Default::default())
        .await
        .unwrap();
    assert_eq!(
        store.live_members(at(-4_000)).await.unwrap(),
        ["a", "b"],
        "c is silent"
    );
    store
        .heartbeat_member("c", at(2_000), &Default::default())
        .await
        .unwrap();
    assert_eq!(
        store.live_members(at(-4_000)).await.unwrap(),
        ["a", "b", "c"],
        "c is back"
    );
    store.remove_member("b").await.unwrap();
    assert_eq!(store.live_members(at(-4_000)).await.unwrap(), ["a", "c"]);
    // An hour of silence and the row is gone even for a lenient reader.
    store
        .heartbeat_member(
            "a",
            at(MEMBER_RETENTION.as_millis() as i64 + 1_500),
            &Default::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        store.live_members(Millis::new(0)).await.unwrap(),
        ["a", "c"]
    );
    store
        .heartbeat_member(
            "a",
            at(MEMBER_RETENTION.as_millis() as i64 + 2_001),
            &Default::default(),
        )
        .await
        .unwrap();
    assert_eq!(store.live_members(Millis::new(0)).await.unwrap(), ["a"]);
}

/// `heartbeat_and_list_members`, a dispatcher's beat (one statement on PostgreSQL):
/// the members alive since the given time, the beating one with them even when its last
/// heartbeat was older, its shares replaced, and members silent for an hour forgotten —
/// as `heartbeat_member` then `live_members` do.
async fn a_beat_writes_the_heartbeat_and_reads_the_live_members(store: &dyn Store) {
    let shares = |n: u32| [("x".to_string(), n)].into_iter().collect();
    store.heartbeat_member("b", T0, &shares(3)).await.unwrap();
    store
        .heartbeat_member("old", at(-10_000), &Default::default())
        .await
        .unwrap();
    store
        .heartbeat_member("a", at(-20_000), &shares(7))
        .await
        .unwrap();
    let seen = store
        .heartbeat_and_list_members("a", at(1_000), &shares(2), at(-4_000))
        .await
        .unwrap();
    assert_eq!(seen, ["a", "b"], "old is silent; a counts at once");
    assert_eq!(
        store.live_shares(at(-4_000)).await.unwrap()["x"],
        5,
        "a's shares replaced: {:?}",
        store.live_shares(at(-4_000)).await
    );
    let past_retention = MEMBER_RETENTION.as_millis() as i64;
    let seen = store
        .heartbeat_and_list_members(
            "c",
            at(past_retention - 5_000),
            &Default::default(),
            Millis::new(0),
        )
        .await
        .unwrap();
    assert_eq!(seen, ["a", "b", "c"], "old went silent an hour ago");
    assert_eq!(
        store.live_members(Millis::new(0)).await.unwrap(),
        ["a", "b", "c"],
        "forgotten for good"
    );
}

/// The adaptive shares published with the heartbeats: summed per task type over the
/// live members, a later heartbeat replacing a member's earlier shares.
async fn shares_are_summed_over_the_live_members(store: &dyn Store) {
    let shares = |pairs: &[(&str, u32)]| -> asyncd_store::Shares {
        pairs.iter().map(|(t, s)| (t.to_string(), *s)).collect()
    };
    store
        .heartbeat_member("a", T0, &shares(&[("x", 8), ("y", 3)]))
        .await
        .unwrap();
    store
        .heartbeat_member("b", T0, &shares(&[("x", 5)]))
        .await
        .unwrap();
    store
        .heartbeat_member("c", at(-10_000), &shares(&[("x", 64)]))
        .await
        .unwrap();
    let sums = store.live_shares(at(-4_000)).await.unwrap();
    assert_eq!(
        sums.into_iter().collect::<Vec<_>>(),
        [("x".to_string(), 13), ("y".to_string(), 3)],
        "c is silent"
    );
    store
        .heartbeat_member("a", at(1_000), &shares(&[("x", 2)]))
        .await
        .unwrap();
    let sums = store.live_shares(at(-4_000)).await.unwrap();
    assert_eq!(sums.into_iter().collect::<Vec<_>>(), [("x".to_string(), 7)]);
}

async fn the_servers_clock_is_read_in_utc_milliseconds(store: &dyn Store) {
    let before = chrono::Utc::now().timestamp_millis();
    let clock = store.database_clock().await.unwrap();
    let after = chrono::Utc::now().timestamp_millis();
    // The test runs on the database's host, so its clock is ours: an embedded database
    // has none to read, a server's reads as ours, to within a second for rounding and
    // scheduling, not a time zone's hours.
    if let Some(clock) = clock {
        assert!(
            (before - 1_000..=after + 1_000).contains(&clock.as_i64()),
            "{clock:?} not within [{before}, {after}]"
        );
    }
}

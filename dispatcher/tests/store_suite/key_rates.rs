//! `concurrencyKey.rateLimit`: each key's own token bucket, held in total across
//! dispatchers (the bucket is a row of the store), while the job's other keys go on.

use std::time::Duration;

use asyncd_spec::RateLimit;
use asyncd_store::{HeldBy, JobGate, NewTask, Store, TaskState};

use crate::limits::claims_of;
use crate::{T0, at, insert, start_params, state};

scenarios!(a_key_rate_holds_its_key_while_the_other_keys_go_on);

/// Four claims, three of key `a` and one of `b`, a rate of 10/s with a burst of 1 per
/// key: `a`'s first and `b`'s begin, `a`'s others wait for its next token, which the
/// start names; a start 50 ms later (another dispatcher's) finds no token, one 100 ms
/// later one.
async fn a_key_rate_holds_its_key_while_the_other_keys_go_on(store: &dyn Store) {
    let a: Vec<String> = vec![
        insert(store, NewTask::test("paced", T0).concurrency_key("a")).await,
        insert(store, NewTask::test("paced", at(1)).concurrency_key("a")).await,
        insert(store, NewTask::test("paced", at(2)).concurrency_key("a")).await,
    ];
    let b = insert(store, NewTask::test("paced", at(3)).concurrency_key("b")).await;
    let claims = claims_of(store, "paced", "x", 4, at(10)).await;
    let key_of = |id: &str| if id == b { Some("b") } else { Some("a") };
    let keys: Vec<Option<&str>> = claims.iter().map(|(id, _)| key_of(id)).collect();
    let gate = JobGate {
        task_type: "paced",
        concurrency: 100,
        rate: None,
        key_limit: Some(10),
        key_rate: Some(RateLimit {
            per_second: 10,
            burst: 1,
        }),
        keys: &keys,
        limiters: &[],
    };
    let first = store
        .start_limited(start_params(&claims, at(10), 0), gate)
        .await
        .unwrap();
    let mut begun: Vec<&str> = first.started.iter().map(|s| s.id.as_str()).collect();
    begun.sort();
    let mut expected = vec![a[0].as_str(), b.as_str()];
    expected.sort();
    assert_eq!(begun, expected, "each key's first");
    assert_eq!(first.deferred.len(), 2);
    assert!(
        matches!(first.held_by, Some(HeldBy::Rate { next_token }) if next_token <= Duration::from_millis(100)),
        "{:?}",
        first.held_by
    );
    assert_eq!(state(store, &a[1]).await, TaskState::Claimed);

    let waiting: Vec<(String, i64)> = first
        .deferred
        .iter()
        .map(|&index| claims[index].clone())
        .collect();
    let keys: Vec<Option<&str>> = waiting.iter().map(|(id, _)| key_of(id)).collect();
    let again = |now: i64| {
        let (waiting, keys) = (&waiting, &keys);
        async move {
            store
                .start_limited(start_params(waiting, at(now), 0), JobGate { keys, ..gate })
                .await
                .unwrap()
        }
    };
    assert_eq!(again(60).await.started.len(), 0, "no token 50 ms later");
    let later = again(110).await;
    assert_eq!(
        later.started.len(),
        1,
        "the next token 100 ms after the first"
    );
}

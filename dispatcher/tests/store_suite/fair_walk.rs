//! The fair claim by rank walks a keyed job's keys (a skip-scan, one index probe per
//! key) instead of reading its backlog, so what one claim looks at is bounded: the keys
//! that can take its slots plus at most 256 more (docs/design.md, "Per-key limits").
//! These scenarios hold the walk to the order of the turns it replaces.

use std::collections::{BTreeMap, BTreeSet};

use asyncd_store::{FairParams, KeyOrder, Millis, NewTask, Store, TypeFilter};

use crate::{at, claim_params, insert};

scenarios!(
    a_claim_steps_over_keys_with_nothing_due_and_the_next_goes_on,
    later_turns_come_once_every_key_had_its_first,
    a_key_at_its_limit_is_stepped_over_and_keyless_tasks_go_first,
    a_key_whose_limit_was_cut_is_claimed_up_to_the_cut,
);

/// One fair claim by rank: the ids taken, and where the rotation goes on.
async fn claim(
    store: &dyn Store,
    task_type: &str,
    now: Millis,
    limit: u32,
    per_key: u32,
    after: Option<&str>,
    cut: Option<&BTreeMap<String, u32>>,
) -> (BTreeSet<String>, Option<String>) {
    let only = TypeFilter::Only(vec![task_type.into()]);
    let claim = store
        .claim_fair(
            claim_params(&only, now, now, 60_000, "x", limit),
            FairParams {
                per_key,
                after,
                order: KeyOrder::Rank,
                key_limits: cut,
                tenants: None,
            },
        )
        .await
        .unwrap();
    (
        claim.tasks.into_iter().map(|task| task.id).collect(),
        claim.last_key,
    )
}

/// 700 keys whose tasks fall due later, then one key with a task due now: a claim walks
/// at most its slots plus 256 keys, so the first claims find nothing, each saying where
/// it stopped, and the claim after them goes on from there and takes the due task —
/// within ⌈701 / 260⌉ claims of 4 — where a walk that began again each time would never
/// reach it.
async fn a_claim_steps_over_keys_with_nothing_due_and_the_next_goes_on(store: &dyn Store) {
    let later: Vec<NewTask> = (0..700)
        .map(|i| NewTask::test("walked", at(60_000)).concurrency_key(format!("k{i:03}")))
        .collect();
    store.insert(&later, at(0)).await.unwrap();
    let due = insert(
        store,
        NewTask::test("walked", at(0)).concurrency_key("k700"),
    )
    .await;
    let mut after: Option<String> = None;
    let mut stops = Vec::new();
    for _ in 0..3 {
        let (taken, last) = claim(store, "walked", at(10), 4, 1, after.as_deref(), None).await;
        if taken.contains(&due) {
            assert_eq!(taken.len(), 1, "only k700's task is due");
            assert!(last.is_some(), "the rotation goes on from where it stopped");
            assert_eq!(
                stops.len(),
                2,
                "two claims stopped short before it: {stops:?}"
            );
            return;
        }
        assert!(taken.is_empty(), "{taken:?}");
        let last = last.expect("a claim that stopped short says where");
        assert!(
            after.as_deref().is_none_or(|after| *after < *last),
            "each claim goes on past the last: {after:?}, then {last}"
        );
        stops.push(last.clone());
        after = Some(last);
    }
    panic!("k700's task was not taken by the third claim: stopped at {stops:?}");
}

/// Keys a (three due), b (one due), c (two due), limit 3 per key: a claim of 5 takes each
/// key's first, then the second turns in the same rotation — a, c — and not a's third.
async fn later_turns_come_once_every_key_had_its_first(store: &dyn Store) {
    let mut ids = std::collections::BTreeMap::new();
    for (key, count) in [("a", 3), ("b", 1), ("c", 2)] {
        for n in 0..count {
            let id = insert(store, NewTask::test("turns", at(n)).concurrency_key(key)).await;
            ids.insert(format!("{key}{n}"), id);
        }
    }
    let (taken, last) = claim(store, "turns", at(100), 5, 3, None, None).await;
    let expected: BTreeSet<String> = ["a0", "b0", "c0", "a1", "c1"]
        .iter()
        .map(|name| ids[*name].clone())
        .collect();
    assert_eq!(taken, expected);
    assert_eq!(last.as_deref(), Some("c"), "the second turn ended at c");
    let (rest, _) = claim(store, "turns", at(100), 5, 3, last.as_deref(), None).await;
    assert_eq!(rest, BTreeSet::from([ids["a2"].clone()]), "a's third turn");
}

/// A key whose limit its claimed task fills is stepped over; the job's tasks without a
/// key (from before it had one) are taken too, as one more key with the same limit.
async fn a_key_at_its_limit_is_stepped_over_and_keyless_tasks_go_first(store: &dyn Store) {
    let full = insert(store, NewTask::test("held", at(0)).concurrency_key("a")).await;
    let (first, _) = claim(store, "held", at(10), 1, 1, None, None).await;
    assert_eq!(first, BTreeSet::from([full]), "a's first is claimed");
    insert(store, NewTask::test("held", at(1)).concurrency_key("a")).await;
    let b = insert(store, NewTask::test("held", at(2)).concurrency_key("b")).await;
    let keyless = insert(store, NewTask::test("held", at(3))).await;
    insert(store, NewTask::test("held", at(4))).await;
    let (taken, _) = claim(store, "held", at(10), 10, 1, None, None).await;
    assert_eq!(
        taken,
        BTreeSet::from([b, keyless]),
        "a is at its limit of 1; one keyless task, the limit"
    );
}

/// `concurrencyKey.adaptive`: a key whose executor's overload answers cut its limit (the
/// dispatcher passes the cut limits) is claimed up to the cut; the others to the job's.
async fn a_key_whose_limit_was_cut_is_claimed_up_to_the_cut(store: &dyn Store) {
    let mut ids = BTreeMap::new();
    for key in ["a", "b"] {
        for n in 0..3 {
            let id = insert(store, NewTask::test("cut", at(n)).concurrency_key(key)).await;
            ids.insert(format!("{key}{n}"), id);
        }
    }
    let cut = BTreeMap::from([("a".to_string(), 1)]);
    let (taken, _) = claim(store, "cut", at(100), 10, 3, None, Some(&cut)).await;
    let expected: BTreeSet<String> = ["a0", "b0", "b1", "b2"]
        .iter()
        .map(|name| ids[*name].clone())
        .collect();
    assert_eq!(taken, expected, "a to its cut of 1, b to the limit of 3");
    let (more, _) = claim(store, "cut", at(100), 10, 3, None, Some(&cut)).await;
    assert!(more.is_empty(), "a holds its cut: {more:?}");
    let (rest, _) = claim(store, "cut", at(100), 10, 3, None, None).await;
    assert_eq!(rest.len(), 2, "uncut, a takes up to 3");
}

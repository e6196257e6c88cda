//! Ordered keys (`spec.ordering: fifo`): the fair claim takes each key's earliest
//! unfinished task only, in submission order, and a retry or (with `onDead: block`) a
//! dead task holds its key's place.

use asyncd_store::{
    FairParams, Finish, FinishKind, KeyOrder, Millis, NewTask, RedriveOutcome, Store, TypeFilter,
};

use crate::{at, claim_params, start_params};

scenarios!(
    an_ordered_key_begins_in_submission_order_and_a_retry_keeps_its_place,
    a_dead_task_holds_its_key_only_when_it_blocks,
);

/// Submits a task of key `key`, due at `due`, accepted at `submitted`.
async fn submit(store: &dyn Store, key: &str, due: i64, submitted: i64) -> String {
    let task = NewTask::test("ordered", at(due)).concurrency_key(key);
    let id = task.id.clone();
    store.insert(&[task], at(submitted)).await.unwrap();
    id
}

/// The ids an ordered claim of the job takes at `now`, sorted.
async fn claim(store: &dyn Store, now: Millis, dead_blocks: bool) -> Vec<(String, i64)> {
    let only = TypeFilter::Only(vec!["ordered".into()]);
    let mut claimed: Vec<(String, i64)> = store
        .claim_fair(
            claim_params(&only, now, now, 600_000, "x", 100),
            FairParams {
                per_key: 1,
                after: None,
                order: KeyOrder::Fifo { dead_blocks },
                key_limits: None,
                tenants: None,
            },
        )
        .await
        .unwrap()
        .tasks
        .into_iter()
        .map(|c| (c.id, c.lease_token))
        .collect();
    claimed.sort();
    claimed
}

fn ids(claimed: &[(String, i64)]) -> Vec<&str> {
    claimed.iter().map(|(id, _)| id.as_str()).collect()
}

/// Begins the attempt of the claimed `task` at `now` and ends it with `kind`.
async fn attempt(store: &dyn Store, task: &(String, i64), now: Millis, kind: FinishKind) {
    let started = store
        .start(start_params(std::slice::from_ref(task), now, 5_000))
        .await
        .unwrap();
    assert_eq!(started.len(), 1, "{} begins", task.0);
    let finish = Finish {
        id: task.0.clone(),
        lease_token: started[0].lease_token,
        kind,
    };
    assert_eq!(store.finish(&[finish], now).await.unwrap(), [true]);
}

/// Submission order wins over due time and priority; only a key's first unfinished task
/// is taken; a retry waiting for its time holds the key; the next goes once the first
/// succeeded.
async fn an_ordered_key_begins_in_submission_order_and_a_retry_keeps_its_place(store: &dyn Store) {
    let a1 = submit(store, "a", 0, 0).await;
    // Submitted after a1 but due before it: it still waits for a1.
    let a2 = submit(store, "a", -1_000, 1).await;
    let a3 = submit(store, "a", 0, 2).await;
    let b1 = submit(store, "b", 0, 3).await;
    let first = claim(store, at(10), true).await;
    let mut expected = vec![a1.as_str(), b1.as_str()];
    expected.sort();
    assert_eq!(ids(&first), expected, "each key's first submitted");
    assert!(
        claim(store, at(10), true).await.is_empty(),
        "a1 and b1 are claimed: their keys wait"
    );
    let a1_claim = first.iter().find(|(id, _)| *id == a1).unwrap().clone();
    attempt(
        store,
        &a1_claim,
        at(20),
        FinishKind::Retry {
            at: at(5_000),
            error: "500".into(),
        },
    )
    .await;
    assert!(
        claim(store, at(30), true).await.is_empty(),
        "a1 waits for its retry and a2, a3 wait behind it"
    );
    let retried = claim(store, at(5_000), true).await;
    assert_eq!(ids(&retried), [a1.as_str()], "a1's retry, before a2");
    attempt(
        store,
        &retried[0],
        at(5_010),
        FinishKind::Succeeded { result: None },
    )
    .await;
    let next = claim(store, at(5_020), true).await;
    assert_eq!(ids(&next), [a2.as_str()], "a2 once a1 succeeded");
    attempt(
        store,
        &next[0],
        at(5_030),
        FinishKind::Succeeded { result: None },
    )
    .await;
    assert_eq!(ids(&claim(store, at(5_040), true).await), [a3.as_str()]);
}

/// A dead task holds its key until it is redriven (it then goes first) with `onDead:
/// block`, and not at all with `continue`.
async fn a_dead_task_holds_its_key_only_when_it_blocks(store: &dyn Store) {
    let a1 = submit(store, "a", 0, 0).await;
    let a2 = submit(store, "a", 0, 1).await;
    let b1 = submit(store, "b", 0, 2).await;
    let b2 = submit(store, "b", 0, 3).await;
    let first = claim(store, at(10), true).await;
    for task in &first {
        attempt(
            store,
            task,
            at(20),
            FinishKind::Dead {
                error: "gave up".into(),
            },
        )
        .await;
    }
    let mut both_first = vec![a1.clone(), b1.clone()];
    both_first.sort();
    assert_eq!(ids(&first), both_first);
    assert!(
        claim(store, at(30), true).await.is_empty(),
        "a1 and b1 are dead: with block, a2 and b2 wait"
    );
    assert!(matches!(
        store.redrive(&a1, at(40)).await.unwrap(),
        RedriveOutcome::Redriven { .. }
    ));
    assert_eq!(
        ids(&claim(store, at(50), true).await),
        [a1.as_str()],
        "the redriven a1 goes first, before a2; b still waits"
    );
    assert_eq!(
        ids(&claim(store, at(60), false).await),
        [b2.as_str()],
        "with continue, b1's death holds nothing (a1 is claimed)"
    );
    let _ = a2;
}

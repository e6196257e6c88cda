//! Key windows (`NewTask::window`): a trailing debounce keeps one waiting task per key
//! with the latest payload, moved until its cap; a leading debounce and a throttle hold
//! submits back; and concurrent submits of one key — from several stores, as several
//! API replicas are — end with exactly one task holding the last payload.

use std::sync::Arc;
use std::time::Duration;

use asyncd_store::{
    self as store, InsertOutcome, KeyWindow, Millis, NewTask, SearchParams, Store, TaskState,
    WindowRule,
};

use crate::server::Server;
use crate::{T0, at, claim_all, start_params, state};

scenarios!(
    a_trailing_debounce_keeps_one_task_with_the_latest_payload_until_its_cap,
    a_leading_debounce_and_a_throttle_hold_submits_back,
);

const S: Duration = Duration::from_secs(1);

fn windowed(key: &str, rule: WindowRule, payload: &str) -> NewTask {
    let mut task = NewTask::test("w", T0).payload(payload);
    task.window = Some(KeyWindow {
        key: key.into(),
        rule,
        refuse_held: false,
    });
    task
}

async fn submit(store: &dyn Store, task: NewTask, now: Millis) -> InsertOutcome {
    store.insert(&[task], now).await.unwrap().remove(0)
}

fn trailing() -> WindowRule {
    WindowRule::Trailing {
        period: 10 * S,
        max_delay: 25 * S,
    }
}

async fn a_trailing_debounce_keeps_one_task_with_the_latest_payload_until_its_cap(
    store: &dyn Store,
) {
    let first = submit(store, windowed("u:1", trailing(), r#"{"n":1}"#), T0).await;
    let InsertOutcome::Inserted { id, trigger_at } = first else {
        panic!("{first:?}");
    };
    assert_eq!(trigger_at, at(10_000), "due a period after the submit");
    let mut expected = Vec::new();
    for (n, (at_ms, due_ms)) in [(5_000, 15_000), (12_000, 22_000), (30_000, 25_000)]
        .into_iter()
        .enumerate()
    {
        let payload = format!(r#"{{"n":{}}}"#, n + 2);
        let outcome = submit(store, windowed("u:1", trailing(), &payload), at(at_ms)).await;
        expected.push(InsertOutcome::Debounced {
            id: id.clone(),
            trigger_at: at(due_ms),
        });
        assert_eq!(&outcome, expected.last().unwrap(), "submit at {at_ms} ms");
    }
    let task = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (task.payload.get(), task.trigger_at, task.state),
        (r#"{"n":4}"#, at(25_000), TaskState::Pending),
        "the latest payload, due at the cap 25 s after the first submit"
    );
    let other = submit(store, windowed("u:2", trailing(), "{}"), at(30_000)).await;
    let InsertOutcome::Inserted { id: other, .. } = other else {
        panic!("another key is another task: {other:?}");
    };
    assert_ne!(other, id);

    // Claimed: a submit gives the claim up (the claimer's start begins nothing) ...
    let claimed = claim_all(store, at(25_000), at(30_000)).await;
    let claim = claimed.iter().find(|c| c.id == id).unwrap();
    let old = [(id.clone(), claim.lease_token)];
    let folded = submit(store, windowed("u:1", trailing(), r#"{"n":5}"#), at(31_000)).await;
    assert!(
        matches!(folded, InsertOutcome::Debounced { .. }),
        "{folded:?}"
    );
    assert_eq!(state(store, &id).await, TaskState::Pending);
    assert!(
        store
            .start(start_params(&old, at(31_000), 0))
            .await
            .unwrap()
            .is_empty()
    );
    // ... but once it began, the next submit starts a new burst with a new task.
    let claimed = claim_all(store, at(25_000), at(31_000)).await;
    let claim = claimed.iter().find(|c| c.id == id).unwrap();
    let begun = store
        .start(start_params(
            &[(id.clone(), claim.lease_token)],
            at(31_000),
            0,
        ))
        .await
        .unwrap();
    assert_eq!(begun.len(), 1);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().payload.get(),
        r#"{"n":5}"#
    );
    let next = submit(store, windowed("u:1", trailing(), r#"{"n":6}"#), at(32_000)).await;
    let InsertOutcome::Inserted {
        id: next,
        trigger_at,
    } = next
    else {
        panic!("{next:?}");
    };
    assert_ne!(next, id);
    assert_eq!(trigger_at, at(42_000));

    // Windows closed a while ago whose task no longer waits are purged; the window of
    // a waiting task is kept (a trailing debounce still folds submits into it).
    assert_eq!(store.purge_key_windows(at(200_000), 10).await.unwrap(), 0);
    store.cancel(&other, at(33_000)).await.unwrap();
    assert_eq!(
        store.purge_key_windows(at(55_000), 10).await.unwrap(),
        0,
        "still open"
    );
    assert_eq!(store.purge_key_windows(at(200_000), 10).await.unwrap(), 1);
    let again = submit(store, windowed("u:1", trailing(), r#"{"n":7}"#), at(33_000)).await;
    assert!(
        matches!(&again, InsertOutcome::Debounced { id: got, .. } if *got == next),
        "{again:?}"
    );
}

async fn a_leading_debounce_and_a_throttle_hold_submits_back(store: &dyn Store) {
    let leading = WindowRule::Leading { period: 10 * S };
    let first = submit(store, windowed("k", leading, "1"), T0).await;
    let InsertOutcome::Inserted { id, trigger_at } = first else {
        panic!("{first:?}");
    };
    assert_eq!(trigger_at, T0, "runs as submitted");
    assert_eq!(
        submit(store, windowed("k", leading, "2"), at(5_000)).await,
        InsertOutcome::Held {
            id: id.clone(),
            until: at(15_000),
            refuse: false
        }
    );
    assert_eq!(
        submit(store, windowed("k", leading, "3"), at(14_000)).await,
        InsertOutcome::Held {
            id: id.clone(),
            until: at(24_000),
            refuse: false
        },
        "each held submit extends the quiet"
    );
    let after_quiet = submit(store, windowed("k", leading, "4"), at(24_000)).await;
    assert!(matches!(after_quiet, InsertOutcome::Inserted { .. }));

    let throttle = WindowRule::Throttle { period: 10 * S };
    let refusing = |payload: &str| {
        let mut task = windowed("k", throttle, payload);
        task.window.as_mut().unwrap().refuse_held = true;
        task
    };
    let first = submit(store, refusing("1"), T0).await;
    let InsertOutcome::Inserted { id, .. } = first else {
        panic!("{first:?}");
    };
    assert_eq!(
        submit(store, refusing("2"), at(9_999)).await,
        InsertOutcome::Held {
            id,
            until: at(10_000),
            refuse: true
        },
        "a throttle's window does not move"
    );
    assert!(matches!(
        submit(store, refusing("3"), at(10_000)).await,
        InsertOutcome::Inserted { .. }
    ));
    let stored = store
        .search(SearchParams {
            task_type: Some("w"),
            limit: 100,
            ..SearchParams::default()
        })
        .await
        .unwrap();
    assert_eq!(stored.len(), 4, "two of each: nothing held back was stored");
}

/// Each of `WRITERS` submits `EACH` times to one key at once; then one more submit.
const WRITERS: usize = 6;
const EACH: usize = 20;

/// The key's first task, begun: the next submits find the window naming a task they
/// cannot fold into, so each would open a new one but for the window's lock.
async fn begin_the_keys_first_task(store: &dyn Store) -> String {
    let first = submit(store, windowed("hot", trailing(), r#""first""#), T0).await;
    let InsertOutcome::Inserted { id, .. } = first else {
        panic!("{first:?}");
    };
    let claim = claim_all(store, at(60_000), T0).await;
    let began = store
        .start(start_params(&[(id.clone(), claim[0].lease_token)], T0, 0))
        .await
        .unwrap();
    assert_eq!(began.len(), 1);
    id
}

/// `EACH` rounds in which every store submits to the key at once, the first round onto
/// a window whose task has begun.
async fn submit_concurrently(stores: &[Arc<dyn Store>]) -> Vec<InsertOutcome> {
    for store in stores {
        // Connected before the first round, so its submits race.
        store.ping().await.unwrap();
    }
    let mut outcomes = Vec::new();
    for n in 0..EACH {
        let round = stores.iter().enumerate().map(|(w, store)| {
            let task = windowed("hot", trailing(), &format!(r#"{{"w":{w},"n":{n}}}"#));
            async move { submit(store.as_ref(), task, T0).await }
        });
        outcomes.extend(futures::future::join_all(round).await);
    }
    outcomes
}

async fn check_one_task_with_the_last_payload(
    store: &dyn Store,
    begun: &str,
    outcomes: Vec<InsertOutcome>,
) {
    let inserted: Vec<&InsertOutcome> = outcomes
        .iter()
        .filter(|o| matches!(o, InsertOutcome::Inserted { .. }))
        .collect();
    assert_eq!(inserted.len(), 1, "one task for the key: {inserted:?}");
    let InsertOutcome::Inserted { id, .. } = inserted[0] else {
        unreachable!()
    };
    assert!(
        outcomes.iter().all(|o| match o {
            InsertOutcome::Inserted { id: got, .. } | InsertOutcome::Debounced { id: got, .. } =>
                got == id,
            _ => false,
        }),
        "every submit landed in it: {outcomes:?}"
    );
    let last = submit(store, windowed("hot", trailing(), r#""last""#), at(1)).await;
    assert!(
        matches!(&last, InsertOutcome::Debounced { id: got, .. } if got == id),
        "{last:?}"
    );
    let tasks = store
        .search(SearchParams {
            task_type: Some("w"),
            limit: 1000,
            ..SearchParams::default()
        })
        .await
        .unwrap();
    let mut ids: Vec<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
    ids.sort();
    let mut expected = vec![begun, id.as_str()];
    expected.sort();
    assert_eq!(ids, expected, "the begun task and exactly one new one");
    let waiting = tasks.iter().find(|t| t.id == *id).unwrap();
    assert_eq!(waiting.payload.get(), r#""last""#);
}

/// On SQLite, one store (its one writer) shared by the concurrent submitters.
#[tokio::test]
async fn sqlite_submitters_of_one_key_end_in_one_task_with_the_last_payload() {
    crate::on_sqlite(concurrent_submits_on_one_store).await;
}

async fn concurrent_submits_on_one_store(store: &dyn Store) {
    let begun = begin_the_keys_first_task(store).await;
    let writers = (0..WRITERS).map(|w| async move {
        let mut outcomes = Vec::new();
        for n in 0..EACH {
            let task = windowed("hot", trailing(), &format!(r#"{{"w":{w},"n":{n}}}"#));
            outcomes.push(submit(store, task, T0).await);
        }
        outcomes
    });
    let outcomes = futures::future::join_all(writers)
        .await
        .into_iter()
        .flatten()
        .collect();
    check_one_task_with_the_last_payload(store, &begun, outcomes).await;
}

/// Each submitter with a store (and pool) of its own, as API replicas have.
async fn replicas_submitting_one_key_end_in_one_task_with_the_last_payload(server: &Server) {
    let url = server.create_db().await;
    let setup = store::open(&url).await.unwrap();
    setup.migrate().await.unwrap();
    let mut stores: Vec<Arc<dyn Store>> = Vec::new();
    for _ in 0..WRITERS {
        stores.push(store::open(&url).await.unwrap());
    }
    let begun = begin_the_keys_first_task(setup.as_ref()).await;
    let outcomes = submit_concurrently(&stores).await;
    check_one_task_with_the_last_payload(setup.as_ref(), &begun, outcomes).await;
    drop(setup);
    server.drop_created().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_replicas_submitting_one_key_end_in_one_task_with_the_last_payload() {
    let Some(server) = Server::mariadb() else {
        return;
    };
    replicas_submitting_one_key_end_in_one_task_with_the_last_payload(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_replicas_submitting_one_key_end_in_one_task_with_the_last_payload() {
    let Some(server) = Server::postgres() else {
        return;
    };
    replicas_submitting_one_key_end_in_one_task_with_the_last_payload(&server).await;
}

//! Tasks that expire (`NewTask::expires_at`): no start begins one at or past its expiry,
//! whether it is claimed or taken straight from pending, and `Store::expire` ends it
//! `expired` — freeing its unique key and failing what waits on it — whether it was
//! blocked, pending or claimed. A task that began is never expired.

use std::time::Duration;

use asyncd_store::{
    CancelOutcome, ChangeOutcome, ExpiredTask, Finish, FinishKind, InsertOutcome, JobGate, NewTask,
    PurgeParams, SearchParams, StartDueParams, Store, TaskChange, TaskState,
};

use crate::{T0, at, claim_all, insert, start_params, state};

scenarios!(
    a_task_not_begun_by_its_expiry_never_begins_and_ends_expired,
    a_start_straight_from_pending_passes_over_expired_tasks,
);

fn expiring(task_type: &str, due_ms: i64, expires_ms: i64) -> NewTask {
    NewTask::test(task_type, at(due_ms)).expires_at(at(expires_ms))
}

async fn a_task_not_begun_by_its_expiry_never_begins_and_ends_expired(store: &dyn Store) {
    let mut keyed = expiring("a", 10, 100);
    keyed.unique_key = Some("code:1".into());
    let claimed = insert(store, keyed).await;
    let lasting = insert(store, NewTask::test("a", at(10))).await;
    let begun = insert(store, expiring("a", 10, 100)).await;
    let mut waiting = NewTask::test("a", at(10));
    waiting.depends_on = vec![claimed.clone()];
    let waiting = insert(store, waiting).await;
    let tokens: std::collections::HashMap<String, i64> = claim_all(store, at(200), at(50))
        .await
        .into_iter()
        .map(|task| {
            let expected = if task.id == lasting {
                None
            } else {
                Some(at(100))
            };
            assert_eq!(task.expires_at, expected, "a claim carries its expiry");
            (task.id, task.lease_token)
        })
        .collect();
    assert_eq!(tokens.len(), 3);
    let claim = |id: &String| (id.clone(), tokens[id]);

    // Begun before its expiry: an attempt that began is never expired.
    let started = store
        .start(start_params(&[claim(&begun)], at(99), 0))
        .await
        .unwrap();
    assert_eq!(started.len(), 1);
    // At its expiry it no longer begins; a task without one does.
    let started = store
        .start(start_params(
            &[claim(&claimed), claim(&lasting)],
            at(100),
            0,
        ))
        .await
        .unwrap();
    let ids: Vec<&str> = started.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, [lasting.as_str()]);
    assert_eq!(state(store, &claimed).await, TaskState::Claimed);

    // A blocked and a pending task expire as a claimed one does.
    let mut blocked = expiring("b", 10, 150);
    blocked.depends_on = vec![lasting.clone()];
    let blocked = insert(store, blocked).await;
    let pending = insert(store, expiring("b", 500, 600)).await;

    assert!(
        store.expire(at(99), 100).await.unwrap().is_empty(),
        "nothing expires before its time"
    );
    let expired = store.expire(at(150), 100).await.unwrap();
    assert_eq!(
        expired,
        [
            ExpiredTask {
                id: claimed.clone(),
                task_type: "a".into()
            },
            ExpiredTask {
                id: blocked.clone(),
                task_type: "b".into()
            },
        ],
        "earliest expiry first; the running one is left alone"
    );
    assert!(store.expire(at(150), 100).await.unwrap().is_empty());
    let record = store.get(&claimed).await.unwrap().unwrap();
    assert_eq!(record.state, TaskState::Expired);
    assert_eq!(record.expires_at, Some(at(100)));
    assert!(record.last_error.unwrap().contains("expired"));
    assert_eq!(state(store, &begun).await, TaskState::Running);
    assert_eq!(state(store, &pending).await, TaskState::Pending);
    assert_eq!(
        state(store, &waiting).await,
        TaskState::Dead,
        "what waits on an expired task fails, as on a dead one"
    );
    assert!(
        store
            .start(start_params(&[claim(&claimed)], at(100), 0))
            .await
            .unwrap()
            .is_empty(),
        "the expired task's old claim begins nothing"
    );
    assert_eq!(
        store
            .change(&claimed, TaskChange::default(), T0)
            .await
            .unwrap(),
        ChangeOutcome::NotChangeable(TaskState::Expired)
    );
    assert_eq!(
        store.cancel(&claimed, T0).await.unwrap(),
        CancelOutcome::NotCancellable(TaskState::Expired)
    );
    let mut again = NewTask::test("a", at(200));
    again.unique_key = Some("code:1".into());
    assert!(
        matches!(
            store.insert(&[again], at(200)).await.unwrap()[0],
            InsertOutcome::Inserted { .. }
        ),
        "an expired task frees its unique key"
    );
    let mut dependent = NewTask::test("a", at(200));
    dependent.depends_on = vec![claimed.clone()];
    let stored = store.insert(&[dependent], at(200)).await.unwrap();
    let InsertOutcome::Inserted { id, .. } = &stored[0] else {
        panic!("{stored:?}");
    };
    assert_eq!(
        state(store, id).await,
        TaskState::Dead,
        "a task submitted to wait on an expired one fails at once"
    );

    let pending_expired = store.expire(at(600), 100).await.unwrap();
    assert_eq!(pending_expired.len(), 1);
    assert_eq!(pending_expired[0].id, pending);

    let found = store
        .search(SearchParams {
            state: Some(TaskState::Expired),
            limit: 10,
            ..SearchParams::default()
        })
        .await
        .unwrap();
    let mut found: Vec<String> = found.into_iter().map(|t| t.id).collect();
    found.sort();
    let mut expected = vec![claimed.clone(), blocked, pending];
    expected.sort();
    assert_eq!(found, expected, "expired tasks are found by their state");

    let purged = store
        .purge(PurgeParams {
            task_type: "a",
            state: TaskState::Expired,
            finished_before: at(1_000),
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(purged, 1, "expired tasks are purged past their retention");
    assert!(store.get(&claimed).await.unwrap().is_none());

    // The attempt that began before its expiry ends as any other.
    let done = Finish {
        id: begun.clone(),
        lease_token: started_token(store, &begun).await,
        kind: FinishKind::Succeeded { result: None },
    };
    assert_eq!(store.finish(&[done], at(700)).await.unwrap(), [true]);
}

async fn started_token(store: &dyn Store, id: &str) -> i64 {
    store.get(id).await.unwrap().unwrap().lease_token
}

async fn a_start_straight_from_pending_passes_over_expired_tasks(store: &dyn Store) {
    let stale = insert(store, expiring("due", 0, 50)).await;
    let fresh = insert(store, expiring("due", 1, 500)).await;
    let gate = JobGate {
        task_type: "due",
        concurrency: 10,
        rate: None,
        key_limit: None,
        key_rate: None,
        keys: &[],
        limiters: &[],
    };
    let params = StartDueParams {
        now: at(50),
        owner: "a",
        grace: Duration::from_secs(5),
        limit: 10,
        probe: false,
    };
    let due = store.start_due(params, gate).await.unwrap();
    let ids: Vec<&str> = due.tasks.iter().map(|(t, _)| t.id.as_str()).collect();
    assert_eq!(ids, [fresh.as_str()], "the expired one is passed over");
    assert_eq!(state(store, &stale).await, TaskState::Pending);
    let expired = store.expire(at(50), 10).await.unwrap();
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].id, stale);
    assert_eq!(state(store, &fresh).await, TaskState::Running);
}

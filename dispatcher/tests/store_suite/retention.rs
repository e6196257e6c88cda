//! Retention: finished tasks purged after their job's retention.

use asyncd_store::{
    CancelOutcome, Finish, FinishKind, Millis, NewTask, PurgeParams, Store, TaskState,
};

use crate::{at, claim_all, insert, start_params, state};

scenarios!(finished_tasks_are_purged_after_their_retention,);

/// Issue 15, retention: finished tasks older than the cutoff go, oldest first and at most
/// `limit` per call, one job and one state at a time, with their dependency edges; a
/// finished task a blocked task still waits on stays; the idempotency key of a purged
/// task is free again.
async fn finished_tasks_are_purged_after_their_retention(store: &dyn Store) {
    // Runs the one due task `id` at `when` to the outcome `kind`.
    async fn finish_at(store: &dyn Store, id: &str, when: Millis, kind: FinishKind) {
        let claimed = claim_all(store, when, when).await;
        assert_eq!(claimed.len(), 1, "only {id} is due at {when:?}");
        let attempt = store
            .start(start_params(
                &[(id.to_string(), claimed[0].lease_token)],
                when,
                0,
            ))
            .await
            .unwrap()
            .remove(0);
        let finish = Finish {
            id: id.to_string(),
            lease_token: attempt.lease_token,
            kind,
        };
        assert_eq!(store.finish(&[finish], when).await.unwrap(), [true]);
    }
    let succeeded = || FinishKind::Succeeded { result: None };
    let purge = |task_type: &'static str, state: TaskState, before: i64, limit: u32| async move {
        store
            .purge(PurgeParams {
                task_type,
                state,
                finished_before: at(before),
                limit,
            })
            .await
            .unwrap()
    };
    let exists = |id: String| async move { store.get(&id).await.unwrap().is_some() };

    let far = at(10_000_000);
    let other = insert(store, NewTask::test("a", far)).await;
    let parent = insert(store, NewTask::test("a", at(5))).await;
    let mut child = NewTask::test("a", at(5));
    child.depends_on = vec![parent.clone(), other.clone()];
    let child = insert(store, child).await;
    finish_at(store, &parent, at(5), succeeded()).await;
    assert_eq!(
        state(store, &child).await,
        TaskState::Blocked,
        "still waits on {other}"
    );

    let mut keyed = NewTask::test("a", at(10));
    keyed.idempotency_key = Some("purge-key".into());
    let s1 = insert(store, keyed).await;
    finish_at(store, &s1, at(10), succeeded()).await;
    let s2 = insert(store, NewTask::test("a", at(20))).await;
    finish_at(store, &s2, at(20), succeeded()).await;
    let s3 = insert(store, NewTask::test("a", at(30))).await;
    finish_at(store, &s3, at(30), succeeded()).await;
    let d1 = insert(store, NewTask::test("a", at(40))).await;
    finish_at(
        store,
        &d1,
        at(40),
        FinishKind::Dead {
            error: "gone".into(),
        },
    )
    .await;
    let b1 = insert(store, NewTask::test("b", at(50))).await;
    finish_at(store, &b1, at(50), succeeded()).await;
    let c1 = insert(store, NewTask::test("a", far)).await;
    assert_eq!(
        store.cancel(&c1, at(60)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    // In flight, last changed long before every cutoff below: one claimed (at 1), one
    // running (claimed at 1, started at 2). Neither is finished, so no purge may take it.
    let claimed = insert(store, NewTask::test("a", at(1))).await;
    let running = insert(store, NewTask::test("a", at(1))).await;
    let claims = claim_all(store, at(1), at(1)).await;
    assert_eq!(claims.len(), 2, "only the two in flight are due at 1");
    let token = claims.iter().find(|c| c.id == running).unwrap().lease_token;
    let started = store
        .start(start_params(&[(running.clone(), token)], at(2), 0))
        .await
        .unwrap();
    assert_eq!(started.len(), 1);
    let in_flight = [
        (claimed.clone(), TaskState::Claimed),
        (running.clone(), TaskState::Running),
    ];
    for (id, want) in &in_flight {
        let task = store.get(id).await.unwrap().unwrap();
        assert_eq!(task.state, *want, "{id}");
        assert!(
            task.updated_at < at(25),
            "{id} last changed before every cutoff"
        );
    }

    assert_eq!(
        purge("a", TaskState::Succeeded, 25, 1).await,
        1,
        "one per limit"
    );
    assert!(!exists(s1.clone()).await, "the oldest goes first");
    assert!(exists(s2.clone()).await);
    assert_eq!(
        purge("a", TaskState::Succeeded, 25, 10).await,
        1,
        "{s2} only: {parent} has a blocked dependent, {s3} finished after the cutoff"
    );
    assert!(exists(parent.clone()).await && exists(s3.clone()).await);
    assert_eq!(purge("a", TaskState::Succeeded, 1_000, 10).await, 1);
    assert!(!exists(s3).await);
    assert_eq!(purge("a", TaskState::Dead, 1_000, 10).await, 1);
    assert!(!exists(d1).await);
    assert_eq!(purge("a", TaskState::Cancelled, 1_000, 10).await, 1);
    assert!(!exists(c1).await);
    assert_eq!(purge("a", TaskState::Cancelled, 1_000, 10).await, 0);
    assert!(exists(b1).await, "another job's tasks are not this purge's");
    // Every finished state, with a cutoff past everything: the two in flight stay, as
    // they were.
    for finished in [TaskState::Succeeded, TaskState::Dead, TaskState::Cancelled] {
        purge("a", finished, 10_000_000, 1_000).await;
    }
    for (id, want) in &in_flight {
        let task = store.get(id).await.unwrap();
        assert_eq!(
            task.map(|t| t.state),
            Some(*want),
            "{id}, in flight since long before the cutoff, is not purged"
        );
    }
    assert_eq!(state(store, &other).await, TaskState::Pending);
    assert_eq!(
        store.get(&child).await.unwrap().unwrap().depends_on.len(),
        2,
        "the blocked child keeps its edges"
    );

    let mut again = NewTask::test("a", far);
    again.idempotency_key = Some("purge-key".into());
    let again = insert(store, again).await;
    assert_ne!(again, s1, "the purged task's key is free");
}

//! Dependencies between tasks: released and failed as their dependencies finish, a
//! workflow stored whole, a redriven dependent waiting again.

use asyncd_store::{
    self as store, BulkAction, DeadFilter, Finish, FinishKind, InsertOutcome, Millis, NewTask,
    RedriveOutcome, Store, TaskState, WorkflowOutcome,
};

use crate::{Server, T0, at, claim_all, insert, start_params, state};

scenarios!(
    dependencies_release_and_fail,
    a_workflow_is_stored_whole_or_not_at_all,
    a_redriven_task_waits_again_on_its_dead_dependency,
);

async fn dependencies_release_and_fail(store: &dyn Store) {
    let parent = insert(store, NewTask::test("a", T0)).await;
    let mut child = NewTask::test("a", T0);
    child.depends_on = vec![parent.clone()];
    let child = insert(store, child).await;
    let mut orphan = NewTask::test("a", T0);
    orphan.depends_on = vec!["01900000-0000-7000-8000-000000000000".into()];
    assert!(matches!(
        store.insert(&[orphan], T0).await.unwrap()[0],
        InsertOutcome::UnknownDependency { .. }
    ));
    assert_eq!(state(store, &child).await, TaskState::Blocked);
    let claimed = claim_all(store, T0, T0).await;
    assert_eq!(claimed.len(), 1, "the blocked child is not claimable");
    let started = store
        .start(start_params(
            &[(parent.clone(), claimed[0].lease_token)],
            T0,
            0,
        ))
        .await
        .unwrap()
        .remove(0);
    let done = Finish {
        id: parent.clone(),
        lease_token: started.lease_token,
        kind: FinishKind::Succeeded { result: None },
    };
    store.finish(&[done], at(5)).await.unwrap();
    assert_eq!(state(store, &child).await, TaskState::Pending);
    assert_eq!(
        store.get(&child).await.unwrap().unwrap().depends_on,
        [parent]
    );

    let doomed = insert(store, NewTask::test("a", at(1_000_000))).await;
    let mut grandchild_parent = NewTask::test("a", T0);
    grandchild_parent.depends_on = vec![doomed.clone()];
    let middle = insert(store, grandchild_parent).await;
    let mut last = NewTask::test("a", T0);
    last.depends_on = vec![middle.clone()];
    let last = insert(store, last).await;
    store.cancel(&doomed, T0).await.unwrap();
    assert_eq!(state(store, &middle).await, TaskState::Dead);
    assert_eq!(
        state(store, &last).await,
        TaskState::Dead,
        "failure cascades"
    );
}

/// Issue 15, workflows in one call: stored parents first in one transaction; a child's
/// dependency on a parent that turns out to be a repeat is the first task's id; and one
/// refused task leaves nothing of the workflow behind.
async fn a_workflow_is_stored_whole_or_not_at_all(store: &dyn Store) {
    let mut parent = NewTask::test("a", T0);
    parent.idempotency_key = Some("wf-parent".into());
    let mut child = NewTask::test("a", T0);
    child.depends_on = vec![parent.id.clone()];
    let (parent_id, child_id) = (parent.id.clone(), child.id.clone());
    match store.insert_workflow(&[parent, child], T0).await.unwrap() {
        WorkflowOutcome::Stored(outcomes) => assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, InsertOutcome::Inserted { .. })),
            "{outcomes:?}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(state(store, &child_id).await, TaskState::Blocked);

    // The same workflow again with fresh ids: the parent is a repeat of its key.
    let mut again = NewTask::test("a", T0);
    again.idempotency_key = Some("wf-parent".into());
    let mut second_child = NewTask::test("a", T0);
    second_child.depends_on = vec![again.id.clone()];
    let second_child_id = second_child.id.clone();
    match store
        .insert_workflow(&[again, second_child], T0)
        .await
        .unwrap()
    {
        WorkflowOutcome::Stored(outcomes) => {
            assert!(
                matches!(&outcomes[0], InsertOutcome::Duplicate { id, .. } if *id == parent_id),
                "{outcomes:?}"
            );
            assert!(matches!(outcomes[1], InsertOutcome::Inserted { .. }));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        store
            .get(&second_child_id)
            .await
            .unwrap()
            .unwrap()
            .depends_on,
        [parent_id],
        "waits on the first task, not on the repeat's unused id"
    );

    let mut holder = NewTask::test("a", at(1_000_000));
    holder.unique_key = Some("wf-key".into());
    insert(store, holder).await;
    let first = NewTask::test("a", T0);
    let first_id = first.id.clone();
    let mut clash = NewTask::test("a", T0);
    clash.unique_key = Some("wf-key".into());
    clash.depends_on = vec![first_id.clone()];
    match store.insert_workflow(&[first, clash], T0).await.unwrap() {
        WorkflowOutcome::Refused { index, outcome } => {
            assert_eq!(index, 1);
            assert!(
                matches!(outcome, InsertOutcome::UniqueConflict { .. }),
                "{outcome:?}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(
        store.get(&first_id).await.unwrap().is_none(),
        "nothing of a refused workflow is stored"
    );
}

/// Issue 15: a task that died because its dependency died waits on it again when
/// redriven — alone or in bulk — and runs once the dependency, redriven too, succeeds.
async fn a_redriven_task_waits_again_on_its_dead_dependency(store: &dyn Store) {
    // Runs the one due task `id` at `when` to the outcome `kind`.
    async fn run(store: &dyn Store, id: &str, when: Millis, kind: FinishKind) {
        let claimed = claim_all(store, when, when).await;
        assert_eq!(claimed.len(), 1, "only {id} is due at {when:?}");
        assert_eq!(claimed[0].id, id);
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
    let dead = || FinishKind::Dead {
        error: "boom".into(),
    };
    for bulk in [false, true] {
        let base = if bulk { 100_000 } else { 0 };
        let parent = insert(store, NewTask::test("a", at(base + 10))).await;
        let mut child = NewTask::test("a", at(base + 10));
        child.depends_on = vec![parent.clone()];
        let child = insert(store, child).await;
        run(store, &parent, at(base + 10), dead()).await;
        assert_eq!(
            state(store, &child).await,
            TaskState::Dead,
            "died with its parent"
        );

        let now = at(base + 20);
        if bulk {
            let filter = DeadFilter {
                task_type: "a",
                error_prefix: None,
                dead_after: Some(at(base)),
                dead_before: now,
                action: BulkAction::Redrive,
            };
            assert_eq!(store.act_on_dead(filter, 10, now).await.unwrap(), 2);
        } else {
            assert_eq!(
                store.redrive(&child, now).await.unwrap(),
                RedriveOutcome::Redriven {
                    trigger_at: now,
                    state: TaskState::Blocked
                },
                "its parent is dead: it waits on it again"
            );
            assert_eq!(
                store.redrive(&parent, now).await.unwrap(),
                RedriveOutcome::Redriven {
                    trigger_at: now,
                    state: TaskState::Pending
                }
            );
        }
        assert_eq!(
            state(store, &child).await,
            TaskState::Blocked,
            "bulk: {bulk}"
        );
        assert_eq!(
            state(store, &parent).await,
            TaskState::Pending,
            "bulk: {bulk}"
        );
        run(store, &parent, now, FinishKind::Succeeded { result: None }).await;
        assert_eq!(
            state(store, &child).await,
            TaskState::Pending,
            "bulk: {bulk}"
        );
        run(
            store,
            &child,
            at(base + 30),
            FinishKind::Succeeded { result: None },
        )
        .await;
    }
}

/// A task waiting on two dependencies that succeed at the same moment, in two
/// dispatchers, is released: neither finisher may decide "the other one is still
/// running" on a view from before the other committed.
async fn concurrent_finishes_release_their_dependent(server: &Server) {
    const PAIRS: usize = 40;
    let url = server.create_db().await;
    let setup = store::open(&url).await.unwrap();
    setup.migrate().await.unwrap();
    let (one, two) = (
        store::open(&url).await.unwrap(),
        store::open(&url).await.unwrap(),
    );
    let mut pairs = Vec::new();
    for _ in 0..PAIRS {
        let a = insert(setup.as_ref(), NewTask::test("p", T0)).await;
        let b = insert(setup.as_ref(), NewTask::test("p", T0)).await;
        let mut child = NewTask::test("c", T0);
        child.depends_on = vec![a.clone(), b.clone()];
        let child = insert(setup.as_ref(), child).await;
        pairs.push((a, b, child));
    }
    let claims: Vec<(String, i64)> = claim_all(setup.as_ref(), T0, T0)
        .await
        .into_iter()
        .map(|c| (c.id, c.lease_token))
        .collect();
    assert_eq!(claims.len(), 2 * PAIRS, "only the parents are claimable");
    let tokens: std::collections::HashMap<String, i64> = setup
        .start(start_params(&claims, T0, 60_000))
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.id, s.lease_token))
        .collect();
    let succeed = |id: &String| {
        vec![Finish {
            id: id.clone(),
            lease_token: tokens[id],
            kind: FinishKind::Succeeded { result: None },
        }]
    };
    for (a, b, _) in &pairs {
        let (fa, fb) = (succeed(a), succeed(b));
        let (ra, rb) = tokio::join!(one.finish(&fa, at(1)), two.finish(&fb, at(1)));
        assert_eq!((ra.unwrap(), rb.unwrap()), (vec![true], vec![true]));
    }
    for (_, _, child) in &pairs {
        assert_eq!(
            state(setup.as_ref(), child).await,
            TaskState::Pending,
            "{child} stayed blocked after both its dependencies succeeded"
        );
    }
    drop((setup, one, two));
    server.drop_created().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_concurrent_finishes_release_their_dependent() {
    let Some(server) = Server::mariadb() else {
        return;
    };
    concurrent_finishes_release_their_dependent(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_concurrent_finishes_release_their_dependent() {
    let Some(server) = Server::postgres() else {
        return;
    };
    concurrent_finishes_release_their_dependent(&server).await;
}

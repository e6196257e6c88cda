//! The jobs overview's counts.

use asyncd_store::{
    CancelOutcome, DueBacklog, Finish, FinishKind, JobCountParams, JobCounts, Millis, NewTask,
    Store, TaskState, TypeFilter,
};

use crate::{T0, at, claim_all, claim_params, insert, start_params, state};

scenarios!(job_counts_by_state_stop_at_their_cap,);

/// Inserts a task of `task_type` due at `when` and begins its attempt at `when`, which
/// ends then as `kind` says (`None`: it goes on running); nothing else may be due then.
/// Returns its id.
async fn run_to(
    store: &dyn Store,
    task_type: &str,
    when: Millis,
    kind: Option<FinishKind>,
) -> String {
    let id = insert(store, NewTask::test(task_type, when)).await;
    let claimed = claim_all(store, when, when).await;
    assert_eq!(claimed.len(), 1, "only {id} is due at {when:?}");
    let started = store
        .start(start_params(
            &[(id.clone(), claimed[0].lease_token)],
            when,
            0,
        ))
        .await
        .unwrap();
    assert_eq!(started.len(), 1);
    if let Some(kind) = kind {
        let finish = Finish {
            id: id.clone(),
            lease_token: started[0].lease_token,
            kind,
        };
        assert_eq!(store.finish(&[finish], when).await.unwrap(), [true]);
    }
    id
}

/// Issue 16, the jobs overview: one type's due (pending or claimed, due by now),
/// scheduled, running and dead tasks, its oldest due task and what finished since a
/// cutoff, each count stopping at the cap; other types, blocked and cancelled tasks do
/// not count. `due_backlog` reads the same due figures.
async fn job_counts_by_state_stop_at_their_cap(store: &dyn Store) {
    let dead = || {
        Some(FinishKind::Dead {
            error: "gone".into(),
        })
    };
    let succeeded = || Some(FinishKind::Succeeded { result: None });
    run_to(store, "j", at(-200_000), succeeded()).await;
    run_to(store, "j", at(-150_000), dead()).await;
    run_to(store, "j", at(-50_000), succeeded()).await;
    run_to(store, "j", at(-40_000), succeeded()).await;
    run_to(store, "j", at(-30_000), dead()).await;
    run_to(store, "k", at(-20_000), succeeded()).await;
    // Begun and not finished: running.
    run_to(store, "j", at(-10_000), None).await;

    insert(store, NewTask::test("k", at(-9_000))).await;
    let oldest = insert(store, NewTask::test("j", at(-3_000))).await;
    insert(store, NewTask::test("j", at(-2_000))).await;
    insert(store, NewTask::test("j", T0)).await;
    let scheduled = insert(store, NewTask::test("j", at(5_000))).await;
    insert(store, NewTask::test("j", at(6_000))).await;
    let only_j = TypeFilter::Only(vec!["j".into()]);
    let claimed = store
        .claim(claim_params(&only_j, T0, T0, 60_000, "me", 1))
        .await
        .unwrap();
    assert_eq!(claimed[0].id, oldest, "claimed, and still the oldest due");
    let cancelled = insert(store, NewTask::test("j", at(-1_000))).await;
    assert_eq!(
        store.cancel(&cancelled, T0).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let mut blocked = NewTask::test("j", at(-1_000));
    blocked.depends_on = vec![scheduled];
    let blocked = insert(store, blocked).await;
    assert_eq!(state(store, &blocked).await, TaskState::Blocked);

    let counts = |task_type: &'static str, cap: u32| async move {
        store
            .job_counts(JobCountParams {
                task_type,
                now: T0,
                finished_since: at(-60_000),
                cap,
            })
            .await
            .unwrap()
    };
    assert_eq!(
        counts("j", 100).await,
        JobCounts {
            due: 3,
            scheduled: 2,
            running: 1,
            dead: 2,
            oldest_due: Some(at(-3_000)),
            succeeded_since: 2,
            dead_since: 1,
        }
    );
    assert_eq!(
        counts("j", 2).await,
        JobCounts {
            due: 2,
            scheduled: 2,
            running: 1,
            dead: 2,
            oldest_due: Some(at(-3_000)),
            succeeded_since: 2,
            dead_since: 1,
        },
        "each count stops at the cap"
    );
    assert_eq!(
        counts("k", 100).await,
        JobCounts {
            due: 1,
            oldest_due: Some(at(-9_000)),
            succeeded_since: 1,
            ..JobCounts::default()
        }
    );
    assert_eq!(counts("none", 100).await, JobCounts::default());

    // The backlog gauges' frequent pass: the due figures alone, the same as above.
    let backlog = |task_type: &'static str, cap: u32| async move {
        store
            .due_backlog(JobCountParams {
                task_type,
                now: T0,
                finished_since: at(-60_000),
                cap,
            })
            .await
            .unwrap()
    };
    let oldest_due = Some(at(-3_000));
    assert_eq!(backlog("j", 100).await, DueBacklog { due: 3, oldest_due });
    assert_eq!(backlog("j", 2).await, DueBacklog { due: 2, oldest_due });
    assert_eq!(
        backlog("k", 100).await,
        DueBacklog {
            due: 1,
            oldest_due: Some(at(-9_000))
        }
    );
    assert_eq!(backlog("none", 100).await, DueBacklog::default());
}

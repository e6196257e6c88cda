//! Cron firings as the store keeps them.

use asyncd_store::{
    CancelOutcome, Finish, FinishKind, InsertOutcome, Millis, NewTask, Store, TaskState,
};

use crate::{at, claim_all, insert, start_params, state};

scenarios!(a_cron_firing_is_refused_while_the_previous_is_unfinished,);

/// Issue 15, cron `overlap: Skip` as the store keeps it (the scheduler's `firing` gives
/// every firing of such an entry one unique key, held only while unfinished): a firing
/// is refused naming the previous one while that is pending, claimed, running or waiting
/// to retry, and goes in once it succeeded, died or was cancelled. The same firing again
/// (another scheduler) is a repeat, not a skip; of several missed firings caught up in
/// one insert, only the first goes in.
async fn a_cron_firing_is_refused_while_the_previous_is_unfinished(store: &dyn Store) {
    let firing = |n: i64| {
        let mut task = NewTask::test("cron", at(n * 10_000));
        task.cron_key = Some(format!("cron/tick/{}", at(n * 10_000).as_i64()));
        task.unique_key = Some("cron:cron/tick".into());
        task
    };
    let outcome = |task: NewTask, now: Millis| async move {
        store.insert(&[task], now).await.unwrap().remove(0)
    };
    let skipped = |id: &str| InsertOutcome::UniqueConflict {
        existing_id: id.to_string(),
    };

    let first = insert(store, firing(1)).await;
    assert_eq!(
        outcome(firing(1), at(10_000)).await,
        InsertOutcome::Duplicate {
            id: first.clone(),
            trigger_at: at(10_000)
        },
        "the same firing from another scheduler"
    );
    assert_eq!(
        outcome(firing(2), at(10_000)).await,
        skipped(&first),
        "pending"
    );

    let claims = claim_all(store, at(10_000), at(10_000)).await;
    assert_eq!(claims.len(), 1);
    assert_eq!(
        outcome(firing(2), at(11_000)).await,
        skipped(&first),
        "claimed"
    );
    let attempt = store
        .start(start_params(
            &[(first.clone(), claims[0].lease_token)],
            at(11_000),
            0,
        ))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        outcome(firing(2), at(12_000)).await,
        skipped(&first),
        "running"
    );
    let retry = Finish {
        id: first.clone(),
        lease_token: attempt.lease_token,
        kind: FinishKind::Retry {
            at: at(30_000),
            error: "once more".into(),
        },
    };
    assert_eq!(store.finish(&[retry], at(13_000)).await.unwrap(), [true]);
    assert_eq!(
        outcome(firing(2), at(20_000)).await,
        skipped(&first),
        "waiting to retry"
    );
    assert_eq!(state(store, &first).await, TaskState::Pending);

    let claims = claim_all(store, at(30_000), at(30_000)).await;
    assert_eq!(
        claims.len(),
        1,
        "only {first} is due: the skipped firings never went in"
    );
    let attempt = store
        .start(start_params(
            &[(first.clone(), claims[0].lease_token)],
            at(30_000),
            0,
        ))
        .await
        .unwrap()
        .remove(0);
    let done = Finish {
        id: first.clone(),
        lease_token: attempt.lease_token,
        kind: FinishKind::Succeeded { result: None },
    };
    assert_eq!(store.finish(&[done], at(31_000)).await.unwrap(), [true]);

    // Caught up after an outage: firings 4, 5 and 6 in one insert.
    let missed = [firing(4), firing(5), firing(6)];
    let caught_up = missed[0].id.clone();
    let outcomes = store.insert(&missed, at(61_000)).await.unwrap();
    assert_eq!(
        outcomes,
        [
            InsertOutcome::Inserted {
                id: caught_up.clone(),
                trigger_at: at(40_000)
            },
            skipped(&caught_up),
            skipped(&caught_up),
        ],
        "after a success the key is free; the first missed firing takes it"
    );

    // Died: free at once.
    let claims = claim_all(store, at(61_000), at(61_000)).await;
    assert_eq!(claims.len(), 1);
    let attempt = store
        .start(start_params(
            &[(caught_up.clone(), claims[0].lease_token)],
            at(61_000),
            0,
        ))
        .await
        .unwrap()
        .remove(0);
    let dead = Finish {
        id: caught_up.clone(),
        lease_token: attempt.lease_token,
        kind: FinishKind::Dead {
            error: "gone".into(),
        },
    };
    assert_eq!(store.finish(&[dead], at(62_000)).await.unwrap(), [true]);
    let seventh = firing(7);
    let seventh_id = seventh.id.clone();
    assert!(
        matches!(outcome(seventh, at(70_000)).await, InsertOutcome::Inserted { id, .. } if id == seventh_id),
        "after a death the key is free"
    );

    // Cancelled: free at once.
    assert_eq!(
        store.cancel(&seventh_id, at(71_000)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let eighth = firing(8);
    let eighth_id = eighth.id.clone();
    assert!(
        matches!(outcome(eighth, at(80_000)).await, InsertOutcome::Inserted { id, .. } if id == eighth_id),
        "after a cancel the key is free"
    );
    assert_eq!(outcome(firing(9), at(90_000)).await, skipped(&eighth_id));
}

//! The keys that make a submit a repeat or a conflict: idempotency, unique and cron keys,
//! compared byte for byte, and a unique key's window after success.

use std::time::Duration;

use asyncd_store::{
    CancelOutcome, Finish, FinishKind, InsertOutcome, Millis, NewTask, RedriveOutcome, Store,
    TaskState,
};
use serde_json::value::RawValue;

use crate::{T0, at, claim_all, insert, start_params, state};

scenarios!(
    idempotency_unique_and_cron_keys,
    keys_live_inside_their_type,
    keys_compare_byte_for_byte,
    unique_keys_are_held_for_their_window_after_success,
    one_insert_holding_a_task_twice,
    a_batch_under_idempotency_keys_answers_each_repeat_in_its_place,
);

async fn idempotency_unique_and_cron_keys(store: &dyn Store) {
    let mut first = NewTask::test("a", T0);
    first.idempotency_key = Some("idem".into());
    first.unique_key = Some("order:1".into());
    let first_id = first.id.clone();
    let mut repeat = NewTask::test("a", at(99));
    repeat.idempotency_key = Some("idem".into());
    repeat.unique_key = Some("order:1".into());
    let mut same_key = NewTask::test("a", T0);
    same_key.unique_key = Some("order:1".into());
    let outcomes = store
        .insert(&[first, repeat, same_key.clone()], T0)
        .await
        .unwrap();
    assert_eq!(
        outcomes[0],
        InsertOutcome::Inserted {
            id: first_id.clone(),
            trigger_at: T0
        }
    );
    assert_eq!(
        outcomes[1],
        InsertOutcome::Duplicate {
            id: first_id.clone(),
            trigger_at: T0
        }
    );
    assert_eq!(
        outcomes[2],
        InsertOutcome::UniqueConflict {
            existing_id: first_id.clone()
        }
    );

    // The idempotency key again with another payload is refused, in an insert and in
    // the lookup the Kafka route makes; the same payload spaced and ordered differently
    // is a repeat.
    let mut other_payload = NewTask::test("a", T0);
    other_payload.idempotency_key = Some("idem".into());
    other_payload.payload = RawValue::from_string(r#"{"k":2}"#.into()).unwrap();
    let mut respaced = NewTask::test("a", T0);
    respaced.idempotency_key = Some("idem".into());
    respaced.payload = RawValue::from_string(r#"{ "k" : 1 }"#.into()).unwrap();
    let mismatch = InsertOutcome::IdempotencyMismatch {
        existing_id: first_id.clone(),
    };
    let outcomes = store
        .insert(&[other_payload.clone(), respaced.clone()], T0)
        .await
        .unwrap();
    let repeat = InsertOutcome::Duplicate {
        id: first_id.clone(),
        trigger_at: T0,
    };
    assert_eq!(outcomes, [mismatch.clone(), repeat.clone()]);
    assert_eq!(
        store.find_idempotent(&other_payload).await.unwrap(),
        Some(mismatch)
    );
    assert_eq!(
        store.find_idempotent(&respaced).await.unwrap(),
        Some(repeat)
    );
    let mut unheld = NewTask::test("a", T0);
    unheld.idempotency_key = Some("nobody".into());
    assert_eq!(store.find_idempotent(&unheld).await.unwrap(), None);

    // Once the holder finished, the key is free again.
    assert_eq!(
        store.cancel(&first_id, T0).await.unwrap(),
        CancelOutcome::Cancelled
    );
    assert!(matches!(
        store.insert(&[same_key], T0).await.unwrap()[0],
        InsertOutcome::Inserted { .. }
    ));

    let mut firing = NewTask::test("a", at(60_000));
    firing.cron_key = Some("a/nightly/1".into());
    let mut again = NewTask::test("a", at(60_000));
    again.cron_key = Some("a/nightly/1".into());
    let outcomes = store.insert(&[firing.clone(), again], T0).await.unwrap();
    assert_eq!(
        outcomes[1],
        InsertOutcome::Duplicate {
            id: firing.id,
            trigger_at: at(60_000)
        }
    );
}

/// Two submits of one idempotency key in one group commit share an id (a keyed task's
/// id is derived from its key): one insert holds the task twice, with another between.
/// The first goes in, the other too, and the second is answered as the first's repeat.
async fn one_insert_holding_a_task_twice(store: &dyn Store) {
    let mut first = NewTask::test("a", T0);
    first.idempotency_key = Some("twice".into());
    let again = first.clone();
    let other = NewTask::test("a", at(5));
    let outcomes = store
        .insert(&[first.clone(), other.clone(), again], T0)
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        [
            InsertOutcome::Inserted {
                id: first.id.clone(),
                trigger_at: T0
            },
            InsertOutcome::Inserted {
                id: other.id.clone(),
                trigger_at: at(5)
            },
            InsertOutcome::Duplicate {
                id: first.id.clone(),
                trigger_at: T0
            },
        ]
    );
    assert_eq!(state(store, &first.id).await, TaskState::Pending);
    assert_eq!(state(store, &other.id).await, TaskState::Pending);
}

/// Issue 31: one job's idempotency and unique keys neither block nor match another's,
/// a task of another type under a task's id is no repeat of it, and a redrive takes its
/// unique key back while another type's task holds the same key.
async fn keys_live_inside_their_type(store: &dyn Store) {
    let later = at(10_000_000);
    let keyed = move |task_type: &str| {
        let mut task = NewTask::test(task_type, later);
        task.idempotency_key = Some("order-42".into());
        task.unique_key = Some("order:42".into());
        task
    };
    let (a, b) = (keyed("a"), keyed("b"));
    let outcomes = store.insert(&[a.clone(), b.clone()], T0).await.unwrap();
    assert_eq!(
        outcomes,
        [
            InsertOutcome::Inserted {
                id: a.id.clone(),
                trigger_at: later
            },
            InsertOutcome::Inserted {
                id: b.id.clone(),
                trigger_at: later
            },
        ],
        "the same keys in two types are two tasks"
    );
    let repeat = InsertOutcome::Duplicate {
        id: b.id.clone(),
        trigger_at: later,
    };
    assert_eq!(
        store.insert(&[keyed("b")], T0).await.unwrap(),
        std::slice::from_ref(&repeat)
    );
    assert_eq!(
        store.find_idempotent(&keyed("b")).await.unwrap(),
        Some(repeat)
    );
    let mut unkeyed_b = NewTask::test("b", T0);
    unkeyed_b.unique_key = Some("order:42".into());
    assert_eq!(
        store.insert(&[unkeyed_b], T0).await.unwrap(),
        [InsertOutcome::UniqueConflict {
            existing_id: b.id.clone()
        }],
        "within its type a unique key still holds"
    );
    let mut unheld = keyed("c");
    unheld.unique_key = None;
    assert_eq!(store.find_idempotent(&unheld).await.unwrap(), None);

    // A's id again under another type (a cancel-before-consume row, or a message
    // consumed on another job's topic): neither a repeat nor A's to name.
    let mut taken = NewTask::test("b", later);
    taken.id = a.id.clone();
    assert_eq!(
        store.insert(&[taken], T0).await.unwrap(),
        [InsertOutcome::IdTaken { id: a.id.clone() }]
    );
    assert!(
        !store.insert_cancelled(&a.id, "b", T0).await.unwrap(),
        "a cancel-before-consume row cannot displace A"
    );
    assert_eq!(store.get(&a.id).await.unwrap().unwrap().task_type, "a");
    let mut same = NewTask::test("a", later);
    same.id = a.id.clone();
    assert_eq!(
        store.insert(&[same], T0).await.unwrap(),
        [InsertOutcome::Duplicate {
            id: a.id.clone(),
            trigger_at: later
        }],
        "the same id and type is a message consumed twice"
    );

    // A dead letter of type c takes its unique key back although b's task holds it.
    let mut dead = NewTask::test("c", T0);
    dead.unique_key = Some("order:42".into());
    let dead_id = insert(store, dead).await;
    let claimed = claim_all(store, T0, T0).await;
    assert_eq!(claimed.len(), 1, "only the task to bury is due");
    let attempt = store
        .start(start_params(
            &[(dead_id.clone(), claimed[0].lease_token)],
            T0,
            0,
        ))
        .await
        .unwrap()
        .remove(0);
    let burial = Finish {
        id: dead_id.clone(),
        lease_token: attempt.lease_token,
        kind: FinishKind::Dead {
            error: "gave up".into(),
        },
    };
    assert_eq!(store.finish(&[burial], T0).await.unwrap(), [true]);
    assert!(matches!(
        store.redrive(&dead_id, T0).await.unwrap(),
        RedriveOutcome::Redriven { .. }
    ));
}

async fn keys_compare_byte_for_byte(store: &dyn Store) {
    // Case, trailing spaces and Unicode normalization all make a different key (MySQL's
    // usual collations would fold the first two, and some the third).
    let keys = ["k", "k ", "K", "\u{e9}", "e\u{301}"];
    let mut ids = Vec::new();
    for key in keys {
        let mut task = NewTask::test("a", T0);
        task.idempotency_key = Some(key.into());
        task.unique_key = Some(key.into());
        task.cron_key = Some(format!("a/{key}/1"));
        ids.push(insert(store, task).await);
    }
    for (key, id) in keys.iter().zip(&ids) {
        let record = store.get(id).await.unwrap().unwrap();
        assert_eq!(
            (
                record.idempotency_key.as_deref(),
                record.unique_key.as_deref()
            ),
            (Some(*key), Some(*key))
        );
        let mut again = NewTask::test("a", at(1));
        again.idempotency_key = Some(key.to_string());
        assert_eq!(
            store.insert(&[again], T0).await.unwrap()[0],
            InsertOutcome::Duplicate {
                id: id.clone(),
                trigger_at: T0
            }
        );
        let mut same_unique = NewTask::test("a", at(1));
        same_unique.unique_key = Some(key.to_string());
        assert_eq!(
            store.insert(&[same_unique], T0).await.unwrap()[0],
            InsertOutcome::UniqueConflict {
                existing_id: id.clone()
            }
        );
    }
}

/// Issue 15: a unique key stays held for its `unique_for` after its task succeeded — a
/// submit with it within the window is refused naming the finished task, as while it was
/// pending — and is free from the window's end: taken by the insert or redrive that hits
/// it, or freed before that by the purger's `release_unique_keys`, which never touches a
/// key an unfinished task holds. Without a window, or when the task was cancelled or
/// died, the key is free at once.
async fn unique_keys_are_held_for_their_window_after_success(store: &dyn Store) {
    // Runs task `id` (due by `when`) to the outcome `kind` at `when`.
    async fn run(store: &dyn Store, id: &str, when: Millis, kind: FinishKind) {
        let claimed = store
            .claim_ids(asyncd_store::ClaimIdsParams {
                ids: &[id.to_string()],
                now: when,
                hold: Duration::from_secs(60),
                owner: "d1",
            })
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1, "{id} is claimable at {when:?}");
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
    let window = Duration::from_millis(1_000);
    let keyed = |key: &str, unique_for: Duration| {
        let mut task = NewTask::test("u", at(0));
        task.unique_key = Some(key.into());
        task.unique_for = unique_for;
        task
    };
    let submit = |task: NewTask, now: Millis| async move {
        store.insert(&[task], now).await.unwrap().remove(0)
    };
    let inserted = |outcome: InsertOutcome| match outcome {
        InsertOutcome::Inserted { id, .. } => id,
        other => panic!("expected an insert, got {other:?}"),
    };
    let conflict = |id: &str| InsertOutcome::UniqueConflict {
        existing_id: id.to_string(),
    };
    let succeeded = || FinishKind::Succeeded { result: None };

    let first = inserted(submit(keyed("a", window), at(0)).await);
    run(store, &first, at(10), succeeded()).await;
    assert_eq!(
        submit(keyed("a", window), at(1_009)).await,
        conflict(&first),
        "a late duplicate within the window is recognised"
    );
    let second = inserted(submit(keyed("a", window), at(1_010)).await);
    assert_ne!(second, first, "the key is free when the window ends");
    assert_eq!(
        submit(keyed("a", window), at(1_011)).await,
        conflict(&second),
        "the new task holds it"
    );

    let plain = inserted(submit(keyed("b", Duration::ZERO), at(0)).await);
    run(store, &plain, at(20), succeeded()).await;
    inserted(submit(keyed("b", window), at(20)).await);
    let dead = inserted(submit(keyed("c", window), at(0)).await);
    let dead_error = || FinishKind::Dead {
        error: "gone".into(),
    };
    run(store, &dead, at(30), dead_error()).await;
    inserted(submit(keyed("c", window), at(30)).await);
    let cancelled = inserted(submit(keyed("d", window), at(0)).await);
    assert_eq!(
        store.cancel(&cancelled, at(35)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    inserted(submit(keyed("d", window), at(35)).await);

    // The purger frees what ended, and only that.
    let swept = inserted(submit(keyed("e", window), at(0)).await);
    run(store, &swept, at(40), succeeded()).await;
    assert_eq!(
        store.release_unique_keys(at(1_039), 100).await.unwrap(),
        0,
        "{first}'s hold ended at 1010 and was taken; {swept}'s has not ended"
    );
    assert_eq!(store.release_unique_keys(at(1_040), 100).await.unwrap(), 1);
    inserted(submit(keyed("e", window), at(41)).await);
    assert_eq!(
        store
            .release_unique_keys(at(100_000_000), 100)
            .await
            .unwrap(),
        0,
        "nothing unfinished is released"
    );
    assert_eq!(
        submit(keyed("a", window), at(100_000_000)).await,
        conflict(&second),
        "a pending task's key stays held"
    );

    // A redrive that hits a held key is refused until the window ends.
    let buried = inserted(submit(keyed("f", window), at(0)).await);
    run(store, &buried, at(50), dead_error()).await;
    let holder = inserted(submit(keyed("f", window), at(50)).await);
    run(store, &holder, at(60), succeeded()).await;
    assert_eq!(
        store.redrive(&buried, at(1_059)).await.unwrap(),
        RedriveOutcome::UniqueConflict {
            existing_id: holder.clone()
        }
    );
    assert!(matches!(
        store.redrive(&buried, at(1_060)).await.unwrap(),
        RedriveOutcome::Redriven { .. }
    ));
    assert_eq!(state(store, &holder).await, TaskState::Succeeded);
}

/// A batch whose every task holds an idempotency key (the Go SDK's submits, gathered by
/// the API's group commit) goes in as one statement where the store has one
/// (PostgreSQL's, outside a transaction): the repeats of keys stored before, a repeat
/// with another payload, and a key named twice in the batch itself are each answered in
/// their place, and every other task is stored once.
async fn a_batch_under_idempotency_keys_answers_each_repeat_in_its_place(store: &dyn Store) {
    let keyed = |key: usize, due: i64| {
        let mut task = NewTask::test("a", at(due));
        task.idempotency_key = Some(format!("k{key}"));
        task
    };
    let first: Vec<NewTask> = (0..10).map(|i| keyed(i, i as i64)).collect();
    let outcomes = store.insert(&first, T0).await.unwrap();
    let inserted = |task: &NewTask| InsertOutcome::Inserted {
        id: task.id.clone(),
        trigger_at: task.trigger_at,
    };
    assert_eq!(outcomes, first.iter().map(inserted).collect::<Vec<_>>());

    // Keys k5 to k24: k5–k9 stored before (k7 with another payload), k20 twice.
    let mut second: Vec<NewTask> = (5..25).map(|i| keyed(i, 100 + i as i64)).collect();
    second[2].payload = RawValue::from_string(r#"{"other":true}"#.into()).unwrap();
    second.push(keyed(20, 500));
    let outcomes = store.insert(&second, T0).await.unwrap();
    let expected: Vec<InsertOutcome> = second
        .iter()
        .enumerate()
        .map(|(i, task)| match i {
            2 => InsertOutcome::IdempotencyMismatch {
                existing_id: first[7].id.clone(),
            },
            0..5 => InsertOutcome::Duplicate {
                id: first[i + 5].id.clone(),
                trigger_at: first[i + 5].trigger_at,
            },
            20 => InsertOutcome::Duplicate {
                id: second[15].id.clone(),
                trigger_at: second[15].trigger_at,
            },
            _ => inserted(task),
        })
        .collect();
    assert_eq!(outcomes, expected);
    for (task, outcome) in second.iter().zip(&outcomes) {
        let stored = store.get(&task.id).await.unwrap();
        assert_eq!(
            stored.is_some(),
            matches!(outcome, InsertOutcome::Inserted { .. }),
            "{outcome:?}"
        );
    }
    assert_eq!(
        claim_all(store, at(1_000), T0).await.len(),
        10 + 15,
        "each key's task stored once"
    );
}

//! Tasks as inserted and read back: one at a time and in large batches, with every value
//! kept exactly, a task cancelled before its insert arrived, and a task changed in place
//! until it begins.

use std::time::Duration;

use std::collections::HashMap;

use asyncd_store::{
    CancelOutcome, ChangeOutcome, ClaimAtInsert, Finish, FinishKind, InsertConsumedParams,
    InsertOutcome, NewTask, Store, TaskChange, TaskState,
};
use serde_json::value::RawValue;

use crate::{T0, at, claim_all, insert, start_params, state};

scenarios!(
    insert_get_and_order_within_one_millisecond,
    a_large_batch_keeps_each_tasks_outcome_and_values,
    a_batch_without_keys_keeps_every_value_and_survives_a_taken_id,
    payloads_and_results_are_kept_byte_for_byte,
    values_at_the_apis_limits_are_stored_exactly,
    a_task_cancelled_before_it_exists_is_stored_cancelled_once,
    a_task_changed_before_it_is_consumed_is_stored_changed,
    a_consumed_task_whose_key_another_request_holds_is_refused_not_dropped,
    a_task_changes_in_place_until_it_begins,
    a_change_racing_claims_and_starts_lands_whole_or_not_at_all,
);

async fn insert_get_and_order_within_one_millisecond(store: &dyn Store) {
    let mut ids = Vec::new();
    for _ in 0..50 {
        ids.push(insert(store, NewTask::test("a", at(10))).await);
    }
    let early = insert(store, NewTask::test("a", at(9))).await;
    let late = insert(store, NewTask::test("a", at(11))).await;
    let task = store.get(&ids[0]).await.unwrap().unwrap();
    assert_eq!(
        (task.state, task.trigger_at, task.payload.get()),
        (TaskState::Pending, at(10), r#"{"k":1}"#)
    );

    assert!(
        claim_all(store, at(8), T0).await.is_empty(),
        "nothing due by the horizon"
    );
    let claimed: Vec<String> = claim_all(store, at(11), T0)
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    let mut expected = vec![early];
    expected.extend(ids);
    expected.push(late);
    assert_eq!(claimed, expected, "ordered by (trigger_at, id)");
    assert!(
        claim_all(store, at(100), T0).await.is_empty(),
        "claimed rows are not claimed twice"
    );
}

/// A large batch goes in as multi-row statements where the backend can, and gives the
/// same outcome per task as inserting them one by one would: repeats within a statement
/// and across statements, a taken unique key, and a task with a dependency cutting the
/// run; every task's own values stored, each with its own lease secret.
async fn a_large_batch_keeps_each_tasks_outcome_and_values(store: &dyn Store) {
    const TASKS: usize = 600;
    let held = {
        let mut task = NewTask::test("a", T0);
        task.unique_key = Some("held".into());
        insert(store, task).await
    };
    let tasks: Vec<NewTask> = (0..TASKS)
        .map(|i| {
            let mut task = NewTask::test("a", at(i as i64));
            task.payload = RawValue::from_string(format!(r#"{{"n":{i}}}"#)).unwrap();
            task.priority = (i % 10) as u8;
            task.idempotency_key = Some(format!("idem-{i}"));
            match i {
                // A repeat of task 3 in the same statement, and of task 10 in a later one
                // (a repeat brings the same payload).
                5 | 500 => {
                    let first = if i == 5 { 3 } else { 10 };
                    task.idempotency_key = Some(format!("idem-{first}"));
                    task.payload = RawValue::from_string(format!(r#"{{"n":{first}}}"#)).unwrap();
                }
                // The unique key an earlier insert holds.
                7 => task.unique_key = Some("held".into()),
                _ => {}
            }
            task
        })
        .collect();
    let mut tasks = tasks;
    // A dependency on task 0 splits the run at 300.
    tasks[300].depends_on = vec![tasks[0].id.clone()];
    let outcomes = store.insert(&tasks, T0).await.unwrap();
    assert_eq!(outcomes.len(), TASKS);
    for (i, outcome) in outcomes.iter().enumerate() {
        let expected = match i {
            5 => InsertOutcome::Duplicate {
                id: tasks[3].id.clone(),
                trigger_at: at(3),
            },
            500 => InsertOutcome::Duplicate {
                id: tasks[10].id.clone(),
                trigger_at: at(10),
            },
            7 => InsertOutcome::UniqueConflict {
                existing_id: held.clone(),
            },
            _ => InsertOutcome::Inserted {
                id: tasks[i].id.clone(),
                trigger_at: at(i as i64),
            },
        };
        assert_eq!(outcome, &expected, "task {i}");
    }
    let mut secrets = std::collections::HashSet::new();
    for i in [0, 1, 255, 256, 299, 300, 301, 599] {
        let task = store.get(&tasks[i].id).await.unwrap().unwrap();
        let state = if i == 300 {
            TaskState::Blocked
        } else {
            TaskState::Pending
        };
        assert_eq!(
            (
                task.state,
                task.payload.get().to_string(),
                task.priority,
                task.trigger_at,
                task.idempotency_key.clone(),
            ),
            (
                state,
                format!(r#"{{"n":{i}}}"#),
                (i % 10) as u8,
                at(i as i64),
                Some(format!("idem-{i}")),
            ),
            "task {i}"
        );
        assert!(
            secrets.insert(task.lease_secret),
            "task {i}'s lease secret is its own"
        );
    }
    for i in [5, 7, 500] {
        assert!(
            store.get(&tasks[i].id).await.unwrap().is_none(),
            "task {i} stored"
        );
    }
}

/// A batch of tasks that hold no key goes in by the backend's bulk load where it has one
/// (PostgreSQL's `COPY` from 128 rows, one statement of arrays below;
/// [`asyncd_store::Store::insert_claiming`]): every value comes back as submitted, the
/// characters a bulk load's text format must escape included, and the first of the due
/// ones go in claimed within their type's room. A task whose id is taken (a Kafka
/// message consumed twice) fails a bulk load as a whole, also one run outside a
/// transaction ([`asyncd_store::Store::insert`]); the batch then goes in row by row: the
/// repeat is answered as a duplicate and every other task is stored.
async fn a_batch_without_keys_keeps_every_value_and_survives_a_taken_id(store: &dyn Store) {
    batch_without_keys(store, 300, 0).await;
    batch_without_keys(store, 100, 10_000).await;
}

/// [`a_batch_without_keys_keeps_every_value_and_survives_a_taken_id`] with batches of
/// `count` tasks, due from `start` + 10 ms on.
async fn batch_without_keys(store: &dyn Store, count: usize, start: i64) {
    const ROOM: usize = 40;
    // A tab and a newline between tokens, and backslashes, quotes and \u0000 in strings.
    let odd = "{ \"z\" : [1, 2.50],\n\t\"a\": \"é😀\\u0000\\\\\\\"\" }";
    let trace = asyncd::trace::TraceContext::parse(
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        Some("vendor=1,other=x"),
    )
    .unwrap();
    let batch = |first: i64| -> Vec<NewTask> {
        (0..count as i64)
            .map(|i| {
                let mut task = NewTask::test("a", at(first + i));
                task.payload = RawValue::from_string(match i % 3 {
                    0 => odd.to_string(),
                    _ => format!(r#"{{"n":{i}}}"#),
                })
                .unwrap();
                task.priority = (i % 10) as u8;
                task.max_retries = (i % 4) as u32;
                task.timeout_ms = 1_000 + i;
                task.source_service = Some(format!("svc\t{i}\\"));
                if i % 5 == 0 {
                    task.concurrency_key = Some(format!("key\t{i}\n\\"));
                }
                if i % 7 == 0 {
                    task.expires_at = Some(at(1_000_000 + i));
                }
                if i % 2 == 0 {
                    task = task.trace(trace.clone());
                }
                task
            })
            .collect()
    };
    let room: HashMap<String, usize> = [("a".to_string(), ROOM)].into();
    let claim = ClaimAtInsert {
        owner: "local",
        hold: Duration::from_secs(30),
        horizon: at(start + 1_000),
        room: Some(&room),
    };

    let tasks = batch(start + 10);
    let (outcomes, claimed) = store.insert_claiming(&tasks, T0, claim).await.unwrap();
    let inserted: Vec<InsertOutcome> = tasks
        .iter()
        .map(|t| InsertOutcome::Inserted {
            id: t.id.clone(),
            trigger_at: t.trigger_at,
        })
        .collect();
    assert_eq!(outcomes, inserted);
    let claimed_ids: Vec<&str> = claimed.iter().map(|c| c.id.as_str()).collect();
    let first: Vec<&str> = tasks[..ROOM].iter().map(|t| t.id.as_str()).collect();
    assert_eq!(claimed_ids, first, "the first due tasks, within a's room");
    let mut secrets = std::collections::HashSet::new();
    for (i, task) in tasks.iter().enumerate() {
        let stored = store.get(&task.id).await.unwrap().unwrap();
        let state = if i < ROOM {
            TaskState::Claimed
        } else {
            TaskState::Pending
        };
        assert_eq!(
            (
                stored.state,
                stored.payload.get(),
                stored.priority,
                stored.trigger_at,
                stored.max_retries,
                stored.timeout_ms,
                stored.expires_at,
                stored.idempotency_key.as_deref(),
            ),
            (
                state,
                task.payload.get(),
                task.priority,
                task.trigger_at,
                task.max_retries,
                task.timeout_ms,
                task.expires_at,
                None,
            ),
            "task {i}"
        );
        assert!(secrets.insert(stored.lease_secret), "task {i}'s own secret");
    }
    for c in &claimed {
        let stored = store.get(&c.id).await.unwrap().unwrap();
        assert_eq!(
            (stored.lease_token, stored.lease_secret.as_str()),
            (c.lease_token, c.lease_secret.as_str())
        );
    }
    // The keys and traces come back with a claim.
    let rest = claim_all(store, at(start + 1_000), T0).await;
    assert_eq!(rest.len(), count - ROOM);
    for c in rest.iter().chain(&claimed) {
        let task = tasks.iter().find(|t| t.id == c.id).unwrap();
        assert_eq!(
            (c.concurrency_key.as_ref(), c.trace.as_ref()),
            (task.concurrency_key.as_ref(), task.trace.as_ref()),
            "{}",
            c.id
        );
    }

    let mut again = batch(start + 2_000);
    let repeat = count / 2;
    again[repeat] = tasks[7].clone();
    let outcomes = store.insert(&again, T0).await.unwrap();
    for (i, outcome) in outcomes.iter().enumerate() {
        let expected = match i {
            i if i == repeat => InsertOutcome::Duplicate {
                id: tasks[7].id.clone(),
                trigger_at: tasks[7].trigger_at,
            },
            _ => InsertOutcome::Inserted {
                id: again[i].id.clone(),
                trigger_at: again[i].trigger_at,
            },
        };
        assert_eq!(outcome, &expected, "task {i} of the second batch");
    }
    assert_eq!(
        claim_all(store, at(start + 3_000), T0).await.len(),
        count - 1,
        "the second batch's tasks are all stored"
    );
}

async fn payloads_and_results_are_kept_byte_for_byte(store: &dyn Store) {
    // The executor's signature covers the body the payload is spliced into: spacing, key
    // order, number spelling and escapes must come back exactly as submitted.
    let text = "{ \"z\" : [1, 2.50, 1e3],\n\t\"a\": \"é😀\\u0000\\\"\" }";
    let mut task = NewTask::test("a", T0);
    task.payload = RawValue::from_string(text.into()).unwrap();
    let id = insert(store, task).await;
    assert_eq!(store.get(&id).await.unwrap().unwrap().payload.get(), text);
    let claimed = claim_all(store, T0, T0).await.remove(0);
    assert_eq!(claimed.payload.get(), text);
    let started = store
        .start(start_params(&[(id.clone(), claimed.lease_token)], T0, 0))
        .await
        .unwrap()
        .remove(0);
    let result = "[ \"ok\" ,{\"n\":1.0} ]";
    let done = Finish {
        id: id.clone(),
        lease_token: started.lease_token,
        kind: FinishKind::Succeeded {
            result: Some(RawValue::from_string(result.into()).unwrap()),
        },
    };
    assert_eq!(store.finish(&[done], T0).await.unwrap(), [true]);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().result.unwrap().get(),
        result
    );
}

/// The longest string of `ch` within `len` bytes.
fn key_of(ch: char, len: usize) -> String {
    std::iter::repeat_n(ch, len / ch.len_utf8()).collect()
}

async fn values_at_the_apis_limits_are_stored_exactly(store: &dyn Store) {
    // The API validates against the strictest backend; every value it can accept, at
    // its limits, must be storable on each one and come back unchanged: keys of the
    // longest length in 1- to 4-byte characters, the longest source name (written, not
    // read back: no record carries it), the default
    // largest payload (escapes that some databases refuse raw, like \u0000, included)
    // and the largest executor answer kept as a result.
    const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1024 * 1024;
    const MAX_SOURCE_SERVICE_BYTES: usize = 128;
    use asyncd::api::submit::MAX_KEY_LEN;
    let prefix = "{\"s\":\"\\u0000é😀\",\"pad\":\"";
    let suffix = "\"}";
    let payload = format!(
        "{prefix}{}{suffix}",
        "x".repeat(DEFAULT_MAX_PAYLOAD_BYTES - prefix.len() - suffix.len())
    );
    assert_eq!(payload.len(), DEFAULT_MAX_PAYLOAD_BYTES);
    let mut ids = Vec::new();
    for (i, ch) in ['k', 'é', '€', '😀'].into_iter().enumerate() {
        let mut task = NewTask::test("a", at(i as i64));
        let key = key_of(ch, MAX_KEY_LEN);
        task.idempotency_key = Some(key.clone());
        task.unique_key = Some(format!("u{}", &key[ch.len_utf8()..]));
        task.source_service = Some(key_of(ch, MAX_SOURCE_SERVICE_BYTES));
        task.payload = RawValue::from_string(payload.clone()).unwrap();
        let id = insert(store, task.clone()).await;
        let record = store.get(&id).await.unwrap().unwrap();
        assert_eq!(
            (
                record.idempotency_key.as_deref(),
                record.unique_key.as_deref(),
                record.payload.get().len(),
            ),
            (
                task.idempotency_key.as_deref(),
                task.unique_key.as_deref(),
                payload.len(),
            ),
            "{ch:?} keys"
        );
        assert_eq!(record.payload.get(), payload);
        ids.push(id);
    }
    let claimed = claim_all(store, at(10), at(10)).await;
    assert_eq!(claimed.len(), ids.len());
    let claims: Vec<(String, i64)> = claimed
        .iter()
        .map(|c| (c.id.clone(), c.lease_token))
        .collect();
    let started = store.start(start_params(&claims, at(10), 0)).await.unwrap();
    let answer = format!(
        "\"{}\"",
        "é".repeat((asyncd::executor::MAX_ANSWER_BYTES - 2) / 2)
    );
    let done = Finish {
        id: started[0].id.clone(),
        lease_token: started[0].lease_token,
        kind: FinishKind::Succeeded {
            result: Some(RawValue::from_string(answer.clone()).unwrap()),
        },
    };
    assert_eq!(store.finish(&[done], at(11)).await.unwrap(), [true]);
    assert_eq!(
        store
            .get(&started[0].id)
            .await
            .unwrap()
            .unwrap()
            .result
            .unwrap()
            .get(),
        answer
    );
}

/// A Kafka-routed task cancelled before it is consumed: its row is written cancelled,
/// once; the consumer's insert of the message later finds the id taken.
async fn a_task_cancelled_before_it_exists_is_stored_cancelled_once(store: &dyn Store) {
    assert!(store.insert_cancelled("early", "k", T0).await.unwrap());
    assert_eq!(state(store, "early").await, TaskState::Cancelled);
    assert!(
        !store.insert_cancelled("early", "k", T0).await.unwrap(),
        "the id is taken"
    );
    let mut consumed = NewTask::test("k", T0);
    consumed.id = "early".into();
    let outcome = store.insert(&[consumed], T0).await.unwrap();
    assert!(
        !matches!(outcome[0], InsertOutcome::Inserted { .. }),
        "{outcome:?}"
    );
    assert_eq!(state(store, "early").await, TaskState::Cancelled);
}

/// Two submits with one idempotency key and different payloads, both produced before
/// either is consumed, share the id the key derives; the consumer stores the first, and
/// the second comes back refused (its index in the batch and the holder), so the
/// consumer keeps its message instead of dropping it unseen. So does a copy whose unique
/// key an unfinished task holds. The rest of the batch is stored and claimed.
async fn a_consumed_task_whose_key_another_request_holds_is_refused_not_dropped(store: &dyn Store) {
    let keyed = |payload: &str| {
        let mut task = NewTask::test("k", T0).payload(payload);
        task.id = "from-the-key".into();
        task.idempotency_key = Some("idem".into());
        task
    };
    let mut holder = NewTask::test("k", at(60_000));
    holder.unique_key = Some("order:7".into());
    insert(store, holder.clone()).await;
    let mut unique = NewTask::test("k", T0);
    unique.unique_key = Some("order:7".into());
    let plain = NewTask::test("k", T0);
    let batch = [
        keyed(r#"{"n":1}"#),
        unique.clone(),
        keyed(r#"{"n":2}"#),
        plain.clone(),
    ];
    let consumed = store
        .insert_consumed(InsertConsumedParams {
            tasks: &batch,
            horizon: at(100),
            now: T0,
            hold: Duration::from_secs(30),
            owner: "consumer",
        })
        .await
        .unwrap();
    assert_eq!(
        consumed.refused,
        [
            (
                1,
                InsertOutcome::UniqueConflict {
                    existing_id: holder.id.clone()
                }
            ),
            (
                2,
                InsertOutcome::IdempotencyMismatch {
                    existing_id: "from-the-key".into()
                }
            ),
        ]
    );
    let mut claimed: Vec<&str> = consumed.claimed.iter().map(|t| t.id.as_str()).collect();
    claimed.sort_unstable();
    let mut expected = vec!["from-the-key", plain.id.as_str()];
    expected.sort_unstable();
    assert_eq!(claimed, expected, "the first copy and the plain task");
    let kept = store.get("from-the-key").await.unwrap().unwrap();
    assert_eq!(kept.payload.get(), r#"{"n":1}"#, "the first copy's payload");
    assert!(store.get(&unique.id).await.unwrap().is_none());
}

/// A Kafka-routed task changed while its message waits in the topic: a cancelled
/// placeholder holds its id until the consumer stores the message, which then takes the
/// placeholder's place with the change applied (a second change before consumption is
/// kept member by member). Consumed again, nothing changes; a cancel of the placeholder
/// drops the change and the message with it; a message of another type under the id is
/// not the changed task.
async fn a_task_changed_before_it_is_consumed_is_stored_changed(store: &dyn Store) {
    let change = |trigger_at, payload, priority| TaskChange {
        trigger_at,
        payload,
        priority,
    };
    assert!(
        store
            .change_unconsumed(
                "early",
                "k",
                change(Some(at(50)), Some(r#"{"n":2}"#), None),
                T0
            )
            .await
            .unwrap()
    );
    assert_eq!(
        state(store, "early").await,
        TaskState::Cancelled,
        "a placeholder"
    );
    assert!(
        store
            .change_unconsumed("early", "k", change(None, None, Some(5)), at(1))
            .await
            .unwrap(),
        "a second change goes over the first"
    );
    let consume = |id: &str, task_type: &str| {
        let mut task = NewTask::test(task_type, T0).payload(r#"{"n":1}"#);
        task.id = id.into();
        task
    };
    let messages = [consume("early", "k")];
    let claimed = store
        .insert_consumed(InsertConsumedParams {
            tasks: &messages,
            horizon: at(100),
            now: at(2),
            hold: Duration::from_secs(30),
            owner: "consumer",
        })
        .await
        .unwrap()
        .claimed;
    assert_eq!(
        claimed.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        ["early"],
        "stored, and due within the horizon: claimed"
    );
    let task = store.get("early").await.unwrap().unwrap();
    assert_eq!(
        (
            task.state,
            task.trigger_at,
            task.payload.get(),
            task.priority
        ),
        (TaskState::Claimed, at(50), r#"{"n":2}"#, 5),
        "the message's task, changed"
    );
    assert!(
        !store
            .change_unconsumed("early", "k", change(None, None, Some(1)), at(3))
            .await
            .unwrap(),
        "consumed: change the stored task instead"
    );
    // The message again (a redelivery): the stored task stays as it is, and the
    // message is no refusal.
    let again = store
        .insert_consumed(InsertConsumedParams {
            tasks: &messages,
            horizon: at(100),
            now: at(4),
            hold: Duration::from_secs(30),
            owner: "consumer",
        })
        .await
        .unwrap();
    assert!(again.refused.is_empty(), "{:?}", again.refused);
    let again = store.get("early").await.unwrap().unwrap();
    assert_eq!((again.payload.get(), again.priority), (r#"{"n":2}"#, 5));

    // Changed, then cancelled: the message is dropped.
    assert!(
        store
            .change_unconsumed("dropped", "k", change(None, None, Some(2)), T0)
            .await
            .unwrap()
    );
    assert_eq!(
        store.cancel("dropped", at(1)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    // Changed, and a message of another type under the id.
    assert!(
        store
            .change_unconsumed("other", "k", change(None, None, Some(2)), T0)
            .await
            .unwrap()
    );
    let consumed = store
        .insert_consumed(InsertConsumedParams {
            tasks: &[consume("dropped", "k"), consume("other", "j")],
            horizon: at(100),
            now: at(5),
            hold: Duration::from_secs(30),
            owner: "consumer",
        })
        .await
        .unwrap();
    assert!(consumed.refused.is_empty(), "{:?}", consumed.refused);
    assert_eq!(state(store, "dropped").await, TaskState::Cancelled);
    let other = store.get("other").await.unwrap().unwrap();
    assert_eq!(
        (other.task_type.as_str(), other.state),
        ("k", TaskState::Cancelled),
        "not the changed task"
    );
}

/// A change keeps the id and every value it does not name; a claimed task goes back to
/// pending and its claim's start begins nothing; once running or ended, nothing changes.
async fn a_task_changes_in_place_until_it_begins(store: &dyn Store) {
    let id = insert(store, NewTask::test("a", at(10))).await;
    let every = TaskChange {
        trigger_at: Some(at(20)),
        payload: Some(r#"{"k":2}"#),
        priority: Some(3),
    };
    assert_eq!(
        store.change(&id, every, T0).await.unwrap(),
        ChangeOutcome::Changed
    );
    let task = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (
            task.state,
            task.trigger_at,
            task.payload.get(),
            task.priority
        ),
        (TaskState::Pending, at(20), r#"{"k":2}"#, 3)
    );
    let sooner = TaskChange {
        trigger_at: Some(at(5)),
        ..TaskChange::default()
    };
    assert_eq!(
        store.change(&id, sooner, T0).await.unwrap(),
        ChangeOutcome::Changed
    );
    let task = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (task.trigger_at, task.payload.get(), task.priority),
        (at(5), r#"{"k":2}"#, 3),
        "what the change did not name is kept"
    );

    let claimed = claim_all(store, at(100), T0).await;
    assert_eq!(claimed.len(), 1);
    let payload = TaskChange {
        payload: Some(r#"{"k":3}"#),
        ..TaskChange::default()
    };
    assert_eq!(
        store.change(&id, payload, T0).await.unwrap(),
        ChangeOutcome::Changed
    );
    assert_eq!(
        state(store, &id).await,
        TaskState::Pending,
        "the claim is given up"
    );
    let old_claim = [(id.clone(), claimed[0].lease_token)];
    assert!(
        store
            .start(start_params(&old_claim, T0, 0))
            .await
            .unwrap()
            .is_empty(),
        "the old claim's start begins nothing"
    );

    let claimed = claim_all(store, at(100), T0).await;
    assert_eq!(
        claimed[0].payload.get(),
        r#"{"k":3}"#,
        "claimed with the new values"
    );
    let claim = [(id.clone(), claimed[0].lease_token)];
    let started = store.start(start_params(&claim, T0, 0)).await.unwrap();
    assert_eq!(started.len(), 1);
    assert_eq!(
        store.change(&id, sooner, T0).await.unwrap(),
        ChangeOutcome::NotChangeable(TaskState::Running)
    );
    let done = Finish {
        id: id.clone(),
        lease_token: started[0].lease_token,
        kind: FinishKind::Succeeded { result: None },
    };
    store.finish(&[done], T0).await.unwrap();
    assert_eq!(
        store.change(&id, sooner, T0).await.unwrap(),
        ChangeOutcome::NotChangeable(TaskState::Succeeded)
    );
    assert_eq!(
        store
            .change("01890000-0000-7000-8000-000000000000", sooner, T0)
            .await
            .unwrap(),
        ChangeOutcome::NotFound
    );
}

/// Changes of every task racing a dispatcher that claims and begins them: each change
/// either lands (and no attempt begins with the values it replaced) or is refused
/// because the attempt began first; never half.
async fn a_change_racing_claims_and_starts_lands_whole_or_not_at_all(store: &dyn Store) {
    const TASKS: usize = 60;
    let mut ids = Vec::new();
    for _ in 0..TASKS {
        ids.push(insert(store, NewTask::test("a", at(0))).await);
    }
    let dispatcher = async {
        let mut begun = Vec::new();
        while begun.len() < TASKS {
            let claimed = claim_all(store, at(100), T0).await;
            let claims: Vec<(String, i64)> = claimed
                .iter()
                .map(|c| (c.id.clone(), c.lease_token))
                .collect();
            let started = store.start(start_params(&claims, T0, 0)).await.unwrap();
            for s in started {
                let claim = claimed
                    .iter()
                    .find(|c| c.id == s.id)
                    .expect("a claimed task");
                begun.push((s.id, claim.payload.get().to_string()));
            }
            tokio::task::yield_now().await;
        }
        begun
    };
    let changes = async {
        let mut outcomes = Vec::new();
        for id in &ids {
            let change = TaskChange {
                payload: Some(r#"{"k":"new"}"#),
                ..TaskChange::default()
            };
            outcomes.push(store.change(id, change, T0).await.unwrap());
            tokio::task::yield_now().await;
        }
        outcomes
    };
    let (begun, outcomes) = tokio::join!(dispatcher, changes);
    for (id, outcome) in ids.iter().zip(&outcomes) {
        let stored = store.get(id).await.unwrap().unwrap();
        let sent = &begun
            .iter()
            .find(|(b, _)| b == id)
            .expect("every task began")
            .1;
        assert_eq!(
            sent,
            stored.payload.get(),
            "task {id} began with the values the store holds"
        );
        match outcome {
            ChangeOutcome::Changed => {
                assert_eq!(stored.payload.get(), r#"{"k":"new"}"#);
            }
            ChangeOutcome::NotChangeable(TaskState::Running) => {
                assert_eq!(stored.payload.get(), r#"{"k":1}"#);
            }
            other => panic!("task {id}: {other:?}"),
        }
    }
    assert_eq!(begun.len(), TASKS, "each task began once");
}

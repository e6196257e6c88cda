//! The store contract, run against every backend. Each backend test opens a fresh
//! database and runs the same scenarios; a backend is done when it passes all of them.

use std::time::Duration;

use asyncd::store::{
    self, BulkAction, CancelOutcome, ClaimParams, DeadCount, DeadFilter, DeadLetterParams,
    FairParams, Finish, FinishKind, HeldBy, InsertOutcome, JobCountParams, JobCounts, JobGate,
    KafkaDeadLetter, KafkaDeadLetterKey, KafkaDeadLetterParams, MEMBER_RETENTION, Millis, NewTask,
    PurgeParams, RedriveOutcome, SearchParams, StartParams, Store, TaskState, TypeFilter,
    WorkflowOutcome,
};
use asyncd_spec::RateLimit;
use serde_json::value::RawValue;

const T0: Millis = Millis::new(T0_MS);
const T0_MS: i64 = 1_800_000_000_000;

/// `ms` milliseconds after (or before) [`T0`].
fn at(ms: i64) -> Millis {
    Millis::new(T0_MS + ms)
}

fn claim_params<'a>(
    types: &'a TypeFilter,
    horizon: Millis,
    now: Millis,
    hold_ms: u64,
    owner: &'a str,
    limit: u32,
) -> ClaimParams<'a> {
    ClaimParams {
        types,
        horizon,
        now,
        hold: Duration::from_millis(hold_ms),
        owner,
        limit,
    }
}

fn start_params(claims: &[(String, i64)], now: Millis, grace_ms: u64) -> StartParams<'_> {
    StartParams {
        claims,
        now,
        grace: Duration::from_millis(grace_ms),
    }
}

fn new_task(task_type: &str, trigger_at: Millis) -> NewTask {
    NewTask {
        id: uuid::Uuid::now_v7().to_string(),
        task_type: task_type.into(),
        payload: RawValue::from_string(r#"{"k":1}"#.into()).unwrap(),
        priority: 0,
        trigger_at,
        max_retries: 3,
        timeout_ms: 1000,
        idempotency_key: None,
        unique_key: None,
        unique_for: std::time::Duration::ZERO,
        cron_key: None,
        depends_on: Vec::new(),
        source_service: None,
        concurrency_key: None,
        trace: None,
    }
}

async fn insert(store: &dyn Store, task: NewTask) -> String {
    match store.insert(&[task], T0).await.unwrap().remove(0) {
        InsertOutcome::Inserted { id, .. } => id,
        other => panic!("expected an insert, got {other:?}"),
    }
}

async fn claim_all(
    store: &dyn Store,
    horizon: Millis,
    now: Millis,
) -> Vec<asyncd::store::ClaimedTask> {
    store
        .claim(claim_params(
            &TypeFilter::All,
            horizon,
            now,
            5_000,
            "me",
            10_000,
        ))
        .await
        .unwrap()
}

async fn state(store: &dyn Store, id: &str) -> TaskState {
    store.get(id).await.unwrap().unwrap().state
}

async fn insert_get_and_order_within_one_millisecond(store: &dyn Store) {
    let mut ids = Vec::new();
    for _ in 0..50 {
        ids.push(insert(store, new_task("a", at(10))).await);
    }
    let early = insert(store, new_task("a", at(9))).await;
    let late = insert(store, new_task("a", at(11))).await;
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
        let mut task = new_task("a", T0);
        task.unique_key = Some("held".into());
        insert(store, task).await
    };
    let tasks: Vec<NewTask> = (0..TASKS)
        .map(|i| {
            let mut task = new_task("a", at(i as i64));
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

/// The submitter's trace context comes back with the claim, as stored (issue 16).
async fn a_claim_returns_the_tasks_trace_context(store: &dyn Store) {
    let trace = asyncd::trace::TraceContext::parse(
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        Some("vendor=1,other=x"),
    )
    .unwrap();
    let traced = insert(
        store,
        NewTask {
            trace: Some(trace.clone()),
            ..new_task("t", T0)
        },
    )
    .await;
    let plain = insert(store, new_task("t", T0)).await;
    let claimed = claim_all(store, T0, T0).await;
    let trace_of = |id: &str| claimed.iter().find(|c| c.id == id).unwrap().trace.clone();
    assert_eq!(trace_of(&traced), Some(trace));
    assert_eq!(trace_of(&plain), None);
}

async fn claim_respects_type_filter_and_limit(store: &dyn Store) {
    for _ in 0..5 {
        insert(store, new_task("mine", T0)).await;
        insert(store, new_task("theirs", T0)).await;
    }
    let only = TypeFilter::Only(vec!["mine".into()]);
    let first = store
        .claim(claim_params(&only, T0, T0, 1000, "me", 3))
        .await
        .unwrap();
    assert_eq!(first.len(), 3);
    let rest = store
        .claim(claim_params(&only, T0, T0, 1000, "me", 100))
        .await
        .unwrap();
    assert_eq!(rest.len(), 2);
    assert!(first.iter().chain(&rest).all(|t| t.task_type == "mine"));
}

async fn attempt_lifecycle_with_fencing(store: &dyn Store) {
    let id = insert(store, new_task("a", T0)).await;
    let claimed = claim_all(store, T0, T0).await.remove(0);
    let started = store
        .start(start_params(&[(id.clone(), claimed.lease_token)], T0, 500))
        .await
        .unwrap();
    assert_eq!(started.len(), 1);
    let attempt = &started[0];
    assert_eq!(attempt.attempt, 1);
    assert!(attempt.lease_token > claimed.lease_token);
    let record = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        record.lease_until,
        Some(at(1000 + 500)),
        "timeout plus grace"
    );
    // The claim's token is spent: starting it again changes nothing.
    assert!(
        store
            .start(start_params(&[(id.clone(), claimed.lease_token)], T0, 500))
            .await
            .unwrap()
            .is_empty()
    );

    let retry = Finish {
        id: id.clone(),
        lease_token: attempt.lease_token,
        kind: FinishKind::Retry {
            at: at(50),
            error: "boom".into(),
        },
    };
    assert_eq!(
        store
            .finish(std::slice::from_ref(&retry), T0)
            .await
            .unwrap(),
        [true]
    );
    assert_eq!(
        store.finish(&[retry], T0).await.unwrap(),
        [false],
        "a finished attempt's token is stale"
    );
    let record = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (
            record.state,
            record.trigger_at,
            record.last_error.as_deref()
        ),
        (TaskState::Pending, at(50), Some("boom"))
    );

    let claimed = claim_all(store, at(50), at(50)).await.remove(0);
    let second = store
        .start(start_params(
            &[(id.clone(), claimed.lease_token)],
            at(50),
            0,
        ))
        .await
        .unwrap()
        .remove(0);
    assert_eq!(second.attempt, 2);
    let stale = Finish {
        id: id.clone(),
        lease_token: attempt.lease_token,
        kind: FinishKind::Succeeded { result: None },
    };
    let fresh = Finish {
        id: id.clone(),
        lease_token: second.lease_token,
        kind: FinishKind::Succeeded {
            result: Some(RawValue::from_string("\"ok\"".into()).unwrap()),
        },
    };
    assert_eq!(
        store.finish(&[stale, fresh], at(60)).await.unwrap(),
        [false, true]
    );
    let record = store.get(&id).await.unwrap().unwrap();
    assert_eq!(
        (record.state, record.result.unwrap().get()),
        (TaskState::Succeeded, "\"ok\"")
    );
}

/// Each task gets its own random `lease_secret` at insert, kept as it is through claims
/// and attempts; the token an executor receives derives from it and the attempt's
/// counter, so another task's token, an earlier attempt's, or a guess matches nothing,
/// and a finish naming an earlier attempt's counter still changes nothing.
async fn lease_secrets_make_each_attempts_token_its_own(store: &dyn Store) {
    use asyncd::lease;
    let a = insert(store, new_task("a", T0)).await;
    let b = insert(store, new_task("a", T0)).await;
    let claimed = claim_all(store, T0, T0).await;
    assert_eq!(claimed.len(), 2);
    let secret = |id: &str| {
        claimed
            .iter()
            .find(|c| c.id == id)
            .unwrap()
            .lease_secret
            .clone()
    };
    for id in [&a, &b] {
        let s = secret(id);
        assert_eq!(s.len(), 64, "256 random bits, hex: {s:?}");
        assert!(s.bytes().all(|c| c.is_ascii_hexdigit()));
    }
    assert_ne!(secret(&a), secret(&b));
    let claims: Vec<(String, i64)> = claimed
        .iter()
        .map(|c| (c.id.clone(), c.lease_token))
        .collect();
    let started = store.start(start_params(&claims, T0, 0)).await.unwrap();
    let counter = |id: &str| started.iter().find(|s| s.id == id).unwrap().lease_token;
    let record = store.get(&a).await.unwrap().unwrap();
    assert_eq!(
        record.lease_secret,
        secret(&a),
        "the secret is the insert's"
    );
    assert_eq!(record.lease_token, counter(&a));
    let first = lease::token(&record.lease_secret, &a, counter(&a));
    let other = lease::token(&secret(&b), &b, counter(&b));
    assert!(lease::matches(
        &record.lease_secret,
        &a,
        record.lease_token,
        &first
    ));
    assert!(!lease::matches(
        &record.lease_secret,
        &a,
        record.lease_token,
        &other
    ));
    assert!(!lease::matches(
        &record.lease_secret,
        &a,
        record.lease_token,
        &record.lease_token.to_string()
    ));

    let retry = Finish {
        id: a.clone(),
        lease_token: counter(&a),
        kind: FinishKind::Retry {
            at: at(50),
            error: "boom".into(),
        },
    };
    assert_eq!(store.finish(&[retry], T0).await.unwrap(), [true]);
    let again = claim_all(store, at(50), at(50)).await.remove(0);
    assert_eq!(again.lease_secret, secret(&a));
    let second = store
        .start(start_params(&[(a.clone(), again.lease_token)], at(50), 0))
        .await
        .unwrap()
        .remove(0);
    let record = store.get(&a).await.unwrap().unwrap();
    let current = lease::token(&record.lease_secret, &a, second.lease_token);
    assert_ne!(current, first);
    assert!(lease::matches(
        &record.lease_secret,
        &a,
        record.lease_token,
        &current
    ));
    assert!(
        !lease::matches(&record.lease_secret, &a, record.lease_token, &first),
        "the earlier attempt's token is refused"
    );
    let late = Finish {
        id: a.clone(),
        lease_token: counter(&a),
        kind: FinishKind::Succeeded { result: None },
    };
    assert_eq!(store.finish(&[late], at(60)).await.unwrap(), [false]);
    assert_eq!(state(store, &a).await, TaskState::Running);
}

async fn lapsed_leases_come_back(store: &dyn Store) {
    let held = insert(store, new_task("a", T0)).await;
    let running = insert(store, new_task("a", T0)).await;
    let claims = claim_all(store, T0, T0).await;
    let run_claim = claims.iter().find(|c| c.id == running).unwrap();
    let started = store
        .start(start_params(
            &[(running.clone(), run_claim.lease_token)],
            T0,
            0,
        ))
        .await
        .unwrap()
        .remove(0);
    // Hold is 5 s past the ETA; the attempt's lease is its 1 s timeout.
    assert!(store.lapsed(at(999), 100).await.unwrap().is_empty());
    let lapsed = store.lapsed(at(5_001), 100).await.unwrap();
    let mut states: Vec<_> = lapsed.iter().map(|l| (l.id.clone(), l.state)).collect();
    states.sort_by_key(|(id, _)| id.clone());
    let mut expected = vec![
        (held.clone(), TaskState::Claimed),
        (running.clone(), TaskState::Running),
    ];
    expected.sort_by_key(|(id, _)| id.clone());
    assert_eq!(states, expected);
    let held_token = lapsed.iter().find(|l| l.id == held).unwrap().lease_token;
    let finishes = [
        Finish {
            id: held.clone(),
            lease_token: held_token,
            kind: FinishKind::Release,
        },
        Finish {
            id: running.clone(),
            lease_token: started.lease_token,
            kind: FinishKind::Retry {
                at: at(6_000),
                error: "lapsed".into(),
            },
        },
    ];
    assert_eq!(
        store.finish(&finishes, at(5_001)).await.unwrap(),
        [true, true]
    );
    let again: Vec<String> = claim_all(store, at(6_000), at(5_001))
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(
        again,
        [held, running],
        "both claimable again, in trigger order"
    );
}

fn dead_page<'a>(
    task_type: Option<&'a str>,
    after: Option<(Millis, &'a str)>,
    limit: u32,
) -> DeadLetterParams<'a> {
    DeadLetterParams {
        task_type,
        after,
        limit,
    }
}

async fn dead_letters_page_by_cursor_latest_due_first(store: &dyn Store) {
    // Five dead tasks of type a, two sharing a due time (the id orders those), one of
    // type b; paging by twos from each page's last item lists every a once, in order.
    let mut expected = Vec::new();
    for (i, due) in [0, 5, 5, 9, 2].into_iter().enumerate() {
        let mut task = new_task("a", at(due));
        task.id = format!("0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5{i}");
        expected.push((due, insert(store, task).await));
    }
    insert(store, new_task("b", at(3))).await;
    let claims: Vec<(String, i64)> = claim_all(store, at(10), at(10))
        .await
        .iter()
        .map(|c| (c.id.clone(), c.lease_token))
        .collect();
    let started = store.start(start_params(&claims, at(10), 0)).await.unwrap();
    let deaths: Vec<Finish> = started
        .iter()
        .map(|s| Finish {
            id: s.id.clone(),
            lease_token: s.lease_token,
            kind: FinishKind::Dead {
                error: "bad".into(),
            },
        })
        .collect();
    assert!(
        store
            .finish(&deaths, at(11))
            .await
            .unwrap()
            .iter()
            .all(|a| *a)
    );
    expected.sort_by(|x, y| y.cmp(x));
    let expected: Vec<String> = expected.into_iter().map(|(_, id)| id).collect();

    let mut listed: Vec<String> = Vec::new();
    let mut after: Option<(Millis, String)> = None;
    loop {
        let page = store
            .dead_letters(dead_page(
                Some("a"),
                after.as_ref().map(|(at, id)| (*at, id.as_str())),
                2,
            ))
            .await
            .unwrap();
        assert!(page.len() <= 2);
        let Some(last) = page.last() else { break };
        after = Some((last.trigger_at, last.id.clone()));
        listed.extend(page.iter().map(|t| t.id.clone()));
    }
    assert_eq!(listed, expected);
    let everything = store
        .dead_letters(dead_page(None, None, 100))
        .await
        .unwrap();
    assert_eq!(everything.len(), 6, "no type: every dead task");
}

async fn dead_letters_redrive_and_cancel(store: &dyn Store) {
    let id = insert(store, new_task("a", T0)).await;
    let claimed = claim_all(store, T0, T0).await.remove(0);
    let started = store
        .start(start_params(&[(id.clone(), claimed.lease_token)], T0, 0))
        .await
        .unwrap()
        .remove(0);
    let dead = Finish {
        id: id.clone(),
        lease_token: started.lease_token,
        kind: FinishKind::Dead {
            error: "bad".into(),
        },
    };
    assert_eq!(store.finish(&[dead], T0).await.unwrap(), [true]);
    let letters = store
        .dead_letters(dead_page(Some("a"), None, 10))
        .await
        .unwrap();
    assert_eq!(
        letters.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        [id.as_str()]
    );
    assert!(
        store
            .dead_letters(dead_page(Some("b"), None, 10))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.redrive(&id, at(1)).await.unwrap(),
        RedriveOutcome::Redriven {
            trigger_at: at(1),
            state: TaskState::Pending
        }
    );
    let record = store.get(&id).await.unwrap().unwrap();
    assert_eq!((record.state, record.attempt), (TaskState::Pending, 0));
    assert_eq!(
        store.redrive(&id, T0).await.unwrap(),
        RedriveOutcome::NotDead(TaskState::Pending)
    );
    assert_eq!(
        store.redrive("nope", T0).await.unwrap(),
        RedriveOutcome::NotFound
    );

    assert_eq!(
        store.cancel(&id, T0).await.unwrap(),
        CancelOutcome::Cancelled
    );
    assert_eq!(
        store.cancel(&id, T0).await.unwrap(),
        CancelOutcome::NotCancellable(TaskState::Cancelled)
    );
    assert_eq!(
        store.cancel("nope", T0).await.unwrap(),
        CancelOutcome::NotFound
    );
    assert!(
        claim_all(store, at(10), T0).await.is_empty(),
        "a cancelled task is never claimed"
    );
}

async fn idempotency_unique_and_cron_keys(store: &dyn Store) {
    let mut first = new_task("a", T0);
    first.idempotency_key = Some("idem".into());
    first.unique_key = Some("order:1".into());
    let first_id = first.id.clone();
    let mut repeat = new_task("a", at(99));
    repeat.idempotency_key = Some("idem".into());
    repeat.unique_key = Some("order:1".into());
    let mut same_key = new_task("a", T0);
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

    // The idempotency key again with another payload or type is refused, in an insert
    // and in the lookup the Kafka route makes; the same payload spaced and ordered
    // differently is a repeat.
    let mut other_payload = new_task("a", T0);
    other_payload.idempotency_key = Some("idem".into());
    other_payload.payload = RawValue::from_string(r#"{"k":2}"#.into()).unwrap();
    let mut other_type = new_task("b", T0);
    other_type.idempotency_key = Some("idem".into());
    let mut respaced = new_task("a", T0);
    respaced.idempotency_key = Some("idem".into());
    respaced.payload = RawValue::from_string(r#"{ "k" : 1 }"#.into()).unwrap();
    let mismatch = InsertOutcome::IdempotencyMismatch {
        existing_id: first_id.clone(),
    };
    let outcomes = store
        .insert(
            &[other_payload.clone(), other_type.clone(), respaced.clone()],
            T0,
        )
        .await
        .unwrap();
    let repeat = InsertOutcome::Duplicate {
        id: first_id.clone(),
        trigger_at: T0,
    };
    assert_eq!(
        outcomes,
        [mismatch.clone(), mismatch.clone(), repeat.clone()]
    );
    assert_eq!(
        store.find_idempotent(&other_payload).await.unwrap(),
        Some(mismatch.clone())
    );
    assert_eq!(
        store.find_idempotent(&other_type).await.unwrap(),
        Some(mismatch)
    );
    assert_eq!(
        store.find_idempotent(&respaced).await.unwrap(),
        Some(repeat)
    );
    let mut unheld = new_task("a", T0);
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

    let mut firing = new_task("a", at(60_000));
    firing.cron_key = Some("a/nightly/1".into());
    let mut again = new_task("a", at(60_000));
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

async fn dependencies_release_and_fail(store: &dyn Store) {
    let parent = insert(store, new_task("a", T0)).await;
    let mut child = new_task("a", T0);
    child.depends_on = vec![parent.clone()];
    let child = insert(store, child).await;
    let mut orphan = new_task("a", T0);
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

    let doomed = insert(store, new_task("a", at(1_000_000))).await;
    let mut grandchild_parent = new_task("a", T0);
    grandchild_parent.depends_on = vec![doomed.clone()];
    let middle = insert(store, grandchild_parent).await;
    let mut last = new_task("a", T0);
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

async fn payloads_and_results_are_kept_byte_for_byte(store: &dyn Store) {
    // The executor's signature covers the body the payload is spliced into: spacing, key
    // order, number spelling and escapes must come back exactly as submitted.
    let text = "{ \"z\" : [1, 2.50, 1e3],\n\t\"a\": \"é😀\\u0000\\\"\" }";
    let mut task = new_task("a", T0);
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

async fn keys_compare_byte_for_byte(store: &dyn Store) {
    // Case, trailing spaces and Unicode normalization all make a different key (MySQL's
    // usual collations would fold the first two, and some the third).
    let keys = ["k", "k ", "K", "\u{e9}", "e\u{301}"];
    let mut ids = Vec::new();
    for key in keys {
        let mut task = new_task("a", T0);
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
        let mut again = new_task("a", at(1));
        again.idempotency_key = Some(key.to_string());
        assert_eq!(
            store.insert(&[again], T0).await.unwrap()[0],
            InsertOutcome::Duplicate {
                id: id.clone(),
                trigger_at: T0
            }
        );
        let mut same_unique = new_task("a", at(1));
        same_unique.unique_key = Some(key.to_string());
        assert_eq!(
            store.insert(&[same_unique], T0).await.unwrap()[0],
            InsertOutcome::UniqueConflict {
                existing_id: id.clone()
            }
        );
    }
}

async fn a_lease_extension_that_moves_nothing_still_applies(store: &dyn Store) {
    let id = insert(store, new_task("a", T0)).await;
    let claimed = claim_all(store, T0, T0).await.remove(0);
    let started = store
        .start(start_params(&[(id.clone(), claimed.lease_token)], T0, 0))
        .await
        .unwrap()
        .remove(0);
    // The lease already runs to at(1000) and `now` is unchanged: the row stays as it
    // is, but the token matched, so the heartbeat is accepted.
    let extend = |until| Finish {
        id: id.clone(),
        lease_token: started.lease_token,
        kind: FinishKind::Extend { until },
    };
    assert_eq!(store.finish(&[extend(at(500))], T0).await.unwrap(), [true]);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().lease_until,
        Some(at(1000)),
        "a lease is never shortened"
    );
    assert_eq!(store.finish(&[extend(at(2000))], T0).await.unwrap(), [true]);
    assert_eq!(
        store.get(&id).await.unwrap().unwrap().lease_until,
        Some(at(2000))
    );
}

/// Inserts a task of `task_type` due at `when` and begins its attempt at `when`, which
/// ends then as `kind` says (`None`: it goes on running); nothing else may be due then.
/// Returns its id.
async fn run_to(
    store: &dyn Store,
    task_type: &str,
    when: Millis,
    kind: Option<FinishKind>,
) -> String {
    let id = insert(store, new_task(task_type, when)).await;
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
/// not count.
/// A Kafka-routed task cancelled before it is consumed: its row is written cancelled,
/// once; the consumer's insert of the message later finds the id taken.
async fn a_task_cancelled_before_it_exists_is_stored_cancelled_once(store: &dyn Store) {
    assert!(store.insert_cancelled("early", "k", T0).await.unwrap());
    assert_eq!(state(store, "early").await, TaskState::Cancelled);
    assert!(
        !store.insert_cancelled("early", "k", T0).await.unwrap(),
        "the id is taken"
    );
    let mut consumed = new_task("k", T0);
    consumed.id = "early".into();
    let outcome = store.insert(&[consumed], T0).await.unwrap();
    assert!(
        !matches!(outcome[0], InsertOutcome::Inserted { .. }),
        "{outcome:?}"
    );
    assert_eq!(state(store, "early").await, TaskState::Cancelled);
}

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

    insert(store, new_task("k", at(-9_000))).await;
    let oldest = insert(store, new_task("j", at(-3_000))).await;
    insert(store, new_task("j", at(-2_000))).await;
    insert(store, new_task("j", T0)).await;
    let scheduled = insert(store, new_task("j", at(5_000))).await;
    insert(store, new_task("j", at(6_000))).await;
    let only_j = TypeFilter::Only(vec!["j".into()]);
    let claimed = store
        .claim(claim_params(&only_j, T0, T0, 60_000, "me", 1))
        .await
        .unwrap();
    assert_eq!(claimed[0].id, oldest, "claimed, and still the oldest due");
    let cancelled = insert(store, new_task("j", at(-1_000))).await;
    assert_eq!(
        store.cancel(&cancelled, T0).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let mut blocked = new_task("j", at(-1_000));
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
}

async fn membership_by_heartbeat(store: &dyn Store) {
    store
        .heartbeat_member("b", T0, &Default::default())
        .await
        .unwrap();
    store
        .heartbeat_member("a", at(1_000), &Default::default())
        .await
        .unwrap();
    store
        .heartbeat_member("c", at(-10_000), &Default::default())
        .await
        .unwrap();
    assert_eq!(
        store.live_members(at(-4_000)).await.unwrap(),
        ["a", "b"],
        "c is silent"
    );
    store
        .heartbeat_member("c", at(2_000), &Default::default())
        .await
        .unwrap();
    assert_eq!(
        store.live_members(at(-4_000)).await.unwrap(),
        ["a", "b", "c"],
        "c is back"
    );
    store.leave("b").await.unwrap();
    assert_eq!(store.live_members(at(-4_000)).await.unwrap(), ["a", "c"]);
    // An hour of silence and the row is gone even for a lenient reader.
    store
        .heartbeat_member(
            "a",
            at(MEMBER_RETENTION.as_millis() as i64 + 1_500),
            &Default::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        store.live_members(Millis::new(0)).await.unwrap(),
        ["a", "c"]
    );
    store
        .heartbeat_member(
            "a",
            at(MEMBER_RETENTION.as_millis() as i64 + 2_001),
            &Default::default(),
        )
        .await
        .unwrap();
    assert_eq!(store.live_members(Millis::new(0)).await.unwrap(), ["a"]);
}

/// The adaptive shares published with the heartbeats: summed per task type over the
/// live members, a later heartbeat replacing a member's earlier shares.
async fn shares_are_summed_over_the_live_members(store: &dyn Store) {
    let shares = |pairs: &[(&str, u32)]| -> asyncd::store::Shares {
        pairs.iter().map(|(t, s)| (t.to_string(), *s)).collect()
    };
    store
        .heartbeat_member("a", T0, &shares(&[("x", 8), ("y", 3)]))
        .await
        .unwrap();
    store
        .heartbeat_member("b", T0, &shares(&[("x", 5)]))
        .await
        .unwrap();
    store
        .heartbeat_member("c", at(-10_000), &shares(&[("x", 64)]))
        .await
        .unwrap();
    let sums = store.live_shares(at(-4_000)).await.unwrap();
    assert_eq!(
        sums.into_iter().collect::<Vec<_>>(),
        [("x".to_string(), 13), ("y".to_string(), 3)],
        "c is silent"
    );
    store
        .heartbeat_member("a", at(1_000), &shares(&[("x", 2)]))
        .await
        .unwrap();
    let sums = store.live_shares(at(-4_000)).await.unwrap();
    assert_eq!(sums.into_iter().collect::<Vec<_>>(), [("x".to_string(), 7)]);
}

async fn a_dead_owners_claims_come_back_at_once(store: &dyn Store) {
    let held = insert(store, new_task("a", T0)).await;
    let running = insert(store, new_task("a", T0)).await;
    let other = insert(store, new_task("b", T0)).await;
    let a = TypeFilter::Only(vec!["a".into()]);
    let b = TypeFilter::Only(vec!["b".into()]);
    let dead = store
        .claim(claim_params(&a, T0, T0, 30_000, "dead", 10))
        .await
        .unwrap();
    assert_eq!(dead.len(), 2);
    store
        .claim(claim_params(&b, T0, T0, 30_000, "alive", 10))
        .await
        .unwrap();
    let token = |id: &str| dead.iter().find(|c| c.id == id).unwrap().lease_token;
    store
        .start(start_params(&[(running.clone(), token(&running))], T0, 0))
        .await
        .unwrap();

    assert_eq!(store.release_claims("dead", at(100)).await.unwrap(), 1);
    let state = async |id: &str| store.get(id).await.unwrap().unwrap().state;
    assert_eq!(state(&held).await, TaskState::Pending);
    assert_eq!(
        state(&running).await,
        TaskState::Running,
        "attempts keep their lease"
    );
    assert_eq!(
        state(&other).await,
        TaskState::Claimed,
        "another owner's claim"
    );
    assert!(
        store
            .start(start_params(&[(held.clone(), token(&held))], at(200), 0))
            .await
            .unwrap()
            .is_empty(),
        "the dead owner's late start changes nothing"
    );
    let again = store
        .claim(claim_params(&a, at(300), at(300), 30_000, "alive", 10))
        .await
        .unwrap();
    assert_eq!(
        again.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        [held.as_str()]
    );
    assert_eq!(store.release_claims("dead", at(400)).await.unwrap(), 0);
}

async fn the_servers_clock_is_read_in_utc_milliseconds(store: &dyn Store) {
    let before = chrono::Utc::now().timestamp_millis();
    let clock = store.clock().await.unwrap();
    let after = chrono::Utc::now().timestamp_millis();
    // The test runs on the database's host, so its clock is ours: an embedded database
    // has none to read, a server's reads as ours, to within a second for rounding and
    // scheduling, not a time zone's hours.
    if let Some(clock) = clock {
        assert!(
            (before - 1_000..=after + 1_000).contains(&clock.as_i64()),
            "{clock:?} not within [{before}, {after}]"
        );
    }
}

/// A Kafka message the consumer could not make a task of is kept byte for byte — NUL,
/// bytes that are no UTF-8 — once per (topic, partition, offset), however often it is
/// re-delivered and recorded.
async fn kafka_dead_letters_keep_messages_once_and_byte_for_byte(store: &dyn Store) {
    let raw: Vec<u8> = b"\x00garbage\xff\xfe{\"id\":\x00}\xc3\x28"
        .iter()
        .copied()
        .chain(0..=255)
        .collect();
    let letter = |partition: i32, offset: i64, message: &[u8], reason: &str, t: i64| {
        KafkaDeadLetter::new(
            "asyncd-topic",
            partition,
            offset,
            message,
            reason.to_string(),
            at(t),
        )
    };
    let first = letter(2, 41, &raw, "not an asyncd task envelope", 10);
    store.record_kafka_dead_letter(&first).await.unwrap();
    // Re-delivered after a crash, recorded again: still one row, the first.
    store
        .record_kafka_dead_letter(&letter(2, 41, b"other", "again", 20))
        .await
        .unwrap();
    // The same offset of another partition, and of another topic, are other messages.
    let other_partition = letter(3, 41, b"", "the message has no value", 30);
    store
        .record_kafka_dead_letter(&other_partition)
        .await
        .unwrap();
    let mut other_topic = letter(2, 41, b"x", "the store refused task t", 40);
    other_topic.topic = "asyncd-other".into();
    store.record_kafka_dead_letter(&other_topic).await.unwrap();

    let listed = store
        .kafka_dead_letters(KafkaDeadLetterParams {
            limit: 10,
            ..KafkaDeadLetterParams::default()
        })
        .await
        .unwrap();
    assert_eq!(
        listed,
        vec![other_topic.clone(), other_partition.clone(), first.clone()],
        "latest first, each once, bytes as recorded"
    );
    assert_eq!(listed[2].message, raw);
    assert_eq!(listed[2].message_size, raw.len() as i64);
    assert_eq!(
        store
            .kafka_dead_letters(KafkaDeadLetterParams {
                limit: 1,
                ..KafkaDeadLetterParams::default()
            })
            .await
            .unwrap(),
        vec![other_topic.clone()],
        "limited"
    );
    // One topic's, and a page after a page's last item.
    let of_topic = KafkaDeadLetterParams {
        topic: Some("asyncd-topic"),
        after: None,
        limit: 10,
    };
    assert_eq!(
        store.kafka_dead_letters(of_topic).await.unwrap(),
        vec![other_partition.clone(), first.clone()]
    );
    fn key(l: &KafkaDeadLetter) -> KafkaDeadLetterKey<'_> {
        KafkaDeadLetterKey {
            recorded_at: l.recorded_at,
            topic: &l.topic,
            partition: l.partition,
            offset: l.offset,
        }
    }
    let next = |after| KafkaDeadLetterParams {
        topic: None,
        after: Some(after),
        limit: 1,
    };
    assert_eq!(
        store
            .kafka_dead_letters(next(key(&other_topic)))
            .await
            .unwrap(),
        vec![other_partition.clone()]
    );
    assert_eq!(
        store
            .kafka_dead_letters(next(key(&other_partition)))
            .await
            .unwrap(),
        vec![first.clone()]
    );

    // Retention: those recorded before the cutoff go, oldest first, `limit` at a time.
    assert_eq!(
        store.purge_kafka_dead_letters(at(30), 10).await.unwrap(),
        1,
        "recorded at 10: before 30"
    );
    assert_eq!(
        store
            .kafka_dead_letters(KafkaDeadLetterParams {
                limit: 10,
                ..KafkaDeadLetterParams::default()
            })
            .await
            .unwrap(),
        vec![other_topic.clone(), other_partition.clone()]
    );
    assert_eq!(store.purge_kafka_dead_letters(at(41), 1).await.unwrap(), 1);
    assert_eq!(
        store
            .kafka_dead_letters(KafkaDeadLetterParams {
                limit: 10,
                ..KafkaDeadLetterParams::default()
            })
            .await
            .unwrap(),
        vec![other_topic],
        "the older one went first"
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
        let mut task = new_task("a", at(i as i64));
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

async fn errors_from_executors_are_stored_sanitized_and_capped(store: &dyn Store) {
    // An executor's error text reaches the store whatever it holds: NUL (PostgreSQL
    // refuses it in text), escape sequences, megabytes. The store makes each storable
    // itself, so no caller can get an outcome batch refused, and the other outcomes in
    // the same batch apply.
    let poison = format!("boom\0\u{1b}[31m\r{}", "é".repeat(100_000));
    let ids = [
        insert(store, new_task("a", T0)).await,
        insert(store, new_task("a", T0)).await,
        insert(store, new_task("a", T0)).await,
    ];
    let claims: Vec<(String, i64)> = claim_all(store, T0, T0)
        .await
        .iter()
        .map(|c| (c.id.clone(), c.lease_token))
        .collect();
    let started = store.start(start_params(&claims, T0, 0)).await.unwrap();
    let token = |id: &str| started.iter().find(|s| s.id == id).unwrap().lease_token;
    let finishes = [
        Finish {
            id: ids[0].clone(),
            lease_token: token(&ids[0]),
            kind: FinishKind::Retry {
                at: at(1000),
                error: poison.clone(),
            },
        },
        Finish {
            id: ids[1].clone(),
            lease_token: token(&ids[1]),
            kind: FinishKind::Dead {
                error: poison.clone(),
            },
        },
        Finish {
            id: ids[2].clone(),
            lease_token: token(&ids[2]),
            kind: FinishKind::Succeeded { result: None },
        },
    ];
    assert_eq!(
        store.finish(&finishes, at(1)).await.unwrap(),
        [true, true, true]
    );
    for (id, state) in [(&ids[0], TaskState::Pending), (&ids[1], TaskState::Dead)] {
        let record = store.get(id).await.unwrap().unwrap();
        assert_eq!(record.state, state);
        let error = record.last_error.unwrap();
        assert_eq!(error, asyncd::executor::sanitize_reason(&poison));
        assert!(
            error.starts_with("boom\u{FFFD}\u{FFFD}[31m\u{FFFD}é"),
            "{error:.20}"
        );
        assert!(error.chars().count() <= asyncd::executor::MAX_REASON_CHARS + 1);
    }
    assert_eq!(state(store, &ids[2]).await, TaskState::Succeeded);
}

async fn a_success_after_its_attempt_was_given_up_lands_until_a_new_claim(store: &dyn Store) {
    // Issue 10, finding 3: a dispatcher starved of CPU wrote successes after their
    // leases lapsed; the rescuer had queued the tasks again, the successes were refused
    // as stale, and the work ran again and again. A success for a given-up attempt now
    // lands while the task waits for a new attempt; once one is claimed (or after a
    // redrive) the old attempt's token is spent.
    async fn given_up(store: &dyn Store, id: &str, now: Millis) -> i64 {
        let claimed = claim_all(store, now, now).await;
        let claim = claimed.iter().find(|c| c.id == id).unwrap();
        let attempt = store
            .start(start_params(&[(id.to_string(), claim.lease_token)], now, 0))
            .await
            .unwrap()
            .remove(0);
        let lapsed = Finish {
            id: id.to_string(),
            lease_token: attempt.lease_token,
            kind: FinishKind::Retry {
                at: now,
                error: "attempt 1 lease lapsed".into(),
            },
        };
        assert_eq!(store.finish(&[lapsed], now).await.unwrap(), [true]);
        attempt.lease_token
    }
    let late = |id: &str, token: i64| Finish {
        id: id.to_string(),
        lease_token: token,
        kind: FinishKind::Succeeded {
            result: Some(RawValue::from_string("\"late\"".into()).unwrap()),
        },
    };

    let waiting = insert(store, new_task("a", T0)).await;
    let token = given_up(store, &waiting, T0).await;
    assert_eq!(state(store, &waiting).await, TaskState::Pending);
    assert_eq!(
        store.finish(&[late(&waiting, token)], at(1)).await.unwrap(),
        [true]
    );
    let record = store.get(&waiting).await.unwrap().unwrap();
    assert_eq!(
        (
            record.state,
            record.attempt,
            record.result.map(|r| r.get().to_string())
        ),
        (TaskState::Succeeded, 1, Some("\"late\"".to_string()))
    );
    assert!(
        claim_all(store, at(10), at(10)).await.is_empty(),
        "nothing runs again"
    );

    let reclaimed = insert(store, new_task("a", at(20))).await;
    let token = given_up(store, &reclaimed, at(20)).await;
    let claim = claim_all(store, at(20), at(20)).await.remove(0);
    assert_eq!(
        store
            .finish(&[late(&reclaimed, token)], at(21))
            .await
            .unwrap(),
        [false],
        "a new claim spent the old token"
    );
    let second = store
        .start(start_params(
            &[(reclaimed.clone(), claim.lease_token)],
            at(21),
            0,
        ))
        .await
        .unwrap();
    assert_eq!(second.len(), 1, "the new claim still begins");

    // Given up on its last attempt: dead-lettered, until the success comes in.
    let buried = insert(store, new_task("a", at(25))).await;
    let claim = claim_all(store, at(25), at(25)).await.remove(0);
    let attempt = store
        .start(start_params(
            &[(buried.clone(), claim.lease_token)],
            at(25),
            0,
        ))
        .await
        .unwrap()
        .remove(0);
    let lapsed = Finish {
        id: buried.clone(),
        lease_token: attempt.lease_token,
        kind: FinishKind::Dead {
            error: "attempt 1 lease lapsed".into(),
        },
    };
    assert_eq!(store.finish(&[lapsed], at(26)).await.unwrap(), [true]);
    assert_eq!(
        store
            .finish(&[late(&buried, attempt.lease_token)], at(27))
            .await
            .unwrap(),
        [true],
        "a success lands on the dead-lettered attempt"
    );
    assert_eq!(state(store, &buried).await, TaskState::Succeeded);

    let redriven = insert(store, new_task("a", at(30))).await;
    let claim = claim_all(store, at(30), at(30)).await.remove(0);
    let attempt = store
        .start(start_params(
            &[(redriven.clone(), claim.lease_token)],
            at(30),
            0,
        ))
        .await
        .unwrap()
        .remove(0);
    let dead = Finish {
        id: redriven.clone(),
        lease_token: attempt.lease_token,
        kind: FinishKind::Dead {
            error: "gone".into(),
        },
    };
    assert_eq!(store.finish(&[dead], at(31)).await.unwrap(), [true]);
    assert!(matches!(
        store.redrive(&redriven, at(32)).await.unwrap(),
        RedriveOutcome::Redriven { .. }
    ));
    assert_eq!(
        store
            .finish(&[late(&redriven, attempt.lease_token)], at(33))
            .await
            .unwrap(),
        [false],
        "a redrive spent the old token"
    );
    assert_eq!(state(store, &redriven).await, TaskState::Pending);
}

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
    let other = insert(store, new_task("a", far)).await;
    let parent = insert(store, new_task("a", at(5))).await;
    let mut child = new_task("a", at(5));
    child.depends_on = vec![parent.clone(), other.clone()];
    let child = insert(store, child).await;
    finish_at(store, &parent, at(5), succeeded()).await;
    assert_eq!(
        state(store, &child).await,
        TaskState::Blocked,
        "still waits on {other}"
    );

    let mut keyed = new_task("a", at(10));
    keyed.idempotency_key = Some("purge-key".into());
    let s1 = insert(store, keyed).await;
    finish_at(store, &s1, at(10), succeeded()).await;
    let s2 = insert(store, new_task("a", at(20))).await;
    finish_at(store, &s2, at(20), succeeded()).await;
    let s3 = insert(store, new_task("a", at(30))).await;
    finish_at(store, &s3, at(30), succeeded()).await;
    let d1 = insert(store, new_task("a", at(40))).await;
    finish_at(
        store,
        &d1,
        at(40),
        FinishKind::Dead {
            error: "gone".into(),
        },
    )
    .await;
    let b1 = insert(store, new_task("b", at(50))).await;
    finish_at(store, &b1, at(50), succeeded()).await;
    let c1 = insert(store, new_task("a", far)).await;
    assert_eq!(
        store.cancel(&c1, at(60)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    // In flight, last changed long before every cutoff below: one claimed (at 1), one
    // running (claimed at 1, started at 2). Neither is finished, so no purge may take it.
    let claimed = insert(store, new_task("a", at(1))).await;
    let running = insert(store, new_task("a", at(1))).await;
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

    let mut again = new_task("a", far);
    again.idempotency_key = Some("purge-key".into());
    let again = insert(store, again).await;
    assert_ne!(again, s1, "the purged task's key is free");
}

/// Issue 15, cron `overlap: Skip` as the store keeps it (the scheduler's `firing` gives
/// every firing of such an entry one unique key, held only while unfinished): a firing
/// is refused naming the previous one while that is pending, claimed, running or waiting
/// to retry, and goes in once it succeeded, died or was cancelled. The same firing again
/// (another scheduler) is a repeat, not a skip; of several missed firings caught up in
/// one insert, only the first goes in.
async fn a_cron_firing_is_refused_while_the_previous_is_unfinished(store: &dyn Store) {
    let firing = |n: i64| {
        let mut task = new_task("cron", at(n * 10_000));
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
            .claim_ids(asyncd::store::ClaimIdsParams {
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
        let mut task = new_task("u", at(0));
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
        let parent = insert(store, new_task("a", at(base + 10))).await;
        let mut child = new_task("a", at(base + 10));
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

/// Issue 15, workflows in one call: stored parents first in one transaction; a child's
/// dependency on a parent that turns out to be a repeat is the first task's id; and one
/// refused task leaves nothing of the workflow behind.
async fn a_workflow_is_stored_whole_or_not_at_all(store: &dyn Store) {
    let mut parent = new_task("a", T0);
    parent.idempotency_key = Some("wf-parent".into());
    let mut child = new_task("a", T0);
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
    let mut again = new_task("a", T0);
    again.idempotency_key = Some("wf-parent".into());
    let mut second_child = new_task("a", T0);
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

    let mut holder = new_task("a", at(1_000_000));
    holder.unique_key = Some("wf-key".into());
    insert(store, holder).await;
    let first = new_task("a", T0);
    let first_id = first.id.clone();
    let mut clash = new_task("a", T0);
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

/// Issue 15, dead letters in bulk: the filter narrows by type, error prefix (literally:
/// `%` is no wildcard) and time of death; each pass acts on the oldest deaths first, up
/// to its limit; what it cannot act on is counted apart; and a task that dies again after
/// the action's cutoff is not matched again.
async fn dead_letters_are_redriven_and_purged_in_bulk(store: &dyn Store) {
    // Task `id`, due at `when`, dies there with `error`.
    async fn bury(store: &dyn Store, id: &str, when: Millis, error: &str) {
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
        let dead = Finish {
            id: id.to_string(),
            lease_token: attempt.lease_token,
            kind: FinishKind::Dead {
                error: error.into(),
            },
        };
        assert_eq!(store.finish(&[dead], when).await.unwrap(), [true]);
    }
    async fn dead_at(store: &dyn Store, task: NewTask, error: &str) -> String {
        let when = task.trigger_at;
        let id = insert(store, task).await;
        bury(store, &id, when, error).await;
        id
    }
    let filter = |action, error_prefix, dead_after, dead_before| DeadFilter {
        task_type: "a",
        error_prefix,
        dead_after,
        dead_before,
        action,
    };
    let count = |filter| async move { store.count_dead(filter).await.unwrap() };
    let act =
        |filter, limit| async move { store.act_on_dead(filter, limit, at(5_000)).await.unwrap() };
    let cutoff = at(1_000);
    let busy = Some("executor answered 503");

    let d1 = dead_at(store, new_task("a", at(10)), "executor answered 503: busy").await;
    let d2 = dead_at(store, new_task("a", at(20)), "executor answered 503: busy").await;
    let d3 = dead_at(store, new_task("a", at(30)), "timed out after 30s").await;
    let mut keyed = new_task("a", at(40));
    keyed.unique_key = Some("order:7".into());
    let d4 = dead_at(store, keyed, "executor answered 503").await;
    let mut holder = new_task("a", at(10_000_000));
    holder.unique_key = Some("order:7".into());
    insert(store, holder).await;
    let other_type = dead_at(store, new_task("b", at(50)), "executor answered 503").await;

    let everything = filter(BulkAction::Redrive, None, None, cutoff);
    assert_eq!(
        count(everything).await,
        DeadCount {
            matched: 4,
            actionable: 3
        },
        "{d4}'s unique key is held by a pending task"
    );
    assert_eq!(
        count(filter(BulkAction::Purge, None, None, cutoff)).await,
        DeadCount {
            matched: 4,
            actionable: 4
        }
    );
    assert_eq!(
        count(filter(BulkAction::Redrive, busy, None, cutoff)).await,
        DeadCount {
            matched: 3,
            actionable: 2
        }
    );
    assert_eq!(
        count(filter(BulkAction::Redrive, Some("executor%"), None, cutoff)).await,
        DeadCount::default(),
        "a prefix is literal text"
    );
    assert_eq!(
        count(filter(BulkAction::Redrive, None, Some(at(20)), at(35)))
            .await
            .matched,
        2,
        "{d2} and {d3} died in [20, 35)"
    );

    assert_eq!(
        act(filter(BulkAction::Redrive, busy, None, cutoff), 1).await,
        1
    );
    assert_eq!(
        state(store, &d1).await,
        TaskState::Pending,
        "the oldest death first"
    );
    assert_eq!(state(store, &d2).await, TaskState::Dead);
    let d1_record = store.get(&d1).await.unwrap().unwrap();
    assert_eq!((d1_record.attempt, d1_record.trigger_at), (0, at(5_000)));
    assert_eq!(
        act(filter(BulkAction::Redrive, busy, None, cutoff), 10).await,
        1
    );
    assert_eq!(state(store, &d2).await, TaskState::Pending);
    assert_eq!(
        act(filter(BulkAction::Redrive, busy, None, cutoff), 10).await,
        0,
        "a repeat finds nothing more to do"
    );
    assert_eq!(state(store, &d4).await, TaskState::Dead);

    // d1 runs again and dies again, after the cutoff: the same action does not match it.
    assert_eq!(
        store.cancel(&d2, at(5_000)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    bury(store, &d1, at(5_000), "executor answered 503: busy").await;
    assert_eq!(
        count(filter(BulkAction::Redrive, busy, None, cutoff)).await,
        DeadCount {
            matched: 1,
            actionable: 0
        }
    );

    // Two dead letters that share a unique key (the first died, freeing it, before the
    // second took it): one redrive at a time, the second refused.
    let mut e1 = new_task("a", at(60));
    e1.unique_key = Some("order:8".into());
    let e1 = dead_at(store, e1, "twin").await;
    let mut e2 = new_task("a", at(70));
    e2.unique_key = Some("order:8".into());
    let e2 = dead_at(store, e2, "twin").await;
    let twins = filter(BulkAction::Redrive, Some("twin"), None, cutoff);
    assert_eq!(
        count(twins).await,
        DeadCount {
            matched: 2,
            actionable: 2
        }
    );
    assert_eq!(act(twins, 10).await, 1);
    assert_eq!(state(store, &e1).await, TaskState::Pending);
    assert_eq!(state(store, &e2).await, TaskState::Dead);
    assert_eq!(
        count(twins).await,
        DeadCount {
            matched: 1,
            actionable: 0
        }
    );

    let purge = filter(BulkAction::Purge, None, None, cutoff);
    assert_eq!(
        count(purge).await,
        DeadCount {
            matched: 3,
            actionable: 3
        }
    );
    assert_eq!(act(purge, 2).await, 2);
    assert!(
        store.get(&d3).await.unwrap().is_none(),
        "the oldest death first"
    );
    assert!(store.get(&d4).await.unwrap().is_none());
    assert_eq!(act(purge, 10).await, 1);
    assert!(store.get(&e2).await.unwrap().is_none());
    assert_eq!(act(purge, 10).await, 0);
    assert_eq!(
        state(store, &other_type).await,
        TaskState::Dead,
        "another type's"
    );
    assert_eq!(
        state(store, &d1).await,
        TaskState::Dead,
        "died after the cutoff"
    );
}

/// Issue 15: paging through 10 000 tasks while more are inserted meets each of them
/// exactly once and none twice. Between pages, and while the next page is read, tasks go
/// in on both sides of the cursor: created later than everything (before the first
/// page), at an instant already read, at the cursor's own instant on either side of its
/// id, and at an instant still to read. A task behind the cursor may or may not be met
/// (it raced the page); none of the inserts may shift a page, which would skip or repeat
/// one of the first 10 000.
async fn search_pages_through_10_000_tasks_under_concurrent_inserts(store: &dyn Store) {
    const TASKS: usize = 10_000;
    const INSTANTS: i64 = 10;
    let mut stored = std::collections::BTreeSet::new();
    for chunk in 0..INSTANTS {
        let batch: Vec<NewTask> = (0..TASKS as i64 / INSTANTS)
            .map(|_| new_task("a", T0))
            .collect();
        // Created over ten instants, so the cursor crosses ties and instants alike.
        for outcome in store.insert(&batch, at(chunk)).await.unwrap() {
            match outcome {
                InsertOutcome::Inserted { id, .. } => assert!(stored.insert(id)),
                other => panic!("{other:?}"),
            }
        }
    }
    let page = |after: Option<(Millis, String)>| async move {
        store
            .search(SearchParams {
                task_type: Some("a"),
                after: after.as_ref().map(|(at, id)| (*at, id.as_str())),
                limit: 250,
                ..SearchParams::default()
            })
            .await
            .unwrap()
    };
    // Ids that sort below every stored one (the stored are UUIDv7s of today), for a task
    // at the cursor's instant that still has to be read.
    let low_id = |n: usize| format!("00000000-0000-7000-8000-{n:012x}");
    // The tasks to insert, with when each is created, while the page after `cursor` is
    // read.
    let around = |n: usize, cursor: &Option<(Millis, String)>| -> Vec<(NewTask, Millis)> {
        let mut tasks = vec![(new_task("a", T0), at(INSTANTS + n as i64))];
        if let Some((created, _)) = cursor {
            let instant = created.as_i64() - T0_MS;
            // Already read: newer than the cursor, and at its instant with a higher id.
            tasks.push((new_task("a", T0), at((instant + 1).min(INSTANTS - 1))));
            tasks.push((new_task("a", T0), *created));
            // Still to read: at its instant with a lower id, and at an older instant.
            let mut low = new_task("a", T0);
            low.id = low_id(n);
            tasks.push((low, *created));
            tasks.push((new_task("a", T0), at((instant - 1).max(0))));
        }
        tasks
    };
    let mut seen = Vec::with_capacity(TASKS);
    let mut added = std::collections::BTreeSet::new();
    let mut cursor: Option<(Millis, String)> = None;
    for n in 0.. {
        let inserts = around(n, &cursor);
        let insert_all = async {
            let mut ids = Vec::new();
            for (task, created) in inserts {
                match store.insert(&[task], created).await.unwrap().remove(0) {
                    InsertOutcome::Inserted { id, .. } => ids.push(id),
                    other => panic!("{other:?}"),
                }
            }
            ids
        };
        let (found, ids) = tokio::join!(page(cursor.clone()), insert_all);
        added.extend(ids);
        let Some(last) = found.last() else { break };
        cursor = Some((last.created_at, last.id.clone()));
        seen.extend(found.into_iter().map(|t| t.id));
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), seen.len(), "no task on two pages");
    let seen: std::collections::BTreeSet<String> = seen.into_iter().collect();
    assert!(
        stored.is_subset(&seen),
        "{} of the first 10 000 never listed",
        stored.difference(&seen).count()
    );
    assert!(
        seen.iter()
            .all(|id| stored.contains(id) || added.contains(id)),
        "only stored tasks are listed"
    );
    assert!(
        added.len() > 4 * 40,
        "inserts went in beside every page: {}",
        added.len()
    );
}

/// Issue 15, task search: every filter narrows, the newest come first, and the cursor
/// of a page's last task continues where it ended, through ties on `created_at`.
async fn tasks_are_found_by_filter_newest_first_page_by_page(store: &dyn Store) {
    let mut ids = Vec::new();
    for (n, (task_type, unique, created)) in [
        ("a", None, 1),
        ("a", Some("k1"), 2),
        ("b", None, 2),
        ("a", None, 2),
        ("a", Some("k2"), 3),
    ]
    .into_iter()
    .enumerate()
    {
        let mut task = new_task(task_type, at(100 + n as i64));
        task.unique_key = unique.map(String::from);
        match store.insert(&[task], at(created)).await.unwrap().remove(0) {
            InsertOutcome::Inserted { id, .. } => ids.push(id),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        store.cancel(&ids[3], at(4)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let search = |params: SearchParams<'static>| async move {
        store
            .search(params)
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.id)
            .collect::<Vec<_>>()
    };
    let all = SearchParams {
        limit: 100,
        ..SearchParams::default()
    };
    // Newest first; ties on created_at by id, descending.
    let mut tied = vec![ids[1].clone(), ids[2].clone(), ids[3].clone()];
    tied.sort();
    tied.reverse();
    let newest_first: Vec<String> = [vec![ids[4].clone()], tied, vec![ids[0].clone()]].concat();
    assert_eq!(search(all).await, newest_first);

    let only_a = search(SearchParams {
        task_type: Some("a"),
        ..all
    })
    .await;
    assert_eq!(only_a.len(), 4);
    assert!(!only_a.contains(&ids[2]));
    assert_eq!(
        search(SearchParams {
            state: Some(TaskState::Cancelled),
            ..all
        })
        .await,
        [ids[3].clone()]
    );
    assert_eq!(
        search(SearchParams {
            unique_key: Some("k2"),
            ..all
        })
        .await,
        [ids[4].clone()]
    );
    assert_eq!(
        search(SearchParams {
            created_after: Some(at(2)),
            ..all
        })
        .await,
        [ids[4].clone()]
    );
    assert_eq!(
        search(SearchParams {
            eta_before: Some(at(101)),
            ..all
        })
        .await,
        [ids[0].clone()]
    );

    // Two at a time, each page starting after the last one's (created_at, id).
    let mut paged = Vec::new();
    let mut cursor: Option<(Millis, String)> = None;
    loop {
        let page = store
            .search(SearchParams {
                after: cursor.as_ref().map(|(at, id)| (*at, id.as_str())),
                limit: 2,
                ..SearchParams::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        cursor = Some((last.created_at, last.id.clone()));
        paged.extend(page.into_iter().map(|t| t.id));
    }
    assert_eq!(paged, newest_first);
}

/// A paused task type is neither claimed (by a poll or by id) nor started, and keeps its
/// tasks pending; other types go on; a resume hands every one of them out again, in order.
async fn a_paused_type_waits_and_resumes_in_order(store: &dyn Store) {
    let mut paused = Vec::new();
    for i in 0..5 {
        paused.push(insert(store, new_task("held", at(i))).await);
    }
    let other = insert(store, new_task("free", T0)).await;
    // Claimed before the pause: held, but its attempt must not begin.
    let early = store
        .claim(claim_params(
            &TypeFilter::Only(vec!["held".into()]),
            T0,
            T0,
            5_000,
            "me",
            1,
        ))
        .await
        .unwrap();
    assert_eq!(early.len(), 1);
    assert_eq!(early[0].id, paused[0]);

    assert_eq!(store.pause("held", at(10)).await.unwrap(), at(10));
    assert_eq!(
        store.pause("held", at(20)).await.unwrap(),
        at(10),
        "pausing again keeps the first pause"
    );
    assert_eq!(store.pauses().await.unwrap(), vec![("held".into(), at(10))]);

    let claimed: Vec<String> = claim_all(store, at(100), at(100))
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(claimed, vec![other], "only the unpaused type is claimed");
    let by_id = store
        .claim_ids(asyncd::store::ClaimIdsParams {
            ids: &paused[1..],
            now: at(100),
            hold: Duration::from_secs(5),
            owner: "consumer",
        })
        .await
        .unwrap();
    assert!(by_id.is_empty(), "a Kafka consumer's claim skips it too");
    let claims = vec![(early[0].id.clone(), early[0].lease_token)];
    let started = store
        .start(start_params(&claims, at(100), 1000))
        .await
        .unwrap();
    assert!(
        started.is_empty(),
        "a claim held from before the pause does not start"
    );
    // The dispatcher hands the unstarted claim back; it waits with the others.
    let released = store
        .finish(
            &[Finish {
                id: early[0].id.clone(),
                lease_token: early[0].lease_token,
                kind: FinishKind::Release,
            }],
            at(100),
        )
        .await
        .unwrap();
    assert_eq!(released, vec![true]);
    for id in &paused {
        assert_eq!(state(store, id).await, TaskState::Pending);
    }

    assert!(store.resume("held").await.unwrap());
    assert!(
        !store.resume("held").await.unwrap(),
        "a second resume changes nothing"
    );
    assert!(store.pauses().await.unwrap().is_empty());
    let claimed: Vec<String> = claim_all(store, at(100), at(100))
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(
        claimed, paused,
        "every waiting task, in (trigger_at, id) order"
    );
}

/// Claims take due work by rank: the trigger time moved 10 s earlier per priority level.
/// A priority-9 task overtakes the priority-0 backlog due up to 90 s before it, a task
/// due longer than that still goes first (ageing), and one not due by the horizon is
/// left however high its priority.
async fn claims_rank_priority_among_due_work_with_ageing(store: &dyn Store) {
    // Every claim ranks alike: of all types (tasks_ranked), of one type (its own index,
    // tasks_ranked_by_type) and of a list of types; the last two with another type's due
    // tasks ranked ahead of theirs.
    for (run, task_type, types) in [
        (0, "r0", None),
        (1, "r1", Some(vec!["r1".to_string()])),
        (2, "r2", Some(vec!["r2".to_string(), "absent".to_string()])),
    ] {
        let filter = types.map_or(TypeFilter::All, TypeFilter::Only);
        if run > 0 {
            for i in 0..10 {
                insert(store, new_task(&format!("other{run}"), at(-100_000 + i))).await;
            }
        }
        let mut low = Vec::new();
        for i in 0..20 {
            low.push(insert(store, new_task(task_type, at(i * 3_000))).await);
        }
        let mut high = new_task(task_type, at(60_000));
        high.priority = 9;
        let high = insert(store, high).await;
        let aged = insert(store, new_task(task_type, at(-31_000))).await;
        let mut later = new_task(task_type, at(60_001));
        later.priority = 9;
        let later = insert(store, later).await;
        let claim = async |now: Millis, limit: u32| -> Vec<String> {
            store
                .claim(claim_params(&filter, now, now, 5_000, "me", limit))
                .await
                .unwrap()
                .into_iter()
                .map(|c| c.id)
                .collect()
        };
        assert_eq!(
            claim(at(60_000), 2).await,
            vec![aged, high],
            "{task_type}: ageing, then priority"
        );
        assert_eq!(
            claim(at(60_000), 1_000).await,
            low,
            "{task_type}: then the backlog by trigger time; not the task due later"
        );
        assert_eq!(claim(at(60_001), 1_000).await, vec![later], "{task_type}");
        // A paused type is not claimed, whichever index the claim walks.
        let mut paused = new_task(task_type, at(60_002));
        paused.priority = 9;
        insert(store, paused).await;
        store.pause(task_type, at(60_002)).await.unwrap();
        assert!(
            claim(at(60_002), 1_000).await.is_empty(),
            "{task_type} paused"
        );
        store.resume(task_type).await.unwrap();
        assert_eq!(
            claim(at(60_002), 1_000).await.len(),
            1,
            "{task_type} resumed"
        );
    }
}

/// Claims `n` due tasks of `task_type` for `owner`, as `(id, token)` pairs in rank order.
async fn claims_of(
    store: &dyn Store,
    task_type: &str,
    owner: &str,
    n: u32,
    now: Millis,
) -> Vec<(String, i64)> {
    store
        .claim(claim_params(
            &TypeFilter::Only(vec![task_type.into()]),
            now,
            now,
            60_000,
            owner,
            n,
        ))
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.id, c.lease_token))
        .collect()
}

/// `concurrencyKey`: the fair claim takes each key's best task before any key's second,
/// counts a key's claimed and running tasks against its share, and the start keeps each
/// key's running attempts within its limit across starters, skipping a full key's claims
/// without holding back the claims behind them.
async fn keys_are_claimed_in_turn_and_limited_in_total(store: &dyn Store) {
    let keyed = |key: &str, ms: i64| NewTask {
        concurrency_key: Some(key.into()),
        ..new_task("keyed", at(ms))
    };
    // "a" floods first, each of its tasks due earlier than any other key's.
    let mut a = Vec::new();
    for i in 0..6 {
        a.push(insert(store, keyed("a", i)).await);
    }
    let b: Vec<String> = [
        insert(store, keyed("b", 10)).await,
        insert(store, keyed("b", 11)).await,
    ]
    .into();
    let c = insert(store, keyed("c", 12)).await;
    let _later = insert(store, keyed("c", 60_000)).await;
    let other = insert(store, new_task("unkeyed", T0)).await;
    let only = TypeFilter::Only(vec!["keyed".into()]);
    let fair_after = |limit: u32, now: Millis, owner: &'static str, after: Option<&'static str>| {
        let only = only.clone();
        async move {
            let mut ids: Vec<String> = store
                .claim_fair(
                    claim_params(&only, now, now, 60_000, owner, limit),
                    FairParams { per_key: 2, after },
                )
                .await
                .unwrap()
                .tasks
                .into_iter()
                .map(|c| c.id)
                .collect();
            ids.sort();
            ids
        }
    };
    let fair = |limit: u32, now: Millis, owner: &'static str| fair_after(limit, now, owner, None);
    let sorted = |mut ids: Vec<String>| {
        ids.sort();
        ids
    };
    // Room for one, after "a" in the rotation: b's first, though a's rank better.
    assert_eq!(
        fair_after(1, at(20), "x", Some("a")).await,
        vec![b[0].clone()]
    );
    // Room for two: the first turn's other keys, not a's first two.
    assert_eq!(
        fair(2, at(20), "x").await,
        sorted(vec![a[0].clone(), c.clone()])
    );
    // Each key's share is 2, claimed tasks counted: one more of a and b, none of c due.
    assert_eq!(
        fair(100, at(20), "x").await,
        sorted(vec![a[1].clone(), b[1].clone()])
    );
    assert!(
        fair(100, at(20), "y").await.is_empty(),
        "every key has its share"
    );
    assert_eq!(
        state(store, &other).await,
        TaskState::Pending,
        "another type's task"
    );

    // The claims as the dispatcher holds them: tokens from the store.
    let mut held = Vec::new();
    for id in [&a[0], &a[1], &b[0], &c] {
        let task = store.get(id).await.unwrap().unwrap();
        held.push((task.id, task.lease_token));
    }
    let keys_of = |held: &[(String, i64)]| -> Vec<Option<&'static str>> {
        held.iter()
            .map(|(id, _)| {
                Some(if a.contains(id) {
                    "a"
                } else if b.contains(id) {
                    "b"
                } else {
                    "c"
                })
            })
            .collect()
    };
    let keys = keys_of(&held);
    let gate = JobGate {
        task_type: "keyed",
        concurrency: 10,
        rate: None,
        key_limit: Some(1),
        keys: &keys,
    };
    let first = store
        .start_limited(start_params(&held, at(20), 0), gate)
        .await
        .unwrap();
    // a's second waits for its first; b and c behind it begin.
    let mut started: Vec<String> = first.started.iter().map(|s| s.id.clone()).collect();
    started.sort();
    assert_eq!(started, sorted(vec![a[0].clone(), b[0].clone(), c.clone()]));
    assert_eq!(
        (first.deferred.clone(), first.held_by),
        (vec![1], Some(HeldBy::Key))
    );
    // Another starter (another dispatcher) finds a's slot taken too.
    let again = vec![held[1].clone()];
    let keys = keys_of(&again);
    let second = store
        .start_limited(
            start_params(&again, at(21), 0),
            JobGate {
                keys: &keys,
                ..gate
            },
        )
        .await
        .unwrap();
    assert_eq!((second.started.len(), second.deferred.len()), (0, 1));
    let done = first.started.iter().find(|s| s.id == a[0]).unwrap();
    store
        .finish(
            &[Finish {
                id: done.id.clone(),
                lease_token: done.lease_token,
                kind: FinishKind::Succeeded { result: None },
            }],
            at(22),
        )
        .await
        .unwrap();
    let third = store
        .start_limited(
            start_params(&again, at(23), 0),
            JobGate {
                keys: &keys,
                ..gate
            },
        )
        .await
        .unwrap();
    assert_eq!((third.started.len(), third.held_by), (1, None));
    // a's first is done: its share has room for its third task.
    assert_eq!(fair(100, at(24), "x").await, vec![a[2].clone()]);
}

async fn limits_hold_in_total_across_starters(store: &dyn Store) {
    for _ in 0..10 {
        insert(store, new_task("slots", T0)).await;
    }
    let gate = JobGate {
        task_type: "slots",
        concurrency: 3,
        rate: None,
        key_limit: None,
        keys: &[],
    };
    // Two dispatchers' claims: the first may begin 3, the second none until one ends.
    let a = claims_of(store, "slots", "a", 5, T0).await;
    let b = claims_of(store, "slots", "b", 5, T0).await;
    let first = store
        .start_limited(start_params(&a, T0, 0), gate)
        .await
        .unwrap();
    assert_eq!(first.started.len(), 3);
    assert_eq!(
        first.started.iter().map(|s| &s.id).collect::<Vec<_>>(),
        a[..3].iter().map(|(id, _)| id).collect::<Vec<_>>(),
        "the first claims given begin"
    );
    assert_eq!(
        (first.deferred.len(), first.held_by),
        (2, Some(HeldBy::Concurrency))
    );
    assert_eq!(state(store, &a[3].0).await, TaskState::Claimed);
    let second = store
        .start_limited(start_params(&b, T0, 0), gate)
        .await
        .unwrap();
    assert_eq!((second.started.len(), second.deferred.len()), (0, 5));
    let done = &first.started[0];
    store
        .finish(
            &[Finish {
                id: done.id.clone(),
                lease_token: done.lease_token,
                kind: FinishKind::Succeeded { result: None },
            }],
            at(1),
        )
        .await
        .unwrap();
    let third = store
        .start_limited(start_params(&b, at(1), 0), gate)
        .await
        .unwrap();
    assert_eq!((third.started.len(), third.deferred.len()), (1, 4));
    // A raised limit (a config change) takes effect at the next start.
    let raised = store
        .start_limited(
            start_params(&b[1..], at(2), 0),
            JobGate {
                concurrency: 5,
                ..gate
            },
        )
        .await
        .unwrap();
    assert_eq!((raised.started.len(), raised.deferred.len()), (2, 2));

    // A rate of 10/s with a burst of 2, on claims of two owners.
    for _ in 0..10 {
        insert(store, new_task("rated", T0)).await;
    }
    let gate = JobGate {
        task_type: "rated",
        concurrency: 100,
        rate: Some(RateLimit {
            per_second: 10,
            burst: 2,
        }),
        key_limit: None,
        keys: &[],
    };
    let a = claims_of(store, "rated", "a", 5, T0).await;
    let b = claims_of(store, "rated", "b", 5, T0).await;
    let burst = store
        .start_limited(start_params(&a, T0, 0), gate)
        .await
        .unwrap();
    assert_eq!(burst.started.len(), 2, "the burst");
    assert_eq!(
        burst.held_by,
        Some(HeldBy::Rate {
            next_token: Duration::from_millis(100)
        })
    );
    let empty = store
        .start_limited(start_params(&b, at(40), 0), gate)
        .await
        .unwrap();
    assert_eq!(
        (empty.started.len(), empty.held_by),
        (
            0,
            Some(HeldBy::Rate {
                next_token: Duration::from_millis(60)
            })
        ),
        "the other owner shares the bucket"
    );
    let one = store
        .start_limited(start_params(&b, at(100), 0), gate)
        .await
        .unwrap();
    assert_eq!(one.started.len(), 1);
    // Two tokens by 300 ms (the burst; not more): two begin.
    let two = store
        .start_limited(start_params(&b[1..], at(300), 0), gate)
        .await
        .unwrap();
    assert_eq!(two.started.len(), 2);
    // A claim that does not begin (cancelled meanwhile) takes no token.
    assert_eq!(
        store.cancel(&b[3].0, at(360)).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let cancelled = store
        .start_limited(start_params(&b[3..4], at(400), 0), gate)
        .await
        .unwrap();
    assert_eq!((cancelled.started.len(), cancelled.deferred.len()), (0, 0));
    let after = store
        .start_limited(start_params(&b[4..], at(400), 0), gate)
        .await
        .unwrap();
    assert_eq!(after.started.len(), 1, "the token the cancelled claim left");
}

/// Every scenario as one test per backend (`sqlite::…`, `mariadb::…`, `postgres::…`),
/// each on a fresh, migrated database, so one failure hides none of the others.
macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    let dir = tempfile::tempdir().unwrap();
                    let url = format!("sqlite://{}/store.db", dir.path().display());
                    let store = super::store::open(&url).await.unwrap();
                    store.migrate().await.unwrap();
                    super::$name(store.as_ref()).await;
                }
            )*
        }
        mod mariadb {
            $(
                #[tokio::test]
                async fn $name() {
                    super::mariadb().run(super::$name).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    super::postgres().run(super::$name).await;
                }
            )*
        }
    };
}

scenarios!(
    insert_get_and_order_within_one_millisecond,
    a_large_batch_keeps_each_tasks_outcome_and_values,
    a_claim_returns_the_tasks_trace_context,
    claim_respects_type_filter_and_limit,
    attempt_lifecycle_with_fencing,
    a_success_after_its_attempt_was_given_up_lands_until_a_new_claim,
    lease_secrets_make_each_attempts_token_its_own,
    lapsed_leases_come_back,
    dead_letters_redrive_and_cancel,
    dead_letters_page_by_cursor_latest_due_first,
    idempotency_unique_and_cron_keys,
    dependencies_release_and_fail,
    job_counts_by_state_stop_at_their_cap,
    a_task_cancelled_before_it_exists_is_stored_cancelled_once,
    membership_by_heartbeat,
    shares_are_summed_over_the_live_members,
    payloads_and_results_are_kept_byte_for_byte,
    keys_compare_byte_for_byte,
    a_lease_extension_that_moves_nothing_still_applies,
    a_dead_owners_claims_come_back_at_once,
    the_servers_clock_is_read_in_utc_milliseconds,
    kafka_dead_letters_keep_messages_once_and_byte_for_byte,
    values_at_the_apis_limits_are_stored_exactly,
    errors_from_executors_are_stored_sanitized_and_capped,
    finished_tasks_are_purged_after_their_retention,
    unique_keys_are_held_for_their_window_after_success,
    a_cron_firing_is_refused_while_the_previous_is_unfinished,
    dead_letters_are_redriven_and_purged_in_bulk,
    a_redriven_task_waits_again_on_its_dead_dependency,
    a_workflow_is_stored_whole_or_not_at_all,
    tasks_are_found_by_filter_newest_first_page_by_page,
    search_pages_through_10_000_tasks_under_concurrent_inserts,
    a_paused_type_waits_and_resumes_in_order,
    claims_rank_priority_among_due_work_with_ageing,
    limits_hold_in_total_across_starters,
    keys_are_claimed_in_turn_and_limited_in_total,
);

// ---------------------------------------------------------------------------------------
// Server backends. The servers come from the environment and are required: a test that
// skipped without them would let a broken backend pass CI.

/// A database server for the backend tests: a URL without a database, from `var`.
struct Server {
    url: String,
    postgres: bool,
    /// Databases this test created, dropped when it passes (a failed test leaves them
    /// for inspection; names are unique, so they never disturb a later run).
    created: std::sync::Mutex<Vec<String>>,
}

impl Server {
    fn from_env(var: &str, script: &str, postgres: bool) -> Self {
        let url = match std::env::var(var) {
            Ok(url) if !url.trim().is_empty() => url.trim().trim_end_matches('/').to_string(),
            _ => panic!(
                "{var} is not set, so the {script} backend cannot be tested. Start the server \
                 with `e2e/services/{script}.sh start` and run the tests with \
                 `{var}=$(e2e/services/{script}.sh url)` (a server URL without a database)."
            ),
        };
        Self {
            url,
            postgres,
            created: Default::default(),
        }
    }

    /// Runs one statement as the test user, on the server's maintenance database.
    async fn admin(&self, sql: String) {
        self.try_admin(sql).await.unwrap();
    }

    async fn try_admin(&self, sql: String) -> Result<(), sqlx::Error> {
        use sqlx::Connection;
        let sql = sqlx::AssertSqlSafe(sql);
        if self.postgres {
            let options: sqlx::postgres::PgConnectOptions = self.url.parse().unwrap();
            let mut conn = sqlx::PgConnection::connect_with(&options.database("postgres"))
                .await
                .unwrap_or_else(|e| panic!("cannot reach {}: {e}", self.url));
            sqlx::query(sql).execute(&mut conn).await?;
        } else {
            let mut conn = sqlx::MySqlConnection::connect(&self.url)
                .await
                .unwrap_or_else(|e| panic!("cannot reach {}: {e}", self.url));
            sqlx::query(sql).execute(&mut conn).await?;
        }
        Ok(())
    }

    /// Creates a fresh, empty database and returns its URL.
    async fn create_db(&self) -> String {
        let name = format!("asyncd_t_{}", uuid::Uuid::now_v7().simple());
        self.admin(if self.postgres {
            format!("CREATE DATABASE {name}")
        } else {
            format!("CREATE DATABASE {name} CHARACTER SET utf8mb4")
        })
        .await;
        self.created.lock().unwrap().push(name.clone());
        // Any query string (sslmode=…) stays after the database name.
        match self.url.split_once('?') {
            Some((base, query)) => format!("{base}/{name}?{query}"),
            None => format!("{}/{name}", self.url),
        }
    }

    async fn drop_created(&self) {
        let names = std::mem::take(&mut *self.created.lock().unwrap());
        for name in names {
            let dropped = self
                .try_admin(if self.postgres {
                    // FORCE: pools of finished scenarios may still hold idle connections.
                    format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                } else {
                    format!("DROP DATABASE IF EXISTS {name}")
                })
                .await;
            // Cleanup only: the scenario passed. PostgreSQL refuses FORCE when a process
            // the test user may not signal (an autovacuum worker) is on the database;
            // the name is unique, so a database left behind disturbs no later run.
            if let Err(err) = dropped {
                eprintln!("left database {name} behind: {err}");
            }
        }
    }

    /// Runs one scenario on a fresh, migrated database.
    async fn run<F>(&self, scenario: F)
    where
        F: for<'a> AsyncFn(&'a dyn Store),
    {
        let store = store::open(&self.create_db().await).await.unwrap();
        store.migrate().await.unwrap();
        scenario(store.as_ref()).await;
        drop(store);
        self.drop_created().await;
    }

    /// Several dispatchers (each its own store and pool, as separate processes would be)
    /// claiming from one database at once never get the same task, and between them get
    /// every task.
    async fn claimers_never_share_a_task(&self) {
        const TASKS: usize = 2000;
        const CLAIMERS: usize = 4;
        const LIMIT: u32 = 50;
        let url = self.create_db().await;
        let setup = store::open(&url).await.unwrap();
        setup.migrate().await.unwrap();
        let mut all = std::collections::HashSet::new();
        for chunk in 0..TASKS / 500 {
            // Spread over a few trigger times, so each batch's order is checked too.
            let tasks: Vec<NewTask> = (0..500)
                .map(|i| new_task("c", at(-(((chunk * 500 + i) % 7) as i64))))
                .collect();
            all.extend(tasks.iter().map(|t| t.id.clone()));
            setup.insert(&tasks, T0).await.unwrap();
        }

        let mut claimers = Vec::new();
        for n in 0..CLAIMERS {
            let url = url.clone();
            claimers.push(tokio::spawn(async move {
                let store = store::open(&url).await.unwrap();
                let owner = format!("claimer-{n}");
                let mut got = Vec::new();
                loop {
                    let batch = store
                        .claim(claim_params(
                            &TypeFilter::All,
                            T0,
                            T0,
                            60_000,
                            &owner,
                            LIMIT,
                        ))
                        .await
                        .unwrap();
                    if batch.is_empty() {
                        return got;
                    }
                    assert!(batch.len() <= LIMIT as usize);
                    assert!(
                        batch
                            .windows(2)
                            .all(|w| (w[0].trigger_at, &w[0].id) < (w[1].trigger_at, &w[1].id)),
                        "each claim is ordered by (trigger_at, id)"
                    );
                    got.extend(batch.into_iter().map(|c| c.id));
                }
            }));
        }
        let mut claimed = Vec::new();
        for (n, claimer) in claimers.into_iter().enumerate() {
            let got = claimer.await.unwrap();
            eprintln!("claimer {n} claimed {} tasks", got.len());
            claimed.extend(got);
        }
        let unique: std::collections::HashSet<String> = claimed.iter().cloned().collect();
        assert_eq!(
            unique.len(),
            claimed.len(),
            "{} tasks were claimed twice",
            claimed.len() - unique.len()
        );
        assert_eq!(unique, all, "every task was claimed");
        assert!(claim_all(setup.as_ref(), T0, T0).await.is_empty());
        drop(setup);
        self.drop_created().await;
    }

    /// Several dispatchers (each its own store and pool) beginning attempts of one job
    /// at once never have more running than its concurrency between them: each counts
    /// an attempt from after its start committed until before its finish does, a subset
    /// of what the store counts, and checks the total.
    async fn starters_never_exceed_the_concurrency_in_total(&self) {
        const TASKS: usize = 300;
        const STARTERS: usize = 4;
        const K: u32 = 5;
        let url = self.create_db().await;
        let setup = store::open(&url).await.unwrap();
        setup.migrate().await.unwrap();
        let tasks: Vec<NewTask> = (0..TASKS).map(|_| new_task("k", T0)).collect();
        setup.insert(&tasks, T0).await.unwrap();
        let running = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut starters = Vec::new();
        for n in 0..STARTERS {
            let (url, running, most) = (url.clone(), running.clone(), most.clone());
            starters.push(tokio::spawn(async move {
                use std::sync::atomic::Ordering::SeqCst;
                let store = store::open(&url).await.unwrap();
                let owner = format!("starter-{n}");
                let gate = JobGate {
                    task_type: "k",
                    concurrency: K,
                    rate: None,
                    key_limit: None,
                    keys: &[],
                };
                let mut done = 0;
                let mut held = claims_of(store.as_ref(), "k", &owner, 3, T0).await;
                while !held.is_empty() {
                    let admitted = store
                        .start_limited(start_params(&held, T0, 60_000), gate)
                        .await
                        .unwrap();
                    let now =
                        running.fetch_add(admitted.started.len(), SeqCst) + admitted.started.len();
                    most.fetch_max(now, SeqCst);
                    assert!(now <= K as usize, "{now} running, above {K}");
                    held.drain(..held.len() - admitted.deferred.len());
                    // The attempts' work: long enough for the others to try meanwhile.
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    running.fetch_sub(admitted.started.len(), SeqCst);
                    let finishes: Vec<Finish> = admitted
                        .started
                        .iter()
                        .map(|s| Finish {
                            id: s.id.clone(),
                            lease_token: s.lease_token,
                            kind: FinishKind::Succeeded { result: None },
                        })
                        .collect();
                    done += finishes.len();
                    store.finish(&finishes, at(1)).await.unwrap();
                    if held.len() < 3 {
                        held.extend(claims_of(store.as_ref(), "k", &owner, 3, T0).await);
                    }
                }
                done
            }));
        }
        let mut done = 0;
        for starter in starters {
            done += starter.await.unwrap();
        }
        assert_eq!(done, TASKS, "every task ran");
        let most = most.load(std::sync::atomic::Ordering::SeqCst);
        eprintln!("at most {most} of {K} running at once");
        // One starter holds at most 3: more means the starters overlapped, so the limit
        // was shared, not met by taking turns.
        assert!(most > 3, "the starters never overlapped (at most {most})");
        drop(setup);
        self.drop_created().await;
    }

    /// A task waiting on two dependencies that succeed at the same moment, in two
    /// dispatchers, is released: neither finisher may decide "the other one is still
    /// running" on a view from before the other committed.
    async fn concurrent_finishes_release_their_dependent(&self) {
        const PAIRS: usize = 40;
        let url = self.create_db().await;
        let setup = store::open(&url).await.unwrap();
        setup.migrate().await.unwrap();
        let (one, two) = (
            store::open(&url).await.unwrap(),
            store::open(&url).await.unwrap(),
        );
        let mut pairs = Vec::new();
        for _ in 0..PAIRS {
            let a = insert(setup.as_ref(), new_task("p", T0)).await;
            let b = insert(setup.as_ref(), new_task("p", T0)).await;
            let mut child = new_task("c", T0);
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
        self.drop_created().await;
    }
}

fn mariadb() -> Server {
    Server::from_env("ASYNCD_TEST_MYSQL_URL", "mariadb", false)
}

fn postgres() -> Server {
    Server::from_env("ASYNCD_TEST_POSTGRES_URL", "postgres", true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_claimers_never_share_a_task() {
    mariadb().claimers_never_share_a_task().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_claimers_never_share_a_task() {
    postgres().claimers_never_share_a_task().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_concurrent_finishes_release_their_dependent() {
    mariadb()
        .concurrent_finishes_release_their_dependent()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_concurrent_finishes_release_their_dependent() {
    postgres()
        .concurrent_finishes_release_their_dependent()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_starters_never_exceed_the_concurrency_in_total() {
    mariadb()
        .starters_never_exceed_the_concurrency_in_total()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_starters_never_exceed_the_concurrency_in_total() {
    postgres()
        .starters_never_exceed_the_concurrency_in_total()
        .await;
}

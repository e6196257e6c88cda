//! Claims: which due tasks a dispatcher takes, in what order, and never one another
//! dispatcher holds.

use std::time::Duration;

use std::collections::HashMap;

use asyncd_store::{
    self as store, ClaimAtInsert, Finish, FinishKind, InsertConsumedParams, Millis, NewTask, Store,
    TaskState, TypeFilter,
};

use crate::{Server, T0, at, claim_all, claim_params, insert, start_params, state};

scenarios!(
    a_claim_returns_the_tasks_trace_context,
    claim_respects_type_filter_and_limit,
    a_claim_of_many_types_takes_each_in_rank_order,
    claims_rank_priority_among_due_work_with_ageing,
    a_paused_type_waits_and_resumes_in_order,
    consumed_tasks_due_by_the_horizon_come_back_claimed,
    tasks_claimed_at_submit_stay_within_each_types_room,
    a_claim_ahead_leaves_what_is_due_for_its_runner,
    the_next_pending_eta_is_of_the_type_after_now_and_by_the_horizon,
);

/// `Store::next_pending_eta`: the earliest ETA among the type's pending tasks due after
/// `after` and by the horizon; claimed ones, other types' and those outside the window
/// do not count.
async fn the_next_pending_eta_is_of_the_type_after_now_and_by_the_horizon(store: &dyn Store) {
    assert_eq!(
        store.next_pending_eta("a", at(5), at(2_000)).await.unwrap(),
        None
    );
    insert(store, NewTask::test("a", T0)).await;
    insert(store, NewTask::test("a", at(3_000))).await;
    insert(store, NewTask::test("b", at(100))).await;
    let claimed = insert(store, NewTask::test("a", at(200))).await;
    let later = insert(store, NewTask::test("a", at(900))).await;
    insert(store, NewTask::test("a", at(1_400))).await;
    let taken = store
        .claim(store::ClaimParams {
            ahead: true,
            ..claim_params(
                &TypeFilter::Only(vec!["a".into()]),
                at(250),
                at(5),
                60_000,
                "x",
                1,
            )
        })
        .await
        .unwrap();
    assert_eq!(taken.iter().map(|t| &t.id).collect::<Vec<_>>(), [&claimed]);
    assert_eq!(
        store.next_pending_eta("a", at(5), at(2_000)).await.unwrap(),
        Some(at(900)),
        "{later}: the earliest pending in the window"
    );
    assert_eq!(
        store
            .next_pending_eta("a", at(900), at(1_399))
            .await
            .unwrap(),
        None,
        "after is exclusive, the horizon inclusive"
    );
    assert_eq!(
        store
            .next_pending_eta("a", at(900), at(1_400))
            .await
            .unwrap(),
        Some(at(1_400))
    );
}

/// `ClaimParams::ahead`: of the listed types, only the tasks due after now and by the
/// horizon, in rank order; what is due already stays pending (for `start_due`), as do
/// other types' and a paused type's.
async fn a_claim_ahead_leaves_what_is_due_for_its_runner(store: &dyn Store) {
    let due = insert(store, NewTask::test("a", T0)).await;
    let soon = insert(store, NewTask::test("a", at(1_000))).await;
    let sooner_urgent = insert(store, {
        let mut task = NewTask::test("b", at(1_500));
        task.priority = 9;
        task
    })
    .await;
    let beyond = insert(store, NewTask::test("a", at(9_000))).await;
    let other = insert(store, NewTask::test("c", at(1_000))).await;
    let paused = insert(store, NewTask::test("p", at(1_000))).await;
    store.pause("p", T0).await.unwrap();
    let types = TypeFilter::Only(vec!["a".into(), "b".into(), "p".into()]);
    let claimed: Vec<String> = store
        .claim(store::ClaimParams {
            ahead: true,
            ..claim_params(&types, at(2_000), at(5), 60_000, "x", 10)
        })
        .await
        .unwrap()
        .into_iter()
        .map(|task| task.id)
        .collect();
    assert_eq!(
        claimed,
        [sooner_urgent.clone(), soon.clone()],
        "in rank order"
    );
    for (id, expected) in [
        (&due, TaskState::Pending),
        (&beyond, TaskState::Pending),
        (&other, TaskState::Pending),
        (&paused, TaskState::Pending),
        (&soon, TaskState::Claimed),
    ] {
        assert_eq!(state(store, id).await, expected, "{id}");
    }
    // One type, and a limit.
    let one = store
        .claim(store::ClaimParams {
            ahead: true,
            ..claim_params(
                &TypeFilter::Only(vec!["a".into()]),
                at(10_000),
                at(5),
                60_000,
                "x",
                1,
            )
        })
        .await
        .unwrap();
    assert_eq!(one.iter().map(|t| &t.id).collect::<Vec<_>>(), [&beyond]);
    assert_eq!(state(store, &due).await, TaskState::Pending);
}

/// The submitter's trace context comes back with the claim, as stored (issue 16).
async fn a_claim_returns_the_tasks_trace_context(store: &dyn Store) {
    let trace = asyncd::trace::TraceContext::parse(
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        Some("vendor=1,other=x"),
    )
    .unwrap();
    let traced = insert(store, NewTask::test("t", T0).trace(trace.clone())).await;
    let plain = insert(store, NewTask::test("t", T0)).await;
    let claimed = claim_all(store, T0, T0).await;
    let trace_of = |id: &str| claimed.iter().find(|c| c.id == id).unwrap().trace.clone();
    assert_eq!(trace_of(&traced), Some(trace));
    assert_eq!(trace_of(&plain), None);
}

async fn claim_respects_type_filter_and_limit(store: &dyn Store) {
    for _ in 0..5 {
        insert(store, NewTask::test("mine", T0)).await;
        insert(store, NewTask::test("theirs", T0)).await;
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

/// A dispatcher serving more jobs than SQLite takes in one claim statement (its claim
/// walks each type apart, in runs of 400 types): the limit holds across the runs, and
/// what is claimed first is the earliest of every type, not the first types'.
async fn a_claim_of_many_types_takes_each_in_rank_order(store: &dyn Store) {
    const TYPES: i64 = 450;
    let types: Vec<String> = (0..TYPES).map(|n| format!("t{n:03}")).collect();
    // the last type's task is due first, the first type's last
    for (n, task_type) in types.iter().enumerate() {
        insert(store, NewTask::test(task_type, at(-(n as i64) * 10))).await;
    }
    insert(store, NewTask::test("not-mine", at(-100_000))).await;
    let only = TypeFilter::Only(types.clone());
    let first = store
        .claim(claim_params(&only, T0, T0, 1000, "me", 420))
        .await
        .unwrap();
    assert_eq!(first.len(), 420);
    let rest = store
        .claim(claim_params(&only, T0, T0, 1000, "me", 100))
        .await
        .unwrap();
    assert_eq!(rest.len(), TYPES as usize - 420);
    let mut claimed: Vec<&str> = first
        .iter()
        .chain(&rest)
        .map(|t| t.task_type.as_str())
        .collect();
    claimed.sort();
    assert_eq!(
        claimed,
        types.iter().map(String::as_str).collect::<Vec<_>>()
    );
    // within the first run of types (on SQLite) the earliest due were taken first
    assert!(
        rest.iter().all(|t| t.task_type.as_str() < "t030"),
        "the first claim left the latest of the first types: {:?}",
        rest.iter().map(|t| &t.task_type).collect::<Vec<_>>()
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
                insert(
                    store,
                    NewTask::test(format!("other{run}"), at(-100_000 + i)),
                )
                .await;
            }
        }
        let mut low = Vec::new();
        for i in 0..20 {
            low.push(insert(store, NewTask::test(task_type, at(i * 3_000))).await);
        }
        let mut high = NewTask::test(task_type, at(60_000));
        high.priority = 9;
        let high = insert(store, high).await;
        let aged = insert(store, NewTask::test(task_type, at(-31_000))).await;
        let mut later = NewTask::test(task_type, at(60_001));
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
        let mut paused = NewTask::test(task_type, at(60_002));
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

/// A paused task type is neither claimed (by a poll or by id) nor started, and keeps its
/// tasks pending; other types go on; a resume hands every one of them out again, in order.
async fn a_paused_type_waits_and_resumes_in_order(store: &dyn Store) {
    let mut paused = Vec::new();
    for i in 0..5 {
        paused.push(insert(store, NewTask::test("held", at(i))).await);
    }
    let other = insert(store, NewTask::test("free", T0)).await;
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
    assert_eq!(
        store.paused_types().await.unwrap(),
        vec![("held".into(), at(10))]
    );

    let claimed: Vec<String> = claim_all(store, at(100), at(100))
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(claimed, vec![other], "only the unpaused type is claimed");
    let by_id = store
        .claim_ids(asyncd_store::ClaimIdsParams {
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
    assert!(store.paused_types().await.unwrap().is_empty());
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

/// Several dispatchers (each its own store and pool, as separate processes would be)
/// claiming from one database at once never get the same task, and between them get
/// every task.
async fn claimers_never_share_a_task(server: &Server) {
    const TASKS: usize = 2000;
    const CLAIMERS: usize = 4;
    const LIMIT: u32 = 50;
    let url = server.create_db().await;
    let setup = store::open(&url).await.unwrap();
    setup.migrate().await.unwrap();
    let mut all = std::collections::HashSet::new();
    for chunk in 0..TASKS / 500 {
        // Spread over a few trigger times, so each batch's order is checked too.
        let tasks: Vec<NewTask> = (0..500)
            .map(|i| NewTask::test("c", at(-(((chunk * 500 + i) % 7) as i64))))
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
    server.drop_created().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_claimers_never_share_a_task() {
    let Some(server) = Server::mariadb() else {
        return;
    };
    claimers_never_share_a_task(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_claimers_never_share_a_task() {
    let Some(server) = Server::postgres() else {
        return;
    };
    claimers_never_share_a_task(&server).await;
}

/// A Kafka consumer's batch (`insert_consumed`): the new tasks due by the horizon come
/// back claimed by the consumer, with the lease token and secret the store holds, so
/// the attempt begins on them and no other claim takes them. A task due later, one of a
/// paused type, and one already stored (a message consumed twice) are left pending to
/// the claimer. SQLite and PostgreSQL claim as they insert; MariaDB claims after.
async fn consumed_tasks_due_by_the_horizon_come_back_claimed(store: &dyn Store) {
    let twice = NewTask::test("k", T0);
    insert(store, twice.clone()).await;
    store.pause("stopped", T0).await.unwrap();
    let due = [
        NewTask::test("k", T0),
        NewTask::test("k", at(500)).priority(3),
    ];
    let later = NewTask::test("k", at(60_000));
    let paused = NewTask::test("stopped", T0);
    let batch = [
        due[0].clone(),
        twice.clone(),
        later.clone(),
        due[1].clone(),
        paused.clone(),
    ];
    let consumed = store
        .insert_consumed(InsertConsumedParams {
            tasks: &batch,
            horizon: at(1_000),
            now: T0,
            hold: Duration::from_secs(30),
            owner: "consumer",
        })
        .await
        .unwrap();
    assert!(consumed.refused.is_empty(), "{:?}", consumed.refused);
    let claimed = consumed.claimed;
    let mut ids: Vec<&str> = claimed.iter().map(|t| t.id.as_str()).collect();
    ids.sort_unstable();
    let mut expected = vec![due[0].id.as_str(), due[1].id.as_str()];
    expected.sort_unstable();
    assert_eq!(
        ids, expected,
        "the new tasks due by the horizon, and only those"
    );
    for task in &claimed {
        let stored = store.get(&task.id).await.unwrap().unwrap();
        assert_eq!(stored.state, TaskState::Claimed);
        assert_eq!(stored.lease_token, task.lease_token);
        assert_eq!(stored.lease_secret, task.lease_secret);
        assert_eq!(stored.attempt, 0);
        let sent = due.iter().find(|d| d.id == task.id).unwrap();
        assert_eq!(
            (task.priority, task.trigger_at),
            (sent.priority, sent.trigger_at)
        );
        assert_eq!(task.payload.get(), sent.payload.get());
    }
    // Another dispatcher's claim takes what was left pending, and none of the claimed.
    let others = store
        .claim(claim_params(
            &TypeFilter::All,
            at(120_000),
            T0,
            5_000,
            "other",
            100,
        ))
        .await
        .unwrap();
    let mut left: Vec<&str> = others.iter().map(|t| t.id.as_str()).collect();
    left.sort_unstable();
    let mut pending = vec![twice.id.as_str(), later.id.as_str()];
    pending.sort_unstable();
    assert_eq!(left, pending, "the paused type's task waits for its resume");
    assert_eq!(state(store, &paused.id).await, TaskState::Pending);
    // The consumer begins its attempts with the tokens it was handed.
    let claims: Vec<(String, i64)> = claimed
        .iter()
        .map(|t| (t.id.clone(), t.lease_token))
        .collect();
    let started = store.start(start_params(&claims, T0, 1_000)).await.unwrap();
    assert_eq!(started.len(), 2);
    assert!(started.iter().all(|s| s.attempt == 1));
}

/// Claim at submit (`insert_claiming`, a dispatcher in the submitting process): of the
/// new tasks due by the horizon, at most each type's room goes in claimed by the
/// dispatcher, the first in the batch first, with the token and secret the store holds;
/// a task past its type's room, a type without room, a task due later, one of a type
/// paused through the API and a repeat of a stored id go in (or stay) pending for any
/// dispatcher's claim. Every dialect inserts runs of rows per statement (MariaDB's runs
/// all or nothing: the repeat sends its run row by row), so the room is used: the first
/// two of a's due tasks go in claimed.
async fn tasks_claimed_at_submit_stay_within_each_types_room(store: &dyn Store) {
    let twice = NewTask::test("a", T0);
    insert(store, twice.clone()).await;
    store.pause("stopped", T0).await.unwrap();
    let batch = vec![
        NewTask::test("a", T0),
        NewTask::test("a", at(500)),
        NewTask::test("a", T0),
        NewTask::test("a", at(60_000)),
        twice.clone(),
        NewTask::test("b", T0),
        NewTask::test("stopped", T0),
    ];
    let room: HashMap<String, usize> = [("a".to_string(), 2), ("stopped".to_string(), 5)].into();
    let (outcomes, claimed) = store
        .insert_claiming(
            &batch,
            T0,
            ClaimAtInsert {
                owner: "local",
                hold: Duration::from_secs(30),
                horizon: at(1_000),
                room: Some(&room),
            },
        )
        .await
        .unwrap();
    assert_eq!(outcomes.len(), batch.len(), "one answer per task");
    assert!(
        matches!(outcomes[4], store::InsertOutcome::Duplicate { .. }),
        "{:?}",
        outcomes[4]
    );
    let allowed = [batch[0].id.as_str(), batch[1].id.as_str()];
    for task in &claimed {
        assert!(
            allowed.contains(&task.id.as_str()),
            "{} was claimed beyond a's room of 2, or against a pause or a horizon",
            task.id
        );
        let stored = store.get(&task.id).await.unwrap().unwrap();
        assert_eq!(stored.state, TaskState::Claimed);
        assert_eq!(stored.lease_token, task.lease_token);
        assert_eq!(stored.lease_secret, task.lease_secret);
    }
    // Another dispatcher's claim takes everything else due but the paused type's.
    let others = claim_all(store, at(120_000), T0).await;
    let mut left: Vec<&str> = others.iter().map(|t| t.id.as_str()).collect();
    left.sort_unstable();
    let mut expected: Vec<&str> = batch
        .iter()
        .filter(|t| t.task_type != "stopped" && !claimed.iter().any(|c| c.id == t.id))
        .map(|t| t.id.as_str())
        .collect();
    expected.sort_unstable();
    expected.dedup();
    assert_eq!(left, expected);
    assert_eq!(state(store, &batch[6].id).await, TaskState::Pending);
    let ids: Vec<&str> = claimed.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, [batch[0].id.as_str(), batch[1].id.as_str()]);
}

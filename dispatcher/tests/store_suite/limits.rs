//! A job's limits as the start of attempts keeps them: concurrency and rate in total, and
//! concurrency keys claimed in turn.

use std::time::Duration;

use asyncd_spec::RateLimit;
use asyncd_store::{
    self as store, CancelOutcome, DueStart, FairParams, Finish, FinishKind, HeldBy, JobGate,
    KeyOrder, Millis, NewTask, RateBucket, StartDueParams, Store, StoreError, TaskState,
    TypeFilter, domain,
};

use crate::server::Held;
use crate::{Server, T0, at, claim_params, insert, start_params, state, succeeded};

scenarios!(
    keys_are_claimed_in_turn_and_limited_in_total,
    a_cooling_key_waits_while_the_other_keys_go_on,
    limits_hold_in_total_across_starters,
    due_tasks_begin_in_one_write_within_the_limits,
    outcomes_begin_the_next_due_attempts_in_the_same_write,
);

/// Claims `n` due tasks of `task_type` for `owner`, as `(id, token)` pairs in rank order.
pub(crate) async fn claims_of(
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

/// A key cooling down (its executor answered 429 with `Retry-After`) gets no fair claim
/// until its end, while the job's other keys, its tasks without a key and the same key
/// of another job go on; an earlier end does not shorten a cooldown; the retention
/// pass deletes only those that ended.
async fn a_cooling_key_waits_while_the_other_keys_go_on(store: &dyn Store) {
    let keyed = |key: &str, ms: i64| NewTask::test("cooled", at(ms)).concurrency_key(key);
    let a = insert(store, keyed("a", 0)).await;
    let b = insert(store, keyed("b", 1)).await;
    let keyless = insert(store, NewTask::test("cooled", at(2))).await;
    let other_job = insert(store, NewTask::test("other", at(0)).concurrency_key("a")).await;
    store
        .cool_down_key("cooled", "a", at(10_000))
        .await
        .unwrap();
    store.cool_down_key("cooled", "a", at(5_000)).await.unwrap();
    let fair = |task_type: &'static str, now: Millis| async move {
        let only = TypeFilter::Only(vec![task_type.into()]);
        let mut ids: Vec<String> = store
            .claim_fair(
                claim_params(&only, now, now, 60_000, "x", 100),
                FairParams {
                    per_key: 5,
                    after: None,
                    order: KeyOrder::Rank,
                    key_limits: None,
                    tenants: None,
                },
            )
            .await
            .unwrap()
            .tasks
            .into_iter()
            .map(|c| c.id)
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(
        store.resting_keys("cooled", at(20), 10).await.unwrap(),
        [("a".to_string(), at(10_000))],
        "the overview's resting keys: a, until the later end"
    );
    assert!(
        store
            .resting_keys("other", at(20), 10)
            .await
            .unwrap()
            .is_empty(),
        "another job's key \"a\" does not rest"
    );
    assert!(
        store
            .resting_keys("cooled", at(10_000), 10)
            .await
            .unwrap()
            .is_empty(),
        "a's cooldown ended"
    );
    let mut others = vec![b, keyless];
    others.sort();
    assert_eq!(
        fair("cooled", at(20)).await,
        others,
        "a rests; b and the keyless go on"
    );
    assert_eq!(
        fair("other", at(20)).await,
        vec![other_job],
        "another job's key \"a\""
    );
    assert!(
        fair("cooled", at(9_999)).await.is_empty(),
        "the earlier end did not shorten a's cooldown"
    );
    assert_eq!(
        fair("cooled", at(10_000)).await,
        vec![a],
        "a's cooldown ended"
    );
    store
        .cool_down_key("cooled", "c", at(50_000))
        .await
        .unwrap();
    assert_eq!(store.purge_key_cooldowns(at(20_000), 100).await.unwrap(), 1);
    assert_eq!(store.purge_key_cooldowns(at(20_000), 100).await.unwrap(), 0);
    assert_eq!(store.purge_key_cooldowns(at(50_001), 100).await.unwrap(), 1);
}

/// `concurrencyKey`: the fair claim takes each key's best task before any key's second,
/// counts a key's claimed and running tasks against its share, and the start keeps each
/// key's running attempts within its limit across starters, skipping a full key's claims
/// without holding back the claims behind them.
async fn keys_are_claimed_in_turn_and_limited_in_total(store: &dyn Store) {
    let keyed = |key: &str, ms: i64| NewTask::test("keyed", at(ms)).concurrency_key(key);
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
    let other = insert(store, NewTask::test("unkeyed", T0)).await;
    let only = TypeFilter::Only(vec!["keyed".into()]);
    let fair_after = |limit: u32, now: Millis, owner: &'static str, after: Option<&'static str>| {
        let only = only.clone();
        async move {
            let mut ids: Vec<String> = store
                .claim_fair(
                    claim_params(&only, now, now, 60_000, owner, limit),
                    FairParams {
                        per_key: 2,
                        after,
                        order: KeyOrder::Rank,
                        key_limits: None,
                        tenants: None,
                    },
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
        key_rate: None,
        keys: &keys,
        limiters: &[],
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
        insert(store, NewTask::test("slots", T0)).await;
    }
    let gate = JobGate {
        task_type: "slots",
        concurrency: 3,
        rate: None,
        key_limit: None,
        key_rate: None,
        keys: &[],
        limiters: &[],
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
        insert(store, NewTask::test("rated", T0)).await;
    }
    let gate = JobGate {
        task_type: "rated",
        concurrency: 100,
        rate: Some(RateLimit {
            per_second: 10,
            burst: 2,
        }),
        key_limit: None,
        key_rate: None,
        keys: &[],
        limiters: &[],
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

pub(crate) fn start_due_params(now: Millis, owner: &str, limit: u32) -> StartDueParams<'_> {
    StartDueParams {
        now,
        owner,
        grace: Duration::from_secs(5),
        limit,
        probe: true,
    }
}

/// The same without the reader's look first, as a runner whose last look was full asks.
fn start_due_unprobed(now: Millis, owner: &str, limit: u32) -> StartDueParams<'_> {
    StartDueParams {
        probe: false,
        ..start_due_params(now, owner, limit)
    }
}

/// `start_due`: a job's due pending tasks go straight to running in rank order, within
/// its concurrency and rate in total (counting attempts begun from claims), never a
/// claimed, future, paused or other type's task; each comes back as its claim would
/// read it, with the attempt and token its outcome is fenced by.
async fn due_tasks_begin_in_one_write_within_the_limits(store: &dyn Store) {
    let first = insert(store, NewTask::test("due", T0)).await;
    let urgent = insert(store, {
        let mut task = NewTask::test("due", at(1));
        task.priority = 9;
        task
    })
    .await;
    let third = insert(store, NewTask::test("due", at(2))).await;
    let future = insert(store, NewTask::test("due", at(60_000))).await;
    let other = insert(store, NewTask::test("other", T0)).await;
    let gate = JobGate {
        task_type: "due",
        concurrency: 3,
        rate: None,
        key_limit: None,
        key_rate: None,
        keys: &[],
        limiters: &[],
    };
    // Another dispatcher's claim of one due task: not taken, but counted once begun.
    let claimed = claims_of(store, "due", "b", 1, at(5)).await;
    assert_eq!(claimed[0].0, urgent, "the claim takes the best ranked");
    let began = store
        .start_limited(start_params(&claimed, at(5), 0), gate)
        .await
        .unwrap();
    assert_eq!(began.started.len(), 1);

    let due = store
        .start_due(start_due_params(at(5), "a", 2), gate)
        .await
        .unwrap();
    let ids: Vec<&str> = due.tasks.iter().map(|(t, _)| t.id.as_str()).collect();
    assert_eq!(ids, [first.as_str(), third.as_str()], "in rank order");
    assert_eq!(due.held_by, None, "room for the two asked for");
    for (task, started) in &due.tasks {
        let record = store.get(&task.id).await.unwrap().unwrap();
        assert_eq!(record.state, TaskState::Running);
        assert_eq!((task.attempt, started.attempt), (0, 1));
        assert_eq!(started.lease_token, record.lease_token);
        assert_eq!(task.task_type, "due");
    }
    assert_eq!(state(store, &future).await, TaskState::Pending);
    assert_eq!(state(store, &other).await, TaskState::Pending);

    // Full (3 running in total): nothing begins until an outcome is written.
    let late = insert(store, NewTask::test("due", at(6))).await;
    let full = store
        .start_due(start_due_unprobed(at(7), "a", 10), gate)
        .await
        .unwrap();
    assert_eq!(
        (full.tasks.len(), full.held_by),
        (0, Some(HeldBy::Concurrency))
    );
    let (done, attempt) = &due.tasks[0];
    let finished = store
        .finish(
            &[Finish {
                id: done.id.clone(),
                lease_token: attempt.lease_token,
                kind: FinishKind::Succeeded { result: None },
            }],
            at(8),
        )
        .await
        .unwrap();
    assert_eq!(
        finished,
        [true],
        "the outcome is fenced by the token begun with"
    );
    // A pause (`Store::pause`) keeps its tasks pending.
    store.pause("due", at(9)).await.unwrap();
    for params in [start_due_params, start_due_unprobed] {
        let paused = store.start_due(params(at(9), "a", 10), gate).await.unwrap();
        assert!(paused.tasks.is_empty());
    }
    store.resume("due").await.unwrap();
    let after = store
        .start_due(start_due_params(at(10), "a", 10), gate)
        .await
        .unwrap();
    let ids: Vec<&str> = after.tasks.iter().map(|(t, _)| t.id.as_str()).collect();
    assert_eq!(ids, [late.as_str()]);

    // A rate of 10/s with a burst of 2, shared with the start of claims.
    for _ in 0..5 {
        insert(store, NewTask::test("rated", T0)).await;
    }
    let gate = JobGate {
        task_type: "rated",
        concurrency: 100,
        rate: Some(RateLimit {
            per_second: 10,
            burst: 2,
        }),
        key_limit: None,
        key_rate: None,
        keys: &[],
        limiters: &[],
    };
    assert_eq!(
        store.rate_bucket(RateBucket::Job("rated")).await.unwrap(),
        None,
        "no bucket before the first start"
    );
    let burst = store
        .start_due(start_due_params(T0, "a", 5), gate)
        .await
        .unwrap();
    assert_eq!(burst.tasks.len(), 2, "the burst");
    // The jobs overview reads the bucket as the start left it: empty at T0.
    assert_eq!(
        store.rate_bucket(RateBucket::Job("rated")).await.unwrap(),
        Some(domain::Bucket {
            milli_tokens: 0,
            at: T0
        })
    );
    assert_eq!(
        burst.held_by,
        Some(HeldBy::Rate {
            next_token: Duration::from_millis(100)
        })
    );
    let claimed = claims_of(store, "rated", "b", 1, at(40)).await;
    let none = store
        .start_limited(start_params(&claimed, at(40), 0), gate)
        .await
        .unwrap();
    assert_eq!(none.started.len(), 0, "the claims' start shares the bucket");
    let one = store
        .start_due(start_due_params(at(100), "a", 5), gate)
        .await
        .unwrap();
    assert_eq!(one.tasks.len(), 1);
    // Nothing due: the unprobed look begins nothing and names no limit.
    let gate = JobGate {
        task_type: "nothing",
        rate: None,
        ..gate
    };
    let empty = store
        .start_due(start_due_unprobed(at(10_000), "a", 5), gate)
        .await
        .unwrap();
    assert_eq!((empty.tasks.len(), empty.held_by), (0, None));
}

/// Several dispatchers (each its own store and pool) beginning attempts of one job
/// at once — a third from their claims, a third straight from pending (`start_due`),
/// a third with the outcomes of their last attempts (`finish_and_start_due`) — never
/// have more running than its concurrency between them: each counts an attempt from
/// after its start committed until before its finish does, a subset of what the store
/// counts, and checks the total.
async fn starters_never_exceed_the_concurrency_in_total(server: &Server) {
    const TASKS: usize = 300;
    const STARTERS: usize = 6;
    const K: u32 = 5;
    let url = server.create_db().await;
    let setup = store::open(&url).await.unwrap();
    setup.migrate().await.unwrap();
    let tasks: Vec<NewTask> = (0..TASKS).map(|_| NewTask::test("k", T0)).collect();
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
                key_rate: None,
                keys: &[],
                limiters: &[],
            };
            let mut done = 0;
            if n % 3 == 2 {
                // The outcomes and the next starts in one write. A start that finds the
                // limits row held begins nothing: it stops there, the others go on.
                let mut finishing: Vec<Finish> = Vec::new();
                loop {
                    // Not counted from here on: the write may record them at any moment.
                    running.fetch_sub(finishing.len(), SeqCst);
                    done += finishing.len();
                    let start = DueStart {
                        params: start_due_params(T0, &owner, 3),
                        gate,
                    };
                    let (applied, mut started) = store
                        .finish_and_start_due(&finishing, at(1), &[start])
                        .await
                        .unwrap();
                    assert!(applied.iter().all(|a| *a), "{applied:?}");
                    let due = started.remove(0);
                    if due.tasks.is_empty() && due.held_by.is_none() {
                        break done;
                    }
                    let now = running.fetch_add(due.tasks.len(), SeqCst) + due.tasks.len();
                    most.fetch_max(now, SeqCst);
                    assert!(now <= K as usize, "{now} running, above {K}");
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    finishing = due
                        .tasks
                        .iter()
                        .map(|(_, s)| succeeded(&s.id, s.lease_token))
                        .collect();
                }
            } else if n % 3 == 1 {
                // Claim and begin in one write.
                loop {
                    let due = store
                        .start_due(start_due_params(T0, &owner, 3), gate)
                        .await
                        .unwrap();
                    if due.tasks.is_empty() && due.held_by.is_none() {
                        break done;
                    }
                    let now = running.fetch_add(due.tasks.len(), SeqCst) + due.tasks.len();
                    most.fetch_max(now, SeqCst);
                    assert!(now <= K as usize, "{now} running, above {K}");
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    running.fetch_sub(due.tasks.len(), SeqCst);
                    let finishes: Vec<Finish> = due
                        .tasks
                        .iter()
                        .map(|(_, s)| succeeded(&s.id, s.lease_token))
                        .collect();
                    done += finishes.len();
                    store.finish(&finishes, at(1)).await.unwrap();
                }
            } else {
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
                        .map(|s| succeeded(&s.id, s.lease_token))
                        .collect();
                    done += finishes.len();
                    store.finish(&finishes, at(1)).await.unwrap();
                    if held.len() < 3 {
                        held.extend(claims_of(store.as_ref(), "k", &owner, 3, T0).await);
                    }
                }
                done
            }
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
    server.drop_created().await;
}

/// The next starts written with a batch of outcomes never wait for the job's limits row
/// while another dispatcher's start holds it: the outcomes commit at once, without
/// those starts (the runner's own look, which waits its turn, begins them), and the
/// next write, with the row free, refills again. An outcome waiting on another
/// transaction is one more that a crash would run again.
async fn a_refill_never_waits_for_a_limits_row_another_start_holds(server: &Server) {
    let url = server.create_db().await;
    let store = store::open(&url).await.unwrap();
    store.migrate().await.unwrap();
    for _ in 0..3 {
        insert(store.as_ref(), NewTask::test("held", T0)).await;
    }
    let gate = JobGate {
        task_type: "held",
        concurrency: 1,
        rate: None,
        key_limit: None,
        key_rate: None,
        keys: &[],
        limiters: &[],
    };
    let running = store
        .start_due(start_due_params(at(5), "a", 1), gate)
        .await
        .unwrap();
    let [(first, attempt)] = &running.tasks[..] else {
        panic!("one begun: {:?}", running.tasks);
    };
    let held = Held::take(
        &url,
        "SELECT tokens FROM job_limits WHERE task_type = 'held' FOR UPDATE",
    )
    .await;
    let finish = Finish {
        id: first.id.clone(),
        lease_token: attempt.lease_token,
        kind: FinishKind::Succeeded { result: None },
    };
    let start = DueStart {
        params: start_due_params(at(6), "a", 1),
        gate,
    };
    let (applied, started) = tokio::time::timeout(
        Duration::from_secs(10),
        store.finish_and_start_due(std::slice::from_ref(&finish), at(6), &[start]),
    )
    .await
    .expect("the outcomes waited for the held limits row")
    .unwrap();
    assert_eq!(applied, [true]);
    assert!(started[0].tasks.is_empty(), "{:?}", started[0].tasks);
    assert_eq!(state(store.as_ref(), &first.id).await, TaskState::Succeeded);
    held.release().await;

    let (_, started) = store
        .finish_and_start_due(&[], at(7), &[start])
        .await
        .unwrap();
    assert_eq!(
        started[0].tasks.len(),
        1,
        "the row free, the slot is refilled"
    );
    drop(store);
    server.drop_created().await;
}

#[tokio::test]
async fn mariadb_a_refill_never_waits_for_a_limits_row_another_start_holds() {
    let Some(server) = Server::mariadb() else {
        return;
    };
    a_refill_never_waits_for_a_limits_row_another_start_holds(&server).await;
}

#[tokio::test]
async fn postgres_a_refill_never_waits_for_a_limits_row_another_start_holds() {
    let Some(server) = Server::postgres() else {
        return;
    };
    a_refill_never_waits_for_a_limits_row_another_start_holds(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_starters_never_exceed_the_concurrency_in_total() {
    let Some(server) = Server::mariadb() else {
        return;
    };
    starters_never_exceed_the_concurrency_in_total(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_starters_never_exceed_the_concurrency_in_total() {
    let Some(server) = Server::postgres() else {
        return;
    };
    starters_never_exceed_the_concurrency_in_total(&server).await;
}

/// `finish_and_start_due`: outcomes and the next starts in one write. An attempt whose
/// outcome the write records no longer counts against its job's concurrency; one whose
/// stale outcome applies nothing still does. Each start is of its own job, and the
/// results come back in the order the starts were given.
async fn outcomes_begin_the_next_due_attempts_in_the_same_write(store: &dyn Store) {
    let due: Vec<String> = [
        insert(store, NewTask::test("refill", T0)).await,
        insert(store, NewTask::test("refill", at(1))).await,
        insert(store, NewTask::test("refill", at(2))).await,
        insert(store, NewTask::test("refill", at(3))).await,
    ]
    .into();
    let other = insert(store, NewTask::test("another", T0)).await;
    let gate = JobGate {
        task_type: "refill",
        concurrency: 2,
        rate: None,
        key_limit: None,
        key_rate: None,
        keys: &[],
        limiters: &[],
    };
    let running = store
        .start_due(start_due_params(at(5), "a", 2), gate)
        .await
        .unwrap();
    let [(first, first_attempt), (second, second_attempt)] = &running.tasks[..] else {
        panic!("two begun: {:?}", running.tasks);
    };
    assert_eq!([&first.id, &second.id], [&due[0], &due[1]]);
    let finishes = [
        Finish {
            id: first.id.clone(),
            lease_token: first_attempt.lease_token,
            kind: FinishKind::Succeeded { result: None },
        },
        // Stale: the second attempt runs on.
        Finish {
            id: second.id.clone(),
            lease_token: second_attempt.lease_token - 1,
            kind: FinishKind::Succeeded { result: None },
        },
    ];
    let starts = [
        DueStart {
            params: start_due_params(at(6), "a", 2),
            gate,
        },
        DueStart {
            params: start_due_params(at(6), "a", 5),
            gate: JobGate {
                task_type: "another",
                concurrency: 10,
                ..gate
            },
        },
    ];
    let (applied, started) = store
        .finish_and_start_due(&finishes, at(6), &starts)
        .await
        .unwrap();
    assert_eq!(applied, [true, false]);
    let ids = |n: usize| -> Vec<&str> {
        started[n]
            .tasks
            .iter()
            .map(|(task, _)| task.id.as_str())
            .collect()
    };
    assert_eq!(ids(0), [due[2].as_str()], "the slot the outcome freed");
    assert_eq!(started[0].held_by, Some(HeldBy::Concurrency));
    assert_eq!(
        ids(1),
        [other.as_str()],
        "in the order the starts were given"
    );
    assert_eq!(started[1].held_by, None);
    assert_eq!(state(store, &due[0]).await, TaskState::Succeeded);
    assert_eq!(state(store, &due[1]).await, TaskState::Running);
    assert_eq!(state(store, &due[2]).await, TaskState::Running);
    assert_eq!(state(store, &due[3]).await, TaskState::Pending);
    let (task, attempt) = &started[0].tasks[0];
    assert_eq!(
        store.get(&task.id).await.unwrap().unwrap().lease_token,
        attempt.lease_token
    );

    // A keyed job's turns are the claim's to keep: refused, nothing written.
    let refused = store
        .finish_and_start_due(
            &finishes[1..],
            at(7),
            &[DueStart {
                params: start_due_params(at(7), "a", 1),
                gate: JobGate {
                    key_limit: Some(1),
                    key_rate: None,
                    ..gate
                },
            }],
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::Corrupt(_))),
        "{refused:?}"
    );
    assert_eq!(state(store, &due[3]).await, TaskState::Pending);
}

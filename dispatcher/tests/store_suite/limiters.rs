//! AsyncLimiters: a concurrency and a rate shared by several jobs, held in total across
//! the jobs and every starter, through each start path (`start_due`, `start_limited`,
//! `finish_and_start_due`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use asyncd_spec::{Limiter, RateLimit};
use asyncd_store::{self as store, DueStart, Finish, HeldBy, JobGate, NewTask, Store, TaskState};

use crate::limits::{claims_of, start_due_params};
use crate::{Server, T0, at, insert, start_params, state, succeeded};

scenarios!(
    a_limiter_holds_the_jobs_that_name_it_in_total,
    a_job_the_limiter_held_back_gets_the_next_slot_freed,
);

fn limiter(id: &str, concurrency: Option<u32>, rate: Option<RateLimit>) -> Arc<Limiter> {
    Arc::new(Limiter {
        id: id.into(),
        concurrency,
        rate,
        task_types: vec!["payout".into(), "refund".into()],
    })
}

fn gate<'a>(task_type: &'a str, limiters: &'a [Arc<Limiter>]) -> JobGate<'a> {
    JobGate {
        task_type,
        concurrency: 100,
        rate: None,
        key_limit: None,
        key_rate: None,
        keys: &[],
        limiters,
    }
}

/// Two jobs naming one limiter of 3 share its 3 slots whichever path begins their
/// attempts; a slot freed by one job's outcome goes to the other; a job that does not
/// name it is not held; a shared rate is spent by both jobs' starts.
async fn a_limiter_holds_the_jobs_that_name_it_in_total(store: &dyn Store) {
    for n in 0..4 {
        insert(store, NewTask::test("refund", at(n))).await;
        insert(store, NewTask::test("payout", at(n))).await;
        insert(store, NewTask::test("mail", at(n))).await;
    }
    let psp = [limiter("psp", Some(3), None)];
    let refunds = store
        .start_due(start_due_params(at(10), "a", 2), gate("refund", &psp))
        .await
        .unwrap();
    assert_eq!((refunds.tasks.len(), refunds.held_by), (2, None));
    let payouts = store
        .start_due(start_due_params(at(10), "b", 4), gate("payout", &psp))
        .await
        .unwrap();
    assert_eq!(
        (payouts.tasks.len(), payouts.held_by),
        (1, Some(HeldBy::Limiter)),
        "one slot of three left for the other job"
    );
    // A job that names no limiter is not held by it.
    let mail = store
        .start_due(start_due_params(at(10), "c", 4), gate("mail", &[]))
        .await
        .unwrap();
    assert_eq!(mail.tasks.len(), 4);
    // Another dispatcher's claims of the first job wait too.
    let claimed = claims_of(store, "refund", "d", 2, at(11)).await;
    assert_eq!(claimed.len(), 2);
    let admitted = store
        .start_limited(start_params(&claimed, at(11), 0), gate("refund", &psp))
        .await
        .unwrap();
    assert_eq!(
        (
            admitted.started.len(),
            admitted.deferred.len(),
            admitted.held_by
        ),
        (0, 2, Some(HeldBy::Limiter))
    );
    // A refund's outcome frees a slot, refilled in the same write by the payouts.
    let (done, attempt) = &refunds.tasks[0];
    let payout_start = DueStart {
        params: start_due_params(at(12), "b", 4),
        gate: gate("payout", &psp),
    };
    let (applied, started) = store
        .finish_and_start_due(
            &[succeeded(&done.id, attempt.lease_token)],
            at(12),
            &[payout_start],
        )
        .await
        .unwrap();
    assert_eq!(applied, [true]);
    assert_eq!(
        (started[0].tasks.len(), started[0].held_by),
        (1, Some(HeldBy::Limiter))
    );
    assert_eq!(state(store, &claimed[0].0).await, TaskState::Claimed);
    // Both jobs' starts in one write count each other's: one slot, taken once.
    let (_, attempt) = &refunds.tasks[1];
    let (_, started) = store
        .finish_and_start_due(
            &[succeeded(&refunds.tasks[1].0.id, attempt.lease_token)],
            at(13),
            &[
                DueStart {
                    params: start_due_params(at(13), "b", 4),
                    gate: gate("payout", &psp),
                },
                DueStart {
                    params: start_due_params(at(13), "a", 4),
                    gate: gate("refund", &psp),
                },
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        started.iter().map(|s| s.tasks.len()).sum::<usize>(),
        1,
        "{started:?}"
    );

    // A shared rate of 10/s, burst 2: spent by both jobs' starts.
    for n in 0..3 {
        insert(store, NewTask::test("refund", at(20 + n))).await;
        insert(store, NewTask::test("payout", at(20 + n))).await;
    }
    let rated = [limiter(
        "bank",
        None,
        Some(RateLimit {
            per_second: 10,
            burst: 2,
        }),
    )];
    let refunds = store
        .start_due(start_due_params(at(100), "a", 1), gate("refund", &rated))
        .await
        .unwrap();
    assert_eq!(refunds.tasks.len(), 1);
    let payouts = store
        .start_due(start_due_params(at(100), "b", 3), gate("payout", &rated))
        .await
        .unwrap();
    assert_eq!(payouts.tasks.len(), 1, "one token of the burst left");
    assert!(
        matches!(payouts.held_by, Some(HeldBy::Rate { next_token }) if next_token <= Duration::from_millis(100)),
        "{:?}",
        payouts.held_by
    );
    let later = store
        .start_due(start_due_params(at(200), "a", 3), gate("refund", &rated))
        .await
        .unwrap();
    assert_eq!(later.tasks.len(), 1, "a token a tenth of a second");
}

/// A job that found the limiter full with due work left waits for it: the other job's
/// next refill leaves it the slot its outcome freed, so a job refilling every slot it
/// frees cannot starve the other. Once the waiter began, the other job refills again;
/// a waiter that stops asking holds nothing back after half a second.
async fn a_job_the_limiter_held_back_gets_the_next_slot_freed(store: &dyn Store) {
    for n in 0..4 {
        insert(store, NewTask::test("refund", at(n))).await;
        insert(store, NewTask::test("payout", at(n))).await;
    }
    let psp = [limiter("psp", Some(2), None)];
    let refunds = store
        .start_due(start_due_params(at(10), "a", 2), gate("refund", &psp))
        .await
        .unwrap();
    assert_eq!(refunds.tasks.len(), 2);
    let payouts = store
        .start_due(start_due_params(at(10), "b", 2), gate("payout", &psp))
        .await
        .unwrap();
    assert_eq!(
        (payouts.tasks.len(), payouts.held_by),
        (0, Some(HeldBy::Limiter))
    );
    let refill = |n: usize, now: i64| {
        let (task, attempt) = &refunds.tasks[n];
        (
            succeeded(&task.id, attempt.lease_token),
            DueStart {
                params: start_due_params(at(now), "a", 1),
                gate: gate("refund", &psp),
            },
        )
    };
    let (finish, start) = refill(0, 20);
    let (_, started) = store
        .finish_and_start_due(&[finish], at(20), &[start])
        .await
        .unwrap();
    assert_eq!(
        (started[0].tasks.len(), started[0].held_by),
        (0, Some(HeldBy::Limiter)),
        "the slot is left to the waiting payouts"
    );
    let payouts = store
        .start_due(start_due_params(at(30), "b", 2), gate("payout", &psp))
        .await
        .unwrap();
    assert_eq!(payouts.tasks.len(), 1, "the waiter takes it");
    assert_eq!(store.running_attempts(&psp[0].task_types).await.unwrap(), 2);
    // The payouts, held again with work left, wait again; a refill after the wait has
    // lapsed takes the slot.
    let (finish, start) = refill(1, 1_000);
    let (_, started) = store
        .finish_and_start_due(&[finish], at(1_000), &[start])
        .await
        .unwrap();
    assert_eq!(started[0].tasks.len(), 1, "nobody waits any longer");
}

/// Dispatchers (each its own store and pool) of two jobs that share a limiter of 4,
/// beginning attempts at once, half from their claims and half straight from pending,
/// never have more than 4 running between them, though each job alone allows 10.
async fn starters_of_two_jobs_never_exceed_their_shared_limiter(server: &Server) {
    const TASKS: usize = 120;
    const STARTERS: usize = 4;
    const LIMIT: usize = 4;
    let url = server.create_db().await;
    let setup = store::open(&url).await.unwrap();
    setup.migrate().await.unwrap();
    for task_type in ["refund", "payout"] {
        let tasks: Vec<NewTask> = (0..TASKS).map(|_| NewTask::test(task_type, T0)).collect();
        setup.insert(&tasks, T0).await.unwrap();
    }
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let shared = [limiter("psp", Some(LIMIT as u32), None)];
    let mut starters = Vec::new();
    for n in 0..STARTERS {
        let (url, running, most, shared) =
            (url.clone(), running.clone(), most.clone(), shared.clone());
        starters.push(tokio::spawn(async move {
            let store = store::open(&url).await.unwrap();
            let owner = format!("starter-{n}");
            let task_type = if n < 2 { "refund" } else { "payout" };
            let gate = JobGate {
                concurrency: 10,
                ..gate(task_type, &shared)
            };
            let mut done = 0;
            let mut held = Vec::new();
            loop {
                let started: Vec<(String, i64)> = if n % 2 == 1 {
                    let due = store
                        .start_due(start_due_params(T0, &owner, 3), gate)
                        .await
                        .unwrap();
                    if due.tasks.is_empty() && due.held_by.is_none() {
                        break done;
                    }
                    due.tasks
                        .iter()
                        .map(|(_, s)| (s.id.clone(), s.lease_token))
                        .collect()
                } else {
                    if held.len() < 3 {
                        held.extend(claims_of(store.as_ref(), task_type, &owner, 3, T0).await);
                    }
                    if held.is_empty() {
                        break done;
                    }
                    let admitted = store
                        .start_limited(start_params(&held, T0, 60_000), gate)
                        .await
                        .unwrap();
                    held.drain(..held.len() - admitted.deferred.len());
                    admitted
                        .started
                        .iter()
                        .map(|s| (s.id.clone(), s.lease_token))
                        .collect()
                };
                let now = running.fetch_add(started.len(), SeqCst) + started.len();
                most.fetch_max(now, SeqCst);
                assert!(now <= LIMIT, "{now} running, above the limiter's {LIMIT}");
                // The attempts' work: long enough for the others to try meanwhile.
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(2)).await;
                running.fetch_sub(started.len(), SeqCst);
                let finishes: Vec<Finish> = started
                    .iter()
                    .map(|(id, token)| succeeded(id, *token))
                    .collect();
                done += finishes.len();
                store.finish(&finishes, at(1)).await.unwrap();
            }
        }));
    }
    let mut done = 0;
    for starter in starters {
        done += starter.await.unwrap();
    }
    assert_eq!(done, 2 * TASKS, "every task of both jobs ran");
    let most = most.load(SeqCst);
    eprintln!("at most {most} of {LIMIT} running at once");
    // One starter holds at most 3: more means starters (of both jobs or one) overlapped.
    assert!(most > 3, "the starters never overlapped (at most {most})");
    drop(setup);
    server.drop_created().await;
}

#[tokio::test]
async fn mariadb_starters_of_two_jobs_never_exceed_their_shared_limiter() {
    let Some(server) = Server::mariadb() else {
        return;
    };
    starters_of_two_jobs_never_exceed_their_shared_limiter(&server).await;
}

#[tokio::test]
async fn postgres_starters_of_two_jobs_never_exceed_their_shared_limiter() {
    let Some(server) = Server::postgres() else {
        return;
    };
    starters_of_two_jobs_never_exceed_their_shared_limiter(&server).await;
}

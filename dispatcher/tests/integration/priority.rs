//! Priority that holds under backlog (docs/design.md, "Priority"): among a job's due
//! tasks a higher priority begins first — in the store's claim and in the dispatcher —
//! so a priority-9 task submitted behind 50 000 overdue priority-0 tasks does not wait
//! for them, and tasks due at the same instant begin in priority order. On the manual
//! clock: nothing begins until the test moves it.

use std::time::Duration;

use asyncd_store::Millis;
use serde_json::json;

use crate::support::*;

const BACKLOG: usize = 50_000;
const CONCURRENCY: usize = 8;
/// Attempts that may begin before the priority-9 task's, counted from the moment the
/// backlog came due: those begun before its submit was answered and claimed, those in
/// flight and those its runner had already taken (at most the concurrency each). Without
/// ranking it would be the whole backlog.
const BOUND: usize = 200;

#[tokio::test]
async fn a_priority_9_task_overtakes_50_000_due_priority_0_tasks() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let jobs = vec![(
        "job.yaml",
        job_yaml(
            "prio-job",
            "work",
            &executor.url(),
            &format!("  concurrency: {CONCURRENCY}\n"),
        ),
    )];
    let asyncd = InProcess::start(&jobs).await;
    // The backlog, due 1 s from now: claimed into the heap as far as the job has room,
    // none begun yet.
    let backlog_eta = asyncd::clock::rfc3339(Millis::new(T0 + 1_000));
    for chunk in 0..BACKLOG / 1000 {
        let tasks: Vec<_> = (0..1000)
            .map(
                |i| json!({"type": "work", "payload": {"n": chunk * 1000 + i}, "eta": backlog_eta}),
            )
            .collect();
        let (status, answer) = asyncd
            .post("/v1/tasks:batch", json!({"tasks": tasks}))
            .await;
        assert_eq!(status, 200, "{answer}");
        assert!(
            answer["results"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["status"] == 201),
            "every item stored"
        );
    }
    assert!(executor.calls().is_empty());
    // The backlog is overdue; the priority-9 task comes due after all of it.
    asyncd.clock.set_millis(Millis::new(T0 + 2_000));
    let high = asyncd
        .submit(json!({"type": "work", "payload": {"n": "high"}, "priority": 9}))
        .await;
    executor.wait_calls(&high, 1).await;
    let position = executor.calls().iter().position(|c| c.id == high).unwrap();
    eprintln!(
        "the priority-9 task began as attempt {} of {}",
        position + 1,
        BACKLOG + 1
    );
    assert!(
        position <= BOUND,
        "{position} of the {BACKLOG} overdue tasks began before the priority-9 task (bound {BOUND})"
    );
    asyncd.wait_state(&high, "succeeded").await;
}

#[tokio::test]
async fn equal_etas_run_in_priority_order() {
    let executor = Executor::start(|_| Answer::ok()).await;
    // A hold long enough that a job of concurrency 1 and a 5 s timeout may hold all five
    // at once (see `asyncd::dispatch::holdings`).
    let mut asyncd = InProcess::start_with(&one_job(&executor, "  concurrency: 1\n"), |s| {
        s.dispatcher.hold = Duration::from_secs(60)
    })
    .await;
    let eta = T0 + 500;
    let text = asyncd::clock::rfc3339(Millis::new(eta));
    let mut ids = Vec::new();
    for priority in [1, 5, 3, 9, 0] {
        let id = asyncd
            .submit(json!({"type": "work", "payload": {"p": priority}, "eta": text, "priority": priority}))
            .await;
        ids.push(id);
    }
    // All five in the heap before any is due, so only priority decides the order.
    let mut claimed = Vec::new();
    while claimed.len() < ids.len() {
        claimed.extend(
            asyncd
                .next("claims", |s| match s {
                    asyncd::test_hooks::Signal::Claimed { ids, .. } => Some(ids),
                    _ => None,
                })
                .await,
        );
    }
    asyncd.clock.set_millis(Millis::new(eta));
    wait_for("all five calls", DEADLINE, async || {
        (executor.calls().len() == 5).then_some(())
    })
    .await;
    let order: Vec<i64> = executor
        .calls()
        .iter()
        .map(|c| c.body["payload"]["p"].as_i64().unwrap())
        .collect();
    assert_eq!(order, [9, 5, 3, 1, 0]);
}

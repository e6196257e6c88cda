//! Pausing a job (docs/api.md, "Pause and resume"): through the API and through
//! `spec.paused`, on every backend. A paused job's tasks wait in the store — none is
//! claimed, none reaches the executor, also across a dispatcher restart — and a resume
//! runs every one of them once, in order.
//!
//! The role runs in-process on the system clock (a manual clock would stand still while
//! the database servers' clocks move on, which the dispatcher's clock check refuses), and
//! the tests wait on its signals: "nothing was claimed" is asserted over claimer passes
//! that read the clock after every task was due.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use asyncd::clock::{Clock, SystemClock};
use asyncd::test_hooks::Signal;
use serde_json::{Value, json};

use crate::support::*;

const JOB: &str = "pause-job";

fn jobs(executor: &Executor, extra: &str) -> Vec<(&'static str, String)> {
    vec![(
        "job.yaml",
        job_yaml(
            JOB,
            "work",
            &executor.url(),
            &format!("  concurrency: 1\n{extra}"),
        ),
    )]
}

async fn start(executor: &Executor, store_url: Option<String>) -> InProcess {
    InProcess::start_with(&jobs(executor, ""), |s| {
        s.clock = Arc::new(SystemClock);
        // A concurrency-1 job may hold every early task at once (see `asyncd::dispatch::holdings`),
        // and claims them well before they are due, however slow the machine.
        s.dispatcher.hold = Duration::from_secs(60);
        s.dispatcher.lookahead = Duration::from_secs(10);
        if let Some(url) = store_url {
            s.store_url = url;
        }
    })
    .await
}

fn now_ms() -> i64 {
    SystemClock.now_millis().as_i64()
}

/// Waits for the dispatcher to report `job` paused (or not) at `after` or later; fails if
/// a task of `ids` is claimed meanwhile.
async fn pauses_seen(asyncd: &mut InProcess, paused: bool, after: i64, ids: &HashSet<String>) {
    asyncd
        .next(
            &format!("the dispatcher to see {JOB} paused={paused}"),
            |s| match s {
                Signal::PausesSeen { paused: jobs, at } => {
                    (at.as_i64() >= after && jobs.iter().any(|j| j == JOB) == paused).then_some(())
                }
                Signal::Claimed { ids: claimed, .. } if paused => {
                    assert!(
                        !claimed.iter().any(|id| ids.contains(id)),
                        "a paused task was claimed: {claimed:?}"
                    );
                    None
                }
                _ => None,
            },
        )
        .await
}

/// Waits for a claimer pass that read the clock at `after` or later, failing if any task
/// of `ids` is claimed (or handed to its runner) before it.
async fn nothing_claimed_until(asyncd: &mut InProcess, after: i64, ids: &HashSet<String>) {
    asyncd
        .next("a claimer pass after every task was due", |s| match s {
            Signal::ClaimPass { at } => (at.as_i64() >= after).then_some(()),
            Signal::Claimed { ids: claimed, .. } => {
                assert!(
                    !claimed.iter().any(|id| ids.contains(id)),
                    "a paused task was claimed: {claimed:?}"
                );
                None
            }
            Signal::Dispatched { id, .. } => {
                assert!(!ids.contains(&id), "a paused task was dispatched: {id}");
                None
            }
            _ => None,
        })
        .await
}

fn paused_metric(metrics: &str) -> Option<i64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("asyncd_job_paused{{job=\"{JOB}\"}} ")))
        .map(|v| v.parse().unwrap())
}

async fn pause_holds_across_a_restart_and_resume_runs_each_task_once(store_url: Option<String>) {
    let server = store_url.is_some();
    let executor = Executor::start(|_| Answer::ok()).await;
    let mut asyncd = start(&executor, store_url).await;
    let mut etas: Vec<(i64, String)> = Vec::new();

    // Five tasks claimed into the heap before the pause: held by the dispatcher, due in
    // 5 s, within its 10 s look-ahead.
    let due = now_ms() + 5_000;
    let text = asyncd::clock::rfc3339(asyncd_store::Millis::new(due));
    let mut early = HashSet::new();
    for n in 0..5 {
        let id = asyncd
            .submit(json!({"type": "work", "payload": {"n": n}, "eta": text}))
            .await;
        early.insert(id.clone());
        etas.push((due, id));
    }
    let mut claimed = HashSet::new();
    while claimed.len() < early.len() {
        let ids = asyncd
            .next("the early tasks claimed", |s| match s {
                Signal::Claimed { ids, .. } => Some(ids),
                _ => None,
            })
            .await;
        claimed.extend(ids.into_iter().filter(|id| early.contains(id)));
    }

    let (status, answer) = asyncd
        .post(&format!("/v1/jobs/{JOB}/pause"), json!({}))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["job"], JOB);
    assert_eq!(answer["task_type"], "work");
    assert_eq!(answer["paused"], true);
    assert_eq!(answer["paused_by_config"], false);
    assert!(answer["paused_at"].is_string(), "{answer}");
    let (status, again) = asyncd
        .post(&format!("/v1/jobs/{JOB}/pause"), json!({}))
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(
        again["paused_at"], answer["paused_at"],
        "pausing is idempotent"
    );

    // A hundred more, due now, submitted while paused.
    let mut ids: HashSet<String> = early.clone();
    for n in 5..105 {
        let (status, answer) = asyncd
            .post("/v1/tasks", json!({"type": "work", "payload": {"n": n}}))
            .await;
        assert_eq!(status, 201, "{answer}");
        let id = answer["id"].as_str().unwrap().to_string();
        etas.push((parse_time(&answer["eta"]), id.clone()));
        ids.insert(id);
    }
    let all_due = due.max(now_ms());
    // The early five reach their runner, whose start the store refuses: handed back.
    let mut released = HashSet::new();
    while released.len() < early.len() {
        let id = asyncd
            .next("the early tasks handed back unstarted", |s| match s {
                Signal::Released { id } => Some(id),
                Signal::Claimed { ids: claimed, .. } => {
                    assert!(
                        !claimed.iter().any(|id| ids.contains(id)),
                        "a paused task was claimed: {claimed:?}"
                    );
                    None
                }
                _ => None,
            })
            .await;
        if early.contains(&id) {
            released.insert(id);
        }
    }
    nothing_claimed_until(&mut asyncd, all_due + 500, &ids).await;
    pauses_seen(&mut asyncd, true, 0, &ids).await;
    assert_eq!(paused_metric(&asyncd.metrics().await), Some(1));
    // Waiting, but no backlog a replica could work off.
    let line = |metrics: &str, name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}{{task_type=\"work\"}} ")))
            .map(|v| v.to_string())
    };
    wait_for("the backlog gauges", DEADLINE, async || {
        let metrics = asyncd.metrics().await;
        (line(&metrics, "asyncd_mysql_pending_tasks").as_deref() == Some("105")).then_some(())
    })
    .await;
    let metrics = asyncd.metrics().await;
    assert_eq!(line(&metrics, "asyncd_due_backlog").as_deref(), Some("0"));
    assert_eq!(
        line(&metrics, "asyncd_oldest_due_age_seconds").as_deref(),
        Some("0")
    );
    assert!(
        executor.calls().is_empty(),
        "a paused task reached the executor"
    );

    // A dispatcher restart: the pause is in the store, not in the process.
    asyncd.restart().await;
    let restarted = now_ms();
    pauses_seen(&mut asyncd, true, restarted, &ids).await;
    nothing_claimed_until(&mut asyncd, restarted + 1_000, &ids).await;
    assert!(
        executor.calls().is_empty(),
        "a paused task reached the executor"
    );
    let (status, job) = asyncd.get(&format!("/v1/jobs/{JOB}")).await;
    assert_eq!(status, 200, "{job}");
    assert_eq!(job["paused"], true);
    for id in &ids {
        assert_eq!(asyncd.task(id).await["state"], "pending", "{id}");
    }

    let (status, answer) = asyncd
        .post(&format!("/v1/jobs/{JOB}/resume"), json!({}))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["paused"], false);
    assert_eq!(answer["paused_at"], Value::Null);
    wait_for("every task to run", Duration::from_secs(60), async || {
        (executor.calls().len() >= ids.len()).then_some(())
    })
    .await;
    for id in &ids {
        asyncd.wait_state(id, "succeeded").await;
    }
    let by_task = executor.calls_by_task();
    assert_eq!(by_task.len(), ids.len(), "none lost");
    for (id, calls) in &by_task {
        assert!(ids.contains(id), "an unknown task ran: {id}");
        assert_eq!(calls.len(), 1, "{id} ran {} times", calls.len());
    }
    // Concurrency 1: released in order of their trigger times. On a database server a
    // claim passes over rows another transaction holds locked at that instant (SKIP
    // LOCKED), so a task may begin a few places late there: by at most one claim batch.
    let slack = if server { 8 } else { 0 };
    let eta_of: std::collections::HashMap<&str, i64> =
        etas.iter().map(|(eta, id)| (id.as_str(), *eta)).collect();
    let order: Vec<i64> = executor
        .calls()
        .iter()
        .map(|c| eta_of[c.id.as_str()])
        .collect();
    for (i, eta) in order.iter().enumerate() {
        let overtaken_by = order[i + 1..].iter().filter(|later| *later < eta).count();
        assert!(
            overtaken_by <= slack,
            "the task due at {eta} ran before {overtaken_by} due earlier: {order:?}"
        );
    }
    pauses_seen(&mut asyncd, false, 0, &HashSet::new()).await;
    assert_eq!(paused_metric(&asyncd.metrics().await), Some(0));
}

#[tokio::test]
async fn sqlite_pause_holds_across_a_restart_and_resume_runs_each_task_once() {
    pause_holds_across_a_restart_and_resume_runs_each_task_once(None).await;
}

#[tokio::test]
async fn mariadb_pause_holds_across_a_restart_and_resume_runs_each_task_once() {
    let Some(url) = fresh_database(Service::MariaDb).await else {
        return;
    };
    pause_holds_across_a_restart_and_resume_runs_each_task_once(Some(url)).await;
}

#[tokio::test]
async fn postgres_pause_holds_across_a_restart_and_resume_runs_each_task_once() {
    let Some(url) = fresh_database(Service::Postgres).await else {
        return;
    };
    pause_holds_across_a_restart_and_resume_runs_each_task_once(Some(url)).await;
}

/// `spec.paused: true` holds the job's tasks too; the API's resume cannot lift it (the
/// answer says so), a config change does.
#[tokio::test]
async fn spec_paused_holds_until_the_config_changes() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let mut asyncd = InProcess::start_with(&jobs(&executor, "  paused: true\n"), |s| {
        s.clock = Arc::new(SystemClock);
    })
    .await;
    let mut ids = HashSet::new();
    for n in 0..20 {
        ids.insert(
            asyncd
                .submit(json!({"type": "work", "payload": {"n": n}}))
                .await,
        );
    }
    let submitted = now_ms();
    nothing_claimed_until(&mut asyncd, submitted + 500, &ids).await;
    pauses_seen(&mut asyncd, true, 0, &ids).await;
    let (status, job) = asyncd
        .post(&format!("/v1/jobs/{JOB}/resume"), json!({}))
        .await;
    assert_eq!(status, 200, "{job}");
    assert_eq!(job["paused"], true, "still paused by its config: {job}");
    assert_eq!(job["paused_by_config"], true);
    nothing_claimed_until(&mut asyncd, now_ms() + 500, &ids).await;
    assert!(
        executor.calls().is_empty(),
        "a paused task reached the executor"
    );

    asyncd.write_job(
        "job.yaml",
        &job_yaml(JOB, "work", &executor.url(), "  concurrency: 1\n"),
    );
    wait_for("every task to run", Duration::from_secs(60), async || {
        (executor.calls().len() >= ids.len()).then_some(())
    })
    .await;
    assert_eq!(executor.calls_by_task().len(), ids.len());
}

#[tokio::test]
async fn pausing_an_unknown_job_is_a_404_naming_it() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = start(&executor, None).await;
    for path in ["/v1/jobs/nope/pause", "/v1/jobs/nope/resume"] {
        let (status, answer) = asyncd.post(path, json!({})).await;
        assert_eq!(status, 404, "{path}: {answer}");
        assert_eq!(answer["error"]["code"], "not_found");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("nope"),
            "{answer}"
        );
    }
    let (status, _) = asyncd.get("/v1/jobs/nope").await;
    assert_eq!(status, 404);
}

//! The jobs overview, `GET /v1/jobs` and `GET /v1/jobs/{name}` (docs/api.md, "Jobs
//! overview"), on the `dev` role in-process with a manual clock: each job's due,
//! scheduled, running and dead tasks, its lateness to the millisecond, what finished in
//! the last minute, its pause and its cron entries' next firings. The store's counting on
//! every backend, caps included, is `job_counts_by_state_stop_at_their_cap` in
//! store_suite/jobs.rs; who sees which job is in auth.rs.

use std::time::Duration;

use asyncd::test_hooks::Signal;
use serde_json::{Value, json};

use crate::support::*;

const CRON_JOB: &str = "a-nightly-job";
const WORK_JOB: &str = "b-work-job";

#[tokio::test]
async fn the_overview_counts_each_jobs_tasks_and_names_its_next_cron_firings() {
    // A payload {"fail": true} fails for good (400, no retries): a dead letter at once.
    let executor = Executor::start(|call| {
        if call.body["payload"]["fail"] == true {
            Answer::status(400)
        } else {
            Answer::ok()
        }
    })
    .await;
    let jobs = [
        (
            "a.yaml",
            job_yaml(
                CRON_JOB,
                "nightly",
                &executor.url(),
                "  cron:\n    - name: cleanup\n      schedule: \"CRON_TZ=UTC 0 3 * * *\"\n",
            ),
        ),
        (
            "b.yaml",
            job_yaml(
                WORK_JOB,
                "work",
                &executor.url(),
                "  retry: {maxRetries: 0}\n",
            ),
        ),
    ];
    let mut asyncd = InProcess::start(&jobs).await;
    // A scheduler pass has written the entry as a schedule; its next firing (03:00, hours
    // ahead) is not a task yet — the overview names it under `cron`.
    asyncd
        .next("a scheduler pass", |s| match s {
            Signal::Scheduled { created, .. } => {
                assert_eq!(created, 0, "nothing within the horizon");
                Some(())
            }
            _ => None,
        })
        .await;

    // The nightly job is paused, so its tasks wait and their lateness grows.
    let (status, answer) = asyncd
        .post(&format!("/v1/jobs/{CRON_JOB}/pause"), json!({}))
        .await;
    assert_eq!(status, 200, "{answer}");
    for _ in 0..2 {
        asyncd.submit(json!({"type": "nightly"})).await;
    }
    asyncd
        .submit(json!({"type": "nightly", "delay": "1h"}))
        .await;
    let ok = asyncd.submit(json!({"type": "work"})).await;
    asyncd.finished(&ok).await;
    let failed = asyncd
        .submit(json!({"type": "work", "payload": {"fail": true}}))
        .await;
    asyncd.finished(&failed).await;
    assert_eq!(asyncd.task(&failed).await["state"], "dead");

    asyncd.clock.advance(Duration::from_millis(5_250));
    let (status, list) = asyncd.get("/v1/jobs").await;
    assert_eq!(status, 200, "{list}");
    let names: Vec<&str> = list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["job"].as_str().unwrap())
        .collect();
    assert_eq!(names, [CRON_JOB, WORK_JOB], "every job, sorted by name");
    let nightly = &list["jobs"][0];
    assert_eq!(
        (
            &nightly["task_type"],
            &nightly["paused"],
            &nightly["paused_by_config"]
        ),
        (&json!("nightly"), &json!(true), &json!(false)),
        "{nightly}"
    );
    assert!(nightly["paused_at"].is_string(), "{nightly}");
    assert_eq!(
        nightly["stats"],
        json!({"due": 2, "scheduled": 1, "running": 0, "dead": 0,
               "oldest_due_seconds": 5.25,
               "finished_last_minute": {"succeeded": 0, "dead": 0}})
    );
    // T0 is 2027-01-15T08:00:00Z: the next three 03:00 UTC firings.
    assert_eq!(
        nightly["cron"],
        json!([{"name": "cleanup", "schedule": "CRON_TZ=UTC 0 3 * * *",
                "next": ["2027-01-16T03:00:00.000Z", "2027-01-17T03:00:00.000Z",
                         "2027-01-18T03:00:00.000Z"],
                "overlap": "Allow", "catch_up": "1h", "paused": false}])
    );
    // No dispatcher has begun an attempt of it: its configured concurrency (the
    // default). fairness.rs shows a share backed off by an overloaded executor.
    assert_eq!(nightly["effective_concurrency"], 100);
    let work = &list["jobs"][1];
    assert_eq!(work["paused"], false);
    assert_eq!(
        work["stats"],
        json!({"due": 0, "scheduled": 0, "running": 0, "dead": 1,
               "oldest_due_seconds": null,
               "finished_last_minute": {"succeeded": 1, "dead": 1}})
    );
    assert_eq!(work["cron"], json!([]));
    let (status, one) = asyncd.get(&format!("/v1/jobs/{WORK_JOB}")).await;
    assert_eq!(status, 200, "{one}");
    assert_eq!(&one, work, "one job answers as it is listed");

    // A minute on, the finishes have left the window; the dead letter and the waiting
    // tasks stay.
    asyncd.clock.advance(Duration::from_secs(60));
    let (_, one) = asyncd.get(&format!("/v1/jobs/{WORK_JOB}")).await;
    assert_eq!(
        one["stats"]["finished_last_minute"],
        json!({"succeeded": 0, "dead": 0})
    );
    assert_eq!(one["stats"]["dead"], 1);
    let (_, nightly) = asyncd.get(&format!("/v1/jobs/{CRON_JOB}")).await;
    let stats: &Value = &nightly["stats"];
    assert_eq!(
        (
            &stats["due"],
            &stats["scheduled"],
            &stats["oldest_due_seconds"]
        ),
        (&json!(2), &json!(1), &json!(65.25))
    );

    let (status, answer) = asyncd.get("/v1/jobs/nope").await;
    assert_eq!(status, 404, "{answer}");
    assert_eq!(answer["error"]["field"], "name");
}

/// A rate limit with no token left is what the overview names while tasks are due: the
/// job's own `rateLimit`, then an AsyncLimiter's rate. The manual clock stands still, so
/// each bucket stays empty after its burst began until the clock moves on.
#[tokio::test]
async fn an_empty_rate_bucket_is_named_as_the_binding_limit() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let jobs = [
        (
            "rated.yaml",
            job_yaml(
                "rated-job",
                "rated",
                &executor.url(),
                "  rateLimit: {perSecond: 1, burst: 2}\n",
            ),
        ),
        (
            "shared.yaml",
            job_yaml(
                "shared-job",
                "shared",
                &executor.url(),
                "  limiters: [mail]\n",
            ),
        ),
        (
            "mail.yaml",
            "apiVersion: asyncd.example.io/v1\nkind: AsyncLimiter\nmetadata: {name: mail}\n\
             spec: {rateLimit: {perSecond: 1, burst: 1}}\n"
                .to_string(),
        ),
    ];
    let asyncd = InProcess::start(&jobs).await;
    let mut ids = Vec::new();
    for (task_type, n) in [("rated", 4), ("shared", 3)] {
        for _ in 0..n {
            ids.push((task_type, asyncd.submit(json!({"type": task_type})).await));
        }
    }
    // The bursts began (2 and 1), then each bucket is empty until the clock moves.
    wait_for("the bursts to run", Duration::from_secs(30), async || {
        let calls = executor.calls();
        let of = |t: &str| calls.iter().filter(|c| c.body["type"] == t).count();
        (of("rated") == 2 && of("shared") == 1).then_some(())
    })
    .await;
    let binding = async |job: &str| -> Value {
        let (status, one) = asyncd.get(&format!("/v1/jobs/{job}")).await;
        assert_eq!(status, 200, "{one}");
        one.get("binding_limit").cloned().unwrap_or(Value::Null)
    };
    assert_eq!(binding("rated-job").await, json!({"limit": "rate"}));
    assert_eq!(
        binding("shared-job").await,
        json!({"limit": "limiter_rate", "name": "mail"})
    );

    // A second at a time, the buckets refill and the rest begin; once none is due,
    // nothing binds.
    wait_for("every task to run", Duration::from_secs(60), async || {
        if executor.calls().len() == ids.len() {
            return Some(());
        }
        asyncd.clock.advance(Duration::from_secs(1));
        None
    })
    .await;
    for (_, id) in &ids {
        wait_for("each outcome written", DEADLINE, async || {
            (asyncd.task(id).await["state"] == "succeeded").then_some(())
        })
        .await;
    }
    assert_eq!(binding("rated-job").await, Value::Null);
    assert_eq!(binding("shared-job").await, Value::Null);
    assert_eq!(executor.calls().len(), 7, "each task ran once");
}

/// A fair job's tenants with work, each with the weight the claim uses now, its counts
/// and its share of the job's concurrency, the busiest first, and its keys with their
/// counts; a weight set at runtime changes the shares. The job is paused, so every task
/// stays due.
#[tokio::test]
async fn a_fair_jobs_tenants_show_their_work_and_shares() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let fair = "  concurrency: 4\n  concurrencyKey: {key: '{m}', limit: 1}\n  \
                fairness: {tenant: '{t}', weights: {acme: 3}}\n";
    let jobs = [(
        "fair.yaml",
        job_yaml("fair-job", "fair", &executor.url(), fair),
    )];
    let asyncd = InProcess::start(&jobs).await;
    let (status, answer) = asyncd.post("/v1/jobs/fair-job/pause", json!({})).await;
    assert_eq!(status, 200, "{answer}");
    for (tenant, n) in [("acme", 3), ("zeta", 1)] {
        for i in 0..n {
            asyncd
                .submit(json!({"type": "fair", "payload": {"t": tenant, "m": i}}))
                .await;
        }
    }
    let tenants = async || {
        let (status, one) = asyncd.get("/v1/jobs/fair-job").await;
        assert_eq!(status, 200, "{one}");
        one["tenants"].clone()
    };
    assert_eq!(
        tenants().await,
        json!([
            {"tenant": "acme", "weight": 3, "running": 0, "due": 3, "fair_share": 3.0},
            {"tenant": "zeta", "weight": 1, "running": 0, "due": 1, "fair_share": 1.0},
        ])
    );
    let (_, one) = asyncd.get("/v1/jobs/fair-job").await;
    let key = |tenant: &str, m: u32| format!("{tenant}\u{1f}{m}");
    assert_eq!(
        one["keys"],
        json!([
            {"key": key("acme", 0), "running": 0, "due": 1},
            {"key": key("acme", 1), "running": 0, "due": 1},
            {"key": key("acme", 2), "running": 0, "due": 1},
            {"key": key("zeta", 0), "running": 0, "due": 1},
        ]),
        "each key of each tenant, in key order at equal counts"
    );
    let (status, answer) = asyncd
        .send_json(
            reqwest::Method::PUT,
            "/v1/jobs/fair-job/tenants/zeta/weight",
            json!({"weight": 5}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        tenants().await,
        json!([
            {"tenant": "acme", "weight": 3, "running": 0, "due": 3, "fair_share": 1.5},
            {"tenant": "zeta", "weight": 5, "running": 0, "due": 1, "fair_share": 2.5},
        ])
    );
    assert!(executor.calls().is_empty(), "paused: nothing ran");
}

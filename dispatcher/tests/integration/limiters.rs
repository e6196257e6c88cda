//! An AsyncLimiter shared by two jobs holds in total across both jobs and two
//! dispatcher processes (docs/design.md, "Limiters shared across jobs"): a config folder
//! declares the limiter `psp` (3 at once) and two jobs that name it, each allowing 10;
//! an API process and one dispatcher per job (`--job`, as the operator runs them) on one
//! MariaDB or PostgreSQL database. The executor counts what arrives: never more than 3
//! calls at once of both jobs together, and both jobs' calls in flight at one moment (the
//! slots were shared, not taken in turns: the executor holds the first calls until the
//! job left out has been held back by the limiter, so that both dispatchers are at work
//! before any slot frees, however long one takes to start). The jobs overview names the
//! limiter, what runs under it, and that it is what holds the job's due tasks;
//! `GET /v1/limiters` lists the limiter as the overview shows it.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use serde_json::{Value, json};

use crate::support::*;

const LIMIT: usize = 3;
const PER_JOB: usize = 60;
const JOBS: [&str; 2] = ["refund", "payout"];

/// Calls in flight now: in total and per job; the most in total, and the most calls of
/// the two jobs in flight together (the smaller job's count at the moment).
#[derive(Default)]
struct InFlight {
    total: AtomicUsize,
    per_job: Mutex<[usize; 2]>,
    most: AtomicUsize,
    most_together: AtomicUsize,
    done: AtomicUsize,
}

/// The executor: each call counted in flight at once, then held until `gate` is open,
/// then answered 40 ms later.
async fn serve(counts: Arc<InFlight>, gate: tokio::sync::watch::Receiver<bool>) -> String {
    let app = axum::Router::new().fallback(move |body: Bytes| {
        let (counts, mut gate) = (counts.clone(), gate.clone());
        async move {
            let body: Value = serde_json::from_slice(&body).unwrap_or_default();
            let job = usize::from(body["type"] == JOBS[1]);
            let now = counts.total.fetch_add(1, SeqCst) + 1;
            counts.most.fetch_max(now, SeqCst);
            {
                let mut per_job = counts.per_job.lock().unwrap();
                per_job[job] += 1;
                counts
                    .most_together
                    .fetch_max(per_job[0].min(per_job[1]), SeqCst);
            }
            let _ = gate.wait_for(|open| *open).await;
            tokio::time::sleep(Duration::from_millis(40)).await;
            counts.per_job.lock().unwrap()[job] -= 1;
            counts.total.fetch_sub(1, SeqCst);
            counts.done.fetch_add(1, SeqCst);
            "{}"
        }
    });
    serve_executor(app).await
}

async fn a_limiter_holds_two_jobs_and_two_dispatchers_in_total(server: Service) {
    let Some(store) = fresh_database(server).await else {
        return;
    };
    let _turn = cluster_turn().await;
    let counts = Arc::new(InFlight::default());
    let (open_gate, gate) = tokio::sync::watch::channel(false);
    let url = serve(counts.clone(), gate).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("jobs");
    std::fs::create_dir(&config).unwrap();
    std::fs::write(
        config.join("psp.yaml"),
        format!(
            "apiVersion: asyncd.example.io/v1\nkind: AsyncLimiter\nmetadata: {{name: psp}}\n\
             spec: {{concurrency: {LIMIT}}}\n"
        ),
    )
    .unwrap();
    for job in JOBS {
        std::fs::write(
            config.join(format!("{job}.yaml")),
            job_yaml(
                &format!("{job}-job"),
                job,
                &url,
                "  concurrency: 10\n  limiters: [psp]\n",
            ),
        )
        .unwrap();
    }
    migrate(&store);
    let api = Role::serve("api", &store, &config, dir.path(), &[]);
    let dispatchers: Vec<Role> = JOBS
        .iter()
        .map(|job| {
            Role::serve(
                &format!("dispatcher-{job}"),
                &store,
                &config,
                dir.path(),
                &["--job", &format!("{job}-job")],
            )
        })
        .collect();
    let http = reqwest::Client::new();
    for role in std::iter::once(&api).chain(&dispatchers) {
        wait_healthy(&http, &role.listen).await;
    }

    let tasks: Vec<Value> = (0..PER_JOB)
        .flat_map(|i| JOBS.map(|job| json!({"type": job, "payload": {"i": i}})))
        .collect();
    let answer: Value = http
        .post(format!("http://{}/v1/tasks:batch", api.listen))
        .json(&json!({ "tasks": tasks }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for result in answer["results"].as_array().unwrap() {
        assert_eq!(result["status"], 201, "{result}");
    }
    let get = |path: String| {
        let (http, listen) = (http.clone(), api.listen.clone());
        async move {
            let r = http
                .get(format!("http://{listen}{path}"))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.unwrap()
        }
    };
    // The first calls fill the limiter and wait at the executor's gate.
    wait_for(
        "the limiter's slots taken",
        Duration::from_secs(30),
        async || (counts.total.load(SeqCst) == LIMIT).then_some(()),
    )
    .await;
    let per_job = *counts.per_job.lock().unwrap();
    let overview = |job: &'static str| get(format!("/v1/jobs/{job}-job"));
    if let Some(left_out) = (0..JOBS.len()).find(|&job| per_job[job] == 0) {
        // While its backlog waits, the overview says the limiter is what holds it.
        wait_for(
            "the overview to name the limiter as what holds the job left out",
            Duration::from_secs(30),
            async || {
                let job = overview(JOBS[left_out]).await;
                (job["binding_limit"] == json!({"limit": "limiter", "name": "psp"})).then_some(())
            },
        )
        .await;
        // Its dispatcher tried to begin one and was held back: it is the limiter's
        // waiter, and the next slot freed is left to it.
        let metrics = format!("http://{}/metrics", dispatchers[left_out].listen);
        let held = format!(
            "asyncd_job_limited_total{{job=\"{}-job\",limit=\"limiter\"}} ",
            JOBS[left_out]
        );
        wait_for(
            "the job left out to be held back by the limiter",
            Duration::from_secs(30),
            async || {
                let text = http.get(&metrics).send().await.ok()?.text().await.ok()?;
                text.lines()
                    .find_map(|line| line.strip_prefix(held.as_str()))
                    .and_then(|count| count.parse::<f64>().ok())
                    .filter(|&count| count > 0.0)
            },
        )
        .await;
    }
    open_gate.send_replace(true);
    wait_for("every call answered", Duration::from_secs(60), async || {
        (counts.done.load(SeqCst) >= 2 * PER_JOB).then_some(())
    })
    .await;
    let most = counts.most.load(SeqCst);
    let together = counts.most_together.load(SeqCst);
    eprintln!("at most {most} calls at once (limiter {LIMIT}); both jobs at once: {together}");
    assert!(
        most <= LIMIT,
        "{most} calls at once, above the limiter's {LIMIT}"
    );
    assert_eq!(
        most, LIMIT,
        "the limit was reached: the dispatchers were busy"
    );
    assert!(together >= 1, "the two jobs never ran at the same time");
    assert_eq!(counts.done.load(SeqCst), 2 * PER_JOB, "each task ran once");

    // The executor answers before the dispatchers write the outcomes: the store counts
    // an attempt as running until then.
    let job = wait_for(
        "every outcome written",
        Duration::from_secs(30),
        async || {
            let job = overview("payout").await;
            (job["limiters"][0]["running"] == 0).then_some(job)
        },
    )
    .await;
    assert_eq!(
        job["limiters"],
        json!([{"name": "psp", "concurrency": LIMIT, "running": 0,
                "task_types": ["payout", "refund"]}]),
        "{job}"
    );
    assert_eq!(job.get("binding_limit"), None, "nothing waits: {job}");
    // What the operator copies into the AsyncLimiter's status.
    let limiters = get("/v1/limiters".into()).await;
    assert_eq!(limiters, json!({"limiters": job["limiters"]}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_a_limiter_holds_two_jobs_and_two_dispatchers_in_total() {
    a_limiter_holds_two_jobs_and_two_dispatchers_in_total(Service::MariaDb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_limiter_holds_two_jobs_and_two_dispatchers_in_total() {
    a_limiter_holds_two_jobs_and_two_dispatchers_in_total(Service::Postgres).await;
}

//! A slow executor must stop the claimer, not fill the dispatcher's memory: with
//! concurrency 1, an executor that takes 20 s and 10⁵ due tasks of 8 KiB each, `asyncd
//! dev` holds one task at a time, every claim starts before it lapses, and the process
//! stays small. Before the per-job room (`dispatcher/src/holdings.rs`) the claimer pulled
//! the whole due backlog (some 800 MiB of payloads) into the heap, the claims lapsed
//! after the hold and were claimed again, over and over.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::HeaderMap;

use crate::support::*;

const TASKS: usize = 100_000;
const PAYLOAD_BYTES: usize = 8 * 1024;
const EXECUTOR_TAKES: Duration = Duration::from_secs(20);
/// A short hold, so that lapsing claims would show within one executor call.
const CLAIM_HOLD: &str = "2s";
/// Resident memory the dispatcher may reach: its own working set plus request buffers
/// is some tens of MiB; holding the backlog would be 800 MiB.
const MAX_RSS_BYTES: u64 = 200 * 1024 * 1024;

/// Calls per task id; each answers 200 after `EXECUTOR_TAKES`.
async fn slow_executor() -> (String, Arc<Mutex<HashMap<String, u32>>>) {
    let calls: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let seen = calls.clone();
    let app = axum::Router::new().fallback(move |headers: HeaderMap| {
        let seen = seen.clone();
        async move {
            let id = headers
                .get("asyncd-task-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            *seen.lock().unwrap().entry(id).or_default() += 1;
            tokio::time::sleep(EXECUTOR_TAKES).await;
            "{}"
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/run", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, calls)
}

fn peak_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib * 1024
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_slow_executor_stops_the_claimer_instead_of_filling_memory() {
    let (url, calls) = slow_executor().await;
    let job = format!(
        "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata:\n  name: slow\nspec:\n  \
         taskType: slow\n  concurrency: 1\n  executor:\n    url: {url}\n    timeout: 30s\n"
    );
    let asyncd = Asyncd::start(&[("slow.yaml", job)], &["--claim-hold", CLAIM_HOLD]).await;
    let pid = asyncd.child.as_ref().unwrap().id();

    // Written straight into the database the process runs on, in one statement: 800 MiB
    // through the HTTP API or the store's insert path takes minutes in a debug build and
    // proves nothing more here. The rows are what an insert writes for a due task.
    let database = format!("sqlite://{}", asyncd.dir.path().join("asyncd.db").display());
    let mut db = <sqlx::SqliteConnection as sqlx::Connection>::connect(&database)
        .await
        .unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?1) \
         INSERT INTO tasks (id, task_type, payload, state, trigger_at, max_retries, timeout_ms, \
                            created_at, updated_at) \
         SELECT printf('slow-%06d', i), 'slow', \
                json_object('n', i, 'filler', printf('%.*c', ?2, 'x')), \
                'pending', ?3, 3, 30000, ?3, ?3 FROM n",
    )
    .bind(TASKS as i64)
    .bind(PAYLOAD_BYTES as i64)
    .bind(now)
    .execute(&mut db)
    .await
    .unwrap();

    // Two calls: the first attempt ran its full 20 s while the backlog sat due, and the
    // next task was claimed only then; ten holds have passed in between. A lapsed claim
    // ends the wait early, for the assertions below to report.
    let calls_now = || calls.lock().unwrap().values().sum::<u32>();
    let metrics = wait_for(
        "a second executor call",
        Duration::from_secs(120),
        async || {
            let metrics = asyncd.metrics().await;
            (calls_now() >= 2 || metric(&metrics, "asyncd_task_rescued_total") > 0.0)
                .then_some(metrics)
        },
    )
    .await;
    let claimed = metric(&metrics, "asyncd_task_claimed_total");
    let rescued = metric(&metrics, "asyncd_task_rescued_total");
    assert_eq!(rescued, 0.0, "claims or leases lapsed");
    assert!(
        claimed <= f64::from(calls_now()) + 1.0,
        "{claimed} claims for {} calls: the claimer took more than the executor could start",
        calls_now()
    );
    assert!(
        calls.lock().unwrap().values().all(|&n| n == 1),
        "a task was called twice"
    );
    let peak = peak_rss_bytes(pid);
    assert!(
        peak < MAX_RSS_BYTES,
        "peak RSS {} MiB over the {} MiB bound",
        peak >> 20,
        MAX_RSS_BYTES >> 20
    );
}

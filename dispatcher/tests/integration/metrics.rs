//! `/metrics`: real values, and labels a client cannot multiply.

use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn metrics_report_real_values() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let r = asyncd
        .http
        .post(asyncd.url("/v1/tasks"))
        .header("asyncd-source-service", "orders")
        .json(&json!({"type": "work"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    asyncd.submit(json!({"type": "work", "delay": "1h"})).await;
    let metrics = wait_for("metrics to show the run", DEADLINE, async || {
        let m = asyncd.metrics().await;
        // The backlog gauges refresh every 2 s: wait for a refresh after both submits.
        (m.contains("asyncd_task_executed_total{status=\"success\",task_type=\"work\"} 1")
            && m.contains("asyncd_mysql_pending_tasks{task_type=\"work\"} 1")
            && m.contains("asyncd_due_backlog{task_type=\"work\"} 0"))
        .then_some(m)
    })
    .await;
    for expected in [
        "asyncd_task_submitted_total{source_service=\"orders\",task_type=\"work\"} 1",
        "asyncd_task_dispatched_total{task_type=\"work\"} 1",
        "asyncd_task_dispatch_delay_seconds_count{task_type=\"work\"} 1",
        "asyncd_task_execution_duration_seconds_count{task_type=\"work\"} 1",
        "asyncd_task_submit_latency_seconds_count{task_type=\"work\"} 2",
        "asyncd_mysql_poll_duration_seconds_count",
    ] {
        assert!(metrics.contains(expected), "missing {expected}\n{metrics}");
    }
    let (status, _) = asyncd.get("/readyz").await;
    assert_eq!(status, 200);
}

/// Issue 10: `source_service` is a Prometheus label, and any client could mint a new time
/// series per submit.
#[tokio::test]
async fn source_service_labels_are_bounded() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let tasks: Vec<_> = (0..150)
        .map(|i| json!({"type": "work", "delay": "1h", "source_service": format!("svc-{i}")}))
        .collect();
    let (status, answer) = asyncd
        .post("/v1/tasks:batch", json!({ "tasks": tasks }))
        .await;
    assert_eq!(status, 200, "{answer}");
    let metrics = asyncd.metrics().await;
    let series: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("asyncd_task_submitted_total{"))
        .collect();
    // docs/api.md: the first 100 distinct values, the rest as "other".
    assert_eq!(series.len(), 101, "{series:#?}");
    assert!(
        metrics.contains(
            "asyncd_task_submitted_total{source_service=\"other\",task_type=\"work\"} 50"
        ),
        "{metrics}"
    );
}

/// `asyncd_tenant_tasks` and `asyncd_key_tasks`: a fair job's ten busiest tenants, and
/// its ten busiest keys, each get a series, the rest are summed as "others", so a tenant
/// per customer or a key per merchant does not mint a series each. The job is paused,
/// so every task stays due.
#[tokio::test]
async fn tenant_and_key_series_are_the_busiest_ten_and_others() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let fair = "  concurrencyKey: {key: '{m}', limit: 1}\n  fairness: {tenant: '{t}'}\n";
    let asyncd = InProcess::start(&[(
        "fair.yaml",
        job_yaml("fair-job", "fair", &executor.url(), fair),
    )])
    .await;
    let (status, answer) = asyncd.post("/v1/jobs/fair-job/pause", json!({})).await;
    assert_eq!(status, 200, "{answer}");
    // t00 has 3 due tasks, t01..t12 one each: t00 and the nine first by name get series,
    // t10, t11 and t12 are summed.
    let tasks: Vec<_> = (0..13)
        .flat_map(|i| (0..if i == 0 { 3 } else { 1 }).map(move |n| (i, n)))
        .map(|(i, n)| json!({"type": "fair", "payload": {"t": format!("t{i:02}"), "m": n}}))
        .collect();
    let (status, answer) = asyncd
        .post("/v1/tasks:batch", json!({ "tasks": tasks }))
        .await;
    assert_eq!(status, 200, "{answer}");
    let series = |m: &str, tenant: &str| {
        format!("asyncd_tenant_tasks{{state=\"due\",task_type=\"fair\",tenant=\"{tenant}\"}} {m}")
    };
    let metrics = wait_for("the tenants' series", DEADLINE, async || {
        let m = asyncd.metrics().await;
        m.contains(&series("3", "others")).then_some(m)
    })
    .await;
    assert!(metrics.contains(&series("3", "t00")), "{metrics}");
    assert!(metrics.contains(&series("1", "t09")), "{metrics}");
    let due_series = metrics
        .lines()
        .filter(|l| l.starts_with("asyncd_tenant_tasks{state=\"due\""))
        .count();
    assert_eq!(due_series, 11, "ten tenants and others:\n{metrics}");
    assert!(!metrics.contains("tenant=\"t10\""), "{metrics}");
    // 15 keys with one due task each: the first ten by key, then five summed.
    let key_series = |m: &str, key: &str| {
        format!("asyncd_key_tasks{{key=\"{key}\",state=\"due\",task_type=\"fair\"}} {m}")
    };
    let metrics = wait_for("the keys' series", DEADLINE, async || {
        let m = asyncd.metrics().await;
        m.contains(&key_series("5", "others")).then_some(m)
    })
    .await;
    assert!(
        metrics.contains(&key_series("1", "t00\u{241f}0")),
        "{metrics}"
    );
    assert!(
        metrics.contains(&key_series("1", "t07\u{241f}0")),
        "{metrics}"
    );
    let due_keys = metrics
        .lines()
        .filter(|l| l.starts_with("asyncd_key_tasks{") && l.contains("state=\"due\""))
        .count();
    assert_eq!(due_keys, 11, "ten keys and others:\n{metrics}");

    // Resumed, every task runs; tenants without work lose their series.
    let (status, answer) = asyncd.post("/v1/jobs/fair-job/resume", json!({})).await;
    assert_eq!(status, 200, "{answer}");
    wait_for("the tenants' series to go", DEADLINE, async || {
        let m = asyncd.metrics().await;
        (executor.calls().len() == 15
            && !m.contains("asyncd_tenant_tasks{")
            && !m.contains("asyncd_key_tasks{"))
        .then_some(())
    })
    .await;
}

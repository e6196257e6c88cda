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

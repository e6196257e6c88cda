//! Guarantee 1 on the embedded store: every accepted task runs at least once through
//! `kill -9` of `asyncd dev` at arbitrary moments.

use std::time::Duration;

use serde_json::json;

use crate::support::*;

const TASKS: usize = 600;

#[tokio::test]
async fn kill_9_mid_run_loses_nothing() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let jobs = [(
        "job.yaml",
        job_yaml("crash-job", "work", &executor.url(), ""),
    )];
    // A short claim hold so the restarted process takes back the dead one's claims quickly.
    let mut asyncd = Asyncd::start(&jobs, &["--claim-hold", "2s"]).await;

    let mut ids = Vec::with_capacity(TASKS);
    for chunk in (0..TASKS).collect::<Vec<_>>().chunks(200) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|i| json!({"type": "work", "payload": {"i": i}, "delay": format!("{}ms", (i * 7919) % 6000)}))
            .collect();
        let (status, answer) = asyncd
            .post("/v1/tasks:batch", json!({ "tasks": tasks }))
            .await;
        assert_eq!(status, 200);
        for result in answer["results"].as_array().unwrap() {
            assert_eq!(result["status"], 201, "{result}");
            ids.push(result["id"].as_str().unwrap().to_string());
        }
    }

    // Kill it twice while work is in every state: executed, in the heap, not yet claimed.
    for threshold in [TASKS / 4, TASKS / 2] {
        wait_for(
            &format!("{threshold} tasks executed"),
            DEADLINE,
            async || (executor.calls_by_task().len() >= threshold).then_some(()),
        )
        .await;
        asyncd.kill9();
        asyncd.spawn().await;
    }

    wait_for("every task executed", Duration::from_secs(60), async || {
        (executor.calls_by_task().len() >= TASKS).then_some(())
    })
    .await;
    let counts = executor.calls_by_task();
    for id in &ids {
        assert!(counts.contains_key(id), "task {id} never ran");
    }
    let duplicates: usize = counts.values().map(|calls| calls.len() - 1).sum();
    println!("kill -9 twice: {TASKS} tasks, {duplicates} duplicate executions");
    for id in &ids {
        asyncd.wait_state(id, "succeeded").await;
    }
}

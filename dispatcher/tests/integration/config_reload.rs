//! Job config files changed while `asyncd dev` runs.

use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn config_changes_apply_without_restart() {
    let first = Executor::start(|_| Answer::ok()).await;
    let second = Executor::start(|_| Answer::ok()).await;
    let asyncd = Asyncd::start(&one_job(&first, ""), &[]).await;
    let (status, _) = asyncd.post("/v1/tasks", task("other", json!({}))).await;
    assert_eq!(status, 400, "not configured yet");

    asyncd.write_job(
        "other.yaml",
        &job_yaml("other-job", "other", &second.url(), ""),
    );
    let id = wait_for("the new job to be routable", DEADLINE, async || {
        let (status, answer) = asyncd.post("/v1/tasks", task("other", json!({}))).await;
        (status == 201).then(|| answer["id"].as_str().unwrap().to_string())
    })
    .await;
    second.wait_calls(&id, 1).await;

    // Point the first job at the second executor: the next dispatch follows.
    asyncd.write_job(
        "job.yaml",
        &job_yaml("test-job", "work", &second.url(), "  concurrency: 2\n"),
    );
    let id = wait_for("the changed URL to apply", DEADLINE, async || {
        let id = asyncd.submit(task("work", json!({}))).await;
        asyncd.wait_state(&id, "succeeded").await;
        (!second.calls_for(&id).is_empty()).then_some(id)
    })
    .await;
    assert!(first.calls_for(&id).is_empty());

    // A broken file keeps the last good table.
    asyncd.write_job("job.yaml", "spec: [not, a, job");
    wait_for(
        "the reload to refuse the broken file",
        DEADLINE,
        async || {
            asyncd
                .log()
                .contains("keeping the last good ones")
                .then_some(())
        },
    )
    .await;
    let id = asyncd.submit(task("work", json!({}))).await;
    second.wait_calls(&id, 1).await;
}

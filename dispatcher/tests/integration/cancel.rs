//! Cancelling a task through the API.

use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn cancel_only_while_pending() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let later = asyncd.submit(json!({"type": "work", "delay": "1h"})).await;
    let (status, answer) = asyncd.delete(&format!("/v1/tasks/{later}")).await;
    assert_eq!((status, answer["state"].as_str()), (200, Some("cancelled")));
    let now = asyncd.submit(json!({"type": "work"})).await;
    asyncd.wait_state(&now, "succeeded").await;
    let (status, answer) = asyncd.delete(&format!("/v1/tasks/{now}")).await;
    assert_eq!(
        (status, answer["error"]["state"].as_str()),
        (409, Some("succeeded"))
    );
    let (status, answer) = asyncd
        .delete("/v1/tasks/01900000-0000-7000-8000-000000000000")
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    assert!(
        executor.calls_for(&later).is_empty(),
        "a cancelled task never runs"
    );
}

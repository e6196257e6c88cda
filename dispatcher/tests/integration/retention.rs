//! Retention: finished tasks purged after their job's `spec.retention`.

use asyncd_store::Millis;
use serde_json::json;

use crate::support::*;

/// Issue 15, retention: a finished task is kept for its job's `spec.retention`, counted
/// from when it finished, then purged — `GET` answers 404, the counter says so, and its
/// idempotency key makes a new task.
#[tokio::test]
async fn finished_tasks_are_purged_after_the_jobs_retention() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let mut asyncd =
        InProcess::start(&one_job(&executor, "  retention:\n    succeeded: 1h\n")).await;
    let submit = json!({"type": "work", "payload": {}, "idempotency_key": "kept-1h"});
    let (status, first) = asyncd.post("/v1/tasks", submit.clone()).await;
    assert_eq!(status, 201, "{first}");
    let id = first["id"].as_str().unwrap().to_string();
    let done = asyncd.wait_state(&id, "succeeded").await;
    let finished = parse_time(&done["updated_at"]);

    // Kept through its last millisecond…
    let last = finished + 3_600_000;
    asyncd.clock.set_millis(Millis::new(last));
    asyncd.purge_pass(last).await;
    assert_eq!(asyncd.get(&format!("/v1/tasks/{id}")).await.0, 200);
    let (status, same) = asyncd.post("/v1/tasks", submit.clone()).await;
    assert_eq!(
        (status, same["id"].as_str(), same["duplicate"].as_bool()),
        (200, Some(id.as_str()), Some(true)),
        "its key still answers with it"
    );
    // …and purged once past it.
    asyncd.clock.set_millis(Millis::new(last + 1));
    asyncd.purge_pass(last + 1).await;
    assert_eq!(asyncd.get(&format!("/v1/tasks/{id}")).await.0, 404);
    assert!(
        asyncd
            .metrics()
            .await
            .contains("asyncd_tasks_purged_total{state=\"succeeded\",task_type=\"work\"} 1")
    );
    // The key is free: the same submit makes a new task (a job without a Kafka topic
    // gives it a new id).
    let (status, fresh) = asyncd.post("/v1/tasks", submit).await;
    assert_eq!(
        (status, fresh["duplicate"].as_bool()),
        (201, Some(false)),
        "{fresh}"
    );
    let fresh_id = fresh["id"].as_str().unwrap();
    assert_ne!(fresh_id, id, "the purged task is not brought back");
    let created = asyncd.task(fresh_id).await;
    assert_eq!(parse_time(&created["created_at"]), last + 1);
}

//! Changing a task that has not begun (`PATCH /v1/tasks/{id}`).

use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn a_waiting_task_is_changed_in_place_and_runs_with_its_new_values() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let id = asyncd
        .submit(json!({"type": "work", "delay": "1h", "payload": {"v": 1}}))
        .await;
    let (status, answer) = asyncd
        .patch(
            &format!("/v1/tasks/{id}"),
            json!({"payload": {"v": 2}, "priority": 5, "delay": "30m"}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        (
            answer["id"].as_str(),
            &answer["payload"],
            &answer["priority"]
        ),
        (Some(id.as_str()), &json!({"v": 2}), &json!(5))
    );
    assert!(executor.calls_for(&id).is_empty(), "still 30 minutes away");

    let (status, answer) = asyncd
        .patch(&format!("/v1/tasks/{id}"), json!({"run_now": true}))
        .await;
    assert_eq!(status, 200, "{answer}");
    asyncd.wait_state(&id, "succeeded").await;
    let calls = executor.calls_for(&id);
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].body["payload"],
        json!({"v": 2}),
        "the changed payload ran"
    );

    let (status, answer) = asyncd
        .patch(&format!("/v1/tasks/{id}"), json!({"run_now": true}))
        .await;
    assert_eq!(
        (
            status,
            answer["error"]["code"].as_str(),
            answer["error"]["state"].as_str()
        ),
        (409, Some("task_started"), Some("succeeded"))
    );
    let (status, answer) = asyncd
        .patch(
            "/v1/tasks/01900000-0000-7000-8000-000000000000",
            json!({"run_now": true}),
        )
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
}

#[tokio::test]
async fn a_bad_change_is_refused_naming_its_field() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "  uniqueKey: \"order:{order_id}\"\n")).await;
    let id = asyncd
        .submit(json!({"type": "work", "delay": "1h", "payload": {"order_id": 7, "n": 1}}))
        .await;
    let path = format!("/v1/tasks/{id}");
    let cases = [
        (json!({}), "invalid_field", "payload"),
        (
            json!({"delay": "1m", "eta": "2030-01-01T00:00:00Z"}),
            "invalid_field",
            "eta",
        ),
        (
            json!({"delay": "1m", "run_now": true}),
            "invalid_field",
            "run_now",
        ),
        (json!({"delay": "401d"}), "invalid_field", "delay"),
        (json!({"priority": 12}), "invalid_field", "priority"),
        (
            json!({"payload": {"order_id": 8}}),
            "invalid_field",
            "payload",
        ),
        (json!({"type": "other"}), "malformed_json", ""),
    ];
    for (body, code, field) in cases {
        let (status, answer) = asyncd.patch(&path, body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(
            answer["error"]["code"].as_str(),
            Some(code),
            "{body}: {answer}"
        );
        if !field.is_empty() {
            assert_eq!(
                answer["error"]["field"].as_str(),
                Some(field),
                "{body}: {answer}"
            );
        }
    }
    let task = asyncd.get(&path).await.1;
    assert_eq!(
        task["payload"],
        json!({"order_id": 7, "n": 1}),
        "nothing changed"
    );

    // A payload that keeps the key the job renders from it is a change like any other.
    let (status, answer) = asyncd
        .patch(&path, json!({"payload": {"order_id": 7, "n": 2}}))
        .await;
    assert_eq!(
        (status, &answer["payload"]["n"]),
        (200, &json!(2)),
        "{answer}"
    );
}

#[tokio::test]
async fn a_task_is_changed_by_its_job_and_key() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let keyed = asyncd
        .submit(json!({"type": "work", "delay": "1h", "idempotency_key": "order-7", "payload": {"v": 1}}))
        .await;
    let (status, answer) = asyncd
        .patch(
            "/v1/tasks?job=test-job&idempotency_key=order-7",
            json!({"payload": {"v": 2}}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        (answer["id"].as_str(), &answer["payload"]),
        (Some(keyed.as_str()), &json!({"v": 2}))
    );

    let unique = asyncd
        .submit(json!({"type": "work", "delay": "1h", "unique_key": "u-1"}))
        .await;
    let (status, answer) = asyncd
        .patch("/v1/tasks?type=work&unique_key=u-1", json!({"priority": 4}))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        (answer["id"].as_str(), &answer["priority"]),
        (Some(unique.as_str()), &json!(4))
    );

    let (status, answer) = asyncd
        .patch(
            "/v1/tasks?job=test-job&unique_key=nobody",
            json!({"priority": 4}),
        )
        .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let (status, answer) = asyncd
        .patch("/v1/tasks?job=test-job", json!({"priority": 4}))
        .await;
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("unique_key"))
    );
}

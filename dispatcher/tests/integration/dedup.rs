//! Submitting the same work twice: an idempotency key answers with the first task, a
//! unique key allows one unfinished task, and for the job's window after it succeeded.

use std::time::Duration;

use asyncd_store::Millis;
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn idempotency_key_returns_the_first_task() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let body = json!({"type": "work", "payload": {}, "idempotency_key": "order-42", "delay": "1s"});
    let (s1, first) = asyncd.post("/v1/tasks", body.clone()).await;
    let (s2, second) = asyncd.post("/v1/tasks", body).await;
    assert_eq!((s1, s2), (201, 200));
    assert_eq!(first["id"], second["id"]);
    assert_eq!(second["duplicate"], true);
    assert_eq!(first["eta"], second["eta"]);
    let id = first["id"].as_str().unwrap();
    asyncd
        .clock
        .set_millis(Millis::new(parse_time(&first["eta"])));
    asyncd.wait_state(id, "succeeded").await;
    let (s3, third) = asyncd
        .post(
            "/v1/tasks",
            json!({"type": "work", "payload": {}, "idempotency_key": "order-42"}),
        )
        .await;
    assert_eq!(
        (s3, third["id"].as_str()),
        (200, Some(id)),
        "still the same task after it ran"
    );
    // The key with another payload (or none) is another request: refused, naming the
    // task that holds the key, however long ago that task ran.
    for other in [json!({"order_id": 43}), json!(null)] {
        let (status, refused) = asyncd
            .post(
                "/v1/tasks",
                json!({"type": "work", "payload": other, "idempotency_key": "order-42"}),
            )
            .await;
        assert_eq!(status, 409, "{refused}");
        assert_eq!(refused["error"]["code"], "idempotency_mismatch");
        assert_eq!(refused["error"]["field"], "idempotency_key");
        assert_eq!(refused["error"]["existing_id"].as_str(), Some(id));
    }
    let call = &executor.calls_for(id)[0];
    assert_eq!(call.headers["idempotency-key"], "order-42");
    assert_eq!(executor.calls().len(), 1);
}

#[tokio::test]
async fn unique_key_allows_one_pending_task() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "  uniqueKey: \"order:{order_id}\"\n")).await;
    let first = asyncd
        .submit(json!({"type": "work", "payload": {"order_id": 7}, "delay": "2s"}))
        .await;
    let (status, answer) = asyncd
        .post(
            "/v1/tasks",
            json!({"type": "work", "payload": {"order_id": 7}}),
        )
        .await;
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["code"], "unique_conflict");
    assert_eq!(answer["error"]["existing_id"], first.as_str());
    asyncd
        .submit(json!({"type": "work", "payload": {"order_id": 8}}))
        .await;
    asyncd.clock.advance(Duration::from_secs(2));
    asyncd.wait_state(&first, "succeeded").await;
    asyncd
        .submit(json!({"type": "work", "payload": {"order_id": 7}}))
        .await;
}

/// Issue 15: a job's `retention.uniqueKeys` keeps a succeeded task's unique key held,
/// counted from when it succeeded: a late submit with the key within the window is
/// refused (409 `unique_conflict` naming the finished task), and from the window's end
/// the same submit makes a new task. (The API on SQLite, where the manual clock can move
/// freely; a server store refuses to dispatch on a clock an hour off its own, and the
/// store suite covers the server backends at the same instants.)
#[tokio::test]
async fn a_unique_key_is_held_for_its_window_after_success() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "  retention:\n    uniqueKeys: 1h\n")).await;
    let submit = json!({"type": "work", "payload": {}, "unique_key": "order:7"});
    let (status, first) = asyncd.post("/v1/tasks", submit.clone()).await;
    assert_eq!(status, 201, "{first}");
    let id = first["id"].as_str().unwrap().to_string();
    let done = asyncd.wait_state(&id, "succeeded").await;
    let finished = parse_time(&done["updated_at"]);

    asyncd.clock.set_millis(Millis::new(finished + 3_599_999));
    let (status, late) = asyncd.post("/v1/tasks", submit.clone()).await;
    assert_eq!(
        (
            status,
            late["error"]["code"].as_str(),
            late["error"]["existing_id"].as_str()
        ),
        (409, Some("unique_conflict"), Some(id.as_str())),
        "within the window: {late}"
    );
    asyncd.clock.set_millis(Millis::new(finished + 3_600_000));
    let (status, fresh) = asyncd.post("/v1/tasks", submit).await;
    assert_eq!(status, 201, "after the window: {fresh}");
    assert_ne!(fresh["id"].as_str(), Some(id.as_str()));
    asyncd
        .wait_state(fresh["id"].as_str().unwrap(), "succeeded")
        .await;
}

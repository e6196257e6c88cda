//! Tasks that expire: `expires_at` or `start_within` on the submit, or the job's
//! `spec.startWithin`. Past it no attempt begins — not the first, not a retry — and the
//! task ends `expired`, counted in `asyncd_task_expired_total`. Driven by the injected
//! clock: the expiry and the due time come in one step of it.

use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn a_task_due_past_its_expiry_never_reaches_the_executor_and_ends_expired() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let expiring = asyncd
        .submit(json!({"type": "work", "delay": "1m", "start_within": "10s"}))
        .await;
    let lasting = asyncd.submit(json!({"type": "work", "delay": "1m"})).await;
    let task = asyncd.task(&expiring).await;
    assert_eq!(parse_time(&task["expires_at"]), T0 + 70_000, "{task}");
    assert!(
        asyncd.task(&lasting).await["expires_at"].is_null(),
        "a task without an expiry shows none"
    );

    // Both fall due, and the first past its expiry, in one step of the clock.
    asyncd
        .clock
        .set_millis(asyncd_store::Millis::new(T0 + 70_000));
    asyncd.wait_state(&lasting, "succeeded").await;
    let expired = asyncd.wait_state(&expiring, "expired").await;
    assert!(
        expired["last_error"].as_str().unwrap().contains("expired"),
        "{expired}"
    );
    assert_eq!(expired["attempt"], 0, "{expired}");
    assert!(executor.calls_for(&expiring).is_empty());
    assert_eq!(executor.calls_for(&lasting).len(), 1);

    let (_, found) = asyncd.get("/v1/tasks?state=expired").await;
    assert_eq!(found["items"][0]["id"], expiring.as_str(), "{found}");
    assert_eq!(found["items"].as_array().unwrap().len(), 1, "{found}");
    let metrics = asyncd.metrics().await;
    assert!(
        metrics.contains("asyncd_task_expired_total{task_type=\"work\"} 1"),
        "{metrics}"
    );
    let (status, answer) = asyncd
        .patch(&format!("/v1/tasks/{expiring}"), json!({"run_now": true}))
        .await;
    assert_eq!(
        (status, answer["error"]["state"].as_str()),
        (409, Some("expired")),
        "{answer}"
    );
}

#[tokio::test]
async fn no_retry_begins_past_the_expiry() {
    let executor = Executor::start(|_| Answer::status(503)).await;
    let extra = "  retry:\n    initialBackoff: 10s\n    maxBackoff: 10s\n";
    let asyncd = InProcess::start(&one_job(&executor, extra)).await;
    let id = asyncd
        .submit(json!({"type": "work", "start_within": "2s"}))
        .await;
    executor.wait_calls(&id, 1).await;
    // The retry is due 5–10 s later, past the expiry 2 s after the submit.
    let eta = asyncd.run_when_due(&id).await;
    assert!(eta >= T0 + 5_000, "retry due at T0 + {} ms", eta - T0);
    let expired = asyncd.wait_state(&id, "expired").await;
    assert_eq!(expired["attempt"], 1, "{expired}");
    assert_eq!(executor.calls_for(&id).len(), 1, "the retry never began");
}

#[tokio::test]
async fn the_jobs_start_within_applies_unless_the_submit_gives_its_own() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "  startWithin: 5m\n")).await;
    let by_job = asyncd.submit(json!({"type": "work", "delay": "1h"})).await;
    assert_eq!(
        parse_time(&asyncd.task(&by_job).await["expires_at"]),
        T0 + 3_600_000 + 300_000
    );
    let own = asyncd
        .submit(json!({"type": "work", "delay": "1h", "expires_at": "2027-01-15T10:00:00Z"}))
        .await;
    assert_eq!(
        parse_time(&asyncd.task(&own).await["expires_at"]),
        T0 + 2 * 3_600_000
    );
    let within = asyncd
        .submit(json!({"type": "work", "start_within": "30s"}))
        .await;
    assert_eq!(
        parse_time(&asyncd.task(&within).await["expires_at"]),
        T0 + 30_000
    );
}

#[tokio::test]
async fn a_bad_expiry_is_refused_naming_its_field() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let asyncd = InProcess::start(&one_job(&executor, "")).await;
    let cases = [
        (
            json!({"start_within": "1m", "expires_at": "2027-01-15T10:00:00Z"}),
            "start_within",
        ),
        (json!({"start_within": "soon"}), "start_within"),
        (json!({"start_within": "0s"}), "start_within"),
        (json!({"start_within": "401d"}), "start_within"),
        (json!({"expires_at": "tomorrow"}), "expires_at"),
        // Not after the task is due: it could never begin.
        (json!({"expires_at": "2027-01-15T08:00:00Z"}), "expires_at"),
        (
            json!({"delay": "2h", "expires_at": "2027-01-15T09:00:00Z"}),
            "expires_at",
        ),
    ];
    for (fields, field) in cases {
        let mut body = json!({"type": "work"});
        body.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        let (status, answer) = asyncd.post("/v1/tasks", body.clone()).await;
        assert_eq!(
            (
                status,
                answer["error"]["code"].as_str(),
                answer["error"]["field"].as_str()
            ),
            (400, Some("invalid_field"), Some(field)),
            "{body}: {answer}"
        );
    }

    // A change may not move a task's due time to its expiry or past it.
    let id = asyncd
        .submit(json!({"type": "work", "delay": "1h", "start_within": "1m"}))
        .await;
    for (change, field) in [
        (json!({"delay": "2h"}), "delay"),
        (json!({"eta": "2027-01-15T09:01:00Z"}), "eta"),
    ] {
        let (status, answer) = asyncd.patch(&format!("/v1/tasks/{id}"), change).await;
        assert_eq!(
            (status, answer["error"]["field"].as_str()),
            (400, Some(field)),
            "{answer}"
        );
    }
    let (status, answer) = asyncd
        .patch(&format!("/v1/tasks/{id}"), json!({"delay": "1h30s"}))
        .await;
    assert_eq!(status, 200, "before the expiry: {answer}");
}

//! Leases of asynchronous attempts (an executor answering 202): a lapsed lease retried,
//! heartbeats keeping one, and what a lapsed attempt may still report.

use std::time::Duration;

use asyncd_store::Millis;
use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn a_lapsed_202_lease_is_retried() {
    let executor = Executor::start(|call| {
        if call.attempt == 1 {
            Answer::status(202).with_body(r#"{"lease":"1s"}"#)
        } else {
            Answer::ok()
        }
    })
    .await;
    let mut asyncd =
        InProcess::start(&one_job(&executor, "  retry:\n    initialBackoff: 100ms\n")).await;
    let id = asyncd.submit(task("work", json!({}))).await;
    // The 202's lease is recorded with the attempt's outcome.
    asyncd.finished(&id).await;
    let running = asyncd.task(&id).await;
    assert_eq!(
        (running["state"].as_str(), running["attempt"].as_i64()),
        (Some("running"), Some(1))
    );
    let lease_until = parse_time(&running["lease_until"]);
    assert!(
        lease_until >= T0 + 1_000,
        "at least the executor's 1 s lease"
    );
    // Still held at its last millisecond…
    asyncd.clock.set_millis(Millis::new(lease_until));
    asyncd.rescue_pass(lease_until).await;
    assert_eq!(asyncd.task(&id).await["state"], "running");
    // …and retried once past it.
    asyncd.clock.set_millis(Millis::new(lease_until + 1));
    assert_eq!(asyncd.rescue_pass(lease_until + 1).await, 1);
    let retry = asyncd.run_when_due(&id).await;
    assert!(
        retry > lease_until,
        "retried at {retry}, before the lease lapsed"
    );
    let done = asyncd.wait_state(&id, "succeeded").await;
    assert_eq!(done["attempt"], 2);
    let calls = executor.calls_for(&id);
    assert_ne!(
        calls[1].lease_token, calls[0].lease_token,
        "each attempt has its own token"
    );
}

#[tokio::test]
async fn heartbeats_keep_a_lease_and_the_result_completes_it() {
    let executor = Executor::start(|_| Answer::status(202).with_body(r#"{"lease":"1s"}"#)).await;
    let mut asyncd = InProcess::start(&one_job(&executor, "")).await;
    let id = asyncd.submit(task("work", json!({}))).await;
    let call = executor.wait_calls(&id, 1).await.remove(0);
    assert_eq!(
        call.headers["asyncd-callback-url"],
        format!("http://{}", asyncd.addr)
    );
    // Three seconds of work, three times the lease, kept alive by heartbeats; after each
    // step a rescuer pass has seen the clock and brought nothing back.
    for _ in 0..10 {
        let (status, beat) = asyncd
            .post(
                &format!("/v1/tasks/{id}/heartbeat"),
                json!({"lease_token": call.lease_token}),
            )
            .await;
        assert_eq!(status, 200, "{beat}");
        asyncd.clock.advance(Duration::from_millis(300));
        let now = asyncd.now();
        assert_eq!(asyncd.rescue_pass(now).await, 0);
    }
    let (status, answer) = asyncd
        .post(
            &format!("/v1/tasks/{id}/result"),
            json!({"lease_token": call.lease_token, "status": "success", "output": {"rows": 12}}),
        )
        .await;
    assert_eq!(
        (status, answer["state"].as_str()),
        (200, Some("succeeded")),
        "{answer}"
    );
    let done = asyncd.task(&id).await;
    assert_eq!(
        done["attempt"], 1,
        "no second attempt while heartbeats came"
    );
    assert_eq!(done["result"], json!({"rows": 12}));
    assert_eq!(executor.calls_for(&id).len(), 1);
}

/// Issue 10, finding 3, through the result callback: an executor whose attempt was given
/// up (its lease lapsed) and queued again, or dead-lettered on its last try, reports
/// success before any new attempt is claimed — the work did succeed, so it lands instead
/// of running again or staying in dead letters. A late failure or heartbeat is refused.
#[tokio::test]
async fn a_lapsed_attempts_success_lands_until_a_new_attempt() {
    let executor = Executor::start(|_| Answer::status(202).with_body(r#"{"lease":"1s"}"#)).await;
    // One retry, an hour away: the given-up attempt's task waits, pending, meanwhile.
    let mut asyncd = InProcess::start(&one_job(
        &executor,
        "  retry:\n    maxRetries: 1\n    initialBackoff: 1h\n    maxBackoff: 1h\n",
    ))
    .await;
    let lapse = async |asyncd: &mut InProcess, id: &str| -> String {
        let token = executor.wait_calls(id, 1).await.pop().unwrap().lease_token;
        wait_for("the 202's lease recorded", DEADLINE, async || {
            let t = asyncd.task(id).await;
            (t["state"] == "running" && !t["lease_until"].is_null()).then_some(())
        })
        .await;
        let lease_until = parse_time(&asyncd.task(id).await["lease_until"]);
        asyncd.clock.set_millis(Millis::new(lease_until + 1));
        assert_eq!(asyncd.rescue_pass(lease_until + 1).await, 1);
        token
    };

    let queued = asyncd.submit(task("work", json!({"n": 1}))).await;
    let token = lapse(&mut asyncd, &queued).await;
    assert_eq!(asyncd.task(&queued).await["state"], "pending");
    for (path, body) in [
        ("heartbeat", json!({"lease_token": token})),
        (
            "result",
            json!({"lease_token": token, "status": "failed", "error": "late"}),
        ),
    ] {
        let (status, answer) = asyncd
            .post(&format!("/v1/tasks/{queued}/{path}"), body)
            .await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (409, Some("stale_lease")),
            "late {path}"
        );
    }
    let (status, answer) = asyncd
        .post(
            &format!("/v1/tasks/{queued}/result"),
            json!({"lease_token": token, "status": "success", "output": "late"}),
        )
        .await;
    assert_eq!(
        (status, answer["state"].as_str()),
        (200, Some("succeeded")),
        "{answer}"
    );
    let done = asyncd.task(&queued).await;
    assert_eq!(
        (done["attempt"].as_i64(), &done["result"]),
        (Some(1), &json!("late"))
    );

    // Its last attempt lapsed: dead-lettered, until the success comes in.
    let last = asyncd.submit(task("work", json!({"n": 2}))).await;
    let first = lapse(&mut asyncd, &last).await;
    let (status, _) = asyncd
        .post(
            &format!("/v1/tasks/{last}/result"),
            json!({"lease_token": first, "status": "retry"}),
        )
        .await;
    assert_eq!(status, 409, "a late retry is refused too");
    asyncd.run_when_due(&last).await;
    let calls = executor.wait_calls(&last, 2).await;
    let second = calls[1].lease_token.clone();
    assert_ne!(second, first);
    wait_for(
        "the second attempt's lease recorded",
        DEADLINE,
        async || {
            let t = asyncd.task(&last).await;
            (t["attempt"] == 2 && !t["lease_until"].is_null()).then_some(())
        },
    )
    .await;
    let lease_until = parse_time(&asyncd.task(&last).await["lease_until"]);
    asyncd.clock.set_millis(Millis::new(lease_until + 1));
    assert_eq!(asyncd.rescue_pass(lease_until + 1).await, 1);
    assert_eq!(asyncd.task(&last).await["state"], "dead");
    let (status, _) = asyncd
        .post(
            &format!("/v1/tasks/{last}/result"),
            json!({"lease_token": first, "status": "success"}),
        )
        .await;
    assert_eq!(
        status, 409,
        "the first attempt's token was spent by the second claim"
    );
    let (status, answer) = asyncd
        .post(
            &format!("/v1/tasks/{last}/result"),
            json!({"lease_token": second, "status": "success", "output": "late"}),
        )
        .await;
    assert_eq!(
        (status, answer["state"].as_str()),
        (200, Some("succeeded")),
        "{answer}"
    );
    assert_eq!(
        executor.calls_for(&last).len(),
        2,
        "nothing ran a third time"
    );
}

#[tokio::test]
async fn a_lapsed_attempts_late_result_is_refused() {
    let executor = Executor::start(|call| {
        let lease = if call.attempt == 1 { "1s" } else { "60s" };
        Answer::status(202).with_body(format!(r#"{{"lease":"{lease}"}}"#))
    })
    .await;
    let mut asyncd =
        InProcess::start(&one_job(&executor, "  retry:\n    initialBackoff: 100ms\n")).await;
    let id = asyncd.submit(task("work", json!({}))).await;
    executor.wait_calls(&id, 1).await;
    asyncd.finished(&id).await;
    let lease_until = parse_time(&asyncd.task(&id).await["lease_until"]);
    asyncd.clock.set_millis(Millis::new(lease_until + 1));
    assert_eq!(asyncd.rescue_pass(lease_until + 1).await, 1);
    asyncd.run_when_due(&id).await;
    let calls = executor.wait_calls(&id, 2).await;
    let (old, new) = (&calls[0].lease_token, &calls[1].lease_token);
    wait_for("second attempt leased", DEADLINE, async || {
        let t = asyncd.task(&id).await;
        (t["state"] == "running" && t["attempt"] == 2).then_some(())
    })
    .await;

    for (path, body) in [
        (
            "result",
            json!({"lease_token": old, "status": "success", "output": "stale"}),
        ),
        ("heartbeat", json!({"lease_token": old})),
    ] {
        let (status, answer) = asyncd.post(&format!("/v1/tasks/{id}/{path}"), body).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (409, Some("stale_lease")),
            "{path}"
        );
    }
    let task = asyncd.task(&id).await;
    assert_eq!(
        (task["state"].as_str(), task["attempt"].as_i64()),
        (Some("running"), Some(2))
    );

    let (status, _) = asyncd
        .post(
            &format!("/v1/tasks/{id}/result"),
            json!({"lease_token": new, "status": "success", "output": "fresh"}),
        )
        .await;
    assert_eq!(status, 200);
    let done = asyncd.task(&id).await;
    assert_eq!(done["result"], "fresh");
    let (status, _) = asyncd
        .post(
            &format!("/v1/tasks/{id}/result"),
            json!({"lease_token": new, "status": "failed"}),
        )
        .await;
    assert_eq!(status, 409, "a finished attempt cannot be reported twice");
}

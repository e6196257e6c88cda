//! Failed attempts: exponential backoff with equal jitter to dead letters, `Retry-After`
//! obeyed, and a permanent 4xx dead at once.

use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn failures_back_off_exponentially_then_dead_letter_and_redrive() {
    let executor = Executor::start(|_| Answer::status(500).with_body("down")).await;
    let extra = "  retry:\n    maxRetries: 3\n    initialBackoff: 200ms\n    maxBackoff: 10s\n";
    let mut asyncd = InProcess::start(&one_job(&executor, extra)).await;
    let id = asyncd.submit(task("work", json!({}))).await;
    let mut dispatched = vec![asyncd.dispatched(&id).await.1];
    for i in 0..3 {
        asyncd.finished(&id).await;
        let eta = asyncd.run_when_due(&id).await;
        // Equal jitter: each gap lies in [backoff/2, backoff], to the millisecond.
        let gap = eta - dispatched[i];
        let full = 200 << i;
        assert!(
            (full / 2..=full).contains(&gap),
            "gap {i} was {gap} ms, not within [{}, {full}]",
            full / 2
        );
        assert_eq!(asyncd.dispatched(&id).await, (eta, eta));
        dispatched.push(eta);
    }
    let dead = asyncd.wait_state(&id, "dead").await;
    let calls = executor.calls_for(&id);
    assert_eq!(calls.len(), 4, "max_retries 3 means 4 attempts");
    assert_eq!(
        calls.iter().map(|c| c.attempt).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    assert!(
        dead["last_error"].as_str().unwrap().contains("500"),
        "{dead}"
    );

    let (_, letters) = asyncd.get("/v1/dead-letters?type=work").await;
    assert_eq!(letters["items"][0]["id"], id.as_str());
    let metrics = asyncd.metrics().await;
    assert!(
        metrics.contains("asyncd_task_retry_total{task_type=\"work\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("asyncd_task_executed_total{status=\"failed\",task_type=\"work\"} 4"),
        "{metrics}"
    );

    executor.set_script(|_| Answer::ok());
    let (status, redriven) = asyncd
        .post(&format!("/v1/dead-letters/{id}/redrive"), json!({}))
        .await;
    assert_eq!(status, 200, "{redriven}");
    let done = asyncd.wait_state(&id, "succeeded").await;
    assert_eq!(done["attempt"], 1, "redrive resets the attempt count");
    let (status, again) = asyncd
        .post(&format!("/v1/dead-letters/{id}/redrive"), json!({}))
        .await;
    assert_eq!(
        (status, again["error"]["code"].as_str()),
        (409, Some("not_dead"))
    );
    let (_, letters) = asyncd.get("/v1/dead-letters?type=work").await;
    assert_eq!(letters["items"], json!([]));
}

#[tokio::test]
async fn retry_after_is_obeyed() {
    let executor = Executor::start(|call| {
        if call.attempt == 1 {
            Answer::status(429).with_header("retry-after", "2")
        } else {
            Answer::ok()
        }
    })
    .await;
    // A 10 s backoff would be obvious if Retry-After were ignored.
    let extra = "  retry:\n    initialBackoff: 10s\n";
    let mut asyncd = InProcess::start(&one_job(&executor, extra)).await;
    let id = asyncd.submit(task("work", json!({}))).await;
    let (_, first) = asyncd.dispatched(&id).await;
    asyncd.finished(&id).await;
    let second = asyncd.run_when_due(&id).await;
    assert_eq!(
        second - first,
        2_000,
        "second attempt exactly Retry-After later"
    );
    asyncd.wait_state(&id, "succeeded").await;
    assert_eq!(executor.calls_for(&id).len(), 2);
}

/// A 4xx is permanent. Its body is kept in `last_error` only for a job that opts in
/// (`executor.errorBodies`): otherwise the URL could read out any service's answers.
#[tokio::test]
async fn permanent_4xx_goes_straight_to_dead_letters() {
    let executor = Executor::start(|_| Answer::status(422).with_body("bad order")).await;
    let url = executor.url();
    let asyncd = InProcess::start(&[
        ("plain.yaml", job_yaml("plain-job", "work", &url, "")),
        (
            "bodies.yaml",
            job_yaml("bodies-job", "bodies", &url, "    errorBodies: true\n"),
        ),
    ])
    .await;
    let plain = asyncd.submit(task("work", json!({}))).await;
    let opted = asyncd.submit(task("bodies", json!({}))).await;
    for (id, last_error) in [
        (&plain, "executor answered 422 Unprocessable Entity"),
        (&opted, "executor answered 422: bad order"),
    ] {
        let dead = asyncd.wait_state(id, "dead").await;
        assert_eq!(executor.calls_for(id).len(), 1);
        assert_eq!(dead["last_error"], last_error, "{dead}");
    }
}

//! HTTP/2: a job with `executor.http2` calls its executor over HTTP/2 by prior knowledge
//! (h2c) and every other job over HTTP/1.1; the API answers HTTP/2 by prior knowledge as
//! well as HTTP/1.1.

use serde_json::json;

use crate::support::*;

#[tokio::test]
async fn a_job_with_http2_calls_over_h2c_and_the_api_takes_h2c_submits() {
    let h2 = Executor::start(|_| Answer::ok()).await;
    let h1 = Executor::start(|_| Answer::ok()).await;
    let jobs = [
        (
            "h2.yaml",
            job_yaml("h2-job", "over-h2", &h2.url(), "    http2: true\n"),
        ),
        ("h1.yaml", job_yaml("h1-job", "over-h1", &h1.url(), "")),
    ];
    let mut asyncd = InProcess::start(&jobs).await;
    // Every submit and read of this test goes over h2c.
    asyncd.http = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let over_h2 = asyncd.submit(task("over-h2", json!({"n": 1}))).await;
    let over_h1 = asyncd.submit(task("over-h1", json!({"n": 2}))).await;
    asyncd.wait_state(&over_h2, "succeeded").await;
    asyncd.wait_state(&over_h1, "succeeded").await;

    let call = &h2.calls_for(&over_h2)[0];
    assert_eq!(call.version, axum::http::Version::HTTP_2);
    assert_eq!(call.body["payload"], json!({"n": 1}));
    assert_eq!(call.attempt, 1);
    assert_eq!(
        h1.calls_for(&over_h1)[0].version,
        axum::http::Version::HTTP_11
    );
}

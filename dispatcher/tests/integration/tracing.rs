//! Issue 16's trace context: a `traceparent` given at submit reaches every executor
//! call, on the store route (in process, on the test's clock) and on the Kafka route
//! (the real binary and broker); with an OTLP endpoint, the executor's parent is the
//! attempt's span and spans are posted to `{endpoint}/v1/traces`. e2e/tracing.sh decodes
//! those spans with the official opentelemetry-proto package.

use std::sync::{Arc, Mutex};

use asyncd::trace::OtlpSettings;
use asyncd_store::Millis;
use serde_json::{Value, json};

use crate::support::*;

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

async fn submit_with(api: &impl Api, path: &str, body: Value, headers: &[(&str, &str)]) -> Value {
    let mut request = api.http().post(api.url(path)).json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let answer = request.send().await.unwrap();
    let status = answer.status().as_u16();
    let body: Value = answer.json().await.unwrap();
    assert!(status == 201 || status == 200, "{status} {body}");
    body
}

#[tokio::test]
async fn the_submitters_traceparent_reaches_every_attempt_on_the_store_route() {
    // The first attempt fails, so the retry shows the trace is kept with the task.
    let executor = Executor::start(|call| {
        if call.attempt == 1 {
            Answer::status(500)
        } else {
            Answer::ok()
        }
    })
    .await;
    let asyncd = InProcess::start(&one_job(&executor, "  retry:\n    maxRetries: 1\n")).await;
    let answer = submit_with(
        &asyncd,
        "/v1/tasks",
        json!({"type": "work"}),
        &[("traceparent", TRACEPARENT), ("tracestate", "vendor=1")],
    )
    .await;
    let id = answer["id"].as_str().unwrap().to_string();
    let first = executor.wait_calls(&id, 1).await.remove(0);
    // Without an exporter nothing is recorded: the caller's span stays the parent.
    assert_eq!(first.headers["traceparent"], TRACEPARENT);
    assert_eq!(first.headers["tracestate"], "vendor=1");
    let task = wait_for("the retry to be scheduled", DEADLINE, async || {
        let task = asyncd.task(&id).await;
        matches!(task["state"].as_str(), Some("pending" | "claimed")).then_some(task)
    })
    .await;
    asyncd
        .clock
        .set_millis(Millis::new(parse_time(&task["eta"])));
    let second = executor.wait_calls(&id, 2).await.remove(1);
    assert_eq!(second.attempt, 2);
    assert_eq!(second.headers["traceparent"], TRACEPARENT);

    // A batch's tasks all join the request's trace; a malformed header is ignored, not
    // refused (W3C Trace Context), and the task runs untraced.
    let batch = submit_with(
        &asyncd,
        "/v1/tasks:batch",
        json!({"tasks": [{"type": "work"}, {"type": "work"}]}),
        &[("traceparent", TRACEPARENT)],
    )
    .await;
    let malformed = submit_with(
        &asyncd,
        "/v1/tasks",
        json!({"type": "work"}),
        &[(
            "traceparent",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
        )],
    )
    .await;
    for result in batch["results"].as_array().unwrap() {
        let id = result["id"].as_str().unwrap();
        let call = executor.wait_calls(id, 1).await.remove(0);
        assert_eq!(call.headers["traceparent"], TRACEPARENT, "batch item {id}");
        assert!(!call.headers.contains_key("tracestate"));
    }
    let call = executor
        .wait_calls(malformed["id"].as_str().unwrap(), 1)
        .await
        .remove(0);
    assert!(
        !call.headers.contains_key("traceparent"),
        "{:?}",
        call.headers
    );
}

/// What the collector was sent: each request's content type and body.
type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// An OTLP/HTTP endpoint that keeps what it is sent.
async fn collector() -> (String, Received) {
    let received: Received = Arc::default();
    let keep = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let keep = keep.clone();
                async move {
                    let content_type = headers
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    keep.lock().unwrap().push((content_type, body.to_vec()));
                    ""
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), received)
}

#[tokio::test]
async fn with_an_exporter_the_executors_parent_is_the_attempt_span() {
    let executor = Executor::start(|_| Answer::ok()).await;
    let (endpoint, received) = collector().await;
    let asyncd = InProcess::start_with(&one_job(&executor, ""), |s| {
        s.otlp = Some(OtlpSettings {
            endpoint,
            service_name: "tracing-test".into(),
        })
    })
    .await;
    let id = asyncd.submit(json!({"type": "work"})).await;
    let traced = submit_with(
        &asyncd,
        "/v1/tasks",
        json!({"type": "work"}),
        &[("traceparent", TRACEPARENT)],
    )
    .await;
    let traced = traced["id"].as_str().unwrap();
    let call = executor.wait_calls(traced, 1).await.remove(0);
    let parent = &call.headers["traceparent"];
    let (prefix, rest) = parent.split_at(36);
    assert_eq!(prefix, &TRACEPARENT[..36], "same version and trace id");
    assert_ne!(
        &rest[..16],
        &TRACEPARENT[36..52],
        "the attempt's span, not the caller's"
    );
    assert!(rest.ends_with("-01"), "{parent}");
    assert!(
        !executor.wait_calls(&id, 1).await[0]
            .headers
            .contains_key("traceparent"),
        "a task submitted without a trace is called without one"
    );
    // The submit span, then dispatch and attempt: within a batch wait or two.
    let bodies = wait_for("spans at the collector", DEADLINE, async || {
        let bodies = received.lock().unwrap().clone();
        let all: Vec<u8> = bodies.iter().flat_map(|(_, b)| b.clone()).collect();
        let names = ["submit", "dispatch", "attempt"];
        names
            .iter()
            .all(|n| all.windows(n.len()).any(|w| w == n.as_bytes()))
            .then_some(bodies)
    })
    .await;
    for (content_type, body) in &bodies {
        assert_eq!(content_type, "application/x-protobuf");
        let trace_id = hex_bytes(&TRACEPARENT[3..35]);
        assert!(
            body.windows(16).any(|w| w == trace_id),
            "the caller's trace id"
        );
        assert!(
            !body.windows(id.len()).any(|w| w == id.as_bytes()),
            "no spans for the untraced task"
        );
    }
}

fn hex_bytes(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

#[tokio::test]
async fn the_kafka_route_keeps_the_traceparent() {
    let Some(broker) = Broker::shared().await else {
        return;
    };
    let executor = Executor::start(|_| Answer::ok()).await;
    let topic = format!("asyncd-test-traced-{}", uuid::Uuid::now_v7().simple());
    let jobs = [(
        "job.yaml",
        job_yaml(
            "traced",
            "traced",
            &executor.url(),
            &format!(
                "  kafka:\n    topic: {topic}\n    partitions: 1\n    consumerGroup: {topic}-cg\n"
            ),
        ),
    )];
    let asyncd = Asyncd::start(
        &jobs,
        &["--kafka-brokers", &broker.address, "--create-topics"],
    )
    .await;
    // The topic is created on start; the first produce may race it.
    let answer = wait_for("a submit through Kafka", DEADLINE, async || {
        let answer = asyncd
            .http()
            .post(asyncd.url("/v1/tasks"))
            .header("traceparent", TRACEPARENT)
            .header("tracestate", "k=v")
            .json(&json!({"type": "traced"}))
            .send()
            .await
            .unwrap();
        (answer.status() == 201).then_some(answer.json::<Value>().await.unwrap())
    })
    .await;
    assert_eq!(answer["route"], "kafka");
    let call = executor
        .wait_calls(answer["id"].as_str().unwrap(), 1)
        .await
        .remove(0);
    assert_eq!(call.headers["traceparent"], TRACEPARENT);
    assert_eq!(call.headers["tracestate"], "k=v");
}

//! Ordered keys (`spec.ordering: {key, mode: fifo}`, docs/design.md "Order per key") end
//! to end on the in-process `dev` role and the manual clock: a key's tasks reach the
//! executor in submission order, one at a time, and a retry keeps its place. The claim's
//! SQL runs on every backend in the store suite (`store_suite/ordering.rs`).

use std::sync::{Arc, Mutex};

use asyncd_store::Millis;
use axum::body::Bytes;
use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::support::*;

const EACH: usize = 5;

/// An executor that notes each call's `(key, n)` in arrival order and fails the first
/// call of m0's first task.
#[derive(Clone, Default)]
struct Recorder {
    calls: Arc<Mutex<Vec<(String, u64)>>>,
}

impl Recorder {
    async fn start() -> (Self, String) {
        let recorder = Self::default();
        let r = recorder.clone();
        let app = axum::Router::new().fallback(move |body: Bytes| {
            let r = r.clone();
            async move {
                let body: Value = serde_json::from_slice(&body).unwrap();
                let key = body["payload"]["m"].as_str().unwrap().to_string();
                let n = body["payload"]["n"].as_u64().unwrap();
                let first = {
                    let mut calls = r.calls.lock().unwrap();
                    calls.push((key.clone(), n));
                    calls.iter().filter(|c| **c == (key.clone(), n)).count() == 1
                };
                if key == "m0" && n == 0 && first {
                    (StatusCode::INTERNAL_SERVER_ERROR, "not yet")
                } else {
                    (StatusCode::OK, "{}")
                }
            }
        });
        (recorder, serve_executor(app).await)
    }

    /// The `n` of each call of `key`, in arrival order.
    fn calls_of(&self, key: &str) -> Vec<u64> {
        let calls = self.calls.lock().unwrap();
        calls
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, n)| *n)
            .collect()
    }
}

/// m0's first task fails once and waits for its retry: none of m0's later tasks is
/// called meanwhile (with a key limit alone, m0's second would be called as soon as the
/// failure freed the key), while m1's run in order. Once the clock passes the retry,
/// m0's tasks run in submission order, the retried one first. The tasks of each key
/// are submitted in one batch with their due times in reverse, so due order would be
/// the opposite of submission order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_runs_in_submission_order_and_a_retry_keeps_its_place() {
    let (executor, url) = Recorder::start().await;
    let spec = "  concurrency: 4\n  ordering: {key: '{m}', mode: fifo}\n  retry: {maxRetries: 3, initialBackoff: 60s}\n";
    let jobs = vec![("job.yaml", job_yaml("ordered-job", "ordered", &url, spec))];
    let asyncd = InProcess::start(&jobs).await;
    for key in ["m0", "m1"] {
        let tasks: Vec<Value> = (0..EACH)
            .map(|n| {
                let eta = asyncd::clock::rfc3339(Millis::new(T0 + 1_000 - n as i64));
                json!({"type": "ordered", "payload": {"m": key, "n": n}, "eta": eta})
            })
            .collect();
        let (status, answer) = asyncd
            .post("/v1/tasks:batch", json!({"tasks": tasks}))
            .await;
        assert_eq!(status, 200, "{answer}");
    }
    asyncd.clock.set_millis(Millis::new(T0 + 2_000));

    let in_order: Vec<u64> = (0..EACH as u64).collect();
    wait_for("every task of m1 called", DEADLINE, async || {
        (executor.calls_of("m1").len() >= EACH).then_some(())
    })
    .await;
    assert_eq!(executor.calls_of("m1"), in_order, "m1 in submission order");
    assert_eq!(
        executor.calls_of("m0"),
        [0],
        "m0's later tasks waited for its first one's retry"
    );

    asyncd.clock.set_millis(Millis::new(T0 + 2_000 + 600_000));
    wait_for("m0's tasks called after the retry", DEADLINE, async || {
        (executor.calls_of("m0").len() > EACH).then_some(())
    })
    .await;
    let mut expected = vec![0];
    expected.extend(&in_order);
    assert_eq!(
        executor.calls_of("m0"),
        expected,
        "the retry kept its place"
    );
}

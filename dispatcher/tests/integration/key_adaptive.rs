//! `concurrencyKey.adaptive`: each key's limit backs off on its own after its executor's
//! overload answers, while the job's other keys keep theirs (docs/design.md, "Per-key
//! limits").

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use asyncd_store::Millis;
use axum::body::Bytes;
use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::support::*;

/// An executor that takes at most [`KEY_CAPACITY`] calls of key "a" at once and answers
/// the rest 429 (no retry time, so no cooldown), and takes any number of the other keys';
/// each call takes 20 ms. Records, per call, its key, its answer and how many of its
/// key's calls it held when it came (itself included).
#[derive(Clone, Default)]
struct KeyOverloaded {
    in_flight: Arc<Mutex<HashMap<String, usize>>>,
    calls: Arc<Mutex<Vec<(String, u16, usize)>>>,
}

const KEY_CAPACITY: usize = 2;

impl KeyOverloaded {
    async fn start() -> (Self, String) {
        let executor = Self::default();
        let e = executor.clone();
        let app = axum::Router::new().fallback(move |body: Bytes| {
            let e = e.clone();
            async move {
                let body: Value = serde_json::from_slice(&body).unwrap();
                let key = body["payload"]["k"].as_str().unwrap().to_string();
                let held = {
                    let mut in_flight = e.in_flight.lock().unwrap();
                    let n = in_flight.entry(key.clone()).or_default();
                    *n += 1;
                    *n
                };
                let status = if key == "a" && held > KEY_CAPACITY {
                    StatusCode::TOO_MANY_REQUESTS
                } else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    StatusCode::OK
                };
                *e.in_flight.lock().unwrap().get_mut(&key).unwrap() -= 1;
                e.calls.lock().unwrap().push((key, status.as_u16(), held));
                (status, "{}")
            }
        });
        (executor, serve_executor(app).await)
    }
}

/// `concurrencyKey.adaptive`: the executor refuses key "a" past 2 calls at once. Its
/// limit of 8 is cut and held near what the executor takes, while key "b" keeps all 8:
/// among a's last half of answers at most a third are 429 (measured 17.6 %; without the
/// cut 83 %: 8 in flight against 2 taken), b's calls reach 8 at once and none is
/// refused. The job-wide adaptive concurrency is off, so only the key's limit moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_backs_off_on_its_own_while_the_others_keep_their_limit() {
    const TASKS: usize = 300;
    const LATE_429_RATE: f64 = 1.0 / 3.0;
    let (executor, url) = KeyOverloaded::start().await;
    let spec = "  concurrency: 32\n  adaptiveConcurrency: {enabled: false}\n  \
                concurrencyKey: {key: '{k}', limit: 8, adaptive: true}\n  \
                retry: {maxRetries: 100, backoff: fixed, initialBackoff: 1ms, maxBackoff: 1ms}\n";
    let jobs = vec![("job.yaml", job_yaml("keys-job", "keys", &url, spec))];
    let asyncd = InProcess::start(&jobs).await;
    let eta = asyncd::clock::rfc3339(Millis::new(T0 + 1_000));
    let tasks: Vec<Value> = (0..TASKS)
        .flat_map(|i| {
            ["a", "b"].map(|k| json!({"type": "keys", "eta": eta, "payload": {"k": k, "n": i}}))
        })
        .collect();
    let (status, answer) = asyncd
        .post("/v1/tasks:batch", json!({"tasks": tasks}))
        .await;
    assert_eq!(status, 200, "{answer}");
    asyncd.clock.set_millis(Millis::new(T0 + 2_000));
    // Retries are due a millisecond after a refusal.
    let ticking = tick_clock(asyncd.clock.clone());
    let calls = wait_for(
        "every task answered 200",
        Duration::from_secs(120),
        async || {
            let calls = executor.calls.lock().unwrap().clone();
            (calls.iter().filter(|(_, status, _)| *status == 200).count() >= 2 * TASKS)
                .then_some(calls)
        },
    )
    .await;
    ticking.abort();
    let of = |key: &str| -> Vec<(u16, usize)> {
        calls
            .iter()
            .filter(|(k, _, _)| k == key)
            .map(|(_, status, held)| (*status, *held))
            .collect()
    };
    let (a, b) = (of("a"), of("b"));
    let late = &a[a.len() / 2..];
    let rate = late.iter().filter(|(s, _)| *s == 429).count() as f64 / late.len() as f64;
    eprintln!(
        "a: {} calls, {:.1} % of the last half refused; b: {} calls, at most {} at once",
        a.len(),
        rate * 100.0,
        b.len(),
        b.iter().map(|(_, held)| *held).max().unwrap_or(0)
    );
    assert!(
        rate <= LATE_429_RATE,
        "key a's limit was not cut: {:.1} % of its last half refused",
        rate * 100.0
    );
    assert!(b.iter().all(|(s, _)| *s == 200), "b was never refused");
    assert_eq!(
        b.iter().map(|(_, held)| *held).max(),
        Some(8),
        "b kept its limit of 8"
    );
    assert!(
        b.iter().all(|(_, held)| *held <= 8),
        "never more than the limit"
    );
}

//! The shared error taxonomy (sdk/testdata/errors.json) and opt-in retries, against a
//! scripted stand-in for the API.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use asyncd_client::{Client, Error, ErrorCode, RetryPolicy, Task};
use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde_json::{Value, json};

/// One canned answer: status, Retry-After, body.
type Answer = (u16, Option<&'static str>, String);

/// Answers each request with the next canned answer (then keeps the last) and records
/// each request's idempotency key.
#[derive(Clone, Default)]
struct Scripted {
    answers: Arc<Mutex<Vec<Answer>>>,
    keys: Arc<Mutex<Vec<Option<String>>>>,
}

impl Scripted {
    async fn start(answers: Vec<Answer>) -> (Scripted, String) {
        let s = Scripted {
            answers: Arc::new(Mutex::new(answers)),
            keys: Arc::default(),
        };
        let f = s.clone();
        let app = Router::new().fallback(move |body: Bytes| {
            let f = f.clone();
            async move {
                let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let n = {
                    let mut keys = f.keys.lock().unwrap();
                    keys.push(body["idempotency_key"].as_str().map(str::to_string));
                    keys.len()
                };
                let answers = f.answers.lock().unwrap();
                let (status, retry_after, body) = answers[(n - 1).min(answers.len() - 1)].clone();
                let mut resp = (StatusCode::from_u16(status).unwrap(), body).into_response();
                if let Some(v) = retry_after {
                    resp.headers_mut().insert("retry-after", v.parse().unwrap());
                }
                resp
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (s, format!("http://{addr}"))
    }

    fn calls(&self) -> usize {
        self.keys.lock().unwrap().len()
    }
}

fn api_error(code: &str) -> String {
    json!({"error": {"code": code, "message": "m", "existing_id": "t0"}}).to_string()
}

#[tokio::test]
async fn every_code_of_the_shared_table_is_typed_and_classed() {
    let table: Value = serde_json::from_str(include_str!("../../testdata/errors.json")).unwrap();
    let codes: BTreeSet<&str> = table["codes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["code"].as_str().unwrap())
        .collect();
    let server: BTreeSet<&str> = ErrorCode::SERVER.iter().map(ErrorCode::as_str).collect();
    assert_eq!(codes, server, "the table lists every code the server sends");
    for row in table["codes"].as_array().unwrap() {
        let code = row["code"].as_str().unwrap();
        let status = row["status"].as_u64().unwrap() as u16;
        let retryable = row["retryable"].as_bool().unwrap();
        let retry_after = retryable.then_some("1");
        let (_, endpoint) = Scripted::start(vec![(status, retry_after, api_error(code))]).await;
        let client = Client::builder().endpoint(endpoint).build().unwrap();
        let err = client.get("x").await.unwrap_err();
        let parsed = ErrorCode::parse(code);
        assert!(
            !matches!(parsed, ErrorCode::Other(_)),
            "{code} has a variant"
        );
        assert!(err.is(&parsed), "{code}: {err}");
        assert_eq!(ErrorCode::parse(code).status(), Some(status), "{code}");
        assert_eq!(err.is_retryable(), retryable, "{code}");
        assert_eq!(
            err.retry_after(),
            retryable.then_some(Duration::from_secs(1)),
            "{code}"
        );
    }
    for row in table["http_errors"].as_array().unwrap() {
        let status = row["status"].as_u64().unwrap() as u16;
        let (_, endpoint) =
            Scripted::start(vec![(status, None, "<html>proxy</html>".into())]).await;
        let client = Client::builder().endpoint(endpoint).build().unwrap();
        let err = client.get("x").await.unwrap_err();
        assert!(err.is(&ErrorCode::HttpError), "{status}: {err}");
        assert_eq!(
            err.is_retryable(),
            row["retryable"].as_bool().unwrap(),
            "{status}"
        );
        assert_eq!(err.is_rate_limited(), status == 429, "{status}");
    }
    let rate_limited = table["rate_limited"].as_array().unwrap();
    assert!(!rate_limited.is_empty(), "the table has rate_limited rows");
    for row in rate_limited {
        let code = row["code"].as_str().unwrap();
        let status = row["status"].as_u64().unwrap() as u16;
        let body = json!({"error": {"code": code, "message": "slow down"}}).to_string();
        let (_, endpoint) = Scripted::start(vec![(status, Some("1"), body)]).await;
        let client = Client::builder().endpoint(endpoint).build().unwrap();
        let err = client.get("x").await.unwrap_err();
        assert!(err.is_rate_limited() && err.is_retryable(), "{code}: {err}");
        assert!(err.is(&ErrorCode::parse(code)), "{code}: {err}");
        assert_eq!(err.retry_after(), Some(Duration::from_secs(1)), "{code}");
        assert_eq!(
            err.to_string(),
            format!("asyncd: rate limited: {code} (429): slow down")
        );
    }
}

#[tokio::test]
async fn a_transport_error_shows_its_cause_and_is_retryable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let client = Client::builder().endpoint(endpoint).build().unwrap();
    let err = client.get("x").await.unwrap_err();
    assert!(matches!(err, Error::Transport { .. }), "{err:?}");
    assert!(err.is_retryable());
    // In its Display, not only in {:?}.
    assert!(
        err.to_string()
            .to_lowercase()
            .contains("connection refused"),
        "{err}"
    );
}

const UNAVAILABLE: &str =
    r#"{"error":{"code":"store_unavailable","message":"the store did not answer"}}"#;
const CREATED: &str =
    r#"{"id":"t1","eta":"2026-12-01T00:00:00Z","route":"store","duplicate":false}"#;

/// `max_attempts`, 100 ms doubling to 3 s, each wait recorded in `waits` instead of slept.
fn recording_policy(max_attempts: u32, waits: &Arc<Mutex<Vec<Duration>>>) -> RetryPolicy {
    let w = waits.clone();
    RetryPolicy::new(max_attempts)
        .backoff(Duration::from_millis(100), Duration::from_secs(3))
        .sleep_with(move |d| {
            w.lock().unwrap().push(d);
            async {}
        })
}

#[tokio::test]
async fn retries_honour_retry_after_and_resend_the_same_key() {
    let (s, endpoint) = Scripted::start(vec![
        (503, Some("2"), UNAVAILABLE.into()),
        (503, None, api_error("kafka_unavailable")),
        (201, None, CREATED.into()),
    ])
    .await;
    let waits = Arc::new(Mutex::new(Vec::new()));
    let retried = Arc::new(Mutex::new(Vec::new()));
    let r = retried.clone();
    let client = Client::builder()
        .endpoint(endpoint)
        .retry(recording_policy(4, &waits).on_retry(move |n, err, _| {
            r.lock()
                .unwrap()
                .push(format!("{n}:{}", err.code().unwrap()));
        }))
        .build()
        .unwrap();
    let task = Task::new("t", json!({"a": 1})).idempotency_key("k-1");
    let res = client.submit(&task).await.unwrap();
    assert_eq!(res.id, "t1");
    assert_eq!(*s.keys.lock().unwrap(), vec![Some("k-1".to_string()); 3]);
    let waits = waits.lock().unwrap().clone();
    // Retry-After first; then the backoff's second step, 200 ms with equal jitter.
    assert_eq!(waits.len(), 2);
    assert_eq!(waits[0], Duration::from_secs(2));
    assert!(
        (Duration::from_millis(100)..=Duration::from_millis(200)).contains(&waits[1]),
        "{waits:?}"
    );
    assert_eq!(
        *retried.lock().unwrap(),
        ["1:store_unavailable", "2:kafka_unavailable"]
    );
}

#[tokio::test]
async fn retries_give_up_and_never_repeat_a_refusal() {
    let (s, endpoint) = Scripted::start(vec![(503, Some("1"), UNAVAILABLE.into())]).await;
    let waits = Arc::new(Mutex::new(Vec::new()));
    let client = Client::builder()
        .endpoint(endpoint)
        .retry(recording_policy(3, &waits))
        .build()
        .unwrap();
    let task = Task::new("t", json!({})).idempotency_key("k");
    let err = client.submit(&task).await.unwrap_err();
    assert!(err.is(&ErrorCode::StoreUnavailable), "{err}");
    assert_eq!(s.calls(), 3);
    assert_eq!(*waits.lock().unwrap(), [Duration::from_secs(1); 2]);

    let (s, endpoint) = Scripted::start(vec![(409, None, api_error("idempotency_mismatch"))]).await;
    let client = Client::builder()
        .endpoint(endpoint)
        .retry(recording_policy(3, &waits))
        .build()
        .unwrap();
    let err = client.submit(&task).await.unwrap_err();
    assert!(err.is(&ErrorCode::IdempotencyMismatch), "{err}");
    assert_eq!(err.api().unwrap().existing_id.as_deref(), Some("t0"));
    assert_eq!(s.calls(), 1);

    // Without a policy a 503 comes back at once.
    let (s, endpoint) = Scripted::start(vec![(503, Some("1"), UNAVAILABLE.into())]).await;
    let client = Client::builder().endpoint(endpoint).build().unwrap();
    assert!(client.submit(&task).await.unwrap_err().is_retryable());
    assert_eq!(s.calls(), 1);
}

/// asyncd's own 429 (`--auth kubernetes`: too many new tokens from one address).
const RATE_LIMITED: &str = r#"{"error":{"code":"auth_unavailable","message":"Authorization: too many new bearer tokens from 127.0.0.1; retry in a second"}}"#;

#[tokio::test]
async fn a_429_is_retried_after_its_retry_after() {
    let (s, endpoint) = Scripted::start(vec![
        (429, Some("2"), RATE_LIMITED.into()),
        (201, None, CREATED.into()),
    ])
    .await;
    let waits = Arc::new(Mutex::new(Vec::new()));
    let retried = Arc::new(Mutex::new(Vec::new()));
    let r = retried.clone();
    let client = Client::builder()
        .endpoint(endpoint)
        .retry(recording_policy(4, &waits).on_retry(move |n, err, wait| {
            r.lock().unwrap().push((n, err.is_rate_limited(), wait));
        }))
        .build()
        .unwrap();
    let task = Task::new("t", json!({"a": 1})).idempotency_key("k-429");
    assert_eq!(client.submit(&task).await.unwrap().id, "t1");
    // One wait, the server's 2 s (not the policy's 100 ms backoff), then the same submit.
    assert_eq!(*s.keys.lock().unwrap(), vec![Some("k-429".to_string()); 2]);
    assert_eq!(*waits.lock().unwrap(), [Duration::from_secs(2)]);
    assert_eq!(
        *retried.lock().unwrap(),
        [(1, true, Duration::from_secs(2))]
    );

    // The other calls the client retries get the same treatment.
    let (s, endpoint) = Scripted::start(vec![
        (429, Some("1"), RATE_LIMITED.into()),
        (
            200,
            None,
            json!({"id": "t1", "type": "t", "state": "pending", "attempt": 0, "max_retries": 3,
                   "priority": 0, "payload": {}, "eta": "2026-12-01T00:00:00Z",
                   "created_at": "2026-12-01T00:00:00Z", "updated_at": "2026-12-01T00:00:00Z"})
            .to_string(),
        ),
    ])
    .await;
    waits.lock().unwrap().clear();
    let client = Client::builder()
        .endpoint(endpoint)
        .retry(recording_policy(4, &waits))
        .build()
        .unwrap();
    assert_eq!(client.get("t1").await.unwrap().id, "t1");
    assert_eq!(s.calls(), 2);
    assert_eq!(*waits.lock().unwrap(), [Duration::from_secs(1)]);
}

#[tokio::test]
async fn a_429_that_outlasts_the_attempts_is_a_rate_limit_error() {
    // Retry-After 30 s is more than the policy's maximum backoff (3 s): each wait is cut
    // to it.
    let (s, endpoint) = Scripted::start(vec![(429, Some("30"), RATE_LIMITED.into())]).await;
    let waits = Arc::new(Mutex::new(Vec::new()));
    let client = Client::builder()
        .endpoint(endpoint)
        .retry(recording_policy(4, &waits))
        .build()
        .unwrap();
    let task = Task::new("t", json!({})).idempotency_key("k");
    let err = client.submit(&task).await.unwrap_err();
    assert!(err.is_rate_limited(), "{err}");
    assert!(err.is(&ErrorCode::AuthUnavailable), "{err}");
    assert_eq!(err.status(), Some(429));
    assert!(
        err.to_string().starts_with(
            "asyncd: rate limited: auth_unavailable (429): Authorization: too many new bearer tokens"
        ),
        "{err}"
    );
    assert_eq!(s.calls(), 4);
    assert_eq!(*waits.lock().unwrap(), [Duration::from_secs(3); 3]);
}

#[tokio::test]
async fn a_429_without_a_readable_retry_after_waits_the_backoff() {
    for retry_after in [None, Some("soon"), Some("-5")] {
        let (s, endpoint) = Scripted::start(vec![
            (429, retry_after, RATE_LIMITED.into()),
            (429, retry_after, "<html>proxy: slow down</html>".into()),
            (201, None, CREATED.into()),
        ])
        .await;
        let waits = Arc::new(Mutex::new(Vec::new()));
        let client = Client::builder()
            .endpoint(endpoint)
            .retry(recording_policy(4, &waits))
            .build()
            .unwrap();
        let task = Task::new("t", json!({})).idempotency_key("k");
        client.submit(&task).await.unwrap();
        assert_eq!(s.calls(), 3, "{retry_after:?}");
        // The backoff's first two steps, 100 ms and 200 ms, with equal jitter.
        let waits = waits.lock().unwrap().clone();
        assert_eq!(waits.len(), 2, "{retry_after:?}");
        assert!(
            (Duration::from_millis(50)..=Duration::from_millis(100)).contains(&waits[0])
                && (Duration::from_millis(100)..=Duration::from_millis(200)).contains(&waits[1]),
            "{retry_after:?}: {waits:?}"
        );
    }
}

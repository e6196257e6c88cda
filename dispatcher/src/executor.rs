//! The executor contract, client side: one HTTP call per attempt, and the reading of
//! its answer into an [`AttemptOutcome`]. What an outcome does to the task is [`crate::retry`]'s
//! business.

pub use crate::store::domain::{MAX_REASON_CHARS, sanitize_reason};
use std::time::{Duration, SystemTime};

use crate::clock::from_millis;
use crate::signing::Keys;
use asyncd_contract::{ExecutorAccepted, ExecutorCall, SignedCall, headers, sign};
use asyncd_spec::Job;
use serde_json::value::RawValue;

use crate::store::{ClaimedTask, Started};
use crate::trace::TraceContext;

/// What an executor's answer means for the attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptOutcome {
    Succeeded,
    /// 202: long-running; the executor keeps the lease with heartbeats.
    Accepted {
        lease: Duration,
    },
    /// 429/503 with `Retry-After`.
    RetryAfter {
        after: Duration,
        reason: String,
    },
    /// 429/503 without `Retry-After`: retry with backoff, and a sign of overload for
    /// adaptive concurrency ([`crate::adaptive`]).
    Overloaded {
        reason: String,
    },
    /// Other 5xx, connection error, or timeout: retry with backoff.
    Retry {
        reason: String,
        timed_out: bool,
    },
    /// Other 4xx: dead letters at once.
    Permanent {
        reason: String,
    },
}

impl AttemptOutcome {
    /// The `status` label of `asyncd_task_executed_total`.
    pub fn status_label(&self) -> &'static str {
        match self {
            Self::Succeeded | Self::Accepted { .. } => "success",
            Self::Retry {
                timed_out: true, ..
            } => "timeout",
            _ => "failed",
        }
    }
}

pub struct ExecutorClient {
    client: reqwest::Client,
    callback_url: String,
    /// Sent as `Asyncd-Dispatcher`, so an executor's logs say which process called.
    dispatcher: String,
}

impl ExecutorClient {
    /// `callback_url` is where executors reach the API for heartbeats and results.
    pub fn new(callback_url: String, dispatcher: String) -> Self {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            // A followed 302 turns the POST into a body-less GET whose 200 would count as
            // success, and a 307 would forward the signed task elsewhere: a redirect is an
            // answer like any other, and `classify` makes it a failed attempt.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("HTTP client builds");
        Self {
            client,
            callback_url,
            dispatcher,
        }
    }

    /// One attempt. `keys` are the job's signing keys as read when the attempt began
    /// ([`crate::signing`]); the dispatcher begins no attempt while they are unavailable.
    /// `trace` is sent as `traceparent` and `tracestate` ([`crate::trace`]). Also
    /// returns the answer's HTTP status, when there was one.
    pub async fn call(
        &self,
        job: &Job,
        task: &ClaimedTask,
        started: &Started,
        keys: &Keys,
        trace: Option<&TraceContext>,
    ) -> (AttemptOutcome, Option<u16>) {
        let timeout = Duration::from_millis(task.timeout_ms.max(1) as u64);
        let body = serde_json::to_vec(&ExecutorCall::<&RawValue> {
            id: task.id.clone(),
            task_type: task.task_type.clone(),
            payload: &task.payload,
            attempt: started.attempt,
            eta: Some(from_millis(task.trigger_at)),
        })
        .expect("task body serializes");
        let idempotency_key = task.idempotency_key.as_deref().unwrap_or(&task.id);
        let attempt = started.attempt.to_string();
        let lease_token = crate::lease::token(&task.lease_secret, &task.id, started.lease_token);
        let mut request = self
            .client
            .post(&job.executor_url)
            .timeout(timeout)
            .header("content-type", "application/json")
            .header(headers::IDEMPOTENCY_KEY, idempotency_key)
            .header(headers::TASK_ID, &task.id)
            .header(headers::ATTEMPT, &attempt)
            .header(headers::LEASE_TOKEN, &lease_token)
            .header(headers::CALLBACK_URL, &self.callback_url)
            .header(headers::DISPATCHER, &self.dispatcher);
        if let Some(trace) = trace {
            request = request.header(headers::TRACEPARENT, trace.traceparent());
            if let Some(state) = &trace.state {
                request = request.header(headers::TRACESTATE, state);
            }
        }
        match keys {
            Keys::Unsigned => {}
            Keys::Ready(keys) => {
                let timestamp = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs()
                    .to_string();
                let call = SignedCall {
                    timestamp: &timestamp,
                    task_id: &task.id,
                    attempt: &attempt,
                    idempotency_key,
                    lease_token: &lease_token,
                    callback_url: &self.callback_url,
                    body: &body,
                };
                let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                let signature = match sign(&keys, &call) {
                    Ok(signature) => signature,
                    // `Keys::Ready` holds no empty key; never send a call unsigned
                    // when it should be signed.
                    Err(err) => {
                        return (
                            AttemptOutcome::Retry {
                                reason: format!("not called: {err}"),
                                timed_out: false,
                            },
                            None,
                        );
                    }
                };
                request = request
                    .header(headers::TIMESTAMP, timestamp)
                    .header(headers::SIGNATURE, signature);
            }
            Keys::Unavailable(why) => {
                return (
                    AttemptOutcome::Retry {
                        reason: format!("not called: {why}"),
                        timed_out: false,
                    },
                    None,
                );
            }
        }
        let response = match request.body(body).send().await {
            Ok(response) => response,
            Err(err) => return (transport_failure(&err, timeout), None),
        };
        let status = response.status().as_u16();
        let header = |name: &str| response.headers().get(name).map(|v| v.as_bytes().to_vec());
        let retry_after = header(headers::RETRY_AFTER);
        let location = header(reqwest::header::LOCATION.as_str());
        let body = match read_capped(response, MAX_ANSWER_BYTES).await {
            Ok(body) => body,
            Err(err) => return (transport_failure(&err, timeout), Some(status)),
        };
        let answer = ExecutorAnswer {
            status,
            retry_after: retry_after.as_deref(),
            location: location.as_deref(),
            body: &body,
        };
        (classify(&answer, SystemTime::now(), timeout), Some(status))
    }
}

/// The most of an executor's answer that is read: enough for a 202 body and an error
/// message, and an executor that streams gigabytes cannot fill the dispatcher's memory.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// The longest lease a 202 or a heartbeat may ask for; longer asks are cut to this.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);
/// The shortest lease a 202 may ask for: a shorter one would lapse before the executor
/// could send its first heartbeat.
pub const MIN_LEASE: Duration = Duration::from_secs(1);
/// The longest `Retry-After` obeyed; longer asks are cut to this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// Reads at most `cap` bytes of the body; the rest is left unread (the connection is
/// dropped with the response, not returned to the pool).
async fn read_capped(mut response: reqwest::Response, cap: usize) -> reqwest::Result<Vec<u8>> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = cap - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() == cap {
            break;
        }
    }
    Ok(body)
}

/// A lease an executor asked for, in seconds, kept within [`MIN_LEASE`] and
/// [`MAX_LEASE`]; `None` for zero, negative or not a number.
pub fn lease_from_seconds(seconds: f64) -> Option<Duration> {
    if seconds.is_nan() || seconds <= 0.0 {
        return None;
    }
    Some(bounded_lease(
        Duration::try_from_secs_f64(seconds).unwrap_or(MAX_LEASE),
    ))
}

fn bounded_lease(lease: Duration) -> Duration {
    lease.clamp(MIN_LEASE, MAX_LEASE)
}

/// The attempt's error for a call that got no (whole) answer. reqwest's own text ("error
/// sending request for url …") names neither a timeout nor the cause, so a timeout says
/// so with the attempt's timeout, and any other failure carries its causes.
fn transport_failure(err: &reqwest::Error, timeout: Duration) -> AttemptOutcome {
    let timed_out = err.is_timeout();
    AttemptOutcome::Retry {
        reason: transport_reason(err, timed_out, timeout),
        timed_out,
    }
}

fn transport_reason(err: &dyn std::error::Error, timed_out: bool, timeout: Duration) -> String {
    if timed_out {
        return format!(
            "executor call timed out after {} (the attempt's timeout)",
            humantime::format_duration(timeout)
        );
    }
    let mut reason = format!("executor call failed: {err}");
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !reason.contains(&text) {
            reason.push_str(": ");
            reason.push_str(&text);
        }
        source = cause.source();
    }
    sanitize_reason(&reason)
}

/// What an executor answered, as far as the contract reads it. Header values are raw
/// bytes: an executor may send anything.
#[derive(Debug, Clone, Copy)]
pub struct ExecutorAnswer<'a> {
    pub status: u16,
    pub retry_after: Option<&'a [u8]>,
    pub location: Option<&'a [u8]>,
    pub body: &'a [u8],
}

/// Reads an executor's answer. `default_lease` is used for a 202 that names none.
pub fn classify(
    answer: &ExecutorAnswer,
    now: SystemTime,
    default_lease: Duration,
) -> AttemptOutcome {
    let ExecutorAnswer {
        status,
        retry_after,
        location,
        body,
    } = *answer;
    let snippet = || {
        let text = String::from_utf8_lossy(&body[..body.len().min(512)]);
        sanitize_reason(&format!("executor answered {status}: {}", text.trim()))
    };
    match status {
        202 => AttemptOutcome::Accepted {
            lease: lease_from(body).unwrap_or_else(|| bounded_lease(default_lease)),
        },
        200..=299 => AttemptOutcome::Succeeded,
        300..=399 => AttemptOutcome::Retry {
            reason: sanitize_reason(&format!(
                "executor answered {status} (redirect to {}); redirects are not followed",
                String::from_utf8_lossy(location.unwrap_or(b"nowhere"))
            )),
            timed_out: false,
        },
        429 | 503 => match retry_after
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| parse_retry_after(v, now))
        {
            Some(after) => AttemptOutcome::RetryAfter {
                after,
                reason: snippet(),
            },
            None => AttemptOutcome::Overloaded { reason: snippet() },
        },
        400..=499 => AttemptOutcome::Permanent { reason: snippet() },
        _ => AttemptOutcome::Retry {
            reason: snippet(),
            timed_out: false,
        },
    }
}

/// `{"lease": "60s"}` or `{"lease_seconds": 60}`.
fn lease_from(body: &[u8]) -> Option<Duration> {
    let accepted: ExecutorAccepted = serde_json::from_slice(body).ok()?;
    if let Some(text) = accepted.lease {
        return asyncd_spec::parse_duration(&text)
            .ok()
            .filter(|d| !d.is_zero())
            .map(bounded_lease);
    }
    accepted.lease_seconds.and_then(lease_from_seconds)
}

/// `Retry-After` is either delay-seconds or an HTTP date.
fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(now)
            .unwrap_or_default()
            .min(MAX_RETRY_AFTER),
    )
}

/// A job calling `url`, for tests.
#[cfg(test)]
pub(crate) fn test_job(url: &str) -> Job {
    Job {
        name: "job".into(),
        task_type: "t".into(),
        executor_url: url.into(),
        timeout: Duration::from_secs(30),
        signing: None,
        max_retries: 3,
        backoff: asyncd_spec::job::BackoffKind::Exponential,
        initial_backoff: Duration::from_secs(1),
        max_backoff: Duration::from_secs(60),
        unique_key: None,
        concurrency: 1,
        rate_limit: None,
        concurrency_key: None,
        adaptive: asyncd_spec::Adaptive::default(),
        kafka: None,
        cron: Vec::new(),
        retention: asyncd_spec::Retention::DEFAULT,
        paused: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);

    /// A call that times out says so and after how long; a refused connection names its
    /// cause (reqwest's own text says only "error sending request").
    #[tokio::test]
    async fn transport_failures_say_what_happened() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", silent.local_addr().unwrap());
        let timeout = Duration::from_millis(300);
        let err = reqwest::Client::new()
            .post(&url)
            .timeout(timeout)
            .send()
            .await
            .unwrap_err();
        assert_eq!(
            transport_failure(&err, timeout),
            AttemptOutcome::Retry {
                reason: "executor call timed out after 300ms (the attempt's timeout)".into(),
                timed_out: true
            }
        );
        drop(silent);
        let err = reqwest::Client::new().post(&url).send().await.unwrap_err();
        let AttemptOutcome::Retry { reason, timed_out } = transport_failure(&err, timeout) else {
            panic!("not a retry");
        };
        assert!(!timed_out);
        assert!(
            reason.starts_with("executor call failed: ")
                && reason.to_lowercase().contains("connection refused"),
            "{reason}"
        );
    }

    fn outcome(status: u16, retry_after: Option<&str>, body: &str) -> AttemptOutcome {
        let answer = ExecutorAnswer {
            status,
            retry_after: retry_after.map(str::as_bytes),
            location: None,
            body: body.as_bytes(),
        };
        classify(&answer, SystemTime::UNIX_EPOCH, LEASE)
    }

    #[test]
    fn reads_the_contract() {
        assert_eq!(outcome(200, None, ""), AttemptOutcome::Succeeded);
        assert_eq!(outcome(204, None, ""), AttemptOutcome::Succeeded);
        assert_eq!(
            outcome(202, None, r#"{"lease":"90s"}"#),
            AttemptOutcome::Accepted {
                lease: Duration::from_secs(90)
            }
        );
        assert_eq!(
            outcome(202, None, r#"{"lease_seconds":2.5}"#),
            AttemptOutcome::Accepted {
                lease: Duration::from_millis(2500)
            }
        );
        assert_eq!(
            outcome(202, None, "not json"),
            AttemptOutcome::Accepted { lease: LEASE }
        );
        assert!(
            matches!(outcome(429, Some("7"), ""), AttemptOutcome::RetryAfter { after, .. } if after == Duration::from_secs(7))
        );
        assert!(
            matches!(outcome(503, Some("Thu, 01 Jan 1970 00:00:10 GMT"), ""), AttemptOutcome::RetryAfter { after, .. } if after == Duration::from_secs(10))
        );
        assert!(matches!(
            outcome(503, None, ""),
            AttemptOutcome::Overloaded { .. }
        ));
        assert!(
            matches!(outcome(404, None, "nope"), AttemptOutcome::Permanent { reason } if reason.contains("404") && reason.contains("nope"))
        );
        assert!(matches!(
            outcome(422, None, ""),
            AttemptOutcome::Permanent { .. }
        ));
        assert!(matches!(
            outcome(500, None, ""),
            AttemptOutcome::Retry {
                timed_out: false,
                ..
            }
        ));
        assert!(matches!(
            outcome(302, None, ""),
            AttemptOutcome::Retry { .. }
        ));
    }

    #[test]
    fn a_redirect_is_a_failed_attempt_naming_the_target() {
        let outcome = classify(
            &ExecutorAnswer {
                status: 302,
                retry_after: None,
                location: Some(b"http://elsewhere/"),
                body: b"",
            },
            SystemTime::UNIX_EPOCH,
            LEASE,
        );
        assert!(
            matches!(&outcome, AttemptOutcome::Retry { reason, timed_out: false }
                if reason.contains("302") && reason.contains("http://elsewhere/") && reason.contains("not followed")),
            "{outcome:?}"
        );
    }

    /// The real client against a real server: the redirect target must never be called,
    /// so neither a 302 (which reqwest would turn into a GET) nor a 307 (which would
    /// forward the signed body) can count as success.
    #[tokio::test]
    async fn the_client_does_not_follow_redirects() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        let target_calls = Arc::new(AtomicUsize::new(0));
        let counter = target_calls.clone();
        let app = axum::Router::new()
            .route(
                "/found",
                axum::routing::post(|| async {
                    (axum::http::StatusCode::FOUND, [("location", "/target")])
                }),
            )
            .route(
                "/temporary",
                axum::routing::post(|| async {
                    (
                        axum::http::StatusCode::TEMPORARY_REDIRECT,
                        [("location", "/target")],
                    )
                }),
            )
            .route(
                "/target",
                axum::routing::any(move || async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    "ok"
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });

        let client = ExecutorClient::new("http://127.0.0.1:1".into(), "test".into());
        for (path, status) in [("found", "302"), ("temporary", "307")] {
            let job = test_job(&format!("http://{addr}/{path}"));
            let (outcome, http_status) = client
                .call(&job, &test_task(), &test_started(), &Keys::Unsigned, None)
                .await;
            assert_eq!(http_status.map(|s| s.to_string()).as_deref(), Some(status));
            assert!(
                matches!(&outcome, AttemptOutcome::Retry { reason, .. } if reason.contains(status) && reason.contains("/target")),
                "{path}: {outcome:?}"
            );
        }
        assert_eq!(
            target_calls.load(Ordering::SeqCst),
            0,
            "a redirect was followed"
        );
    }

    /// An executor that streams far more than [`MAX_ANSWER_BYTES`] is read only that far.
    #[tokio::test]
    async fn a_huge_answer_is_read_only_up_to_the_cap() {
        let app = axum::Router::new().route(
            "/",
            axum::routing::post(|| async {
                let chunk = bytes::Bytes::from(vec![b'x'; 64 * 1024]);
                let stream = futures::stream::iter(
                    (0..16 * 1024).map(move |_| Ok::<_, std::io::Error>(chunk.clone())),
                );
                (
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    axum::body::Body::from_stream(stream),
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = ExecutorClient::new("http://127.0.0.1:1".into(), "test".into());
        // 1 GiB on offer; reading it all would take far longer than the job's timeout.
        let (outcome, _) = client
            .call(
                &test_job(&format!("http://{addr}/")),
                &test_task(),
                &test_started(),
                &Keys::Unsigned,
                None,
            )
            .await;
        assert!(
            matches!(&outcome, AttemptOutcome::Retry { reason, timed_out: false } if reason.contains("500") && reason.chars().count() <= MAX_REASON_CHARS + 1),
            "{outcome:?}"
        );
    }

    fn test_task() -> ClaimedTask {
        ClaimedTask {
            id: "task-1".into(),
            task_type: "t".into(),
            payload: RawValue::from_string("{}".into()).unwrap(),
            priority: 0,
            trigger_at: crate::store::Millis::new(0),
            attempt: 0,
            max_retries: 3,
            timeout_ms: 30_000,
            lease_token: 1,
            idempotency_key: None,
            lease_secret: "secret".into(),
            concurrency_key: None,
            trace: None,
        }
    }

    fn test_started() -> Started {
        Started {
            id: "task-1".into(),
            attempt: 1,
            lease_token: 2,
        }
    }

    #[test]
    fn executor_text_is_made_storable() {
        assert_eq!(
            sanitize_reason("a\0b\nc\td\u{1b}"),
            "a\u{FFFD}b\nc\td\u{FFFD}"
        );
        let long = "é".repeat(MAX_REASON_CHARS * 3);
        let kept = sanitize_reason(&long);
        assert_eq!(kept.chars().count(), MAX_REASON_CHARS + 1);
        assert!(kept.ends_with('…'));
    }

    #[test]
    fn absurd_leases_are_cut_not_a_panic() {
        // `Duration::from_secs_f64(1e300)` panics; an executor may send it.
        assert_eq!(lease_from_seconds(1e300), Some(MAX_LEASE));
        assert_eq!(lease_from_seconds(f64::INFINITY), Some(MAX_LEASE));
        assert_eq!(lease_from_seconds(f64::NAN), None);
        assert_eq!(lease_from_seconds(-1.0), None);
        assert_eq!(lease_from_seconds(1e-200), Some(MIN_LEASE));
        assert_eq!(
            outcome(202, None, r#"{"lease_seconds":1e300}"#),
            AttemptOutcome::Accepted { lease: MAX_LEASE }
        );
        assert_eq!(
            outcome(202, None, r#"{"lease":"100000000y"}"#),
            AttemptOutcome::Accepted { lease: MAX_LEASE }
        );
        assert!(matches!(
            outcome(429, Some("18446744073709551615"), ""),
            AttemptOutcome::RetryAfter { after, .. } if after == MAX_RETRY_AFTER
        ));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Whatever an executor answers, the classifier returns an outcome that is
            /// safe to store and to add to a time.
            #[test]
            fn any_answer_classifies_within_bounds(
                status in 0u16..1000,
                retry_after in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
                location in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
                body in proptest::collection::vec(any::<u8>(), 0..2048),
                now_secs in 0u64..(1u64 << 40),
            ) {
                let answer = ExecutorAnswer {
                    status,
                    retry_after: retry_after.as_deref(),
                    location: location.as_deref(),
                    body: &body,
                };
                let now = SystemTime::UNIX_EPOCH + Duration::from_secs(now_secs);
                let outcome = classify(&answer, now, LEASE);
                match &outcome {
                    AttemptOutcome::Succeeded => prop_assert!((200..300).contains(&status) && status != 202),
                    AttemptOutcome::Accepted { lease } => {
                        prop_assert_eq!(status, 202);
                        prop_assert!((MIN_LEASE..=MAX_LEASE).contains(lease));
                    }
                    AttemptOutcome::RetryAfter { after, reason } => {
                        prop_assert!(status == 429 || status == 503);
                        prop_assert!(*after <= MAX_RETRY_AFTER);
                        prop_assert!(storable(reason));
                    }
                    AttemptOutcome::Overloaded { reason } => {
                        prop_assert!(status == 429 || status == 503);
                        prop_assert!(storable(reason));
                    }
                    AttemptOutcome::Retry { reason, .. } => {
                        prop_assert!(!(200..300).contains(&status) && !(400..500).contains(&status) && status != 503);
                        prop_assert!(storable(reason));
                    }
                    AttemptOutcome::Permanent { reason } => {
                        prop_assert!((400..500).contains(&status) && status != 429);
                        prop_assert!(storable(reason));
                    }
                }
            }

            /// A 202 body with any number in `lease_seconds` is read without a panic.
            #[test]
            fn any_lease_seconds_is_bounded(seconds in any::<f64>()) {
                let body = serde_json::json!({ "lease_seconds": seconds }).to_string();
                let outcome = outcome(202, None, &body);
                let AttemptOutcome::Accepted { lease } = outcome else {
                    panic!("202 is always accepted: {outcome:?}")
                };
                prop_assert!((MIN_LEASE..=MAX_LEASE).contains(&lease));
            }
        }

        fn storable(text: &str) -> bool {
            !text.contains('\0') && text.chars().count() <= MAX_REASON_CHARS + 1
        }
    }
}

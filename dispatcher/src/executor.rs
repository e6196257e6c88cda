//! The executor contract, client side: one HTTP call per attempt, and the reading of
//! its answer into an [`AttemptOutcome`]. What an outcome does to the task is [`crate::retry`]'s
//! business.

mod policy;

pub use asyncd_store::domain::{MAX_REASON_CHARS, sanitize_reason};
pub use policy::{AddressPolicy, Refused};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::clock::from_millis;
use crate::signing::Keys;
use asyncd_contract::{
    ExecutorAccepted, ExecutorBatchCall, ExecutorBatchResult, ExecutorBatchStatus,
    ExecutorBatchTask, ExecutorCall, SignedCall, headers, sign,
};
use asyncd_spec::Job;
use serde_json::value::RawValue;

use crate::trace::TraceContext;
use asyncd_store::{ClaimedTask, Started};

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
    /// adaptive concurrency ([`crate::dispatch::adaptive`]).
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
    /// HTTP/1.1 only, also on `https://` (no ALPN offer of h2).
    client: reqwest::Client,
    /// HTTP/2 only, for jobs with `executor.http2`: by prior knowledge on `http://`,
    /// by ALPN (offering `h2` alone) on `https://`.
    http2: reqwest::Client,
    /// Which addresses executors may be at ([`policy`]): the client's resolver applies
    /// it to names, [`Self::request`] to IP-literal URLs.
    policy: Arc<AddressPolicy>,
    callback_url: String,
    /// Sent as `Asyncd-Dispatcher`, so an executor's logs say which process called.
    dispatcher: String,
}

impl ExecutorClient {
    /// `callback_url` is where executors reach the API for heartbeats and results.
    /// Executors may be anywhere but link-local ([`AddressPolicy::local`]).
    pub fn new(callback_url: String, dispatcher: String) -> Self {
        Self::with_policy(callback_url, dispatcher, AddressPolicy::local())
    }

    /// [`Self::new`], with executors only at the addresses `policy` allows.
    pub fn with_policy(callback_url: String, dispatcher: String, policy: AddressPolicy) -> Self {
        let policy = Arc::new(policy);
        // No cap on idle connections per executor: the attempts in flight, which the
        // jobs' `concurrency` bounds, bound them, and idle ones close after reqwest's
        // idle timeout. A cap below a job's concurrency (this was 256) closed a
        // connection after each call above it, and opened a new one for the next.
        let builder = || {
            reqwest::Client::builder()
                .tcp_nodelay(true)
                // A followed 302 turns the POST into a body-less GET whose 200 would count
                // as success, and a 307 would forward the signed task elsewhere: a redirect
                // is an answer like any other, and `classify` makes it a failed attempt.
                .redirect(reqwest::redirect::Policy::none())
                .dns_resolver(policy::PolicyResolver {
                    policy: policy.clone(),
                })
        };
        // hyper sends at most as many streams at once as the executor's server allows
        // (its `SETTINGS_MAX_CONCURRENT_STREAMS`) and queues the rest of the attempts in
        // flight on the connection; the jobs' `concurrency` bounds them, as it bounds
        // HTTP/1.1's connections.
        let http2 = builder()
            .http2_prior_knowledge()
            .build()
            .expect("HTTP/2 client builds");
        let client = builder().http1_only().build().expect("HTTP client builds");
        Self {
            client,
            http2,
            policy,
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
        let attempt = started.attempt.to_string();
        let lease_token =
            asyncd_store::lease::token(&task.lease_secret, &task.id, started.lease_token);
        let per_task = TaskHeaders {
            task_id: &task.id,
            attempt: &attempt,
            idempotency_key: task.idempotency_key.as_deref().unwrap_or(&task.id),
            lease_token: &lease_token,
        };
        let mut request = match self.request(job, timeout, &body, &per_task, keys) {
            Ok(request) => request
                .header(headers::IDEMPOTENCY_KEY, per_task.idempotency_key)
                .header(headers::TASK_ID, per_task.task_id)
                .header(headers::ATTEMPT, per_task.attempt)
                .header(headers::LEASE_TOKEN, per_task.lease_token),
            Err(not_called) => return (not_called, None),
        };
        if let Some(trace) = trace {
            request = request.header(headers::TRACEPARENT, trace.traceparent());
            if let Some(state) = &trace.state {
                request = request.header(headers::TRACESTATE, state);
            }
        }
        match send(request, body, timeout, MAX_ANSWER_BYTES, job).await {
            Ok(answer) => (
                classify(
                    &answer.view(),
                    SystemTime::now(),
                    timeout,
                    job.executor_error_bodies,
                ),
                Some(answer.status),
            ),
            Err(failed) => failed,
        }
    }

    /// One call carrying an attempt of each of `attempts` (a job with `executor.batch`):
    /// what [`Self::call`] sends in headers goes per task in the body. Returns one
    /// outcome per attempt, in order ([`classify_batch`]), and the answer's HTTP status.
    pub async fn call_batch(
        &self,
        job: &Job,
        attempts: &[BatchAttempt<'_>],
        keys: &Keys,
    ) -> (Vec<AttemptOutcome>, Option<u16>) {
        // One timeout for the call; the tasks of a job share it unless the job's timeout
        // changed while some of them waited.
        let timeout_ms = attempts
            .iter()
            .map(|a| a.task.timeout_ms)
            .max()
            .unwrap_or(1);
        let timeout = Duration::from_millis(timeout_ms.max(1) as u64);
        let tasks = attempts
            .iter()
            .map(
                |&BatchAttempt {
                     task,
                     started,
                     trace,
                 }| ExecutorBatchTask::<&RawValue> {
                    id: task.id.clone(),
                    task_type: task.task_type.clone(),
                    payload: &task.payload,
                    attempt: started.attempt,
                    eta: Some(from_millis(task.trigger_at)),
                    idempotency_key: task
                        .idempotency_key
                        .clone()
                        .unwrap_or_else(|| task.id.clone()),
                    lease_token: asyncd_store::lease::token(
                        &task.lease_secret,
                        &task.id,
                        started.lease_token,
                    ),
                    traceparent: trace.map(TraceContext::traceparent),
                    tracestate: trace.and_then(|t| t.state.clone()),
                },
            )
            .collect();
        let body = serde_json::to_vec(&ExecutorBatchCall { tasks }).expect("batch body serializes");
        let every = |outcome: AttemptOutcome| vec![outcome; attempts.len()];
        // The body holds (and the signature covers) every task's id, attempt and token.
        let request = match self.request(job, timeout, &body, &TaskHeaders::default(), keys) {
            Ok(request) => request.header(headers::BATCH, attempts.len().to_string()),
            Err(not_called) => return (every(not_called), None),
        };
        let cap = MAX_ANSWER_BYTES + attempts.len() * MAX_BATCH_RESULT_BYTES;
        match send(request, body, timeout, cap, job).await {
            Ok(answer) => {
                let ids: Vec<&str> = attempts.iter().map(|a| a.task.id.as_str()).collect();
                (
                    classify_batch(
                        &answer.view(),
                        &ids,
                        SystemTime::now(),
                        timeout,
                        job.executor_error_bodies,
                    ),
                    Some(answer.status),
                )
            }
            Err((outcome, status)) => (every(outcome), status),
        }
    }

    /// The request with what every call carries, signed when the job signs; `Err` is the
    /// attempt's outcome when no call may be made.
    fn request(
        &self,
        job: &Job,
        timeout: Duration,
        body: &[u8],
        per_task: &TaskHeaders,
        keys: &Keys,
    ) -> Result<reqwest::RequestBuilder, AttemptOutcome> {
        let not_called = |why: &dyn std::fmt::Display| AttemptOutcome::Retry {
            reason: format!("not called: {why}"),
            timed_out: false,
        };
        if let Some(ip) = job.executor_ip
            && let Err(refused) = self.policy.check(ip)
        {
            return Err(refused_outcome(&refused));
        }
        let client = if job.executor_http2 {
            &self.http2
        } else {
            &self.client
        };
        let request = client
            .post(job.executor_url.clone())
            .timeout(timeout)
            .header("content-type", "application/json")
            .header(headers::CALLBACK_URL, &self.callback_url)
            .header(headers::DISPATCHER, &self.dispatcher);
        match keys {
            Keys::Unsigned => Ok(request),
            Keys::Ready(keys) => {
                let timestamp = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs()
                    .to_string();
                let call = SignedCall {
                    timestamp: &timestamp,
                    task_id: per_task.task_id,
                    attempt: per_task.attempt,
                    idempotency_key: per_task.idempotency_key,
                    lease_token: per_task.lease_token,
                    callback_url: &self.callback_url,
                    body,
                };
                let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
                // `Keys::Ready` holds no empty key; never send a call unsigned when it
                // should be signed.
                let signature = sign(&keys, &call).map_err(|err| not_called(&err))?;
                Ok(request
                    .header(headers::TIMESTAMP, timestamp)
                    .header(headers::SIGNATURE, signature))
            }
            Keys::Unavailable(why) => Err(not_called(why)),
        }
    }
}

/// The header values of a single call that are about its one task; a batch call sends
/// none and signs them empty.
#[derive(Default)]
struct TaskHeaders<'a> {
    task_id: &'a str,
    attempt: &'a str,
    idempotency_key: &'a str,
    lease_token: &'a str,
}

/// One attempt of a batch call: the task, its begun attempt, and the trace context sent
/// for it.
#[derive(Clone, Copy)]
pub struct BatchAttempt<'a> {
    pub task: &'a ClaimedTask,
    pub started: &'a Started,
    pub trace: Option<&'a TraceContext>,
}

/// An answer as read: the status, the headers the contract reads, and at most the cap
/// of the body.
struct ReadAnswer {
    status: u16,
    retry_after: Option<Vec<u8>>,
    location: Option<Vec<u8>>,
    body: Vec<u8>,
}

impl ReadAnswer {
    fn view(&self) -> ExecutorAnswer<'_> {
        ExecutorAnswer {
            status: self.status,
            retry_after: self.retry_after.as_deref(),
            location: self.location.as_deref(),
            body: &self.body,
        }
    }
}

/// Sends the call and reads the answer; `Err` is the outcome of a call that got no
/// (whole) answer, with the status when there was one. The retry time is read from the
/// job's `executor.retryAfterHeader`.
async fn send(
    request: reqwest::RequestBuilder,
    body: Vec<u8>,
    timeout: Duration,
    cap: usize,
    job: &Job,
) -> Result<ReadAnswer, (AttemptOutcome, Option<u16>)> {
    let response = match request.body(body).send().await {
        Ok(response) => response,
        Err(err) => return Err((transport_failure(&err, timeout), None)),
    };
    let status = response.status().as_u16();
    let header = |name: &str| response.headers().get(name).map(|v| v.as_bytes().to_vec());
    let retry_after = header(&job.executor_retry_after_header);
    let location = header(reqwest::header::LOCATION.as_str());
    match read_capped(response, cap).await {
        Ok(body) => Ok(ReadAnswer {
            status,
            retry_after,
            location,
            body,
        }),
        Err(err) => Err((transport_failure(&err, timeout), Some(status))),
    }
}

/// How much more of a batch call's answer is read per task: a result with an error text
/// of [`MAX_REASON_CHARS`] and room to spare.
pub const MAX_BATCH_RESULT_BYTES: usize = 2 * 1024;

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
    if let Some(refused) = policy::refusal_in(err) {
        return refused_outcome(refused);
    }
    let timed_out = err.is_timeout();
    AttemptOutcome::Retry {
        reason: transport_reason(err, timed_out, timeout),
        timed_out,
    }
}

/// A call the address policy refused is never made: no later attempt would be allowed
/// either until the job's URL or the policy changes, so the task goes to dead letters
/// at once (and is redriven after the fix) rather than retried against the same wall.
fn refused_outcome(refused: &Refused) -> AttemptOutcome {
    AttemptOutcome::Permanent {
        reason: refused.to_string(),
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
/// `error_bodies` (`spec.executor.errorBodies`): an error's reason quotes the start of
/// the answer's body, and a redirect's its `Location`; otherwise the reason is the status
/// and its standard name only, since the URL may reach a service that is no executor.
pub fn classify(
    answer: &ExecutorAnswer,
    now: SystemTime,
    default_lease: Duration,
    error_bodies: bool,
) -> AttemptOutcome {
    let ExecutorAnswer {
        status,
        retry_after,
        location,
        body,
    } = *answer;
    let snippet = || {
        if error_bodies {
            let text = String::from_utf8_lossy(&body[..body.len().min(512)]);
            sanitize_reason(&format!("executor answered {status}: {}", text.trim()))
        } else {
            answered(status)
        }
    };
    match status {
        202 => AttemptOutcome::Accepted {
            lease: lease_from(body).unwrap_or_else(|| bounded_lease(default_lease)),
        },
        200..=299 => AttemptOutcome::Succeeded,
        300..=399 => AttemptOutcome::Retry {
            reason: if error_bodies {
                sanitize_reason(&format!(
                    "executor answered {status} (redirect to {}); redirects are not followed",
                    String::from_utf8_lossy(location.unwrap_or(b"nowhere"))
                ))
            } else {
                format!("{}; redirects are not followed", answered(status))
            },
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

/// `executor answered 503 Service Unavailable`: the status in asyncd's words.
fn answered(status: u16) -> String {
    match reqwest::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
    {
        Some(name) => format!("executor answered {status} {name}"),
        None => format!("executor answered {status}"),
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

/// Reads the answer to a batch call of the tasks `ids` into one outcome per task, in
/// order. A 2xx other than 202 carries per-task results; any other answer is read as for
/// a single call and applies to every task.
pub fn classify_batch(
    answer: &ExecutorAnswer,
    ids: &[&str],
    now: SystemTime,
    default_lease: Duration,
    error_bodies: bool,
) -> Vec<AttemptOutcome> {
    let whole = classify(answer, now, default_lease, error_bodies);
    if whole != AttemptOutcome::Succeeded {
        return vec![whole; ids.len()];
    }
    /// Entries are read one by one, so one the contract cannot read fails only its task.
    #[derive(serde::Deserialize)]
    struct Results {
        results: Vec<serde_json::Value>,
    }
    let results = match serde_json::from_slice::<Results>(answer.body) {
        Ok(answer) => answer.results,
        Err(err) => {
            // serde's text may quote the answer's values: a body's words, as above.
            let reason = if error_bodies {
                sanitize_reason(&format!(
                    "executor answered {} without batch results: {err}",
                    answer.status
                ))
            } else {
                format!("executor answered {} without batch results", answer.status)
            };
            return vec![
                AttemptOutcome::Retry {
                    reason,
                    timed_out: false
                };
                ids.len()
            ];
        }
    };
    let mut by_id: HashMap<String, ExecutorBatchResult> = HashMap::with_capacity(results.len());
    for entry in results {
        if let Ok(result) = serde_json::from_value::<ExecutorBatchResult>(entry) {
            by_id.entry(result.id.clone()).or_insert(result);
        }
    }
    ids.iter()
        .map(|id| match by_id.get(*id) {
            Some(result) => task_outcome(result, default_lease),
            None => AttemptOutcome::Retry {
                reason: "batch answer has no result for this task".into(),
                timed_out: false,
            },
        })
        .collect()
}

/// One task's result in a batch answer, bounded like a single call's answer.
fn task_outcome(result: &ExecutorBatchResult, default_lease: Duration) -> AttemptOutcome {
    let reason = || match result.error.as_deref() {
        Some(error) => sanitize_reason(error),
        None => format!("executor answered {:?} for this task", result.status).to_lowercase(),
    };
    let duration = |text: Option<&str>| text.and_then(|t| asyncd_spec::parse_duration(t).ok());
    match result.status {
        ExecutorBatchStatus::Success => AttemptOutcome::Succeeded,
        ExecutorBatchStatus::Accepted => AttemptOutcome::Accepted {
            lease: bounded_lease(
                duration(result.lease.as_deref())
                    .filter(|d| !d.is_zero())
                    .unwrap_or(default_lease),
            ),
        },
        ExecutorBatchStatus::Retry => match duration(result.retry_after.as_deref()) {
            Some(after) => AttemptOutcome::RetryAfter {
                after: after.min(MAX_RETRY_AFTER),
                reason: reason(),
            },
            None => AttemptOutcome::Retry {
                reason: reason(),
                timed_out: false,
            },
        },
        ExecutorBatchStatus::Failed => AttemptOutcome::Permanent { reason: reason() },
    }
}

/// A job calling `url`, for tests.
#[cfg(test)]
pub(crate) fn test_job(url: &str) -> Job {
    Job {
        name: "job".into(),
        task_type: "t".into(),
        executor_url: url.parse().expect("a test URL"),
        executor_ip: None,
        executor_error_bodies: false,
        executor_retry_after_header: "retry-after".into(),
        executor_http2: false,
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
        start_within: None,
        window: None,
        paused: false,
        batch: None,
        limiter_names: Vec::new(),
        limiters: Vec::new(),
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
        classify(&answer, SystemTime::UNIX_EPOCH, LEASE, true)
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

    /// Without `errorBodies`, what a service answered stays out of the reason: the URL
    /// may reach one that is no executor, and `lastError` must not read it out.
    #[test]
    fn an_error_answer_is_named_by_its_status_unless_the_job_opts_in_to_bodies() {
        let answer =
            |status, location: Option<&'static [u8]>, body: &'static [u8]| ExecutorAnswer {
                status,
                retry_after: None,
                location,
                body,
            };
        let reason = |answer: &ExecutorAnswer, bodies| match classify(
            answer,
            SystemTime::UNIX_EPOCH,
            LEASE,
            bodies,
        ) {
            AttemptOutcome::Permanent { reason }
            | AttemptOutcome::Retry { reason, .. }
            | AttemptOutcome::Overloaded { reason }
            | AttemptOutcome::RetryAfter { reason, .. } => reason,
            other => panic!("{other:?}"),
        };
        let secret = answer(404, None, b"ami-id: secret-instance-data");
        assert_eq!(reason(&secret, false), "executor answered 404 Not Found");
        assert_eq!(
            reason(&secret, true),
            "executor answered 404: ami-id: secret-instance-data"
        );
        let busy = answer(503, None, b"db down");
        assert_eq!(
            reason(&busy, false),
            "executor answered 503 Service Unavailable"
        );
        assert_eq!(
            reason(&answer(599, None, b"x"), false),
            "executor answered 599"
        );
        let moved = answer(302, Some(b"http://internal/"), b"");
        assert_eq!(
            reason(&moved, false),
            "executor answered 302 Found; redirects are not followed"
        );
        assert!(reason(&moved, true).contains("http://internal/"));
        // A 2xx that is no batch answer: serde's text would quote the body.
        let quoted = answer(200, None, br#""secret-token""#);
        let outcomes =
            |bodies| classify_batch(&quoted, &["a"], SystemTime::UNIX_EPOCH, LEASE, bodies);
        assert_eq!(
            outcomes(false),
            vec![AttemptOutcome::Retry {
                reason: "executor answered 200 without batch results".into(),
                timed_out: false
            }]
        );
        assert!(
            matches!(&outcomes(true)[0], AttemptOutcome::Retry { reason, .. } if reason.contains("secret-token"))
        );
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
            true,
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
            let mut job = test_job(&format!("http://{addr}/{path}"));
            job.executor_error_bodies = true;
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

    /// A job with `executor.http2` calls its executor over HTTP/2 by prior knowledge
    /// (h2c), each attempt a stream of one connection; any other job over HTTP/1.1.
    #[tokio::test]
    async fn a_job_with_http2_calls_over_h2c_and_any_other_over_http1() {
        let versions = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = versions.clone();
        let app = axum::Router::new().route(
            "/",
            axum::routing::post(move |request: axum::extract::Request| async move {
                seen.lock().unwrap().push(request.version());
                "ok"
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = ExecutorClient::new("http://127.0.0.1:1".into(), "test".into());
        let url = format!("http://{addr}/");
        for (http2, expected) in [
            (true, axum::http::Version::HTTP_2),
            (false, axum::http::Version::HTTP_11),
        ] {
            let job = Job {
                executor_http2: http2,
                ..test_job(&url)
            };
            let (task, started) = (test_task(), test_started());
            let calls = (0..3).map(|_| client.call(&job, &task, &started, &Keys::Unsigned, None));
            for (outcome, status) in futures::future::join_all(calls).await {
                assert_eq!((outcome, status), (AttemptOutcome::Succeeded, Some(200)));
            }
            let seen = std::mem::take(&mut *versions.lock().unwrap());
            assert_eq!(seen, vec![expected; 3], "http2: {http2}");
        }
    }

    /// `executor.retryAfterHeader` names the header a 429's retry time is read from;
    /// `Retry-After` is then not read.
    #[tokio::test]
    async fn the_retry_time_is_read_from_the_header_the_job_names() {
        let app = axum::Router::new().route(
            "/",
            axum::routing::post(|| async {
                (
                    axum::http::StatusCode::TOO_MANY_REQUESTS,
                    [("RateLimit-Reset", "30"), ("Retry-After", "5")],
                    "slow down",
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = ExecutorClient::new("http://127.0.0.1:1".into(), "test".into());
        let url = format!("http://{addr}/");
        for (header, expected) in [("retry-after", 5), ("ratelimit-reset", 30)] {
            let job = Job {
                executor_retry_after_header: header.into(),
                ..test_job(&url)
            };
            let (outcome, _) = client
                .call(&job, &test_task(), &test_started(), &Keys::Unsigned, None)
                .await;
            assert!(
                matches!(&outcome, AttemptOutcome::RetryAfter { after, .. } if *after == Duration::from_secs(expected)),
                "{header}: {outcome:?}"
            );
        }
    }

    fn batch(
        status: u16,
        retry_after: Option<&str>,
        body: &str,
        ids: &[&str],
    ) -> Vec<AttemptOutcome> {
        let answer = ExecutorAnswer {
            status,
            retry_after: retry_after.map(str::as_bytes),
            location: None,
            body: body.as_bytes(),
        };
        classify_batch(&answer, ids, SystemTime::UNIX_EPOCH, LEASE, true)
    }

    /// Each task gets its own result's outcome, whatever the order; a task without a
    /// readable result is retried, and a result for a task not in the call is ignored.
    #[test]
    fn a_batch_answer_gives_each_task_its_own_outcome() {
        let body = r#"{"results": [
            {"id": "d", "status": "failed", "error": "no such image"},
            {"id": "a", "status": "success"},
            {"id": "c", "status": "retry", "error": "busy", "retry_after": "30s"},
            {"id": "b", "status": "accepted", "lease": "5m"},
            {"id": "e", "status": "retry"},
            {"id": "f", "status": "maybe"},
            {"id": "a", "status": "failed"},
            {"id": "stranger", "status": "success"}
        ]}"#;
        let outcomes = batch(200, None, body, &["a", "b", "c", "d", "e", "f", "g"]);
        assert_eq!(
            outcomes,
            vec![
                AttemptOutcome::Succeeded,
                AttemptOutcome::Accepted {
                    lease: Duration::from_secs(300)
                },
                AttemptOutcome::RetryAfter {
                    after: Duration::from_secs(30),
                    reason: "busy".into()
                },
                AttemptOutcome::Permanent {
                    reason: "no such image".into()
                },
                AttemptOutcome::Retry {
                    reason: "executor answered retry for this task".into(),
                    timed_out: false
                },
                AttemptOutcome::Retry {
                    reason: "batch answer has no result for this task".into(),
                    timed_out: false
                },
                AttemptOutcome::Retry {
                    reason: "batch answer has no result for this task".into(),
                    timed_out: false
                },
            ]
        );
    }

    /// An answer that is not per-task applies to every task of the call, as it would to
    /// one task; a 2xx without results fails each attempt rather than counting as done.
    #[test]
    fn a_batch_answer_without_results_applies_to_every_task() {
        let ids = ["a", "b"];
        for outcome in batch(200, None, "ok", &ids) {
            assert!(
                matches!(&outcome, AttemptOutcome::Retry { reason, .. } if reason.contains("without batch results")),
                "{outcome:?}"
            );
        }
        assert_eq!(
            batch(202, None, r#"{"lease":"90s"}"#, &ids),
            vec![
                AttemptOutcome::Accepted {
                    lease: Duration::from_secs(90)
                };
                2
            ]
        );
        assert!(
            batch(503, Some("7"), "", &ids)
                .iter()
                .all(|o| matches!(o, AttemptOutcome::RetryAfter { after, .. } if *after == Duration::from_secs(7)))
        );
        assert!(
            batch(400, None, "bad", &ids)
                .iter()
                .all(|o| matches!(o, AttemptOutcome::Permanent { .. }))
        );
        let absurd = r#"{"results": [{"id": "a", "status": "accepted", "lease": "100000000y"},
            {"id": "b", "status": "retry", "retry_after": "100000000y", "error": "a\u0000b"}]}"#;
        assert_eq!(
            batch(200, None, absurd, &ids),
            vec![
                AttemptOutcome::Accepted { lease: MAX_LEASE },
                AttemptOutcome::RetryAfter {
                    after: MAX_RETRY_AFTER,
                    reason: "a\u{FFFD}b".into()
                }
            ]
        );
    }

    /// The real client against a real server that verifies the batch signature as
    /// docs/api.md defines it (the per-task header values empty) and answers per task.
    #[tokio::test]
    async fn a_batch_call_is_signed_over_its_body_and_read_per_task() {
        use asyncd_contract::verify_signature;
        use axum::http::HeaderMap;

        let app = axum::Router::new().route(
            "/",
            axum::routing::post(|headers: HeaderMap, body: bytes::Bytes| async move {
                let header = |name: &str| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string()
                };
                assert_eq!(header(headers::BATCH), "2");
                assert_eq!(header(headers::TASK_ID), "", "no per-task header on a batch");
                let timestamp = header(headers::TIMESTAMP);
                let callback_url = header(headers::CALLBACK_URL);
                let call = SignedCall {
                    timestamp: &timestamp,
                    task_id: "",
                    attempt: "",
                    idempotency_key: "",
                    lease_token: "",
                    callback_url: &callback_url,
                    body: &body,
                };
                let signature = header(headers::SIGNATURE);
                if verify_signature(&[b"k1".as_slice()], Some(&signature), &call, SystemTime::now()).is_err()
                {
                    return (axum::http::StatusCode::UNAUTHORIZED, String::new());
                }
                let call: ExecutorBatchCall = serde_json::from_slice(&body).unwrap();
                let results: Vec<_> = call
                    .tasks
                    .iter()
                    .map(|t| {
                        assert_eq!(t.lease_token.len(), 64);
                        if t.attempt == 1 {
                            serde_json::json!({"id": t.id, "status": "success"})
                        } else {
                            serde_json::json!({"id": t.id, "status": "failed", "error": format!("attempt {} of {}", t.attempt, t.idempotency_key)})
                        }
                    })
                    .collect();
                (
                    axum::http::StatusCode::OK,
                    serde_json::json!({ "results": results }).to_string(),
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = ExecutorClient::new("http://127.0.0.1:1".into(), "test".into());
        let job = test_job(&format!("http://{addr}/"));
        let first = test_task();
        let mut second = test_task();
        second.id = "task-2".into();
        second.idempotency_key = Some("order-7".into());
        let started_first = test_started();
        let started_second = Started {
            id: "task-2".into(),
            attempt: 3,
            lease_token: 9,
        };
        let attempts = [
            BatchAttempt {
                task: &first,
                started: &started_first,
                trace: None,
            },
            BatchAttempt {
                task: &second,
                started: &started_second,
                trace: None,
            },
        ];
        let keys = Keys::Ready(std::sync::Arc::new(vec![b"k1".to_vec()]));
        let (outcomes, status) = client.call_batch(&job, &attempts, &keys).await;
        assert_eq!(status, Some(200));
        assert_eq!(
            outcomes,
            vec![
                AttemptOutcome::Succeeded,
                AttemptOutcome::Permanent {
                    reason: "attempt 3 of order-7".into()
                }
            ]
        );
        // Signed with a key the executor does not hold: refused, for every task.
        let wrong = Keys::Ready(std::sync::Arc::new(vec![b"k2".to_vec()]));
        let (outcomes, status) = client.call_batch(&job, &attempts, &wrong).await;
        assert_eq!(status, Some(401));
        assert!(
            outcomes
                .iter()
                .all(|o| matches!(o, AttemptOutcome::Permanent { .. }))
        );
    }

    fn test_task() -> ClaimedTask {
        ClaimedTask {
            id: "task-1".into(),
            task_type: "t".into(),
            payload: RawValue::from_string("{}".into()).unwrap(),
            priority: 0,
            trigger_at: asyncd_store::Millis::new(0),
            attempt: 0,
            max_retries: 3,
            timeout_ms: 30_000,
            lease_token: 1,
            idempotency_key: None,
            lease_secret: "secret".into(),
            concurrency_key: None,
            trace: None,
            expires_at: None,
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
                let outcome = classify(&answer, now, LEASE, true);
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

            /// Whatever a batch answer holds, each task of the call gets one outcome,
            /// safe to store and to add to a time.
            #[test]
            fn any_batch_answer_gives_one_bounded_outcome_per_task(
                status in prop_oneof![Just(200u16), 0u16..1000],
                entries in proptest::collection::vec(
                    (0usize..4, prop_oneof![Just("success".to_owned()), Just("accepted".to_owned()), Just("retry".to_owned()), Just("failed".to_owned()), ".*"],
                     proptest::option::of(".*"), proptest::option::of(".*"), proptest::option::of(".*")),
                    0..8),
                garbage in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
            ) {
                let ids = ["t0", "t1", "t2"];
                let results: Vec<_> = entries.iter().map(|(id, status, error, retry_after, lease)| serde_json::json!({
                    "id": format!("t{id}"), "status": status, "error": error, "retry_after": retry_after, "lease": lease,
                })).collect();
                let body = match &garbage {
                    Some(bytes) => bytes.clone(),
                    None => serde_json::json!({ "results": results }).to_string().into_bytes(),
                };
                let answer = ExecutorAnswer { status, retry_after: None, location: None, body: &body };
                let outcomes = classify_batch(&answer, &ids, SystemTime::UNIX_EPOCH, LEASE, true);
                prop_assert_eq!(outcomes.len(), ids.len());
                for outcome in &outcomes {
                    match outcome {
                        AttemptOutcome::Succeeded => {}
                        AttemptOutcome::Accepted { lease } => prop_assert!((MIN_LEASE..=MAX_LEASE).contains(lease)),
                        AttemptOutcome::RetryAfter { after, reason } => {
                            prop_assert!(*after <= MAX_RETRY_AFTER);
                            prop_assert!(storable(reason));
                        }
                        AttemptOutcome::Overloaded { reason }
                        | AttemptOutcome::Retry { reason, .. }
                        | AttemptOutcome::Permanent { reason } => prop_assert!(storable(reason)),
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

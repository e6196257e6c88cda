//! The executor side of the contract (`docs/api.md`, "Executor contract"): an axum
//! [`Router`] — a tower service — that checks the call's signature, decodes the task,
//! runs the handler registered for its type and turns the handler's outcome into the
//! answer asyncd expects.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use asyncd_contract::{ExecutorAccepted, ExecutorCall, headers};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::client::{Client, DEFAULT_ENDPOINT, ResultStatus, TaskResult};
use crate::error::ErrorCode;
use crate::time::{format_duration, retry_after_seconds};
use crate::verifier::{Verifier, VerifyError};
use asyncd_contract::SignatureError;

/// Executor call headers ([`asyncd_contract::headers`]).
pub const HEADER_IDEMPOTENCY_KEY: &str = headers::IDEMPOTENCY_KEY;
pub const HEADER_TASK_ID: &str = headers::TASK_ID;
pub const HEADER_ATTEMPT: &str = headers::ATTEMPT;
pub const HEADER_LEASE_TOKEN: &str = headers::LEASE_TOKEN;
pub const HEADER_CALLBACK_URL: &str = headers::CALLBACK_URL;
pub const HEADER_DISPATCHER: &str = headers::DISPATCHER;
pub const HEADER_TIMESTAMP: &str = headers::TIMESTAMP;
pub const HEADER_SIGNATURE: &str = headers::SIGNATURE;

/// The lease a long-running executor asks for when given none.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// asyncd's own payload limit is 1 MiB by default; this only stops garbage.
const MAX_BODY: usize = 32 << 20;

/// The task and attempt a handler is running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskContext {
    pub id: String,
    pub task_type: String,
    /// 1-based attempt number.
    pub attempt: u32,
    /// The task's idempotency key, else its id: key your side effects on it, since
    /// asyncd delivers at least once.
    pub idempotency_key: String,
    /// This attempt's lease token (opaque), for heartbeats and results.
    pub lease_token: String,
    /// Base URL of the asyncd API that sent the call (for heartbeats and results).
    pub callback_url: String,
    /// The task's due time.
    pub eta: Option<DateTime<Utc>>,
    /// The dispatcher instance that made the call, for logs.
    pub dispatcher: Option<String>,
    /// The call's W3C `traceparent` (the submitter's trace, under the attempt's span
    /// when asyncd exports spans) and `tracestate`: give them to
    /// [`crate::Task::trace`] (or an OpenTelemetry propagator) to continue the trace.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

/// Any error a handler may fail with: it becomes a 500 (retried with backoff).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// How a handler failed; `Ok` means the task succeeded.
///
/// | handler returns | answer | asyncd does |
/// |---|---|---|
/// | `Ok(_)` | 200 | task succeeded |
/// | `Err(Outcome::Retry { after: Some(d) })` | 503, `Retry-After: ⌈d⌉` s | retries after `d` (counts as an attempt) |
/// | `Err(Outcome::Retry { after: None })` | 503 without `Retry-After` | retries with exponential backoff |
/// | `Err(Outcome::Permanent(msg))` | 422 | dead letters, no retry |
/// | `Err(Outcome::Error(e))`, any `?`-converted error, a panic | 500 | retries with backoff until `max_retries`, then dead letters |
///
/// Every `std::error::Error` converts into `Outcome::Error`, so `?` works in handlers.
#[derive(Debug)]
pub enum Outcome {
    /// A transient failure: retry after `after`, or with asyncd's backoff when `None`.
    Retry { after: Option<Duration> },
    /// No retry can fix it: the task goes to dead letters.
    Permanent(String),
    /// An unexpected failure: retried with backoff.
    Error(BoxError),
}

impl Outcome {
    /// Retry after `after` (`Duration::ZERO`: at once).
    pub fn retry_after(after: Duration) -> Self {
        Self::Retry { after: Some(after) }
    }

    /// Retry with asyncd's exponential backoff.
    pub fn retry() -> Self {
        Self::Retry { after: None }
    }

    /// Send the task to dead letters with `message` as its `last_error`.
    pub fn permanent(message: impl fmt::Display) -> Self {
        Self::Permanent(message.to_string())
    }

    /// An unexpected failure, e.g. from `anyhow::Error` (which is not a
    /// `std::error::Error` and so does not convert with `?`).
    pub fn error(err: impl Into<BoxError>) -> Self {
        Self::Error(err.into())
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Retry { after: None } => f.write_str("retry"),
            Self::Retry { after: Some(d) } => write!(f, "retry after {}", format_duration(*d)),
            Self::Permanent(msg) if msg.is_empty() => f.write_str("permanent failure"),
            Self::Permanent(msg) => f.write_str(msg),
            Self::Error(e) => write!(f, "{e}"),
        }
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for Outcome {
    fn from(err: E) -> Self {
        Self::Error(Box::new(err))
    }
}

type HandlerFuture = Pin<Box<dyn Future<Output = Result<Value, Outcome>> + Send>>;
/// Decodes the payload (Err: the message of a 422) and starts the handler.
type ErasedHandler = Box<dyn Fn(TaskContext, &str) -> Result<HandlerFuture, String> + Send + Sync>;

struct Registration {
    handler: ErasedHandler,
    /// Set for long-running executors.
    lease: Option<Duration>,
}

/// Registry of task handlers, served as an axum [`Router`] at the URL an
/// AsyncJobConfig's `spec.executor.url` names (any path; dispatch is by the body's
/// `type`).
///
/// ```no_run
/// use asyncd_client::{Executor, Outcome, TaskContext};
/// #[derive(serde::Deserialize)]
/// struct Order { order_id: u64 }
///
/// async fn cancel(ctx: TaskContext, order: Order) -> Result<(), Outcome> {
///     println!("cancel {} (task {}, attempt {})", order.order_id, ctx.id, ctx.attempt);
///     Ok(())
/// }
///
/// # async fn run() -> std::io::Result<()> {
/// let app = Executor::new()
///     .signing_secret("the key in the job's signing Secret")
///     .register("cancel_expired_order", cancel)
///     .into_router();
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// axum::serve(listener, app).await
/// # }
/// ```
pub struct Executor {
    handlers: HashMap<String, Registration>,
    keys: Option<Vec<Vec<u8>>>,
    callback_endpoint: Option<String>,
    http: Option<reqwest::Client>,
    tracker: TaskTracker,
}

impl Default for Executor {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut types: Vec<_> = self.handlers.keys().collect();
        types.sort();
        f.debug_struct("Executor")
            .field("task_types", &types)
            .field("signed", &self.keys.is_some())
            .finish()
    }
}

impl Executor {
    pub fn new() -> Self {
        Self {
            handlers: HashMap::new(),
            keys: None,
            callback_endpoint: None,
            http: None,
            tracker: TaskTracker::new(),
        }
    }

    /// Refuse (401) every call whose `Asyncd-Signature` verifies with none of the
    /// keys given here — the values in the job's signing Secret
    /// (`spec.executor.signing.secretRef`); call it twice while a key is rotated —
    /// whose `Asyncd-Timestamp` is more than [`SIGNATURE_TOLERANCE`] off, or that
    /// repeats a (task, attempt) already delivered within that window. An empty key
    /// is never accepted: with no other key every call is refused.
    ///
    /// [`SIGNATURE_TOLERANCE`]: asyncd_contract::SIGNATURE_TOLERANCE
    pub fn signing_secret(mut self, key: impl AsRef<[u8]>) -> Self {
        self.keys
            .get_or_insert_with(Vec::new)
            .push(key.as_ref().to_vec());
        self
    }

    /// Where long-running executors send heartbeats and results when a call carries
    /// no `Asyncd-Callback-Url` (default [`DEFAULT_ENDPOINT`]). [`into_router`]
    /// panics unless it is an `http://` or `https://` URL.
    ///
    /// [`into_router`]: Self::into_router
    pub fn callback_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.callback_endpoint = Some(endpoint.into());
        self
    }

    /// The HTTP client for heartbeats and results (default: one with a 10 s timeout).
    pub fn http_client(mut self, http: reqwest::Client) -> Self {
        self.http = Some(http);
        self
    }

    /// Runs `handler` for tasks of `task_type`, within the executor call: the
    /// outcome is the answer (see [`Outcome`]). The payload is decoded into `P`
    /// (`serde_json::Value` takes anything); a payload that does not decode is a
    /// permanent failure (422), since the same payload would come again on a retry.
    /// A serializable `Ok` value other than `()` is answered as `{"output": …}`.
    /// Registering a type again replaces its handler.
    pub fn register<P, T, F, Fut>(self, task_type: impl Into<String>, handler: F) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        T: Serialize + Send + 'static,
        F: Fn(TaskContext, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, Outcome>> + Send + 'static,
    {
        self.add(task_type.into(), None, handler)
    }

    /// Like [`register`](Self::register), for work that may outlast the job's
    /// timeout: the call is answered `202 {"lease": …}` at once, the handler runs in
    /// the background, a heartbeat keeps the lease every `lease / 3`, and the outcome
    /// is posted to `{callback}/v1/tasks/{id}/result` (`success` with the `Ok` value
    /// as `output`, `retry` with `retry_after`, or `failed`). If asyncd refuses a
    /// heartbeat — `task_cancelled` (the task was cancelled while it ran) or
    /// `stale_lease` (the lease lapsed and a newer attempt owns the task) — the
    /// handler's future is dropped and no result is posted. `Duration::ZERO`
    /// means [`DEFAULT_LEASE`].
    pub fn register_long_running<P, T, F, Fut>(
        self,
        task_type: impl Into<String>,
        lease: Duration,
        handler: F,
    ) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        T: Serialize + Send + 'static,
        F: Fn(TaskContext, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, Outcome>> + Send + 'static,
    {
        let lease = if lease.is_zero() {
            DEFAULT_LEASE
        } else {
            lease
        };
        self.add(task_type.into(), Some(lease), handler)
    }

    fn add<P, T, F, Fut>(mut self, task_type: String, lease: Option<Duration>, handler: F) -> Self
    where
        P: DeserializeOwned + Send + 'static,
        T: Serialize + Send + 'static,
        F: Fn(TaskContext, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, Outcome>> + Send + 'static,
    {
        let erased: ErasedHandler = Box::new(move |ctx, raw| {
            let payload: P =
                serde_json::from_str(raw).map_err(|e| format!("payload does not decode: {e}"))?;
            let fut = handler(ctx, payload);
            Ok(Box::pin(async move {
                let out = fut.await?;
                serde_json::to_value(out).map_err(Outcome::from)
            }))
        });
        self.handlers.insert(
            task_type,
            Registration {
                handler: erased,
                lease,
            },
        );
        self
    }

    /// A handle on the long-running handlers still at work; take it before
    /// [`into_router`](Self::into_router) to wait for them on shutdown.
    pub fn in_flight(&self) -> InFlight {
        InFlight {
            tracker: self.tracker.clone(),
        }
    }

    /// The router serving the executor contract at any path.
    pub fn into_router(self) -> Router {
        let http = self.http.unwrap_or_else(|| {
            reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("a default reqwest client builds")
        });
        let callbacks = Client::builder()
            .endpoint(
                self.callback_endpoint
                    .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string()),
            )
            .http_client(http)
            .build()
            .expect("Executor::callback_endpoint must be an http:// or https:// URL");
        let shared = Arc::new(Shared {
            handlers: self.handlers,
            verifier: self.keys.map(Verifier::new),
            callbacks,
            tracker: self.tracker,
        });
        Router::new()
            .fallback(serve)
            .layer(DefaultBodyLimit::max(MAX_BODY))
            .with_state(shared)
    }
}

/// The long-running handlers of an [`Executor`] still at work.
#[derive(Debug, Clone)]
pub struct InFlight {
    tracker: TaskTracker,
}

impl InFlight {
    /// How many long-running handlers are running or posting their result.
    pub fn len(&self) -> usize {
        self.tracker.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }

    /// Waits until every long-running handler has posted its result (or given up).
    /// Stop the HTTP server first so that no new ones start; bound it with
    /// `tokio::time::timeout`.
    pub async fn wait(&self) {
        self.tracker.close();
        self.tracker.wait().await;
        self.tracker.reopen();
    }
}

struct Shared {
    handlers: HashMap<String, Registration>,
    verifier: Option<Verifier>,
    callbacks: Client,
    tracker: TaskTracker,
}

/// The call body; `id` and `attempt` may be left to the headers.
type Envelope = ExecutorCall<Option<Box<RawValue>>>;

fn answer(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

fn error_answer(status: StatusCode, message: impl fmt::Display) -> Response {
    answer(status, json!({"error": message.to_string()}))
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

fn context(headers: &HeaderMap, env: &Envelope, default_callback: &str) -> TaskContext {
    let id = if env.id.is_empty() {
        header_str(headers, HEADER_TASK_ID)
            .unwrap_or("")
            .to_string()
    } else {
        env.id.clone()
    };
    let attempt = if env.attempt > 0 {
        env.attempt
    } else {
        header_str(headers, HEADER_ATTEMPT)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    TaskContext {
        idempotency_key: header_str(headers, HEADER_IDEMPOTENCY_KEY)
            .map(str::to_string)
            .unwrap_or_else(|| id.clone()),
        id,
        task_type: env.task_type.clone(),
        attempt,
        lease_token: header_str(headers, HEADER_LEASE_TOKEN)
            .unwrap_or("")
            .to_string(),
        callback_url: header_str(headers, HEADER_CALLBACK_URL)
            .unwrap_or(default_callback)
            .trim_end_matches('/')
            .to_string(),
        eta: env.eta,
        dispatcher: header_str(headers, HEADER_DISPATCHER).map(str::to_string),
        traceparent: header_str(headers, headers::TRACEPARENT).map(str::to_string),
        tracestate: header_str(headers, headers::TRACESTATE).map(str::to_string),
    }
}

async fn serve(
    State(shared): State<Arc<Shared>>,
    method: Method,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    if method != Method::POST {
        let mut resp = error_answer(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return resp;
    }
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return error_answer(StatusCode::PAYLOAD_TOO_LARGE, "body too large");
        }
        Err(rejection) => return error_answer(StatusCode::BAD_REQUEST, rejection.body_text()),
    };
    if let Some(verifier) = &shared.verifier
        && let Err(e) = verifier.verify(&headers, &body, SystemTime::now())
    {
        tracing::error!(
            task = %header_str(&headers, HEADER_TASK_ID).unwrap_or(""),
            attempt = %header_str(&headers, HEADER_ATTEMPT).unwrap_or(""),
            reason = %e,
            hint = refusal_hint(&headers, &e),
            "asyncd: refused an executor call (401: asyncd will not retry it; redrive the task once fixed)"
        );
        return error_answer(StatusCode::UNAUTHORIZED, e);
    }
    let env = match serde_json::from_slice::<Envelope>(&body) {
        Ok(env) if !env.task_type.is_empty() => env,
        // The same body would come again on a retry, so this is permanent (400).
        _ => {
            tracing::error!(
                task = %header_str(&headers, HEADER_TASK_ID).unwrap_or(""),
                "asyncd: refused an executor call (400): the body is not an asyncd task"
            );
            return error_answer(StatusCode::BAD_REQUEST, "body is not an asyncd task");
        }
    };
    let Some(reg) = shared.handlers.get(&env.task_type) else {
        // 501, not 404: a 4xx would dead-letter the task, while the usual cause is a
        // rollout that has not reached this replica yet; a 5xx is retried.
        tracing::warn!(
            task = %header_str(&headers, HEADER_TASK_ID).unwrap_or(""),
            task_type = %env.task_type,
            "asyncd: refused an executor call (501): no executor for this task type; asyncd will retry"
        );
        return error_answer(
            StatusCode::NOT_IMPLEMENTED,
            format!("no executor for task type {:?}", env.task_type),
        );
    };
    let ctx = context(&headers, &env, shared.callbacks.endpoint());
    let raw = env.payload.as_deref().map_or("null", RawValue::get);
    let fut = match (reg.handler)(ctx.clone(), raw) {
        Ok(fut) => fut,
        Err(msg) => {
            tracing::error!(task = %ctx.id, task_type = %ctx.task_type, attempt = ctx.attempt, error = %msg,
                "asyncd: task failed permanently (its payload does not decode); it goes to dead letters");
            return error_answer(StatusCode::UNPROCESSABLE_ENTITY, msg);
        }
    };
    if let Some(lease) = reg.lease {
        let s = shared.clone();
        shared
            .tracker
            .spawn(async move { run_long(s, ctx, lease, fut).await });
        let accepted = ExecutorAccepted {
            lease: Some(format_duration(lease)),
            lease_seconds: None,
        };
        return (StatusCode::ACCEPTED, axum::Json(accepted)).into_response();
    }
    // Spawned so that a panic is a 500 rather than a dropped connection.
    let started = Instant::now();
    let mut abandoned = Abandoned {
        ctx: Some(ctx.clone()),
        started,
    };
    let outcome = match tokio::spawn(fut).await {
        Ok(outcome) => outcome,
        Err(e) => Err(Outcome::Error(panic_message(e).into())),
    };
    abandoned.ctx = None;
    log_outcome(&ctx, &outcome, started.elapsed());
    outcome_answer(outcome)
}

/// Logs, when dropped armed, that asyncd closed the call before the handler returned:
/// the attempt timed out (the job's executor timeout is shorter than the handler). The
/// server drops the answering future when the caller hangs up; the handler runs on.
struct Abandoned {
    ctx: Option<TaskContext>,
    started: Instant,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if let Some(ctx) = &self.ctx {
            tracing::error!(task = %ctx.id, task_type = %ctx.task_type, attempt = ctx.attempt,
                took = ?self.started.elapsed(),
                "asyncd: task timed out: asyncd closed the call before the handler returned (the job's \
                 executor timeout is shorter than the handler); it counts as a failed attempt and may run again");
        }
    }
}

/// What usually causes a signature refusal.
fn refusal_hint(headers: &HeaderMap, err: &VerifyError) -> &'static str {
    match err {
        VerifyError::Signature(SignatureError::NoKey) => {
            "this executor has no usable signing key (is the variable holding the job's signing secret \
             empty?): it refuses every call"
        }
        _ if header_str(headers, HEADER_SIGNATURE).is_none() => {
            "the call is unsigned: the job has no spec.executor.signing (asyncd signs the calls of \
             jobs that configure it), or the caller is not asyncd"
        }
        VerifyError::Signature(SignatureError::Stale) => {
            "the clocks of asyncd and this executor differ by more than 5 minutes"
        }
        VerifyError::Replayed => "this attempt was delivered before (a replayed call)",
        _ => "the signing key differs from the job's signing Secret",
    }
}

/// Logs an attempt that did not succeed, at a level saying whether asyncd retries it.
fn log_outcome(ctx: &TaskContext, outcome: &Result<Value, Outcome>, took: Duration) {
    let Err(o) = outcome else { return };
    match o {
        Outcome::Retry { .. } => tracing::warn!(task = %ctx.id, task_type = %ctx.task_type,
            attempt = ctx.attempt, ?took, error = %o, "asyncd: task asked to be retried"),
        Outcome::Permanent(_) => tracing::error!(task = %ctx.id, task_type = %ctx.task_type,
            attempt = ctx.attempt, ?took, error = %o, "asyncd: task failed permanently; it goes to dead letters"),
        Outcome::Error(_) => tracing::error!(task = %ctx.id, task_type = %ctx.task_type,
            attempt = ctx.attempt, ?took, error = %o, "asyncd: task failed; asyncd will retry it"),
    }
}

fn panic_message(e: tokio::task::JoinError) -> String {
    if !e.is_panic() {
        return "handler cancelled".to_string();
    }
    let p = e.into_panic();
    let msg = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown payload".into());
    format!("handler panicked: {msg}")
}

fn outcome_answer(outcome: Result<Value, Outcome>) -> Response {
    match outcome {
        Ok(Value::Null) => answer(StatusCode::OK, json!({})),
        Ok(output) => answer(StatusCode::OK, json!({ "output": output })),
        Err(o @ Outcome::Retry { after }) => {
            let mut resp = error_answer(StatusCode::SERVICE_UNAVAILABLE, &o);
            if let Some(after) = after {
                resp.headers_mut().insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(retry_after_seconds(after)),
                );
            }
            resp
        }
        Err(o @ Outcome::Permanent(_)) => error_answer(StatusCode::UNPROCESSABLE_ENTITY, o),
        Err(o @ Outcome::Error(_)) => error_answer(StatusCode::INTERNAL_SERVER_ERROR, o),
    }
}

fn result_of(ctx: &TaskContext, outcome: Result<Value, Outcome>) -> TaskResult {
    let mut res = TaskResult {
        lease_token: ctx.lease_token.clone(),
        status: ResultStatus::Success,
        error: None,
        output: None,
        retry_after: None,
    };
    match outcome {
        Ok(Value::Null) => {}
        Ok(output) => res.output = Some(output),
        Err(o) => {
            res.error = Some(o.to_string());
            match o {
                Outcome::Permanent(_) => res.status = ResultStatus::Failed,
                Outcome::Retry { after } => {
                    res.status = ResultStatus::Retry;
                    res.retry_after = after;
                }
                Outcome::Error(_) => res.status = ResultStatus::Retry,
            }
        }
    }
    res
}

async fn run_long(shared: Arc<Shared>, ctx: TaskContext, lease: Duration, fut: HandlerFuture) {
    let api = shared.callbacks.at(&ctx.callback_url);
    let period = (lease / 3).max(Duration::from_millis(1));
    let started = Instant::now();
    let mut handler = tokio::spawn(fut);
    let mut lease_until = Instant::now() + lease;
    let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let joined = loop {
        tokio::select! {
            joined = &mut handler => break joined,
            _ = ticker.tick() => {
                let beat = tokio::time::timeout(period, api.heartbeat(&ctx.id, &ctx.lease_token, Some(lease))).await;
                match beat {
                    Ok(Ok(_)) => lease_until = Instant::now() + lease,
                    Ok(Err(e)) if e.is(&ErrorCode::TaskCancelled) => {
                        // Dropping the handler's future is how Rust cancels it: it stops
                        // at its next await, and its destructors run.
                        tracing::info!(task = %ctx.id, task_type = %ctx.task_type, attempt = ctx.attempt,
                            "asyncd: task was cancelled while it ran (its heartbeat said so); stopping the handler, its result is dropped");
                        handler.abort();
                        return;
                    }
                    Ok(Err(e)) if e.is(&ErrorCode::StaleLease) || e.is(&ErrorCode::NotFound) => {
                        // A newer attempt owns the task; asyncd would refuse our result.
                        tracing::warn!(task = %ctx.id, task_type = %ctx.task_type, attempt = ctx.attempt, error = %e,
                            "asyncd: long-running task lost its lease (a heartbeat was refused): a newer attempt owns it; stopping the handler");
                        handler.abort();
                        return;
                    }
                    Ok(Err(e)) => tracing::warn!(task = %ctx.id, error = %e, "asyncd heartbeat failed"),
                    Err(_) => tracing::warn!(task = %ctx.id, "asyncd heartbeat timed out"),
                }
            }
        }
    };
    let outcome = joined.unwrap_or_else(|e| Err(Outcome::Error(panic_message(e).into())));
    log_outcome(&ctx, &outcome, started.elapsed());
    let result = result_of(&ctx, outcome);
    // Transport failures and 5xx are retried until the lease would have lapsed
    // anyway; after that asyncd retries the task itself.
    let mut backoff = Duration::from_millis(100);
    loop {
        match api.post_result(&ctx.id, &result).await {
            Ok(_) => return,
            Err(e) if e.status().is_some_and(|s| s < 500) => {
                tracing::warn!(task = %ctx.id, error = %e, "asyncd refused the result");
                return;
            }
            Err(e) => {
                if Instant::now() + backoff > lease_until {
                    tracing::warn!(task = %ctx.id, error = %e, "asyncd result not delivered");
                    return;
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sign;
    use axum::body::Body;
    use axum::http::Request;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::ServiceExt;

    fn task_body(task_type: &str, payload: &str) -> String {
        format!(
            r#"{{"id":"0193t","type":"{task_type}","payload":{payload},"attempt":2,"eta":"2026-11-30T06:00:00.123Z"}}"#
        )
    }

    async fn call(
        app: &Router,
        method: &str,
        body: &str,
        headers: &[(&str, String)],
    ) -> (u16, HeaderMap, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri("/tasks/run")
            .header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let resp = app
            .clone()
            .oneshot(req.body(Body::from(body.to_string())).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (
            status,
            headers,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    #[derive(Debug, thiserror::Error)]
    #[error("db down")]
    struct DbDown;

    /// What a `tracing_subscriber::fmt` subscriber wrote, shared with the test.
    #[derive(Clone, Default)]
    struct Logs(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Logs {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
        type Writer = Logs;
        fn make_writer(&'a self) -> Logs {
            self.clone()
        }
    }

    impl Logs {
        /// Installs a subscriber writing here for this thread (the test's current-thread
        /// runtime runs every spawned task on it too).
        fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
            let logs = Logs::default();
            let subscriber = tracing_subscriber::fmt()
                .with_writer(logs.clone())
                .with_ansi(false)
                .finish();
            (logs.clone(), tracing::subscriber::set_default(subscriber))
        }

        fn lines(&self) -> Vec<String> {
            String::from_utf8_lossy(&self.0.lock().unwrap())
                .lines()
                .map(str::to_string)
                .collect()
        }
    }

    /// Every attempt that did not succeed is logged through `tracing`, at a level that
    /// says whether asyncd retries it; a success is not.
    #[tokio::test]
    async fn every_failed_or_refused_task_is_logged() {
        let (logs, _guard) = Logs::capture();
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Order {
            order_id: u64,
        }
        let app = Executor::new()
            .register("ok", |_, _: Value| async { Ok(()) })
            .register("later", |_, _: Value| async {
                Err::<(), _>(Outcome::retry_after(Duration::from_secs(10)))
            })
            .register("bad", |_, _: Value| async {
                Err::<(), _>(Outcome::permanent("card declined"))
            })
            .register("flaky", |_, _: Value| async {
                Err::<(), DbDown>(DbDown)?;
                Ok(())
            })
            .register("typed", |_, _: Order| async { Ok(()) })
            .into_router();
        let headers = [("Asyncd-Task-Id", "0193t".to_string())];
        call(&app, "POST", &task_body("ok", "{}"), &headers).await;
        assert_eq!(
            logs.lines(),
            Vec::<String>::new(),
            "a success is not logged"
        );
        for (task_type, payload) in [
            ("later", "{}"),
            ("bad", "{}"),
            ("flaky", "{}"),
            ("typed", r#"{"order_id":"x"}"#),
            ("nobody", "{}"),
        ] {
            call(&app, "POST", &task_body(task_type, payload), &headers).await;
        }
        let lines = logs.lines();
        let want = [
            ("WARN", "later", "asked to be retried"),
            ("ERROR", "bad", "failed permanently"),
            ("ERROR", "flaky", "asyncd will retry it"),
            ("ERROR", "typed", "its payload does not decode"),
            ("WARN", "nobody", "no executor for this task type"),
        ];
        assert_eq!(lines.len(), want.len(), "{lines:#?}");
        for (line, (level, task_type, msg)) in lines.iter().zip(want) {
            assert!(
                line.contains(level)
                    && line.contains(&format!("task_type={task_type}"))
                    && line.contains(msg)
                    && line.contains("0193t"),
                "{line} lacks {level} {task_type} {msg}"
            );
        }
    }

    /// Unsigned calls (a job without `spec.executor.signing`) and an
    /// executor without a key (its variable unset) are logged with what to fix.
    #[tokio::test]
    async fn refused_calls_are_logged_with_a_hint() {
        let (logs, _guard) = Logs::capture();
        let headers = [("Asyncd-Task-Id", "0193t".to_string())];
        let signed = Executor::new()
            .signing_secret("s3cret")
            .register("ok", |_, _: Value| async { Ok(()) })
            .into_router();
        let (status, _, _) = call(&signed, "POST", &task_body("ok", "{}"), &headers).await;
        assert_eq!(status, 401);
        let keyless = Executor::new()
            .signing_secret("")
            .register("ok", |_, _: Value| async { Ok(()) })
            .into_router();
        call(&keyless, "POST", &task_body("ok", "{}"), &headers).await;
        let lines = logs.lines();
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(
            lines[0].contains("ERROR")
                && lines[0].contains("401")
                && lines[0].contains("task=0193t")
                && lines[0].contains("the job has no spec.executor.signing"),
            "{}",
            lines[0]
        );
        assert!(lines[1].contains("no usable signing key"), "{}", lines[1]);
    }

    /// asyncd hangs up when the job's executor timeout passes; the attempt is logged as
    /// timed out.
    #[tokio::test]
    async fn a_call_asyncd_gave_up_on_is_logged_as_timed_out() {
        let (logs, _guard) = Logs::capture();
        let app = Executor::new()
            .register("slow", |_, _: Value| async {
                std::future::pending::<()>().await;
                Ok(())
            })
            .into_router();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/tasks", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let err = reqwest::Client::new()
            .post(&url)
            .header("Asyncd-Task-Id", "0193t")
            .body(task_body("slow", "{}"))
            .timeout(Duration::from_millis(200))
            .send()
            .await
            .unwrap_err();
        assert!(err.is_timeout());
        let deadline = Instant::now() + Duration::from_secs(5);
        while !logs.lines().iter().any(|l| l.contains("timed out")) {
            assert!(
                Instant::now() < deadline,
                "no timed-out record: {:#?}",
                logs.lines()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let line = logs
            .lines()
            .into_iter()
            .find(|l| l.contains("timed out"))
            .unwrap();
        assert!(
            line.contains("ERROR") && line.contains("task_type=slow"),
            "{line}"
        );
    }

    #[tokio::test]
    async fn outcome_mapping() {
        let seen: Arc<Mutex<Option<(TaskContext, Value)>>> = Arc::default();
        let s = seen.clone();
        #[derive(serde::Deserialize)]
        struct Order {
            order_id: u64,
        }
        let app = Executor::new()
            .register("ok", move |ctx, payload: Value| {
                *s.lock().unwrap() = Some((ctx, payload));
                async { Ok(()) }
            })
            .register("typed", |_, o: Order| async move {
                Ok(json!({"cancelled": o.order_id}))
            })
            .register("retry_later", |_, _: Value| async {
                Err::<(), _>(Outcome::retry_after(Duration::from_millis(1500)))
            })
            .register("retry_now", |_, _: Value| async {
                Err::<(), _>(Outcome::retry_after(Duration::ZERO))
            })
            .register("retry_backoff", |_, _: Value| async {
                Err::<(), _>(Outcome::retry())
            })
            .register("permanent", |_, _: Value| async {
                Err::<(), _>(Outcome::permanent("card declined"))
            })
            .register("transient", |_, _: Value| async {
                Err::<(), DbDown>(DbDown)?;
                Ok(())
            })
            .register("panics", |_, _: Value| async {
                if true {
                    panic!("nil map");
                }
                Ok(())
            })
            .into_router();

        let headers = [
            ("Idempotency-Key", "order-42".to_string()),
            ("Asyncd-Task-Id", "0193t".to_string()),
            ("Asyncd-Attempt", "2".to_string()),
            ("Asyncd-Lease-Token", "tok-7".to_string()),
            ("Asyncd-Callback-Url", "http://127.0.0.1:7700/".to_string()),
            ("Asyncd-Dispatcher", "d-1".to_string()),
        ];
        let (status, _, body) = call(
            &app,
            "POST",
            &task_body("ok", r#"{"order_id":42}"#),
            &headers,
        )
        .await;
        assert_eq!((status, body), (200, json!({})));
        let (ctx, payload) = seen.lock().unwrap().clone().unwrap();
        assert_eq!(payload, json!({"order_id": 42}));
        assert_eq!(
            ctx,
            TaskContext {
                id: "0193t".into(),
                task_type: "ok".into(),
                attempt: 2,
                idempotency_key: "order-42".into(),
                lease_token: "tok-7".into(),
                callback_url: "http://127.0.0.1:7700".into(),
                eta: Some("2026-11-30T06:00:00.123Z".parse().unwrap()),
                dispatcher: Some("d-1".into()),
                traceparent: None,
                tracestate: None,
            }
        );

        let (status, _, body) =
            call(&app, "POST", &task_body("typed", r#"{"order_id":42}"#), &[]).await;
        assert_eq!((status, body), (200, json!({"output": {"cancelled": 42}})));

        for (task_type, want_status, want_retry_after) in [
            ("retry_later", 503, Some("2")),
            ("retry_now", 503, Some("0")),
            ("retry_backoff", 503, None),
            ("permanent", 422, None),
            ("transient", 500, None),
            ("panics", 500, None),
            ("unregistered", 501, None),
        ] {
            let (status, headers, body) =
                call(&app, "POST", &task_body(task_type, "{}"), &[]).await;
            assert_eq!(status, want_status, "{task_type}: {body}");
            assert_eq!(
                headers.get("retry-after").map(|v| v.to_str().unwrap()),
                want_retry_after,
                "{task_type}"
            );
            assert!(body["error"].is_string(), "{task_type}: {body}");
        }
        let (_, _, body) = call(&app, "POST", &task_body("permanent", "{}"), &[]).await;
        assert_eq!(body["error"], "card declined");
        let (_, _, body) = call(&app, "POST", &task_body("transient", "{}"), &[]).await;
        assert_eq!(body["error"], "db down");
        let (_, _, body) = call(&app, "POST", &task_body("panics", "{}"), &[]).await;
        assert!(
            body["error"].as_str().unwrap().contains("nil map"),
            "{body}"
        );

        // A payload that does not decode into the handler's type cannot be retried.
        let (status, _, body) = call(
            &app,
            "POST",
            &task_body("typed", r#"{"order_id":"x"}"#),
            &[],
        )
        .await;
        assert_eq!(status, 422, "{body}");
        // Not an asyncd task at all.
        for bad in ["not json", r#"{"id":"x"}"#, r#"{"type":""}"#, "[]"] {
            let (status, _, _) = call(&app, "POST", bad, &[]).await;
            assert_eq!(status, 400, "{bad}");
        }
        let (status, headers, _) = call(&app, "GET", "", &[]).await;
        assert_eq!((status, headers["allow"].to_str().unwrap()), (405, "POST"));
    }

    #[tokio::test]
    async fn context_falls_back_to_headers_and_id() {
        let seen: Arc<Mutex<Option<TaskContext>>> = Arc::default();
        let s = seen.clone();
        let app = Executor::new()
            .callback_endpoint("http://asyncd:7700")
            .register("ok", move |ctx, _: Value| {
                *s.lock().unwrap() = Some(ctx);
                async { Ok(()) }
            })
            .into_router();
        let headers = [
            ("Asyncd-Task-Id", "from-header".to_string()),
            ("Asyncd-Attempt", "3".to_string()),
        ];
        let (status, _, _) = call(&app, "POST", r#"{"type":"ok"}"#, &headers).await;
        assert_eq!(status, 200);
        let ctx = seen.lock().unwrap().clone().unwrap();
        assert_eq!(ctx.id, "from-header");
        assert_eq!(ctx.idempotency_key, "from-header", "no key: the id");
        assert_eq!(ctx.attempt, 3);
        assert_eq!(ctx.callback_url, "http://asyncd:7700");
        assert_eq!(
            (ctx.lease_token.as_str(), ctx.eta, ctx.dispatcher),
            ("", None, None)
        );
        assert_eq!((ctx.traceparent, ctx.tracestate), (None, None));
    }

    /// The handler gets the call's trace context, to continue the trace.
    #[tokio::test]
    async fn the_handler_sees_the_calls_trace_context() {
        let seen: Arc<Mutex<Option<TaskContext>>> = Arc::default();
        let s = seen.clone();
        let app = Executor::new()
            .register("ok", move |ctx, _: Value| {
                *s.lock().unwrap() = Some(ctx);
                async { Ok(()) }
            })
            .into_router();
        let parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let headers = [
            ("traceparent", parent.to_string()),
            ("tracestate", "vendor=1".to_string()),
        ];
        let (status, _, _) = call(&app, "POST", &task_body("ok", "{}"), &headers).await;
        assert_eq!(status, 200);
        let ctx = seen.lock().unwrap().clone().unwrap();
        assert_eq!(ctx.traceparent.as_deref(), Some(parent));
        assert_eq!(ctx.tracestate.as_deref(), Some("vendor=1"));
    }

    #[tokio::test]
    async fn signature_is_checked() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let app = Executor::new()
            .signing_secret("new")
            .signing_secret("old")
            .register("ok", move |_, _: Value| {
                c.fetch_add(1, Ordering::SeqCst);
                async { Ok(()) }
            })
            .into_router();
        let body = task_body("ok", "{}");
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let signed = |key: &[u8], ts: i64, attempt: &str, body: &str| {
            let mut h = vec![
                ("Asyncd-Timestamp", ts.to_string()),
                ("Asyncd-Task-Id", "0193t".to_string()),
                ("Asyncd-Attempt", attempt.to_string()),
                ("Asyncd-Lease-Token", "tok".to_string()),
            ];
            let mut map = HeaderMap::new();
            for (k, v) in &h {
                map.insert(*k, v.parse().unwrap());
            }
            let sig = sign(&[key], &crate::signed_call(&map, body.as_bytes()))
                .unwrap_or_else(|_| "v2=00".into());
            h.push(("Asyncd-Signature", sig));
            h
        };
        for ok in [
            signed(b"new", now, "1", &body),
            signed(b"old", now, "2", &body),
        ] {
            let (status, _, resp) = call(&app, "POST", &body, &ok).await;
            assert_eq!(status, 200, "{resp}");
        }
        let cases = [
            ("unsigned", vec![]),
            ("replay", signed(b"new", now, "1", &body)),
            ("mismatch", signed(b"new", now, "3", &format!("{body} "))),
            ("stale", signed(b"new", now - 301, "3", &body)),
            ("future", signed(b"new", now + 301, "3", &body)),
            (
                "bad stamp",
                vec![
                    ("Asyncd-Timestamp", "soon".to_string()),
                    ("Asyncd-Signature", "v2=00".to_string()),
                ],
            ),
            ("other key", signed(b"other", now, "3", &body)),
        ];
        for (name, headers) in cases {
            let (status, _, resp) = call(&app, "POST", &body, &headers).await;
            assert_eq!(status, 401, "{name}: {resp}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2, "only the signed calls ran");

        let empty = Executor::new()
            .signing_secret("")
            .register("ok", |_, _: Value| async {
                panic!("ran with an empty key");
                #[allow(unreachable_code)]
                Ok(())
            })
            .into_router();
        let (status, _, _) = call(&empty, "POST", &body, &signed(b"x", now, "1", &body)).await;
        assert_eq!(status, 401, "an empty key accepts nothing");
    }

    /// Stands in for asyncd's heartbeat and result endpoints.
    #[derive(Clone, Default)]
    struct CallbackApi {
        heartbeats: Arc<Mutex<Vec<Value>>>,
        results: Arc<Mutex<Vec<Value>>>,
        /// Refuse heartbeats as stale after this many (0: never).
        stale_after: usize,
        /// Answer heartbeats `410 task_cancelled` after this many (0: never).
        cancelled_after: usize,
    }

    impl CallbackApi {
        async fn start(self) -> (Self, String) {
            let api = self.clone();
            let app = Router::new().fallback(move |uri: axum::http::Uri, body: Bytes| {
                let api = api.clone();
                async move {
                    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    if uri.path().ends_with("/heartbeat") {
                        let mut hbs = api.heartbeats.lock().unwrap();
                        hbs.push(body);
                        if api.stale_after > 0 && hbs.len() > api.stale_after {
                            return answer(
                                StatusCode::CONFLICT,
                                json!({"error": {"code": "stale_lease", "message": "lease lapsed"}}),
                            );
                        }
                        if api.cancelled_after > 0 && hbs.len() > api.cancelled_after {
                            return answer(
                                StatusCode::GONE,
                                json!({"error": {"code": "task_cancelled", "message": "task was cancelled", "state": "cancelled"}}),
                            );
                        }
                        answer(StatusCode::OK, json!({"lease_until": "2026-11-30T06:00:00.000Z"}))
                    } else if uri.path().ends_with("/result") {
                        api.results.lock().unwrap().push(body);
                        answer(StatusCode::OK, json!({"id": "0193t", "state": "succeeded"}))
                    } else {
                        answer(StatusCode::NOT_FOUND, json!({}))
                    }
                }
            });
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
            (self, format!("http://{addr}"))
        }

        fn heartbeats(&self) -> Vec<Value> {
            self.heartbeats.lock().unwrap().clone()
        }

        fn results(&self) -> Vec<Value> {
            self.results.lock().unwrap().clone()
        }
    }

    async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn long_running_heartbeats_then_posts_the_result() {
        type Case = (&'static str, fn() -> Result<Value, Outcome>, Value);
        let cases: Vec<Case> = vec![
            (
                "success",
                || Ok(Value::Null),
                json!({"lease_token": "tok-7", "status": "success"}),
            ),
            (
                "output",
                || Ok(json!({"rows": 3})),
                json!({"lease_token": "tok-7", "status": "success", "output": {"rows": 3}}),
            ),
            (
                "permanent",
                || Err(Outcome::permanent("bad input")),
                json!({"lease_token": "tok-7", "status": "failed", "error": "bad input"}),
            ),
            (
                "retry",
                || Err(Outcome::retry_after(Duration::from_secs(10))),
                json!({"lease_token": "tok-7", "status": "retry", "error": "retry after 10s", "retry_after": "10s"}),
            ),
            (
                "error",
                || Err(DbDown.into()),
                json!({"lease_token": "tok-7", "status": "retry", "error": "db down"}),
            ),
        ];
        for (name, outcome, want) in cases {
            let (api, url) = CallbackApi::default().start().await;
            let release = Arc::new(tokio::sync::Notify::new());
            let r = release.clone();
            let executor = Executor::new()
                .callback_endpoint("http://127.0.0.1:1")
                .register_long_running("long", Duration::from_millis(300), move |_, _: Value| {
                    let r = r.clone();
                    async move {
                        r.notified().await;
                        outcome()
                    }
                });
            let in_flight = executor.in_flight();
            let app = executor.into_router();
            let headers = [
                ("Asyncd-Lease-Token", "tok-7".to_string()),
                ("Asyncd-Callback-Url", url),
            ];
            let (status, _, body) = call(&app, "POST", &task_body("long", "{}"), &headers).await;
            assert_eq!((status, body), (202, json!({"lease": "300ms"})), "{name}");
            assert_eq!(in_flight.len(), 1);
            wait_until("two heartbeats", || api.heartbeats().len() >= 2).await;
            assert!(
                api.results().is_empty(),
                "{name}: result before the handler ended"
            );
            release.notify_one();
            tokio::time::timeout(Duration::from_secs(10), in_flight.wait())
                .await
                .expect("the long-running handler finishes");
            assert_eq!(
                api.heartbeats()[0],
                json!({"lease_token": "tok-7", "lease": "300ms"}),
                "{name}"
            );
            assert_eq!(api.results(), vec![want], "{name}");
        }
    }

    #[tokio::test]
    async fn long_running_stale_lease_stops_the_handler() {
        a_refused_heartbeat_drops_the_handler(CallbackApi {
            stale_after: 1,
            ..CallbackApi::default()
        })
        .await;
    }

    /// Issue 15: a task cancelled while it runs is told on its next heartbeat.
    #[tokio::test]
    async fn long_running_cancelled_task_stops_the_handler() {
        a_refused_heartbeat_drops_the_handler(CallbackApi {
            cancelled_after: 1,
            ..CallbackApi::default()
        })
        .await;
    }

    async fn a_refused_heartbeat_drops_the_handler(api: CallbackApi) {
        let (api, url) = api.start().await;
        struct Dropped(Arc<AtomicUsize>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicUsize::new(0));
        let d = dropped.clone();
        let executor = Executor::new().register_long_running(
            "long",
            Duration::from_millis(150),
            move |_, _: Value| {
                let guard = Dropped(d.clone());
                async move {
                    std::future::pending::<()>().await;
                    drop(guard);
                    Ok(())
                }
            },
        );
        let in_flight = executor.in_flight();
        let app = executor.into_router();
        let headers = [
            ("Asyncd-Lease-Token", "tok-3".to_string()),
            ("Asyncd-Callback-Url", url),
        ];
        let (status, _, _) = call(&app, "POST", &task_body("long", "null"), &headers).await;
        assert_eq!(status, 202);
        wait_until("the handler to be dropped", || {
            dropped.load(Ordering::SeqCst) == 1
        })
        .await;
        tokio::time::timeout(Duration::from_secs(10), in_flight.wait())
            .await
            .unwrap();
        assert_eq!(api.heartbeats().len(), 2);
        assert!(
            api.results().is_empty(),
            "a result was posted for a lost lease or a cancelled task"
        );
    }

    #[test]
    fn outcome_display_and_conversions() {
        assert_eq!(Outcome::retry().to_string(), "retry");
        assert_eq!(
            Outcome::retry_after(Duration::from_secs(90)).to_string(),
            "retry after 1m 30s"
        );
        assert_eq!(Outcome::permanent("").to_string(), "permanent failure");
        let from_io: Outcome = std::io::Error::other("disk").into();
        assert!(matches!(&from_io, Outcome::Error(_)));
        assert_eq!(from_io.to_string(), "disk");
        assert_eq!(Outcome::error("plain text").to_string(), "plain text");
    }
}

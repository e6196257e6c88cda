//! The executor side of the contract (`docs/api.md`, "Executor contract"): an axum
//! [`Router`] — a tower service — that checks the call's signature, decodes the task,
//! runs the handler registered for its type and turns the handler's outcome into the
//! answer asyncd expects. A batch call (`Asyncd-Batch`, "Batch delivery") runs the same
//! per-task path once per task of its body, concurrently, and answers one result per
//! task.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use asyncd_contract::{
    ExecutorAccepted, ExecutorBatchAnswer, ExecutorBatchCall, ExecutorBatchResult,
    ExecutorBatchStatus, ExecutorBatchTask, ExecutorCall, headers,
};
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
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::client::{Client, DEFAULT_ENDPOINT, ResultStatus, TaskResult};
use crate::error::ErrorCode;
use crate::time::{format_duration, retry_after_seconds};
use crate::verifier::{VerifiedBatch, Verifier, VerifyError};
use asyncd_contract::SignatureError;

mod batch;
mod context;
mod long_running;

use batch::{batch_result, serve_batch};
pub use context::{BoxError, Outcome, TaskContext};
use context::{panic_message, panic_text};
use long_running::run_long;

/// Executor call headers ([`asyncd_contract::headers`]).
pub const HEADER_IDEMPOTENCY_KEY: &str = headers::IDEMPOTENCY_KEY;
pub const HEADER_TASK_ID: &str = headers::TASK_ID;
pub const HEADER_ATTEMPT: &str = headers::ATTEMPT;
pub const HEADER_LEASE_TOKEN: &str = headers::LEASE_TOKEN;
pub const HEADER_CALLBACK_URL: &str = headers::CALLBACK_URL;
pub const HEADER_DISPATCHER: &str = headers::DISPATCHER;
pub const HEADER_TIMESTAMP: &str = headers::TIMESTAMP;
pub const HEADER_SIGNATURE: &str = headers::SIGNATURE;
/// Present on a batch call: how many tasks its body holds.
pub const HEADER_BATCH: &str = headers::BATCH;

/// The lease a long-running executor asks for when given none.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// How long a long-running handler has, once its [`TaskContext::cancellation`] is
/// cancelled, to return on its own before its future is dropped, unless
/// [`Executor::cancel_grace`] says otherwise.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(5);

/// How many handlers of one batch call run at once unless
/// [`Executor::batch_concurrency`] says otherwise.
pub const DEFAULT_BATCH_CONCURRENCY: usize = 64;

/// asyncd's own payload limit is 1 MiB by default; this only stops garbage.
const MAX_BODY: usize = 32 << 20;

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
    batch_concurrency: usize,
    cancel_grace: Duration,
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
            batch_concurrency: DEFAULT_BATCH_CONCURRENCY,
            cancel_grace: DEFAULT_CANCEL_GRACE,
            tracker: TaskTracker::new(),
        }
    }

    /// Refuse (401) every call whose `Asyncd-Signature` verifies with none of the
    /// keys given here — the values in the job's signing Secret
    /// (`spec.executor.signing.secretRef`); call it twice while a key is rotated —
    /// whose `Asyncd-Timestamp` is more than [`SIGNATURE_TOLERANCE`] off, or that
    /// repeats a (task, attempt) already delivered within that window. An empty key
    /// is never accepted: with no other key every call is refused. A batch call is
    /// refused as a whole for its signature or timestamp; a repeated (task, attempt)
    /// in it fails that task only (`failed`, the refusal as its error), unrun.
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

    /// How many handlers of one batch call (a job with `executor.batch`) run at once
    /// (default [`DEFAULT_BATCH_CONCURRENCY`]; 0 means the default). The other tasks of
    /// the call wait for a slot; long-running handlers hold one only until they are
    /// accepted.
    pub fn batch_concurrency(mut self, n: usize) -> Self {
        self.batch_concurrency = if n == 0 { DEFAULT_BATCH_CONCURRENCY } else { n };
        self
    }

    /// How long a long-running handler whose [`TaskContext::cancellation`] was
    /// cancelled may take to return on its own before its future is dropped (default
    /// [`DEFAULT_CANCEL_GRACE`]; `Duration::ZERO` drops it at once).
    pub fn cancel_grace(mut self, grace: Duration) -> Self {
        self.cancel_grace = grace;
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
    /// handler's [`TaskContext::cancellation`] is cancelled, the handler has
    /// [`cancel_grace`](Self::cancel_grace) to return, then its future is dropped;
    /// no result is posted either way. `Duration::ZERO` means [`DEFAULT_LEASE`].
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
            batch_concurrency: self.batch_concurrency,
            cancel_grace: self.cancel_grace,
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
    batch_concurrency: usize,
    cancel_grace: Duration,
    tracker: TaskTracker,
}

/// The call body; `id` and `attempt` may be left to the headers.
type Envelope = ExecutorCall<Option<Box<RawValue>>>;

/// A batch call's body; a `null` payload is `None`.
type BatchEnvelope = ExecutorBatchCall<Option<Box<RawValue>>>;

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

/// What a call's headers say about every task it carries: where to send heartbeats
/// and results, and which dispatcher sent it.
struct CallOrigin {
    callback_url: String,
    dispatcher: Option<String>,
}

impl CallOrigin {
    fn of(headers: &HeaderMap, default_callback: &str) -> Self {
        Self {
            callback_url: header_str(headers, HEADER_CALLBACK_URL)
                .unwrap_or(default_callback)
                .trim_end_matches('/')
                .to_string(),
            dispatcher: header_str(headers, HEADER_DISPATCHER).map(str::to_string),
        }
    }
}

/// A single call's task: the body, and the per-task headers.
fn context(headers: &HeaderMap, env: &Envelope, origin: CallOrigin) -> TaskContext {
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
        callback_url: origin.callback_url,
        eta: env.eta,
        dispatcher: origin.dispatcher,
        traceparent: header_str(headers, headers::TRACEPARENT).map(str::to_string),
        tracestate: header_str(headers, headers::TRACESTATE).map(str::to_string),
        cancellation: CancellationToken::new(),
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
    if headers.contains_key(HEADER_BATCH) {
        return serve_batch(shared, headers, body).await;
    }
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
    let origin = CallOrigin::of(&headers, shared.callbacks.endpoint());
    let ctx = context(&headers, &env, origin);
    run_task(shared, ctx, env.payload).await.answer()
}

/// What became of one task, whether it came alone or in a batch: [`Verdict::answer`]
/// makes it a single call's answer, [`Verdict::batch_result`] a batch call's result.
enum Verdict {
    /// No handler for its type: usually a rollout that has not reached this replica
    /// yet, so retried (a single call's 501; a 4xx would dead-letter it).
    Unregistered(String),
    /// The payload does not decode: permanent, since a retry brings the same payload.
    BadPayload(String),
    /// Long-running: accepted with this lease, the handler runs in the background.
    Accepted(Duration),
    /// The handler's outcome.
    Done(Result<Value, Outcome>),
}

impl Verdict {
    fn answer(self) -> Response {
        match self {
            Self::Unregistered(msg) => error_answer(StatusCode::NOT_IMPLEMENTED, msg),
            Self::BadPayload(msg) => error_answer(StatusCode::UNPROCESSABLE_ENTITY, msg),
            Self::Accepted(lease) => {
                let accepted = ExecutorAccepted {
                    lease: Some(format_duration(lease)),
                    lease_seconds: None,
                };
                (StatusCode::ACCEPTED, axum::Json(accepted)).into_response()
            }
            Self::Done(outcome) => outcome_answer(outcome),
        }
    }

    /// The batch result of task `id`: the status a single call's answer stands for
    /// (501 and 5xx `retry`, 503's Retry-After as `retry_after`, 422 `failed`, 202
    /// `accepted` with its lease). A batch result carries no output: asyncd stores
    /// output only from a long-running task's result callback.
    fn batch_result(self, id: String) -> ExecutorBatchResult {
        match self {
            Self::Unregistered(msg) => batch_result(id, ExecutorBatchStatus::Retry, Some(msg)),
            Self::BadPayload(msg) => batch_result(id, ExecutorBatchStatus::Failed, Some(msg)),
            Self::Accepted(lease) => ExecutorBatchResult {
                lease: Some(format_duration(lease)),
                ..batch_result(id, ExecutorBatchStatus::Accepted, None)
            },
            Self::Done(outcome) => {
                let res = result_of(String::new(), outcome);
                let status = match res.status {
                    ResultStatus::Success => ExecutorBatchStatus::Success,
                    ResultStatus::Retry => ExecutorBatchStatus::Retry,
                    ResultStatus::Failed => ExecutorBatchStatus::Failed,
                };
                ExecutorBatchResult {
                    retry_after: res.retry_after.map(format_duration),
                    ..batch_result(id, status, res.error)
                }
            }
        }
    }
}

/// Runs one task, alone or from a batch: the handler registered for its type, within
/// the call, or — long-running — in the background with heartbeats and a result
/// callback. A handler that panics is a failed attempt (`Outcome::Error`).
async fn run_task(
    shared: Arc<Shared>,
    ctx: TaskContext,
    payload: Option<Box<RawValue>>,
) -> Verdict {
    let Some(reg) = shared.handlers.get(&ctx.task_type) else {
        tracing::warn!(
            task = %ctx.id,
            task_type = %ctx.task_type,
            "asyncd: refused an executor call (501): no executor for this task type; asyncd will retry"
        );
        return Verdict::Unregistered(format!("no executor for task type {:?}", ctx.task_type));
    };
    let raw = payload.as_deref().map_or("null", RawValue::get);
    // A handler may panic before its future exists (in the closure's body).
    let starting = std::panic::catch_unwind(AssertUnwindSafe(|| (reg.handler)(ctx.clone(), raw)));
    let fut = match starting {
        Ok(Ok(fut)) => fut,
        Ok(Err(msg)) => {
            tracing::error!(task = %ctx.id, task_type = %ctx.task_type, attempt = ctx.attempt, error = %msg,
                "asyncd: task failed permanently (its payload does not decode); it goes to dead letters");
            return Verdict::BadPayload(msg);
        }
        Err(panic) => {
            let outcome = Err(Outcome::Error(panic_text(panic).into()));
            log_outcome(&ctx, &outcome, Duration::ZERO);
            return Verdict::Done(outcome);
        }
    };
    if let Some(lease) = reg.lease {
        let s = shared.clone();
        shared
            .tracker
            .spawn(async move { run_long(s, ctx, lease, fut).await });
        return Verdict::Accepted(lease);
    }
    // Spawned so that a panic is a failed attempt rather than a dropped connection.
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
    Verdict::Done(outcome)
}

/// Logs, when dropped armed, that asyncd closed the call before the handler returned:
/// the attempt timed out (the job's executor timeout is shorter than the handler). The
/// server drops the answering future when the caller hangs up; the handler runs on,
/// told by its cancelled [`TaskContext::cancellation`] that nobody waits for it.
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
            ctx.cancellation.cancel();
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

/// A handler's outcome as a result (a long-running task's callback, a batch result):
/// success, `retry` (with `retry_after`) or `failed`, as the single call's answer.
fn result_of(lease_token: String, outcome: Result<Value, Outcome>) -> TaskResult {
    let mut res = TaskResult {
        lease_token,
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
    /// timed out, and the handler, which runs on, sees its cancellation token cancelled.
    #[tokio::test]
    async fn a_call_asyncd_gave_up_on_is_logged_as_timed_out() {
        let (logs, _guard) = Logs::capture();
        let observed = Arc::new(tokio::sync::Notify::new());
        let o = observed.clone();
        let app = Executor::new()
            .register("slow", move |ctx: TaskContext, _: Value| {
                let o = o.clone();
                async move {
                    ctx.cancellation.cancelled().await;
                    o.notify_one();
                    Ok(())
                }
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
        tokio::time::timeout(Duration::from_secs(5), observed.notified())
            .await
            .expect("the abandoned handler's token is cancelled");
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
                cancellation: CancellationToken::new(),
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
            // A minute past the bound: the executor reads its own clock later than `now`.
            ("future", signed(b"new", now + 360, "3", &body)),
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
        /// Every call: its path and body.
        calls: Arc<Mutex<Vec<(String, Value)>>>,
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
                    api.calls
                        .lock()
                        .unwrap()
                        .push((uri.path().to_string(), body.clone()));
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

        /// The bodies posted to `path`.
        fn posted_to(&self, path: &str) -> Vec<Value> {
            self.calls
                .lock()
                .unwrap()
                .iter()
                .filter(|(p, _)| p == path)
                .map(|(_, body)| body.clone())
                .collect()
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
        a_refused_heartbeat_stops_the_handler(CallbackApi {
            stale_after: 1,
            ..CallbackApi::default()
        })
        .await;
    }

    /// Issue 15: a task cancelled while it runs is told on its next heartbeat.
    #[tokio::test]
    async fn long_running_cancelled_task_stops_the_handler() {
        a_refused_heartbeat_stops_the_handler(CallbackApi {
            cancelled_after: 1,
            ..CallbackApi::default()
        })
        .await;
    }

    /// After the second heartbeat is refused, the handler's token is cancelled: a
    /// handler watching it returns on its own; one ignoring it is dropped once the
    /// grace has passed, the token cancelled before. Neither posts a result.
    async fn a_refused_heartbeat_stops_the_handler(api: CallbackApi) {
        /// Counts its drops, and those that found the token already cancelled.
        struct Dropped {
            drops: Arc<AtomicUsize>,
            after_cancel: Arc<AtomicUsize>,
            token: CancellationToken,
        }
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.drops.fetch_add(1, Ordering::SeqCst);
                if self.token.is_cancelled() {
                    self.after_cancel.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        for watches_token in [true, false] {
            // A fresh fake each time: clones would share the recorded calls.
            let (api, url) = CallbackApi {
                stale_after: api.stale_after,
                cancelled_after: api.cancelled_after,
                ..CallbackApi::default()
            }
            .start()
            .await;
            let drops = Arc::new(AtomicUsize::new(0));
            let after_cancel = Arc::new(AtomicUsize::new(0));
            let returned = Arc::new(AtomicUsize::new(0));
            let (d, a, r) = (drops.clone(), after_cancel.clone(), returned.clone());
            let executor = Executor::new()
                // Watching: a grace far past the test's deadline, so that only the
                // handler's own return can end it.
                .cancel_grace(if watches_token {
                    Duration::from_secs(60)
                } else {
                    Duration::from_millis(50)
                })
                .register_long_running(
                    "long",
                    Duration::from_millis(150),
                    move |ctx: TaskContext, _: Value| {
                        let guard = Dropped {
                            drops: d.clone(),
                            after_cancel: a.clone(),
                            token: ctx.cancellation.clone(),
                        };
                        let r = r.clone();
                        async move {
                            let _guard = guard;
                            if watches_token {
                                ctx.cancellation.cancelled().await;
                                r.fetch_add(1, Ordering::SeqCst);
                                return Err(Outcome::permanent("cancelled"));
                            }
                            std::future::pending::<()>().await;
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
            tokio::time::timeout(Duration::from_secs(10), in_flight.wait())
                .await
                .expect("the handler is stopped");
            let case = if watches_token {
                "watching"
            } else {
                "ignoring"
            };
            assert_eq!(drops.load(Ordering::SeqCst), 1, "{case}");
            assert_eq!(
                after_cancel.load(Ordering::SeqCst),
                1,
                "{case}: the token is cancelled before the handler ends"
            );
            assert_eq!(
                returned.load(Ordering::SeqCst),
                usize::from(watches_token),
                "{case}: a handler watching its token returns on its own"
            );
            assert_eq!(api.heartbeats().len(), 2, "{case}");
            assert!(
                api.results().is_empty(),
                "{case}: a result was posted for a lost lease or a cancelled task"
            );
        }
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

    // ---- Batch calls ("Batch delivery" in docs/api.md) ----

    fn batch_task(id: &str, task_type: &str, payload: Value) -> Value {
        json!({
            "id": id,
            "type": task_type,
            "payload": payload,
            "attempt": 1,
            "eta": "2026-11-30T06:00:00.123Z",
            "idempotency_key": format!("key-{id}"),
            "lease_token": format!("tok-{id}"),
        })
    }

    fn batch_body(tasks: &[Value]) -> String {
        json!({ "tasks": tasks }).to_string()
    }

    /// POSTs a batch call; the answer must be a 200 with one result per task, in order.
    async fn call_batch(app: &Router, tasks: &[Value], headers: &[(&str, String)]) -> Vec<Value> {
        let mut h = vec![("Asyncd-Batch", tasks.len().to_string())];
        h.extend(headers.iter().cloned());
        let (status, _, body) = call(app, "POST", &batch_body(tasks), &h).await;
        assert_eq!(status, 200, "{body}");
        let answer: ExecutorBatchAnswer =
            serde_json::from_value(body.clone()).expect("the answer is an ExecutorBatchAnswer");
        let ids: Vec<&str> = answer.results.iter().map(|r| r.id.as_str()).collect();
        let want: Vec<&str> = tasks.iter().map(|t| t["id"].as_str().unwrap()).collect();
        assert_eq!(ids, want, "one result per task, in order");
        body["results"].as_array().unwrap().clone()
    }

    /// Every outcome a handler can have, in one batch: each task's result says what a
    /// single call's answer would, a panic fails only its own task, and long-running
    /// tasks heartbeat and post their results each with its own lease token.
    #[tokio::test]
    async fn a_batch_runs_every_task_and_answers_each_outcome() {
        let (api, url) = CallbackApi::default().start().await;
        let seen: Arc<Mutex<Vec<(TaskContext, Value)>>> = Arc::default();
        let s = seen.clone();
        let release = Arc::new(tokio::sync::Notify::new());
        let r = release.clone();
        #[derive(serde::Deserialize)]
        struct Order {
            order_id: u64,
        }
        let executor = Executor::new()
            .callback_endpoint("http://127.0.0.1:1")
            .register("ok", move |ctx, payload: Value| {
                s.lock().unwrap().push((ctx, payload));
                async { Ok(()) }
            })
            .register("typed", |_, o: Order| async move {
                Ok(json!({"cancelled": o.order_id}))
            })
            .register("retry_later", |_, _: Value| async {
                Err::<(), _>(Outcome::retry_after(Duration::from_millis(1500)))
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
            .register("panics_early", |_, _: Value| {
                if true {
                    panic!("before its future");
                }
                async { Ok(()) }
            })
            .register_long_running("long", Duration::from_millis(300), move |_, p: Value| {
                let r = r.clone();
                async move {
                    r.notified().await;
                    if p["fail"] == true {
                        Err(Outcome::permanent("bad input"))
                    } else {
                        Ok(json!({"rows": 3}))
                    }
                }
            });
        let in_flight = executor.in_flight();
        let app = executor.into_router();
        let mut traced = batch_task("t-ok", "ok", json!({"order_id": 42}));
        traced["attempt"] = json!(3);
        traced["traceparent"] = json!("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        traced["tracestate"] = json!("vendor=1");
        let tasks = [
            traced,
            batch_task("t-typed", "typed", json!({"order_id": 7})),
            batch_task("t-later", "retry_later", json!({})),
            batch_task("t-backoff", "retry_backoff", json!({})),
            batch_task("t-permanent", "permanent", json!({})),
            batch_task("t-transient", "transient", json!({})),
            batch_task("t-panics", "panics", json!({})),
            batch_task("t-panics-early", "panics_early", json!({})),
            batch_task("t-bad", "typed", json!({"order_id": "x"})),
            batch_task("t-nobody", "unregistered", json!({})),
            batch_task("t-long-a", "long", json!({})),
            batch_task("t-long-b", "long", json!({"fail": true})),
        ];
        let headers = [
            ("Asyncd-Callback-Url", format!("{url}/")),
            ("Asyncd-Dispatcher", "d-1".to_string()),
        ];
        let results = call_batch(&app, &tasks, &headers).await;
        let bad = results[8]["error"].as_str().unwrap_or("").to_string();
        assert!(bad.starts_with("payload does not decode"), "{bad}");
        let want = [
            json!({"id": "t-ok", "status": "success"}),
            json!({"id": "t-typed", "status": "success"}),
            json!({"id": "t-later", "status": "retry", "error": "retry after 1s 500ms", "retry_after": "1s 500ms"}),
            json!({"id": "t-backoff", "status": "retry", "error": "retry"}),
            json!({"id": "t-permanent", "status": "failed", "error": "card declined"}),
            json!({"id": "t-transient", "status": "retry", "error": "db down"}),
            json!({"id": "t-panics", "status": "retry", "error": "handler panicked: nil map"}),
            json!({"id": "t-panics-early", "status": "retry", "error": "handler panicked: before its future"}),
            json!({"id": "t-bad", "status": "failed", "error": bad}),
            json!({"id": "t-nobody", "status": "retry", "error": "no executor for task type \"unregistered\""}),
            json!({"id": "t-long-a", "status": "accepted", "lease": "300ms"}),
            json!({"id": "t-long-b", "status": "accepted", "lease": "300ms"}),
        ];
        for (got, want) in results.iter().zip(want) {
            assert_eq!(got, &want);
        }

        // The handler got the per-task context a single call gives it.
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].1, json!({"order_id": 42}));
        assert_eq!(
            seen[0].0,
            TaskContext {
                id: "t-ok".into(),
                task_type: "ok".into(),
                attempt: 3,
                idempotency_key: "key-t-ok".into(),
                lease_token: "tok-t-ok".into(),
                callback_url: url.clone(),
                eta: Some("2026-11-30T06:00:00.123Z".parse().unwrap()),
                dispatcher: Some("d-1".into()),
                traceparent: Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into()),
                tracestate: Some("vendor=1".into()),
                cancellation: CancellationToken::new(),
            }
        );

        // Each long-running task keeps its own lease and posts its own result.
        assert_eq!(in_flight.len(), 2);
        for id in ["t-long-a", "t-long-b"] {
            let path = format!("/v1/tasks/{id}/heartbeat");
            wait_until("two heartbeats of each", || api.posted_to(&path).len() >= 2).await;
            assert_eq!(
                api.posted_to(&path)[0],
                json!({"lease_token": format!("tok-{id}"), "lease": "300ms"})
            );
        }
        assert!(
            api.results().is_empty(),
            "a result before the handlers ended"
        );
        release.notify_waiters();
        tokio::time::timeout(Duration::from_secs(10), in_flight.wait())
            .await
            .expect("the long-running handlers finish");
        assert_eq!(
            api.posted_to("/v1/tasks/t-long-a/result"),
            vec![
                json!({"lease_token": "tok-t-long-a", "status": "success", "output": {"rows": 3}})
            ]
        );
        assert_eq!(
            api.posted_to("/v1/tasks/t-long-b/result"),
            vec![json!({"lease_token": "tok-t-long-b", "status": "failed", "error": "bad input"})]
        );
    }

    /// The handlers of one batch run concurrently, at most `batch_concurrency` at once.
    #[tokio::test]
    async fn batch_handlers_run_concurrently_within_the_bound() {
        const BOUND: usize = 3;
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        // Each handler waits for BOUND of them to be running: run one at a time, the
        // batch would never end.
        let barrier = Arc::new(tokio::sync::Barrier::new(BOUND));
        let (r, m, b) = (running.clone(), most.clone(), barrier.clone());
        let app = Executor::new()
            .batch_concurrency(BOUND)
            .register("meet", move |_, _: Value| {
                let (r, m, b) = (r.clone(), m.clone(), b.clone());
                async move {
                    let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                    m.fetch_max(now, Ordering::SeqCst);
                    b.wait().await;
                    r.fetch_sub(1, Ordering::SeqCst);
                    Ok(())
                }
            })
            .into_router();
        let tasks: Vec<Value> = (0..2 * BOUND)
            .map(|i| batch_task(&format!("t{i}"), "meet", Value::Null))
            .collect();
        let results = tokio::time::timeout(Duration::from_secs(10), call_batch(&app, &tasks, &[]))
            .await
            .expect("the handlers of a batch run concurrently");
        assert!(
            results.iter().all(|r| r["status"] == "success"),
            "{results:?}"
        );
        assert_eq!(
            most.load(Ordering::SeqCst),
            BOUND,
            "at most {BOUND} at once"
        );
    }

    /// A batch call is signed over the body with the per-task header values empty; a
    /// (task, attempt) already delivered — alone or in a batch — fails in the batch
    /// with the single call's refusal, without running, while the rest of it runs.
    #[tokio::test]
    async fn a_replayed_task_of_a_batch_fails_without_running() {
        let ran: Arc<Mutex<Vec<String>>> = Arc::default();
        let r = ran.clone();
        let app = Executor::new()
            .signing_secret("k")
            .register("ok", move |ctx, _: Value| {
                r.lock().unwrap().push(ctx.id);
                async { Ok(()) }
            })
            .into_router();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let batch_headers = |key: &[u8], ts: i64, body: &str| {
            let mut map = HeaderMap::new();
            map.insert("Asyncd-Timestamp", ts.to_string().parse().unwrap());
            map.insert("Asyncd-Callback-Url", "http://asyncd:7700".parse().unwrap());
            let sig = sign(&[key], &crate::signed_batch_call(&map, body.as_bytes())).unwrap();
            vec![
                ("Asyncd-Timestamp", ts.to_string()),
                ("Asyncd-Callback-Url", "http://asyncd:7700".to_string()),
                ("Asyncd-Signature", sig),
            ]
        };

        // t1 (attempt 1, tok-t1) comes alone first.
        let single = r#"{"id":"t1","type":"ok","payload":null,"attempt":1}"#;
        let mut map = HeaderMap::new();
        for (k, v) in [
            ("Asyncd-Timestamp", now.to_string()),
            ("Asyncd-Task-Id", "t1".into()),
            ("Asyncd-Attempt", "1".into()),
            ("Idempotency-Key", "key-t1".into()),
            ("Asyncd-Lease-Token", "tok-t1".into()),
        ] {
            map.insert(k, v.parse().unwrap());
        }
        let mut single_headers: Vec<(&str, String)> = map
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap().to_string()))
            .collect();
        single_headers.push((
            "Asyncd-Signature",
            sign(&[b"k"], &crate::signed_call(&map, single.as_bytes())).unwrap(),
        ));
        let (status, _, body) = call(&app, "POST", single, &single_headers).await;
        assert_eq!(status, 200, "{body}");

        let tasks = [
            batch_task("t1", "ok", Value::Null),
            batch_task("t2", "ok", Value::Null),
        ];
        let both = batch_body(&tasks);
        let replayed = "bad signature: this task attempt was already delivered";
        let results = call_batch(&app, &tasks, &batch_headers(b"k", now, &both)).await;
        assert_eq!(
            results,
            vec![
                json!({"id": "t1", "status": "failed", "error": replayed}),
                json!({"id": "t2", "status": "success"}),
            ]
        );
        assert_eq!(*ran.lock().unwrap(), vec!["t1", "t2"], "t1 ran once, alone");

        // The same batch again, signed anew: both tasks were delivered.
        let results = call_batch(&app, &tasks, &batch_headers(b"k", now + 1, &both)).await;
        assert!(
            results
                .iter()
                .all(|r| r["status"] == "failed" && r["error"] == replayed),
            "{results:?}"
        );
        // And t2, delivered in a batch, alone: the single call's 401.
        let mut map = map.clone();
        map.insert("Asyncd-Task-Id", "t2".parse().unwrap());
        map.insert("Asyncd-Lease-Token", "tok-t2".parse().unwrap());
        let t2 = r#"{"id":"t2","type":"ok","payload":null,"attempt":1}"#;
        let mut t2_headers: Vec<(&str, String)> = map
            .iter()
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap().to_string()))
            .collect();
        t2_headers.push((
            "Asyncd-Signature",
            sign(&[b"k"], &crate::signed_call(&map, t2.as_bytes())).unwrap(),
        ));
        let (status, _, body) = call(&app, "POST", t2, &t2_headers).await;
        assert_eq!((status, body), (401, json!({"error": replayed})));

        // A batch whose signature fails is refused whole, before anything runs.
        let fresh = [batch_task("t3", "ok", Value::Null)];
        let fresh_body = batch_body(&fresh);
        let cases = [
            ("unsigned", vec![("Asyncd-Timestamp", now.to_string())]),
            ("other key", batch_headers(b"other", now, &fresh_body)),
            ("stale", batch_headers(b"k", now - 301, &fresh_body)),
            ("signed as another body", batch_headers(b"k", now, &both)),
        ];
        for (name, mut headers) in cases {
            headers.push(("Asyncd-Batch", "1".to_string()));
            let (status, _, resp) = call(&app, "POST", &fresh_body, &headers).await;
            assert_eq!(status, 401, "{name}: {resp}");
        }
        assert_eq!(ran.lock().unwrap().len(), 2, "no refused task ran");
        // Once signed, t3 runs: the refusals were not remembered as deliveries.
        let results = call_batch(&app, &fresh, &batch_headers(b"k", now, &fresh_body)).await;
        assert_eq!(results, vec![json!({"id": "t3", "status": "success"})]);
    }

    /// A batch body that is not the contract's is refused (400), permanently; nothing runs.
    #[tokio::test]
    async fn a_malformed_batch_is_refused() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let app = Executor::new()
            .register("ok", move |_, _: Value| {
                c.fetch_add(1, Ordering::SeqCst);
                async { Ok(()) }
            })
            .into_router();
        let mut no_lease = batch_task("t1", "ok", Value::Null);
        no_lease.as_object_mut().unwrap().remove("lease_token");
        let bodies = [
            "not json".to_string(),
            "[]".to_string(),
            r#"{"tasks":"x"}"#.to_string(),
            r#"{"tasks":[]}"#.to_string(),
            batch_body(&[batch_task("", "ok", Value::Null)]),
            batch_body(&[batch_task("t1", "", Value::Null)]),
            batch_body(&[batch_task("t1", "ok", Value::Null), no_lease]),
            // A single call's body, sent as a batch.
            task_body("ok", "{}"),
        ];
        for body in bodies {
            let (status, _, resp) =
                call(&app, "POST", &body, &[("Asyncd-Batch", "1".to_string())]).await;
            assert_eq!(status, 400, "{body}: {resp}");
            assert!(
                resp["error"]
                    .as_str()
                    .unwrap()
                    .starts_with("body is not an asyncd batch call"),
                "{resp}"
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 0);
    }

    fn fixture(name: &str) -> Value {
        let path = format!(
            "{}/../../contract/fixtures/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    }

    /// The contract's batch call (`executor_batch_call.json`) decodes into the tasks'
    /// contexts, and the answer has the shape of `executor_batch_answer.json`.
    #[tokio::test]
    async fn the_contract_batch_call_and_answer() {
        let call_fixture = fixture("executor_batch_call");
        let answer_fixture = fixture("executor_batch_answer");
        let seen: Arc<Mutex<Vec<(TaskContext, Value)>>> = Arc::default();
        let s = seen.clone();
        let app = Executor::new()
            .register("send_email", move |ctx: TaskContext, payload: Value| {
                let attempt = ctx.attempt;
                s.lock().unwrap().push((ctx, payload));
                async move {
                    match attempt {
                        1 => Ok(()),
                        _ => Err(Outcome::retry_after(Duration::from_secs(30))),
                    }
                }
            })
            .into_router();
        let tasks = call_fixture["tasks"].as_array().unwrap().clone();
        let headers = [("Asyncd-Callback-Url", "http://10.0.0.7:7700".to_string())];
        let results = call_batch(&app, &tasks, &headers).await;

        // The same answer but for the error text, which for a retry is the Outcome's.
        let mut want = answer_fixture.clone();
        want["results"][1]["error"] = json!("retry after 30s");
        assert_eq!(json!({ "results": results }), want);
        let decoded: ExecutorBatchAnswer = serde_json::from_value(answer_fixture).unwrap();
        assert_eq!(decoded.results[1].retry_after.as_deref(), Some("30s"));

        let mut seen = seen.lock().unwrap().clone();
        seen.sort_by_key(|(ctx, _)| ctx.attempt);
        assert_eq!(seen.len(), 2);
        for ((ctx, payload), task) in seen.iter().zip(&tasks) {
            assert_eq!(ctx.id, task["id"].as_str().unwrap());
            assert_eq!(ctx.task_type, "send_email");
            assert_eq!(u64::from(ctx.attempt), task["attempt"].as_u64().unwrap());
            assert_eq!(
                ctx.idempotency_key,
                task["idempotency_key"].as_str().unwrap()
            );
            assert_eq!(ctx.lease_token, task["lease_token"].as_str().unwrap());
            assert_eq!(ctx.callback_url, "http://10.0.0.7:7700");
            assert_eq!(
                ctx.eta.map(crate::format_time).as_deref(),
                task["eta"].as_str()
            );
            assert_eq!(ctx.traceparent.as_deref(), task["traceparent"].as_str());
            assert_eq!(ctx.tracestate, None);
            assert_eq!(payload, &task["payload"]);
        }
        assert!(
            seen[1].0.traceparent.is_some(),
            "the fixture's second task is traced"
        );
    }
}

//! The HTTP API (docs/api.md): submit, inspect, cancel, dead letters, the executor
//! callbacks (heartbeat, result), and the operational endpoints.

mod bulk;
pub mod console;
pub mod error;
pub mod group_commit;
mod kafka_dead_letters;
pub mod submit;
mod workflow;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use asyncd_contract::{
    BatchItemResult, BatchOutcome, BatchResponse, CRON_FIRINGS, CancelResult, CronOverlap,
    CronOverview, CronTriggerResult, ErrorCode, FinishedCounts, HeartbeatRequest,
    HeartbeatResponse, JobList, JobOverview, JobStats, JobStatus, MAX_JOB_COUNT, MAX_LISTING_BYTES,
    RedriveResult, ResultAck, ResultRequest, ResultStatus, Route, SubmitResult, TaskStatus,
    headers,
};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use crate::auth::{Auth, Caller, Verb};
use crate::clock::{SharedClock, from_millis};
use crate::dispatcher::ClaimerWakeup;
use crate::executor::AttemptOutcome;
use crate::metrics::Metrics;
use crate::retry;
use crate::routing::Routes;
use crate::store::{
    CancelOutcome, DeadLetterParams, Finish, FinishKind, InsertOutcome, JobCountParams, Millis,
    NewTask, RedriveOutcome, SearchParams, Store, TaskRecord, TaskState, WorkflowOutcome,
};
use crate::trace::{Span, SpanKind, TraceContext, Tracer, Value};
use error::ApiError;
use submit::Limits;

pub use asyncd_contract::MAX_BATCH;

pub struct ApiState {
    pub store: Arc<dyn Store>,
    /// Where a submit of one store-routed task is written: with the others arriving
    /// meanwhile, in one transaction (`group_commit`).
    pub inserts: group_commit::GroupCommit,
    pub routes: Routes,
    pub metrics: Arc<Metrics>,
    pub clock: SharedClock,
    /// Present when a dispatcher runs in this process, to claim near-due tasks at once.
    pub waker: Option<ClaimerWakeup>,
    pub lookahead_ms: i64,
    pub limits: Limits,
    /// The Kafka path, when brokers are configured.
    pub kafka: Option<crate::kafka::Producer>,
    /// A dispatcher in this process: its clock's offset from the store's.
    pub clock_check: Option<Arc<crate::clock_check::ClockCheck>>,
    /// A dispatcher in this process: the jobs it cannot sign calls for.
    pub signing_status: Option<Arc<crate::signing::SigningStatus>>,
    /// Who may call the public endpoints (docs/security.md).
    pub auth: Auth,
    /// Where the `submit` spans go ([`crate::trace`]).
    pub tracer: Tracer,
}

impl axum::extract::FromRequestParts<Arc<ApiState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, ApiError> {
        Ok(state.auth.authenticate(&parts.headers).await?)
    }
}

type AppState = State<Arc<ApiState>>;

/// The endpoints of a role: `public` (the API role, and `dev`) adds submit, inspect,
/// cancel, dead letters and jobs, which need a credential, and the web console at `/ui`
/// (which asks the browser's user for one); every role serves the executor
/// callbacks (authenticated by their lease token), `/metrics` and the health endpoints.
pub fn router(state: Arc<ApiState>, public: bool) -> Router {
    // Enforced while the body is read: a body over its limit is refused as soon as the
    // limit is passed, never buffered whole first.
    let body_limit = state.limits.body_bytes();
    let batch_limit = state.limits.batch_body_bytes();
    let mut router = Router::new();
    if public {
        router = router
            .route(
                "/v1/tasks",
                post(submit_one)
                    .get(search_tasks)
                    .delete(cancel_by_unique_key),
            )
            // The route's own limit replaces the router-wide one below.
            .route(
                "/v1/tasks:batch",
                post(submit_batch).layer(DefaultBodyLimit::max(batch_limit)),
            )
            .route("/v1/tasks/{id}", get(get_task).delete(cancel_task))
            .route("/v1/dead-letters", get(dead_letters))
            .route("/v1/dead-letters/redrive", post(bulk::redrive_matching))
            .route("/v1/dead-letters/purge", post(bulk::purge_matching))
            .route("/v1/dead-letters/{id}/redrive", post(redrive))
            .route("/v1/kafka-dead-letters", get(kafka_dead_letters::list))
            .route(
                "/v1/kafka-dead-letters/purge",
                post(kafka_dead_letters::purge),
            )
            .route("/v1/jobs", get(list_jobs))
            .route("/v1/jobs/{name}", get(get_job))
            .route("/v1/jobs/{name}/pause", post(pause_job))
            .route("/v1/jobs/{name}/resume", post(resume_job))
            .route("/v1/jobs/{name}/cron/{entry}/trigger", post(trigger_cron))
            .merge(console::routes());
    }
    router
        .route("/v1/tasks/{id}/heartbeat", post(heartbeat))
        .route("/v1/tasks/{id}/result", post(post_result))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route("/v1/openapi.json", get(openapi))
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such endpoint") })
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// The body, or why it could not be read; `limit` is the endpoint's body limit, which
/// the router enforced while reading.
fn body_bytes(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("the request body is over this endpoint's limit of {limit} bytes"),
            )
        } else {
            ApiError::new(ErrorCode::MalformedJson, rejection.body_text())
                .with_status(rejection.status())
        }
    })
}

fn source_header(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(headers::SOURCE_SERVICE)
        .and_then(|v| v.to_str().ok())
}

type Answer = Result<(StatusCode, SubmitResult), ApiError>;

fn submitted(id: String, trigger_at: Millis, route: Route, duplicate: bool) -> SubmitResult {
    SubmitResult {
        id,
        eta: from_millis(trigger_at),
        route,
        duplicate,
    }
}

/// One submit result as both endpoints answer it.
fn accepted(outcome: InsertOutcome) -> Answer {
    match outcome {
        InsertOutcome::Inserted { id, trigger_at } => Ok((
            StatusCode::CREATED,
            submitted(id, trigger_at, Route::Store, false),
        )),
        InsertOutcome::Duplicate { id, trigger_at } => Ok((
            StatusCode::OK,
            submitted(id, trigger_at, Route::Store, true),
        )),
        InsertOutcome::UniqueConflict { existing_id } => Err(ApiError::new(
            ErrorCode::UniqueConflict,
            format!(
                "unique_key: task {existing_id} holds this key (unfinished, or succeeded \
                 within its job's retention.uniqueKeys)"
            ),
        )
        .with_field("unique_key")
        .with_existing_id(existing_id)),
        InsertOutcome::IdempotencyMismatch { existing_id } => Err(ApiError::new(
            ErrorCode::IdempotencyMismatch,
            format!(
                "idempotency_key: task {existing_id} was submitted with this key and another \
                 type or payload; use a new key for a new request"
            ),
        )
        .with_field("idempotency_key")
        .with_existing_id(existing_id)),
        InsertOutcome::UnknownDependency { id } => {
            Err(ApiError::field("depends_on", format!("no task {id}")))
        }
    }
}

impl ApiState {
    /// The AsyncJobConfig that declares `task_type`, which is what access is granted on;
    /// `None` when no job declares it (any more), which only a caller allowed on every
    /// job may then act on.
    fn job_name(&self, task_type: &str) -> Option<String> {
        self.routes
            .borrow()
            .job(task_type)
            .map(|job| job.name.clone())
    }

    /// 403 unless `caller` may submit `task_type`. An undeclared type is left for
    /// validation to refuse (`unknown_task_type`): there is nothing to protect.
    async fn may_submit(
        &self,
        caller: &Caller,
        routes: &crate::routing::RouteTable,
        task_type: &str,
    ) -> Result<(), ApiError> {
        match routes.job(task_type) {
            Some(job) => Ok(self
                .auth
                .require(caller, Verb::Submit, Some(&job.name))
                .await?),
            None => Ok(()),
        }
    }

    /// The task `id` when `caller` may do `verb` on it. A caller who may not even read
    /// the task's job is answered exactly as for an unknown id, so nobody learns which
    /// tasks exist in jobs they cannot see; one who may read it but not do `verb` gets 403.
    async fn visible_task(
        &self,
        caller: &Caller,
        id: &str,
        verb: Verb,
    ) -> Result<TaskRecord, ApiError> {
        let task = self
            .store
            .get(id)
            .await?
            .ok_or_else(|| ApiError::not_found(id))?;
        let job = self.job_name(&task.task_type);
        if self.auth.allows(caller, verb, job.as_deref()).await? {
            return Ok(task);
        }
        if verb != Verb::Get && self.auth.allows(caller, Verb::Get, job.as_deref()).await? {
            return Err(crate::auth::forbidden(verb, job.as_deref()).into());
        }
        tracing::info!(
            caller = caller.name(),
            ?verb,
            id,
            "task hidden from a caller who may not read it"
        );
        Err(ApiError::not_found(id))
    }

    /// The store route for tasks Kafka did not acknowledge in time, under the ids they
    /// were produced with: a produce that lands after all then reaches the consumer as a
    /// second copy of a stored id, which its insert drops (a duplicate, not an error), so
    /// the task exists and runs once either way. Only if the store fails too is the task
    /// refused.
    async fn store_unacknowledged(
        &self,
        tasks: &[NewTask],
        unacknowledged: &[usize],
        answers: &mut [Option<Answer>],
        now: Millis,
    ) {
        let fallback: Vec<NewTask> = unacknowledged.iter().map(|&i| tasks[i].clone()).collect();
        match self.store.insert(&fallback, now).await {
            Ok(outcomes) => {
                for (&i, outcome) in unacknowledged.iter().zip(outcomes) {
                    let task = &tasks[i];
                    self.metrics
                        .kafka_fallback
                        .with_label_values(&[task.task_type.as_str()])
                        .inc();
                    answers[i] = Some(match outcome {
                        // Without an idempotency key the id is new to the world: a row
                        // already under it is this task's own produce, consumed first.
                        InsertOutcome::Duplicate { id, trigger_at }
                            if task.idempotency_key.is_none() =>
                        {
                            Ok((
                                StatusCode::CREATED,
                                submitted(id, trigger_at, Route::Kafka, false),
                            ))
                        }
                        other => accepted(other),
                    });
                }
            }
            Err(err) => {
                tracing::error!(%err, "storing tasks Kafka did not acknowledge");
                for &i in unacknowledged {
                    answers[i] = Some(Err(ApiError::new(
                        ErrorCode::KafkaUnavailable,
                        "the task was not accepted: Kafka did not acknowledge it in time and \
                         the store did not answer either; retry",
                    )));
                }
            }
        }
    }

    /// Stores or produces each task, one answer per task in order. Only a store failure
    /// fails the whole call; a task Kafka did not acknowledge is stored instead, and
    /// refused only when that fails too.
    async fn accept(&self, tasks: &[NewTask], now: Millis) -> Result<Vec<Answer>, ApiError> {
        let routes = self.routes.borrow().clone();
        let topics: Vec<Option<Cow<str>>> = tasks
            .iter()
            .map(|task| {
                let producer = self.kafka.as_ref()?;
                producer.topic_for(task, routes.job(&task.task_type)?, now)
            })
            .collect();
        let mut answers: Vec<Option<Answer>> =
            std::iter::repeat_with(|| None).take(tasks.len()).collect();

        let stored: Vec<NewTask> = tasks
            .iter()
            .zip(&topics)
            .filter(|(_, topic)| topic.is_none())
            .map(|(task, _)| task.clone())
            .collect();
        // Kafka-route tasks alone must not need the store. One task shares a
        // transaction with the other single submits of the moment; a batch is one already.
        let mut outcomes = match stored.len() {
            0 => Vec::new(),
            1 => self.inserts.insert(stored, now).await?,
            _ => self.store.insert(&stored, now).await?,
        }
        .into_iter();
        let mut produced = Vec::new();
        for (i, topic) in topics.iter().enumerate() {
            match topic {
                None => answers[i] = Some(accepted(outcomes.next().expect("one outcome per task"))),
                Some(topic) => produced.push((i, &**topic)),
            }
        }
        if let Some(producer) = &self.kafka {
            let sends = produced.iter().map(|&(i, topic)| async move {
                let task = &tasks[i];
                // A repeat of a key the store already holds answers with the first task
                // (or 409 when the key's task has another type or payload). With the
                // store away the task is produced all the same: its id comes from its
                // key, so a repeat names the same task and the consumer keeps one copy
                // (the answer then says 201, not which copy came first).
                if task.idempotency_key.is_some() {
                    match self.store.find_idempotent(task).await {
                        Ok(Some(outcome)) => {
                            return Ok::<_, ApiError>((i, Some(accepted(outcome))));
                        }
                        Ok(None) => {}
                        Err(err) if err.is_unavailable() => {
                            tracing::debug!(%err, "store unavailable; producing without the idempotency lookup");
                        }
                        Err(err) => return Err(err.into()),
                    }
                }
                match producer.send(topic, task).await {
                    Ok(()) => Ok((i, Some(Ok((
                        StatusCode::CREATED,
                        submitted(task.id.clone(), task.trigger_at, Route::Kafka, false),
                    ))))),
                    Err(err) => {
                        tracing::warn!(%err, %topic, id = %task.id, "produce failed; storing the task instead");
                        Ok((i, None))
                    }
                }
            });
            let mut unacknowledged = Vec::new();
            for result in futures::future::join_all(sends).await {
                match result? {
                    (i, Some(answer)) => answers[i] = Some(answer),
                    (i, None) => unacknowledged.push(i),
                }
            }
            if !unacknowledged.is_empty() {
                producer.pause(self.clock.now_millis());
                self.store_unacknowledged(tasks, &unacknowledged, &mut answers, now)
                    .await;
            }
        }

        let answers: Vec<Answer> = answers
            .into_iter()
            .map(|a| a.expect("every task answered"))
            .collect();
        self.count_and_wake(tasks, &answers, now);
        Ok(answers)
    }

    /// Counts the tasks newly accepted and wakes the claimer if one is due soon.
    fn count_and_wake(&self, tasks: &[NewTask], answers: &[Answer], now: Millis) {
        let horizon = now + Duration::from_millis(self.lookahead_ms as u64);
        let mut wake = false;
        for (task, answer) in tasks.iter().zip(answers) {
            if let Ok((StatusCode::CREATED, _)) = answer {
                self.metrics
                    .submitted
                    .with_label_values(&[
                        task.task_type.as_str(),
                        self.metrics
                            .source_label(task.source_service.as_deref().unwrap_or("")),
                    ])
                    .inc();
                wake |= task.trigger_at <= horizon;
            }
        }
        if wake && let Some(waker) = &self.waker {
            waker.wake();
        }
    }
}

/// The trace a submit continues: the caller's `traceparent`, and with an exporter the
/// `submit` span under it, which the stored trace then names as its parent.
struct SubmitTrace {
    span: Option<Span>,
    stored: Option<TraceContext>,
}

impl SubmitTrace {
    /// A malformed or repeated `traceparent` is ignored, as the W3C Trace Context spec
    /// asks of a receiver: the submit goes on untraced, never refused for it.
    fn start(tracer: &Tracer, headers: &HeaderMap) -> Self {
        let mut parents = headers.get_all(headers::TRACEPARENT).iter();
        let caller = match (parents.next(), parents.next()) {
            (Some(parent), None) => parent.to_str().ok().and_then(|parent| {
                // Several `tracestate` headers are one list, joined by commas.
                let states: Option<Vec<&str>> = headers
                    .get_all(headers::TRACESTATE)
                    .iter()
                    .map(|v| v.to_str().ok())
                    .collect();
                let state = states.filter(|s| !s.is_empty()).map(|s| s.join(","));
                TraceContext::parse(parent, state.as_deref())
            }),
            _ => None,
        };
        let span = caller
            .as_ref()
            .and_then(|caller| tracer.start(caller, "submit", SpanKind::Server));
        let stored = span.as_ref().map(|s| s.context.clone()).or(caller);
        Self { span, stored }
    }

    fn attr(&mut self, key: &'static str, value: Value) {
        if let Some(span) = &mut self.span {
            span.attr(key, value);
        }
    }

    fn end(self, tracer: &Tracer, status: StatusCode) {
        if let Some(mut span) = self.span {
            span.attr(
                "http.response.status_code",
                Value::Int(i64::from(status.as_u16())),
            );
            let error =
                (status.is_client_error() || status.is_server_error()).then(|| status.to_string());
            tracer.end(span, error);
        }
    }
}

fn status_of(result: &Result<Response, ApiError>) -> StatusCode {
    match result {
        Ok(response) => response.status(),
        Err(err) => err.status,
    }
}

async fn submit_one(
    State(state): AppState,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let mut trace = SubmitTrace::start(&state.tracer, &headers);
    let result = accept_one(&state, &caller, &headers, body, &mut trace).await;
    trace.end(&state.tracer, status_of(&result));
    result
}

async fn accept_one(
    state: &ApiState,
    caller: &Caller,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    trace: &mut SubmitTrace,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let body = body_bytes(body, state.limits.body_bytes())?;
    let request = submit::parse(&body)?;
    let now = state.clock.now_millis();
    let routes = state.routes.borrow().clone();
    state
        .may_submit(caller, &routes, &request.task_type)
        .await?;
    let mut task = submit::validate(request, &routes, &state.limits, now, source_header(headers))?;
    task.trace = trace.stored.clone();
    trace.attr("asyncd.task.id", Value::Str(task.id.clone()));
    trace.attr("asyncd.task.type", Value::Str(task.task_type.clone()));
    let task_type = task.task_type.clone();
    let answer = state
        .accept(std::slice::from_ref(&task), now)
        .await?
        .pop()
        .expect("one answer per task");
    state
        .metrics
        .submit_latency
        .with_label_values(&[task_type.as_str()])
        .observe(started.elapsed().as_secs_f64());
    let (status, body) = answer?;
    Ok((status, Json(body)).into_response())
}

async fn submit_batch(
    State(state): AppState,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let mut trace = SubmitTrace::start(&state.tracer, &headers);
    let result = accept_batch(&state, &caller, &headers, body, &mut trace).await;
    trace.end(&state.tracer, status_of(&result));
    result
}

/// Every task of a batch joins the batch request's trace.
async fn accept_batch(
    state: &ApiState,
    caller: &Caller,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    trace: &mut SubmitTrace,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let body = body_bytes(body, state.limits.batch_body_bytes())?;
    // Items are parsed one by one below, so that each is refused on its own.
    let items = submit::parse_batch(&body)?;
    trace.attr("asyncd.batch.size", Value::Int(items.len() as i64));
    let now = state.clock.now_millis();
    let routes = state.routes.borrow().clone();
    let source = source_header(headers);
    let mut checked: Vec<Result<NewTask, ApiError>> = Vec::with_capacity(items.len());
    let mut refs = Vec::with_capacity(items.len());
    for raw in &items {
        let item = match submit::parse(raw.get().as_bytes()) {
            Ok(mut req) => {
                refs.push(workflow::Refs::take(&mut req));
                match state.may_submit(caller, &routes, &req.task_type).await {
                    Ok(()) => submit::validate(req, &routes, &state.limits, now, source).map(
                        |mut task| {
                            task.trace = trace.stored.clone();
                            task
                        },
                    ),
                    Err(err) => Err(err),
                }
            }
            Err(err) => {
                refs.push(workflow::Refs::default());
                Err(err)
            }
        };
        checked.push(item);
    }
    if workflow::is_workflow(&refs) {
        let results = submit_workflow(state, checked, &refs, now).await?;
        return Ok(Json(BatchResponse { results }).into_response());
    }
    let valid: Vec<NewTask> = checked
        .iter()
        .filter_map(|c| c.as_ref().ok().cloned())
        .collect();
    let mut answers = state.accept(&valid, now).await?.into_iter();
    let results = checked
        .into_iter()
        .map(|item| {
            let answer = item.and_then(|_| answers.next().expect("one answer per valid task"));
            match answer {
                Ok((status, result)) => BatchItemResult {
                    status: status.as_u16(),
                    outcome: BatchOutcome::Accepted(result),
                },
                Err(err) => BatchItemResult {
                    status: err.status.as_u16(),
                    outcome: BatchOutcome::Refused(err.body()),
                },
            }
        })
        .collect();
    for task in &valid {
        state
            .metrics
            .submit_latency
            .with_label_values(&[task.task_type.as_str()])
            .observe(started.elapsed().as_secs_f64());
    }
    Ok(Json(BatchResponse { results }).into_response())
}

/// A batch that is a workflow (`api::workflow`): every item valid, refs resolved, the
/// tasks stored parents first in one transaction — or one refusal for the whole batch.
async fn submit_workflow(
    state: &ApiState,
    checked: Vec<Result<NewTask, ApiError>>,
    refs: &[workflow::Refs],
    now: Millis,
) -> Result<Vec<BatchItemResult>, ApiError> {
    let mut tasks = Vec::with_capacity(checked.len());
    for (i, item) in checked.into_iter().enumerate() {
        tasks.push(item.map_err(|err| workflow::in_item(i, err))?);
    }
    let own_dependencies: Vec<usize> = tasks.iter().map(|t| t.depends_on.len()).collect();
    let (ordered, parents) = workflow::order(refs, &own_dependencies)?;
    for (child, mine) in parents.iter().enumerate() {
        let ids: Vec<String> = mine.iter().map(|&p| tasks[p].id.clone()).collect();
        tasks[child].depends_on.extend(ids);
    }
    let in_order: Vec<NewTask> = ordered.iter().map(|&i| tasks[i].clone()).collect();
    let outcomes = match state.store.insert_workflow(&in_order, now).await? {
        WorkflowOutcome::Stored(outcomes) => outcomes,
        WorkflowOutcome::Refused { index, outcome } => {
            let err = accepted(outcome).expect_err("a refused outcome");
            return Err(workflow::in_item(ordered[index], err));
        }
    };
    let mut answers: Vec<Option<Answer>> =
        std::iter::repeat_with(|| None).take(tasks.len()).collect();
    for (&i, outcome) in ordered.iter().zip(outcomes) {
        answers[i] = Some(accepted(outcome));
    }
    let answers: Vec<Answer> = answers
        .into_iter()
        .map(|a| a.expect("every task answered"))
        .collect();
    state.count_and_wake(&tasks, &answers, now);
    Ok(answers
        .into_iter()
        .map(|answer| match answer {
            Ok((status, result)) => BatchItemResult {
                status: status.as_u16(),
                outcome: BatchOutcome::Accepted(result),
            },
            Err(err) => BatchItemResult {
                status: err.status.as_u16(),
                outcome: BatchOutcome::Refused(err.body()),
            },
        })
        .collect())
}

fn raw_or_null(raw: &RawValue) -> serde_json::Value {
    serde_json::from_str(raw.get()).unwrap_or(serde_json::Value::Null)
}

pub fn task_status(task: &TaskRecord) -> TaskStatus {
    TaskStatus {
        id: task.id.clone(),
        task_type: task.task_type.clone(),
        payload: raw_or_null(&task.payload),
        state: task.state,
        priority: task.priority,
        eta: from_millis(task.trigger_at),
        attempt: task.attempt,
        max_retries: task.max_retries,
        idempotency_key: task.idempotency_key.clone(),
        unique_key: task.unique_key.clone(),
        depends_on: task.depends_on.clone(),
        last_error: task.last_error.clone(),
        result: task.result.as_deref().map(raw_or_null),
        lease_until: task.lease_until.map(from_millis),
        created_at: from_millis(task.created_at),
        updated_at: from_millis(task.updated_at),
    }
}

async fn get_task(
    State(state): AppState,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let task = state.visible_task(&caller, &id, Verb::Get).await?;
    Ok(Json(task_status(&task)).into_response())
}

/// `DELETE /v1/tasks/{id}`: cancels a task that has not finished. With `?job=` (or
/// `?type=`) naming a Kafka-routed job, an id not in the store yet — its message still
/// waits in the topic — is recorded as cancelled, so the consumer's insert drops it.
async fn cancel_task(
    State(state): AppState,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let now = state.clock.now_millis();
    if let Some(job) = query_job(&state, &query)?
        && job.kafka.is_some()
        && uuid::Uuid::parse_str(&id).is_ok()
        && state.store.get(&id).await?.is_none()
    {
        state
            .auth
            .require(&caller, Verb::Cancel, Some(&job.name))
            .await?;
        if state
            .store
            .insert_cancelled(&id, &job.task_type, now)
            .await?
        {
            tracing::info!(
                caller = caller.name(),
                job = job.name,
                task_id = id,
                "task cancelled before it was consumed from Kafka"
            );
            return Ok(Json(CancelResult {
                id,
                state: TaskState::Cancelled,
            })
            .into_response());
        }
        // Consumed in the meantime: cancel the stored task.
    }
    cancel_stored(&state, &caller, id, now).await
}

/// `DELETE /v1/tasks?job=J&unique_key=K` (or `type=T`): cancels the unfinished task of
/// that job holding unique key `K`.
async fn cancel_by_unique_key(
    State(state): AppState,
    caller: Caller,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let Some(key) = query.get("unique_key") else {
        return Err(ApiError::field(
            "unique_key",
            "name the unique key of the task to cancel (DELETE /v1/tasks/{id} cancels by id)",
        ));
    };
    submit::plain_text("unique_key", key)?;
    let Some(job) = query_job(&state, &query)? else {
        return Err(ApiError::field(
            "job",
            "name the job (or type) whose task holds the key",
        ));
    };
    state
        .auth
        .require(&caller, Verb::Cancel, Some(&job.name))
        .await?;
    let holders = state
        .store
        .search(SearchParams {
            task_type: Some(&job.task_type),
            unique_key: Some(key),
            limit: 100,
            ..SearchParams::default()
        })
        .await?;
    let Some(holder) = holders.into_iter().find(|t| !t.state.is_final()) else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!(
                "no unfinished task of job {} holds unique key {key:?}",
                job.name
            ),
        ));
    };
    cancel_stored(&state, &caller, holder.id, state.clock.now_millis()).await
}

/// The job a `job=` or `type=` query parameter names, if either is given.
fn query_job(
    state: &ApiState,
    query: &HashMap<String, String>,
) -> Result<Option<Arc<asyncd_spec::Job>>, ApiError> {
    let routes = state.routes.borrow().clone();
    match (query.get("job"), query.get("type")) {
        (Some(name), _) => routes
            .jobs()
            .find(|j| j.name == *name)
            .cloned()
            .map(Some)
            .ok_or_else(|| ApiError::field("job", format!("no AsyncJobConfig is named {name:?}"))),
        (None, Some(task_type)) => routes.job(task_type).cloned().map(Some).ok_or_else(|| {
            ApiError::field(
                "type",
                format!("no AsyncJobConfig runs tasks of type {task_type:?}"),
            )
        }),
        (None, None) => Ok(None),
    }
}

async fn cancel_stored(
    state: &ApiState,
    caller: &Caller,
    id: String,
    now: Millis,
) -> Result<Response, ApiError> {
    state.visible_task(caller, &id, Verb::Cancel).await?;
    match state.store.cancel(&id, now).await? {
        CancelOutcome::Cancelled => Ok(Json(CancelResult {
            id,
            state: TaskState::Cancelled,
        })
        .into_response()),
        CancelOutcome::NotFound => Err(ApiError::not_found(&id)),
        CancelOutcome::NotCancellable(s) => Err(ApiError::new(
            ErrorCode::NotCancellable,
            format!("task {id} is {s} and can no longer be cancelled"),
        )
        .with_state(s)),
    }
}

/// A heartbeat or result body, and its lease token, which may come as the
/// `Asyncd-Lease-Token` header instead. An empty body is an empty object.
fn parse_callback<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
    body_token: impl FnOnce(&mut T) -> Option<String>,
) -> Result<(T, String), ApiError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        body
    };
    let mut de = serde_json::Deserializer::from_slice(body);
    let mut callback: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        ApiError::new(
            ErrorCode::MalformedJson,
            format!("{path}: {}", e.into_inner()),
        )
        .with_field(path)
    })?;
    let header_token = || {
        headers
            .get(headers::LEASE_TOKEN)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_string())
    };
    let token = body_token(&mut callback)
        .or_else(header_token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            ApiError::field(
                "lease_token",
                "is required (or the Asyncd-Lease-Token header)",
            )
        })?;
    Ok((callback, token))
}

/// The attempt a callback's token belongs to: the running one — or, for a success, an
/// attempt that was given up (queued again, or dead-lettered on its last try) with no
/// new attempt claimed since, because that work did succeed (the store's `succeed`
/// fences the same way). An unknown task, any other state, and a token that is not the
/// current one all answer the same [`stale`]: a caller without the token learns nothing,
/// not even whether the task exists. The token is compared in constant time
/// ([`crate::lease::matches`]).
async fn current_attempt(
    state: &ApiState,
    id: &str,
    token: &str,
    success: bool,
) -> Result<TaskRecord, ApiError> {
    match state.store.get(id).await? {
        Some(task)
            if (task.state == TaskState::Running
                || (success && matches!(task.state, TaskState::Pending | TaskState::Dead)))
                && crate::lease::matches(&task.lease_secret, id, task.lease_token, token) =>
        {
            Ok(task)
        }
        // A cancel moves the token on by one: the attempt it stopped holds the one before.
        // Only that attempt's holder learns it was cancelled; anyone else gets `stale`.
        Some(task)
            if task.state == TaskState::Cancelled
                && crate::lease::matches(&task.lease_secret, id, task.lease_token - 1, token) =>
        {
            Err(ApiError::new(
                ErrorCode::TaskCancelled,
                format!(
                    "task {id} was cancelled while this attempt ran; stop, nothing is recorded"
                ),
            )
            .with_state(TaskState::Cancelled))
        }
        _ => Err(stale()),
    }
}

/// The one answer to every refused callback. It names nothing from the store, so its
/// bytes are the same for an unknown task, a finished one, and a wrong token.
fn stale() -> ApiError {
    ApiError::new(
        ErrorCode::StaleLease,
        "lease_token: not the current attempt of this task",
    )
    .with_field("lease_token")
}

async fn heartbeat(
    State(state): AppState,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(body, state.limits.body_bytes())?;
    let (callback, token) = parse_callback(&headers, &body, |c: &mut HeartbeatRequest| {
        c.lease_token.take()
    })?;
    let task = current_attempt(&state, &id, &token, false).await?;
    let lease = match callback.lease {
        Some(text) => {
            asyncd_spec::parse_duration(&text).map_err(|m| ApiError::field("lease", m))?
        }
        None => std::time::Duration::from_millis(task.timeout_ms as u64),
    };
    if lease > submit::MAX_TIMEOUT {
        return Err(ApiError::field("lease", "must be at most 24h"));
    }
    let now = state.clock.now_millis();
    let until = now + lease;
    // The counter read with the token fences the write: if a newer attempt began in
    // between, this changes nothing.
    let finish = Finish {
        id: id.clone(),
        lease_token: task.lease_token,
        kind: FinishKind::Extend { until },
    };
    if !state.store.finish(&[finish], now).await?[0] {
        return Err(stale());
    }
    Ok(Json(HeartbeatResponse {
        lease_until: from_millis(until.max(task.lease_until.unwrap_or_default())),
    })
    .into_response())
}

async fn post_result(
    State(state): AppState,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(body, state.limits.body_bytes())?;
    let (callback, token) =
        parse_callback(&headers, &body, |c: &mut ResultRequest<Box<RawValue>>| {
            c.lease_token.take()
        })
        // An unknown status is a bad value, as a missing one is, not a JSON type error.
        .map_err(|e| match e.error.field.as_deref() {
            Some("status") => status_required(),
            _ => e,
        })?;
    let reason = || {
        callback.error.as_deref().map_or_else(
            || "executor reported failure".into(),
            crate::executor::sanitize_reason,
        )
    };
    let outcome = match callback.status {
        Some(ResultStatus::Success) => AttemptOutcome::Succeeded,
        Some(ResultStatus::Failed) => AttemptOutcome::Permanent { reason: reason() },
        Some(ResultStatus::Retry) => match &callback.retry_after {
            Some(text) => AttemptOutcome::RetryAfter {
                after: asyncd_spec::parse_duration(text)
                    .map_err(|m| ApiError::field("retry_after", m))?,
                reason: reason(),
            },
            None => AttemptOutcome::Retry {
                reason: reason(),
                timed_out: false,
            },
        },
        None => return Err(status_required()),
    };
    let success = matches!(outcome, AttemptOutcome::Succeeded);
    let task = current_attempt(&state, &id, &token, success).await?;
    let now = state.clock.now_millis();
    let routes = state.routes.borrow().clone();
    state
        .metrics
        .executed
        .with_label_values(&[task.task_type.as_str(), outcome.status_label()])
        .inc();
    let mut kind = retry::settle(
        outcome,
        task.attempt,
        task.max_retries,
        routes.job(&task.task_type).map(|j| j.as_ref()),
        now,
    );
    if let FinishKind::Succeeded { result } = &mut kind {
        *result = callback.output;
    }
    let new_state = match &kind {
        FinishKind::Succeeded { .. } => TaskState::Succeeded,
        FinishKind::Dead { .. } => TaskState::Dead,
        _ => {
            state
                .metrics
                .retries
                .with_label_values(&[task.task_type.as_str()])
                .inc();
            TaskState::Pending
        }
    };
    if !state
        .store
        .finish(
            &[Finish {
                id: id.clone(),
                lease_token: task.lease_token,
                kind,
            }],
            now,
        )
        .await?[0]
    {
        return Err(stale());
    }
    if let Some(waker) = &state.waker {
        waker.wake();
    }
    Ok(Json(ResultAck {
        id,
        state: new_state,
    })
    .into_response())
}

fn status_required() -> ApiError {
    ApiError::field("status", "must be \"success\", \"retry\" or \"failed\"")
}

async fn dead_letters(
    State(state): AppState,
    caller: Caller,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    if let Some(task_type) = query.get("type") {
        submit::plain_text("type", task_type)?;
    }
    let job = query
        .get("type")
        .and_then(|task_type| state.job_name(task_type));
    state
        .auth
        .require(&caller, Verb::ListDeadLetters, job.as_deref())
        .await?;
    let limit = listing_limit(&query)?;
    let after = query.get("cursor").map(|c| parse_cursor(c)).transpose()?;
    let tasks = state
        .store
        .dead_letters(DeadLetterParams {
            task_type: query.get("type").map(String::as_str),
            after: after.as_ref().map(|(at, id)| (*at, id.as_str())),
            limit,
        })
        .await?;
    let (body, _) = listing(&tasks, limit, MAX_LISTING_BYTES, |t| t.trigger_at);
    Ok(([("content-type", "application/json")], body).into_response())
}

/// `GET /v1/tasks`: tasks by filter, newest first, paged like dead letters. Reading
/// them needs the same right as reading one (`get`), on the job filtered by or, without
/// one, on every job.
async fn search_tasks(
    State(state): AppState,
    caller: Caller,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    // No stored name or key has a control character, and PostgreSQL cannot even
    // compare with a NUL: such a filter is a bad request, not a store error.
    for field in ["job", "type", "unique_key"] {
        if let Some(value) = query.get(field) {
            submit::plain_text(field, value)?;
        }
    }
    let task_type = match (query.get("job"), query.get("type")) {
        (Some(job), _) => {
            let routes = state.routes.borrow().clone();
            let Some(found) = routes.jobs().find(|j| j.name == *job) else {
                return Err(ApiError::field(
                    "job",
                    format!("no AsyncJobConfig is named {job:?}"),
                ));
            };
            Some(found.task_type.clone())
        }
        (None, task_type) => task_type.cloned(),
    };
    let job = task_type.as_deref().and_then(|t| state.job_name(t));
    state
        .auth
        .require(&caller, Verb::Get, job.as_deref())
        .await?;
    let limit = listing_limit(&query)?;
    let task_state = query
        .get("state")
        .map(|text| {
            TaskState::parse(text).map_err(|_| {
                ApiError::field(
                    "state",
                    "must be one of blocked, pending, claimed, running, succeeded, dead, cancelled",
                )
            })
        })
        .transpose()?;
    let instant = |field: &'static str| {
        query
            .get(field)
            .map(|text| {
                chrono::DateTime::parse_from_rfc3339(text)
                    .map(|t| Millis::new(t.timestamp_millis()))
                    .map_err(|e| {
                        ApiError::field(field, format!("{text:?} is not an RFC 3339 time ({e})"))
                    })
            })
            .transpose()
    };
    let created_after = instant("created_after")?;
    let eta_before = instant("eta_before")?;
    let after = query.get("cursor").map(|c| parse_cursor(c)).transpose()?;
    let tasks = state
        .store
        .search(SearchParams {
            task_type: task_type.as_deref(),
            state: task_state,
            unique_key: query.get("unique_key").map(String::as_str),
            created_after,
            eta_before,
            after: after.as_ref().map(|(at, id)| (*at, id.as_str())),
            limit,
        })
        .await?;
    let (body, _) = listing(&tasks, limit, MAX_LISTING_BYTES, |t| t.created_at);
    Ok(([("content-type", "application/json")], body).into_response())
}

fn listing_limit(query: &HashMap<String, String>) -> Result<u32, ApiError> {
    match query.get("limit") {
        None => Ok(100),
        Some(text) => match text.parse::<u32>() {
            Ok(n @ 1..=1000) => Ok(n),
            _ => Err(ApiError::field("limit", "must be 1..=1000")),
        },
    }
}

/// A listing cursor names the last task of a page by its place in the listing's order:
/// `<ms>.<id>`, the ms being the time the listing orders by (`trigger_at` for dead
/// letters, `created_at` for a search). Clients treat it as opaque.
fn cursor_of(task: &TaskRecord, order: fn(&TaskRecord) -> Millis) -> String {
    format!("{}.{}", order(task).as_i64(), task.id)
}

fn parse_cursor(text: &str) -> Result<(Millis, String), ApiError> {
    let invalid = || ApiError::field("cursor", "must be a next_cursor from a previous page");
    let (at, id) = text.split_once('.').ok_or_else(invalid)?;
    let at: i64 = at.parse().map_err(|_| invalid())?;
    // Ids are UUIDs: anything else cannot have come from this server.
    let id = uuid::Uuid::parse_str(id).map_err(|_| invalid())?;
    Ok((Millis::new(at), id.to_string()))
}

/// A [`asyncd_contract::DeadLetters`] answer of `tasks` (a page asked with `limit`), cut
/// after the last item that keeps the body within `max_bytes` (the first item always goes
/// in, or a task larger than the cap could never be listed); the second value says
/// whether items were cut. A cut page, or a full one, names the cursor of its last item.
/// Written item by item, so a cut listing is never serialized whole.
fn listing(
    tasks: &[TaskRecord],
    limit: u32,
    max_bytes: usize,
    order: fn(&TaskRecord) -> Millis,
) -> (Vec<u8>, bool) {
    // The longest tail: `"truncated"` and a cursor of an i64 and a UUID.
    const TAIL_BYTES: usize = 128;
    let mut body = br#"{"items":["#.to_vec();
    let mut listed = 0;
    for (i, task) in tasks.iter().enumerate() {
        let item = serde_json::to_vec(&task_status(task)).expect("a task status serializes");
        if i > 0 && body.len() + 1 + item.len() + TAIL_BYTES > max_bytes {
            break;
        }
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&item);
        listed += 1;
    }
    let truncated = listed < tasks.len();
    body.extend_from_slice(format!("],\"truncated\":{truncated}").as_bytes());
    if truncated || (listed > 0 && tasks.len() == limit as usize) {
        let cursor = cursor_of(&tasks[listed - 1], order);
        body.extend_from_slice(format!(",\"next_cursor\":\"{cursor}\"").as_bytes());
    }
    body.push(b'}');
    (body, truncated)
}

async fn redrive(
    State(state): AppState,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    state.visible_task(&caller, &id, Verb::Redrive).await?;
    let now = state.clock.now_millis();
    match state.store.redrive(&id, now).await? {
        RedriveOutcome::Redriven {
            trigger_at,
            state: redriven,
        } => {
            if let Some(waker) = &state.waker {
                waker.wake();
            }
            Ok(Json(RedriveResult {
                id,
                state: redriven,
                eta: from_millis(trigger_at),
            })
            .into_response())
        }
        RedriveOutcome::NotFound => Err(ApiError::not_found(&id)),
        RedriveOutcome::NotDead(s) => Err(ApiError::new(
            ErrorCode::NotDead,
            format!("task {id} is {s}, not in dead letters"),
        )
        .with_state(s)),
        RedriveOutcome::UniqueConflict { existing_id } => Err(ApiError::new(
            ErrorCode::UniqueConflict,
            format!("task {existing_id} holds this task's unique key"),
        )
        .with_existing_id(existing_id)),
    }
}

/// The job named `name` (an AsyncJobConfig), when `caller` may do `verb` on it: 404 for a
/// name no config declares, 403 for a job the caller may not act on.
async fn named_job(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    verb: Verb,
) -> Result<Arc<asyncd_spec::Job>, ApiError> {
    let job = state
        .routes
        .borrow()
        .jobs()
        .find(|job| job.name == name)
        .cloned()
        .ok_or_else(|| {
            ApiError::new(ErrorCode::NotFound, format!("no job {name:?}")).with_field("name")
        })?;
    state.auth.require(caller, verb, Some(&job.name)).await?;
    Ok(job)
}

/// How `job` stands, the API's pause read from the store (`paused_at`, as given).
fn job_status(job: &asyncd_spec::Job, paused_at: Option<Millis>) -> JobStatus {
    JobStatus {
        job: job.name.clone(),
        task_type: job.task_type.clone(),
        paused: job.paused || paused_at.is_some(),
        paused_at: paused_at.map(from_millis),
        paused_by_config: job.paused,
    }
}

/// How far back the overview's finished counts reach.
const FINISHED_WINDOW: Duration = Duration::from_secs(60);

/// `job` as the jobs overview shows it at `now`, `paused_at` being the API's pause of it
/// and `shares` the live dispatchers' adaptive shares summed by task type.
async fn job_overview(
    state: &ApiState,
    job: &asyncd_spec::Job,
    paused_at: Option<Millis>,
    shares: &BTreeMap<String, u64>,
    now: Millis,
) -> Result<JobOverview, ApiError> {
    let counts = state
        .store
        .job_counts(JobCountParams {
            task_type: &job.task_type,
            now,
            finished_since: now.saturating_sub(FINISHED_WINDOW),
            cap: u32::try_from(MAX_JOB_COUNT).expect("the cap fits"),
        })
        .await?;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    // The dispatchers running the job each offer its executor their share; together
    // never more than `concurrency` (the store's count holds that).
    let effective_concurrency = match shares.get(&job.task_type) {
        Some(&sum) if job.adaptive.enabled => {
            u32::try_from(sum).unwrap_or(u32::MAX).min(job.concurrency)
        }
        _ => job.concurrency,
    };
    let cron = job
        .cron
        .iter()
        .map(|entry| CronOverview {
            name: entry.name.clone(),
            schedule: entry.schedule.as_str().to_string(),
            next: std::iter::successors(entry.schedule.next_after(from_millis(now)), |t| {
                entry.schedule.next_after(*t)
            })
            .take(CRON_FIRINGS)
            .collect(),
            overlap: match entry.overlap {
                asyncd_spec::job::Overlap::Allow => CronOverlap::Allow,
                asyncd_spec::job::Overlap::Skip => CronOverlap::Skip,
            },
            catch_up: if entry.catch_up.is_zero() {
                "0s".into()
            } else {
                asyncd_spec::format_duration(entry.catch_up)
            },
            paused: entry.paused,
        })
        .collect();
    Ok(JobOverview {
        status: job_status(job, paused_at),
        effective_concurrency,
        stats: JobStats {
            due: count(counts.due),
            scheduled: count(counts.scheduled),
            running: count(counts.running),
            dead: count(counts.dead),
            oldest_due_seconds: counts.oldest_due.map(|at| now.since(at).as_secs_f64()),
            finished_last_minute: FinishedCounts {
                succeeded: count(counts.succeeded_since),
                dead: count(counts.dead_since),
            },
        },
        cron,
    })
}

/// The API's pause of `task_type`, from the store's list of pauses.
fn paused_since(pauses: &[(String, Millis)], task_type: &str) -> Option<Millis> {
    pauses
        .iter()
        .find_map(|(paused, at)| (paused == task_type).then_some(*at))
}

/// `GET /v1/jobs`: every job the caller may read (`get`), sorted by name. A job the
/// caller may not read is left out, as `GET /v1/jobs/{name}` would refuse it.
async fn list_jobs(State(state): AppState, caller: Caller) -> Result<Json<JobList>, ApiError> {
    let mut jobs: Vec<Arc<asyncd_spec::Job>> = state.routes.borrow().jobs().cloned().collect();
    jobs.sort_by(|a, b| a.name.cmp(&b.name));
    let pauses = state.store.pauses().await?;
    let now = state.clock.now_millis();
    let shares = live_shares(&state, now).await?;
    let mut overviews = Vec::with_capacity(jobs.len());
    for job in jobs {
        if !state
            .auth
            .allows(&caller, Verb::Get, Some(&job.name))
            .await?
        {
            continue;
        }
        let paused_at = paused_since(&pauses, &job.task_type);
        overviews.push(job_overview(&state, &job, paused_at, &shares, now).await?);
    }
    Ok(Json(JobList { jobs: overviews }))
}

async fn get_job(
    State(state): AppState,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<JobOverview>, ApiError> {
    let job = named_job(&state, &caller, &name, Verb::Get).await?;
    let paused_at = paused_since(&state.store.pauses().await?, &job.task_type);
    let now = state.clock.now_millis();
    let shares = live_shares(&state, now).await?;
    Ok(Json(
        job_overview(&state, &job, paused_at, &shares, now).await?,
    ))
}

/// The adaptive shares of the dispatchers alive at `now` (heartbeat within a member's
/// TTL, as membership counts them), summed by task type.
async fn live_shares(state: &ApiState, now: Millis) -> Result<BTreeMap<String, u64>, ApiError> {
    Ok(state
        .store
        .live_shares(now.saturating_sub(crate::dispatcher::MEMBER_TTL))
        .await?)
}

/// Pauses the job's task type in the store, where every claim and attempt start of every
/// dispatcher checks it: once this answers, no attempt of the job begins.
async fn pause_job(
    State(state): AppState,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<JobStatus>, ApiError> {
    let job = named_job(&state, &caller, &name, Verb::Pause).await?;
    let since = state
        .store
        .pause(&job.task_type, state.clock.now_millis())
        .await?;
    tracing::info!(caller = caller.name(), job = job.name, "job paused");
    Ok(Json(job_status(&job, Some(since))))
}

async fn resume_job(
    State(state): AppState,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<JobStatus>, ApiError> {
    let job = named_job(&state, &caller, &name, Verb::Pause).await?;
    if state.store.resume(&job.task_type).await? {
        tracing::info!(caller = caller.name(), job = job.name, "job resumed");
    }
    // The waiting tasks are due: a dispatcher in this process claims them now rather
    // than at its next poll.
    if let Some(waker) = &state.waker {
        waker.wake();
    }
    Ok(Json(job_status(&job, None)))
}

/// Fires a cron entry once, now: the task the scheduler would create for a firing due
/// at this instant, besides the schedule's own firings. Creating a task of the job needs
/// the right to submit to it.
async fn trigger_cron(
    State(state): AppState,
    caller: Caller,
    Path((name, entry)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let job = named_job(&state, &caller, &name, Verb::Submit).await?;
    let Some(cron) = job.cron.iter().find(|c| c.name == entry) else {
        let known: Vec<&str> = job.cron.iter().map(|c| c.name.as_str()).collect();
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!(
                "job {name:?} has no cron entry {entry:?} (its entries: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ),
        )
        .with_field("entry"));
    };
    let now = state.clock.now_millis();
    let task = crate::scheduler::firing(&job, cron, now, None);
    let outcome = state.store.insert(std::slice::from_ref(&task), now).await?;
    let (id, trigger_at) = match outcome.into_iter().next() {
        Some(InsertOutcome::Inserted { id, trigger_at }) => (id, trigger_at),
        other => {
            // A firing carries no key that could clash: nothing else can come back.
            return Err(ApiError::new(
                ErrorCode::StoreUnavailable,
                format!("the store did not insert the firing: {other:?}"),
            ));
        }
    };
    if let Some(waker) = &state.waker {
        waker.wake();
    }
    tracing::info!(
        caller = caller.name(),
        job = job.name.as_str(),
        entry = entry.as_str(),
        task_id = id.as_str(),
        "cron entry triggered"
    );
    Ok((
        StatusCode::CREATED,
        Json(CronTriggerResult {
            id,
            job: job.name.clone(),
            entry,
            task_type: job.task_type.clone(),
            eta: from_millis(trigger_at),
        }),
    )
        .into_response())
}

async fn metrics(State(state): AppState) -> Response {
    (
        [("content-type", "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

async fn ready(State(state): AppState) -> Result<&'static str, ApiError> {
    state.store.ping().await?;
    if let Some(why) = state.clock_check.as_ref().and_then(|check| check.skew()) {
        return Err(ApiError::new(ErrorCode::ClockSkew, why));
    }
    if let Some(status) = &state.signing_status {
        let routes = state.routes.borrow().clone();
        let unavailable = status.unavailable(|job| routes.jobs().any(|j| j.name == job));
        if !unavailable.is_empty() {
            return Err(ApiError::new(
                ErrorCode::SigningUnavailable,
                unavailable.join("; "),
            ));
        }
    }
    Ok("ready")
}

/// `docs/openapi.json`, generated from the contract types once per process.
async fn openapi() -> Response {
    static DOCUMENT: std::sync::LazyLock<String> =
        std::sync::LazyLock::new(asyncd_contract::openapi::text);
    ([("content-type", "application/json")], DOCUMENT.as_str()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use asyncd_contract::DeadLetters;

    fn dead(id: usize, payload_bytes: usize) -> TaskRecord {
        let payload = format!("\"{}\"", "x".repeat(payload_bytes));
        TaskRecord {
            id: format!("task-{id}"),
            task_type: "t".into(),
            payload: RawValue::from_string(payload).unwrap(),
            state: TaskState::Dead,
            priority: 0,
            trigger_at: Millis::new(0),
            attempt: 1,
            max_retries: 0,
            timeout_ms: 1000,
            lease_token: 0,
            lease_until: None,
            idempotency_key: None,
            unique_key: None,
            depends_on: Vec::new(),
            last_error: Some("boom".into()),
            result: None,
            created_at: Millis::new(0),
            updated_at: Millis::new(0),
            lease_secret: String::new(),
        }
    }

    #[test]
    fn a_listing_stops_at_its_byte_cap_and_says_so() {
        let tasks: Vec<TaskRecord> = (0..10).map(|i| dead(i, 1000)).collect();
        let (body, truncated) = listing(&tasks, 10, 4500, |t| t.trigger_at);
        let answer: DeadLetters = serde_json::from_slice(&body).unwrap();
        assert!(body.len() <= 4500, "{} bytes", body.len());
        assert_eq!((answer.items.len(), answer.truncated), (3, true));
        assert!(truncated);
        assert_eq!(answer.items[2].id, "task-2", "the newest ones, in order");
        assert_eq!(
            answer.next_cursor.as_deref(),
            Some("0.task-2"),
            "the next page starts after the last one listed"
        );

        let (full, truncated) = listing(&tasks, 10, usize::MAX, |t| t.trigger_at);
        let answer: DeadLetters = serde_json::from_slice(&full).unwrap();
        assert_eq!(
            (answer.items.len(), answer.truncated, truncated),
            (10, false, false)
        );
        assert_eq!(
            answer.next_cursor.as_deref(),
            Some("0.task-9"),
            "a full page may have more behind it"
        );
        let (body, _) = listing(&tasks, 11, usize::MAX, |t| t.trigger_at);
        let short: DeadLetters = serde_json::from_slice(&body).unwrap();
        assert_eq!(short.next_cursor, None, "a short page is the last");
        for (body, answer) in [(full, answer), (body, short)] {
            assert_eq!(
                body,
                serde_json::to_vec(&answer).unwrap(),
                "written as the contract type writes it"
            );
        }
    }

    #[test]
    fn a_task_larger_than_the_cap_is_still_listed_alone() {
        let tasks = [dead(0, 10_000), dead(1, 10)];
        let (body, _) = listing(&tasks, 2, 1000, |t| t.trigger_at);
        let answer: DeadLetters = serde_json::from_slice(&body).unwrap();
        assert_eq!((answer.items.len(), answer.truncated), (1, true));
        let (body, _) = listing(&[], 2, 1000, |t| t.trigger_at);
        assert_eq!(body, br#"{"items":[],"truncated":false}"#);
    }

    #[test]
    fn a_cursor_is_refused_unless_this_server_could_have_written_it() {
        let id = "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
        assert_eq!(
            parse_cursor(&format!("-5.{id}")).unwrap(),
            (Millis::new(-5), id.to_string())
        );
        for bad in [
            "",
            "5",
            ".x",
            "x.y",
            &format!("1e3.{id}"),
            "5.task-1",
            &format!("5.{id}\0"),
        ] {
            let error = parse_cursor(bad).unwrap_err();
            assert_eq!(error.status, axum::http::StatusCode::BAD_REQUEST, "{bad:?}");
        }
    }
}

//! The one submit pipeline behind `POST /v1/tasks` and `POST /v1/tasks:batch`: a single
//! submit is a batch of one, answered with its task's own status and body rather than a
//! list of results. Each item is parsed, its caller's right checked and the request
//! validated (`validate`); the valid tasks go to the store or, for a job with a Kafka
//! topic, to Kafka (`ApiState::accept`). A batch whose items name each other is a
//! `workflow`, stored whole or refused whole. Single submits of the moment share one
//! store transaction ([`group_commit`]).

mod change;
pub mod group_commit;
pub mod task_writer;
mod validate;
mod when;
mod workflow;

use std::borrow::Cow;
use std::time::{Duration, Instant};

use asyncd_contract::{
    BatchItemResult, BatchOutcome, BatchResponse, ErrorCode, Route, SubmitResult, headers,
};
use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::{ApiState, body_bytes};
use crate::auth::{Caller, Verb};
use crate::clock::from_millis;
use crate::job_table::RouteTable;
use crate::trace::{Span, SpanKind, TraceContext, Tracer, Value};
use asyncd_store::{InsertOutcome, Millis, NewTask};
pub use change::{check_change, check_unconsumed_change};
pub use validate::{Limits, MAX_KEY_LEN, key_id, legacy_task_id};
pub(super) use validate::{MAX_TIMEOUT, parse_json, plain_text};
use workflow::Refs;

/// The bounds of a task's fields, which the Kafka consumer holds each message to as a
/// submit is held to them.
pub mod bounds {
    pub use super::validate::{key, max_retries, priority, source_service, timeout};
    pub use super::when::{MAX_DELAY, after_due, not_too_far};
}

/// What a submit's body holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    /// One submit request: refused as a whole, answered with the task's own status.
    One,
    /// `{"tasks": [...]}`: each item answered on its own, with `200` for the call.
    Batch,
}

/// Submits the tasks of `body`, a request of `shape`, under the request's trace.
pub(super) async fn submit(
    state: &ApiState,
    caller: &Caller,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    shape: Shape,
) -> Result<Response, ApiError> {
    let mut trace = SubmitTrace::start(&state.tracer, headers);
    let result = accept_request(state, caller, headers, body, shape, &mut trace).await;
    trace.end(&state.tracer, status_of(&result));
    result
}

/// Every task of a batch joins the batch request's trace.
async fn accept_request(
    state: &ApiState,
    caller: &Caller,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    shape: Shape,
    trace: &mut SubmitTrace,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let limit = match shape {
        Shape::One => state.limits.body_bytes(),
        Shape::Batch => state.limits.batch_body_bytes(),
    };
    let body = body_bytes(body, limit)?;
    let items: Vec<&[u8]> = match shape {
        Shape::One => vec![&body],
        // Items are parsed one by one below, so that each is refused on its own.
        Shape::Batch => {
            let items = validate::parse_batch(&body)?;
            trace.attr("asyncd.batch.size", Value::Int(items.len() as i64));
            items
                .into_iter()
                .map(|item| item.get().as_bytes())
                .collect()
        }
    };
    let now = state.clock.now_millis();
    let routes = state.routes.borrow().clone();
    let source = source_header(headers);
    let mut checked: Vec<Result<NewTask, ApiError>> = Vec::with_capacity(items.len());
    let mut refs = Vec::with_capacity(items.len());
    for item in items {
        let (task, item_refs) = check(state, caller, &routes, item, shape, now, source).await;
        checked.push(task.map(|mut task| {
            task.trace = trace.stored.clone();
            task
        }));
        refs.push(item_refs);
    }
    if let (Shape::One, [Ok(task)]) = (shape, checked.as_slice()) {
        trace.attr("asyncd.task.id", Value::Str(task.id.clone()));
        trace.attr("asyncd.task.type", Value::Str(task.task_type.clone()));
    }
    let types: Vec<Option<String>> = checked
        .iter()
        .map(|task| task.as_ref().ok().map(|task| task.task_type.clone()))
        .collect();
    // Only a batch's items take refs out, so a single submit is never one.
    if workflow::is_workflow(&refs) {
        let answers = workflow::store(state, checked, &refs, now).await?;
        let answers = hide_unreadable_holders(state, caller, &types, answers).await?;
        return Ok(batch_response(answers));
    }
    let answers = accept_checked(state, checked, now, started).await?;
    let answers = hide_unreadable_holders(state, caller, &types, answers).await?;
    match shape {
        Shape::One => {
            let answer = answers.into_iter().next().expect("one answer per item");
            let (status, body) = answer?;
            Ok((status, Json(body)).into_response())
        }
        Shape::Batch => Ok(batch_response(answers)),
    }
}

/// One item of a submit, parsed, allowed and validated, with the workflow fields a batch
/// item names (a single submit leaves them in, for validation to refuse).
async fn check(
    state: &ApiState,
    caller: &Caller,
    routes: &RouteTable,
    item: &[u8],
    shape: Shape,
    now: Millis,
    source: Option<&str>,
) -> (Result<NewTask, ApiError>, Refs) {
    let mut request = match validate::parse(item) {
        Ok(request) => request,
        Err(err) => return (Err(err), Refs::default()),
    };
    let refs = match shape {
        Shape::One => Refs::default(),
        Shape::Batch => Refs::take(&mut request),
    };
    let task = match may_submit(state, caller, routes, &request.task_type).await {
        Ok(()) => validate::validate(request, routes, &state.limits, now, source),
        Err(err) => Err(err),
    };
    let task = match task {
        Ok(task) if !task.depends_on.is_empty() => {
            may_depend(state, caller, &task).await.map(|()| task)
        }
        other => other,
    };
    (task, refs)
}

/// Accepts the valid tasks of `checked`, one answer per item in order: a refused item
/// keeps its refusal. Each valid task's submit latency is observed once it is answered.
async fn accept_checked(
    state: &ApiState,
    checked: Vec<Result<NewTask, ApiError>>,
    now: Millis,
    started: Instant,
) -> Result<Vec<Answer>, ApiError> {
    let mut valid = Vec::with_capacity(checked.len());
    let refused: Vec<Option<ApiError>> = checked
        .into_iter()
        .map(|item| match item {
            Ok(task) => {
                valid.push(task);
                None
            }
            Err(err) => Some(err),
        })
        .collect();
    let mut answers = state.accept(&valid, now).await?.into_iter();
    // Every task of the call is answered now: one look-up of the histogram per run of
    // one type, not one per task.
    let latency = started.elapsed().as_secs_f64();
    for (task_type, tasks) in runs(valid.iter().map(|task| task.task_type.as_str())) {
        let histogram = state.metrics.submit_latency.with_label_values(&[task_type]);
        for _ in 0..tasks {
            histogram.observe(latency);
        }
    }
    Ok(refused
        .into_iter()
        .map(|refusal| match refusal {
            Some(err) => Err(err),
            None => answers.next().expect("one answer per valid task"),
        })
        .collect())
}

/// Refusals name the task holding a key (`existing_id`) only to a caller who may read
/// it. Keys are unique per type, so the holder is a task of the submitted job; but a
/// caller may hold the right to submit a job's tasks and not to read them.
async fn hide_unreadable_holders(
    state: &ApiState,
    caller: &Caller,
    types: &[Option<String>],
    mut answers: Vec<Answer>,
) -> Result<Vec<Answer>, ApiError> {
    for (answer, task_type) in answers.iter_mut().zip(types) {
        let (Err(err), Some(task_type)) = (answer, task_type) else {
            continue;
        };
        let Some(holder) = err.error.existing_id.clone() else {
            continue;
        };
        let job = state.job_name(task_type);
        if !state.auth.allows(caller, Verb::Get, job.as_deref()).await? {
            err.error.existing_id = None;
            err.error.message = err
                .error
                .message
                .replace(&format!("task {holder}"), "another task of this job");
        }
    }
    Ok(answers)
}

fn batch_response(answers: Vec<Answer>) -> Response {
    let results = answers
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
        .collect();
    Json(BatchResponse { results }).into_response()
}

fn source_header(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(headers::SOURCE_SERVICE)
        .and_then(|v| v.to_str().ok())
}

/// 403 unless `caller` may submit `task_type`. An undeclared type is left for
/// validation to refuse (`unknown_task_type`): there is nothing to protect.
async fn may_submit(
    state: &ApiState,
    caller: &Caller,
    routes: &RouteTable,
    task_type: &str,
) -> Result<(), ApiError> {
    match routes.job(task_type) {
        Some(job) => Ok(state
            .auth
            .require(caller, Verb::Submit, Some(&job.name))
            .await?),
        None => Ok(()),
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

/// A task's answer within a submit: its status and result, or its refusal.
type Answer = Result<(StatusCode, SubmitResult), ApiError>;

fn submitted(id: String, trigger_at: Millis, route: Route, duplicate: bool) -> SubmitResult {
    SubmitResult {
        id,
        eta: from_millis(trigger_at),
        route,
        duplicate,
        debounced: false,
        dropped: false,
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
        InsertOutcome::UnknownDependency { id } => Err(unknown_dependency(&id)),
        // Only an id derived from an idempotency key can be held: by a task of another
        // job, which is neither named nor taken for this one.
        InsertOutcome::IdTaken { .. } => Err(ApiError::new(
            ErrorCode::IdempotencyMismatch,
            "idempotency_key: the task id this key derives is held by a task of another \
             job; use another key",
        )
        .with_field("idempotency_key")),
        InsertOutcome::Debounced { id, trigger_at } => Ok((
            StatusCode::OK,
            SubmitResult {
                debounced: true,
                ..submitted(id, trigger_at, Route::Store, false)
            },
        )),
        InsertOutcome::Held {
            id,
            until,
            refuse: false,
        } => Ok((
            StatusCode::OK,
            SubmitResult {
                dropped: true,
                ..submitted(id, until, Route::Store, false)
            },
        )),
        InsertOutcome::Held {
            id,
            until,
            refuse: true,
        } => Err(ApiError::new(
            ErrorCode::Throttled,
            format!(
                "throttle: task {id} was stored under this key within the throttle's period; \
                 the window closes at {}",
                from_millis(until).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
            ),
        )
        .with_field("throttle")
        .with_existing_id(id)),
    }
}

/// A `depends_on` id that names no task the caller may read: unknown and invisible
/// dependencies are answered alike, so the answer reveals nothing of other jobs.
fn unknown_dependency(id: &str) -> ApiError {
    ApiError::field("depends_on", format!("no task {id}"))
}

/// `400` unless every dependency of `task` is a task `caller` may read. The store
/// checks again, atomically, that each exists when the task is inserted.
async fn may_depend(state: &ApiState, caller: &Caller, task: &NewTask) -> Result<(), ApiError> {
    for dep in &task.depends_on {
        let Some(found) = state.store.get(dep).await? else {
            return Err(unknown_dependency(dep));
        };
        let job = state.job_name(&found.task_type);
        if !state.auth.allows(caller, Verb::Get, job.as_deref()).await? {
            tracing::info!(
                caller = caller.name(),
                dependency = dep.as_str(),
                "dependency hidden from a caller who may not read it"
            );
            return Err(unknown_dependency(dep));
        }
    }
    Ok(())
}

impl ApiState {
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
        match self.tasks.insert(&fallback, now).await {
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

        // Copied only when some go to Kafka instead.
        let stored: Cow<[NewTask]> = if topics.iter().all(Option::is_none) {
            Cow::Borrowed(tasks)
        } else {
            Cow::Owned(
                tasks
                    .iter()
                    .zip(&topics)
                    .filter(|(_, topic)| topic.is_none())
                    .map(|(task, _)| task.clone())
                    .collect(),
            )
        };
        // Kafka-route tasks alone must not need the store. A single submit, or a small
        // batch (an SDK's concurrent submits sent together), shares a transaction with
        // the other submits of the moment; a large batch pays for its own commit.
        let mut outcomes = match stored.len() {
            0 => Vec::new(),
            n if n < group_commit::OWN_TRANSACTION => {
                self.inserts.insert(stored.into_owned(), now).await?
            }
            _ => self.tasks.insert(&stored, now).await?,
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
        // The claimer was woken by the insert, if it must be ([`task_writer`]).
        self.count(tasks, &answers);
        Ok(answers)
    }

    /// Counts the tasks newly accepted and wakes the claimer if one is due soon.
    fn count_and_wake(&self, tasks: &[NewTask], answers: &[Answer], now: Millis) {
        self.count(tasks, answers);
        let horizon = now + Duration::from_millis(self.lookahead_ms as u64);
        let wake = tasks.iter().zip(answers).any(|(task, answer)| {
            matches!(answer, Ok((StatusCode::CREATED, _))) && task.trigger_at <= horizon
        });
        if wake && let Some(waker) = &self.waker {
            waker.wake();
        }
    }

    /// Counts the tasks newly accepted: one counter update per run of one type and
    /// source (a batch is mostly one run), not one per task.
    fn count(&self, tasks: &[NewTask], answers: &[Answer]) {
        let created = tasks
            .iter()
            .zip(answers)
            .filter(|(_, answer)| matches!(answer, Ok((StatusCode::CREATED, _))))
            .map(|(task, _)| {
                let source = task.source_service.as_deref().unwrap_or("");
                (task.task_type.as_str(), source)
            });
        for ((task_type, source), tasks) in runs(created) {
            self.metrics
                .submitted
                .with_label_values(&[task_type, self.metrics.source_label(source)])
                .inc_by(tasks);
        }
    }
}

/// Each run of equal consecutive items, with its length.
fn runs<T: PartialEq>(items: impl IntoIterator<Item = T>) -> Vec<(T, u64)> {
    let mut runs: Vec<(T, u64)> = Vec::new();
    for item in items {
        match runs.last_mut() {
            Some((last, n)) if *last == item => *n += 1,
            _ => runs.push((item, 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn runs_count_equal_neighbours_only() {
        assert_eq!(
            runs(["a", "a", "b", "a", "a", "a"]),
            [("a", 2), ("b", 1), ("a", 3)]
        );
        assert_eq!(runs(Vec::<&str>::new()), []);
    }
}

//! Tasks: submit one or a batch (through [`super::submit`]), read one, search them,
//! change one that has not begun, and cancel one by id or by unique key.

use std::collections::HashMap;
use std::sync::Arc;

use asyncd_contract::{CancelResult, ErrorCode, MAX_LISTING_BYTES};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde_json::value::RawValue;

use super::extract::{Path, Query};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::listing::{listing, listing_limit, parse_cursor, task_status};
use super::submit::{self, Shape, plain_text};
use super::{ApiState, AppState};
use crate::auth::{Caller, Verb};
use asyncd_store::{CancelOutcome, ChangeOutcome, Millis, SearchParams, TaskRecord, TaskState};

/// `POST /v1/tasks`: one task, answered with its own status and body.
pub(super) async fn submit_one(
    State(state): AppState,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    submit::submit(&state, &caller, &headers, body, Shape::One).await
}

/// `POST /v1/tasks:batch`: up to `MAX_BATCH` tasks, each answered on its own — or, for a
/// workflow, all refused together.
pub(super) async fn submit_batch(
    State(state): AppState,
    caller: Caller,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    submit::submit(&state, &caller, &headers, body, Shape::Batch).await
}

/// `GET /v1/tasks/{id}`.
pub(super) async fn get(
    State(state): AppState,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let task = state.visible_task(&caller, &id, Verb::Get).await?;
    Ok(Json(task_status(&task)).into_response())
}

/// `PATCH /v1/tasks/{id}` (a [`asyncd_contract::ChangeRequest`]): changes a task that
/// has not begun in place — its due time, payload or priority — keeping its id, and
/// answers with the task as `GET` shows it. A claimed task goes back to pending under a
/// new token, so the dispatcher holding it cannot begin it with the old values; one
/// already running or ended is refused (409 `task_started`). Changing a task needs the
/// right to submit its job's tasks. Only stored tasks: one whose Kafka message has not
/// been consumed yet is not found (404) until it is.
/// With `?job=` (or `?type=`) naming a Kafka-routed job, a time-ordered id not in the
/// store yet — its message still waits in the topic — is changed ahead of consumption
/// (202, [`asyncd_store::Store::change_unconsumed`]), as `DELETE` cancels one.
pub(super) async fn change(
    State(state): AppState,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let time_ordered = uuid::Uuid::parse_str(&id).is_ok_and(|id| id.get_version_num() == 7);
    let job = query_job(&state, &query)?.filter(|_| time_ordered);
    change_task(&state, &caller, id, body, job).await
}

/// `PATCH /v1/tasks?job=J&unique_key=K` (or `idempotency_key=K`): [`change`] for the
/// stored task of job `J` holding that key (for a unique key, the unfinished one).
pub(super) async fn change_by_key(
    State(state): AppState,
    caller: Caller,
    Query(query): Query<HashMap<String, String>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (field, key, job) = query_key(&state, &query, "change")?;
    // The right first, so that whoever may not change the job's tasks learns nothing of
    // its keys.
    state
        .auth
        .require(&caller, Verb::Submit, Some(&job.name))
        .await?;
    let id = if field == "idempotency_key" {
        match state
            .store
            .idempotency_key_holder(&job.task_type, key)
            .await?
        {
            // On a job with a Kafka topic a task not consumed yet is changed under the
            // id its key derives, as it is cancelled.
            None if job.kafka.is_some() => {
                let id = submit::key_id(&job.task_type, key);
                return change_task(&state, &caller, id, body, Some(job)).await;
            }
            id => id,
        }
    } else {
        unfinished_unique_holder(&state, &job, key).await?
    };
    let Some(id) = id else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no stored task of job {} holds {field} {key:?}", job.name),
        ));
    };
    change_task(&state, &caller, id, body, None).await
}

async fn change_task(
    state: &ApiState,
    caller: &Caller,
    id: String,
    body: Result<Bytes, BytesRejection>,
    kafka_job: Option<Arc<asyncd_spec::Job>>,
) -> Result<Response, ApiError> {
    let body = super::body_bytes(body, state.limits.body_bytes())?;
    let request: asyncd_contract::ChangeRequest<Box<RawValue>> = submit::parse_json(&body)?;
    let now = state.clock.now_millis();
    // Not stored yet, or a cancelled placeholder that may hold an earlier change.
    if let Some(job) = kafka_job
        && job.kafka.is_some()
        && state
            .store
            .get(&id)
            .await?
            .is_none_or(|task| task.state == TaskState::Cancelled)
    {
        state
            .auth
            .require(caller, Verb::Submit, Some(&job.name))
            .await?;
        let change = submit::check_unconsumed_change(&request, &job, &state.limits, now)?;
        if state
            .store
            .change_unconsumed(&id, &job.task_type, change, now)
            .await?
        {
            tracing::info!(
                caller = caller.name(),
                job = job.name,
                task_id = id,
                "task changed before it was consumed from Kafka"
            );
            return Ok((
                StatusCode::ACCEPTED,
                Json(asyncd_contract::PendingChange {
                    id,
                    job: job.name.clone(),
                    task_type: job.task_type.clone(),
                    consumed: false,
                }),
            )
                .into_response());
        }
        // Consumed in the meantime: change the stored task.
    }
    let task = state.visible_task(caller, &id, Verb::Submit).await?;
    let change = submit::check_change(&request, &task, &state.routes.borrow(), &state.limits, now)?;
    match state.store.change(&id, change, now).await? {
        ChangeOutcome::Changed => {}
        ChangeOutcome::NotFound => return Err(ApiError::not_found(&id)),
        ChangeOutcome::NotChangeable(s) => return Err(started(&id, s)),
    }
    tracing::info!(caller = caller.name(), task_id = id, "task changed");
    // A dispatcher in this process looks at once: the task may be due now, or a claim of
    // it given up.
    if let Some(waker) = &state.waker {
        waker.wake();
    }
    // Read back for the answer: what a racing claim or start made of it since shows too.
    let task: TaskRecord = state
        .store
        .get(&id)
        .await?
        .ok_or_else(|| ApiError::not_found(&id))?;
    Ok(Json(task_status(&task)).into_response())
}

fn started(id: &str, state: TaskState) -> ApiError {
    let what = match state {
        TaskState::Running => "has begun",
        _ => "has ended",
    };
    ApiError::new(
        ErrorCode::TaskStarted,
        format!("task {id} is {state}: it {what} and can no longer be changed"),
    )
    .with_state(state)
}

/// `DELETE /v1/tasks/{id}`: cancels a task that has not finished. With `?job=` (or
/// `?type=`) naming a Kafka-routed job, a time-ordered id (UUIDv7, as the API gives a
/// task without an idempotency key) not in the store yet — its message still waits in
/// the topic — is recorded as cancelled under that job's type, so the consumer's insert
/// drops it. An id derived from a key is not recorded so: whoever knows another job's
/// type and key could compute it, and plant a row under it. A keyed task is cancelled
/// ahead of consumption by its key instead (`cancel_by_key`).
pub(super) async fn cancel(
    State(state): AppState,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let time_ordered = uuid::Uuid::parse_str(&id).is_ok_and(|id| id.get_version_num() == 7);
    let job = query_job(&state, &query)?.filter(|_| time_ordered);
    cancel_id(&state, &caller, job, id).await
}

/// Cancels task `id`; when `job` is Kafka-routed and no task `id` is stored yet, records
/// it as cancelled under `job`'s type (the caller needs the right to cancel `job`'s
/// tasks), for the consumer to drop.
async fn cancel_id(
    state: &ApiState,
    caller: &Caller,
    job: Option<Arc<asyncd_spec::Job>>,
    id: String,
) -> Result<Response, ApiError> {
    let now = state.clock.now_millis();
    if let Some(job) = job
        && job.kafka.is_some()
        && state.store.get(&id).await?.is_none()
    {
        state
            .auth
            .require(caller, Verb::Cancel, Some(&job.name))
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
    cancel_stored(state, caller, id, now).await
}

/// `DELETE /v1/tasks?job=J&unique_key=K` (or `type=T`): cancels the unfinished task of
/// that job holding unique key `K`. With `idempotency_key=K` instead: cancels the task
/// of that job submitted with idempotency key `K` — for a Kafka-routed job also while
/// its message still waits in the topic, as `DELETE /v1/tasks/{id}?job=J` does for a
/// task without a key.
pub(super) async fn cancel_by_key(
    State(state): AppState,
    caller: Caller,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let (field, key, job) = query_key(&state, &query, "cancel")?;
    state
        .auth
        .require(&caller, Verb::Cancel, Some(&job.name))
        .await?;
    if field == "idempotency_key" {
        // A stored task is found by its key. On a job with a Kafka topic a task not
        // consumed yet is cancelled under the id its key derives (`submit::task_id`).
        let id = match state
            .store
            .idempotency_key_holder(&job.task_type, key)
            .await?
        {
            Some(id) => id,
            None if job.kafka.is_some() => submit::key_id(&job.task_type, key),
            None => {
                return Err(ApiError::new(
                    ErrorCode::NotFound,
                    format!("no task of job {} holds idempotency key {key:?}", job.name),
                ));
            }
        };
        return cancel_id(&state, &caller, Some(job), id).await;
    }
    let Some(holder) = unfinished_unique_holder(&state, &job, key).await? else {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!(
                "no unfinished task of job {} holds unique key {key:?}",
                job.name
            ),
        ));
    };
    cancel_stored(&state, &caller, holder, state.clock.now_millis()).await
}

/// The id of the unfinished task of `job` holding unique key `key`, if one does.
async fn unfinished_unique_holder(
    state: &ApiState,
    job: &asyncd_spec::Job,
    key: &str,
) -> Result<Option<String>, ApiError> {
    let holders = state
        .store
        .search(SearchParams {
            task_type: Some(&job.task_type),
            unique_key: Some(key),
            limit: 100,
            ..SearchParams::default()
        })
        .await?;
    Ok(holders
        .into_iter()
        .find(|t| !t.state.is_final())
        .map(|t| t.id))
}

/// The key a `?job=J&unique_key=K` (or `idempotency_key=K`) call names — which of the
/// two, the key, and the job — for the task to `action`.
fn query_key<'q>(
    state: &ApiState,
    query: &'q HashMap<String, String>,
    action: &str,
) -> Result<(&'static str, &'q str, Arc<asyncd_spec::Job>), ApiError> {
    let (field, key) = match (query.get("unique_key"), query.get("idempotency_key")) {
        (Some(key), None) => ("unique_key", key),
        (None, Some(key)) => ("idempotency_key", key),
        (Some(_), Some(_)) => {
            return Err(ApiError::field(
                "idempotency_key",
                format!(
                    "name either the unique key or the idempotency key of the task to {action}"
                ),
            ));
        }
        (None, None) => {
            return Err(ApiError::field(
                "unique_key",
                format!(
                    "name the unique key (or idempotency key) of the task to {action} \
                     (/v1/tasks/{{id}} names it by id)"
                ),
            ));
        }
    };
    plain_text(field, key)?;
    let Some(job) = query_job(state, query)? else {
        return Err(ApiError::field(
            "job",
            "name the job (or type) whose task holds the key",
        ));
    };
    Ok((field, key, job))
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

/// `GET /v1/tasks`: tasks by filter, newest first, paged like dead letters. Reading
/// them needs the same right as reading one (`get`), on the job filtered by or, without
/// one, on every job.
pub(super) async fn search(
    State(state): AppState,
    caller: Caller,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    // No stored name or key has a control character, and PostgreSQL cannot even
    // compare with a NUL: such a filter is a bad request, not a store error.
    for field in ["job", "type", "unique_key"] {
        if let Some(value) = query.get(field) {
            plain_text(field, value)?;
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

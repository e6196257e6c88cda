//! Schedules as API objects (`/v1/schedules`, docs/api.md "Schedules"): create, read,
//! list, change, pause, delete, trigger and backfill. The store holds them
//! ([`asyncd_store::schedule`]) and the scheduler fires them, with the job's
//! `spec.cron` entries, which show here too, read-only (`source: config`).
//!
//! Reading a schedule needs the right to read the job's tasks; everything else the
//! right to submit them, since it makes tasks of the job.

use std::collections::HashMap;
use std::sync::Arc;

use asyncd_contract::{
    BackfillRequest, BackfillResult, CronTriggerResult, ErrorCode, MAX_BACKFILL, MAX_SCHEDULE_PAGE,
    Schedule, ScheduleCreate, SchedulePage, ScheduleSource as WireSource, ScheduleSpec,
};
use asyncd_spec::Job;
use asyncd_spec::schedule::rule::{ScheduleRule, check_name};
use asyncd_store::{InsertOutcome, Millis, PutSchedule, ScheduleRecord, ScheduleSource};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::extract::{Path, Query};
use super::submit::parse_json;
use super::{ApiState, AppState};
use crate::auth::{Caller, Verb};
use crate::clock::from_millis;
use crate::scheduler::plan::{firing, firing_key, rule_of, triggered};

/// How often a change retries its read-modify-write when another change of the same
/// schedule came in between.
const CHANGE_ATTEMPTS: usize = 5;
/// How many backfilled firings go into the store per transaction.
const BACKFILL_CHUNK: usize = 500;

/// The job named `name`, when `caller` may do `verb` on it.
async fn job_named(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    verb: Verb,
) -> Result<Arc<Job>, ApiError> {
    let job = state
        .routes
        .borrow()
        .jobs()
        .find(|job| job.name == name)
        .cloned()
        .ok_or_else(|| {
            ApiError::new(ErrorCode::NotFound, format!("no job {name:?}")).with_field("job")
        })?;
    state.auth.require(caller, verb, Some(&job.name)).await?;
    Ok(job)
}

fn no_schedule(job: &Job, name: &str) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!("job {} has no schedule {name:?}", job.name),
    )
    .with_field("name")
}

fn read_only(job: &Job, name: &str) -> ApiError {
    ApiError::new(
        ErrorCode::ScheduleReadOnly,
        format!(
            "schedule {name} of job {} is its config's spec.cron entry: change the config",
            job.name
        ),
    )
}

/// The schedule `name` of `job`, as stored.
async fn stored(state: &ApiState, job: &Job, name: &str) -> Result<ScheduleRecord, ApiError> {
    check_name(name).map_err(|message| ApiError::field("name", message))?;
    state
        .store
        .get_schedule(&job.task_type, name)
        .await?
        .ok_or_else(|| no_schedule(job, name))
}

/// Validates `spec` for `job`; the spec as stored (JSON) and its rule.
fn checked(state: &ApiState, spec: &ScheduleSpec) -> Result<(String, ScheduleRule), ApiError> {
    let rule =
        ScheduleRule::from_spec(spec).map_err(|err| ApiError::field(err.field, err.message))?;
    let payload = spec.payload.to_string();
    if payload.len() > state.limits.max_payload_bytes {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "payload: {} bytes is over the limit of {} bytes",
                payload.len(),
                state.limits.max_payload_bytes
            ),
        )
        .with_field("payload"));
    }
    let text = serde_json::to_string(spec).expect("a schedule spec serialises");
    Ok((text, rule))
}

/// A stored schedule as the API answers it.
pub fn schedule_of(job: &Job, row: &ScheduleRecord) -> Schedule {
    let spec: ScheduleSpec = serde_json::from_str(&row.spec).unwrap_or_default();
    // Before a scheduler has planned it, its next firing is the one it will plan.
    let next_at = row.next_at.or_else(|| {
        (!row.paused)
            .then(|| rule_of(row).ok())
            .flatten()
            .and_then(|rule| {
                rule.next_after(from_millis(row.updated_at), from_millis(row.created_at))
            })
            .map(Millis::from)
    });
    Schedule {
        job: job.name.clone(),
        name: row.name.clone(),
        task_type: row.task_type.clone(),
        source: match row.source {
            ScheduleSource::Api => WireSource::Api,
            ScheduleSource::Config => WireSource::Config,
        },
        spec: ScheduleSpec {
            paused: row.paused,
            ..spec
        },
        next_firing: (!row.paused).then_some(next_at).flatten().map(from_millis),
        last_firing: row.last_fired_at.map(from_millis),
        last_task_id: row.last_task_id.clone(),
        buffered_firing: row.buffered_at.map(from_millis),
        fired: row.fired,
        created_at: from_millis(row.created_at),
        updated_at: from_millis(row.updated_at),
    }
}

/// `POST /v1/schedules`: a new schedule; 409 `schedule_exists` if the job has one of
/// that name.
pub(super) async fn create(
    State(state): AppState,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = super::body_bytes(body, state.limits.body_bytes())?;
    // `job` and `name`, then the rest as a spec (which refuses members it does not know).
    let mut members: serde_json::Map<String, serde_json::Value> = parse_json(&body)?;
    let mut take = |member: &str| match members.remove(member) {
        Some(serde_json::Value::String(text)) => Ok(text),
        Some(_) => Err(ApiError::new(
            ErrorCode::MalformedJson,
            format!("{member}: must be a string"),
        )
        .with_field(member)),
        None => Err(ApiError::field(member, "is required")),
    };
    let (job_name, name) = (take("job")?, take("name")?);
    let spec: ScheduleSpec = parse_json(&serde_json::to_vec(&members).expect("JSON"))?;
    let request = ScheduleCreate {
        job: job_name,
        name,
        spec,
    };
    let job = job_named(&state, &caller, &request.job, Verb::Submit).await?;
    check_name(&request.name).map_err(|message| ApiError::field("name", message))?;
    let (text, _) = checked(&state, &request.spec)?;
    let now = state.clock.now_millis();
    let put = PutSchedule {
        task_type: &job.task_type,
        name: &request.name,
        source: ScheduleSource::Api,
        spec: &text,
        paused: request.spec.paused,
        now,
    };
    let Some(row) = state.store.create_schedule(put).await? else {
        return Err(ApiError::new(
            ErrorCode::ScheduleExists,
            format!(
                "name: job {} already has a schedule named {}",
                job.name, request.name
            ),
        )
        .with_field("name"));
    };
    tracing::info!(
        caller = caller.name(),
        job = job.name,
        schedule = request.name,
        "schedule created"
    );
    Ok((StatusCode::CREATED, Json(schedule_of(&job, &row))).into_response())
}

/// `PUT /v1/schedules/{job}/{name}`: creates the schedule, or writes over it (201 or
/// 200), so a caller keeping one schedule per customer need not know which.
pub(super) async fn put(
    State(state): AppState,
    caller: Caller,
    Path((job_name, name)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = super::body_bytes(body, state.limits.body_bytes())?;
    let spec: ScheduleSpec = parse_json(&body)?;
    let job = job_named(&state, &caller, &job_name, Verb::Submit).await?;
    check_name(&name).map_err(|message| ApiError::field("name", message))?;
    let (text, _) = checked(&state, &spec)?;
    let now = state.clock.now_millis();
    let put = PutSchedule {
        task_type: &job.task_type,
        name: &name,
        source: ScheduleSource::Api,
        spec: &text,
        paused: spec.paused,
        now,
    };
    for _ in 0..CHANGE_ATTEMPTS {
        match state.store.get_schedule(&job.task_type, &name).await? {
            Some(row) if row.source == ScheduleSource::Config => {
                return Err(read_only(&job, &name));
            }
            Some(row) => {
                if let Some(row) = state.store.update_schedule(put, Some(row.version)).await? {
                    return Ok(Json(schedule_of(&job, &row)).into_response());
                }
            }
            None => {
                if let Some(row) = state.store.create_schedule(put).await? {
                    return Ok((StatusCode::CREATED, Json(schedule_of(&job, &row))).into_response());
                }
            }
        }
    }
    Err(busy(&job, &name))
}

fn busy(job: &Job, name: &str) -> ApiError {
    ApiError::new(
        ErrorCode::StoreUnavailable,
        format!(
            "schedule {name} of job {} kept changing under this call; try again",
            job.name
        ),
    )
}

/// `GET /v1/schedules/{job}/{name}`.
pub(super) async fn get(
    State(state): AppState,
    caller: Caller,
    Path((job_name, name)): Path<(String, String)>,
) -> Result<Json<Schedule>, ApiError> {
    let job = job_named(&state, &caller, &job_name, Verb::Get).await?;
    let row = stored(&state, &job, &name).await?;
    Ok(Json(schedule_of(&job, &row)))
}

/// `GET /v1/schedules?job=J[&cursor=C][&limit=N]`: the job's schedules by name.
pub(super) async fn list(
    State(state): AppState,
    caller: Caller,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Json<SchedulePage>, ApiError> {
    let job_name = query
        .get("job")
        .ok_or_else(|| ApiError::field("job", "is required: the job whose schedules to list"))?;
    let job = job_named(&state, &caller, job_name, Verb::Get).await?;
    let limit = match query.get("limit") {
        None => 100,
        Some(text) => match text.parse::<u32>() {
            Ok(n) if (1..=MAX_SCHEDULE_PAGE).contains(&n) => n,
            _ => {
                return Err(ApiError::field(
                    "limit",
                    format!("must be 1..={MAX_SCHEDULE_PAGE}"),
                ));
            }
        },
    };
    let after = query.get("cursor").map(String::as_str);
    if let Some(after) = after {
        check_name(after)
            .map_err(|_| ApiError::field("cursor", "must be a next_cursor from a previous page"))?;
    }
    let rows = state
        .store
        .list_schedules(&job.task_type, after, limit)
        .await?;
    let next_cursor = (rows.len() == limit as usize)
        .then(|| rows.last().map(|row| row.name.clone()))
        .flatten();
    Ok(Json(SchedulePage {
        items: rows.iter().map(|row| schedule_of(&job, row)).collect(),
        next_cursor,
    }))
}

/// `PATCH /v1/schedules/{job}/{name}`: the members given replace the schedule's.
pub(super) async fn patch(
    State(state): AppState,
    caller: Caller,
    Path((job_name, name)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Schedule>, ApiError> {
    let body = super::body_bytes(body, state.limits.body_bytes())?;
    let patch: serde_json::Map<String, serde_json::Value> = parse_json(&body)?;
    let job = job_named(&state, &caller, &job_name, Verb::Submit).await?;
    if patch.is_empty() {
        // It would plan the schedule afresh and change nothing else.
        return Err(ApiError::field(
            "body",
            "give at least one member of the schedule to change",
        ));
    }
    change(&state, &job, &name, |spec| {
        let mut members = match serde_json::to_value(spec).expect("JSON") {
            serde_json::Value::Object(members) => members,
            _ => unreachable!("a spec is an object"),
        };
        for (member, value) in &patch {
            if value.is_null() {
                members.remove(member);
            } else {
                members.insert(member.clone(), value.clone());
            }
        }
        // `cron` and `every` exclude each other: giving one replaces the other.
        if patch.get("cron").is_some_and(|v| !v.is_null()) && !patch.contains_key("every") {
            members.remove("every");
        }
        if patch.get("every").is_some_and(|v| !v.is_null()) && !patch.contains_key("cron") {
            members.remove("cron");
        }
        parse_json(&serde_json::to_vec(&members).expect("JSON"))
    })
    .await
    .map(Json)
}

/// `POST /v1/schedules/{job}/{name}/pause`.
pub(super) async fn pause(
    State(state): AppState,
    caller: Caller,
    Path((job_name, name)): Path<(String, String)>,
) -> Result<Json<Schedule>, ApiError> {
    set_paused(state, caller, job_name, name, true).await
}

/// `POST /v1/schedules/{job}/{name}/resume`: it starts again with its next firing; the
/// firings of the pause are not caught up.
pub(super) async fn resume(
    State(state): AppState,
    caller: Caller,
    Path((job_name, name)): Path<(String, String)>,
) -> Result<Json<Schedule>, ApiError> {
    set_paused(state, caller, job_name, name, false).await
}

async fn set_paused(
    state: Arc<ApiState>,
    caller: Caller,
    job_name: String,
    name: String,
    paused: bool,
) -> Result<Json<Schedule>, ApiError> {
    let job = job_named(&state, &caller, &job_name, Verb::Submit).await?;
    let before = stored(&state, &job, &name).await?;
    let schedule = change(&state, &job, &name, |spec| {
        Ok(ScheduleSpec { paused, ..spec })
    })
    .await?;
    if paused {
        cancel_ahead(&state, &job, &before).await?;
    }
    Ok(Json(schedule))
}

/// Cancels the firings `row` created ahead of their instant (a schedule that allows
/// overlaps has them up to a minute ahead), so a pause or a delete stops the schedule
/// at once. Their instants lie between now and its next firing not created.
async fn cancel_ahead(state: &ApiState, job: &Job, row: &ScheduleRecord) -> Result<(), ApiError> {
    let (Some(next_at), Ok(rule)) = (row.next_at, rule_of(row)) else {
        return Ok(());
    };
    let now = state.clock.now_millis();
    let anchor = from_millis(row.created_at);
    // Jitter may put a firing's due time after now while its instant is before.
    let mut after = from_millis(now.saturating_sub(rule.jitter));
    let mut keys = Vec::new();
    while let Some(at) = rule.next_after(after, anchor)
        && Millis::from(at) < next_at
        && keys.len() < crate::scheduler::plan::MAX_FIRINGS_PER_PLAN
    {
        keys.push(firing_key(job, &row.name, Millis::from(at)));
        after = at;
    }
    let cancelled = state.store.cancel_firings(&keys, now).await?;
    if cancelled > 0 {
        tracing::info!(
            job = job.name,
            schedule = row.name,
            cancelled,
            "firings created ahead of their instant cancelled"
        );
    }
    Ok(())
}

/// Reads schedule `name`, applies `edit` to its spec and writes it back, again if
/// another change came in between.
async fn change(
    state: &ApiState,
    job: &Job,
    name: &str,
    edit: impl Fn(ScheduleSpec) -> Result<ScheduleSpec, ApiError>,
) -> Result<Schedule, ApiError> {
    for _ in 0..CHANGE_ATTEMPTS {
        let row = stored(state, job, name).await?;
        if row.source == ScheduleSource::Config {
            return Err(read_only(job, name));
        }
        let current: ScheduleSpec = serde_json::from_str(&row.spec).unwrap_or_default();
        let spec = edit(ScheduleSpec {
            paused: row.paused,
            ..current
        })?;
        let (text, _) = checked(state, &spec)?;
        let put = PutSchedule {
            task_type: &job.task_type,
            name,
            source: ScheduleSource::Api,
            spec: &text,
            paused: spec.paused,
            now: state.clock.now_millis(),
        };
        if let Some(row) = state.store.update_schedule(put, Some(row.version)).await? {
            return Ok(schedule_of(job, &row));
        }
    }
    Err(busy(job, name))
}

/// `DELETE /v1/schedules/{job}/{name}`: its firings already created stay.
pub(super) async fn delete(
    State(state): AppState,
    caller: Caller,
    Path((job_name, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let job = job_named(&state, &caller, &job_name, Verb::Submit).await?;
    let row = stored(&state, &job, &name).await?;
    if row.source == ScheduleSource::Config {
        return Err(read_only(&job, &name));
    }
    if !state.store.delete_schedule(&job.task_type, &name).await? {
        return Err(no_schedule(&job, &name));
    }
    cancel_ahead(&state, &job, &row).await?;
    tracing::info!(
        caller = caller.name(),
        job = job.name,
        schedule = name,
        "schedule deleted"
    );
    Ok(StatusCode::NO_CONTENT)
}

/// The rule of `job`'s schedule `name`: its config entry's, or the stored schedule's.
async fn rule_named(state: &ApiState, job: &Job, name: &str) -> Result<ScheduleRule, ApiError> {
    if let Some(entry) = job.cron.iter().find(|entry| entry.name == name) {
        return Ok(entry.rule());
    }
    let row = stored(state, job, name).await?;
    rule_of(&row).map_err(|err| {
        ApiError::new(
            ErrorCode::StoreUnavailable,
            format!("schedule {name} cannot be read: {err}"),
        )
    })
}

/// Fires schedule `name` of `job` once, now, besides its firings: `POST
/// /v1/schedules/{job}/{name}/trigger`, and `POST /v1/jobs/{job}/cron/{name}/trigger`,
/// which names a config entry or an API schedule alike.
pub(super) async fn trigger_named(
    state: &ApiState,
    caller: &Caller,
    job: &Job,
    name: &str,
) -> Result<Response, ApiError> {
    let rule = rule_named(state, job, name).await?;
    let now = state.clock.now_millis();
    let task = triggered(job, &rule, name, now);
    let outcome = state.store.insert(std::slice::from_ref(&task), now).await?;
    let (id, trigger_at) = match outcome.into_iter().next() {
        Some(InsertOutcome::Inserted { id, trigger_at }) => (id, trigger_at),
        Some(InsertOutcome::UniqueConflict { existing_id }) => {
            return Err(ApiError::new(
                ErrorCode::UniqueConflict,
                format!(
                    "schedule {name} does not allow overlaps and its firing {existing_id} has not finished"
                ),
            )
            .with_existing_id(existing_id));
        }
        other => {
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
        schedule = name,
        task_id = id.as_str(),
        "schedule triggered"
    );
    Ok((
        StatusCode::CREATED,
        Json(CronTriggerResult {
            id,
            job: job.name.clone(),
            entry: name.to_string(),
            task_type: job.task_type.clone(),
            eta: from_millis(trigger_at),
        }),
    )
        .into_response())
}

/// `POST /v1/schedules/{job}/{name}/trigger`.
pub(super) async fn trigger(
    State(state): AppState,
    caller: Caller,
    Path((job_name, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let job = job_named(&state, &caller, &job_name, Verb::Submit).await?;
    trigger_named(&state, &caller, &job, &name).await
}

/// `POST /v1/schedules/{job}/{name}/backfill`: the firings in `[from, to)`, each
/// created once however often this is called.
pub(super) async fn backfill(
    State(state): AppState,
    caller: Caller,
    Path((job_name, name)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<BackfillResult>, ApiError> {
    let body = super::body_bytes(body, state.limits.body_bytes())?;
    let request: BackfillRequest = parse_json(&body)?;
    let job = job_named(&state, &caller, &job_name, Verb::Submit).await?;
    if request.to <= request.from {
        return Err(ApiError::field("to", "must be after from"));
    }
    if Millis::from(request.to) > state.clock.now_millis() {
        return Err(ApiError::field(
            "to",
            "must not be in the future: the schedule creates its coming firings itself",
        ));
    }
    let rule = rule_named(&state, &job, &name).await?;
    let row = state.store.get_schedule(&job.task_type, &name).await?;
    let anchor = row.map_or(request.from, |row| from_millis(row.created_at));
    let mut firings = Vec::new();
    let mut after = request.from - chrono::Duration::milliseconds(1);
    while let Some(at) = rule.next_after(after, anchor)
        && at < request.to
    {
        if firings.len() == MAX_BACKFILL as usize {
            return Err(ApiError::field(
                "to",
                format!("the range holds more than {MAX_BACKFILL} firings: backfill it in parts"),
            ));
        }
        // Overlap does not apply to a backfill: each firing is a task of its own.
        firings.push(asyncd_store::NewTask {
            unique_key: None,
            ..firing(&job, &rule, &name, Millis::from(at), None)
        });
        after = at;
    }
    let now = state.clock.now_millis();
    let mut created = 0;
    for chunk in firings.chunks(BACKFILL_CHUNK) {
        let outcomes = state.store.insert(chunk, now).await?;
        created += outcomes
            .iter()
            .filter(|outcome| matches!(outcome, InsertOutcome::Inserted { .. }))
            .count() as u64;
    }
    if created > 0
        && let Some(waker) = &state.waker
    {
        waker.wake();
    }
    tracing::info!(
        caller = caller.name(),
        job = job.name,
        schedule = name,
        firings = firings.len(),
        created,
        "schedule backfilled"
    );
    Ok(Json(BackfillResult {
        firings: firings.len() as u64,
        created,
    }))
}

//! Dead letters: tasks that ran out of attempts (or failed permanently). `GET
//! /v1/dead-letters` lists them, `POST /v1/dead-letters/{id}/redrive` runs one again, and
//! `POST /v1/dead-letters/redrive` and `POST /v1/dead-letters/purge` act on those a
//! filter matches, in bulk.
//!
//! One bulk call acts on at most [`MAX_BULK`] dead letters (see the store's `bulk` module
//! for why), and answers how many matched before and remain after; a client repeats the
//! call with the answer's `dead_before` until none remain. Fixing `dead_before` at the
//! first call is what makes the loop idempotent and resumable: a redriven task that dies
//! again has died after it, so no later call of the same action redrives it a second time.

use std::collections::HashMap;

use asyncd_contract::{
    DeadLetterBulk, DeadLetterBulkResult, ErrorCode, MAX_BULK, MAX_LISTING_BYTES, RedriveResult,
};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;

use super::extract::{Path, Query};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::listing::{listing, listing_limit, parse_cursor};
use super::submit::{parse_json, plain_text};
use super::{AppState, body_bytes};
use crate::auth::{Caller, Verb};
use crate::clock::from_millis;
use asyncd_store::{
    BulkAction, DeadFilter, DeadLetterParams, Millis, RedriveOutcome, domain::MAX_REASON_CHARS,
};

/// `GET /v1/dead-letters`: dead tasks, latest due first, paged.
pub(super) async fn list(
    State(state): AppState,
    caller: Caller,
    Query(query): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    if let Some(task_type) = query.get("type") {
        plain_text("type", task_type)?;
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

/// `POST /v1/dead-letters/{id}/redrive`: the dead task runs again.
pub(super) async fn redrive(
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

/// A body is a filter of a few fields; anything larger is not one.
const MAX_BODY_BYTES: usize = 16 * 1024;

/// `POST /v1/dead-letters/redrive`.
pub(super) async fn redrive_matching(
    state: AppState,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DeadLetterBulkResult>, ApiError> {
    act(state, caller, body, BulkAction::Redrive).await
}

/// `POST /v1/dead-letters/purge`: deletes them.
pub(super) async fn purge_matching(
    state: AppState,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DeadLetterBulkResult>, ApiError> {
    act(state, caller, body, BulkAction::Purge).await
}

async fn act(
    State(state): AppState,
    caller: Caller,
    body: Result<Bytes, BytesRejection>,
    action: BulkAction,
) -> Result<Json<DeadLetterBulkResult>, ApiError> {
    let body = body_bytes(body, MAX_BODY_BYTES)?;
    // Unknown fields are refused too: a misspelt filter must not widen a purge.
    let request: DeadLetterBulk = parse_json(&body)?;
    for (field, value) in [
        ("job", &request.job),
        ("type", &request.task_type),
        ("error_prefix", &request.error_prefix),
    ] {
        if let Some(value) = value {
            plain_text(field, value)?;
        }
    }
    if request
        .error_prefix
        .as_ref()
        .is_some_and(|p| p.chars().count() > MAX_REASON_CHARS)
    {
        return Err(ApiError::field(
            "error_prefix",
            format!("must be at most {MAX_REASON_CHARS} characters, as much as a last error keeps"),
        ));
    }
    let limit = request.limit.unwrap_or(MAX_BULK);
    if !(1..=MAX_BULK).contains(&limit) {
        return Err(ApiError::field(
            "limit",
            format!("must be from 1 to {MAX_BULK}"),
        ));
    }
    let task_type = match (&request.job, &request.task_type) {
        (Some(job), task_type) => {
            let routes = state.routes.borrow().clone();
            let Some(found) = routes.jobs().find(|j| j.name == *job) else {
                return Err(ApiError::field(
                    "job",
                    format!("no AsyncJobConfig is named {job:?}"),
                ));
            };
            if task_type.as_ref().is_some_and(|t| *t != found.task_type) {
                return Err(ApiError::field(
                    "type",
                    format!(
                        "job {job:?} runs tasks of type {:?}; leave type out or name that one",
                        found.task_type
                    ),
                ));
            }
            found.task_type.clone()
        }
        (None, Some(task_type)) => task_type.clone(),
        (None, None) => {
            return Err(ApiError::field(
                "job",
                "name a job or a task type (\"job\" or \"type\")",
            ));
        }
    };
    let job = state.job_name(&task_type);
    let verb = match action {
        BulkAction::Redrive => Verb::Redrive,
        BulkAction::Purge => Verb::Purge,
    };
    state.auth.require(&caller, verb, job.as_deref()).await?;

    let now = state.clock.now_millis();
    let dead_before = request.dead_before.map(Millis::from).unwrap_or(now);
    let filter = DeadFilter {
        task_type: &task_type,
        error_prefix: request.error_prefix.as_deref(),
        dead_after: request.dead_after.map(Millis::from),
        dead_before,
        action,
    };
    let before = state.store.count_dead(filter).await?;
    let (affected, after) = if request.dry_run || before.actionable == 0 {
        (0, before)
    } else {
        let affected = state.store.act_on_dead(filter, limit, now).await?;
        (affected, state.store.count_dead(filter).await?)
    };
    if affected > 0 {
        tracing::info!(
            caller = caller.name(),
            task_type,
            ?action,
            affected,
            remaining = after.actionable,
            "dead letters acted on in bulk"
        );
        if action == BulkAction::Redrive
            && let Some(waker) = &state.waker
        {
            waker.wake();
        }
    }
    Ok(Json(DeadLetterBulkResult {
        matched: before.matched,
        affected,
        skipped: after.matched.saturating_sub(after.actionable),
        remaining: after.actionable,
        dry_run: request.dry_run,
        dead_before: from_millis(dead_before),
    }))
}

//! A change of a task that has not begun (`PATCH /v1/tasks/{id}`), checked as a submit's
//! fields are.

use serde_json::value::RawValue;

use super::validate::{Limits, priority, within_payload_limit};
use super::when::due_at;
use crate::api::error::ApiError;
use crate::job_table::RouteTable;
use asyncd_spec::job::Job;
use asyncd_store::{Millis, TaskChange, TaskRecord, TaskState};

/// A change of `task` (`PATCH /v1/tasks/{id}`), checked as a submit's fields are. A new
/// payload must leave the keys its job renders from the payload (`uniqueKey`,
/// `concurrencyKey`) as they are: those are the task's identity among its job's tasks,
/// and a new identity is a new task.
pub fn check_change<'a>(
    req: &'a asyncd_contract::ChangeRequest<Box<RawValue>>,
    task: &TaskRecord,
    routes: &RouteTable,
    limits: &Limits,
    now: Millis,
) -> Result<TaskChange<'a>, ApiError> {
    let change = change_values(req, limits, now)?;
    // A waiting task due at or after its expiry could never begin: refused rather than
    // expired on arrival. (`expires_at` never changes, so reading it first is safe; a
    // task that began or ended is left to the store's answer, 409.)
    let waiting = matches!(
        task.state,
        TaskState::Blocked | TaskState::Pending | TaskState::Claimed
    );
    if let (true, Some(due), Some(expires_at)) = (waiting, change.trigger_at, task.expires_at)
        && due >= expires_at
    {
        let field = match (req.run_now, &req.delay) {
            (Some(true), _) => "run_now",
            (_, Some(_)) => "delay",
            _ => "eta",
        };
        return Err(ApiError::field(
            field,
            "must be before the task's expires_at: it could never begin",
        ));
    }
    if let Some(payload) = req.payload.as_deref()
        && let Some(job) = routes.job(&task.task_type)
    {
        same_keys(job, task, payload)?;
    }
    Ok(change)
}

/// A change of a Kafka-routed task of `job` whose message has not been consumed
/// ([`asyncd_store::Store::change_unconsumed`]). Its payload is not known here, so a new
/// payload is refused where the job renders keys from it: whether the keys stay could
/// not be checked.
pub fn check_unconsumed_change<'a>(
    req: &'a asyncd_contract::ChangeRequest<Box<RawValue>>,
    job: &Job,
    limits: &Limits,
    now: Millis,
) -> Result<TaskChange<'a>, ApiError> {
    let change = change_values(req, limits, now)?;
    if change.payload.is_some() && (job.unique_key.is_some() || job.concurrency_key.is_some()) {
        return Err(ApiError::field(
            "payload",
            format!(
                "job {} renders keys from the payload, and this task has not been consumed \
                 from Kafka yet, so its keys cannot be checked: change its payload once it is \
                 stored",
                job.name
            ),
        ));
    }
    Ok(change)
}

/// The values a change names, each checked as a submit's.
fn change_values<'a>(
    req: &'a asyncd_contract::ChangeRequest<Box<RawValue>>,
    limits: &Limits,
    now: Millis,
) -> Result<TaskChange<'a>, ApiError> {
    let due = due_at(req.delay.as_deref(), req.eta.as_deref(), now)?;
    let trigger_at = match (req.run_now, due) {
        (Some(true), Some(_)) => {
            return Err(ApiError::field(
                "run_now",
                "give run_now, delay or eta, not two",
            ));
        }
        (Some(true), None) => Some(now),
        (_, due) => due,
    };
    let payload = req.payload.as_deref();
    if let Some(payload) = payload {
        within_payload_limit(payload, limits)?;
    }
    let priority = req.priority.map(priority).transpose()?;
    if trigger_at.is_none() && payload.is_none() && priority.is_none() {
        return Err(ApiError::field(
            "payload",
            "name what to change: payload, delay, eta, run_now or priority",
        ));
    }
    Ok(TaskChange {
        trigger_at,
        payload: payload.map(RawValue::get),
        priority,
    })
}

/// Refuses a new payload from which `job` renders other keys than from the task's.
fn same_keys(job: &Job, task: &TaskRecord, payload: &RawValue) -> Result<(), ApiError> {
    if job.unique_key.is_none() && job.concurrency_key.is_none() {
        return Ok(());
    }
    let new: serde_json::Value =
        serde_json::from_str(payload.get()).map_err(|e| ApiError::field("payload", e))?;
    let old: serde_json::Value = serde_json::from_str(task.payload.get()).unwrap_or_default();
    let renders = [
        (
            "uniqueKey",
            job.render_unique_key(&old),
            job.render_unique_key(&new),
        ),
        (
            "concurrencyKey",
            job.render_concurrency_key(&old),
            job.render_concurrency_key(&new),
        ),
    ];
    for (what, old, new) in renders {
        if old.ok() != new.ok() {
            return Err(ApiError::field(
                "payload",
                format!(
                    "the job renders the task's {what} from its payload, and this one gives \
                     another: cancel the task and submit a new one"
                ),
            ));
        }
    }
    Ok(())
}

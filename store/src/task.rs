//! The tasks the store takes and hands out, and what each transition of one answers.

use std::time::Duration;

use asyncd_contract::{TaskState, TraceContext};
use serde_json::value::RawValue;

use crate::window::KeyWindow;
use crate::{Millis, duration_ms};

/// A task to insert, validated by the API or the cron scheduler.
#[derive(Debug, Clone)]
pub struct NewTask {
    pub id: String,
    pub task_type: String,
    pub payload: Box<RawValue>,
    pub priority: u8,
    pub trigger_at: Millis,
    pub max_retries: u32,
    pub timeout_ms: i64,
    pub idempotency_key: Option<String>,
    pub unique_key: Option<String>,
    /// How long the unique key stays held after the task succeeded (its job's
    /// `spec.retention.uniqueKeys` at submit time); zero frees it when the task finishes.
    pub unique_for: Duration,
    /// Identity of a cron firing (`type/name/millis`): the same firing is inserted once.
    pub cron_key: Option<String>,
    pub depends_on: Vec<String>,
    pub source_service: Option<String>,
    /// The job's `concurrencyKey` rendered from the payload.
    pub concurrency_key: Option<String>,
    /// The submitter's trace, continued by every attempt.
    pub trace: Option<TraceContext>,
    /// No attempt begins at or after this time: the task ends
    /// [`TaskState::Expired`] instead ([`crate::Store::expire`]).
    pub expires_at: Option<Millis>,
    /// A debounce or throttle: the insert combines this submit with the others of its
    /// key ([`crate::window`]).
    pub window: Option<KeyWindow>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum InsertOutcome {
    Inserted {
        id: String,
        trigger_at: Millis,
    },
    /// The idempotency key or cron firing already exists: the first task.
    Duplicate {
        id: String,
        trigger_at: Millis,
    },
    /// The idempotency key is held by a task with another type or payload.
    IdempotencyMismatch {
        existing_id: String,
    },
    /// Another task holds the unique key: an unfinished one, or one that succeeded
    /// within its [`NewTask::unique_for`].
    UniqueConflict {
        existing_id: String,
    },
    /// A `depends_on` id names no task.
    UnknownDependency {
        id: String,
    },
    /// A task of another type holds the task's id: not a repeat of this one. The
    /// holder belongs to another job, so the outcome names only the task's own id.
    IdTaken {
        id: String,
    },
    /// A trailing debounce folded the submit into its key's waiting task `id`, now due
    /// at `trigger_at` with the submit's payload.
    Debounced {
        id: String,
        trigger_at: Millis,
    },
    /// A leading debounce or a throttle held the submit back: nothing was stored. `id`
    /// is the task the key's window last stored, `until` when the window closes;
    /// `refuse` is the window's [`KeyWindow::refuse_held`].
    Held {
        id: String,
        until: Millis,
        refuse: bool,
    },
}

impl InsertOutcome {
    /// Whether the task was refused: another request's task holds one of its keys, or
    /// a dependency it names does not exist. A repeat, a taken id, a debounce and a held
    /// submit are answers, not refusals.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::IdempotencyMismatch { .. }
                | Self::UniqueConflict { .. }
                | Self::UnknownDependency { .. }
        )
    }
}

/// A task as `GET /v1/tasks/{id}` shows it.
#[derive(Debug, Clone)]
pub struct TaskRecord {
    pub id: String,
    pub task_type: String,
    pub payload: Box<RawValue>,
    pub state: TaskState,
    pub priority: u8,
    pub trigger_at: Millis,
    pub attempt: u32,
    pub max_retries: u32,
    pub timeout_ms: i64,
    pub lease_token: i64,
    pub lease_until: Option<Millis>,
    pub idempotency_key: Option<String>,
    pub unique_key: Option<String>,
    pub depends_on: Vec<String>,
    pub last_error: Option<String>,
    pub result: Option<Box<RawValue>>,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// Where each attempt's executor-facing lease token comes from ([`crate::lease`]);
    /// empty only for a row written by hand, whose callbacks are then refused.
    pub lease_secret: String,
    /// See [`NewTask::expires_at`].
    pub expires_at: Option<Millis>,
}

/// A task claimed into a dispatcher's heap.
#[derive(Debug, Clone)]
pub struct ClaimedTask {
    pub id: String,
    pub task_type: String,
    pub payload: Box<RawValue>,
    pub priority: u8,
    pub trigger_at: Millis,
    pub attempt: u32,
    pub max_retries: u32,
    pub timeout_ms: i64,
    pub lease_token: i64,
    pub idempotency_key: Option<String>,
    /// See [`TaskRecord::lease_secret`].
    pub lease_secret: String,
    /// See [`NewTask::concurrency_key`].
    pub concurrency_key: Option<String>,
    /// See [`NewTask::trace`].
    pub trace: Option<TraceContext>,
    /// See [`NewTask::expires_at`].
    pub expires_at: Option<Millis>,
}

impl ClaimedTask {
    /// Whether the task may no longer begin at `now` ([`NewTask::expires_at`]).
    pub fn expired_by(&self, now: Millis) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }
}

/// A task [`crate::Store::expire`] ended: it had not begun by its
/// [`NewTask::expires_at`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredTask {
    pub id: String,
    pub task_type: String,
}

/// What one priority level is worth among due tasks: a task of priority `p` due at `t`
/// ranks as if it were due at `t - p × PRIORITY_STEP`. So a priority-9 task overtakes the
/// lower-priority tasks that became due up to 90 s before it, and ageing bounds what a
/// low-priority task waits: once it has been due for `(9 - p) × PRIORITY_STEP`, no task
/// that comes due later ranks before it. Migration `0006_claim_rank.sql` computes the
/// store's `claim_rank` with the same step; change both together.
pub const PRIORITY_STEP: Duration = Duration::from_secs(10);

impl ClaimedTask {
    /// The task's place among its job's due work: lower first, ties by id (older first).
    /// A dispatcher begins due tasks in this order ([`crate::heap::ReadyHeap`]), and the
    /// store claims in it.
    pub fn rank(&self) -> (i64, &str) {
        let step = duration_ms(PRIORITY_STEP);
        (
            self.trigger_at
                .as_i64()
                .saturating_sub(i64::from(self.priority).saturating_mul(step)),
            &self.id,
        )
    }
}

/// A claimed task whose attempt has begun: `attempt` and `lease_token` are the new ones.
#[derive(Debug, Clone)]
pub struct Started {
    pub id: String,
    pub attempt: u32,
    pub lease_token: i64,
}

/// Ends an attempt (or a claim), conditional on the token.
#[derive(Debug, Clone)]
pub struct Finish {
    pub id: String,
    pub lease_token: i64,
    pub kind: FinishKind,
}

#[derive(Debug, Clone)]
pub enum FinishKind {
    Succeeded {
        result: Option<Box<RawValue>>,
    },
    /// Back to pending at `at`; the attempt counted.
    Retry {
        at: Millis,
        error: String,
    },
    Dead {
        error: String,
    },
    /// A claimed task handed back unstarted (shutdown, job removed, lapsed claim).
    Release,
    /// The attempt goes on (202, heartbeat) until `until`.
    Extend {
        until: Millis,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum CancelOutcome {
    Cancelled,
    NotFound,
    NotCancellable(TaskState),
}

/// [`Store::change`](crate::Store::change)'s new values for a task that has not begun;
/// `None` keeps the task's own.
#[derive(Debug, Clone, Copy, Default)]
pub struct TaskChange<'a> {
    pub trigger_at: Option<Millis>,
    /// JSON, stored byte for byte as a submit's payload is.
    pub payload: Option<&'a str>,
    pub priority: Option<u8>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ChangeOutcome {
    /// Changed in place, id kept. A claimed task is `pending` again: its claim's token is
    /// spent, so the dispatcher holding it cannot begin it with the old values.
    Changed,
    NotFound,
    /// It has begun (`running`) or ended: nothing changed.
    NotChangeable(TaskState),
}

#[derive(Debug, Clone, PartialEq)]
pub enum RedriveOutcome {
    /// Back to `pending`, or to `blocked` while one of its dependencies has not
    /// succeeded (it waits on them again, as when it was submitted).
    Redriven {
        trigger_at: Millis,
        state: TaskState,
    },
    NotFound,
    NotDead(TaskState),
    UniqueConflict {
        existing_id: String,
    },
}

/// A claim or attempt whose lease ran out: the rescuer decides what becomes of it.
#[derive(Debug, Clone)]
pub struct Lapsed {
    pub id: String,
    pub task_type: String,
    pub state: TaskState,
    pub attempt: u32,
    pub max_retries: u32,
    pub lease_token: i64,
}

/// What [`Store::insert_workflow`](crate::Store::insert_workflow) answers.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkflowOutcome {
    /// Every task stored (or found as a repeat), one outcome per task.
    Stored(Vec<InsertOutcome>),
    /// Nothing stored: task `index` was refused so.
    Refused {
        index: usize,
        outcome: InsertOutcome,
    },
}

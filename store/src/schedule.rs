//! Schedules in the store (migration 0020): the API's `/v1/schedules` and the
//! AsyncJobConfig cron entries, one row each, fired by any number of schedulers.
//!
//! The store knows no cron: a scheduler's planner ([`Planner`]) turns a row into the
//! firings due and when to look at the row again ([`FirePlan`]); [`crate::Store::fire_schedules`]
//! runs it on each row it takes and, in the same transaction, inserts the firings,
//! applies the row's overlap policy to each and writes where the row stands. A row is
//! taken by one scheduler at a time (`FOR UPDATE SKIP LOCKED` where rows lock; SQLite
//! has one writer), and each firing has its identity as its `cron_key`, so a firing is
//! created once however many schedulers run.

use std::time::Duration;

use asyncd_spec::job::Overlap;

use crate::{Millis, NewTask};

/// How often a scheduler looks again at a schedule holding a firing back
/// (`overlap: BufferOne`), to create it once the previous firing has finished.
pub const BUFFER_RECHECK: Duration = Duration::from_secs(1);

/// Who manages a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleSource {
    /// `/v1/schedules`.
    Api,
    /// An AsyncJobConfig cron entry, kept in step by the scheduler
    /// ([`crate::Store::sync_config_schedules`]).
    Config,
}

impl ScheduleSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::Config => "config",
        }
    }

    pub(crate) fn parse(text: &str) -> Self {
        if text == "config" {
            Self::Config
        } else {
            Self::Api
        }
    }
}

/// A schedule's row.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleRecord {
    pub task_type: String,
    pub name: String,
    pub source: ScheduleSource,
    /// The schedule as the API takes it (`asyncd_contract::ScheduleSpec`), in JSON.
    pub spec: String,
    pub paused: bool,
    /// The next firing not yet created; `None` before a scheduler planned the row (it
    /// then plans from `updated_at`).
    pub next_at: Option<Millis>,
    /// When a scheduler must look at the row next; `None` while paused or ended.
    pub wake_at: Option<Millis>,
    /// A firing held back by `overlap: BufferOne`.
    pub buffered_at: Option<Millis>,
    pub last_task_id: Option<String>,
    pub last_fired_at: Option<Millis>,
    pub fired: u64,
    /// Counts the row's writes: [`crate::Store::update_schedule`] applies only on the
    /// version read.
    pub version: i64,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// A schedule to create or to write over ([`crate::Store::create_schedule`],
/// [`crate::Store::update_schedule`]). Either way the row is planned afresh from `now`:
/// its next firing is the first after `now`, and what an outage missed before is not
/// caught up.
#[derive(Debug, Clone, Copy)]
pub struct PutSchedule<'a> {
    pub task_type: &'a str,
    pub name: &'a str,
    pub source: ScheduleSource,
    pub spec: &'a str,
    pub paused: bool,
    pub now: Millis,
}

/// A config schedule, as [`crate::Store::sync_config_schedules`] takes it.
#[derive(Debug, Clone)]
pub struct ConfigSchedule {
    pub name: String,
    pub spec: String,
    pub paused: bool,
}

/// One pass of [`crate::Store::fire_schedules`].
#[derive(Debug, Clone, Copy)]
pub struct FireParams {
    pub now: Millis,
    /// Rows whose `wake_at` is at or before this are taken.
    pub wake_by: Millis,
    /// The most rows taken (one transaction).
    pub limit: u32,
}

/// What a planner makes of a row: the firings to create, in order, and where the row
/// stands after them.
#[derive(Debug, Clone)]
pub struct FirePlan {
    pub firings: Vec<PlannedFiring>,
    pub next_at: Option<Millis>,
    pub wake_at: Option<Millis>,
    pub overlap: Overlap,
}

impl FirePlan {
    /// Nothing to create; look again at `wake_at`.
    pub fn wait(row: &ScheduleRecord, wake_at: Option<Millis>) -> Self {
        Self {
            firings: Vec::new(),
            next_at: row.next_at,
            wake_at,
            overlap: Overlap::Allow,
        }
    }
}

/// A firing to create: `task` (its `cron_key` the firing's identity; a unique key
/// shared by the schedule's firings unless it allows overlaps), for the instant `at`.
#[derive(Debug, Clone)]
pub struct PlannedFiring {
    pub at: Millis,
    pub task: NewTask,
    /// The firing `overlap: BufferOne` held back, tried again.
    pub buffered: bool,
}

/// The planner a scheduler hands [`crate::Store::fire_schedules`]: pure, run inside the
/// transaction holding the row.
pub type Planner<'a> = &'a (dyn Fn(&ScheduleRecord) -> FirePlan + Send + Sync);

/// What became of a planned firing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FiringOutcome {
    /// Stored as task `id`.
    Created { id: String },
    /// The firing was stored before (a backfill, a pass retried).
    Existed { id: String },
    /// Skipped: the previous firing (`running`) has not finished (`Skip`, or
    /// `BufferOne` with a firing already held back).
    Skipped { running: String },
    /// Held back until the previous firing finishes (`BufferOne`).
    Buffered { running: String },
    /// `CancelOther`: the previous firing was cancelled and this one stored.
    Replaced { id: String, cancelled: String },
    /// The store refused it for another reason (logged by the scheduler).
    Refused { reason: String },
}

/// What one [`crate::Store::fire_schedules`] call did.
#[derive(Debug, Clone, Default)]
pub struct FirePass {
    /// Schedules taken: a pass that took its limit may have left more due.
    pub schedules: usize,
    pub fired: Vec<Fired>,
}

/// A firing a pass dealt with.
#[derive(Debug, Clone)]
pub struct Fired {
    pub task_type: String,
    pub name: String,
    pub at: Millis,
    pub task: NewTask,
    pub outcome: FiringOutcome,
}

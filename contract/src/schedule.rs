//! Schedules as API objects: `/v1/schedules` (docs/api.md, "Schedules"). A schedule
//! fires tasks of its job on a cron (with its time zone) or at a fixed interval, like
//! an AsyncJobConfig's `spec.cron` entry, but is created, changed and deleted at
//! runtime, by the million.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::CronOverlap;

/// The longest schedule name, in bytes.
pub const MAX_SCHEDULE_NAME: usize = 200;
/// The most schedules one `GET /v1/schedules` lists (the default is 100).
pub const MAX_SCHEDULE_PAGE: u32 = 1000;
/// The most firings one `POST /v1/schedules/{job}/{name}/backfill` creates.
pub const MAX_BACKFILL: u32 = 10_000;

/// What a schedule does: when it fires and what each firing is. The body of
/// `PUT /v1/schedules/{job}/{name}`, and (with `job` and `name`) of `POST /v1/schedules`;
/// each member of `PATCH` replaces the schedule's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    /// `CRON_TZ=Area/City` and a 5- or 6-field cron expression, e.g.
    /// `"CRON_TZ=Europe/Berlin 0 9 * * MON"`. Exactly one of `cron` and `every`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// A fixed interval (`"90s"`, `"15m"`, `"1h"`; at least 1 s), counted from
    /// `start_at`, or from the schedule's creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    /// Each firing's payload: any JSON value. In its strings, `{{scheduled_at}}` becomes
    /// the firing's instant (RFC 3339, UTC) and `{{schedule}}` the schedule's name.
    #[serde(default)]
    pub payload: serde_json::Value,
    /// Each firing's priority, 0 to 9.
    #[serde(default)]
    pub priority: u8,
    /// What a firing does while the previous one has not finished (default `Allow`).
    #[serde(default)]
    pub overlap: CronOverlap,
    /// How far back firings missed while no scheduler could write them are still
    /// created, and run at once: a duration up to 7d, or `"0s"` for none (default 1h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catch_up: Option<String>,
    /// No firing before this instant.
    #[serde(
        default,
        with = "crate::time::rfc3339_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::schema_option")
    )]
    pub start_at: Option<DateTime<Utc>>,
    /// No firing after this instant: the schedule has ended.
    #[serde(
        default,
        with = "crate::time::rfc3339_option",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::schema_option")
    )]
    pub end_at: Option<DateTime<Utc>>,
    /// Each firing is due up to this much after its instant (a duration, at most the
    /// interval between firings and at most 1h): the same delay for the same firing on
    /// every scheduler, so that a million schedules on one cron do not all fall due in
    /// the same millisecond.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<String>,
    /// While true, the schedule creates no firings.
    #[serde(default)]
    pub paused: bool,
}

/// The body of `POST /v1/schedules`: a new schedule of job `job` named `name`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct ScheduleCreate {
    /// The AsyncJobConfig whose tasks it fires.
    pub job: String,
    /// Unique within the job, 1 to 200 bytes of letters, digits and `-_.:@`; part of
    /// each firing's identity.
    pub name: String,
    #[serde(flatten)]
    pub spec: ScheduleSpec,
}

/// The body of `PATCH /v1/schedules/{job}/{name}`: the members given replace the
/// schedule's (a `null` clears an optional one); the rest are kept.
pub type SchedulePatch = serde_json::Map<String, serde_json::Value>;

/// Who manages a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum ScheduleSource {
    /// Created through `/v1/schedules`.
    Api,
    /// An entry of the job's AsyncJobConfig (`spec.cron`): read-only here, changed
    /// through the config; it can be triggered and backfilled.
    Config,
}

/// A schedule as `/v1/schedules` answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct Schedule {
    pub job: String,
    pub name: String,
    #[serde(rename = "type")]
    pub task_type: String,
    pub source: ScheduleSource,
    #[serde(flatten)]
    pub spec: ScheduleSpec,
    /// The next firing not yet created; null when the schedule is paused, has ended,
    /// or has not been planned by a scheduler yet.
    #[serde(default, with = "crate::time::rfc3339_option")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::schema_option")
    )]
    pub next_firing: Option<DateTime<Utc>>,
    /// The instant of the latest firing created; null before the first.
    #[serde(default, with = "crate::time::rfc3339_option")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::schema_option")
    )]
    pub last_firing: Option<DateTime<Utc>>,
    /// The task the latest firing created.
    #[serde(default)]
    pub last_task_id: Option<String>,
    /// `overlap: BufferOne`: the instant of the firing held back until the previous one
    /// finishes.
    #[serde(default, with = "crate::time::rfc3339_option")]
    #[cfg_attr(
        feature = "openapi",
        schemars(schema_with = "crate::time::schema_option")
    )]
    pub buffered_firing: Option<DateTime<Utc>>,
    /// Tasks its firings created.
    pub fired: u64,
    #[serde(with = "crate::time::rfc3339")]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema"))]
    pub created_at: DateTime<Utc>,
    #[serde(with = "crate::time::rfc3339")]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema"))]
    pub updated_at: DateTime<Utc>,
}

/// The answer to `GET /v1/schedules?job=…`: a job's schedules by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct SchedulePage {
    pub items: Vec<Schedule>,
    /// There may be more: pass this as `cursor` for the next page. Absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// The body of `POST /v1/schedules/{job}/{name}/backfill`: create the firings whose
/// instants fall in `[from, to)`, as if the schedule had been running then. Each is
/// created once, however often the backfill is repeated; overlap does not apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct BackfillRequest {
    #[serde(with = "crate::time::rfc3339")]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema"))]
    pub from: DateTime<Utc>,
    #[serde(with = "crate::time::rfc3339")]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema"))]
    pub to: DateTime<Utc>,
}

/// The answer to a backfill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct BackfillResult {
    /// Firings in the range.
    pub firings: u64,
    /// Of those, the ones this call created (the rest existed already).
    pub created: u64,
}

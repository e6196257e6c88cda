//! The jobs overview: `GET /v1/jobs` and `GET /v1/jobs/{name}`, what operators' tools
//! (the web console, `asyncctl jobs`) show per job.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::JobStatus;

/// Where the overview stops counting: a count at this value means "at least this many".
/// Each count walks an index range and stops here, so an overview costs the same
/// however deep a backlog or a dead-letter queue is (docs/api.md, "Jobs overview").
pub const MAX_JOB_COUNT: u64 = 100_000;

/// How many upcoming firings of each cron entry the overview names.
pub const CRON_FIRINGS: usize = 3;

/// The answer to `GET /v1/jobs`: the jobs the caller may read, sorted by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct JobList {
    pub jobs: Vec<JobOverview>,
}

/// One job as `GET /v1/jobs` and `GET /v1/jobs/{name}` show it: its [`JobStatus`]
/// (the same members, at the top level), what is waiting and running, and its cron entries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct JobOverview {
    #[serde(flatten)]
    pub status: JobStatus,
    /// Attempts of the job that may be in flight at once now, in total across every
    /// dispatcher: its `concurrency`, or less while adaptive concurrency has backed it
    /// off — the sum of the shares the dispatchers running the job published with their
    /// last heartbeat (each second; a dispatcher counts while it has begun an attempt of
    /// the job within the last 4 s or has one in flight), at most `concurrency`. The
    /// job's `concurrency` when adaptive concurrency is off or no dispatcher is running
    /// it (docs/api.md, "Adaptive concurrency").
    pub effective_concurrency: u32,
    pub stats: JobStats,
    /// The job's cron entries in config order; empty for a job without cron.
    #[serde(default)]
    pub cron: Vec<CronOverview>,
    /// Keys of a job with a `concurrencyKey` resting now: an executor answered one of
    /// their tasks 429 or 503 with a retry time, and none of the key's tasks is claimed
    /// before `until`. The [`MAX_RESTING_KEYS`] that rest longest, longest first; absent
    /// when none rests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resting_keys: Vec<RestingKey>,
    /// A job with a `concurrencyKey`: its keys with tasks claimed, running or due now, the
    /// most running first, then the most due: the [`MAX_KEYS_SHOWN`] busiest, counted over
    /// at most [`MAX_JOB_COUNT`] of the job's waiting and running tasks; absent when no key
    /// has work. With `spec.fairness` a key is `tenant␟key`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<KeyUsage>,
    /// The AsyncLimiters the job names (`spec.limiters`), each with the attempts running
    /// under it now across every job that names it; absent when it names none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limiters: Vec<LimiterUsage>,
    /// A `spec.fairness` job's tenants whose weight was set at runtime
    /// ([`TenantWeightRequest`]), with that weight, in place of the spec's; absent when
    /// none was.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub tenant_weights: std::collections::BTreeMap<String, u32>,
    /// A `spec.fairness` job's tenants with tasks claimed, running or due now, the most
    /// running first, then the most due: the [`MAX_TENANTS_SHOWN`] busiest, counted over
    /// at most [`MAX_JOB_COUNT`] of the job's waiting and running tasks; absent when no
    /// tenant has work.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<TenantUsage>,
    /// Which limit keeps the job's due tasks from beginning now, read from the counts
    /// above and the rate limits' token buckets; absent when nothing is due or none of
    /// these is reached (a key's own rate shows in
    /// `asyncd_job_limited_total{limit="rate"}` instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding_limit: Option<BindingLimit>,
}

/// The answer to `GET /v1/limiters`: every AsyncLimiter named by a job the caller may
/// read, sorted by name (what the operator copies into each limiter's `status.running`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct LimiterList {
    pub limiters: Vec<LimiterUsage>,
}

/// An AsyncLimiter as the jobs overview and `GET /v1/limiters` show it (docs/api.md,
/// "Limiters shared across jobs").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct LimiterUsage {
    /// The limiter's name; `namespace/name` when it was declared in a namespace.
    pub name: String,
    /// Attempts it lets run at once across its jobs; absent when it limits only a rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// Attempts it lets begin per second across its jobs; absent without a rate limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_second: Option<u32>,
    /// Attempts running now of every job that names it.
    pub running: u64,
    /// The task types of the jobs that name it, sorted.
    pub task_types: Vec<String>,
}

/// The limit that keeps a job's due tasks waiting, first match in this order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(tag = "limit", rename_all = "snake_case")]
pub enum BindingLimit {
    /// The job is paused.
    Paused,
    /// As many attempts run as its effective concurrency allows.
    Concurrency,
    /// As many attempts of the limiter's jobs run as the limiter allows.
    Limiter { name: String },
    /// The job's `rateLimit` has no token left: the next begins when one refills.
    Rate,
    /// The rate of an AsyncLimiter the job names has no token left.
    LimiterRate { name: String },
    /// Keys of the job rest after 429 or 503 answers (`resting_keys`).
    KeyCooldown,
}

/// How many tenants the overview names: one tenant per customer may mean thousands.
pub const MAX_TENANTS_SHOWN: usize = 20;

/// A tenant of a `spec.fairness` job as the jobs overview shows it (docs/api.md,
/// "Fairness between tenants").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct TenantUsage {
    pub tenant: String,
    /// Its weight in the claim now: the one set at runtime, else the spec's.
    pub weight: u32,
    /// Its tasks claimed or running now.
    pub running: u64,
    /// Its tasks due now and waiting.
    pub due: u64,
    /// The attempts it may have in flight while the tenants listed keep work: the job's
    /// effective concurrency times its weight over theirs.
    pub fair_share: f64,
}

/// How many keys the overview names: one key per merchant may mean thousands.
pub const MAX_KEYS_SHOWN: usize = 20;

/// A concurrency key of a job as the jobs overview shows it (docs/api.md, "Per-key
/// limits").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct KeyUsage {
    pub key: String,
    /// Its tasks claimed or running now (at most `concurrencyKey.limit`).
    pub running: u64,
    /// Its tasks due now and waiting.
    pub due: u64,
}

/// How many resting keys the overview names: a flood of 429s over 10⁴ merchants would
/// otherwise make one answer of them all.
pub const MAX_RESTING_KEYS: usize = 20;

/// One key resting after an executor's 429 or 503 (docs/api.md, "Per-key limits").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct RestingKey {
    /// The key, as rendered from the payload.
    pub key: String,
    /// When its cooldown ends.
    #[serde(with = "crate::time::rfc3339")]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema"))]
    pub until: DateTime<Utc>,
}

/// What the store holds of a job's tasks at the moment of the answer. Each count stops
/// at [`MAX_JOB_COUNT`] (100 000): that value means "at least".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct JobStats {
    /// Waiting tasks (pending, or claimed by a dispatcher but not begun) due now. A
    /// paused job's tasks count too: they are what a resume releases.
    pub due: u64,
    /// Waiting tasks not due yet (a delay, an ETA, a retry's backoff).
    pub scheduled: u64,
    /// Attempts in flight.
    pub running: u64,
    /// Tasks in dead letters (until their job's retention purges them).
    pub dead: u64,
    /// How long the oldest due task has been due, in seconds: the job's lateness. Null
    /// when nothing is due.
    pub oldest_due_seconds: Option<f64>,
    /// Tasks that finished in the 60 s before the answer. Divided by 60, the rate over
    /// the last minute in tasks per second.
    pub finished_last_minute: FinishedCounts,
}

/// Tasks finished in a window, by how they ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct FinishedCounts {
    pub succeeded: u64,
    /// Tasks that went to dead letters: out of retries, failed permanently, or a
    /// dependency died.
    pub dead: u64,
}

/// A cron entry of the job and its next firings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct CronOverview {
    /// The entry's name in the config.
    pub name: String,
    /// As written in the config: `CRON_TZ=<zone> <expression>`.
    pub schedule: String,
    /// The next three firings after the answer (fewer for an expression that stops
    /// firing, such as one that names 30 February).
    #[serde(with = "crate::time::rfc3339_vec")]
    #[cfg_attr(feature = "openapi", schemars(schema_with = "crate::time::schema_vec"))]
    pub next: Vec<DateTime<Utc>>,
    /// `spec.cron[].overlap`: whether a firing runs while the previous one is unfinished.
    pub overlap: CronOverlap,
    /// `spec.cron[].catchUp` in effect: how far back firings missed during an outage
    /// are still created, as a duration (`0s`: none).
    pub catch_up: String,
    /// `spec.cron[].paused`: the entry creates no firings (`next` says when it would).
    pub paused: bool,
}

/// What a cron entry does when a firing comes while the previous one has not finished.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub enum CronOverlap {
    /// The firing runs anyway (also spelled `AllowAll`).
    #[default]
    #[serde(alias = "AllowAll")]
    Allow,
    /// The firing is skipped.
    Skip,
    /// The firing waits until the previous one finishes, then runs; at most one waits
    /// (a further firing meanwhile is skipped).
    BufferOne,
    /// The previous firing is cancelled (a running attempt's outcome is then ignored)
    /// and the new one runs.
    CancelOther,
}

/// `PUT /v1/jobs/{name}/tenants/{tenant}/weight`'s body: the tenant's weight in the job's
/// fair claim from the next claim on, in place of its `spec.fairness` weight, until it
/// is deleted (docs/api.md, "Tenants' weights at runtime").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct TenantWeightRequest {
    /// 1 to 1000, as in `spec.fairness.weights`.
    pub weight: u32,
}

/// A tenant's weight in a job's fair claim, as `PUT` and `DELETE
/// /v1/jobs/{name}/tenants/{tenant}/weight` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(schemars::JsonSchema))]
pub struct TenantWeight {
    pub job: String,
    pub tenant: String,
    /// The weight the claim uses now.
    pub weight: u32,
    /// Whether it was set at runtime (else it is the spec's).
    pub set_at_runtime: bool,
}

//! What the [`Store`](crate::Store) methods other than a task's own transitions take and
//! answer: claims, limits, listings, counts and bulk actions.

use std::collections::BTreeMap;
use std::time::Duration;

use asyncd_contract::TaskState;

#[cfg(doc)]
use crate::Store;
use crate::{ClaimedTask, InsertOutcome, Millis, NewTask, Started};

/// What the jobs overview (`GET /v1/jobs`) shows of one task type, from
/// [`Store::job_counts`]. Each count stops at the `cap` it was asked with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobCounts {
    /// Pending or claimed, due by `now`.
    pub due: i64,
    /// Pending or claimed, due after `now`.
    pub scheduled: i64,
    pub running: i64,
    pub dead: i64,
    /// The earliest trigger time among the due tasks.
    pub oldest_due: Option<Millis>,
    /// Succeeded at or after `finished_since`.
    pub succeeded_since: i64,
    /// Went dead at or after `finished_since`.
    pub dead_since: i64,
}

/// One task type's due backlog: what autoscaling follows, without the counts of the
/// tasks not yet due (which a backlog gauge can sample far less often).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DueBacklog {
    /// Pending or claimed, due by `now`.
    pub due: i64,
    /// The earliest trigger time among the due tasks.
    pub oldest_due: Option<Millis>,
}

/// What [`Store::usage`] counts a keyed job's tasks by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UsageBy {
    /// The concurrency key (`tenant␟key` with `spec.fairness`).
    Key,
    /// The tenant of a `spec.fairness` job: the key's text before its U+001F.
    Tenant,
}

/// One key's or tenant's tasks, from [`Store::usage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageCounts {
    /// The key or the tenant.
    pub of: String,
    /// Its tasks claimed or running.
    pub running: u64,
    /// Its tasks pending and due.
    pub due: u64,
}

/// A token bucket [`Store::rate_bucket`] reads: a job's own (`spec.rateLimit`, keyed by
/// task type) or an AsyncLimiter's (by its id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateBucket<'a> {
    Job(&'a str),
    Limiter(&'a str),
}

/// What [`Store::job_counts`] takes.
#[derive(Debug, Clone, Copy)]
pub struct JobCountParams<'a> {
    pub task_type: &'a str,
    pub now: Millis,
    pub finished_since: Millis,
    /// Each count stops here: a count equal to it means "at least".
    pub cap: u32,
}

/// Which task types a claim may take: all of them (embedded mode) or the ones this
/// dispatcher owns.
#[derive(Debug, Clone)]
pub enum TypeFilter {
    All,
    Only(Vec<String>),
}

/// What [`Store::claim`] takes.
#[derive(Debug, Clone, Copy)]
pub struct ClaimParams<'a> {
    pub types: &'a TypeFilter,
    /// Tasks due by this instant are claimed.
    pub horizon: Millis,
    pub now: Millis,
    /// How long past `max(trigger_at, now)` the claim holds before the rescuer takes it.
    pub hold: Duration,
    pub owner: &'a str,
    pub limit: u32,
    /// Only the tasks due after `now`: what is due already is left for
    /// [`Store::start_due`] (the types' runners claim and begin it in one write). For a
    /// list of types ([`TypeFilter::Only`]); ignored with [`TypeFilter::All`].
    pub ahead: bool,
}

/// What [`Store::dead_letters`] takes. Dead tasks are listed by `(trigger_at, id)`,
/// descending — when each was last due, the latest first — because the claim's index on
/// `(state, trigger_at, id)` already serves that order on every backend: listing needs
/// no index of its own that every transition would have to maintain.
#[derive(Debug, Clone, Copy)]
pub struct DeadLetterParams<'a> {
    pub task_type: Option<&'a str>,
    /// Only tasks listed after this `(trigger_at, id)`: the last of the previous page.
    pub after: Option<(Millis, &'a str)>,
    pub limit: u32,
}

/// What a bulk dead-letter action does; it decides which matches it can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkAction {
    /// Not one whose unique key another task holds (its redrive would be refused).
    Redrive,
    /// Not one that a blocked task waits on (its dependents would never be released).
    Purge,
}

/// Which dead letters a bulk action is about: one task type's, by when they died
/// (`updated_at`, which nothing changes while a task stays dead) and how their last
/// error starts.
#[derive(Debug, Clone, Copy)]
pub struct DeadFilter<'a> {
    pub task_type: &'a str,
    pub error_prefix: Option<&'a str>,
    pub dead_after: Option<Millis>,
    pub dead_before: Millis,
    pub action: BulkAction,
}

/// What [`Store::count_dead`] answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeadCount {
    /// Every dead letter matching the filter.
    pub matched: u64,
    /// Those the action can act on.
    pub actionable: u64,
}

/// What [`Store::purge`] takes: up to `limit` tasks of `task_type` in the finished
/// `state` whose last change — when they finished — is before `finished_before`, oldest
/// first. A task that a blocked task still waits on is kept (its dependents would never
/// be released without it).
#[derive(Debug, Clone, Copy)]
pub struct PurgeParams<'a> {
    pub task_type: &'a str,
    pub state: TaskState,
    pub finished_before: Millis,
    pub limit: u32,
}

/// What [`Store::search`] takes: tasks matching every filter given, newest first (by
/// `created_at`, then id), up to `limit`, after the cursor `(created_at, id)` of the
/// last task of the previous page.
#[derive(Debug, Clone, Copy, Default)]
pub struct SearchParams<'a> {
    pub task_type: Option<&'a str>,
    pub state: Option<TaskState>,
    pub unique_key: Option<&'a str>,
    pub created_after: Option<Millis>,
    pub eta_before: Option<Millis>,
    pub after: Option<(Millis, &'a str)>,
    pub limit: u32,
}

/// What [`Store::claim_ids`] takes.
#[derive(Debug, Clone, Copy)]
pub struct ClaimIdsParams<'a> {
    pub ids: &'a [String],
    pub now: Millis,
    pub hold: Duration,
    pub owner: &'a str,
}

/// What [`Store::insert_consumed`] takes.
#[derive(Debug, Clone, Copy)]
pub struct InsertConsumedParams<'a> {
    pub tasks: &'a [NewTask],
    pub horizon: Millis,
    pub now: Millis,
    pub hold: Duration,
    pub owner: &'a str,
}

/// What [`Store::insert_consumed`] did with a batch of consumed tasks.
#[derive(Debug, Default)]
pub struct Consumed {
    /// The new tasks due by the horizon, claimed for the consumer.
    pub claimed: Vec<ClaimedTask>,
    /// The tasks not stored because another task holds one of their keys, or a
    /// dependency they name does not exist, by index in the batch, with the outcome that
    /// says which. A message consumed twice, a change's placeholder and a debounce are
    /// not refusals.
    pub refused: Vec<(usize, InsertOutcome)>,
}

/// What [`Store::claim_fair`] takes besides the claim's.
#[derive(Debug, Clone, Copy)]
pub struct FairParams<'a> {
    /// `concurrencyKey.limit`: each key's claimed and running tasks, at most.
    pub per_key: u32,
    /// The last key the previous claim took ([`FairClaim::last_key`]).
    pub after: Option<&'a str>,
    /// In what order each key's tasks are taken.
    pub order: KeyOrder,
    /// `spec.fairness`: keys are `tenant␟key`, and the claim takes the tenants' tasks
    /// by weight before the keys' turns (with [`KeyOrder::Rank`]).
    pub tenants: Option<TenantWeights<'a>>,
    /// Keys whose limit is below `per_key` now (`concurrencyKey.adaptive`: cut by their
    /// executor's overload answers), with that limit (with [`KeyOrder::Rank`]).
    pub key_limits: Option<&'a std::collections::BTreeMap<String, u32>>,
}

/// The tenants' weights of a job with `spec.fairness`: a tenant of weight `w` begins `w`
/// tasks in each round where a tenant of weight 1 begins one.
#[derive(Debug, Clone, Copy)]
pub struct TenantWeights<'a> {
    pub weights: &'a std::collections::BTreeMap<String, u32>,
    pub default_weight: u32,
    /// A tenant's claimed and running tasks, at most (the job's `concurrency`): a
    /// tenant with a flood of due tasks holds no more claims than could run, so the
    /// next claim finds room for the others' tasks before the runner's queue fills.
    pub per_tenant: u32,
}

/// In what order a keyed job's claim takes each key's tasks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum KeyOrder {
    /// By rank (priority, then due time), as many at once as the key's limit.
    #[default]
    Rank,
    /// `spec.ordering: fifo`: in submission order (`created_at`, then id), and only the
    /// key's earliest unfinished task, once it is due — a retry waiting for its time
    /// holds its key. With `dead_blocks`, a dead task holds its key too, until it is
    /// redriven or purged.
    Fifo { dead_blocks: bool },
}

/// What [`Store::claim_fair`] did.
#[derive(Debug, Clone)]
pub struct FairClaim {
    pub tasks: Vec<ClaimedTask>,
    /// The key of the last task picked in turn order, for the next claim's `after`: the
    /// rotation goes on where this claim stopped.
    pub last_key: Option<String>,
}

/// What [`Store::start`] takes.
#[derive(Debug, Clone, Copy)]
pub struct StartParams<'a> {
    /// `(id, lease_token)` of each claim.
    pub claims: &'a [(String, i64)],
    pub now: Millis,
    /// How long past its timeout an attempt's lease runs.
    pub grace: Duration,
}

/// What [`Store::start_due`] takes: begin attempts on up to `limit` of one job's pending
/// tasks due by `now`, best ranked first, without claiming them first.
#[derive(Debug, Clone, Copy)]
pub struct StartDueParams<'a> {
    pub now: Millis,
    /// Identifies the dispatcher in the store's `owner` column.
    pub owner: &'a str,
    /// How long past its timeout an attempt's lease runs.
    pub grace: Duration,
    pub limit: u32,
    /// First ask a reader whether anything is due, so that a look finding nothing takes
    /// no lock (the job's limits row; on SQLite, the one writer). A runner whose last
    /// look began all it asked for skips it: more is most likely due, and on SQLite the
    /// read is a round trip to another thread for every batch.
    pub probe: bool,
}

/// What [`Store::start_due`] did: the attempts begun, each with its task as a claim
/// would read it (`attempt` the count before this one), in rank order; and the limit
/// that kept more from beginning, if one did.
#[derive(Debug, Clone)]
pub struct DueStarted {
    pub tasks: Vec<(ClaimedTask, Started)>,
    pub held_by: Option<HeldBy>,
}

/// One job's start in [`Store::finish_and_start_due`]: [`Store::start_due`]'s arguments
/// (`params.probe` is not read: the write that frees the slots makes the look anyway).
#[derive(Debug, Clone, Copy)]
pub struct DueStart<'a> {
    pub params: StartDueParams<'a>,
    pub gate: JobGate<'a>,
}

/// A job's limits, which [`Store::start_limited`] keeps in total across every
/// dispatcher: the job's config as this dispatcher reads it.
#[derive(Debug, Clone, Copy)]
pub struct JobGate<'a> {
    pub task_type: &'a str,
    /// Running attempts of the type, at most.
    pub concurrency: u32,
    pub rate: Option<asyncd_spec::RateLimit>,
    /// `concurrencyKey.limit`: running attempts of one key, at most.
    pub key_limit: Option<u32>,
    /// `concurrencyKey.rateLimit`: each key's token bucket (with [`Self::keys`]).
    pub key_rate: Option<asyncd_spec::RateLimit>,
    /// Each claim's concurrency key, in the order of [`StartParams::claims`] (empty
    /// without a key limit).
    pub keys: &'a [Option<&'a str>],
    /// The AsyncLimiters the job names (`Job::limiters`, sorted by id): each holds the
    /// attempts of all its task types in total, its row taken after the job's.
    pub limiters: &'a [std::sync::Arc<asyncd_spec::Limiter>],
}

/// Which limit kept claims from beginning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldBy {
    /// As many attempts are running as the job allows; one ends when its outcome is
    /// written (by any dispatcher).
    Concurrency,
    /// The token bucket is empty; the next token comes in this long.
    Rate { next_token: Duration },
    /// Some claims' keys have as many attempts running as `concurrencyKey.limit`
    /// allows (the others' claims were tried); one ends when its outcome is written.
    Key,
    /// A limiter the job shares with others has as many attempts running as its
    /// `concurrency` allows; one ends when an outcome of any of its jobs is written.
    Limiter,
}

/// What [`Store::start_limited`] did.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// The attempts that began.
    pub started: Vec<Started>,
    /// The claims (indexes into [`StartParams::claims`], in order) the limits left for
    /// later: not tried, still claimed.
    pub deferred: Vec<usize>,
    pub held_by: Option<HeldBy>,
}

/// The task table's row versions as the database's statistics count them
/// ([`Store::dead_rows`]): a server that keeps the versions an update or delete replaced
/// until a vacuum reclaims them (PostgreSQL) also keeps their index entries, and a claim
/// walks every one of them that ranks before the first due task.
///
/// [`Store::dead_rows`]: crate::Store::dead_rows
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadRows {
    /// Live row versions (an estimate, as the statistics have it).
    pub live: u64,
    /// Row versions replaced or deleted and not yet reclaimed.
    pub dead: u64,
    /// Whether the store's role may reclaim them ([`Store::reclaim_dead_rows`]):
    /// PostgreSQL lets only the table's or the database's owner vacuum a table.
    ///
    /// [`Store::reclaim_dead_rows`]: crate::Store::reclaim_dead_rows
    pub may_reclaim: bool,
}

/// A dispatcher's adaptive share of each job it runs, by task type (the server's
/// `adaptive` module), as it publishes them with its heartbeat.
pub type Shares = BTreeMap<String, u32>;

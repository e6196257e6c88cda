//! The task store: the one narrow interface every backend implements, and no SQL
//! anywhere else.
//!
//! A task row moves through these states (`lease_token` is the fencing token; what an
//! executor receives is derived from it and the row's `lease_secret`, see [`crate::lease`]):
//!
//! ```text
//!   blocked ──deps succeeded──► pending ──claim──► claimed ──start──► running ──► succeeded
//!      │                          ▲  ▲               │ release           │ ├─► pending (retry, later trigger_at)
//!      └──dep failed──► dead ◄────┼──┼───────────────┘                   │ └─► dead
//!                                 │  └──────────── lease lapsed (rescuer) ┘
//!                                 └── redrive ── dead
//! ```
//!
//! Every transition out of `claimed` or `running` names the token it expects, so a
//! dispatcher or executor acting on an attempt that has since lapsed changes nothing.
//!
//! The module is laid out so that a backend holds only what differs between dialects:
//!
//! - this file: the [`Store`] trait with its parameter and outcome types, [`Millis`], and
//!   the retry of transactions a database aborted (each backend names its SQLSTATEs);
//! - [`domain`]: every decision, as pure functions with unit tests — the state a new task
//!   starts in, which key an insert conflicted on, what a finish does to dependents,
//!   what a refused cancel or redrive answers, the order a batch locks rows in;
//! - `rows`: one `FromRow` struct per query shape, shared by the backends, each with one
//!   conversion into [`TaskRecord`], [`ClaimedTask`], [`Lapsed`] and the rest;
//! - `shared`: `Queries`, each backend's named statements, and the
//!   reads whose shape is the same everywhere (a task, the rescuer's scan, membership),
//!   written once over any sqlx database;
//! - `tx`: the write transactions — insert (dependency locks, the initial state, the
//!   retry when a key's holder finished before it could be named), cancel, start,
//!   finish with what it does to dependents, redrive — and the dead-letter and stats
//!   reads, written once over any sqlx database and run through each backend's
//!   `tx::Dialect`: its statements and the few steps its database needs done its own
//!   way (how a dedupe key is bound, how dependencies are recorded, released and
//!   failed, whether a statement expected to fail needs a savepoint). [`Store`] itself
//!   is implemented there once, for every `tx::Backend`: a dialect with its pools
//!   (SQLite writes through one connection and reads through others) and its own
//!   migrations, claims, `start` and `finish`;
//! - [`sqlite`], [`postgres`], [`mysql`]: the SQL and those steps, each explained where
//!   it is done — PostgreSQL releases dependents by locking them then updating them all
//!   with one array, MariaDB has no `UPDATE … RETURNING` and locks then updates with
//!   `IN` lists padded to powers of two, SQLite, with one writer, does each in one
//!   statement — and the fast paths that stay their own: PostgreSQL claims with one
//!   `UPDATE … RETURNING`, MariaDB locks then updates, SQLite batches a whole `start`,
//!   and a `finish` of plain successes, into one statement.
//!
//! `tests/store_conformance.rs` runs every scenario against every backend.

mod bulk;
pub mod domain;
pub mod mysql;
pub mod postgres;
mod rows;
mod shared;
pub mod sqlite;
#[doc(hidden)]
pub mod testing;
mod tx;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::value::RawValue;

/// An instant: milliseconds since the Unix epoch, UTC. The store's only time type, a
/// BIGINT on every backend. Lengths of time stay [`Duration`]s (or `_ms` integers where
/// a row stores them).
#[derive(
    Debug,
    Default,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    sqlx::Type,
    serde::Serialize,
    serde::Deserialize,
)]
#[sqlx(transparent)]
#[serde(transparent)]
pub struct Millis(i64);

impl Millis {
    pub const fn new(ms: i64) -> Self {
        Self(ms)
    }

    pub const fn as_i64(self) -> i64 {
        self.0
    }

    pub fn saturating_sub(self, length: Duration) -> Self {
        Self(self.0.saturating_sub(duration_ms(length)))
    }

    /// How long after `earlier` this is; zero if it is not after.
    pub fn since(self, earlier: Millis) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }
}

/// A length in whole milliseconds, as the store adds it to instants in SQL.
pub fn duration_ms(length: Duration) -> i64 {
    i64::try_from(length.as_millis()).unwrap_or(i64::MAX)
}

impl std::ops::Add<Duration> for Millis {
    type Output = Millis;

    /// Saturating: an instant far enough out is as good as never.
    fn add(self, length: Duration) -> Millis {
        Self(self.0.saturating_add(duration_ms(length)))
    }
}

impl From<DateTime<Utc>> for Millis {
    fn from(time: DateTime<Utc>) -> Self {
        Self(time.timestamp_millis())
    }
}

impl std::fmt::Display for Millis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store: {0}")]
    Database(#[from] sqlx::Error),
    #[error("store migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// Holds the URL with its password masked ([`redact_url`]).
    #[error("store URL {0:?} is not supported (use sqlite://, mysql:// or postgres://)")]
    UnsupportedUrl(String),
    /// An error whose text named the store URL's password, with the password masked.
    #[error("store: {0}")]
    Redacted(String),
    #[error("store row is corrupt: {0}")]
    Corrupt(String),
    /// A write hit a unique key, again and again, that no task could be found holding.
    #[error("store conflict: {0}")]
    Conflict(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    /// Whether the database could not be reached, or is starting or stopping: worth
    /// waiting out, unlike a wrong URL, wrong credentials or a schema that does not match.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::Database(err)
            | Self::Migrate(
                sqlx::migrate::MigrateError::Execute(err)
                | sqlx::migrate::MigrateError::ExecuteMigration(err, _),
            ) => sqlx_unavailable(err),
            _ => false,
        }
    }
}

fn sqlx_unavailable(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        // A connection cut during the handshake: with TLS support built in, the
        // PostgreSQL driver first asks for TLS, and a server (or proxy) that closes the
        // socket then is reported as a protocol error ("unexpected response from
        // SSLRequest"), not as I/O. Waiting out a peer that speaks no PostgreSQL costs
        // only `--store-wait`, each failure logged.
        sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().as_deref().is_some_and(unavailable_sqlstate),
        _ => false,
    }
}

/// SQLSTATEs of a server that is away for now. Class 08 is a connection exception on
/// both PostgreSQL and MariaDB (MariaDB's "server shutdown in progress" and "too many
/// connections" are 08S01 and 08004); 57P01–57P03 are PostgreSQL's administrator or crash
/// shutdown and "the database system is starting up".
fn unavailable_sqlstate(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03")
}

/// Opens the store a URL names and applies pending migrations, waiting up to `wait` for a
/// database that is down or restarting (retrying with backoff, each failure logged), so
/// a role started during a database restart comes up with it instead of exiting. Any
/// other error, and still no database after `wait`, is returned at once; so is
/// `shutdown`, as the last error seen.
pub async fn open_migrated(
    url: &str,
    wait: Duration,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<std::sync::Arc<dyn Store>> {
    let started = tokio::time::Instant::now();
    let mut backoff = Duration::from_millis(100);
    loop {
        let attempt = async {
            let store = open(url).await?;
            store.migrate().await?;
            Ok::<_, StoreError>(store)
        };
        let err: StoreError = match attempt.await {
            Ok(store) => return Ok(store),
            Err(err) => err,
        };
        let waited = started.elapsed();
        if !err.is_unavailable() || waited >= wait {
            return Err(err);
        }
        tracing::warn!(%err, waited_s = waited.as_secs(), "store unavailable at start; waiting for it");
        tokio::select! {
            _ = shutdown.cancelled() => return Err(err),
            _ = tokio::time::sleep(backoff.min(wait - waited)) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// How long a request waits for a connection to a database server before it fails.
/// sqlx's default of 30 s left every request hanging through a database outage; the API
/// answers 503 with `Retry-After` instead, and the dispatcher's loops try again.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);

use crate::trace::TraceContext;
pub use asyncd_contract::TaskState;

impl From<asyncd_contract::UnknownState> for StoreError {
    fn from(err: asyncd_contract::UnknownState) -> Self {
        Self::Corrupt(err.to_string())
    }
}

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
    /// The submitter's trace, continued by every attempt ([`crate::trace`]).
    pub trace: Option<TraceContext>,
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

/// What [`Store::insert_workflow`] answers.
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

/// What [`Store::adopt`] takes.
#[derive(Debug, Clone, Copy)]
pub struct AdoptParams<'a> {
    pub tasks: &'a [NewTask],
    pub horizon: Millis,
    pub now: Millis,
    pub hold: Duration,
    pub owner: &'a str,
}

/// What [`Store::claim_fair`] takes besides the claim's.
#[derive(Debug, Clone, Copy)]
pub struct FairParams<'a> {
    /// `concurrencyKey.limit`: each key's claimed and running tasks, at most.
    pub per_key: u32,
    /// The last key the previous claim took ([`FairClaim::last_key`]).
    pub after: Option<&'a str>,
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
    /// Each claim's concurrency key, in the order of [`StartParams::claims`] (empty
    /// without a key limit).
    pub keys: &'a [Option<&'a str>],
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

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Applies pending migrations.
    async fn migrate(&self) -> Result<()>;
    async fn ping(&self) -> Result<()>;

    /// Inserts tasks in one transaction, one outcome per task in order.
    async fn insert(&self, tasks: &[NewTask], now: Millis) -> Result<Vec<InsertOutcome>>;
    /// Inserts a workflow — tasks that may depend on earlier ones of the same list — in
    /// one transaction, all or nothing. A `depends_on` id of an earlier task is read as
    /// the id that task ends up with (a repeat of an idempotency key answers with the
    /// first task's). The first outcome that is neither an insert nor such a repeat
    /// rolls everything back and is returned with its index.
    async fn insert_workflow(&self, tasks: &[NewTask], now: Millis) -> Result<WorkflowOutcome>;
    async fn get(&self, id: &str) -> Result<Option<TaskRecord>>;
    async fn cancel(&self, id: &str, now: Millis) -> Result<CancelOutcome>;
    /// Records task `id` of `task_type` as cancelled before it exists: a Kafka-routed
    /// task cancelled while its message still waits in the topic. When the consumer
    /// stores the message, the insert finds the id taken and nothing runs. `false` when
    /// a task with this id exists already (cancel that one instead).
    async fn insert_cancelled(&self, id: &str, task_type: &str, now: Millis) -> Result<bool>;

    /// Claims up to `limit` pending tasks due by `horizon`, best `(claim_rank, id)` first
    /// (the trigger time moved 10 s earlier per priority level, [`crate::heap::rank`]),
    /// holding each until `max(trigger_at, now) + hold`. Tasks of a paused type
    /// ([`Store::pause`]) are never claimed, here or by [`Store::claim_ids`].
    async fn claim(&self, params: ClaimParams<'_>) -> Result<Vec<ClaimedTask>>;
    /// Claims these tasks if they are still pending, as [`Store::claim`] would.
    async fn claim_ids(&self, params: ClaimIdsParams<'_>) -> Result<Vec<ClaimedTask>>;
    /// Stores tasks consumed from Kafka and claims for `owner` the new ones due by
    /// `horizon`, so the consumer that read them dispatches them without a poll. Tasks
    /// already stored (a message consumed twice) are left alone.
    async fn adopt(&self, params: AdoptParams<'_>) -> Result<Vec<ClaimedTask>> {
        let outcomes = self.insert(params.tasks, params.now).await?;
        let due: Vec<String> = params
            .tasks
            .iter()
            .zip(&outcomes)
            .filter(|(task, outcome)| {
                matches!(outcome, InsertOutcome::Inserted { .. })
                    && task.trigger_at <= params.horizon
            })
            .map(|(task, _)| task.id.clone())
            .collect();
        if due.is_empty() {
            return Ok(Vec::new());
        }
        self.claim_ids(ClaimIdsParams {
            ids: &due,
            now: params.now,
            hold: params.hold,
            owner: params.owner,
        })
        .await
    }
    /// What inserting `task` would answer against the task already holding its
    /// idempotency key: [`InsertOutcome::Duplicate`] or, for another type or payload,
    /// [`InsertOutcome::IdempotencyMismatch`]; `None` when no task holds it (or the task
    /// has no key). Inserts nothing.
    async fn find_idempotent(&self, task: &NewTask) -> Result<Option<InsertOutcome>>;
    /// Begins attempts on claimed tasks whose token still matches and whose type is not
    /// paused; each lease runs until `now + its timeout + grace`. Returns the ones that
    /// started.
    async fn start(&self, params: StartParams<'_>) -> Result<Vec<Started>>;
    /// [`Store::start`] within a job's limits, kept in total across every dispatcher: in
    /// one transaction that takes the job's `job_limits` row first (so dispatchers take
    /// turns), begins attempts on the first claims given while the type's running
    /// attempts stay within `gate.concurrency` and its token bucket has a token for each
    /// (`store::domain::admit`), and takes a token for each attempt begun. The claims
    /// left over stay claimed, for the caller to try again.
    async fn start_limited(&self, params: StartParams<'_>, gate: JobGate<'_>) -> Result<Admitted>;
    /// Claims up to `params.limit` of one keyed job's due tasks (`params.types` names
    /// it) fairly among its concurrency keys: each key's claimed and running tasks
    /// count first, so a key that has `per_key` of them gets no more, and the rest go
    /// to the keys in turns — every key's best ranked task before any key's second,
    /// the keys of a turn in rotation from the one after `after` (docs/design.md,
    /// "Per-key limits").
    async fn claim_fair(&self, params: ClaimParams<'_>, fair: FairParams<'_>) -> Result<FairClaim>;
    /// Applies each finish whose token still matches; `true` where it applied.
    async fn finish(&self, finishes: &[Finish], now: Millis) -> Result<Vec<bool>>;
    async fn lapsed(&self, now: Millis, limit: u32) -> Result<Vec<Lapsed>>;

    /// A page of dead tasks, latest due first (see [`DeadLetterParams`]).
    async fn dead_letters(&self, params: DeadLetterParams<'_>) -> Result<Vec<TaskRecord>>;
    async fn redrive(&self, id: &str, now: Millis) -> Result<RedriveOutcome>;
    /// Deletes finished tasks past their retention ([`PurgeParams`]) with their
    /// dependency edges, in one short transaction; returns how many went.
    async fn purge(&self, params: PurgeParams<'_>) -> Result<u64>;
    /// Frees the unique keys of up to `limit` succeeded tasks whose
    /// [`NewTask::unique_for`] ended by `now`, earliest end first, in one short
    /// transaction; returns how many. (An insert or redrive that hits such a key frees
    /// it itself: this only keeps them from piling up.)
    async fn release_unique_keys(&self, now: Millis, limit: u32) -> Result<u64>;
    /// Tasks by filter ([`SearchParams`]), without their `depends_on`.
    /// How many dead letters match `filter`, and how many of them its action can act on.
    async fn count_dead(&self, filter: DeadFilter<'_>) -> Result<DeadCount>;
    /// Acts (redrive or purge) on up to `limit` of the dead letters `filter`'s action can
    /// act on, oldest death first; returns how many it acted on. A redrive does to each
    /// what [`Store::redrive`] does.
    async fn act_on_dead(&self, filter: DeadFilter<'_>, limit: u32, now: Millis) -> Result<u64>;
    async fn search(&self, params: SearchParams<'_>) -> Result<Vec<TaskRecord>>;
    /// One task type's counts for the jobs overview, each an index range walked at most
    /// `cap` entries deep (see [`JobCountParams`]): `tasks_by_type_state` (migration
    /// 0008) for the waiting and running tasks, `tasks_finished` for the finished ones.
    async fn job_counts(&self, params: JobCountParams<'_>) -> Result<JobCounts>;

    /// Records that dispatcher `member` is alive at `now` with its adaptive `shares` of
    /// the jobs it runs (and forgets members silent for an hour).
    async fn heartbeat_member(&self, member: &str, now: Millis, shares: &Shares) -> Result<()>;
    /// Dispatchers whose last heartbeat is at or after `since`, sorted.
    async fn live_members(&self, since: Millis) -> Result<Vec<String>>;
    /// Per task type, the sum of the shares published by the dispatchers whose last
    /// heartbeat is at or after `since` (migration `0014_dispatcher_shares.sql`).
    async fn live_shares(&self, since: Millis) -> Result<BTreeMap<String, u64>>;
    /// A clean exit: the others take over `member`'s task types at once.
    async fn leave(&self, member: &str) -> Result<()>;
    /// Hands back every claim `owner` holds (not its running attempts), as if it had
    /// released each one: for a dispatcher that others found dead, so its claimed tasks
    /// run again within seconds instead of after the claim hold. Safe while it lives
    /// on: its `start` of a released claim changes nothing. Returns how many.
    async fn release_claims(&self, owner: &str, now: Millis) -> Result<u64>;
    /// The database server's clock, for a process to measure its own against; `None`
    /// for an embedded database, which has no clock but the process's.
    async fn clock(&self) -> Result<Option<Millis>>;
    /// Keeps a Kafka message the consumer could not make a task of, so its offset can be
    /// committed without losing it. A message already recorded (at the same topic,
    /// partition and offset: re-delivered after a crash) is left as it is.
    async fn record_kafka_dead_letter(&self, letter: &KafkaDeadLetter) -> Result<()>;
    /// Recorded Kafka messages, latest first ([`KafkaDeadLetterParams`]).
    async fn kafka_dead_letters(
        &self,
        params: KafkaDeadLetterParams<'_>,
    ) -> Result<Vec<KafkaDeadLetter>>;
    /// Deletes up to `limit` Kafka dead letters recorded before `recorded_before`, oldest
    /// first, in one short statement; returns how many went.
    async fn purge_kafka_dead_letters(&self, recorded_before: Millis, limit: u32) -> Result<u64>;

    /// Pauses task type `task_type` (the API's pause of its job): from the commit on, no
    /// claim takes its tasks and no attempt of it begins (a claim already held is left
    /// unstarted, for its dispatcher to hand back). Returns since when it is paused: `now`,
    /// or the earlier pause it was already under.
    async fn pause(&self, task_type: &str, now: Millis) -> Result<Millis>;
    /// Lifts the pause of `task_type`; `false` if it was not paused.
    async fn resume(&self, task_type: &str) -> Result<bool>;
    /// Every paused task type with since when, sorted by type.
    async fn pauses(&self) -> Result<Vec<(String, Millis)>>;
}

/// A dispatcher's adaptive share of each job it runs, by task type
/// ([`crate::adaptive`]), as it publishes them with its heartbeat.
pub type Shares = BTreeMap<String, u32>;

/// How long a silent member's row is kept before a heartbeat of another deletes it.
pub const MEMBER_RETENTION: Duration = Duration::from_secs(3600);

/// A Kafka message the consumer could not make a task of: bytes that are no task
/// envelope, or a task the store refused.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaDeadLetter {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The message's value as read, byte for byte, cut at [`KAFKA_DEAD_LETTER_BYTES`].
    pub message: Vec<u8>,
    /// The value's length as read: more than `message.len()` when it was cut.
    pub message_size: i64,
    pub reason: String,
    pub recorded_at: Millis,
}

/// What [`Store::kafka_dead_letters`] lists: up to `limit` dead letters, of `topic`
/// only if given, in the order latest recorded first, then by topic, partition and
/// offset, each descending; with `after`, those that come after it in that order (a
/// page's last item: the next page).
#[derive(Debug, Clone, Copy, Default)]
pub struct KafkaDeadLetterParams<'a> {
    pub topic: Option<&'a str>,
    pub after: Option<KafkaDeadLetterKey<'a>>,
    pub limit: u32,
}

/// Where a Kafka dead letter sits in the listing's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KafkaDeadLetterKey<'a> {
    pub recorded_at: Millis,
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
}

/// How much of a message a Kafka dead letter keeps. A broker accepts messages up to its
/// `message.max.bytes` (1 MiB by default), so a message is cut only on a topic configured
/// above 8 MiB; the bound keeps one row within MariaDB's default 16 MiB packet.
pub const KAFKA_DEAD_LETTER_BYTES: usize = 8 << 20;

impl KafkaDeadLetter {
    /// The dead letter of the message at `offset` of `partition`, its value cut to
    /// [`KAFKA_DEAD_LETTER_BYTES`].
    pub fn new(
        topic: &str,
        partition: i32,
        offset: i64,
        message: &[u8],
        reason: String,
        recorded_at: Millis,
    ) -> Self {
        Self {
            topic: topic.to_string(),
            partition,
            offset,
            message: message[..message.len().min(KAFKA_DEAD_LETTER_BYTES)].to_vec(),
            message_size: i64::try_from(message.len()).unwrap_or(i64::MAX),
            reason,
            recorded_at,
        }
    }
}

/// Runs a transaction again when the database aborted it as a deadlock victim or a
/// serialization failure (`transient` says which SQLSTATEs are those). Both roll the
/// whole transaction back, so running it again from the start is safe; anything else is
/// returned as is. Deadlocks are possible in principle (a batch finishing a task while
/// an insert holds its dependency, or the rescuer and a dispatcher finishing
/// overlapping batches), but rare: batches lock rows in id order (see
/// [`domain::lock_order`]).
async fn retrying<T, F, Fut>(transient: fn(&str) -> bool, mut run: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    const ATTEMPTS: u32 = 5;
    let mut attempt = 1;
    loop {
        match run().await {
            Err(StoreError::Database(sqlx::Error::Database(db)))
                if attempt < ATTEMPTS && db.code().as_deref().is_some_and(transient) =>
            {
                tracing::debug!(error = %db, attempt, "store transaction aborted; running it again");
                tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt))).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// The error when an insert conflicted on a unique key and no task held any of its keys,
/// however often it was tried.
fn unnamed_insert_conflict(task: &NewTask) -> StoreError {
    StoreError::Conflict(format!("insert of {} conflicted on no known key", task.id))
}

/// The same for a redrive.
fn unnamed_redrive_conflict(id: &str) -> StoreError {
    StoreError::Conflict(format!(
        "redrive of {id} conflicted on a unique key no task holds"
    ))
}

/// Opens the store a URL names. No error it returns contains the URL's password: the
/// URL is masked in our own messages, and a driver error that quotes the password (none
/// is known to, but a parse error could) is turned into [`StoreError::Redacted`].
pub async fn open(url: &str) -> Result<std::sync::Arc<dyn Store>> {
    open_unredacted(url)
        .await
        .map_err(|err| without_password(err, url))
}

async fn open_unredacted(url: &str) -> Result<std::sync::Arc<dyn Store>> {
    if url.starts_with("sqlite:") {
        Ok(std::sync::Arc::new(sqlite::SqliteStore::open(url).await?))
    } else if url.starts_with("mysql:") {
        Ok(std::sync::Arc::new(mysql::MySqlStore::open(url).await?))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Ok(std::sync::Arc::new(
            postgres::PostgresStore::open(url).await?,
        ))
    } else {
        Err(StoreError::UnsupportedUrl(redact_url(url)))
    }
}

/// The password of `scheme://user:password@host…`, as written and percent-decoded; the
/// userinfo ends at the last `@`, as URL parsers read it. Works on malformed URLs too,
/// which are the ones that end up in error messages.
fn passwords(url: &str) -> Vec<String> {
    let Some(start) = url.find("://").map(|i| i + 3) else {
        return Vec::new();
    };
    let rest = &url[start..];
    let Some(at) = rest.rfind('@') else {
        return Vec::new();
    };
    let Some(colon) = rest[..at].find(':') else {
        return Vec::new();
    };
    let raw = &rest[colon + 1..at];
    if raw.is_empty() {
        return Vec::new();
    }
    let decoded = percent_decode(raw);
    if decoded == raw {
        vec![raw.to_string()]
    } else {
        vec![raw.to_string(), decoded]
    }
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `url` with its password replaced by `***`, for messages and logs.
pub fn redact_url(url: &str) -> String {
    redact(url, url)
}

/// `text` with every occurrence of `url`'s password replaced by `***`.
pub fn redact(text: &str, url: &str) -> String {
    let mut text = text.to_string();
    // longest first: the decoded form may be a part of the raw one or the other way round
    let mut secrets = passwords(url);
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for secret in secrets {
        text = text.replace(&secret, "***");
    }
    text
}

fn without_password(err: StoreError, url: &str) -> StoreError {
    let text = err.to_string();
    let masked = redact(&text, url);
    if masked == text {
        err
    } else {
        StoreError::Redacted(masked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_are_masked_even_when_malformed() {
        for (url, masked) in [
            (
                "postgres://app:s3cr%40t@db:5432/q?sslmode=require",
                "postgres://app:***@db:5432/q?sslmode=require",
            ),
            ("mysql://app:p@ss@db/q", "mysql://app:***@db/q"),
            (
                "postgress://app:pw@db:notaport/q",
                "postgress://app:***@db:notaport/q",
            ),
            ("mysql://app@db/q", "mysql://app@db/q"),
            ("sqlite://asyncd.db", "sqlite://asyncd.db"),
            ("not a url at all", "not a url at all"),
        ] {
            assert_eq!(redact_url(url), masked, "{url}");
        }
        // the decoded form, as a driver would quote it, is masked too
        let url = "postgres://app:s3cr%40t@db/q";
        assert_eq!(redact("auth as s3cr@t failed", url), "auth as *** failed");
    }

    #[tokio::test]
    async fn an_unsupported_store_url_is_reported_without_its_password() {
        let err = open("postgress://app:Hunter2Secret@db/q")
            .await
            .err()
            .expect("refused");
        let text = err.to_string();
        assert!(!text.contains("Hunter2Secret"), "{text}");
        assert!(text.contains("postgress://app:***@db/q"), "{text}");
    }

    #[test]
    fn millis_arithmetic_saturates_instead_of_wrapping() {
        let t = Millis::new(1_000);
        assert_eq!(t + Duration::from_millis(500), Millis::new(1_500));
        assert_eq!(t.saturating_sub(Duration::from_secs(1)), Millis::new(0));
        assert_eq!(
            Millis::new(i64::MAX - 1) + Duration::from_secs(1),
            Millis::new(i64::MAX)
        );
        assert_eq!(t + Duration::MAX, Millis::new(i64::MAX));
        assert_eq!(
            Millis::new(i64::MIN + 1).saturating_sub(Duration::from_secs(1)),
            Millis::new(i64::MIN)
        );
    }

    #[test]
    fn since_is_never_negative() {
        let (early, late) = (Millis::new(1_000), Millis::new(3_500));
        assert_eq!(late.since(early), Duration::from_millis(2_500));
        assert_eq!(early.since(late), Duration::ZERO);
    }

    #[test]
    fn millis_come_from_chrono_and_travel_as_plain_numbers() {
        let time = DateTime::parse_from_rfc3339("2026-01-02T03:04:05.678Z")
            .unwrap()
            .with_timezone(&Utc);
        let ms = Millis::from(time);
        assert_eq!(ms.as_i64(), time.timestamp_millis());
        assert_eq!(serde_json::to_string(&ms).unwrap(), ms.as_i64().to_string());
        assert_eq!(ms.to_string(), ms.as_i64().to_string());
    }
}

//! The task store: the one narrow interface every backend implements, and no SQL
//! anywhere else.
//!
//! A task row moves through these states (`lease_token` is the fencing token):
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

pub mod mysql;
pub mod postgres;
pub mod sqlite;

use async_trait::async_trait;
use serde_json::value::RawValue;

/// Milliseconds since the Unix epoch, UTC: the store's only time type, the same on
/// every backend.
pub type Millis = i64;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store: {0}")]
    Database(#[from] sqlx::Error),
    #[error("store migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("store URL {0:?} is not supported (use sqlite://, mysql:// or postgres://)")]
    UnsupportedUrl(String),
    #[error("store row is corrupt: {0}")]
    Corrupt(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

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
    /// Identity of a cron firing (`type/name/millis`): the same firing is inserted once.
    pub cron_key: Option<String>,
    pub depends_on: Vec<String>,
    pub source_service: Option<String>,
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
    /// Another unfinished task holds the unique key.
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
    Redriven { trigger_at: Millis },
    NotFound,
    NotDead(TaskState),
    UniqueConflict { existing_id: String },
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

/// Per task type: what is waiting, and what of it is already due.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeStats {
    pub task_type: String,
    pub pending: i64,
    pub due: i64,
    pub oldest_due: Option<Millis>,
}

/// Which task types a claim may take: all of them (embedded mode) or the ones this
/// dispatcher owns.
#[derive(Debug, Clone)]
pub enum TypeFilter {
    All,
    Only(Vec<String>),
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Applies pending migrations.
    async fn migrate(&self) -> Result<()>;
    async fn ping(&self) -> Result<()>;

    /// Inserts tasks in one transaction, one outcome per task in order.
    async fn insert(&self, tasks: &[NewTask], now: Millis) -> Result<Vec<InsertOutcome>>;
    async fn get(&self, id: &str) -> Result<Option<TaskRecord>>;
    async fn cancel(&self, id: &str, now: Millis) -> Result<CancelOutcome>;

    /// Claims up to `limit` pending tasks due by `horizon`, earliest `(trigger_at, id)`
    /// first, holding each until `max(trigger_at, now) + hold_ms`.
    async fn claim(
        &self,
        types: &TypeFilter,
        horizon: Millis,
        now: Millis,
        hold_ms: i64,
        owner: &str,
        limit: u32,
    ) -> Result<Vec<ClaimedTask>>;
    /// Claims these tasks if they are still pending, as [`Store::claim`] would.
    async fn claim_ids(
        &self,
        ids: &[String],
        now: Millis,
        hold_ms: i64,
        owner: &str,
    ) -> Result<Vec<ClaimedTask>>;
    /// Stores tasks consumed from Kafka and claims for `owner` the new ones due by
    /// `horizon`, so the consumer that read them dispatches them without a poll. Tasks
    /// already stored (a message consumed twice) are left alone.
    async fn adopt(
        &self,
        tasks: &[NewTask],
        horizon: Millis,
        now: Millis,
        hold_ms: i64,
        owner: &str,
    ) -> Result<Vec<ClaimedTask>> {
        let outcomes = self.insert(tasks, now).await?;
        let due: Vec<String> = tasks
            .iter()
            .zip(&outcomes)
            .filter(|(task, outcome)| {
                matches!(outcome, InsertOutcome::Inserted { .. }) && task.trigger_at <= horizon
            })
            .map(|(task, _)| task.id.clone())
            .collect();
        if due.is_empty() {
            return Ok(Vec::new());
        }
        self.claim_ids(&due, now, hold_ms, owner).await
    }
    /// The task holding an idempotency key, as `(id, trigger_at)`.
    async fn find_idempotent(&self, key: &str) -> Result<Option<(String, Millis)>>;
    /// Begins attempts on claimed tasks whose token still matches; each lease runs
    /// until `now + its timeout + grace_ms`. Returns the ones that started.
    async fn start(
        &self,
        claims: &[(String, i64)],
        now: Millis,
        grace_ms: i64,
    ) -> Result<Vec<Started>>;
    /// Applies each finish whose token still matches; `true` where it applied.
    async fn finish(&self, finishes: &[Finish], now: Millis) -> Result<Vec<bool>>;
    async fn lapsed(&self, now: Millis, limit: u32) -> Result<Vec<Lapsed>>;

    async fn dead_letters(&self, task_type: Option<&str>, limit: u32) -> Result<Vec<TaskRecord>>;
    async fn redrive(&self, id: &str, now: Millis) -> Result<RedriveOutcome>;
    async fn stats(&self, now: Millis) -> Result<Vec<TypeStats>>;

    /// Records that dispatcher `member` is alive at `now` (and forgets members silent
    /// for an hour).
    async fn heartbeat_member(&self, member: &str, now: Millis) -> Result<()>;
    /// Dispatchers whose last heartbeat is at or after `since`, sorted.
    async fn live_members(&self, since: Millis) -> Result<Vec<String>>;
    /// A clean exit: the others take over `member`'s task types at once.
    async fn leave(&self, member: &str) -> Result<()>;
}

/// How long a silent member's row is kept before a heartbeat of another deletes it.
pub const MEMBER_RETENTION_MS: Millis = 3_600_000;

/// Opens the store a URL names.
pub async fn open(url: &str) -> Result<std::sync::Arc<dyn Store>> {
    if url.starts_with("sqlite:") {
        Ok(std::sync::Arc::new(sqlite::SqliteStore::open(url).await?))
    } else if url.starts_with("mysql:") {
        Ok(std::sync::Arc::new(mysql::MySqlStore::open(url).await?))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Ok(std::sync::Arc::new(
            postgres::PostgresStore::open(url).await?,
        ))
    } else {
        Err(StoreError::UnsupportedUrl(url.to_string()))
    }
}

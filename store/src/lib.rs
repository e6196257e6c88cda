//! The task store of asyncd: the one narrow interface every backend implements, and no
//! SQL anywhere else; with it the lease secret each row keeps ([`lease`]) and the heaps a
//! dispatcher holds claimed tasks in ([`heap`]). It depends on nothing of the server:
//! no HTTP, no Kafka, no metrics.
//!
//! A task row moves through these states (`lease_token` is the fencing token; what an
//! executor receives is derived from it and the row's `lease_secret`, see [`lease`]):
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
//! The crate is laid out so that a backend holds only what differs between dialects:
//!
//! - `store`: the [`Store`] trait; `task`: the tasks it takes and hands out and what
//!   each transition answers ([`NewTask`], [`ClaimedTask`] and its rank, …); `params`:
//!   what its other methods take and answer; `kafka_dead_letter`: [`KafkaDeadLetter`];
//!   `millis`: [`Millis`], its one time type;
//! - this file: [`open`] and [`open_migrated`]; `error`: [`StoreError`], which errors are
//!   waited out, and the retry of transactions a database aborted (each backend names
//!   its SQLSTATEs); `redact`: store URLs without their passwords;
//! - [`domain`]: every decision, as pure functions with unit tests — the state a new task
//!   starts in, which key an insert conflicted on, what a finish does to dependents,
//!   what a refused cancel or redrive answers, the order a batch locks rows in;
//! - `rows`: one `FromRow` struct per query shape, shared by the backends, each with one
//!   conversion into [`TaskRecord`], [`ClaimedTask`], [`Lapsed`] and the rest;
//! - `shared`: `Queries`, each backend's named statements, and the
//!   reads whose shape is the same everywhere (a task, the rescuer's scan, membership),
//!   written once over any sqlx database;
//! - `tx`: the write transactions — insert (`tx/insert.rs`: one statement outside a
//!   transaction where the dialect and the tasks allow it; dependency locks, the initial
//!   state, the retry when a key's holder finished before it could be named), cancel, start,
//!   finish with what it does to dependents, redrive — and the dead-letter and stats
//!   reads, written once over any sqlx database and run through each backend's
//!   `tx::Dialect`: its statements and the few steps its database needs done its own
//!   way (how a dedupe key is bound, how dependencies are recorded, released and
//!   failed, whether a statement expected to fail needs a savepoint);
//! - `sql_store`: [`Store`] itself, implemented once for every `sql_store::Backend`: a
//!   dialect with its pools (SQLite writes through one connection and reads through
//!   others) and its own migrations, claims, `start` and `finish`;
//! - [`sqlite`], [`postgres`], [`mysql`]: the SQL and those steps, each explained where
//!   it is done — PostgreSQL releases dependents by locking them then updating them all
//!   with one array, MariaDB has no `UPDATE … RETURNING` and locks then updates with
//!   `IN` lists padded to powers of two, SQLite, with one writer, does each in one
//!   statement — and the fast paths that stay their own: PostgreSQL claims with one
//!   `UPDATE … RETURNING`, MariaDB locks then updates, SQLite batches a whole `start`,
//!   and a `finish` of plain successes, into one statement. Their migrations are in
//!   `migrations/<dialect>/`, embedded at compile time.
//!
//! The store suite, `dispatcher/tests/store_suite/` (a file per entity), runs every scenario
//! against every backend.

mod bounded;
mod bulk;
pub mod domain;
mod error;
mod fair_claim;
pub mod heap;
mod job_counts;
mod job_gate;
mod kafka_dead_letter;
pub mod lease;
mod limit_rows;
mod limited_start;
mod millis;
pub mod mysql;
mod params;
pub mod postgres;
mod redact;
mod rows;
pub mod schedule;
mod shared;
mod sql_store;
pub mod sqlite;
mod store;
mod task;
mod task_row;
pub use task_row::ClaimAtInsert;
#[doc(hidden)]
pub mod testing;
mod tx;
pub mod window;

use std::time::Duration;

pub use asyncd_contract::TaskState;
pub use error::{Result, StoreError};
use error::{is_unique_violation, retrying, unnamed_insert_conflict, unnamed_redrive_conflict};
pub use kafka_dead_letter::{
    KAFKA_DEAD_LETTER_BYTES, KafkaDeadLetter, KafkaDeadLetterKey, KafkaDeadLetterParams,
};
pub use millis::{Millis, duration_ms};
pub use params::{
    Admitted, BulkAction, ClaimIdsParams, ClaimParams, Consumed, DeadCount, DeadFilter,
    DeadLetterParams, DeadRows, DueBacklog, DueStart, DueStarted, FairClaim, FairParams, HeldBy,
    InsertConsumedParams, JobCountParams, JobCounts, JobGate, KeyOrder, PurgeParams, RateBucket,
    SearchParams, Shares, StartDueParams, StartParams, TenantWeights, TypeFilter, UsageBy,
    UsageCounts,
};
use redact::without_password;
pub use redact::{redact, redact_url};
pub use schedule::{
    ConfigSchedule, FireParams, FirePass, FirePlan, Fired, FiringOutcome, PlannedFiring, Planner,
    PutSchedule, ScheduleRecord, ScheduleSource,
};
pub use store::{MEMBER_RETENTION, Store};
pub use task::{
    CancelOutcome, ChangeOutcome, ClaimedTask, ExpiredTask, Finish, FinishKind, InsertOutcome,
    Lapsed, NewTask, PRIORITY_STEP, RedriveOutcome, Started, TaskChange, TaskRecord,
    WorkflowOutcome,
};
pub use window::{KeyWindow, WindowRule};

/// Opens the store a URL names, each call bounded by `bound` ([`open_bounded`]), and
/// applies pending migrations, waiting up to `wait` for a
/// database that is down or restarting (retrying with backoff, each failure logged), so
/// a role started during a database restart comes up with it instead of exiting. Any
/// other error, and still no database after `wait`, is returned at once; so is
/// `shutdown`, as the last error seen.
pub async fn open_migrated(
    url: &str,
    wait: Duration,
    bound: Duration,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<std::sync::Arc<dyn Store>> {
    let started = tokio::time::Instant::now();
    let mut backoff = Duration::from_millis(100);
    loop {
        let attempt = async {
            let store = open_bounded(url, bound).await?;
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

/// A pooled connection to a database server is pinged before use only after it sat idle
/// this long. sqlx pings every connection as it comes back to the pool, so one used a
/// moment ago was just found alive; its default, a ping before each use too, cost a
/// round trip to the server on every store call. One idle longer (through a database
/// restart, say) is still checked, and replaced if it died.
pub const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// What a pool's `before_acquire` hook returns: whether to hand the connection out.
type AcquireCheck<'c> =
    std::pin::Pin<Box<dyn Future<Output = std::result::Result<bool, sqlx::Error>> + Send + 'c>>;

/// The pools' `before_acquire` ([`PING_AFTER_IDLE`]), for any database server.
fn ping_if_idle<DB: sqlx::Database>()
-> impl for<'c> Fn(&'c mut DB::Connection, sqlx::pool::PoolConnectionMetadata) -> AcquireCheck<'c>
+ Send
+ Sync
+ 'static {
    |conn, meta| {
        Box::pin(async move {
            if meta.idle_for >= PING_AFTER_IDLE {
                sqlx::Connection::ping(conn).await?;
            }
            Ok(true)
        })
    }
}

/// How long a call to a store on a database server waits for its answer before it
/// fails as unavailable ([`StoreError::TimedOut`]), unless the role says otherwise
/// (`--store-timeout`): the longest a dead network path goes unnoticed. Far above what a
/// call takes on a working link, each being a few statements over a bounded number of
/// rows (the retention purge and the bulk actions go in batches), and below the claim
/// holds and leases that a call stuck for longer would see lapse.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens the store a URL names, each call bounded by [`CALL_TIMEOUT`] ([`open_bounded`]).
pub async fn open(url: &str) -> Result<std::sync::Arc<dyn Store>> {
    open_bounded(url, CALL_TIMEOUT).await
}

/// Opens the store a URL names. On a database server (MariaDB, PostgreSQL) every call
/// but the migrations fails after `bound` without an answer, and the server ends a
/// transaction left idle for as long (see the `bounded` module); an embedded SQLite file
/// has no network to lose and is not bounded. No error it returns contains the URL's
/// password: the URL is masked in our own messages, and a driver error that quotes the
/// password (none is known to, but a parse error could) is turned into
/// [`StoreError::Redacted`].
pub async fn open_bounded(url: &str, bound: Duration) -> Result<std::sync::Arc<dyn Store>> {
    open_unredacted(url, bound)
        .await
        .map_err(|err| without_password(err, url))
}

async fn open_unredacted(url: &str, bound: Duration) -> Result<std::sync::Arc<dyn Store>> {
    let bounded = |store: std::sync::Arc<dyn Store>| -> std::sync::Arc<dyn Store> {
        std::sync::Arc::new(bounded::Bounded::new(store, bound))
    };
    if url.starts_with("sqlite:") {
        Ok(std::sync::Arc::new(sqlite::SqliteStore::open(url).await?))
    } else if url.starts_with("mysql:") {
        Ok(bounded(std::sync::Arc::new(
            mysql::MySqlStore::open(url, bound).await?,
        )))
    } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        Ok(bounded(std::sync::Arc::new(
            postgres::PostgresStore::open(url, bound).await?,
        )))
    } else {
        Err(StoreError::UnsupportedUrl(redact_url(url)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}

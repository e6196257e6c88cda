//! What can go wrong in the store, and how each error is met: a database away for now
//! is waited out ([`StoreError::is_unavailable`]), a transaction the database aborted is
//! run again ([`retrying`]), the rest is reported.

use std::future::Future;
use std::time::Duration;

use crate::NewTask;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store: {0}")]
    Database(#[from] sqlx::Error),
    #[error("store migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// Holds the URL with its password masked ([`redact_url`](crate::redact_url)).
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
    /// A call got no answer within the store's bound ([`crate::open_bounded`]): the
    /// database or the path to it is gone without a word. Waited out like an outage.
    #[error("store: no answer within {bound:?} to {call}; the call was given up")]
    TimedOut { call: &'static str, bound: Duration },
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
            Self::TimedOut { .. } => true,
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
        sqlx::Error::Database(db) => {
            db.code().as_deref().is_some_and(unavailable_sqlstate)
                || db
                    .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                    .is_some_and(|my| mysql_out_of_room(my.number()))
        }
        _ => false,
    }
}

/// MariaDB's "disk full" (1021) and "the table is full" (1114): a full file system,
/// waited out like an outage until space is freed (their SQLSTATE, HY000, names nothing).
fn mysql_out_of_room(number: u16) -> bool {
    matches!(number, 1021 | 1114)
}

/// SQLSTATEs of a server that is away for now. Class 08 is a connection exception on
/// both PostgreSQL and MariaDB (MariaDB's "server shutdown in progress" and "too many
/// connections" are 08S01 and 08004); 57P01–57P03 are PostgreSQL's administrator or crash
/// shutdown and "the database system is starting up".
/// PostgreSQL: a lost connection (class 08), a server shutting down or starting
/// (57P01–57P03), and insufficient resources (class 53: a full disk, out of memory, too
/// many connections), which pass once the server has room again.
fn unavailable_sqlstate(code: &str) -> bool {
    code.starts_with("08") || code.starts_with("53") || matches!(code, "57P01" | "57P02" | "57P03")
}

impl From<asyncd_contract::UnknownState> for StoreError {
    fn from(err: asyncd_contract::UnknownState) -> Self {
        Self::Corrupt(err.to_string())
    }
}

/// Runs a transaction again when the database aborted it as a deadlock victim or a
/// serialization failure (`transient` says which SQLSTATEs are those). Both roll the
/// whole transaction back, so running it again from the start is safe; anything else is
/// returned as is. Deadlocks are possible in principle (a batch finishing a task while
/// an insert holds its dependency, or the rescuer and a dispatcher finishing
/// overlapping batches), but rare: batches lock rows in id order (see
/// [`domain::lock_order`]).
pub(crate) async fn retrying<T, F, Fut>(transient: fn(&str) -> bool, mut run: F) -> Result<T>
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

pub(crate) fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.is_unique_violation())
}

/// The error when an insert conflicted on a unique key and no task held any of its keys,
/// however often it was tried.
pub(crate) fn unnamed_insert_conflict(task: &NewTask) -> StoreError {
    StoreError::Conflict(format!("insert of {} conflicted on no known key", task.id))
}

/// The same for a redrive.
pub(crate) fn unnamed_redrive_conflict(id: &str) -> StoreError {
    StoreError::Conflict(format!(
        "redrive of {id} conflicted on a unique key no task holds"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outages_and_a_server_out_of_room_are_waited_out() {
        for code in ["08006", "57P01", "57P03", "53100", "53300"] {
            assert!(unavailable_sqlstate(code), "{code}");
        }
        // A bad statement or a constraint is the request's fault, not the server's.
        for code in ["23505", "22021", "42601", "40001"] {
            assert!(!unavailable_sqlstate(code), "{code}");
        }
        assert!(mysql_out_of_room(1021) && mysql_out_of_room(1114));
        assert!(!mysql_out_of_room(1062), "a duplicate key");
    }
}

//! What each SQL backend does its own way; [`Store`] is implemented once over it in
//! [`super`].

use async_trait::async_trait;
use sqlx::{Database, Pool};

use crate::tx::Dialect;
use crate::*;

/// A SQL backend: its dialect, its pools, and what it does its own way; the rest of
/// [`Store`] is implemented once, below, for all of them.
#[async_trait]
pub trait Backend: Dialect {
    /// Where writes go (SQLite: its one writer connection).
    fn writer(&self) -> &Pool<Self::DB>;
    /// Where reads go.
    fn reader(&self) -> &Pool<Self::DB>;
    /// Applies this dialect's pending migrations.
    async fn run_migrations(&self) -> Result<()>;
    /// [`Store::dead_rows`]: `None` unless the database keeps replaced row versions
    /// until a vacuum (SQLite rewrites in place; InnoDB's purge threads remove
    /// delete-marked index records as they go).
    async fn table_dead_rows(&self) -> Result<Option<DeadRows>> {
        Ok(None)
    }
    /// [`Store::reclaim_dead_rows`]: nothing, where [`Backend::table_dead_rows`] is
    /// `None`.
    async fn reclaim_table_dead_rows(&self) -> Result<()> {
        Ok(())
    }
    /// [`Store::claim`].
    async fn claim_due(&self, params: ClaimParams<'_>) -> Result<Vec<ClaimedTask>>;
    /// [`Store::claim_ids`].
    async fn claim_named(&self, params: ClaimIdsParams<'_>) -> Result<Vec<ClaimedTask>>;
    /// [`Store::start`].
    async fn start_claims(&self, params: StartParams<'_>) -> Result<Vec<Started>>;
    /// [`Store::start`] over `conn`, in the caller's transaction ([`Store::start_limited`]).
    async fn start_on(
        conn: &mut <Self::DB as Database>::Connection,
        params: StartParams<'_>,
    ) -> Result<Vec<Started>>;
    /// [`Store::start_due`]'s one write, over `conn` in the caller's transaction: up to
    /// `params.limit` due tasks of `task_type` from pending straight to running.
    async fn start_due_on(
        conn: &mut <Self::DB as Database>::Connection,
        task_type: &str,
        params: StartDueParams<'_>,
    ) -> Result<Vec<(ClaimedTask, Started)>>;
    /// [`Store::finish`] over `conn`, in the caller's transaction (with the next starts,
    /// [`Store::finish_and_start_due`]).
    async fn finish_on(
        conn: &mut <Self::DB as Database>::Connection,
        finishes: &[Finish],
        now: Millis,
    ) -> Result<Vec<bool>>;
}

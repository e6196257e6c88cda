//! The reclaimer: on a store that keeps the row versions an update or delete replaced
//! until a vacuum removes them (PostgreSQL), it vacuums the task table once they pile up.
//!
//! Every attempt replaces its task's row twice (begun, finished) and leaves the entry of
//! its pending version in the claim order's index (`tasks_ranked_by_type`) where the
//! task ranked. Those entries sit in front of every task still waiting, and each claim
//! and each start walks all of them before it reaches the first due task: 25 s into a
//! drain of 3·10⁵ tasks, 10–12 ms and 2 200 buffer reads per start, against 0.2 ms and
//! 80 without them; the drain slowed as it went (docs/benchmarks.md, "A drain walked the
//! rows it had already run"). PostgreSQL's autovacuum would remove them, but by default
//! it looks at a database once a minute (`autovacuum_naptime`) and waits for a fifth of
//! the table to be dead: a drain of 10⁵ tasks is over before it comes. So each
//! dispatcher reads the table's statistics every [`INTERVAL`] and vacuums it once the
//! dead versions reach [`MIN_DEAD`] and a [`DEAD_SHARE`] of the table. A look that finds
//! no more dead versions than the one before waits, without a timer, for the
//! dispatcher's next written outcomes: an idle dispatcher asks nothing.
//!
//! A vacuum passes over the table and every index: about 0.2 s for 3·10⁵ tasks on two
//! cores, while the walks it spares cost more than that each second of a drain. Several
//! dispatchers may find the table due at once; a vacuum already at work on it is left
//! to finish instead of waited for (`SKIP LOCKED`). A role that may not vacuum the table
//! (neither its owner nor the database's) is told once in the log and leaves it to
//! autovacuum. SQLite and MariaDB reclaim as they go: there the reclaimer has nothing to
//! do and waits for the shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use asyncd_store::{DeadRows, Store};

/// How often the statistics are read: one short read of two counters, while a drain
/// adds up to tens of thousands of dead versions a second.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// The fewest dead versions worth a vacuum: below it the walks over them cost less than
/// the vacuum's pass over a small table.
pub const MIN_DEAD: u64 = 20_000;

/// The share of the table's versions that must be dead (1 in `DEAD_SHARE`): a vacuum's
/// cost grows with the table, so a big table waits for more, as autovacuum's
/// `autovacuum_vacuum_scale_factor` does (a fifth by default).
pub const DEAD_SHARE: u64 = 10;

/// What one look at the table did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The store reclaims dead versions by itself: nothing to watch.
    SelfReclaiming,
    /// The store's role may not vacuum the table.
    NotPermitted,
    /// Too few dead versions yet.
    Waited(DeadRows),
    /// Vacuumed (or found a vacuum at work on it) with this many dead versions.
    Reclaimed(DeadRows),
}

/// Whether `rows` call for a vacuum: at least `min_dead` dead versions, and at least one
/// in `share` of all.
pub fn worth_reclaiming(rows: &DeadRows, min_dead: u64, share: u64) -> bool {
    rows.dead >= min_dead && rows.dead.saturating_mul(share) >= rows.live + rows.dead
}

pub struct Reclaimer {
    pub store: Arc<dyn Store>,
    /// The dispatcher's completer's (`Dispatcher::outcomes_written`).
    pub outcomes_written: Arc<Notify>,
}

impl Reclaimer {
    pub async fn run(self, shutdown: CancellationToken) {
        let mut last_dead = None;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(INTERVAL) => {}
            }
            // The shutdown does not wait for a vacuum: on a path to the database that
            // died it could wait out the whole bound.
            let step = tokio::select! {
                _ = shutdown.cancelled() => return,
                step = reclaim_if_due(self.store.as_ref(), MIN_DEAD, DEAD_SHARE) => step,
            };
            match step {
                Ok(Step::SelfReclaiming) => break,
                Ok(Step::NotPermitted) => {
                    tracing::warn!(
                        "the store's role may not vacuum the tasks table (it owns neither the \
                         table nor the database): claims walk the dead rows of finished \
                         attempts until autovacuum removes them; see docs/operations.md"
                    );
                    break;
                }
                Ok(Step::Waited(rows)) => {
                    // Nothing replaced a row since the last look: ask again once this
                    // dispatcher has written outcomes.
                    if last_dead.replace(rows.dead) == Some(rows.dead) {
                        tokio::select! {
                            _ = shutdown.cancelled() => return,
                            _ = self.outcomes_written.notified() => {}
                        }
                    }
                }
                Ok(Step::Reclaimed(_)) => last_dead = None,
                Err(err) => {
                    last_dead = None;
                    tracing::warn!(%err, "reading or reclaiming the task table's dead rows failed");
                }
            }
        }
        shutdown.cancelled().await;
    }
}

/// One look: reads `store`'s statistics, and vacuums if they call for it
/// ([`worth_reclaiming`] with `min_dead` and `share`).
pub async fn reclaim_if_due(
    store: &dyn Store,
    min_dead: u64,
    share: u64,
) -> asyncd_store::Result<Step> {
    let Some(rows) = store.dead_rows().await? else {
        return Ok(Step::SelfReclaiming);
    };
    if !rows.may_reclaim {
        return Ok(Step::NotPermitted);
    }
    if !worth_reclaiming(&rows, min_dead, share) {
        return Ok(Step::Waited(rows));
    }
    let began = Instant::now();
    store.reclaim_dead_rows().await?;
    tracing::debug!(
        live = rows.live,
        dead = rows.dead,
        took_ms = began.elapsed().as_millis() as u64,
        "vacuumed the tasks table"
    );
    Ok(Step::Reclaimed(rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(live: u64, dead: u64) -> DeadRows {
        DeadRows {
            live,
            dead,
            may_reclaim: true,
        }
    }

    #[test]
    fn a_vacuum_waits_for_enough_dead_rows_and_a_share_of_the_table() {
        let due = |live, dead| worth_reclaiming(&rows(live, dead), MIN_DEAD, DEAD_SHARE);
        assert!(
            !due(0, MIN_DEAD - 1),
            "below the floor, however small the table"
        );
        assert!(due(0, MIN_DEAD));
        assert!(due(100_000, MIN_DEAD), "a fifth of 10⁵ + 2·10⁴");
        assert!(!due(1_000_000, 100_000), "a eleventh of the table");
        assert!(due(900_000, 100_000), "a tenth of the table");
    }
}

//! Retention: finished tasks are deleted once they are older than their job's
//! `spec.retention` (succeeded and cancelled 24 h, dead letters 7 days by default), so
//! the task table holds the unfinished work plus a bounded tail instead of growing
//! forever. An idempotency key lives exactly as long as its task's row: while the task is
//! unfinished and for the retention after it finished; a submit with the key after that
//! creates a new task. (A unique key is free as soon as its task finishes, as before.)
//!
//! Each pass walks every routed job and finished state, deleting at most [`BATCH`] tasks
//! per short transaction, oldest first, and at most [`MAX_BATCHES`] per job and state, so
//! a pass never holds locks for long nor starves claims of the database; a backlog of
//! expired rows drains over successive passes. Every dispatcher runs a purger: on
//! PostgreSQL and MySQL concurrent purgers skip the rows another one has locked
//! (`SKIP LOCKED`), and SQLite has one writer anyway. Tasks of a job no longer routed are
//! left alone — nothing says how long to keep them.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::metrics::Metrics;
use crate::routing::Routes;
use crate::signals::{Signal, TestSignals, emit};
use crate::store::{Millis, PurgeParams, Store, TaskState};

/// Tasks deleted per transaction: small enough that a delete holds its row locks for
/// milliseconds.
pub const BATCH: u32 = 500;
/// Batches per job and state in one pass, so one job's expired backlog cannot hold the
/// purger away from the others for long. A pass that stopped at this cap is followed by
/// the next one at once, not after the interval, so a job finishing more tasks per
/// second than one pass deletes is still kept flat.
pub const MAX_BATCHES: u32 = 20;

/// What one pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pass {
    /// The clock reading the pass counted retention from.
    pub at: Millis,
    pub purged: u64,
    /// Some job and state stopped at [`MAX_BATCHES`] with more to delete.
    pub more: bool,
}

pub struct Purger {
    pub store: Arc<dyn Store>,
    pub routes: Routes,
    pub metrics: Arc<Metrics>,
    pub clock: SharedClock,
    pub interval: Duration,
    /// Test-only event hooks.
    pub signals: Option<TestSignals>,
}

impl Purger {
    pub async fn run(self, shutdown: CancellationToken) {
        let mut more = false;
        loop {
            let pause = if more { Duration::ZERO } else { self.interval };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            match self.purge_once().await {
                Ok(pass) => {
                    more = pass.more;
                    emit(&self.signals, || Signal::Purged {
                        purged: pass.purged,
                        at: pass.at,
                    });
                }
                Err(err) => {
                    more = false;
                    tracing::warn!(%err, "retention pass failed");
                }
            }
        }
    }

    /// One pass over every routed job.
    pub async fn purge_once(&self) -> crate::store::Result<Pass> {
        let now = self.clock.now_millis();
        let routes = self.routes.borrow().clone();
        let mut pass = Pass {
            at: now,
            ..Pass::default()
        };
        for job in routes.jobs() {
            let kept = &job.retention;
            for (state, keep) in [
                (TaskState::Succeeded, kept.succeeded),
                (TaskState::Cancelled, kept.cancelled),
                (TaskState::Dead, kept.dead),
            ] {
                let finished_before = Millis::new(
                    now.as_i64()
                        .saturating_sub(i64::try_from(keep.as_millis()).unwrap_or(i64::MAX)),
                );
                for batch in 1..=MAX_BATCHES {
                    let purged = self
                        .store
                        .purge(PurgeParams {
                            task_type: &job.task_type,
                            state,
                            finished_before,
                            limit: BATCH,
                        })
                        .await?;
                    pass.purged += purged;
                    self.metrics
                        .purged
                        .with_label_values(&[job.task_type.as_str(), state.as_str()])
                        .inc_by(purged);
                    if purged < u64::from(BATCH) {
                        break;
                    }
                    pass.more |= batch == MAX_BATCHES;
                }
            }
        }
        Ok(pass)
    }
}

//! Retention: finished tasks are deleted once they are older than their job's
//! `spec.retention` (succeeded, cancelled and expired 24 h, dead letters 7 days by
//! default), so the task table holds the unfinished work plus a bounded tail instead of growing
//! forever. An idempotency key lives exactly as long as its task's row: while the task is
//! unfinished and for the retention after it finished; a submit with the key after that
//! creates a new task.
//!
//! A unique key is held while its task is unfinished and, once it succeeded, for its
//! job's `spec.retention.uniqueKeys` (default 0: free at once; at most the succeeded
//! retention, so the row outlives the hold). The window is the one the job had when the
//! task was submitted, kept in its row. Within it a submit with the key is refused as a
//! duplicate (409 `unique_conflict` naming the task); from its end the key is free: an
//! insert or redrive that hits it frees it on the spot, and each pass here frees the
//! ended ones in batches, so they do not pile up in the unique index. A cancelled or
//! dead task frees its key at once: it did not do the work, and a new submit or its
//! redrive needs the key.
//!
//! Kafka dead letters (messages the consumer could not make a task of, kept byte for
//! byte in `kafka_dead_letters`) are deleted [`KAFKA_DEAD_LETTERS`] after they were
//! recorded, in the same batches: they belong to no job whose retention could say.
//!
//! Each pass walks every routed job and finished state, deleting at most [`BATCH`] tasks
//! per short transaction, oldest first, and at most [`MAX_BATCHES`] per job and state, so
//! a pass never holds locks for long nor starves claims of the database; a backlog of
//! expired rows drains over successive passes. Passes come every second while they
//! delete, and back off to [`IDLE_INTERVAL`] while nothing has expired. Every dispatcher runs a purger: on
//! PostgreSQL and MySQL concurrent purgers skip the rows another one has locked
//! (`SKIP LOCKED`), and SQLite has one writer anyway. Tasks of a job no longer routed are
//! left alone — nothing says how long to keep them.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::job_table::Routes;
use crate::metrics::Metrics;
use crate::test_hooks::{Signal, TestSignals, emit};
use asyncd_store::{Millis, PurgeParams, Store, TaskState};

/// Tasks deleted per transaction: small enough that a delete holds its row locks for
/// milliseconds.
pub const BATCH: u32 = 500;
/// Batches per job and state (and of unique keys, and of Kafka dead letters) in one
/// pass, so one job's expired backlog cannot hold the purger away from the others for
/// long. A pass that stopped at this cap is followed by
/// the next one at once, not after the interval, so a job finishing more tasks per
/// second than one pass deletes is still kept flat.
pub const MAX_BATCHES: u32 = 20;

/// The longest the purger waits between passes while they delete nothing: retention is
/// counted in hours and days, so a store with nothing expired need not be asked every
/// second (each pass is a statement per job and state). A pass that deletes something
/// brings the purger back to its interval at once.
pub const IDLE_INTERVAL: Duration = Duration::from_secs(8);

/// How long a Kafka dead letter is kept: as long as a job's dead letters by default
/// ([`asyncd_spec::Retention::DEFAULT`]), time for an operator to read one and replay it.
pub const KAFKA_DEAD_LETTERS: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long a key window (a debounce's or throttle's, `store::window`) is kept after it
/// closed, once its task no longer waits: a closed window decides nothing (the next
/// submit of its key opens a new one), so this only keeps the table small.
pub const KEY_WINDOWS: Duration = Duration::from_secs(24 * 3600);

/// What one pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pass {
    /// The clock reading the pass counted retention from.
    pub at: Millis,
    /// Finished tasks deleted.
    pub purged: u64,
    /// Some job and state stopped at [`MAX_BATCHES`] with more to delete.
    pub more: bool,
}

/// The wait before the next pass after `pass`: none when it stopped at its cap with more
/// to delete, `interval` when it deleted some, else twice the last wait up to
/// [`IDLE_INTERVAL`].
fn next_pause(last: Duration, pass: &Pass, interval: Duration) -> Duration {
    if pass.more {
        Duration::ZERO
    } else if pass.purged > 0 {
        interval
    } else {
        last.saturating_mul(2)
            .clamp(interval, IDLE_INTERVAL.max(interval))
    }
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
        let mut pause = self.interval;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            match self.purge_once().await {
                Ok(pass) => {
                    pause = next_pause(pause, &pass, self.interval);
                    emit(&self.signals, || Signal::Purged {
                        purged: pass.purged,
                        at: pass.at,
                    });
                }
                Err(err) => {
                    pause = self.interval;
                    tracing::warn!(%err, "retention pass failed");
                }
            }
        }
    }

    /// One pass over every routed job, the unique keys whose hold ended and the Kafka
    /// dead letters.
    pub async fn purge_once(&self) -> asyncd_store::Result<Pass> {
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
                (TaskState::Expired, kept.expired),
            ] {
                let finished_before = now.saturating_sub(keep);
                let (purged, more) = drain(|| {
                    self.store.purge(PurgeParams {
                        task_type: &job.task_type,
                        state,
                        finished_before,
                        limit: BATCH,
                    })
                })
                .await?;
                pass.purged += purged;
                pass.more |= more;
                self.metrics
                    .purged
                    .with_label_values(&[job.task_type.as_str(), state.as_str()])
                    .inc_by(purged);
            }
        }
        // Every job's at once: each row carries its own window.
        let (released, more) = drain(|| self.store.release_unique_keys(now, BATCH)).await?;
        pass.more |= more;
        let recorded_before = now.saturating_sub(KAFKA_DEAD_LETTERS);
        let (kafka_purged, more) =
            drain(|| self.store.purge_kafka_dead_letters(recorded_before, BATCH)).await?;
        pass.more |= more;
        let closed_before = now.saturating_sub(KEY_WINDOWS);
        let (_, more) = drain(|| self.store.purge_key_windows(closed_before, BATCH)).await?;
        pass.more |= more;
        // A cooldown that ended rests nothing: it goes at once.
        let (_, more) = drain(|| self.store.purge_key_cooldowns(now, BATCH)).await?;
        pass.more |= more;
        if released + kafka_purged > 0 {
            tracing::debug!(
                released,
                kafka_purged,
                "unique keys past their window freed, Kafka dead letters purged"
            );
        }
        Ok(pass)
    }
}

/// Runs `batch` (one short transaction acting on at most [`BATCH`] rows) until it acts
/// on fewer, at most [`MAX_BATCHES`] times. Returns how many rows it acted on, and
/// whether it stopped at the cap with a full batch (there may be more).
async fn drain<F, Fut>(mut batch: F) -> asyncd_store::Result<(u64, bool)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = asyncd_store::Result<u64>>,
{
    let mut total = 0;
    for _ in 0..MAX_BATCHES {
        let done = batch().await?;
        total += done;
        if done < u64::from(BATCH) {
            return Ok((total, false));
        }
    }
    Ok((total, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_purger_asks_less_often_and_a_purge_brings_it_back() {
        let second = Duration::from_secs(1);
        let idle = Pass::default();
        let mut pause = second;
        let mut waits = Vec::new();
        for _ in 0..5 {
            pause = next_pause(pause, &idle, second);
            waits.push(pause.as_secs());
        }
        assert_eq!(waits, [2, 4, 8, 8, 8]);
        let purged = Pass {
            purged: 3,
            ..Pass::default()
        };
        assert_eq!(next_pause(pause, &purged, second), second);
        let capped = Pass {
            purged: 10_000,
            more: true,
            ..Pass::default()
        };
        assert_eq!(next_pause(pause, &capped, second), Duration::ZERO);
        assert_eq!(
            next_pause(Duration::ZERO, &idle, second),
            second,
            "after a pass at its cap, never sooner than the interval"
        );
    }
}

//! SQLite's write-ahead log copied into the database file beside the one writer
//! (docs/benchmarks.md, "SQLite's log copied beside the writer").

use std::time::Duration;

use sqlx::SqlitePool;

/// How often the checkpointer looks for new frames in the write-ahead log while the
/// writer is busy. Under a full load the writer adds a few thousand frames a second:
/// each pass copies a few hundred. A look that finds nothing new doubles the wait, up
/// to [`CHECKPOINT_IDLE`], so an idle store costs a `stat` a second.
const CHECKPOINT_EVERY: Duration = Duration::from_millis(50);
const CHECKPOINT_IDLE: Duration = Duration::from_secs(1);

/// The log's size, in pages, at which the writer checkpoints itself after a commit
/// (SQLite's default is 1 000). With the checkpointer ahead of it, the writer's own
/// checkpoint finds the frames copied already; it is what restarts the log from its
/// beginning, which only the connection about to write can do, so it bounds the log
/// (16 MiB at 4 KiB pages).
pub(super) const WRITER_CHECKPOINT_PAGES: &str = "4000";

/// Checkpoints the write-ahead log of the database at `wal` through `pool` whenever it
/// changed, looking every [`CHECKPOINT_EVERY`] to [`CHECKPOINT_IDLE`].
///
/// With SQLite's default, the writer itself copies the log into the database after
/// every 1 000 pages, in the commit that crossed them: the one writer, which every
/// insert, start and finish waits for, spent about a tenth of its time there (copies,
/// and the `fsync`s of `synchronous=NORMAL`). `PASSIVE` neither waits for nor blocks
/// the writer or the readers, so this runs on the other core beside them.
pub(super) async fn checkpoint_beside_the_writer(pool: SqlitePool, wal: std::path::PathBuf) {
    let mut seen = None;
    let mut wait = CHECKPOINT_EVERY;
    loop {
        tokio::time::sleep(wait).await;
        let changed = std::fs::metadata(&wal)
            .and_then(|m| Ok((m.len(), m.modified()?)))
            .ok();
        if changed.is_none() || changed == seen {
            wait = (wait * 2).min(CHECKPOINT_IDLE);
            continue;
        }
        wait = CHECKPOINT_EVERY;
        match sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
            .execute(&pool)
            .await
        {
            Ok(_) => seen = changed,
            // The writer's own checkpoints still bound the log; a failure here only
            // leaves it more to copy.
            Err(err) => tracing::debug!(%err, "background checkpoint failed"),
        }
    }
}

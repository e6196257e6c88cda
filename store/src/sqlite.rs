//! The embedded SQLite backend: the default for `asyncd dev` and single-node use.
//!
//! SQLite allows one writer at a time, so writes go through a pool of one connection
//! (no busy-retry storms, no deferred-transaction upgrade failures) while reads use a
//! separate pool; WAL mode lets the two run side by side. `synchronous=NORMAL` keeps
//! every committed transaction through a process crash (`kill -9`); only a power cut
//! can take the last few, which is the trade the embedded mode makes for speed.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteQueryResult,
    SqliteSynchronous,
};
use sqlx::{Pool, Sqlite, SqliteConnection, SqlitePool};

use super::rows::{self, ClaimRow, claim_columns, task_columns};
use super::shared::{GateRow, ManyRows, Queries};
use super::sql_store::Backend;
use super::tx::{Dialect, Tx};
use super::*;

mod checkpoint;
mod claim;

use checkpoint::{WRITER_CHECKPOINT_PAGES, checkpoint_beside_the_writer};

pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
    /// Copies the write-ahead log into the database file beside the writer; ends
    /// with the store.
    checkpoints: tokio::task::JoinHandle<()>,
}

impl Drop for SqliteStore {
    fn drop(&mut self) {
        self.checkpoints.abort();
    }
}

impl SqliteStore {
    pub async fn open(url: &str) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(30))
            .foreign_keys(false)
            // A statement that may fail halfway (any multi-row insert: a row can hit a
            // unique key) keeps a statement journal of the pages it changed. SQLite keeps
            // the first 64 KiB in memory and spills the rest to a temporary file it
            // creates and deletes per transaction: most of a group commit's writes were
            // to such files, not to the database. In memory, the journal is bounded by
            // the pages one transaction changes.
            .pragma("temp_store", "memory")
            // The rows a statement returns cross from sqlx's SQLite thread to the caller
            // through a channel of this many. At sqlx's 50 a claim (up to 1 000 rows by
            // default) or a batch of 256 filled it, and the SQLite thread, the one writer,
            // parked until the caller drained it: a thread hand-off every 50 rows.
            .row_buffer_size(1024);
        // No ping before each acquire (sqlx's default): a file cannot hang up, and on
        // SQLite the ping is a round trip to the connection's thread, a hand-off that
        // cost as much as a statement and came before every store call.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect_with(
                options
                    .clone()
                    .pragma("wal_autocheckpoint", WRITER_CHECKPOINT_PAGES),
            )
            .await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .connect_with(options.clone().read_only(true))
            .await?;
        let mut wal = options.get_filename().as_os_str().to_owned();
        wal.push("-wal");
        // A checkpoint copies frames from the log to the database file without its
        // connection's page cache: a small one is all it needs.
        let checkpointer = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
            .connect_with(options.pragma("cache_size", "-64"))
            .await?;
        let checkpoints = tokio::spawn(checkpoint_beside_the_writer(checkpointer, wal.into()));
        Ok(Self {
            writer,
            reader,
            checkpoints,
        })
    }
}

// The statements that name their tasks (by a JSON list of ids, or as the dependents of
// one task) write `+state`, not `state`: the unary plus keeps SQLite from reaching the
// rows through an index on `state`, which without statistics it prefers to the primary
// key, and which would walk every task in that state. Until 0028 `tasks_lease` led with
// the state and did that: every claimed task for each batch started, every pending and
// dead task for each batch finished. With `+state` each id is one primary-key lookup
// whatever indexes come. The test `hot_statements_use_the_indexes_meant_for_them` reads
// the plans.

/// The claim of only the tasks due after now (`ClaimParams::ahead`), keeping the types
/// `$types` (parameter ?5) allows: the range of the types' pending tasks due between
/// now and the horizon (tasks_by_type_state), sorted; a walk in claim order would read
/// every due task first.
macro_rules! claim_ahead {
    ($types:literal) => {
        concat!(
            "UPDATE tasks SET state = 'claimed', lease_token = lease_token + 1, \
                    owner = ?1, lease_until = MAX(trigger_at, ?2) + ?3, updated_at = ?2 \
             WHERE id IN (SELECT id FROM tasks INDEXED BY tasks_by_type_state \
                  WHERE ",
            $types,
            " AND state = 'pending' AND state IN ('pending', 'claimed', 'running') \
                    AND trigger_at > ?2 AND trigger_at <= ?4 \
                    AND task_type NOT IN (SELECT task_type FROM job_pauses) \
                  ORDER BY claim_rank, id LIMIT ?6) \
             RETURNING ",
            claim_columns!()
        )
    };
}

const CLAIM_AHEAD_ONE_TYPE: &str = claim_ahead!("task_type = ?5");
const CLAIM_AHEAD_SEVERAL_TYPES: &str =
    claim_ahead!("task_type IN (SELECT value FROM json_each(?5))");

/// Claims these pending tasks (`Store::claim_ids`).
const CLAIM_NAMED: &str = concat!(
    "UPDATE tasks SET state = 'claimed', lease_token = lease_token + 1, owner = ?, \
            lease_until = MAX(trigger_at, ?) + ?, updated_at = ? \
     WHERE +state = 'pending' AND id IN (SELECT value FROM json_each(?)) \
       AND task_type NOT IN (SELECT task_type FROM job_pauses) \
     RETURNING ",
    claim_columns!()
);

/// Claims and begins up to `?5` of one type's due tasks in one write
/// (`Store::start_due`), walking the type's pending tasks in claim order as the claim
/// does.
const START_DUE: &str = concat!(
    "UPDATE tasks SET state = 'running', attempt = attempt + 1, \
            lease_token = lease_token + 1, owner = ?1, lease_until = ?2 + timeout_ms + ?3, \
            updated_at = ?2 \
     WHERE id IN (SELECT id FROM tasks INDEXED BY tasks_ranked_by_type \
                  WHERE state = 'pending' AND claim_rank <= ?2 AND trigger_at <= ?2 \
                    AND task_type = ?4 \
                    AND task_type NOT IN (SELECT task_type FROM job_pauses) \
                    AND (expires_at IS NULL OR expires_at > ?2) \
                  ORDER BY claim_rank, id LIMIT ?5) \
     RETURNING ",
    claim_columns!()
);

/// Begins attempts on a batch of `[id, lease_token]` claims.
const START_BATCH: &str = "UPDATE tasks SET state = 'running', attempt = attempt + 1, \
        lease_token = lease_token + 1, lease_until = ?1 + timeout_ms + ?2, updated_at = ?1 \
     WHERE id IN (SELECT value ->> 0 FROM json_each(?3)) AND +state = 'claimed' \
       AND id || ' ' || lease_token IN (SELECT value ->> 0 || ' ' || (value ->> 1) FROM json_each(?3)) \
       AND task_type NOT IN (SELECT task_type FROM job_pauses) \
       AND (expires_at IS NULL OR expires_at > ?1) \
     RETURNING id, attempt, lease_token";

/// Finishes a batch of `[id, lease_token]` plain successes; returns each finished id,
/// whether its unique key is now to be freed, and whether it has dependents to release.
/// It leaves `unique_active` to [`FREE_UNIQUE_KEYS`], run only for those: naming the
/// column here would rewrite its unique index for every task, keyed or not. The
/// dependents are looked up here rather than by a statement of their own, one round
/// trip to SQLite's thread fewer per batch (`task_deps_reverse`).
const FINISH_SUCCESSES: &str = "UPDATE tasks SET state = 'succeeded', result = NULL, \
             lease_until = NULL, owner = NULL, updated_at = ?1 \
     WHERE id IN (SELECT value ->> 0 FROM json_each(?2)) \
       AND +state IN ('running', 'pending', 'dead') \
       AND id || ' ' || lease_token IN (SELECT value ->> 0 || ' ' || (value ->> 1) FROM json_each(?2)) \
     RETURNING id, unique_active IS NOT NULL AND unique_for = 0, \
               EXISTS (SELECT 1 FROM task_deps WHERE depends_on = tasks.id)";

/// Frees the unique keys of these succeeded tasks (a JSON list of ids) that hold theirs
/// for no window (`unique_for` 0), as the single `succeed` does.
const FREE_UNIQUE_KEYS: &str = "UPDATE tasks SET unique_active = NULL \
     WHERE id IN (SELECT value FROM json_each(?)) AND +unique_active IS NOT NULL \
       AND unique_for = 0";

/// Releases the blocked dependents of a task whose dependencies all succeeded.
const RELEASE_DEPENDENTS: &str = "UPDATE tasks SET state = 'pending', \
            trigger_at = MAX(trigger_at, ?), updated_at = ? \
     WHERE +state = 'blocked' \
       AND id IN (SELECT task_id FROM task_deps WHERE depends_on = ?) \
       AND NOT EXISTS (SELECT 1 FROM task_deps d JOIN tasks t ON t.id = d.depends_on \
                       WHERE d.task_id = tasks.id AND t.state <> 'succeeded')";

/// Fails the blocked dependents of a task that will not succeed.
const FAIL_BLOCKED_DEPENDENTS: &str = "UPDATE tasks SET state = 'dead', unique_active = NULL, \
            last_error = ?, updated_at = ? \
     WHERE +state = 'blocked' AND id IN (SELECT task_id FROM task_deps WHERE depends_on = ?) \
     RETURNING id";

/// The statements every backend runs alike (see `shared` and `tx`).
const QUERIES: Queries = Queries {
    get: concat!("SELECT ", task_columns!(), " FROM tasks WHERE id = ?"),
    dependencies: "SELECT depends_on FROM task_deps WHERE task_id = ? ORDER BY depends_on",
    lapsed_leases: "SELECT id, task_type, state, attempt, max_retries, lease_token FROM tasks \
             WHERE state IN ('claimed', 'running') AND lease_until < ? \
             ORDER BY lease_until LIMIT ?",
    heartbeat: "INSERT INTO dispatchers (id, heartbeat_at, shares) VALUES (?, ?, ?) \
                ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, \
                shares = excluded.shares",
    forget_members: "DELETE FROM dispatchers WHERE heartbeat_at < ?",
    live_members: "SELECT id FROM dispatchers WHERE heartbeat_at >= ? ORDER BY id",
    heartbeat_and_live: None,
    live_shares: "SELECT shares FROM dispatchers WHERE heartbeat_at >= ? AND shares IS NOT NULL",
    remove_member: "DELETE FROM dispatchers WHERE id = ?",
    // A claim always sets a lease: the term lets SQLite read the partial tasks_lease.
    release_claims: "UPDATE tasks SET state = 'pending', lease_until = NULL, owner = NULL, \
                     updated_at = ? WHERE state = 'claimed' AND owner = ? \
                     AND lease_until IS NOT NULL",
    skip_locked: "",
    database_clock: None,
    record_kafka_dead_letter: "INSERT INTO kafka_dead_letters (topic, kafka_partition, kafka_offset, message, \
                               message_size, reason, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?) \
                               ON CONFLICT DO NOTHING",
    // One writer: nothing to skip. The table has a rowid (it is not WITHOUT ROWID).
    purge_kafka_dead_letters: "DELETE FROM kafka_dead_letters WHERE rowid IN \
                               (SELECT rowid FROM kafka_dead_letters WHERE recorded_at < ? \
                                ORDER BY recorded_at LIMIT ?)",
    pause: "INSERT INTO job_pauses (task_type, paused_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
    resume: "DELETE FROM job_pauses WHERE task_type = ?",
    paused_types: "SELECT task_type, paused_at FROM job_pauses ORDER BY task_type",
    // The repeated `state IN (…)` term lets SQLite read the partial tasks_by_type_state.
    next_pending_eta: "SELECT trigger_at FROM tasks INDEXED BY tasks_by_type_state \
                       WHERE task_type = ? AND state = 'pending' \
                         AND state IN ('pending', 'claimed', 'running') \
                         AND trigger_at > ? AND trigger_at <= ? \
                       ORDER BY trigger_at LIMIT 1",
    job_limits: GateRow {
        new: "INSERT INTO job_limits (task_type, tokens, refilled_at) VALUES (?, ?, ?) \
                     ON CONFLICT DO NOTHING",
        // One writer: the transaction itself keeps others out.
        lock: "SELECT tokens, refilled_at FROM job_limits WHERE task_type = ?",
        // One writer: nothing else can hold the row.
        try_lock: "SELECT tokens, refilled_at FROM job_limits WHERE task_type = ?",
        peek: "SELECT tokens, refilled_at FROM job_limits WHERE task_type = ?",
        save: "UPDATE job_limits SET tokens = ?, refilled_at = ? WHERE task_type = ?",
    },
    limiters: GateRow {
        new: "INSERT INTO limiters (id, tokens, refilled_at) VALUES (?, ?, ?) \
                     ON CONFLICT DO NOTHING",
        // One writer: the transaction itself keeps others out.
        lock: "SELECT tokens, refilled_at FROM limiters WHERE id = ?",
        // One writer: nothing else can hold the row.
        try_lock: "SELECT tokens, refilled_at FROM limiters WHERE id = ?",
        peek: "SELECT tokens, refilled_at FROM limiters WHERE id = ?",
        save: "UPDATE limiters SET tokens = ?, refilled_at = ? WHERE id = ?",
    },
    key_buckets: GateRow {
        new: "INSERT INTO key_buckets (id, tokens, refilled_at) VALUES (?, ?, ?) \
                     ON CONFLICT DO NOTHING",
        // One writer: the transaction itself keeps others out.
        lock: "SELECT tokens, refilled_at FROM key_buckets WHERE id = ?",
        // One writer: nothing else can hold the row.
        try_lock: "SELECT tokens, refilled_at FROM key_buckets WHERE id = ?",
        peek: "SELECT tokens, refilled_at FROM key_buckets WHERE id = ?",
        save: "UPDATE key_buckets SET tokens = ?, refilled_at = ? WHERE id = ?",
    },
    purge_key_buckets: "DELETE FROM key_buckets WHERE id IN ( \
                        SELECT id FROM key_buckets WHERE refilled_at < ? \
                        ORDER BY refilled_at LIMIT ?)",
    limiter_waiter: "SELECT waiting, waiting_at FROM limiters WHERE id = ?",
    set_limiter_waiter: "UPDATE limiters SET waiting = ?, waiting_at = ? WHERE id = ?",
    set_tenant_weight: "INSERT INTO tenant_weights (task_type, tenant, weight, updated_at) \
                        VALUES (?, ?, ?, ?) ON CONFLICT (task_type, tenant) DO UPDATE \
                        SET weight = excluded.weight, updated_at = excluded.updated_at",
    delete_tenant_weight: "DELETE FROM tenant_weights WHERE task_type = ? AND tenant = ?",
    tenant_weights: "SELECT tenant, weight FROM tenant_weights WHERE task_type = ? \
                     ORDER BY tenant",
    // The repeated `state IN (…)` term lets SQLite read tasks_by_type_state (0016).
    running: "SELECT COUNT(*) FROM tasks WHERE task_type = ? AND state = 'running' \
              AND state IN ('pending', 'claimed', 'running')",
    limits_and_running: Some(
        "SELECT tokens, refilled_at, (SELECT COUNT(*) FROM tasks \
                 WHERE task_type = job_limits.task_type AND state = 'running' \
                   AND state IN ('pending', 'claimed', 'running')) \
         FROM job_limits WHERE task_type = ?",
    ),
    due_exists: "SELECT trigger_at FROM tasks INDEXED BY tasks_ranked_by_type \
                 WHERE task_type = ? AND state = 'pending' AND claim_rank <= ? \
                   AND trigger_at <= ? LIMIT 1",
    // One writer: nothing can finish a dependency while this transaction runs.
    dependency_state: "SELECT state FROM tasks WHERE id = ?",
    insert_tasks_conflict: " ON CONFLICT DO NOTHING",
    insert_many: ManyRows::LeftOut,
    holder_by_idempotency_key: "SELECT id, trigger_at, task_type, payload FROM tasks \
                                WHERE idempotency_key = ? AND task_type = ?",
    holder_by_cron_key: "SELECT id, trigger_at FROM tasks WHERE cron_key = ?",
    holder_by_id: "SELECT id, trigger_at, task_type FROM tasks WHERE id = ?",
    holder_by_unique_key: "SELECT id, trigger_at FROM tasks \
                           WHERE unique_active = ? AND task_type = ?",
    release_unique: "UPDATE tasks SET unique_active = NULL WHERE id = ? AND unique_until <= ?",
    unique_expired: "SELECT id FROM tasks WHERE unique_until <= ? \
                     ORDER BY unique_until LIMIT ?",
    open_window: "INSERT INTO key_windows (task_type, kind, window_key, opened_at, closes_at) \
                  VALUES (?, ?, ?, 0, 0) \
                  ON CONFLICT (task_type, kind, window_key) \
                  DO UPDATE SET closes_at = key_windows.closes_at",
    read_window: "SELECT task_id, opened_at, closes_at FROM key_windows \
                  WHERE task_type = ? AND kind = ? AND window_key = ?",
    save_window: "UPDATE key_windows SET task_id = ?, opened_at = ?, closes_at = ? \
                  WHERE task_type = ? AND kind = ? AND window_key = ?",
    purge_windows: "DELETE FROM key_windows WHERE (task_type, kind, window_key) IN ( \
                        SELECT task_type, kind, window_key FROM key_windows w \
                        WHERE closes_at < ? \
                          AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = w.task_id \
                                          AND t.state IN ('blocked', 'pending', 'claimed')) \
                        ORDER BY closes_at LIMIT ?)",
    cool_down_key: "INSERT INTO key_cooldowns (task_type, concurrency_key, ends_at) \
                    VALUES (?, ?, ?) ON CONFLICT (task_type, concurrency_key) \
                    DO UPDATE SET ends_at = MAX(ends_at, excluded.ends_at)",
    purge_cooldowns: "DELETE FROM key_cooldowns WHERE (task_type, concurrency_key) IN ( \
                          SELECT task_type, concurrency_key FROM key_cooldowns \
                          WHERE ends_at < ? ORDER BY ends_at LIMIT ?)",
    // The partial index's terms word for word, or SQLite will not read it.
    expirable: "SELECT id, task_type FROM tasks INDEXED BY tasks_expiring \
                WHERE expires_at IS NOT NULL AND state IN ('blocked', 'pending', 'claimed') \
                  AND expires_at <= ? \
                ORDER BY expires_at LIMIT ?",
    expire: "UPDATE tasks SET state = 'expired', last_error = ?, unique_active = NULL, \
             lease_until = NULL, owner = NULL, lease_token = lease_token + 1, updated_at = ? \
             WHERE id = ? AND expires_at <= ? AND state IN ('blocked', 'pending', 'claimed')",
    lock_rows: "",
    lock_skipping: "",
    state: "SELECT state FROM tasks WHERE id = ?",
    cancel: "UPDATE tasks SET state = 'cancelled', unique_active = NULL, lease_until = NULL, \
             lease_token = lease_token + 1, updated_at = ? \
             WHERE id = ? AND state IN ('blocked', 'pending', 'claimed', 'running')",
    change: "UPDATE tasks SET trigger_at = COALESCE(?, trigger_at), \
                 payload = COALESCE(?, payload), priority = COALESCE(?, priority), \
                 state = CASE WHEN state = 'claimed' THEN 'pending' ELSE state END, \
                 owner = NULL, lease_until = NULL, lease_token = lease_token + 1, updated_at = ? \
             WHERE id = ? AND state IN ('blocked', 'pending', 'claimed')",
    succeed: "UPDATE tasks SET state = 'succeeded', result = ?, \
                     unique_active = CASE WHEN unique_for > 0 THEN unique_active END, \
              lease_until = NULL, owner = NULL, updated_at = ? \
              WHERE id = ? AND lease_token = ? AND state IN ('running', 'pending', 'dead')",
    retry: "UPDATE tasks SET state = 'pending', trigger_at = ?, last_error = ?, \
            lease_until = NULL, owner = NULL, updated_at = ? \
            WHERE id = ? AND lease_token = ? AND state = 'running'",
    bury: "UPDATE tasks SET state = 'dead', last_error = ?, unique_active = NULL, \
           lease_until = NULL, owner = NULL, updated_at = ? \
           WHERE id = ? AND lease_token = ? AND state = 'running'",
    release: "UPDATE tasks SET state = 'pending', lease_until = NULL, owner = NULL, updated_at = ? \
              WHERE id = ? AND lease_token = ? AND state = 'claimed'",
    extend: "UPDATE tasks SET lease_until = MAX(lease_until, ?), updated_at = ? \
             WHERE id = ? AND lease_token = ? AND state = 'running'",
    redrive: "UPDATE tasks SET state = ?, attempt = 0, trigger_at = ?, \
              lease_token = lease_token + 1, unique_active = unique_key, lease_until = NULL, updated_at = ? \
              WHERE id = ? AND state = 'dead'",
    redrive_holder: "SELECT b.id FROM tasks a JOIN tasks b \
                     ON b.unique_active = a.unique_key AND b.task_type = a.task_type \
                     WHERE a.id = ?",
    dead_letters: concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks INDEXED BY tasks_dead_due WHERE state = 'dead' AND (? IS NULL OR task_type = ?) \
           AND (trigger_at < ? OR (trigger_at = ? AND id < ?)) \
         ORDER BY trigger_at DESC, id DESC LIMIT ?"
    ),
    // The state is bound, and SQLite reads a partial index only for a condition written
    // out: one branch per index, each naming its index's condition (tasks_finished's, or
    // tasks_expired's), and only the branch of the state bound finds rows.
    purgeable: "SELECT id FROM ( \
                  SELECT * FROM (SELECT id, updated_at FROM tasks \
                    WHERE task_type = ?1 AND state = ?2 AND updated_at < ?3 \
                      AND state IN ('succeeded', 'cancelled', 'dead') \
                      AND NOT EXISTS (SELECT 1 FROM task_deps d JOIN tasks c ON c.id = d.task_id \
                                     WHERE d.depends_on = tasks.id AND c.state = 'blocked') \
                    ORDER BY updated_at, id LIMIT ?4) \
                  UNION ALL \
                  SELECT * FROM (SELECT id, updated_at FROM tasks \
                    WHERE task_type = ?1 AND state = ?2 AND updated_at < ?3 \
                      AND state = 'expired' \
                      AND NOT EXISTS (SELECT 1 FROM task_deps d JOIN tasks c ON c.id = d.task_id \
                                     WHERE d.depends_on = tasks.id AND c.state = 'blocked') \
                    ORDER BY updated_at, id LIMIT ?4)) \
                ORDER BY updated_at, id LIMIT ?4",
};

impl Dialect for SqliteStore {
    type DB = Sqlite;
    type Key = str;

    const QUERIES: Queries = QUERIES;
    const TENANT_OF_KEY: &'static str =
        "substr(concurrency_key, 1, instr(concurrency_key, char(31)) - 1)";
    const KEYED_WALK: crate::tx::keyed_walk::KeyedWalk = crate::tx::keyed_walk::KeyedWalk {
        table: "tasks INDEXED BY tasks_keyed",
        walked: "state IN ('pending', 'claimed', 'running')",
        pending: "state = 'pending'",
        trigger_at: "trigger_at",
        stepwise: false,
        pending_by_rank: "tasks INDEXED BY tasks_ranked_by_type",
        after_tenant_of: |column| {
            format!("substr({column}, 1, instr({column}, char(31)) - 1) || char(32)")
        },
        keyless_setting: None,
    };
    // A failed statement is rolled back alone (SQLite's default ABORT resolution).
    const FAILED_STATEMENT_ABORTS: bool = false;

    /// None: with one writer no transaction is aborted for another's sake.
    fn transient(_: &str) -> bool {
        false
    }

    fn key(key: &str) -> &str {
        key
    }

    fn rows_affected(done: &SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    /// Every run: the same multi-row insert without `ON CONFLICT DO NOTHING RETURNING
    /// id`, whose returned ids SQLite gathers in a temporary table and sqlx hands back
    /// row by row, took a fifth of the writer's time per task of a batch.
    const BULK_LOAD_MIN_ROWS: Option<usize> = Some(1);

    async fn load_tasks(
        conn: &mut SqliteConnection,
        rows: &[crate::task_row::TaskValues<'_>],
    ) -> Result<()> {
        let mut statements = Vec::new();
        let mut rest = rows;
        while !rest.is_empty() {
            let (some, after) = rest.split_at(crate::task_row::rows_per_statement(
                rest.len(),
                ManyRows::LeftOut,
            ));
            statements.push(some);
            rest = after;
        }
        // Each statement's binds are pushed while SQLite's thread runs the one before:
        // the writer is the one serial resource, and it waited on them otherwise.
        let mut statements = statements.into_iter();
        let mut next = statements.next().map(Tx::<Self>::values_statement);
        while let Some(mut statement) = next {
            let (done, following) = tokio::join!(statement.build().execute(&mut *conn), async {
                statements.next().map(Tx::<Self>::values_statement)
            });
            done?;
            next = following;
        }
        Ok(())
    }

    /// One row at a time: a task names few dependencies.
    async fn insert_dependencies(conn: &mut SqliteConnection, task: &NewTask) -> Result<()> {
        Tx::<Self>::insert_each_dependency(
            conn,
            "INSERT INTO task_deps (task_id, depends_on) VALUES (?, ?)",
            task,
        )
        .await
    }

    /// One UPDATE: with one writer nothing can change between its check and its write.
    async fn release_dependents(conn: &mut SqliteConnection, id: &str, now: Millis) -> Result<()> {
        sqlx::query(RELEASE_DEPENDENTS)
            .bind(now)
            .bind(now)
            .bind(id)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn fail_blocked_dependents(
        conn: &mut SqliteConnection,
        dep: &str,
        now: Millis,
    ) -> Result<Vec<String>> {
        Tx::<Self>::fail_returning(conn, FAIL_BLOCKED_DEPENDENTS, dep, now).await
    }
}

#[async_trait]
impl Backend for SqliteStore {
    fn writer(&self) -> &Pool<Self::DB> {
        &self.writer
    }

    fn reader(&self) -> &Pool<Self::DB> {
        &self.reader
    }

    async fn run_migrations(&self) -> Result<()> {
        sqlx::migrate!("./migrations/sqlite")
            .run(&self.writer)
            .await?;
        Ok(())
    }

    async fn claim_due(&self, params: ClaimParams<'_>) -> Result<Vec<ClaimedTask>> {
        if let (true, TypeFilter::Only(list)) = (params.ahead, params.types) {
            let (sql, types) = match list.as_slice() {
                [one] => (CLAIM_AHEAD_ONE_TYPE, one.clone()),
                list => (
                    CLAIM_AHEAD_SEVERAL_TYPES,
                    serde_json::to_string(list).expect("strings serialize"),
                ),
            };
            let rows: Vec<ClaimRow> = sqlx::query_as(sql)
                .bind(params.owner)
                .bind(params.now)
                .bind(duration_ms(params.hold))
                .bind(params.horizon)
                .bind(types)
                .bind(i64::from(params.limit))
                .fetch_all(&self.writer)
                .await?;
            return rows::claimed(rows);
        }
        let pending_types;
        let types = match params.types {
            TypeFilter::Only(list) => list.as_slice(),
            TypeFilter::All => {
                pending_types = sqlx::query_scalar::<_, String>(claim::PENDING_TYPES)
                    .fetch_all(&self.writer)
                    .await?;
                pending_types.as_slice()
            }
        };
        if types.is_empty() {
            return Ok(Vec::new());
        }
        if types.len() <= claim::TYPES_PER_STATEMENT {
            let rows = claim::bind_due(
                sqlx::query_as::<_, ClaimRow>(sqlx::AssertSqlSafe(claim::claim_due_sql(
                    types.len(),
                ))),
                &params,
                types,
            )
            .fetch_all(&self.writer)
            .await?;
            return rows::claimed(rows);
        }
        let mut tx = self.writer.begin().await?;
        let mut picked: Vec<(String, i64)> = Vec::new();
        for run in types.chunks(claim::TYPES_PER_STATEMENT) {
            let query = sqlx::query_as::<_, (String, i64)>(sqlx::AssertSqlSafe(
                claim::pick_due_sql(run.len()),
            ));
            picked.extend(
                claim::bind_due(query, &params, run)
                    .fetch_all(&mut *tx)
                    .await?,
            );
        }
        picked.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        picked.truncate(params.limit as usize);
        let ids: Vec<&str> = picked.iter().map(|(id, _)| id.as_str()).collect();
        let claimed: Vec<ClaimRow> = sqlx::query_as(CLAIM_NAMED)
            .bind(params.owner)
            .bind(params.now)
            .bind(duration_ms(params.hold))
            .bind(params.now)
            .bind(serde_json::to_string(&ids).expect("strings serialize"))
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows::claimed(claimed)
    }

    async fn claim_named(&self, params: ClaimIdsParams<'_>) -> Result<Vec<ClaimedTask>> {
        let rows: Vec<ClaimRow> = sqlx::query_as(CLAIM_NAMED)
            .bind(params.owner)
            .bind(params.now)
            .bind(duration_ms(params.hold))
            .bind(params.now)
            .bind(serde_json::to_string(params.ids).expect("strings serialize"))
            .fetch_all(&self.writer)
            .await?;
        rows::claimed(rows)
    }

    async fn start_claims(&self, params: StartParams<'_>) -> Result<Vec<Started>> {
        let mut conn = self.writer.acquire().await?;
        Self::start_on(&mut conn, params).await
    }

    async fn start_on(
        conn: &mut SqliteConnection,
        params: StartParams<'_>,
    ) -> Result<Vec<Started>> {
        // One statement for the whole batch: each statement is a round trip to sqlx's
        // SQLite worker thread, and those hand-offs, not SQLite, were the cost.
        let rows: Vec<rows::BatchStarted> = sqlx::query_as(START_BATCH)
            .bind(params.now)
            .bind(duration_ms(params.grace))
            .bind(serde_json::to_string(params.claims).expect("pairs serialize"))
            .fetch_all(conn)
            .await?;
        rows::started_in_order(params.claims, rows)
    }

    async fn start_due_on(
        conn: &mut SqliteConnection,
        task_type: &str,
        params: StartDueParams<'_>,
    ) -> Result<Vec<(ClaimedTask, Started)>> {
        let rows: Vec<ClaimRow> = sqlx::query_as(START_DUE)
            .bind(params.owner)
            .bind(params.now)
            .bind(duration_ms(params.grace))
            .bind(task_type)
            .bind(i64::from(params.limit))
            .fetch_all(conn)
            .await?;
        rows::started_due(rows)
    }

    async fn finish_on(
        conn: &mut SqliteConnection,
        finishes: &[Finish],
        now: Millis,
    ) -> Result<Vec<bool>> {
        let mut applied = vec![false; finishes.len()];
        // The common case, plain successes, in one statement (see `start`); tasks that
        // have dependents then release them one by one.
        let plain: Vec<(usize, (&str, i64))> = finishes
            .iter()
            .enumerate()
            .filter(|(_, f)| matches!(f.kind, FinishKind::Succeeded { result: None }))
            .map(|(i, f)| (i, (f.id.as_str(), f.lease_token)))
            .collect();
        if !plain.is_empty() {
            let pairs: Vec<(&str, i64)> = plain.iter().map(|(_, p)| *p).collect();
            let finished: Vec<(String, bool, bool)> = sqlx::query_as(FINISH_SUCCESSES)
                .bind(now)
                .bind(serde_json::to_string(&pairs).expect("pairs serialize"))
                .fetch_all(&mut *conn)
                .await?;
            let to_free: Vec<&str> = finished
                .iter()
                .filter(|(_, free, _)| *free)
                .map(|(id, _, _)| id.as_str())
                .collect();
            if !to_free.is_empty() {
                sqlx::query(FREE_UNIQUE_KEYS)
                    .bind(serde_json::to_string(&to_free).expect("ids serialize"))
                    .execute(&mut *conn)
                    .await?;
            }
            // After the whole batch succeeded: a dependent of two of its tasks is
            // released by whichever comes first, seeing both done.
            for (id, _, has_dependents) in &finished {
                if *has_dependents {
                    <Self as Dialect>::release_dependents(&mut *conn, id, now).await?;
                }
            }
            let done: std::collections::HashSet<String> =
                finished.into_iter().map(|(id, _, _)| id).collect();
            for (i, (id, _)) in &plain {
                applied[*i] = done.contains(*id);
            }
        }
        for (i, finish) in finishes.iter().enumerate() {
            if matches!(finish.kind, FinishKind::Succeeded { result: None }) {
                continue;
            }
            applied[i] = Tx::<Self>::finish_one(&mut *conn, finish, now).await?;
        }
        Ok(applied)
    }
}

#[cfg(test)]
pub(crate) mod tests;

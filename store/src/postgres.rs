//! The PostgreSQL backend: several dispatcher processes share one database.
//!
//! Semantics are those of the SQLite backend, statement for statement where it can be.
//! What differs is concurrency: SQLite runs one write transaction at a time, here many
//! run at once, so
//!
//! - claims lock the rows they take with `FOR UPDATE SKIP LOCKED`: two pollers never
//!   claim the same task and never wait for each other;
//! - isolation is READ COMMITTED (set on every connection, so a server default cannot
//!   change it): each statement sees what was committed before it started, and the
//!   few decisions that read one row to change another lock the row read first (a
//!   dependency while a dependent is inserted, a dependent while it is released);
//! - a transaction chosen as a deadlock victim is run again (see [`retrying`]).

use std::str::FromStr;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgQueryResult};
use sqlx::{PgConnection, PgPool, Pool, Postgres};

use super::rows::{self, ClaimRow, claim_columns, task_columns};
use super::shared::{GateRow, ManyRows, Queries};
use super::sql_store::Backend;
use super::task_row::TaskValues;
use super::tx::{Dialect, Tx};
use super::*;

mod claim_ahead;
mod copy;
mod unnest;
mod vacuum;

/// Below it a load's one statement of arrays (one round trip) beats `COPY`'s two (the
/// load first waits for the server to accept the data); a group commit's runs are mostly
/// of 10–60 tasks.
const COPY_MIN_ROWS: usize = 128;

pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    /// `bound`: how long the server lets a transaction sit idle before it ends the
    /// session (see the `bounded` module), so the row locks of a client that went away
    /// without a word are not held for good. Sent with the connection's start-up
    /// message: no round trip of its own.
    pub async fn open(url: &str, bound: Duration) -> Result<Self> {
        let options = PgConnectOptions::from_str(url)?.options([(
            "idle_in_transaction_session_timeout",
            bound.as_millis().max(1).to_string(),
        )]);
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .test_before_acquire(false)
            .before_acquire(crate::ping_if_idle::<sqlx::Postgres>())
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::query(
                        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED",
                    )
                    .execute(conn)
                    .await
                    .map(drop)
                })
            })
            .connect_with(options)
            .await?;
        Ok(Self { pool })
    }
}

/// The claim of several types (`$2`): each type's pending tasks walked on
/// tasks_ranked_by_type to the limit (`$3`), the first of them all in claim order, then
/// locked as the claim of one type locks them. One index of every type's pending tasks
/// in claim order, written by every new task, served this before 0029; dispatchers run
/// one job each in a cluster, so a claim of several types is `asyncd dev`'s and the
/// tests'. A candidate another claimer holds is skipped, not replaced: such a claim may
/// take fewer than it could.
const CLAIM_SEVERAL_TYPES: &str = concat!(
    "UPDATE tasks SET state = 'claimed', lease_token = lease_token + 1, \
            owner = $4, lease_until = GREATEST(trigger_at, $5) + $6, updated_at = $5 \
     WHERE id = ANY(ARRAY( \
         SELECT id FROM tasks \
         WHERE id = ANY(ARRAY( \
             SELECT picked.id FROM unnest($2::text[]) AS wanted(task_type) \
             CROSS JOIN LATERAL ( \
                 SELECT id, claim_rank FROM tasks \
                 WHERE tasks.task_type = wanted.task_type AND state = 'pending' \
                   AND claim_rank <= $1 AND trigger_at <= $1 \
                   AND CASE WHEN EXISTS (SELECT 1 FROM job_pauses p \
                                         WHERE p.task_type = wanted.task_type) \
                            THEN false ELSE true END \
                 ORDER BY claim_rank, id LIMIT $3) picked \
             ORDER BY picked.claim_rank, picked.id LIMIT $3)) \
           AND state = 'pending' \
         ORDER BY claim_rank, id \
         FOR UPDATE SKIP LOCKED)) \
     RETURNING ",
    claim_columns!()
);

/// The task types with pending tasks (a claim of every type): a skip-scan of
/// tasks_ranked_by_type, one probe per type.
const PENDING_TYPES: &str = "WITH RECURSIVE types(task_type) AS ( \
       (SELECT task_type FROM tasks WHERE state = 'pending' ORDER BY task_type LIMIT 1) \
       UNION ALL \
       SELECT (SELECT t.task_type FROM tasks t \
               WHERE t.state = 'pending' AND t.task_type > types.task_type \
               ORDER BY t.task_type LIMIT 1) \
       FROM types WHERE types.task_type IS NOT NULL) \
     SELECT task_type FROM types WHERE task_type IS NOT NULL";

/// The statements every backend runs alike (see `shared` and `tx`).
const QUERIES: Queries = Queries {
    get: concat!("SELECT ", task_columns!(), " FROM tasks WHERE id = $1"),
    dependencies: "SELECT depends_on FROM task_deps WHERE task_id = $1 ORDER BY depends_on",
    lapsed_leases: "SELECT id, task_type, state, attempt, max_retries, lease_token FROM tasks \
             WHERE state IN ('claimed', 'running') AND lease_until < $1 \
             ORDER BY lease_until LIMIT $2",
    heartbeat: "INSERT INTO dispatchers (id, heartbeat_at, shares) VALUES ($1, $2, $3) \
                ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, \
                shares = excluded.shares",
    forget_members: "DELETE FROM dispatchers WHERE heartbeat_at < $1",
    live_members: "SELECT id FROM dispatchers WHERE heartbeat_at >= $1 ORDER BY id",
    // A statement reads the table as it was when it began: the member's own row comes
    // from the upsert, not the read, and the rows the delete removes are left out of
    // the read by the delete's own bound.
    heartbeat_and_live: Some(
        "WITH beat AS ( \
             INSERT INTO dispatchers (id, heartbeat_at, shares) VALUES ($1, $2, $3) \
             ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, \
             shares = excluded.shares RETURNING id), \
         gone AS (DELETE FROM dispatchers WHERE heartbeat_at < $4 AND id <> $1) \
         SELECT id FROM dispatchers WHERE heartbeat_at >= $5 AND heartbeat_at >= $4 \
           AND id <> $1 \
         UNION SELECT id FROM beat ORDER BY id",
    ),
    live_shares: "SELECT shares FROM dispatchers WHERE heartbeat_at >= $1 AND shares IS NOT NULL",
    remove_member: "DELETE FROM dispatchers WHERE id = $1",
    release_claims: "UPDATE tasks SET state = 'pending', lease_until = NULL, owner = NULL, \
                     updated_at = $1 WHERE state = 'claimed' AND owner = $2",
    skip_locked: " FOR UPDATE SKIP LOCKED",
    database_clock: Some("SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT"),
    record_kafka_dead_letter: "INSERT INTO kafka_dead_letters (topic, kafka_partition, kafka_offset, message, \
                               message_size, reason, recorded_at) VALUES ($1, $2, $3, $4, $5, $6, $7) \
                               ON CONFLICT DO NOTHING",
    purge_kafka_dead_letters: "DELETE FROM kafka_dead_letters WHERE ctid = ANY(ARRAY( \
                               SELECT ctid FROM kafka_dead_letters WHERE recorded_at < $1 \
                               ORDER BY recorded_at LIMIT $2 FOR UPDATE SKIP LOCKED))",
    pause: "INSERT INTO job_pauses (task_type, paused_at) VALUES ($1, $2) ON CONFLICT DO NOTHING",
    resume: "DELETE FROM job_pauses WHERE task_type = $1",
    paused_types: "SELECT task_type, paused_at FROM job_pauses ORDER BY task_type",
    next_pending_eta: "SELECT trigger_at FROM tasks WHERE task_type = $1 \
                       AND state = 'pending' AND trigger_at > $2 AND trigger_at <= $3 \
                       ORDER BY trigger_at LIMIT 1",
    job_limits: GateRow {
        new: "INSERT INTO job_limits (task_type, tokens, refilled_at) VALUES ($1, $2, $3) \
                     ON CONFLICT DO NOTHING",
        lock: "SELECT tokens, refilled_at FROM job_limits WHERE task_type = $1 FOR UPDATE",
        try_lock: "SELECT tokens, refilled_at FROM job_limits WHERE task_type = $1 \
                          FOR UPDATE SKIP LOCKED",
        peek: "SELECT tokens, refilled_at FROM job_limits WHERE task_type = $1",
        save: "UPDATE job_limits SET tokens = $1, refilled_at = $2 WHERE task_type = $3",
    },
    limiters: GateRow {
        new: "INSERT INTO limiters (id, tokens, refilled_at) VALUES ($1, $2, $3) \
                     ON CONFLICT DO NOTHING",
        lock: "SELECT tokens, refilled_at FROM limiters WHERE id = $1 FOR UPDATE",
        try_lock: "SELECT tokens, refilled_at FROM limiters WHERE id = $1 \
                          FOR UPDATE SKIP LOCKED",
        peek: "SELECT tokens, refilled_at FROM limiters WHERE id = $1",
        save: "UPDATE limiters SET tokens = $1, refilled_at = $2 WHERE id = $3",
    },
    key_buckets: GateRow {
        new: "INSERT INTO key_buckets (id, tokens, refilled_at) VALUES ($1, $2, $3) \
                     ON CONFLICT DO NOTHING",
        lock: "SELECT tokens, refilled_at FROM key_buckets WHERE id = $1 FOR UPDATE",
        try_lock: "SELECT tokens, refilled_at FROM key_buckets WHERE id = $1 \
                          FOR UPDATE SKIP LOCKED",
        peek: "SELECT tokens, refilled_at FROM key_buckets WHERE id = $1",
        save: "UPDATE key_buckets SET tokens = $1, refilled_at = $2 WHERE id = $3",
    },
    purge_key_buckets: "DELETE FROM key_buckets WHERE id IN ( \
                        SELECT id FROM key_buckets WHERE refilled_at < $1 \
                        ORDER BY refilled_at LIMIT $2)",
    limiter_waiter: "SELECT waiting, waiting_at FROM limiters WHERE id = $1",
    set_limiter_waiter: "UPDATE limiters SET waiting = $1, waiting_at = $2 WHERE id = $3",
    set_tenant_weight: "INSERT INTO tenant_weights (task_type, tenant, weight, updated_at) \
                        VALUES ($1, $2, $3, $4) ON CONFLICT (task_type, tenant) DO UPDATE \
                        SET weight = excluded.weight, updated_at = excluded.updated_at",
    delete_tenant_weight: "DELETE FROM tenant_weights WHERE task_type = $1 AND tenant = $2",
    tenant_weights: "SELECT tenant, weight FROM tenant_weights WHERE task_type = $1 \
                     ORDER BY tenant",
    running: "SELECT COUNT(*) FROM tasks WHERE task_type = $1 AND state = 'running'",
    limits_and_running: None,
    due_exists: "SELECT trigger_at FROM tasks WHERE task_type = $1 AND state = 'pending' \
                 AND claim_rank <= $2 AND trigger_at <= $3 LIMIT 1",
    dependency_state: "SELECT state FROM tasks WHERE id = $1 FOR SHARE",
    // ON CONFLICT DO NOTHING, with no target, covers every unique constraint, like
    // SQLite's; an error would abort the whole transaction and the batch with it.
    insert_tasks_conflict: " ON CONFLICT DO NOTHING",
    insert_many: ManyRows::LeftOut,
    holder_by_idempotency_key: "SELECT id, trigger_at, task_type, payload FROM tasks \
                                WHERE idempotency_key = $1 AND task_type = $2",
    holder_by_cron_key: "SELECT id, trigger_at FROM tasks WHERE cron_key = $1",
    holder_by_id: "SELECT id, trigger_at, task_type FROM tasks WHERE id = $1",
    holder_by_unique_key: "SELECT id, trigger_at FROM tasks \
                           WHERE unique_active = $1 AND task_type = $2",
    release_unique: "UPDATE tasks SET unique_active = NULL WHERE id = $1 AND unique_until <= $2",
    unique_expired: "SELECT id FROM tasks WHERE unique_until <= $1 \
                     ORDER BY unique_until LIMIT $2 FOR UPDATE SKIP LOCKED",
    open_window: "INSERT INTO key_windows (task_type, kind, window_key, opened_at, closes_at) \
                  VALUES ($1, $2, $3, 0, 0) \
                  ON CONFLICT (task_type, kind, window_key) \
                  DO UPDATE SET closes_at = key_windows.closes_at",
    read_window: "SELECT task_id, opened_at, closes_at FROM key_windows \
                  WHERE task_type = $1 AND kind = $2 AND window_key = $3",
    save_window: "UPDATE key_windows SET task_id = $1, opened_at = $2, closes_at = $3 \
                  WHERE task_type = $4 AND kind = $5 AND window_key = $6",
    purge_windows: "DELETE FROM key_windows WHERE (task_type, kind, window_key) IN ( \
                        SELECT task_type, kind, window_key FROM key_windows w \
                        WHERE closes_at < $1 \
                          AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.id = w.task_id \
                                          AND t.state IN ('blocked', 'pending', 'claimed')) \
                        ORDER BY closes_at LIMIT $2)",
    cool_down_key: "INSERT INTO key_cooldowns (task_type, concurrency_key, ends_at) \
                    VALUES ($1, $2, $3) ON CONFLICT (task_type, concurrency_key) \
                    DO UPDATE SET ends_at = GREATEST(key_cooldowns.ends_at, EXCLUDED.ends_at)",
    purge_cooldowns: "DELETE FROM key_cooldowns WHERE (task_type, concurrency_key) IN ( \
                          SELECT task_type, concurrency_key FROM key_cooldowns \
                          WHERE ends_at < $1 ORDER BY ends_at LIMIT $2)",
    expirable: "SELECT id, task_type FROM tasks \
                WHERE expires_at IS NOT NULL AND state IN ('blocked', 'pending', 'claimed') \
                  AND expires_at <= $1 \
                ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED",
    expire: "UPDATE tasks SET state = 'expired', last_error = $1, unique_active = NULL, \
             lease_until = NULL, owner = NULL, lease_token = lease_token + 1, updated_at = $2 \
             WHERE id = $3 AND expires_at <= $4 AND state IN ('blocked', 'pending', 'claimed')",
    lock_rows: " FOR UPDATE",
    lock_skipping: " FOR UPDATE SKIP LOCKED",
    state: "SELECT state FROM tasks WHERE id = $1",
    cancel: "UPDATE tasks SET state = 'cancelled', unique_active = NULL, lease_until = NULL, \
             lease_token = lease_token + 1, updated_at = $1 \
             WHERE id = $2 AND state IN ('blocked', 'pending', 'claimed', 'running')",
    change: "UPDATE tasks SET trigger_at = COALESCE($1, trigger_at), \
                 payload = COALESCE($2, payload), priority = COALESCE($3, priority), \
                 state = CASE WHEN state = 'claimed' THEN 'pending' ELSE state END, \
                 owner = NULL, lease_until = NULL, lease_token = lease_token + 1, updated_at = $4 \
             WHERE id = $5 AND state IN ('blocked', 'pending', 'claimed')",
    succeed: "UPDATE tasks SET state = 'succeeded', result = $1, \
                     unique_active = CASE WHEN unique_for > 0 THEN unique_active END, \
              lease_until = NULL, owner = NULL, updated_at = $2 \
              WHERE id = $3 AND lease_token = $4 AND state IN ('running', 'pending', 'dead')",
    retry: "UPDATE tasks SET state = 'pending', trigger_at = $1, last_error = $2, \
            lease_until = NULL, owner = NULL, updated_at = $3 \
            WHERE id = $4 AND lease_token = $5 AND state = 'running'",
    bury: "UPDATE tasks SET state = 'dead', last_error = $1, unique_active = NULL, \
           lease_until = NULL, owner = NULL, updated_at = $2 \
           WHERE id = $3 AND lease_token = $4 AND state = 'running'",
    release: "UPDATE tasks SET state = 'pending', lease_until = NULL, owner = NULL, \
              updated_at = $1 \
              WHERE id = $2 AND lease_token = $3 AND state = 'claimed'",
    extend: "UPDATE tasks SET lease_until = GREATEST(lease_until, $1), updated_at = $2 \
             WHERE id = $3 AND lease_token = $4 AND state = 'running'",
    redrive: "UPDATE tasks SET state = $1, attempt = 0, trigger_at = $2, \
              lease_token = lease_token + 1, unique_active = unique_key, lease_until = NULL, updated_at = $3 \
              WHERE id = $4 AND state = 'dead'",
    redrive_holder: "SELECT b.id FROM tasks a JOIN tasks b \
                     ON b.unique_active = a.unique_key AND b.task_type = a.task_type \
                     WHERE a.id = $1",
    dead_letters: concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE state = 'dead' AND ($1::text IS NULL OR task_type = $2) \
           AND (trigger_at < $3 OR (trigger_at = $4 AND id < $5)) \
         ORDER BY trigger_at DESC, id DESC LIMIT $6"
    ),
    purgeable: "SELECT id FROM tasks \
                WHERE task_type = $1 AND state = $2 AND updated_at < $3 \
                  AND NOT EXISTS (SELECT 1 FROM task_deps d JOIN tasks c ON c.id = d.task_id \
                                 WHERE d.depends_on = tasks.id AND c.state = 'blocked') \
                ORDER BY updated_at, id LIMIT $4 FOR UPDATE SKIP LOCKED",
};

/// `UPDATE … RETURNING` begins an attempt and answers its new number and token at once.
impl Dialect for PostgresStore {
    type DB = Postgres;
    type Key = str;

    const QUERIES: Queries = QUERIES;
    const TENANT_OF_KEY: &'static str = "split_part(concurrency_key, chr(31), 1)";
    const KEYED_WALK: crate::tx::keyed_walk::KeyedWalk = crate::tx::keyed_walk::KeyedWalk {
        table: "tasks",
        walked: "state IN ('pending', 'claimed', 'running')",
        pending: "CASE WHEN state = 'pending' THEN true ELSE false END",
        trigger_at: "trigger_at + 0",
        stepwise: false,
        pending_by_rank: "tasks",
        after_tenant_of: |column| format!("split_part({column}, chr(31), 1) || chr(32)"),
        keyless_setting: Some("SET LOCAL enable_sort = off"),
    };
    const FAILED_STATEMENT_ABORTS: bool = true;

    /// Deadlock victims (`40P01`) and serialization failures (`40001`).
    fn transient(code: &str) -> bool {
        matches!(code, "40001" | "40P01")
    }

    fn key(key: &str) -> &str {
        key
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }

    /// Every run: one statement of arrays below [`COPY_MIN_ROWS`], `COPY` from there.
    const BULK_LOAD_MIN_ROWS: Option<usize> = Some(1);
    const RUN_IS_ONE_STATEMENT: bool = true;

    async fn load_tasks(conn: &mut PgConnection, rows: &[TaskValues<'_>]) -> Result<()> {
        match rows.len() {
            n if n < COPY_MIN_ROWS => unnest::load_tasks(conn, rows).await,
            _ => copy::load_tasks(conn, rows).await,
        }
    }

    async fn insert_leaving_out(
        conn: &mut PgConnection,
        rows: &[TaskValues<'_>],
    ) -> Result<Vec<String>> {
        unnest::insert_leaving_out(conn, rows).await
    }

    /// One statement for all of them (a round trip to the server saved per
    /// dependency); DO NOTHING records a dependency named twice once.
    async fn insert_dependencies(conn: &mut PgConnection, task: &NewTask) -> Result<()> {
        sqlx::query(
            "INSERT INTO task_deps (task_id, depends_on) \
             SELECT $1, d FROM UNNEST($2::text[]) AS d ON CONFLICT DO NOTHING",
        )
        .bind(&task.id)
        .bind(&task.depends_on)
        .execute(conn)
        .await?;
        Ok(())
    }

    /// Two steps, unlike SQLite's one UPDATE: the dependents are locked first, then
    /// checked by a new statement. When two dependencies of one task finish at once,
    /// the second finisher waits for the first's lock on the dependent, and its check
    /// (a statement started after the wait) sees the first's success. In a single UPDATE
    /// the NOT EXISTS would read a snapshot from before the wait, each finisher would see
    /// the other's dependency still running, and the dependent would stay blocked.
    async fn release_dependents(conn: &mut PgConnection, id: &str, now: Millis) -> Result<()> {
        let dependents: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM tasks WHERE state = 'blocked' \
               AND id IN (SELECT task_id FROM task_deps WHERE depends_on = $1) \
             ORDER BY id FOR UPDATE",
        )
        .bind(id)
        .fetch_all(&mut *conn)
        .await?;
        if dependents.is_empty() {
            return Ok(());
        }
        sqlx::query(
            "UPDATE tasks SET state = 'pending', trigger_at = GREATEST(trigger_at, $1), \
                    updated_at = $1 \
             WHERE id = ANY($2) AND state = 'blocked' \
               AND NOT EXISTS (SELECT 1 FROM task_deps d JOIN tasks t ON t.id = d.depends_on \
                               WHERE d.task_id = tasks.id AND t.state <> 'succeeded')",
        )
        .bind(now)
        .bind(&dependents)
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn fail_blocked_dependents(
        conn: &mut PgConnection,
        dep: &str,
        now: Millis,
    ) -> Result<Vec<String>> {
        Tx::<Self>::fail_returning(
            conn,
            "UPDATE tasks SET state = 'dead', unique_active = NULL, last_error = $1, \
                    updated_at = $2 \
             WHERE state = 'blocked' \
               AND id IN (SELECT task_id FROM task_deps WHERE depends_on = $3) \
             RETURNING id",
            dep,
            now,
        )
        .await
    }
}

#[async_trait]
impl Backend for PostgresStore {
    fn writer(&self) -> &Pool<Self::DB> {
        &self.pool
    }

    fn reader(&self) -> &Pool<Self::DB> {
        &self.pool
    }

    async fn run_migrations(&self) -> Result<()> {
        // sqlx serialises concurrent migrators with an advisory lock.
        sqlx::migrate!("./migrations/postgres")
            .run(&self.pool)
            .await?;
        Ok(())
    }

    async fn table_dead_rows(&self) -> Result<Option<DeadRows>> {
        vacuum::dead_rows(&self.pool).await.map(Some)
    }

    async fn reclaim_table_dead_rows(&self) -> Result<()> {
        vacuum::reclaim(&self.pool).await
    }

    async fn claim_due(&self, params: ClaimParams<'_>) -> Result<Vec<ClaimedTask>> {
        /// The claim, keeping the types `$types` (parameter `$2`) allows.
        macro_rules! claim_due {
            ($types:literal) => {
                concat!(
                    "UPDATE tasks SET state = 'claimed', lease_token = lease_token + 1, \
                            owner = $4, lease_until = GREATEST(trigger_at, $5) + $6, \
                            updated_at = $5 \
                     WHERE id = ANY(ARRAY( \
                         SELECT id FROM tasks \
                         WHERE state = 'pending' AND claim_rank <= $1 AND trigger_at <= $1 \
                           AND ",
                    $types,
                    " AND CASE WHEN EXISTS (SELECT 1 FROM job_pauses p \
                                                 WHERE p.task_type = tasks.task_type) \
                                    THEN false ELSE true END \
                         ORDER BY claim_rank, id \
                         LIMIT $3 \
                         FOR UPDATE SKIP LOCKED)) \
                     RETURNING ",
                    claim_columns!()
                )
            };
        }
        // One statement, so one transaction. The ARRAY(…) subquery (run once, before
        // the update) walks tasks_ranked_by_type in (claim_rank, id) order — that
        // type's pending tasks alone (several types: CLAIM_SEVERAL_TYPES) — from the start to
        // the horizon: a task due by then ranks no later (`claim_rank <= trigger_at`), so
        // the walk never reads the tasks due after it — locks up to `limit`
        // rows and skips rows another claimer has locked (it is claiming them); the
        // UPDATE then marks exactly the rows locked, found by primary key. (Joining a
        // CTE instead lets a generic plan, which does not know `limit`, hash-join it
        // against a scan of the whole table.) The pause test is a CASE, not a `NOT
        // EXISTS`: the planner turns that into an anti-join and, with few task types in
        // the statistics and a never-analysed `job_pauses`, estimates that one due row
        // survives it — then it sorts every due row instead of walking the index to
        // `limit` (2.7 s instead of 16 ms a claim with 366 000 due tasks in the soak).
        // A CASE is opaque to it: half the rows, and the walk wins. The type test is
        // its own statement for one type (`task_type = $2`): a generic plan of
        // `$2 IS NULL OR …` could not choose the type's index.
        if let (true, TypeFilter::Only(types)) = (params.ahead, params.types) {
            return self.claim_ahead(params, types).await;
        }
        let pending_types;
        let several = match params.types {
            TypeFilter::Only(list) if list.len() == 1 => None,
            TypeFilter::Only(list) => Some(list.as_slice()),
            TypeFilter::All => {
                pending_types = sqlx::query_scalar::<_, String>(PENDING_TYPES)
                    .fetch_all(&self.pool)
                    .await?;
                Some(pending_types.as_slice())
            }
        };
        let rows: Vec<ClaimRow> = retrying(Self::transient, || async {
            let query = match (several, params.types) {
                (Some(types), _) => sqlx::query_as(CLAIM_SEVERAL_TYPES)
                    .bind(params.horizon)
                    .bind(types),
                (None, TypeFilter::Only(one)) => sqlx::query_as(claim_due!("task_type = $2"))
                    .bind(params.horizon)
                    .bind(one[0].as_str()),
                (None, TypeFilter::All) => unreachable!("every type is claimed as several"),
            };
            let rows = query
                .bind(i64::from(params.limit))
                .bind(params.owner)
                .bind(params.now)
                .bind(duration_ms(params.hold))
                .fetch_all(&self.pool)
                .await?;
            Ok(rows)
        })
        .await?;
        rows::claimed(rows)
    }

    async fn claim_named(&self, params: ClaimIdsParams<'_>) -> Result<Vec<ClaimedTask>> {
        let rows: Vec<ClaimRow> = retrying(Self::transient, || async {
            Ok(sqlx::query_as(concat!(
                "UPDATE tasks SET state = 'claimed', lease_token = lease_token + 1, \
                        owner = $2, lease_until = GREATEST(trigger_at, $3) + $4, updated_at = $3 \
                 WHERE state = 'pending' AND id = ANY($1) \
                   AND NOT EXISTS (SELECT 1 FROM job_pauses p WHERE p.task_type = tasks.task_type) \
                 RETURNING ",
                claim_columns!()
            ))
            .bind(params.ids)
            .bind(params.owner)
            .bind(params.now)
            .bind(duration_ms(params.hold))
            .fetch_all(&self.pool)
            .await?)
        })
        .await?;
        rows::claimed(rows)
    }

    async fn start_claims(&self, params: StartParams<'_>) -> Result<Vec<Started>> {
        // A deadlock with the rescuer or a member's claims being released is retried
        // like any other.
        retrying(Self::transient, || async {
            let mut conn = self.pool.acquire().await?;
            Self::start_on(&mut conn, params).await
        })
        .await
    }

    async fn start_due_on(
        conn: &mut PgConnection,
        task_type: &str,
        params: StartDueParams<'_>,
    ) -> Result<Vec<(ClaimedTask, Started)>> {
        // The claim's walk and locks (see `claim_due`), for one type, with the start's
        // write.
        let rows: Vec<ClaimRow> = sqlx::query_as(concat!(
            "UPDATE tasks SET state = 'running', attempt = attempt + 1, \
                    lease_token = lease_token + 1, owner = $3, \
                    lease_until = $2 + timeout_ms + $4, updated_at = $2 \
             WHERE id = ANY(ARRAY( \
                 SELECT id FROM tasks \
                 WHERE state = 'pending' AND claim_rank <= $2 AND trigger_at <= $2 \
                   AND task_type = $1 \
                   AND CASE WHEN EXISTS (SELECT 1 FROM job_pauses p \
                                         WHERE p.task_type = tasks.task_type) \
                            THEN false ELSE true END \
                   AND (expires_at IS NULL OR expires_at > $2) \
                 ORDER BY claim_rank, id \
                 LIMIT $5 \
                 FOR UPDATE SKIP LOCKED)) \
             RETURNING ",
            claim_columns!()
        ))
        .bind(task_type)
        .bind(params.now)
        .bind(params.owner)
        .bind(duration_ms(params.grace))
        .bind(i64::from(params.limit))
        .fetch_all(conn)
        .await?;
        rows::started_due(rows)
    }

    async fn start_on(conn: &mut PgConnection, params: StartParams<'_>) -> Result<Vec<Started>> {
        // One statement for the whole batch, the claims joined in as arrays: a statement
        // per claim made beginning attempts a round trip each, the dispatcher's ceiling on
        // this backend. (Two batches never share a claim.)
        let (ids, tokens): (Vec<&str>, Vec<i64>) = params
            .claims
            .iter()
            .map(|(id, token)| (id.as_str(), *token))
            .unzip();
        let rows: Vec<rows::BatchStarted> = sqlx::query_as(
            "UPDATE tasks SET state = 'running', attempt = attempt + 1, \
                    lease_token = lease_token + 1, lease_until = $1 + timeout_ms + $2, \
                    updated_at = $1 \
             FROM UNNEST($3::text[], $4::bigint[]) AS c(claim_id, claim_token) \
             WHERE tasks.id = c.claim_id AND tasks.lease_token = c.claim_token \
               AND tasks.state = 'claimed' \
               AND NOT EXISTS (SELECT 1 FROM job_pauses p WHERE p.task_type = tasks.task_type) \
               AND (tasks.expires_at IS NULL OR tasks.expires_at > $1) \
             RETURNING tasks.id, tasks.attempt, tasks.lease_token",
        )
        .bind(params.now)
        .bind(duration_ms(params.grace))
        .bind(&ids)
        .bind(&tokens)
        .fetch_all(conn)
        .await?;
        rows::started_in_order(params.claims, rows)
    }

    async fn finish_on(
        conn: &mut PgConnection,
        finishes: &[Finish],
        now: Millis,
    ) -> Result<Vec<bool>> {
        // Successes, nearly every outcome, in one statement (see `start_claims`); the
        // rest one at a time, and the dependents of what succeeded after that.
        let successes: Vec<(usize, &str, i64, Option<&str>)> = finishes
            .iter()
            .enumerate()
            .filter_map(|(i, f)| match &f.kind {
                FinishKind::Succeeded { result } => Some((
                    i,
                    f.id.as_str(),
                    f.lease_token,
                    result.as_ref().map(|r| r.get()),
                )),
                _ => None,
            })
            .collect();
        let ids: Vec<&str> = successes.iter().map(|s| s.1).collect();
        let tokens: Vec<i64> = successes.iter().map(|s| s.2).collect();
        let results: Vec<Option<&str>> = successes.iter().map(|s| s.3).collect();
        let mut applied = vec![false; finishes.len()];
        if !successes.is_empty() {
            // By id and token: a batch may hold a stale outcome and the live one of
            // the same task. Whether each has dependents comes back with it, rather than
            // from a read of its own: one round trip fewer for every outcome written.
            let done: Vec<(String, i64, bool)> = sqlx::query_as(
                "UPDATE tasks SET state = 'succeeded', result = s.outcome, \
                        unique_active = CASE WHEN unique_for > 0 THEN unique_active END, \
                        lease_until = NULL, owner = NULL, \
                        updated_at = $1 \
                 FROM UNNEST($2::text[], $3::bigint[], $4::text[]) \
                      AS s(finished_id, finished_token, outcome) \
                 WHERE tasks.id = s.finished_id AND tasks.lease_token = s.finished_token \
                   AND tasks.state IN ('running', 'pending', 'dead') \
                 RETURNING tasks.id, tasks.lease_token, \
                           EXISTS (SELECT 1 FROM task_deps d WHERE d.depends_on = tasks.id)",
            )
            .bind(now)
            .bind(&ids)
            .bind(&tokens)
            .bind(&results)
            .fetch_all(&mut *conn)
            .await?;
            let applied_ones: std::collections::HashSet<(&str, i64)> = done
                .iter()
                .map(|(id, token, _)| (id.as_str(), *token))
                .collect();
            for (i, id, token, _) in &successes {
                applied[*i] = applied_ones.contains(&(*id, *token));
            }
            // In id order, as the read this replaced sorted them: two batches releasing
            // a shared dependent lock in the same order.
            let mut with_dependents: Vec<&str> = done
                .iter()
                .filter(|(_, _, dependents)| *dependents)
                .map(|(id, _, _)| id.as_str())
                .collect();
            with_dependents.sort_unstable();
            with_dependents.dedup();
            for id in with_dependents {
                Self::release_dependents(&mut *conn, id, now).await?;
            }
        }
        for i in domain::lock_order(finishes.iter().map(|f| &f.id)) {
            if !matches!(finishes[i].kind, FinishKind::Succeeded { .. }) {
                applied[i] = Tx::<Self>::finish_one(&mut *conn, &finishes[i], now).await?;
            }
        }
        Ok(applied)
    }
}

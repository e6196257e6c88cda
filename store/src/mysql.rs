//! The MySQL-protocol backend (tested on MariaDB >= 10.6; MySQL >= 8.0 has every
//! feature used): several dispatcher processes share one database.
//!
//! Semantics are those of the SQLite backend; the statements differ where MySQL lacks
//! something (no `UPDATE … RETURNING`, no partial indexes, no `ON CONFLICT DO NOTHING`
//! that reports which rows it skipped). As on PostgreSQL (see `postgres.rs`):
//!
//! - claims lock the rows they take with `SELECT … FOR UPDATE SKIP LOCKED`, then mark
//!   them claimed in the same transaction: two pollers never claim the same task and
//!   never wait for each other;
//! - isolation is READ COMMITTED, set on every connection (InnoDB defaults to
//!   REPEATABLE READ, whose gap locks would make a claim block inserts of new due tasks
//!   and whose snapshot would make the dependency checks below read stale states);
//!   the decisions that read one row to change another lock the row read first;
//! - a transaction chosen as a deadlock victim is run again (see [`retrying`]);
//! - statements that lock rows pin their index. InnoDB locks (and an UPDATE at least
//!   examines) every row its plan visits, and MariaDB, seeing few rows in a state
//!   (statistics on a queue table are always stale), will reach `id = ? AND state = …`
//!   through the state index and walk every claimed or blocked task; hence
//!   `FORCE INDEX (PRIMARY)` on the updates by id, and the pinned claim and dependents
//!   plans below.

mod queries;

use std::str::FromStr;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions, MySqlQueryResult};
use sqlx::{MySql, MySqlConnection, MySqlPool, Pool};

use super::domain;

use super::rows::{self, ClaimRow, claim_columns};
use super::shared::Queries;
use super::sql_store::Backend;
use super::tx::{Dialect, Tx};
use super::*;
use queries::QUERIES;

pub struct MySqlStore {
    pool: MySqlPool,
}

impl MySqlStore {
    /// `bound`: how long the server lets a transaction sit idle before it ends the
    /// session (see the `bounded` module), so the row locks of a client that went away
    /// without a word are not held until `wait_timeout` (8 hours by default).
    pub async fn open(url: &str, bound: Duration) -> Result<Self> {
        let options = MySqlConnectOptions::from_str(url)?;
        let idle_transaction = format!(
            "SET SESSION idle_transaction_timeout = {}",
            bound.as_secs().max(1)
        );
        let pool = MySqlPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .test_before_acquire(false)
            .before_acquire(crate::ping_if_idle::<sqlx::MySql>())
            .after_connect(move |conn, _| {
                let idle_transaction = sqlx::AssertSqlSafe(idle_transaction.clone());
                Box::pin(async move {
                    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .execute(&mut *conn)
                        .await?;
                    match sqlx::query(idle_transaction).execute(&mut *conn).await {
                        // MariaDB's own variable (1193: unknown to MySQL, whose sessions
                        // keep the server's wait_timeout).
                        Err(sqlx::Error::Database(db))
                            if db
                                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                                .is_some_and(|err| err.number() == 1193) =>
                        {
                            Ok(())
                        }
                        other => other.map(drop),
                    }
                })
            })
            .connect_with(options)
            .await?;
        Ok(Self { pool })
    }
}

/// Which pending rows a claim takes.
#[derive(Clone, Copy)]
enum Selection<'a> {
    /// Up to `limit` due by `horizon`, earliest first, of these types (or all).
    Due {
        types: Option<&'a [String]>,
        horizon: Millis,
        limit: u32,
        /// Only those due after this (`ClaimParams::ahead`), with a list of types.
        after: Option<Millis>,
    },
    /// These rows.
    Ids(&'a [String]),
}

/// `?, ?, …` for an `IN` list of `n` values (never 0: `IN ()` is a syntax error, so
/// callers return early on empty lists), padded to the next power of two; bind the
/// values with [`padded`], which repeats the last one (harmless in `IN`). Padding keeps
/// each statement to a handful of shapes that stay in the prepared-statement cache.
/// The alternative, preparing and closing a statement per call, costs a 40 ms stall
/// each time: sqlx sends the close, which gets no answer, just before the next command,
/// and without TCP_NODELAY (sqlx does not set it) Nagle holds that command back until
/// the server's delayed ACK arrives.
fn placeholders(n: usize) -> String {
    debug_assert!(n > 0);
    vec!["?"; n.next_power_of_two()].join(", ")
}

fn padded<T>(values: &[T]) -> impl Iterator<Item = &T> {
    let last = values.last();
    values
        .iter()
        .chain(std::iter::repeat_n(last, values.len().next_power_of_two() - values.len()).flatten())
}

/// No `UPDATE … RETURNING`: the started row is read back, still locked by the
/// transaction.
/// The blocked dependents of `id`, locked.
///
/// InnoDB locks the rows a locking read visits, so the plan is pinned: walk `id`'s
/// dependency rows (task_deps_reverse, in task id order, so two finishers queue rather
/// than deadlock) and look each dependent up by primary key. Left to itself, the
/// optimizer reaches `tasks` through `state = 'blocked'` when it expects few blocked
/// tasks, and would then lock every blocked task in the table.
async fn lock_blocked_dependents(conn: &mut MySqlConnection, id: &str) -> Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT t.id FROM task_deps d STRAIGHT_JOIN tasks t FORCE INDEX (PRIMARY) \
           ON t.id = d.task_id \
         WHERE d.depends_on = ? AND t.state = 'blocked' \
         ORDER BY d.task_id FOR UPDATE",
    )
    .bind(id)
    .fetch_all(conn)
    .await?)
}

impl Dialect for MySqlStore {
    type DB = MySql;
    type Key = [u8];

    const QUERIES: Queries = QUERIES;
    const TENANT_OF_KEY: &'static str = "SUBSTRING_INDEX(concurrency_key, CHAR(31), 1)";
    const KEYED_WALK: crate::tx::keyed_walk::KeyedWalk = crate::tx::keyed_walk::KeyedWalk {
        table: "tasks FORCE INDEX (tasks_keyed)",
        walked: "state = 'pending'",
        pending: "state = 'pending'",
        trigger_at: "trigger_at",
        stepwise: true,
        pending_by_rank: "tasks FORCE INDEX (tasks_ranked_by_type)",
        after_tenant_of: |column| {
            format!("CONCAT(SUBSTRING_INDEX({column}, CHAR(31), 1), CHAR(32))")
        },
        keyless_setting: None,
    };
    // InnoDB rolls a failed statement back alone; the transaction goes on.
    const FAILED_STATEMENT_ABORTS: bool = false;

    /// InnoDB's deadlock victims (SQLSTATE `40001`, error 1213).
    fn transient(code: &str) -> bool {
        code == "40001"
    }

    /// The dedupe keys are VARBINARY (see the migration).
    fn key(key: &str) -> &[u8] {
        key.as_bytes()
    }

    fn rows_affected(done: &MySqlQueryResult) -> u64 {
        done.rows_affected()
    }

    /// One row at a time, deduplicated first rather than with `INSERT IGNORE`, which
    /// would also turn other errors into warnings.
    async fn insert_dependencies(conn: &mut MySqlConnection, task: &NewTask) -> Result<()> {
        Tx::<Self>::insert_each_dependency(
            conn,
            "INSERT INTO task_deps (task_id, depends_on) VALUES (?, ?)",
            task,
        )
        .await
    }

    /// The dependents are locked first and checked by later statements. When two
    /// dependencies of one task finish at once, the second finisher waits for the
    /// first's lock on the dependent, and its check (a statement started after the wait,
    /// so with a fresh READ COMMITTED view) sees the first's success; without the lock
    /// each could see the other's dependency still running and leave the dependent
    /// blocked. (MySQL also refuses SQLite's single UPDATE: its NOT EXISTS reads the
    /// table being updated.)
    async fn release_dependents(conn: &mut MySqlConnection, id: &str, now: Millis) -> Result<()> {
        let dependents = lock_blocked_dependents(conn, id).await?;
        if dependents.is_empty() {
            return Ok(());
        }
        let sql = format!(
            "SELECT d.task_id FROM task_deps d JOIN tasks t ON t.id = d.depends_on \
             WHERE d.task_id IN ({}) \
             GROUP BY d.task_id HAVING SUM(t.state <> 'succeeded') = 0",
            placeholders(dependents.len())
        );
        let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql));
        for dependent in padded(&dependents) {
            query = query.bind(dependent);
        }
        let ready: Vec<String> = query.fetch_all(&mut *conn).await?;
        if ready.is_empty() {
            return Ok(());
        }
        let sql = format!(
            "UPDATE tasks FORCE INDEX (PRIMARY) \
             SET state = 'pending', trigger_at = GREATEST(trigger_at, ?), \
                    updated_at = ? \
             WHERE state = 'blocked' AND id IN ({})",
            placeholders(ready.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now).bind(now);
        for id in padded(&ready) {
            query = query.bind(id);
        }
        query.execute(conn).await?;
        Ok(())
    }

    /// No UPDATE … RETURNING: lock the dependents to learn which they are, then update
    /// exactly those.
    async fn fail_blocked_dependents(
        conn: &mut MySqlConnection,
        dep: &str,
        now: Millis,
    ) -> Result<Vec<String>> {
        let dependents = lock_blocked_dependents(conn, dep).await?;
        if dependents.is_empty() {
            return Ok(dependents);
        }
        let sql = format!(
            "UPDATE tasks FORCE INDEX (PRIMARY) \
             SET state = 'dead', unique_active = NULL, last_error = ?, \
                    updated_at = ? \
             WHERE state = 'blocked' AND id IN ({})",
            placeholders(dependents.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(domain::dependency_failed(dep))
            .bind(now);
        for id in padded(&dependents) {
            query = query.bind(id);
        }
        query.execute(conn).await?;
        Ok(dependents)
    }
}

impl MySqlStore {
    async fn claim_tx(
        &self,
        selection: Selection<'_>,
        now: Millis,
        hold: Duration,
        owner: &str,
    ) -> Result<Vec<ClaimedTask>> {
        let mut tx = self.pool.begin().await?;
        let ids: Vec<String> = match selection {
            // Walk tasks_ranked in (claim_rank, id) order — for one type,
            // tasks_ranked_by_type, that type's pending tasks alone — and lock up to
            // `limit` rows, skipping rows another claimer has locked (it is claiming
            // them). FORCE INDEX: a plan that scanned and sorted instead would lock every
            // due row, not just `limit` of them, and starve the other claimers;
            // statistics on a queue table change too fast to leave that to the optimizer.
            // Only the tasks due after `after`: the range of the types' pending tasks
            // due between it and the horizon (tasks_by_type_state), sorted; the walk in
            // claim order would read every task already due first.
            Selection::Due {
                types: Some(types),
                horizon,
                limit,
                after: Some(after),
            } if !types.is_empty() => {
                let sql = format!(
                    "SELECT id FROM tasks FORCE INDEX (tasks_by_type_state) \
                     WHERE task_type IN ({}) AND state = 'pending' \
                       AND trigger_at > ? AND trigger_at <= ? \
                       AND NOT EXISTS (SELECT 1 FROM job_pauses p WHERE p.task_type = tasks.task_type) \
                     ORDER BY claim_rank, id LIMIT ? FOR UPDATE SKIP LOCKED",
                    placeholders(types.len())
                );
                let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql));
                for task_type in padded(types) {
                    query = query.bind(task_type);
                }
                query
                    .bind(after)
                    .bind(horizon)
                    .bind(i64::from(limit))
                    .fetch_all(&mut *tx)
                    .await?
            }
            Selection::Due {
                types,
                horizon,
                limit,
                after: _,
            } => {
                let (index, type_filter) = match types {
                    None => ("tasks_ranked", String::new()),
                    Some([_]) => ("tasks_ranked_by_type", " AND task_type = ?".to_string()),
                    Some(list) => (
                        "tasks_ranked",
                        format!(" AND task_type IN ({})", placeholders(list.len())),
                    ),
                };
                let sql = format!(
                    "SELECT id FROM tasks FORCE INDEX ({index}) \
                     WHERE state = 'pending' AND claim_rank <= ? AND trigger_at <= ?{type_filter} \
                       AND NOT EXISTS (SELECT 1 FROM job_pauses p WHERE p.task_type = tasks.task_type) \
                     ORDER BY claim_rank, id LIMIT ? FOR UPDATE SKIP LOCKED"
                );
                // `claim_rank <= horizon` bounds the walk: a task due by the horizon ranks
                // no later, and the tasks due after it are never read.
                let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                    .bind(horizon)
                    .bind(horizon);
                for task_type in padded(types.unwrap_or_default()) {
                    query = query.bind(task_type);
                }
                query.bind(i64::from(limit)).fetch_all(&mut *tx).await?
            }
            // Named rows (a Kafka consumer's own): lock the ones still pending.
            Selection::Ids(ids) => {
                let sql = format!(
                    "SELECT id FROM tasks FORCE INDEX (PRIMARY) \
                     WHERE state = 'pending' AND id IN ({}) \
                       AND NOT EXISTS (SELECT 1 FROM job_pauses p WHERE p.task_type = tasks.task_type) \
                     FOR UPDATE SKIP LOCKED",
                    placeholders(ids.len())
                );
                let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql));
                for id in padded(ids) {
                    query = query.bind(id);
                }
                query.fetch_all(&mut *tx).await?
            }
        };
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let list = placeholders(ids.len());
        let sql = format!(
            "UPDATE tasks FORCE INDEX (PRIMARY) \
             SET state = 'claimed', lease_token = lease_token + 1, owner = ?, \
                    lease_until = GREATEST(trigger_at, ?) + ?, updated_at = ? \
             WHERE id IN ({list})"
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(owner)
            .bind(now)
            .bind(duration_ms(hold))
            .bind(now);
        for id in padded(&ids) {
            query = query.bind(id);
        }
        query.execute(&mut *tx).await?;
        // No UPDATE … RETURNING: read the claimed rows back (still locked by us).
        let sql = format!(
            concat!(
                "SELECT ",
                claim_columns!(),
                " FROM tasks WHERE id IN ({list})"
            ),
            list = list
        );
        let mut query = sqlx::query_as::<_, ClaimRow>(sqlx::AssertSqlSafe(sql));
        for id in padded(&ids) {
            query = query.bind(id);
        }
        let rows = query.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        rows::claimed(rows)
    }
}

/// `[[id, token], …]` sorted by id, for [`json_pairs!`]: the order rows are locked in.
fn pairs_json<'a>(pairs: impl Iterator<Item = (&'a str, i64)>) -> String {
    let mut pairs: Vec<(&str, i64)> = pairs.collect();
    pairs.sort_unstable();
    serde_json::to_string(&pairs).expect("pairs serialize")
}

/// A table `p(pair_id, pair_token)` of the JSON array of [`pairs_json`], bound as one
/// parameter: one prepared statement whatever the batch size (IN lists would need one
/// per length), compared byte-wise like the `id` column. Every statement joins it first
/// (`STRAIGHT_JOIN`) and reaches `tasks` by primary key: left to itself, MariaDB drove
/// from the state index and re-read the whole JSON table for every claimed row — 4 s to
/// begin 256 attempts with 20 000 claimed, which held a dispatcher to 300 tasks/s.
macro_rules! json_pairs {
    () => {
        "JSON_TABLE(?, '$[*]' COLUMNS ( \
             pair_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]', \
             pair_token BIGINT PATH '$[1]')) AS p"
    };
}

#[async_trait]
impl Backend for MySqlStore {
    fn writer(&self) -> &Pool<Self::DB> {
        &self.pool
    }

    fn reader(&self) -> &Pool<Self::DB> {
        &self.pool
    }

    async fn run_migrations(&self) -> Result<()> {
        // sqlx serialises concurrent migrators with GET_LOCK.
        sqlx::migrate!("./migrations/mysql").run(&self.pool).await?;
        Ok(())
    }

    async fn claim_due(&self, params: ClaimParams<'_>) -> Result<Vec<ClaimedTask>> {
        let types = match params.types {
            TypeFilter::All => None,
            // No type may be claimed (as on SQLite), and `IN ()` would not parse.
            TypeFilter::Only(list) if list.is_empty() => return Ok(Vec::new()),
            TypeFilter::Only(list) => Some(list.as_slice()),
        };
        let selection = Selection::Due {
            types,
            horizon: params.horizon,
            limit: params.limit,
            after: params.ahead.then_some(params.now),
        };
        retrying(Self::transient, || {
            self.claim_tx(selection, params.now, params.hold, params.owner)
        })
        .await
    }

    async fn claim_named(&self, params: ClaimIdsParams<'_>) -> Result<Vec<ClaimedTask>> {
        if params.ids.is_empty() {
            return Ok(Vec::new());
        }
        let selection = Selection::Ids(params.ids);
        retrying(Self::transient, || {
            self.claim_tx(selection, params.now, params.hold, params.owner)
        })
        .await
    }

    async fn start_claims(&self, params: StartParams<'_>) -> Result<Vec<Started>> {
        retrying(Self::transient, || async {
            let mut tx = self.pool.begin().await?;
            let started = Self::start_on(&mut tx, params).await?;
            tx.commit().await?;
            Ok(started)
        })
        .await
    }

    async fn start_due_on(
        conn: &mut MySqlConnection,
        task_type: &str,
        params: StartDueParams<'_>,
    ) -> Result<Vec<(ClaimedTask, Started)>> {
        // The claim's walk and locks (see `claim_tx`), for one type, then one write that
        // begins the rows locked, read back as the claim reads them (no RETURNING).
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM tasks FORCE INDEX (tasks_ranked_by_type) \
             WHERE state = 'pending' AND claim_rank <= ? AND trigger_at <= ? AND task_type = ? \
               AND NOT EXISTS (SELECT 1 FROM job_pauses p WHERE p.task_type = tasks.task_type) \
               AND (expires_at IS NULL OR expires_at > ?) \
             ORDER BY claim_rank, id LIMIT ? FOR UPDATE SKIP LOCKED",
        )
        .bind(params.now)
        .bind(params.now)
        .bind(task_type)
        .bind(params.now)
        .bind(i64::from(params.limit))
        .fetch_all(&mut *conn)
        .await?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let list = placeholders(ids.len());
        let sql = format!(
            "UPDATE tasks FORCE INDEX (PRIMARY) \
             SET state = 'running', attempt = attempt + 1, lease_token = lease_token + 1, \
                 owner = ?, lease_until = ? + timeout_ms + ?, updated_at = ? \
             WHERE id IN ({list})"
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(params.owner)
            .bind(params.now)
            .bind(duration_ms(params.grace))
            .bind(params.now);
        for id in padded(&ids) {
            query = query.bind(id);
        }
        query.execute(&mut *conn).await?;
        let sql = format!(
            concat!(
                "SELECT ",
                claim_columns!(),
                " FROM tasks WHERE id IN ({list})"
            ),
            list = list
        );
        let mut query = sqlx::query_as::<_, ClaimRow>(sqlx::AssertSqlSafe(sql));
        for id in padded(&ids) {
            query = query.bind(id);
        }
        rows::started_due(query.fetch_all(&mut *conn).await?)
    }

    async fn start_on(conn: &mut MySqlConnection, params: StartParams<'_>) -> Result<Vec<Started>> {
        // A statement per claim made beginning attempts a round trip each, this backend's
        // ceiling. Without UPDATE … RETURNING, the batch is two statements (in the
        // caller's transaction): lock and read the claims that still hold their tokens,
        // then begin exactly those.
        let claims = pairs_json(
            params
                .claims
                .iter()
                .map(|(id, token)| (id.as_str(), *token)),
        );
        let held: Vec<rows::BatchStarted> = sqlx::query_as(concat!(
            "SELECT tasks.id, tasks.attempt + 1 AS attempt, tasks.lease_token + 1 AS lease_token \
             FROM ",
            json_pairs!(),
            " STRAIGHT_JOIN tasks FORCE INDEX (PRIMARY) \
               ON tasks.id = p.pair_id AND tasks.lease_token = p.pair_token \
             WHERE tasks.state = 'claimed' \
               AND NOT EXISTS (SELECT 1 FROM job_pauses q WHERE q.task_type = tasks.task_type) \
               AND (tasks.expires_at IS NULL OR tasks.expires_at > ?) \
             ORDER BY tasks.id FOR UPDATE"
        ))
        .bind(&claims)
        .bind(params.now)
        .fetch_all(&mut *conn)
        .await?;
        if !held.is_empty() {
            let ids = serde_json::to_string(&held.iter().map(|r| &r.id).collect::<Vec<_>>())
                .expect("ids serialize");
            sqlx::query(
                "UPDATE JSON_TABLE(?, '$[*]' \
                       COLUMNS (id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin \
                                PATH '$')) AS i \
                   STRAIGHT_JOIN tasks FORCE INDEX (PRIMARY) ON tasks.id = i.id \
                 SET tasks.state = 'running', tasks.attempt = tasks.attempt + 1, \
                     tasks.lease_token = tasks.lease_token + 1, \
                     tasks.lease_until = ? + tasks.timeout_ms + ?, tasks.updated_at = ? \
                 WHERE tasks.state = 'claimed'",
            )
            .bind(&ids)
            .bind(params.now)
            .bind(duration_ms(params.grace))
            .bind(params.now)
            .execute(&mut *conn)
            .await?;
        }
        rows::started_in_order(params.claims, held)
    }

    async fn finish_on(
        conn: &mut MySqlConnection,
        finishes: &[Finish],
        now: Millis,
    ) -> Result<Vec<bool>> {
        // Successes, nearly every outcome, as one batch (see `start_claims`); the rest one
        // at a time, and the dependents of what succeeded after that.
        let successes: Vec<usize> = (0..finishes.len())
            .filter(|&i| matches!(finishes[i].kind, FinishKind::Succeeded { .. }))
            .collect();
        let pairs = pairs_json(
            successes
                .iter()
                .map(|&i| (finishes[i].id.as_str(), finishes[i].lease_token)),
        );
        let mut applied = vec![false; finishes.len()];
        if !successes.is_empty() {
            let held: std::collections::HashSet<(String, i64)> = sqlx::query_as(concat!(
                "SELECT tasks.id, tasks.lease_token FROM ",
                json_pairs!(),
                " STRAIGHT_JOIN tasks FORCE INDEX (PRIMARY) \
                   ON tasks.id = p.pair_id AND tasks.lease_token = p.pair_token \
                 WHERE tasks.state IN ('running', 'pending', 'dead') ORDER BY tasks.id FOR UPDATE"
            ))
            .bind(&pairs)
            .fetch_all(&mut *conn)
            .await?
            .into_iter()
            .collect();
            if !held.is_empty() {
                let outcomes = serde_json::to_string(
                    &successes
                        .iter()
                        .map(|&i| {
                            let f = &finishes[i];
                            let result = match &f.kind {
                                FinishKind::Succeeded { result } => {
                                    result.as_ref().map(|r| r.get())
                                }
                                _ => None,
                            };
                            (f.id.as_str(), f.lease_token, result)
                        })
                        .collect::<Vec<_>>(),
                )
                .expect("outcomes serialize");
                // The result travels as a JSON string, so JSON_TABLE hands back its
                // text exactly (results are stored byte for byte, never re-encoded).
                sqlx::query(
                    "UPDATE JSON_TABLE(?, '$[*]' COLUMNS ( \
                         pair_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin \
                             PATH '$[0]', \
                         pair_token BIGINT PATH '$[1]', \
                         outcome LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin \
                             PATH '$[2]')) AS p \
                       STRAIGHT_JOIN tasks FORCE INDEX (PRIMARY) \
                       ON tasks.id = p.pair_id AND tasks.lease_token = p.pair_token \
                     SET tasks.state = 'succeeded', tasks.result = p.outcome, \
                         tasks.unique_active = CASE WHEN tasks.unique_for > 0 THEN tasks.unique_active END, \
                         tasks.lease_until = NULL, \
                         tasks.owner = NULL, tasks.updated_at = ? \
                     WHERE tasks.state IN ('running', 'pending', 'dead')",
                )
                .bind(&outcomes)
                .bind(now)
                .execute(&mut *conn)
                .await?;
                let done: Vec<&str> = held.iter().map(|(id, _)| id.as_str()).collect();
                let with_dependents: Vec<String> = sqlx::query_scalar(
                    "SELECT DISTINCT d.depends_on FROM JSON_TABLE(?, '$[*]' COLUMNS ( \
                          id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin \
                          PATH '$')) AS i \
                       STRAIGHT_JOIN task_deps d FORCE INDEX (task_deps_reverse) \
                         ON d.depends_on = i.id \
                     ORDER BY d.depends_on",
                )
                .bind(serde_json::to_string(&done).expect("ids serialize"))
                .fetch_all(&mut *conn)
                .await?;
                for id in with_dependents {
                    Self::release_dependents(&mut *conn, &id, now).await?;
                }
            }
            for &i in &successes {
                applied[i] = held.contains(&(finishes[i].id.clone(), finishes[i].lease_token));
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

#[cfg(test)]
mod tests {
    use sqlx::Connection;

    use super::*;
    use crate::Store;

    /// The tests' MariaDB server (`ASYNCD_TEST_MYSQL_URL`, without a database): none
    /// skips the test, unless `ASYNCD_TEST_REQUIRE_BACKENDS=1` (the test command's).
    fn server() -> Option<String> {
        match std::env::var("ASYNCD_TEST_MYSQL_URL") {
            Ok(url) if !url.is_empty() => Some(url.trim_end_matches('/').to_string()),
            _ if std::env::var("ASYNCD_TEST_REQUIRE_BACKENDS").as_deref() == Ok("1") => {
                panic!("ASYNCD_TEST_MYSQL_URL is not set")
            }
            _ => None,
        }
    }

    /// The plan's entry for table `tasks` in MariaDB's `EXPLAIN FORMAT=JSON`.
    fn tasks_access(plan: &serde_json::Value) -> Option<&serde_json::Value> {
        match plan {
            serde_json::Value::Object(map) => {
                if map.get("table_name").and_then(|t| t.as_str()) == Some("tasks") {
                    return Some(plan);
                }
                map.values().find_map(tasks_access)
            }
            serde_json::Value::Array(items) => items.iter().find_map(tasks_access),
            _ => None,
        }
    }

    /// With thousands of lapsed claims (a killed dispatcher's), the rescuer's read walks
    /// `tasks_lease` in order and stops at its limit: no sort of all of them.
    #[tokio::test]
    async fn the_rescuer_reads_lapsed_leases_in_index_order() {
        let Some(server) = server() else { return };
        let name = format!("asyncd_lapsed_{}", uuid::Uuid::now_v7().simple());
        let mut admin = MySqlConnection::connect(&server).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .unwrap();
        let url = format!("{server}/{name}");
        let store = MySqlStore::open(&url, Duration::from_secs(60))
            .await
            .unwrap();
        store.migrate().await.unwrap();
        for _ in 0..3 {
            let tasks: Vec<NewTask> = (0..1_000)
                .map(|_| NewTask::test("t", Millis::new(1_000)))
                .collect();
            store.insert(&tasks, Millis::new(1_000)).await.unwrap();
        }
        let mut conn = MySqlConnection::connect(&url).await.unwrap();
        // Every lease lapsed, at different times; a few attempts running too.
        for statement in [
            "UPDATE tasks SET state = 'claimed', owner = 'd', \
             lease_until = 2000 + CRC32(id) % 5000",
            "UPDATE tasks SET state = 'running' ORDER BY id LIMIT 10",
            "ANALYZE TABLE tasks",
        ] {
            sqlx::query(statement).execute(&mut conn).await.unwrap();
        }
        let (plan,): (String,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "EXPLAIN FORMAT=JSON {}",
            QUERIES.lapsed_leases
        )))
        .bind(10_000_i64)
        .bind(100_i64)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        let plan: serde_json::Value = serde_json::from_str(&plan).unwrap();
        let access = tasks_access(&plan).unwrap_or_else(|| panic!("{plan}"));
        assert_eq!(access["key"], "tasks_lease", "{plan}");
        assert!(!plan.to_string().contains("filesort"), "sorts: {plan}");
        let lapsed = store.lapsed_leases(Millis::new(10_000), 100).await.unwrap();
        assert_eq!(lapsed.len(), 100);
        assert!(
            lapsed.iter().all(|l| l.state == TaskState::Claimed),
            "claims first"
        );
        drop(store);
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {name}")))
            .execute(&mut admin)
            .await
            .unwrap();
    }
}

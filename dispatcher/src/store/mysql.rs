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

use std::str::FromStr;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use sqlx::{MySql, MySqlPool, Transaction};

use super::domain::{self, DependentsEffect, Initial};
use super::rows::{
    self, ClaimRow, Holder, StartedRow, StatsRow, TaskRow, claim_columns, task_columns,
};
use super::shared::{self, Queries};
use super::*;

pub struct MySqlStore {
    pool: MySqlPool,
}

impl MySqlStore {
    pub async fn open(url: &str) -> Result<Self> {
        let options = MySqlConnectOptions::from_str(url)?;
        let pool = MySqlPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
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

/// Which pending rows a claim takes.
#[derive(Clone, Copy)]
enum Selection<'a> {
    /// Up to `limit` due by `horizon`, earliest first, of these types (or all).
    Due {
        types: Option<&'a [String]>,
        horizon: Millis,
        limit: u32,
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

/// InnoDB's deadlock victims (SQLSTATE `40001`, error 1213) are run again (see
/// [`retrying`]).
fn transient(code: &str) -> bool {
    code == "40001"
}

/// [`super::retrying`] with this backend's transient errors.
async fn retrying<T, F, Fut>(run: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    super::retrying(transient, run).await
}

/// The statements every backend runs alike (see [`shared`]).
const QUERIES: Queries = Queries {
    get: concat!("SELECT ", task_columns!(), " FROM tasks WHERE id = ?"),
    dependencies: "SELECT depends_on FROM task_deps WHERE task_id = ? ORDER BY depends_on",
    lapsed: "SELECT id, task_type, state, attempt, max_retries, lease_token FROM tasks \
             WHERE state IN ('claimed', 'running') AND lease_until < ? \
             ORDER BY lease_until LIMIT ?",
    heartbeat: "INSERT INTO dispatchers (id, heartbeat_at) VALUES (?, ?) \
                ON DUPLICATE KEY UPDATE heartbeat_at = VALUES(heartbeat_at)",
    forget_members: "DELETE FROM dispatchers WHERE heartbeat_at < ?",
    live_members: "SELECT id FROM dispatchers WHERE heartbeat_at >= ? ORDER BY id",
    leave: "DELETE FROM dispatchers WHERE id = ?",
    release_claims: "UPDATE tasks SET state = 'pending', lease_until = NULL, owner = NULL, \
                     updated_at = ? WHERE state = 'claimed' AND owner = ?",
    // Not INSERT IGNORE, which would also turn a value the table refuses into a warning
    // and a row that is not the message: the no-op update skips only the duplicate key.
    record_kafka_dead_letter: "INSERT INTO kafka_dead_letters (topic, kafka_partition, kafka_offset, message, \
                               message_size, reason, recorded_at) VALUES (?, ?, ?, ?, ?, ?, ?) \
                               ON DUPLICATE KEY UPDATE topic = topic",
    kafka_dead_letters: "SELECT topic, kafka_partition, kafka_offset, message, message_size, \
                         reason, recorded_at FROM kafka_dead_letters \
                         ORDER BY recorded_at DESC, topic, kafka_partition, kafka_offset DESC \
                         LIMIT ?",
};

/// The query naming the task that holds a key an insert conflicted on.
fn holder_sql(key: domain::ConflictKey<'_>) -> &'static str {
    match key {
        domain::ConflictKey::Idempotency(_) => {
            "SELECT id, trigger_at FROM tasks WHERE idempotency_key = ?"
        }
        domain::ConflictKey::Cron(_) => "SELECT id, trigger_at FROM tasks WHERE cron_key = ?",
        domain::ConflictKey::Id(_) => "SELECT id, trigger_at FROM tasks WHERE id = ?",
        domain::ConflictKey::Unique(_) => {
            "SELECT id, trigger_at FROM tasks WHERE unique_active = ?"
        }
    }
}

impl MySqlStore {
    async fn insert_one(
        tx: &mut Transaction<'_, MySql>,
        task: &NewTask,
        now: Millis,
    ) -> Result<InsertOutcome> {
        // The shared lock keeps each dependency from finishing until this insert
        // commits: its finish then finds this task among its dependents (without the lock
        // it could finish in between, look for dependents before this one is visible, and
        // leave it blocked forever).
        let mut dependencies = Vec::with_capacity(task.depends_on.len());
        for dep in &task.depends_on {
            let dep_state: Option<String> =
                sqlx::query_scalar("SELECT state FROM tasks WHERE id = ? LOCK IN SHARE MODE")
                    .bind(dep)
                    .fetch_optional(&mut **tx)
                    .await?;
            let dep_state = rows::state(dep_state)?;
            dependencies.push((dep.as_str(), dep_state));
            if dep_state.is_none() {
                break;
            }
        }
        let (state, error) = match domain::initial_state(dependencies) {
            Initial::UnknownDependency(id) => return Ok(InsertOutcome::UnknownDependency { id }),
            Initial::Start { state, last_error } => (state, last_error),
        };
        let unique_active = domain::unique_active(task, state);
        for _ in 0..domain::CONFLICT_ATTEMPTS {
            // A duplicate key fails the INSERT, which InnoDB rolls back alone (the
            // transaction goes on), and is told apart from every other error by its
            // code. `INSERT IGNORE` would also turn other errors (truncated values, bad
            // data) into warnings, and `ON DUPLICATE KEY UPDATE id = id` cannot tell a
            // duplicate from an insert here: sqlx sets CLIENT_FOUND_ROWS, under which
            // both report one affected row.
            let inserted = sqlx::query(
                "INSERT INTO tasks (id, task_type, payload, state, priority, trigger_at, \
                 max_retries, timeout_ms, idempotency_key, unique_key, unique_active, cron_key, \
                 source_service, last_error, created_at, updated_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&task.id)
            .bind(&task.task_type)
            .bind(task.payload.get())
            .bind(state.as_str())
            .bind(i16::from(task.priority))
            .bind(task.trigger_at)
            .bind(i64::from(task.max_retries))
            .bind(task.timeout_ms)
            .bind(task.idempotency_key.as_deref().map(str::as_bytes))
            .bind(task.unique_key.as_deref().map(str::as_bytes))
            .bind(unique_active.map(str::as_bytes))
            .bind(task.cron_key.as_deref().map(str::as_bytes))
            .bind(&task.source_service)
            .bind(&error)
            .bind(now)
            .bind(now)
            .execute(&mut **tx)
            .await;
            match inserted {
                Ok(_) => {
                    // A dependency named twice is recorded once, as SQLite's INSERT OR
                    // IGNORE does; deduplicating here keeps every other error an error.
                    let mut deps: Vec<&String> = task.depends_on.iter().collect();
                    deps.sort();
                    deps.dedup();
                    for dep in deps {
                        sqlx::query("INSERT INTO task_deps (task_id, depends_on) VALUES (?, ?)")
                            .bind(&task.id)
                            .bind(dep)
                            .execute(&mut **tx)
                            .await?;
                    }
                    return Ok(InsertOutcome::Inserted {
                        id: task.id.clone(),
                        trigger_at: task.trigger_at,
                    });
                }
                Err(err) if is_unique_violation(&err) => {}
                Err(err) => return Err(err.into()),
            }
            for key in domain::conflict_keys(task) {
                let holder: Option<Holder> = sqlx::query_as(holder_sql(key))
                    .bind(key.value().as_bytes())
                    .fetch_optional(&mut **tx)
                    .await?;
                if let Some(holder) = holder {
                    return Ok(key.outcome(holder.id, holder.trigger_at));
                }
            }
        }
        Err(unnamed_insert_conflict(task))
    }

    /// The blocked dependents of `id`, locked.
    ///
    /// InnoDB locks the rows a locking read visits, so the plan is pinned: walk `id`'s
    /// dependency rows (task_deps_reverse, in task id order, so two finishers queue
    /// rather than deadlock) and look each dependent up by primary key. Left to itself,
    /// the optimizer reaches `tasks` through `state = 'blocked'` when it expects few
    /// blocked tasks, and would then lock every blocked task in the table.
    async fn lock_blocked_dependents(
        tx: &mut Transaction<'_, MySql>,
        id: &str,
    ) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT t.id FROM task_deps d STRAIGHT_JOIN tasks t FORCE INDEX (PRIMARY) \
               ON t.id = d.task_id \
             WHERE d.depends_on = ? AND t.state = 'blocked' \
             ORDER BY d.task_id FOR UPDATE",
        )
        .bind(id)
        .fetch_all(&mut **tx)
        .await?)
    }

    /// After a task succeeded: its blocked dependents whose dependencies have all
    /// succeeded become pending.
    ///
    /// The dependents are locked first and checked by later statements. When two
    /// dependencies of one task finish at once, the second finisher waits for the
    /// first's lock on the dependent, and its check (a statement started after the wait,
    /// so with a fresh READ COMMITTED view) sees the first's success; without the lock
    /// each could see the other's dependency still running and leave the dependent
    /// blocked. (MySQL also refuses SQLite's single UPDATE: its NOT EXISTS reads the
    /// table being updated.)
    async fn release_dependents(
        tx: &mut Transaction<'_, MySql>,
        id: &str,
        now: Millis,
    ) -> Result<()> {
        let dependents = Self::lock_blocked_dependents(tx, id).await?;
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
        let ready: Vec<String> = query.fetch_all(&mut **tx).await?;
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
        query.execute(&mut **tx).await?;
        Ok(())
    }

    /// After a task failed for good: its blocked dependents, and theirs, go to dead letters.
    async fn fail_dependents(tx: &mut Transaction<'_, MySql>, id: &str, now: Millis) -> Result<()> {
        let mut failed = vec![id.to_string()];
        while let Some(dep) = failed.pop() {
            // No UPDATE … RETURNING: lock the dependents to learn which they are, then
            // update exactly those.
            let dependents = Self::lock_blocked_dependents(tx, &dep).await?;
            if dependents.is_empty() {
                continue;
            }
            let sql = format!(
                "UPDATE tasks FORCE INDEX (PRIMARY) \
                 SET state = 'dead', unique_active = NULL, last_error = ?, \
                        updated_at = ? \
                 WHERE state = 'blocked' AND id IN ({})",
                placeholders(dependents.len())
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(domain::dependency_failed(&dep))
                .bind(now);
            for id in padded(&dependents) {
                query = query.bind(id);
            }
            query.execute(&mut **tx).await?;
            failed.extend(dependents);
        }
        Ok(())
    }

    async fn insert_tx(&self, tasks: &[NewTask], now: Millis) -> Result<Vec<InsertOutcome>> {
        let mut tx = self.pool.begin().await?;
        let mut outcomes = Vec::with_capacity(tasks.len());
        for task in tasks {
            outcomes.push(Self::insert_one(&mut tx, task, now).await?);
        }
        tx.commit().await?;
        Ok(outcomes)
    }

    async fn cancel_tx(&self, id: &str, now: Millis) -> Result<CancelOutcome> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "UPDATE tasks FORCE INDEX (PRIMARY) \
             SET state = 'cancelled', unique_active = NULL, lease_until = NULL, \
             lease_token = lease_token + 1, updated_at = ? \
             WHERE id = ? AND state IN ('blocked', 'pending', 'claimed')",
        )
        .bind(now)
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let outcome = if done == 1 {
            Self::fail_dependents(&mut tx, id, now).await?;
            CancelOutcome::Cancelled
        } else {
            let state: Option<String> = sqlx::query_scalar("SELECT state FROM tasks WHERE id = ?")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
            domain::cancel_refused(rows::state(state)?)
        };
        tx.commit().await?;
        Ok(outcome)
    }

    async fn claim_tx(
        &self,
        selection: Selection<'_>,
        now: Millis,
        hold: Duration,
        owner: &str,
    ) -> Result<Vec<ClaimedTask>> {
        let mut tx = self.pool.begin().await?;
        let ids: Vec<String> = match selection {
            // Walk tasks_due in (trigger_at, id) order and lock up to `limit` rows,
            // skipping rows another claimer has locked (it is claiming them). FORCE
            // INDEX: a plan that scanned and sorted instead would lock every due row,
            // not just `limit` of them, and starve the other claimers; statistics on a
            // queue table change too fast to leave that to the optimizer.
            Selection::Due {
                types,
                horizon,
                limit,
            } => {
                let type_filter = match types {
                    None => String::new(),
                    Some(list) => format!(" AND task_type IN ({})", placeholders(list.len())),
                };
                let sql = format!(
                    "SELECT id FROM tasks FORCE INDEX (tasks_due) \
                     WHERE state = 'pending' AND trigger_at <= ?{type_filter} \
                     ORDER BY trigger_at, id LIMIT ? FOR UPDATE SKIP LOCKED"
                );
                let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql)).bind(horizon);
                for task_type in padded(types.unwrap_or_default()) {
                    query = query.bind(task_type);
                }
                query.bind(i64::from(limit)).fetch_all(&mut *tx).await?
            }
            // Named rows (a Kafka consumer's own): lock the ones still pending.
            Selection::Ids(ids) => {
                let sql = format!(
                    "SELECT id FROM tasks FORCE INDEX (PRIMARY) \
                     WHERE state = 'pending' AND id IN ({}) FOR UPDATE SKIP LOCKED",
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

    async fn start_tx(&self, params: StartParams<'_>) -> Result<Vec<Started>> {
        let mut tx = self.pool.begin().await?;
        let mut started = vec![None; params.claims.len()];
        for i in domain::lock_order(params.claims.iter().map(|(id, _)| id)) {
            let (id, token) = &params.claims[i];
            let done = sqlx::query(
                "UPDATE tasks FORCE INDEX (PRIMARY) \
                 SET state = 'running', attempt = attempt + 1, \
                        lease_token = lease_token + 1, lease_until = ? + timeout_ms + ?, \
                        updated_at = ? \
                 WHERE id = ? AND lease_token = ? AND state = 'claimed'",
            )
            .bind(params.now)
            .bind(duration_ms(params.grace))
            .bind(params.now)
            .bind(id)
            .bind(token)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if done == 1 {
                // No UPDATE … RETURNING: the row is ours (locked) until commit.
                let row: StartedRow =
                    sqlx::query_as("SELECT attempt, lease_token FROM tasks WHERE id = ?")
                        .bind(id)
                        .fetch_one(&mut *tx)
                        .await?;
                started[i] = Some(row.into_started(id.clone())?);
            }
        }
        tx.commit().await?;
        Ok(started.into_iter().flatten().collect())
    }

    async fn finish_tx(&self, finishes: &[Finish], now: Millis) -> Result<Vec<bool>> {
        let mut tx = self.pool.begin().await?;
        let mut applied = vec![false; finishes.len()];
        for i in domain::lock_order(finishes.iter().map(|f| &f.id)) {
            let finish = &finishes[i];
            let query = match &finish.kind {
                FinishKind::Succeeded { result } => sqlx::query(
                    "UPDATE tasks FORCE INDEX (PRIMARY) \
                     SET state = 'succeeded', result = ?, unique_active = NULL, \
                     lease_until = NULL, owner = NULL, updated_at = ? \
                     WHERE id = ? AND lease_token = ? AND state = 'running'",
                )
                .bind(result.as_ref().map(|r| r.get())),
                FinishKind::Retry { at, error } => sqlx::query(
                    "UPDATE tasks FORCE INDEX (PRIMARY) \
                     SET state = 'pending', trigger_at = ?, last_error = ?, \
                     lease_until = NULL, owner = NULL, updated_at = ? \
                     WHERE id = ? AND lease_token = ? AND state = 'running'",
                )
                .bind(at)
                .bind(error),
                FinishKind::Dead { error } => sqlx::query(
                    "UPDATE tasks FORCE INDEX (PRIMARY) \
                     SET state = 'dead', last_error = ?, unique_active = NULL, \
                     lease_until = NULL, owner = NULL, updated_at = ? \
                     WHERE id = ? AND lease_token = ? AND state = 'running'",
                )
                .bind(error),
                FinishKind::Release => sqlx::query(
                    "UPDATE tasks FORCE INDEX (PRIMARY) \
                     SET state = 'pending', lease_until = NULL, owner = NULL, \
                     updated_at = ? \
                     WHERE id = ? AND lease_token = ? AND state = 'claimed'",
                ),
                FinishKind::Extend { until } => sqlx::query(
                    "UPDATE tasks FORCE INDEX (PRIMARY) \
                     SET lease_until = GREATEST(lease_until, ?), updated_at = ? \
                     WHERE id = ? AND lease_token = ? AND state = 'running'",
                )
                .bind(until),
            };
            // rows_affected counts matched rows, not changed ones (sqlx sets
            // CLIENT_FOUND_ROWS), so an extension that moves nothing still reports that
            // its token matched, as on SQLite.
            let done = query
                .bind(now)
                .bind(&finish.id)
                .bind(finish.lease_token)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1;
            if done {
                match domain::on_finish(&finish.kind) {
                    DependentsEffect::Release => {
                        Self::release_dependents(&mut tx, &finish.id, now).await?
                    }
                    DependentsEffect::Fail => {
                        Self::fail_dependents(&mut tx, &finish.id, now).await?
                    }
                    DependentsEffect::None => {}
                }
            }
            applied[i] = done;
        }
        tx.commit().await?;
        Ok(applied)
    }

    async fn redrive_tx(&self, id: &str, now: Millis) -> Result<Option<RedriveOutcome>> {
        let mut tx = self.pool.begin().await?;
        let updated = sqlx::query(
            "UPDATE tasks FORCE INDEX (PRIMARY) \
             SET state = 'pending', attempt = 0, trigger_at = ?, \
             unique_active = unique_key, lease_until = NULL, updated_at = ? \
             WHERE id = ? AND state = 'dead'",
        )
        .bind(now)
        .bind(now)
        .bind(id)
        .execute(&mut *tx)
        .await;
        let outcome = match updated {
            Ok(done) if done.rows_affected() == 1 => RedriveOutcome::Redriven { trigger_at: now },
            Ok(_) => {
                let state: Option<String> =
                    sqlx::query_scalar("SELECT state FROM tasks WHERE id = ?")
                        .bind(id)
                        .fetch_optional(&mut *tx)
                        .await?;
                domain::redrive_refused(rows::state(state)?)
            }
            // InnoDB rolled back the failed UPDATE alone; the transaction goes on.
            Err(err) if is_unique_violation(&err) => {
                let existing_id: Option<String> = sqlx::query_scalar(
                    "SELECT b.id FROM tasks a JOIN tasks b ON b.unique_active = a.unique_key \
                     WHERE a.id = ?",
                )
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
                match domain::redrive_conflict(existing_id) {
                    Some(outcome) => outcome,
                    // The holder finished since: the caller tries again.
                    None => return Ok(None),
                }
            }
            Err(err) => return Err(err.into()),
        };
        tx.commit().await?;
        Ok(Some(outcome))
    }
}

#[async_trait]
impl Store for MySqlStore {
    async fn migrate(&self) -> Result<()> {
        // sqlx serialises concurrent migrators with GET_LOCK.
        sqlx::migrate!("./migrations/mysql").run(&self.pool).await?;
        Ok(())
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn insert(&self, tasks: &[NewTask], now: Millis) -> Result<Vec<InsertOutcome>> {
        retrying(|| self.insert_tx(tasks, now)).await
    }

    async fn get(&self, id: &str) -> Result<Option<TaskRecord>> {
        shared::get(&self.pool, &QUERIES, id).await
    }

    async fn cancel(&self, id: &str, now: Millis) -> Result<CancelOutcome> {
        retrying(|| self.cancel_tx(id, now)).await
    }

    async fn claim(&self, params: ClaimParams<'_>) -> Result<Vec<ClaimedTask>> {
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
        };
        retrying(|| self.claim_tx(selection, params.now, params.hold, params.owner)).await
    }

    async fn claim_ids(&self, params: ClaimIdsParams<'_>) -> Result<Vec<ClaimedTask>> {
        if params.ids.is_empty() {
            return Ok(Vec::new());
        }
        let selection = Selection::Ids(params.ids);
        retrying(|| self.claim_tx(selection, params.now, params.hold, params.owner)).await
    }

    async fn find_idempotent(&self, key: &str) -> Result<Option<(String, Millis)>> {
        let holder: Option<Holder> =
            sqlx::query_as("SELECT id, trigger_at FROM tasks WHERE idempotency_key = ?")
                .bind(key.as_bytes())
                .fetch_optional(&self.pool)
                .await?;
        Ok(holder.map(|h| (h.id, h.trigger_at)))
    }

    async fn start(&self, params: StartParams<'_>) -> Result<Vec<Started>> {
        retrying(|| self.start_tx(params)).await
    }

    async fn finish(&self, finishes: &[Finish], now: Millis) -> Result<Vec<bool>> {
        retrying(|| self.finish_tx(finishes, now)).await
    }

    async fn lapsed(&self, now: Millis, limit: u32) -> Result<Vec<Lapsed>> {
        shared::lapsed(&self.pool, &QUERIES, now, limit).await
    }

    async fn dead_letters(&self, task_type: Option<&str>, limit: u32) -> Result<Vec<TaskRecord>> {
        let rows: Vec<TaskRow> = sqlx::query_as(concat!(
            "SELECT ",
            task_columns!(),
            " FROM tasks WHERE state = 'dead' AND (? IS NULL OR task_type = ?) \
             ORDER BY updated_at DESC, id DESC LIMIT ?"
        ))
        .bind(task_type)
        .bind(task_type)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter().map(TaskRow::into_record).collect()
    }

    async fn redrive(&self, id: &str, now: Millis) -> Result<RedriveOutcome> {
        for _ in 0..domain::CONFLICT_ATTEMPTS {
            if let Some(outcome) = retrying(|| self.redrive_tx(id, now)).await? {
                return Ok(outcome);
            }
        }
        Err(unnamed_redrive_conflict(id))
    }

    async fn stats(&self, now: Millis) -> Result<Vec<TypeStats>> {
        // SUM is DECIMAL on MySQL: cast it back to the BIGINT the other backends return.
        let rows: Vec<StatsRow> = sqlx::query_as(
            "SELECT task_type, COUNT(*) AS pending, \
                    CAST(SUM(CASE WHEN trigger_at <= ? THEN 1 ELSE 0 END) AS SIGNED) AS due, \
                    MIN(CASE WHEN trigger_at <= ? THEN trigger_at END) AS oldest_due \
             FROM tasks WHERE state IN ('pending', 'claimed') GROUP BY task_type ORDER BY task_type",
        )
        .bind(now)
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(TypeStats::from).collect())
    }

    async fn heartbeat_member(&self, member: &str, now: Millis) -> Result<()> {
        shared::heartbeat_member(&self.pool, &QUERIES, member, now).await
    }

    async fn live_members(&self, since: Millis) -> Result<Vec<String>> {
        shared::live_members(&self.pool, &QUERIES, since).await
    }

    async fn leave(&self, member: &str) -> Result<()> {
        shared::leave(&self.pool, &QUERIES, member).await
    }

    async fn release_claims(&self, owner: &str, now: Millis) -> Result<u64> {
        let done = shared::release_claims(&self.pool, &QUERIES, owner, now).await?;
        Ok(done.rows_affected())
    }

    async fn clock(&self) -> Result<Option<Millis>> {
        let ms: i64 =
            sqlx::query_scalar("SELECT CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)")
                .fetch_one(&self.pool)
                .await?;
        Ok(Some(Millis::new(ms)))
    }

    async fn record_kafka_dead_letter(&self, letter: &KafkaDeadLetter) -> Result<()> {
        shared::record_kafka_dead_letter(&self.pool, &QUERIES, letter).await
    }

    async fn kafka_dead_letters(&self, limit: u32) -> Result<Vec<KafkaDeadLetter>> {
        shared::kafka_dead_letters(&self.pool, &QUERIES, limit).await
    }
}

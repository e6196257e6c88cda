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

use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::value::RawValue;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions, MySqlRow};
use sqlx::{MySql, MySqlPool, Row, Transaction};

use super::*;

pub struct MySqlStore {
    pool: MySqlPool,
}

/// The columns [`record`] reads, as a literal so queries built with `concat!` stay
/// `&'static str` (no `AssertSqlSafe` needed).
macro_rules! task_columns {
    () => {
        "id, task_type, payload, state, priority, trigger_at, attempt, max_retries, \
         timeout_ms, lease_token, lease_until, idempotency_key, unique_key, last_error, \
         result, created_at, updated_at"
    };
}

impl MySqlStore {
    pub async fn open(url: &str) -> Result<Self> {
        let options = MySqlConnectOptions::from_str(url)?;
        let pool = MySqlPoolOptions::new()
            .max_connections(10)
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

fn raw(text: String) -> Result<Box<RawValue>> {
    RawValue::from_string(text).map_err(|e| StoreError::Corrupt(format!("stored JSON: {e}")))
}

/// A dedupe key: VARBINARY in the schema (see the migration), UTF-8 text here.
fn key(row: &MySqlRow, column: &str) -> Result<Option<String>> {
    row.try_get::<Option<Vec<u8>>, _>(column)?
        .map(|bytes| {
            String::from_utf8(bytes)
                .map_err(|_| StoreError::Corrupt(format!("{column} is not UTF-8")))
        })
        .transpose()
}

fn record(row: &MySqlRow) -> Result<TaskRecord> {
    Ok(TaskRecord {
        id: row.try_get("id")?,
        task_type: row.try_get("task_type")?,
        payload: raw(row.try_get("payload")?)?,
        state: TaskState::parse(row.try_get::<&str, _>("state")?)?,
        priority: row.try_get::<i64, _>("priority")? as u8,
        trigger_at: row.try_get("trigger_at")?,
        attempt: row.try_get::<i64, _>("attempt")? as u32,
        max_retries: row.try_get::<i64, _>("max_retries")? as u32,
        timeout_ms: row.try_get("timeout_ms")?,
        lease_token: row.try_get("lease_token")?,
        lease_until: row.try_get("lease_until")?,
        idempotency_key: key(row, "idempotency_key")?,
        unique_key: key(row, "unique_key")?,
        depends_on: Vec::new(),
        last_error: row.try_get("last_error")?,
        result: row
            .try_get::<Option<String>, _>("result")?
            .map(raw)
            .transpose()?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

fn claimed(row: &MySqlRow) -> Result<ClaimedTask> {
    Ok(ClaimedTask {
        id: row.try_get("id")?,
        task_type: row.try_get("task_type")?,
        payload: raw(row.try_get("payload")?)?,
        priority: row.try_get::<i64, _>("priority")? as u8,
        trigger_at: row.try_get("trigger_at")?,
        attempt: row.try_get::<i64, _>("attempt")? as u32,
        max_retries: row.try_get::<i64, _>("max_retries")? as u32,
        timeout_ms: row.try_get("timeout_ms")?,
        lease_token: row.try_get("lease_token")?,
        idempotency_key: key(row, "idempotency_key")?,
    })
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

fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.is_unique_violation())
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

/// Runs a transaction again when InnoDB aborted it as a deadlock victim (SQLSTATE
/// `40001`, error 1213), which rolls the whole transaction back, so running it again
/// from the start is safe; anything else is returned as is. Deadlocks are possible in
/// principle (a batch finishing a task while an insert holds its dependency, or the
/// rescuer and a dispatcher finishing overlapping batches), but rare: batches lock
/// rows in id order (see [`lock_order`]).
async fn retrying<T, F, Fut>(mut run: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    const ATTEMPTS: u32 = 5;
    let mut attempt = 1;
    loop {
        match run().await {
            Err(StoreError::Database(sqlx::Error::Database(db)))
                if attempt < ATTEMPTS && db.code().as_deref() == Some("40001") =>
            {
                tracing::debug!(error = %db, attempt, "store transaction aborted; running it again");
                tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt))).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// The order in which to apply a batch: by id, so concurrent batches lock shared rows in
/// the same order instead of deadlocking, and stable, so two entries for one task (an
/// extension, then the result) keep their order. Outcomes still go back in input order.
fn lock_order(ids: impl Iterator<Item = impl AsRef<str>>) -> Vec<usize> {
    let ids: Vec<_> = ids.collect();
    let mut order: Vec<usize> = (0..ids.len()).collect();
    order.sort_by(|&a, &b| ids[a].as_ref().cmp(ids[b].as_ref()));
    order
}

impl MySqlStore {
    async fn insert_one(
        tx: &mut Transaction<'_, MySql>,
        task: &NewTask,
        now: Millis,
    ) -> Result<InsertOutcome> {
        // Dependencies decide the starting state: any failed → dead at once, all
        // succeeded → pending, otherwise blocked until they finish. The shared lock keeps
        // each dependency from finishing until this insert commits: its finish then finds
        // this task among its dependents (without the lock it could finish in between,
        // look for dependents before this one is visible, and leave it blocked forever).
        let mut state = TaskState::Pending;
        let mut error = None;
        for dep in &task.depends_on {
            let dep_state: Option<String> =
                sqlx::query_scalar("SELECT state FROM tasks WHERE id = ? LOCK IN SHARE MODE")
                    .bind(dep)
                    .fetch_optional(&mut **tx)
                    .await?;
            match dep_state.as_deref().map(TaskState::parse).transpose()? {
                None => return Ok(InsertOutcome::UnknownDependency { id: dep.clone() }),
                Some(TaskState::Dead | TaskState::Cancelled) => {
                    state = TaskState::Dead;
                    error = Some(format!("dependency {dep} failed"));
                }
                Some(TaskState::Succeeded) => {}
                Some(_) if state == TaskState::Pending => state = TaskState::Blocked,
                Some(_) => {}
            }
        }
        let unique_active = (state != TaskState::Dead)
            .then_some(task.unique_key.as_deref())
            .flatten();
        // A conflict on the unique key names a task that may finish (freeing the key)
        // before we look it up; then the insert is simply tried again.
        for _ in 0..3 {
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
            // The insert hit a constraint; say which, idempotency first (a repeat of the
            // same submit also repeats its unique key).
            for (sql, key) in [
                (
                    "SELECT id, trigger_at FROM tasks WHERE idempotency_key = ?",
                    &task.idempotency_key,
                ),
                (
                    "SELECT id, trigger_at FROM tasks WHERE cron_key = ?",
                    &task.cron_key,
                ),
                // The same task again: a Kafka message consumed twice.
                (
                    "SELECT id, trigger_at FROM tasks WHERE id = ?",
                    &Some(task.id.clone()),
                ),
            ] {
                let Some(key) = key else { continue };
                if let Some(row) = sqlx::query(sql)
                    .bind(key.as_bytes())
                    .fetch_optional(&mut **tx)
                    .await?
                {
                    return Ok(InsertOutcome::Duplicate {
                        id: row.try_get("id")?,
                        trigger_at: row.try_get("trigger_at")?,
                    });
                }
            }
            if let Some(key) = &task.unique_key {
                let existing: Option<String> =
                    sqlx::query_scalar("SELECT id FROM tasks WHERE unique_active = ?")
                        .bind(key.as_bytes())
                        .fetch_optional(&mut **tx)
                        .await?;
                if let Some(existing_id) = existing {
                    return Ok(InsertOutcome::UniqueConflict { existing_id });
                }
            }
        }
        Err(StoreError::Corrupt(format!(
            "insert of {} conflicted on no known key",
            task.id
        )))
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
                .bind(format!("dependency {dep} failed"))
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
            match state {
                None => CancelOutcome::NotFound,
                Some(s) => CancelOutcome::NotCancellable(TaskState::parse(&s)?),
            }
        };
        tx.commit().await?;
        Ok(outcome)
    }

    async fn claim_tx(
        &self,
        selection: Selection<'_>,
        now: Millis,
        hold_ms: i64,
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
            .bind(hold_ms)
            .bind(now);
        for id in padded(&ids) {
            query = query.bind(id);
        }
        query.execute(&mut *tx).await?;
        // No UPDATE … RETURNING: read the claimed rows back (still locked by us).
        let sql = format!(
            "SELECT id, task_type, payload, priority, trigger_at, attempt, max_retries, \
                    timeout_ms, lease_token, idempotency_key \
             FROM tasks WHERE id IN ({list})"
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for id in padded(&ids) {
            query = query.bind(id);
        }
        let rows = query.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        let mut claimed = rows.iter().map(claimed).collect::<Result<Vec<_>>>()?;
        claimed.sort_by(|a, b| (a.trigger_at, &a.id).cmp(&(b.trigger_at, &b.id)));
        Ok(claimed)
    }

    async fn start_tx(
        &self,
        claims: &[(String, i64)],
        now: Millis,
        grace_ms: i64,
    ) -> Result<Vec<Started>> {
        let mut tx = self.pool.begin().await?;
        let mut started = vec![None; claims.len()];
        for i in lock_order(claims.iter().map(|(id, _)| id)) {
            let (id, token) = &claims[i];
            let done = sqlx::query(
                "UPDATE tasks FORCE INDEX (PRIMARY) \
                 SET state = 'running', attempt = attempt + 1, \
                        lease_token = lease_token + 1, lease_until = ? + timeout_ms + ?, \
                        updated_at = ? \
                 WHERE id = ? AND lease_token = ? AND state = 'claimed'",
            )
            .bind(now)
            .bind(grace_ms)
            .bind(now)
            .bind(id)
            .bind(token)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if done == 1 {
                // No UPDATE … RETURNING: the row is ours (locked) until commit.
                let row = sqlx::query("SELECT attempt, lease_token FROM tasks WHERE id = ?")
                    .bind(id)
                    .fetch_one(&mut *tx)
                    .await?;
                started[i] = Some(Started {
                    id: id.clone(),
                    attempt: row.try_get::<i64, _>("attempt")? as u32,
                    lease_token: row.try_get("lease_token")?,
                });
            }
        }
        tx.commit().await?;
        Ok(started.into_iter().flatten().collect())
    }

    async fn finish_tx(&self, finishes: &[Finish], now: Millis) -> Result<Vec<bool>> {
        let mut tx = self.pool.begin().await?;
        let mut applied = vec![false; finishes.len()];
        for i in lock_order(finishes.iter().map(|f| &f.id)) {
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
                match finish.kind {
                    FinishKind::Succeeded { .. } => {
                        Self::release_dependents(&mut tx, &finish.id, now).await?
                    }
                    FinishKind::Dead { .. } => {
                        Self::fail_dependents(&mut tx, &finish.id, now).await?
                    }
                    _ => {}
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
                match state {
                    None => RedriveOutcome::NotFound,
                    Some(s) => RedriveOutcome::NotDead(TaskState::parse(&s)?),
                }
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
                match existing_id {
                    Some(existing_id) => RedriveOutcome::UniqueConflict { existing_id },
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
        let Some(row) = sqlx::query(concat!(
            "SELECT ",
            task_columns!(),
            " FROM tasks WHERE id = ?"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?
        else {
            return Ok(None);
        };
        let mut task = record(&row)?;
        task.depends_on = sqlx::query_scalar(
            "SELECT depends_on FROM task_deps WHERE task_id = ? ORDER BY depends_on",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?;
        Ok(Some(task))
    }

    async fn cancel(&self, id: &str, now: Millis) -> Result<CancelOutcome> {
        retrying(|| self.cancel_tx(id, now)).await
    }

    async fn claim(
        &self,
        types: &TypeFilter,
        horizon: Millis,
        now: Millis,
        hold_ms: i64,
        owner: &str,
        limit: u32,
    ) -> Result<Vec<ClaimedTask>> {
        let types = match types {
            TypeFilter::All => None,
            // No type may be claimed (as on SQLite), and `IN ()` would not parse.
            TypeFilter::Only(list) if list.is_empty() => return Ok(Vec::new()),
            TypeFilter::Only(list) => Some(list.as_slice()),
        };
        let selection = Selection::Due {
            types,
            horizon,
            limit,
        };
        retrying(|| self.claim_tx(selection, now, hold_ms, owner)).await
    }

    async fn claim_ids(
        &self,
        ids: &[String],
        now: Millis,
        hold_ms: i64,
        owner: &str,
    ) -> Result<Vec<ClaimedTask>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        retrying(|| self.claim_tx(Selection::Ids(ids), now, hold_ms, owner)).await
    }

    async fn find_idempotent(&self, key: &str) -> Result<Option<(String, Millis)>> {
        let row = sqlx::query("SELECT id, trigger_at FROM tasks WHERE idempotency_key = ?")
            .bind(key.as_bytes())
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| Ok((r.try_get("id")?, r.try_get("trigger_at")?)))
            .transpose()
    }

    async fn start(
        &self,
        claims: &[(String, i64)],
        now: Millis,
        grace_ms: i64,
    ) -> Result<Vec<Started>> {
        retrying(|| self.start_tx(claims, now, grace_ms)).await
    }

    async fn finish(&self, finishes: &[Finish], now: Millis) -> Result<Vec<bool>> {
        retrying(|| self.finish_tx(finishes, now)).await
    }

    async fn lapsed(&self, now: Millis, limit: u32) -> Result<Vec<Lapsed>> {
        let rows = sqlx::query(
            "SELECT id, task_type, state, attempt, max_retries, lease_token FROM tasks \
             WHERE state IN ('claimed', 'running') AND lease_until < ? \
             ORDER BY lease_until LIMIT ?",
        )
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(Lapsed {
                    id: row.try_get("id")?,
                    task_type: row.try_get("task_type")?,
                    state: TaskState::parse(row.try_get::<&str, _>("state")?)?,
                    attempt: row.try_get::<i64, _>("attempt")? as u32,
                    max_retries: row.try_get::<i64, _>("max_retries")? as u32,
                    lease_token: row.try_get("lease_token")?,
                })
            })
            .collect()
    }

    async fn dead_letters(&self, task_type: Option<&str>, limit: u32) -> Result<Vec<TaskRecord>> {
        let rows = sqlx::query(concat!(
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
        rows.iter().map(record).collect()
    }

    async fn redrive(&self, id: &str, now: Millis) -> Result<RedriveOutcome> {
        for _ in 0..3 {
            if let Some(outcome) = retrying(|| self.redrive_tx(id, now)).await? {
                return Ok(outcome);
            }
        }
        Err(StoreError::Corrupt(format!(
            "redrive of {id} conflicted on a unique key no task holds"
        )))
    }

    async fn stats(&self, now: Millis) -> Result<Vec<TypeStats>> {
        // SUM is DECIMAL on MySQL: cast it back to the BIGINT the other backends return.
        let rows = sqlx::query(
            "SELECT task_type, COUNT(*) AS pending, \
                    CAST(SUM(CASE WHEN trigger_at <= ? THEN 1 ELSE 0 END) AS SIGNED) AS due, \
                    MIN(CASE WHEN trigger_at <= ? THEN trigger_at END) AS oldest_due \
             FROM tasks WHERE state IN ('pending', 'claimed') GROUP BY task_type ORDER BY task_type",
        )
        .bind(now)
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(TypeStats {
                    task_type: row.try_get("task_type")?,
                    pending: row.try_get("pending")?,
                    due: row.try_get("due")?,
                    oldest_due: row.try_get("oldest_due")?,
                })
            })
            .collect()
    }

    async fn heartbeat_member(&self, member: &str, now: Millis) -> Result<()> {
        sqlx::query("INSERT INTO dispatchers (id, heartbeat_at) VALUES (?, ?) ON DUPLICATE KEY UPDATE heartbeat_at = VALUES(heartbeat_at)")
            .bind(member)
            .bind(now)
            .execute(&self.pool)
            .await?;
        sqlx::query("DELETE FROM dispatchers WHERE heartbeat_at < ?")
            .bind(now - MEMBER_RETENTION_MS)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn live_members(&self, since: Millis) -> Result<Vec<String>> {
        Ok(
            sqlx::query_scalar("SELECT id FROM dispatchers WHERE heartbeat_at >= ? ORDER BY id")
                .bind(since)
                .fetch_all(&self.pool)
                .await?,
        )
    }

    async fn leave(&self, member: &str) -> Result<()> {
        sqlx::query("DELETE FROM dispatchers WHERE id = ?")
            .bind(member)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

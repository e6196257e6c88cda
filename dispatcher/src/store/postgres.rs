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
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Acquire, PgPool, Postgres, Transaction};

use super::domain::{self, DependentsEffect, Initial};
use super::rows::{
    self, ClaimRow, Holder, StartedRow, StatsRow, TaskRow, claim_columns, task_columns,
};
use super::shared::{self, Queries};
use super::*;

pub struct PostgresStore {
    pool: PgPool,
}

impl PostgresStore {
    pub async fn open(url: &str) -> Result<Self> {
        let options = PgConnectOptions::from_str(url)?;
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(ACQUIRE_TIMEOUT)
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

/// Deadlock victims (`40P01`) and serialization failures (`40001`) are run again (see
/// [`retrying`]).
fn transient(code: &str) -> bool {
    matches!(code, "40001" | "40P01")
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
    get: concat!("SELECT ", task_columns!(), " FROM tasks WHERE id = $1"),
    dependencies: "SELECT depends_on FROM task_deps WHERE task_id = $1 ORDER BY depends_on",
    lapsed: "SELECT id, task_type, state, attempt, max_retries, lease_token FROM tasks \
             WHERE state IN ('claimed', 'running') AND lease_until < $1 \
             ORDER BY lease_until LIMIT $2",
    heartbeat: "INSERT INTO dispatchers (id, heartbeat_at) VALUES ($1, $2) \
                ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at",
    forget_members: "DELETE FROM dispatchers WHERE heartbeat_at < $1",
    live_members: "SELECT id FROM dispatchers WHERE heartbeat_at >= $1 ORDER BY id",
    leave: "DELETE FROM dispatchers WHERE id = $1",
    release_claims: "UPDATE tasks SET state = 'pending', lease_until = NULL, owner = NULL, \
                     updated_at = $1 WHERE state = 'claimed' AND owner = $2",
    record_kafka_dead_letter: "INSERT INTO kafka_dead_letters (topic, kafka_partition, kafka_offset, message, \
                               message_size, reason, recorded_at) VALUES ($1, $2, $3, $4, $5, $6, $7) \
                               ON CONFLICT DO NOTHING",
    kafka_dead_letters: "SELECT topic, kafka_partition, kafka_offset, message, message_size, \
                         reason, recorded_at FROM kafka_dead_letters \
                         ORDER BY recorded_at DESC, topic, kafka_partition, kafka_offset DESC \
                         LIMIT $1",
};

/// The query naming the task that holds a key an insert conflicted on.
fn holder_sql(key: domain::ConflictKey<'_>) -> &'static str {
    match key {
        domain::ConflictKey::Idempotency(_) => {
            "SELECT id, trigger_at FROM tasks WHERE idempotency_key = $1"
        }
        domain::ConflictKey::Cron(_) => "SELECT id, trigger_at FROM tasks WHERE cron_key = $1",
        domain::ConflictKey::Id(_) => "SELECT id, trigger_at FROM tasks WHERE id = $1",
        domain::ConflictKey::Unique(_) => {
            "SELECT id, trigger_at FROM tasks WHERE unique_active = $1"
        }
    }
}

impl PostgresStore {
    async fn insert_one(
        tx: &mut Transaction<'_, Postgres>,
        task: &NewTask,
        now: Millis,
    ) -> Result<InsertOutcome> {
        // FOR SHARE keeps each dependency from finishing until this insert commits: its
        // finish then finds this task among its dependents (without the lock it could
        // finish in between, look for dependents before this one is visible, and leave it
        // blocked forever).
        let mut dependencies = Vec::with_capacity(task.depends_on.len());
        for dep in &task.depends_on {
            let dep_state: Option<String> =
                sqlx::query_scalar("SELECT state FROM tasks WHERE id = $1 FOR SHARE")
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
            // ON CONFLICT DO NOTHING, with no target, covers every unique constraint, like
            // SQLite's; an error would abort the whole transaction and the batch with it.
            let inserted = sqlx::query(
                "INSERT INTO tasks (id, task_type, payload, state, priority, trigger_at, \
                 max_retries, timeout_ms, idempotency_key, unique_key, unique_active, cron_key, \
                 source_service, last_error, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $15) \
                 ON CONFLICT DO NOTHING",
            )
            .bind(&task.id)
            .bind(&task.task_type)
            .bind(task.payload.get())
            .bind(state.as_str())
            .bind(i16::from(task.priority))
            .bind(task.trigger_at)
            .bind(task.max_retries as i32)
            .bind(task.timeout_ms)
            .bind(&task.idempotency_key)
            .bind(&task.unique_key)
            .bind(unique_active)
            .bind(&task.cron_key)
            .bind(&task.source_service)
            .bind(&error)
            .bind(now)
            .execute(&mut **tx)
            .await?
            .rows_affected();
            if inserted == 1 {
                // DO NOTHING: a dependency named twice is recorded once, as on SQLite.
                sqlx::query(
                    "INSERT INTO task_deps (task_id, depends_on) \
                     SELECT $1, d FROM UNNEST($2::text[]) AS d ON CONFLICT DO NOTHING",
                )
                .bind(&task.id)
                .bind(&task.depends_on)
                .execute(&mut **tx)
                .await?;
                return Ok(InsertOutcome::Inserted {
                    id: task.id.clone(),
                    trigger_at: task.trigger_at,
                });
            }
            for key in domain::conflict_keys(task) {
                let holder: Option<Holder> = sqlx::query_as(holder_sql(key))
                    .bind(key.value())
                    .fetch_optional(&mut **tx)
                    .await?;
                if let Some(holder) = holder {
                    return Ok(key.outcome(holder.id, holder.trigger_at));
                }
            }
        }
        Err(unnamed_insert_conflict(task))
    }

    /// After a task succeeded: its blocked dependents whose dependencies have all
    /// succeeded become pending.
    ///
    /// Two steps, unlike SQLite's one UPDATE: the dependents are locked first, then
    /// checked by a new statement. When two dependencies of one task finish at once,
    /// the second finisher waits for the first's lock on the dependent, and its check
    /// (a statement started after the wait) sees the first's success. In a single UPDATE
    /// the NOT EXISTS would read a snapshot from before the wait, each finisher would see
    /// the other's dependency still running, and the dependent would stay blocked.
    async fn release_dependents(
        tx: &mut Transaction<'_, Postgres>,
        id: &str,
        now: Millis,
    ) -> Result<()> {
        let dependents: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM tasks WHERE state = 'blocked' \
               AND id IN (SELECT task_id FROM task_deps WHERE depends_on = $1) \
             ORDER BY id FOR UPDATE",
        )
        .bind(id)
        .fetch_all(&mut **tx)
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
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// After a task failed for good: its blocked dependents, and theirs, go to dead letters.
    async fn fail_dependents(
        tx: &mut Transaction<'_, Postgres>,
        id: &str,
        now: Millis,
    ) -> Result<()> {
        let mut failed = vec![id.to_string()];
        while let Some(dep) = failed.pop() {
            let dependents: Vec<String> = sqlx::query_scalar(
                "UPDATE tasks SET state = 'dead', unique_active = NULL, last_error = $1, \
                        updated_at = $2 \
                 WHERE state = 'blocked' \
                   AND id IN (SELECT task_id FROM task_deps WHERE depends_on = $3) \
                 RETURNING id",
            )
            .bind(domain::dependency_failed(&dep))
            .bind(now)
            .bind(&dep)
            .fetch_all(&mut **tx)
            .await?;
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
            "UPDATE tasks SET state = 'cancelled', unique_active = NULL, lease_until = NULL, \
             lease_token = lease_token + 1, updated_at = $1 \
             WHERE id = $2 AND state IN ('blocked', 'pending', 'claimed')",
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
            let state: Option<String> = sqlx::query_scalar("SELECT state FROM tasks WHERE id = $1")
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
            domain::cancel_refused(rows::state(state)?)
        };
        tx.commit().await?;
        Ok(outcome)
    }

    async fn start_tx(&self, params: StartParams<'_>) -> Result<Vec<Started>> {
        let mut tx = self.pool.begin().await?;
        let mut started = vec![None; params.claims.len()];
        for i in domain::lock_order(params.claims.iter().map(|(id, _)| id)) {
            let (id, token) = &params.claims[i];
            let row: Option<StartedRow> = sqlx::query_as(
                "UPDATE tasks SET state = 'running', attempt = attempt + 1, \
                        lease_token = lease_token + 1, lease_until = $1 + timeout_ms + $2, \
                        updated_at = $1 \
                 WHERE id = $3 AND lease_token = $4 AND state = 'claimed' \
                 RETURNING attempt, lease_token",
            )
            .bind(params.now)
            .bind(duration_ms(params.grace))
            .bind(id)
            .bind(token)
            .fetch_optional(&mut *tx)
            .await?;
            if let Some(row) = row {
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
            // Each statement ends with `updated_at = $n-2 WHERE id = $n-1 AND lease_token = $n`.
            let query = match &finish.kind {
                FinishKind::Succeeded { result } => sqlx::query(
                    "UPDATE tasks SET state = 'succeeded', result = $1, unique_active = NULL, \
                     lease_until = NULL, owner = NULL, updated_at = $2 \
                     WHERE id = $3 AND lease_token = $4 AND state = 'running'",
                )
                .bind(result.as_ref().map(|r| r.get())),
                FinishKind::Retry { at, error } => sqlx::query(
                    "UPDATE tasks SET state = 'pending', trigger_at = $1, last_error = $2, \
                     lease_until = NULL, owner = NULL, updated_at = $3 \
                     WHERE id = $4 AND lease_token = $5 AND state = 'running'",
                )
                .bind(at)
                .bind(error),
                FinishKind::Dead { error } => sqlx::query(
                    "UPDATE tasks SET state = 'dead', last_error = $1, unique_active = NULL, \
                     lease_until = NULL, owner = NULL, updated_at = $2 \
                     WHERE id = $3 AND lease_token = $4 AND state = 'running'",
                )
                .bind(error),
                FinishKind::Release => sqlx::query(
                    "UPDATE tasks SET state = 'pending', lease_until = NULL, owner = NULL, \
                     updated_at = $1 \
                     WHERE id = $2 AND lease_token = $3 AND state = 'claimed'",
                ),
                FinishKind::Extend { until } => sqlx::query(
                    "UPDATE tasks SET lease_until = GREATEST(lease_until, $1), updated_at = $2 \
                     WHERE id = $3 AND lease_token = $4 AND state = 'running'",
                )
                .bind(until),
            };
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
        // A failed statement aborts a PostgreSQL transaction, so the UPDATE that may hit
        // the unique key runs in a savepoint, and the transaction goes on to name the
        // task holding the key.
        let mut savepoint = tx.begin().await?;
        let updated = sqlx::query(
            "UPDATE tasks SET state = 'pending', attempt = 0, trigger_at = $1, \
             unique_active = unique_key, lease_until = NULL, updated_at = $1 \
             WHERE id = $2 AND state = 'dead'",
        )
        .bind(now)
        .bind(id)
        .execute(&mut *savepoint)
        .await;
        let outcome = match updated {
            Ok(done) if done.rows_affected() == 1 => {
                savepoint.commit().await?;
                RedriveOutcome::Redriven { trigger_at: now }
            }
            Ok(_) => {
                savepoint.commit().await?;
                let state: Option<String> =
                    sqlx::query_scalar("SELECT state FROM tasks WHERE id = $1")
                        .bind(id)
                        .fetch_optional(&mut *tx)
                        .await?;
                domain::redrive_refused(rows::state(state)?)
            }
            Err(err) if is_unique_violation(&err) => {
                savepoint.rollback().await?;
                let existing_id: Option<String> = sqlx::query_scalar(
                    "SELECT b.id FROM tasks a JOIN tasks b ON b.unique_active = a.unique_key \
                     WHERE a.id = $1",
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
impl Store for PostgresStore {
    async fn migrate(&self) -> Result<()> {
        // sqlx serialises concurrent migrators with an advisory lock.
        sqlx::migrate!("./migrations/postgres")
            .run(&self.pool)
            .await?;
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
        let type_list: Option<&[String]> = match params.types {
            TypeFilter::All => None,
            TypeFilter::Only(list) => Some(list),
        };
        // One statement, so one transaction. The ARRAY(…) subquery (run once, before
        // the update) walks tasks_due in (trigger_at, id) order, locks up to `limit`
        // rows and skips rows another claimer has locked (it is claiming them); the
        // UPDATE then marks exactly the rows locked, found by primary key. (Joining a
        // CTE instead lets a generic plan, which does not know `limit`, hash-join it
        // against a scan of the whole table.)
        let rows: Vec<ClaimRow> = retrying(|| async {
            let rows = sqlx::query_as(concat!(
                "UPDATE tasks SET state = 'claimed', lease_token = lease_token + 1, \
                        owner = $4, lease_until = GREATEST(trigger_at, $5) + $6, \
                        updated_at = $5 \
                 WHERE id = ANY(ARRAY( \
                     SELECT id FROM tasks \
                     WHERE state = 'pending' AND trigger_at <= $1 \
                       AND ($2::text[] IS NULL OR task_type = ANY($2)) \
                     ORDER BY trigger_at, id \
                     LIMIT $3 \
                     FOR UPDATE SKIP LOCKED)) \
                 RETURNING ",
                claim_columns!()
            ))
            .bind(params.horizon)
            .bind(type_list)
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

    async fn claim_ids(&self, params: ClaimIdsParams<'_>) -> Result<Vec<ClaimedTask>> {
        let rows: Vec<ClaimRow> = retrying(|| async {
            Ok(sqlx::query_as(concat!(
                "UPDATE tasks SET state = 'claimed', lease_token = lease_token + 1, \
                        owner = $2, lease_until = GREATEST(trigger_at, $3) + $4, updated_at = $3 \
                 WHERE state = 'pending' AND id = ANY($1) \
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

    async fn find_idempotent(&self, key: &str) -> Result<Option<(String, Millis)>> {
        let holder: Option<Holder> =
            sqlx::query_as("SELECT id, trigger_at FROM tasks WHERE idempotency_key = $1")
                .bind(key)
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
            " FROM tasks WHERE state = 'dead' AND ($1::text IS NULL OR task_type = $1) \
             ORDER BY updated_at DESC, id DESC LIMIT $2"
        ))
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
        let rows: Vec<StatsRow> = sqlx::query_as(
            "SELECT task_type, COUNT(*) AS pending, \
                    SUM(CASE WHEN trigger_at <= $1 THEN 1 ELSE 0 END) AS due, \
                    MIN(CASE WHEN trigger_at <= $1 THEN trigger_at END) AS oldest_due \
             FROM tasks WHERE state IN ('pending', 'claimed') GROUP BY task_type ORDER BY task_type",
        )
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
            sqlx::query_scalar("SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT")
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

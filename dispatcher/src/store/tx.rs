//! The write transactions, written once over any sqlx [`Database`]: inserting tasks,
//! cancelling, beginning and ending attempts, redriving. Each backend implements
//! [`Dialect`] — its statements ([`Queries`]) and the few steps its database needs done
//! its own way — and runs these bodies through [`Tx`]; it also implements [`Backend`],
//! and with it gets [`Store`].

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::marker::PhantomData;

use sqlx::{
    Acquire, Database, Encode, Executor, FromRow, IntoArguments, Pool, QueryBuilder, Transaction,
    Type,
};

use super::domain::{self, DependentsEffect, Initial};
use crate::trace::TraceContext;
use async_trait::async_trait;

use super::bulk;
use super::rows::{self, Holder, JobCountsRow, LapsedRow, StartedRow, TaskRow};
use super::shared::{self, INSERT_TASKS, KafkaDeadLetterRow, Queries};
use super::{
    Admitted, BulkAction, CancelOutcome, ClaimIdsParams, ClaimParams, ClaimedTask, DeadCount,
    DeadFilter, DeadLetterParams, FairClaim, FairParams, Finish, FinishKind, InsertOutcome,
    JobCountParams, JobCounts, JobGate, KafkaDeadLetter, KafkaDeadLetterParams, Lapsed, Millis,
    NewTask, PurgeParams, RedriveOutcome, Result, SearchParams, Shares, StartParams, Started,
    Store, StoreError, TaskRecord, TaskState, is_unique_violation, retrying,
    unnamed_insert_conflict, unnamed_redrive_conflict,
};

/// A connection of a dialect's database.
pub type Conn<D> = <<D as Dialect>::DB as Database>::Connection;

/// What a backend supplies to the shared transaction bodies.
pub trait Dialect: Send + Sync + 'static {
    type DB: Database;
    /// What a dedupe key (idempotency, unique, cron key, or an id looked up as one) is
    /// bound as: the columns' type.
    type Key: ?Sized + Sync;

    const QUERIES: Queries;
    /// Whether a failed statement aborts the whole transaction, so that one expected to
    /// fail (a redrive hitting the unique key) must run in a savepoint.
    const FAILED_STATEMENT_ABORTS: bool;

    /// Which SQLSTATEs mean the database rolled the transaction back and it may simply
    /// run again (see [`retrying`]).
    fn transient(code: &str) -> bool;

    fn key(key: &str) -> &Self::Key;

    /// sqlx has no database-generic way to read this.
    fn rows_affected(done: &<Self::DB as Database>::QueryResult) -> u64;

    /// Records that the new task `task` depends on each of its `depends_on` (a
    /// dependency named twice is recorded once).
    fn insert_dependencies<'a>(
        conn: &'a mut Conn<Self>,
        task: &'a NewTask,
    ) -> impl Future<Output = Result<()>> + Send + 'a;

    /// After task `id` succeeded: its blocked dependents whose dependencies have all
    /// succeeded become pending, no longer due before `now`.
    fn release_dependents<'a>(
        conn: &'a mut Conn<Self>,
        id: &'a str,
        now: Millis,
    ) -> impl Future<Output = Result<()>> + Send + 'a;

    /// After task `dep` failed for good: its blocked dependents go to dead letters.
    /// Returns their ids (their own dependents follow them).
    fn fail_blocked_dependents<'a>(
        conn: &'a mut Conn<Self>,
        dep: &'a str,
        now: Millis,
    ) -> impl Future<Output = Result<Vec<String>>> + Send + 'a;
}

/// The shared bodies, run with dialect `D`.
pub struct Tx<D>(PhantomData<D>);

/// The most rows one insert statement carries: 256 × 21 parameters stays well inside
/// every backend's limit (SQLite's is 32 766).
const MAX_ROWS_PER_INSERT: usize = 256;

/// How many of a run of `run` tasks one statement inserts: a power of two, so that a
/// connection prepares and caches at most nine statement texts however batches are cut.
fn rows_per_statement(run: usize) -> usize {
    let most = run.clamp(1, MAX_ROWS_PER_INSERT);
    1 << most.ilog2()
}

/// A task row's values, in [`INSERT_TASKS`]' column order.
struct TaskValues<'a> {
    id: &'a str,
    task_type: &'a str,
    payload: &'a str,
    state: TaskState,
    priority: i16,
    trigger_at: Millis,
    max_retries: i64,
    timeout_ms: i64,
    idempotency_key: Option<&'a str>,
    unique_key: Option<&'a str>,
    /// The unique key while it is held ([`domain::unique_active`]).
    unique_active: Option<&'a str>,
    unique_for: i64,
    cron_key: Option<&'a str>,
    source_service: Option<&'a str>,
    last_error: Option<&'a str>,
    /// Both `created_at` and `updated_at`.
    now: Millis,
    lease_secret: String,
    concurrency_key: Option<&'a str>,
    traceparent: Option<String>,
    tracestate: Option<&'a str>,
}

impl<'a> TaskValues<'a> {
    fn new(task: &'a NewTask, state: TaskState, last_error: Option<&'a str>, now: Millis) -> Self {
        Self {
            id: &task.id,
            task_type: &task.task_type,
            payload: task.payload.get(),
            state,
            priority: i16::from(task.priority),
            trigger_at: task.trigger_at,
            max_retries: i64::from(task.max_retries),
            timeout_ms: task.timeout_ms,
            idempotency_key: task.idempotency_key.as_deref(),
            unique_key: task.unique_key.as_deref(),
            unique_active: domain::unique_active(task, state),
            unique_for: super::duration_ms(task.unique_for),
            cron_key: task.cron_key.as_deref(),
            source_service: task.source_service.as_deref(),
            last_error,
            now,
            lease_secret: crate::lease::new_secret(),
            concurrency_key: task.concurrency_key.as_deref(),
            traceparent: task.trace.as_ref().map(TraceContext::traceparent),
            tracestate: task.trace.as_ref().and_then(|t| t.state.as_deref()),
        }
    }
}

impl<D, DB> Tx<D>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> &'q D::Key: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q D::Key>: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> i16: Encode<'q, DB> + Type<DB>,
    for<'r> (String,): FromRow<'r, DB::Row>,
    for<'r> Holder: FromRow<'r, DB::Row>,
    for<'r> StartedRow: FromRow<'r, DB::Row>,
    for<'r> TaskRow: FromRow<'r, DB::Row>,
{
    /// Inserts tasks in one transaction, one outcome per task in order. Where the
    /// dialect can ([`Queries::insert_many`]), runs of tasks without dependencies go in
    /// as multi-row statements: a statement per row was most of a batch submit's time.
    pub async fn insert(
        pool: &Pool<DB>,
        tasks: &[NewTask],
        now: Millis,
    ) -> Result<Vec<InsertOutcome>> {
        retrying(D::transient, || async {
            let mut tx = pool.begin().await?;
            let mut outcomes = Vec::with_capacity(tasks.len());
            let mut rest = tasks;
            while let Some(first) = rest.first() {
                let run = if D::QUERIES.insert_many {
                    rest.iter().take_while(|t| t.depends_on.is_empty()).count()
                } else {
                    0
                };
                if run >= 2 {
                    let (rows, after) = rest.split_at(rows_per_statement(run));
                    outcomes.extend(Self::insert_many(&mut tx, rows, now).await?);
                    rest = after;
                } else {
                    outcomes.push(Self::insert_one(&mut tx, first, now).await?);
                    rest = &rest[1..];
                }
            }
            tx.commit().await?;
            Ok(outcomes)
        })
        .await
    }

    /// Inserts `tasks`, none with dependencies, in one statement; those it left out for
    /// a taken key go through [`Self::insert_one`], which names the key's holder.
    async fn insert_many(
        tx: &mut Transaction<'_, DB>,
        tasks: &[NewTask],
        now: Millis,
    ) -> Result<Vec<InsertOutcome>> {
        let rows: Vec<TaskValues<'_>> = tasks
            .iter()
            .map(|task| TaskValues::new(task, TaskState::Pending, None, now))
            .collect();
        let mut insert = Self::insert_statement(&rows);
        insert.push(" RETURNING id");
        let mut inserted: std::collections::HashSet<String> = insert
            .build_query_scalar::<String>()
            .fetch_all(&mut **tx)
            .await?
            .into_iter()
            .collect();
        let mut outcomes = Vec::with_capacity(tasks.len());
        for task in tasks {
            outcomes.push(if inserted.remove(&task.id) {
                InsertOutcome::Inserted {
                    id: task.id.clone(),
                    trigger_at: task.trigger_at,
                }
            } else {
                Self::insert_one(tx, task, now).await?
            });
        }
        Ok(outcomes)
    }

    /// [`INSERT_TASKS`] with `rows`, then the dialect's way with a taken key.
    fn insert_statement(rows: &[TaskValues<'_>]) -> QueryBuilder<DB> {
        let mut insert = QueryBuilder::<DB>::new(INSERT_TASKS);
        insert.push_values(rows, |mut row, v| {
            row.push_bind(v.id)
                .push_bind(v.task_type)
                .push_bind(v.payload)
                .push_bind(v.state.as_str())
                .push_bind(v.priority)
                .push_bind(v.trigger_at)
                .push_bind(v.max_retries)
                .push_bind(v.timeout_ms)
                .push_bind(v.idempotency_key.map(D::key))
                .push_bind(v.unique_key.map(D::key))
                .push_bind(v.unique_active.map(D::key))
                .push_bind(v.unique_for)
                .push_bind(v.cron_key.map(D::key))
                .push_bind(v.source_service)
                .push_bind(v.last_error)
                .push_bind(v.now)
                .push_bind(v.now)
                .push_bind(v.lease_secret.as_str())
                .push_bind(v.concurrency_key.map(D::key))
                .push_bind(v.traceparent.as_deref())
                .push_bind(v.tracestate);
        });
        insert.push(D::QUERIES.insert_tasks_conflict);
        insert
    }

    /// [`super::Store::insert_workflow`].
    pub async fn insert_workflow(
        pool: &Pool<DB>,
        tasks: &[NewTask],
        now: Millis,
    ) -> Result<super::WorkflowOutcome> {
        retrying(D::transient, || async {
            let mut tx = pool.begin().await?;
            let mut stored_as: std::collections::HashMap<&str, String> =
                std::collections::HashMap::with_capacity(tasks.len());
            let mut outcomes = Vec::with_capacity(tasks.len());
            for (index, task) in tasks.iter().enumerate() {
                let mut task = task.clone();
                for dep in &mut task.depends_on {
                    if let Some(id) = stored_as.get(dep.as_str()) {
                        dep.clone_from(id);
                    }
                }
                let outcome = Self::insert_one(&mut tx, &task, now).await?;
                match &outcome {
                    InsertOutcome::Inserted { id, .. } | InsertOutcome::Duplicate { id, .. } => {
                        stored_as.insert(tasks[index].id.as_str(), id.clone());
                        outcomes.push(outcome);
                    }
                    _ => {
                        tx.rollback().await?;
                        return Ok(super::WorkflowOutcome::Refused { index, outcome });
                    }
                }
            }
            tx.commit().await?;
            Ok(super::WorkflowOutcome::Stored(outcomes))
        })
        .await
    }

    async fn insert_one(
        tx: &mut Transaction<'_, DB>,
        task: &NewTask,
        now: Millis,
    ) -> Result<InsertOutcome> {
        // Where rows lock, reading a dependency's state locks it against finishing until
        // this insert commits: its finish then finds this task among its dependents
        // (without the lock it could finish in between, look for dependents before this
        // one is visible, and leave it blocked forever).
        let mut dependencies = Vec::with_capacity(task.depends_on.len());
        for dep in &task.depends_on {
            let dep_state = Self::state(tx, D::QUERIES.dependency_state, dep).await?;
            dependencies.push((dep.as_str(), dep_state));
            if dep_state.is_none() {
                break;
            }
        }
        let (state, error) = match domain::initial_state(dependencies) {
            Initial::UnknownDependency(id) => return Ok(InsertOutcome::UnknownDependency { id }),
            Initial::Start { state, last_error } => (state, last_error),
        };
        let values = TaskValues::new(task, state, error.as_deref(), now);
        for _ in 0..domain::CONFLICT_ATTEMPTS {
            let inserted = Self::insert_statement(std::slice::from_ref(&values))
                .build()
                .execute(&mut **tx)
                .await;
            // A unique key either leaves the row out (affecting none) or fails the
            // statement, depending on the dialect's `insert_tasks_conflict`.
            match inserted {
                Ok(done) if D::rows_affected(&done) == 1 => {
                    D::insert_dependencies(&mut **tx, task).await?;
                    return Ok(InsertOutcome::Inserted {
                        id: task.id.clone(),
                        trigger_at: task.trigger_at,
                    });
                }
                Ok(_) => {}
                Err(err) if is_unique_violation(&err) => {}
                Err(err) => return Err(err.into()),
            }
            for key in domain::conflict_keys(task) {
                let holder: Option<Holder> = sqlx::query_as(Self::holder_sql(key))
                    .bind(D::key(key.value()))
                    .fetch_optional(&mut **tx)
                    .await?;
                let Some(holder) = holder else { continue };
                if matches!(key, domain::ConflictKey::Unique(_))
                    && Self::release_unique(tx, &holder.id, now).await?
                {
                    break;
                }
                let same = holder.same_request(task);
                return Ok(key.outcome(holder.id, holder.trigger_at, same));
            }
            // No task holds any of the keys: the holder of the unique key finished in
            // between (not possible with SQLite's one writer, where trying again finds
            // the same and ends in the error below), or held it past its window after
            // success and was freed just now (on every backend): the next try takes it.
        }
        Err(unnamed_insert_conflict(task))
    }

    /// Frees the unique key task `id` holds if its window after success ended by `now`
    /// (`NewTask::unique_for`); `true` if it did. The purger frees such keys too, in
    /// batches; this makes the key free exactly when the window ends.
    async fn release_unique(tx: &mut Transaction<'_, DB>, id: &str, now: Millis) -> Result<bool> {
        let done = sqlx::query::<DB>(D::QUERIES.release_unique)
            .bind(id)
            .bind(now)
            .execute(&mut **tx)
            .await?;
        Ok(D::rows_affected(&done) == 1)
    }

    /// The statement naming the task that holds a key an insert conflicted on.
    fn holder_sql(key: domain::ConflictKey<'_>) -> &'static str {
        match key {
            domain::ConflictKey::Idempotency(_) => D::QUERIES.holder_by_idempotency_key,
            domain::ConflictKey::Cron(_) => D::QUERIES.holder_by_cron_key,
            domain::ConflictKey::Id(_) => D::QUERIES.holder_by_id,
            domain::ConflictKey::Unique(_) => D::QUERIES.holder_by_unique_key,
        }
    }

    /// The state of task `id` as statement `sql` reads it (`None`: no such task).
    async fn state(
        tx: &mut Transaction<'_, DB>,
        sql: &'static str,
        id: &str,
    ) -> Result<Option<super::TaskState>> {
        let state: Option<String> = sqlx::query_scalar(sql)
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?;
        rows::state(state)
    }

    /// [`super::Store::find_idempotent`].
    pub async fn find_idempotent(pool: &Pool<DB>, task: &NewTask) -> Result<Option<InsertOutcome>> {
        let Some(key) = task.idempotency_key.as_deref() else {
            return Ok(None);
        };
        let holder: Option<Holder> = sqlx::query_as(D::QUERIES.holder_by_idempotency_key)
            .bind(D::key(key))
            .fetch_optional(pool)
            .await?;
        Ok(holder.map(|h| {
            let same = h.same_request(task);
            domain::ConflictKey::Idempotency(key).outcome(h.id, h.trigger_at, same)
        }))
    }

    pub async fn cancel(pool: &Pool<DB>, id: &str, now: Millis) -> Result<CancelOutcome> {
        retrying(D::transient, || async {
            let mut tx = pool.begin().await?;
            let done = sqlx::query::<DB>(D::QUERIES.cancel)
                .bind(now)
                .bind(id)
                .execute(&mut *tx)
                .await?;
            let outcome = if D::rows_affected(&done) == 1 {
                Self::fail_dependents(&mut tx, id, now).await?;
                CancelOutcome::Cancelled
            } else {
                domain::cancel_refused(Self::state(&mut tx, D::QUERIES.state, id).await?)
            };
            tx.commit().await?;
            Ok(outcome)
        })
        .await
    }

    /// [`super::Store::insert_cancelled`]: the task row, already `cancelled`, with no
    /// payload, keys or attempts.
    pub async fn insert_cancelled(
        pool: &Pool<DB>,
        id: &str,
        task_type: &str,
        now: Millis,
    ) -> Result<bool> {
        let values = TaskValues {
            id,
            task_type,
            payload: "null",
            state: TaskState::Cancelled,
            priority: 0,
            trigger_at: now,
            max_retries: 0,
            timeout_ms: 0,
            idempotency_key: None,
            unique_key: None,
            unique_active: None,
            unique_for: 0,
            cron_key: None,
            source_service: None,
            last_error: Some("cancelled before it was consumed from Kafka"),
            now,
            lease_secret: crate::lease::new_secret(),
            concurrency_key: None,
            traceparent: None,
            tracestate: None,
        };
        let inserted = Self::insert_statement(std::slice::from_ref(&values))
            .build()
            .execute(pool)
            .await;
        match inserted {
            Ok(done) => Ok(D::rows_affected(&done) == 1),
            Err(err) if is_unique_violation(&err) => Ok(false),
            Err(err) => Err(err.into()),
        }
    }

    /// After a task failed for good: its blocked dependents, and theirs, go to dead letters.
    async fn fail_dependents(tx: &mut Transaction<'_, DB>, id: &str, now: Millis) -> Result<()> {
        let mut failed = vec![id.to_string()];
        while let Some(dep) = failed.pop() {
            failed.extend(D::fail_blocked_dependents(&mut **tx, &dep, now).await?);
        }
        Ok(())
    }

    /// Applies one finish if its token still matches, and what it does to the tasks
    /// waiting on it; `true` where it applied.
    pub async fn finish_one(
        tx: &mut Transaction<'_, DB>,
        finish: &Finish,
        now: Millis,
    ) -> Result<bool> {
        let q = &D::QUERIES;
        // Each statement ends in `updated_at = ? WHERE id = ? AND lease_token = ?`.
        // Whoever wrote an error, it is made storable here: one value a backend refuses
        // would fail the whole batch of outcomes.
        let error = match &finish.kind {
            FinishKind::Retry { error, .. } | FinishKind::Dead { error } => {
                domain::sanitize_reason(error)
            }
            _ => String::new(),
        };
        let query = match &finish.kind {
            FinishKind::Succeeded { result } => {
                sqlx::query::<DB>(q.succeed).bind(result.as_ref().map(|r| r.get()))
            }
            FinishKind::Retry { at, .. } => sqlx::query(q.retry).bind(*at).bind(error.as_str()),
            FinishKind::Dead { .. } => sqlx::query(q.bury).bind(error.as_str()),
            FinishKind::Release => sqlx::query(q.release),
            FinishKind::Extend { until } => sqlx::query(q.extend).bind(*until),
        };
        let done = query
            .bind(now)
            .bind(finish.id.as_str())
            .bind(finish.lease_token)
            .execute(&mut **tx)
            .await?;
        let done = D::rows_affected(&done) == 1;
        if done {
            match domain::on_finish(&finish.kind) {
                DependentsEffect::Release => {
                    D::release_dependents(&mut **tx, &finish.id, now).await?
                }
                DependentsEffect::Fail => Self::fail_dependents(tx, &finish.id, now).await?,
                DependentsEffect::None => {}
            }
        }
        Ok(done)
    }

    pub async fn redrive(pool: &Pool<DB>, id: &str, now: Millis) -> Result<RedriveOutcome> {
        for _ in 0..domain::CONFLICT_ATTEMPTS {
            if let Some(outcome) =
                retrying(D::transient, || Self::redrive_tx(pool, id, now)).await?
            {
                return Ok(outcome);
            }
        }
        Err(unnamed_redrive_conflict(id))
    }

    /// What a redriven task `id` goes back to: `blocked` while one of its dependencies
    /// has not succeeded (it died because one did not), `pending` otherwise. Each
    /// dependency's state is read as an insert reads it — locked where rows lock — so
    /// the dependency cannot finish unseen before the task is back among its dependents.
    /// A dependency no longer stored (purged) is no longer waited on.
    async fn redriven_state(tx: &mut Transaction<'_, DB>, id: &str) -> Result<super::TaskState> {
        let deps: Vec<String> = sqlx::query_scalar(D::QUERIES.dependencies)
            .bind(id)
            .fetch_all(&mut **tx)
            .await?;
        for dep in &deps {
            let state = Self::state(tx, D::QUERIES.dependency_state, dep).await?;
            if state.is_some_and(|s| s != super::TaskState::Succeeded) {
                return Ok(super::TaskState::Blocked);
            }
        }
        Ok(super::TaskState::Pending)
    }

    /// One redrive; `None` when the task holding the unique key finished before it could
    /// be named (not possible with SQLite's one writer), and the caller tries again.
    async fn redrive_tx(pool: &Pool<DB>, id: &str, now: Millis) -> Result<Option<RedriveOutcome>> {
        let mut tx = pool.begin().await?;
        let state = Self::redriven_state(&mut tx, id).await?;
        let update = sqlx::query::<DB>(D::QUERIES.redrive)
            .bind(state.as_str())
            .bind(now)
            .bind(now)
            .bind(id);
        // The UPDATE may hit the unique key; the transaction goes on to name the task
        // holding it.
        let updated = if D::FAILED_STATEMENT_ABORTS {
            let mut savepoint = tx.begin().await?;
            let updated = update.execute(&mut *savepoint).await;
            match &updated {
                Ok(_) => savepoint.commit().await?,
                Err(err) if is_unique_violation(err) => savepoint.rollback().await?,
                Err(_) => {}
            }
            updated
        } else {
            update.execute(&mut *tx).await
        };
        let outcome = match updated {
            Ok(done) if D::rows_affected(&done) == 1 => RedriveOutcome::Redriven {
                trigger_at: now,
                state,
            },
            Ok(_) => domain::redrive_refused(Self::state(&mut tx, D::QUERIES.state, id).await?),
            Err(err) if is_unique_violation(&err) => {
                let existing_id: Option<String> = sqlx::query_scalar(D::QUERIES.redrive_holder)
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?;
                if let Some(holder) = &existing_id
                    && Self::release_unique(&mut tx, holder, now).await?
                {
                    // Its hold after success had ended: the next try takes the key.
                    tx.commit().await?;
                    return Ok(None);
                }
                match domain::redrive_conflict(existing_id) {
                    Some(outcome) => outcome,
                    None => return Ok(None),
                }
            }
            Err(err) => return Err(err.into()),
        };
        tx.commit().await?;
        Ok(Some(outcome))
    }

    pub async fn dead_letters(
        pool: &Pool<DB>,
        params: DeadLetterParams<'_>,
    ) -> Result<Vec<TaskRecord>> {
        // No cursor: everything sorts before one past the latest possible time.
        let (at, id) = params.after.unwrap_or((Millis::new(i64::MAX), ""));
        let rows: Vec<TaskRow> = sqlx::query_as(D::QUERIES.dead_letters)
            .bind(params.task_type)
            .bind(params.task_type)
            .bind(at)
            .bind(at)
            .bind(id)
            .bind(i64::from(params.limit))
            .fetch_all(pool)
            .await?;
        rows.into_iter().map(TaskRow::into_record).collect()
    }

    /// [`Dialect::fail_blocked_dependents`] where the database has `UPDATE …
    /// RETURNING`: one statement, binding `(last_error, now, dep)`.
    pub async fn fail_returning(
        conn: &mut DB::Connection,
        sql: &'static str,
        dep: &str,
        now: Millis,
    ) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar::<DB, String>(sql)
            .bind(domain::dependency_failed(dep).as_str())
            .bind(now)
            .bind(dep)
            .fetch_all(conn)
            .await?)
    }

    /// [`Dialect::insert_dependencies`] one row at a time with `sql`, binding
    /// `(task_id, depends_on)`; a dependency named twice is inserted once.
    pub async fn insert_each_dependency(
        conn: &mut DB::Connection,
        sql: &'static str,
        task: &NewTask,
    ) -> Result<()> {
        let mut deps: Vec<&str> = task.depends_on.iter().map(String::as_str).collect();
        deps.sort_unstable();
        deps.dedup();
        for dep in deps {
            sqlx::query::<DB>(sql)
                .bind(task.id.as_str())
                .bind(dep)
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }
}

/// A SQL backend: its dialect, its pools, and what it does its own way; the rest of
/// [`Store`] is implemented once, below, for all of them.
#[async_trait]
pub trait Backend: Dialect {
    /// Where writes go (SQLite: its one writer connection).
    fn writer(&self) -> &Pool<Self::DB>;
    /// Where reads go.
    fn reader(&self) -> &Pool<Self::DB>;
    /// Applies this dialect's pending migrations.
    async fn run_migrations(&self) -> Result<()>;
    /// [`Store::claim`].
    async fn claim_due(&self, params: ClaimParams<'_>) -> Result<Vec<ClaimedTask>>;
    /// [`Store::claim_ids`].
    async fn claim_named(&self, params: ClaimIdsParams<'_>) -> Result<Vec<ClaimedTask>>;
    /// [`Store::start`].
    async fn start_claims(&self, params: StartParams<'_>) -> Result<Vec<Started>>;
    /// [`Store::start`] over `conn`, in the caller's transaction ([`Store::start_limited`]).
    async fn start_on(
        conn: &mut <Self::DB as Database>::Connection,
        params: StartParams<'_>,
    ) -> Result<Vec<Started>>;
    /// [`Store::finish`].
    async fn finish_batch(&self, finishes: &[Finish], now: Millis) -> Result<Vec<bool>>;
}

#[async_trait]
impl<B, DB> Store for B
where
    B: Backend<DB = DB>,
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> &'q B::Key: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q B::Key>: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> i16: Encode<'q, DB> + Type<DB>,
    for<'r> (String,): FromRow<'r, DB::Row>,
    for<'r> Holder: FromRow<'r, DB::Row>,
    for<'r> StartedRow: FromRow<'r, DB::Row>,
    for<'r> TaskRow: FromRow<'r, DB::Row>,
    for<'r> JobCountsRow: FromRow<'r, DB::Row>,
    for<'r> LapsedRow: FromRow<'r, DB::Row>,
    for<'r> KafkaDeadLetterRow: FromRow<'r, DB::Row>,
    for<'r> (i64,): FromRow<'r, DB::Row>,
    for<'r> (String, i64): FromRow<'r, DB::Row>,
    for<'r> (i64, i64): FromRow<'r, DB::Row>,
    for<'q> &'q [u8]: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'r> (rows::Key, i64): FromRow<'r, DB::Row>,
    for<'r> (String, Option<rows::Key>): FromRow<'r, DB::Row>,
{
    async fn migrate(&self) -> Result<()> {
        self.run_migrations().await
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query::<DB>("SELECT 1").execute(self.reader()).await?;
        Ok(())
    }

    async fn insert(&self, tasks: &[NewTask], now: Millis) -> Result<Vec<InsertOutcome>> {
        Tx::<B>::insert(self.writer(), tasks, now).await
    }

    async fn insert_workflow(
        &self,
        tasks: &[NewTask],
        now: Millis,
    ) -> Result<super::WorkflowOutcome> {
        Tx::<B>::insert_workflow(self.writer(), tasks, now).await
    }

    async fn get(&self, id: &str) -> Result<Option<TaskRecord>> {
        shared::get(self.reader(), &B::QUERIES, id).await
    }

    async fn cancel(&self, id: &str, now: Millis) -> Result<CancelOutcome> {
        Tx::<B>::cancel(self.writer(), id, now).await
    }

    async fn insert_cancelled(&self, id: &str, task_type: &str, now: Millis) -> Result<bool> {
        Tx::<B>::insert_cancelled(self.writer(), id, task_type, now).await
    }

    async fn claim(&self, params: ClaimParams<'_>) -> Result<Vec<ClaimedTask>> {
        self.claim_due(params).await
    }

    async fn claim_ids(&self, params: ClaimIdsParams<'_>) -> Result<Vec<ClaimedTask>> {
        self.claim_named(params).await
    }

    async fn find_idempotent(&self, task: &NewTask) -> Result<Option<InsertOutcome>> {
        Tx::<B>::find_idempotent(self.reader(), task).await
    }

    async fn start(&self, params: StartParams<'_>) -> Result<Vec<Started>> {
        self.start_claims(params).await
    }

    async fn start_limited(&self, params: StartParams<'_>, gate: JobGate<'_>) -> Result<Admitted> {
        let q = &B::QUERIES;
        retrying(B::transient, || async {
            let mut tx = self.writer().begin().await?;
            // Locked before it is inserted, then inserted only if missing: an insert that
            // finds the row takes a shared lock on it (InnoDB), and two transactions
            // upgrading theirs would deadlock on every start.
            let mut row: Option<(i64, i64)> = sqlx::query_as(q.lock_limits)
                .bind(gate.task_type)
                .fetch_optional(&mut *tx)
                .await?;
            if row.is_none() {
                let fresh = domain::Bucket::full(gate.rate, params.now);
                sqlx::query::<DB>(q.new_limits)
                    .bind(gate.task_type)
                    .bind(fresh.milli_tokens)
                    .bind(fresh.at)
                    .execute(&mut *tx)
                    .await?;
                row = sqlx::query_as(q.lock_limits)
                    .bind(gate.task_type)
                    .fetch_optional(&mut *tx)
                    .await?;
            }
            let (milli_tokens, at) = row.ok_or_else(|| {
                StoreError::Corrupt(format!("no job_limits row for {:?}", gate.task_type))
            })?;
            // Read after the row lock was granted, so it counts every attempt begun by
            // the transactions that held it before (READ COMMITTED: a statement sees what
            // was committed when it began).
            let (running,): (i64,) = sqlx::query_as(q.running)
                .bind(gate.task_type)
                .fetch_one(&mut *tx)
                .await?;
            // The running attempts of the batch's keys, read under the same row lock
            // as the job's count (served by tasks_keyed).
            let mut key_running = HashMap::new();
            let mut batch_keys: Vec<&str> = gate.keys.iter().flatten().copied().collect();
            batch_keys.sort_unstable();
            batch_keys.dedup();
            if gate.key_limit.is_some() && !batch_keys.is_empty() {
                let mut query = sqlx::QueryBuilder::<DB>::new(
                    "SELECT concurrency_key, COUNT(*) FROM tasks WHERE task_type = ",
                );
                query
                    .push_bind(gate.task_type)
                    .push(" AND state = 'running' AND concurrency_key IN (");
                let mut list = query.separated(", ");
                for key in &batch_keys {
                    list.push_bind(B::key(key));
                }
                query.push(") GROUP BY concurrency_key");
                let counts: Vec<(rows::Key, i64)> =
                    query.build_query_as().fetch_all(&mut *tx).await?;
                key_running.extend(counts.into_iter().map(|(key, n)| (key.0, n)));
            }
            // The keys first, so a full key's claims do not take the job's slots or
            // tokens from the others'.
            let keys: Vec<Option<&str>> = (0..params.claims.len())
                .map(|index| gate.keys.get(index).copied().flatten())
                .collect();
            let (room, key_held) = domain::key_room(&keys, gate.key_limit, &key_running);
            let admission = domain::admit(
                room.len(),
                running,
                gate.concurrency,
                gate.rate,
                domain::Bucket {
                    milli_tokens,
                    at: Millis::new(at),
                },
                params.now,
            );
            let tried: Vec<(String, i64)> = room[..admission.allowed]
                .iter()
                .map(|&index| params.claims[index].clone())
                .collect();
            let started = if tried.is_empty() {
                Vec::new()
            } else {
                B::start_on(
                    &mut *tx,
                    StartParams {
                        claims: &tried,
                        ..params
                    },
                )
                .await?
            };
            if gate.rate.is_some() {
                // A claim that did not start (cancelled, paused, lapsed) took no token.
                let bucket = domain::spend(admission.bucket, started.len());
                sqlx::query::<DB>(q.save_limits)
                    .bind(bucket.milli_tokens)
                    .bind(bucket.at)
                    .bind(gate.task_type)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            let mut deferred = vec![true; params.claims.len()];
            for &index in &room[..admission.allowed] {
                deferred[index] = false;
            }
            Ok(Admitted {
                started,
                deferred: (0..params.claims.len()).filter(|&i| deferred[i]).collect(),
                held_by: admission.held_by.or(key_held.then_some(super::HeldBy::Key)),
            })
        })
        .await
    }

    async fn claim_fair(&self, params: ClaimParams<'_>, fair: FairParams<'_>) -> Result<FairClaim> {
        let super::TypeFilter::Only(types) = params.types else {
            return Err(StoreError::Corrupt("a fair claim is of one job".into()));
        };
        let [task_type] = types.as_slice() else {
            return Err(StoreError::Corrupt("a fair claim is of one job".into()));
        };
        // The job's active tasks, found through tasks_keyed (type, key, rank), numbered
        // within each key (`turn`), its claimed and running ones first: linear in the
        // job's due backlog (docs/design.md, "Per-key limits", on the cost). The keys
        // take each turn in rotation, starting after `after`.
        let mut query = sqlx::QueryBuilder::<DB>::new(
            "SELECT id, concurrency_key FROM (SELECT id, state, claim_rank, concurrency_key, \
               ROW_NUMBER() OVER (PARTITION BY concurrency_key \
                 ORDER BY CASE WHEN state = 'pending' THEN 1 ELSE 0 END, claim_rank, id) AS turn \
             FROM tasks WHERE task_type = ",
        );
        query
            .push_bind(task_type.as_str())
            .push(
                " AND state IN ('pending', 'claimed', 'running') \
                  AND (state <> 'pending' OR (claim_rank <= ",
            )
            .push_bind(params.horizon)
            .push(" AND trigger_at <= ")
            .push_bind(params.horizon)
            .push(")) ) ranked WHERE state = 'pending' AND turn <= ")
            .push_bind(i64::from(fair.per_key))
            .push(" ORDER BY turn, CASE WHEN concurrency_key > ")
            .push_bind(B::key(fair.after.unwrap_or("")))
            .push(" THEN 0 ELSE 1 END, concurrency_key, claim_rank, id LIMIT ")
            .push_bind(i64::from(params.limit));
        let picked: Vec<(String, Option<rows::Key>)> =
            query.build_query_as().fetch_all(self.writer()).await?;
        let Some((_, last_key)) = picked.last() else {
            return Ok(FairClaim {
                tasks: Vec::new(),
                last_key: None,
            });
        };
        let last_key = last_key.as_ref().map(|key| key.0.clone());
        let ids: Vec<String> = picked.into_iter().map(|(id, _)| id).collect();
        // Claimed by id, only those still pending: another dispatcher's claim between
        // the two statements takes a task from this one, never twice.
        let tasks = self
            .claim_named(ClaimIdsParams {
                ids: &ids,
                now: params.now,
                hold: params.hold,
                owner: params.owner,
            })
            .await?;
        Ok(FairClaim { tasks, last_key })
    }

    async fn finish(&self, finishes: &[Finish], now: Millis) -> Result<Vec<bool>> {
        self.finish_batch(finishes, now).await
    }

    async fn lapsed(&self, now: Millis, limit: u32) -> Result<Vec<Lapsed>> {
        shared::lapsed(self.reader(), &B::QUERIES, now, limit).await
    }

    async fn dead_letters(&self, params: DeadLetterParams<'_>) -> Result<Vec<TaskRecord>> {
        Tx::<B>::dead_letters(self.reader(), params).await
    }

    async fn redrive(&self, id: &str, now: Millis) -> Result<RedriveOutcome> {
        Tx::<B>::redrive(self.writer(), id, now).await
    }

    async fn search(&self, params: SearchParams<'_>) -> Result<Vec<TaskRecord>> {
        shared::search(self.reader(), params).await
    }

    async fn purge(&self, params: PurgeParams<'_>) -> Result<u64> {
        retrying(B::transient, || {
            shared::purge(self.writer(), &B::QUERIES, params)
        })
        .await
    }

    async fn release_unique_keys(&self, now: Millis, limit: u32) -> Result<u64> {
        retrying(B::transient, || {
            shared::release_unique_keys(self.writer(), &B::QUERIES, now, limit)
        })
        .await
    }

    async fn count_dead(&self, filter: DeadFilter<'_>) -> Result<DeadCount> {
        bulk::count(self.reader(), filter).await
    }

    async fn act_on_dead(&self, filter: DeadFilter<'_>, limit: u32, now: Millis) -> Result<u64> {
        match filter.action {
            BulkAction::Purge => {
                retrying(B::transient, || {
                    bulk::purge::<B, DB>(self.writer(), filter, limit)
                })
                .await
            }
            BulkAction::Redrive => {
                let (ids, bulk) = retrying(B::transient, || {
                    bulk::redrive_picked::<B, DB>(self.writer(), filter, limit, now)
                })
                .await?;
                let mut redriven = bulk.unwrap_or(0);
                if redriven == ids.len() as u64 {
                    return Ok(redriven);
                }
                // Tasks with dependencies, or a unique key the one UPDATE hit: one at a
                // time, each as `POST /v1/dead-letters/{id}/redrive` (those the UPDATE
                // redrove are no longer dead and are left alone).
                for id in &ids {
                    if let RedriveOutcome::Redriven { .. } =
                        Tx::<B>::redrive(self.writer(), id, now).await?
                    {
                        redriven += 1;
                    }
                }
                Ok(redriven)
            }
        }
    }

    async fn job_counts(&self, params: JobCountParams<'_>) -> Result<JobCounts> {
        shared::job_counts(self.reader(), params).await
    }

    async fn heartbeat_member(&self, member: &str, now: Millis, shares: &Shares) -> Result<()> {
        shared::heartbeat_member(self.writer(), &B::QUERIES, member, now, shares).await
    }

    async fn live_members(&self, since: Millis) -> Result<Vec<String>> {
        shared::live_members(self.reader(), &B::QUERIES, since).await
    }

    async fn live_shares(&self, since: Millis) -> Result<BTreeMap<String, u64>> {
        shared::live_shares(self.reader(), &B::QUERIES, since).await
    }

    async fn leave(&self, member: &str) -> Result<()> {
        shared::leave(self.writer(), &B::QUERIES, member).await
    }

    async fn release_claims(&self, owner: &str, now: Millis) -> Result<u64> {
        let done = shared::release_claims(self.writer(), &B::QUERIES, owner, now).await?;
        Ok(B::rows_affected(&done))
    }

    async fn clock(&self) -> Result<Option<Millis>> {
        let Some(statement) = B::QUERIES.clock else {
            return Ok(None);
        };
        let ms = sqlx::query_scalar::<DB, i64>(statement)
            .fetch_one(self.reader())
            .await?;
        Ok(Some(Millis::new(ms)))
    }

    async fn record_kafka_dead_letter(&self, letter: &KafkaDeadLetter) -> Result<()> {
        shared::record_kafka_dead_letter(self.writer(), &B::QUERIES, letter).await
    }

    async fn kafka_dead_letters(
        &self,
        params: KafkaDeadLetterParams<'_>,
    ) -> Result<Vec<KafkaDeadLetter>> {
        shared::kafka_dead_letters(self.reader(), params).await
    }

    async fn purge_kafka_dead_letters(&self, recorded_before: Millis, limit: u32) -> Result<u64> {
        let done = retrying(B::transient, || async {
            Ok(sqlx::query::<DB>(B::QUERIES.purge_kafka_dead_letters)
                .bind(recorded_before)
                .bind(i64::from(limit))
                .execute(self.writer())
                .await?)
        })
        .await?;
        Ok(B::rows_affected(&done))
    }

    async fn pause(&self, task_type: &str, now: Millis) -> Result<Millis> {
        let mut tx = self.writer().begin().await?;
        sqlx::query::<DB>(B::QUERIES.pause)
            .bind(task_type)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        let since = sqlx::query_as::<DB, (String, i64)>(B::QUERIES.pauses)
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .find(|(paused, _)| paused == task_type)
            .map_or(now, |(_, at)| Millis::new(at));
        tx.commit().await?;
        Ok(since)
    }

    async fn resume(&self, task_type: &str) -> Result<bool> {
        let done = sqlx::query::<DB>(B::QUERIES.resume)
            .bind(task_type)
            .execute(self.writer())
            .await?;
        Ok(B::rows_affected(&done) > 0)
    }

    async fn pauses(&self) -> Result<Vec<(String, Millis)>> {
        Ok(sqlx::query_as::<DB, (String, i64)>(B::QUERIES.pauses)
            .fetch_all(self.reader())
            .await?
            .into_iter()
            .map(|(task_type, at)| (task_type, Millis::new(at)))
            .collect())
    }
}

//! The write transactions, written once over any sqlx [`Database`]: inserting tasks,
//! cancelling, beginning and ending attempts, redriving. Each backend implements
//! [`Dialect`] — its statements ([`Queries`]) and the few steps its database needs done
//! its own way — and runs these bodies through [`Tx`]; it also implements
//! [`Backend`](crate::sql_store::Backend), and with it gets [`Store`](crate::Store).

use std::future::Future;
use std::marker::PhantomData;

use sqlx::{Acquire, Database, Encode, Executor, FromRow, IntoArguments, Pool, Transaction, Type};

use super::domain::{self, DependentsEffect, Initial};
use super::rows::{self, Holder, KeyWindowRow, StartedRow, TaskRow};
use super::shared::Queries;
pub use super::task_row::ClaimAtInsert;
use super::task_row::TaskValues;
use super::{
    DeadLetterParams, Finish, FinishKind, InsertOutcome, Millis, NewTask, RedriveOutcome, Result,
    TaskRecord, is_unique_violation, retrying, unnamed_insert_conflict, unnamed_redrive_conflict,
};

mod insert;
mod kafka_changes;
pub(crate) mod keyed_walk;
mod schedules;
mod waiting;
mod workflow;

pub use kafka_changes::KafkaChangeRow;
pub use schedules::ScheduleRow;

/// A connection of a dialect's database.
pub type Conn<D> = <<D as Dialect>::DB as Database>::Connection;

/// What a backend supplies to the shared transaction bodies.
pub trait Dialect: Send + Sync + 'static {
    type DB: Database;
    /// What a dedupe key (idempotency, unique, cron key, or an id looked up as one) is
    /// bound as: the columns' type.
    type Key: ?Sized + Sync;

    const QUERIES: Queries;
    /// The tenant of a `tenant␟key` concurrency key (`spec.fairness`): the column's text
    /// before its first U+001F.
    const TENANT_OF_KEY: &'static str;
    /// How the fair claim's walk reads `tasks_keyed` ([`keyed_walk::KeyedWalk`]).
    const KEYED_WALK: keyed_walk::KeyedWalk;
    /// Whether a failed statement aborts the whole transaction, so that one expected to
    /// fail (a redrive hitting the unique key) must run in a savepoint.
    const FAILED_STATEMENT_ABORTS: bool;

    /// Which SQLSTATEs mean the database rolled the transaction back and it may simply
    /// run again (see [`retrying`]).
    fn transient(code: &str) -> bool;

    fn key(key: &str) -> &Self::Key;

    /// sqlx has no database-generic way to read this.
    fn rows_affected(done: &<Self::DB as Database>::QueryResult) -> u64;

    /// The fewest tasks of a run that go in by the dialect's bulk load of task rows
    /// ([`Self::load_tasks`]), where it has one faster than its multi-row insert.
    const BULK_LOAD_MIN_ROWS: Option<usize> = None;

    /// Whether [`Self::load_tasks`] and [`Self::insert_leaving_out`] write a run of any
    /// length in one statement, which commits or fails as a whole on its own: an insert
    /// that is one such run then needs no transaction around it, nor BEGIN's and
    /// COMMIT's round trips (two of a group commit's three; [`Tx::insert_alone`]).
    const RUN_IS_ONE_STATEMENT: bool = false;

    /// Inserts `rows` in one statement, leaving out each whose id or key is taken, and
    /// returns the ids it inserted. Called only where [`Self::RUN_IS_ONE_STATEMENT`].
    fn insert_leaving_out<'a>(
        _conn: &'a mut Conn<Self>,
        _rows: &'a [TaskValues<'a>],
    ) -> impl Future<Output = Result<Vec<String>>> + Send + 'a {
        async { Err(sqlx::Error::Protocol("this store has no one-statement insert".into()).into()) }
    }

    /// Writes `rows`, none holding a key ([`crate::task_row::loadable`]), as one bulk
    /// load. Called only where [`Self::BULK_LOAD_MIN_ROWS`] is set. A row whose id is
    /// taken fails the whole load with a unique violation, and with it the transaction.
    fn load_tasks<'a>(
        _conn: &'a mut Conn<Self>,
        _rows: &'a [TaskValues<'a>],
    ) -> impl Future<Output = Result<()>> + Send + 'a {
        async { Err(sqlx::Error::Protocol("this store has no bulk load of tasks".into()).into()) }
    }

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
    for<'q> Option<Millis>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> i16: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i16>: Encode<'q, DB> + Type<DB>,
    for<'r> (String,): FromRow<'r, DB::Row>,
    for<'r> (String, String): FromRow<'r, DB::Row>,
    for<'r> Holder: FromRow<'r, DB::Row>,
    for<'r> KeyWindowRow: FromRow<'r, DB::Row>,
    for<'r> StartedRow: FromRow<'r, DB::Row>,
    for<'r> TaskRow: FromRow<'r, DB::Row>,
{
    async fn insert_one(
        tx: &mut Transaction<'_, DB>,
        task: &NewTask,
        now: Millis,
    ) -> Result<InsertOutcome> {
        match &task.window {
            Some(window) => Self::insert_windowed(tx, task, window, now).await,
            None => Self::insert_row(tx, task, now).await,
        }
    }

    async fn insert_row(
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
                    if !task.depends_on.is_empty() {
                        D::insert_dependencies(&mut **tx, task).await?;
                    }
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
                let mut holder = sqlx::query_as(Self::holder_sql(key)).bind(D::key(key.value()));
                if key.per_type() {
                    holder = holder.bind(task.task_type.as_str());
                }
                let holder: Option<Holder> = holder.fetch_optional(&mut **tx).await?;
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
        let holder = Self::idempotency_key_holder(pool, &task.task_type, key).await?;
        Ok(holder.map(|h| {
            let same = h.same_request(task);
            domain::ConflictKey::Idempotency(key).outcome(h.id, h.trigger_at, same)
        }))
    }

    /// The task of `task_type` holding idempotency key `key`.
    pub async fn idempotency_key_holder(
        pool: &Pool<DB>,
        task_type: &str,
        key: &str,
    ) -> Result<Option<Holder>> {
        Ok(sqlx::query_as(D::QUERIES.holder_by_idempotency_key)
            .bind(D::key(key))
            .bind(task_type)
            .fetch_optional(pool)
            .await?)
    }

    /// After a task failed for good: its blocked dependents, and theirs, go to dead letters.
    async fn fail_dependents(conn: &mut Conn<D>, id: &str, now: Millis) -> Result<()> {
        let mut failed = vec![id.to_string()];
        while let Some(dep) = failed.pop() {
            failed.extend(D::fail_blocked_dependents(&mut *conn, &dep, now).await?);
        }
        Ok(())
    }

    /// Applies one finish if its token still matches, and what it does to the tasks
    /// waiting on it; `true` where it applied.
    pub async fn finish_one(conn: &mut Conn<D>, finish: &Finish, now: Millis) -> Result<bool> {
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
            .execute(&mut *conn)
            .await?;
        let done = D::rows_affected(&done) == 1;
        if done {
            match domain::on_finish(&finish.kind) {
                DependentsEffect::Release => {
                    D::release_dependents(&mut *conn, &finish.id, now).await?
                }
                DependentsEffect::Fail => Self::fail_dependents(conn, &finish.id, now).await?,
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

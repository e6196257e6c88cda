//! Operations whose shape is the same on every backend, written once over any sqlx
//! [`Database`]: each backend passes its [`Queries`], the only part that differs.

use std::collections::BTreeMap;

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, QueryBuilder, Type};

use super::rows::{LapsedRow, TaskRow, task_columns};
use super::{
    KafkaDeadLetter, KafkaDeadLetterParams, Lapsed, MEMBER_RETENTION, Millis, PurgeParams, Result,
    SearchParams, Shares, TaskRecord,
};

/// The columns a new task's row is written with, in [`crate::task_row::TaskValues`]'
/// order: by [`INSERT_TASKS`], and by a dialect's bulk load of tasks
/// ([`crate::tx::Dialect::load_tasks`]).
macro_rules! insert_columns {
    () => {
        "id, task_type, payload, state, priority, trigger_at, max_retries, timeout_ms, \
         idempotency_key, unique_key, unique_active, unique_for, cron_key, source_service, \
         last_error, created_at, updated_at, lease_secret, concurrency_key, traceparent, \
         tracestate, expires_at, owner, lease_until, lease_token"
    };
}
pub(crate) use insert_columns;

/// Inserts task rows, given as `VALUES` (in this column order) after it, then the
/// dialect's [`Queries::insert_tasks_conflict`].
pub const INSERT_TASKS: &str = concat!("INSERT INTO tasks (", insert_columns!(), ") ");

/// What a multi-row insert of tasks does when a row's key is taken. Either way a batch's
/// runs of tasks without dependencies go in as multi-row statements, and a task whose
/// key is taken goes through the one-row insert, which names the key's holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManyRows {
    /// The row is left out (`ON CONFLICT DO NOTHING`) and the statement names the rows
    /// it inserted (`RETURNING id`): only the rows left out are tried again one by one.
    LeftOut,
    /// The statement fails, and the server undoes it alone (InnoDB: the transaction
    /// goes on): the whole run is tried again one row at a time. A run holds a taken key
    /// only after a redelivery or a repeated submit, so most runs go in at once.
    AllOrNothing,
}

/// One backend's text for the statements run here and in [`super::tx`]; each takes its
/// parameters in the order its comment names (the function binding it uses that order).
pub struct Queries {
    /// The task columns (`rows::task_columns!`) of task `id`.
    pub get: &'static str,
    /// The `depends_on` ids of task `id`, sorted.
    pub dependencies: &'static str,
    /// Up to `limit` claimed or running tasks whose lease ended before `now`, oldest
    /// lease first.
    pub lapsed_leases: &'static str,
    /// Records member `id` alive at `now` with its adaptive `shares` (JSON), inserting or
    /// updating its row.
    pub heartbeat: &'static str,
    /// Deletes members whose last heartbeat is before `until`.
    pub forget_members: &'static str,
    /// Members whose last heartbeat is at or after `since`, sorted.
    pub live_members: &'static str,
    /// `heartbeat`, `forget_members` and `live_members` in one statement, where the
    /// dialect can: member, now, shares, until, since.
    pub heartbeat_and_live: Option<&'static str>,
    /// The `shares` of the members whose last heartbeat is at or after `since`.
    pub live_shares: &'static str,
    /// Deletes member `id`.
    pub remove_member: &'static str,
    /// Sets every task in `claimed` whose `owner` is `owner` back to `pending`, as a
    /// release does, stamped `now`; parameters `now`, `owner`.
    pub release_claims: &'static str,
    /// What ends a SELECT that picks rows a transaction then changes, so that concurrent
    /// pickers skip each other's rows instead of waiting; empty for SQLite, whose one
    /// writer needs no row locks.
    pub skip_locked: &'static str,
    /// The database server's clock in UTC milliseconds; `None` for an embedded database.
    pub database_clock: Option<&'static str>,
    /// Inserts a Kafka dead letter unless one is recorded at its (topic, partition,
    /// offset); parameters `topic, kafka_partition, kafka_offset, message, message_size,
    /// reason, recorded_at`.
    pub record_kafka_dead_letter: &'static str,
    /// Deletes up to `limit` Kafka dead letters recorded before `recorded_before`
    /// (`recorded_before, limit`), oldest first, skipping rows another purger holds.
    pub purge_kafka_dead_letters: &'static str,
    /// Records task type `task_type` paused at `paused_at` unless it is already paused
    /// (then its row is left as it is); parameters `task_type, paused_at`.
    pub pause: &'static str,
    /// Deletes the pause of task type `task_type`.
    pub resume: &'static str,
    /// `task_type, paused_at` of every paused task type, sorted by type.
    pub paused_types: &'static str,
    /// The earliest ETA of a pending task of `task_type` due after `after` and by
    /// `horizon` (`task_type, after, horizon`), through `tasks_by_type_state`.
    pub next_pending_eta: &'static str,
    /// The `job_limits` row of a task type.
    pub job_limits: GateRow,
    /// The `limiters` row of a limiter's id (migration 0024).
    pub limiters: GateRow,
    /// The `key_buckets` row of a job's key (`task type␟key`, migration 0025).
    pub key_buckets: GateRow,
    /// Deletes up to `limit` key buckets last refilled before `before`, oldest first
    /// (`before, limit`).
    pub purge_key_buckets: &'static str,
    /// `waiting, waiting_at` of the `limiters` row of `id`: the job left the next slot.
    pub limiter_waiter: &'static str,
    /// Sets `waiting, waiting_at` of the `limiters` row of `id`; parameters `waiting,
    /// waiting_at, id` (`''` and 0 clear it).
    pub set_limiter_waiter: &'static str,
    /// Sets the runtime weight of a job's tenant (migration 0026); parameters
    /// `task_type, tenant, weight, updated_at`.
    pub set_tenant_weight: &'static str,
    /// Deletes the runtime weight of a job's tenant (`task_type, tenant`).
    pub delete_tenant_weight: &'static str,
    /// `tenant, weight` of every runtime weight of `task_type`, by tenant.
    pub tenant_weights: &'static str,
    /// How many attempts of `task_type` are running.
    pub running: &'static str,
    /// [`Self::lock_limits`] and [`Self::running`] in one statement (`task_type`), where
    /// that counts right: with one writer (SQLite) nothing can begin between the two.
    /// Where rows lock, the count must be a statement of its own, read after the lock
    /// was granted (READ COMMITTED: a statement sees what was committed when it began).
    pub limits_and_running: Option<&'static str>,
    /// The ETA of a pending task of `task_type` due by `now`, if there is one
    /// (`task_type, now, now`), through the index the claim walks: what
    /// [`Store::start_due`](crate::Store::start_due) reads before it takes the job's
    /// lock, so a look that finds nothing writes nothing.
    pub due_exists: &'static str,

    /// The state of task `id`, a new task's dependency: locked, where rows lock, so it
    /// cannot finish before the new task is committed.
    pub dependency_state: &'static str,
    /// What follows the rows of [`INSERT_TASKS`]: on a taken key the dialect either
    /// leaves the row out (`ON CONFLICT DO NOTHING`) or fails with a unique violation
    /// (empty).
    pub insert_tasks_conflict: &'static str,
    /// What a multi-row insert does with a row whose key is taken.
    pub insert_many: ManyRows,
    /// `id, trigger_at, task_type, payload` of the task of type `task_type` holding
    /// idempotency key `key` (`key, task_type`): keys are unique per type.
    pub holder_by_idempotency_key: &'static str,
    /// `id, trigger_at` of the task holding cron key `key` (a firing's identity, which
    /// names its job).
    pub holder_by_cron_key: &'static str,
    /// `id, trigger_at, task_type` of task `id`: a task of another type under the id is
    /// not a repeat ([`crate::InsertOutcome::IdTaken`]).
    pub holder_by_id: &'static str,
    /// `id, trigger_at` of the task of type `task_type` holding unique key `key`
    /// (`unique_active`; `key, task_type`).
    pub holder_by_unique_key: &'static str,
    /// Frees the unique key of task `id` if it is held past its window by `now` (`id,
    /// now`): a succeeded task whose `unique_until` has come.
    pub release_unique: &'static str,
    /// The ids of up to `limit` tasks whose unique key is held past its window by `now`
    /// (`now, limit`), earliest end first, locked where rows lock (skipping those
    /// another purger holds).
    pub unique_expired: &'static str,
    /// `id, task_type` of up to `limit` tasks not begun whose `expires_at` is at or before
    /// `now` (`now, limit`), earliest expiry first, locked where rows lock (skipping
    /// those another expirer or a start holds): `tasks_expiring` (migration 0018).
    pub expirable: &'static str,
    /// Ends task `id` `expired` if it has not begun and its expiry has come (`last_error,
    /// now, id, now`), freeing its unique key and moving its token on, so a claim of it
    /// no longer starts.
    pub expire: &'static str,
    /// Creates the key window `(task_type, kind, key)` if it does not exist, and locks
    /// it either way where rows lock (`task_type, kind, key`).
    pub open_window: &'static str,
    /// `task_id, opened_at, closes_at` of key window `(task_type, kind, key)`.
    pub read_window: &'static str,
    /// Sets key window `(task_type, kind, key)` to `task_id, opened_at, closes_at`
    /// (bound in that order, then the window's three).
    pub save_window: &'static str,
    /// Deletes up to `limit` key windows closed before `closed_before` whose task no
    /// longer waits, earliest closed first (`closed_before, limit`).
    pub purge_windows: &'static str,
    /// Rests key `(task_type, key)` until `ends_at`, or keeps its later end
    /// (`task_type, key, ends_at`).
    pub cool_down_key: &'static str,
    /// Deletes up to `limit` key cooldowns that ended before `ended_before`, earliest
    /// first (`ended_before, limit`).
    pub purge_cooldowns: &'static str,
    /// The state of task `id`, read to say why a transition did not apply.
    pub state: &'static str,
    /// What ends a `SELECT` that locks the rows it reads and passes over those another
    /// transaction holds (empty where one writer is all there is): a schedule firing
    /// pass's.
    pub lock_skipping: &'static str,
    /// What ends a `SELECT` that locks the rows it reads, waiting for another
    /// transaction's (empty where one writer is all there is).
    pub lock_rows: &'static str,
    /// Cancels task `id` at `now` (`now, id`) if it has not begun.
    pub cancel: &'static str,
    /// Changes task `id` if it has not begun (`trigger_at, payload, priority, now, id`,
    /// each value `NULL` to keep the task's): a claim is given up (back to `pending`,
    /// the token bumped, so the claimer's start no longer matches).
    pub change: &'static str,
    /// The finishes, each binding its own values, then `(now, id, lease_token)`:
    /// `result`; `trigger_at, last_error`; `last_error`; nothing; `lease_until`.
    ///
    /// A success also lands on a `pending` or `dead` task still holding the attempt's
    /// token: the attempt was given up (its lease lapsed, or the dispatcher stopped
    /// waiting) and queued again — or, on its last attempt, dead-lettered — but no new
    /// attempt has been claimed (a claim, like a redrive or a cancel, moves the token
    /// on). The work did succeed; running it again would be the duplicate, and leaving it
    /// in dead letters would be a lie. (A claim that was released, not started, never
    /// shares its token with an attempt: starting moves the token on too. Dependents
    /// failed by the death stay failed: a success does not revive them.) A success keeps
    /// the unique key held when the task has a window after success (`unique_for > 0`,
    /// migration 0012); every other end of a task frees it.
    pub succeed: &'static str,
    pub retry: &'static str,
    pub bury: &'static str,
    pub release: &'static str,
    pub extend: &'static str,
    /// Dead task `id` back to `state` (pending, or blocked while a dependency has not
    /// succeeded) at `now` (`state, now, now, id`), taking its unique key back (which
    /// fails if another unfinished task holds it).
    pub redrive: &'static str,
    /// The id of the task holding the unique key of task `id`.
    pub redrive_holder: &'static str,
    /// Up to `limit` dead tasks, of type `task_type` unless it is NULL (`task_type,
    /// task_type, limit`), latest first.
    pub dead_letters: &'static str,
    /// The ids of up to `limit` tasks [`super::Store::purge`] may delete (`task_type,
    /// state, finished_before, limit`), oldest first, locked where rows lock (skipping
    /// those another purger holds).
    pub purgeable: &'static str,
}

/// The statements on one table of limits rows (`job_limits` keyed by task type,
/// `limiters` by limiter id): a token bucket per row, `tokens` in thousandths of a
/// token as of `refilled_at`, the row's lock the turn every start of its attempts takes.
#[derive(Debug)]
pub struct GateRow {
    /// Inserts the row of `key` with `tokens, refilled_at` unless it exists; parameters
    /// `key, tokens, refilled_at`.
    pub new: &'static str,
    /// `tokens, refilled_at` of the row of `key`, locked where rows lock.
    pub lock: &'static str,
    /// [`Self::lock`], but no row when another transaction holds it (`SKIP LOCKED`)
    /// instead of waiting for it.
    pub try_lock: &'static str,
    /// [`Self::lock`] without the lock: whether the row exists, read without waiting for
    /// whoever holds it.
    pub peek: &'static str,
    /// Sets the bucket of `key`; parameters `tokens, refilled_at, key`.
    pub save: &'static str,
}

pub async fn get<DB>(pool: &Pool<DB>, queries: &Queries, id: &str) -> Result<Option<TaskRecord>>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'r> TaskRow: FromRow<'r, DB::Row>,
    for<'r> (String,): FromRow<'r, DB::Row>,
{
    let Some(row) = sqlx::query_as::<DB, TaskRow>(queries.get)
        .bind(id)
        .fetch_optional(pool)
        .await?
    else {
        return Ok(None);
    };
    let mut task = row.into_record()?;
    task.depends_on = sqlx::query_scalar::<DB, String>(queries.dependencies)
        .bind(id)
        .fetch_all(pool)
        .await?;
    Ok(Some(task))
}

pub async fn lapsed_leases<DB>(
    pool: &Pool<DB>,
    queries: &Queries,
    now: Millis,
    limit: u32,
) -> Result<Vec<Lapsed>>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> LapsedRow: FromRow<'r, DB::Row>,
{
    let rows = sqlx::query_as::<DB, LapsedRow>(queries.lapsed_leases)
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(pool)
        .await?;
    rows.into_iter().map(LapsedRow::into_lapsed).collect()
}

pub async fn heartbeat_member<DB>(
    pool: &Pool<DB>,
    queries: &Queries,
    member: &str,
    now: Millis,
    shares: &Shares,
) -> Result<()>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
{
    let shares = serde_json::to_string(shares).expect("a map of strings to numbers");
    sqlx::query::<DB>(queries.heartbeat)
        .bind(member)
        .bind(now)
        .bind(shares.as_str())
        .execute(pool)
        .await?;
    sqlx::query::<DB>(queries.forget_members)
        .bind(now.saturating_sub(MEMBER_RETENTION))
        .execute(pool)
        .await?;
    Ok(())
}

/// The heartbeat, the forgetting of silent members and the live members, in one
/// statement where the dialect has it.
pub async fn heartbeat_and_list_members<DB>(
    pool: &Pool<DB>,
    queries: &Queries,
    member: &str,
    now: Millis,
    shares: &Shares,
    live_since: Millis,
) -> Result<Vec<String>>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'r> (String,): FromRow<'r, DB::Row>,
{
    let Some(statement) = queries.heartbeat_and_live else {
        heartbeat_member(pool, queries, member, now, shares).await?;
        return live_members(pool, queries, live_since).await;
    };
    let shares = serde_json::to_string(shares).expect("a map of strings to numbers");
    Ok(sqlx::query_scalar::<DB, String>(statement)
        .bind(member)
        .bind(now)
        .bind(shares.as_str())
        .bind(now.saturating_sub(MEMBER_RETENTION))
        .bind(live_since)
        .fetch_all(pool)
        .await?)
}

pub async fn live_members<DB>(
    pool: &Pool<DB>,
    queries: &Queries,
    since: Millis,
) -> Result<Vec<String>>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'r> (String,): FromRow<'r, DB::Row>,
{
    Ok(sqlx::query_scalar::<DB, String>(queries.live_members)
        .bind(since)
        .fetch_all(pool)
        .await?)
}

/// The sum, per task type, of the adaptive shares the members alive since `since`
/// published. A row that does not parse (written by some other version) counts as none.
pub async fn live_shares<DB>(
    pool: &Pool<DB>,
    queries: &Queries,
    since: Millis,
) -> Result<BTreeMap<String, u64>>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'r> (String,): FromRow<'r, DB::Row>,
{
    let rows = sqlx::query_scalar::<DB, String>(queries.live_shares)
        .bind(since)
        .fetch_all(pool)
        .await?;
    let mut sums = BTreeMap::new();
    for row in rows {
        let Ok(shares) = serde_json::from_str::<Shares>(&row) else {
            continue;
        };
        for (task_type, share) in shares {
            *sums.entry(task_type).or_insert(0) += u64::from(share);
        }
    }
    Ok(sums)
}

/// Appends `ids` as bound parameters and closes the `IN (` the statement ends with.
pub fn push_ids<DB>(query: &mut QueryBuilder<DB>, ids: &[String])
where
    DB: Database,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
{
    let mut list = query.separated(", ");
    for id in ids {
        list.push_bind(id.as_str());
    }
    query.push(")");
}

/// [`super::Store::purge`]: picks the tasks, then deletes them and the dependency edges
/// they own by id, in one transaction.
pub async fn purge<DB>(pool: &Pool<DB>, queries: &Queries, params: PurgeParams<'_>) -> Result<u64>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> (String,): FromRow<'r, DB::Row>,
{
    let mut tx = pool.begin().await?;
    let ids: Vec<String> = sqlx::query_scalar::<DB, String>(queries.purgeable)
        .bind(params.task_type)
        .bind(params.state.as_str())
        .bind(params.finished_before)
        .bind(i64::from(params.limit))
        .fetch_all(&mut *tx)
        .await?;
    if ids.is_empty() {
        // Ended here, not left to the drop: sqlx only queues the rollback of a dropped
        // transaction, and until the pooled connection is used again it holds the lock
        // InnoDB took on the first row past the range, which a later pick then skips.
        tx.commit().await?;
        return Ok(0);
    }
    for (table, column) in [("task_deps", "task_id"), ("tasks", "id")] {
        let mut delete =
            QueryBuilder::<DB>::new(format!("DELETE FROM {table} WHERE {column} IN ("));
        push_ids(&mut delete, &ids);
        delete.build().execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(ids.len() as u64)
}

/// [`super::Store::release_unique_keys`]: picks the tasks, then frees their keys by id,
/// in one transaction; the pick's condition is checked again by the update.
pub async fn release_unique_keys<DB>(
    pool: &Pool<DB>,
    queries: &Queries,
    now: Millis,
    limit: u32,
) -> Result<u64>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> (String,): FromRow<'r, DB::Row>,
{
    let mut tx = pool.begin().await?;
    let ids: Vec<String> = sqlx::query_scalar::<DB, String>(queries.unique_expired)
        .bind(now)
        .bind(i64::from(limit))
        .fetch_all(&mut *tx)
        .await?;
    if ids.is_empty() {
        // Ended here, not left to the drop: sqlx only queues the rollback of a dropped
        // transaction, and until the pooled connection is used again it holds the lock
        // InnoDB took on the first row past the range, which a later pick then skips.
        tx.commit().await?;
        return Ok(0);
    }
    let mut update =
        QueryBuilder::<DB>::new("UPDATE tasks SET unique_active = NULL WHERE unique_until <= ");
    update.push_bind(now).push(" AND id IN (");
    push_ids(&mut update, &ids);
    update.build().execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(ids.len() as u64)
}

/// [`super::Store::search`]: one statement with only the filters given, so each can use
/// its index (`tasks_created` leads with the type).
pub async fn search<DB>(pool: &Pool<DB>, params: SearchParams<'_>) -> Result<Vec<TaskRecord>>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> TaskRow: FromRow<'r, DB::Row>,
{
    let mut query = sqlx::QueryBuilder::<DB>::new(concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE 1 = 1"
    ));
    if let Some(task_type) = params.task_type {
        query.push(" AND task_type = ").push_bind(task_type);
    }
    if let Some(state) = params.state {
        // Written out, not bound: SQLite reads a partial index on the state (dead
        // tasks') only for a literal. The text is one of TaskState's own names.
        query.push(format!(" AND state = '{}'", state.as_str()));
    }
    if let Some(key) = params.unique_key {
        query.push(" AND unique_key = ").push_bind(key);
    }
    if let Some(after) = params.created_after {
        query.push(" AND created_at > ").push_bind(after);
    }
    if let Some(before) = params.eta_before {
        query.push(" AND trigger_at < ").push_bind(before);
    }
    if let Some((created, id)) = params.after {
        query
            .push(" AND (created_at < ")
            .push_bind(created)
            .push(" OR (created_at = ")
            .push_bind(created)
            .push(" AND id < ")
            .push_bind(id)
            .push("))");
    }
    query
        .push(" ORDER BY created_at DESC, id DESC LIMIT ")
        .push_bind(i64::from(params.limit));
    let rows: Vec<TaskRow> = query.build_query_as().fetch_all(pool).await?;
    rows.into_iter().map(TaskRow::into_record).collect()
}

pub async fn remove_member<DB>(pool: &Pool<DB>, queries: &Queries, member: &str) -> Result<()>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
{
    sqlx::query::<DB>(queries.remove_member)
        .bind(member)
        .execute(pool)
        .await?;
    Ok(())
}

pub async fn release_claims<DB>(
    pool: &Pool<DB>,
    queries: &Queries,
    owner: &str,
    now: Millis,
) -> Result<DB::QueryResult>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
{
    Ok(sqlx::query::<DB>(queries.release_claims)
        .bind(now)
        .bind(owner)
        .execute(pool)
        .await?)
}

pub async fn record_kafka_dead_letter<DB>(
    pool: &Pool<DB>,
    queries: &Queries,
    letter: &KafkaDeadLetter,
) -> Result<()>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> &'q [u8]: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
{
    sqlx::query::<DB>(queries.record_kafka_dead_letter)
        .bind(letter.topic.as_str())
        .bind(letter.partition)
        .bind(letter.offset)
        .bind(letter.message.as_slice())
        .bind(letter.message_size)
        .bind(letter.reason.as_str())
        .bind(letter.recorded_at)
        .execute(pool)
        .await?;
    Ok(())
}

/// A row of [`kafka_dead_letters`].
#[derive(sqlx::FromRow)]
pub struct KafkaDeadLetterRow {
    topic: String,
    kafka_partition: i32,
    kafka_offset: i64,
    message: Vec<u8>,
    message_size: i64,
    reason: String,
    recorded_at: Millis,
}

/// [`super::Store::kafka_dead_letters`]: one statement with only the filters given,
/// walking `kafka_dead_letters_recent` from the newest.
pub async fn kafka_dead_letters<DB>(
    pool: &Pool<DB>,
    params: KafkaDeadLetterParams<'_>,
) -> Result<Vec<KafkaDeadLetter>>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'r> KafkaDeadLetterRow: FromRow<'r, DB::Row>,
{
    let mut query = sqlx::QueryBuilder::<DB>::new(
        "SELECT topic, kafka_partition, kafka_offset, message, message_size, reason, \
         recorded_at FROM kafka_dead_letters WHERE 1 = 1",
    );
    if let Some(topic) = params.topic {
        query.push(" AND topic = ").push_bind(topic);
    }
    if let Some(after) = params.after {
        // Strictly after `after` in the listing's order, spelt out rather than as a row
        // comparison, which not every backend's planner turns into an index range.
        query
            .push(" AND (recorded_at < ")
            .push_bind(after.recorded_at)
            .push(" OR (recorded_at = ")
            .push_bind(after.recorded_at)
            .push(" AND (topic < ")
            .push_bind(after.topic)
            .push(" OR (topic = ")
            .push_bind(after.topic)
            .push(" AND (kafka_partition < ")
            .push_bind(after.partition)
            .push(" OR (kafka_partition = ")
            .push_bind(after.partition)
            .push(" AND kafka_offset < ")
            .push_bind(after.offset)
            .push("))))))");
    }
    query
        .push(
            " ORDER BY recorded_at DESC, topic DESC, kafka_partition DESC, kafka_offset DESC \
             LIMIT ",
        )
        .push_bind(i64::from(params.limit));
    let rows: Vec<KafkaDeadLetterRow> = query.build_query_as().fetch_all(pool).await?;
    Ok(rows
        .into_iter()
        .map(|row| KafkaDeadLetter {
            topic: row.topic,
            partition: row.kafka_partition,
            offset: row.kafka_offset,
            message: row.message,
            message_size: row.message_size,
            reason: row.reason,
            recorded_at: row.recorded_at,
        })
        .collect())
}

//! Bulk dead-letter actions (`POST /v1/dead-letters/redrive` and `…/purge`), written once
//! over any sqlx [`Database`]: the filter is built with [`QueryBuilder`], so only the
//! conditions given reach the statement and each backend's placeholders come out right.
//!
//! Every call acts on at most `limit` dead letters, oldest death first, in statements
//! that touch only those rows: a bulk action over millions of dead letters is many short
//! passes, never one long lock. A pass is idempotent — what it acted on no longer
//! matches — so a client resumes an interrupted action by running it again.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, QueryBuilder, Type};

use super::shared::push_ids;
use super::tx::Dialect;
use super::{BulkAction, DeadCount, DeadFilter, Millis, Result};

/// Appends the conditions of `filter` (every match, actionable or not) to a statement
/// that already has a `WHERE`.
fn push_filter<DB>(query: &mut QueryBuilder<DB>, filter: &DeadFilter<'_>)
where
    DB: Database,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
{
    query
        // The repeated state term lets SQLite read the partial tasks_finished.
        .push(
            " tasks.state = 'dead' AND tasks.state IN ('succeeded', 'cancelled', 'dead') \
             AND tasks.task_type = ",
        )
        .push_bind(filter.task_type)
        .push(" AND tasks.updated_at < ")
        .push_bind(filter.dead_before);
    if let Some(after) = filter.dead_after {
        query.push(" AND tasks.updated_at >= ").push_bind(after);
    }
    if let Some(prefix) = filter.error_prefix {
        // A comparison of the leading characters rather than LIKE: the prefix is the
        // caller's text, and `%` or `_` in it must mean themselves. An error prefix is
        // capped far below i32::MAX characters by the API.
        let chars = i32::try_from(prefix.chars().count()).unwrap_or(i32::MAX);
        query
            .push(" AND substr(tasks.last_error, 1, ")
            .push_bind(chars)
            .push(") = ")
            .push_bind(prefix);
    }
}

/// Appends what makes a match actionable for `action`.
fn push_actionable<DB: Database>(query: &mut QueryBuilder<DB>, action: BulkAction) {
    query.push(match action {
        // The redrive would take the unique key back; while another task holds it, the
        // redrive is refused (409 for one task), so the bulk action leaves it.
        BulkAction::Redrive => {
            " AND (tasks.unique_key IS NULL OR NOT EXISTS \
               (SELECT 1 FROM tasks holder WHERE holder.unique_active = tasks.unique_key \
                 AND holder.task_type = tasks.task_type))"
        }
        // Its blocked dependents would never be released without it (as retention).
        BulkAction::Purge => {
            " AND NOT EXISTS (SELECT 1 FROM task_deps d JOIN tasks c ON c.id = d.task_id \
               WHERE d.depends_on = tasks.id AND c.state = 'blocked')"
        }
    });
}

/// [`super::Store::count_dead`].
pub async fn count<DB>(pool: &Pool<DB>, filter: DeadFilter<'_>) -> Result<DeadCount>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'r> (i64,): FromRow<'r, DB::Row>,
{
    let mut counts = [0u64; 2];
    for (actionable, count) in [false, true].into_iter().zip(counts.iter_mut()) {
        let mut query = QueryBuilder::<DB>::new("SELECT COUNT(*) FROM tasks WHERE");
        push_filter(&mut query, &filter);
        if actionable {
            push_actionable(&mut query, filter.action);
        }
        let (n,): (i64,) = query.build_query_as().fetch_one(pool).await?;
        *count = u64::try_from(n).unwrap_or_default();
    }
    Ok(DeadCount {
        matched: counts[0],
        actionable: counts[1],
    })
}

/// The ids of up to `limit` actionable matches, oldest death first; `lock` ends the
/// statement when it runs inside the transaction that acts on them.
async fn pick<'e, DB, E>(
    executor: E,
    filter: DeadFilter<'_>,
    limit: u32,
    lock: &str,
) -> Result<Vec<String>>
where
    DB: Database,
    E: Executor<'e, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> (String,): FromRow<'r, DB::Row>,
{
    let mut query = QueryBuilder::<DB>::new("SELECT tasks.id FROM tasks WHERE");
    push_filter(&mut query, &filter);
    push_actionable(&mut query, filter.action);
    query
        .push(" ORDER BY tasks.updated_at, tasks.id LIMIT ")
        .push_bind(i64::from(limit))
        .push(lock);
    let rows: Vec<(String,)> = query.build_query_as().fetch_all(executor).await?;
    Ok(rows.into_iter().map(|(id,)| id).collect())
}

/// Redrives the picked dead letters that have no dependencies with one UPDATE, as
/// [`super::Store::redrive`] does each: pending, due `now`, attempts reset, the unique
/// key taken back. Returns the picked ids and how many the UPDATE redrove: `None` when
/// it hit a unique key (two of them share one, or another task took one since the pick)
/// and changed nothing. The caller redrives what is left one by one.
pub async fn redrive_picked<D, DB>(
    pool: &Pool<DB>,
    filter: DeadFilter<'_>,
    limit: u32,
    now: Millis,
) -> Result<(Vec<String>, Option<u64>)>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> (String,): FromRow<'r, DB::Row>,
{
    let ids = pick(pool, filter, limit, "").await?;
    if ids.is_empty() {
        return Ok((ids, Some(0)));
    }
    let mut update =
        QueryBuilder::<DB>::new("UPDATE tasks SET state = 'pending', attempt = 0, trigger_at = ");
    update
        .push_bind(now)
        .push(
            ", lease_token = lease_token + 1, unique_active = unique_key, \
             lease_until = NULL, updated_at = ",
        )
        .push_bind(now)
        // A task with dependencies may have to go back to `blocked`: the caller redrives
        // those one at a time, as the single redrive does.
        .push(
            " WHERE state = 'dead' \
             AND NOT EXISTS (SELECT 1 FROM task_deps d WHERE d.task_id = tasks.id) AND id IN (",
        );
    push_ids(&mut update, &ids);
    match update.build().execute(pool).await {
        Ok(done) => Ok((ids, Some(D::rows_affected(&done)))),
        Err(err) if super::is_unique_violation(&err) => Ok((ids, None)),
        Err(err) => Err(err.into()),
    }
}

/// Deletes up to `limit` actionable matches and the dependency edges they own, in one
/// transaction that locks exactly the rows it deletes.
pub async fn purge<D, DB>(pool: &Pool<DB>, filter: DeadFilter<'_>, limit: u32) -> Result<u64>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> (String,): FromRow<'r, DB::Row>,
{
    let mut tx = pool.begin().await?;
    let ids = pick(&mut *tx, filter, limit, D::QUERIES.skip_locked).await?;
    if ids.is_empty() {
        return Ok(0);
    }
    let mut deleted = 0;
    for (table, column) in [("task_deps", "task_id"), ("tasks", "id")] {
        let mut delete =
            QueryBuilder::<DB>::new(format!("DELETE FROM {table} WHERE {column} IN ("));
        push_ids(&mut delete, &ids);
        let done = delete.build().execute(&mut *tx).await?;
        deleted = D::rows_affected(&done);
    }
    tx.commit().await?;
    Ok(deleted)
}

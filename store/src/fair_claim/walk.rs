//! The statements of the fair claim by rank, written once for every SQL dialect. Each
//! reads index ranges, never a job's whole backlog:
//! - [`held`]: the job's attempts in flight per key (at most its concurrency);
//! - [`keys`]: a skip-scan over the keys with pending tasks in key order (a recursive
//!   query, one index probe per key: the key after the last one), each with its best due
//!   task (one more probe);
//! - [`tenants`]: the same skip-scan, a tenant at a time (`tenant␟key` keys sort by
//!   tenant first);
//! - [`more_of`]: a few keys' next due tasks, for the turns after the first;
//! - [`keyless`]: the job's due tasks without a key, among the first [`KEYLESS_WINDOW`]
//!   by rank.
//!
//! On SQLite and PostgreSQL they read `tasks_keyed` (type, key, rank) over the active
//! keyed tasks, and on MariaDB `tasks_keyed` (type, state, key, rank) since migration
//! 0027, so the pending keys are one range there too; [`crate::tx::keyed_walk::KeyedWalk`] says how
//! each dialect is kept to that index.

use std::ops::Bound;

#[cfg(test)]
use sqlx::Sqlite;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, QueryBuilder, Type};

use crate::rows;
use crate::tx::{Conn, Dialect};
use crate::{ClaimParams, Millis, Result};

/// How far back by rank the claim looks for tasks without a key (a job's tasks from
/// before it had a `concurrencyKey`): found through the type's pending tasks in rank
/// order, so a bounded window keeps that read from growing with the keyed backlog.
pub(super) const KEYLESS_WINDOW: u32 = 256;

/// Where a walk starts and stops, comparing keys byte for byte.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span<'a> {
    pub from: Bound<&'a str>,
    pub to: Bound<&'a str>,
}

/// The least key past all of `tenant`'s: U+0020 is the character after the U+001F
/// separator, so every `tenant␟…` key sorts below it and every later tenant's at or
/// above it.
pub(super) fn after_tenant(tenant: &str) -> String {
    format!("{tenant} ")
}

/// The first key of `tenant`'s.
pub(super) fn tenant_start(tenant: &str) -> String {
    format!("{tenant}{}", asyncd_spec::TENANT_SEPARATOR)
}

/// How the skip-scan steps from one key to the next.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// To the next key.
    Key,
    /// To the next tenant's first key.
    Tenant,
}

/// The attempts in flight (claimed or running) of `task_type` per key; `None` counts
/// those without a key.
pub(super) async fn held<D, DB>(
    conn: &mut Conn<D>,
    task_type: &str,
) -> Result<Vec<(Option<rows::Key>, i64)>>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'r> (Option<rows::Key>, i64): FromRow<'r, DB::Row>,
{
    Ok(held_query::<DB>(task_type)
        .build_query_as()
        .fetch_all(&mut *conn)
        .await?)
}

fn held_query<DB>(task_type: &str) -> QueryBuilder<DB>
where
    DB: Database,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
{
    // One range per state: an `IN` over both would let a never-analysed PostgreSQL
    // table read the type's every active task for them.
    let mut query = QueryBuilder::<DB>::new("SELECT concurrency_key, COUNT(*) FROM (");
    for (i, state) in ["claimed", "running"].into_iter().enumerate() {
        if i > 0 {
            query.push(" UNION ALL ");
        }
        query
            .push("SELECT concurrency_key FROM tasks WHERE task_type = ")
            .push_bind(task_type)
            .push(format!(
                " AND state IN ('pending', 'claimed', 'running') AND state = '{state}'"
            ));
    }
    query.push(") held GROUP BY concurrency_key");
    query
}

/// Up to `max` keys of `task_type` with tasks within `span` (active ones; on MariaDB
/// pending ones), in key order, each with its best due task (by rank, then id) unless it
/// has none or is cooling down.
pub(super) async fn keys<D, DB>(
    conn: &mut Conn<D>,
    task_type: &str,
    span: Span<'_>,
    max: u32,
    params: &ClaimParams<'_>,
) -> Result<Vec<(rows::Key, Option<String>)>>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> &'q D::Key: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> (rows::Key, Option<String>): FromRow<'r, DB::Row>,
    for<'r> (rows::Key, i64): FromRow<'r, DB::Row>,
    for<'r> (String, Option<rows::Key>): FromRow<'r, DB::Row>,
{
    if D::KEYED_WALK.stepwise {
        let ranked = ranged::<D, DB>(conn, task_type, span, max, Step::Key).await?;
        let due: Vec<&str> = ranked
            .iter()
            .filter(|(_, rank)| *rank <= params.horizon.as_i64())
            .map(|(key, _)| key.as_str())
            .collect();
        let mut firsts: std::collections::HashMap<String, String> = Default::default();
        if !due.is_empty() {
            let found: Vec<(String, Option<rows::Key>)> =
                firsts_query::<D, DB>(task_type, &due, params)
                    .build_query_as()
                    .fetch_all(&mut *conn)
                    .await?;
            firsts.extend(found.into_iter().filter_map(|(id, key)| Some((key?.0, id))));
        }
        return Ok(ranked
            .into_iter()
            .map(|(key, _)| {
                let first = firsts.remove(&key);
                (rows::Key(key), first)
            })
            .collect());
    }
    Ok(keys_query::<D, DB>(task_type, span, max, params)
        .build_query_as()
        .fetch_all(&mut *conn)
        .await?)
}

/// [`keys`] in one recursive statement.
fn keys_query<D, DB>(
    task_type: &str,
    span: Span<'_>,
    max: u32,
    params: &ClaimParams<'_>,
) -> QueryBuilder<DB>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> &'q D::Key: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let mut query = skip_scan::<D, DB>(task_type, span, max, Step::Key);
    query.push(" SELECT k, ");
    push_first_due::<D, DB>(&mut query, "walk.k", task_type, params);
    query.push(" FROM walk WHERE k IS NOT NULL");
    push_below::<D, DB>(&mut query, "k", span.to);
    query
}

/// The best due task of the key in `column`, unless it is cooling down, as a scalar
/// subquery.
fn push_first_due<D, DB>(
    query: &mut QueryBuilder<DB>,
    column: &str,
    task_type: &str,
    params: &ClaimParams<'_>,
) where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
{
    let walk = D::KEYED_WALK;
    query
        .push(format!("(SELECT id FROM {} WHERE task_type = ", walk.table))
        .push_bind(task_type)
        .push(format!(" AND {} AND {}", walk.walked, walk.pending))
        .push(format!(
            " AND concurrency_key = {column} AND claim_rank <= "
        ))
        .push_bind(params.horizon)
        .push(format!(" AND {} <= ", walk.trigger_at))
        .push_bind(params.horizon)
        // A key cooling down waits (`key_cooldowns`' primary key).
        .push(" AND NOT EXISTS (SELECT 1 FROM key_cooldowns c WHERE c.task_type = ")
        .push_bind(task_type)
        .push(format!(
            " AND c.concurrency_key = {column} AND c.ends_at > "
        ))
        .push_bind(params.now)
        .push(") ORDER BY claim_rank, id LIMIT 1)");
}

/// How many index entries one statement of a MariaDB walk reads, at most.
const RANGE_READ: u32 = 1_024;

/// [`KeyedWalk::stepwise`](crate::tx::keyed_walk::KeyedWalk::stepwise) (MariaDB): up to `max` keys
/// within `span` (with [`Step::Tenant`], the first key of each tenant), in order, each
/// with its best pending task's rank, from runs of `tasks_keyed`'s entries in (key, rank)
/// order of at most [`RANGE_READ`] a statement. A statement yields every key whose
/// entries it reads, and at least one, since the next starts past the last key (or
/// tenant) it read: a deep key costs one statement, a run of shallow keys shares one.
async fn ranged<D, DB>(
    conn: &mut Conn<D>,
    task_type: &str,
    span: Span<'_>,
    max: u32,
    step: Step,
) -> Result<Vec<(String, i64)>>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> &'q D::Key: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> (rows::Key, i64): FromRow<'r, DB::Row>,
{
    let walk = D::KEYED_WALK;
    let mut found: Vec<(String, i64)> = Vec::new();
    let mut next_from: Option<String> = None;
    while (found.len() as u32) < max {
        let from = match (&next_from, step) {
            (None, _) => span.from,
            (Some(key), Step::Key) => Bound::Excluded(key.as_str()),
            (Some(bound), Step::Tenant) => Bound::Included(bound.as_str()),
        };
        let mut query = QueryBuilder::<DB>::new(format!(
            "SELECT concurrency_key, claim_rank FROM {} WHERE task_type = ",
            walk.table
        ));
        query.push_bind(task_type).push(" AND ").push(walk.walked);
        push_from::<D, DB>(&mut query, from);
        push_below::<D, DB>(&mut query, "concurrency_key", span.to);
        query
            .push(" ORDER BY concurrency_key, claim_rank LIMIT ")
            .push_bind(i64::from(RANGE_READ));
        let entries: Vec<(rows::Key, i64)> = query.build_query_as().fetch_all(&mut *conn).await?;
        let read_all = (entries.len() as u32) < RANGE_READ;
        let mut last: Option<String> = None;
        for (key, rank) in entries {
            let same = last.as_deref().is_some_and(|last| match step {
                Step::Key => last == key.0,
                Step::Tenant => tenant_of(last) == tenant_of(&key.0),
            });
            if !same && (found.len() as u32) < max {
                found.push((key.0.clone(), rank));
            }
            last = Some(key.0);
        }
        let Some(last) = last else { break };
        if read_all {
            break;
        }
        next_from = Some(match step {
            Step::Key => last,
            Step::Tenant => after_tenant(tenant_of(&last)),
        });
    }
    Ok(found)
}

/// Each of `keys`' best due task, unless the key is cooling down, as `(id, key)`: one
/// `LIMIT 1` range per key.
fn firsts_query<D, DB>(task_type: &str, keys: &[&str], params: &ClaimParams<'_>) -> QueryBuilder<DB>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> &'q D::Key: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
{
    let walk = D::KEYED_WALK;
    let mut query = QueryBuilder::<DB>::new("");
    for (i, key) in keys.iter().enumerate() {
        if i > 0 {
            query.push(" UNION ALL ");
        }
        query
            .push(format!(
                "SELECT id, concurrency_key FROM (SELECT id, concurrency_key FROM {} \
                 WHERE task_type = ",
                walk.table
            ))
            .push_bind(task_type)
            .push(format!(" AND {} AND {}", walk.walked, walk.pending))
            .push(" AND concurrency_key = ")
            .push_bind(D::key(key))
            .push(" AND claim_rank <= ")
            .push_bind(params.horizon)
            .push(format!(" AND {} <= ", walk.trigger_at))
            .push_bind(params.horizon)
            .push(" AND NOT EXISTS (SELECT 1 FROM key_cooldowns c WHERE c.task_type = ")
            .push_bind(task_type)
            .push(" AND c.concurrency_key = ")
            .push_bind(D::key(key))
            .push(" AND c.ends_at > ")
            .push_bind(params.now)
            .push(format!(") ORDER BY claim_rank, id LIMIT 1) first{i}"));
    }
    query
}

fn push_from<D, DB>(query: &mut QueryBuilder<DB>, from: Bound<&str>)
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'q> &'q D::Key: Encode<'q, DB> + Type<DB>,
{
    match from {
        Bound::Included(from) => query
            .push(" AND concurrency_key >= ")
            .push_bind(D::key(from)),
        Bound::Excluded(from) => query
            .push(" AND concurrency_key > ")
            .push_bind(D::key(from)),
        // Every key is at least the empty one; a range, not `IS NOT NULL`, so that a
        // never-analysed PostgreSQL table still reads the walk's start from tasks_keyed
        // rather than sorting the type's active tasks.
        Bound::Unbounded => query.push(" AND concurrency_key >= ''"),
    };
}

/// Up to `max` tenants of `task_type` with tasks within `span` (as [`keys`] walks
/// them), in order, each as its first such key.
pub(super) async fn tenants<D, DB>(
    conn: &mut Conn<D>,
    task_type: &str,
    span: Span<'_>,
    max: u32,
) -> Result<Vec<(rows::Key,)>>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> &'q D::Key: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> (rows::Key,): FromRow<'r, DB::Row>,
    for<'r> (rows::Key, i64): FromRow<'r, DB::Row>,
{
    if D::KEYED_WALK.stepwise {
        let ranked = ranged::<D, DB>(conn, task_type, span, max, Step::Tenant).await?;
        return Ok(ranked
            .into_iter()
            .map(|(key, _)| (rows::Key(key),))
            .collect());
    }
    Ok(tenants_query::<D, DB>(task_type, span, max)
        .build_query_as()
        .fetch_all(&mut *conn)
        .await?)
}

/// [`tenants`] in one recursive statement.
fn tenants_query<D, DB>(task_type: &str, span: Span<'_>, max: u32) -> QueryBuilder<DB>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> &'q D::Key: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let mut query = skip_scan::<D, DB>(task_type, span, max, Step::Tenant);
    query.push(" SELECT k FROM walk WHERE k IS NOT NULL");
    push_below::<D, DB>(&mut query, "k", span.to);
    query
}

/// The tenant of a `tenant␟key` key.
pub(super) fn tenant_of(key: &str) -> &str {
    key.split(asyncd_spec::TENANT_SEPARATOR)
        .next()
        .unwrap_or("")
}

/// `WITH RECURSIVE walk (k, n) AS (…)`: the keys of the skip-scan, at most `max`, the
/// last a NULL where the keys ran out; the caller selects from `walk`.
fn skip_scan<D, DB>(task_type: &str, span: Span<'_>, max: u32, step: Step) -> QueryBuilder<DB>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> &'q D::Key: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let walk = D::KEYED_WALK;
    let mut query = QueryBuilder::<DB>::new(format!(
        "WITH RECURSIVE walk (k, n) AS (SELECT (SELECT concurrency_key FROM {} \
         WHERE task_type = ",
        walk.table
    ));
    query.push_bind(task_type).push(" AND ").push(walk.walked);
    push_from::<D, DB>(&mut query, span.from);
    query
        .push(format!(
            " ORDER BY concurrency_key LIMIT 1), 1 \
             UNION ALL SELECT (SELECT concurrency_key FROM {} WHERE task_type = ",
            walk.table
        ))
        .push_bind(task_type)
        .push(" AND ")
        .push(walk.walked);
    match step {
        Step::Key => query.push(" AND concurrency_key > walk.k"),
        Step::Tenant => query
            .push(" AND concurrency_key >= ")
            .push((D::KEYED_WALK.after_tenant_of)("walk.k")),
    };
    query
        .push(" ORDER BY concurrency_key LIMIT 1), walk.n + 1 FROM walk WHERE walk.k IS NOT NULL AND walk.n < ")
        .push_bind(i64::from(max));
    push_below::<D, DB>(&mut query, "walk.k", span.to);
    query.push(")");
    query
}

fn push_below<D, DB>(query: &mut QueryBuilder<DB>, column: &str, to: Bound<&str>)
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'q> &'q D::Key: Encode<'q, DB> + Type<DB>,
{
    match to {
        Bound::Included(to) => query
            .push(format!(" AND {column} <= "))
            .push_bind(D::key(to)),
        Bound::Excluded(to) => query
            .push(format!(" AND {column} < "))
            .push_bind(D::key(to)),
        Bound::Unbounded => query,
    };
}

/// Each of `wanted` keys' best due tasks, as many as asked, as `(id, key, rank)`; in no
/// particular order (the caller sorts each key's by rank, then id).
pub(super) async fn more_of<D, DB>(
    conn: &mut Conn<D>,
    task_type: &str,
    wanted: &[(&str, u32)],
    params: &ClaimParams<'_>,
) -> Result<Vec<(String, rows::Key, Millis)>>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> &'q D::Key: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> (String, rows::Key, Millis): FromRow<'r, DB::Row>,
{
    Ok(more_query::<D, DB>(task_type, wanted, params)
        .build_query_as()
        .fetch_all(&mut *conn)
        .await?)
}

fn more_query<D, DB>(
    task_type: &str,
    wanted: &[(&str, u32)],
    params: &ClaimParams<'_>,
) -> QueryBuilder<DB>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> &'q D::Key: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let walk = D::KEYED_WALK;
    let mut query = QueryBuilder::<DB>::new("");
    for (i, (key, count)) in wanted.iter().enumerate() {
        if i > 0 {
            query.push(" UNION ALL ");
        }
        query
            .push(format!(
                "SELECT id, concurrency_key, claim_rank FROM (SELECT id, concurrency_key, \
                 claim_rank FROM {} WHERE task_type = ",
                walk.table
            ))
            .push_bind(task_type)
            .push(format!(" AND {} AND {}", walk.walked, walk.pending))
            .push(" AND concurrency_key = ")
            .push_bind(D::key(key))
            .push(" AND claim_rank <= ")
            .push_bind(params.horizon)
            .push(format!(" AND {} <= ", walk.trigger_at))
            .push_bind(params.horizon)
            .push(" ORDER BY claim_rank, id LIMIT ")
            .push_bind(i64::from(*count))
            .push(format!(") more{i}"));
    }
    query
}

/// Up to `limit` due tasks of `task_type` without a key, best first, among its first
/// [`KEYLESS_WINDOW`] due tasks by rank.
pub(super) async fn keyless<D, DB>(
    conn: &mut Conn<D>,
    task_type: &str,
    limit: u32,
    params: &ClaimParams<'_>,
) -> Result<Vec<(String,)>>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> (String,): FromRow<'r, DB::Row>,
{
    let mut query = keyless_query::<D, DB>(task_type, limit, params);
    let Some(setting) = D::KEYED_WALK.keyless_setting else {
        return Ok(query.build_query_as().fetch_all(&mut *conn).await?);
    };
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    sqlx::query::<DB>(setting).execute(&mut *tx).await?;
    let found = query.build_query_as().fetch_all(&mut *tx).await?;
    tx.commit().await?;
    Ok(found)
}

fn keyless_query<D, DB>(task_type: &str, limit: u32, params: &ClaimParams<'_>) -> QueryBuilder<DB>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let mut query = QueryBuilder::<DB>::new(format!(
        "SELECT id FROM (SELECT id, concurrency_key, claim_rank FROM {} WHERE task_type = ",
        D::KEYED_WALK.pending_by_rank
    ));
    query
        .push_bind(task_type)
        .push(" AND state = 'pending' AND claim_rank <= ")
        .push_bind(params.horizon)
        .push(" AND trigger_at <= ")
        .push_bind(params.horizon)
        .push(" ORDER BY claim_rank, id LIMIT ")
        .push_bind(i64::from(KEYLESS_WINDOW))
        .push(") window_ WHERE concurrency_key IS NULL ORDER BY claim_rank, id LIMIT ")
        .push_bind(i64::from(limit));
    query
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::TypeFilter;
    use crate::sqlite::SqliteStore;

    /// The plan SQLite (the version sqlx bundles) chooses for each statement of the walk:
    /// every read of `tasks` an index search (never a scan of the table or of a type's
    /// tasks by state) and no sort, so none grows with the job's backlog but the keyless
    /// window, bounded by its `LIMIT`.
    #[tokio::test]
    async fn the_walks_statements_search_their_indexes_without_sorting() {
        let pool = crate::sqlite::tests::migrated_in_memory().await;
        let types = TypeFilter::Only(vec!["job".into()]);
        let params = ClaimParams {
            types: &types,
            horizon: Millis::new(1),
            now: Millis::new(1),
            hold: std::time::Duration::from_secs(1),
            owner: "plan",
            limit: 4,
            ahead: false,
        };
        let span = Span {
            from: Bound::Excluded("a"),
            to: Bound::Included("z"),
        };
        let keyed = "USING INDEX tasks_keyed (task_type=? AND concurrency_key>?)";
        let statements: Vec<(&str, QueryBuilder<Sqlite>, Vec<&str>)> = vec![
            (
                "held",
                held_query::<Sqlite>("job"),
                vec!["USING INDEX tasks_by_type_state (task_type=? AND state=?)"],
            ),
            (
                "keys",
                keys_query::<SqliteStore, Sqlite>("job", span, 8, &params),
                vec![
                    keyed,
                    "USING INDEX tasks_keyed (task_type=? AND concurrency_key=? AND claim_rank<?)",
                ],
            ),
            (
                "tenants",
                tenants_query::<SqliteStore, Sqlite>("job", span, 8),
                vec![keyed],
            ),
            (
                "more_of",
                more_query::<SqliteStore, Sqlite>("job", &[("a", 2), ("b", 3)], &params),
                vec![
                    "USING INDEX tasks_keyed (task_type=? AND concurrency_key=? AND claim_rank<?)",
                ],
            ),
            (
                "keyless",
                keyless_query::<SqliteStore, Sqlite>("job", 4, &params),
                vec!["USING INDEX tasks_ranked_by_type (task_type=? AND claim_rank<?)"],
            ),
        ];
        for (name, mut query, expected) in statements {
            let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "EXPLAIN QUERY PLAN {}",
                query.sql().as_str()
            )))
            .fetch_all(&pool)
            .await
            .unwrap();
            let details: Vec<&str> = plan.iter().map(|row| row.3.as_str()).collect();
            for expected in expected {
                assert!(
                    details.iter().any(|d| d.contains(expected)),
                    "{name}: {expected} in {details:?}"
                );
            }
            assert!(
                !details.iter().any(|d| d.starts_with("SCAN tasks")),
                "{name} scans: {details:?}"
            );
            assert!(
                !details.iter().any(|d| d.contains("TEMP B-TREE")) || name == "held",
                "{name} sorts: {details:?}"
            );
            let _ = query.reset();
        }
    }
}

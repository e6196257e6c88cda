//! The jobs overview's counts ([`super::Store::job_counts`]) and the backlog gauges' due
//! figures ([`super::Store::due_backlog`]): scalar subqueries on index ranges of one task
//! type, each count stopping at a cap, written once over any sqlx [`Database`].

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use super::rows::{DueBacklogRow, JobCountsRow};
use super::{DueBacklog, JobCountParams, JobCounts, Millis, Result};

/// One figure of [`job_counts`] or [`due_backlog`]: its alias, whether it is a minimum
/// rather than a count, its condition, and the instant the condition ends with.
pub(crate) type Figure = (&'static str, bool, &'static str, Option<Millis>);

// Each condition starts with the predicate of the partial index it walks
// (`tasks_by_type_state` or `tasks_finished`), word for word: SQLite uses a partial
// index only for a query that repeats its predicate; elsewhere the term is a no-op.
macro_rules! active {
    ($rest:literal) => {
        concat!("state IN ('pending', 'claimed', 'running') AND ", $rest)
    };
}
macro_rules! finished {
    ($rest:literal) => {
        concat!("state IN ('succeeded', 'cancelled', 'dead') AND ", $rest)
    };
}

fn due(now: Millis) -> Figure {
    (
        "due",
        false,
        active!("state IN ('pending', 'claimed') AND trigger_at <= "),
        Some(now),
    )
}

fn oldest_due(now: Millis) -> [Figure; 2] {
    [
        (
            "oldest_pending",
            true,
            active!("state = 'pending' AND trigger_at <= "),
            Some(now),
        ),
        (
            "oldest_claimed",
            true,
            active!("state = 'claimed' AND trigger_at <= "),
            Some(now),
        ),
    ]
}

/// [`super::Store::job_counts`]: one statement of scalar subqueries, each on an index
/// range that leads with the task type and the state. A count wraps a `LIMIT cap`
/// subquery, so it stops after `cap` index entries however many match; the two minimums
/// (one per waiting state) read the first entry of their range.
pub async fn job_counts<DB>(pool: &Pool<DB>, params: JobCountParams<'_>) -> Result<JobCounts>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> JobCountsRow: FromRow<'r, DB::Row>,
{
    let JobCountParams {
        now,
        finished_since,
        ..
    } = params;
    let [oldest_pending, oldest_claimed] = oldest_due(now);
    let figures = [
        due(now),
        (
            "scheduled",
            false,
            active!("state IN ('pending', 'claimed') AND trigger_at > "),
            Some(now),
        ),
        ("running", false, active!("state = 'running'"), None),
        ("dead", false, finished!("state = 'dead'"), None),
        oldest_pending,
        oldest_claimed,
        (
            "succeeded_since",
            false,
            finished!("state = 'succeeded' AND updated_at >= "),
            Some(finished_since),
        ),
        (
            "dead_since",
            false,
            finished!("state = 'dead' AND updated_at >= "),
            Some(finished_since),
        ),
    ];
    let row: JobCountsRow = fetch(pool, &figures, params).await?;
    Ok(row.into())
}

/// [`due_backlog`]'s figures.
pub(crate) fn due_figures(now: Millis) -> [Figure; 3] {
    let [oldest_pending, oldest_claimed] = oldest_due(now);
    [due(now), oldest_pending, oldest_claimed]
}

/// [`super::Store::due_backlog`]: [`job_counts`]' due figures alone.
pub async fn due_backlog<DB>(pool: &Pool<DB>, params: JobCountParams<'_>) -> Result<DueBacklog>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> DueBacklogRow: FromRow<'r, DB::Row>,
{
    let row: DueBacklogRow = fetch(pool, &due_figures(params.now), params).await?;
    Ok(row.into())
}

/// Runs [`figures_query`] and reads its one row.
async fn fetch<DB, Row>(
    pool: &Pool<DB>,
    figures: &[Figure],
    params: JobCountParams<'_>,
) -> Result<Row>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> Row: FromRow<'r, DB::Row> + Send + Unpin,
{
    Ok(figures_query::<DB>(figures, params)
        .build_query_as()
        .fetch_one(pool)
        .await?)
}

/// One `SELECT` of a scalar subquery per figure, on `params`' task type, each count
/// stopping at `params.cap`.
pub(crate) fn figures_query<'a, DB>(
    figures: &[Figure],
    params: JobCountParams<'a>,
) -> sqlx::QueryBuilder<DB>
where
    DB: Database,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let cap = i64::from(params.cap);
    let mut query = sqlx::QueryBuilder::<DB>::new("SELECT ");
    for (i, &(alias, min, condition, instant)) in figures.iter().enumerate() {
        if i > 0 {
            query.push(", ");
        }
        query.push(if min {
            "(SELECT MIN(trigger_at) FROM tasks WHERE task_type = "
        } else {
            "(SELECT COUNT(*) FROM (SELECT 1 AS one FROM tasks WHERE task_type = "
        });
        query
            .push_bind(params.task_type)
            .push(" AND ")
            .push(condition);
        if let Some(instant) = instant {
            query.push_bind(instant);
        }
        if !min {
            query
                .push(" LIMIT ")
                .push_bind(cap)
                .push(format_args!(") {alias}_rows"));
        }
        query.push(format_args!(") AS {alias}"));
    }
    query
}

/// [`super::Store::resting_keys`]: up to `limit` keys of `task_type` whose cooldown ends
/// after `now`, the latest ending first, through the primary key of `key_cooldowns`
/// (one job's rows: its resting keys and the ended ones retention has not purged yet).
pub async fn resting_keys<DB>(
    pool: &Pool<DB>,
    task_type: &str,
    now: Millis,
    limit: u32,
) -> Result<Vec<(String, Millis)>>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> (super::rows::Key, i64): FromRow<'r, DB::Row>,
{
    let mut query = sqlx::QueryBuilder::<DB>::new(
        "SELECT concurrency_key, ends_at FROM key_cooldowns WHERE task_type = ",
    );
    query
        .push_bind(task_type)
        .push(" AND ends_at > ")
        .push_bind(now)
        .push(" ORDER BY ends_at DESC, concurrency_key LIMIT ")
        .push_bind(i64::from(limit));
    let rows: Vec<(super::rows::Key, i64)> = query.build_query_as().fetch_all(pool).await?;
    Ok(rows
        .into_iter()
        .map(|(key, at)| (key.0, Millis::new(at)))
        .collect())
}

/// [`super::Store::usage`]: the keys or tenants of a keyed job with tasks claimed,
/// running or due, each counted once over at most `cap` active tasks (one grouped read of
/// `tasks_by_type_state`'s ranges), the busiest first.
pub(crate) async fn usage<D, DB>(
    pool: &Pool<DB>,
    task_type: &str,
    by: super::UsageBy,
    now: Millis,
    cap: u64,
    limit: u32,
) -> Result<Vec<super::UsageCounts>>
where
    D: crate::tx::Dialect<DB = DB>,
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> (super::rows::Key, i64, i64): FromRow<'r, DB::Row>,
{
    let of = match by {
        super::UsageBy::Key => "concurrency_key",
        super::UsageBy::Tenant => D::TENANT_OF_KEY,
    };
    // A task without a key (from before the job had one) is no key's nor tenant's.
    let mut query = sqlx::QueryBuilder::<DB>::new(format!(
        "SELECT of_, COUNT(CASE WHEN state <> 'pending' THEN 1 END) AS running, \
           COUNT(CASE WHEN state = 'pending' THEN 1 END) AS due \
         FROM (SELECT {of} AS of_, state FROM tasks WHERE {}",
        active!("task_type = ")
    ));
    query
        .push_bind(task_type)
        .push(" AND concurrency_key IS NOT NULL AND (state <> 'pending' OR trigger_at <= ")
        .push_bind(now)
        .push(") LIMIT ")
        .push_bind(i64::try_from(cap).unwrap_or(i64::MAX))
        .push(") active GROUP BY of_ ORDER BY running DESC, due DESC, of_ LIMIT ")
        .push_bind(i64::from(limit));
    let rows: Vec<(super::rows::Key, i64, i64)> = query.build_query_as().fetch_all(pool).await?;
    Ok(rows
        .into_iter()
        .map(|(of, running, due)| super::UsageCounts {
            of: of.0,
            running: u64::try_from(running).unwrap_or(0),
            due: u64::try_from(due).unwrap_or(0),
        })
        .collect())
}

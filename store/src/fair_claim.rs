//! The first step of [`Store::claim_fair`](crate::Store::claim_fair), written once for
//! every SQL dialect: which of a keyed job's pending tasks to claim, in turns of their
//! keys, leaving out the keys cooling down. The second step claims the picked ids.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use crate::rows;
use crate::tx::Dialect;
use crate::{ClaimParams, FairParams, Millis, Result};

/// `(id, concurrency_key)` of up to `params.limit` pending tasks of `task_type`, in the
/// order the fair claim takes them.
pub(crate) async fn pick<D, DB>(
    pool: &Pool<DB>,
    task_type: &str,
    params: &ClaimParams<'_>,
    fair: &FairParams<'_>,
) -> Result<Vec<(String, Option<rows::Key>)>>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> &'q D::Key: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'r> (String, Option<rows::Key>): FromRow<'r, DB::Row>,
{
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
        .push_bind(task_type)
        .push(
            " AND state IN ('pending', 'claimed', 'running') \
              AND (state <> 'pending' OR (claim_rank <= ",
        )
        .push_bind(params.horizon)
        .push(" AND trigger_at <= ")
        .push_bind(params.horizon)
        .push(")) ) ranked WHERE state = 'pending' AND turn <= ")
        .push_bind(i64::from(fair.per_key))
        // A key cooling down waits; a task without a key (from before the job was
        // keyed) matches no cooldown.
        .push(
            " AND NOT EXISTS (SELECT 1 FROM key_cooldowns c \
               WHERE c.task_type = ",
        )
        .push_bind(task_type)
        .push(" AND c.concurrency_key = ranked.concurrency_key AND c.ends_at > ")
        .push_bind(params.now)
        .push(") ORDER BY turn, CASE WHEN concurrency_key > ")
        .push_bind(D::key(fair.after.unwrap_or("")))
        .push(" THEN 0 ELSE 1 END, concurrency_key, claim_rank, id LIMIT ")
        .push_bind(i64::from(params.limit));
    Ok(query.build_query_as().fetch_all(pool).await?)
}

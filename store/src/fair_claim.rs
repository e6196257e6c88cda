//! The first step of [`Store::claim_fair`](crate::Store::claim_fair), written once for
//! every SQL dialect: which of a keyed job's pending tasks to claim, in turns of their
//! keys, leaving out the keys cooling down. The second step claims the picked ids.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use crate::rows;
use crate::tx::Dialect;
use crate::{ClaimParams, FairParams, KeyOrder, Millis, Result};

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
    let mut query = match fair.order {
        KeyOrder::Rank => by_rank::<DB>(task_type, params, fair),
        KeyOrder::Fifo { dead_blocks } => in_order::<DB>(task_type, params, dead_blocks),
    };
    // A key cooling down waits; a task without a key (from before the job was keyed)
    // matches no cooldown.
    query
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

/// [`KeyOrder::Rank`]: the job's active tasks, found through tasks_keyed (type, key,
/// rank), numbered within each key (`turn`), its claimed and running ones first: linear
/// in the job's due backlog (docs/design.md, "Per-key limits", on the cost). The keys
/// take each turn in rotation, starting after `after`. Ends inside the `WHERE` of the
/// ranked tasks.
fn by_rank<DB>(
    task_type: &str,
    params: &ClaimParams<'_>,
    fair: &FairParams<'_>,
) -> sqlx::QueryBuilder<DB>
where
    DB: Database,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
    for<'e> Millis: Encode<'e, DB> + Type<DB>,
    for<'e> i64: Encode<'e, DB> + Type<DB>,
{
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
        .push_bind(i64::from(fair.per_key));
    query
}

/// [`KeyOrder::Fifo`]: every active task of the job, due or not, numbered within its key
/// in submission order; only a key's first (`turn` 1) is taken, and only once it is
/// pending and due. A retry waiting for its time is pending, not due: it keeps its key's
/// first place and the key waits. With `dead_blocks`, a key whose dead task was
/// submitted before its first waits too (`tasks_dead_keyed`, migration 0023). Linear in
/// the job's active tasks, due or not.
fn in_order<DB>(
    task_type: &str,
    params: &ClaimParams<'_>,
    dead_blocks: bool,
) -> sqlx::QueryBuilder<DB>
where
    DB: Database,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
    for<'e> Millis: Encode<'e, DB> + Type<DB>,
    for<'e> i64: Encode<'e, DB> + Type<DB>,
{
    let mut query = sqlx::QueryBuilder::<DB>::new(
        "SELECT id, concurrency_key FROM (SELECT id, state, claim_rank, trigger_at, \
           created_at, concurrency_key, \
           ROW_NUMBER() OVER (PARTITION BY concurrency_key ORDER BY created_at, id) AS turn \
         FROM tasks WHERE task_type = ",
    );
    query
        .push_bind(task_type)
        .push(
            " AND state IN ('pending', 'claimed', 'running')) ranked \
             WHERE turn = 1 AND state = 'pending' AND claim_rank <= ",
        )
        .push_bind(params.horizon)
        .push(" AND trigger_at <= ")
        .push_bind(params.horizon);
    if dead_blocks {
        query
            .push(" AND NOT EXISTS (SELECT 1 FROM tasks d WHERE d.task_type = ")
            .push_bind(task_type)
            .push(
                " AND d.concurrency_key = ranked.concurrency_key AND d.state = 'dead' \
                 AND (d.created_at < ranked.created_at \
                   OR (d.created_at = ranked.created_at AND d.id < ranked.id)))",
            );
    }
    query
}

//! The first step of [`Store::claim_fair`](crate::Store::claim_fair), written once for
//! every SQL dialect: which of a keyed job's pending tasks to claim, in turns of their
//! keys (with `spec.fairness`, by the tenants' weights first), leaving out the keys
//! cooling down. The second step claims the picked ids.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use crate::rows;
use crate::tx::Dialect;
use asyncd_spec::TENANT_SEPARATOR;

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
    let mut query = match (fair.order, fair.tenants) {
        (KeyOrder::Rank, None) => by_rank::<DB>(task_type, params, fair),
        (KeyOrder::Rank, Some(_)) => by_tenant::<D, DB>(task_type, params, fair),
        (KeyOrder::Fifo { dead_blocks }, _) => in_order::<DB>(task_type, params, dead_blocks),
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
        .push(")");
    match fair.tenants {
        None => {
            query
                .push(" ORDER BY turn, CASE WHEN concurrency_key > ")
                .push_bind(D::key(fair.after.unwrap_or("")))
                .push(" THEN 0 ELSE 1 END, concurrency_key, claim_rank, id");
        }
        Some(tenants) => {
            // Weighted fair queuing: a tenant's n-th task finishes its share at n / w
            // (its virtual time); ties go round the tenants, starting after the last
            // tenant the previous claim took.
            let after = fair.after.unwrap_or("");
            let after = after.split(TENANT_SEPARATOR).next().unwrap_or("");
            query.push(" ORDER BY tenant_turn * 1.0 / ");
            if tenants.weights.is_empty() {
                query.push_bind(i64::from(tenants.default_weight));
            } else {
                query.push("(CASE tenant");
                for (tenant, weight) in tenants.weights {
                    query
                        .push(" WHEN ")
                        .push_bind(D::key(tenant))
                        .push(" THEN ")
                        .push_bind(i64::from(*weight));
                }
                query
                    .push(" ELSE ")
                    .push_bind(i64::from(tenants.default_weight))
                    .push(" END)");
            }
            query
                .push(", CASE WHEN tenant > ")
                .push_bind(D::key(after))
                .push(" THEN 0 ELSE 1 END, tenant, tenant_turn");
        }
    }
    query.push(" LIMIT ").push_bind(i64::from(params.limit));
    Ok(query.build_query_as().fetch_all(pool).await?)
}

/// [`KeyOrder::Rank`] with [`FairParams::tenants`]: the keys' turns as [`by_rank`]
/// numbers them, then each tenant's tasks numbered (`tenant_turn`) in the order of those
/// turns, its claimed and running tasks first, so a tenant with attempts in flight
/// comes after one without, and one holding `per_tenant` is not taken. Linear in the job's due backlog, like `by_rank`. Ends
/// inside the `WHERE` of the ranked tasks.
fn by_tenant<D, DB>(
    task_type: &str,
    params: &ClaimParams<'_>,
    fair: &FairParams<'_>,
) -> sqlx::QueryBuilder<DB>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'e> &'e str: Encode<'e, DB> + Type<DB>,
    for<'e> Millis: Encode<'e, DB> + Type<DB>,
    for<'e> i64: Encode<'e, DB> + Type<DB>,
{
    let mut query = sqlx::QueryBuilder::<DB>::new(format!(
        "SELECT id, concurrency_key FROM (SELECT id, state, claim_rank, concurrency_key, \
           tenant, ROW_NUMBER() OVER (PARTITION BY tenant \
             ORDER BY turn, concurrency_key, claim_rank, id) AS tenant_turn \
         FROM (SELECT id, state, claim_rank, concurrency_key, {} AS tenant, \
           ROW_NUMBER() OVER (PARTITION BY concurrency_key \
             ORDER BY CASE WHEN state = 'pending' THEN 1 ELSE 0 END, claim_rank, id) AS turn \
         FROM tasks WHERE task_type = ",
        D::TENANT_OF_KEY
    ));
    query
        .push_bind(task_type)
        .push(
            " AND state IN ('pending', 'claimed', 'running') \
              AND (state <> 'pending' OR (claim_rank <= ",
        )
        .push_bind(params.horizon)
        .push(" AND trigger_at <= ")
        .push_bind(params.horizon)
        .push(")) ) keyed WHERE turn <= ")
        .push_bind(i64::from(fair.per_key))
        .push(") ranked WHERE state = 'pending' AND tenant_turn <= ")
        .push_bind(i64::from(
            fair.tenants.map_or(u32::MAX, |tenants| tenants.per_tenant),
        ));
    query
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

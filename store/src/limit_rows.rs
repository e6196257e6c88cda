//! The limits rows the jobs overview and the fair claim read outside a start: a rate
//! limit's token bucket as the last start left it, and the tenants' weights set at
//! runtime (migration 0026), for [`Store`](crate::Store)'s methods in `sql_store.rs`.

use std::collections::BTreeMap;

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use crate::domain;
use crate::sql_store::Backend;
use crate::*;

/// [`Store::rate_bucket`](crate::Store::rate_bucket).
pub(crate) async fn rate_bucket<B>(store: &B, of: RateBucket<'_>) -> Result<Option<domain::Bucket>>
where
    B: Backend,
    for<'c> &'c sqlx::Pool<B::DB>: Executor<'c, Database = B::DB>,
    <B::DB as Database>::Arguments: IntoArguments<B::DB>,
    for<'q> &'q str: Encode<'q, B::DB> + Type<B::DB>,
    for<'r> (i64, i64): FromRow<'r, <B::DB as Database>::Row>,
{
    let (peek, key) = match of {
        RateBucket::Job(task_type) => (B::QUERIES.job_limits.peek, task_type),
        RateBucket::Limiter(id) => (B::QUERIES.limiters.peek, id),
    };
    let row: Option<(i64, i64)> = sqlx::query_as(peek)
        .bind(key)
        .fetch_optional(store.reader())
        .await?;
    Ok(row.map(|(milli_tokens, at)| domain::Bucket {
        milli_tokens,
        at: Millis::new(at),
    }))
}

/// [`Store::set_tenant_weight`](crate::Store::set_tenant_weight).
pub(crate) async fn set_tenant_weight<B>(
    store: &B,
    task_type: &str,
    tenant: &str,
    weight: Option<u32>,
    now: Millis,
) -> Result<bool>
where
    B: Backend,
    for<'c> &'c sqlx::Pool<B::DB>: Executor<'c, Database = B::DB>,
    <B::DB as Database>::Arguments: IntoArguments<B::DB>,
    for<'q> &'q str: Encode<'q, B::DB> + Type<B::DB>,
    for<'q> i64: Encode<'q, B::DB> + Type<B::DB>,
    for<'q> Millis: Encode<'q, B::DB> + Type<B::DB>,
{
    retrying(B::transient, || async {
        let done = match weight {
            Some(weight) => {
                sqlx::query::<B::DB>(B::QUERIES.set_tenant_weight)
                    .bind(task_type)
                    .bind(tenant)
                    .bind(i64::from(weight))
                    .bind(now)
                    .execute(store.writer())
                    .await?
            }
            None => {
                sqlx::query::<B::DB>(B::QUERIES.delete_tenant_weight)
                    .bind(task_type)
                    .bind(tenant)
                    .execute(store.writer())
                    .await?
            }
        };
        Ok(B::rows_affected(&done) > 0)
    })
    .await
}

/// [`Store::tenant_weights`](crate::Store::tenant_weights).
pub(crate) async fn tenant_weights<B>(store: &B, task_type: &str) -> Result<BTreeMap<String, u32>>
where
    B: Backend,
    for<'c> &'c sqlx::Pool<B::DB>: Executor<'c, Database = B::DB>,
    <B::DB as Database>::Arguments: IntoArguments<B::DB>,
    for<'q> &'q str: Encode<'q, B::DB> + Type<B::DB>,
    for<'r> (String, i64): FromRow<'r, <B::DB as Database>::Row>,
{
    let rows: Vec<(String, i64)> = sqlx::query_as(B::QUERIES.tenant_weights)
        .bind(task_type)
        .fetch_all(store.reader())
        .await?;
    Ok(rows
        .into_iter()
        .map(|(tenant, weight)| (tenant, u32::try_from(weight).unwrap_or(u32::MAX)))
        .collect())
}

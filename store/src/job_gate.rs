//! A job's limits as every start keeps them in total across dispatchers: its
//! `job_limits` row taken first (so starters take turns), the running attempts counted
//! under it, and the token bucket spent. Used by [`Store`](crate::Store)'s starts in
//! `sql_store.rs`, in the caller's transaction.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use crate::domain;
use crate::sql_store::Backend;
use crate::*;

/// Whether a start waits for the job's limits row while another transaction holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowLock {
    Wait,
    /// Begins nothing instead: for a start written with outcomes, which must not wait
    /// on another dispatcher's start to be committed (each outcome it holds is one a
    /// crash would run again).
    SkipIfHeld,
}

/// [`Store::start_due`]'s write, in the caller's transaction: the job's limits row
/// taken, then as many attempts begun as the limits admit.
pub(crate) async fn start_due_in<B>(
    conn: &mut <B::DB as Database>::Connection,
    params: StartDueParams<'_>,
    gate: &JobGate<'_>,
    lock: RowLock,
) -> Result<DueStarted>
where
    B: Backend,
    for<'c> &'c mut <B::DB as Database>::Connection: Executor<'c, Database = B::DB>,
    <B::DB as Database>::Arguments: IntoArguments<B::DB>,
    for<'q> &'q str: Encode<'q, B::DB> + Type<B::DB>,
    for<'q> i64: Encode<'q, B::DB> + Type<B::DB>,
    for<'q> Millis: Encode<'q, B::DB> + Type<B::DB>,
    for<'r> (i64,): FromRow<'r, <B::DB as Database>::Row>,
    for<'r> (i64, i64): FromRow<'r, <B::DB as Database>::Row>,
    for<'r> (i64, i64, i64): FromRow<'r, <B::DB as Database>::Row>,
{
    let Some((bucket, running)) = take_gate::<B>(&mut *conn, gate, params.now, lock).await? else {
        return Ok(DueStarted {
            tasks: Vec::new(),
            held_by: None,
        });
    };
    let admission = domain::admit(
        params.limit as usize,
        running,
        gate.concurrency,
        gate.rate,
        bucket,
        params.now,
    );
    let tasks = match u32::try_from(admission.allowed) {
        Ok(0) | Err(_) => Vec::new(),
        Ok(allowed) => {
            B::start_due_on(
                &mut *conn,
                gate.task_type,
                StartDueParams {
                    limit: allowed,
                    ..params
                },
            )
            .await?
        }
    };
    spend_tokens::<B>(&mut *conn, gate, admission.bucket, tasks.len()).await?;
    Ok(DueStarted {
        tasks,
        held_by: admission.held_by,
    })
}

/// Takes `gate`'s `job_limits` row lock, so dispatchers beginning the job's attempts
/// take turns, and reads its token bucket and the type's running attempts under it.
pub(crate) async fn lock_gate<B>(
    conn: &mut <B::DB as Database>::Connection,
    gate: &JobGate<'_>,
    now: Millis,
) -> Result<(domain::Bucket, i64)>
where
    B: Backend,
    for<'c> &'c mut <B::DB as Database>::Connection: Executor<'c, Database = B::DB>,
    <B::DB as Database>::Arguments: IntoArguments<B::DB>,
    for<'q> &'q str: Encode<'q, B::DB> + Type<B::DB>,
    for<'q> i64: Encode<'q, B::DB> + Type<B::DB>,
    for<'q> Millis: Encode<'q, B::DB> + Type<B::DB>,
    for<'r> (i64,): FromRow<'r, <B::DB as Database>::Row>,
    for<'r> (i64, i64): FromRow<'r, <B::DB as Database>::Row>,
    for<'r> (i64, i64, i64): FromRow<'r, <B::DB as Database>::Row>,
{
    let taken = take_gate::<B>(conn, gate, now, RowLock::Wait).await?;
    taken.ok_or_else(|| StoreError::Corrupt(format!("no job_limits row for {:?}", gate.task_type)))
}

/// [`lock_gate`]; with [`RowLock::SkipIfHeld`], `None` while another transaction holds
/// the row (or it does not exist yet: a waiting start makes it).
async fn take_gate<B>(
    conn: &mut <B::DB as Database>::Connection,
    gate: &JobGate<'_>,
    now: Millis,
    lock: RowLock,
) -> Result<Option<(domain::Bucket, i64)>>
where
    B: Backend,
    for<'c> &'c mut <B::DB as Database>::Connection: Executor<'c, Database = B::DB>,
    <B::DB as Database>::Arguments: IntoArguments<B::DB>,
    for<'q> &'q str: Encode<'q, B::DB> + Type<B::DB>,
    for<'q> i64: Encode<'q, B::DB> + Type<B::DB>,
    for<'q> Millis: Encode<'q, B::DB> + Type<B::DB>,
    for<'r> (i64,): FromRow<'r, <B::DB as Database>::Row>,
    for<'r> (i64, i64): FromRow<'r, <B::DB as Database>::Row>,
    for<'r> (i64, i64, i64): FromRow<'r, <B::DB as Database>::Row>,
{
    let q = &B::QUERIES;
    let read =
        async |conn: &mut <B::DB as Database>::Connection| -> Result<Option<(i64, i64, i64)>> {
            if let Some(both) = q.limits_and_running {
                return Ok(sqlx::query_as(both)
                    .bind(gate.task_type)
                    .fetch_optional(&mut *conn)
                    .await?);
            }
            let lock_limits = match lock {
                RowLock::Wait => q.lock_limits,
                RowLock::SkipIfHeld => q.try_lock_limits,
            };
            let Some((milli_tokens, at)): Option<(i64, i64)> = sqlx::query_as(lock_limits)
                .bind(gate.task_type)
                .fetch_optional(&mut *conn)
                .await?
            else {
                return Ok(None);
            };
            // Read after the row lock was granted, so it counts every attempt begun by the
            // transactions that held it before (READ COMMITTED: a statement sees what was
            // committed when it began).
            let (running,): (i64,) = sqlx::query_as(q.running)
                .bind(gate.task_type)
                .fetch_one(&mut *conn)
                .await?;
            Ok(Some((milli_tokens, at, running)))
        };
    // Locked before it is inserted, then inserted only if missing: an insert that finds
    // the row takes a shared lock on it (InnoDB), and two transactions upgrading theirs
    // would deadlock on every start.
    let mut row = read(&mut *conn).await?;
    if row.is_none() && lock == RowLock::SkipIfHeld {
        // No row, or one another transaction holds: only the first is made here (an
        // insert that finds a held row would wait for it).
        let exists: Option<(i64, i64)> = sqlx::query_as(q.peek_limits)
            .bind(gate.task_type)
            .fetch_optional(&mut *conn)
            .await?;
        if exists.is_some() {
            return Ok(None);
        }
    }
    if row.is_none() {
        let fresh = domain::Bucket::full(gate.rate, now);
        sqlx::query::<B::DB>(q.new_limits)
            .bind(gate.task_type)
            .bind(fresh.milli_tokens)
            .bind(fresh.at)
            .execute(&mut *conn)
            .await?;
        row = read(&mut *conn).await?;
    }
    let Some((milli_tokens, at, running)) = row else {
        return Ok(None);
    };
    let bucket = domain::Bucket {
        milli_tokens,
        at: Millis::new(at),
    };
    Ok(Some((bucket, running)))
}

/// Takes a token from `gate`'s bucket (as [`lock_gate`] read it, refilled to now) for
/// each of the `started` attempts; nothing to write without a rate limit.
pub(crate) async fn spend_tokens<B>(
    conn: &mut <B::DB as Database>::Connection,
    gate: &JobGate<'_>,
    bucket: domain::Bucket,
    started: usize,
) -> Result<()>
where
    B: Backend,
    for<'c> &'c mut <B::DB as Database>::Connection: Executor<'c, Database = B::DB>,
    <B::DB as Database>::Arguments: IntoArguments<B::DB>,
    for<'q> &'q str: Encode<'q, B::DB> + Type<B::DB>,
    for<'q> i64: Encode<'q, B::DB> + Type<B::DB>,
    for<'q> Millis: Encode<'q, B::DB> + Type<B::DB>,
{
    if gate.rate.is_none() {
        return Ok(());
    }
    let bucket = domain::spend(bucket, started);
    sqlx::query::<B::DB>(B::QUERIES.save_limits)
        .bind(bucket.milli_tokens)
        .bind(bucket.at)
        .bind(gate.task_type)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

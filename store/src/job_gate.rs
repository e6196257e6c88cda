//! A job's limits as every start keeps them in total across dispatchers: its
//! `job_limits` row taken first (so starters take turns), then the rows of the
//! AsyncLimiters it shares with other jobs (with their waiters, so no job starves
//! another), then its keys' token buckets (`concurrencyKey.rateLimit`); the running
//! attempts counted under each lock, and the buckets spent. Every start takes them in
//! that order, each group sorted, so no two starts wait on each other. Used by
//! [`Store`](crate::Store)'s starts in `sql_store.rs`, in the caller's transaction.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use crate::domain;
use crate::shared::GateRow;
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

/// The rows a start took and what they hold: the job's, then each of its limiters', in
/// [`JobGate::limiters`]' order.
pub(crate) struct Gates {
    pub(crate) limits: Vec<domain::Limit>,
    /// Each limiter's waiter as its row holds it: `(task type, since)`, `("", 0)` for none.
    waiters: Vec<(String, i64)>,
}

/// How long a job that found a limiter full is left the next slot freed: ten of a
/// dispatcher's polls for a slot (50 ms each). A waiter that stops asking (its backlog
/// gone, its dispatcher stopped) holds a slot back no longer than this.
const WAITER_FOR_MS: i64 = 500;

impl Gates {
    /// How many of `wanted` attempts may begin now, the buckets refilled to `now`, and
    /// which limit binds.
    pub(crate) fn admit(&self, wanted: usize, now: Millis) -> Admission {
        let (allowed, buckets, held_by) = domain::admit_all(wanted, &self.limits, now);
        Admission {
            allowed,
            buckets,
            held_by,
        }
    }
}

pub(crate) struct Admission {
    pub(crate) allowed: usize,
    pub(crate) buckets: Vec<domain::Bucket>,
    pub(crate) held_by: Option<HeldBy>,
}

/// [`Store::start_due`]'s write, in the caller's transaction: the job's limits rows
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
    for<'r> (String, i64): FromRow<'r, <B::DB as Database>::Row>,
{
    let Some(gates) = take_gates::<B>(&mut *conn, gate, params.now, lock).await? else {
        return Ok(DueStarted {
            tasks: Vec::new(),
            held_by: None,
        });
    };
    let admission = gates.admit(params.limit as usize, params.now);
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
    spend_tokens::<B>(&mut *conn, gate, &admission, tasks.len()).await?;
    if !gate.limiters.is_empty() {
        // Held back with due tasks left: all it was allowed began, and more are due.
        let work_left = admission.allowed < params.limit as usize
            && tasks.len() == admission.allowed
            && (admission.allowed > 0 || {
                let due: Option<(i64,)> = sqlx::query_as(B::QUERIES.due_exists)
                    .bind(gate.task_type)
                    .bind(params.now)
                    .bind(params.now)
                    .fetch_optional(&mut *conn)
                    .await?;
                due.is_some()
            });
        settle_waiters::<B>(&mut *conn, gate, &gates, tasks.len(), work_left, params.now).await?;
    }
    Ok(DueStarted {
        tasks,
        held_by: admission.held_by,
    })
}

/// Takes `gate`'s `job_limits` row lock, so dispatchers beginning the job's attempts
/// take turns, then its limiters' rows; reads each token bucket and the running
/// attempts that count against each under the locks.
pub(crate) async fn lock_gate<B>(
    conn: &mut <B::DB as Database>::Connection,
    gate: &JobGate<'_>,
    now: Millis,
) -> Result<Gates>
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
    for<'r> (String, i64): FromRow<'r, <B::DB as Database>::Row>,
{
    let taken = take_gates::<B>(conn, gate, now, RowLock::Wait).await?;
    taken.ok_or_else(|| StoreError::Corrupt(format!("no job_limits row for {:?}", gate.task_type)))
}

/// [`lock_gate`]; with [`RowLock::SkipIfHeld`], `None` while another transaction holds
/// one of the rows (or it does not exist yet: a waiting start makes it). Every start
/// takes the job's row first and its limiters' in id order, and only a waiting start
/// waits, each for one job's row at most before the limiters': so no two starts wait on
/// each other.
async fn take_gates<B>(
    conn: &mut <B::DB as Database>::Connection,
    gate: &JobGate<'_>,
    now: Millis,
    lock: RowLock,
) -> Result<Option<Gates>>
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
    for<'r> (String, i64): FromRow<'r, <B::DB as Database>::Row>,
{
    let q = &B::QUERIES;
    let own_type = [gate.task_type];
    let job_row = Row {
        rows: &q.job_limits,
        key: gate.task_type,
        rate: gate.rate,
        types: &own_type,
        // One statement where that counts right (SQLite, one writer).
        combined: q.limits_and_running,
    };
    let Some((bucket, running)) = take_row::<B>(&mut *conn, &job_row, now, lock).await? else {
        return Ok(None);
    };
    let mut limits = Vec::with_capacity(1 + gate.limiters.len());
    let mut waiters = Vec::with_capacity(gate.limiters.len());
    limits.push(domain::Limit {
        running,
        concurrency: gate.concurrency,
        rate: gate.rate,
        bucket,
        held_by_concurrency: HeldBy::Concurrency,
    });
    for limiter in gate.limiters {
        let types: Vec<&str> = limiter.task_types.iter().map(String::as_str).collect();
        let row = Row {
            rows: &q.limiters,
            key: &limiter.id,
            rate: limiter.rate,
            types: &types,
            combined: None,
        };
        let Some((bucket, running)) = take_row::<B>(&mut *conn, &row, now, lock).await? else {
            return Ok(None);
        };
        let waiter: (String, i64) = sqlx::query_as(q.limiter_waiter)
            .bind(limiter.id.as_str())
            .fetch_one(&mut *conn)
            .await?;
        // Another job waits for this limiter: the next slot freed is left to it.
        let leave_one = !waiter.0.is_empty()
            && waiter.0 != gate.task_type
            && now.as_i64().saturating_sub(waiter.1) <= WAITER_FOR_MS;
        waiters.push(waiter);
        limits.push(domain::Limit {
            running,
            concurrency: limiter
                .concurrency
                .map_or(u32::MAX, |c| c - u32::from(leave_one)),
            rate: limiter.rate,
            bucket,
            held_by_concurrency: HeldBy::Limiter,
        });
    }
    Ok(Some(Gates { limits, waiters }))
}

/// One limits row to take: where it lives, its bucket's rate, and the task types whose
/// running attempts count against it.
struct Row<'a> {
    rows: &'a GateRow,
    key: &'a str,
    rate: Option<asyncd_spec::RateLimit>,
    types: &'a [&'a str],
    /// The row and the count of its one type in one statement, where that counts right.
    combined: Option<&'static str>,
}

/// The bucket of `row`, locked (made full first if missing), and the running attempts
/// of its types counted after the lock was granted; `None` with
/// [`RowLock::SkipIfHeld`] while another transaction holds it.
async fn take_row<B>(
    conn: &mut <B::DB as Database>::Connection,
    row: &Row<'_>,
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
    for<'r> (String, i64): FromRow<'r, <B::DB as Database>::Row>,
{
    let q = &B::QUERIES;
    let read =
        async |conn: &mut <B::DB as Database>::Connection| -> Result<Option<(i64, i64, i64)>> {
            if let Some(both) = row.combined {
                return Ok(sqlx::query_as(both)
                    .bind(row.key)
                    .fetch_optional(&mut *conn)
                    .await?);
            }
            let lock_row = match lock {
                RowLock::Wait => row.rows.lock,
                RowLock::SkipIfHeld => row.rows.try_lock,
            };
            let Some((milli_tokens, at)): Option<(i64, i64)> = sqlx::query_as(lock_row)
                .bind(row.key)
                .fetch_optional(&mut *conn)
                .await?
            else {
                return Ok(None);
            };
            // Read after the row lock was granted, so it counts every attempt begun by the
            // transactions that held it before (READ COMMITTED: a statement sees what was
            // committed when it began).
            let mut running = 0;
            for task_type in row.types {
                let (count,): (i64,) = sqlx::query_as(q.running)
                    .bind(*task_type)
                    .fetch_one(&mut *conn)
                    .await?;
                running += count;
            }
            Ok(Some((milli_tokens, at, running)))
        };
    // Locked before it is inserted, then inserted only if missing: an insert that finds
    // the row takes a shared lock on it (InnoDB), and two transactions upgrading theirs
    // would deadlock on every start.
    let mut taken = read(&mut *conn).await?;
    if taken.is_none() && lock == RowLock::SkipIfHeld {
        // No row, or one another transaction holds: only the first is made here (an
        // insert that finds a held row would wait for it).
        let exists: Option<(i64, i64)> = sqlx::query_as(row.rows.peek)
            .bind(row.key)
            .fetch_optional(&mut *conn)
            .await?;
        if exists.is_some() {
            return Ok(None);
        }
    }
    if taken.is_none() {
        let fresh = domain::Bucket::full(row.rate, now);
        sqlx::query::<B::DB>(row.rows.new)
            .bind(row.key)
            .bind(fresh.milli_tokens)
            .bind(fresh.at)
            .execute(&mut *conn)
            .await?;
        taken = read(&mut *conn).await?;
    }
    let Some((milli_tokens, at, running)) = taken else {
        return Ok(None);
    };
    let bucket = domain::Bucket {
        milli_tokens,
        at: Millis::new(at),
    };
    Ok(Some((bucket, running)))
}

/// Takes a token from each rate-limited bucket (as [`lock_gate`] read it, refilled to
/// now) for each of the `started` attempts; nothing to write without a rate limit.
pub(crate) async fn spend_tokens<B>(
    conn: &mut <B::DB as Database>::Connection,
    gate: &JobGate<'_>,
    admission: &Admission,
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
    let q = &B::QUERIES;
    let rows = std::iter::once((&q.job_limits, gate.task_type, gate.rate)).chain(
        gate.limiters
            .iter()
            .map(|limiter| (&q.limiters, limiter.id.as_str(), limiter.rate)),
    );
    for ((rows, key, rate), bucket) in rows.zip(&admission.buckets) {
        if rate.is_none() {
            continue;
        }
        let bucket = domain::spend(*bucket, started);
        sqlx::query::<B::DB>(rows.save)
            .bind(bucket.milli_tokens)
            .bind(bucket.at)
            .bind(key)
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// After a start of `started` attempts under `gates`: the job becomes its full
/// limiters' waiter when it has `work_left` (unless another job waits already), and
/// stops being one when it began or has nothing left, so each limiter's other jobs leave
/// a waiting job the next slot freed. Nothing to write for a job without limiters, or
/// while no limiter is full and nobody waits.
pub(crate) async fn settle_waiters<B>(
    conn: &mut <B::DB as Database>::Connection,
    gate: &JobGate<'_>,
    gates: &Gates,
    started: usize,
    work_left: bool,
    now: Millis,
) -> Result<()>
where
    B: Backend,
    for<'c> &'c mut <B::DB as Database>::Connection: Executor<'c, Database = B::DB>,
    <B::DB as Database>::Arguments: IntoArguments<B::DB>,
    for<'q> &'q str: Encode<'q, B::DB> + Type<B::DB>,
    for<'q> i64: Encode<'q, B::DB> + Type<B::DB>,
{
    let started = i64::try_from(started).unwrap_or(i64::MAX);
    for ((limiter, limit), (waiting, since)) in gate
        .limiters
        .iter()
        .zip(&gates.limits[1..])
        .zip(&gates.waiters)
    {
        let full = limiter.concurrency.is_some()
            && limit.running.saturating_add(started) >= i64::from(limit.concurrency);
        let mine = waiting == gate.task_type;
        let free = waiting.is_empty() || now.as_i64().saturating_sub(*since) > WAITER_FOR_MS;
        let (waiter, at) = if full && work_left && (mine || free) {
            (gate.task_type, now.as_i64())
        } else if mine && (started > 0 || !work_left) {
            ("", 0)
        } else {
            continue;
        };
        sqlx::query::<B::DB>(B::QUERIES.set_limiter_waiter)
            .bind(waiter)
            .bind(at)
            .bind(limiter.id.as_str())
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// The token buckets of `concurrencyKey.rateLimit` that a batch's keys spend.
#[derive(Default)]
pub(crate) struct KeyBuckets {
    /// Each key's bucket id (`task type␟key`) and its bucket refilled to now.
    buckets: Vec<(String, String, domain::Bucket)>,
}

/// With `gate.key_rate`: takes the bucket of each key of `room`'s claims (in key
/// order, after the job's and its limiters' rows), and keeps of `room` the claims their
/// keys have a token for, in order; the rest wait for their key's next token, which
/// `held_by` says. Without a key rate, `room` as it is.
pub(crate) async fn take_key_buckets<B>(
    conn: &mut <B::DB as Database>::Connection,
    gate: &JobGate<'_>,
    room: Vec<usize>,
    now: Millis,
) -> Result<(Vec<usize>, KeyBuckets, Option<HeldBy>)>
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
    for<'r> (String, i64): FromRow<'r, <B::DB as Database>::Row>,
{
    let Some(rate) = gate.key_rate else {
        return Ok((room, KeyBuckets::default(), None));
    };
    let mut wanted: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for &index in &room {
        if let Some(Some(key)) = gate.keys.get(index) {
            *wanted.entry(key).or_default() += 1;
        }
    }
    let mut tokens = std::collections::HashMap::new();
    let mut buckets = KeyBuckets::default();
    let mut held_by: Option<HeldBy> = None;
    for (key, wanted) in wanted {
        let id = format!("{}{}{key}", gate.task_type, asyncd_spec::TENANT_SEPARATOR);
        let row = Row {
            rows: &B::QUERIES.key_buckets,
            key: &id,
            rate: Some(rate),
            types: &[],
            combined: None,
        };
        let (bucket, _) = take_row::<B>(&mut *conn, &row, now, RowLock::Wait)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("no key bucket {id:?}")))?;
        let admission = domain::admit(wanted, 0, u32::MAX, Some(rate), bucket, now);
        if let Some(HeldBy::Rate { next_token }) = admission.held_by {
            // The soonest of the held keys' next tokens.
            held_by = Some(match held_by {
                Some(HeldBy::Rate { next_token: other }) => HeldBy::Rate {
                    next_token: next_token.min(other),
                },
                _ => HeldBy::Rate { next_token },
            });
        }
        tokens.insert(key, admission.allowed);
        buckets
            .buckets
            .push((id, key.to_string(), admission.bucket));
    }
    let room = room
        .into_iter()
        .filter(|&index| {
            let Some(key) = gate.keys.get(index).copied().flatten() else {
                return true;
            };
            match tokens.get_mut(key) {
                Some(left) if *left > 0 => {
                    *left -= 1;
                    true
                }
                _ => false,
            }
        })
        .collect();
    Ok((room, buckets, held_by))
}

/// Takes a token from each key's bucket for each of its attempts that began.
pub(crate) async fn spend_key_tokens<B>(
    conn: &mut <B::DB as Database>::Connection,
    buckets: &KeyBuckets,
    started_per_key: &std::collections::HashMap<&str, usize>,
) -> Result<()>
where
    B: Backend,
    for<'c> &'c mut <B::DB as Database>::Connection: Executor<'c, Database = B::DB>,
    <B::DB as Database>::Arguments: IntoArguments<B::DB>,
    for<'q> &'q str: Encode<'q, B::DB> + Type<B::DB>,
    for<'q> i64: Encode<'q, B::DB> + Type<B::DB>,
    for<'q> Millis: Encode<'q, B::DB> + Type<B::DB>,
{
    for (id, key, bucket) in &buckets.buckets {
        let started = started_per_key.get(key.as_str()).copied().unwrap_or(0);
        let bucket = domain::spend(*bucket, started);
        sqlx::query::<B::DB>(B::QUERIES.key_buckets.save)
            .bind(bucket.milli_tokens)
            .bind(bucket.at)
            .bind(id.as_str())
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

//! [`Store::start_limited`](crate::Store::start_limited)'s write, in the caller's
//! transaction: a batch of claims (a keyed job's, or a batch job's) begun as far as
//! the job's limits, its keys' limits and its limiters admit, every count read under
//! the job's row lock (see [`job_gate`](crate::job_gate) for the order the rows are
//! taken in).

use std::collections::HashMap;

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use crate::domain;
use crate::job_gate::{
    lock_gate, settle_waiters, spend_key_tokens, spend_tokens, take_key_buckets,
};
use crate::rows;
use crate::sql_store::{Backend, RUNNING_PER_KEY};
use crate::*;

/// Begins those of `params.claims` the limits admit, in the order given, and says which
/// were deferred and which limit held them.
pub(crate) async fn start_limited_in<B>(
    conn: &mut <B::DB as Database>::Connection,
    params: StartParams<'_>,
    gate: &JobGate<'_>,
) -> Result<Admitted>
where
    B: Backend,
    for<'c> &'c mut <B::DB as Database>::Connection: Executor<'c, Database = B::DB>,
    <B::DB as Database>::Arguments: IntoArguments<B::DB>,
    for<'q> &'q str: Encode<'q, B::DB> + Type<B::DB>,
    for<'q> &'q B::Key: Encode<'q, B::DB> + Type<B::DB>,
    for<'q> i64: Encode<'q, B::DB> + Type<B::DB>,
    for<'q> Millis: Encode<'q, B::DB> + Type<B::DB>,
    for<'r> (i64,): FromRow<'r, <B::DB as Database>::Row>,
    for<'r> (i64, i64): FromRow<'r, <B::DB as Database>::Row>,
    for<'r> (i64, i64, i64): FromRow<'r, <B::DB as Database>::Row>,
    for<'r> (String, i64): FromRow<'r, <B::DB as Database>::Row>,
    for<'r> (rows::Key, i64): FromRow<'r, <B::DB as Database>::Row>,
{
    let gates = lock_gate::<B>(&mut *conn, gate, params.now).await?;
    // The running attempts of the batch's keys, read under the same row lock
    // as the job's count.
    let mut key_running = HashMap::new();
    let mut batch_keys: Vec<&str> = gate.keys.iter().flatten().copied().collect();
    batch_keys.sort_unstable();
    batch_keys.dedup();
    if gate.key_limit.is_some() && !batch_keys.is_empty() {
        let mut query = sqlx::QueryBuilder::<B::DB>::new(RUNNING_PER_KEY.0);
        query.push_bind(gate.task_type).push(RUNNING_PER_KEY.1);
        let mut list = query.separated(", ");
        for key in &batch_keys {
            list.push_bind(B::key(key));
        }
        query.push(") GROUP BY concurrency_key");
        let counts: Vec<(rows::Key, i64)> = query.build_query_as().fetch_all(&mut *conn).await?;
        key_running.extend(counts.into_iter().map(|(key, n)| (key.0, n)));
    }
    // The keys first, so a full key's claims do not take the job's slots or
    // tokens from the others'.
    let keys: Vec<Option<&str>> = (0..params.claims.len())
        .map(|index| gate.keys.get(index).copied().flatten())
        .collect();
    let (room, key_held) = domain::key_room(&keys, gate.key_limit, &key_running);
    let (room, key_buckets, rate_held) =
        take_key_buckets::<B>(&mut *conn, gate, room, params.now).await?;
    let admission = gates.admit(room.len(), params.now);
    let tried: Vec<(String, i64)> = room[..admission.allowed]
        .iter()
        .map(|&index| params.claims[index].clone())
        .collect();
    let started = if tried.is_empty() {
        Vec::new()
    } else {
        B::start_on(
            &mut *conn,
            StartParams {
                claims: &tried,
                ..params
            },
        )
        .await?
    };
    // A claim that did not start (cancelled, paused, lapsed) took no token.
    spend_tokens::<B>(&mut *conn, gate, &admission, started.len()).await?;
    if gate.key_rate.is_some() {
        let key_of: HashMap<&str, &str> = params
            .claims
            .iter()
            .zip(&keys)
            .filter_map(|((id, _), key)| Some((id.as_str(), (*key)?)))
            .collect();
        let mut started_per_key: HashMap<&str, usize> = HashMap::new();
        for begun in &started {
            if let Some(key) = key_of.get(begun.id.as_str()) {
                *started_per_key.entry(key).or_default() += 1;
            }
        }
        spend_key_tokens::<B>(&mut *conn, &key_buckets, &started_per_key).await?;
    }
    // Claims the limits held back are work left.
    let work_left = admission.allowed < room.len();
    settle_waiters::<B>(
        &mut *conn,
        gate,
        &gates,
        started.len(),
        work_left,
        params.now,
    )
    .await?;
    let mut deferred = vec![true; params.claims.len()];
    for &index in &room[..admission.allowed] {
        deferred[index] = false;
    }
    Ok(Admitted {
        started,
        deferred: (0..params.claims.len()).filter(|&i| deferred[i]).collect(),
        held_by: admission
            .held_by
            .or(key_held.then_some(HeldBy::Key))
            .or(rate_held),
    })
}

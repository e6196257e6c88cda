//! The first step of [`Store::claim_fair`](crate::Store::claim_fair), written once for
//! every SQL dialect: which of a keyed job's pending tasks to claim. By rank (the
//! default), in turns of the keys (with `spec.fairness`, by the tenants' weights first),
//! leaving out the keys cooling down, from index probes whose number grows with the
//! keys and tenants a claim looks at, not with the job's backlog ([`walk`], [`turns`]).
//! In order per key (`spec.ordering`), from one statement over the job's active tasks.
//! The second step claims the picked ids.

mod turns;
mod walk;

use std::collections::HashMap;
use std::ops::Bound;

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use crate::rows;
use crate::tx::{Conn, Dialect};

use crate::{ClaimParams, FairParams, KeyOrder, Millis, Result, TenantWeights};
use turns::{Demand, KeyTasks};
use walk::Span;

/// What the first step picked: the ids to claim, in the order taken, and where the
/// keys' rotation goes on from at the job's next claim ([`crate::FairClaim::last_key`]).
#[derive(Debug, Default)]
pub(crate) struct Picked {
    pub ids: Vec<String>,
    pub last_key: Option<String>,
}

/// How many keys (or tenants) one claim's walk looks at, at most, beyond those that can
/// take its slots: the keys at their limit, cooling down or with nothing due yet are
/// stepped over, one index probe each, and past this many the claim ends and the next
/// one goes on from where it stopped.
const WALK_SLACK: u32 = 256;

/// The keys one statement of the walk reads, at most.
const WALK_BATCH: u32 = 512;

/// Up to `params.limit` pending tasks of `task_type`, in the order the fair claim takes
/// them.
pub(crate) async fn pick<D, DB>(
    pool: &Pool<DB>,
    task_type: &str,
    params: &ClaimParams<'_>,
    fair: &FairParams<'_>,
) -> Result<Picked>
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
    for<'r> (Option<rows::Key>, i64): FromRow<'r, DB::Row>,
    for<'r> (rows::Key, Option<String>): FromRow<'r, DB::Row>,
    for<'r> (rows::Key, i64): FromRow<'r, DB::Row>,
    for<'r> (rows::Key,): FromRow<'r, DB::Row>,
    for<'r> (String,): FromRow<'r, DB::Row>,
    for<'r> (String, rows::Key, Millis): FromRow<'r, DB::Row>,
{
    let mut conn = pool.acquire().await?;
    let conn: &mut Conn<D> = &mut conn;
    if let KeyOrder::Fifo { dead_blocks } = fair.order {
        let mut query = in_order::<DB>(task_type, params, dead_blocks);
        // A key cooling down waits.
        query
            .push(" AND NOT EXISTS (SELECT 1 FROM key_cooldowns c WHERE c.task_type = ")
            .push_bind(task_type)
            .push(" AND c.concurrency_key = ranked.concurrency_key AND c.ends_at > ")
            .push_bind(params.now)
            .push(") ORDER BY CASE WHEN concurrency_key > ")
            .push_bind(D::key(fair.after.unwrap_or("")))
            .push(" THEN 0 ELSE 1 END, concurrency_key LIMIT ")
            .push_bind(i64::from(params.limit));
        let picked: Vec<(String, Option<rows::Key>)> =
            query.build_query_as().fetch_all(&mut *conn).await?;
        let last_key = picked
            .last()
            .and_then(|(_, key)| Some(key.as_ref()?.0.clone()));
        return Ok(Picked {
            ids: picked.into_iter().map(|(id, _)| id).collect(),
            last_key,
        });
    }
    let mut held: HashMap<Option<String>, u32> = HashMap::new();
    for (key, count) in walk::held::<D, DB>(conn, task_type).await? {
        held.insert(
            key.map(|key| key.0),
            u32::try_from(count).unwrap_or(u32::MAX),
        );
    }
    // A job's tasks without a key (from before it had one) are one more key, taken
    // ahead of the turns.
    let keyless_room = fair
        .per_key
        .saturating_sub(held.get(&None).copied().unwrap_or(0))
        .min(params.limit);
    let mut ids: Vec<String> = if keyless_room > 0 {
        walk::keyless::<D, DB>(conn, task_type, keyless_room, params)
            .await?
            .into_iter()
            .map(|(id,)| id)
            .collect()
    } else {
        Vec::new()
    };
    let room = params.limit.saturating_sub(ids.len() as u32);
    let keyed = Keyed {
        task_type,
        params,
        per_key: fair.per_key,
        key_limits: fair.key_limits,
        held: &held,
    };
    let (taken, last_key) = match fair.tenants {
        None => keyed.in_turns::<D, DB>(conn, fair.after, room).await?,
        Some(tenants) => {
            keyed
                .by_weight::<D, DB>(conn, tenants, fair.after, room)
                .await?
        }
    };
    ids.extend(taken.into_iter().map(|(id, _)| id));
    Ok(Picked { ids, last_key })
}

/// A keyed job's claim by rank, as it walks its keys.
struct Keyed<'a> {
    task_type: &'a str,
    params: &'a ClaimParams<'a>,
    per_key: u32,
    /// The keys whose limit is cut below `per_key` now.
    key_limits: Option<&'a std::collections::BTreeMap<String, u32>>,
    /// Attempts in flight per key.
    held: &'a HashMap<Option<String>, u32>,
}

impl Keyed<'_> {
    fn held(&self, key: &str) -> u32 {
        self.held.get(&Some(key.to_owned())).copied().unwrap_or(0)
    }

    /// `key`'s limit now: `per_key`, or lower where its executor's answers cut it.
    fn limit_of(&self, key: &str) -> u32 {
        self.key_limits
            .and_then(|limits| limits.get(key))
            .map_or(self.per_key, |&limit| limit.clamp(1, self.per_key))
    }

    /// Up to `limit` tasks as `(id, key)` in the keys' turns, the keys in rotation
    /// starting after `after`; and the key the next claim's rotation starts after.
    async fn in_turns<D, DB>(
        &self,
        conn: &mut Conn<D>,
        after: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<(String, String)>, Option<String>)>
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
        for<'r> (String, rows::Key, Millis): FromRow<'r, DB::Row>,
    {
        let spans = match after {
            Some(after) => vec![
                Span {
                    from: Bound::Excluded(after),
                    to: Bound::Unbounded,
                },
                Span {
                    from: Bound::Unbounded,
                    to: Bound::Included(after),
                },
            ],
            None => vec![Span {
                from: Bound::Unbounded,
                to: Bound::Unbounded,
            }],
        };
        let (taken, walked) = self.take::<D, DB>(conn, &spans, limit).await?;
        let last_key = match walked {
            // The walk stopped short: the next claim goes on from where it did.
            Walked::Stopped(at) => Some(at),
            Walked::All => taken.last().map(|(_, key)| key.clone()),
        };
        Ok((taken, last_key))
    }

    /// Up to `limit` tasks as `(id, key)` from the keys within `spans` (walked in the
    /// order given), in turns; every key's first before any key's second, so the turns
    /// after the first are read only once every key has been walked.
    async fn take<D, DB>(
        &self,
        conn: &mut Conn<D>,
        spans: &[Span<'_>],
        limit: u32,
    ) -> Result<(Vec<(String, String)>, Walked)>
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
        for<'r> (String, rows::Key, Millis): FromRow<'r, DB::Row>,
    {
        if limit == 0 {
            return Ok((Vec::new(), Walked::All));
        }
        let budget = limit.saturating_add(WALK_SLACK);
        let mut walked = 0u32;
        let mut found: Vec<KeyTasks> = Vec::new();
        // Keys with nothing in flight: their first due task is a first turn. Once there
        // are as many as slots, no key further on could come before them.
        let mut firsts = 0u32;
        // The first statement reads about as many keys as should fill the slots (the
        // keys at their limit are among those held); later ones read more at once.
        let mut max = (limit + self.held.len() as u32 + 16).min(WALK_BATCH);
        let mut last_walked: Option<String> = None;
        'spans: for span in spans {
            let mut from = span.from;
            let mut from_key: String;
            loop {
                let keys = walk::keys::<D, DB>(
                    conn,
                    self.task_type,
                    Span { from, to: span.to },
                    max.min(budget - walked),
                    self.params,
                )
                .await?;
                let ran_out = (keys.len() as u32) < max.min(budget - walked);
                walked += keys.len() as u32;
                for (key, first) in keys {
                    let held = self.held(&key.0);
                    let limit = self.limit_of(&key.0);
                    if let Some(id) = first
                        && held < limit
                    {
                        firsts += u32::from(held == 0);
                        found.push(KeyTasks {
                            key: key.0.clone(),
                            held,
                            limit,
                            ids: vec![id],
                        });
                    }
                    last_walked = Some(key.0);
                }
                if firsts >= limit {
                    break 'spans;
                }
                if ran_out {
                    break;
                }
                if walked >= budget {
                    let at = last_walked.take().unwrap_or_default();
                    return Ok((self.ordered(&found, limit), Walked::Stopped(at)));
                }
                from_key = last_walked.clone().unwrap_or_default();
                from = Bound::Excluded(from_key.as_str());
                max = WALK_BATCH;
            }
        }
        if firsts < limit {
            self.more_turns::<D, DB>(conn, &mut found, limit).await?;
        }
        Ok((self.ordered(&found, limit), Walked::All))
    }

    /// `found`'s tasks in turns, up to `limit`, as `(id, key)`.
    fn ordered(&self, found: &[KeyTasks], limit: u32) -> Vec<(String, String)> {
        turns::in_turns(found, limit as usize)
            .into_iter()
            .map(|(k, t)| (found[k].ids[t].clone(), found[k].key.clone()))
            .collect()
    }

    /// Reads the next due tasks of each of `found`'s keys that has room for more than
    /// its first: at most what the claim or the key's limit could take.
    async fn more_turns<D, DB>(
        &self,
        conn: &mut Conn<D>,
        found: &mut [KeyTasks],
        limit: u32,
    ) -> Result<()>
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
        let wanted: Vec<(&str, u32)> = found
            .iter()
            .filter(|key| key.held + 1 < key.limit)
            .map(|key| (key.key.as_str(), (key.limit - key.held).min(limit)))
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let mut more = walk::more_of::<D, DB>(conn, self.task_type, &wanted, self.params).await?;
        more.sort_by(|a, b| (&a.1.0, a.2, &a.0).cmp(&(&b.1.0, b.2, &b.0)));
        let mut by_key: HashMap<String, Vec<String>> = HashMap::new();
        for (id, key, _) in more {
            by_key.entry(key.0).or_default().push(id);
        }
        for key in found.iter_mut() {
            if let Some(ids) = by_key.remove(&key.key) {
                // The key's best is its first already, unless another claim took it
                // since: then its next ones keep their order after it.
                let first = key.ids[0].clone();
                key.ids = std::iter::once(first.clone())
                    .chain(ids.into_iter().filter(|id| *id != first))
                    .collect();
            }
        }
        Ok(())
    }

    /// Up to `limit` tasks as `(id, key)` by the tenants' weighted fair queuing, each
    /// tenant's in its keys' turns; the tenants in rotation starting after the tenant of
    /// `after`. Looks at the tenants with attempts in flight, those given a weight, and
    /// the next `limit + WALK_SLACK` tenants with pending tasks in the rotation.
    async fn by_weight<D, DB>(
        &self,
        conn: &mut Conn<D>,
        weights: TenantWeights<'_>,
        after: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<(String, String)>, Option<String>)>
    where
        D: Dialect<DB = DB>,
        DB: Database,
        for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
        DB::Arguments: IntoArguments<DB>,
        for<'q> &'q str: Encode<'q, DB> + Type<DB>,
        for<'q> &'q D::Key: Encode<'q, DB> + Type<DB>,
        for<'q> Millis: Encode<'q, DB> + Type<DB>,
        for<'q> i64: Encode<'q, DB> + Type<DB>,
        for<'r> (rows::Key,): FromRow<'r, DB::Row>,
        for<'r> (rows::Key, i64): FromRow<'r, DB::Row>,
        for<'r> (rows::Key, Option<String>): FromRow<'r, DB::Row>,
        for<'r> (String, Option<rows::Key>): FromRow<'r, DB::Row>,
        for<'r> (String, rows::Key, Millis): FromRow<'r, DB::Row>,
    {
        if limit == 0 {
            return Ok((Vec::new(), None));
        }
        let tenant_of = |key: &str| walk::tenant_of(key).to_owned();
        let mut held: HashMap<String, u32> = HashMap::new();
        for (key, count) in self.held {
            if let Some(key) = key {
                *held.entry(tenant_of(key)).or_default() += count;
            }
        }
        let after = after.map(tenant_of);
        let bound = after.as_deref().map(walk::after_tenant);
        let spans = match &bound {
            Some(bound) => vec![
                Span {
                    from: Bound::Included(bound.as_str()),
                    to: Bound::Unbounded,
                },
                Span {
                    from: Bound::Unbounded,
                    to: Bound::Excluded(bound.as_str()),
                },
            ],
            None => vec![Span {
                from: Bound::Unbounded,
                to: Bound::Unbounded,
            }],
        };
        let mut budget = limit.saturating_add(WALK_SLACK);
        let mut names: Vec<String> = Vec::new();
        for span in spans {
            let found =
                walk::tenants::<D, DB>(conn, self.task_type, span, budget.min(WALK_BATCH)).await?;
            budget -= found.len() as u32;
            names.extend(found.into_iter().map(|(key,)| tenant_of(&key.0)));
            if budget == 0 {
                break;
            }
        }
        names.extend(held.keys().cloned());
        names.extend(weights.weights.keys().cloned());
        // In rotation: the tenants after the last one taken first, then from the start.
        let rotation = |tenant: &String| {
            (
                after.as_ref().is_some_and(|after| tenant <= after),
                tenant.clone(),
            )
        };
        names.sort_by_key(rotation);
        names.dedup();
        let per_tenant = weights.per_tenant;
        let mut demands: Vec<Demand> = names
            .iter()
            .map(|tenant| {
                let held = held.get(tenant).copied().unwrap_or(0);
                Demand {
                    weight: weights
                        .weights
                        .get(tenant)
                        .copied()
                        .unwrap_or(weights.default_weight),
                    held,
                    supply: per_tenant.saturating_sub(held),
                }
            })
            .collect();
        let mut taken: Vec<Option<Vec<(String, String)>>> = vec![None; names.len()];
        let order = loop {
            let order = turns::weighted(&demands, per_tenant, limit as usize);
            let mut counts = vec![0u32; names.len()];
            for &tenant in &order {
                counts[tenant] += 1;
            }
            let mut short = false;
            for (i, tenant) in names.iter().enumerate() {
                // A tenant found short has its supply set to what it gave, so the next
                // order gives it no more.
                if counts[i] <= taken[i].as_ref().map_or(0, Vec::len) as u32 {
                    continue;
                }
                let start = walk::tenant_start(tenant);
                let end = walk::after_tenant(tenant);
                let span = Span {
                    from: Bound::Included(start.as_str()),
                    to: Bound::Excluded(end.as_str()),
                };
                let (tasks, _) = self.take::<D, DB>(conn, &[span], counts[i]).await?;
                if (tasks.len() as u32) < counts[i] {
                    demands[i].supply = tasks.len() as u32;
                    short = true;
                }
                taken[i] = Some(tasks);
            }
            if !short {
                break order;
            }
        };
        let mut next = vec![0usize; names.len()];
        let picked: Vec<(String, String)> = order
            .into_iter()
            .filter_map(|tenant| {
                let task = taken[tenant].as_ref()?.get(next[tenant])?.clone();
                next[tenant] += 1;
                Some(task)
            })
            .collect();
        let last_key = picked.last().map(|(_, key)| key.clone());
        Ok((picked, last_key))
    }
}

/// How far a claim's walk of the keys went.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Walked {
    /// Every key in its spans, or as many as gave each slot a key.
    All,
    /// It stopped at this key, having looked at as many as it may.
    Stopped(String),
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

//! Inserting new tasks: in one statement outside a transaction where the store and the
//! tasks allow it, else in one transaction, runs of them by multi-row statements or the
//! dialect's bulk load, one at a time where a task needs reads first.

use sqlx::{
    Database, Encode, Executor, FromRow, IntoArguments, Pool, QueryBuilder, Transaction, Type,
};

use super::{Dialect, Tx};
use crate::rows::{Holder, KeyWindowRow, StartedRow, TaskRow};
use crate::shared::{INSERT_TASKS, ManyRows};
use crate::task_row::{
    BULK_LOAD_MAX_ROWS, CLAIMED_AT_INSERT_TOKEN, ClaimAtInsert, ClaimRoom, TaskValues, loadable,
    new_rows, rows_per_statement,
};
use crate::{ClaimedTask, InsertOutcome, Millis, NewTask, Result, is_unique_violation, retrying};

/// Whether an insert of tasks that each hold an idempotency key first tries the plain
/// statement a bulk load uses, which fails whole on a taken key, before the statement
/// that leaves such rows out. On PostgreSQL `ON CONFLICT DO NOTHING` checks every unique
/// index once more for every row before inserting it: a 64-row insert of keyed tasks
/// took 1.46–1.72 ms with it and 1.22–1.25 ms without (docs/benchmarks.md, "Keyed
/// submits inserted as if no key were taken"), and a taken key is rare — a caller's
/// retry. A failed try costs a statement, so after one, the next [`TakenKeys::SKIP`]
/// such inserts in this process leave rows out at once: a caller that submits mostly
/// repeats does not pay twice for each. Only a choice of statement: both answer alike.
static TAKEN_KEYS: TakenKeys = TakenKeys(std::sync::atomic::AtomicU32::new(0));

struct TakenKeys(std::sync::atomic::AtomicU32);

impl TakenKeys {
    const SKIP: u32 = 64;

    /// Whether to try the plain statement; counts down the inserts left to skip.
    fn expect_none(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.0
            .fetch_update(Relaxed, Relaxed, |skip| skip.checked_sub(1))
            .is_err()
    }

    /// A plain statement met a taken key.
    fn met(&self) {
        self.0
            .store(Self::SKIP, std::sync::atomic::Ordering::Relaxed);
    }
}

// `Tx`'s bounds (tx.rs), repeated: Rust has no alias for a where clause.
impl<D, DB> Tx<D>
where
    D: Dialect<DB = DB>,
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> &'q D::Key: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q D::Key>: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> Option<Millis>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> i16: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i16>: Encode<'q, DB> + Type<DB>,
    for<'r> (String,): FromRow<'r, DB::Row>,
    for<'r> (String, String): FromRow<'r, DB::Row>,
    for<'r> Holder: FromRow<'r, DB::Row>,
    for<'r> KeyWindowRow: FromRow<'r, DB::Row>,
    for<'r> StartedRow: FromRow<'r, DB::Row>,
    for<'r> TaskRow: FromRow<'r, DB::Row>,
{
    /// Inserts tasks in one transaction, one outcome per task in order. Where the
    /// dialect can ([`Queries::insert_many`]), runs of tasks without dependencies go in
    /// as multi-row statements: a statement per row was most of a batch submit's time.
    pub async fn insert(
        pool: &Pool<DB>,
        tasks: &[NewTask],
        now: Millis,
    ) -> Result<Vec<InsertOutcome>> {
        Ok(Self::insert_claiming(pool, tasks, now, None).await?.0)
    }

    /// [`Self::insert`], claiming for `claim` the new tasks it may as they go in: those
    /// due by its horizon, without dependencies, of a type not paused, inserted by a
    /// multi-row statement (where the dialect has them). Also returns those claimed.
    pub async fn insert_claiming(
        pool: &Pool<DB>,
        tasks: &[NewTask],
        now: Millis,
        claim: Option<&ClaimAtInsert<'_>>,
    ) -> Result<(Vec<InsertOutcome>, Vec<ClaimedTask>)> {
        if D::BULK_LOAD_MIN_ROWS.is_none() {
            return Self::insert_claiming_by(pool, tasks, now, claim, false).await;
        }
        if claim.is_none()
            && let Some(outcomes) = Self::insert_alone(pool, tasks, now).await?
        {
            return Ok((outcomes, Vec::new()));
        }
        // A bulk load cannot leave out a row whose id is taken (a Kafka message
        // consumed again): it fails, the transaction rolls back, and the insert runs
        // again row by row, leaving such rows out.
        match Self::insert_claiming_by(pool, tasks, now, claim, true).await {
            Err(crate::StoreError::Database(err)) if is_unique_violation(&err) => {
                tracing::debug!(error = %err, "bulk load of tasks met a taken id; inserting them instead");
                Self::insert_claiming_by(pool, tasks, now, claim, false).await
            }
            done => done,
        }
    }

    /// Inserts `tasks` in one statement outside a transaction where the dialect has
    /// such statements ([`Dialect::RUN_IS_ONE_STATEMENT`]) and the tasks allow it: none
    /// has dependencies or a key window, and either none holds a key (a taken id fails
    /// the statement, which so wrote nothing: `None`) or each holds an idempotency key
    /// and no other (tried first as if no key were taken: [`TAKEN_KEYS`]). Each task
    /// left out names a key already taken, and is answered
    /// afterwards as the transaction's path answers it. An outage in that step fails
    /// the whole insert although the statement committed: each of these tasks is safe
    /// to submit again, its repeat answered as a duplicate. `None`: the tasks need the
    /// transaction's path.
    async fn insert_alone(
        pool: &Pool<DB>,
        tasks: &[NewTask],
        now: Millis,
    ) -> Result<Option<Vec<InsertOutcome>>> {
        if !D::RUN_IS_ONE_STATEMENT
            || tasks.is_empty()
            || tasks.len() > BULK_LOAD_MAX_ROWS
            || !tasks
                .iter()
                .all(|t| t.depends_on.is_empty() && t.window.is_none())
        {
            return Ok(None);
        }
        let keyless = tasks.iter().all(loadable);
        if !keyless
            && !tasks.iter().all(|t| {
                t.idempotency_key.is_some() && t.unique_key.is_none() && t.cron_key.is_none()
            })
        {
            return Ok(None);
        }
        // The plain statement: a taken id or key fails it whole, having written nothing.
        if keyless || TAKEN_KEYS.expect_none() {
            let loaded = retrying(D::transient, || async {
                Self::load_many(&mut *pool.acquire().await?, tasks, now, None).await
            })
            .await;
            match loaded {
                Ok((outcomes, _)) => return Ok(Some(outcomes)),
                Err(crate::StoreError::Database(err)) if is_unique_violation(&err) => {
                    if keyless {
                        return Ok(None);
                    }
                    TAKEN_KEYS.met();
                }
                Err(err) => return Err(err),
            }
        }
        let rows = new_rows(tasks, now, None);
        let inserted: std::collections::HashSet<String> = retrying(D::transient, || async {
            D::insert_leaving_out(&mut *pool.acquire().await?, &rows).await
        })
        .await?
        .into_iter()
        .collect();
        let left_out: Vec<NewTask> = tasks
            .iter()
            .filter(|t| !inserted.contains(&t.id))
            .cloned()
            .collect();
        let mut answered = match left_out.is_empty() {
            true => Vec::new(),
            false => {
                Self::insert_claiming_by(pool, &left_out, now, None, false)
                    .await?
                    .0
            }
        }
        .into_iter();
        let outcomes = tasks
            .iter()
            .map(|task| match inserted.contains(&task.id) {
                true => InsertOutcome::Inserted {
                    id: task.id.clone(),
                    trigger_at: task.trigger_at,
                },
                false => answered.next().expect("an outcome per task left out"),
            })
            .collect();
        Ok(Some(outcomes))
    }

    /// [`Self::insert_claiming`]; `bulk_load`: runs of at least
    /// [`Dialect::BULK_LOAD_MIN_ROWS`] tasks holding no key go in by
    /// [`Dialect::load_tasks`].
    async fn insert_claiming_by(
        pool: &Pool<DB>,
        tasks: &[NewTask],
        now: Millis,
        claim: Option<&ClaimAtInsert<'_>>,
        bulk_load: bool,
    ) -> Result<(Vec<InsertOutcome>, Vec<ClaimedTask>)> {
        retrying(D::transient, || async {
            let mut tx = pool.begin().await?;
            // Read in the transaction, as the claim reads them in its statement.
            let paused: std::collections::HashSet<String> = match claim {
                Some(_) => sqlx::query_as::<DB, (String,)>("SELECT task_type FROM job_pauses")
                    .fetch_all(&mut *tx)
                    .await?
                    .into_iter()
                    .map(|(task_type,)| task_type)
                    .collect(),
                _ => Default::default(),
            };
            // What each type may still have claimed; counted down afresh by each try.
            let mut room = claim.and_then(|claim| claim.room.cloned());
            let mut claim = claim.map(|claim| ClaimRoom {
                claim,
                paused: &paused,
                room: room.as_mut(),
            });
            let mut outcomes = Vec::with_capacity(tasks.len());
            let mut claimed = Vec::new();
            let mut rest = tasks;
            while let Some(first) = rest.first() {
                let run = rest
                    .iter()
                    .take_while(|t| t.depends_on.is_empty() && t.window.is_none())
                    .count();
                let loadable = match bulk_load {
                    true => rest[..run].iter().take_while(|t| loadable(t)).count(),
                    false => 0,
                };
                // A task with dependencies goes in by itself, after reading theirs, and
                // one under a key window after locking the window.
                if D::BULK_LOAD_MIN_ROWS.is_some_and(|min| loadable >= min) {
                    let (rows, after) = rest.split_at(loadable.min(BULK_LOAD_MAX_ROWS));
                    let (some, claimed_some) =
                        Self::load_many(&mut *tx, rows, now, claim.as_mut()).await?;
                    outcomes.extend(some);
                    claimed.extend(claimed_some);
                    rest = after;
                } else if run >= 1 {
                    let (rows, after) = rest.split_at(match D::RUN_IS_ONE_STATEMENT {
                        true => run.min(BULK_LOAD_MAX_ROWS),
                        false => rows_per_statement(run, D::QUERIES.insert_many),
                    });
                    let (some, claimed_some) =
                        Self::insert_many(&mut tx, rows, now, claim.as_mut()).await?;
                    outcomes.extend(some);
                    claimed.extend(claimed_some);
                    rest = after;
                } else {
                    outcomes.push(Self::insert_one(&mut tx, first, now).await?);
                    rest = &rest[1..];
                }
            }
            tx.commit().await?;
            Ok((outcomes, claimed))
        })
        .await
    }

    /// Writes `tasks`, none with dependencies or a key, by the dialect's bulk load: all
    /// of them go in, or the load fails (see [`Self::insert_claiming`]).
    async fn load_many(
        conn: &mut DB::Connection,
        tasks: &[NewTask],
        now: Millis,
        claim: Option<&mut ClaimRoom<'_, '_>>,
    ) -> Result<(Vec<InsertOutcome>, Vec<ClaimedTask>)> {
        let rows = new_rows(tasks, now, claim);
        D::load_tasks(conn, &rows).await?;
        let outcomes = tasks
            .iter()
            .map(|task| InsertOutcome::Inserted {
                id: task.id.clone(),
                trigger_at: task.trigger_at,
            })
            .collect();
        let claimed = tasks
            .iter()
            .zip(&rows)
            .filter(|(_, row)| row.claim.is_some())
            .map(|(task, row)| row.claimed_task(task))
            .collect();
        Ok((outcomes, claimed))
    }

    /// Inserts `tasks`, none with dependencies, in one statement; those it left out for
    /// a taken key go through [`Self::insert_one`], which names the key's holder.
    async fn insert_many(
        tx: &mut Transaction<'_, DB>,
        tasks: &[NewTask],
        now: Millis,
        claim: Option<&mut ClaimRoom<'_, '_>>,
    ) -> Result<(Vec<InsertOutcome>, Vec<ClaimedTask>)> {
        let rows = new_rows(tasks, now, claim);
        let mut inserted: std::collections::HashSet<String> = match D::QUERIES.insert_many {
            _ if D::RUN_IS_ONE_STATEMENT => D::insert_leaving_out(&mut **tx, &rows)
                .await?
                .into_iter()
                .collect(),
            ManyRows::LeftOut => {
                let mut insert = Self::insert_statement(&rows);
                insert.push(" RETURNING id");
                insert
                    .build_query_scalar::<String>()
                    .fetch_all(&mut **tx)
                    .await?
                    .into_iter()
                    .collect()
            }
            ManyRows::AllOrNothing => match Self::insert_statement(&rows)
                .build()
                .execute(&mut **tx)
                .await
            {
                Ok(_) => tasks.iter().map(|task| task.id.clone()).collect(),
                Err(err) if is_unique_violation(&err) => Default::default(),
                Err(err) => return Err(err.into()),
            },
        };
        let mut outcomes = Vec::with_capacity(tasks.len());
        let mut claimed = Vec::new();
        for (task, row) in tasks.iter().zip(&rows) {
            outcomes.push(if inserted.remove(&task.id) {
                if row.claim.is_some() {
                    claimed.push(row.claimed_task(task));
                }
                InsertOutcome::Inserted {
                    id: task.id.clone(),
                    trigger_at: task.trigger_at,
                }
            } else {
                // A taken key: the row went in (if at all) through `insert_one`, pending.
                Self::insert_one(tx, task, now).await?
            });
        }
        Ok((outcomes, claimed))
    }

    /// [`INSERT_TASKS`] with `rows`, then the dialect's way with a taken key.
    pub(super) fn insert_statement(rows: &[TaskValues<'_>]) -> QueryBuilder<DB> {
        let mut insert = Self::values_statement(rows);
        insert.push(D::QUERIES.insert_tasks_conflict);
        insert
    }

    /// [`INSERT_TASKS`] with `rows`: a row whose id or key is taken fails it.
    pub(crate) fn values_statement(rows: &[TaskValues<'_>]) -> QueryBuilder<DB> {
        let mut insert = QueryBuilder::<DB>::new(INSERT_TASKS);
        insert.push_values(rows, |mut row, v| {
            row.push_bind(v.id)
                .push_bind(v.task_type)
                .push_bind(v.payload)
                .push_bind(v.state.as_str())
                .push_bind(v.priority)
                .push_bind(v.trigger_at)
                .push_bind(v.max_retries)
                .push_bind(v.timeout_ms)
                .push_bind(v.idempotency_key.map(D::key))
                .push_bind(v.unique_key.map(D::key))
                .push_bind(v.unique_active.map(D::key))
                .push_bind(v.unique_for)
                .push_bind(v.cron_key.map(D::key))
                .push_bind(v.source_service)
                .push_bind(v.last_error)
                .push_bind(v.now)
                .push_bind(v.now)
                .push_bind(v.lease_secret.as_str())
                .push_bind(v.concurrency_key.map(D::key))
                .push_bind(v.traceparent.as_deref())
                .push_bind(v.tracestate)
                .push_bind(v.expires_at)
                .push_bind(v.claim.map(|(owner, _)| owner))
                .push_bind(v.claim.map(|(_, until)| until))
                .push_bind(if v.claim.is_some() {
                    CLAIMED_AT_INSERT_TOKEN
                } else {
                    0
                });
        });
        insert
    }
}

#[cfg(test)]
mod tests {
    use super::TakenKeys;

    #[test]
    fn a_taken_key_sends_the_next_inserts_straight_to_the_statement_leaving_rows_out() {
        let keys = TakenKeys(std::sync::atomic::AtomicU32::new(0));
        assert!(
            keys.expect_none(),
            "nothing met yet: the plain statement first"
        );
        assert!(keys.expect_none());
        keys.met();
        for skipped in 0..TakenKeys::SKIP {
            assert!(!keys.expect_none(), "insert {skipped} after a taken key");
        }
        assert!(keys.expect_none(), "back to the plain statement");
        keys.met();
        assert!(!keys.expect_none(), "a second taken key counts afresh");
    }
}

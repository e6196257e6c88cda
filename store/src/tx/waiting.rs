//! The transactions of a task that waits to begin — cancel, change, expire — and of a
//! submit folded into a waiting task or held back by its key's window
//! ([`crate::window`]).

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Transaction, Type};

use super::{Dialect, Tx};
use crate::domain;
use crate::rows::{Holder, KeyWindowRow, StartedRow, TaskRow};
use crate::task_row::TaskValues;
use crate::window::{self, KeyWindow, WindowRow, WindowStep};
use crate::{
    CancelOutcome, ChangeOutcome, ExpiredTask, InsertOutcome, Millis, NewTask, Result, TaskChange,
    TaskState, is_unique_violation, retrying,
};

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
    /// A submit under a key window ([`crate::window`]). The window's row is created if
    /// need be and locked first, so the submits of one key take turns across every
    /// API replica; then [`window::step`] decides: fold it into the key's waiting task,
    /// store it, or hold it back.
    pub(super) async fn insert_windowed(
        tx: &mut Transaction<'_, DB>,
        task: &NewTask,
        window: &KeyWindow,
        now: Millis,
    ) -> Result<InsertOutcome> {
        let names = (
            task.task_type.as_str(),
            window.rule.kind(),
            D::key(&window.key),
        );
        sqlx::query::<DB>(D::QUERIES.open_window)
            .bind(names.0)
            .bind(names.1)
            .bind(names.2)
            .execute(&mut **tx)
            .await?;
        let row: WindowRow = sqlx::query_as::<DB, KeyWindowRow>(D::QUERIES.read_window)
            .bind(names.0)
            .bind(names.1)
            .bind(names.2)
            .fetch_one(&mut **tx)
            .await?
            .into();
        let (trigger_at, opened) = match window::step(window.rule, &row, task.trigger_at, now) {
            WindowStep::Replace { id, trigger_at } => {
                // The change's own statement: a claim of the task is given up, and a
                // task that began meanwhile is left alone (a new burst begins).
                let fold = TaskChange {
                    trigger_at: Some(trigger_at),
                    payload: Some(task.payload.get()),
                    priority: None,
                };
                if Self::apply_change(tx, &id, fold, now).await? {
                    return Ok(InsertOutcome::Debounced { id, trigger_at });
                }
                match window::open(window.rule, task.trigger_at, now) {
                    WindowStep::Insert { trigger_at, row } => (trigger_at, row),
                    other => unreachable!("a window opens with an insert, not {other:?}"),
                }
            }
            WindowStep::Insert { trigger_at, row } => (trigger_at, row),
            WindowStep::Hold { id, closes_at } => {
                Self::save_window(tx, names, Some(&id), row.opened_at, closes_at).await?;
                return Ok(InsertOutcome::Held {
                    id,
                    until: closes_at,
                    refuse: window.refuse_held,
                });
            }
        };
        let mut task = task.clone();
        task.trigger_at = trigger_at;
        let outcome = Self::insert_row(tx, &task, now).await?;
        if let InsertOutcome::Inserted { id, .. } = &outcome {
            Self::save_window(tx, names, Some(id), opened.opened_at, opened.closes_at).await?;
        }
        Ok(outcome)
    }

    async fn save_window(
        tx: &mut Transaction<'_, DB>,
        (task_type, kind, key): (&str, &str, &D::Key),
        task_id: Option<&str>,
        opened_at: Millis,
        closes_at: Millis,
    ) -> Result<()> {
        sqlx::query::<DB>(D::QUERIES.save_window)
            .bind(task_id)
            .bind(opened_at)
            .bind(closes_at)
            .bind(task_type)
            .bind(kind)
            .bind(key)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    pub async fn cancel(pool: &Pool<DB>, id: &str, now: Millis) -> Result<CancelOutcome> {
        retrying(D::transient, || async {
            let mut tx = pool.begin().await?;
            let outcome = Self::cancel_in(&mut tx, id, now).await?;
            tx.commit().await?;
            Ok(outcome)
        })
        .await
    }

    /// [`Self::cancel`] in the caller's transaction (a schedule's `CancelOther`).
    pub(super) async fn cancel_in(
        tx: &mut Transaction<'_, DB>,
        id: &str,
        now: Millis,
    ) -> Result<CancelOutcome> {
        let done = sqlx::query::<DB>(D::QUERIES.cancel)
            .bind(now)
            .bind(id)
            .execute(&mut **tx)
            .await?;
        if D::rows_affected(&done) == 1 {
            Self::fail_dependents(&mut **tx, id, now).await?;
            Ok(CancelOutcome::Cancelled)
        } else {
            let state = Self::state(tx, D::QUERIES.state, id).await?;
            // A task changed before it was consumed from Kafka is a cancelled placeholder
            // and its change: without the change, the consumer drops the message.
            if state == Some(TaskState::Cancelled) && Self::drop_change(tx, id).await? {
                return Ok(CancelOutcome::Cancelled);
            }
            Ok(domain::cancel_refused(state))
        }
    }

    /// [`super::Store::change`].
    pub async fn change(
        pool: &Pool<DB>,
        id: &str,
        change: TaskChange<'_>,
        now: Millis,
    ) -> Result<ChangeOutcome> {
        retrying(D::transient, || async {
            let mut tx = pool.begin().await?;
            let outcome = if Self::apply_change(&mut tx, id, change, now).await? {
                ChangeOutcome::Changed
            } else {
                match Self::state(&mut tx, D::QUERIES.state, id).await? {
                    None => ChangeOutcome::NotFound,
                    Some(state) => ChangeOutcome::NotChangeable(state),
                }
            };
            tx.commit().await?;
            Ok(outcome)
        })
        .await
    }

    /// The change's one conditional update of task `id` (`Queries::change`); `true` if
    /// the task was still waiting and changed.
    async fn apply_change(
        tx: &mut Transaction<'_, DB>,
        id: &str,
        change: TaskChange<'_>,
        now: Millis,
    ) -> Result<bool> {
        let done = sqlx::query::<DB>(D::QUERIES.change)
            .bind(change.trigger_at)
            .bind(change.payload)
            .bind(change.priority.map(i16::from))
            .bind(now)
            .bind(id)
            .execute(&mut **tx)
            .await?;
        Ok(D::rows_affected(&done) == 1)
    }

    /// [`super::Store::insert_cancelled`]: the task row, already `cancelled`, with no
    /// payload, keys or attempts.
    /// Drops the change waiting for task `id`, if there is one: a cancel of a task changed
    /// before it was consumed (its placeholder is cancelled already).
    async fn drop_change(tx: &mut Transaction<'_, DB>, id: &str) -> Result<bool> {
        let mut delete = sqlx::QueryBuilder::<DB>::new("DELETE FROM kafka_changes WHERE id = ");
        delete.push_bind(id);
        let done = delete.build().execute(&mut **tx).await?;
        Ok(D::rows_affected(&done) == 1)
    }

    pub async fn insert_cancelled(
        pool: &Pool<DB>,
        id: &str,
        task_type: &str,
        now: Millis,
    ) -> Result<bool> {
        let values = TaskValues::placeholder(id, task_type, now);
        let inserted = Self::insert_statement(std::slice::from_ref(&values))
            .build()
            .execute(pool)
            .await;
        match inserted {
            Ok(done) => Ok(D::rows_affected(&done) == 1),
            Err(err) if is_unique_violation(&err) => Ok(false),
            Err(err) => Err(err.into()),
        }
    }

    /// [`super::Store::expire`].
    pub async fn expire(pool: &Pool<DB>, now: Millis, limit: u32) -> Result<Vec<ExpiredTask>> {
        retrying(D::transient, || async {
            let mut tx = pool.begin().await?;
            let picked: Vec<(String, String)> = sqlx::query_as(D::QUERIES.expirable)
                .bind(now)
                .bind(i64::from(limit))
                .fetch_all(&mut *tx)
                .await?;
            let mut expired = Vec::with_capacity(picked.len());
            for (id, task_type) in picked {
                let done = sqlx::query::<DB>(D::QUERIES.expire)
                    .bind(domain::EXPIRED)
                    .bind(now)
                    .bind(id.as_str())
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                if D::rows_affected(&done) == 1 {
                    Self::fail_dependents(&mut tx, &id, now).await?;
                    expired.push(ExpiredTask { id, task_type });
                }
            }
            // Committed even when nothing was picked: see `shared::release_unique_keys`.
            tx.commit().await?;
            Ok(expired)
        })
        .await
    }
}

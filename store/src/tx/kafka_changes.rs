//! A change of a Kafka-routed task whose message still waits in the topic (migration
//! 0021): the change writes a cancelled placeholder under the task's id — as a cancel
//! ahead of consumption does — and the change itself; the consumer's insert of the
//! message then finds the id taken, and [`Tx::merge_changes`] replaces the placeholder
//! with the consumed task, changed. The tasks table's primary key orders a change and
//! the consumer's insert; the change's row lock orders a second change, a cancel and the
//! consumer's merge.

use serde_json::value::RawValue;
use sqlx::{
    Database, Encode, Executor, FromRow, IntoArguments, Pool, QueryBuilder, Transaction, Type,
};

use super::{Dialect, Tx};
use crate::rows::{Holder, KeyWindowRow, StartedRow, TaskRow};
use crate::task_row::TaskValues;
use crate::{InsertOutcome, Millis, NewTask, Result, TaskChange, is_unique_violation, retrying};

/// The placeholder's `last_error`, until the message is consumed.
pub(crate) const CHANGED_BEFORE_CONSUMED: &str =
    "changed before it was consumed from Kafka: the consumed task takes this place, changed";

/// A change as `kafka_changes` holds it.
#[derive(sqlx::FromRow)]
pub struct KafkaChangeRow {
    id: String,
    task_type: String,
    trigger_at: Option<i64>,
    payload: Option<String>,
    priority: Option<i16>,
}

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
    for<'r> KafkaChangeRow: FromRow<'r, DB::Row>,
{
    /// [`crate::Store::change_unconsumed`].
    pub async fn change_unconsumed(
        pool: &Pool<DB>,
        id: &str,
        task_type: &str,
        change: TaskChange<'_>,
        now: Millis,
    ) -> Result<bool> {
        retrying(D::transient, || async {
            let mut tx = pool.begin().await?;
            let placed = Self::place_holder(&mut tx, id, task_type, now).await?;
            let recorded = if placed {
                let mut insert = QueryBuilder::<DB>::new(
                    "INSERT INTO kafka_changes (id, task_type, trigger_at, payload, priority, \
                     changed_at) VALUES (",
                );
                let mut values = insert.separated(", ");
                values
                    .push_bind(id)
                    .push_bind(task_type)
                    .push_bind(change.trigger_at)
                    .push_bind(change.payload)
                    .push_bind(change.priority.map(i16::from))
                    .push_bind(now);
                insert.push(")");
                insert.build().execute(&mut *tx).await?;
                true
            } else {
                // A change before this one: this one goes over it, member by member.
                let mut update =
                    QueryBuilder::<DB>::new("UPDATE kafka_changes SET trigger_at = COALESCE(");
                update
                    .push_bind(change.trigger_at)
                    .push(", trigger_at), payload = COALESCE(")
                    .push_bind(change.payload)
                    .push(", payload), priority = COALESCE(")
                    .push_bind(change.priority.map(i16::from))
                    .push(", priority), changed_at = ")
                    .push_bind(now)
                    .push(" WHERE id = ")
                    .push_bind(id)
                    .push(" AND task_type = ")
                    .push_bind(task_type);
                let done = update.build().execute(&mut *tx).await?;
                D::rows_affected(&done) == 1
            };
            tx.commit().await?;
            Ok(recorded)
        })
        .await
    }

    /// Writes the cancelled placeholder of a changed task not consumed yet; `false` if
    /// the id is taken (the task was consumed, or changed or cancelled before).
    async fn place_holder(
        tx: &mut Transaction<'_, DB>,
        id: &str,
        task_type: &str,
        now: Millis,
    ) -> Result<bool> {
        let values = TaskValues {
            last_error: Some(CHANGED_BEFORE_CONSUMED),
            ..TaskValues::placeholder(id, task_type, now)
        };
        let inserted = Self::insert_statement(std::slice::from_ref(&values))
            .build()
            .execute(&mut **tx)
            .await;
        match inserted {
            Ok(done) => Ok(D::rows_affected(&done) == 1),
            Err(err) if is_unique_violation(&err) => Ok(false),
            Err(err) => Err(err.into()),
        }
    }

    /// The consumer's half of a change before consumption ([`crate::Store::insert_consumed`]):
    /// each of `consumed` whose id was found taken and has a change waiting replaces its
    /// placeholder, changed. Returns the tasks stored so, with their due time.
    pub async fn merge_changes(
        pool: &Pool<DB>,
        consumed: &[&NewTask],
        now: Millis,
    ) -> Result<Vec<(String, Millis)>> {
        if consumed.is_empty() {
            return Ok(Vec::new());
        }
        retrying(D::transient, || async {
            let mut tx = pool.begin().await?;
            let mut select = QueryBuilder::<DB>::new(
                "SELECT id, task_type, trigger_at, payload, priority FROM kafka_changes \
                 WHERE id IN (",
            );
            let mut ids = select.separated(", ");
            for task in consumed {
                ids.push_bind(task.id.as_str());
            }
            select.push(")").push(D::QUERIES.lock_rows);
            let changes: Vec<KafkaChangeRow> = select.build_query_as().fetch_all(&mut *tx).await?;
            let mut merged = Vec::new();
            for change in changes {
                let Some(task) = consumed
                    .iter()
                    .find(|task| task.id == change.id && task.task_type == change.task_type)
                else {
                    continue;
                };
                let mut delete = QueryBuilder::<DB>::new("DELETE FROM tasks WHERE id = ");
                delete
                    .push_bind(change.id.as_str())
                    .push(" AND task_type = ")
                    .push_bind(change.task_type.as_str())
                    .push(" AND state = 'cancelled'");
                let done = delete.build().execute(&mut *tx).await?;
                if D::rows_affected(&done) == 1 {
                    let mut changed = (*task).clone();
                    if let Some(at) = change.trigger_at {
                        changed.trigger_at = Millis::new(at);
                    }
                    if let Some(payload) = &change.payload
                        && let Ok(payload) = RawValue::from_string(payload.clone())
                    {
                        changed.payload = payload;
                    }
                    if let Some(priority) = change.priority {
                        changed.priority = u8::try_from(priority).unwrap_or(changed.priority);
                    }
                    if let InsertOutcome::Inserted { id, trigger_at } =
                        Self::insert_row(&mut tx, &changed, now).await?
                    {
                        merged.push((id, trigger_at));
                    }
                }
                let mut delete = QueryBuilder::<DB>::new("DELETE FROM kafka_changes WHERE id = ");
                delete.push_bind(change.id.as_str());
                delete.build().execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(merged)
        })
        .await
    }

    /// Deletes the changes made before `changed_before` whose message never came (a
    /// message the consumer could not make a task of, say), with
    /// [`crate::Store::purge_kafka_dead_letters`].
    pub async fn purge_kafka_changes(pool: &Pool<DB>, changed_before: Millis) -> Result<u64> {
        let mut delete = QueryBuilder::<DB>::new("DELETE FROM kafka_changes WHERE changed_at < ");
        delete.push_bind(changed_before);
        let done = delete.build().execute(pool).await?;
        Ok(D::rows_affected(&done))
    }
}

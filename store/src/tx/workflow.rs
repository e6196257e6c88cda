//! A workflow's tasks ([`crate::Store::insert_workflow`]): all stored in one
//! transaction, each naming its parents by the ids they were stored under, or none.

use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Type};

use super::{Dialect, Tx};
use crate::rows::{Holder, KeyWindowRow, StartedRow, TaskRow};
use crate::{InsertOutcome, Millis, NewTask, Result, WorkflowOutcome, retrying};

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
    /// [`super::Store::insert_workflow`].
    pub async fn insert_workflow(
        pool: &Pool<DB>,
        tasks: &[NewTask],
        now: Millis,
    ) -> Result<WorkflowOutcome> {
        retrying(D::transient, || async {
            let mut tx = pool.begin().await?;
            let mut stored_as: std::collections::HashMap<&str, String> =
                std::collections::HashMap::with_capacity(tasks.len());
            let mut outcomes = Vec::with_capacity(tasks.len());
            for (index, task) in tasks.iter().enumerate() {
                let mut task = task.clone();
                for dep in &mut task.depends_on {
                    if let Some(id) = stored_as.get(dep.as_str()) {
                        dep.clone_from(id);
                    }
                }
                let outcome = Self::insert_one(&mut tx, &task, now).await?;
                match &outcome {
                    InsertOutcome::Inserted { id, .. } | InsertOutcome::Duplicate { id, .. } => {
                        stored_as.insert(tasks[index].id.as_str(), id.clone());
                        outcomes.push(outcome);
                    }
                    _ => {
                        tx.rollback().await?;
                        return Ok(WorkflowOutcome::Refused { index, outcome });
                    }
                }
            }
            tx.commit().await?;
            Ok(WorkflowOutcome::Stored(outcomes))
        })
        .await
    }
}

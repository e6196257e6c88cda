//! The transactions of schedules ([`crate::schedule`]): writing them, and firing them.
//!
//! Statements are built with [`QueryBuilder`], which numbers the parameters as each
//! database wants, so one text serves the three dialects; only the lock of the firing
//! pass is the dialect's ([`crate::shared::Queries::lock_skipping`]).

use sqlx::{
    Database, Encode, Executor, FromRow, IntoArguments, Pool, QueryBuilder, Transaction, Type,
};

use super::{Dialect, Tx};
use crate::rows::{Holder, KeyWindowRow, StartedRow, TaskRow};
use crate::schedule::{
    BUFFER_RECHECK, ConfigSchedule, FireParams, FirePass, Fired, FiringOutcome, Planner,
    PutSchedule, ScheduleRecord, ScheduleSource,
};
use crate::{CancelOutcome, InsertOutcome, Millis, Result, is_unique_violation, retrying};
use asyncd_spec::job::Overlap;

/// The columns of [`ScheduleRow`], in its order.
const COLUMNS: &str = "task_type, name, source, spec, paused, next_at, wake_at, buffered_at, \
                       last_task_id, last_fired_at, fired, version, created_at, updated_at";

/// A row of `schedules` as read.
#[derive(sqlx::FromRow)]
pub struct ScheduleRow {
    task_type: String,
    name: String,
    source: String,
    spec: String,
    paused: i64,
    next_at: Option<i64>,
    wake_at: Option<i64>,
    buffered_at: Option<i64>,
    last_task_id: Option<String>,
    last_fired_at: Option<i64>,
    fired: i64,
    version: i64,
    created_at: i64,
    updated_at: i64,
}

impl From<ScheduleRow> for ScheduleRecord {
    fn from(row: ScheduleRow) -> Self {
        Self {
            task_type: row.task_type,
            name: row.name,
            source: ScheduleSource::parse(&row.source),
            spec: row.spec,
            paused: row.paused != 0,
            next_at: row.next_at.map(Millis::new),
            wake_at: row.wake_at.map(Millis::new),
            buffered_at: row.buffered_at.map(Millis::new),
            last_task_id: row.last_task_id,
            last_fired_at: row.last_fired_at.map(Millis::new),
            fired: u64::try_from(row.fired).unwrap_or(0),
            version: row.version,
            created_at: Millis::new(row.created_at),
            updated_at: Millis::new(row.updated_at),
        }
    }
}

/// Where a put schedule first wakes a scheduler: at once, to plan it, unless paused.
fn first_wake(put: &PutSchedule<'_>) -> Option<Millis> {
    (!put.paused).then_some(put.now)
}

// `Tx`'s bounds (tx.rs), repeated, and the schedule row's.
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
    for<'r> ScheduleRow: FromRow<'r, DB::Row>,
{
    /// [`crate::Store::create_schedule`].
    pub async fn create_schedule(
        pool: &Pool<DB>,
        put: PutSchedule<'_>,
    ) -> Result<Option<ScheduleRecord>> {
        match Self::schedule_insert(&put).build().execute(pool).await {
            Ok(_) => {}
            Err(err) if is_unique_violation(&err) => return Ok(None),
            Err(err) => return Err(err.into()),
        }
        Ok(Some(ScheduleRecord {
            task_type: put.task_type.to_string(),
            name: put.name.to_string(),
            source: put.source,
            spec: put.spec.to_string(),
            paused: put.paused,
            next_at: None,
            wake_at: first_wake(&put),
            buffered_at: None,
            last_task_id: None,
            last_fired_at: None,
            fired: 0,
            version: 1,
            created_at: put.now,
            updated_at: put.now,
        }))
    }

    /// [`crate::Store::update_schedule`].
    pub async fn update_schedule(
        pool: &Pool<DB>,
        put: PutSchedule<'_>,
        version: Option<i64>,
    ) -> Result<Option<ScheduleRecord>> {
        let done = Self::schedule_update(&put, version)
            .build()
            .execute(pool)
            .await?;
        if D::rows_affected(&done) == 0 {
            return Ok(None);
        }
        Self::get_schedule(pool, put.task_type, put.name).await
    }

    /// The insert of a new schedule row.
    fn schedule_insert(put: &PutSchedule<'_>) -> QueryBuilder<DB> {
        let mut insert =
            QueryBuilder::<DB>::new(format!("INSERT INTO schedules ({COLUMNS}) VALUES ("));
        let mut values = insert.separated(", ");
        values
            .push_bind(put.task_type)
            .push_bind(put.name)
            .push_bind(put.source.as_str())
            .push_bind(put.spec)
            .push_bind(i64::from(put.paused))
            .push_bind(None::<Millis>)
            .push_bind(first_wake(put))
            .push_bind(None::<Millis>)
            .push_bind(None::<&str>)
            .push_bind(None::<Millis>)
            .push_bind(0_i64)
            .push_bind(1_i64)
            .push_bind(put.now)
            .push_bind(put.now);
        insert.push(")");
        insert
    }

    /// The write over a schedule row (only at `version`, if given), planning it afresh.
    fn schedule_update(put: &PutSchedule<'_>, version: Option<i64>) -> QueryBuilder<DB> {
        let mut update = QueryBuilder::<DB>::new("UPDATE schedules SET source = ");
        update
            .push_bind(put.source.as_str())
            .push(", spec = ")
            .push_bind(put.spec)
            .push(", paused = ")
            .push_bind(i64::from(put.paused))
            .push(", next_at = NULL, buffered_at = NULL, wake_at = ")
            .push_bind(first_wake(put))
            .push(", version = version + 1, updated_at = ")
            .push_bind(put.now)
            .push(" WHERE task_type = ")
            .push_bind(put.task_type)
            .push(" AND name = ")
            .push_bind(put.name);
        if let Some(version) = version {
            update.push(" AND version = ").push_bind(version);
        }
        update
    }

    /// [`crate::Store::get_schedule`].
    pub async fn get_schedule(
        pool: &Pool<DB>,
        task_type: &str,
        name: &str,
    ) -> Result<Option<ScheduleRecord>> {
        let mut select = QueryBuilder::<DB>::new(format!(
            "SELECT {COLUMNS} FROM schedules WHERE task_type = "
        ));
        select
            .push_bind(task_type)
            .push(" AND name = ")
            .push_bind(name);
        let row: Option<ScheduleRow> = select.build_query_as().fetch_optional(pool).await?;
        Ok(row.map(Into::into))
    }

    /// [`crate::Store::list_schedules`].
    pub async fn list_schedules(
        pool: &Pool<DB>,
        task_type: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ScheduleRecord>> {
        let mut select = QueryBuilder::<DB>::new(format!(
            "SELECT {COLUMNS} FROM schedules WHERE task_type = "
        ));
        select.push_bind(task_type);
        if let Some(after) = after {
            select.push(" AND name > ").push_bind(after);
        }
        select
            .push(" ORDER BY name LIMIT ")
            .push_bind(i64::from(limit));
        let rows: Vec<ScheduleRow> = select.build_query_as().fetch_all(pool).await?;
        Ok(rows.into_iter().map(Into::into).collect())
    }

    /// [`crate::Store::delete_schedule`].
    pub async fn delete_schedule(pool: &Pool<DB>, task_type: &str, name: &str) -> Result<bool> {
        let mut delete = QueryBuilder::<DB>::new("DELETE FROM schedules WHERE task_type = ");
        delete
            .push_bind(task_type)
            .push(" AND name = ")
            .push_bind(name);
        let done = delete.build().execute(pool).await?;
        Ok(D::rows_affected(&done) == 1)
    }

    /// [`crate::Store::sync_config_schedules`].
    pub async fn sync_config_schedules(
        pool: &Pool<DB>,
        task_type: &str,
        entries: &[ConfigSchedule],
        now: Millis,
    ) -> Result<()> {
        retrying(D::transient, || async {
            let mut tx = pool.begin().await?;
            // The job's config schedules, and any of the entries' names (an API
            // schedule a new entry takes over): never the job's every schedule.
            let mut select = QueryBuilder::<DB>::new(format!(
                "SELECT {COLUMNS} FROM schedules WHERE task_type = "
            ));
            select.push_bind(task_type).push(" AND source = 'config'");
            if !entries.is_empty() {
                select
                    .push(" UNION SELECT ")
                    .push(COLUMNS)
                    .push(" FROM schedules WHERE task_type = ")
                    .push_bind(task_type)
                    .push(" AND name IN (");
                let mut names = select.separated(", ");
                for entry in entries {
                    names.push_bind(entry.name.as_str());
                }
                select.push(")");
            }
            let rows: Vec<ScheduleRow> = select.build_query_as().fetch_all(&mut *tx).await?;
            let rows: Vec<ScheduleRecord> = rows.into_iter().map(Into::into).collect();
            for entry in entries {
                let put = PutSchedule {
                    task_type,
                    name: &entry.name,
                    source: ScheduleSource::Config,
                    spec: &entry.spec,
                    paused: entry.paused,
                    now,
                };
                match rows.iter().find(|row| row.name == entry.name) {
                    Some(row)
                        if row.source == ScheduleSource::Config
                            && row.spec == entry.spec
                            && row.paused == entry.paused => {}
                    Some(row) => {
                        if row.source == ScheduleSource::Api {
                            tracing::warn!(
                                task_type,
                                schedule = entry.name,
                                "a cron entry of the job's config takes over the API schedule of its name"
                            );
                        }
                        Self::schedule_update(&put, None).build().execute(&mut *tx).await?;
                    }
                    None => {
                        Self::schedule_insert(&put).build().execute(&mut *tx).await?;
                    }
                }
            }
            for gone in rows.iter().filter(|row| {
                row.source == ScheduleSource::Config && !entries.iter().any(|e| e.name == row.name)
            }) {
                let mut delete =
                    QueryBuilder::<DB>::new("DELETE FROM schedules WHERE task_type = ");
                delete
                    .push_bind(task_type)
                    .push(" AND name = ")
                    .push_bind(gone.name.as_str());
                delete.build().execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    /// [`crate::Store::cancel_firings`].
    pub async fn cancel_firings(pool: &Pool<DB>, cron_keys: &[String], now: Millis) -> Result<u64> {
        if cron_keys.is_empty() {
            return Ok(0);
        }
        let mut update = QueryBuilder::<DB>::new(
            "UPDATE tasks SET state = 'cancelled', unique_active = NULL, lease_until = NULL, \
             lease_token = lease_token + 1, last_error = 'its schedule was paused or deleted', \
             updated_at = ",
        );
        update
            .push_bind(now)
            .push(" WHERE state IN ('pending', 'claimed') AND trigger_at > ")
            .push_bind(now)
            .push(" AND cron_key IN (");
        let mut keys = update.separated(", ");
        for key in cron_keys {
            keys.push_bind(D::key(key));
        }
        update.push(")");
        let done = update.build().execute(pool).await?;
        Ok(D::rows_affected(&done))
    }

    /// [`crate::Store::fire_schedules`].
    pub async fn fire_schedules(
        pool: &Pool<DB>,
        params: FireParams,
        planner: Planner<'_>,
    ) -> Result<FirePass> {
        retrying(D::transient, || async {
            let mut tx = pool.begin().await?;
            let mut select = QueryBuilder::<DB>::new(format!(
                "SELECT {COLUMNS} FROM schedules WHERE wake_at <= "
            ));
            select
                .push_bind(params.wake_by)
                .push(" ORDER BY wake_at LIMIT ")
                .push_bind(i64::from(params.limit))
                .push(D::QUERIES.lock_skipping);
            let rows: Vec<ScheduleRow> = select.build_query_as().fetch_all(&mut *tx).await?;
            let mut fired = Vec::new();
            let schedules = rows.len();
            for row in rows {
                let mut row = ScheduleRecord::from(row);
                let plan = planner(&row);
                for firing in plan.firings {
                    let outcome =
                        Self::fire_one(&mut tx, &mut row, &firing, plan.overlap, params.now)
                            .await?;
                    fired.push(Fired {
                        task_type: row.task_type.clone(),
                        name: row.name.clone(),
                        at: firing.at,
                        task: firing.task,
                        outcome,
                    });
                }
                let mut wake_at = plan.wake_at;
                if row.buffered_at.is_some() {
                    let recheck = params.now + BUFFER_RECHECK;
                    wake_at = Some(wake_at.map_or(recheck, |at| at.min(recheck)));
                }
                let mut update = QueryBuilder::<DB>::new("UPDATE schedules SET next_at = ");
                update
                    .push_bind(plan.next_at)
                    .push(", wake_at = ")
                    .push_bind(wake_at)
                    .push(", buffered_at = ")
                    .push_bind(row.buffered_at)
                    .push(", last_task_id = ")
                    .push_bind(row.last_task_id.as_deref())
                    .push(", last_fired_at = ")
                    .push_bind(row.last_fired_at)
                    .push(", fired = ")
                    .push_bind(i64::try_from(row.fired).unwrap_or(i64::MAX))
                    .push(", version = version + 1 WHERE task_type = ")
                    .push_bind(row.task_type.as_str())
                    .push(" AND name = ")
                    .push_bind(row.name.as_str());
                update.build().execute(&mut *tx).await?;
            }
            tx.commit().await?;
            Ok(FirePass { schedules, fired })
        })
        .await
    }

    /// Stores one planned firing of `row` under its overlap policy, noting on `row`
    /// what it created or held back.
    async fn fire_one(
        tx: &mut Transaction<'_, DB>,
        row: &mut ScheduleRecord,
        firing: &crate::schedule::PlannedFiring,
        overlap: Overlap,
        now: Millis,
    ) -> Result<FiringOutcome> {
        let mut cancelled = None;
        loop {
            let outcome = match Self::insert_one(tx, &firing.task, now).await? {
                InsertOutcome::Inserted { id, .. } => {
                    row.last_task_id = Some(id.clone());
                    row.last_fired_at = Some(firing.at);
                    row.fired += 1;
                    if firing.buffered {
                        row.buffered_at = None;
                    }
                    match cancelled {
                        Some(cancelled) => FiringOutcome::Replaced { id, cancelled },
                        None => FiringOutcome::Created { id },
                    }
                }
                InsertOutcome::Duplicate { id, .. } => {
                    if firing.buffered {
                        row.buffered_at = None;
                    }
                    FiringOutcome::Existed { id }
                }
                InsertOutcome::UniqueConflict { existing_id } => match overlap {
                    Overlap::CancelOther if cancelled.is_none() => {
                        // Cancelled in this transaction, then the firing tried again: it
                        // then finds the key free.
                        if Self::cancel_in(tx, &existing_id, now).await? == CancelOutcome::Cancelled
                        {
                            cancelled = Some(existing_id);
                            continue;
                        }
                        FiringOutcome::Skipped {
                            running: existing_id,
                        }
                    }
                    Overlap::BufferOne if firing.buffered => FiringOutcome::Buffered {
                        running: existing_id,
                    },
                    Overlap::BufferOne if row.buffered_at.is_none() => {
                        row.buffered_at = Some(firing.at);
                        FiringOutcome::Buffered {
                            running: existing_id,
                        }
                    }
                    _ => FiringOutcome::Skipped {
                        running: existing_id,
                    },
                },
                other => FiringOutcome::Refused {
                    reason: format!("{other:?}"),
                },
            };
            return Ok(outcome);
        }
    }
}

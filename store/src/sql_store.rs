//! [`Store`], implemented once for every SQL [`Backend`]: a [`Dialect`] with its pools
//! (SQLite writes through one connection and reads through others) and the few
//! operations it does its own way — migrations, claims, `start` and `finish`. Every
//! other method runs the shared bodies of [`Tx`] and [`shared`] on the backend's pools.

use std::collections::BTreeMap;

use async_trait::async_trait;
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Type};

use crate::bulk;
use crate::fair_claim;
use crate::job_gate::{RowLock, start_due_in};
use crate::limit_rows;
use crate::limited_start;
use crate::rows::{self, DueBacklogRow, Holder, JobCountsRow, LapsedRow, StartedRow, TaskRow};
use crate::shared::{self, KafkaDeadLetterRow};
use crate::tx::{ClaimAtInsert, Tx};
use crate::*;

mod backend;
pub use backend::Backend;

/// The count of a job's running attempts per concurrency key, around its two lists of
/// parameters (the task type; the keys, then `) GROUP BY concurrency_key`). The
/// repeated `state IN (…)` term is for SQLite, which uses a partial index (`tasks_keyed`)
/// only where the statement repeats its terms.
pub(crate) const RUNNING_PER_KEY: (&str, &str) = (
    "SELECT concurrency_key, COUNT(*) FROM tasks WHERE task_type = ",
    " AND state = 'running' AND state IN ('pending', 'claimed', 'running') \
     AND concurrency_key IN (",
);

#[async_trait]
impl<B, DB> Store for B
where
    B: Backend<DB = DB>,
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q str>: Encode<'q, DB> + Type<DB>,
    for<'q> &'q B::Key: Encode<'q, DB> + Type<DB>,
    for<'q> Option<&'q B::Key>: Encode<'q, DB> + Type<DB>,
    for<'q> Millis: Encode<'q, DB> + Type<DB>,
    for<'q> Option<Millis>: Encode<'q, DB> + Type<DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
    for<'q> i16: Encode<'q, DB> + Type<DB>,
    for<'q> Option<i16>: Encode<'q, DB> + Type<DB>,
    for<'r> (String,): FromRow<'r, DB::Row>,
    for<'r> (String, String): FromRow<'r, DB::Row>,
    for<'r> Holder: FromRow<'r, DB::Row>,
    for<'r> rows::KeyWindowRow: FromRow<'r, DB::Row>,
    for<'r> StartedRow: FromRow<'r, DB::Row>,
    for<'r> TaskRow: FromRow<'r, DB::Row>,
    for<'r> JobCountsRow: FromRow<'r, DB::Row>,
    for<'r> DueBacklogRow: FromRow<'r, DB::Row>,
    for<'r> LapsedRow: FromRow<'r, DB::Row>,
    for<'r> crate::tx::ScheduleRow: FromRow<'r, DB::Row>,
    for<'r> crate::tx::KafkaChangeRow: FromRow<'r, DB::Row>,
    for<'r> KafkaDeadLetterRow: FromRow<'r, DB::Row>,
    for<'r> (i64,): FromRow<'r, DB::Row>,
    for<'r> (String, i64): FromRow<'r, DB::Row>,
    for<'r> (i64, i64): FromRow<'r, DB::Row>,
    for<'r> (i64, i64, i64): FromRow<'r, DB::Row>,
    for<'r> (rows::Key, i64, i64): FromRow<'r, DB::Row>,
    for<'q> &'q [u8]: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
    for<'r> (rows::Key, i64): FromRow<'r, DB::Row>,
    for<'r> (String, Option<rows::Key>): FromRow<'r, DB::Row>,
    for<'r> (Option<rows::Key>, i64): FromRow<'r, DB::Row>,
    for<'r> (rows::Key, Option<String>): FromRow<'r, DB::Row>,
    for<'r> (rows::Key,): FromRow<'r, DB::Row>,
    for<'r> (String,): FromRow<'r, DB::Row>,
    for<'r> (String, rows::Key, Millis): FromRow<'r, DB::Row>,
{
    async fn migrate(&self) -> Result<()> {
        self.run_migrations().await
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query::<DB>("SELECT 1").execute(self.reader()).await?;
        Ok(())
    }

    async fn insert(&self, tasks: &[NewTask], now: Millis) -> Result<Vec<InsertOutcome>> {
        Tx::<B>::insert(self.writer(), tasks, now).await
    }

    async fn insert_workflow(
        &self,
        tasks: &[NewTask],
        now: Millis,
    ) -> Result<super::WorkflowOutcome> {
        Tx::<B>::insert_workflow(self.writer(), tasks, now).await
    }

    async fn get(&self, id: &str) -> Result<Option<TaskRecord>> {
        shared::get(self.reader(), &B::QUERIES, id).await
    }

    async fn cancel(&self, id: &str, now: Millis) -> Result<CancelOutcome> {
        Tx::<B>::cancel(self.writer(), id, now).await
    }

    async fn change(&self, id: &str, change: TaskChange<'_>, now: Millis) -> Result<ChangeOutcome> {
        Tx::<B>::change(self.writer(), id, change, now).await
    }

    async fn insert_cancelled(&self, id: &str, task_type: &str, now: Millis) -> Result<bool> {
        Tx::<B>::insert_cancelled(self.writer(), id, task_type, now).await
    }

    async fn change_unconsumed(
        &self,
        id: &str,
        task_type: &str,
        change: TaskChange<'_>,
        now: Millis,
    ) -> Result<bool> {
        Tx::<B>::change_unconsumed(self.writer(), id, task_type, change, now).await
    }

    async fn claim(&self, params: ClaimParams<'_>) -> Result<Vec<ClaimedTask>> {
        self.claim_due(params).await
    }

    async fn claim_ids(&self, params: ClaimIdsParams<'_>) -> Result<Vec<ClaimedTask>> {
        self.claim_named(params).await
    }

    /// The new due tasks are claimed as they are inserted where the dialect inserts many
    /// rows per statement (one write each instead of two); the rest (MariaDB's, and any
    /// inserted one by one) are claimed after, as [`Store::claim_ids`] does.
    async fn insert_consumed(&self, params: InsertConsumedParams<'_>) -> Result<Consumed> {
        let claim = ClaimAtInsert {
            owner: params.owner,
            hold: params.hold,
            horizon: params.horizon,
            room: None,
        };
        let (outcomes, mut claimed) =
            Tx::<B>::insert_claiming(self.writer(), params.tasks, params.now, Some(&claim)).await?;
        let taken: std::collections::HashSet<&str> =
            claimed.iter().map(|task| task.id.as_str()).collect();
        let mut due: Vec<String> = params
            .tasks
            .iter()
            .zip(&outcomes)
            .filter(|(task, outcome)| {
                matches!(outcome, InsertOutcome::Inserted { .. })
                    && task.trigger_at <= params.horizon
                    && !taken.contains(task.id.as_str())
            })
            .map(|(task, _)| task.id.clone())
            .collect();
        // An id found taken: a message consumed twice, or a task changed (or cancelled)
        // before it was consumed, whose change takes its placeholder's place. Rare, so
        // the look for changes costs nothing on the common path.
        let taken_ids: Vec<&NewTask> = params
            .tasks
            .iter()
            .zip(&outcomes)
            .filter(|(_, outcome)| {
                matches!(
                    outcome,
                    InsertOutcome::IdTaken { .. } | InsertOutcome::Duplicate { .. }
                )
            })
            .map(|(task, _)| task)
            .collect();
        if !taken_ids.is_empty() {
            let merged = Tx::<B>::merge_changes(self.writer(), &taken_ids, params.now).await?;
            due.extend(
                merged
                    .into_iter()
                    .filter(|(_, trigger_at)| *trigger_at <= params.horizon)
                    .map(|(id, _)| id),
            );
        }
        if !due.is_empty() {
            claimed.extend(
                self.claim_named(ClaimIdsParams {
                    ids: &due,
                    now: params.now,
                    hold: params.hold,
                    owner: params.owner,
                })
                .await?,
            );
        }
        let refused = outcomes
            .into_iter()
            .enumerate()
            .filter(|(_, outcome)| outcome.is_refusal())
            .collect();
        Ok(Consumed { claimed, refused })
    }

    async fn insert_claiming(
        &self,
        tasks: &[NewTask],
        now: Millis,
        claim: ClaimAtInsert<'_>,
    ) -> Result<(Vec<InsertOutcome>, Vec<ClaimedTask>)> {
        Tx::<B>::insert_claiming(self.writer(), tasks, now, Some(&claim)).await
    }

    async fn find_idempotent(&self, task: &NewTask) -> Result<Option<InsertOutcome>> {
        Tx::<B>::find_idempotent(self.reader(), task).await
    }

    async fn idempotency_key_holder(&self, task_type: &str, key: &str) -> Result<Option<String>> {
        Ok(
            Tx::<B>::idempotency_key_holder(self.reader(), task_type, key)
                .await?
                .map(|holder| holder.id),
        )
    }

    async fn start(&self, params: StartParams<'_>) -> Result<Vec<Started>> {
        self.start_claims(params).await
    }

    async fn start_limited(&self, params: StartParams<'_>, gate: JobGate<'_>) -> Result<Admitted> {
        retrying(B::transient, || async {
            let mut tx = self.writer().begin().await?;
            let admitted = limited_start::start_limited_in::<B>(&mut tx, params, &gate).await?;
            tx.commit().await?;
            Ok(admitted)
        })
        .await
    }

    async fn start_due(&self, params: StartDueParams<'_>, gate: JobGate<'_>) -> Result<DueStarted> {
        if gate.key_limit.is_some() {
            return Err(StoreError::Corrupt(
                "a job with a concurrency key begins its claims, in turns".into(),
            ));
        }
        if params.probe {
            let due: Option<(i64,)> = sqlx::query_as(B::QUERIES.due_exists)
                .bind(gate.task_type)
                .bind(params.now)
                .bind(params.now)
                .fetch_optional(self.reader())
                .await?;
            if due.is_none() {
                return Ok(DueStarted {
                    tasks: Vec::new(),
                    held_by: None,
                });
            }
        }
        retrying(B::transient, || async {
            let mut tx = self.writer().begin().await?;
            let started = start_due_in::<B>(&mut tx, params, &gate, RowLock::Wait).await?;
            tx.commit().await?;
            Ok(started)
        })
        .await
    }

    async fn finish_and_start_due(
        &self,
        finishes: &[Finish],
        now: Millis,
        starts: &[DueStart<'_>],
    ) -> Result<(Vec<bool>, Vec<DueStarted>)> {
        if starts.iter().any(|start| start.gate.key_limit.is_some()) {
            return Err(StoreError::Corrupt(
                "a job with a concurrency key begins its claims, in turns".into(),
            ));
        }
        // The limits rows are taken in one order, so two dispatchers' writes never wait
        // on each other's.
        let mut order: Vec<usize> = (0..starts.len()).collect();
        order.sort_by_key(|&i| starts[i].gate.task_type);
        retrying(B::transient, || async {
            let mut tx = self.writer().begin().await?;
            let applied = B::finish_on(&mut tx, finishes, now).await?;
            let mut started: Vec<Option<DueStarted>> = vec![None; starts.len()];
            for &i in &order {
                let start = &starts[i];
                let start =
                    start_due_in::<B>(&mut tx, start.params, &start.gate, RowLock::SkipIfHeld)
                        .await?;
                started[i] = Some(start);
            }
            tx.commit().await?;
            Ok((applied, started.into_iter().flatten().collect()))
        })
        .await
    }

    async fn claim_fair(&self, params: ClaimParams<'_>, fair: FairParams<'_>) -> Result<FairClaim> {
        let super::TypeFilter::Only(types) = params.types else {
            return Err(StoreError::Corrupt("a fair claim is of one job".into()));
        };
        let [task_type] = types.as_slice() else {
            return Err(StoreError::Corrupt("a fair claim is of one job".into()));
        };
        let fair_claim::Picked { ids, last_key } =
            fair_claim::pick::<B, DB>(self.writer(), task_type, &params, &fair).await?;
        if ids.is_empty() {
            return Ok(FairClaim {
                tasks: Vec::new(),
                last_key,
            });
        }
        // Claimed by id, only those still pending: another dispatcher's claim between
        // the two statements takes a task from this one, never twice.
        let tasks = self
            .claim_named(ClaimIdsParams {
                ids: &ids,
                now: params.now,
                hold: params.hold,
                owner: params.owner,
            })
            .await?;
        Ok(FairClaim { tasks, last_key })
    }

    async fn finish(&self, finishes: &[Finish], now: Millis) -> Result<Vec<bool>> {
        retrying(B::transient, || async {
            let mut tx = self.writer().begin().await?;
            let applied = B::finish_on(&mut tx, finishes, now).await?;
            tx.commit().await?;
            Ok(applied)
        })
        .await
    }

    async fn cool_down_key(&self, task_type: &str, key: &str, ends_at: Millis) -> Result<()> {
        retrying(B::transient, || async {
            sqlx::query::<B::DB>(B::QUERIES.cool_down_key)
                .bind(task_type)
                .bind(B::key(key))
                .bind(ends_at)
                .execute(self.writer())
                .await?;
            Ok(())
        })
        .await
    }

    async fn purge_key_cooldowns(&self, ended_before: Millis, limit: u32) -> Result<u64> {
        // A bucket idle for a day is full again at any rate but one whose burst takes
        // longer to refill; deleted, it is made full at its key's next start.
        const IDLE_BUCKET: Duration = Duration::from_secs(24 * 3600);
        let mut purged = 0;
        for (statement, before) in [
            (B::QUERIES.purge_cooldowns, ended_before),
            (
                B::QUERIES.purge_key_buckets,
                ended_before.saturating_sub(IDLE_BUCKET),
            ),
        ] {
            purged += retrying(B::transient, || async {
                let done = sqlx::query::<B::DB>(statement)
                    .bind(before)
                    .bind(i64::from(limit))
                    .execute(self.writer())
                    .await?;
                Ok(B::rows_affected(&done))
            })
            .await?;
        }
        Ok(purged)
    }

    async fn purge_key_windows(&self, closed_before: Millis, limit: u32) -> Result<u64> {
        retrying(B::transient, || async {
            let done = sqlx::query::<B::DB>(B::QUERIES.purge_windows)
                .bind(closed_before)
                .bind(i64::from(limit))
                .execute(self.writer())
                .await?;
            Ok(B::rows_affected(&done))
        })
        .await
    }

    async fn expire(&self, now: Millis, limit: u32) -> Result<Vec<ExpiredTask>> {
        Tx::<B>::expire(self.writer(), now, limit).await
    }

    async fn lapsed_leases(&self, now: Millis, limit: u32) -> Result<Vec<Lapsed>> {
        shared::lapsed_leases(self.reader(), &B::QUERIES, now, limit).await
    }

    async fn dead_letters(&self, params: DeadLetterParams<'_>) -> Result<Vec<TaskRecord>> {
        Tx::<B>::dead_letters(self.reader(), params).await
    }

    async fn redrive(&self, id: &str, now: Millis) -> Result<RedriveOutcome> {
        Tx::<B>::redrive(self.writer(), id, now).await
    }

    async fn search(&self, params: SearchParams<'_>) -> Result<Vec<TaskRecord>> {
        shared::search(self.reader(), params).await
    }

    async fn purge(&self, params: PurgeParams<'_>) -> Result<u64> {
        retrying(B::transient, || {
            shared::purge(self.writer(), &B::QUERIES, params)
        })
        .await
    }

    async fn release_unique_keys(&self, now: Millis, limit: u32) -> Result<u64> {
        retrying(B::transient, || {
            shared::release_unique_keys(self.writer(), &B::QUERIES, now, limit)
        })
        .await
    }

    async fn count_dead(&self, filter: DeadFilter<'_>) -> Result<DeadCount> {
        bulk::count(self.reader(), filter).await
    }

    async fn act_on_dead(&self, filter: DeadFilter<'_>, limit: u32, now: Millis) -> Result<u64> {
        match filter.action {
            BulkAction::Purge => {
                retrying(B::transient, || {
                    bulk::purge::<B, DB>(self.writer(), filter, limit)
                })
                .await
            }
            BulkAction::Redrive => {
                let (ids, bulk) = retrying(B::transient, || {
                    bulk::redrive_picked::<B, DB>(self.writer(), filter, limit, now)
                })
                .await?;
                let mut redriven = bulk.unwrap_or(0);
                if redriven == ids.len() as u64 {
                    return Ok(redriven);
                }
                // Tasks with dependencies, or a unique key the one UPDATE hit: one at a
                // time, each as `POST /v1/dead-letters/{id}/redrive` (those the UPDATE
                // redrove are no longer dead and are left alone).
                for id in &ids {
                    if let RedriveOutcome::Redriven { .. } =
                        Tx::<B>::redrive(self.writer(), id, now).await?
                    {
                        redriven += 1;
                    }
                }
                Ok(redriven)
            }
        }
    }

    async fn job_counts(&self, params: JobCountParams<'_>) -> Result<JobCounts> {
        job_counts::job_counts(self.reader(), params).await
    }

    async fn resting_keys(
        &self,
        task_type: &str,
        now: Millis,
        limit: u32,
    ) -> Result<Vec<(String, Millis)>> {
        job_counts::resting_keys(self.reader(), task_type, now, limit).await
    }

    async fn running_attempts(&self, task_types: &[String]) -> Result<u64> {
        let mut running = 0;
        for task_type in task_types {
            let (count,): (i64,) = sqlx::query_as(B::QUERIES.running)
                .bind(task_type.as_str())
                .fetch_one(self.reader())
                .await?;
            running += u64::try_from(count).unwrap_or(0);
        }
        Ok(running)
    }

    async fn rate_bucket(&self, of: RateBucket<'_>) -> Result<Option<domain::Bucket>> {
        limit_rows::rate_bucket(self, of).await
    }

    async fn set_tenant_weight(
        &self,
        task_type: &str,
        tenant: &str,
        weight: Option<u32>,
        now: Millis,
    ) -> Result<bool> {
        limit_rows::set_tenant_weight(self, task_type, tenant, weight, now).await
    }

    async fn tenant_weights(&self, task_type: &str) -> Result<BTreeMap<String, u32>> {
        limit_rows::tenant_weights(self, task_type).await
    }

    async fn usage(
        &self,
        task_type: &str,
        by: UsageBy,
        now: Millis,
        cap: u64,
        limit: u32,
    ) -> Result<Vec<UsageCounts>> {
        job_counts::usage::<B, DB>(self.reader(), task_type, by, now, cap, limit).await
    }

    async fn due_backlog(&self, params: JobCountParams<'_>) -> Result<DueBacklog> {
        job_counts::due_backlog(self.reader(), params).await
    }

    async fn heartbeat_member(&self, member: &str, now: Millis, shares: &Shares) -> Result<()> {
        shared::heartbeat_member(self.writer(), &B::QUERIES, member, now, shares).await
    }

    async fn live_members(&self, since: Millis) -> Result<Vec<String>> {
        shared::live_members(self.reader(), &B::QUERIES, since).await
    }

    async fn heartbeat_and_list_members(
        &self,
        member: &str,
        now: Millis,
        shares: &Shares,
        live_since: Millis,
    ) -> Result<Vec<String>> {
        shared::heartbeat_and_list_members(
            self.writer(),
            &B::QUERIES,
            member,
            now,
            shares,
            live_since,
        )
        .await
    }

    async fn live_shares(&self, since: Millis) -> Result<BTreeMap<String, u64>> {
        shared::live_shares(self.reader(), &B::QUERIES, since).await
    }

    async fn remove_member(&self, member: &str) -> Result<()> {
        shared::remove_member(self.writer(), &B::QUERIES, member).await
    }

    async fn release_claims(&self, owner: &str, now: Millis) -> Result<u64> {
        let done = shared::release_claims(self.writer(), &B::QUERIES, owner, now).await?;
        Ok(B::rows_affected(&done))
    }

    async fn database_clock(&self) -> Result<Option<Millis>> {
        let Some(statement) = B::QUERIES.database_clock else {
            return Ok(None);
        };
        let ms = sqlx::query_scalar::<DB, i64>(statement)
            .fetch_one(self.reader())
            .await?;
        Ok(Some(Millis::new(ms)))
    }

    async fn dead_rows(&self) -> Result<Option<DeadRows>> {
        self.table_dead_rows().await
    }

    async fn reclaim_dead_rows(&self) -> Result<()> {
        self.reclaim_table_dead_rows().await
    }

    async fn record_kafka_dead_letter(&self, letter: &KafkaDeadLetter) -> Result<()> {
        shared::record_kafka_dead_letter(self.writer(), &B::QUERIES, letter).await
    }

    async fn kafka_dead_letters(
        &self,
        params: KafkaDeadLetterParams<'_>,
    ) -> Result<Vec<KafkaDeadLetter>> {
        shared::kafka_dead_letters(self.reader(), params).await
    }

    async fn purge_kafka_dead_letters(&self, recorded_before: Millis, limit: u32) -> Result<u64> {
        let done = retrying(B::transient, || async {
            Ok(sqlx::query::<DB>(B::QUERIES.purge_kafka_dead_letters)
                .bind(recorded_before)
                .bind(i64::from(limit))
                .execute(self.writer())
                .await?)
        })
        .await?;
        Tx::<B>::purge_kafka_changes(self.writer(), recorded_before).await?;
        Ok(B::rows_affected(&done))
    }

    async fn pause(&self, task_type: &str, now: Millis) -> Result<Millis> {
        let mut tx = self.writer().begin().await?;
        sqlx::query::<DB>(B::QUERIES.pause)
            .bind(task_type)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        let since = sqlx::query_as::<DB, (String, i64)>(B::QUERIES.paused_types)
            .fetch_all(&mut *tx)
            .await?
            .into_iter()
            .find(|(paused, _)| paused == task_type)
            .map_or(now, |(_, at)| Millis::new(at));
        tx.commit().await?;
        Ok(since)
    }

    async fn resume(&self, task_type: &str) -> Result<bool> {
        let done = sqlx::query::<DB>(B::QUERIES.resume)
            .bind(task_type)
            .execute(self.writer())
            .await?;
        Ok(B::rows_affected(&done) > 0)
    }

    async fn paused_types(&self) -> Result<Vec<(String, Millis)>> {
        Ok(sqlx::query_as::<DB, (String, i64)>(B::QUERIES.paused_types)
            .fetch_all(self.reader())
            .await?
            .into_iter()
            .map(|(task_type, at)| (task_type, Millis::new(at)))
            .collect())
    }

    async fn create_schedule(&self, put: PutSchedule<'_>) -> Result<Option<ScheduleRecord>> {
        Tx::<B>::create_schedule(self.writer(), put).await
    }

    async fn update_schedule(
        &self,
        put: PutSchedule<'_>,
        version: Option<i64>,
    ) -> Result<Option<ScheduleRecord>> {
        Tx::<B>::update_schedule(self.writer(), put, version).await
    }

    async fn get_schedule(&self, task_type: &str, name: &str) -> Result<Option<ScheduleRecord>> {
        Tx::<B>::get_schedule(self.reader(), task_type, name).await
    }

    async fn list_schedules(
        &self,
        task_type: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ScheduleRecord>> {
        Tx::<B>::list_schedules(self.reader(), task_type, after, limit).await
    }

    async fn delete_schedule(&self, task_type: &str, name: &str) -> Result<bool> {
        Tx::<B>::delete_schedule(self.writer(), task_type, name).await
    }

    async fn sync_config_schedules(
        &self,
        task_type: &str,
        entries: &[ConfigSchedule],
        now: Millis,
    ) -> Result<()> {
        Tx::<B>::sync_config_schedules(self.writer(), task_type, entries, now).await
    }

    async fn cancel_firings(&self, cron_keys: &[String], now: Millis) -> Result<u64> {
        Tx::<B>::cancel_firings(self.writer(), cron_keys, now).await
    }

    async fn fire_schedules(&self, params: FireParams, planner: Planner<'_>) -> Result<FirePass> {
        Tx::<B>::fire_schedules(self.writer(), params, planner).await
    }

    async fn next_pending_eta(
        &self,
        task_type: &str,
        after: Millis,
        horizon: Millis,
    ) -> Result<Option<Millis>> {
        let eta: Option<(i64,)> = sqlx::query_as(B::QUERIES.next_pending_eta)
            .bind(task_type)
            .bind(after)
            .bind(horizon)
            .fetch_optional(self.reader())
            .await?;
        Ok(eta.map(|(at,)| Millis::new(at)))
    }
}

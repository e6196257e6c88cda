//! The bound on every call to a store on a database server: a call that gets no answer
//! within it fails with [`StoreError::TimedOut`], which counts as the store being
//! unavailable, so each caller's existing path for an outage applies (the API answers
//! 503 `store_unavailable`, the dispatcher's loops try again on their next pass).
//!
//! Nothing else notices a dead network path: a server-side timeout's answer never
//! arrives through it, sqlx sets no socket timeouts or TCP keepalive, and the pool's
//! `acquire_timeout` bounds only the wait for a connection, not the statements run on
//! it. A black-holed connection, in use when the path died, otherwise waits for its
//! answer until the kernel gives up on it, or forever if nothing is left to send.
//!
//! A call given up is dropped mid-flight. sqlx does not put its connection back as it
//! is: on release it pings the connection, which first reads whatever the dropped
//! statements still had to answer, and closes it if that fails; a transaction left open
//! is rolled back first. Until that ping ends, the connection holds its place in the
//! pool, so a dead path takes at most the pool's size out of it; new calls meanwhile
//! fail within the pool's `acquire_timeout`. On the server side, the transaction of a
//! client that went away without a word is ended after the bound too
//! (`idle_in_transaction_session_timeout` on PostgreSQL, `idle_transaction_timeout` on
//! MariaDB), so its row locks do not stop the other dispatchers.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::*;

/// The bound on [`Store::reclaim_dead_rows`].
const RECLAIM_BOUND: Duration = Duration::from_secs(30 * 60);

/// A store whose every call but [`Store::migrate`] and [`Store::reclaim_dead_rows`]
/// fails after `bound` without an answer.
pub(crate) struct Bounded {
    inner: Arc<dyn Store>,
    bound: Duration,
}

impl Bounded {
    pub(crate) fn new(inner: Arc<dyn Store>, bound: Duration) -> Self {
        Self { inner, bound }
    }

    async fn within<T>(
        &self,
        call: &'static str,
        answer: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        tokio::time::timeout(self.bound, answer)
            .await
            .unwrap_or(Err(StoreError::TimedOut {
                call,
                bound: self.bound,
            }))
    }
}

#[async_trait]
impl Store for Bounded {
    async fn migrate(&self) -> Result<()> {
        // Migrations may rewrite big tables: they are waited for, however long.
        self.inner.migrate().await
    }

    async fn ping(&self) -> Result<()> {
        self.within("ping", self.inner.ping()).await
    }

    async fn insert(&self, tasks: &[NewTask], now: Millis) -> Result<Vec<InsertOutcome>> {
        self.within("insert", self.inner.insert(tasks, now)).await
    }

    async fn change_unconsumed(
        &self,
        id: &str,
        task_type: &str,
        change: TaskChange<'_>,
        now: Millis,
    ) -> Result<bool> {
        self.within(
            "change_unconsumed",
            self.inner.change_unconsumed(id, task_type, change, now),
        )
        .await
    }

    async fn insert_workflow(&self, tasks: &[NewTask], now: Millis) -> Result<WorkflowOutcome> {
        self.within("insert_workflow", self.inner.insert_workflow(tasks, now))
            .await
    }

    async fn get(&self, id: &str) -> Result<Option<TaskRecord>> {
        self.within("get", self.inner.get(id)).await
    }

    async fn cancel(&self, id: &str, now: Millis) -> Result<CancelOutcome> {
        self.within("cancel", self.inner.cancel(id, now)).await
    }

    async fn change(&self, id: &str, change: TaskChange<'_>, now: Millis) -> Result<ChangeOutcome> {
        self.within("change", self.inner.change(id, change, now))
            .await
    }

    async fn insert_cancelled(&self, id: &str, task_type: &str, now: Millis) -> Result<bool> {
        self.within(
            "insert_cancelled",
            self.inner.insert_cancelled(id, task_type, now),
        )
        .await
    }

    async fn claim(&self, params: ClaimParams<'_>) -> Result<Vec<ClaimedTask>> {
        self.within("claim", self.inner.claim(params)).await
    }

    async fn claim_ids(&self, params: ClaimIdsParams<'_>) -> Result<Vec<ClaimedTask>> {
        self.within("claim_ids", self.inner.claim_ids(params)).await
    }

    async fn insert_consumed(&self, params: InsertConsumedParams<'_>) -> Result<Consumed> {
        self.within("insert_consumed", self.inner.insert_consumed(params))
            .await
    }

    async fn insert_claiming(
        &self,
        tasks: &[NewTask],
        now: Millis,
        claim: ClaimAtInsert<'_>,
    ) -> Result<(Vec<InsertOutcome>, Vec<ClaimedTask>)> {
        self.within(
            "insert_claiming",
            self.inner.insert_claiming(tasks, now, claim),
        )
        .await
    }

    async fn find_idempotent(&self, task: &NewTask) -> Result<Option<InsertOutcome>> {
        self.within("find_idempotent", self.inner.find_idempotent(task))
            .await
    }

    async fn idempotency_key_holder(&self, task_type: &str, key: &str) -> Result<Option<String>> {
        self.within(
            "idempotency_key_holder",
            self.inner.idempotency_key_holder(task_type, key),
        )
        .await
    }

    async fn start(&self, params: StartParams<'_>) -> Result<Vec<Started>> {
        self.within("start", self.inner.start(params)).await
    }

    async fn start_limited(&self, params: StartParams<'_>, gate: JobGate<'_>) -> Result<Admitted> {
        self.within("start_limited", self.inner.start_limited(params, gate))
            .await
    }

    async fn start_due(&self, params: StartDueParams<'_>, gate: JobGate<'_>) -> Result<DueStarted> {
        self.within("start_due", self.inner.start_due(params, gate))
            .await
    }

    async fn claim_fair(&self, params: ClaimParams<'_>, fair: FairParams<'_>) -> Result<FairClaim> {
        self.within("claim_fair", self.inner.claim_fair(params, fair))
            .await
    }

    async fn finish(&self, finishes: &[Finish], now: Millis) -> Result<Vec<bool>> {
        self.within("finish", self.inner.finish(finishes, now))
            .await
    }

    async fn finish_and_start_due(
        &self,
        finishes: &[Finish],
        now: Millis,
        starts: &[DueStart<'_>],
    ) -> Result<(Vec<bool>, Vec<DueStarted>)> {
        self.within(
            "finish_and_start_due",
            self.inner.finish_and_start_due(finishes, now, starts),
        )
        .await
    }

    async fn cool_down_key(&self, task_type: &str, key: &str, ends_at: Millis) -> Result<()> {
        self.within(
            "cool_down_key",
            self.inner.cool_down_key(task_type, key, ends_at),
        )
        .await
    }

    async fn resting_keys(
        &self,
        task_type: &str,
        now: Millis,
        limit: u32,
    ) -> Result<Vec<(String, Millis)>> {
        self.within(
            "resting_keys",
            self.inner.resting_keys(task_type, now, limit),
        )
        .await
    }

    async fn running_attempts(&self, task_types: &[String]) -> Result<u64> {
        self.within("running_attempts", self.inner.running_attempts(task_types))
            .await
    }

    async fn rate_bucket(&self, of: RateBucket<'_>) -> Result<Option<domain::Bucket>> {
        self.within("rate_bucket", self.inner.rate_bucket(of)).await
    }

    async fn set_tenant_weight(
        &self,
        task_type: &str,
        tenant: &str,
        weight: Option<u32>,
        now: Millis,
    ) -> Result<bool> {
        self.within(
            "set_tenant_weight",
            self.inner.set_tenant_weight(task_type, tenant, weight, now),
        )
        .await
    }

    async fn usage(
        &self,
        task_type: &str,
        by: UsageBy,
        now: Millis,
        cap: u64,
        limit: u32,
    ) -> Result<Vec<UsageCounts>> {
        self.within("usage", self.inner.usage(task_type, by, now, cap, limit))
            .await
    }

    async fn tenant_weights(&self, task_type: &str) -> Result<BTreeMap<String, u32>> {
        self.within("tenant_weights", self.inner.tenant_weights(task_type))
            .await
    }

    async fn purge_key_cooldowns(&self, ended_before: Millis, limit: u32) -> Result<u64> {
        self.within(
            "purge_key_cooldowns",
            self.inner.purge_key_cooldowns(ended_before, limit),
        )
        .await
    }

    async fn purge_key_windows(&self, closed_before: Millis, limit: u32) -> Result<u64> {
        self.within(
            "purge_key_windows",
            self.inner.purge_key_windows(closed_before, limit),
        )
        .await
    }

    async fn expire(&self, now: Millis, limit: u32) -> Result<Vec<ExpiredTask>> {
        self.within("expire", self.inner.expire(now, limit)).await
    }

    async fn lapsed_leases(&self, now: Millis, limit: u32) -> Result<Vec<Lapsed>> {
        self.within("lapsed_leases", self.inner.lapsed_leases(now, limit))
            .await
    }

    async fn dead_letters(&self, params: DeadLetterParams<'_>) -> Result<Vec<TaskRecord>> {
        self.within("dead_letters", self.inner.dead_letters(params))
            .await
    }

    async fn redrive(&self, id: &str, now: Millis) -> Result<RedriveOutcome> {
        self.within("redrive", self.inner.redrive(id, now)).await
    }

    async fn purge(&self, params: PurgeParams<'_>) -> Result<u64> {
        self.within("purge", self.inner.purge(params)).await
    }

    async fn release_unique_keys(&self, now: Millis, limit: u32) -> Result<u64> {
        self.within(
            "release_unique_keys",
            self.inner.release_unique_keys(now, limit),
        )
        .await
    }

    async fn count_dead(&self, filter: DeadFilter<'_>) -> Result<DeadCount> {
        self.within("count_dead", self.inner.count_dead(filter))
            .await
    }

    async fn act_on_dead(&self, filter: DeadFilter<'_>, limit: u32, now: Millis) -> Result<u64> {
        self.within("act_on_dead", self.inner.act_on_dead(filter, limit, now))
            .await
    }

    async fn search(&self, params: SearchParams<'_>) -> Result<Vec<TaskRecord>> {
        self.within("search", self.inner.search(params)).await
    }

    async fn job_counts(&self, params: JobCountParams<'_>) -> Result<JobCounts> {
        self.within("job_counts", self.inner.job_counts(params))
            .await
    }

    async fn due_backlog(&self, params: JobCountParams<'_>) -> Result<DueBacklog> {
        self.within("due_backlog", self.inner.due_backlog(params))
            .await
    }

    async fn heartbeat_member(&self, member: &str, now: Millis, shares: &Shares) -> Result<()> {
        self.within(
            "heartbeat_member",
            self.inner.heartbeat_member(member, now, shares),
        )
        .await
    }

    async fn live_members(&self, since: Millis) -> Result<Vec<String>> {
        self.within("live_members", self.inner.live_members(since))
            .await
    }

    async fn heartbeat_and_list_members(
        &self,
        member: &str,
        now: Millis,
        shares: &Shares,
        live_since: Millis,
    ) -> Result<Vec<String>> {
        self.within(
            "heartbeat_and_list_members",
            self.inner
                .heartbeat_and_list_members(member, now, shares, live_since),
        )
        .await
    }

    async fn live_shares(&self, since: Millis) -> Result<BTreeMap<String, u64>> {
        self.within("live_shares", self.inner.live_shares(since))
            .await
    }

    async fn remove_member(&self, member: &str) -> Result<()> {
        self.within("remove_member", self.inner.remove_member(member))
            .await
    }

    async fn release_claims(&self, owner: &str, now: Millis) -> Result<u64> {
        self.within("release_claims", self.inner.release_claims(owner, now))
            .await
    }

    async fn database_clock(&self) -> Result<Option<Millis>> {
        self.within("database_clock", self.inner.database_clock())
            .await
    }

    async fn dead_rows(&self) -> Result<Option<DeadRows>> {
        self.within("dead_rows", self.inner.dead_rows()).await
    }

    async fn reclaim_dead_rows(&self) -> Result<()> {
        // A vacuum passes over the whole table and its indexes: minutes for a big one,
        // longer than a bound that notices a dead path quickly. Only the reclaimer
        // waits for it, on one connection.
        let bound = RECLAIM_BOUND.max(self.bound);
        tokio::time::timeout(bound, self.inner.reclaim_dead_rows())
            .await
            .unwrap_or(Err(StoreError::TimedOut {
                call: "reclaim_dead_rows",
                bound,
            }))
    }

    async fn record_kafka_dead_letter(&self, letter: &KafkaDeadLetter) -> Result<()> {
        self.within(
            "record_kafka_dead_letter",
            self.inner.record_kafka_dead_letter(letter),
        )
        .await
    }

    async fn kafka_dead_letters(
        &self,
        params: KafkaDeadLetterParams<'_>,
    ) -> Result<Vec<KafkaDeadLetter>> {
        self.within("kafka_dead_letters", self.inner.kafka_dead_letters(params))
            .await
    }

    async fn purge_kafka_dead_letters(&self, recorded_before: Millis, limit: u32) -> Result<u64> {
        self.within(
            "purge_kafka_dead_letters",
            self.inner.purge_kafka_dead_letters(recorded_before, limit),
        )
        .await
    }

    async fn pause(&self, task_type: &str, now: Millis) -> Result<Millis> {
        self.within("pause", self.inner.pause(task_type, now)).await
    }

    async fn resume(&self, task_type: &str) -> Result<bool> {
        self.within("resume", self.inner.resume(task_type)).await
    }

    async fn paused_types(&self) -> Result<Vec<(String, Millis)>> {
        self.within("paused_types", self.inner.paused_types()).await
    }

    async fn next_pending_eta(
        &self,
        task_type: &str,
        after: Millis,
        horizon: Millis,
    ) -> Result<Option<Millis>> {
        self.within(
            "next_pending_eta",
            self.inner.next_pending_eta(task_type, after, horizon),
        )
        .await
    }
    async fn create_schedule(&self, put: PutSchedule<'_>) -> Result<Option<ScheduleRecord>> {
        self.within("create_schedule", self.inner.create_schedule(put))
            .await
    }

    async fn update_schedule(
        &self,
        put: PutSchedule<'_>,
        version: Option<i64>,
    ) -> Result<Option<ScheduleRecord>> {
        self.within("update_schedule", self.inner.update_schedule(put, version))
            .await
    }

    async fn get_schedule(&self, task_type: &str, name: &str) -> Result<Option<ScheduleRecord>> {
        self.within("get_schedule", self.inner.get_schedule(task_type, name))
            .await
    }

    async fn list_schedules(
        &self,
        task_type: &str,
        after: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ScheduleRecord>> {
        self.within(
            "list_schedules",
            self.inner.list_schedules(task_type, after, limit),
        )
        .await
    }

    async fn delete_schedule(&self, task_type: &str, name: &str) -> Result<bool> {
        self.within(
            "delete_schedule",
            self.inner.delete_schedule(task_type, name),
        )
        .await
    }

    async fn sync_config_schedules(
        &self,
        task_type: &str,
        entries: &[ConfigSchedule],
        now: Millis,
    ) -> Result<()> {
        self.within(
            "sync_config_schedules",
            self.inner.sync_config_schedules(task_type, entries, now),
        )
        .await
    }

    async fn cancel_firings(&self, cron_keys: &[String], now: Millis) -> Result<u64> {
        self.within("cancel_firings", self.inner.cancel_firings(cron_keys, now))
            .await
    }

    async fn fire_schedules(&self, params: FireParams, planner: Planner<'_>) -> Result<FirePass> {
        self.within("fire_schedules", self.inner.fire_schedules(params, planner))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_given_up_is_waited_out_like_an_outage() {
        let err = StoreError::TimedOut {
            call: "claim",
            bound: Duration::from_secs(10),
        };
        // What the api answers (503) and the dispatcher's loops retry on.
        assert!(err.is_unavailable());
        assert_eq!(
            err.to_string(),
            "store: no answer within 10s to claim; the call was given up"
        );
    }
}

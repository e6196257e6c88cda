//! The rescuer: brings back work whose lease ran out — claims held by a dispatcher that
//! died, attempts whose executor never answered or stopped heartbeating — so a crash
//! anywhere delays a task but never loses it. Each pass also ends the tasks whose
//! expiry came before any attempt began ([`Store::expire`]).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::executor::AttemptOutcome;
use crate::job_table::Routes;
use crate::metrics::Metrics;
use crate::retry;
use crate::test_hooks::{Signal, TestSignals, emit};
use asyncd_store::{Finish, FinishKind, Millis, Store, TaskState};

pub struct Rescuer {
    pub store: Arc<dyn Store>,
    pub routes: Routes,
    pub metrics: Arc<Metrics>,
    pub clock: SharedClock,
    pub interval: Duration,
    /// Test-only event hooks.
    pub signals: Option<TestSignals>,
}

/// After the store was unavailable, attempts whose outcome a dispatcher is still writing
/// look lapsed: their lease ran out while nothing could be written. For this long after
/// the rescuer last found the store unavailable, running attempts are left alone (claims
/// are still handed back), so those outcomes land first and work that succeeded is not
/// retried or dead-lettered. A completer retries within 2 s of the store's return (its
/// backoff's cap); the rest is margin for a busy machine.
pub const SETTLE: Duration = Duration::from_secs(15);

/// The longest the rescuer waits between passes while they find nothing lapsed. A lease
/// lasts at least the dispatcher's grace (5 s by default) past an attempt's timeout, and a
/// claim 30 s past its ETA, so a lapse found up to this much later than at `interval`
/// delays a task by a fraction of its lease; an idle queue is then asked once every 2 s
/// instead of twice a second (the rescuer was an eighth of an idle process's statements).
pub const IDLE_INTERVAL: Duration = Duration::from_secs(2);

/// The most tasks one expiry pass ends, in one transaction: a pass that ends this many
/// is followed by the next at `interval`, so a backlog of expired tasks drains at this
/// many per interval without holding row locks long.
pub const EXPIRE_BATCH: u32 = 500;

/// The wait before the next pass: `interval` after one that brought tasks back or
/// failed, else twice the last wait up to [`IDLE_INTERVAL`].
fn next_pause(last: Duration, found: Option<usize>, interval: Duration) -> Duration {
    match found {
        Some(0) => last
            .saturating_mul(2)
            .clamp(interval, IDLE_INTERVAL.max(interval)),
        _ => interval,
    }
}

impl Rescuer {
    pub async fn run(self, shutdown: CancellationToken) {
        // Running attempts are rescued only from this instant on.
        let mut settled_at = Millis::default();
        let mut pause = self.interval;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            let now = self.clock.now_millis();
            let found = match self.rescue_once(now >= settled_at).await {
                Ok(count) => {
                    emit(&self.signals, || Signal::Rescued {
                        count,
                        at: self.clock.now_millis(),
                    });
                    Some(count)
                }
                Err(err) => {
                    if err.is_unavailable() {
                        settled_at = self.clock.now_millis() + SETTLE;
                    }
                    tracing::warn!(%err, "rescue pass failed");
                    None
                }
            };
            let expired = match self.expire_once().await {
                Ok(count) => Some(count),
                Err(err) => {
                    tracing::warn!(%err, "expiry pass failed");
                    None
                }
            };
            let found = found
                .zip(expired)
                .map(|(rescued, expired)| rescued + expired);
            pause = next_pause(pause, found, self.interval);
        }
    }

    /// Ends up to [`EXPIRE_BATCH`] tasks whose expiry came before an attempt began;
    /// returns how many. No start begins such a task whether or not this has run: it
    /// decides when the task shows as `expired`, within a pass of its expiry.
    pub async fn expire_once(&self) -> asyncd_store::Result<usize> {
        let expired = self
            .store
            .expire(self.clock.now_millis(), EXPIRE_BATCH)
            .await?;
        for task in &expired {
            self.metrics
                .expired
                .with_label_values(&[task.task_type.as_str()])
                .inc();
        }
        if !expired.is_empty() {
            tracing::info!(count = expired.len(), "expired tasks no attempt had begun");
        }
        Ok(expired.len())
    }

    /// One pass; returns how many tasks it brought back. Lapsed running attempts are
    /// left alone unless `running` (see [`SETTLE`]).
    pub async fn rescue_once(&self, running: bool) -> asyncd_store::Result<usize> {
        let now = self.clock.now_millis();
        let mut lapsed = self.store.lapsed_leases(now, 1000).await?;
        if !running {
            lapsed.retain(|task| task.state != TaskState::Running);
        }
        if lapsed.is_empty() {
            return Ok(0);
        }
        let routes = self.routes.borrow().clone();
        let labels: Vec<(String, TaskState)> = lapsed
            .iter()
            .map(|task| (task.task_type.clone(), task.state))
            .collect();
        let finishes: Vec<Finish> = lapsed
            .into_iter()
            .map(|task| {
                let kind = match task.state {
                    TaskState::Running => {
                        let kind = retry::settle(
                            AttemptOutcome::Retry {
                                reason: format!("attempt {} lease lapsed", task.attempt),
                                timed_out: true,
                            },
                            task.attempt,
                            task.max_retries,
                            routes.job(&task.task_type).map(|j| j.as_ref()),
                            now,
                        );
                        self.metrics
                            .executed
                            .with_label_values(&[task.task_type.as_str(), "timeout"])
                            .inc();
                        if matches!(kind, FinishKind::Retry { .. }) {
                            self.metrics
                                .retries
                                .with_label_values(&[task.task_type.as_str()])
                                .inc();
                        }
                        kind
                    }
                    _ => FinishKind::Release,
                };
                Finish {
                    id: task.id,
                    lease_token: task.lease_token,
                    kind,
                }
            })
            .collect();
        let applied = match self.store.finish(&finishes, now).await {
            Ok(applied) => applied,
            Err(err) if err.is_unavailable() => return Err(err),
            // One the store refuses must not stop every rescue behind it: write the
            // batch in parts, the refused one as a dead letter naming why.
            Err(err) => {
                tracing::warn!(%err, "the store refused a batch of rescues; isolating the refused one");
                let mut finishes = finishes;
                return crate::outcomes::write(self.store.as_ref(), &mut finishes, now).await;
            }
        };
        for ((task_type, state), _) in labels.iter().zip(&applied).filter(|(_, a)| **a) {
            self.metrics
                .rescued
                .with_label_values(&[task_type.as_str(), state.as_str()])
                .inc();
        }
        let count = applied.iter().filter(|a| **a).count();
        tracing::info!(count, "rescued tasks with lapsed leases");
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use async_trait::async_trait;
    use chrono::{TimeZone, Utc};

    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::job_table::{RouteTable, fixed};
    use crate::test_hooks::TestSignals;
    use asyncd_store::{self as store, *};

    const T0: i64 = 1_800_000_000_000;

    #[test]
    fn an_idle_rescuer_asks_less_often_and_a_rescue_or_a_failure_brings_it_back() {
        let half = Duration::from_millis(500);
        let mut pause = half;
        let mut waits = Vec::new();
        for _ in 0..4 {
            pause = next_pause(pause, Some(0), half);
            waits.push(pause.as_millis());
        }
        assert_eq!(waits, [1000, 2000, 2000, 2000]);
        assert_eq!(next_pause(pause, Some(3), half), half);
        assert_eq!(
            next_pause(pause, None, half),
            half,
            "a failed pass tries again soon"
        );
        let fast = Duration::from_millis(5);
        assert_eq!(
            next_pause(Duration::from_secs(3), Some(0), Duration::from_secs(3)),
            Duration::from_secs(3),
            "never sooner than the interval"
        );
        assert_eq!(next_pause(fast, Some(0), fast), 2 * fast);
    }

    /// A store whose `lapsed` fails as an unreachable database does while `down` is set.
    struct Flaky {
        inner: Arc<dyn Store>,
        down: AtomicBool,
        refused: AtomicUsize,
    }

    #[async_trait]
    impl Store for Flaky {
        async fn migrate(&self) -> store::Result<()> {
            self.inner.migrate().await
        }
        async fn ping(&self) -> store::Result<()> {
            self.inner.ping().await
        }
        async fn insert(&self, t: &[NewTask], now: Millis) -> store::Result<Vec<InsertOutcome>> {
            self.inner.insert(t, now).await
        }
        async fn get(&self, id: &str) -> store::Result<Option<TaskRecord>> {
            self.inner.get(id).await
        }
        async fn cancel(&self, id: &str, now: Millis) -> store::Result<CancelOutcome> {
            self.inner.cancel(id, now).await
        }
        async fn change(
            &self,
            id: &str,
            change: store::TaskChange<'_>,
            now: Millis,
        ) -> store::Result<store::ChangeOutcome> {
            self.inner.change(id, change, now).await
        }
        async fn cool_down_key(
            &self,
            task_type: &str,
            key: &str,
            ends_at: Millis,
        ) -> store::Result<()> {
            self.inner.cool_down_key(task_type, key, ends_at).await
        }
        async fn purge_key_cooldowns(
            &self,
            ended_before: Millis,
            limit: u32,
        ) -> store::Result<u64> {
            self.inner.purge_key_cooldowns(ended_before, limit).await
        }
        async fn resting_keys(
            &self,
            task_type: &str,
            now: Millis,
            limit: u32,
        ) -> store::Result<Vec<(String, Millis)>> {
            self.inner.resting_keys(task_type, now, limit).await
        }
        async fn running_attempts(&self, task_types: &[String]) -> store::Result<u64> {
            self.inner.running_attempts(task_types).await
        }
        async fn rate_bucket(
            &self,
            of: store::RateBucket<'_>,
        ) -> store::Result<Option<store::domain::Bucket>> {
            self.inner.rate_bucket(of).await
        }
        async fn set_tenant_weight(
            &self,
            task_type: &str,
            tenant: &str,
            weight: Option<u32>,
            now: Millis,
        ) -> store::Result<bool> {
            self.inner
                .set_tenant_weight(task_type, tenant, weight, now)
                .await
        }
        async fn tenant_weights(
            &self,
            task_type: &str,
        ) -> store::Result<std::collections::BTreeMap<String, u32>> {
            self.inner.tenant_weights(task_type).await
        }
        async fn usage(
            &self,
            task_type: &str,
            by: store::UsageBy,
            now: Millis,
            cap: u64,
            limit: u32,
        ) -> store::Result<Vec<store::UsageCounts>> {
            self.inner.usage(task_type, by, now, cap, limit).await
        }
        async fn purge_key_windows(&self, closed_before: Millis, limit: u32) -> store::Result<u64> {
            self.inner.purge_key_windows(closed_before, limit).await
        }
        async fn expire(&self, now: Millis, limit: u32) -> store::Result<Vec<ExpiredTask>> {
            self.inner.expire(now, limit).await
        }
        async fn insert_consumed(
            &self,
            p: store::InsertConsumedParams<'_>,
        ) -> store::Result<store::Consumed> {
            self.inner.insert_consumed(p).await
        }
        async fn insert_claiming(
            &self,
            t: &[NewTask],
            now: Millis,
            claim: store::ClaimAtInsert<'_>,
        ) -> store::Result<(Vec<InsertOutcome>, Vec<ClaimedTask>)> {
            self.inner.insert_claiming(t, now, claim).await
        }
        async fn claim(&self, p: ClaimParams<'_>) -> store::Result<Vec<ClaimedTask>> {
            self.inner.claim(p).await
        }
        async fn claim_ids(&self, p: ClaimIdsParams<'_>) -> store::Result<Vec<ClaimedTask>> {
            self.inner.claim_ids(p).await
        }
        async fn find_idempotent(&self, task: &NewTask) -> store::Result<Option<InsertOutcome>> {
            self.inner.find_idempotent(task).await
        }
        async fn idempotency_key_holder(
            &self,
            task_type: &str,
            key: &str,
        ) -> store::Result<Option<String>> {
            self.inner.idempotency_key_holder(task_type, key).await
        }
        async fn start(&self, p: StartParams<'_>) -> store::Result<Vec<Started>> {
            self.inner.start(p).await
        }
        async fn claim_fair(
            &self,
            p: ClaimParams<'_>,
            fair: store::FairParams<'_>,
        ) -> store::Result<store::FairClaim> {
            self.inner.claim_fair(p, fair).await
        }
        async fn start_limited(
            &self,
            p: StartParams<'_>,
            gate: store::JobGate<'_>,
        ) -> store::Result<store::Admitted> {
            self.inner.start_limited(p, gate).await
        }
        async fn start_due(
            &self,
            p: store::StartDueParams<'_>,
            gate: store::JobGate<'_>,
        ) -> store::Result<store::DueStarted> {
            self.inner.start_due(p, gate).await
        }
        async fn change_unconsumed(
            &self,
            id: &str,
            task_type: &str,
            change: store::TaskChange<'_>,
            now: Millis,
        ) -> store::Result<bool> {
            self.inner
                .change_unconsumed(id, task_type, change, now)
                .await
        }
        async fn create_schedule(
            &self,
            put: store::PutSchedule<'_>,
        ) -> store::Result<Option<store::ScheduleRecord>> {
            self.inner.create_schedule(put).await
        }
        async fn update_schedule(
            &self,
            put: store::PutSchedule<'_>,
            version: Option<i64>,
        ) -> store::Result<Option<store::ScheduleRecord>> {
            self.inner.update_schedule(put, version).await
        }
        async fn get_schedule(
            &self,
            task_type: &str,
            name: &str,
        ) -> store::Result<Option<store::ScheduleRecord>> {
            self.inner.get_schedule(task_type, name).await
        }
        async fn list_schedules(
            &self,
            task_type: &str,
            after: Option<&str>,
            limit: u32,
        ) -> store::Result<Vec<store::ScheduleRecord>> {
            self.inner.list_schedules(task_type, after, limit).await
        }
        async fn delete_schedule(&self, task_type: &str, name: &str) -> store::Result<bool> {
            self.inner.delete_schedule(task_type, name).await
        }
        async fn sync_config_schedules(
            &self,
            task_type: &str,
            entries: &[store::ConfigSchedule],
            now: Millis,
        ) -> store::Result<()> {
            self.inner
                .sync_config_schedules(task_type, entries, now)
                .await
        }
        async fn cancel_firings(&self, keys: &[String], now: Millis) -> store::Result<u64> {
            self.inner.cancel_firings(keys, now).await
        }
        async fn fire_schedules(
            &self,
            params: store::FireParams,
            planner: store::Planner<'_>,
        ) -> store::Result<store::FirePass> {
            self.inner.fire_schedules(params, planner).await
        }
        async fn finish(&self, f: &[Finish], now: Millis) -> store::Result<Vec<bool>> {
            self.inner.finish(f, now).await
        }
        async fn finish_and_start_due(
            &self,
            f: &[Finish],
            now: Millis,
            starts: &[store::DueStart<'_>],
        ) -> store::Result<(Vec<bool>, Vec<store::DueStarted>)> {
            self.inner.finish_and_start_due(f, now, starts).await
        }
        async fn lapsed_leases(&self, now: Millis, limit: u32) -> store::Result<Vec<Lapsed>> {
            if self.down.load(Ordering::SeqCst) {
                self.refused.fetch_add(1, Ordering::SeqCst);
                return Err(StoreError::Database(sqlx::Error::PoolTimedOut));
            }
            self.inner.lapsed_leases(now, limit).await
        }
        async fn dead_letters(
            &self,
            params: store::DeadLetterParams<'_>,
        ) -> store::Result<Vec<TaskRecord>> {
            self.inner.dead_letters(params).await
        }
        async fn redrive(&self, id: &str, now: Millis) -> store::Result<RedriveOutcome> {
            self.inner.redrive(id, now).await
        }
        async fn job_counts(&self, p: store::JobCountParams<'_>) -> store::Result<JobCounts> {
            self.inner.job_counts(p).await
        }
        async fn due_backlog(
            &self,
            p: store::JobCountParams<'_>,
        ) -> store::Result<store::DueBacklog> {
            self.inner.due_backlog(p).await
        }
        async fn purge(&self, params: store::PurgeParams<'_>) -> store::Result<u64> {
            self.inner.purge(params).await
        }
        async fn release_unique_keys(&self, now: Millis, limit: u32) -> store::Result<u64> {
            self.inner.release_unique_keys(now, limit).await
        }
        async fn purge_kafka_dead_letters(
            &self,
            recorded_before: Millis,
            limit: u32,
        ) -> store::Result<u64> {
            self.inner
                .purge_kafka_dead_letters(recorded_before, limit)
                .await
        }
        async fn insert_workflow(
            &self,
            t: &[NewTask],
            now: Millis,
        ) -> store::Result<store::WorkflowOutcome> {
            self.inner.insert_workflow(t, now).await
        }
        async fn count_dead(
            &self,
            filter: store::DeadFilter<'_>,
        ) -> store::Result<store::DeadCount> {
            self.inner.count_dead(filter).await
        }
        async fn act_on_dead(
            &self,
            filter: store::DeadFilter<'_>,
            limit: u32,
            now: Millis,
        ) -> store::Result<u64> {
            self.inner.act_on_dead(filter, limit, now).await
        }
        async fn insert_cancelled(
            &self,
            id: &str,
            task_type: &str,
            now: Millis,
        ) -> store::Result<bool> {
            self.inner.insert_cancelled(id, task_type, now).await
        }
        async fn search(&self, params: store::SearchParams<'_>) -> store::Result<Vec<TaskRecord>> {
            self.inner.search(params).await
        }
        async fn heartbeat_member(
            &self,
            member: &str,
            now: Millis,
            shares: &store::Shares,
        ) -> store::Result<()> {
            self.inner.heartbeat_member(member, now, shares).await
        }
        async fn live_members(&self, since: Millis) -> store::Result<Vec<String>> {
            self.inner.live_members(since).await
        }
        async fn live_shares(
            &self,
            since: Millis,
        ) -> store::Result<std::collections::BTreeMap<String, u64>> {
            self.inner.live_shares(since).await
        }
        async fn remove_member(&self, member: &str) -> store::Result<()> {
            self.inner.remove_member(member).await
        }
        async fn release_claims(&self, owner: &str, now: Millis) -> store::Result<u64> {
            self.inner.release_claims(owner, now).await
        }
        async fn database_clock(&self) -> store::Result<Option<Millis>> {
            self.inner.database_clock().await
        }

        async fn dead_rows(&self) -> store::Result<Option<store::DeadRows>> {
            self.inner.dead_rows().await
        }

        async fn reclaim_dead_rows(&self) -> store::Result<()> {
            self.inner.reclaim_dead_rows().await
        }

        async fn record_kafka_dead_letter(
            &self,
            letter: &store::KafkaDeadLetter,
        ) -> store::Result<()> {
            self.inner.record_kafka_dead_letter(letter).await
        }

        async fn kafka_dead_letters(
            &self,
            params: store::KafkaDeadLetterParams<'_>,
        ) -> store::Result<Vec<store::KafkaDeadLetter>> {
            self.inner.kafka_dead_letters(params).await
        }
        async fn pause(&self, task_type: &str, now: Millis) -> store::Result<Millis> {
            self.inner.pause(task_type, now).await
        }
        async fn resume(&self, task_type: &str) -> store::Result<bool> {
            self.inner.resume(task_type).await
        }
        async fn paused_types(&self) -> store::Result<Vec<(String, Millis)>> {
            self.inner.paused_types().await
        }
        async fn next_pending_eta(
            &self,
            task_type: &str,
            after: Millis,
            horizon: Millis,
        ) -> store::Result<Option<Millis>> {
            self.inner.next_pending_eta(task_type, after, horizon).await
        }
    }

    /// A due task, claimed and started at T0 with a 1 s lease; its `(id, lease_token)`.
    async fn running(store: &dyn Store) -> (String, i64) {
        let id = uuid::Uuid::now_v7().to_string();
        let task = NewTask::test("work", Millis::new(T0))
            .id(id.clone())
            .payload("{}")
            .max_retries(0);
        store.insert(&[task], Millis::new(T0)).await.unwrap();
        let claimed = store
            .claim_ids(ClaimIdsParams {
                ids: std::slice::from_ref(&id),
                now: Millis::new(T0),
                hold: Duration::from_secs(30),
                owner: "d",
            })
            .await
            .unwrap();
        let started = store
            .start(StartParams {
                claims: &[(id.clone(), claimed[0].lease_token)],
                now: Millis::new(T0),
                grace: Duration::ZERO,
            })
            .await
            .unwrap();
        (id, started[0].lease_token)
    }

    #[tokio::test]
    async fn a_rescue_the_store_refuses_blocks_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let database = format!("sqlite://{}/t.db", dir.path().display());
        let store = asyncd_store::open(&database).await.unwrap();
        store.migrate().await.unwrap();
        let (refused, _) = running(store.as_ref()).await;
        let (rescued, _) = running(store.as_ref()).await;
        let mut db = <sqlx::SqliteConnection as sqlx::Connection>::connect(&database)
            .await
            .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TRIGGER refuse BEFORE UPDATE ON tasks \
             WHEN NEW.id = '{refused}' AND NEW.last_error LIKE '%lease lapsed%' \
             BEGIN SELECT RAISE(ABORT, 'refused by the test trigger'); END"
        )))
        .execute(&mut db)
        .await
        .unwrap();
        let rescuer = Rescuer {
            store: store.clone(),
            routes: fixed(RouteTable::from_jobs(Vec::new())),
            metrics: Arc::new(Metrics::new()),
            clock: ManualClock::at(Utc.timestamp_millis_opt(T0 + 5_000).unwrap()),
            interval: Duration::from_secs(1),
            signals: None,
        };
        assert_eq!(rescuer.rescue_once(true).await.unwrap(), 2);
        let task = |id: String| {
            let store = store.clone();
            async move { store.get(&id).await.unwrap().unwrap() }
        };
        let other = task(rescued).await;
        assert_eq!(other.state, TaskState::Dead, "no retries left");
        assert!(
            other
                .last_error
                .unwrap()
                .ends_with("attempt 1 lease lapsed")
        );
        let kept = task(refused).await;
        assert_eq!(kept.state, TaskState::Dead);
        let error = kept.last_error.unwrap();
        assert!(error.contains("refused by the test trigger"), "{error}");
    }

    #[tokio::test]
    async fn after_an_outage_a_late_success_lands_before_the_rescuer_takes_the_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let inner = asyncd_store::open(&format!("sqlite://{}/t.db", dir.path().display()))
            .await
            .unwrap();
        inner.migrate().await.unwrap();
        let (succeeded, token) = running(inner.as_ref()).await;
        let store = Arc::new(Flaky {
            inner,
            down: AtomicBool::new(true),
            refused: AtomicUsize::new(0),
        });
        let clock = ManualClock::at(Utc.timestamp_millis_opt(T0 + 5_000).unwrap());
        let (signals, mut passes) = TestSignals::new();
        let rescuer = Rescuer {
            store: store.clone(),
            routes: fixed(RouteTable::from_jobs(Vec::new())),
            metrics: Arc::new(Metrics::new()),
            clock: clock.clone(),
            interval: Duration::from_millis(5),
            signals: Some(signals),
        };
        let shutdown = CancellationToken::new();
        let run = tokio::spawn(rescuer.run(shutdown.clone()));
        let pass = async |passes: &mut tokio::sync::broadcast::Receiver<Signal>| loop {
            if let Signal::Rescued { count, .. } = passes.recv().await.unwrap() {
                return count;
            }
        };
        let deadline = Duration::from_secs(20);
        tokio::time::timeout(deadline, async {
            while store.refused.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("a pass while the store is down");

        // The store is back; the attempt's lease lapsed during the outage, and its
        // dispatcher is about to write the success it kept.
        store.down.store(false, Ordering::SeqCst);
        assert_eq!(
            tokio::time::timeout(deadline, pass(&mut passes))
                .await
                .unwrap(),
            0
        );
        let late = Finish {
            id: succeeded.clone(),
            lease_token: token,
            kind: FinishKind::Succeeded { result: None },
        };
        assert_eq!(
            store.finish(&[late], clock.now_millis()).await.unwrap(),
            [true]
        );

        // Once settled, lapsed attempts are rescued again.
        let (silent, _) = running(store.as_ref()).await;
        clock.set_millis(clock.now_millis() + SETTLE);
        while tokio::time::timeout(deadline, pass(&mut passes))
            .await
            .unwrap()
            == 0
        {}
        let state = |id: String| {
            let store = store.clone();
            async move { store.get(&id).await.unwrap().unwrap().state }
        };
        assert_eq!(state(succeeded).await, TaskState::Succeeded);
        assert_eq!(state(silent).await, TaskState::Dead, "no retries left");
        shutdown.cancel();
        run.await.unwrap();
    }
}

//! The membership loop: heartbeats this dispatcher into the store and reads who else is
//! alive, so [`Ownership`] can split task types among the live dispatchers; hands back
//! the claims of a member that stopped heartbeating; and, on the same beat, checks this
//! clock against the store's and exports which jobs are paused.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::adaptive::Adaptive;
use super::ownership::{self, Ownership};
use super::{ClaimerWakeup, DispatcherConfig};
use crate::clock::SharedClock;
use crate::clock_check::Reading;
use crate::job_table::Routes;
use crate::metrics::Metrics;
use crate::test_hooks::{Signal, emit};
use asyncd_store::{Millis, Store};

pub(super) struct Membership {
    store: Arc<dyn Store>,
    routes: Routes,
    metrics: Arc<Metrics>,
    clock: SharedClock,
    config: Arc<DispatcherConfig>,
    /// This dispatcher's name in the member set.
    member: String,
    /// Read for the shares to publish with each heartbeat.
    adaptive: Arc<Mutex<Adaptive>>,
    /// Told each view of the live members.
    ownership: Arc<Mutex<Ownership>>,
    /// Woken when a dead member's claims are handed back, so they are claimed again now.
    waker: ClaimerWakeup,
    /// Members seen alive by the last heartbeat; one missing now has died (or left).
    alive: BTreeSet<String>,
}

impl Membership {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        store: Arc<dyn Store>,
        routes: Routes,
        metrics: Arc<Metrics>,
        clock: SharedClock,
        config: Arc<DispatcherConfig>,
        member: String,
        adaptive: Arc<Mutex<Adaptive>>,
        ownership: Arc<Mutex<Ownership>>,
        waker: ClaimerWakeup,
    ) -> Self {
        Self {
            store,
            routes,
            metrics,
            clock,
            config,
            member,
            adaptive,
            ownership,
            waker,
            alive: BTreeSet::new(),
        }
    }

    /// Beats every `heartbeat_interval` until shutdown, then leaves the member set.
    pub(super) async fn run(mut self, shutdown: CancellationToken) {
        loop {
            self.beat().await;
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(self.config.heartbeat_interval) => {}
            }
        }
        if let Err(err) = self.store.remove_member(&self.member).await {
            tracing::warn!(%err, "could not leave the dispatcher set; it will expire");
        }
    }

    /// One beat: the clock check, the heartbeat with the live members' view, and the
    /// paused jobs.
    pub(super) async fn beat(&mut self) {
        let config = &self.config;
        self.check_clock().await;
        let now = self.clock.now_millis();
        // The shares of the jobs begun here within a member's TTL: a share is only
        // published while the jobs overview would count this dispatcher as live.
        let shares = self
            .adaptive
            .lock()
            .expect("adaptive lock")
            .shares(now.saturating_sub(config.member_ttl));
        let seen = self
            .store
            .heartbeat_and_list_members(
                &self.member,
                now,
                &shares,
                now.saturating_sub(config.member_ttl),
            )
            .await;
        match seen {
            Ok(members) => {
                let members: BTreeSet<String> = members.into_iter().collect();
                for gone in self
                    .alive
                    .difference(&members)
                    .filter(|m| **m != self.member)
                {
                    self.release_claims_of(gone, now).await;
                }
                self.alive.clone_from(&members);
                self.ownership
                    .lock()
                    .expect("ownership lock")
                    .observe(members, Instant::now());
                emit(&config.signals, || Signal::Heartbeat { at: now });
            }
            Err(err) => tracing::warn!(%err, "membership heartbeat failed; keeping the last view"),
        }
        self.observe_pauses(now).await;
    }

    /// Exports which jobs are paused, by their config or through the API, as
    /// `asyncd_job_paused{job}`. Only for the metric: pausing does not depend on it (the
    /// store's claim and start skip paused types; the claimer and runners read the config).
    async fn observe_pauses(&self, now: Millis) {
        let in_store: BTreeSet<String> = match self.store.paused_types().await {
            Ok(pauses) => pauses.into_iter().map(|(task_type, _)| task_type).collect(),
            Err(err) => {
                tracing::debug!(%err, "could not read the paused jobs");
                return;
            }
        };
        let routes = self.routes.borrow().clone();
        let mut paused = Vec::new();
        for job in routes.jobs() {
            let is = job.paused || in_store.contains(&job.task_type);
            self.metrics
                .job_paused
                .with_label_values(&[job.name.as_str()])
                .set(i64::from(is));
            if is {
                paused.push(job.name.clone());
            }
        }
        emit(&self.config.signals, || Signal::PausesSeen {
            paused,
            at: now,
        });
    }

    /// Reads the store's clock between two readings of ours and records the offset (see
    /// [`crate::clock_check`]); a failed read keeps the last reading.
    async fn check_clock(&self) {
        let before = self.clock.now_millis();
        let store = match self.store.database_clock().await {
            Ok(Some(store)) => store,
            Ok(None) => return self.config.clock_check.record_no_store_clock(),
            Err(err) => {
                tracing::debug!(%err, "could not read the store's clock");
                return;
            }
        };
        let reading = Reading::new(before, store, self.clock.now_millis());
        self.metrics
            .clock_offset
            .set(reading.offset_ms as f64 / 1000.0);
        let check = &self.config.clock_check;
        let was = check.skew().is_some();
        check.record(reading);
        match check.skew() {
            Some(why) if !was => tracing::error!("{why}"),
            None if was => tracing::info!(
                offset_ms = reading.offset_ms,
                "clock back within bounds; dispatching again"
            ),
            _ => {}
        }
    }

    /// Hands back the claims of a member that stopped heartbeating, so its claimed tasks
    /// run again now rather than when their hold lapses. Its running attempts keep their
    /// leases: an executor may still be working on them (a 202 with a lease) and answer.
    /// Every survivor does this; the release is idempotent, and fencing makes it safe even
    /// if the member was only slow.
    async fn release_claims_of(&self, gone: &str, now: Millis) {
        let owner = ownership::instance_of(gone);
        match self.store.release_claims(owner, now).await {
            Ok(0) => {}
            Ok(count) => {
                tracing::info!(
                    member = gone,
                    count,
                    "released the claims of a dispatcher that stopped heartbeating"
                );
                self.waker.wake();
            }
            Err(err) => {
                tracing::warn!(%err, member = gone, "could not release the claims of a dispatcher that stopped heartbeating; they return to pending when their hold lapses")
            }
        }
        emit(&self.config.signals, || Signal::MemberGone {
            member: gone.to_string(),
        });
    }
}

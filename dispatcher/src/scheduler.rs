//! The cron scheduler: makes sure each upcoming firing of every job's cron entries
//! exists as a store row before it is due.
//!
//! Stateless by design (the reference system's idea): a firing's identity is
//! `task_type/entry name/UTC millis`, held by a unique constraint, so any number of
//! schedulers can run at once and each firing is created exactly once. Firings missed
//! while no scheduler ran are not back-filled; the next one is created.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::dispatcher::Waker;
use crate::routing::Routes;
use crate::store::{InsertOutcome, Millis, NewTask, Store};

pub struct Scheduler {
    pub store: Arc<dyn Store>,
    pub routes: Routes,
    pub clock: SharedClock,
    pub waker: Option<Waker>,
    /// Firings up to this far ahead are created on each pass (at least the next one).
    pub horizon: Duration,
    pub interval: Duration,
    /// Per (task type, entry, schedule text): the latest firing known to exist, so a
    /// pass only writes what is new.
    pub created: HashMap<(String, String, String), Millis>,
}

impl Scheduler {
    pub fn new(
        store: Arc<dyn Store>,
        routes: Routes,
        clock: SharedClock,
        waker: Option<Waker>,
    ) -> Self {
        Self {
            store,
            routes,
            clock,
            waker,
            horizon: Duration::from_secs(60),
            interval: Duration::from_secs(1),
            created: HashMap::new(),
        }
    }

    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            if let Err(err) = self.schedule_once().await {
                tracing::warn!(%err, "cron pass failed");
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }

    /// One pass over every cron entry; returns the firings this pass inserted.
    pub async fn schedule_once(&mut self) -> crate::store::Result<Vec<NewTask>> {
        let now_ms = self.clock.now_millis();
        let now = crate::clock::from_millis(now_ms);
        let horizon = now_ms + self.horizon.as_millis() as i64;
        let routes = self.routes.borrow().clone();
        let mut firings = Vec::new();
        let mut latest = Vec::new();
        for job in routes.jobs() {
            for entry in &job.cron {
                let key = (
                    job.task_type.clone(),
                    entry.name.clone(),
                    entry.schedule.as_str().to_string(),
                );
                // A future firing already created: only add what the horizon now covers.
                let known = self.created.get(&key).copied().filter(|&at| at > now_ms);
                let mut after = known.map(crate::clock::from_millis).unwrap_or(now);
                let mut last = None;
                while let Some(next) = entry.schedule.next_after(after) {
                    let at = next.timestamp_millis();
                    // Always the next firing, then every one within the horizon.
                    if at > horizon && (known.is_some() || last.is_some()) {
                        break;
                    }
                    let payload = RawValue::from_string(entry.payload.to_string())
                        .expect("a JSON value prints as JSON");
                    firings.push(NewTask {
                        id: uuid::Uuid::now_v7().to_string(),
                        task_type: job.task_type.clone(),
                        payload,
                        priority: entry.priority,
                        trigger_at: at,
                        max_retries: job.max_retries,
                        timeout_ms: job.timeout.as_millis() as i64,
                        idempotency_key: None,
                        unique_key: None,
                        cron_key: Some(format!("{}/{}/{at}", job.task_type, entry.name)),
                        depends_on: Vec::new(),
                        source_service: Some("asyncd-scheduler".into()),
                    });
                    last = Some(at);
                    after = next;
                }
                if let Some(at) = last {
                    latest.push((key, at));
                }
            }
        }
        if firings.is_empty() {
            return Ok(firings);
        }
        let outcomes = self.store.insert(&firings, now_ms).await?;
        for (key, at) in latest {
            self.created.insert(key, at);
        }
        let soon = firings.iter().any(|f| f.trigger_at <= now_ms + 5_000);
        if soon && let Some(waker) = &self.waker {
            waker.wake();
        }
        Ok(firings
            .into_iter()
            .zip(outcomes)
            .filter(|(_, o)| matches!(o, InsertOutcome::Inserted { .. }))
            .map(|(f, _)| f)
            .collect())
    }
}

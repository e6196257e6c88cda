//! The rescuer: brings back work whose lease ran out — claims held by a dispatcher that
//! died, attempts whose executor never answered or stopped heartbeating — so a crash
//! anywhere delays a task but never loses it.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::executor::AttemptOutcome;
use crate::metrics::Metrics;
use crate::retry;
use crate::routing::Routes;
use crate::signals::{Signal, TestSignals, emit};
use crate::store::{Finish, FinishKind, Store, TaskState};

pub struct Rescuer {
    pub store: Arc<dyn Store>,
    pub routes: Routes,
    pub metrics: Arc<Metrics>,
    pub clock: SharedClock,
    pub interval: Duration,
    /// Test-only event hooks.
    pub signals: Option<TestSignals>,
}

impl Rescuer {
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
            match self.rescue_once().await {
                Ok(count) => emit(&self.signals, || Signal::Rescued {
                    count,
                    at: self.clock.now_millis(),
                }),
                Err(err) => tracing::warn!(%err, "rescue pass failed"),
            }
        }
    }

    /// One pass; returns how many tasks it brought back.
    pub async fn rescue_once(&self) -> crate::store::Result<usize> {
        let now = self.clock.now_millis();
        let lapsed = self.store.lapsed(now, 1000).await?;
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
        let applied = self.store.finish(&finishes, now).await?;
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

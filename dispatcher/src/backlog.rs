//! Publishes what is waiting in the store as gauges: pending tasks, the due backlog and
//! the oldest due task's age, per task type. The due figures are what autoscaling should
//! follow; raw queue depth also counts tasks that are not due yet. A paused job's tasks
//! count as pending but not as due backlog: no replica could start them, so the
//! autoscaler must not add replicas for them.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::metrics::Metrics;
use crate::routing::Routes;
use crate::store::Store;

pub async fn run(
    store: Arc<dyn Store>,
    routes: Routes,
    metrics: Arc<Metrics>,
    clock: SharedClock,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut seen: HashSet<String> = HashSet::new();
    loop {
        let now = clock.now_millis();
        match store.stats(now).await {
            Ok(stats) => {
                let mut paused: HashSet<String> = match store.pauses().await {
                    Ok(pauses) => pauses.into_iter().map(|(task_type, _)| task_type).collect(),
                    Err(err) => {
                        tracing::debug!(%err, "could not read the paused jobs");
                        HashSet::new()
                    }
                };
                paused.extend(
                    routes
                        .borrow()
                        .jobs()
                        .filter(|job| job.paused)
                        .map(|job| job.task_type.clone()),
                );
                let current: HashSet<String> = stats.iter().map(|s| s.task_type.clone()).collect();
                for gone in seen.difference(&current) {
                    metrics.pending.with_label_values(&[gone]).set(0);
                    metrics.due_backlog.with_label_values(&[gone]).set(0);
                    metrics.oldest_due_age.with_label_values(&[gone]).set(0.0);
                }
                for s in &stats {
                    let t = s.task_type.as_str();
                    metrics.pending.with_label_values(&[t]).set(s.pending);
                    let due = if paused.contains(t) { 0 } else { s.due };
                    metrics.due_backlog.with_label_values(&[t]).set(due);
                    let age = match s.oldest_due {
                        Some(at) if due > 0 => now.since(at).as_secs_f64(),
                        _ => 0.0,
                    };
                    metrics.oldest_due_age.with_label_values(&[t]).set(age);
                }
                seen = current;
            }
            Err(err) => tracing::warn!(%err, "backlog stats failed"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

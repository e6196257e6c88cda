//! Publishes what is waiting in the store as gauges: pending tasks, the due backlog and
//! the oldest due task's age, per task type. The due figures are what autoscaling should
//! follow; raw queue depth also counts tasks that are not due yet.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::metrics::Metrics;
use crate::store::Store;

pub async fn run(
    store: Arc<dyn Store>,
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
                let current: HashSet<String> = stats.iter().map(|s| s.task_type.clone()).collect();
                for gone in seen.difference(&current) {
                    metrics.pending.with_label_values(&[gone]).set(0);
                    metrics.due_backlog.with_label_values(&[gone]).set(0);
                    metrics.oldest_due_age.with_label_values(&[gone]).set(0.0);
                }
                for s in &stats {
                    let t = s.task_type.as_str();
                    metrics.pending.with_label_values(&[t]).set(s.pending);
                    metrics.due_backlog.with_label_values(&[t]).set(s.due);
                    let age = s.oldest_due.map_or(0.0, |at| now.since(at).as_secs_f64());
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

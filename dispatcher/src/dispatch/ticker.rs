//! The ticker: sleeps until the heap's earliest ETA or a new arrival, then moves the
//! due tasks to their job's runner, starting a job's runner when its first task comes
//! due (or when the claimer asks it to look in the store for due tasks). One place decides when a task is due, so the runners only decide in what order
//! and how fast.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::runner::{ReadyQueue, Runners};
use super::{DispatcherConfig, Outcomes, Unstarted, stop_on_exit};
use crate::clock::SharedClock;
use crate::job_table::Routes;
use crate::metrics::Metrics;
use crate::test_hooks::{Signal, emit};
use asyncd_store::Millis;

pub(super) struct Ticker {
    unstarted: Arc<Unstarted>,
    routes: Routes,
    metrics: Arc<Metrics>,
    clock: SharedClock,
    config: Arc<DispatcherConfig>,
    /// For the due tasks no runner may take: their job is gone, or the clock is off.
    outcomes: Outcomes,
    /// What each job's runner starts from.
    runners: Runners,
    queues: Queues,
    /// The runners started, for shutdown to wait on.
    started: Vec<JoinHandle<()>>,
}

impl Ticker {
    pub(super) fn new(
        unstarted: Arc<Unstarted>,
        routes: Routes,
        metrics: Arc<Metrics>,
        clock: SharedClock,
        config: Arc<DispatcherConfig>,
        outcomes: Outcomes,
        runners: Runners,
    ) -> Self {
        Self {
            unstarted,
            routes,
            metrics,
            clock,
            config,
            outcomes,
            runners,
            queues: Queues::default(),
            started: Vec::new(),
        }
    }

    /// Returns the runners it started (in `tasks`), for shutdown to wait on. Its queues
    /// close as it ends.
    pub(super) async fn run(
        mut self,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Vec<JoinHandle<()>> {
        loop {
            let (now, next_eta) = self.tick(&tasks, &shutdown).await;
            if shutdown.is_cancelled() {
                return std::mem::take(&mut self.started);
            }
            if next_eta.is_some_and(|eta| eta <= self.clock.now_millis()) {
                continue;
            }
            let sleep = next_eta.map(|eta| eta.since(now));
            tokio::select! {
                _ = shutdown.cancelled() => return std::mem::take(&mut self.started),
                _ = self.unstarted.heap_changed.notified() => {}
                _ = async { tokio::time::sleep(sleep.unwrap_or_default()).await }, if sleep.is_some() => {}
            }
        }
    }

    /// Moves what is due now (up to 4096 tasks) to the runners; returns the clock reading
    /// it went by and the heap's next ETA.
    pub(super) async fn tick(
        &mut self,
        tasks: &TaskTracker,
        shutdown: &CancellationToken,
    ) -> (Millis, Option<Millis>) {
        let now = self.clock.now_millis();
        let (due, next_eta) = {
            let mut heap = self.unstarted.heap();
            let due: Vec<_> = std::iter::from_fn(|| heap.pop_due(now))
                .take(4096)
                .collect();
            self.metrics.heap_size.set(heap.len() as i64);
            (due, heap.next_eta())
        };
        let routes = self.routes.borrow().clone();
        // A clock too far from the store's would run these early (or late): hand them
        // back for a dispatcher whose clock is right.
        let skewed = !self.config.clock_check.may_dispatch();
        for task in due {
            if skewed || routes.job(&task.task_type).is_none() {
                // Its job config is gone: leave the task in the store for when it returns.
                self.outcomes.release(vec![task]).await;
                continue;
            }
            // The claimer keeps heap plus queues within `max_heap` (Kafka adoption may
            // overshoot it by a batch).
            let queue = self.queue(&task.task_type, tasks, shutdown);
            emit(&self.config.signals, || Signal::Dispatched {
                id: task.id.clone(),
                eta: task.trigger_at,
                at: now,
            });
            // (A runner that panicked has stopped the dispatcher: what waits in its
            // queue comes back when the claims' hold lapses.)
            queue.push(task);
        }
        // The runners the claimer named look in the store for what is due.
        let look = std::mem::take(&mut *self.unstarted.look.lock().expect("look lock"));
        for task_type in look {
            if !skewed && routes.job(&task_type).is_some() {
                self.queue(&task_type, tasks, shutdown).look_in_store();
            }
        }
        (now, next_eta)
    }

    /// The queue of `task_type`'s runner, which is started with it.
    fn queue(
        &mut self,
        task_type: &str,
        tasks: &TaskTracker,
        shutdown: &CancellationToken,
    ) -> Arc<ReadyQueue> {
        let Self {
            queues,
            runners,
            started,
            ..
        } = self;
        queues
            .0
            .entry(task_type.to_string())
            .or_insert_with(|| {
                let (runner, queue) = runners.runner(task_type.to_string());
                started.push(
                    tasks.spawn(stop_on_exit(shutdown.clone(), runner.run(shutdown.clone()))),
                );
                queue
            })
            .clone()
    }
}

/// The ticker's queues, closed when it ends for any reason (a panic included), so every
/// runner hands back what waits in its queue and ends.
#[derive(Default)]
struct Queues(HashMap<String, Arc<ReadyQueue>>);

impl Drop for Queues {
    fn drop(&mut self) {
        for queue in self.0.values() {
            queue.close();
        }
    }
}

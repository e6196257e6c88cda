//! Slots refilled in the write that frees them. A permit is held until its attempt's
//! outcome is written, so that the store's count of running attempts never refuses an
//! attempt the runner began. Freed by the completer's write, a permit used to wait for
//! the runner's next look in the store, a write of its own: a slot spent two store
//! round trips and the wait between them on every task. Like BullMQ's
//! `moveToFinished`, which completes one job and fetches the next in one call, the
//! completer now keeps the permits its outcomes free for a job whose runner would look
//! in the store next, and the same transaction that writes the outcomes begins that
//! job's next due attempts ([`Store::finish_and_start_due`]). The job's limits hold as
//! they do for the runner's look: the start takes the job's limits row and counts the
//! attempts running once the outcomes are written. It never waits for that row: while
//! another dispatcher's start holds it, the write begins nothing for the job and its
//! permits go back to the runner, so the outcomes are not held up.
//!
//! The runner stays in charge of everything else: tasks claimed ahead of their ETA (its
//! queue is read first, so the completer keeps no permit while one waits there), the
//! look that finds the job's backlog empty, and a lowered concurrency (the completer
//! pays what the job's limit owes before it keeps a permit).
//!
//! [`Store::finish_and_start_due`]: asyncd_store::Store::finish_and_start_due

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::OwnedSemaphorePermit;

use super::Unstarted;
use super::adaptive::Adaptive;
use super::attempt::Attempts;
use super::claimer::runs_due_from_store;
use super::completer::Completion;
use super::runner::{ConcurrencyLimit, ReadyQueue, effective_concurrency};
use crate::job_table::Routes;
use crate::metrics::Metrics;
use crate::signing::Keys;
use crate::test_hooks::{Signal, emit};
use asyncd_spec::Job;
use asyncd_store::{DueStart, DueStarted, Millis};

/// What the completer needs to refill a job's slots, shared with the runners, which
/// register their limit and queue here as they start.
pub(super) struct Refill {
    routes: Routes,
    adaptive: Arc<Mutex<Adaptive>>,
    metrics: Arc<Metrics>,
    /// Weak: the attempts hold the way into the completer, whose channel closing (every
    /// sender gone) ends it.
    attempts: Weak<Attempts>,
    unstarted: Arc<Unstarted>,
    /// Per job, its runner's limit and queue; a new runner of the job replaces them.
    runners: Mutex<HashMap<String, RunnerSlots>>,
}

#[derive(Clone)]
struct RunnerSlots {
    limit: Arc<ConcurrencyLimit>,
    queue: Arc<ReadyQueue>,
}

impl Refill {
    pub(super) fn new(
        routes: Routes,
        adaptive: Arc<Mutex<Adaptive>>,
        metrics: Arc<Metrics>,
        attempts: Weak<Attempts>,
        unstarted: Arc<Unstarted>,
    ) -> Self {
        Self {
            routes,
            adaptive,
            metrics,
            attempts,
            unstarted,
            runners: Mutex::default(),
        }
    }

    /// Registers the runner of `task_type` that has started.
    pub(super) fn runner_started(
        &self,
        task_type: &str,
        limit: Arc<ConcurrencyLimit>,
        queue: Arc<ReadyQueue>,
    ) {
        self.runners
            .lock()
            .expect("runners lock")
            .insert(task_type.to_string(), RunnerSlots { limit, queue });
    }

    /// Takes, out of `completions`, the permits that may begin their jobs' next due
    /// attempts: those of a job that begins its due tasks from the store, is not paused,
    /// may dispatch here now, and whose runner, with nothing queued, would look in the
    /// store next. `None` when no permit qualifies.
    pub(super) fn plan(&self, completions: &mut [Completion], now: Millis) -> Option<Plan> {
        let attempts = self.attempts.upgrade()?;
        let mut freed: HashMap<&str, Vec<OwnedSemaphorePermit>> = HashMap::new();
        for completion in completions.iter_mut() {
            if let Some((task_type, permit)) = completion.permit_of_job() {
                freed.entry(task_type).or_default().push(permit);
            }
        }
        // Only the runners of the jobs freed here, looked up under one lock.
        let freed: Vec<_> = {
            let runners = self.runners.lock().expect("runners lock");
            freed
                .into_iter()
                .map(|(task_type, permits)| (task_type, permits, runners.get(task_type).cloned()))
                .collect()
        };
        let mut jobs = Vec::new();
        for (task_type, permits, runner) in freed {
            let job = self.routes.borrow().job(task_type).cloned();
            let (Some(job), Some(runner)) = (job, runner) else {
                continue;
            };
            if job.paused || !runs_due_from_store(&job) || !runner.queue.would_look_in_store() {
                continue;
            }
            let Some(keys) = attempts.due_keys(&job) else {
                continue;
            };
            // This dispatcher's share may have changed since the runner last read it.
            runner
                .limit
                .resize(effective_concurrency(&self.adaptive, &self.metrics, &job) as usize);
            let permits: Vec<_> = permits
                .into_iter()
                .filter_map(|permit| runner.limit.keep(permit))
                .collect();
            if !permits.is_empty() {
                jobs.push(JobRefill { job, keys, permits });
            }
        }
        (!jobs.is_empty()).then(|| Plan {
            attempts,
            unstarted: self.unstarted.clone(),
            now,
            jobs,
        })
    }
}

/// The permits a completer batch keeps, per job, for the starts written with it.
pub(super) struct Plan {
    attempts: Arc<Attempts>,
    unstarted: Arc<Unstarted>,
    now: Millis,
    jobs: Vec<JobRefill>,
}

struct JobRefill {
    job: Arc<Job>,
    keys: Keys,
    permits: Vec<OwnedSemaphorePermit>,
}

impl Plan {
    /// The starts to write with the outcomes, one per job, in the plan's order.
    pub(super) fn starts(&self) -> Vec<DueStart<'_>> {
        self.jobs
            .iter()
            .map(|refill| {
                self.attempts
                    .due_start(&refill.job, self.now, refill.permits.len())
            })
            .collect()
    }

    /// The permits kept, when the starts were not written.
    pub(super) fn into_permits(self) -> Vec<OwnedSemaphorePermit> {
        self.jobs
            .into_iter()
            .flat_map(|refill| refill.permits)
            .collect()
    }

    /// Spawns the attempts the starts began (one result per start, in order); the
    /// permits left over go back to their jobs' runners.
    pub(super) fn began(self, started: Vec<DueStarted>) {
        let Self {
            attempts,
            unstarted,
            now,
            jobs,
        } = self;
        for (refill, due) in jobs.into_iter().zip(started) {
            emit(&attempts.config.signals, || Signal::Refilled {
                ids: due.tasks.iter().map(|(task, _)| task.id.clone()).collect(),
            });
            let begun = attempts.began_due(&refill.job, refill.keys, now, due, refill.permits);
            unstarted
                .begun_from_store
                .fetch_add(begun as u64, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

//! One runner per job: keeps that job's order (its keys in turns), and begins its due
//! tasks in batches within the job's `concurrency` here and its limits in total across
//! dispatchers ([`Attempts::begin`]). A runner per job, so a slow job never holds up
//! another.

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::adaptive::Adaptive;
use super::refill::Refill;
use super::{Attempts, Outcomes, Unstarted};
use crate::job_table::Routes;
use crate::metrics::Metrics;
use asyncd_store::heap::ReadyHeap;
use asyncd_store::{ClaimedTask, HeldBy};

/// How often a runner held back by its job's concurrency (slots taken by attempts other
/// dispatchers began, or by long attempts an executor accepted with 202) asks the store
/// again when no outcome of its own was written meanwhile: the store is the only place
/// that learns when another dispatcher's attempt ends.
const SLOT_POLL: Duration = Duration::from_millis(50);

/// How many runners of a dispatcher may look in the store for due tasks at once
/// ([`Attempts::begin_due`]). A look holds one of the store pool's 10 connections while
/// it waits its turn at the job's limits row; a claimer pass sets every owned job's
/// runner looking, and unbounded, with many jobs, those could hold them all while the
/// completer's writes (the outcomes a SIGKILL would run again) wait behind them.
pub(super) const LOOKS_AT_ONCE: usize = 2;

/// What every job's runner shares; the ticker starts one from it for each job it sees.
#[derive(Clone)]
pub(super) struct Runners {
    pub(super) routes: Routes,
    pub(super) metrics: Arc<Metrics>,
    /// Read for this dispatcher's share of each adaptive job's concurrency.
    pub(super) adaptive: Arc<Mutex<Adaptive>>,
    pub(super) attempts: Arc<Attempts>,
    /// For handing back what waits in a queue at shutdown.
    pub(super) outcomes: Outcomes,
    /// Notified each time the completer has written a batch of outcomes: runners held
    /// back by their job's concurrency look again.
    pub(super) outcomes_written: Arc<Notify>,
    /// Where the tasks waiting in the runners' queues are counted.
    pub(super) unstarted: Arc<Unstarted>,
    /// [`LOOKS_AT_ONCE`].
    pub(super) looks: Arc<Semaphore>,
    /// Where each runner registers its limit and queue, for the completer to begin the
    /// job's next attempts with the outcomes that free its slots.
    pub(super) refill: Arc<Refill>,
}

impl Runners {
    /// The runner of `task_type`, and the queue the ticker hands it due tasks through.
    pub(super) fn runner(&self, task_type: String) -> (Runner, Arc<ReadyQueue>) {
        let queue = Arc::new(ReadyQueue::new(self.unstarted.clone()));
        let limit = Arc::new(ConcurrencyLimit::new(
            self.routes
                .borrow()
                .job(&task_type)
                .map_or(1, |job| job.concurrency as usize),
        ));
        self.refill
            .runner_started(&task_type, limit.clone(), queue.clone());
        let runner = Runner {
            shared: self.clone(),
            task_type,
            queue: queue.clone(),
            limit,
            more_due: false,
        };
        (runner, queue)
    }

    fn effective_concurrency(&self, job: &asyncd_spec::Job) -> u32 {
        effective_concurrency(&self.adaptive, &self.metrics, job)
    }
}

/// The attempts of `job` this dispatcher lets run at once: its `concurrency`, or less
/// while adaptive concurrency has backed it off. Also the job's gauge.
pub(super) fn effective_concurrency(
    adaptive: &Mutex<Adaptive>,
    metrics: &Metrics,
    job: &asyncd_spec::Job,
) -> u32 {
    let limit = if job.adaptive.enabled {
        adaptive
            .lock()
            .expect("adaptive lock")
            .limit(&job.task_type, job.concurrency)
    } else {
        job.concurrency
    };
    metrics
        .effective_concurrency
        .with_label_values(&[job.name.as_str()])
        .set(i64::from(limit));
    limit
}

/// One job's runner: at most `concurrency` attempts at once here (a permit is held until
/// the attempt's outcome is written), and within the job's limits in total as the store
/// admits them ([`Attempts::begin`]); each permit goes to the best ranked due task at the
/// moment it is free (a permit is taken first, then the task, so a task that came due
/// meanwhile with a better rank is not passed over).
pub(super) struct Runner {
    shared: Runners,
    task_type: String,
    queue: Arc<ReadyQueue>,
    limit: Arc<ConcurrencyLimit>,
    /// The last look in the store began all it asked for, so more is most likely due:
    /// the next look skips the reader's check ([`asyncd_store::StartDueParams::probe`]).
    more_due: bool,
}

impl Runner {
    pub(super) async fn run(mut self, shutdown: CancellationToken) {
        while !shutdown.is_cancelled() {
            if self.round(&shutdown).await.is_break() {
                break;
            }
        }
        // Shutdown: hand back what waits here, and what the ticker adds until it closes the
        // queue.
        while let Some(task) = self.queue.pop().await {
            self.shared.outcomes.release(vec![task]).await;
        }
    }

    /// One round: takes a permit and the best due task, as many more as are free at
    /// once (or, for a batch job, within its `maxWait`), begins them, and waits as long
    /// as the limit that held any back says. Breaks at shutdown or once the queue closes.
    pub(super) async fn round(&mut self, shutdown: &CancellationToken) -> ControlFlow<()> {
        let Self {
            shared,
            task_type,
            queue,
            limit,
            more_due,
        } = self;
        // Follow a changed concurrency limit without a restart, and this dispatcher's
        // share of it as the executor's answers have it.
        let job = shared.routes.borrow().job(task_type).cloned();
        if let Some(job) = &job {
            limit.resize(shared.effective_concurrency(job) as usize);
        }
        let job_batch = job.as_ref().and_then(|job| job.batch);
        let permit = tokio::select! {
            permit = limit.acquire() => permit,
            _ = shutdown.cancelled() => return ControlFlow::Break(()),
        };
        let first = tokio::select! {
            next = queue.next() => match next {
                Next::Task(task) => task,
                Next::LookInStore => {
                    return match job {
                        Some(job) => {
                            Self::begin_due(shared, queue, limit, more_due, &job, permit, shutdown)
                                .await
                        }
                        None => ControlFlow::Continue(()),
                    };
                }
                Next::Closed => return ControlFlow::Break(()),
            },
            _ = shutdown.cancelled() => return ControlFlow::Break(()),
        };
        let mut batch: Vec<(ClaimedTask, OwnedSemaphorePermit)> = vec![(first, permit)];
        // One store round trip begins up to 256 attempts, or one whole call of a batch
        // job with larger calls.
        let per_call = job_batch.map(|b| b.max_tasks as usize);
        let most = per_call.map_or(256, |n| n.max(256));
        while batch.len() < most {
            let Some(permit) = limit.try_acquire() else {
                break;
            };
            let Some(task) = queue.try_pop() else { break };
            batch.push((task, permit));
        }
        // A batch job may hold what is due for up to `maxWait` to fill its first call.
        if let Some(batch_spec) = job_batch
            && !batch_spec.max_wait.is_zero()
        {
            let deadline = tokio::time::Instant::now() + batch_spec.max_wait;
            while batch.len() < batch_spec.max_tasks as usize {
                // A permit taken while the task is awaited goes back if the wait ends.
                let next = async {
                    let permit = limit.acquire().await;
                    (queue.pop().await, permit)
                };
                tokio::select! {
                    (task, permit) = next => match task {
                        Some(task) => batch.push((task, permit)),
                        None => break,
                    },
                    _ = tokio::time::sleep_until(deadline) => break,
                    _ = shutdown.cancelled() => break,
                }
            }
        }
        // The share may have been cut while the runner waited for a permit or a task:
        // permits taken at the old size would start attempts past the new one, whose
        // overload answers would cut it again (one 429 took a share of 9 to 4). What is
        // over goes back to the queue.
        if let Some(job) = &job {
            limit.resize(shared.effective_concurrency(job) as usize);
            for task in limit.give_back_owed(&mut batch) {
                queue.push(task);
            }
            if batch.is_empty() {
                return ControlFlow::Continue(());
            }
        }
        // Created before the store is asked, so an outcome written meanwhile is not
        // missed (a `Notified` receives `notify_waiters` from its creation on).
        let written = shared.outcomes_written.notified();
        let (pause, on_outcome) = match shared.attempts.begin(queue, batch).await {
            None => return ControlFlow::Continue(()),
            // No outcome brings the next token sooner.
            Some(HeldBy::Rate { next_token }) => (next_token.max(Duration::from_millis(1)), false),
            Some(HeldBy::Concurrency | HeldBy::Key | HeldBy::Limiter) => (SLOT_POLL, true),
        };
        tokio::select! {
            _ = written, if on_outcome => {}
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.cancelled() => return ControlFlow::Break(()),
        }
        ControlFlow::Continue(())
    }
}

impl Runner {
    /// Claims and begins due tasks straight from the store ([`Attempts::begin_due`]),
    /// as many as there are permits free now, up to a store round trip's 256; looks
    /// again next round while that finds a full batch or a limit held some back.
    async fn begin_due(
        shared: &Runners,
        queue: &ReadyQueue,
        limit: &ConcurrencyLimit,
        more_due: &mut bool,
        job: &asyncd_spec::Job,
        permit: OwnedSemaphorePermit,
        shutdown: &CancellationToken,
    ) -> ControlFlow<()> {
        if job.paused || !super::claimer::runs_due_from_store(job) {
            return ControlFlow::Continue(());
        }
        let mut permits = vec![permit];
        while permits.len() < 256
            && let Some(permit) = limit.try_acquire()
        {
            permits.push(permit);
        }
        let look = tokio::select! {
            look = shared.looks.acquire() => look.expect("never closed"),
            _ = shutdown.cancelled() => return ControlFlow::Break(()),
        };
        let wanted = permits.len();
        let written = shared.outcomes_written.notified();
        let begun = shared.attempts.begin_due(job, permits, !*more_due).await;
        drop(look);
        let Some((begun, held_by)) = begun else {
            *more_due = false;
            return ControlFlow::Continue(());
        };
        *more_due = begun == wanted;
        shared
            .unstarted
            .begun_from_store
            .fetch_add(begun as u64, std::sync::atomic::Ordering::Relaxed);
        if begun < wanted && held_by.is_none() {
            // Nothing more is due: the claimer's next pass says when to look again.
            return ControlFlow::Continue(());
        }
        queue.look_in_store();
        let (pause, on_outcome) = match held_by {
            None => return ControlFlow::Continue(()),
            Some(HeldBy::Rate { next_token }) => (next_token.max(Duration::from_millis(1)), false),
            Some(HeldBy::Concurrency | HeldBy::Key | HeldBy::Limiter) => (SLOT_POLL, true),
        };
        tokio::select! {
            _ = written, if on_outcome => {}
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.cancelled() => return ControlFlow::Break(()),
        }
        ControlFlow::Continue(())
    }
}

/// What a runner takes next from its queue.
// Moved once per round, never stored: boxing the task would allocate for each one.
#[allow(clippy::large_enum_variant)]
enum Next {
    /// The best ranked claimed task.
    Task(ClaimedTask),
    /// None is queued, and due tasks may wait in the store ([`ReadyQueue::look_in_store`]).
    LookInStore,
    /// None is queued and none will come: the ticker has ended.
    Closed,
}

/// A job's due tasks between the ticker and the job's runner, which takes the best
/// ranked ([`asyncd_store::ClaimedTask::rank`]) whenever it may begin an attempt. A heap rather than a
/// channel: a high-priority task that comes due behind a backlog goes before it.
pub(super) struct ReadyQueue {
    state: Mutex<QueueState>,
    changed: Notify,
    /// Counts the tasks waiting here against `max_heap`.
    unstarted: Arc<Unstarted>,
}

#[derive(Default)]
struct QueueState {
    ready: ReadyHeap,
    closed: bool,
    /// Due tasks may wait in the store for the runner to claim and begin.
    look: bool,
}

impl ReadyQueue {
    fn new(unstarted: Arc<Unstarted>) -> Self {
        Self {
            state: Mutex::default(),
            changed: Notify::new(),
            unstarted,
        }
    }

    pub(super) fn push(&self, task: ClaimedTask) {
        self.unstarted.queued.fetch_add(1, Ordering::SeqCst);
        self.state.lock().expect("ready lock").ready.push(task);
        self.changed.notify_one();
    }

    /// No more tasks will come (the ticker ended).
    pub(super) fn close(&self) {
        self.state.lock().expect("ready lock").closed = true;
        self.changed.notify_one();
    }

    /// Whether the runner, given a permit, would look in the store next: nothing is
    /// queued and due tasks may wait there.
    pub(super) fn would_look_in_store(&self) -> bool {
        let state = self.state.lock().expect("ready lock");
        state.look && !state.closed && state.ready.is_empty()
    }

    /// Due tasks may wait in the store: the runner looks once it has a permit and
    /// nothing queued.
    pub(super) fn look_in_store(&self) {
        self.state.lock().expect("ready lock").look = true;
        self.changed.notify_one();
    }

    fn try_pop(&self) -> Option<ClaimedTask> {
        let task = self.state.lock().expect("ready lock").ready.pop()?;
        Some(self.taken(task))
    }

    /// The best task queued, else whether to look in the store, waiting for either;
    /// [`Next::Closed`] once closed and empty. One consumer (the runner): `notify_one`
    /// keeps a wake-up for it when it is not waiting yet.
    async fn next(&self) -> Next {
        loop {
            {
                let mut state = self.state.lock().expect("ready lock");
                if let Some(task) = state.ready.pop() {
                    drop(state);
                    return Next::Task(self.taken(task));
                }
                if state.closed {
                    return Next::Closed;
                }
                if std::mem::take(&mut state.look) {
                    return Next::LookInStore;
                }
            }
            self.changed.notified().await;
        }
    }

    /// The best task, waiting for one; `None` once closed and empty. One consumer (the
    /// runner): `notify_one` keeps a wake-up for it when it is not waiting yet.
    async fn pop(&self) -> Option<ClaimedTask> {
        loop {
            {
                let mut state = self.state.lock().expect("ready lock");
                if let Some(task) = state.ready.pop() {
                    drop(state);
                    return Some(self.taken(task));
                }
                if state.closed {
                    return None;
                }
            }
            self.changed.notified().await;
        }
    }

    fn taken(&self, task: ClaimedTask) -> ClaimedTask {
        self.unstarted.queued.fetch_sub(1, Ordering::SeqCst);
        task
    }
}

/// A job's concurrency limit, which a config change may lower while attempts hold its
/// permits. `Semaphore::forget_permits` only forgets permits that are free, so the rest
/// are owed and destroyed as they come back; without that, lowering the limit under load
/// changed nothing. Shared by the job's runner, which takes permits, and the completer,
/// which may keep the permits its outcomes free for the job's next attempts
/// ([`super::refill`]): either pays what is owed first.
pub(super) struct ConcurrencyLimit {
    permits: Arc<Semaphore>,
    debt: Mutex<Debt>,
}

struct Debt {
    limit: usize,
    owed: usize,
}

impl ConcurrencyLimit {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(limit)),
            debt: Mutex::new(Debt { limit, owed: 0 }),
        }
    }

    fn debt(&self) -> std::sync::MutexGuard<'_, Debt> {
        self.debt.lock().expect("debt lock")
    }

    pub(super) fn resize(&self, wanted: usize) {
        let mut debt = self.debt();
        if wanted > debt.limit {
            let grow = wanted - debt.limit;
            let cancelled = grow.min(debt.owed);
            debt.owed -= cancelled;
            self.permits.add_permits(grow - cancelled);
        } else if wanted < debt.limit {
            let shrink = debt.limit - wanted;
            debt.owed += shrink - self.permits.forget_permits(shrink);
        }
        debt.limit = wanted;
    }

    /// Pays what is owed with the permits of `batch`'s lowest ranked entries, and
    /// returns their tasks.
    fn give_back_owed<T>(&self, batch: &mut Vec<(T, OwnedSemaphorePermit)>) -> Vec<T> {
        let mut debt = self.debt();
        let mut tasks = Vec::new();
        while debt.owed > 0
            && let Some((task, permit)) = batch.pop()
        {
            permit.forget();
            debt.owed -= 1;
            tasks.push(task);
        }
        tasks
    }

    /// `permit`, one of this limit's, kept for another attempt unless it pays a debt.
    pub(super) fn keep(&self, permit: OwnedSemaphorePermit) -> Option<OwnedSemaphorePermit> {
        let mut debt = self.debt();
        if debt.owed == 0 {
            return Some(permit);
        }
        permit.forget();
        debt.owed -= 1;
        None
    }

    /// A permit if one is free now, after paying what is owed.
    fn try_acquire(&self) -> Option<OwnedSemaphorePermit> {
        loop {
            let permit = self.permits.clone().try_acquire_owned().ok()?;
            if let Some(permit) = self.keep(permit) {
                return Some(permit);
            }
        }
    }

    /// Waits for a permit, paying what is owed first. Cancel-safe: a permit is destroyed
    /// and the debt lowered in the same step.
    async fn acquire(&self) -> OwnedSemaphorePermit {
        loop {
            let permit = self
                .permits
                .clone()
                .acquire_owned()
                .await
                .expect("semaphore never closes");
            if let Some(permit) = self.keep(permit) {
                return permit;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lowering_the_limit_while_every_permit_is_held_takes_effect_as_they_return() {
        let limit = ConcurrencyLimit::new(4);
        let held: Vec<_> = (0..4).map(|_| limit.try_acquire().unwrap()).collect();
        limit.resize(1);
        drop(held);
        let first = limit.try_acquire();
        assert!(first.is_some());
        assert!(
            limit.try_acquire().is_none(),
            "more than the new limit of 1"
        );
        drop(first);
        assert_eq!(limit.acquire().await.num_permits(), 1);
    }

    #[tokio::test]
    async fn raising_the_limit_cancels_what_is_owed_first() {
        let limit = ConcurrencyLimit::new(4);
        let held: Vec<_> = (0..4).map(|_| limit.try_acquire().unwrap()).collect();
        limit.resize(1);
        limit.resize(3);
        drop(held);
        let now: Vec<_> = std::iter::from_fn(|| limit.try_acquire()).collect();
        assert_eq!(now.len(), 3);
        limit.resize(5);
        let more: Vec<_> = std::iter::from_fn(|| limit.try_acquire()).collect();
        assert_eq!(more.len(), 2, "five in all");
    }

    #[tokio::test]
    async fn a_batch_taken_at_the_old_limit_gives_back_what_is_over_the_new_one() {
        let limit = ConcurrencyLimit::new(4);
        let mut batch: Vec<_> = (0..3).map(|n| (n, limit.try_acquire().unwrap())).collect();
        // Cut while the batch was gathered: two in flight elsewhere would have to end
        // before any of these began.
        let elsewhere = limit.try_acquire().unwrap();
        limit.resize(2);
        assert_eq!(limit.give_back_owed(&mut batch), vec![2, 1]);
        assert_eq!(batch.len(), 1, "the best ranked entry stays");
        drop(elsewhere);
        let next = limit.try_acquire();
        assert!(next.is_some());
        assert!(limit.try_acquire().is_none(), "two in all");
    }
}

//! The dispatcher: claims due work from the store into its ETA heap and hands each task
//! to its executor the moment it is due.
//!
//! Five loops, a module each, every one owning the state only it uses:
//! - [`membership`] heartbeats this dispatcher into the store and reads who else is
//!   alive, so [`Ownership`] can split task types among the live dispatchers;
//! - the [`claimer`] polls the store, for the task types this dispatcher owns, (every
//!   `poll_interval`, less often while idle, or at once when woken by a local submit or
//!   retry) for tasks due
//!   within `lookahead`, so they are in the heap before their ETA instead of waiting for
//!   the next tick; for jobs without keys or batches it claims only what is due ahead
//!   and tells their runners to look in the store for the rest;
//! - the [`ticker`] sleeps until the heap's earliest ETA or a new arrival, then moves
//!   due tasks to their job's runner;
//! - one [`runner`] per job keeps that job's order (its keys in turns), begins attempts
//!   in batches within its `concurrency`, `rateLimit` and per-key limit — kept in total
//!   across dispatchers by the store ([`Store::start_limited`]; with free slots and
//!   nothing queued it claims and begins due tasks in one write, [`Store::start_due`]) —
//!   and spawns the executor calls ([`attempt`]), so a slow job never holds up another;
//! - the [`completer`] writes attempt outcomes back in batches.
//!
//! What they share is small and named: [`Claims`] (per job, the tasks held here, which
//! the claimer sizes its claims by and whatever lets a task go counts down), [`Unstarted`]
//! (the heap and the runners' queues, which the claimer keeps within `max_heap`), the
//! [`Adaptive`] shares (attempts move them, runners follow them, membership publishes
//! them), the [`Ownership`] view (membership updates it, the claimer follows it), the
//! signing keys (the claimer skips a job without them, attempts sign with them), and
//! [`Outcomes`], the way into the completer. Settings ([`DispatcherConfig`]) are read-only.
//!
//! Shutdown: stop claiming, hand unstarted tasks back to the store, let in-flight calls
//! finish (up to `shutdown_grace`, then abandon them), flush outcomes. Anything cut short
//! is leased, so the rescuer brings it back. The loops run in the role's task tracker and
//! [`Dispatcher::run`] returns only after all of them have ended; a loop that panics
//! cancels the shutdown token (so the others drain) and `run` re-raises its panic for the
//! role to report.
//!
//! Every queue is bounded. Claimed-but-unstarted tasks (heap plus runner queues) are
//! capped at `max_heap` by the claimer, and per job at what its executor can begin
//! within half the claim hold ([`holdings`]), so a slow or stalled executor
//! stops the claimer for its job instead of pulling the due backlog into memory and
//! letting the claims lapse; outcomes waiting for the completer at
//! `max_heap` too: as many as the tasks this dispatcher may hold, so back-pressure only
//! starts when the store has fallen that far behind (a tighter bound throttles attempts
//! to the completer's pace and lets leases lapse under load), and a stalled store then
//! slows dispatching instead of growing memory. The completer depends on nothing but the
//! store, so a sender waiting on it cannot deadlock.

pub mod adaptive;
mod at_submit;
mod attempt;
mod claimer;
mod completer;
pub mod holdings;
mod journal;
mod membership;
pub mod ownership;
mod refill;
mod runner;
#[cfg(test)]
mod tests;
mod ticker;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::SharedClock;
use crate::clock_check::ClockCheck;
use crate::executor::ExecutorClient;
use crate::job_table::Routes;
use crate::metrics::Metrics;
use crate::signing::SigningKeys;
use crate::test_hooks::{Signal, TestSignals, emit};
use crate::trace::Tracer;
use asyncd_store::heap::EtaHeap;
use asyncd_store::{ClaimedTask, Millis, NewTask, Store};

use adaptive::{Adaptive, KeyAdaptive};
pub use at_submit::LocalDispatch;
use at_submit::{Reserved, SubmitRoom};
use attempt::Attempts;
use claimer::Claimer;
use completer::{Completer, Outcomes};
use holdings::Holdings;
pub use journal::{JournalError, OutcomeJournal};
use membership::Membership;
use ownership::Ownership;
use runner::Runners;
use ticker::Ticker;

/// How long a member may be silent before the others take it for dead; also how far
/// back the jobs overview counts a dispatcher's published shares.
pub const MEMBER_TTL: Duration = Duration::from_secs(4);

#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    /// Identifies this process in the store's `owner` column.
    pub owner: String,
    /// `--job`: the one job this dispatcher serves, which scopes its membership.
    pub job: Option<String>,
    pub poll_interval: Duration,
    /// The longest the claimer waits between polls once they find nothing: an idle
    /// dispatcher polls less often (see [`claimer`]). At least `poll_interval`, at most
    /// `lookahead`, so a task due later is still claimed ahead of its ETA.
    pub idle_poll_interval: Duration,
    /// How far ahead of their ETA tasks are claimed into the heap.
    pub lookahead: Duration,
    pub claim_batch: u32,
    /// Claiming pauses while the heap holds this many tasks.
    pub max_heap: usize,
    /// A claim is held this long past the task's ETA before the rescuer takes it back.
    pub hold: Duration,
    /// Added to an attempt's timeout for its lease.
    pub grace: Duration,
    pub shutdown_grace: Duration,
    /// How often this dispatcher records that it is alive.
    pub heartbeat_interval: Duration,
    /// A member silent this long is taken for dead and its task types move (default
    /// [`MEMBER_TTL`]).
    pub member_ttl: Duration,
    /// Where the membership loop records this clock's offset from the store's; `/readyz`
    /// reads it too.
    pub clock_check: Arc<ClockCheck>,
    /// Where each job's signing Secret is mounted ([`crate::signing`]).
    pub signing_dir: std::path::PathBuf,
    /// Jobs not dispatched for want of their signing keys; `/readyz` reports them.
    pub signing_status: Arc<crate::signing::SigningStatus>,
    /// Test-only event hooks.
    pub signals: Option<TestSignals>,
    /// Where the `dispatch` and `attempt` spans go ([`crate::trace`]).
    pub tracer: Tracer,
    /// `--outcome-journal`: the directory of this process's outcome journal
    /// ([`OutcomeJournal`]); none by default.
    pub outcome_journal: Option<std::path::PathBuf>,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            owner: format!("dispatcher-{}", std::process::id()),
            job: None,
            poll_interval: Duration::from_millis(200),
            idle_poll_interval: Duration::from_secs(1),
            lookahead: Duration::from_secs(2),
            claim_batch: 1000,
            max_heap: 200_000,
            hold: Duration::from_secs(30),
            grace: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(25),
            heartbeat_interval: Duration::from_secs(1),
            member_ttl: MEMBER_TTL,
            clock_check: Arc::default(),
            signing_dir: crate::signing::DEFAULT_DIR.into(),
            signing_status: Arc::default(),
            signals: None,
            tracer: Tracer::default(),
            outcome_journal: None,
        }
    }
}

/// Wakes the claimer when a task due soon was written by this process.
#[derive(Clone, Default)]
pub struct ClaimerWakeup(Arc<Wakeup>);

#[derive(Default)]
struct Wakeup {
    notify: Notify,
    /// Counts the wakes: one since the claimer's last pass began closes claim at submit
    /// ([`at_submit`]).
    wakes: AtomicU64,
}

impl ClaimerWakeup {
    pub fn wake(&self) {
        self.0.wakes.fetch_add(1, Ordering::SeqCst);
        self.0.notify.notify_one();
    }

    fn wakes(&self) -> u64 {
        self.0.wakes.load(Ordering::SeqCst)
    }
}

/// Lets a Kafka consumer hand the tasks it just claimed to this dispatcher's heap.
/// Weak, so a consumer outliving the dispatcher keeps nothing alive.
#[derive(Clone)]
pub struct HeapSink(std::sync::Weak<Intake>);

impl HeapSink {
    pub fn push(&self, tasks: Vec<ClaimedTask>) {
        let Some(intake) = self.0.upgrade() else {
            return;
        };
        if tasks.is_empty() {
            return;
        }
        intake.push(tasks);
    }
}

/// Per job, how many tasks this dispatcher holds (claimed, queued or running) and may
/// claim: the claimer sizes its claims by it, whatever lets a task go counts it down.
struct Claims {
    holdings: Mutex<Holdings>,
    waker: ClaimerWakeup,
}

impl Claims {
    fn holdings(&self) -> MutexGuard<'_, Holdings> {
        self.holdings.lock().expect("holdings lock")
    }

    /// A task of `task_type` left this dispatcher: finished, handed back, or dropped to
    /// its lease. Wakes the claimer if it had found the job full.
    fn let_go(&self, task_type: &str) {
        self.let_go_many(task_type, 1);
    }

    /// `count` tasks of `task_type` left this dispatcher (a batch call's).
    fn let_go_many(&self, task_type: &str, count: usize) {
        if self.holdings().remove(task_type, count) {
            self.waker.wake();
        }
    }
}

/// Claimed tasks not yet begun, which the claimer keeps within `max_heap`: in the ETA
/// heap until due, then in their job's [`runner::ReadyQueue`] until its runner takes them.
#[derive(Default)]
struct Unstarted {
    heap: Mutex<EtaHeap>,
    /// Notified when tasks join the heap: the ticker's next ETA may be sooner.
    heap_changed: Notify,
    /// Tasks handed to runners but not yet taken by them; counts against `max_heap`.
    queued: AtomicUsize,
    /// The jobs whose runners are to look in the store for due tasks
    /// ([`claimer::runs_due_from_store`]), as the claimer's last pass named them; the
    /// ticker passes it on. At most one entry per job.
    look: Mutex<std::collections::HashSet<String>>,
    /// Counts the tasks runners claimed and began straight from the store: work the
    /// claimer's own claims do not see, which keeps it polling at its busy pace.
    begun_from_store: AtomicU64,
}

impl Unstarted {
    fn heap(&self) -> MutexGuard<'_, EtaHeap> {
        self.heap.lock().expect("heap lock")
    }

    fn len(&self) -> usize {
        self.heap().len() + self.queued.load(Ordering::SeqCst)
    }
}

/// Where claimed tasks come into this dispatcher: the claimer's claims, the Kafka
/// consumer's through [`HeapSink`], and the API's claims at submit through
/// [`LocalDispatch`].
struct Intake {
    claims: Arc<Claims>,
    unstarted: Arc<Unstarted>,
    metrics: Arc<Metrics>,
    clock: SharedClock,
    signals: Option<TestSignals>,
    /// What the API may claim as it inserts, as the claimer last measured it.
    at_submit: Mutex<SubmitRoom>,
    max_heap: usize,
}

impl Intake {
    fn at_submit(&self) -> MutexGuard<'_, SubmitRoom> {
        self.at_submit.lock().expect("at-submit lock")
    }

    /// Room for claiming these of `tasks` at submit ([`SubmitRoom::reserve`]), within
    /// `max_heap`.
    fn reserve(&self, tasks: &[NewTask], horizon: Millis, wakes: u64) -> Option<Reserved> {
        let most = self.max_heap.saturating_sub(self.unstarted.len());
        self.at_submit().reserve(tasks, horizon, wakes, most)
    }

    /// The runners of these jobs are to look in the store for due tasks.
    fn due(&self, task_types: Vec<String>) {
        if task_types.is_empty() {
            return;
        }
        self.unstarted
            .look
            .lock()
            .expect("look lock")
            .extend(task_types);
        self.unstarted.heap_changed.notify_one();
    }

    fn push(&self, tasks: Vec<ClaimedTask>) {
        emit(&self.signals, || Signal::Claimed {
            ids: tasks.iter().map(|t| t.id.clone()).collect(),
            at: self.clock.now_millis(),
        });
        let mut holdings = self.claims.holdings();
        for task in &tasks {
            holdings.add(&task.task_type, 1);
            self.metrics
                .claimed
                .with_label_values(&[task.task_type.as_str()])
                .inc();
        }
        drop(holdings);
        let mut heap = self.unstarted.heap();
        for task in tasks {
            heap.push(task);
        }
        self.metrics.heap_size.set(heap.len() as i64);
        drop(heap);
        self.unstarted.heap_changed.notify_one();
    }
}

/// The loops, built and wired together but not started; [`Dispatcher::run`] starts them.
pub struct Dispatcher {
    completer: Completer,
    membership: Membership,
    claimer: Claimer,
    ticker: Ticker,
    /// Kept until every attempt has ended, so [`HeapSink`]s work until then.
    intake: Arc<Intake>,
    local: LocalDispatch,
    /// Drained at shutdown, its tasks handed back.
    unstarted: Arc<Unstarted>,
    /// For handing those back; the completer ends once this and every other sender is gone.
    outcomes: Outcomes,
    /// The attempts in flight, which shutdown waits for (up to `shutdown_grace`)...
    inflight: TaskTracker,
    /// ...then cancels: attempts still running are dropped.
    abandon: CancellationToken,
    shutdown_grace: Duration,
    shutdown: CancellationToken,
}

impl Dispatcher {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Arc<dyn Store>,
        routes: Routes,
        metrics: Arc<Metrics>,
        clock: SharedClock,
        executor: ExecutorClient,
        config: DispatcherConfig,
        waker: ClaimerWakeup,
        shutdown: CancellationToken,
        journal: Option<Arc<OutcomeJournal>>,
    ) -> Self {
        let (tx, rx) = mpsc::channel(config.max_heap.max(1));
        let member = ownership::member_name(config.job.as_deref(), &config.owner);
        let ownership = Arc::new(Mutex::new(Ownership::new(
            member.clone(),
            config.member_ttl,
        )));
        let signing = Arc::new(SigningKeys::new(
            config.signing_dir.clone(),
            metrics.signing_unavailable.clone(),
            config.signing_status.clone(),
        ));
        let config = Arc::new(config);
        let claims = Arc::new(Claims {
            holdings: Mutex::default(),
            waker: waker.clone(),
        });
        let unstarted = Arc::new(Unstarted::default());
        let intake = Arc::new(Intake {
            claims: claims.clone(),
            unstarted: unstarted.clone(),
            metrics: metrics.clone(),
            clock: clock.clone(),
            signals: config.signals.clone(),
            at_submit: Mutex::default(),
            max_heap: config.max_heap,
        });
        let local = LocalDispatch {
            intake: Arc::downgrade(&intake),
            waker: waker.clone(),
            owner: config.owner.as_str().into(),
            hold: config.hold,
            lookahead: config.lookahead,
        };
        let adaptive = Arc::new(Mutex::new(Adaptive::default()));
        let key_adaptive = Arc::new(Mutex::new(KeyAdaptive::default()));
        let outcomes_written = Arc::new(Notify::new());
        let outcomes = Outcomes::new(
            tx,
            claims.clone(),
            metrics.clone(),
            clock.clone(),
            &config,
            &journal,
        );
        let inflight = TaskTracker::new();
        let abandon = CancellationToken::new();
        let attempts = Arc::new(Attempts {
            store: store.clone(),
            routes: routes.clone(),
            metrics: metrics.clone(),
            clock: clock.clone(),
            executor,
            signing: signing.clone(),
            config: config.clone(),
            adaptive: adaptive.clone(),
            key_adaptive: key_adaptive.clone(),
            claims,
            outcomes: outcomes.clone(),
            inflight: inflight.clone(),
            abandon: abandon.clone(),
        });
        let refill = Arc::new(refill::Refill::new(
            routes.clone(),
            adaptive.clone(),
            metrics.clone(),
            Arc::downgrade(&attempts),
            unstarted.clone(),
        ));
        let runners = Runners {
            routes: routes.clone(),
            metrics: metrics.clone(),
            adaptive: adaptive.clone(),
            attempts,
            outcomes: outcomes.clone(),
            outcomes_written: outcomes_written.clone(),
            unstarted: unstarted.clone(),
            looks: Arc::new(tokio::sync::Semaphore::new(runner::LOOKS_AT_ONCE)),
            refill: refill.clone(),
        };
        Self {
            completer: Completer {
                store: store.clone(),
                clock: clock.clone(),
                waker: waker.clone(),
                signals: config.signals.clone(),
                written: outcomes_written,
                completions: rx,
                refill,
                journal,
            },
            membership: Membership::new(
                store.clone(),
                routes.clone(),
                metrics.clone(),
                clock.clone(),
                config.clone(),
                member,
                adaptive,
                ownership.clone(),
                waker.clone(),
            ),
            claimer: Claimer::new(
                store,
                routes.clone(),
                metrics.clone(),
                clock.clone(),
                config.clone(),
                signing,
                ownership,
                intake.clone(),
                waker,
                key_adaptive,
            ),
            ticker: Ticker::new(
                unstarted.clone(),
                routes,
                metrics,
                clock,
                config.clone(),
                outcomes.clone(),
                runners,
            ),
            intake,
            local,
            unstarted,
            outcomes,
            inflight,
            abandon,
            shutdown_grace: config.shutdown_grace,
            shutdown,
        }
    }

    /// Notified, to whoever waits on it then, each time the completer has written a
    /// batch of outcomes.
    pub fn outcomes_written(&self) -> Arc<Notify> {
        self.completer.written.clone()
    }

    pub fn sink(&self) -> HeapSink {
        HeapSink(Arc::downgrade(&self.intake))
    }

    /// How the API in this process inserts tasks, claiming for this dispatcher what it
    /// may ([`at_submit`]).
    pub fn local_dispatch(&self) -> LocalDispatch {
        self.local.clone()
    }

    /// Runs until the shutdown token fires, then winds down as described above. Its loops
    /// are spawned into `tasks` (the role's tracker) and all have ended when this returns.
    pub async fn run(self, tasks: TaskTracker) {
        let Self {
            completer,
            membership,
            claimer,
            ticker,
            intake,
            local: _,
            unstarted,
            outcomes,
            inflight,
            abandon,
            shutdown_grace,
            shutdown,
        } = self;
        let stop = || shutdown.clone();
        let completer = tasks.spawn(stop_on_exit(stop(), completer.run(stop())));
        let membership = tasks.spawn(stop_on_exit(stop(), membership.run(stop())));
        let claimer = tasks.spawn(stop_on_exit(stop(), claimer.run(stop())));
        let ticker = tasks.spawn(stop_on_exit(stop(), ticker.run(tasks.clone(), stop())));
        let mut panics = Vec::new();
        let mut joined = |result: Result<(), tokio::task::JoinError>| {
            if let Err(err) = result
                && err.is_panic()
            {
                panics.push(err.into_panic());
            }
        };
        let runners = match ticker.await {
            Ok(runners) => runners,
            Err(err) => {
                joined(Err(err));
                Vec::new()
            }
        };
        joined(claimer.await);
        joined(membership.await);

        let unstarted = unstarted.heap().drain();
        outcomes.release(unstarted).await;
        for runner in runners {
            joined(runner.await);
        }
        inflight.close();
        if tokio::time::timeout(shutdown_grace, inflight.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "in-flight attempts still running at shutdown; their leases will bring them back"
            );
            abandon.cancel();
            inflight.wait().await;
        }
        // The last sender goes with `outcomes` (every loop and attempt holding one has
        // ended), which ends the completer once it has written what is queued.
        drop(outcomes);
        drop(intake);
        joined(completer.await);
        if let Some(panic) = panics.into_iter().next() {
            std::panic::resume_unwind(panic);
        }
    }
}

/// Runs `future`, cancelling `shutdown` when it ends for any reason, a panic included:
/// each loop ends normally only after shutdown, so an early end means the others must
/// stop too.
async fn stop_on_exit<T>(shutdown: CancellationToken, future: impl Future<Output = T>) -> T {
    let _stop = shutdown.drop_guard();
    future.await
}

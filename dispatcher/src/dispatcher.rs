//! The dispatcher: claims due work from the store into its ETA heap and hands each task
//! to its executor the moment it is due.
//!
//! Five loops share one [`Shared`]:
//! - **membership** heartbeats this dispatcher into the store and reads who else is
//!   alive, so [`Ownership`] can split task types among the live dispatchers;
//! - the **claimer** polls the store, for the task types this dispatcher owns, (every `poll_interval`, or at once when woken by a
//!   local submit or retry) for tasks due within `lookahead`, so they are in the heap
//!   before their ETA instead of waiting for the next tick;
//! - the **ticker** sleeps until the heap's earliest ETA or a new arrival, then moves
//!   due tasks to their job's runner;
//! - one **runner per job** keeps that job's order (its keys in turns), begins attempts
//!   in batches within its `concurrency`, `rateLimit` and per-key limit — kept in total
//!   across dispatchers by the store
//!   ([`Store::start_limited`]) — and spawns the executor calls, so a slow job never
//!   holds up another;
//! - the **completer** writes attempt outcomes back in batches.
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
//! within half the claim hold ([`crate::holdings`]), so a slow or stalled executor
//! stops the claimer for its job instead of pulling the due backlog into memory and
//! letting the claims lapse; outcomes waiting for the completer at
//! `max_heap` too: as many as the tasks this dispatcher may hold, so back-pressure only
//! starts when the store has fallen that far behind (a tighter bound throttles attempts
//! to the completer's pace and lets leases lapse under load), and a stalled store then
//! slows dispatching instead of growing memory. The completer depends on nothing but the
//! store, so a sender waiting on it cannot deadlock.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::adaptive::{self, Adaptive};
use crate::clock::SharedClock;
use crate::clock_check::{ClockCheck, Reading};
use crate::executor::{AttemptOutcome, BatchAttempt, ExecutorClient};
use crate::heap::{EtaHeap, ReadyHeap};
use crate::holdings::{Holdings, JobLimits};
use crate::metrics::Metrics;
use crate::ownership::Ownership;
use crate::retry;
use crate::routing::Routes;
use crate::signals::{Signal, TestSignals, emit};
use crate::signing::{Keys, SigningKeys};
use crate::store::{
    ClaimParams, ClaimedTask, FairParams, Finish, FinishKind, HeldBy, JobGate, StartParams, Store,
    TypeFilter,
};
use crate::trace::{SpanKind, Tracer, Value};

/// How often a runner held back by its job's concurrency (slots taken by attempts other
/// dispatchers began, or by long attempts an executor accepted with 202) asks the store
/// again when no outcome of its own was written meanwhile: the store is the only place
/// that learns when another dispatcher's attempt ends.
const SLOT_POLL: Duration = Duration::from_millis(50);

/// An outcome for the completer, with the concurrency permit its attempt held: the
/// permit goes once the outcome is written, when the store stops counting the attempt
/// as running, so the runner does not begin an attempt the store's count would refuse.
struct Completion {
    finish: Finish,
    permit: Option<OwnedSemaphorePermit>,
    /// The attempt held a slot of its concurrency key: once its outcome is written the
    /// key's next task may be claimed, so the claimer looks at once.
    frees_key: bool,
}

impl From<Finish> for Completion {
    fn from(finish: Finish) -> Self {
        Self {
            finish,
            permit: None,
            frees_key: false,
        }
    }
}

/// How many times the completer retries a batch once shutdown has begun, before leaving
/// those tasks to their leases rather than holding the process up while the store is away.
const SHUTDOWN_FINISH_TRIES: u32 = 5;

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
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            owner: format!("dispatcher-{}", std::process::id()),
            job: None,
            poll_interval: Duration::from_millis(200),
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
        }
    }
}

/// Wakes the claimer when a task due soon was written by this process.
#[derive(Clone, Default)]
pub struct ClaimerWakeup(Arc<Notify>);

impl ClaimerWakeup {
    pub fn wake(&self) {
        self.0.notify_one();
    }
}

/// Lets a Kafka consumer hand the tasks it just claimed to this dispatcher's heap.
/// Weak, so a consumer outliving the dispatcher keeps nothing alive.
#[derive(Clone)]
pub struct HeapSink(std::sync::Weak<Shared>);

impl HeapSink {
    pub fn push(&self, tasks: Vec<ClaimedTask>) {
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        if tasks.is_empty() {
            return;
        }
        shared.push(tasks);
    }
}

struct Shared {
    store: Arc<dyn Store>,
    routes: Routes,
    metrics: Arc<Metrics>,
    clock: SharedClock,
    executor: ExecutorClient,
    signing: SigningKeys,
    config: DispatcherConfig,
    heap: Mutex<EtaHeap>,
    heap_changed: Notify,
    /// Per job: how many tasks this dispatcher holds and may claim.
    holdings: Mutex<Holdings>,
    /// Per job: this dispatcher's share of its concurrency, as the executor's answers
    /// have it ([`crate::adaptive`]).
    adaptive: Mutex<Adaptive>,
    /// Per keyed job: the key its last fair claim ended at.
    fair_after: Mutex<HashMap<String, String>>,
    ownership: Mutex<Ownership>,
    waker: ClaimerWakeup,
    completions: mpsc::Sender<Completion>,
    /// Notified each time the completer has written a batch of outcomes: runners held
    /// back by their job's concurrency look again.
    outcomes_written: Arc<Notify>,
    /// Tasks handed to runners but not yet taken by them; counts against `max_heap`.
    queued: AtomicUsize,
    inflight: TaskTracker,
    /// Cancelled when the shutdown grace is over: attempts still running are dropped.
    abandon: CancellationToken,
    shutdown: CancellationToken,
}

impl Shared {
    /// A task of `task_type` left this dispatcher: finished, handed back, or dropped to
    /// its lease. Wakes the claimer if it had found the job full.
    fn let_go(&self, task_type: &str) {
        self.let_go_many(task_type, 1);
    }

    /// `count` tasks of `task_type` left this dispatcher (a batch call's).
    fn let_go_many(&self, task_type: &str, count: usize) {
        if self
            .holdings
            .lock()
            .expect("holdings lock")
            .remove(task_type, count)
        {
            self.waker.wake();
        }
    }

    fn push(&self, tasks: Vec<ClaimedTask>) {
        emit(&self.config.signals, || Signal::Claimed {
            ids: tasks.iter().map(|t| t.id.clone()).collect(),
            at: self.clock.now_millis(),
        });
        let mut holdings = self.holdings.lock().expect("holdings lock");
        for task in &tasks {
            holdings.add(&task.task_type, 1);
            self.metrics
                .claimed
                .with_label_values(&[task.task_type.as_str()])
                .inc();
        }
        drop(holdings);
        let mut heap = self.heap.lock().expect("heap lock");
        for task in tasks {
            heap.push(task);
        }
        self.metrics.heap_size.set(heap.len() as i64);
        drop(heap);
        self.heap_changed.notify_one();
    }
}

pub struct Dispatcher {
    shared: Arc<Shared>,
    completions: mpsc::Receiver<Completion>,
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
    ) -> Self {
        let (tx, rx) = mpsc::channel(config.max_heap.max(1));
        let member = crate::ownership::member_name(config.job.as_deref(), &config.owner);
        let ownership = Ownership::new(member, config.member_ttl);
        let signing = SigningKeys::new(
            config.signing_dir.clone(),
            metrics.signing_unavailable.clone(),
            config.signing_status.clone(),
        );
        Self {
            shared: Arc::new(Shared {
                store,
                routes,
                metrics,
                clock,
                executor,
                signing,
                config,
                heap: Mutex::new(EtaHeap::default()),
                heap_changed: Notify::new(),
                holdings: Mutex::new(Holdings::default()),
                adaptive: Mutex::new(Adaptive::default()),
                fair_after: Mutex::default(),
                ownership: Mutex::new(ownership),
                waker,
                completions: tx,
                outcomes_written: Arc::default(),
                queued: AtomicUsize::new(0),
                inflight: TaskTracker::new(),
                abandon: CancellationToken::new(),
                shutdown,
            }),
            completions: rx,
        }
    }

    pub fn sink(&self) -> HeapSink {
        HeapSink(Arc::downgrade(&self.shared))
    }

    /// Runs until the shutdown token fires, then winds down as described above. Its loops
    /// are spawned into `tasks` (the role's tracker) and all have ended when this returns.
    pub async fn run(self, tasks: TaskTracker) {
        let shared = self.shared;
        let stop = || shared.shutdown.clone();
        let completer = tasks.spawn(stop_on_exit(
            stop(),
            complete(shared.clone(), self.completions),
        ));
        let membership = tasks.spawn(stop_on_exit(stop(), keep_membership(shared.clone())));
        let claimer = tasks.spawn(stop_on_exit(stop(), claim(shared.clone())));
        let ticker = tasks.spawn(stop_on_exit(stop(), tick(shared.clone(), tasks.clone())));
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

        let unstarted = shared.heap.lock().expect("heap lock").drain();
        release(&shared, unstarted).await;
        for runner in runners {
            joined(runner.await);
        }
        shared.inflight.close();
        if tokio::time::timeout(shared.config.shutdown_grace, shared.inflight.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "in-flight attempts still running at shutdown; their leases will bring them back"
            );
            shared.abandon.cancel();
            shared.inflight.wait().await;
        }
        // The last sender goes with `shared`, which ends the completer once it has
        // written what is queued.
        drop(shared);
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

async fn release(shared: &Shared, tasks: Vec<ClaimedTask>) {
    for task in tasks {
        emit(&shared.config.signals, || Signal::Released {
            id: task.id.clone(),
        });
        shared.let_go(&task.task_type);
        let _ = shared
            .completions
            .send(
                Finish {
                    id: task.id,
                    lease_token: task.lease_token,
                    kind: FinishKind::Release,
                }
                .into(),
            )
            .await;
    }
}

async fn keep_membership(shared: Arc<Shared>) {
    let config = &shared.config;
    let member = crate::ownership::member_name(config.job.as_deref(), &config.owner);
    // Members seen alive by the last heartbeat; one missing now has died (or left).
    let mut alive: BTreeSet<String> = BTreeSet::new();
    loop {
        check_clock(&shared).await;
        let now = shared.clock.now_millis();
        // The shares of the jobs begun here within a member's TTL: a share is only
        // published while the jobs overview would count this dispatcher as live.
        let shares = shared
            .adaptive
            .lock()
            .expect("adaptive lock")
            .shares(now.saturating_sub(config.member_ttl));
        let seen = async {
            shared.store.heartbeat_member(&member, now, &shares).await?;
            shared
                .store
                .live_members(now.saturating_sub(config.member_ttl))
                .await
        };
        match seen.await {
            Ok(members) => {
                let members: BTreeSet<String> = members.into_iter().collect();
                for gone in alive.difference(&members).filter(|m| **m != member) {
                    release_claims_of(&shared, gone, now).await;
                }
                alive.clone_from(&members);
                shared
                    .ownership
                    .lock()
                    .expect("ownership lock")
                    .observe(members, Instant::now());
                emit(&config.signals, || Signal::Heartbeat { at: now });
            }
            Err(err) => tracing::warn!(%err, "membership heartbeat failed; keeping the last view"),
        }
        observe_pauses(&shared, now).await;
        tokio::select! {
            _ = shared.shutdown.cancelled() => break,
            _ = tokio::time::sleep(config.heartbeat_interval) => {}
        }
    }
    if let Err(err) = shared.store.leave(&member).await {
        tracing::warn!(%err, "could not leave the dispatcher set; it will expire");
    }
}

/// Exports which jobs are paused, by their config or through the API, as
/// `asyncd_job_paused{job}`. Only for the metric: pausing does not depend on it (the
/// store's claim and start skip paused types; the claimer and runners read the config).
async fn observe_pauses(shared: &Shared, now: crate::store::Millis) {
    let in_store: BTreeSet<String> = match shared.store.pauses().await {
        Ok(pauses) => pauses.into_iter().map(|(task_type, _)| task_type).collect(),
        Err(err) => {
            tracing::debug!(%err, "could not read the paused jobs");
            return;
        }
    };
    let routes = shared.routes.borrow().clone();
    let mut paused = Vec::new();
    for job in routes.jobs() {
        let is = job.paused || in_store.contains(&job.task_type);
        shared
            .metrics
            .job_paused
            .with_label_values(&[job.name.as_str()])
            .set(i64::from(is));
        if is {
            paused.push(job.name.clone());
        }
    }
    emit(&shared.config.signals, || Signal::PausesSeen {
        paused,
        at: now,
    });
}

/// Reads the store's clock between two readings of ours and records the offset (see
/// [`crate::clock_check`]); a failed read keeps the last reading.
async fn check_clock(shared: &Shared) {
    let before = shared.clock.now_millis();
    let store = match shared.store.clock().await {
        Ok(Some(store)) => store,
        Ok(None) => return shared.config.clock_check.record_no_store_clock(),
        Err(err) => {
            tracing::debug!(%err, "could not read the store's clock");
            return;
        }
    };
    let reading = Reading::new(before, store, shared.clock.now_millis());
    shared
        .metrics
        .clock_offset
        .set(reading.offset_ms as f64 / 1000.0);
    let check = &shared.config.clock_check;
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
async fn release_claims_of(shared: &Shared, gone: &str, now: crate::store::Millis) {
    let owner = crate::ownership::instance_of(gone);
    match shared.store.release_claims(owner, now).await {
        Ok(0) => {}
        Ok(count) => {
            tracing::info!(
                member = gone,
                count,
                "released the claims of a dispatcher that stopped heartbeating"
            );
            shared.waker.wake();
        }
        Err(err) => {
            tracing::warn!(%err, member = gone, "could not release the claims of a dispatcher that stopped heartbeating; the hold will")
        }
    }
    emit(&shared.config.signals, || Signal::MemberGone {
        member: gone.to_string(),
    });
}

async fn claim(shared: Arc<Shared>) {
    let config = &shared.config;
    let mut last_pass = None;
    loop {
        tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            _ = tokio::time::sleep(config.poll_interval) => {}
            _ = shared.waker.0.notified() => {}
        }
        // Every claim of this pass reads the clock at or after this.
        let now = shared.clock.now_millis();
        loop {
            let unstarted =
                shared.heap.lock().expect("heap lock").len() + shared.queued.load(Ordering::SeqCst);
            if unstarted >= config.max_heap || !config.clock_check.may_dispatch() {
                break;
            }
            let plan = claim_plan(&shared);
            if plan.is_empty() {
                break;
            }
            let mut more = false;
            for Claim {
                types,
                limit,
                per_key,
            } in plan
            {
                let now = shared.clock.now_millis();
                let started = Instant::now();
                let types = TypeFilter::Only(types);
                let params = ClaimParams {
                    types: &types,
                    horizon: now + config.lookahead,
                    now,
                    hold: config.hold,
                    owner: &config.owner,
                    limit,
                };
                let claimed = match per_key {
                    Some(per_key) => claim_fair(&shared, params, per_key).await,
                    None => shared.store.claim(params).await,
                };
                shared
                    .metrics
                    .poll_duration
                    .observe(started.elapsed().as_secs_f64());
                let claimed = match claimed {
                    Ok(claimed) => claimed,
                    Err(err) => {
                        tracing::warn!(%err, "claim failed; retrying on the next tick");
                        break;
                    }
                };
                // Only a full batch of the unconstrained jobs says more is waiting now;
                // a constrained job has taken all its room, and a keyed one each key's
                // share (the next comes when an outcome frees a key).
                more |= per_key.is_none()
                    && limit == config.claim_batch
                    && claimed.len() as u32 == limit;
                if !claimed.is_empty() {
                    shared.push(claimed);
                }
            }
            if !more || shared.shutdown.is_cancelled() {
                break;
            }
        }
        // Once per clock reading, so a test on a manual clock is not flooded.
        if config.signals.is_some() && last_pass != Some(now) {
            last_pass = Some(now);
            emit(&config.signals, || Signal::ClaimPass { at: now });
        }
    }
}

/// A keyed job's claim ([`Store::claim_fair`]), its keys' rotation going on from where
/// this dispatcher's last claim of the job left it.
async fn claim_fair(
    shared: &Shared,
    params: ClaimParams<'_>,
    per_key: u32,
) -> crate::store::Result<Vec<ClaimedTask>> {
    let TypeFilter::Only(types) = params.types else {
        return Ok(Vec::new());
    };
    let task_type = types.first().cloned().unwrap_or_default();
    let after = shared
        .fair_after
        .lock()
        .expect("rotation lock")
        .get(&task_type)
        .cloned();
    let claim = shared
        .store
        .claim_fair(
            params,
            FairParams {
                per_key,
                after: after.as_deref(),
            },
        )
        .await?;
    if let Some(last) = claim.last_key {
        shared
            .fair_after
            .lock()
            .expect("rotation lock")
            .insert(task_type, last);
    }
    Ok(claim.tasks)
}

/// One claim of a pass: of these task types, up to `limit` tasks; with `per_key`, of one
/// keyed job, fairly among its keys ([`Store::claim_fair`]).
struct Claim {
    types: Vec<String>,
    limit: u32,
    per_key: Option<u32>,
}

/// The claims to make now: one for the owned jobs with room for a whole batch, and one
/// per job with less room (limited to it) or with a concurrency key; jobs without room
/// are left out until a task of theirs leaves (see [`crate::holdings`]).
fn claim_plan(shared: &Shared) -> Vec<Claim> {
    let config = &shared.config;
    let routes = shared.routes.borrow().clone();
    // A job whose signing keys are unavailable is not claimed: its tasks wait, pending.
    // Nor is a job paused by its config (`spec.paused`); one paused through the API is
    // left out by the claim itself (`Store::pause`).
    let jobs: Vec<(String, String)> = routes
        .jobs()
        .filter(|job| !job.paused && shared.signing.may_dispatch(job))
        .map(|job| (job.task_type.clone(), job.name.clone()))
        .collect();
    let owned = shared
        .ownership
        .lock()
        .expect("ownership lock")
        .owned(&jobs, Instant::now());
    let mut holdings = shared.holdings.lock().expect("holdings lock");
    let mut open = Vec::new();
    let mut plan = Vec::new();
    for task_type in owned {
        let Some(job) = routes.job(&task_type) else {
            continue;
        };
        let limits = JobLimits {
            concurrency: job.concurrency,
            timeout: job.timeout,
            per_second: job.rate_limit.map(|r| r.per_second),
        };
        let room = holdings.room(&task_type, limits, config.hold);
        let per_key = job.concurrency_key.as_ref().map(|key| key.limit);
        match u32::try_from(room) {
            Ok(0) => {}
            Ok(room) if room < config.claim_batch || per_key.is_some() => plan.push(Claim {
                types: vec![task_type],
                limit: room.min(config.claim_batch),
                per_key,
            }),
            Err(_) if per_key.is_some() => plan.push(Claim {
                types: vec![task_type],
                limit: config.claim_batch,
                per_key,
            }),
            _ => open.push(task_type),
        }
    }
    if !open.is_empty() {
        plan.insert(
            0,
            Claim {
                types: open,
                limit: config.claim_batch,
                per_key: None,
            },
        );
    }
    plan
}

/// A job's due tasks between the ticker and the job's runner, which takes the best
/// ranked ([`crate::heap::rank`]) whenever it may begin an attempt. A heap rather than a
/// channel: a high-priority task that comes due behind a backlog goes before it.
#[derive(Default)]
struct ReadyQueue {
    state: Mutex<(ReadyHeap, bool)>,
    changed: Notify,
}

impl ReadyQueue {
    fn push(&self, task: ClaimedTask) {
        self.state.lock().expect("ready lock").0.push(task);
        self.changed.notify_one();
    }

    /// No more tasks will come (the ticker ended).
    fn close(&self) {
        self.state.lock().expect("ready lock").1 = true;
        self.changed.notify_one();
    }

    fn try_pop(&self) -> Option<ClaimedTask> {
        self.state.lock().expect("ready lock").0.pop()
    }

    /// The best task, waiting for one; `None` once closed and empty. One consumer (the
    /// runner): `notify_one` keeps a wake-up for it when it is not waiting yet.
    async fn pop(&self) -> Option<ClaimedTask> {
        loop {
            {
                let mut state = self.state.lock().expect("ready lock");
                if let Some(task) = state.0.pop() {
                    return Some(task);
                }
                if state.1 {
                    return None;
                }
            }
            self.changed.notified().await;
        }
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

/// The ticker. Returns the runners it started (in `tasks`), for shutdown to wait on.
async fn tick(shared: Arc<Shared>, tasks: TaskTracker) -> Vec<tokio::task::JoinHandle<()>> {
    let mut queues = Queues::default();
    let mut runners = Vec::new();
    loop {
        let now = shared.clock.now_millis();
        let (due, next_eta) = {
            let mut heap = shared.heap.lock().expect("heap lock");
            let due: Vec<_> = std::iter::from_fn(|| heap.pop_due(now))
                .take(4096)
                .collect();
            shared.metrics.heap_size.set(heap.len() as i64);
            (due, heap.next_eta())
        };
        let routes = shared.routes.borrow().clone();
        // A clock too far from the store's would run these early (or late): hand them
        // back for a dispatcher whose clock is right.
        let skewed = !shared.config.clock_check.may_dispatch();
        for task in due {
            if skewed || routes.job(&task.task_type).is_none() {
                // Its job config is gone: leave the task in the store for when it returns.
                release(&shared, vec![task]).await;
                continue;
            }
            // The claimer keeps heap plus queues within `max_heap` (Kafka adoption may
            // overshoot it by a batch).
            let queue = queues.0.entry(task.task_type.clone()).or_insert_with(|| {
                let queue = Arc::new(ReadyQueue::default());
                runners.push(tasks.spawn(stop_on_exit(
                    shared.shutdown.clone(),
                    run_job(shared.clone(), task.task_type.clone(), queue.clone()),
                )));
                queue
            });
            emit(&shared.config.signals, || Signal::Dispatched {
                id: task.id.clone(),
                eta: task.trigger_at,
                at: now,
            });
            shared.queued.fetch_add(1, Ordering::SeqCst);
            // (A runner that panicked has stopped the dispatcher: what waits in its
            // queue comes back when the claims' hold lapses.)
            queue.push(task);
        }
        if shared.shutdown.is_cancelled() {
            return runners;
        }
        if next_eta.is_some_and(|eta| eta <= shared.clock.now_millis()) {
            continue;
        }
        let sleep = next_eta.map(|eta| eta.since(now));
        tokio::select! {
            _ = shared.shutdown.cancelled() => return runners,
            _ = shared.heap_changed.notified() => {}
            _ = async { tokio::time::sleep(sleep.unwrap_or_default()).await }, if sleep.is_some() => {}
        }
    }
}

/// One job's runner: at most `concurrency` attempts at once here (a permit is held until
/// the attempt's outcome is written), and within the job's limits in total as the store
/// admits them ([`begin`]); each permit goes to the best ranked due task at the moment
/// it is free (a permit is taken first, then the task, so a task that came due
/// meanwhile with a better rank is not passed over).
async fn run_job(shared: Arc<Shared>, task_type: String, queue: Arc<ReadyQueue>) {
    let taken = |task: ClaimedTask| {
        shared.queued.fetch_sub(1, Ordering::SeqCst);
        task
    };
    let mut limit = ConcurrencyLimit::new(
        shared
            .routes
            .borrow()
            .job(&task_type)
            .map_or(1, |job| job.concurrency as usize),
    );
    while !shared.shutdown.is_cancelled() {
        // Follow a changed concurrency limit without a restart, and this dispatcher's
        // share of it as the executor's answers have it.
        let job = shared.routes.borrow().job(&task_type).cloned();
        if let Some(job) = &job {
            limit.resize(effective_concurrency(&shared, job) as usize);
        }
        let job_batch = job.as_ref().and_then(|job| job.batch);
        let permit = tokio::select! {
            permit = limit.acquire() => permit,
            _ = shared.shutdown.cancelled() => break,
        };
        let first = tokio::select! {
            task = queue.pop() => match task {
                Some(task) => taken(task),
                None => break,
            },
            _ = shared.shutdown.cancelled() => break,
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
            batch.push((taken(task), permit));
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
                        Some(task) => batch.push((taken(task), permit)),
                        None => break,
                    },
                    _ = tokio::time::sleep_until(deadline) => break,
                    _ = shared.shutdown.cancelled() => break,
                }
            }
        }
        // The share may have been cut while the runner waited for a permit or a task:
        // permits taken at the old size would start attempts past the new one, whose
        // overload answers would cut it again (one 429 took a share of 9 to 4). What is
        // over goes back to the queue.
        if let Some(job) = &job {
            limit.resize(effective_concurrency(&shared, job) as usize);
            for task in limit.give_back_owed(&mut batch) {
                shared.queued.fetch_add(1, Ordering::SeqCst);
                queue.push(task);
            }
            if batch.is_empty() {
                continue;
            }
        }
        // Created before the store is asked, so an outcome written meanwhile is not
        // missed (a `Notified` receives `notify_waiters` from its creation on).
        let written = shared.outcomes_written.notified();
        let (pause, on_outcome) = match begin(&shared, &queue, batch).await {
            None => continue,
            // No outcome brings the next token sooner.
            Some(HeldBy::Rate { next_token }) => (next_token.max(Duration::from_millis(1)), false),
            Some(HeldBy::Concurrency | HeldBy::Key) => (SLOT_POLL, true),
        };
        tokio::select! {
            _ = written, if on_outcome => {}
            _ = tokio::time::sleep(pause) => {}
            _ = shared.shutdown.cancelled() => break,
        }
    }
    // Shutdown: hand back what waits here, and what the ticker adds until it closes the
    // queue.
    while let Some(task) = queue.pop().await {
        release(&shared, vec![taken(task)]).await;
    }
}

/// The attempts of `job` this dispatcher lets run at once: its `concurrency`, or less
/// while adaptive concurrency has backed it off. Also the job's gauge.
fn effective_concurrency(shared: &Shared, job: &asyncd_spec::Job) -> u32 {
    let limit = if job.adaptive.enabled {
        shared
            .adaptive
            .lock()
            .expect("adaptive lock")
            .limit(&job.task_type, job.concurrency)
    } else {
        job.concurrency
    };
    shared
        .metrics
        .effective_concurrency
        .with_label_values(&[job.name.as_str()])
        .set(i64::from(limit));
    limit
}

/// A job's concurrency limit, which a config change may lower while attempts hold its
/// permits. `Semaphore::forget_permits` only forgets permits that are free, so the rest
/// are owed and destroyed as they come back; without that, lowering the limit under load
/// changed nothing.
struct ConcurrencyLimit {
    permits: Arc<Semaphore>,
    limit: usize,
    owed: usize,
}

impl ConcurrencyLimit {
    fn new(limit: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(limit)),
            limit,
            owed: 0,
        }
    }

    fn resize(&mut self, wanted: usize) {
        if wanted > self.limit {
            let grow = wanted - self.limit;
            let cancelled = grow.min(self.owed);
            self.owed -= cancelled;
            self.permits.add_permits(grow - cancelled);
        } else if wanted < self.limit {
            let shrink = self.limit - wanted;
            self.owed += shrink - self.permits.forget_permits(shrink);
        }
        self.limit = wanted;
    }

    /// Pays what is owed with the permits of `batch`'s lowest ranked entries, and
    /// returns their tasks.
    fn give_back_owed<T>(&mut self, batch: &mut Vec<(T, OwnedSemaphorePermit)>) -> Vec<T> {
        let mut tasks = Vec::new();
        while self.owed > 0
            && let Some((task, permit)) = batch.pop()
        {
            permit.forget();
            self.owed -= 1;
            tasks.push(task);
        }
        tasks
    }

    /// A permit if one is free now, after paying what is owed.
    fn try_acquire(&mut self) -> Option<OwnedSemaphorePermit> {
        loop {
            let permit = self.permits.clone().try_acquire_owned().ok()?;
            if self.owed == 0 {
                return Some(permit);
            }
            permit.forget();
            self.owed -= 1;
        }
    }

    /// Waits for a permit, paying what is owed first. Cancel-safe: a permit is destroyed
    /// and the debt lowered in the same step.
    async fn acquire(&mut self) -> OwnedSemaphorePermit {
        loop {
            let permit = self
                .permits
                .clone()
                .acquire_owned()
                .await
                .expect("semaphore never closes");
            if self.owed == 0 {
                return permit;
            }
            permit.forget();
            self.owed -= 1;
        }
    }
}

/// Begins attempts on `batch` (in rank order) within the job's limits, which the store
/// keeps across every dispatcher ([`Store::start_limited`]). What the limits leave for
/// later goes back to `queue`, still claimed, and the limit that held it back is
/// returned for the runner to wait on.
async fn begin(
    shared: &Arc<Shared>,
    queue: &ReadyQueue,
    batch: Vec<(ClaimedTask, OwnedSemaphorePermit)>,
) -> Option<HeldBy> {
    // A runner's batch is of one job. Its keys are read once, before any attempt
    // begins: held tasks of a job whose keys went missing (or that Kafka delivered) are
    // handed back to wait in the store, where the claimer leaves them until the keys
    // are back.
    let job = batch
        .first()
        .and_then(|(task, _)| shared.routes.borrow().job(&task.task_type).cloned());
    let keys = job
        .as_ref()
        .map_or(Keys::Unsigned, |job| shared.signing.keys(job));
    // Likewise the held tasks of a job its config has paused since they were claimed,
    // and those of a job whose config is gone.
    let job = match job {
        Some(job) if !job.paused && !matches!(keys, Keys::Unavailable(_)) => job,
        _ => {
            release(shared, batch.into_iter().map(|(task, _)| task).collect()).await;
            return None;
        }
    };
    let keys = Arc::new(keys);
    let claims: Vec<(String, i64)> = batch
        .iter()
        .map(|(task, _)| (task.id.clone(), task.lease_token))
        .collect();
    let task_keys: Vec<Option<&str>> = match job.concurrency_key {
        Some(_) => batch
            .iter()
            .map(|(task, _)| task.concurrency_key.as_deref())
            .collect(),
        None => Vec::new(),
    };
    let now = shared.clock.now_millis();
    let admitted = shared
        .store
        .start_limited(
            StartParams {
                claims: &claims,
                now,
                grace: shared.config.grace,
            },
            JobGate {
                task_type: &job.task_type,
                concurrency: job.concurrency,
                rate: job.rate_limit,
                key_limit: job.concurrency_key.as_ref().map(|key| key.limit),
                keys: &task_keys,
            },
        )
        .await;
    let admitted = match admitted {
        Ok(admitted) => admitted,
        Err(err) => {
            // The claims stay held; the rescuer hands them back when the hold lapses.
            tracing::warn!(%err, tasks = batch.len(), "could not begin attempts");
            for (task, _) in &batch {
                shared.let_go(&task.task_type);
            }
            return None;
        }
    };
    let mut deferred = Vec::with_capacity(admitted.deferred.len());
    let mut tried = Vec::with_capacity(batch.len() - admitted.deferred.len());
    let mut later = admitted.deferred.iter().peekable();
    for (index, entry) in batch.into_iter().enumerate() {
        if later.next_if_eq(&&index).is_some() {
            deferred.push(entry);
        } else {
            tried.push(entry);
        }
    }
    let batch = tried;
    if !deferred.is_empty() {
        shared
            .metrics
            .limited
            .with_label_values(&[job.name.as_str(), held_by_label(admitted.held_by)])
            .inc_by(deferred.len() as u64);
    }
    for (task, permit) in deferred {
        drop(permit);
        shared.queued.fetch_add(1, Ordering::SeqCst);
        queue.push(task);
    }
    let started = admitted.started;
    if let Some((task, _)) = batch.first() {
        // A runner's batch is of one job.
        shared.holdings.lock().expect("holdings lock").began(
            &task.task_type,
            started.len(),
            Instant::now(),
        );
    }
    let mut started: HashMap<String, _> = started.into_iter().map(|s| (s.id.clone(), s)).collect();
    let mut unstarted = Vec::new();
    let mut attempts = Vec::with_capacity(batch.len());
    for (task, permit) in batch {
        // Missing: its job was paused (`Store::pause`; the claim is still ours and goes
        // back to the store, where it waits for the resume), cancelled meanwhile, or the
        // claim lapsed and went to someone else (then the release, fenced by the token,
        // changes nothing).
        match started.remove(&task.id) {
            Some(attempt) => attempts.push((task, attempt, permit)),
            None => unstarted.push(task),
        }
    }
    let per_call = job.batch.map_or(1, |batch| batch.max_tasks as usize);
    let mut attempts = attempts.into_iter().peekable();
    while attempts.peek().is_some() {
        let call: Vec<_> = attempts.by_ref().take(per_call).collect();
        let shared = shared.clone();
        let keys = keys.clone();
        let task_type = job.task_type.clone();
        let count = call.len();
        if job.batch.is_none() {
            let (task, attempt, permit) = call.into_iter().next().expect("one attempt");
            // Every line logged during the attempt carries the task it is about.
            let span = attempt_span(&task, &attempt);
            shared.inflight.clone().spawn(
                async move {
                    tokio::select! {
                        _ = execute(&shared, task, attempt, &keys, permit) => {}
                        _ = shared.abandon.cancelled() => {}
                    }
                    shared.let_go(&task_type);
                }
                .instrument(span),
            );
        } else {
            let span = tracing::info_span!("batch", task_type = %task_type, tasks = count);
            shared.inflight.clone().spawn(
                async move {
                    tokio::select! {
                        _ = execute_batch(&shared, call, &keys) => {}
                        _ = shared.abandon.cancelled() => {}
                    }
                    shared.let_go_many(&task_type, count);
                }
                .instrument(span),
            );
        }
    }
    if !unstarted.is_empty() {
        release(shared, unstarted).await;
    }
    admitted.held_by
}

/// The span of one attempt: every line logged about it carries its task.
fn attempt_span(task: &ClaimedTask, attempt: &crate::store::Started) -> tracing::Span {
    tracing::info_span!(
        "attempt",
        task_id = %task.id,
        task_type = %task.task_type,
        attempt = attempt.attempt
    )
}

fn held_by_label(held_by: Option<HeldBy>) -> &'static str {
    match held_by {
        Some(HeldBy::Rate { .. }) => "rate",
        Some(HeldBy::Key) => "key",
        _ => "concurrency",
    }
}

/// One attempt in its own call.
async fn execute(
    shared: &Shared,
    task: ClaimedTask,
    attempt: crate::store::Started,
    keys: &Keys,
    permit: OwnedSemaphorePermit,
) {
    let job = shared.routes.borrow().job(&task.task_type).cloned();
    let kind = match job.as_deref() {
        Some(job) => {
            let watch = AttemptWatch::begin(shared, job, &task, &attempt);
            let clock = Instant::now();
            let (outcome, status) = shared
                .executor
                .call(job, &task, &attempt, keys, watch.sent(&task))
                .await;
            watch.answered(&task, &attempt, outcome, status, clock.elapsed())
        }
        None => vanished(shared, &task, &attempt),
    };
    log_outcome(&kind);
    complete_attempt(shared, task, attempt, kind, permit).await;
}

/// The attempts of one batch call (`executor.batch`), each settled on its own.
async fn execute_batch(
    shared: &Shared,
    attempts: Vec<(ClaimedTask, crate::store::Started, OwnedSemaphorePermit)>,
    keys: &Keys,
) {
    let task_type = attempts.first().map(|(task, ..)| task.task_type.clone());
    let job = task_type.and_then(|t| shared.routes.borrow().job(&t).cloned());
    let kinds: Vec<FinishKind> = match job.as_deref() {
        Some(job) => {
            let watches: Vec<AttemptWatch> = attempts
                .iter()
                .map(|(task, attempt, _)| AttemptWatch::begin(shared, job, task, attempt))
                .collect();
            let calls: Vec<BatchAttempt> = attempts
                .iter()
                .zip(&watches)
                .map(|((task, started, _), watch)| BatchAttempt {
                    task,
                    started,
                    trace: watch.sent(task),
                })
                .collect();
            let clock = Instant::now();
            let (outcomes, status) = shared.executor.call_batch(job, &calls, keys).await;
            let took = clock.elapsed();
            drop(calls);
            watches
                .into_iter()
                .zip(outcomes)
                .zip(&attempts)
                .map(|((watch, outcome), (task, attempt, _))| {
                    watch.answered(task, attempt, outcome, status, took)
                })
                .collect()
        }
        None => attempts
            .iter()
            .map(|(task, attempt, _)| vanished(shared, task, attempt))
            .collect(),
    };
    for ((task, attempt, permit), kind) in attempts.into_iter().zip(kinds) {
        attempt_span(&task, &attempt).in_scope(|| log_outcome(&kind));
        complete_attempt(shared, task, attempt, kind, permit).await;
    }
}

/// One attempt from its call to its settled outcome: its metrics, its share of adaptive
/// concurrency and its trace spans, alike for single and batch calls.
struct AttemptWatch<'a> {
    shared: &'a Shared,
    job: &'a asyncd_spec::Job,
    dispatch: Option<crate::trace::Span>,
    span: Option<crate::trace::Span>,
    /// The adaptive concurrency epoch the attempt began in, when the job adapts.
    epoch: Option<u64>,
}

impl<'a> AttemptWatch<'a> {
    fn begin(
        shared: &'a Shared,
        job: &'a asyncd_spec::Job,
        task: &ClaimedTask,
        attempt: &crate::store::Started,
    ) -> Self {
        let metrics = &shared.metrics;
        let tracer = &shared.config.tracer;
        let task_type = task.task_type.as_str();
        let began = shared.clock.now_millis();
        metrics.dispatched.with_label_values(&[task_type]).inc();
        let delay = began.since(task.trigger_at);
        metrics
            .dispatch_delay
            .with_label_values(&[task_type])
            .observe(delay.as_secs_f64());
        let epoch = job.adaptive.enabled.then(|| {
            shared.adaptive.lock().expect("adaptive lock").begin(
                &job.task_type,
                job.concurrency,
                began,
            )
        });
        let mut dispatch = task
            .trace
            .as_ref()
            .and_then(|trace| tracer.start(trace, "dispatch", SpanKind::Consumer));
        if let Some(span) = &mut dispatch {
            span.attr("asyncd.task.id", Value::Str(task.id.clone()));
            span.attr("asyncd.task.type", Value::Str(task.task_type.clone()));
            span.attr("asyncd.attempt", Value::Int(i64::from(attempt.attempt)));
            span.attr(
                "asyncd.dispatch.delay_ms",
                Value::Int(delay.as_millis() as i64),
            );
        }
        let span = dispatch
            .as_ref()
            .and_then(|d| tracer.start(&d.context, "attempt", SpanKind::Client));
        Self {
            shared,
            job,
            dispatch,
            span,
            epoch,
        }
    }

    /// The trace context sent to the executor. When not recording, the stored trace goes
    /// on unchanged, so the executor's spans hang under the submitter's.
    fn sent<'t>(&'t self, task: &'t ClaimedTask) -> Option<&'t crate::trace::TraceContext> {
        self.span
            .as_ref()
            .map(|s| &s.context)
            .or(task.trace.as_ref())
    }

    /// Records the answer and settles what it means for the task.
    fn answered(
        self,
        task: &ClaimedTask,
        attempt: &crate::store::Started,
        outcome: AttemptOutcome,
        status: Option<u16>,
        took: Duration,
    ) -> FinishKind {
        let Self {
            shared,
            job,
            dispatch,
            span,
            epoch,
        } = self;
        let metrics = &shared.metrics;
        let tracer = &shared.config.tracer;
        let task_type = task.task_type.as_str();
        if let Some(epoch) = epoch {
            let signal = match &outcome {
                AttemptOutcome::RetryAfter { .. } | AttemptOutcome::Overloaded { .. } => {
                    adaptive::Signal::Overload
                }
                _ if job.adaptive.latency.is_some_and(|latency| took > latency) => {
                    adaptive::Signal::Overload
                }
                AttemptOutcome::Succeeded | AttemptOutcome::Accepted { .. } => {
                    adaptive::Signal::Success
                }
                _ => adaptive::Signal::Neither,
            };
            let limit = shared.adaptive.lock().expect("adaptive lock").answered(
                &job.task_type,
                job.concurrency,
                epoch,
                signal,
            );
            metrics
                .effective_concurrency
                .with_label_values(&[job.name.as_str()])
                .set(i64::from(limit));
        }
        metrics
            .execution_duration
            .with_label_values(&[task_type])
            .observe(took.as_secs_f64());
        metrics
            .executed
            .with_label_values(&[task_type, outcome.status_label()])
            .inc();
        let kind = retry::settle(
            outcome,
            attempt.attempt,
            task.max_retries,
            Some(job),
            shared.clock.now_millis(),
        );
        if let Some(mut span) = span {
            span.attr("asyncd.task.id", Value::Str(task.id.clone()));
            span.attr("asyncd.task.type", Value::Str(task.task_type.clone()));
            span.attr("asyncd.attempt", Value::Int(i64::from(attempt.attempt)));
            if let Some(status) = status {
                span.attr("http.response.status_code", Value::Int(i64::from(status)));
            }
            span.attr("asyncd.outcome", Value::Str(outcome_name(&kind).into()));
            tracer.end(span, failure(&kind));
        }
        if let Some(mut span) = dispatch {
            span.attr("asyncd.outcome", Value::Str(outcome_name(&kind).into()));
            tracer.end(span, failure(&kind));
        }
        kind
    }
}

/// The job vanished between the attempt's start and its call: a failed attempt.
fn vanished(shared: &Shared, task: &ClaimedTask, attempt: &crate::store::Started) -> FinishKind {
    retry::settle(
        AttemptOutcome::Retry {
            reason: format!("no job config for task type {:?}", task.task_type),
            timed_out: false,
        },
        attempt.attempt,
        task.max_retries,
        None,
        shared.clock.now_millis(),
    )
}

/// Hands a settled attempt to the completer, with the permit it held.
async fn complete_attempt(
    shared: &Shared,
    task: ClaimedTask,
    attempt: crate::store::Started,
    kind: FinishKind,
    permit: OwnedSemaphorePermit,
) {
    if let FinishKind::Retry { at, .. } = &kind {
        shared
            .metrics
            .retries
            .with_label_values(&[task.task_type.as_str()])
            .inc();
        if *at <= shared.clock.now_millis() + shared.config.lookahead {
            shared.waker.wake();
        }
    }
    let frees_key = task.concurrency_key.is_some();
    let _ = shared
        .completions
        .send(Completion {
            finish: Finish {
                id: task.id,
                lease_token: attempt.lease_token,
                kind,
            },
            permit: Some(permit),
            frees_key,
        })
        .await;
}

/// The `asyncd.outcome` attribute of the `dispatch` and `attempt` spans.
fn outcome_name(kind: &FinishKind) -> &'static str {
    match kind {
        FinishKind::Succeeded { .. } => "succeeded",
        FinishKind::Extend { .. } => "accepted",
        FinishKind::Retry { .. } => "retry",
        FinishKind::Dead { .. } => "dead",
        FinishKind::Release => "released",
    }
}

/// A span's error status: the attempt failed.
fn failure(kind: &FinishKind) -> Option<String> {
    match kind {
        FinishKind::Retry { error, .. } | FinishKind::Dead { error } => Some(error.clone()),
        _ => None,
    }
}

/// One line per attempt outcome, inside the attempt's span: failures at `info` (a
/// retry) and `warn` (a dead letter), so they are in the default log; successes at
/// `debug`, as a busy queue has millions.
fn log_outcome(kind: &FinishKind) {
    match kind {
        FinishKind::Succeeded { .. } => tracing::debug!("attempt succeeded"),
        FinishKind::Extend { until } => tracing::debug!(
            lease_until = %crate::clock::from_millis(*until).to_rfc3339(),
            "attempt accepted; the executor holds the lease"
        ),
        FinishKind::Retry { at, error } => tracing::info!(
            error = error.as_str(),
            retry_at = %crate::clock::from_millis(*at).to_rfc3339(),
            "attempt failed; retrying"
        ),
        FinishKind::Dead { error } => {
            tracing::warn!(error = error.as_str(), "attempt failed; the task is dead")
        }
        FinishKind::Release => tracing::debug!("attempt released"),
    }
}

async fn complete(shared: Arc<Shared>, mut completions: mpsc::Receiver<Completion>) {
    // Hold only a weak interest in `shared`: the channel closing is what ends this loop.
    let store = shared.store.clone();
    let clock = shared.clock.clone();
    let waker = shared.waker.clone();
    let signals = shared.config.signals.clone();
    let shutdown = shared.shutdown.clone();
    let written = shared.outcomes_written.clone();
    drop(shared);
    let mut received = Vec::with_capacity(512);
    while completions.recv_many(&mut received, 512).await > 0 {
        let frees_key = received.iter().any(|c: &Completion| c.frees_key);
        let (mut batch, permits): (Vec<Finish>, Vec<_>) = received
            .drain(..)
            .map(|c: Completion| (c.finish, c.permit))
            .unzip();
        let ids: Vec<String> = batch.iter().map(|f| f.id.clone()).collect();
        let wake = frees_key
            || batch
                .iter()
                .any(|f| matches!(f.kind, FinishKind::Release | FinishKind::Retry { .. }));
        let mut backoff = Duration::from_millis(50);
        let mut tries = 0;
        loop {
            // Only an unavailable store comes back as an error (with what is unwritten
            // left in `batch`); an outcome it refuses is isolated inside.
            match crate::outcomes::write(store.as_ref(), &mut batch, clock.now_millis()).await {
                Ok(_) => {
                    emit(&signals, || Signal::Finished {
                        ids,
                        at: clock.now_millis(),
                    });
                    break;
                }
                Err(err) if shutdown.is_cancelled() && tries >= SHUTDOWN_FINISH_TRIES => {
                    tracing::warn!(%err, outcomes = batch.len(), "outcomes not recorded at shutdown; their leases will bring the tasks back");
                    break;
                }
                Err(err) => {
                    tracing::warn!(%err, outcomes = batch.len(), "could not record outcomes; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    tries += 1;
                }
            }
        }
        drop(permits);
        written.notify_waiters();
        if wake {
            waker.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    //! The dispatcher against a temp-file SQLite store, a loopback executor and a
    //! [`ManualClock`]: time moves only when a test moves it, so every ETA is asserted
    //! exactly, and test signals say when something happened instead of polling.

    use std::collections::{BTreeMap, BTreeSet};

    use asyncd_spec::AsyncJobConfig;
    use chrono::{TimeZone, Utc};
    use serde_json::value::RawValue;
    use tokio::sync::broadcast;

    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::routing::{RouteTable, fixed};
    use crate::store::Millis;
    use crate::store::{NewTask, TaskState};

    const T0: i64 = 1_800_000_000_000;

    #[tokio::test]
    async fn lowering_the_limit_while_every_permit_is_held_takes_effect_as_they_return() {
        let mut limit = ConcurrencyLimit::new(4);
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
        let mut limit = ConcurrencyLimit::new(4);
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
        let mut limit = ConcurrencyLimit::new(4);
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

    fn job(task_type: &str, executor: &str, concurrency: u32) -> asyncd_spec::Job {
        let yaml = format!(
            "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata: {{name: {task_type}-job}}\n\
             spec:\n  taskType: {task_type}\n  concurrency: {concurrency}\n  \
             executor: {{url: '{executor}', timeout: 5s}}\n"
        );
        AsyncJobConfig::from_yaml(&yaml).unwrap().1
    }

    /// An executor that answers 200 to everything.
    async fn executor() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().fallback(|| async { "ok" });
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}/run")
    }

    struct Rig {
        dir: tempfile::TempDir,
        store: Arc<dyn Store>,
        clock: Arc<ManualClock>,
        signals: broadcast::Receiver<Signal>,
        shutdown: CancellationToken,
        tasks: TaskTracker,
        run: tokio::task::JoinHandle<()>,
    }

    impl Rig {
        async fn start(jobs: Vec<asyncd_spec::Job>, config: DispatcherConfig) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite://{}/tasks.db", dir.path().display());
            let store = crate::store::open(&url).await.unwrap();
            store.migrate().await.unwrap();
            Self::start_on(dir, store, jobs, config).await
        }

        async fn start_on(
            dir: tempfile::TempDir,
            store: Arc<dyn Store>,
            jobs: Vec<asyncd_spec::Job>,
            config: DispatcherConfig,
        ) -> Self {
            let clock = ManualClock::at(Utc.timestamp_millis_opt(T0).unwrap());
            let (signals, receiver) = TestSignals::new();
            let shutdown = CancellationToken::new();
            let tasks = TaskTracker::new();
            let dispatcher = Dispatcher::new(
                store.clone(),
                fixed(RouteTable::from_jobs(jobs)),
                Arc::new(Metrics::new()),
                clock.clone(),
                ExecutorClient::new("http://127.0.0.1:1".into(), config.owner.clone()),
                DispatcherConfig {
                    signals: Some(signals),
                    ..config
                },
                ClaimerWakeup::default(),
                shutdown.clone(),
            );
            let run = tokio::spawn(dispatcher.run(tasks.clone()));
            Self {
                dir,
                store,
                clock,
                signals: receiver,
                shutdown,
                tasks,
                run,
            }
        }

        async fn insert(&self, task_type: &str, at: i64, priority: u8) -> String {
            let id = uuid::Uuid::now_v7().to_string();
            self.store
                .insert(
                    &[new_task(&id, task_type, at, priority)],
                    self.clock.now_millis(),
                )
                .await
                .unwrap();
            id
        }

        /// The next signal `pick` accepts, skipping others; fails after the deadline.
        async fn next<T>(&mut self, what: &str, mut pick: impl FnMut(Signal) -> Option<T>) -> T {
            let wait = async {
                loop {
                    match self.signals.recv().await {
                        Ok(signal) => {
                            if let Some(found) = pick(signal) {
                                return found;
                            }
                        }
                        Err(err) => panic!("signals ended waiting for {what}: {err}"),
                    }
                }
            };
            tokio::time::timeout(Duration::from_secs(20), wait)
                .await
                .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        }

        async fn claimed(&mut self) -> (Vec<String>, i64) {
            self.next("a claim", |s| match s {
                Signal::Claimed { ids, at } => Some((ids, at.as_i64())),
                _ => None,
            })
            .await
        }

        async fn dispatched(&mut self) -> (String, i64, i64) {
            self.next("a dispatch", |s| match s {
                Signal::Dispatched { id, eta, at } => Some((id, eta.as_i64(), at.as_i64())),
                _ => None,
            })
            .await
        }

        /// Stops the dispatcher; the signals left to read, and the folder (so the store
        /// stays readable).
        async fn stop(self) -> (broadcast::Receiver<Signal>, tempfile::TempDir) {
            self.shutdown.cancel();
            tokio::time::timeout(Duration::from_secs(20), self.run)
                .await
                .expect("the dispatcher stops")
                .expect("without a panic");
            self.tasks.close();
            assert!(
                self.tasks.is_empty(),
                "run returned with tasks still running"
            );
            (self.signals, self.dir)
        }
    }

    fn new_task(id: &str, task_type: &str, at: i64, priority: u8) -> NewTask {
        NewTask {
            id: id.into(),
            task_type: task_type.into(),
            payload: RawValue::from_string("{}".into()).unwrap(),
            priority,
            trigger_at: Millis::new(at),
            max_retries: 0,
            timeout_ms: 5_000,
            idempotency_key: None,
            unique_key: None,
            unique_for: std::time::Duration::ZERO,
            cron_key: None,
            depends_on: Vec::new(),
            source_service: None,
            concurrency_key: None,
            trace: None,
        }
    }

    fn fast() -> DispatcherConfig {
        DispatcherConfig {
            owner: "me".into(),
            poll_interval: Duration::from_millis(10),
            lookahead: Duration::from_secs(2),
            ..DispatcherConfig::default()
        }
    }

    /// An executor taking batch calls: records how many tasks each call carried and
    /// answers each task as its payload's `do` says (`omit`: no result for it).
    async fn batch_executor() -> (String, Arc<Mutex<Vec<usize>>>) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let seen = calls.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().fallback(move |body: bytes::Bytes| {
            let seen = seen.clone();
            async move {
                let call: asyncd_contract::ExecutorBatchCall =
                    serde_json::from_slice(&body).expect("a batch call");
                seen.lock().unwrap().push(call.tasks.len());
                let results: Vec<_> = call
                    .tasks
                    .iter()
                    .filter_map(|task| match task.payload["do"].as_str() {
                        Some("ok") => Some(serde_json::json!({"id": task.id, "status": "success"})),
                        Some("fail") => Some(serde_json::json!({"id": task.id, "status": "failed", "error": "no such thing"})),
                        Some("later") => Some(serde_json::json!({"id": task.id, "status": "retry", "error": "busy", "retry_after": "60s"})),
                        _ => None,
                    })
                    .collect();
                serde_json::json!({ "results": results }).to_string()
            }
        });
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{addr}/batch"), calls)
    }

    /// Four due tasks, calls of at most three: every task goes in exactly one call, and
    /// each ends as its own result says, the one without a result retried.
    #[tokio::test]
    async fn a_batch_job_gets_its_due_tasks_in_calls_of_max_tasks_each_with_its_own_outcome() {
        let (url, calls) = batch_executor().await;
        let yaml = format!(
            "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata: {{name: bulk-job}}\n\
             spec:\n  taskType: bulk\n  concurrency: 10\n  \
             retry: {{maxRetries: 2, initialBackoff: 600s}}\n  \
             executor: {{url: '{url}', timeout: 5s, batch: {{maxTasks: 3, maxWait: 500ms}}}}\n"
        );
        let job = AsyncJobConfig::from_yaml(&yaml).unwrap().1;
        let mut rig = Rig::start(vec![job], fast()).await;
        let mut ids = BTreeMap::new();
        let tasks: Vec<NewTask> = ["ok", "fail", "later", "omit"]
            .into_iter()
            .map(|what| {
                let id = uuid::Uuid::now_v7().to_string();
                ids.insert(what, id.clone());
                NewTask {
                    payload: RawValue::from_string(format!(r#"{{"do":"{what}"}}"#)).unwrap(),
                    max_retries: 2,
                    ..new_task(&id, "bulk", T0, 0)
                }
            })
            .collect();
        rig.store
            .insert(&tasks, rig.clock.now_millis())
            .await
            .unwrap();
        let mut unfinished: BTreeSet<String> = ids.values().cloned().collect();
        while !unfinished.is_empty() {
            let finished = rig
                .next("the outcomes", |s| match s {
                    Signal::Finished { ids, .. } => Some(ids),
                    _ => None,
                })
                .await;
            for id in finished {
                unfinished.remove(&id);
            }
        }
        let mut sizes = calls.lock().unwrap().clone();
        sizes.sort_unstable();
        assert_eq!(sizes, vec![1, 3], "one full call, then the rest");
        let task = |what: &str| {
            let store = rig.store.clone();
            let id = ids[what].clone();
            async move { store.get(&id).await.unwrap().unwrap() }
        };
        assert_eq!(task("ok").await.state, TaskState::Succeeded);
        let failed = task("fail").await;
        assert_eq!(failed.state, TaskState::Dead);
        assert_eq!(failed.last_error.as_deref(), Some("no such thing"));
        let later = task("later").await;
        assert_eq!(later.state, TaskState::Pending);
        assert_eq!(
            later.trigger_at,
            Millis::new(T0 + 60_000),
            "its retry_after"
        );
        assert_eq!(later.last_error.as_deref(), Some("busy"));
        let omitted = task("omit").await;
        assert_eq!(omitted.state, TaskState::Pending);
        assert_eq!(
            omitted.last_error.as_deref(),
            Some("batch answer has no result for this task")
        );
        assert!(
            omitted.trigger_at >= Millis::new(T0 + 300_000),
            "its backoff"
        );
        rig.stop().await;
    }

    #[tokio::test]
    async fn claims_ahead_and_dispatches_exactly_at_the_eta() {
        let url = executor().await;
        let mut rig = Rig::start(vec![job("work", &url, 1)], fast()).await;
        let id = rig.insert("work", T0 + 1_500, 0).await;
        assert_eq!(
            rig.claimed().await,
            (vec![id.clone()], T0),
            "claimed within lookahead"
        );
        assert_eq!(
            rig.store.get(&id).await.unwrap().unwrap().state,
            TaskState::Claimed
        );
        // The ticker reads the clock each time it wakes; it must not hand the task on
        // until the clock reaches the ETA, and then at that very millisecond.
        rig.clock.set_millis(Millis::new(T0 + 1_499));
        rig.clock.set_millis(Millis::new(T0 + 1_500));
        assert_eq!(rig.dispatched().await, (id.clone(), T0 + 1_500, T0 + 1_500));
        let finished = rig
            .next("the outcome", |s| match s {
                Signal::Finished { ids, .. } => Some(ids),
                _ => None,
            })
            .await;
        assert_eq!(finished, std::slice::from_ref(&id));
        assert_eq!(
            rig.store.get(&id).await.unwrap().unwrap().state,
            TaskState::Succeeded
        );
        rig.stop().await;
    }

    #[tokio::test]
    async fn a_dead_members_claims_run_as_soon_as_it_is_known_dead() {
        let url = executor().await;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::open(&format!("sqlite://{}/tasks.db", dir.path().display()))
            .await
            .unwrap();
        store.migrate().await.unwrap();
        // Another dispatcher, alive at T0, claimed a due task for 30 s, then died.
        store
            .heartbeat_member("*/dead", Millis::new(T0), &Default::default())
            .await
            .unwrap();
        let id = uuid::Uuid::now_v7().to_string();
        store
            .insert(&[new_task(&id, "work", T0, 0)], Millis::new(T0))
            .await
            .unwrap();
        let claimed = store
            .claim(ClaimParams {
                types: &TypeFilter::All,
                horizon: Millis::new(T0),
                now: Millis::new(T0),
                hold: Duration::from_secs(30),
                owner: "dead",
                limit: 10,
            })
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1);
        let config = DispatcherConfig {
            heartbeat_interval: Duration::from_millis(10),
            member_ttl: Duration::from_secs(4),
            ..fast()
        };
        let mut rig = Rig::start_on(dir, store, vec![job("work", &url, 1)], config).await;
        rig.next("a heartbeat that sees both", |s| {
            matches!(s, Signal::Heartbeat { .. }).then_some(())
        })
        .await;
        rig.clock.set_millis(Millis::new(T0 + 5_000));
        rig.next("the member gone", |s| match s {
            Signal::MemberGone { member } => (member == "*/dead").then_some(()),
            _ => None,
        })
        .await;
        let (dispatched, _, at) = rig.dispatched().await;
        assert_eq!(dispatched, id);
        assert_eq!(at, T0 + 5_000, "long before the 30 s hold lapses");
        rig.stop().await;
    }

    #[tokio::test]
    async fn an_outcome_the_store_refuses_blocks_no_other() {
        // The executor's error text for one task is something the database refuses (as
        // PostgreSQL refuses NUL in text); a trigger stands in for that refusal.
        let poisoned = uuid::Uuid::now_v7().to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/run", listener.local_addr().unwrap());
        let bad = poisoned.clone();
        let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
            let bad = bad.clone();
            async move {
                if headers
                    .get("asyncd-task-id")
                    .is_some_and(|v| v == bad.as_str())
                {
                    (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "POISON")
                } else {
                    (axum::http::StatusCode::OK, "{}")
                }
            }
        });
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let dir = tempfile::tempdir().unwrap();
        let database = format!("sqlite://{}/tasks.db", dir.path().display());
        let store = crate::store::open(&database).await.unwrap();
        store.migrate().await.unwrap();
        let mut db = <sqlx::SqliteConnection as sqlx::Connection>::connect(&database)
            .await
            .unwrap();
        sqlx::query(
            "CREATE TRIGGER refuse_poison BEFORE UPDATE ON tasks \
             WHEN NEW.last_error LIKE '%POISON%' \
             BEGIN SELECT RAISE(ABORT, 'refused by the test trigger'); END",
        )
        .execute(&mut db)
        .await
        .unwrap();
        let mut ids = vec![poisoned.clone()];
        store
            .insert(&[new_task(&poisoned, "work", T0, 0)], Millis::new(T0))
            .await
            .unwrap();
        for _ in 0..20 {
            let id = uuid::Uuid::now_v7().to_string();
            store
                .insert(&[new_task(&id, "work", T0, 0)], Millis::new(T0))
                .await
                .unwrap();
            ids.push(id);
        }
        let mut rig = Rig::start_on(dir, store, vec![job("work", &url, 21)], fast()).await;
        let mut finished = BTreeSet::new();
        while !ids.iter().all(|id| finished.contains(id)) {
            finished.extend(
                rig.next("outcomes", |s| match s {
                    Signal::Finished { ids, .. } => Some(ids),
                    _ => None,
                })
                .await,
            );
        }
        for id in &ids[1..] {
            let task = rig.store.get(id).await.unwrap().unwrap();
            assert_eq!(task.state, TaskState::Succeeded, "{id}");
        }
        let task = rig.store.get(&poisoned).await.unwrap().unwrap();
        assert_eq!(task.state, TaskState::Dead);
        let error = task.last_error.unwrap();
        assert!(
            error.starts_with("the store refused this attempt's outcome")
                && error.contains("refused by the test trigger"),
            "{error}"
        );
        rig.stop().await;
    }

    #[tokio::test]
    async fn equal_etas_dispatch_in_priority_order() {
        let url = executor().await;
        // A hold long enough that a job of concurrency 1 and a 5 s timeout has room for
        // all five in the heap at once (see `crate::holdings`).
        let config = DispatcherConfig {
            hold: Duration::from_secs(60),
            ..fast()
        };
        let mut rig = Rig::start(vec![job("work", &url, 1)], config).await;
        let mut ids = HashMap::new();
        for priority in [1, 5, 3, 9, 0] {
            ids.insert(rig.insert("work", T0 + 100, priority).await, priority);
        }
        let mut claimed = 0;
        while claimed < 5 {
            claimed += rig.claimed().await.0.len();
        }
        rig.clock.set_millis(Millis::new(T0 + 100));
        let mut order = Vec::new();
        for _ in 0..5 {
            let (id, eta, at) = rig.dispatched().await;
            assert_eq!((eta, at), (T0 + 100, T0 + 100));
            order.push(ids[&id]);
        }
        assert_eq!(order, [9, 5, 3, 1, 0]);
        rig.stop().await;
    }

    #[tokio::test]
    async fn claims_exactly_when_the_eta_enters_the_lookahead() {
        let url = executor().await;
        let config = DispatcherConfig {
            lookahead: Duration::from_secs(1),
            ..fast()
        };
        let mut rig = Rig::start(vec![job("work", &url, 1)], config).await;
        let far = rig.insert("work", T0 + 5_000, 0).await;
        // A due probe shows a claim query ran; the far task must not come with it.
        for now in [T0, T0 + 3_999] {
            rig.clock.set_millis(Millis::new(now));
            let probe = rig.insert("work", now, 0).await;
            assert_eq!(rig.claimed().await, (vec![probe], now));
        }
        rig.clock.set_millis(Millis::new(T0 + 4_000));
        assert_eq!(rig.claimed().await, (vec![far], T0 + 4_000));
        rig.stop().await;
    }

    #[tokio::test]
    async fn shutdown_releases_unstarted_claims_and_waits_for_every_loop() {
        let url = executor().await;
        let mut rig = Rig::start(vec![job("work", &url, 1)], fast()).await;
        let id = rig.insert("work", T0 + 1_000, 0).await;
        assert_eq!(rig.claimed().await.0, std::slice::from_ref(&id));
        let store = rig.store.clone();
        let (mut signals, _dir) = rig.stop().await;
        let mut released = Vec::new();
        while let Ok(signal) = signals.try_recv() {
            if let Signal::Released { id } = signal {
                released.push(id);
            }
        }
        assert_eq!(released, std::slice::from_ref(&id));
        let task = store.get(&id).await.unwrap().unwrap();
        assert_eq!((task.state, task.attempt), (TaskState::Pending, 0));
    }

    #[tokio::test]
    async fn polls_only_the_task_types_it_owns() {
        let url = executor().await;
        let config = DispatcherConfig {
            // A short grace, so the view before the other member was seen ends quickly.
            member_ttl: Duration::from_millis(50),
            heartbeat_interval: Duration::from_millis(100),
            ..fast()
        };
        let me = crate::ownership::member_name(None, &config.owner);
        let other = crate::ownership::member_name(None, "other");
        let members = BTreeSet::from([me.clone(), other.clone()]);
        let owned_by = |who: &str| {
            (0..)
                .map(|i| format!("type-{i}"))
                .find(|t| crate::ownership::owner(t, &format!("{t}-job"), &members) == Some(who))
                .unwrap()
        };
        let (mine, theirs) = (owned_by(&me), owned_by(&other));
        let dir = tempfile::tempdir().unwrap();
        let url_db = format!("sqlite://{}/tasks.db", dir.path().display());
        let store = crate::store::open(&url_db).await.unwrap();
        store.migrate().await.unwrap();
        store
            .heartbeat_member(&other, Millis::new(T0), &Default::default())
            .await
            .unwrap();
        let jobs = vec![job(&mine, &url, 1), job(&theirs, &url, 1)];
        let mut rig = Rig::start_on(dir, store, jobs, config).await;
        // Two heartbeats: the other member is in the view, and the grace (50 ms) after
        // the first view change is over by the second (100 ms later).
        for _ in 0..2 {
            rig.next("a heartbeat", |s| {
                matches!(s, Signal::Heartbeat { .. }).then_some(())
            })
            .await;
        }
        let both = [new_task("m", &mine, T0, 0), new_task("t", &theirs, T0, 0)];
        rig.store.insert(&both, Millis::new(T0)).await.unwrap();
        assert_eq!(rig.claimed().await.0, ["m"]);
        assert_eq!(
            rig.store.get("t").await.unwrap().unwrap().state,
            TaskState::Pending
        );
        rig.stop().await;
    }
}

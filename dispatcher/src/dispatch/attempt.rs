//! Attempts: a runner's batch begun in the store within the job's limits, then each
//! executor call spawned on its own (or one call for a batch job's tasks) and settled
//! into an outcome for the completer. The calls run in their own tasks, so the runner
//! goes on beginning while executors answer, and shutdown can wait for them (or
//! abandon them) apart from the loops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::adaptive::{self, Adaptive, KeyAdaptive};
use super::completer::{failure, log_outcome, outcome_name};
use super::runner::ReadyQueue;
use super::{Claims, DispatcherConfig, Outcomes};
use crate::clock::SharedClock;
use crate::executor::{AttemptOutcome, BatchAttempt, ExecutorClient};
use crate::job_table::Routes;
use crate::metrics::Metrics;
use crate::retry;
use crate::signing::{Keys, SigningKeys};
use crate::test_hooks::{Signal, emit};
use crate::trace::{SpanKind, Value};
use asyncd_store::{
    ClaimedTask, DueStart, DueStarted, FinishKind, HeldBy, JobGate, Millis, StartDueParams,
    StartParams, Started, Store,
};

/// What beginning and running attempts needs, shared by the runners that begin them and
/// the attempts in flight.
pub(super) struct Attempts {
    pub(super) store: Arc<dyn Store>,
    pub(super) routes: Routes,
    pub(super) metrics: Arc<Metrics>,
    pub(super) clock: SharedClock,
    pub(super) executor: ExecutorClient,
    /// Each job's keys, read as its attempts begin.
    pub(super) signing: Arc<SigningKeys>,
    pub(super) config: Arc<DispatcherConfig>,
    /// Per job: this dispatcher's share of its concurrency, as the executor's answers
    /// have it ([`super::adaptive`]).
    pub(super) adaptive: Arc<Mutex<Adaptive>>,
    /// Per job with `concurrencyKey.adaptive`: each key's limit, as the executor's
    /// answers to that key's calls have it; the claimer reads the cut ones.
    pub(super) key_adaptive: Arc<Mutex<KeyAdaptive>>,
    /// Counts the attempts that begin, and the tasks that leave when they end.
    pub(super) claims: Arc<Claims>,
    pub(super) outcomes: Outcomes,
    /// The attempts in flight, which shutdown waits for.
    pub(super) inflight: TaskTracker,
    /// Cancelled when the shutdown grace is over: attempts still running are dropped.
    pub(super) abandon: CancellationToken,
}

impl Attempts {
    /// Begins attempts on `batch` (in rank order) within the job's limits, which the store
    /// keeps across every dispatcher ([`Store::start_limited`]). What the limits leave for
    /// later goes back to `queue`, still claimed, and the limit that held it back is
    /// returned for the runner to wait on.
    pub(super) async fn begin(
        self: &Arc<Self>,
        queue: &ReadyQueue,
        batch: Vec<(ClaimedTask, OwnedSemaphorePermit)>,
    ) -> Option<HeldBy> {
        // A runner's batch is of one job. Its keys are read once, before any attempt
        // begins: held tasks of a job whose keys went missing (or that Kafka delivered) are
        // handed back to wait in the store, where the claimer leaves them until the keys
        // are back.
        let job = batch
            .first()
            .and_then(|(task, _)| self.routes.borrow().job(&task.task_type).cloned());
        let keys = job
            .as_ref()
            .map_or(Keys::Unsigned, |job| self.signing.keys(job));
        // Likewise the held tasks of a job its config has paused since they were claimed,
        // and those of a job whose config is gone.
        let job = match job {
            Some(job) if !job.paused && !matches!(keys, Keys::Unavailable(_)) => job,
            _ => {
                self.outcomes
                    .release(batch.into_iter().map(|(task, _)| task).collect())
                    .await;
                return None;
            }
        };
        let now = self.clock.now_millis();
        // Past its expiry a claim is neither begun (the store's start would refuse it
        // anyway) nor handed back, which would only have it claimed again: it stays
        // claimed until the rescuer's expiry pass ends it.
        let (batch, expired): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .partition(|(task, _)| !task.expired_by(now));
        for (task, _) in &expired {
            self.claims.let_go(&task.task_type);
        }
        if batch.is_empty() {
            return None;
        }
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
        let admitted = self
            .store
            .start_limited(
                StartParams {
                    claims: &claims,
                    now,
                    grace: self.config.grace,
                },
                JobGate {
                    task_type: &job.task_type,
                    concurrency: job.concurrency,
                    rate: job.rate_limit,
                    key_limit: job.concurrency_key.as_ref().map(|key| key.limit),
                    key_rate: job.concurrency_key.as_ref().and_then(|key| key.rate),
                    keys: &task_keys,
                    limiters: &job.limiters,
                },
            )
            .await;
        let admitted = match admitted {
            Ok(admitted) => admitted,
            Err(err) => {
                // The claims stay held; the rescuer hands them back when the hold lapses.
                tracing::warn!(%err, tasks = batch.len(), "could not begin attempts");
                for (task, _) in &batch {
                    self.claims.let_go(&task.task_type);
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
            self.metrics
                .limited
                .with_label_values(&[job.name.as_str(), held_by_label(admitted.held_by)])
                .inc_by(deferred.len() as u64);
        }
        for (task, permit) in deferred {
            drop(permit);
            queue.push(task);
        }
        let started = admitted.started;
        if let Some((task, _)) = batch.first() {
            // A runner's batch is of one job.
            self.claims
                .holdings()
                .began(&task.task_type, started.len(), Instant::now());
        }
        let mut started: HashMap<(String, i64), _> =
            // By id and the claim's token (a start moves it on by one): a batch may hold a
            // claim a change gave up beside the task's live one, and only that one began.
            started
                .into_iter()
                .map(|s| ((s.id.clone(), s.lease_token - 1), s))
                .collect();
        let mut unstarted = Vec::new();
        let mut attempts = Vec::with_capacity(batch.len());
        for (task, permit) in batch {
            // Missing: its job was paused (`Store::pause`; the claim is still ours and goes
            // back to the store, where it waits for the resume), cancelled meanwhile, or the
            // claim lapsed and went to someone else (then the release, fenced by the token,
            // changes nothing).
            match started.remove(&(task.id.clone(), task.lease_token)) {
                Some(attempt) => attempts.push((task, attempt, permit)),
                None => unstarted.push(task),
            }
        }
        self.spawn_calls(&job, &keys, attempts);
        if !unstarted.is_empty() {
            self.outcomes.release(unstarted).await;
        }
        admitted.held_by
    }

    /// Claims and begins up to one attempt per permit on `job`'s due tasks straight from
    /// the store, within its limits in total ([`Store::start_due`]), and spawns their
    /// calls. Returns how many began and the limit that held more back; `None` when
    /// none may begin here now (the job's keys are missing, the clock is off, or the
    /// store failed). `probe`: see [`StartDueParams::probe`].
    pub(super) async fn begin_due(
        self: &Arc<Self>,
        job: &asyncd_spec::Job,
        permits: Vec<OwnedSemaphorePermit>,
        probe: bool,
    ) -> Option<(usize, Option<HeldBy>)> {
        let keys = self.due_keys(job)?;
        let now = self.clock.now_millis();
        let mut start = self.due_start(job, now, permits.len());
        start.params.probe = probe;
        let due = match self.store.start_due(start.params, start.gate).await {
            Ok(due) => due,
            Err(err) => {
                tracing::warn!(%err, job = %job.name, "could not begin due attempts");
                return None;
            }
        };
        let held_by = due.held_by;
        Some((self.began_due(job, keys, now, due, permits), held_by))
    }

    /// The signing keys `job`'s attempts begin with, if they may begin here now: `None`
    /// while its keys are missing or this dispatcher's clock is off.
    pub(super) fn due_keys(&self, job: &asyncd_spec::Job) -> Option<Keys> {
        let keys = self.signing.keys(job);
        (!matches!(keys, Keys::Unavailable(_)) && self.config.clock_check.may_dispatch())
            .then_some(keys)
    }

    /// What [`Store::start_due`] is asked, for up to `limit` of `job`'s due tasks.
    pub(super) fn due_start<'a>(
        &'a self,
        job: &'a asyncd_spec::Job,
        now: Millis,
        limit: usize,
    ) -> DueStart<'a> {
        DueStart {
            params: StartDueParams {
                now,
                owner: &self.config.owner,
                grace: self.config.grace,
                limit: u32::try_from(limit).unwrap_or(u32::MAX),
                probe: false,
            },
            gate: JobGate {
                task_type: &job.task_type,
                concurrency: job.concurrency,
                rate: job.rate_limit,
                key_limit: None,
                key_rate: None,
                keys: &[],
                limiters: &job.limiters,
            },
        }
    }

    /// Counts and spawns the attempts `due` began at `now`, one of `permits` each (the
    /// rest are dropped); returns how many.
    pub(super) fn began_due(
        self: &Arc<Self>,
        job: &asyncd_spec::Job,
        keys: Keys,
        now: Millis,
        due: DueStarted,
        mut permits: Vec<OwnedSemaphorePermit>,
    ) -> usize {
        let begun = due.tasks.len();
        if due.held_by.is_some() {
            // The permits left over: due tasks it may have been.
            self.metrics
                .limited
                .with_label_values(&[job.name.as_str(), held_by_label(due.held_by)])
                .inc_by(permits.len().saturating_sub(begun) as u64);
        }
        if begun > 0 {
            // As the claimer's claims and the ticker's hand-offs count and signal them.
            self.claims.holdings().add(&job.task_type, begun);
            self.claims
                .holdings()
                .began(&job.task_type, begun, Instant::now());
            self.metrics
                .claimed
                .with_label_values(&[job.task_type.as_str()])
                .inc_by(begun as u64);
            let signals = &self.config.signals;
            emit(signals, || Signal::Claimed {
                ids: due.tasks.iter().map(|(task, _)| task.id.clone()).collect(),
                at: now,
            });
            for (task, _) in &due.tasks {
                emit(signals, || Signal::Dispatched {
                    id: task.id.clone(),
                    eta: task.trigger_at,
                    at: now,
                });
            }
        }
        permits.truncate(begun);
        let attempts = due
            .tasks
            .into_iter()
            .zip(permits)
            .map(|((task, started), permit)| (task, started, permit))
            .collect();
        self.spawn_calls(job, &Arc::new(keys), attempts);
        begun
    }

    /// Spawns the executor calls of attempts that began: one each, or for a batch job
    /// up to `executor.batch.maxTasks` per call.
    fn spawn_calls(
        self: &Arc<Self>,
        job: &asyncd_spec::Job,
        keys: &Arc<Keys>,
        attempts: Vec<(ClaimedTask, Started, OwnedSemaphorePermit)>,
    ) {
        let per_call = job.batch.map_or(1, |batch| batch.max_tasks as usize);
        let mut attempts = attempts.into_iter().peekable();
        while attempts.peek().is_some() {
            let call: Vec<_> = attempts.by_ref().take(per_call).collect();
            let this = self.clone();
            let keys = keys.clone();
            let task_type = job.task_type.clone();
            let count = call.len();
            if job.batch.is_none() {
                let (task, attempt, permit) = call.into_iter().next().expect("one attempt");
                // No span around the call: nothing logs during it, and the outcome's line
                // carries the task ([`log_outcome`]).
                self.inflight.spawn(async move {
                    tokio::select! {
                        _ = this.execute(task, attempt, &keys, permit) => {}
                        _ = this.abandon.cancelled() => {}
                    }
                    this.claims.let_go(&task_type);
                });
            } else {
                let span = tracing::info_span!("batch", task_type = %task_type, tasks = count);
                self.inflight.spawn(
                    async move {
                        tokio::select! {
                            _ = this.execute_batch(call, &keys) => {}
                            _ = this.abandon.cancelled() => {}
                        }
                        this.claims.let_go_many(&task_type, count);
                    }
                    .instrument(span),
                );
            }
        }
    }

    /// One attempt in its own call.
    async fn execute(
        &self,
        task: ClaimedTask,
        attempt: Started,
        keys: &Keys,
        permit: OwnedSemaphorePermit,
    ) {
        let job = self.routes.borrow().job(&task.task_type).cloned();
        let kind = match job.as_deref() {
            Some(job) => {
                let watch = AttemptWatch::begin(self, job, &task, &attempt);
                let clock = Instant::now();
                let (outcome, status) = self
                    .executor
                    .call(job, &task, &attempt, keys, watch.sent(&task))
                    .await;
                let cooldown = cooldown(job, &task, &outcome);
                let kind = watch.answered(&task, &attempt, outcome, status, clock.elapsed());
                if let Some(after) = cooldown {
                    self.cool_down(job, &task, after).await;
                }
                kind
            }
            None => self.vanished(&task, &attempt),
        };
        log_outcome(&kind, || attempt_span(&task, &attempt));
        self.outcomes
            .complete_attempt(task, attempt, kind, permit)
            .await;
    }

    /// The attempts of one batch call (`executor.batch`), each settled on its own.
    async fn execute_batch(
        &self,
        attempts: Vec<(ClaimedTask, Started, OwnedSemaphorePermit)>,
        keys: &Keys,
    ) {
        let task_type = attempts.first().map(|(task, ..)| task.task_type.clone());
        let job = task_type.and_then(|t| self.routes.borrow().job(&t).cloned());
        let kinds: Vec<FinishKind> = match job.as_deref() {
            Some(job) => {
                let watches: Vec<AttemptWatch> = attempts
                    .iter()
                    .map(|(task, attempt, _)| AttemptWatch::begin(self, job, task, attempt))
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
                let (outcomes, status) = self.executor.call_batch(job, &calls, keys).await;
                let took = clock.elapsed();
                drop(calls);
                let cooldowns: Vec<(&ClaimedTask, Duration)> = attempts
                    .iter()
                    .zip(&outcomes)
                    .filter_map(|((task, ..), outcome)| Some((task, cooldown(job, task, outcome)?)))
                    .collect();
                for (task, after) in cooldowns {
                    self.cool_down(job, task, after).await;
                }
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
                .map(|(task, attempt, _)| self.vanished(task, attempt))
                .collect(),
        };
        for ((task, attempt, permit), kind) in attempts.into_iter().zip(kinds) {
            log_outcome(&kind, || attempt_span(&task, &attempt));
            self.outcomes
                .complete_attempt(task, attempt, kind, permit)
                .await;
        }
    }

    /// Rests `task`'s concurrency key for `after`, for every dispatcher's fair claims.
    /// Written before the attempt's outcome: once the outcome frees the key's slot, the
    /// next claim must already see the key resting, or the key's next task would be
    /// called at once.
    async fn cool_down(&self, job: &asyncd_spec::Job, task: &ClaimedTask, after: Duration) {
        let Some(key) = task.concurrency_key.as_deref() else {
            return;
        };
        let ends_at = self.clock.now_millis() + after;
        match self
            .store
            .cool_down_key(&task.task_type, key, ends_at)
            .await
        {
            Ok(()) => self
                .metrics
                .key_cooldowns
                .with_label_values(&[job.name.as_str()])
                .inc(),
            Err(err) => {
                tracing::warn!(%err, "could not rest the task's concurrency key as its executor's Retry-After asked; the key's other tasks may be called before then")
            }
        }
    }

    /// The job vanished between the attempt's start and its call: a failed attempt.
    fn vanished(&self, task: &ClaimedTask, attempt: &Started) -> FinishKind {
        retry::settle(
            AttemptOutcome::Retry {
                reason: format!("no job config for task type {:?}", task.task_type),
                timed_out: false,
            },
            attempt.attempt,
            task.max_retries,
            None,
            self.clock.now_millis(),
        )
    }
}

/// How long an answer asks the task's concurrency key to rest: a 429 or 503 with a
/// `Retry-After` speaks for the upstream behind the executor, which for a keyed job is
/// the key's (a merchant's, a tenant's), so the key's other tasks wait too while the
/// job's other keys go on. `None` for an unkeyed job or task, or a wait of nothing.
fn cooldown(
    job: &asyncd_spec::Job,
    task: &ClaimedTask,
    outcome: &AttemptOutcome,
) -> Option<Duration> {
    match outcome {
        AttemptOutcome::RetryAfter { after, .. }
            if !after.is_zero()
                && job.concurrency_key.is_some()
                && task.concurrency_key.is_some() =>
        {
            Some(*after)
        }
        _ => None,
    }
}

/// The span of one attempt's outcome line: it carries the task.
fn attempt_span(task: &ClaimedTask, attempt: &Started) -> tracing::Span {
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
        Some(HeldBy::Limiter) => "limiter",
        _ => "concurrency",
    }
}

/// One attempt from its call to its settled outcome: its metrics, its share of adaptive
/// concurrency and its trace spans, alike for single and batch calls.
struct AttemptWatch<'a> {
    attempts: &'a Attempts,
    job: &'a asyncd_spec::Job,
    dispatch: Option<crate::trace::Span>,
    span: Option<crate::trace::Span>,
    /// The adaptive concurrency epoch the attempt began in, when the job adapts.
    epoch: Option<u64>,
    /// The task's key and the epoch of its limit, when the job's keys adapt.
    key_epoch: Option<(String, u64)>,
}

impl<'a> AttemptWatch<'a> {
    fn begin(
        attempts: &'a Attempts,
        job: &'a asyncd_spec::Job,
        task: &ClaimedTask,
        attempt: &Started,
    ) -> Self {
        let metrics = &attempts.metrics;
        let tracer = &attempts.config.tracer;
        let task_type = task.task_type.as_str();
        let began = attempts.clock.now_millis();
        metrics.dispatched.with_label_values(&[task_type]).inc();
        let delay = began.since(task.trigger_at);
        metrics
            .dispatch_delay
            .with_label_values(&[task_type])
            .observe(delay.as_secs_f64());
        let epoch = job.adaptive.enabled.then(|| {
            attempts.adaptive.lock().expect("adaptive lock").begin(
                &job.task_type,
                job.concurrency,
                began,
            )
        });
        let key_epoch = job
            .concurrency_key
            .as_ref()
            .filter(|key| key.adaptive)
            .zip(task.concurrency_key.as_deref())
            .map(|(spec, key)| {
                let epoch = attempts
                    .key_adaptive
                    .lock()
                    .expect("key adaptive lock")
                    .begin(&job.task_type, key, spec.limit, began);
                (key.to_string(), epoch)
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
            attempts,
            job,
            dispatch,
            span,
            epoch,
            key_epoch,
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
        attempt: &Started,
        outcome: AttemptOutcome,
        status: Option<u16>,
        took: Duration,
    ) -> FinishKind {
        let Self {
            attempts,
            job,
            dispatch,
            span,
            epoch,
            key_epoch,
        } = self;
        let metrics = &attempts.metrics;
        let tracer = &attempts.config.tracer;
        let task_type = task.task_type.as_str();
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
        if let (Some((key, epoch)), Some(spec)) = (key_epoch, &job.concurrency_key) {
            let mut keys = attempts.key_adaptive.lock().expect("key adaptive lock");
            keys.answered(&job.task_type, &key, spec.limit, epoch, signal);
            metrics
                .keys_cut
                .with_label_values(&[job.name.as_str()])
                .set(keys.cut(&job.task_type, spec.limit).len() as i64);
        }
        if let Some(epoch) = epoch {
            let limit = attempts.adaptive.lock().expect("adaptive lock").answered(
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
            attempts.clock.now_millis(),
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

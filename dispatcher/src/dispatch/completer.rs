//! The completer: writes attempt outcomes and handed-back claims to the store in
//! batches, and only then frees the concurrency permits their attempts held. One writer
//! batching for every runner keeps the store's write rate far below the attempt rate,
//! and one outcome the store refuses blocks none of the others ([`crate::outcomes`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, mpsc};
use tokio_util::sync::CancellationToken;

use super::journal::{OutcomeJournal, Ticket};
use super::refill::Refill;
use super::{ClaimerWakeup, Claims, DispatcherConfig};
use crate::clock::SharedClock;
use crate::metrics::Metrics;
use crate::test_hooks::{Signal, TestSignals, emit};
use asyncd_store::{ClaimedTask, Finish, FinishKind, Started, Store};

/// An outcome for the completer, with the concurrency permit its attempt held: the
/// permit goes once the outcome is written, when the store stops counting the attempt
/// as running, so the runner does not begin an attempt the store's count would refuse.
pub(super) struct Completion {
    finish: Finish,
    permit: Option<OwnedSemaphorePermit>,
    /// The attempt held a slot of its concurrency key: once its outcome is written the
    /// key's next task may be claimed, so the claimer looks at once.
    frees_key: bool,
    /// The attempt's job, whose next attempt its permit may begin ([`Refill`]).
    task_type: Option<String>,
    /// Where the outcome went in the outcome journal, if anywhere.
    ticket: Option<Ticket>,
}

impl Completion {
    /// The permit, taken, with the job it belongs to.
    pub(super) fn permit_of_job(&mut self) -> Option<(&str, OwnedSemaphorePermit)> {
        let task_type = self.task_type.as_deref()?;
        Some((task_type, self.permit.take()?))
    }
}

impl From<Finish> for Completion {
    fn from(finish: Finish) -> Self {
        Self {
            finish,
            permit: None,
            frees_key: false,
            task_type: None,
            ticket: None,
        }
    }
}

/// How many times the completer retries a batch once shutdown has begun, before leaving
/// those tasks to their leases rather than holding the process up while the store is away.
const SHUTDOWN_FINISH_TRIES: u32 = 5;

/// The way into the completer, cloned into whatever settles or hands back a task: the
/// ticker, the runners, their attempts and shutdown. The completer ends once every clone
/// is gone.
#[derive(Clone)]
pub(super) struct Outcomes {
    sender: mpsc::Sender<Completion>,
    claims: Arc<Claims>,
    metrics: Arc<Metrics>,
    clock: SharedClock,
    lookahead: Duration,
    signals: Option<TestSignals>,
    journal: Option<Arc<OutcomeJournal>>,
}

impl Outcomes {
    pub(super) fn new(
        sender: mpsc::Sender<Completion>,
        claims: Arc<Claims>,
        metrics: Arc<Metrics>,
        clock: SharedClock,
        config: &DispatcherConfig,
        journal: &Option<Arc<OutcomeJournal>>,
    ) -> Self {
        Self {
            sender,
            claims,
            metrics,
            clock,
            lookahead: config.lookahead,
            signals: config.signals.clone(),
            journal: journal.clone(),
        }
    }

    /// Hands claimed tasks back to the store, unstarted.
    pub(super) async fn release(&self, tasks: Vec<ClaimedTask>) {
        for task in tasks {
            emit(&self.signals, || Signal::Released {
                id: task.id.clone(),
            });
            self.claims.let_go(&task.task_type);
            let _ = self
                .sender
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

    /// Hands a settled attempt to the completer, with the permit it held.
    pub(super) async fn complete_attempt(
        &self,
        task: ClaimedTask,
        attempt: Started,
        kind: FinishKind,
        permit: OwnedSemaphorePermit,
    ) {
        if let FinishKind::Retry { at, .. } = &kind {
            self.metrics
                .retries
                .with_label_values(&[task.task_type.as_str()])
                .inc();
            if *at <= self.clock.now_millis() + self.lookahead {
                self.claims.waker.wake();
            }
        }
        let frees_key = task.concurrency_key.is_some();
        let finish = Finish {
            id: task.id,
            lease_token: attempt.lease_token,
            kind,
        };
        // Before it can wait for the write: a kill from here on finds it journaled.
        let ticket = self.journal.as_ref().and_then(|j| j.append(&finish));
        let _ = self
            .sender
            .send(Completion {
                finish,
                permit: Some(permit),
                frees_key,
                task_type: Some(task.task_type),
                ticket,
            })
            .await;
    }
}

pub(super) struct Completer {
    pub(super) store: Arc<dyn Store>,
    pub(super) clock: SharedClock,
    pub(super) waker: ClaimerWakeup,
    pub(super) signals: Option<TestSignals>,
    /// Notified each time a batch of outcomes is written: runners held back by their
    /// job's concurrency look again.
    pub(super) written: Arc<Notify>,
    pub(super) completions: mpsc::Receiver<Completion>,
    /// Begins jobs' next attempts with the outcomes that free their slots.
    pub(super) refill: Arc<Refill>,
    /// Told which journaled outcomes are written.
    pub(super) journal: Option<Arc<OutcomeJournal>>,
}

impl Completer {
    /// Holds no sender: the channel closing (every [`Outcomes`] gone) is what ends this
    /// loop, once it has written what is queued. `shutdown` only shortens its retries.
    pub(super) async fn run(mut self, shutdown: CancellationToken) {
        // What an earlier process journaled and did not write comes first, while its
        // tasks' leases still hold.
        let mut recovered: Vec<Completion> = self
            .journal
            .as_ref()
            .map(|journal| journal.take_recovered())
            .unwrap_or_default()
            .into_iter()
            .map(|(finish, ticket)| Completion {
                ticket: Some(ticket),
                ..Completion::from(finish)
            })
            .collect();
        let (total, began) = (recovered.len(), std::time::Instant::now());
        let mut applied = 0;
        while !recovered.is_empty() {
            let rest = recovered.split_off(recovered.len().min(512));
            let mut chunk = std::mem::replace(&mut recovered, rest);
            applied += self.write(&mut chunk, &shutdown).await;
        }
        if total > 0 {
            // Most of what a journal holds was written before the kill (a segment is
            // emptied only once all of it is); `applied` are the outcomes the kill had
            // left unwritten, saved from running twice.
            tracing::info!(
                target: "asyncd::dispatch::journal",
                journaled = total,
                applied,
                took_ms = began.elapsed().as_millis() as u64,
                "wrote the outcomes an earlier process left in its journal"
            );
        }
        let mut received = Vec::with_capacity(512);
        while self.completions.recv_many(&mut received, 512).await > 0 {
            self.write(&mut received, &shutdown).await;
        }
    }

    /// Writes one batch (taking what is in `received`), with the next attempts of the
    /// jobs whose slots it frees ([`Refill`]); retrying while the store is unavailable
    /// (a few times only once shutdown has begun), then frees the permits not kept and
    /// wakes who waits on them. Returns how many outcomes applied (a stale lease token
    /// applies none).
    pub(super) async fn write(
        &self,
        received: &mut Vec<Completion>,
        shutdown: &CancellationToken,
    ) -> usize {
        let now = self.clock.now_millis();
        let plan = match shutdown.is_cancelled() {
            true => None,
            false => self.refill.plan(received, now),
        };
        let frees_key = received.iter().any(|c: &Completion| c.frees_key);
        let tickets: Vec<Ticket> = received.iter().filter_map(|c| c.ticket).collect();
        let (mut batch, mut permits): (Vec<Finish>, Vec<_>) = received
            .drain(..)
            .map(|c: Completion| (c.finish, c.permit))
            .unzip();
        let ids: Vec<String> = batch.iter().map(|f| f.id.clone()).collect();
        let wake = frees_key
            || batch
                .iter()
                .any(|f| matches!(f.kind, FinishKind::Release | FinishKind::Retry { .. }));
        let mut began = None;
        let mut written = true;
        let mut applied = 0;
        if let Some(plan) = plan {
            let starts = plan.starts();
            match self.store.finish_and_start_due(&batch, now, &starts).await {
                Ok((done, started)) => {
                    applied = done.iter().filter(|a| **a).count();
                    batch.clear();
                    began = Some((plan, started));
                }
                // Written below without the starts, where an outcome the store refuses
                // is isolated; the kept permits are held until then. A warning, as the
                // outcomes' own write gives: a store that stopped answering shows here
                // first, not a bound later.
                Err(err) => {
                    tracing::warn!(%err, outcomes = batch.len(), "could not record outcomes with the next starts; writing them alone");
                    permits.extend(plan.into_permits().into_iter().map(Some));
                }
            }
        }
        let mut backoff = Duration::from_millis(50);
        let mut tries = 0;
        while !batch.is_empty() {
            // Only an unavailable store comes back as an error (with what is unwritten
            // left in `batch`); an outcome it refuses is isolated inside.
            match crate::outcomes::write(self.store.as_ref(), &mut batch, self.clock.now_millis())
                .await
            {
                Ok(done) => {
                    applied = done;
                    break;
                }
                Err(err) if shutdown.is_cancelled() && tries >= SHUTDOWN_FINISH_TRIES => {
                    tracing::warn!(%err, outcomes = batch.len(), "outcomes not recorded at shutdown; their leases will bring the tasks back");
                    written = false;
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
        if written {
            if let Some(journal) = &self.journal {
                journal.written(tickets);
            }
            emit(&self.signals, || Signal::Finished {
                ids,
                at: self.clock.now_millis(),
            });
        }
        if let Some((plan, started)) = began {
            plan.began(started);
        }
        drop(permits);
        self.written.notify_waiters();
        if wake {
            self.waker.wake();
        }
        applied
    }
}

/// The `asyncd.outcome` attribute of the `dispatch` and `attempt` spans.
pub(super) fn outcome_name(kind: &FinishKind) -> &'static str {
    match kind {
        FinishKind::Succeeded { .. } => "succeeded",
        FinishKind::Extend { .. } => "accepted",
        FinishKind::Retry { .. } => "retry",
        FinishKind::Dead { .. } => "dead",
        FinishKind::Release => "released",
    }
}

/// A span's error status: the attempt failed.
pub(super) fn failure(kind: &FinishKind) -> Option<String> {
    match kind {
        FinishKind::Retry { error, .. } | FinishKind::Dead { error } => Some(error.clone()),
        _ => None,
    }
}

/// One line per attempt outcome, inside the attempt's span: failures at `info` (a
/// retry) and `warn` (a dead letter), so they are in the default log; successes at
/// `debug`, as a busy queue has millions.
/// Logs an attempt's outcome inside `span` (the attempt's), made only when the line is
/// written: at the default level a success writes none, and a span for each attempt cost
/// the hot path an allocation and its fields' formatting per task.
pub(super) fn log_outcome(kind: &FinishKind, span: impl FnOnce() -> tracing::Span) {
    let written = match kind {
        FinishKind::Succeeded { .. } | FinishKind::Extend { .. } | FinishKind::Release => {
            tracing::enabled!(tracing::Level::DEBUG)
        }
        FinishKind::Retry { .. } => tracing::enabled!(tracing::Level::INFO),
        FinishKind::Dead { .. } => tracing::enabled!(tracing::Level::WARN),
    };
    if !written {
        return;
    }
    let _attempt = span().entered();
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

//! The claimer: polls the store for tasks of the types this dispatcher owns that are
//! due within `lookahead` (every `poll_interval`, backing off to `idle_poll_interval`
//! while polls find nothing ([`next_pause`]), or at once when woken by a local submit, a
//! retry or a task leaving a full job), so they are in the heap before their
//! ETA instead of waiting for the next poll. It claims only what each job has room for
//! ([`super::holdings`]), and keyed jobs fairly among their keys. What is already due
//! it leaves to the job's runner, which claims and begins it in one write
//! ([`Store::start_due`]), except for keyed and batch jobs; each pass tells those
//! runners to look.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::adaptive::KeyAdaptive;
use super::holdings::JobLimits;
use super::ownership::Ownership;
use super::{ClaimerWakeup, DispatcherConfig, Intake};
use crate::clock::SharedClock;
use crate::job_table::Routes;
use crate::metrics::Metrics;
use crate::signing::SigningKeys;
use crate::test_hooks::{Signal, emit};
use asyncd_store::{
    ClaimParams, ClaimedTask, FairParams, KeyOrder, Millis, Store, TenantWeights, TypeFilter,
};

pub(super) struct Claimer {
    store: Arc<dyn Store>,
    routes: Routes,
    metrics: Arc<Metrics>,
    clock: SharedClock,
    config: Arc<DispatcherConfig>,
    /// A job whose signing keys are unavailable is not claimed.
    signing: Arc<SigningKeys>,
    /// Which task types this dispatcher polls, as membership last saw the members.
    ownership: Arc<Mutex<Ownership>>,
    /// Where claimed tasks go, and what sizes each job's room.
    intake: Arc<Intake>,
    waker: ClaimerWakeup,
    /// Per keyed job: the key its last fair claim ended at.
    fair_after: HashMap<String, String>,
    /// The clock reading of the last pass signalled.
    last_pass: Option<Millis>,
    /// Each adaptive key's limit, as its executor's answers have it.
    key_adaptive: Arc<Mutex<KeyAdaptive>>,
}

impl Claimer {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        store: Arc<dyn Store>,
        routes: Routes,
        metrics: Arc<Metrics>,
        clock: SharedClock,
        config: Arc<DispatcherConfig>,
        signing: Arc<SigningKeys>,
        ownership: Arc<Mutex<Ownership>>,
        intake: Arc<Intake>,
        waker: ClaimerWakeup,
        key_adaptive: Arc<Mutex<KeyAdaptive>>,
    ) -> Self {
        Self {
            store,
            routes,
            metrics,
            clock,
            config,
            signing,
            ownership,
            intake,
            waker,
            fair_after: HashMap::new(),
            last_pass: None,
            key_adaptive,
        }
    }

    pub(super) async fn run(mut self, shutdown: CancellationToken) {
        let intake = self.intake.clone();
        let begun_from_store = move || {
            intake
                .unstarted
                .begun_from_store
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let mut pause = self.config.poll_interval;
        let mut begun_before = begun_from_store();
        loop {
            let woken = tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(pause) => false,
                _ = self.waker.0.notify.notified() => true,
            };
            let pass = self.pass(&shutdown).await;
            // The runners' begins that the previous pass set off count too.
            let begun = begun_from_store();
            let busy = woken || pass.claimed > 0 || begun != begun_before;
            begun_before = begun;
            pause = next_pause(pause, busy, &self.config);
            if let Some(eta) = pass.next_look {
                pause = pause.min(until_look(eta, self.clock.now_millis(), &self.config));
            }
        }
        // No claim at submit once the claimer has stopped: the heap is about to be handed
        // back, and a task claimed into it afterwards would wait for its hold to lapse.
        self.intake
            .at_submit()
            .measured(self.waker.wakes(), HashMap::new());
    }

    /// One pass: claims until no job has a full batch waiting, the heap is full, or the
    /// clock is too far from the store's to dispatch.
    pub(super) async fn pass(&mut self, shutdown: &CancellationToken) -> Pass {
        let config = self.config.clone();
        // Every claim of this pass reads the clock at or after this.
        let now = self.clock.now_millis();
        // Read before the first claim: a wake from here on may have left due tasks
        // behind this pass's claims.
        let wakes = self.waker.wakes();
        // The types whose due tasks the last round of claims left none of in the store.
        let mut drained: Vec<String> = Vec::new();
        // The jobs whose due tasks their runners begin from the store and whose claim
        // ahead their room cut short (or left out): what it left falls due in the store.
        let mut capped: Vec<String> = Vec::new();
        let mut total = 0;
        loop {
            drained.clear();
            capped.clear();
            let unstarted = self.intake.unstarted.len();
            if unstarted >= config.max_heap || !config.clock_check.may_dispatch() {
                break;
            }
            let (plan, roomless) = self.plan();
            capped.extend(roomless);
            if plan.is_empty() {
                break;
            }
            let mut more = false;
            for Claim {
                types,
                limit,
                per_key,
                ahead,
            } in plan
            {
                let now = self.clock.now_millis();
                let started = Instant::now();
                let filter = TypeFilter::Only(types);
                let params = ClaimParams {
                    types: &filter,
                    horizon: now + config.lookahead,
                    now,
                    hold: config.hold,
                    owner: &config.owner,
                    limit,
                    ahead,
                };
                let claimed = match per_key {
                    Some((per_key, order)) => self.claim_fair(params, per_key, order).await,
                    None => self.store.claim(params).await,
                };
                self.metrics
                    .poll_duration
                    .observe(started.elapsed().as_secs_f64());
                let claimed = match claimed {
                    Ok(claimed) => claimed,
                    Err(err) => {
                        tracing::warn!(%err, "claim failed; retrying on the next tick");
                        drained.clear();
                        break;
                    }
                };
                if let TypeFilter::Only(types) = filter
                    && per_key.is_none()
                {
                    if (claimed.len() as u32) < limit {
                        drained.extend(types.iter().cloned());
                    } else if ahead && limit < config.claim_batch {
                        capped.extend(types.iter().cloned());
                    }
                }
                // Only a full batch of the unconstrained jobs says more is waiting now;
                // a constrained job has taken all its room, and a keyed one each key's
                // share (the next comes when an outcome frees a key).
                more |= per_key.is_none()
                    && limit == config.claim_batch
                    && claimed.len() as u32 == limit;
                total += claimed.len();
                if !claimed.is_empty() {
                    self.intake.push(claimed);
                }
            }
            if !more || shutdown.is_cancelled() {
                break;
            }
        }
        self.measure_room_at_submit(wakes, &drained);
        let next_look = self.next_look(&capped, now).await;
        // Once per clock reading, so a test on a manual clock is not flooded.
        if config.signals.is_some() && self.last_pass != Some(now) {
            self.last_pass = Some(now);
            emit(&config.signals, || Signal::ClaimPass { at: now });
        }
        Pass {
            claimed: total,
            next_look,
        }
    }

    /// When the first task that `capped` jobs left in the store falls due, if within the
    /// lookahead: their runners look only when a pass tells them to, so the next pass
    /// comes then ([`until_look`]) rather than up to a poll later. A fresh dispatcher's
    /// room is small (`holdings`: sized by the slowest the executor may be, until a rate
    /// is measured), and tasks due within its first lookahead waited up to 200 ms.
    async fn next_look(&self, capped: &[String], now: Millis) -> Option<Millis> {
        let mut next: Option<Millis> = None;
        for task_type in capped {
            match self
                .store
                .next_pending_eta(task_type, now, now + self.config.lookahead)
                .await
            {
                Ok(Some(eta)) => next = Some(next.map_or(eta, |next| next.min(eta))),
                Ok(None) => {}
                Err(err) => {
                    tracing::debug!(%err, "could not read the next due task left in the store")
                }
            }
        }
        next
    }

    /// What the API may claim at submit until the next wake ([`super::at_submit`]): of
    /// the `drained` types, as many as their jobs have room for.
    fn measure_room_at_submit(&self, wakes: u64, drained: &[String]) {
        let routes = self.routes.borrow().clone();
        let mut holdings = self.intake.claims.holdings();
        let room = drained
            .iter()
            .filter_map(|task_type| {
                let job = routes.job(task_type)?;
                let limits = JobLimits {
                    concurrency: job.concurrency,
                    timeout: job.timeout,
                    per_second: job.rate_limit.map(|r| r.per_second),
                };
                let room = holdings.room(task_type, limits, self.config.hold);
                (room > 0).then(|| (task_type.clone(), room))
            })
            .collect();
        drop(holdings);
        self.intake.at_submit().measured(wakes, room);
    }

    /// A keyed job's claim ([`Store::claim_fair`]), its keys' rotation going on from where
    /// this dispatcher's last claim of the job left it.
    async fn claim_fair(
        &mut self,
        params: ClaimParams<'_>,
        per_key: u32,
        order: KeyOrder,
    ) -> asyncd_store::Result<Vec<ClaimedTask>> {
        let TypeFilter::Only(types) = params.types else {
            return Ok(Vec::new());
        };
        let task_type = types.first().cloned().unwrap_or_default();
        let after = self.fair_after.get(&task_type).cloned();
        let routes = self.routes.borrow().clone();
        let job = routes.job(&task_type);
        let shared =
            job.and_then(|job| Some((job, job.concurrency_key.as_ref()?.tenants.as_ref()?)));
        // The weights set at runtime replace the spec's for their tenants, read at each
        // claim so that a change holds from the next one on.
        let mut weights = BTreeMap::new();
        if let Some((_, tenants)) = shared {
            weights.clone_from(&tenants.weights);
            weights.extend(self.store.tenant_weights(&task_type).await?);
        }
        // Keys whose overload answers cut their limit are claimed up to the cut.
        let key_limits = job
            .and_then(|job| job.concurrency_key.as_ref())
            .filter(|key| key.adaptive)
            .map(|key| {
                self.key_adaptive
                    .lock()
                    .expect("key adaptive lock")
                    .cut(&task_type, key.limit)
            })
            .unwrap_or_default();
        let tenants = shared.map(|(job, tenants)| TenantWeights {
            weights: &weights,
            default_weight: tenants.default_weight,
            per_tenant: job.concurrency,
        });
        let claim = self
            .store
            .claim_fair(
                params,
                FairParams {
                    per_key,
                    after: after.as_deref(),
                    order,
                    tenants,
                    key_limits: Some(&key_limits),
                },
            )
            .await?;
        if let Some(last) = claim.last_key {
            self.fair_after.insert(task_type, last);
        }
        Ok(claim.tasks)
    }

    /// The claims to make now: one for the owned jobs with room for a whole batch, and one
    /// per job with less room (limited to it) or with a concurrency key; jobs without room
    /// are left out until a task of theirs leaves (see [`super::holdings`]).
    /// Also returns the jobs whose runners begin their due tasks from the store that
    /// have no room now.
    fn plan(&self) -> (Vec<Claim>, Vec<String>) {
        let (plan, runners, roomless) = self.plan_and_runners();
        // The runners of the jobs whose due tasks are left to them look for some.
        self.intake.due(runners);
        (plan, roomless)
    }

    /// [`Self::plan`], and the owned jobs whose runners begin their due tasks straight
    /// from the store ([`runs_due_from_store`]): their claims take only what is due
    /// after now.
    fn plan_and_runners(&self) -> (Vec<Claim>, Vec<String>, Vec<String>) {
        let config = &self.config;
        let routes = self.routes.borrow().clone();
        // A job whose signing keys are unavailable is not claimed: its tasks wait, pending.
        // Nor is a job paused by its config (`spec.paused`); one paused through the API is
        // left out by the claim itself (`Store::pause`).
        let jobs: Vec<(String, String)> = routes
            .jobs()
            .filter(|job| !job.paused && self.signing.may_dispatch(job))
            .map(|job| (job.task_type.clone(), job.name.clone()))
            .collect();
        let owned = self
            .ownership
            .lock()
            .expect("ownership lock")
            .owned(&jobs, Instant::now());
        let mut holdings = self.intake.claims.holdings();
        let mut open = Vec::new();
        let mut open_ahead = Vec::new();
        let mut plan = Vec::new();
        let mut runners = Vec::new();
        let mut roomless = Vec::new();
        for task_type in owned {
            let Some(job) = routes.job(&task_type) else {
                continue;
            };
            let ahead = runs_due_from_store(job);
            if ahead {
                runners.push(task_type.clone());
            }
            let limits = JobLimits {
                concurrency: job.concurrency,
                timeout: job.timeout,
                per_second: job.rate_limit.map(|r| r.per_second),
            };
            // A job with weighted tenants claims only what it can begin now: each claim
            // then fills free slots in the weighted order, from the tenants' running
            // counts as they are. Claimed ahead, the order would be fixed before those
            // counts change, and a first claim with room for the backlog takes a share
            // of every tenant whatever the weights (docs/design.md, "Tenants").
            let weighted = job
                .concurrency_key
                .as_ref()
                .is_some_and(|key| key.tenants.is_some());
            let hold = if weighted {
                Duration::ZERO
            } else {
                config.hold
            };
            let room = holdings.room(&task_type, limits, hold);
            let per_key = job.concurrency_key.as_ref().map(|key| {
                let order = match key.fifo {
                    None => KeyOrder::Rank,
                    Some(on_dead) => KeyOrder::Fifo {
                        dead_blocks: on_dead == asyncd_spec::OnDead::Block,
                    },
                };
                (key.limit, order)
            });
            match u32::try_from(room) {
                Ok(0) if ahead => roomless.push(task_type),
                Ok(0) => {}
                Ok(room) if room < config.claim_batch || per_key.is_some() => plan.push(Claim {
                    types: vec![task_type],
                    limit: room.min(config.claim_batch),
                    per_key,
                    ahead,
                }),
                Err(_) if per_key.is_some() => plan.push(Claim {
                    types: vec![task_type],
                    limit: config.claim_batch,
                    per_key,
                    ahead,
                }),
                _ if ahead => open_ahead.push(task_type),
                _ => open.push(task_type),
            }
        }
        for (types, ahead) in [(open, false), (open_ahead, true)] {
            if !types.is_empty() {
                plan.insert(
                    0,
                    Claim {
                        types,
                        limit: config.claim_batch,
                        per_key: None,
                        ahead,
                    },
                );
            }
        }
        (plan, runners, roomless)
    }
}

/// What a pass did: how many tasks it claimed, and when it wants the next pass
/// ([`Claimer::next_look`]).
pub(super) struct Pass {
    pub(super) claimed: usize,
    pub(super) next_look: Option<Millis>,
}

/// The wait until a pass at `eta`, but never shorter than a quarter of `poll_interval`:
/// where tasks fall due every few milliseconds a pass each would cost more than the
/// lateness it saves, and an executor too slow for the job keeps its room full for good.
fn until_look(eta: Millis, now: Millis, config: &DispatcherConfig) -> Duration {
    let until = Duration::from_millis(u64::try_from(eta.as_i64() - now.as_i64()).unwrap_or(0));
    until.max(config.poll_interval / 4)
}

/// How long the claimer waits before its next poll: `poll_interval` while there is work
/// (a pass claimed some, a runner began some from the store, or a local submit woke it),
/// else twice the last wait, up to `idle_poll_interval`. Most polls of an idle queue find
/// nothing, and each is a store round trip per claim and per runner's look; a task
/// submitted through another process is then found within `idle_poll_interval`, which
/// is within `lookahead`, so a task due later is still claimed before its ETA.
fn next_pause(last: Duration, busy: bool, config: &DispatcherConfig) -> Duration {
    let poll = config.poll_interval;
    if busy {
        return poll;
    }
    let idle = config.idle_poll_interval.max(poll);
    last.saturating_mul(2).clamp(poll, idle)
}

/// One claim of a pass: of these task types, up to `limit` tasks; with `per_key`, of one
/// keyed job, fairly among its keys ([`Store::claim_fair`]); `ahead`, only what is due
/// after now.
struct Claim {
    types: Vec<String>,
    limit: u32,
    /// A keyed job's `concurrencyKey.limit` and the order of each key's tasks.
    per_key: Option<(u32, KeyOrder)>,
    ahead: bool,
}

/// Whether `job`'s runner claims and begins its due tasks in one write
/// ([`Store::start_due`]), so the claimer only claims its tasks ahead of their ETA:
/// every job but those whose keys take turns (the fair claim orders them) and batch
/// jobs (whose calls are filled from claimed tasks within `maxWait`).
pub(super) fn runs_due_from_store(job: &asyncd_spec::Job) -> bool {
    job.concurrency_key.is_none() && job.batch.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_claimer_polls_less_often_and_work_brings_it_back_at_once() {
        let config = DispatcherConfig {
            poll_interval: Duration::from_millis(200),
            idle_poll_interval: Duration::from_secs(1),
            ..DispatcherConfig::default()
        };
        let mut pause = config.poll_interval;
        let mut idle = Vec::new();
        for _ in 0..5 {
            pause = next_pause(pause, false, &config);
            idle.push(pause.as_millis());
        }
        assert_eq!(idle, [400, 800, 1000, 1000, 1000]);
        assert_eq!(next_pause(pause, true, &config), config.poll_interval);
        let never_idle = DispatcherConfig {
            idle_poll_interval: Duration::from_millis(50),
            ..config
        };
        assert_eq!(
            next_pause(Duration::from_millis(200), false, &never_idle),
            Duration::from_millis(200),
            "never faster than poll_interval"
        );
    }

    #[test]
    fn a_pass_comes_when_the_first_task_left_in_the_store_falls_due_but_not_in_a_spin() {
        let config = DispatcherConfig {
            poll_interval: Duration::from_millis(200),
            ..DispatcherConfig::default()
        };
        let now = Millis::new(1_000_000);
        let look = |in_ms: i64| until_look(Millis::new(now.as_i64() + in_ms), now, &config);
        assert_eq!(look(130), Duration::from_millis(130));
        assert_eq!(
            look(2_000),
            Duration::from_secs(2),
            "the poll's own pause is shorter"
        );
        assert_eq!(
            look(3),
            Duration::from_millis(50),
            "a quarter of the poll at least"
        );
        assert_eq!(
            look(-40),
            Duration::from_millis(50),
            "already due: the same"
        );
    }
}

//! Jobs: the overview of each AsyncJobConfig (its counts, effective concurrency, shared
//! limiters, the limit that binds and cron schedule), pausing and resuming a job, and firing one of its cron entries now.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use asyncd_contract::{
    BindingLimit, CRON_FIRINGS, CronOverview, ErrorCode, FinishedCounts, JobList, JobOverview,
    JobStats, JobStatus, KeyUsage, LimiterList, LimiterUsage, MAX_JOB_COUNT, MAX_KEYS_SHOWN,
    MAX_RESTING_KEYS, MAX_TENANTS_SHOWN, RestingKey, TenantUsage,
};
use axum::Json;
use axum::extract::State;

use super::extract::Path;
use axum::response::Response;

use super::error::ApiError;
use super::{ApiState, AppState};
use crate::auth::{Caller, Verb};
use crate::clock::from_millis;
use asyncd_store::{JobCountParams, Millis, RateBucket, UsageBy, domain};

/// The job named `name` (an AsyncJobConfig), when `caller` may do `verb` on it: 404 for a
/// name no config declares, 403 for a job the caller may not act on.
pub(super) async fn named_job(
    state: &ApiState,
    caller: &Caller,
    name: &str,
    verb: Verb,
) -> Result<Arc<asyncd_spec::Job>, ApiError> {
    let job = state
        .routes
        .borrow()
        .jobs()
        .find(|job| job.name == name)
        .cloned()
        .ok_or_else(|| {
            ApiError::new(ErrorCode::NotFound, format!("no job {name:?}")).with_field("name")
        })?;
    state.auth.require(caller, verb, Some(&job.name)).await?;
    Ok(job)
}

/// How `job` stands, the API's pause read from the store (`paused_at`, as given).
fn job_status(job: &asyncd_spec::Job, paused_at: Option<Millis>) -> JobStatus {
    JobStatus {
        job: job.name.clone(),
        task_type: job.task_type.clone(),
        paused: job.paused || paused_at.is_some(),
        paused_at: paused_at.map(from_millis),
        paused_by_config: job.paused,
    }
}

/// How far back the overview's finished counts reach.
const FINISHED_WINDOW: Duration = Duration::from_secs(60);

/// `job` as the jobs overview shows it at `now`, `paused_at` being the API's pause of it
/// and `shares` the live dispatchers' adaptive shares summed by task type.
async fn job_overview(
    state: &ApiState,
    job: &asyncd_spec::Job,
    paused_at: Option<Millis>,
    shares: &BTreeMap<String, u64>,
    now: Millis,
) -> Result<JobOverview, ApiError> {
    let counts = state
        .store
        .job_counts(JobCountParams {
            task_type: &job.task_type,
            now,
            finished_since: now.saturating_sub(FINISHED_WINDOW),
            cap: u32::try_from(MAX_JOB_COUNT).expect("the cap fits"),
        })
        .await?;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    let resting_keys = match &job.concurrency_key {
        Some(_) => state
            .store
            .resting_keys(&job.task_type, now, MAX_RESTING_KEYS as u32)
            .await?
            .into_iter()
            .map(|(key, until)| RestingKey {
                key,
                until: from_millis(until),
            })
            .collect(),
        None => Vec::new(),
    };
    let keys = match &job.concurrency_key {
        Some(_) => state
            .store
            .usage(
                &job.task_type,
                UsageBy::Key,
                now,
                MAX_JOB_COUNT,
                MAX_KEYS_SHOWN as u32,
            )
            .await?
            .into_iter()
            .map(|k| KeyUsage {
                key: k.of,
                running: k.running,
                due: k.due,
            })
            .collect(),
        None => Vec::new(),
    };
    // The dispatchers running the job each offer its executor their share; together
    // never more than `concurrency` (the store's count holds that).
    let effective_concurrency = match shares.get(&job.task_type) {
        Some(&sum) if job.adaptive.enabled => {
            u32::try_from(sum).unwrap_or(u32::MAX).min(job.concurrency)
        }
        _ => job.concurrency,
    };
    let cron = job
        .cron
        .iter()
        .map(|entry| CronOverview {
            name: entry.name.clone(),
            schedule: entry.schedule.as_str().to_string(),
            next: std::iter::successors(entry.schedule.next_after(from_millis(now)), |t| {
                entry.schedule.next_after(*t)
            })
            .take(CRON_FIRINGS)
            .collect(),
            overlap: entry.overlap,
            catch_up: if entry.catch_up.is_zero() {
                "0s".into()
            } else {
                asyncd_spec::format_duration(entry.catch_up)
            },
            paused: entry.paused,
        })
        .collect();
    let mut limiters = Vec::with_capacity(job.limiters.len());
    for limiter in &job.limiters {
        limiters.push(limiter_usage(state, limiter).await?);
    }
    // The rate limits with no token left now: the job's own, then its limiters'.
    let mut empty_rates = Vec::new();
    let rated = std::iter::once((RateBucket::Job(&job.task_type), job.rate_limit, None)).chain(
        job.limiters
            .iter()
            .map(|l| (RateBucket::Limiter(&l.id), l.rate, Some(l.id.clone()))),
    );
    for (of, rate, limiter) in rated {
        let Some(rate) = rate else { continue };
        let Some(bucket) = state.store.rate_bucket(of).await? else {
            continue;
        };
        if domain::admit(1, 0, u32::MAX, Some(rate), bucket, now).allowed == 0 {
            empty_rates.push(match limiter {
                None => BindingLimit::Rate,
                Some(name) => BindingLimit::LimiterRate { name },
            });
        }
    }
    let (tenant_weights, tenants) = match job.tenants() {
        Some(spec) => {
            let set = state.store.tenant_weights(&job.task_type).await?;
            let busy = state
                .store
                .usage(
                    &job.task_type,
                    UsageBy::Tenant,
                    now,
                    MAX_JOB_COUNT,
                    MAX_TENANTS_SHOWN as u32,
                )
                .await?;
            let weight = |tenant: &str| {
                set.get(tenant)
                    .copied()
                    .unwrap_or_else(|| spec.weight_of(tenant))
            };
            let weights: u64 = busy.iter().map(|t| u64::from(weight(&t.of))).sum();
            let tenants = busy
                .into_iter()
                .map(|t| {
                    let weight = weight(&t.of);
                    TenantUsage {
                        fair_share: f64::from(effective_concurrency) * f64::from(weight)
                            / weights.max(1) as f64,
                        tenant: t.of,
                        weight,
                        running: t.running,
                        due: t.due,
                    }
                })
                .collect();
            (set, tenants)
        }
        None => Default::default(),
    };
    let status = job_status(job, paused_at);
    let binding_limit = binding_limit(
        &status,
        count(counts.due),
        count(counts.running),
        effective_concurrency,
        &limiters,
        empty_rates.into_iter().next(),
        !resting_keys.is_empty(),
    );
    Ok(JobOverview {
        status,
        effective_concurrency,
        stats: JobStats {
            due: count(counts.due),
            scheduled: count(counts.scheduled),
            running: count(counts.running),
            dead: count(counts.dead),
            oldest_due_seconds: counts.oldest_due.map(|at| now.since(at).as_secs_f64()),
            finished_last_minute: FinishedCounts {
                succeeded: count(counts.succeeded_since),
                dead: count(counts.dead_since),
            },
        },
        cron,
        resting_keys,
        keys,
        limiters,
        tenant_weights,
        tenants,
        binding_limit,
    })
}

/// Which limit keeps a job's `due` tasks waiting, the first that is reached in the
/// order of [`BindingLimit`]'s variants.
fn binding_limit(
    status: &JobStatus,
    due: u64,
    running: u64,
    effective_concurrency: u32,
    limiters: &[LimiterUsage],
    empty_rate: Option<BindingLimit>,
    keys_resting: bool,
) -> Option<BindingLimit> {
    if due == 0 {
        return None;
    }
    if status.paused {
        return Some(BindingLimit::Paused);
    }
    if running >= u64::from(effective_concurrency) {
        return Some(BindingLimit::Concurrency);
    }
    if let Some(full) = limiters
        .iter()
        .find(|l| l.concurrency.is_some_and(|c| l.running >= u64::from(c)))
    {
        return Some(BindingLimit::Limiter {
            name: full.name.clone(),
        });
    }
    empty_rate.or(keys_resting.then_some(BindingLimit::KeyCooldown))
}

/// The API's pause of `task_type`, from the store's list of pauses.
fn paused_since(pauses: &[(String, Millis)], task_type: &str) -> Option<Millis> {
    pauses
        .iter()
        .find_map(|(paused, at)| (paused == task_type).then_some(*at))
}

/// `GET /v1/jobs`: every job the caller may read (`get`), sorted by name. A job the
/// caller may not read is left out, as `GET /v1/jobs/{name}` would refuse it.
pub(super) async fn list(
    State(state): AppState,
    caller: Caller,
) -> Result<Json<JobList>, ApiError> {
    let mut jobs: Vec<Arc<asyncd_spec::Job>> = state.routes.borrow().jobs().cloned().collect();
    jobs.sort_by(|a, b| a.name.cmp(&b.name));
    let pauses = state.store.paused_types().await?;
    let now = state.clock.now_millis();
    let shares = live_shares(&state, now).await?;
    let mut overviews = Vec::with_capacity(jobs.len());
    for job in jobs {
        if !state
            .auth
            .allows(&caller, Verb::Get, Some(&job.name))
            .await?
        {
            continue;
        }
        let paused_at = paused_since(&pauses, &job.task_type);
        overviews.push(job_overview(&state, &job, paused_at, &shares, now).await?);
    }
    Ok(Json(JobList { jobs: overviews }))
}

/// `GET /v1/limiters`: every limiter named by a job the caller may read (`get`), sorted
/// by name, each with the attempts running now of every job that names it. A caller
/// who may read one of a limiter's jobs sees its total, as `GET /v1/jobs/{name}` shows it.
pub(super) async fn limiters(
    State(state): AppState,
    caller: Caller,
) -> Result<Json<LimiterList>, ApiError> {
    let jobs: Vec<Arc<asyncd_spec::Job>> = state.routes.borrow().jobs().cloned().collect();
    let mut named = BTreeMap::new();
    for job in jobs {
        if job.limiters.is_empty()
            || !state
                .auth
                .allows(&caller, Verb::Get, Some(&job.name))
                .await?
        {
            continue;
        }
        for limiter in &job.limiters {
            named
                .entry(limiter.id.clone())
                .or_insert_with(|| limiter.clone());
        }
    }
    let mut limiters = Vec::with_capacity(named.len());
    for limiter in named.values() {
        limiters.push(limiter_usage(&state, limiter).await?);
    }
    Ok(Json(LimiterList { limiters }))
}

/// `limiter` with the attempts running now of every job that names it.
async fn limiter_usage(
    state: &ApiState,
    limiter: &asyncd_spec::Limiter,
) -> Result<LimiterUsage, ApiError> {
    Ok(LimiterUsage {
        name: limiter.id.clone(),
        concurrency: limiter.concurrency,
        rate_per_second: limiter.rate.map(|rate| rate.per_second),
        running: state.store.running_attempts(&limiter.task_types).await?,
        task_types: limiter.task_types.clone(),
    })
}

/// `GET /v1/jobs/{name}`.
pub(super) async fn get(
    State(state): AppState,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<JobOverview>, ApiError> {
    let job = named_job(&state, &caller, &name, Verb::Get).await?;
    let paused_at = paused_since(&state.store.paused_types().await?, &job.task_type);
    let now = state.clock.now_millis();
    let shares = live_shares(&state, now).await?;
    Ok(Json(
        job_overview(&state, &job, paused_at, &shares, now).await?,
    ))
}

/// The adaptive shares of the dispatchers alive at `now` (heartbeat within a member's
/// TTL, as membership counts them), summed by task type.
async fn live_shares(state: &ApiState, now: Millis) -> Result<BTreeMap<String, u64>, ApiError> {
    Ok(state
        .store
        .live_shares(now.saturating_sub(crate::dispatch::MEMBER_TTL))
        .await?)
}

/// Pauses the job's task type in the store, where every claim and attempt start of every
/// dispatcher checks it: once this answers, no attempt of the job begins.
pub(super) async fn pause(
    State(state): AppState,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<JobStatus>, ApiError> {
    let job = named_job(&state, &caller, &name, Verb::Pause).await?;
    let since = state
        .store
        .pause(&job.task_type, state.clock.now_millis())
        .await?;
    tracing::info!(caller = caller.name(), job = job.name, "job paused");
    Ok(Json(job_status(&job, Some(since))))
}

/// `POST /v1/jobs/{name}/resume`: lifts the API's pause (a pause in the job's config
/// stays).
pub(super) async fn resume(
    State(state): AppState,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<JobStatus>, ApiError> {
    let job = named_job(&state, &caller, &name, Verb::Pause).await?;
    if state.store.resume(&job.task_type).await? {
        tracing::info!(caller = caller.name(), job = job.name, "job resumed");
    }
    // The waiting tasks are due: a dispatcher in this process claims them now rather
    // than at its next poll.
    if let Some(waker) = &state.waker {
        waker.wake();
    }
    Ok(Json(job_status(&job, None)))
}

/// Fires a cron entry once, now: the task the scheduler would create for a firing due
/// at this instant, besides the schedule's own firings. Creating a task of the job needs
/// the right to submit to it.
pub(super) async fn trigger_cron(
    State(state): AppState,
    caller: Caller,
    Path((name, entry)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let job = named_job(&state, &caller, &name, Verb::Submit).await?;
    if !job.cron.iter().any(|c| c.name == entry)
        && state
            .store
            .get_schedule(&job.task_type, &entry)
            .await?
            .is_none()
    {
        let known: Vec<&str> = job.cron.iter().map(|c| c.name.as_str()).collect();
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!(
                "job {name:?} has no cron entry or schedule {entry:?} (its entries: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            ),
        )
        .with_field("entry"));
    }
    super::schedules::trigger_named(&state, &caller, &job, &entry).await
}

//! Publishes what is waiting in the store as gauges: pending tasks, the due backlog and
//! the oldest due task's age, per task type. The due figures are what autoscaling should
//! follow; raw queue depth also counts tasks that are not due yet. A paused job's tasks
//! count as pending but not as due backlog: no replica could start them, so the
//! autoscaler must not add replicas for them.
//!
//! Each job's figures are the jobs overview's counts ([`Store::job_counts`]): index
//! ranges of its own task type, each walked at most [`MAX_JOB_COUNT`] entries deep, so a
//! sample costs the same with a million tasks waiting as with a thousand — where counting
//! every waiting row of the table every two seconds, in every dispatcher, slowed the
//! claims it shares the database with. The gauges saturate there: 100 000 due (and
//! 200 000 pending) reads "at least", far above any autoscaling target. Only the task
//! types of configured jobs are sampled: a type no job names has no dispatcher to scale.
//!
//! Walking 100 000 entries still takes about half a second on PostgreSQL, so a pass that
//! takes long waits longer before the next: sampling spends at most [`DUTY`] of the time
//! (every 2 s while the backlog is small, about every 10 s under such a backlog — the
//! autoscaler looks every 15 s). Between full passes, a pass reads only the due figures
//! ([`Store::due_backlog`]), which cost nothing while nothing is due; the pending count,
//! which walks every task waiting for later, is refreshed at most [`PENDING_DUTY`] of the
//! time, and at most every [`MIN_PENDING_PAUSE`] intervals, once it reaches
//! [`CHEAP_PENDING`] (below that, every pass: the walk is short, and a pass slowed by load
//! says nothing about it). So an idle queue of a million future
//! tasks is not counted over and over: that walk was a third of an idle dispatcher's CPU
//! on PostgreSQL.
//!
//! A keyed job's keys, and a `spec.fairness` job's tenants, are counted on the passes
//! that count its pending tasks ([`Store::usage`], one grouped read over at most
//! [`MAX_JOB_COUNT`] of its active tasks each): the [`SERIES`] busiest each get their
//! series, and the rest are summed under `key="others"` / `tenant="others"`, so a job
//! with a key per merchant publishes at most eleven per state, never one per key.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use asyncd_contract::MAX_JOB_COUNT;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::job_table::Routes;
use crate::metrics::Metrics;
use asyncd_store::{DueBacklog, JobCountParams, Store, UsageBy, UsageCounts};
use prometheus::IntGaugeVec;

/// How many keys or tenants of a job get series of their own in `asyncd_key_tasks` and
/// `asyncd_tenant_tasks`.
const SERIES: usize = 10;

/// How many keys' or tenants' counts a pass reads: past the first [`SERIES`], what they
/// sum to under "others" (a job with more keys with work undercounts "others").
const USAGE_READ: u32 = 1_000;

/// The most of its time the sampler spends counting.
const DUTY: f64 = 0.05;

/// The longest wait between passes, in intervals: a pass slowed by a moment of load
/// must not leave the gauges stale for long.
const MAX_PAUSE: u32 = 5;

/// The most of its time the sampler spends on full passes, which count the tasks not
/// yet due as well: raw depth is for dashboards and a slow-growth alert over 30 minutes,
/// not for scaling, so it may be a minute or two old.
const PENDING_DUTY: f64 = 0.005;

/// The shortest wait between full passes once the walk is long, in intervals: even a
/// quick walk of 100 000 entries (10–40 ms on SQLite) every two seconds was half of an
/// idle `asyncd dev`'s CPU, for a figure no scaler reads.
const MIN_PENDING_PAUSE: u32 = 30;

/// The longest wait between full passes, in intervals.
const MAX_PENDING_PAUSE: u32 = 60;

/// A job with fewer tasks pending than this has them counted on every pass.
const CHEAP_PENDING: i64 = 10_000;

/// How long to wait after a pass that took `took`: `interval`, or longer so that
/// counting takes at most [`DUTY`] of the time, up to [`MAX_PAUSE`] intervals.
fn pause_after(took: Duration, interval: Duration) -> Duration {
    spaced(took, interval, DUTY, 1, MAX_PAUSE)
}

/// How long after a full pass that took `took` the next may begin.
fn full_pause_after(took: Duration, interval: Duration) -> Duration {
    spaced(
        took,
        interval,
        PENDING_DUTY,
        MIN_PENDING_PAUSE,
        MAX_PENDING_PAUSE,
    )
}

fn spaced(took: Duration, interval: Duration, duty: f64, least: u32, most: u32) -> Duration {
    (interval * least)
        .max(took.mul_f64((1.0 - duty) / duty))
        .min(interval * most)
}

pub async fn run(
    store: Arc<dyn Store>,
    routes: Routes,
    metrics: Arc<Metrics>,
    clock: SharedClock,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let cap = u32::try_from(MAX_JOB_COUNT).expect("the cap fits");
    // Each sampled type's last pending count.
    let mut seen: HashMap<String, i64> = HashMap::new();
    let mut tenants = Busiest::new(UsageBy::Tenant, metrics.tenant_tasks.clone());
    let mut keys = Busiest::new(UsageBy::Key, metrics.key_tasks.clone());
    let mut next_full = std::time::Instant::now();
    loop {
        let began = std::time::Instant::now();
        let full = began >= next_full;
        let now = clock.now_millis();
        let mut paused: HashSet<String> = match store.paused_types().await {
            Ok(pauses) => pauses.into_iter().map(|(task_type, _)| task_type).collect(),
            Err(err) => {
                tracing::debug!(%err, "could not read the paused jobs");
                HashSet::new()
            }
        };
        let (types, keyed, fair): (Vec<String>, HashSet<String>, HashSet<String>) = {
            let routes = routes.borrow();
            paused.extend(
                routes
                    .jobs()
                    .filter(|job| job.paused)
                    .map(|job| job.task_type.clone()),
            );
            let keyed = routes
                .jobs()
                .filter(|job| job.concurrency_key.is_some())
                .map(|job| job.task_type.clone())
                .collect();
            let fair = routes
                .jobs()
                .filter(|job| job.tenants().is_some())
                .map(|job| job.task_type.clone())
                .collect();
            (routes.task_types(), keyed, fair)
        };
        let mut current = HashMap::new();
        for task_type in types {
            let params = JobCountParams {
                task_type: &task_type,
                now,
                finished_since: now,
                cap,
            };
            // A job just configured gets its pending count at once.
            let counts = if full || seen.get(&task_type).is_none_or(|&p| p < CHEAP_PENDING) {
                store.job_counts(params).await.map(|counts| {
                    let backlog = DueBacklog {
                        due: counts.due,
                        oldest_due: counts.oldest_due,
                    };
                    (backlog, Some(counts.due + counts.scheduled))
                })
            } else {
                store
                    .due_backlog(params)
                    .await
                    .map(|backlog| (backlog, None))
            };
            let (backlog, pending) = match counts {
                Ok(counts) => counts,
                Err(err) => {
                    // Keeps the last figures rather than zeroing a backlog it could not read.
                    tracing::warn!(%err, task_type, "backlog counts failed");
                    if let Some(&pending) = seen.get(&task_type) {
                        current.insert(task_type, pending);
                    }
                    continue;
                }
            };
            let t = task_type.as_str();
            if let Some(pending) = pending {
                metrics.pending.with_label_values(&[t]).set(pending);
                if keyed.contains(t) {
                    keys.sample(store.as_ref(), t, now).await;
                }
                if fair.contains(t) {
                    tenants.sample(store.as_ref(), t, now).await;
                }
            }
            let pending = pending.or_else(|| seen.get(t).copied()).unwrap_or_default();
            let due = if paused.contains(t) { 0 } else { backlog.due };
            metrics.due_backlog.with_label_values(&[t]).set(due);
            let age = match backlog.oldest_due {
                Some(at) if due > 0 => now.since(at).as_secs_f64(),
                _ => 0.0,
            };
            metrics.oldest_due_age.with_label_values(&[t]).set(age);
            current.insert(task_type, pending);
        }
        for gone in seen.keys().filter(|t| !current.contains_key(*t)) {
            metrics.pending.with_label_values(&[gone]).set(0);
            metrics.due_backlog.with_label_values(&[gone]).set(0);
            metrics.oldest_due_age.with_label_values(&[gone]).set(0.0);
        }
        keys.keep_only(&keyed);
        tenants.keep_only(&fair);
        seen = current;
        if full {
            next_full = began + full_pause_after(began.elapsed(), interval);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(pause_after(began.elapsed(), interval)) => {}
        }
    }
}

/// A keyed job's busiest keys, or a fair job's busiest tenants, each as series of its own
/// in one gauge, the rest summed as "others".
struct Busiest {
    by: UsageBy,
    gauge: IntGaugeVec,
    /// The keys or tenants each type has series for.
    published: HashMap<String, Vec<String>>,
}

impl Busiest {
    fn new(by: UsageBy, gauge: IntGaugeVec) -> Self {
        Self {
            by,
            gauge,
            published: HashMap::new(),
        }
    }

    /// Sets `task_type`'s series from a fresh count, and drops those of the keys or
    /// tenants that left the top: none keeps its last figures.
    async fn sample(&mut self, store: &dyn Store, task_type: &str, now: asyncd_store::Millis) {
        let usage = match store
            .usage(task_type, self.by, now, MAX_JOB_COUNT, USAGE_READ)
            .await
        {
            Ok(usage) => usage,
            Err(err) => {
                tracing::warn!(%err, task_type, by = ?self.by, "usage counts failed");
                return;
            }
        };
        let now: Vec<String> = top(usage)
            .into_iter()
            .map(|(of, running, due)| {
                // A fair job's key is `tenant␟key`: the label shows the separator as the
                // symbol for it, not as a control character.
                let of = of.replace(asyncd_spec::TENANT_SEPARATOR, "\u{241f}");
                for (state, n) in [("running", running), ("due", due)] {
                    self.gauge
                        .with_label_values(&[task_type, &of, state])
                        .set(i64::try_from(n).unwrap_or(i64::MAX));
                }
                of
            })
            .collect();
        let before = self.published.insert(task_type.to_string(), now);
        self.remove(task_type, before.unwrap_or_default());
    }

    /// Drops every series of the types not in `types` (no longer keyed, or fair).
    fn keep_only(&mut self, types: &HashSet<String>) {
        let gone: Vec<String> = self
            .published
            .keys()
            .filter(|t| !types.contains(*t))
            .cloned()
            .collect();
        for task_type in gone {
            let before = self.published.remove(&task_type).unwrap_or_default();
            self.remove(&task_type, before);
        }
    }

    /// Drops the series of `before` that `task_type` no longer publishes.
    fn remove(&self, task_type: &str, before: Vec<String>) {
        let now = self.published.get(task_type);
        for of in before {
            if now.is_some_and(|now| now.contains(&of)) {
                continue;
            }
            for state in ["running", "due"] {
                let _ = self.gauge.remove_label_values(&[task_type, &of, state]);
            }
        }
    }
}

/// The [`SERIES`] busiest of `usage` (busiest first, as the store answers), then the rest
/// summed as "others" when there are any: `(key or tenant, running, due)`.
fn top(usage: Vec<UsageCounts>) -> Vec<(String, u64, u64)> {
    let mut rest = (0, 0);
    let mut top = Vec::with_capacity(SERIES + 1);
    for (i, u) in usage.into_iter().enumerate() {
        if i < SERIES {
            top.push((u.of, u.running, u.due));
        } else {
            rest = (rest.0 + u.running, rest.1 + u.due);
        }
    }
    if rest != (0, 0) {
        top.push(("others".to_string(), rest.0, rest.1));
    }
    top
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_get_series_and_the_rest_are_summed() {
        let usage: Vec<UsageCounts> = (0..13)
            .map(|i| UsageCounts {
                of: format!("t{i:02}"),
                running: 13 - i,
                due: 1,
            })
            .collect();
        let top = top(usage.clone());
        assert_eq!(top.len(), SERIES + 1);
        assert_eq!(top[0], ("t00".to_string(), 13, 1));
        assert_eq!(top[SERIES], ("others".to_string(), 3 + 2 + 1, 3));
        let few = super::top(usage[..2].to_vec());
        assert_eq!(few.len(), 2, "no others while each has its own: {few:?}");
    }

    #[test]
    fn a_slow_pass_spaces_out_the_next() {
        let interval = Duration::from_secs(2);
        assert_eq!(pause_after(Duration::from_millis(30), interval), interval);
        assert_eq!(
            pause_after(Duration::from_millis(500), interval),
            Duration::from_millis(9_500),
            "half a second of counting in every ten"
        );
        assert_eq!(
            pause_after(Duration::from_secs(3), interval),
            Duration::from_secs(10),
            "never staler than five intervals"
        );
    }

    #[test]
    fn the_pending_count_is_refreshed_at_a_much_lower_duty() {
        let interval = Duration::from_secs(2);
        assert_eq!(
            full_pause_after(Duration::from_millis(5), interval),
            Duration::from_secs(60),
            "a quick walk: still not more often than every 30 intervals"
        );
        assert_eq!(
            full_pause_after(Duration::from_millis(500), interval),
            Duration::from_millis(99_500),
            "half a second of counting in every hundred"
        );
        assert_eq!(
            full_pause_after(Duration::from_secs(3), interval),
            Duration::from_secs(120),
            "never staler than two minutes"
        );
    }
}

//! The cron scheduler: makes sure each upcoming firing of every job's cron entries
//! exists as a store row before it is due.
//!
//! Stateless by design (the reference system's idea): a firing's identity is
//! `task_type/entry name/UTC millis`, held by a unique constraint, so any number of
//! schedulers can run at once and each firing is created exactly once.
//!
//! A scheduler that could not create firings for a while (the store was down) catches
//! up on the ones it missed, at most the entry's `catchUp` back (default an hour; none
//! with "0s"); they run at once. A scheduler starting fresh does not back-fill: it
//! begins with the next firing.
//!
//! Per entry: `paused` creates nothing (and forgets where the entry was, so a resumed
//! entry starts with its next firing instead of catching up); `overlap: Skip` gives each
//! firing the entry's unique key, so a firing whose predecessor has not finished is
//! refused by the store and skipped — which is why such firings are created only when
//! due (within one pass), not a horizon ahead.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use asyncd_spec::Job;
use asyncd_spec::job::CronEntry;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::dispatch::ClaimerWakeup;
use crate::job_table::Routes;
use crate::test_hooks::{Signal, TestSignals, emit};
use asyncd_spec::job::Overlap;
use asyncd_store::{InsertOutcome, Millis, NewTask, Store};

pub struct Scheduler {
    pub store: Arc<dyn Store>,
    pub routes: Routes,
    pub clock: SharedClock,
    pub waker: Option<ClaimerWakeup>,
    /// Firings up to this far ahead are created on each pass (at least the next one).
    pub horizon: Duration,
    pub interval: Duration,
    /// Per (task type, entry, schedule text): the latest firing known to exist, so a
    /// pass only writes what is new.
    pub created: HashMap<(String, String, String), Millis>,
    /// Test-only event hooks.
    pub signals: Option<TestSignals>,
}

impl Scheduler {
    pub fn new(
        store: Arc<dyn Store>,
        routes: Routes,
        clock: SharedClock,
        waker: Option<ClaimerWakeup>,
    ) -> Self {
        Self {
            store,
            routes,
            clock,
            waker,
            horizon: Duration::from_secs(60),
            interval: Duration::from_secs(1),
            created: HashMap::new(),
            signals: None,
        }
    }

    pub async fn run(mut self, shutdown: CancellationToken) {
        loop {
            match self.schedule_once().await {
                Ok(created) => emit(&self.signals, || Signal::Scheduled {
                    created: created.len(),
                    at: self.clock.now_millis(),
                }),
                Err(err) => tracing::warn!(%err, "cron pass failed"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }

    /// One pass over every cron entry; returns the firings this pass inserted.
    pub async fn schedule_once(&mut self) -> asyncd_store::Result<Vec<NewTask>> {
        let now_ms = self.clock.now_millis();
        let now = crate::clock::from_millis(now_ms);
        let horizon = now_ms + self.horizon;
        let routes = self.routes.borrow().clone();
        let mut firings = Vec::new();
        let mut latest = Vec::new();
        for job in routes.jobs() {
            for entry in &job.cron {
                let key = (
                    job.task_type.clone(),
                    entry.name.clone(),
                    entry.schedule.as_str().to_string(),
                );
                if entry.paused {
                    self.created.remove(&key);
                    continue;
                }
                let skip_overlap = entry.overlap == Overlap::Skip;
                // Whether a firing is skipped is decided by the store when it is
                // inserted, so that must happen when it is due, not a horizon ahead.
                let entry_horizon = if skip_overlap {
                    now_ms + self.interval
                } else {
                    horizon
                };
                // Continue after the last firing this scheduler created (within the
                // catch-up window, so an outage loses nothing); a fresh one starts now.
                let known = self.created.get(&key).copied();
                let mut after = known
                    .map(|at| {
                        crate::clock::from_millis(at.max(now_ms.saturating_sub(entry.catch_up)))
                    })
                    .unwrap_or(now);
                let mut last = None;
                while let Some(next) = entry.schedule.next_after(after) {
                    let at = Millis::from(next);
                    // Always the next firing (unless it may be skipped), then every one
                    // within the horizon.
                    let next_exists = known.into_iter().chain(last).any(|t| t > now_ms);
                    if at > entry_horizon && (next_exists || skip_overlap) {
                        break;
                    }
                    firings.push(firing(
                        job,
                        entry,
                        at,
                        Some(format!("{}/{}/{at}", job.task_type, entry.name)),
                    ));
                    last = Some(at);
                    after = next;
                }
                if let Some(at) = last {
                    latest.push((key, at));
                }
            }
        }
        if firings.is_empty() {
            return Ok(firings);
        }
        let outcomes = self.store.insert(&firings, now_ms).await?;
        for (key, at) in latest {
            self.created.insert(key, at);
        }
        let soon = firings
            .iter()
            .any(|f| f.trigger_at <= now_ms + Duration::from_secs(5));
        if soon && let Some(waker) = &self.waker {
            waker.wake();
        }
        Ok(firings
            .into_iter()
            .zip(outcomes)
            .filter_map(|(firing, outcome)| match outcome {
                InsertOutcome::Inserted { .. } => Some(firing),
                InsertOutcome::UniqueConflict { existing_id } => {
                    tracing::info!(
                        task_type = firing.task_type,
                        firing = firing.cron_key,
                        running = existing_id,
                        "cron firing skipped: the entry skips overlaps and its previous firing has not finished"
                    );
                    None
                }
                _ => None,
            })
            .collect())
    }
}

/// The task a firing of `entry` at `at` is: the entry's payload and priority, the job's
/// retries and timeout. `cron_key` is a scheduled firing's identity, which makes it
/// exactly-once; a firing triggered through the API has none, so it never takes the place
/// of the scheduled firing of the same instant.
pub fn firing(job: &Job, entry: &CronEntry, at: Millis, cron_key: Option<String>) -> NewTask {
    let payload =
        RawValue::from_string(entry.payload.to_string()).expect("a JSON value prints as JSON");
    NewTask {
        id: uuid::Uuid::now_v7().to_string(),
        task_type: job.task_type.clone(),
        payload,
        priority: entry.priority,
        trigger_at: at,
        max_retries: job.max_retries,
        timeout_ms: job.timeout.as_millis() as i64,
        idempotency_key: None,
        // One key for every firing of an entry that skips overlaps: the store refuses a
        // firing while the previous one holds it (unfinished).
        unique_key: (entry.overlap == Overlap::Skip)
            .then(|| format!("cron:{}/{}", job.task_type, entry.name)),
        // Held only while unfinished, whatever the job's `retention.uniqueKeys`: the
        // next firing must not be skipped for one that already finished.
        unique_for: Duration::ZERO,
        cron_key,
        depends_on: Vec::new(),
        source_service: Some("asyncd-scheduler".into()),
        // A payload the job's template cannot fill (the entry or the template changed
        // since the config was checked) leaves the firing keyless: it is claimed as the
        // keyless tasks' own key rather than lost.
        concurrency_key: job.render_concurrency_key(&entry.payload).ok().flatten(),
        trace: None,
        expires_at: job.start_within.map(|within| at + within),
        // Each firing is its own: a job's debounce or throttle is for its submits.
        window: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::job_table::{RouteTable, fixed};
    use asyncd_spec::AsyncJobConfig;
    use chrono::{DateTime, Utc};

    fn utc(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn routes(schedule: &str) -> Routes {
        entry_routes(schedule, "")
    }

    /// One job with one cron entry `nightly`; `policy` adds lines to the entry.
    fn entry_routes(schedule: &str, policy: &str) -> Routes {
        let yaml = format!(
            "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata: {{name: j}}\n\
             spec:\n  taskType: report\n  executor: {{url: 'http://127.0.0.1:1/'}}\n  \
             cron:\n    - name: nightly\n      schedule: \"{schedule}\"\n{policy}"
        );
        let (_, job) = AsyncJobConfig::from_yaml(&yaml).unwrap();
        fixed(RouteTable::from_jobs([job]))
    }

    async fn store(dir: &tempfile::TempDir) -> Arc<dyn Store> {
        let url = format!("sqlite://{}/cron.db", dir.path().display());
        let store = asyncd_store::open(&url).await.unwrap();
        store.migrate().await.unwrap();
        store
    }

    fn scheduler(store: &Arc<dyn Store>, routes: &Routes, clock: &Arc<ManualClock>) -> Scheduler {
        Scheduler::new(store.clone(), routes.clone(), clock.clone(), None)
    }

    /// The job's tasks waiting in the store at `now`, due or not.
    async fn waiting(store: &Arc<dyn Store>, now: DateTime<Utc>) -> i64 {
        let counts = store
            .job_counts(asyncd_store::JobCountParams {
                task_type: "report",
                now: Millis::from(now),
                finished_since: Millis::from(now),
                cap: 1_000,
            })
            .await
            .unwrap();
        counts.due + counts.scheduled
    }

    fn times(firings: &[NewTask]) -> Vec<DateTime<Utc>> {
        firings
            .iter()
            .map(|f| crate::clock::from_millis(f.trigger_at))
            .collect()
    }

    #[tokio::test]
    async fn firings_follow_the_zone_through_both_dst_changes() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let routes = routes("CRON_TZ=Europe/Berlin 30 2 * * *");
        let clock = ManualClock::at(utc("2026-03-28T12:00:00Z"));
        let mut s = scheduler(&store, &routes, &clock);

        // Spring forward: 02:30 does not exist on 29 March; the firing is at 03:00 CEST.
        assert_eq!(
            times(&s.schedule_once().await.unwrap()),
            [utc("2026-03-29T01:00:00Z")]
        );
        assert!(
            s.schedule_once().await.unwrap().is_empty(),
            "already created"
        );
        clock.set(utc("2026-03-29T01:00:01Z"));
        assert_eq!(
            times(&s.schedule_once().await.unwrap()),
            [utc("2026-03-30T00:30:00Z")]
        );

        // Fall back: 02:30 happens twice on 25 October; it fires on the first pass only.
        clock.set(utc("2026-10-24T12:00:00Z"));
        assert_eq!(
            times(&s.schedule_once().await.unwrap()),
            [utc("2026-10-25T00:30:00Z")]
        );
        clock.set(utc("2026-10-25T01:10:00Z")); // inside the second pass
        assert_eq!(
            times(&s.schedule_once().await.unwrap()),
            [utc("2026-10-26T01:30:00Z")]
        );

        assert_eq!(
            waiting(&store, utc("2026-10-27T00:00:00Z")).await,
            4,
            "four firings, one row each"
        );
    }

    /// Passes that could not write (a store outage) are passes that did not happen: the
    /// next one creates every firing since the last it wrote, then the horizon as usual.
    #[tokio::test]
    async fn firings_missed_during_an_outage_are_caught_up() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let routes = routes("CRON_TZ=UTC */10 * * * * *");
        let start = utc("2026-11-30T00:00:00Z");
        let clock = ManualClock::at(start);
        let mut s = scheduler(&store, &routes, &clock);
        assert_eq!(
            s.schedule_once().await.unwrap().len(),
            6,
            "the 60 s horizon"
        );
        clock.set(start + chrono::Duration::minutes(5));
        let caught_up = times(&s.schedule_once().await.unwrap());
        let expected: Vec<_> = (7..=36)
            .map(|i| start + chrono::Duration::seconds(i * 10))
            .collect();
        assert_eq!(caught_up, expected, "00:01:10 through 00:06:00");

        // Beyond the window only the last hour is created.
        clock.set(start + chrono::Duration::hours(3));
        let late = times(&s.schedule_once().await.unwrap());
        assert_eq!(
            late.first(),
            Some(&(start + chrono::Duration::seconds(2 * 3600 + 10)))
        );
        assert_eq!(late.len(), 360 + 6);
    }

    /// Issue 15, cron policies: `catchUp: 0s` creates none of the firings an outage
    /// missed, only what is ahead.
    #[tokio::test]
    async fn an_entry_without_catch_up_skips_what_an_outage_missed() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let routes = entry_routes("CRON_TZ=UTC */10 * * * * *", "      catchUp: 0s\n");
        let start = utc("2026-11-30T00:00:00Z");
        let clock = ManualClock::at(start);
        let mut s = scheduler(&store, &routes, &clock);
        assert_eq!(s.schedule_once().await.unwrap().len(), 6);
        clock.set(start + chrono::Duration::minutes(5));
        let after = times(&s.schedule_once().await.unwrap());
        let expected: Vec<_> = (31..=36)
            .map(|i| start + chrono::Duration::seconds(i * 10))
            .collect();
        assert_eq!(after, expected, "only 00:05:10 through 00:06:00");
    }

    /// Issue 15, cron policies: a paused entry creates nothing, and once resumed starts
    /// with its next firing rather than catching up on the pause.
    #[tokio::test]
    async fn a_paused_entry_creates_nothing_and_resumes_without_catching_up() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let start = utc("2026-11-30T00:00:00Z");
        let clock = ManualClock::at(start);
        let running = routes("CRON_TZ=UTC */10 * * * * *");
        let mut s = scheduler(&store, &running, &clock);
        assert_eq!(s.schedule_once().await.unwrap().len(), 6);
        let paused = entry_routes("CRON_TZ=UTC */10 * * * * *", "      paused: true\n");
        s.routes = paused;
        clock.set(start + chrono::Duration::minutes(5));
        assert!(s.schedule_once().await.unwrap().is_empty(), "paused");
        s.routes = running;
        clock.set(start + chrono::Duration::minutes(10));
        let resumed = times(&s.schedule_once().await.unwrap());
        assert_eq!(
            resumed.first(),
            Some(&(start + chrono::Duration::seconds(610))),
            "the next firing after the resume, none from the pause"
        );
    }

    /// Issue 15, cron policies: with `overlap: Skip` a firing is created when due, and
    /// skipped while the previous firing has not finished.
    #[tokio::test]
    async fn an_entry_that_skips_overlaps_skips_while_the_previous_runs() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let routes = entry_routes("CRON_TZ=UTC */10 * * * * *", "      overlap: Skip\n");
        let start = utc("2026-11-30T00:00:09.500Z");
        let clock = ManualClock::at(start);
        let mut s = scheduler(&store, &routes, &clock);
        let first = s.schedule_once().await.unwrap();
        assert_eq!(
            times(&first),
            [utc("2026-11-30T00:00:10Z")],
            "only the one due within a pass"
        );
        clock.set(utc("2026-11-30T00:00:19.500Z"));
        assert!(
            s.schedule_once().await.unwrap().is_empty(),
            "00:00:20 skipped: 00:00:10 has not finished"
        );
        let now = Millis::from(utc("2026-11-30T00:00:25Z"));
        assert_eq!(
            store.cancel(&first[0].id, now).await.unwrap(),
            asyncd_store::CancelOutcome::Cancelled
        );
        clock.set(utc("2026-11-30T00:00:29.500Z"));
        assert_eq!(
            times(&s.schedule_once().await.unwrap()),
            [utc("2026-11-30T00:00:30Z")],
            "the previous one finished"
        );
    }

    #[tokio::test]
    async fn several_schedulers_create_each_firing_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let routes = routes("CRON_TZ=Asia/Singapore */5 * * * * *");
        let clock = ManualClock::at(utc("2026-11-30T00:00:00Z"));
        let mut a = scheduler(&store, &routes, &clock);
        let mut b = scheduler(&store, &routes, &clock);
        let mut created = Vec::new();
        for step in 0..30 {
            clock.set(utc("2026-11-30T00:00:00Z") + chrono::Duration::seconds(step * 7));
            created.extend(times(&a.schedule_once().await.unwrap()));
            created.extend(times(&b.schedule_once().await.unwrap()));
        }
        let mut unique = created.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), created.len(), "no firing created twice");
        // Every 5 s from 00:00:05 through the horizon (60 s) past the last step (203 s).
        let expected: Vec<_> = (1..=52)
            .map(|i| utc("2026-11-30T00:00:00Z") + chrono::Duration::seconds(i * 5))
            .collect();
        assert_eq!(unique, expected);
        assert_eq!(
            waiting(&store, utc("2026-11-30T00:10:00Z")).await,
            52,
            "one row per firing in the store"
        );
    }
}

//! The scheduler: fires the schedules held in the store — the API's `/v1/schedules` and
//! every job's `spec.cron` entries, which it writes there as schedules of their own
//! ([`Store::sync_config_schedules`]) — so that each firing exists as a task before it
//! is due.
//!
//! Any number of schedulers can run at once: a pass takes the schedules due to be looked
//! at (`wake_at`), passing over those another scheduler holds, and in one transaction
//! creates their firings and writes where each stands ([`Store::fire_schedules`]). A
//! firing's identity is `task_type/schedule name/UTC millis`, held by a unique
//! constraint, so each is created once.
//!
//! Firings of a schedule that allows overlaps are created up to the horizon (60 s)
//! ahead; the others when due, within one pass, because whether such a firing is
//! skipped, held back or cancels the previous one is decided as it is created
//! ([`plan::Leads`]). Firings missed while no scheduler could write (an outage) are
//! caught up at most the schedule's `catchUp` back (default an hour; none with "0s");
//! they run at once. A schedule new, changed, or resumed from a pause starts with its
//! next firing.

pub mod plan;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use asyncd_store::{ConfigSchedule, FireParams, FiringOutcome, NewTask, ScheduleRecord, Store};
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::dispatch::ClaimerWakeup;
use crate::job_table::{RouteTable, Routes};
use crate::test_hooks::{Signal, TestSignals, emit};
pub use plan::{firing, triggered};

/// The most schedules one transaction of a pass takes: a pass of a million schedules
/// due at once is many short transactions, each holding its rows briefly.
pub const FIRE_BATCH: u32 = 500;
/// The most transactions one pass runs, so a pass ends (and sees shutdown) within
/// seconds however many schedules are due; the next pass goes on.
const BATCHES_PER_PASS: usize = 200;

pub struct Scheduler {
    pub store: Arc<dyn Store>,
    pub routes: Routes,
    pub clock: SharedClock,
    pub waker: Option<ClaimerWakeup>,
    /// Firings of schedules that allow overlaps are created this far ahead.
    pub horizon: Duration,
    pub interval: Duration,
    /// Per task type, the config schedules last written to the store, so a pass writes
    /// only what changed.
    synced: HashMap<String, Vec<ConfigSchedule>>,
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
            synced: HashMap::new(),
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
                Err(err) => tracing::warn!(%err, "schedule pass failed"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }

    /// One pass: the config's cron entries written to the store if they changed, then
    /// every schedule due fired; returns the firings this pass created.
    pub async fn schedule_once(&mut self) -> asyncd_store::Result<Vec<NewTask>> {
        let now = self.clock.now_millis();
        let routes = self.routes.borrow().clone();
        self.sync_config(&routes, now).await?;
        let leads = plan::Leads {
            horizon: self.horizon,
            pass: self.interval,
        };
        let planner = |row: &ScheduleRecord| plan::plan(&routes, row, now, leads);
        let mut created = Vec::new();
        for _ in 0..BATCHES_PER_PASS {
            let pass = self
                .store
                .fire_schedules(
                    FireParams {
                        now,
                        wake_by: now,
                        limit: FIRE_BATCH,
                    },
                    &planner,
                )
                .await?;
            for fired in pass.fired {
                match fired.outcome {
                    FiringOutcome::Created { .. } | FiringOutcome::Replaced { .. } => {
                        if let FiringOutcome::Replaced { cancelled, .. } = &fired.outcome {
                            tracing::info!(
                                task_type = fired.task_type,
                                schedule = fired.name,
                                cancelled,
                                "schedule firing cancelled the previous one (overlap: CancelOther)"
                            );
                        }
                        created.push(fired.task);
                    }
                    FiringOutcome::Existed { .. } => {}
                    FiringOutcome::Skipped { running } => tracing::info!(
                        task_type = fired.task_type,
                        schedule = fired.name,
                        firing = fired.task.cron_key,
                        running,
                        "schedule firing skipped: the previous one has not finished"
                    ),
                    FiringOutcome::Buffered { running } => tracing::debug!(
                        task_type = fired.task_type,
                        schedule = fired.name,
                        firing = fired.task.cron_key,
                        running,
                        "schedule firing held back until the previous one finishes"
                    ),
                    FiringOutcome::Refused { reason } => tracing::warn!(
                        task_type = fired.task_type,
                        schedule = fired.name,
                        firing = fired.task.cron_key,
                        reason,
                        "the store refused a schedule firing"
                    ),
                }
            }
            if pass.schedules < FIRE_BATCH as usize {
                break;
            }
        }
        let soon = created
            .iter()
            .any(|f| f.trigger_at <= now + Duration::from_secs(5));
        if soon && let Some(waker) = &self.waker {
            waker.wake();
        }
        Ok(created)
    }

    /// Writes each job's cron entries to the store as its config schedules, where they
    /// differ from what this scheduler last wrote.
    async fn sync_config(
        &mut self,
        routes: &RouteTable,
        now: asyncd_store::Millis,
    ) -> asyncd_store::Result<()> {
        for job in routes.jobs() {
            let entries: Vec<ConfigSchedule> = job
                .cron
                .iter()
                .map(|entry| ConfigSchedule {
                    name: entry.name.clone(),
                    spec: serde_json::to_string(&entry.to_spec())
                        .expect("a schedule spec serialises"),
                    paused: entry.paused,
                })
                .collect();
            let known = self.synced.get(&job.task_type);
            if known.is_some_and(|known| same(known, &entries)) {
                continue;
            }
            self.store
                .sync_config_schedules(&job.task_type, &entries, now)
                .await?;
            self.synced.insert(job.task_type.clone(), entries);
        }
        Ok(())
    }
}

fn same(a: &[ConfigSchedule], b: &[ConfigSchedule]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(a, b)| a.name == b.name && a.spec == b.spec && a.paused == b.paused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::job_table::{RouteTable, fixed};
    use asyncd_spec::AsyncJobConfig;
    use asyncd_store::Millis;
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

    /// The next firing the store holds for the entry `nightly`, not yet created.
    async fn next_firing(store: &Arc<dyn Store>) -> Option<DateTime<Utc>> {
        let row = store
            .get_schedule("report", "nightly")
            .await
            .unwrap()
            .unwrap();
        row.next_at.map(crate::clock::from_millis)
    }

    #[tokio::test]
    async fn firings_follow_the_zone_through_both_dst_changes() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let routes = routes("CRON_TZ=Europe/Berlin 30 2 * * *");
        let clock = ManualClock::at(utc("2026-03-28T12:00:00Z"));
        let mut s = scheduler(&store, &routes, &clock);

        // Spring forward: 02:30 does not exist on 29 March; the firing is at 03:00 CEST.
        assert!(s.schedule_once().await.unwrap().is_empty(), "13 h ahead");
        assert_eq!(next_firing(&store).await, Some(utc("2026-03-29T01:00:00Z")));
        clock.set(utc("2026-03-29T00:59:30Z"));
        assert_eq!(
            times(&s.schedule_once().await.unwrap()),
            [utc("2026-03-29T01:00:00Z")],
            "within the horizon"
        );
        assert!(
            s.schedule_once().await.unwrap().is_empty(),
            "already created"
        );
        assert_eq!(next_firing(&store).await, Some(utc("2026-03-30T00:30:00Z")));

        // Fall back: 02:30 happens twice on 25 October; it fires on the first pass only.
        clock.set(utc("2026-10-25T00:29:30Z"));
        assert_eq!(
            times(&s.schedule_once().await.unwrap()),
            [utc("2026-10-25T00:30:00Z")]
        );
        clock.set(utc("2026-10-25T01:29:30Z")); // 02:29:30 of the second pass
        assert!(
            s.schedule_once().await.unwrap().is_empty(),
            "no second firing of 02:30"
        );
        assert_eq!(next_firing(&store).await, Some(utc("2026-10-26T01:30:00Z")));
        clock.set(utc("2026-10-26T01:29:30Z"));
        assert_eq!(
            times(&s.schedule_once().await.unwrap()),
            [utc("2026-10-26T01:30:00Z")]
        );

        assert_eq!(
            waiting(&store, utc("2026-10-27T00:00:00Z")).await,
            3,
            "three firings created, one row each (the jump to October passed 30 March)"
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

    /// An API schedule takes the same firing code: a cron in New York's zone through
    /// spring forward (02:30 does not exist on 14 March 2027: 03:00 EDT) and fall back
    /// (01:30 happens twice on 7 November 2027: the first), with jitter held to its bound.
    #[tokio::test]
    async fn an_api_schedule_follows_its_zone_through_both_dst_changes() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(&dir).await;
        let routes = routes("CRON_TZ=UTC 0 0 1 1 *");
        let clock = ManualClock::at(utc("2027-03-13T12:00:00Z"));
        let mut s = scheduler(&store, &routes, &clock);
        let put = |name: &'static str, spec: &'static str| asyncd_store::PutSchedule {
            task_type: "report",
            name,
            source: asyncd_store::ScheduleSource::Api,
            spec,
            paused: false,
            now: Millis::from(utc("2027-03-13T12:00:00Z")),
        };
        store
            .create_schedule(put(
                "spring",
                r#"{"cron":"CRON_TZ=America/New_York 30 2 * * *"}"#,
            ))
            .await
            .unwrap()
            .unwrap();
        store
            .create_schedule(put(
                "fall",
                r#"{"cron":"CRON_TZ=America/New_York 30 1 7 11 *","jitter":"10s"}"#,
            ))
            .await
            .unwrap()
            .unwrap();
        assert!(s.schedule_once().await.unwrap().is_empty(), "planned only");
        clock.set(utc("2027-03-14T06:59:30Z"));
        assert_eq!(
            times(&s.schedule_once().await.unwrap()),
            [utc("2027-03-14T07:00:00Z")],
            "03:00 EDT, right after the gap"
        );
        clock.set(utc("2027-11-07T05:29:30Z"));
        let fall = s.schedule_once().await.unwrap();
        let [firing] = fall.as_slice() else {
            panic!("{fall:?}");
        };
        assert_eq!(
            firing.cron_key.as_deref(),
            Some(format!("report/fall/{}", Millis::from(utc("2027-11-07T05:30:00Z"))).as_str()),
            "01:30 EDT, the first pass"
        );
        let jitter =
            firing.trigger_at.as_i64() - Millis::from(utc("2027-11-07T05:30:00Z")).as_i64();
        assert!((0..10_000).contains(&jitter), "jitter {jitter} ms");
        clock.set(utc("2027-11-07T06:29:30Z")); // 01:29:30 EST, the second pass
        assert!(
            s.schedule_once().await.unwrap().iter().all(|f| !f
                .cron_key
                .as_deref()
                .unwrap_or("")
                .contains("/fall/")),
            "no second 01:30"
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

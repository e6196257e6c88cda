//! How many tasks of each job a dispatcher may hold (claimed into its heap, queued for
//! the job's runner, or running), so a slow or stalled executor — or a dispatcher or
//! store that cannot begin attempts fast enough — stops the claimer instead of filling
//! memory with claims that lapse before they can start.
//!
//! A job may hold its `concurrency` in flight plus as many waiting as it can begin within
//! half the claim hold at the rate it has been beginning attempts: a waiting claim then
//! starts well before the rescuer would take it back, so claims do not churn. The rate
//! is measured over windows of a quarter second or more in which attempts began; before
//! the first, `concurrency / timeout` (the slowest the executor may be) stands in. A
//! burst after an idle spell ramps up quickly: after each window the room allows half a
//! hold's worth of what that window's rate begins. An executor that takes 20 s at concurrency 1 gets
//! one task at a time; a fast one with a dispatcher beginning 10 000 a second gets some
//! 150 000 with the default 30 s hold. Kafka adoption may overshoot the room: a task
//! read from a partition is adopted whatever this says, since leaving it would stall the
//! partition.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a window of beginnings must last before it counts: long enough that a
/// batch of beginnings (a runner begins up to 256 in one store round trip) is not taken
/// for a rate, short enough that a burst due at once is claimed ahead after a quarter
/// second at the cold guess rather than a whole one (measured: 10 000 tasks due in the
/// same second, p99 lateness 1.83 s with one-second windows, 1.30 s with these).
const WINDOW: Duration = Duration::from_millis(250);

/// Weight of the newest window in the rate (a moving average), so one odd window does
/// not swing it.
const RATE_WEIGHT: f64 = 0.5;

#[derive(Debug, Default)]
pub struct Holdings {
    jobs: HashMap<String, JobHolding>,
}

#[derive(Debug, Default)]
struct JobHolding {
    held: usize,
    /// Attempts begun per second, once a window has been measured.
    rate: Option<f64>,
    /// The current window: when it began and how many attempts began in it.
    window: Option<(Instant, usize)>,
    /// The claimer found no room; the next task to leave should wake it.
    full: bool,
}

/// What the claimer needs to know about a job to size its room.
#[derive(Debug, Clone, Copy)]
pub struct JobLimits {
    pub concurrency: u32,
    pub timeout: Duration,
    /// `rateLimit.perSecond`: no dispatcher begins attempts faster, so neither is its
    /// rate taken to be faster, measured or not.
    pub per_second: Option<u32>,
}

impl Holdings {
    /// Tasks of `task_type` came into the dispatcher (claimed or adopted).
    pub fn add(&mut self, task_type: &str, count: usize) {
        let job = self.jobs.entry(task_type.to_string()).or_default();
        job.held = job.held.saturating_add(count);
    }

    /// Tasks of `task_type` left the dispatcher (finished, released, or dropped to their
    /// leases). True when the claimer had found the job full, so it should look again.
    pub fn remove(&mut self, task_type: &str, count: usize) -> bool {
        let Some(job) = self.jobs.get_mut(task_type) else {
            return false;
        };
        job.held = job.held.saturating_sub(count);
        std::mem::take(&mut job.full)
    }

    /// `count` attempts of `task_type` began at `at`.
    pub fn began(&mut self, task_type: &str, count: usize, at: Instant) {
        let job = self.jobs.entry(task_type.to_string()).or_default();
        let (since, begun) = job.window.get_or_insert((at, 0));
        *begun += count;
        let elapsed = at.saturating_duration_since(*since);
        if elapsed >= WINDOW {
            let measured = *begun as f64 / elapsed.as_secs_f64();
            job.rate = Some(match job.rate {
                None => measured,
                Some(rate) => rate * (1.0 - RATE_WEIGHT) + measured * RATE_WEIGHT,
            });
            job.window = Some((at, 0));
        }
    }

    /// How many more tasks of `task_type` the claimer may take now; when none, the job is
    /// marked full so that the next task to leave wakes the claimer.
    pub fn room(&mut self, task_type: &str, limits: JobLimits, hold: Duration) -> usize {
        let job = self.jobs.entry(task_type.to_string()).or_default();
        let rate = job.rate.unwrap_or_else(|| {
            f64::from(limits.concurrency.max(1)) / limits.timeout.as_secs_f64().max(1e-3)
        });
        let rate = limits
            .per_second
            .map_or(rate, |limit| rate.min(f64::from(limit)));
        let room = capacity(limits.concurrency, hold, rate).saturating_sub(job.held);
        job.full = room == 0;
        room
    }

    pub fn held(&self, task_type: &str) -> usize {
        self.jobs.get(task_type).map_or(0, |job| job.held)
    }
}

/// `concurrency` in flight plus what begins within half of `hold` at `rate` per second.
pub fn capacity(concurrency: u32, hold: Duration, rate: f64) -> usize {
    let waiting = rate.max(0.0) * hold.as_secs_f64() / 2.0;
    // Saturating float-to-int casts: an absurd rate must not overflow.
    (concurrency.max(1) as usize).saturating_add(waiting.floor() as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Duration = Duration::from_secs(30);

    fn limits(concurrency: u32, timeout_s: u64) -> JobLimits {
        JobLimits {
            concurrency,
            timeout: Duration::from_secs(timeout_s),
            per_second: None,
        }
    }

    #[test]
    fn a_rate_limit_caps_the_rate_claims_are_sized_by() {
        let mut holdings = Holdings::default();
        let limited = JobLimits {
            per_second: Some(2),
            ..limits(100, 1)
        };
        // Not 100 a second by the timeout: 2, so 30 waiting in half the hold.
        assert_eq!(holdings.room("t", limited, HOLD), 130);
        begin_over(&mut holdings, Instant::now(), 400, 2);
        assert_eq!(holdings.room("t", limited, HOLD), 130, "nor as measured");
    }

    /// `count` beginnings spread evenly over `seconds`, from `t0`.
    fn begin_over(holdings: &mut Holdings, t0: Instant, count: usize, seconds: u64) -> Instant {
        let step = Duration::from_secs(seconds) / count as u32;
        for i in 1..=count {
            holdings.began("t", 1, t0 + step * i as u32);
        }
        t0 + Duration::from_secs(seconds)
    }

    #[test]
    fn a_slow_executor_gets_its_concurrency_and_no_more() {
        // Concurrency 1, 20 s attempts: a twentieth of a beginning per second.
        assert_eq!(capacity(1, HOLD, 0.05), 1);
        let mut holdings = Holdings::default();
        let t0 = Instant::now();
        holdings.began("t", 1, t0);
        holdings.began("t", 1, t0 + Duration::from_secs(20));
        holdings.began("t", 1, t0 + Duration::from_secs(40));
        assert_eq!(holdings.room("t", limits(1, 30), Duration::from_secs(2)), 1);
    }

    #[test]
    fn waiting_claims_begin_within_half_the_hold_at_the_measured_rate() {
        let mut holdings = Holdings::default();
        begin_over(&mut holdings, Instant::now(), 400, 2);
        // About 200 a second for 15 s, behind the 256 in flight.
        let room = holdings.room("t", limits(256, 3), HOLD);
        assert!((256 + 2970..=256 + 3030).contains(&room), "{room}");
    }

    #[test]
    fn the_timeout_stands_in_until_a_rate_is_measured() {
        let mut holdings = Holdings::default();
        // 10 per 5 s timeout: 2 a second, 30 in half the hold.
        assert_eq!(holdings.room("t", limits(10, 5), HOLD), 40);
        holdings.began("t", 500, Instant::now());
        assert_eq!(
            holdings.room("t", limits(10, 5), HOLD),
            40,
            "one batch is no rate"
        );
    }

    #[test]
    fn the_rate_follows_a_dispatcher_that_slows_down() {
        let mut holdings = Holdings::default();
        let mut t = begin_over(&mut holdings, Instant::now(), 20_000, 2);
        let fast = holdings.room("t", limits(1, 5), HOLD);
        for _ in 0..20 {
            t = begin_over(&mut holdings, t, 10, 1);
        }
        let slow = holdings.room("t", limits(1, 5), HOLD);
        assert!(fast > 100_000 && slow < 200, "{fast} then {slow}");
    }

    #[test]
    fn absurd_rates_saturate() {
        assert_eq!(capacity(u32::MAX, HOLD, f64::INFINITY), usize::MAX);
        assert_eq!(capacity(3, HOLD, f64::NAN), 3);
    }

    #[test]
    fn held_tasks_use_the_room_and_a_full_job_wakes_the_claimer_once() {
        let mut holdings = Holdings::default();
        holdings.add("t", 1);
        assert_eq!(holdings.room("t", limits(1, 60), HOLD), 0);
        assert!(holdings.remove("t", 1), "the claimer found it full");
        assert!(!holdings.remove("t", 0), "woken once");
        assert_eq!(holdings.room("t", limits(1, 60), HOLD), 1);
        assert!(!holdings.remove("t", 1), "it was not full");
        assert_eq!(holdings.held("t"), 0);
        assert!(!holdings.remove("unknown", 1));
    }
}

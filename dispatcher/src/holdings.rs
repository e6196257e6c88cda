//! How many tasks of each job a dispatcher may hold (claimed into its heap, queued for
//! the job's runner, or running), so a slow or stalled executor stops the claimer
//! instead of filling memory with claims that lapse before they can start.
//!
//! A job may hold its `concurrency` in flight plus as many waiting as can begin within
//! half the claim hold at the pace its recent attempts took: a waiting claim then starts
//! well before the rescuer would take it back, so claims never churn. Before any attempt
//! of the job has finished, the job's timeout stands in for that pace (the worst case).
//! A fast executor earns a room far larger than a claim batch, so this costs nothing
//! there; an executor that takes 20 s at concurrency 1 with a 30 s hold gets one task
//! at a time. Kafka adoption may overshoot the room: a task read from a partition is
//! adopted whatever this says, since leaving it would stall the partition.

use std::collections::HashMap;
use std::time::Duration;

/// Weight of the newest attempt in the pace (an exponentially weighted moving average):
/// about the last ten attempts count, so the pace follows an executor that slows down
/// within seconds without swinging on one outlier.
const PACE_WEIGHT: f64 = 0.2;

#[derive(Debug, Default)]
pub struct Holdings {
    jobs: HashMap<String, JobHolding>,
}

#[derive(Debug, Default)]
struct JobHolding {
    held: usize,
    /// Moving average of how long an attempt took, once one has finished.
    pace: Option<Duration>,
    /// The claimer found no room; the next task to leave should wake it.
    full: bool,
}

/// What the claimer needs to know about a job to size its room.
#[derive(Debug, Clone, Copy)]
pub struct JobLimits {
    pub concurrency: u32,
    pub timeout: Duration,
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

    pub fn attempt_took(&mut self, task_type: &str, took: Duration) {
        let job = self.jobs.entry(task_type.to_string()).or_default();
        job.pace = Some(match job.pace {
            None => took,
            Some(pace) => pace.mul_f64(1.0 - PACE_WEIGHT) + took.mul_f64(PACE_WEIGHT),
        });
    }

    /// How many more tasks of `task_type` the claimer may take now; when none, the job is
    /// marked full so that the next task to leave wakes the claimer.
    pub fn room(&mut self, task_type: &str, limits: JobLimits, hold: Duration) -> usize {
        let job = self.jobs.entry(task_type.to_string()).or_default();
        let room = capacity(limits.concurrency, hold, job.pace.unwrap_or(limits.timeout))
            .saturating_sub(job.held);
        job.full = room == 0;
        room
    }

    pub fn held(&self, task_type: &str) -> usize {
        self.jobs.get(task_type).map_or(0, |job| job.held)
    }
}

/// `concurrency` in flight plus what can begin within half of `hold` at `pace`.
pub fn capacity(concurrency: u32, hold: Duration, pace: Duration) -> usize {
    let concurrency = concurrency.max(1) as f64;
    let rounds = hold.as_secs_f64() / 2.0 / pace.as_secs_f64().max(1e-6);
    // Saturating float-to-int casts: a 1 µs pace must not overflow.
    (concurrency + concurrency * rounds.floor()) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Duration = Duration::from_secs(30);

    fn limits(concurrency: u32, timeout_s: u64) -> JobLimits {
        JobLimits {
            concurrency,
            timeout: Duration::from_secs(timeout_s),
        }
    }

    #[test]
    fn a_slow_executor_gets_its_concurrency_and_no_more() {
        assert_eq!(capacity(1, HOLD, Duration::from_secs(20)), 1);
        assert_eq!(capacity(4, HOLD, Duration::from_secs(20)), 4);
    }

    #[test]
    fn waiting_claims_start_within_half_the_hold() {
        // 5 s attempts, 15 s of waiting allowed: three rounds of 2 behind the 2 running.
        assert_eq!(capacity(2, HOLD, Duration::from_secs(5)), 8);
    }

    #[test]
    fn a_fast_executor_is_never_the_limit() {
        assert!(capacity(1, HOLD, Duration::from_millis(1)) >= 15_000);
        assert!(capacity(u32::MAX, HOLD, Duration::ZERO) > 0, "no overflow");
    }

    #[test]
    fn the_timeout_stands_in_until_an_attempt_has_finished() {
        let mut holdings = Holdings::default();
        assert_eq!(holdings.room("t", limits(1, 60), HOLD), 1);
        holdings.attempt_took("t", Duration::from_millis(10));
        assert!(holdings.room("t", limits(1, 60), HOLD) > 1000);
    }

    #[test]
    fn the_pace_follows_an_executor_that_slows_down() {
        let mut holdings = Holdings::default();
        holdings.attempt_took("t", Duration::from_millis(10));
        for _ in 0..30 {
            holdings.attempt_took("t", Duration::from_secs(20));
        }
        assert_eq!(holdings.room("t", limits(1, 60), HOLD), 1);
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

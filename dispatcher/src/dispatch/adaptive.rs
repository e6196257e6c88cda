//! Adaptive concurrency (`spec.adaptiveConcurrency`, docs/design.md): each dispatcher
//! scales its own share of a job's `concurrency` by additive increase, multiplicative
//! decrease. An overload answer (429 or 503, or an attempt slower than the job's
//! `latency` threshold) cuts the share to [`DECREASE`] of itself; each success adds
//! `1 / share`, so the share grows by one per round of attempts. It stays within 1 and
//! the configured `concurrency`. It grows only while it is in use (as many attempts in
//! flight as it allows): a dispatcher short of due work learns nothing about what the
//! executor takes, and a share grown meanwhile would let the next burst overrun it.
//!
//! One cut per round: the answers to attempts that began before the last cut say
//! nothing about the cut share (they were sent at the old one), so only an attempt begun
//! since then cuts again. Without that, one burst of 429s — every attempt in flight
//! when the executor tipped over — would take the share to 1 at once.

use std::collections::HashMap;

use asyncd_store::{Millis, Shares};

/// What an overload answer leaves of the share: 0.7, as TCP CUBIC, so the share swings
/// between 70 % and a little over what the executor takes rather than halving.
const DECREASE: f64 = 0.7;

/// How an attempt's answer bears on the share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Success,
    Overload,
    /// Another failure: says nothing about load.
    Neither,
}

#[derive(Debug, Default)]
pub struct Adaptive {
    jobs: HashMap<String, Share>,
}

#[derive(Debug, Clone, Copy)]
struct Share {
    limit: f64,
    /// Counts the cuts: an attempt remembers it when it begins.
    epoch: u64,
    /// Attempts begun and not yet answered.
    in_flight: u64,
    /// When the last attempt began, by the dispatcher's clock.
    last_begun: Millis,
}

impl Adaptive {
    /// The share of `task_type` now, for a job of `max` concurrency: `max` until an
    /// overload has been seen, and again when the configured maximum changes below it.
    pub fn limit(&mut self, task_type: &str, max: u32) -> u32 {
        let share = self.share(task_type, max);
        share.limit = share.limit.min(f64::from(max.max(1)));
        share.limit.floor() as u32
    }

    /// An attempt begins at `now`; what it remembers, for [`Adaptive::answered`].
    pub fn begin(&mut self, task_type: &str, max: u32, now: Millis) -> u64 {
        let share = self.share(task_type, max);
        share.in_flight += 1;
        share.last_begun = share.last_begun.max(now);
        share.epoch
    }

    /// The shares of the jobs this dispatcher is running: those with an attempt in
    /// flight or begun at or after `since`. A job it ran once and no longer runs (its
    /// ownership moved, or its tasks ran out) offers its executor nothing, so its share
    /// would only inflate the total the jobs overview adds up.
    pub fn shares(&self, since: Millis) -> Shares {
        self.jobs
            .iter()
            .filter(|(_, share)| share.in_flight > 0 || share.last_begun >= since)
            .map(|(task_type, share)| (task_type.clone(), share.limit.floor() as u32))
            .collect()
    }

    /// An attempt begun at `epoch` was answered; returns the share after it.
    pub fn answered(&mut self, task_type: &str, max: u32, epoch: u64, signal: Signal) -> u32 {
        let max = f64::from(max.max(1));
        let share = self.share(task_type, max as u32);
        let in_use = share.in_flight >= share.limit.floor() as u64;
        share.in_flight = share.in_flight.saturating_sub(1);
        match signal {
            Signal::Overload if epoch == share.epoch => {
                share.limit = (share.limit * DECREASE).max(1.0);
                share.epoch += 1;
            }
            Signal::Success if in_use => {
                share.limit = (share.limit + 1.0 / share.limit).min(max);
            }
            _ => {}
        }
        share.limit.floor() as u32
    }

    fn share(&mut self, task_type: &str, max: u32) -> &mut Share {
        self.jobs.entry(task_type.to_string()).or_insert(Share {
            limit: f64::from(max.max(1)),
            epoch: 0,
            in_flight: 0,
            last_begun: Millis::new(i64::MIN),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Millis = Millis::new(1_000);

    #[test]
    fn a_burst_of_overloads_cuts_once_and_successes_win_the_share_back_one_per_round() {
        let mut adaptive = Adaptive::default();
        assert_eq!(adaptive.limit("t", 64), 64);
        // Every attempt of the burst began before the first answer.
        let epochs: Vec<u64> = (0..50).map(|_| adaptive.begin("t", 64, T)).collect();
        for epoch in epochs {
            adaptive.answered("t", 64, epoch, Signal::Overload);
        }
        assert_eq!(adaptive.limit("t", 64), 44, "64 × 0.7, once");
        let epoch = adaptive.begin("t", 64, T);
        adaptive.answered("t", 64, epoch, Signal::Overload);
        assert_eq!(adaptive.limit("t", 64), 31);
        // About 31 successes with the share in use make a round: one more after it.
        let round = |adaptive: &mut Adaptive, n: usize| {
            for _ in 0..n {
                // As many in flight as the share allows, one of them answered.
                let share = adaptive.limit("t", 64);
                let epochs: Vec<u64> = (0..share).map(|_| adaptive.begin("t", 64, T)).collect();
                adaptive.answered("t", 64, epochs[0], Signal::Success);
                for &epoch in &epochs[1..] {
                    adaptive.answered("t", 64, epoch, Signal::Neither);
                }
            }
        };
        round(&mut adaptive, 31);
        assert_eq!(adaptive.limit("t", 64), 32);
        round(&mut adaptive, 10_000);
        assert_eq!(adaptive.limit("t", 64), 64, "never above the maximum");
    }

    #[test]
    fn a_share_not_in_use_does_not_grow() {
        let mut adaptive = Adaptive::default();
        let epoch = adaptive.begin("t", 64, T);
        adaptive.answered("t", 64, epoch, Signal::Overload);
        assert_eq!(adaptive.limit("t", 64), 44);
        // One attempt at a time: the executor never saw 44 at once.
        for _ in 0..1000 {
            let epoch = adaptive.begin("t", 64, T);
            adaptive.answered("t", 64, epoch, Signal::Success);
        }
        assert_eq!(adaptive.limit("t", 64), 44);
    }

    #[test]
    fn only_the_shares_of_jobs_run_lately_are_published() {
        let mut adaptive = Adaptive::default();
        let epoch = adaptive.begin("old", 64, Millis::new(0));
        adaptive.answered("old", 64, epoch, Signal::Overload);
        let long = adaptive.begin("long", 8, Millis::new(0));
        let epoch = adaptive.begin("recent", 64, T);
        adaptive.answered("recent", 64, epoch, Signal::Overload);
        let published = |a: &Adaptive| a.shares(Millis::new(500)).into_iter().collect::<Vec<_>>();
        assert_eq!(
            published(&adaptive),
            [("long".to_string(), 8), ("recent".to_string(), 44)],
            "old ran last before 500 ms and has nothing in flight; long still has"
        );
        adaptive.answered("long", 8, long, Signal::Success);
        assert_eq!(published(&adaptive), [("recent".to_string(), 44)]);
    }

    #[test]
    fn the_share_never_falls_below_one_and_follows_a_lower_maximum() {
        let mut adaptive = Adaptive::default();
        for _ in 0..100 {
            let epoch = adaptive.begin("t", 8, T);
            adaptive.answered("t", 8, epoch, Signal::Overload);
        }
        assert_eq!(adaptive.limit("t", 8), 1);
        let mut other = Adaptive::default();
        assert_eq!(other.limit("t", 64), 64);
        assert_eq!(
            other.limit("t", 10),
            10,
            "a config change lowers it at once"
        );
    }
}

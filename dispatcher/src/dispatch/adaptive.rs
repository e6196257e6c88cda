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

use std::collections::{BTreeMap, HashMap};

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

    /// Whether `task_type`'s share is back at `max` with nothing in flight: it then
    /// says no more than a share never cut.
    fn recovered(&self, task_type: &str, max: u32) -> bool {
        self.jobs
            .get(task_type)
            .is_none_or(|share| share.in_flight == 0 && share.limit >= f64::from(max.max(1)))
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

/// `concurrencyKey.adaptive`: the same additive increase and multiplicative decrease for
/// each key of a job on its own, in this dispatcher, between 1 and `concurrencyKey.limit`.
/// An overload answer to one key's call cuts that key's limit; the job's other keys keep
/// theirs. Only the keys cut and not yet recovered, and those with attempts in flight,
/// are kept, at most [`KeyAdaptive::MAX_KEYS`] of them: a key back at its limit with
/// nothing in flight is forgotten, and past the bound the least cut keys idle longest
/// go first (they are claimed at the full limit again).
#[derive(Debug, Default)]
pub struct KeyAdaptive {
    /// Per task type, the keys' limits, keyed by the concurrency key.
    jobs: HashMap<String, Adaptive>,
}

impl KeyAdaptive {
    /// How many keys a job keeps limits for: enough for every key an executor could be
    /// refusing at once, bounded so a key per merchant cannot grow the map without end.
    pub const MAX_KEYS: usize = 1_000;

    /// A call of `key` begins; what it remembers, for [`KeyAdaptive::answered`].
    pub fn begin(&mut self, task_type: &str, key: &str, max: u32, now: Millis) -> u64 {
        let keys = self.jobs.entry(task_type.to_string()).or_default();
        if keys.jobs.len() >= Self::MAX_KEYS && !keys.jobs.contains_key(key) {
            evict(keys, max);
        }
        keys.begin(key, max, now)
    }

    /// A call of `key` begun at `epoch` was answered.
    pub fn answered(&mut self, task_type: &str, key: &str, max: u32, epoch: u64, signal: Signal) {
        let Some(keys) = self.jobs.get_mut(task_type) else {
            return;
        };
        if !keys.jobs.contains_key(key) {
            // Evicted while the call was out: the key is at the full limit again.
            return;
        }
        keys.answered(key, max, epoch, signal);
        if keys.recovered(key, max) {
            keys.jobs.remove(key);
        }
    }

    /// The keys of `task_type` whose limit is cut below `max` now, with that limit, for
    /// the fair claim ([`asyncd_store::FairParams::key_limits`]).
    pub fn cut(&self, task_type: &str, max: u32) -> BTreeMap<String, u32> {
        self.jobs.get(task_type).map_or_else(BTreeMap::new, |keys| {
            keys.jobs
                .iter()
                .map(|(key, share)| (key, (share.limit.floor() as u32).min(max)))
                .filter(|&(_, limit)| limit < max)
                .map(|(key, limit)| (key.clone(), limit))
                .collect()
        })
    }
}

/// Makes room for one more key: drops the keys with nothing in flight, the least cut
/// (and among those the idle longest) first, down to three quarters of the bound, so that
/// a flood of new keys evicts in batches.
fn evict(keys: &mut Adaptive, max: u32) {
    let mut idle: Vec<(String, f64, Millis)> = keys
        .jobs
        .iter()
        .filter(|(_, share)| share.in_flight == 0)
        .map(|(key, share)| {
            (
                key.clone(),
                share.limit.min(f64::from(max)),
                share.last_begun,
            )
        })
        .collect();
    idle.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)));
    let excess = keys
        .jobs
        .len()
        .saturating_sub(KeyAdaptive::MAX_KEYS * 3 / 4);
    for (key, _, _) in idle.into_iter().take(excess) {
        keys.jobs.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_cut_by_overloads_leaves_the_others_and_is_forgotten_once_recovered() {
        let mut keys = KeyAdaptive::default();
        let a = keys.begin("t", "a", 8, T);
        let b = keys.begin("t", "b", 8, T);
        keys.answered("t", "a", 8, a, Signal::Overload);
        keys.answered("t", "b", 8, b, Signal::Success);
        assert_eq!(
            keys.cut("t", 8),
            BTreeMap::from([("a".to_string(), 5)]),
            "8 × 0.7"
        );
        assert!(keys.cut("other", 8).is_empty());
        // Successes with the cut limit in use win it back, one per round.
        for _ in 0..200 {
            let limit = keys.cut("t", 8).get("a").copied().unwrap_or(8);
            let epochs: Vec<u64> = (0..limit).map(|_| keys.begin("t", "a", 8, T)).collect();
            for epoch in epochs {
                keys.answered("t", "a", 8, epoch, Signal::Success);
            }
        }
        assert!(keys.cut("t", 8).is_empty(), "back at 8");
        assert!(keys.jobs["t"].jobs.is_empty(), "and forgotten, b with it");
    }

    #[test]
    fn a_flood_of_keys_keeps_the_most_cut_within_the_bound() {
        let mut keys = KeyAdaptive::default();
        for i in 0..3 * KeyAdaptive::MAX_KEYS {
            let key = format!("k{i}");
            let epoch = keys.begin("t", &key, 8, Millis::new(i as i64));
            keys.answered("t", &key, 8, epoch, Signal::Overload);
            if i % 2 == 0 {
                // Cut twice: 8 × 0.7 × 0.7.
                let epoch = keys.begin("t", &key, 8, Millis::new(i as i64));
                keys.answered("t", &key, 8, epoch, Signal::Overload);
            }
        }
        let cut = keys.cut("t", 8);
        assert!(cut.len() <= KeyAdaptive::MAX_KEYS, "{}", cut.len());
        assert!(cut.len() >= KeyAdaptive::MAX_KEYS * 3 / 4, "{}", cut.len());
        let last = format!("k{}", 3 * KeyAdaptive::MAX_KEYS - 1);
        assert_eq!(cut.get(&last), Some(&5), "the newest is kept");
        let twice = cut.values().filter(|&&limit| limit == 3).count();
        assert!(
            twice > cut.len() / 2,
            "the most cut are kept first: {twice} of {}",
            cut.len()
        );
    }

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

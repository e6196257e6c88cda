//! This process's clock against the store's. Dispatchers decide when a task is due by
//! their own clock, so one whose clock runs ahead runs tasks early and can take leases
//! for lapsed that are not. At each membership heartbeat a dispatcher reads the
//! database server's clock and estimates its own offset from it (the read's round trip
//! bounds the error, NTP-style); while the offset is beyond [`MAX_OFFSET`] by more than
//! that error, it claims and dispatches nothing, and `/readyz` says why. The offset is
//! exported as `asyncd_clock_offset_seconds`.
//!
//! An embedded SQLite store has no clock of its own, so `asyncd dev` never measures.

use std::sync::Mutex;
use std::time::Duration;

use asyncd_store::Millis;

/// How far a dispatcher's clock may be from the store's. Tasks are never dispatched
/// before their ETA by the dispatcher's clock, so this is how early, at worst, a task can
/// run by the store's; NTP keeps hosts within milliseconds, so half a second means a
/// broken clock, not jitter.
pub const MAX_OFFSET: Duration = Duration::from_millis(500);

/// One reading: the store's clock read between two local readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// Store minus local, in milliseconds: positive when this clock is behind.
    pub offset_ms: i64,
    /// Half the round trip: the most the estimate can be off by.
    pub error_ms: i64,
}

impl Reading {
    pub fn new(before: Millis, store: Millis, after: Millis) -> Self {
        let (before, store, after) = (before.as_i64(), store.as_i64(), after.as_i64());
        let rtt = after.saturating_sub(before).max(0);
        let midpoint = before.saturating_add(rtt / 2);
        Self {
            offset_ms: store.saturating_sub(midpoint),
            error_ms: rtt.saturating_add(1) / 2,
        }
    }

    /// Whether the clock is surely beyond [`MAX_OFFSET`], however the round trip split.
    pub fn skewed(&self) -> bool {
        self.offset_ms
            .unsigned_abs()
            .saturating_sub(self.error_ms.unsigned_abs())
            > MAX_OFFSET.as_millis() as u64
    }
}

/// The latest reading, shared by the dispatcher (which takes it) and `/readyz`.
#[derive(Debug, Default)]
pub struct ClockCheck(Mutex<State>);

#[derive(Debug, Default, Clone, Copy)]
enum State {
    /// Nothing measured yet: a dispatcher does not claim until the first reading.
    #[default]
    Unmeasured,
    /// The store has no clock of its own (embedded SQLite).
    NoStoreClock,
    Measured(Reading),
}

impl ClockCheck {
    pub fn record(&self, reading: Reading) {
        *self.0.lock().expect("clock check lock") = State::Measured(reading);
    }

    pub fn record_no_store_clock(&self) {
        *self.0.lock().expect("clock check lock") = State::NoStoreClock;
    }

    /// Whether a dispatcher may claim and dispatch: its clock was measured (or there is
    /// nothing to measure it against) and is within bounds.
    pub fn may_dispatch(&self) -> bool {
        match *self.0.lock().expect("clock check lock") {
            State::Unmeasured => false,
            State::NoStoreClock => true,
            State::Measured(reading) => !reading.skewed(),
        }
    }

    /// Why this process must not dispatch, when its clock is too far off.
    pub fn skew(&self) -> Option<String> {
        let State::Measured(reading) = *self.0.lock().expect("clock check lock") else {
            return None;
        };
        reading.skewed().then(|| {
            format!(
                "this process's clock is {} ms {} the store's (±{} ms), beyond the {} ms allowed; not dispatching until it is fixed",
                reading.offset_ms.unsigned_abs(),
                if reading.offset_ms < 0 { "ahead of" } else { "behind" },
                reading.error_ms,
                MAX_OFFSET.as_millis()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(before: i64, store: i64, after: i64) -> Reading {
        Reading::new(Millis::new(before), Millis::new(store), Millis::new(after))
    }

    #[test]
    fn the_offset_is_taken_at_the_round_trips_midpoint() {
        assert_eq!(
            reading(1_000, 1_050, 1_100),
            Reading {
                offset_ms: 0,
                error_ms: 50
            }
        );
        assert_eq!(reading(1_000, 400, 1_000).offset_ms, -600, "ahead");
    }

    #[test]
    fn skewed_only_beyond_the_bound_plus_the_error() {
        assert!(!reading(1_000, 1_500, 1_000).skewed(), "exactly the bound");
        assert!(reading(1_000, 1_501, 1_000).skewed());
        assert!(reading(10_000, 9_499, 10_000).skewed(), "ahead counts too");
        // 600 ms off, but a 200 ms round trip could make that 500.
        assert!(!reading(1_000, 1_700, 1_200).skewed());
    }

    #[test]
    fn says_why_while_skewed_and_nothing_otherwise() {
        let check = ClockCheck::default();
        assert_eq!(check.skew(), None, "not measured");
        assert!(!check.may_dispatch(), "not before the first reading");
        check.record(reading(5_000, 3_000, 5_000));
        let why = check.skew().unwrap();
        assert!(why.contains("2000 ms ahead of the store"), "{why}");
        assert!(!check.may_dispatch());
        check.record(reading(5_000, 5_010, 5_000));
        assert_eq!(check.skew(), None);
        assert!(check.may_dispatch());
        check.record_no_store_clock();
        assert!(check.may_dispatch() && check.skew().is_none());
    }

    #[test]
    fn absurd_readings_saturate_instead_of_overflowing() {
        assert!(reading(i64::MIN, i64::MAX, i64::MAX).skewed());
    }
}

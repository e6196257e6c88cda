//! Time, injected: every part reads the clock through [`Clock`] (chosen in the roles'
//! `Settings`), so tests can put it on a DST boundary instead of waiting for one, and
//! assert ETAs exactly instead of within a wall-clock tolerance.
//!
//! - [`SystemClock`]: the wall clock, for production.
//! - [`TokioClock`]: the wall clock at construction plus tokio's elapsed time, so a
//!   `#[tokio::test(start_paused = true)]` test moves it with `tokio::time::advance`.
//! - [`ManualClock`]: moves only when the test says so; for in-process tests with real
//!   HTTP and SQLite, where paused tokio time would jump ahead whenever the runtime idles.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, TimeZone, Utc};

use asyncd_store::Millis;

pub trait Clock: Send + Sync + 'static {
    fn now_millis(&self) -> Millis;

    fn now(&self) -> DateTime<Utc> {
        from_millis(self.now_millis())
    }
}

pub type SharedClock = Arc<dyn Clock>;

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> Millis {
        Millis::from(Utc::now())
    }
}

/// The wall clock read once at construction, then advanced by tokio's clock: under paused
/// tokio time it moves exactly as far as the test advances it.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    epoch: Millis,
    start: tokio::time::Instant,
}

impl TokioClock {
    /// Must be called inside a tokio runtime (a paused one freezes `start`).
    pub fn new() -> Self {
        Self::starting_at(Utc::now())
    }

    pub fn starting_at(time: DateTime<Utc>) -> Self {
        Self {
            epoch: Millis::from(time),
            start: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now_millis(&self) -> Millis {
        self.epoch + self.start.elapsed()
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn at(time: DateTime<Utc>) -> Arc<Self> {
        Arc::new(Self(AtomicI64::new(time.timestamp_millis())))
    }

    pub fn set(&self, time: DateTime<Utc>) {
        self.set_millis(Millis::from(time));
    }

    pub fn set_millis(&self, ms: Millis) {
        self.0.store(ms.as_i64(), Ordering::SeqCst);
    }

    pub fn advance(&self, by: std::time::Duration) {
        self.0.fetch_add(by.as_millis() as i64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> Millis {
        Millis::new(self.0.load(Ordering::SeqCst))
    }
}

pub fn from_millis(ms: Millis) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms.as_i64())
        .single()
        .unwrap_or_default()
}

/// RFC 3339 in UTC with milliseconds, the API's one time format.
pub fn rfc3339(ms: Millis) -> String {
    from_millis(ms).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time_exactly() {
        let start = Utc.timestamp_millis_opt(1_700_000_000_000).unwrap();
        let clock = TokioClock::starting_at(start);
        assert_eq!(clock.now_millis().as_i64(), 1_700_000_000_000);
        tokio::time::advance(Duration::from_millis(1234)).await;
        assert_eq!(clock.now_millis().as_i64(), 1_700_000_001_234);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(clock.now_millis().as_i64(), 1_700_000_061_234);
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::at(Utc.timestamp_millis_opt(1_000).unwrap());
        assert_eq!(clock.now_millis().as_i64(), 1_000);
        clock.advance(Duration::from_millis(250));
        assert_eq!(clock.now_millis().as_i64(), 1_250);
        clock.set_millis(Millis::new(5));
        assert_eq!(clock.now_millis().as_i64(), 5);
    }
}

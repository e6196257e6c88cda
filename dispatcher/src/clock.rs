//! Time, injected: the scheduler and the retry policy read the clock through [`Clock`] so
//! tests can put it on a DST boundary instead of waiting for one.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, TimeZone, Utc};

use crate::store::Millis;

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

/// A clock that moves only when told to.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn at(time: DateTime<Utc>) -> Arc<Self> {
        Arc::new(Self(AtomicI64::new(time.timestamp_millis())))
    }

    pub fn set(&self, time: DateTime<Utc>) {
        self.0.store(time.timestamp_millis(), Ordering::SeqCst);
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

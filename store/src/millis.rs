//! [`Millis`], the store's one time type.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// An instant: milliseconds since the Unix epoch, UTC. The store's only time type, a
/// BIGINT on every backend. Lengths of time stay [`Duration`]s (or `_ms` integers where
/// a row stores them).
#[derive(
    Debug,
    Default,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    sqlx::Type,
    serde::Serialize,
    serde::Deserialize,
)]
#[sqlx(transparent)]
#[serde(transparent)]
pub struct Millis(i64);

impl Millis {
    pub const fn new(ms: i64) -> Self {
        Self(ms)
    }

    pub const fn as_i64(self) -> i64 {
        self.0
    }

    pub fn saturating_sub(self, length: Duration) -> Self {
        Self(self.0.saturating_sub(duration_ms(length)))
    }

    /// How long after `earlier` this is; zero if it is not after.
    pub fn since(self, earlier: Millis) -> Duration {
        Duration::from_millis(u64::try_from(self.0.saturating_sub(earlier.0)).unwrap_or(0))
    }
}

/// A length in whole milliseconds, as the store adds it to instants in SQL.
pub fn duration_ms(length: Duration) -> i64 {
    i64::try_from(length.as_millis()).unwrap_or(i64::MAX)
}

impl std::ops::Add<Duration> for Millis {
    type Output = Millis;

    /// Saturating: an instant far enough out is as good as never.
    fn add(self, length: Duration) -> Millis {
        Self(self.0.saturating_add(duration_ms(length)))
    }
}

impl From<DateTime<Utc>> for Millis {
    fn from(time: DateTime<Utc>) -> Self {
        Self(time.timestamp_millis())
    }
}

impl std::fmt::Display for Millis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_arithmetic_saturates_instead_of_wrapping() {
        let t = Millis::new(1_000);
        assert_eq!(t + Duration::from_millis(500), Millis::new(1_500));
        assert_eq!(t.saturating_sub(Duration::from_secs(1)), Millis::new(0));
        assert_eq!(
            Millis::new(i64::MAX - 1) + Duration::from_secs(1),
            Millis::new(i64::MAX)
        );
        assert_eq!(t + Duration::MAX, Millis::new(i64::MAX));
        assert_eq!(
            Millis::new(i64::MIN + 1).saturating_sub(Duration::from_secs(1)),
            Millis::new(i64::MIN)
        );
    }

    #[test]
    fn since_is_never_negative() {
        let (early, late) = (Millis::new(1_000), Millis::new(3_500));
        assert_eq!(late.since(early), Duration::from_millis(2_500));
        assert_eq!(early.since(late), Duration::ZERO);
    }

    #[test]
    fn millis_come_from_chrono_and_travel_as_plain_numbers() {
        let time = DateTime::parse_from_rfc3339("2026-01-02T03:04:05.678Z")
            .unwrap()
            .with_timezone(&Utc);
        let ms = Millis::from(time);
        assert_eq!(ms.as_i64(), time.timestamp_millis());
        assert_eq!(serde_json::to_string(&ms).unwrap(), ms.as_i64().to_string());
        assert_eq!(ms.to_string(), ms.as_i64().to_string());
    }
}

//! Durations and times as the API writes them.

use std::time::Duration;

/// Renders `d` in the humantime form the API reads: `"1h 30m"`, `"1d 2h 3m 4s"`,
/// `"1ms 500us"`, `"0s"` — the same text the Go and Python SDKs send.
pub fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".to_string();
    }
    const UNITS: [(u128, &str); 7] = [
        (86_400_000_000_000, "d"),
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ];
    let mut rest = d.as_nanos();
    let mut parts = Vec::new();
    for (size, name) in UNITS {
        let n = rest / size;
        if n > 0 {
            parts.push(format!("{n}{name}"));
            rest -= n * size;
        }
    }
    parts.join(" ")
}

pub use asyncd_contract::time::format_time;

/// Whole seconds for a `Retry-After` header, rounded up: retrying early is what the
/// handler asked not to happen.
pub(crate) fn retry_after_seconds(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    #[test]
    fn durations_on_the_wire_match_the_other_sdks() {
        let h = 3600;
        for (d, want) in [
            (Duration::from_secs(90), "1m 30s"),
            (Duration::from_secs(90 * 60), "1h 30m"),
            (Duration::from_secs(3 * 24 * h), "3d"),
            (Duration::from_secs(400 * 24 * h), "400d"),
            (Duration::from_millis(h * 1000 + 500), "1h 500ms"),
            (Duration::from_micros(1500), "1ms 500us"),
            (Duration::from_secs(26 * h + 3 * 60 + 4), "1d 2h 3m 4s"),
            (Duration::from_millis(1500), "1s 500ms"),
            (Duration::from_nanos(7), "7ns"),
            (Duration::ZERO, "0s"),
        ] {
            assert_eq!(format_duration(d), want, "{d:?}");
        }
    }

    #[test]
    fn times_are_utc_millis() {
        let t = chrono::FixedOffset::east_opt(8 * 3600)
            .unwrap()
            .with_ymd_and_hms(2026, 12, 1, 8, 0, 0)
            .unwrap()
            + chrono::Duration::microseconds(500_999);
        assert_eq!(
            format_time(t.with_timezone(&Utc)),
            "2026-12-01T00:00:00.500Z"
        );
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after_seconds(Duration::from_secs(3)), 3);
        assert_eq!(retry_after_seconds(Duration::from_nanos(1)), 1);
        assert_eq!(retry_after_seconds(Duration::ZERO), 0);
    }
}

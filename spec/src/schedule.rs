//! Cron schedules with an explicit time zone.
//!
//! The reference system learned that `0 0 * * *` means a different midnight in every
//! country it served, so a schedule must name its zone: `CRON_TZ=Asia/Singapore 0 0 * * *`.
//! Firing times are computed in that zone and handed out in UTC.
//!
//! Daylight-saving rules (tested below):
//! - a firing that falls into a skipped hour (spring forward) happens once, at the first
//!   instant after the gap: `30 2 * * *` in Europe/Berlin fires at 03:00 CEST on the last
//!   Sunday of March;
//! - a firing that falls into a repeated hour (fall back) happens once, on the first pass
//!   (the earlier UTC instant); the second pass through the same wall-clock times fires
//!   nothing.

pub mod rule;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;

/// A parsed `CRON_TZ=Area/City <5 or 6 field expression>` schedule.
#[derive(Debug, Clone)]
pub struct CronSchedule {
    text: String,
    zone: Tz,
    cron: Cron,
}

impl CronSchedule {
    /// Parses a schedule. Five fields are minute-precision; a sixth leading field adds
    /// seconds.
    pub fn parse(text: &str) -> Result<Self, String> {
        let trimmed = text.trim();
        let Some(rest) = trimmed.strip_prefix("CRON_TZ=") else {
            return Err(format!(
                "{text:?} must start with CRON_TZ=<Area/City>, e.g. \"CRON_TZ=Asia/Singapore 0 0 * * *\""
            ));
        };
        let (zone_name, expression) = rest
            .split_once(char::is_whitespace)
            .ok_or_else(|| format!("{text:?} has a time zone but no cron expression"))?;
        let zone: Tz = zone_name
            .parse()
            .map_err(|_| format!("{zone_name:?} is not an IANA time zone like Europe/Berlin"))?;
        let cron = Cron::new(expression.trim())
            .with_seconds_optional()
            .parse()
            .map_err(|err| format!("{:?} is not a cron expression: {err}", expression.trim()))?;
        Ok(Self {
            text: trimmed.to_string(),
            zone,
            cron,
        })
    }

    /// The schedule as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The first firing strictly after `after`, or `None` when the expression never fires
    /// again (e.g. 30 February).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut cursor = after.with_timezone(&self.zone);
        // During a repeated hour croner maps wall-clock times onto their first pass, which
        // can lie before `after`; step forward through wall-clock time until we are past it.
        for _ in 0..10_000 {
            let next = self.cron.find_next_occurrence(&cursor, false).ok()?;
            let next_utc = next.with_timezone(&Utc);
            if next_utc > after {
                return Some(next_utc);
            }
            let naive = next.naive_local() + chrono::Duration::seconds(1);
            cursor = match self.zone.from_local_datetime(&naive) {
                chrono::LocalResult::Single(t) => t,
                chrono::LocalResult::Ambiguous(_, later) => later,
                chrono::LocalResult::None => return None,
            } - chrono::Duration::seconds(1);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn zone_is_mandatory() {
        let err = CronSchedule::parse("0 0 * * *").unwrap_err();
        assert!(err.contains("CRON_TZ="), "{err}");
        assert!(CronSchedule::parse("CRON_TZ=Mars/Olympus 0 0 * * *").is_err());
        assert!(CronSchedule::parse("CRON_TZ=Asia/Singapore").is_err());
        assert!(CronSchedule::parse("CRON_TZ=Asia/Singapore 61 0 * * *").is_err());
    }

    #[test]
    fn fires_at_local_midnight_of_its_zone() {
        let s = CronSchedule::parse("CRON_TZ=Asia/Singapore 0 0 * * *").unwrap();
        // Singapore is UTC+8: local midnight is 16:00 UTC the day before.
        assert_eq!(
            s.next_after(utc("2026-11-30T10:00:00Z")),
            Some(utc("2026-11-30T16:00:00Z"))
        );
        assert_eq!(
            s.next_after(utc("2026-11-30T16:00:00Z")),
            Some(utc("2026-12-01T16:00:00Z")),
            "strictly after"
        );
    }

    #[test]
    fn seconds_field_is_optional() {
        let s = CronSchedule::parse("CRON_TZ=UTC */10 * * * * *").unwrap();
        assert_eq!(
            s.next_after(utc("2026-11-30T10:00:01Z")),
            Some(utc("2026-11-30T10:00:10Z"))
        );
    }

    #[test]
    fn skipped_hour_fires_once_right_after_the_gap() {
        // 2026-03-29 in Berlin: 02:00 CET jumps to 03:00 CEST (01:00 UTC).
        let daily = CronSchedule::parse("CRON_TZ=Europe/Berlin 30 2 * * *").unwrap();
        assert_eq!(
            daily.next_after(utc("2026-03-28T12:00:00Z")),
            Some(utc("2026-03-29T01:00:00Z")),
            "02:30 does not exist that day; it runs at 03:00 CEST"
        );
        assert_eq!(
            daily.next_after(utc("2026-03-29T01:00:00Z")),
            Some(utc("2026-03-30T00:30:00Z")),
            "and the day after at 02:30 CEST again"
        );

        let quarterly = CronSchedule::parse("CRON_TZ=Europe/Berlin */15 * * * *").unwrap();
        let mut t = utc("2026-03-29T00:40:00Z"); // 01:40 CET
        let mut firings = Vec::new();
        for _ in 0..4 {
            t = quarterly.next_after(t).unwrap();
            firings.push(t);
        }
        assert_eq!(
            firings,
            vec![
                utc("2026-03-29T00:45:00Z"), // 01:45 CET
                utc("2026-03-29T01:00:00Z"), // the gap's four firings, once, at 03:00 CEST
                utc("2026-03-29T01:15:00Z"), // 03:15 CEST
                utc("2026-03-29T01:30:00Z"),
            ]
        );
    }

    #[test]
    fn repeated_hour_fires_once_on_the_first_pass() {
        // 2026-10-25 in Berlin: 03:00 CEST falls back to 02:00 CET (01:00 UTC).
        let daily = CronSchedule::parse("CRON_TZ=Europe/Berlin 30 2 * * *").unwrap();
        assert_eq!(
            daily.next_after(utc("2026-10-24T12:00:00Z")),
            Some(utc("2026-10-25T00:30:00Z")),
            "02:30 CEST, the first pass"
        );
        assert_eq!(
            daily.next_after(utc("2026-10-25T00:30:00Z")),
            Some(utc("2026-10-26T01:30:00Z")),
            "not again at 02:30 CET; next day's 02:30 CET"
        );
        // Asked from inside the second pass, it does not hand out a time in the past.
        assert_eq!(
            daily.next_after(utc("2026-10-25T01:10:00Z")),
            Some(utc("2026-10-26T01:30:00Z"))
        );

        let hourly = CronSchedule::parse("CRON_TZ=Europe/Berlin 0 * * * *").unwrap();
        let mut t = utc("2026-10-24T23:30:00Z"); // 01:30 CEST
        let mut firings = Vec::new();
        for _ in 0..3 {
            t = hourly.next_after(t).unwrap();
            firings.push(t);
        }
        assert_eq!(
            firings,
            vec![
                utc("2026-10-25T00:00:00Z"), // 02:00 CEST
                utc("2026-10-25T02:00:00Z"), // 03:00 CET: 02:00 CET (01:00 UTC) is skipped
                utc("2026-10-25T03:00:00Z"),
            ]
        );
    }
}

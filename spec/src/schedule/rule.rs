//! A schedule's rule: when it fires and what each firing carries. One type for an
//! AsyncJobConfig's `spec.cron` entries and the API's schedules, so one scheduler fires
//! both ([`ScheduleRule::from_spec`] reads the API's [`ScheduleSpec`];
//! [`crate::job::CronEntry::to_spec`] writes an entry as one).

use std::time::Duration;

use asyncd_contract::{MAX_SCHEDULE_NAME, ScheduleSpec};
use chrono::{DateTime, Utc};

use super::CronSchedule;
use crate::job::{CronEntry, Overlap, SpecError};
use crate::{format_duration, parse_duration};

/// The most a firing's jitter may delay it.
pub const MAX_JITTER: Duration = Duration::from_secs(3600);
/// The shortest interval of an `every` schedule.
pub const MIN_EVERY: Duration = Duration::from_secs(1);
/// The longest: as far as a task's delay may reach (and within every SDK's duration
/// type).
pub const MAX_EVERY: Duration = Duration::from_secs(400 * 86_400);

/// When a schedule fires.
#[derive(Debug, Clone)]
pub enum When {
    Cron(Box<CronSchedule>),
    /// Every `period`, counted from the schedule's anchor ([`ScheduleRule::next_after`]).
    Every(Duration),
}

/// A validated schedule rule.
#[derive(Debug, Clone)]
pub struct ScheduleRule {
    pub when: When,
    pub payload: serde_json::Value,
    pub priority: u8,
    pub overlap: Overlap,
    pub catch_up: Duration,
    pub start_at: Option<DateTime<Utc>>,
    pub end_at: Option<DateTime<Utc>>,
    pub jitter: Duration,
}

/// Whether `name` may name a schedule: it goes into each firing's identity and into URL
/// paths, so it is kept to characters that need no escaping.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_SCHEDULE_NAME {
        return Err(format!("must be 1 to {MAX_SCHEDULE_NAME} bytes"));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_.:@".contains(*c)))
    {
        return Err(format!(
            "{name:?} holds {bad:?}: use letters, digits and -_.:@"
        ));
    }
    Ok(())
}

impl ScheduleRule {
    /// Validates `spec`; an error names the member at fault.
    pub fn from_spec(spec: &ScheduleSpec) -> Result<Self, SpecError> {
        let when = match (&spec.cron, &spec.every) {
            (Some(cron), None) => When::Cron(Box::new(
                CronSchedule::parse(cron).map_err(|message| SpecError::new("cron", message))?,
            )),
            (None, Some(every)) => {
                let period =
                    parse_duration(every).map_err(|message| SpecError::new("every", message))?;
                if period < MIN_EVERY || period > MAX_EVERY {
                    return Err(SpecError::new("every", "must be 1s to 400 days"));
                }
                When::Every(period)
            }
            (Some(_), Some(_)) => {
                return Err(SpecError::new(
                    "every",
                    "give either cron or every, not both",
                ));
            }
            (None, None) => {
                return Err(SpecError::new(
                    "cron",
                    "give when the schedule fires: cron (\"CRON_TZ=Europe/Berlin 0 9 * * *\") or every (\"15m\")",
                ));
            }
        };
        if spec.priority > 9 {
            return Err(SpecError::new("priority", "must be 0..=9"));
        }
        let catch_up = spec
            .catch_up
            .as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(|message| SpecError::new("catch_up", message))?
            .unwrap_or(CronEntry::DEFAULT_CATCH_UP);
        if catch_up > CronEntry::MAX_CATCH_UP {
            return Err(SpecError::new("catch_up", "must be at most 7d"));
        }
        let jitter = spec
            .jitter
            .as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(|message| SpecError::new("jitter", message))?
            .unwrap_or_default();
        if jitter > MAX_JITTER {
            return Err(SpecError::new("jitter", "must be at most 1h"));
        }
        if let When::Every(period) = when
            && jitter > period
        {
            return Err(SpecError::new(
                "jitter",
                "must be at most the interval between firings (every)",
            ));
        }
        if let (Some(start), Some(end)) = (spec.start_at, spec.end_at)
            && end <= start
        {
            return Err(SpecError::new("end_at", "must be after start_at"));
        }
        Ok(Self {
            when,
            payload: spec.payload.clone(),
            priority: spec.priority,
            overlap: spec.overlap,
            catch_up,
            start_at: spec.start_at,
            end_at: spec.end_at,
            jitter,
        })
    }

    /// The first firing strictly after `after`, or `None` once the schedule has ended.
    /// An interval counts from `start_at`, or else from `anchor` (the schedule's
    /// creation), so every scheduler computes the same instants.
    pub fn next_after(&self, after: DateTime<Utc>, anchor: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Firings at `start_at` itself count.
        let after = match self.start_at {
            Some(start) => after.max(start - chrono::Duration::milliseconds(1)),
            None => after,
        };
        let next = match &self.when {
            When::Cron(cron) => cron.next_after(after)?,
            When::Every(period) => {
                let origin = self.start_at.unwrap_or(anchor);
                let period_ms = i64::try_from(period.as_millis()).ok()?.max(1);
                // Whole periods either side of the origin: a backfill may reach back
                // before the schedule was created (never before its `start_at`).
                let steps = (after - origin).num_milliseconds().div_euclid(period_ms) + 1;
                origin + chrono::Duration::milliseconds(steps.checked_mul(period_ms)?)
            }
        };
        match self.end_at {
            Some(end) if next > end => None,
            _ => Some(next),
        }
    }

    /// How long after its instant the firing of schedule `name` at `at` is due: a hash of
    /// both below the rule's jitter, so every scheduler, and every retry of a pass,
    /// gives the same firing the same delay.
    pub fn jitter_for(&self, name: &str, at: DateTime<Utc>) -> Duration {
        let jitter_ms = self.jitter.as_millis() as u64;
        if jitter_ms == 0 {
            return Duration::ZERO;
        }
        // FNV-1a: stable across builds, unlike std's hasher, so schedulers of two
        // releases agree during a rollout.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in name.bytes().chain(at.timestamp_millis().to_le_bytes()) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        Duration::from_millis(hash % jitter_ms)
    }

    /// The payload of the firing of schedule `name` at `at`: the rule's, with
    /// `{{scheduled_at}}` and `{{schedule}}` filled in its strings.
    pub fn payload_at(&self, name: &str, at: DateTime<Utc>) -> serde_json::Value {
        fn fill(value: &mut serde_json::Value, name: &str, at: &str) {
            match value {
                serde_json::Value::String(text) if text.contains("{{") => {
                    *text = text
                        .replace("{{scheduled_at}}", at)
                        .replace("{{schedule}}", name);
                }
                serde_json::Value::Array(items) => {
                    items.iter_mut().for_each(|item| fill(item, name, at))
                }
                serde_json::Value::Object(members) => {
                    members.values_mut().for_each(|item| fill(item, name, at))
                }
                _ => {}
            }
        }
        let mut payload = self.payload.clone();
        fill(&mut payload, name, &asyncd_contract::time::format_time(at));
        payload
    }
}

impl CronEntry {
    /// The entry's rule, as [`ScheduleRule::from_spec`] reads [`Self::to_spec`].
    pub fn rule(&self) -> ScheduleRule {
        ScheduleRule {
            when: When::Cron(Box::new(self.schedule.clone())),
            payload: self.payload.clone(),
            priority: self.priority,
            overlap: self.overlap,
            catch_up: self.catch_up,
            start_at: None,
            end_at: None,
            jitter: Duration::ZERO,
        }
    }

    /// The entry as the API writes a schedule, for the scheduler to fire it as one.
    pub fn to_spec(&self) -> ScheduleSpec {
        ScheduleSpec {
            cron: Some(self.schedule.as_str().to_string()),
            payload: self.payload.clone(),
            priority: self.priority,
            overlap: self.overlap,
            catch_up: Some(format_duration(self.catch_up)),
            paused: self.paused,
            ..ScheduleSpec::default()
        }
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

    fn rule(json: serde_json::Value) -> Result<ScheduleRule, SpecError> {
        ScheduleRule::from_spec(&serde_json::from_value(json).unwrap())
    }

    #[test]
    fn each_bad_member_is_named() {
        for (json, field) in [
            (serde_json::json!({}), "cron"),
            (serde_json::json!({"cron": "0 9 * * *"}), "cron"),
            (
                serde_json::json!({"cron": "CRON_TZ=UTC 0 9 * * *", "every": "1h"}),
                "every",
            ),
            (serde_json::json!({"every": "500ms"}), "every"),
            (serde_json::json!({"every": "401days"}), "every"),
            (serde_json::json!({"every": "soon"}), "every"),
            (
                serde_json::json!({"every": "1h", "priority": 10}),
                "priority",
            ),
            (
                serde_json::json!({"every": "1h", "catch_up": "8d"}),
                "catch_up",
            ),
            (serde_json::json!({"every": "1m", "jitter": "2m"}), "jitter"),
            (
                serde_json::json!({"cron": "CRON_TZ=UTC 0 9 * * *", "jitter": "2h"}),
                "jitter",
            ),
            (
                serde_json::json!({"every": "1h", "start_at": "2026-12-01T00:00:00Z",
                                   "end_at": "2026-12-01T00:00:00Z"}),
                "end_at",
            ),
        ] {
            let err = rule(json.clone()).unwrap_err();
            assert_eq!(err.field, field, "{json}: {}", err.message);
        }
    }

    #[test]
    fn an_interval_counts_from_its_start_or_its_anchor() {
        let every = rule(serde_json::json!({"every": "15m"})).unwrap();
        let anchor = utc("2026-12-01T10:07:00Z");
        assert_eq!(
            every.next_after(anchor, anchor),
            Some(utc("2026-12-01T10:22:00Z"))
        );
        assert_eq!(
            every.next_after(utc("2026-12-01T10:22:00Z"), anchor),
            Some(utc("2026-12-01T10:37:00Z")),
            "strictly after"
        );
        assert_eq!(
            every.next_after(utc("2026-12-01T09:00:00Z"), anchor),
            Some(utc("2026-12-01T09:07:00Z")),
            "on the same grid before the anchor"
        );
        let started = rule(serde_json::json!({"every": "15m",
            "start_at": "2026-12-02T00:00:00Z", "end_at": "2026-12-02T00:30:00Z"}))
        .unwrap();
        assert_eq!(
            started.next_after(anchor, anchor),
            Some(utc("2026-12-02T00:00:00Z")),
            "the start itself fires"
        );
        assert_eq!(
            started.next_after(utc("2026-12-02T00:15:00Z"), anchor),
            Some(utc("2026-12-02T00:30:00Z")),
            "the end itself fires"
        );
        assert_eq!(
            started.next_after(utc("2026-12-02T00:30:00Z"), anchor),
            None,
            "ended"
        );
    }

    #[test]
    fn a_cron_rule_waits_for_its_start() {
        let cron = rule(
            serde_json::json!({"cron": "CRON_TZ=Europe/Berlin 0 9 * * *",
            "start_at": "2026-12-10T08:00:00Z"}),
        )
        .unwrap();
        assert_eq!(
            cron.next_after(utc("2026-12-01T00:00:00Z"), utc("2026-12-01T00:00:00Z")),
            Some(utc("2026-12-10T08:00:00Z")),
            "09:00 CET on the day it starts"
        );
    }

    #[test]
    fn jitter_is_the_same_for_the_same_firing_and_within_bound() {
        let jittered = rule(serde_json::json!({"every": "1h", "jitter": "10m"})).unwrap();
        let at = utc("2026-12-01T10:00:00Z");
        let delays: Vec<Duration> = (0..100)
            .map(|i| jittered.jitter_for(&format!("customer-{i}"), at))
            .collect();
        assert!(delays.iter().all(|d| *d < Duration::from_secs(600)));
        assert_eq!(delays[7], jittered.jitter_for("customer-7", at));
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 90, "spread: {} distinct", distinct.len());
    }

    #[test]
    fn the_payload_template_fills_instant_and_name() {
        let templated = rule(serde_json::json!({"every": "1h",
            "payload": {"for": "{{scheduled_at}}", "tags": ["{{schedule}}", 3]}}))
        .unwrap();
        assert_eq!(
            templated.payload_at("weekly-42", utc("2026-12-01T10:00:00Z")),
            serde_json::json!({"for": "2026-12-01T10:00:00.000Z", "tags": ["weekly-42", 3]})
        );
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("customer-42:weekly@eu").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a/b").is_err());
        assert!(check_name(&"x".repeat(201)).is_err());
    }
}

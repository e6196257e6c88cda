//! Client-side check of AsyncJobConfig cron schedules, the same as the Go SDK's
//! `ValidateCron` and the Python SDK's `validate_cron`.

use chrono_tz::Tz;

/// A cron schedule asyncd would refuse (or fire at a machine-dependent instant).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("asyncd: cron {expr:?}: {reason}")]
pub struct CronError {
    pub expr: String,
    pub reason: String,
}

/// Checks a cron schedule as an AsyncJobConfig's `spec.cron[].schedule` takes it:
/// `"CRON_TZ=<IANA zone> <schedule>"`, e.g. `"CRON_TZ=Asia/Singapore 0 0 * * *"`.
///
/// The zone is mandatory because a schedule without one fires at a different instant
/// on every machine whose local zone differs. The schedule is five fields (minute hour
/// day-of-month month day-of-week), six with a leading seconds field, or one of
/// `@yearly @annually @monthly @weekly @daily @midnight @hourly`.
///
/// ```
/// assert!(asyncd_client::cron::validate("CRON_TZ=Asia/Singapore 0 0 * * *").is_ok());
/// assert!(asyncd_client::cron::validate("0 0 * * *").is_err());
/// ```
pub fn validate(expr: &str) -> Result<(), CronError> {
    let fail = |reason: String| CronError {
        expr: expr.to_string(),
        reason,
    };
    let Some(rest) = expr.trim().strip_prefix("CRON_TZ=") else {
        return Err(fail(
            "must start with CRON_TZ=<Area/City>, e.g. \"CRON_TZ=Europe/Berlin 0 3 * * *\"".into(),
        ));
    };
    let (zone, schedule) = rest.split_once(' ').unwrap_or((rest, ""));
    check_zone(zone).map_err(fail)?;
    check_schedule(schedule.trim()).map_err(fail)
}

fn check_zone(zone: &str) -> Result<(), String> {
    if zone.is_empty() || zone == "Local" {
        return Err(format!(
            "CRON_TZ needs an IANA time zone name such as Europe/Berlin, got {zone:?}"
        ));
    }
    zone.parse::<Tz>()
        .map(|_| ())
        .map_err(|_| format!("unknown time zone {zone:?}"))
}

const MACROS: [&str; 7] = [
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@midnight",
    "@hourly",
];

const MONTHS: [&str; 12] = [
    "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
];
const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

struct Field {
    name: &'static str,
    lo: i64,
    hi: i64,
    /// `names[i]` stands for `lo + i`.
    names: &'static [&'static str],
    /// Where `?`, `L`, `W` (day of month) and `L`, `#` (day of week) are allowed.
    dom: bool,
    dow: bool,
}

const SECOND: Field = Field {
    name: "second",
    lo: 0,
    hi: 59,
    names: &[],
    dom: false,
    dow: false,
};
const FIELDS: [Field; 5] = [
    Field {
        name: "minute",
        lo: 0,
        hi: 59,
        names: &[],
        dom: false,
        dow: false,
    },
    Field {
        name: "hour",
        lo: 0,
        hi: 23,
        names: &[],
        dom: false,
        dow: false,
    },
    Field {
        name: "day-of-month",
        lo: 1,
        hi: 31,
        names: &[],
        dom: true,
        dow: false,
    },
    Field {
        name: "month",
        lo: 1,
        hi: 12,
        names: &MONTHS,
        dom: false,
        dow: false,
    },
    Field {
        name: "day-of-week",
        lo: 0,
        hi: 7,
        names: &WEEKDAYS,
        dom: false,
        dow: true,
    },
];

fn check_schedule(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("no schedule after the time zone".into());
    }
    if s.starts_with('@') {
        return if MACROS.contains(&s.to_lowercase().as_str()) {
            Ok(())
        } else {
            Err(format!("unknown macro {s:?}"))
        };
    }
    let parts: Vec<&str> = s.split_whitespace().collect();
    let fields: Vec<&Field> = match parts.len() {
        5 => FIELDS.iter().collect(),
        6 => std::iter::once(&SECOND).chain(FIELDS.iter()).collect(),
        n => {
            return Err(format!(
                "want 5 fields (minute hour day-of-month month day-of-week) or 6 with seconds, got {n}"
            ));
        }
    };
    for (field, part) in fields.into_iter().zip(parts) {
        for item in part.split(',') {
            field
                .check_item(item)
                .map_err(|e| format!("{} field {part:?}: {e}", field.name))?;
        }
    }
    Ok(())
}

impl Field {
    fn check_item(&self, item: &str) -> Result<(), String> {
        let u = item.to_uppercase();
        if u.is_empty() {
            return Err("empty list item".into());
        }
        if u == "?" && (self.dom || self.dow) {
            return Ok(());
        }
        if u == "L" && self.dom {
            return Ok(());
        }
        if self.dom
            && let Some(day) = u.strip_suffix('W')
        {
            return self.value(day).map(|_| ());
        }
        if self.dow
            && let Some(day) = u.strip_suffix('L')
        {
            return self.value(day).map(|_| ());
        }
        if self.dow
            && let Some((day, nth)) = u.split_once('#')
        {
            self.value(day)?;
            return match nth.parse::<i64>() {
                Ok(1..=5) => Ok(()),
                _ => Err(format!("{item:?}: nth weekday must be 1..5")),
            };
        }
        let (range, step) = match u.split_once('/') {
            Some((range, step)) => (range, Some(step)),
            None => (u.as_str(), None),
        };
        if let Some(step) = step {
            let width = self.hi - self.lo + 1;
            match step.parse::<i64>() {
                Ok(n) if (1..=width).contains(&n) => {}
                _ => return Err(format!("{item:?}: step must be 1..{width}")),
            }
        }
        if range == "*" {
            return Ok(());
        }
        match range.split_once('-') {
            Some((a, b)) => {
                let lo = self.value(a)?;
                let hi = self.value(b)?;
                if lo > hi {
                    return Err(format!("{item:?}: range runs backwards"));
                }
                Ok(())
            }
            None => self.value(range).map(|_| ()),
        }
    }

    fn value(&self, s: &str) -> Result<i64, String> {
        if let Some(i) = self.names.iter().position(|n| *n == s) {
            return Ok(self.lo + i as i64);
        }
        match s.parse::<i64>() {
            Ok(n) if (self.lo..=self.hi).contains(&n) => Ok(n),
            _ => Err(format!("{s:?} is not in {}..{}", self.lo, self.hi)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The same table is in sdk/go/cron_test.go and sdk/python/tests/test_cron.py.
    const VALID: [&str; 10] = [
        "CRON_TZ=Asia/Singapore 0 0 * * *",
        "CRON_TZ=America/New_York */15 9-17 * * MON-FRI",
        "CRON_TZ=Europe/Berlin 30 2 L * ?",
        "CRON_TZ=UTC 0 0 1,15 jan,jul *",
        "CRON_TZ=Australia/Lord_Howe 0 30 2 * * 0",
        "CRON_TZ=Europe/London 0 9 15W * *",
        "CRON_TZ=Europe/London 0 9 ? * 5L",
        "CRON_TZ=Europe/London 0 9 ? * MON#2",
        "CRON_TZ=America/Argentina/Buenos_Aires @daily",
        "  CRON_TZ=Asia/Tokyo 0 0 * * 7  ",
    ];

    const INVALID: [(&str, &str); 22] = [
        ("0 0 * * *", "CRON_TZ"),
        ("TZ=Asia/Singapore 0 0 * * *", "CRON_TZ"),
        ("CRON_TZ= 0 0 * * *", "time zone"),
        ("CRON_TZ=Local 0 0 * * *", "time zone"),
        ("CRON_TZ=Mars/Olympus 0 0 * * *", "unknown time zone"),
        ("CRON_TZ=Asia/Singapore", "no schedule"),
        ("CRON_TZ=Asia/Singapore 0 0 * *", "5 fields"),
        ("CRON_TZ=Asia/Singapore 0 0 * * * * *", "5 fields"),
        ("CRON_TZ=Asia/Singapore 60 0 * * *", "minute"),
        ("CRON_TZ=Asia/Singapore 0 24 * * *", "hour"),
        ("CRON_TZ=Asia/Singapore 0 0 0 * *", "day-of-month"),
        ("CRON_TZ=Asia/Singapore 0 0 * 13 *", "month"),
        ("CRON_TZ=Asia/Singapore 0 0 * * 8", "day-of-week"),
        ("CRON_TZ=Asia/Singapore 0 0 * * FUN", "day-of-week"),
        ("CRON_TZ=Asia/Singapore */0 0 * * *", "step"),
        ("CRON_TZ=Asia/Singapore 0 17-9 * * *", "backwards"),
        ("CRON_TZ=Asia/Singapore 0 0 1-x * *", "day-of-month"),
        ("CRON_TZ=Asia/Singapore ? 0 * * *", "minute"),
        ("CRON_TZ=Asia/Singapore 0 0 * * MON#6", "nth"),
        ("CRON_TZ=Asia/Singapore 0 0 1,,2 * *", "empty"),
        ("CRON_TZ=Asia/Singapore @fortnightly", "macro"),
        ("CRON_TZ=Asia/Singapore 61 0 0 * * *", "second"),
    ];

    #[test]
    fn table_shared_with_go_and_python() {
        for expr in VALID {
            assert_eq!(validate(expr), Ok(()), "{expr}");
        }
        for (expr, mention) in INVALID {
            let err = validate(expr).expect_err(expr);
            assert!(
                err.to_string().contains(mention),
                "validate({expr:?}) = {err}, want it to mention {mention:?}"
            );
            assert_eq!(err.expr, expr);
        }
    }
}

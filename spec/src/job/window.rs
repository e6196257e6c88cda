//! `spec.debounce` and `spec.throttle`: a job's default key window, its key rendered
//! from each task's payload like `uniqueKey` (docs/api.md, "Debounce and throttle").

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::validate::check_template;
use super::{SpecError, render};
use crate::parse_duration;

/// The longest period or cap a key window takes: the longest a task may be delayed.
pub const MAX_WINDOW: Duration = Duration::from_secs(400 * 86_400);

/// `spec.debounce`: the job's submits whose payloads render the same key are combined.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DebounceSpec {
    /// Template filled from the payload's top-level fields, like `uniqueKey`:
    /// `"user:{user_id}"`.
    pub key: String,
    /// Trailing: a task is due this long after the latest submit of its key. Leading:
    /// the quiet period after which a submit runs again (1ms to 400d).
    pub period: String,
    /// Trailing only: the task is due at most this long after the first submit of the
    /// burst (at least `period`; default no cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay: Option<String>,
    /// `trailing` (default): one waiting task per key, its payload the latest.
    /// `leading`: the first submit runs, the ones within `period` of the last are dropped.
    #[serde(default)]
    pub mode: DebounceMode,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum DebounceMode {
    #[default]
    Trailing,
    Leading,
}

/// `spec.throttle`: at most one task per key and period.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ThrottleSpec {
    /// Template filled from the payload's top-level fields, like `uniqueKey`.
    pub key: String,
    /// 1ms to 400d, counted from the submit that stored the key's task.
    pub period: String,
    /// `refuse` (default): a submit over the limit is answered `409 throttled`. `drop`:
    /// it is answered `200` with `"dropped": true`, and nothing is stored.
    #[serde(default)]
    pub on_limit: OnLimit,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum OnLimit {
    #[default]
    Refuse,
    Drop,
}

/// A validated `spec.debounce` or `spec.throttle`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobWindow {
    pub template: String,
    pub rule: WindowRule,
}

/// A key window's rule and values, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowRule {
    Trailing {
        period: Duration,
        max_delay: Duration,
    },
    Leading {
        period: Duration,
    },
    Throttle {
        period: Duration,
        drop: bool,
    },
}

impl JobWindow {
    /// The key for a task with `payload`; an error names the missing field.
    pub fn render(&self, payload: &serde_json::Value) -> Result<String, String> {
        render(&self.template, "window key", payload)
    }
}

/// A period or cap given as `field`: 1ms to [`MAX_WINDOW`].
pub fn window_duration(field: &str, text: &str) -> Result<Duration, String> {
    let value = parse_duration(text)?;
    if value < Duration::from_millis(1) || value > MAX_WINDOW {
        return Err(format!("{field}: must be 1ms to 400d"));
    }
    Ok(value)
}

/// The values of a trailing or a leading debounce; a refusal names its field, as
/// `field.period` or `field.{cap}` (the cap's name: `maxDelay` in a job, `max_delay` in
/// a submit).
pub fn debounce_rule(
    period: &str,
    max_delay: Option<&str>,
    leading: bool,
    (field, cap): (&str, &str),
) -> Result<WindowRule, (String, String)> {
    let period_field = format!("{field}.period");
    let cap_field = format!("{field}.{cap}");
    let period = window_duration(&period_field, period).map_err(|m| (period_field, m))?;
    if leading {
        if max_delay.is_some() {
            return Err((cap_field, "only a trailing debounce has a cap".into()));
        }
        return Ok(WindowRule::Leading { period });
    }
    let max_delay = match max_delay {
        None => MAX_WINDOW,
        Some(text) => {
            let cap = window_duration(&cap_field, text).map_err(|m| (cap_field.clone(), m))?;
            if cap < period {
                return Err((cap_field, "must be at least the period".into()));
            }
            cap
        }
    };
    Ok(WindowRule::Trailing { period, max_delay })
}

/// `spec.debounce` and `spec.throttle`, at most one of them, checked.
pub(super) fn validate_window(
    debounce: Option<&DebounceSpec>,
    throttle: Option<&ThrottleSpec>,
) -> Result<Option<JobWindow>, SpecError> {
    let (template, field, rule) = match (debounce, throttle) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => {
            return Err(SpecError::new(
                "spec.throttle",
                "give spec.debounce or spec.throttle, not both",
            ));
        }
        (Some(d), None) => {
            let rule = debounce_rule(
                &d.period,
                d.max_delay.as_deref(),
                d.mode == DebounceMode::Leading,
                ("spec.debounce", "maxDelay"),
            );
            (&d.key, "spec.debounce", rule)
        }
        (None, Some(t)) => {
            let field = "spec.throttle.period";
            let rule = window_duration(field, &t.period)
                .map(|period| WindowRule::Throttle {
                    period,
                    drop: t.on_limit == OnLimit::Drop,
                })
                .map_err(|m| (field.to_string(), m));
            (&t.key, "spec.throttle", rule)
        }
    };
    let rule = rule.map_err(|(field, message)| SpecError::new(field, message))?;
    let key_field = format!("{field}.key");
    check_template(template).map_err(|m| SpecError::new(key_field.clone(), m))?;
    if !template.contains('{') || template.contains("{}") {
        return Err(SpecError::new(
            key_field,
            format!("{template:?} must name a payload field ({{field}})"),
        ));
    }
    Ok(Some(JobWindow {
        template: template.clone(),
        rule,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn debounce(period: &str, max_delay: Option<&str>, mode: DebounceMode) -> DebounceSpec {
        DebounceSpec {
            key: "user:{user_id}".into(),
            period: period.into(),
            max_delay: max_delay.map(str::to_string),
            mode,
        }
    }

    #[test]
    fn a_window_is_checked_field_by_field() {
        let trailing = validate_window(
            Some(&debounce("30s", Some("5m"), DebounceMode::Trailing)),
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            trailing.rule,
            WindowRule::Trailing {
                period: Duration::from_secs(30),
                max_delay: Duration::from_secs(300)
            }
        );
        assert_eq!(
            trailing.render(&serde_json::json!({"user_id": 7})),
            Ok("user:7".to_string())
        );
        let refused = |d: Option<DebounceSpec>, t: Option<ThrottleSpec>| {
            validate_window(d.as_ref(), t.as_ref()).unwrap_err().field
        };
        let throttle = ThrottleSpec {
            key: "user:{user_id}".into(),
            period: "1m".into(),
            on_limit: OnLimit::Drop,
        };
        assert_eq!(
            refused(
                Some(debounce("30s", None, DebounceMode::Trailing)),
                Some(throttle.clone())
            ),
            "spec.throttle"
        );
        assert_eq!(
            refused(
                Some(debounce("30s", Some("10s"), DebounceMode::Trailing)),
                None
            ),
            "spec.debounce.maxDelay"
        );
        assert_eq!(
            refused(
                Some(debounce("30s", Some("1m"), DebounceMode::Leading)),
                None
            ),
            "spec.debounce.maxDelay"
        );
        assert_eq!(
            refused(Some(debounce("0s", None, DebounceMode::Trailing)), None),
            "spec.debounce.period"
        );
        let constant = ThrottleSpec {
            key: "everyone".into(),
            ..throttle.clone()
        };
        assert_eq!(refused(None, Some(constant)), "spec.throttle.key");
        assert_eq!(
            validate_window(None, Some(&throttle))
                .unwrap()
                .unwrap()
                .rule,
            WindowRule::Throttle {
                period: Duration::from_secs(60),
                drop: true
            }
        );
    }
}

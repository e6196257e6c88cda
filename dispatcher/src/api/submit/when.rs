//! When a submitted or changed task is due and when it expires, from the request's
//! `delay`, `eta`, `expires_at` and `start_within`, each bounded and refused naming the
//! field.

use std::time::Duration;

use asyncd_spec::{MIN_TIMEOUT, parse_duration};

use crate::api::error::ApiError;
use asyncd_store::Millis;

/// The furthest ahead a task may be due, and the longest it may wait to begin past that.
pub const MAX_DELAY: Duration = Duration::from_secs(400 * 86_400);

/// A trigger instant given as `field`, at most [`MAX_DELAY`] after `now`.
pub fn not_too_far(field: &str, at: Millis, now: Millis) -> Result<Millis, ApiError> {
    if at > now + MAX_DELAY {
        return Err(ApiError::field(field, "must be at most 400 days ahead"));
    }
    Ok(at)
}

/// The due time a request gives as `delay` or `eta` (one of them at most), if it gives
/// one.
pub(super) fn due_at(
    delay: Option<&str>,
    eta: Option<&str>,
    now: Millis,
) -> Result<Option<Millis>, ApiError> {
    Ok(Some(match (delay, eta) {
        (Some(_), Some(_)) => {
            return Err(ApiError::field("eta", "give delay or eta, not both"));
        }
        (Some(delay), None) => {
            let delay = parse_duration(delay).map_err(|m| ApiError::field("delay", m))?;
            if delay > MAX_DELAY {
                return Err(ApiError::field("delay", "must be at most 400 days"));
            }
            now + delay
        }
        (None, Some(eta)) => {
            let eta = Millis::new(
                chrono::DateTime::parse_from_rfc3339(eta)
                    .map_err(|e| {
                        ApiError::field("eta", format!("{eta:?} is not an RFC 3339 time ({e})"))
                    })?
                    .timestamp_millis(),
            );
            // A time in the past means "now", as in Cloud Tasks.
            not_too_far("eta", eta, now)?.max(now)
        }
        (None, None) => return Ok(None),
    }))
}

/// When a task due at `trigger_at` expires: at the request's `expires_at`, or
/// `start_within` after it is due, or, when it gives neither, its job's
/// `spec.startWithin` after it is due; `None` when it never expires.
pub(super) fn expiry(
    expires_at: Option<&str>,
    start_within: Option<&str>,
    job_default: Option<Duration>,
    trigger_at: Millis,
) -> Result<Option<Millis>, ApiError> {
    let at = match (expires_at, start_within) {
        (Some(_), Some(_)) => {
            return Err(ApiError::field(
                "start_within",
                "give expires_at or start_within, not both",
            ));
        }
        (Some(text), None) => Millis::new(
            chrono::DateTime::parse_from_rfc3339(text)
                .map_err(|e| {
                    ApiError::field(
                        "expires_at",
                        format!("{text:?} is not an RFC 3339 time ({e})"),
                    )
                })?
                .timestamp_millis(),
        ),
        (None, Some(text)) => {
            let within = parse_duration(text).map_err(|m| ApiError::field("start_within", m))?;
            if within < MIN_TIMEOUT || within > MAX_DELAY {
                return Err(ApiError::field(
                    "start_within",
                    "must be at least 1ms and at most 400 days",
                ));
            }
            trigger_at + within
        }
        (None, None) => return Ok(job_default.map(|within| trigger_at + within)),
    };
    after_due(at, trigger_at).map(Some)
}

/// An expiry `at` (`expires_at`) of a task due at `trigger_at`: after it, by at most
/// [`MAX_DELAY`].
pub fn after_due(at: Millis, trigger_at: Millis) -> Result<Millis, ApiError> {
    if at <= trigger_at {
        return Err(ApiError::field(
            "expires_at",
            "must be after the task is due (now, or its delay or eta)",
        ));
    }
    if at > trigger_at + MAX_DELAY {
        return Err(ApiError::field(
            "expires_at",
            "must be at most 400 days after the task is due",
        ));
    }
    Ok(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = Millis::new(1_800_000_000_000);

    fn field(result: Result<Option<Millis>, ApiError>) -> Option<String> {
        result.err().and_then(|err| err.error.field)
    }

    #[test]
    fn an_expiry_comes_from_the_request_else_the_job_and_is_after_the_task_is_due() {
        let due = NOW + Duration::from_secs(60);
        let job = Some(Duration::from_secs(300));
        assert_eq!(expiry(None, None, None, due).unwrap(), None);
        assert_eq!(
            expiry(None, None, job, due).unwrap(),
            Some(due + Duration::from_secs(300))
        );
        assert_eq!(
            expiry(None, Some("10s"), job, due).unwrap(),
            Some(due + Duration::from_secs(10)),
            "counted from when the task is due, the request's over the job's"
        );
        assert_eq!(
            expiry(Some("2027-01-15T08:02:00Z"), None, job, due).unwrap(),
            Some(NOW + Duration::from_secs(120))
        );
        assert_eq!(
            field(expiry(Some("2027-01-15T08:01:00Z"), None, None, due)).as_deref(),
            Some("expires_at"),
            "at the due time it could never begin"
        );
        assert_eq!(
            field(expiry(Some("2027-01-15T08:02:00Z"), Some("1s"), None, due)).as_deref(),
            Some("start_within")
        );
        assert_eq!(
            field(expiry(None, Some("401d"), None, due)).as_deref(),
            Some("start_within")
        );
        assert_eq!(after_due(due + MAX_DELAY, due).ok(), Some(due + MAX_DELAY));
        assert!(after_due(due + MAX_DELAY + Duration::from_millis(1), due).is_err());
    }
}

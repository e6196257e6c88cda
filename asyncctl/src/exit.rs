//! Exit codes a script can rely on (asyncctl/README.md, "Exit codes").

use asyncd_client::Error;

/// Done.
pub const OK: u8 = 0;
/// Anything not listed below: the server unreachable, a 5xx other than 503, an answer
/// that does not decode.
pub const OTHER: u8 = 1;
/// A usage error: a bad flag or argument (clap's own code), a bad config file, or a
/// request the API refused as invalid (400, 413).
pub const USAGE: u8 = 2;
/// No such task, job, cron entry or schedule (404).
pub const NOT_FOUND: u8 = 3;
/// No usable credentials, or not allowed on this job (401, 403).
pub const DENIED: u8 = 4;
/// The task is not in a state that allows it: cancelling a finished task, redriving one
/// that is not dead, a unique key held by another task; a schedule name the job already
/// has, a change of a schedule that is its config's cron entry (409).
pub const CONFLICT: u8 = 5;
/// The server is up but cannot serve now: its store or Kafka or the Kubernetes API
/// did not answer (503). Trying again later may succeed.
pub const UNAVAILABLE: u8 = 6;

/// A command that failed: what to print, and the exit code.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

pub fn usage(message: impl Into<String>) -> Failure {
    Failure {
        code: USAGE,
        message: message.into(),
    }
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        let code = match err.status() {
            Some(400 | 413 | 422) => USAGE,
            Some(401 | 403) => DENIED,
            Some(404) => NOT_FOUND,
            Some(409) => CONFLICT,
            Some(503) => UNAVAILABLE,
            Some(_) => OTHER,
            None => match err {
                // Refused by the SDK before anything was sent.
                Error::MissingIdempotencyKey | Error::InvalidTask(_) | Error::Config(_) => USAGE,
                _ => OTHER,
            },
        };
        Failure {
            code,
            message: err.to_string(),
        }
    }
}

impl From<anyhow::Error> for Failure {
    fn from(err: anyhow::Error) -> Self {
        Failure {
            code: OTHER,
            message: format!("{err:#}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use asyncd_client::{ApiError, ErrorCode};

    #[test]
    fn each_refusal_has_its_code() {
        let api = |status: u16, code: &str| -> Failure {
            Error::from(ApiError {
                status,
                code: ErrorCode::parse(code),
                message: "m".into(),
                field: None,
                existing_id: None,
                state: None,
                retry_after: None,
            })
            .into()
        };
        assert_eq!(api(404, "not_found").code, NOT_FOUND);
        assert_eq!(api(401, "unauthenticated").code, DENIED);
        assert_eq!(api(403, "forbidden").code, DENIED);
        assert_eq!(api(409, "not_cancellable").code, CONFLICT);
        assert_eq!(api(409, "schedule_exists").code, CONFLICT);
        assert_eq!(api(409, "schedule_read_only").code, CONFLICT);
        assert_eq!(api(400, "invalid_field").code, USAGE);
        assert_eq!(api(503, "store_unavailable").code, UNAVAILABLE);
        assert_eq!(api(500, "http_error").code, OTHER);
        assert_eq!(Failure::from(Error::MissingIdempotencyKey).code, USAGE);
    }
}

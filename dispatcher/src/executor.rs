//! The executor contract, client side: one HTTP call per attempt, and the reading of
//! its answer into an [`AttemptOutcome`]. What an outcome does to the task is [`crate::retry`]'s
//! business.

use std::time::{Duration, SystemTime};

use asyncd_contract::time::from_millis;
use asyncd_contract::{ExecutorAccepted, ExecutorCall, headers, sign};
use asyncd_spec::Job;
use serde_json::value::RawValue;

use crate::store::{ClaimedTask, Started};

/// What an executor's answer means for the attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptOutcome {
    Succeeded,
    /// 202: long-running; the executor keeps the lease with heartbeats.
    Accepted {
        lease: Duration,
    },
    /// 429/503 with `Retry-After`.
    RetryAfter {
        after: Duration,
        reason: String,
    },
    /// 5xx, connection error, or timeout: retry with backoff.
    Retry {
        reason: String,
        timed_out: bool,
    },
    /// Other 4xx: dead letters at once.
    Permanent {
        reason: String,
    },
}

impl AttemptOutcome {
    /// The `status` label of `asyncd_task_executed_total`.
    pub fn status_label(&self) -> &'static str {
        match self {
            Self::Succeeded | Self::Accepted { .. } => "success",
            Self::Retry {
                timed_out: true, ..
            } => "timeout",
            _ => "failed",
        }
    }
}

pub struct ExecutorClient {
    client: reqwest::Client,
    callback_url: String,
    /// Sent as `Asyncd-Dispatcher`, so an executor's logs say which process called.
    dispatcher: String,
}

impl ExecutorClient {
    /// `callback_url` is where executors reach the API for heartbeats and results.
    pub fn new(callback_url: String, dispatcher: String) -> Self {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            .build()
            .expect("HTTP client builds");
        Self {
            client,
            callback_url,
            dispatcher,
        }
    }

    pub async fn call(&self, job: &Job, task: &ClaimedTask, started: &Started) -> AttemptOutcome {
        let timeout = Duration::from_millis(task.timeout_ms.max(1) as u64);
        let body = serde_json::to_vec(&ExecutorCall::<&RawValue> {
            id: task.id.clone(),
            task_type: task.task_type.clone(),
            payload: &task.payload,
            attempt: started.attempt,
            eta: Some(from_millis(task.trigger_at)),
        })
        .expect("task body serializes");
        let mut request = self
            .client
            .post(&job.executor_url)
            .timeout(timeout)
            .header("content-type", "application/json")
            .header(
                headers::IDEMPOTENCY_KEY,
                task.idempotency_key.as_deref().unwrap_or(&task.id),
            )
            .header(headers::TASK_ID, &task.id)
            .header(headers::ATTEMPT, started.attempt.to_string())
            .header(headers::LEASE_TOKEN, started.lease_token.to_string())
            .header(headers::CALLBACK_URL, &self.callback_url)
            .header(headers::DISPATCHER, &self.dispatcher);
        if let Some(secret) = job
            .signing_secret_env
            .as_deref()
            .and_then(|var| std::env::var(var).ok())
        {
            let timestamp = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs() as i64;
            request = request
                .header(headers::TIMESTAMP, timestamp.to_string())
                .header(
                    headers::SIGNATURE,
                    sign(secret.as_bytes(), timestamp, &body),
                );
        }
        let response = match request.body(body).send().await {
            Ok(response) => response,
            Err(err) => return transport_failure(&err),
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(headers::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = match response.bytes().await {
            Ok(body) => body,
            Err(err) => return transport_failure(&err),
        };
        classify(
            status,
            retry_after.as_deref(),
            &body,
            SystemTime::now(),
            timeout,
        )
    }
}

fn transport_failure(err: &reqwest::Error) -> AttemptOutcome {
    AttemptOutcome::Retry {
        reason: format!("executor call failed: {err}"),
        timed_out: err.is_timeout(),
    }
}

/// Reads an executor's answer. `default_lease` is used for a 202 that names none.
pub fn classify(
    status: u16,
    retry_after: Option<&str>,
    body: &[u8],
    now: SystemTime,
    default_lease: Duration,
) -> AttemptOutcome {
    let snippet = || {
        let text = String::from_utf8_lossy(&body[..body.len().min(512)]);
        format!("executor answered {status}: {}", text.trim())
    };
    match status {
        202 => AttemptOutcome::Accepted {
            lease: lease_from(body).unwrap_or(default_lease),
        },
        200..=299 => AttemptOutcome::Succeeded,
        429 | 503 => match retry_after.and_then(|v| parse_retry_after(v, now)) {
            Some(after) => AttemptOutcome::RetryAfter {
                after,
                reason: snippet(),
            },
            None => AttemptOutcome::Retry {
                reason: snippet(),
                timed_out: false,
            },
        },
        400..=499 => AttemptOutcome::Permanent { reason: snippet() },
        _ => AttemptOutcome::Retry {
            reason: snippet(),
            timed_out: false,
        },
    }
}

/// `{"lease": "60s"}` or `{"lease_seconds": 60}`.
fn lease_from(body: &[u8]) -> Option<Duration> {
    let accepted: ExecutorAccepted = serde_json::from_slice(body).ok()?;
    if let Some(text) = accepted.lease {
        return asyncd_spec::parse_duration(&text)
            .ok()
            .filter(|d| !d.is_zero());
    }
    accepted
        .lease_seconds
        .filter(|s| *s > 0.0 && s.is_finite())
        .map(Duration::from_secs_f64)
}

/// `Retry-After` is either delay-seconds or an HTTP date.
fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(30);

    fn outcome(status: u16, retry_after: Option<&str>, body: &str) -> AttemptOutcome {
        classify(
            status,
            retry_after,
            body.as_bytes(),
            SystemTime::UNIX_EPOCH,
            LEASE,
        )
    }

    #[test]
    fn reads_the_contract() {
        assert_eq!(outcome(200, None, ""), AttemptOutcome::Succeeded);
        assert_eq!(outcome(204, None, ""), AttemptOutcome::Succeeded);
        assert_eq!(
            outcome(202, None, r#"{"lease":"90s"}"#),
            AttemptOutcome::Accepted {
                lease: Duration::from_secs(90)
            }
        );
        assert_eq!(
            outcome(202, None, r#"{"lease_seconds":2.5}"#),
            AttemptOutcome::Accepted {
                lease: Duration::from_millis(2500)
            }
        );
        assert_eq!(
            outcome(202, None, "not json"),
            AttemptOutcome::Accepted { lease: LEASE }
        );
        assert!(
            matches!(outcome(429, Some("7"), ""), AttemptOutcome::RetryAfter { after, .. } if after == Duration::from_secs(7))
        );
        assert!(
            matches!(outcome(503, Some("Thu, 01 Jan 1970 00:00:10 GMT"), ""), AttemptOutcome::RetryAfter { after, .. } if after == Duration::from_secs(10))
        );
        assert!(matches!(
            outcome(503, None, ""),
            AttemptOutcome::Retry { .. }
        ));
        assert!(
            matches!(outcome(404, None, "nope"), AttemptOutcome::Permanent { reason } if reason.contains("404") && reason.contains("nope"))
        );
        assert!(matches!(
            outcome(422, None, ""),
            AttemptOutcome::Permanent { .. }
        ));
        assert!(matches!(
            outcome(500, None, ""),
            AttemptOutcome::Retry {
                timed_out: false,
                ..
            }
        ));
        assert!(matches!(
            outcome(302, None, ""),
            AttemptOutcome::Retry { .. }
        ));
    }
}

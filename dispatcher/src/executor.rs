//! The executor contract, client side: one HTTP call per attempt, and the reading of
//! its answer into an [`AttemptOutcome`]. What an outcome does to the task is [`crate::retry`]'s
//! business.

use std::time::{Duration, SystemTime};

use asyncd_spec::Job;
use hmac::{Hmac, Mac};
use serde::Serialize;
use serde_json::value::RawValue;
use sha2::Sha256;

use crate::clock::rfc3339;
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

#[derive(Serialize)]
struct CallBody<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    task_type: &'a str,
    payload: &'a RawValue,
    attempt: u32,
    eta: String,
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
        let body = serde_json::to_vec(&CallBody {
            id: &task.id,
            task_type: &task.task_type,
            payload: &task.payload,
            attempt: started.attempt,
            eta: rfc3339(task.trigger_at),
        })
        .expect("task body serializes");
        let mut request = self
            .client
            .post(&job.executor_url)
            .timeout(timeout)
            .header("content-type", "application/json")
            .header(
                "idempotency-key",
                task.idempotency_key.as_deref().unwrap_or(&task.id),
            )
            .header("asyncd-task-id", &task.id)
            .header("asyncd-attempt", started.attempt.to_string())
            .header("asyncd-lease-token", started.lease_token.to_string())
            .header("asyncd-callback-url", &self.callback_url)
            .header("asyncd-dispatcher", &self.dispatcher);
        if let Some(secret) = job
            .signing_secret_env
            .as_deref()
            .and_then(|var| std::env::var(var).ok())
        {
            let timestamp = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            request = request
                .header("asyncd-timestamp", timestamp.to_string())
                .header(
                    "asyncd-signature",
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
            .get("retry-after")
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

/// `v1=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>`.
pub fn sign(secret: &[u8], timestamp: u64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1={}", hex::encode(mac.finalize().into_bytes()))
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
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    if let Some(text) = value.get("lease").and_then(|v| v.as_str()) {
        return asyncd_spec::parse_duration(text)
            .ok()
            .filter(|d| !d.is_zero());
    }
    value
        .get("lease_seconds")
        .and_then(|v| v.as_f64())
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

    #[test]
    fn signature_is_hmac_of_timestamp_dot_body() {
        // Independently computed: printf '1700000000.{}' | openssl dgst -sha256 -hmac secret
        assert_eq!(
            sign(b"secret", 1_700_000_000, b"{}"),
            "v1=b8569b78799ff9e3cbff0fc2d63a33a2b57f3282abd07c37ae5e8e7d79a5f163"
        );
    }
}

//! The retry policy: what an attempt's [`AttemptOutcome`] does to its task. Shared by the
//! dispatcher (synchronous answers), the result callback (202 attempts) and the rescuer
//! (lapsed leases), so all three retry the same way.

use std::time::Duration;

use asyncd_spec::Job;
use rand::Rng;

use crate::executor::{AttemptOutcome, MAX_LEASE, MAX_RETRY_AFTER};
use asyncd_store::{FinishKind, Millis};

/// `attempt` is the 1-based number of the attempt that just ended; a task is tried at
/// most `max_retries + 1` times.
pub fn settle(
    outcome: AttemptOutcome,
    attempt: u32,
    max_retries: u32,
    job: Option<&Job>,
    now: Millis,
) -> FinishKind {
    // Executors choose leases and retry delays; `Millis + Duration` saturates, so no ask
    // overflows the arithmetic.
    let retry_at = |delay: Duration| now + delay;
    let exhausted = attempt > max_retries;
    match outcome {
        AttemptOutcome::Succeeded => FinishKind::Succeeded { result: None },
        AttemptOutcome::Accepted { lease } => FinishKind::Extend {
            until: retry_at(lease.min(MAX_LEASE)),
        },
        AttemptOutcome::Permanent { reason } => FinishKind::Dead { error: reason },
        AttemptOutcome::RetryAfter { reason, .. }
        | AttemptOutcome::Overloaded { reason }
        | AttemptOutcome::Retry { reason, .. }
            if exhausted =>
        {
            FinishKind::Dead {
                error: format!("gave up after {attempt} attempts: {reason}"),
            }
        }
        AttemptOutcome::RetryAfter { after, reason } => FinishKind::Retry {
            at: retry_at(after.min(MAX_RETRY_AFTER)),
            error: reason,
        },
        AttemptOutcome::Overloaded { reason } | AttemptOutcome::Retry { reason, .. } => {
            FinishKind::Retry {
                at: retry_at(jittered(backoff(job, attempt))),
                error: reason,
            }
        }
    }
}

fn backoff(job: Option<&Job>, attempt: u32) -> Duration {
    match job {
        Some(job) => job.backoff_for(attempt),
        // A task whose job config is gone still backs off sensibly.
        None => Duration::from_secs(1)
            .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1).min(20)))
            .min(Duration::from_secs(600)),
    }
}

/// "Equal jitter": half the delay fixed, half random, so retries of tasks that failed
/// together spread out while each still waits at least half its backoff.
fn jittered(delay: Duration) -> Duration {
    let half = delay / 2;
    half + rand::rng().random_range(Duration::ZERO..=half)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transient() -> AttemptOutcome {
        AttemptOutcome::Retry {
            reason: "boom".into(),
            timed_out: false,
        }
    }

    #[test]
    fn retries_until_max_then_dead_letters() {
        let retried = |attempt| {
            matches!(
                settle(transient(), attempt, 2, None, Millis::new(0)),
                FinishKind::Retry { .. }
            )
        };
        assert!(retried(1));
        assert!(retried(2));
        assert!(
            matches!(settle(transient(), 3, 2, None, Millis::new(0)), FinishKind::Dead { error } if error.contains("3 attempts"))
        );
        assert!(matches!(
            settle(transient(), 1, 0, None, Millis::new(0)),
            FinishKind::Dead { .. }
        ));
    }

    #[test]
    fn backoff_is_jittered_between_half_and_full() {
        for attempt in 1..=4 {
            let full = 1000i64 << (attempt - 1);
            for _ in 0..50 {
                let FinishKind::Retry { at, .. } =
                    settle(transient(), attempt, 10, None, Millis::new(0))
                else {
                    panic!("expected a retry")
                };
                assert!(
                    (full / 2..=full).contains(&at.as_i64()),
                    "attempt {attempt}: {at}"
                );
            }
        }
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn any_outcome() -> impl Strategy<Value = AttemptOutcome> {
            let duration =
                (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n));
            prop_oneof![
                Just(AttemptOutcome::Succeeded),
                duration
                    .clone()
                    .prop_map(|lease| AttemptOutcome::Accepted { lease }),
                duration.prop_map(|after| AttemptOutcome::RetryAfter {
                    after,
                    reason: "r".into()
                }),
                any::<bool>().prop_map(|timed_out| AttemptOutcome::Retry {
                    reason: "r".into(),
                    timed_out
                }),
                Just(AttemptOutcome::Permanent { reason: "r".into() }),
            ]
        }

        proptest! {
            /// No outcome, attempt count or clock reading makes the arithmetic overflow or
            /// schedule anything in the past, and no wait exceeds the documented maxima.
            #[test]
            fn settle_never_overflows_or_goes_back(
                outcome in any_outcome(),
                attempt in 1u32..200,
                max_retries in 0u32..150,
                now in 0i64..=i64::MAX,
            ) {
                let now = Millis::new(now);
                let limit = |d: Duration| now + d;
                match settle(outcome, attempt, max_retries, None, now) {
                    FinishKind::Extend { until } => prop_assert!(until >= now && until <= limit(MAX_LEASE)),
                    FinishKind::Retry { at, .. } => {
                        prop_assert!(at >= now);
                        prop_assert!(at <= limit(MAX_RETRY_AFTER.max(Duration::from_secs(600))));
                    }
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn retry_after_is_obeyed_and_permanent_is_final() {
        let outcome = AttemptOutcome::RetryAfter {
            after: Duration::from_secs(7),
            reason: "busy".into(),
        };
        assert!(matches!(
            settle(outcome, 1, 3, None, Millis::new(1000)),
            FinishKind::Retry { at, .. } if at == Millis::new(8000)
        ));
        let outcome = AttemptOutcome::Permanent {
            reason: "bad".into(),
        };
        assert!(matches!(
            settle(outcome, 1, 3, None, Millis::new(0)),
            FinishKind::Dead { .. }
        ));
    }
}

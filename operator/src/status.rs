//! From what a reconcile pass saw and did to the status it writes: conditions with
//! reasons, `observedGeneration`, partitions and replicas. Pure, so every branch is tested
//! without a cluster.
//!
//! Conditions: `TopicReady`, `RoutingReady`, `DispatcherReady`, `ScalingReady` (one per
//! step of the pipeline), `Conflict`, and `Ready` (all four steps True). A step that did
//! not run because an earlier one failed is `Unknown` with reason `Pending`.

use asyncd_spec::Job;

use crate::conflicts::Conflict;
use crate::crd::{
    AsyncJobConfig, AsyncJobConfigStatus, AsyncLimiter, AsyncLimiterStatus, Condition,
    LimitsStatus, RateLimitStatus,
};

pub const READY: &str = "Ready";
pub const TOPIC_READY: &str = "TopicReady";
pub const ROUTING_READY: &str = "RoutingReady";
pub const DISPATCHER_READY: &str = "DispatcherReady";
pub const SCALING_READY: &str = "ScalingReady";
pub const CONFLICT: &str = "Conflict";

/// The steps, in pipeline order.
pub const STEPS: [&str; 4] = [TOPIC_READY, ROUTING_READY, DISPATCHER_READY, SCALING_READY];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    True,
    False,
    Unknown,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::True => "True",
            State::False => "False",
            State::Unknown => "Unknown",
        }
    }
}

/// The outcome of one step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub state: State,
    pub reason: String,
    pub message: String,
}

impl Step {
    pub fn ok(reason: &str, message: impl Into<String>) -> Self {
        Self {
            state: State::True,
            reason: reason.into(),
            message: message.into(),
        }
    }
    pub fn failed(reason: &str, message: impl Into<String>) -> Self {
        Self {
            state: State::False,
            reason: reason.into(),
            message: message.into(),
        }
    }
    pub fn pending(message: impl Into<String>) -> Self {
        Self {
            state: State::Unknown,
            reason: "Pending".into(),
            message: message.into(),
        }
    }
}

/// What a pass found.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// The spec failed `JobSpec::validate` (or an operator-only check).
    Invalid { field: String, message: String },
    /// Another config owns the task type or topic: nothing was changed.
    Conflict(Conflict),
    /// The pipeline ran; `steps` holds one outcome per entry of [`STEPS`].
    Reconciled(Report),
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub steps: Vec<Step>,
    pub partitions: Option<u32>,
    pub replicas: Option<i32>,
    pub ready_replicas: Option<i32>,
}

impl Report {
    /// A report whose steps are all pending; the pipeline fills them in as it goes.
    pub fn new() -> Self {
        Self {
            steps: STEPS
                .iter()
                .map(|_| Step::pending("waiting for an earlier step"))
                .collect(),
            ..Self::default()
        }
    }

    pub fn set(&mut self, type_: &str, step: Step) {
        let index = STEPS
            .iter()
            .position(|s| *s == type_)
            .expect("a known step");
        self.steps[index] = step;
    }

    pub fn step(&self, type_: &str) -> &Step {
        let index = STEPS
            .iter()
            .position(|s| *s == type_)
            .expect("a known step");
        &self.steps[index]
    }
}

/// The desired conditions for a verdict, before transition times are merged in.
pub fn conditions(verdict: &Verdict) -> Vec<(String, Step)> {
    let mut out: Vec<(String, Step)> = Vec::new();
    match verdict {
        Verdict::Invalid { field, message } => {
            let text = format!("{field}: {message}");
            out.push((READY.into(), Step::failed("InvalidSpec", text.clone())));
            for step in STEPS {
                out.push((step.into(), Step::pending(format!("invalid spec: {text}"))));
            }
            out.push((
                CONFLICT.into(),
                Step {
                    state: State::Unknown,
                    reason: "InvalidSpec".into(),
                    message: String::new(),
                },
            ));
        }
        Verdict::Conflict(conflict) => {
            out.push((READY.into(), Step::failed("Conflict", conflict.message())));
            for step in STEPS {
                out.push((
                    step.into(),
                    Step {
                        state: State::Unknown,
                        reason: "Conflict".into(),
                        message: format!("not reconciled: {}", conflict.reason()),
                    },
                ));
            }
            out.push((
                CONFLICT.into(),
                Step {
                    state: State::True,
                    reason: conflict.reason().into(),
                    message: conflict.message(),
                },
            ));
        }
        Verdict::Reconciled(report) => {
            let first_bad = report
                .steps
                .iter()
                .zip(STEPS)
                .find(|(s, _)| s.state != State::True);
            let ready = match first_bad {
                None => Step::ok(
                    "Reconciled",
                    "topic, route, dispatcher and autoscaler are in place",
                ),
                Some((step, name)) => Step {
                    state: if step.state == State::False {
                        State::False
                    } else {
                        State::Unknown
                    },
                    reason: step.reason.clone(),
                    message: format!("{name}: {}", step.message),
                },
            };
            out.push((READY.into(), ready));
            for (step, name) in report.steps.iter().zip(STEPS) {
                out.push((name.into(), step.clone()));
            }
            out.push((
                CONFLICT.into(),
                Step {
                    state: State::False,
                    reason: "NoConflict".into(),
                    message: "this config owns its task type and topic".into(),
                },
            ));
        }
    }
    out
}

/// The full status: conditions whose state did not change keep their
/// `lastTransitionTime`; partitions and replicas come from the report, or are kept from
/// the previous status when the pass did not look.
pub fn status(
    previous: Option<&AsyncJobConfigStatus>,
    verdict: &Verdict,
    generation: Option<i64>,
    now: &str,
) -> AsyncJobConfigStatus {
    let conditions = conditions(verdict)
        .into_iter()
        .map(|(type_, step)| {
            let before = previous.and_then(|p| p.condition(&type_));
            let last_transition_time = match before {
                Some(b) if b.status == step.state.as_str() => b.last_transition_time.clone(),
                _ => Some(now.to_string()),
            };
            Condition {
                type_,
                status: step.state.as_str().into(),
                reason: step.reason,
                message: step.message,
                last_transition_time,
                observed_generation: generation,
            }
        })
        .collect();
    let (partitions, replicas, ready_replicas) = match verdict {
        Verdict::Reconciled(r) => (r.partitions, r.replicas, r.ready_replicas),
        _ => (
            previous.and_then(|p| p.partitions),
            previous.and_then(|p| p.replicas),
            previous.and_then(|p| p.ready_replicas),
        ),
    };
    AsyncJobConfigStatus {
        observed_generation: generation,
        conditions,
        partitions,
        replicas,
        ready_replicas,
        paused: previous.and_then(|p| p.paused),
        limits: previous.and_then(|p| p.limits.clone()),
    }
}

/// `status.paused` and `status.limits` from the validated config; an invalid one keeps
/// what the last valid one showed.
pub fn with_job(mut status: AsyncJobConfigStatus, job: Option<&Job>) -> AsyncJobConfigStatus {
    if let Some(job) = job {
        status.paused = Some(job.paused);
        status.limits = Some(LimitsStatus {
            concurrency: job.concurrency,
            rate_limit: job.rate_limit.map(|r| RateLimitStatus {
                per_second: r.per_second,
                burst: r.burst,
            }),
            per_key: job.concurrency_key.as_ref().map(|key| key.limit),
            adaptive: job.adaptive.enabled,
        });
    }
    status
}

/// An AsyncLimiter's status: the configs of `configs` (its namespace's) whose
/// `spec.limiters` name it, sorted, those being deleted left out. `running` stays as the
/// usage loop last wrote it ([`crate::usage`]).
pub fn limiter_status<'a>(
    limiter: &AsyncLimiter,
    configs: impl IntoIterator<Item = &'a AsyncJobConfig>,
) -> AsyncLimiterStatus {
    let mut jobs: Vec<String> = configs
        .into_iter()
        .filter(|c| c.namespace() == limiter.namespace() && !c.is_deleting())
        .filter(|c| c.spec.limiters.iter().any(|n| n.trim() == limiter.name()))
        .map(|c| c.name().to_string())
        .collect();
    jobs.sort();
    jobs.dedup();
    AsyncLimiterStatus {
        observed_generation: limiter.metadata.generation,
        job_count: u32::try_from(jobs.len()).unwrap_or(u32::MAX),
        jobs,
        running: limiter.status.as_ref().and_then(|s| s.running),
    }
}

/// Condition changes worth an Event: `(warning, reason, message)` for each condition whose
/// status or reason changed, skipping the noise of steps going Pending.
pub fn transitions(
    previous: Option<&AsyncJobConfigStatus>,
    next: &AsyncJobConfigStatus,
) -> Vec<(bool, String, String)> {
    let mut out = Vec::new();
    for c in &next.conditions {
        let before = previous.and_then(|p| p.condition(&c.type_));
        let changed = before.is_none_or(|b| b.status != c.status || b.reason != c.reason);
        if !changed || c.status == "Unknown" {
            continue;
        }
        let warning = match c.type_.as_str() {
            CONFLICT => c.status == "True",
            _ => c.status == "False",
        };
        if c.type_ == CONFLICT && c.status == "False" && before.is_none() {
            continue; // not news on a first pass
        }
        if c.type_ == READY || warning {
            out.push((
                warning,
                c.reason.clone(),
                format!("{}: {}", c.type_, c.message),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conflicts::Claimed;

    fn all_ok() -> Report {
        let mut r = Report::new();
        r.set(
            TOPIC_READY,
            Step::ok("TopicCreated", "created with 6 partitions"),
        );
        r.set(
            ROUTING_READY,
            Step::ok("RouteApplied", "entry in asyncd-routing"),
        );
        r.set(DISPATCHER_READY, Step::ok("DeploymentApplied", "0/1 ready"));
        r.set(SCALING_READY, Step::ok("AutoscalerApplied", "1..6"));
        r.partitions = Some(6);
        r.replicas = Some(1);
        r
    }

    fn get<'a>(s: &'a AsyncJobConfigStatus, t: &str) -> &'a Condition {
        s.condition(t).unwrap()
    }

    #[test]
    fn limits_and_the_pause_show_with_their_defaults_and_stay_through_an_invalid_spec() {
        let yaml = "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata: {name: j}\n\
                    spec:\n  taskType: t\n  executor: {url: 'http://e/'}\n  paused: true\n  \
                    rateLimit: {perSecond: 20}\n  concurrencyKey: {key: '{m}', limit: 3}\n";
        let (_, job) = asyncd_spec::AsyncJobConfig::from_yaml(yaml).unwrap();
        let verdict = Verdict::Reconciled(all_ok());
        let s = with_job(status(None, &verdict, Some(1), "t1"), Some(&job));
        assert_eq!(s.paused, Some(true));
        assert_eq!(
            s.limits,
            Some(LimitsStatus {
                concurrency: 100,
                rate_limit: Some(RateLimitStatus {
                    per_second: 20,
                    burst: 20
                }),
                per_key: Some(3),
                adaptive: true,
            })
        );
        let invalid = Verdict::Invalid {
            field: "spec.rateLimit.perSecond".into(),
            message: "must be 1 to 1000000, not 0".into(),
        };
        let kept = with_job(status(Some(&s), &invalid, Some(2), "t2"), None);
        assert_eq!((kept.paused, kept.limits), (s.paused, s.limits.clone()));
        // Written as null, so a merge patch removes a rate limit the spec dropped.
        let mut no_rate = s.clone();
        no_rate.limits.as_mut().unwrap().rate_limit = None;
        let json = serde_json::to_value(&no_rate).unwrap();
        assert!(json["limits"]["rateLimit"].is_null());
        assert!(
            json["limits"]
                .as_object()
                .unwrap()
                .contains_key("rateLimit")
        );
    }

    #[test]
    fn ready_when_every_step_is_true() {
        let s = status(None, &Verdict::Reconciled(all_ok()), Some(3), "t1");
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(get(&s, READY).status, "True");
        assert_eq!(get(&s, READY).reason, "Reconciled");
        assert_eq!(get(&s, CONFLICT).status, "False");
        assert_eq!(s.partitions, Some(6));
        assert_eq!(s.replicas, Some(1));
        let types: Vec<_> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            types,
            [
                READY,
                TOPIC_READY,
                ROUTING_READY,
                DISPATCHER_READY,
                SCALING_READY,
                CONFLICT
            ]
        );
        assert!(
            s.conditions
                .iter()
                .all(|c| c.observed_generation == Some(3))
        );
    }

    #[test]
    fn a_refused_shrink_is_not_ready_and_says_why() {
        let mut r = all_ok();
        r.set(
            TOPIC_READY,
            Step::failed("ShrinkRefused", "topic has 12 partitions; spec asks 6"),
        );
        r.partitions = Some(12);
        let s = status(None, &Verdict::Reconciled(r), Some(4), "t1");
        assert_eq!(get(&s, TOPIC_READY).status, "False");
        assert_eq!(get(&s, READY).status, "False");
        assert_eq!(get(&s, READY).reason, "ShrinkRefused");
        assert!(
            get(&s, READY)
                .message
                .starts_with("TopicReady: topic has 12")
        );
        assert_eq!(s.partitions, Some(12));
    }

    #[test]
    fn a_failed_step_leaves_later_ones_pending() {
        let mut r = Report::new();
        r.set(TOPIC_READY, Step::failed("KafkaUnavailable", "broker down"));
        let s = status(None, &Verdict::Reconciled(r), Some(1), "t1");
        assert_eq!(get(&s, READY).reason, "KafkaUnavailable");
        assert_eq!(get(&s, ROUTING_READY).status, "Unknown");
        assert_eq!(get(&s, ROUTING_READY).reason, "Pending");
    }

    #[test]
    fn conflict_names_the_owner() {
        let verdict = Verdict::Conflict(Conflict {
            owner: "order-cancel-job".into(),
            what: Claimed::TaskType,
            value: "cancel_expired_order".into(),
        });
        let s = status(None, &verdict, Some(1), "t1");
        assert_eq!(get(&s, CONFLICT).status, "True");
        assert_eq!(get(&s, CONFLICT).reason, "TaskTypeOwnedByOther");
        assert!(get(&s, CONFLICT).message.contains("\"order-cancel-job\""));
        assert_eq!(get(&s, READY).status, "False");
        assert_eq!(get(&s, READY).reason, "Conflict");
        assert_eq!(s.partitions, None, "a config in conflict reports no topic");
    }

    #[test]
    fn invalid_spec_names_the_field() {
        let verdict = Verdict::Invalid {
            field: "spec.executor.url".into(),
            message: "must be http".into(),
        };
        let s = status(None, &verdict, Some(2), "t1");
        assert_eq!(get(&s, READY).reason, "InvalidSpec");
        assert_eq!(get(&s, READY).message, "spec.executor.url: must be http");
    }

    #[test]
    fn transition_times_change_only_with_the_status() {
        let first = status(None, &Verdict::Reconciled(all_ok()), Some(1), "t1");
        let again = status(Some(&first), &Verdict::Reconciled(all_ok()), Some(1), "t2");
        assert_eq!(first, again, "a steady state writes the same status");
        let mut r = all_ok();
        r.set(TOPIC_READY, Step::failed("ShrinkRefused", "no"));
        let third = status(Some(&again), &Verdict::Reconciled(r), Some(2), "t3");
        assert_eq!(
            get(&third, TOPIC_READY).last_transition_time.as_deref(),
            Some("t3")
        );
        assert_eq!(
            get(&third, ROUTING_READY).last_transition_time.as_deref(),
            Some("t1")
        );
    }

    #[test]
    fn transitions_make_events_once() {
        let first = status(None, &Verdict::Reconciled(all_ok()), Some(1), "t1");
        let events = transitions(None, &first);
        assert_eq!(
            events,
            [(
                false,
                "Reconciled".to_string(),
                "Ready: topic, route, dispatcher and autoscaler are in place".to_string()
            )]
        );
        assert!(transitions(Some(&first), &first).is_empty());
        let conflict = status(
            Some(&first),
            &Verdict::Conflict(Conflict {
                owner: "a".into(),
                what: Claimed::Topic,
                value: "t".into(),
            }),
            Some(2),
            "t2",
        );
        let events = transitions(Some(&first), &conflict);
        assert!(
            events
                .iter()
                .any(|(w, r, _)| *w && r == "TopicOwnedByOther"),
            "{events:?}"
        );
        assert!(
            events.iter().any(|(w, r, _)| *w && r == "Conflict"),
            "{events:?}"
        );
    }

    #[test]
    fn a_limiters_status_lists_the_configs_of_its_namespace_that_name_it() {
        let limiter = crate::fixtures::limiter("psp", |s| s.concurrency = Some(2));
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let b = crate::fixtures::config_with("b", |s| s.limiters = names(&["bank", "psp "]));
        let a = crate::fixtures::config_with("a", |s| s.limiters = names(&["psp"]));
        let other = crate::fixtures::config_with("c", |s| s.limiters = names(&["bank"]));
        let mut gone = crate::fixtures::config_with("d", |s| s.limiters = names(&["psp"]));
        gone.metadata.deletion_timestamp = gone.metadata.creation_timestamp.clone();
        let mut elsewhere = crate::fixtures::config_with("e", |s| s.limiters = names(&["psp"]));
        elsewhere.metadata.namespace = Some("bank".into());
        let s = limiter_status(&limiter, [&b, &a, &other, &gone, &elsewhere]);
        assert_eq!(
            s,
            AsyncLimiterStatus {
                observed_generation: Some(1),
                jobs: names(&["a", "b"]),
                job_count: 2,
                running: None,
            }
        );
        assert_eq!(limiter_status(&limiter, []).job_count, 0);
        // the usage loop's figure is not the routing rebuild's to change
        let mut counted = limiter.clone();
        counted.status = Some(AsyncLimiterStatus {
            running: Some(4),
            ..s
        });
        assert_eq!(limiter_status(&counted, [&a]).running, Some(4));
    }
}

//! Step 2, validate: the dispatcher's own spec check, what only a cluster needs (the
//! operator's caps among it), that every AsyncLimiter the config names exists in its
//! namespace ([`check_limiters`]), then ownership ([`conflicts::resolve`]). A config that
//! fails any changes nothing.

use std::sync::Arc;

use asyncd_spec::{Job, SpecError};

use crate::builders::routing;
use crate::conflicts::{self, Ownership};
use crate::crd::{AsyncJobConfig, AsyncLimiter};
use crate::policy::Policy;
use crate::status::Verdict;

/// The AsyncLimiters of one namespace, as a pass listed them.
#[derive(Clone, Debug, Default)]
pub struct Limiters {
    /// Sorted by name.
    pub items: Vec<AsyncLimiter>,
    /// Why the namespace's limiters could not be listed (the CRD is not installed, the
    /// operator may not list them): then there are none.
    pub unavailable: Option<String>,
}

impl Limiters {
    pub fn new(mut items: Vec<AsyncLimiter>) -> Self {
        items.sort_by(|a, b| a.name().cmp(b.name()));
        Self {
            items,
            unavailable: None,
        }
    }

    /// The limiters a dispatcher can load: valid, and not being deleted.
    pub fn routable(&self) -> Vec<&AsyncLimiter> {
        self.items
            .iter()
            .filter(|l| !l.is_deleting() && validate_limiter(l).is_ok())
            .collect()
    }
}

/// The dispatcher's own check of a limiter: [`asyncd_spec::AsyncLimiter::validate`] on the
/// very document the routing ConfigMap would hold.
pub fn validate_limiter(limiter: &AsyncLimiter) -> Result<asyncd_spec::Limiter, SpecError> {
    routing::limiter_document(limiter).validate()
}

/// Each name of `job`'s `spec.limiters` must be an AsyncLimiter of `namespace` that a
/// dispatcher can load: the error names `spec.limiters[i]`. A config that fails this is
/// not routed — a dispatcher refuses a whole routing table in which one job does not bind.
pub fn check_limiters(job: &Job, namespace: &str, limiters: &Limiters) -> Result<(), SpecError> {
    for (index, name) in job.limiter_names.iter().enumerate() {
        let field = format!("spec.limiters[{index}]");
        let found = limiters.items.iter().find(|l| l.name() == name);
        let message = match found {
            None if limiters.unavailable.is_some() => format!(
                "no AsyncLimiter {name:?} in namespace {namespace:?} can be read: {}; the \
                 config is not routed until it can",
                limiters.unavailable.as_deref().unwrap_or_default()
            ),
            None => format!(
                "no AsyncLimiter {name:?} in namespace {namespace:?}; the config is not routed \
                 until it exists (or the name is removed)"
            ),
            Some(l) if l.is_deleting() => format!(
                "AsyncLimiter {name:?} is being deleted; the config is not routed while it \
                 names it"
            ),
            Some(l) => match validate_limiter(l) {
                Ok(_) => continue,
                Err(err) => format!(
                    "AsyncLimiter {name:?} is invalid ({}: {}); the config is not routed until \
                     it is fixed",
                    err.field, err.message
                ),
            },
        };
        return Err(SpecError { field, message });
    }
    Ok(())
}

/// The dispatcher's own validation, plus what only a cluster needs: replicas of at least
/// one, and the operator's caps (the CRD's maximums are the ceiling; the operator's flags
/// may set them lower).
pub fn validate(config: &AsyncJobConfig, policy: &Policy) -> Result<Job, SpecError> {
    let job = config.spec.validate(config.name())?;
    let refuse = |field: &str, message: String| {
        Err(SpecError {
            field: field.into(),
            message,
        })
    };
    if let Some(kafka) = &config.spec.kafka
        && kafka.partitions > policy.max_partitions
    {
        return refuse(
            "spec.kafka.partitions",
            format!(
                "{} is above this operator's cap of {} partitions (--max-partitions)",
                kafka.partitions, policy.max_partitions
            ),
        );
    }
    if let Some(scaling) = &config.spec.scaling {
        for (field, value) in [
            ("spec.scaling.minReplicas", scaling.min_replicas),
            ("spec.scaling.maxReplicas", scaling.max_replicas),
            ("spec.scaling.targetDueBacklog", scaling.target_due_backlog),
        ] {
            if value == Some(0) {
                return refuse(field, "must be at least 1".into());
            }
        }
        for (field, value) in [
            ("spec.scaling.minReplicas", scaling.min_replicas),
            ("spec.scaling.maxReplicas", scaling.max_replicas),
        ] {
            if let Some(asked) = value.filter(|v| *v > policy.max_replicas) {
                return refuse(
                    field,
                    format!(
                        "{asked} is above this operator's cap of {} replicas (--max-replicas)",
                        policy.max_replicas
                    ),
                );
            }
        }
    }
    Ok(job)
}

/// Whether `config` may go on to build and apply: `Err` carries the verdict of a config
/// that is invalid, names an AsyncLimiter it cannot bind (reported as invalid, on
/// `spec.limiters[i]`), or is in conflict with one of `peers`. A config not yet in the cache
/// owns what nobody else claims.
pub fn admit(
    config: &AsyncJobConfig,
    peers: &[Arc<AsyncJobConfig>],
    limiters: &Limiters,
    policy: &Policy,
) -> Result<(), Verdict> {
    let invalid = |err: SpecError| Verdict::Invalid {
        field: err.field,
        message: err.message,
    };
    let job = validate(config, policy).map_err(invalid)?;
    check_limiters(&job, config.namespace(), limiters).map_err(invalid)?;
    match conflicts::resolve(peers.iter().map(|c| c.as_ref())).remove(config.name()) {
        Some(Ownership::Conflict(conflict)) => Err(Verdict::Conflict(conflict)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn validation_is_the_dispatchers_plus_scaling_bounds() {
        let policy = Policy::default();
        let ok = fixtures::sample("order-cancel-job.yaml");
        assert!(validate(&ok, &policy).is_ok());
        let bad = fixtures::config_with("x", |s| s.executor.url = "ftp://nope".into());
        assert_eq!(
            validate(&bad, &policy).unwrap_err().field,
            "spec.executor.url"
        );
        let bad = fixtures::config_with("x", |s| {
            s.scaling = Some(asyncd_spec::job::ScalingSpec {
                max_replicas: Some(0),
                ..Default::default()
            })
        });
        assert_eq!(
            validate(&bad, &policy).unwrap_err().field,
            "spec.scaling.maxReplicas"
        );
    }

    #[test]
    fn partitions_and_replicas_above_the_operators_caps_are_refused_naming_the_field() {
        let policy = Policy {
            max_partitions: 12,
            max_replicas: 4,
            ..Policy::default()
        };
        let at_caps = fixtures::config_with("x", |s| {
            s.kafka.as_mut().unwrap().partitions = 12;
            s.scaling = Some(asyncd_spec::job::ScalingSpec {
                min_replicas: Some(4),
                max_replicas: Some(4),
                ..Default::default()
            })
        });
        assert!(validate(&at_caps, &policy).is_ok());
        let mut partitions = at_caps.clone();
        partitions.spec.0.kafka.as_mut().unwrap().partitions = 13;
        let err = validate(&partitions, &policy).unwrap_err();
        assert_eq!(err.field, "spec.kafka.partitions");
        assert!(err.message.contains("cap of 12"), "{}", err.message);
        for (field, edit) in [
            (
                "spec.scaling.minReplicas",
                (|s: &mut asyncd_spec::job::ScalingSpec| {
                    s.min_replicas = Some(5);
                    s.max_replicas = Some(5);
                }) as fn(&mut asyncd_spec::job::ScalingSpec),
            ),
            ("spec.scaling.maxReplicas", |s| s.max_replicas = Some(5)),
        ] {
            let mut replicas = at_caps.clone();
            edit(replicas.spec.0.scaling.as_mut().unwrap());
            let err = validate(&replicas, &policy).unwrap_err();
            assert_eq!(err.field, field);
            assert!(err.message.contains("cap of 4 replicas"), "{}", err.message);
        }
    }

    #[test]
    fn the_younger_of_two_claimants_is_not_admitted() {
        let old = Arc::new(fixtures::aged("old", 1, |_| {}));
        let young = Arc::new(fixtures::aged("young", 2, |s| s.task_type = "other".into()));
        let peers = [old.clone(), young.clone()];
        let policy = Policy::default();
        let none = Limiters::default();
        assert!(admit(&old, &peers, &none, &policy).is_ok());
        assert!(
            matches!(admit(&young, &peers, &none, &policy), Err(Verdict::Conflict(c)) if c.owner == "old")
        );
        let invalid = fixtures::config_with("x", |s| s.executor.url = "ftp://nope".into());
        assert!(matches!(
            admit(&invalid, &[], &none, &policy),
            Err(Verdict::Invalid { field, .. }) if field == "spec.executor.url"
        ));
    }

    fn job(limiters: &[&str]) -> Job {
        let config = fixtures::config_with("x", |s| {
            s.limiters = limiters.iter().map(|n| n.to_string()).collect()
        });
        validate(&config, &Policy::default()).unwrap()
    }

    #[test]
    fn every_limiter_a_config_names_must_exist_and_be_valid_naming_the_field() {
        let psp = fixtures::limiter("psp", |s| s.concurrency = Some(3));
        let bank = fixtures::limiter("bank", |s| {
            s.rate_limit = Some(asyncd_spec::job::RateLimitSpec {
                per_second: 5,
                burst: None,
            })
        });
        let limiters = Limiters::new(vec![psp.clone(), bank]);
        assert!(check_limiters(&job(&[]), "shop", &limiters).is_ok());
        assert!(check_limiters(&job(&["bank", " psp"]), "shop", &limiters).is_ok());

        let missing = check_limiters(&job(&["psp", "card"]), "shop", &limiters).unwrap_err();
        assert_eq!(missing.field, "spec.limiters[1]");
        assert!(
            missing
                .message
                .starts_with("no AsyncLimiter \"card\" in namespace \"shop\""),
            "{}",
            missing.message
        );

        // one without a limit is refused by the dispatchers: not bound either
        let empty = Limiters::new(vec![psp.clone(), fixtures::limiter("idle", |_| {})]);
        let invalid = check_limiters(&job(&["idle"]), "shop", &empty).unwrap_err();
        assert_eq!(invalid.field, "spec.limiters[0]");
        assert!(
            invalid.message.contains("is invalid (spec: must set"),
            "{}",
            invalid.message
        );
        assert_eq!(
            empty
                .routable()
                .iter()
                .map(|l| l.name())
                .collect::<Vec<_>>(),
            ["psp"]
        );

        let mut going = psp.clone();
        going.metadata.deletion_timestamp = fixtures::config("x").metadata.creation_timestamp;
        let deleting = Limiters::new(vec![going]);
        assert!(deleting.routable().is_empty());
        let err = check_limiters(&job(&["psp"]), "shop", &deleting).unwrap_err();
        assert!(err.message.contains("being deleted"), "{}", err.message);

        let no_crd = Limiters {
            unavailable: Some("the AsyncLimiter CRD is not installed".into()),
            ..Limiters::default()
        };
        let err = check_limiters(&job(&["psp"]), "shop", &no_crd).unwrap_err();
        assert!(
            err.message
                .contains("can be read: the AsyncLimiter CRD is not installed"),
            "{}",
            err.message
        );
    }

    #[test]
    fn a_config_naming_a_missing_limiter_is_not_admitted() {
        let config = fixtures::config_with("x", |s| s.limiters = vec!["psp".into()]);
        let policy = Policy::default();
        assert!(matches!(
            admit(&config, &[], &Limiters::default(), &policy),
            Err(Verdict::Invalid { field, .. }) if field == "spec.limiters[0]"
        ));
        let present = Limiters::new(vec![fixtures::limiter("psp", |s| s.concurrency = Some(1))]);
        assert!(admit(&config, &[], &present, &policy).is_ok());
    }
}

//! Step 2, validate: the dispatcher's own spec check, what only a cluster needs (the
//! operator's caps among it), then ownership ([`conflicts::resolve`]). A config that fails
//! either changes nothing.

use std::sync::Arc;

use asyncd_spec::{Job, SpecError};

use crate::conflicts::{self, Ownership};
use crate::crd::AsyncJobConfig;
use crate::policy::Policy;
use crate::status::Verdict;

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
/// that is invalid or in conflict with one of `peers`. A config not yet in the cache
/// owns what nobody else claims.
pub fn admit(
    config: &AsyncJobConfig,
    peers: &[Arc<AsyncJobConfig>],
    policy: &Policy,
) -> Result<(), Verdict> {
    if let Err(err) = validate(config, policy) {
        return Err(Verdict::Invalid {
            field: err.field,
            message: err.message,
        });
    }
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
        assert!(admit(&old, &peers, &policy).is_ok());
        assert!(
            matches!(admit(&young, &peers, &policy), Err(Verdict::Conflict(c)) if c.owner == "old")
        );
        let invalid = fixtures::config_with("x", |s| s.executor.url = "ftp://nope".into());
        assert!(matches!(
            admit(&invalid, &[], &policy),
            Err(Verdict::Invalid { field, .. }) if field == "spec.executor.url"
        ));
    }
}

//! Step 2, validate: the dispatcher's own spec check, what only a cluster needs, then
//! ownership ([`conflicts::resolve`]). A config that fails either changes nothing.

use std::sync::Arc;

use asyncd_spec::Job;

use crate::conflicts::{self, Ownership};
use crate::crd::AsyncJobConfig;
use crate::status::Verdict;

/// The dispatcher's own validation, plus what only a cluster needs.
pub fn validate(config: &AsyncJobConfig) -> Result<Job, asyncd_spec::SpecError> {
    let job = config.spec.validate(config.name())?;
    if let Some(scaling) = &config.spec.scaling {
        for (field, value) in [
            ("spec.scaling.minReplicas", scaling.min_replicas),
            ("spec.scaling.maxReplicas", scaling.max_replicas),
            ("spec.scaling.targetDueBacklog", scaling.target_due_backlog),
        ] {
            if value == Some(0) {
                return Err(asyncd_spec::SpecError {
                    field: field.into(),
                    message: "must be at least 1".into(),
                });
            }
        }
    }
    Ok(job)
}

/// Whether `config` may go on to build and apply: `Err` carries the verdict of a config
/// that is invalid or in conflict with one of `peers`. A config not yet in the cache
/// owns what nobody else claims.
pub fn admit(config: &AsyncJobConfig, peers: &[Arc<AsyncJobConfig>]) -> Result<(), Verdict> {
    if let Err(err) = validate(config) {
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
        let ok = fixtures::sample("order-cancel-job.yaml");
        assert!(validate(&ok).is_ok());
        let bad = fixtures::config_with("x", |s| s.executor.url = "ftp://nope".into());
        assert_eq!(validate(&bad).unwrap_err().field, "spec.executor.url");
        let bad = fixtures::config_with("x", |s| {
            s.scaling = Some(asyncd_spec::job::ScalingSpec {
                max_replicas: Some(0),
                ..Default::default()
            })
        });
        assert_eq!(
            validate(&bad).unwrap_err().field,
            "spec.scaling.maxReplicas"
        );
    }

    #[test]
    fn the_younger_of_two_claimants_is_not_admitted() {
        let old = Arc::new(fixtures::aged("old", 1, |_| {}));
        let young = Arc::new(fixtures::aged("young", 2, |s| s.task_type = "other".into()));
        let peers = [old.clone(), young.clone()];
        assert!(admit(&old, &peers).is_ok());
        assert!(matches!(admit(&young, &peers), Err(Verdict::Conflict(c)) if c.owner == "old"));
        let invalid = fixtures::config_with("x", |s| s.executor.url = "ftp://nope".into());
        assert!(matches!(
            admit(&invalid, &[]),
            Err(Verdict::Invalid { field, .. }) if field == "spec.executor.url"
        ));
    }
}

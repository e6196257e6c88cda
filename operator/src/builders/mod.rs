//! One builder per resource the operator owns. Each is a pure function from an
//! `AsyncJobConfig` (and what was observed) to the desired object or decision, unit-tested
//! without a client; `controller` applies what they return.
//!
//! - [`topic`]: create / grow / keep / refuse-to-shrink decision for the Kafka topic.
//! - [`routing`]: the namespace's `asyncd-routing` ConfigMap, one document per config.
//! - [`deployment`]: the dispatcher Deployment `asyncd-dispatcher-<config>`.
//! - [`hpa`]: the autoscaling/v2 HPA on due backlog, max replicas clamped to partitions.

pub mod deployment;
pub mod hpa;
pub mod routing;
pub mod topic;

use std::collections::BTreeMap;

use ipnet::IpNet;

use crate::crd::AsyncJobConfig;

pub const MANAGED_BY: &str = "asyncd-operator";
pub const JOB_LABEL: &str = "asyncd.example.io/job";

/// Where dispatchers come from and what they connect to: the operator's flags.
#[derive(Clone, Debug)]
pub struct DispatcherSettings {
    pub image: String,
    pub image_pull_policy: Option<String>,
    pub kafka_brokers: String,
    /// Secret (in the config's namespace) whose `url` key is the store URL.
    pub store_secret: String,
    pub service_account: String,
    /// Secret (in the config's namespace) whose keys are `ASYNCD_KAFKA_*` TLS and SASL
    /// settings, given to the dispatchers as environment variables (`envFrom`).
    pub kafka_secret: Option<String>,
    /// Address ranges the dispatchers' executors may not be at, on top of the
    /// dispatcher's own policy (in a pod: link-local, loopback, the API server's service
    /// address); given to them as `ASYNCD_EXECUTOR_DENY_CIDRS`.
    pub executor_deny_cidrs: Vec<IpNet>,
    /// Exceptions to the denied ranges, the dispatcher's own included; given to them as
    /// `ASYNCD_EXECUTOR_ALLOW_CIDRS`.
    pub executor_allow_cidrs: Vec<IpNet>,
    /// The dispatchers' bound on a store call (`ASYNCD_STORE_TIMEOUT`); `None` leaves
    /// asyncd's default.
    pub store_timeout: Option<std::time::Duration>,
}

impl Default for DispatcherSettings {
    fn default() -> Self {
        Self {
            image: "asyncd:latest".into(),
            image_pull_policy: None,
            kafka_brokers: "kafka:9092".into(),
            store_secret: "asyncd-store".into(),
            service_account: "asyncd-dispatcher".into(),
            kafka_secret: None,
            executor_deny_cidrs: Vec::new(),
            executor_allow_cidrs: Vec::new(),
            store_timeout: None,
        }
    }
}

/// An address range of `--executor-deny-cidrs` / `--executor-allow-cidrs`, checked when
/// the operator starts: a bad one would otherwise reach every dispatcher it creates, and
/// each would fail to start.
pub fn cidr(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    text.parse().map_err(|_| {
        format!("{text:?} is not a CIDR (an address and a prefix length: 10.0.0.0/8, fd00::/8)")
    })
}

/// `asyncd-dispatcher-<config name>`: the Deployment's and the HPA's name.
pub fn dispatcher_name(config: &AsyncJobConfig) -> String {
    format!("asyncd-dispatcher-{}", config.name())
}

/// Labels on everything made for one config; the first two select its pods.
pub fn labels(config: &AsyncJobConfig) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "asyncd-dispatcher".into()),
        (JOB_LABEL.into(), config.name().into()),
        ("app.kubernetes.io/instance".into(), config.name().into()),
        ("app.kubernetes.io/component".into(), "dispatcher".into()),
        ("app.kubernetes.io/managed-by".into(), MANAGED_BY.into()),
    ])
}

pub fn selector_labels(config: &AsyncJobConfig) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "asyncd-dispatcher".into()),
        (JOB_LABEL.into(), config.name().into()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executor_ranges_must_be_cidrs() {
        assert_eq!(cidr("10.0.0.0/8").unwrap().to_string(), "10.0.0.0/8");
        assert_eq!(cidr(" fd00::/8 ").unwrap().to_string(), "fd00::/8");
        for bad in [
            "10.0.0.1",
            "10.0.0.0/33",
            "",
            "example.com/8",
            "10.0.0.0/8/8",
        ] {
            let err = cidr(bad).unwrap_err();
            assert!(err.contains("is not a CIDR"), "{bad}: {err}");
        }
    }
}

//! The namespace's routing ConfigMap `asyncd-routing`: one entry per routable config, key
//! `<config name>.yaml`, value that config's AsyncJobConfig document (apiVersion, kind,
//! metadata.name and metadata.namespace, spec), and one entry per valid AsyncLimiter of
//! the namespace, key `limiter_<name>.yaml` (an underscore, which no object name holds,
//! so it never meets a config's key), value its AsyncLimiter document — the very format
//! `asyncd dev --config DIR` reads, so a dispatcher loads the ConfigMap with the same
//! loader as a folder.
//!
//! Every document carries the namespace: the dispatchers bind a job's `spec.limiters` to
//! the limiters of the job document's namespace, and a limiter's row in the store (shared
//! by every namespace) is keyed `<namespace>/<name>`, so two namespaces' limiters of one
//! name never count together.
//!
//! It is always rebuilt from *all* routable configs and limiters of the namespace, never
//! patched entry by entry, so it cannot drift.

use std::collections::BTreeMap;

use asyncd_spec::job::Metadata;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;

use super::MANAGED_BY;
use crate::crd::{AsyncJobConfig, AsyncLimiter};

pub const ROUTING_CONFIGMAP: &str = "asyncd-routing";

fn metadata(name: &str, namespace: &str) -> Metadata {
    Metadata {
        name: name.into(),
        namespace: Some(namespace.into()),
        ..Metadata::default()
    }
}

/// The config as the document a dispatcher (or `asyncd dev`) reads. A Kafka section
/// without a `consumerGroup` gets [`default_consumer_group`]: the dispatcher's own
/// default, `asyncd-<job>`, would be shared by same-named jobs of every namespace on the
/// broker.
pub fn document(config: &AsyncJobConfig) -> asyncd_spec::AsyncJobConfig {
    let mut spec = config.spec.0.clone();
    if let Some(kafka) = spec.kafka.as_mut() {
        kafka
            .consumer_group
            .get_or_insert_with(|| default_consumer_group(config));
    }
    asyncd_spec::AsyncJobConfig {
        api_version: asyncd_spec::job::API_VERSION.into(),
        kind: asyncd_spec::job::KIND.into(),
        metadata: metadata(config.name(), config.namespace()),
        spec,
    }
}

/// The limiter as the document a dispatcher reads; [`asyncd_spec::AsyncLimiter::validate`]
/// on it is the dispatcher's own check.
pub fn limiter_document(limiter: &AsyncLimiter) -> asyncd_spec::AsyncLimiter {
    asyncd_spec::AsyncLimiter {
        api_version: asyncd_spec::job::API_VERSION.into(),
        kind: asyncd_spec::LIMITER_KIND.into(),
        metadata: metadata(limiter.name(), limiter.namespace()),
        spec: limiter.spec.0.clone(),
    }
}

/// `asyncd-<namespace>-<config>`: the consumer group of a config that names none.
pub fn default_consumer_group(config: &AsyncJobConfig) -> String {
    format!("asyncd-{}-{}", config.namespace(), config.name())
}

pub fn key(config: &AsyncJobConfig) -> String {
    format!("{}.yaml", config.name())
}

pub fn limiter_key(limiter: &AsyncLimiter) -> String {
    format!("limiter_{}.yaml", limiter.name())
}

pub fn entry(config: &AsyncJobConfig) -> (String, String) {
    let text = serde_yaml::to_string(&document(config)).expect("a document renders as YAML");
    (key(config), text)
}

pub fn limiter_entry(limiter: &AsyncLimiter) -> (String, String) {
    let text =
        serde_yaml::to_string(&limiter_document(limiter)).expect("a document renders as YAML");
    (limiter_key(limiter), text)
}

/// The whole ConfigMap for `namespace`, from the configs that route there and the
/// limiters they may name. Every config's `spec.limiters` must name one of `limiters`:
/// the dispatchers refuse a ConfigMap whose jobs do not bind, as a whole.
pub fn build<'a>(
    namespace: &str,
    routable: impl IntoIterator<Item = &'a AsyncJobConfig>,
    limiters: impl IntoIterator<Item = &'a AsyncLimiter>,
) -> ConfigMap {
    let data: BTreeMap<String, String> = routable
        .into_iter()
        .map(entry)
        .chain(limiters.into_iter().map(limiter_entry))
        .collect();
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(ROUTING_CONFIGMAP.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([
                ("app.kubernetes.io/name".into(), "asyncd-routing".into()),
                ("app.kubernetes.io/managed-by".into(), MANAGED_BY.into()),
            ])),
            annotations: Some(BTreeMap::from([(
                "asyncd.example.io/format".into(),
                "one AsyncJobConfig or AsyncLimiter document per key, as read by `asyncd dev --config DIR`".into(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn one_entry_per_config_keyed_by_name() {
        let a = fixtures::config("order-cancel-job");
        let b = fixtures::config_with("invoice", |s| s.task_type = "send_invoice".into());
        let cm = build("shop", [&a, &b], []);
        assert_eq!(cm.metadata.name.as_deref(), Some(ROUTING_CONFIGMAP));
        assert_eq!(cm.metadata.namespace.as_deref(), Some("shop"));
        let data = cm.data.unwrap();
        assert_eq!(
            data.keys().collect::<Vec<_>>(),
            ["invoice.yaml", "order-cancel-job.yaml"]
        );
    }

    #[test]
    fn entries_are_what_the_dispatcher_loader_reads() {
        let config = fixtures::sample("order-cancel-job.yaml");
        let (_, text) = entry(&config);
        let (doc, job) = asyncd_spec::AsyncJobConfig::from_yaml(&text).unwrap();
        assert_eq!(doc.api_version, "asyncd.example.io/v1");
        assert_eq!(doc.kind, "AsyncJobConfig");
        assert_eq!(doc.metadata.name, "order-cancel-job");
        assert_eq!(doc.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(doc.spec, config.spec.0);
        assert_eq!(job.task_type, "cancel_expired_order");
        // no status, no cluster metadata
        assert!(!text.contains("status"));
        assert!(!text.contains("uid"));
    }

    #[test]
    fn the_default_consumer_group_names_the_namespace() {
        let unnamed = fixtures::config("orders");
        assert_eq!(unnamed.spec.kafka.as_ref().unwrap().consumer_group, None);
        let doc = document(&unnamed);
        assert_eq!(
            doc.spec.kafka.unwrap().consumer_group.as_deref(),
            Some("asyncd-shop-orders")
        );
        let named = fixtures::sample("order-cancel-job.yaml");
        let doc = document(&named);
        assert_eq!(
            doc.spec.kafka.unwrap().consumer_group.as_deref(),
            Some("asyncd-order-cancel-cg")
        );
        let storeless = fixtures::config_with("s", |s| s.kafka = None);
        assert!(document(&storeless).spec.kafka.is_none());
    }

    #[test]
    fn the_same_map_whatever_the_order() {
        let a = fixtures::config("a");
        let b = fixtures::config_with("b", |s| s.task_type = "b".into());
        let x = fixtures::limiter("x", |s| s.concurrency = Some(1));
        let y = fixtures::limiter("y", |s| s.concurrency = Some(2));
        assert_eq!(
            build("ns", [&a, &b], [&x, &y]),
            build("ns", [&b, &a], [&y, &x])
        );
        assert_eq!(build("ns", [], []).data, Some(BTreeMap::new()));
    }

    #[test]
    fn a_limiter_entry_is_its_document_with_the_namespace() {
        let limiter = fixtures::limiter("psp", |s| {
            s.concurrency = Some(3);
            s.rate_limit = Some(asyncd_spec::job::RateLimitSpec {
                per_second: 10,
                burst: Some(20),
            });
        });
        let (key, text) = limiter_entry(&limiter);
        assert_eq!(key, "limiter_psp.yaml");
        let doc: asyncd_spec::AsyncLimiter = serde_yaml::from_str(&text).unwrap();
        assert_eq!(doc.api_version, "asyncd.example.io/v1");
        assert_eq!(doc.kind, "AsyncLimiter");
        assert_eq!(doc.metadata.name, "psp");
        assert_eq!(doc.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(doc.spec, limiter.spec.0);
        let validated = doc.validate().unwrap();
        assert_eq!(
            validated.id, "shop/psp",
            "the store's key carries the namespace"
        );
        assert!(!text.contains("status"));
        assert!(!text.contains("uid"));
    }

    #[test]
    fn a_limiters_key_never_meets_a_configs() {
        // `limiter-psp` is a valid config name; `limiter_psp` is no object's name
        let config = fixtures::config("limiter-psp");
        let limiter = fixtures::limiter("psp", |s| s.concurrency = Some(1));
        let same = fixtures::limiter("limiter-psp", |s| s.concurrency = Some(1));
        let cm = build("shop", [&config], [&limiter, &same]);
        assert_eq!(
            cm.data.unwrap().keys().collect::<Vec<_>>(),
            [
                "limiter-psp.yaml",
                "limiter_limiter-psp.yaml",
                "limiter_psp.yaml"
            ]
        );
    }

    /// What a dispatcher does with the ConfigMap (dispatcher/src/job_table): every
    /// document validated, jobs bound to the limiters of their document's namespace.
    fn load(cm: &ConfigMap) -> Vec<asyncd_spec::Declared<asyncd_spec::Job>> {
        let mut jobs = Vec::new();
        let mut limiters = Vec::new();
        for text in cm.data.as_ref().unwrap().values() {
            let value: serde_yaml::Value = serde_yaml::from_str(text).unwrap();
            if value["kind"].as_str() == Some(asyncd_spec::LIMITER_KIND) {
                let doc: asyncd_spec::AsyncLimiter = serde_yaml::from_value(value).unwrap();
                limiters.push(doc.validate().unwrap());
            } else {
                let (doc, job) = asyncd_spec::AsyncJobConfig::from_yaml(text).unwrap();
                jobs.push(asyncd_spec::Declared {
                    namespace: doc.metadata.namespace,
                    value: job,
                });
            }
        }
        asyncd_spec::bind_limiters(&mut jobs, limiters)
            .unwrap_or_else(|(job, e)| panic!("{job}: {}: {}", e.field, e.message));
        jobs
    }

    #[test]
    fn the_dispatchers_bind_each_job_to_its_namespaces_limiters() {
        let refund = fixtures::config_with("refund", |s| {
            s.task_type = "refund".into();
            s.limiters = vec!["psp".into()];
        });
        let payout = fixtures::config_with("payout", |s| {
            s.task_type = "payout".into();
            s.limiters = vec!["psp".into()];
        });
        let psp = fixtures::limiter("psp", |s| s.concurrency = Some(4));
        let jobs = load(&build("shop", [&refund, &payout], [&psp]));
        let refund = jobs.iter().find(|j| j.value.name == "refund").unwrap();
        assert_eq!(refund.namespace.as_deref(), Some("shop"));
        let bound = &refund.value.limiters;
        assert_eq!(
            bound.iter().map(|l| l.id.as_str()).collect::<Vec<_>>(),
            ["shop/psp"]
        );
        assert_eq!(bound[0].task_types, ["payout", "refund"]);
    }
}

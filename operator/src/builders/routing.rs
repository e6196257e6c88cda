//! The namespace's routing ConfigMap `asyncd-routing`: one entry per routable config, key
//! `<config name>.yaml`, value that config's AsyncJobConfig document (apiVersion, kind,
//! metadata.name, spec) — the very format `asyncd dev --config DIR` reads, so a
//! dispatcher loads the ConfigMap with the same loader as a folder.
//!
//! It is always rebuilt from *all* routable configs of the namespace (owners, not being
//! deleted), never patched entry by entry, so it cannot drift.

use std::collections::BTreeMap;

use asyncd_spec::job::Metadata;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ObjectMeta;

use super::MANAGED_BY;
use crate::crd::AsyncJobConfig;

pub const ROUTING_CONFIGMAP: &str = "asyncd-routing";

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
        metadata: Metadata {
            name: config.name().into(),
            ..Metadata::default()
        },
        spec,
    }
}

/// `asyncd-<namespace>-<config>`: the consumer group of a config that names none.
pub fn default_consumer_group(config: &AsyncJobConfig) -> String {
    format!("asyncd-{}-{}", config.namespace(), config.name())
}

pub fn key(config: &AsyncJobConfig) -> String {
    format!("{}.yaml", config.name())
}

pub fn entry(config: &AsyncJobConfig) -> (String, String) {
    let text = serde_yaml::to_string(&document(config)).expect("a document renders as YAML");
    (key(config), text)
}

/// The whole ConfigMap for `namespace`, from the configs that route there.
pub fn build<'a>(
    namespace: &str,
    routable: impl IntoIterator<Item = &'a AsyncJobConfig>,
) -> ConfigMap {
    let data: BTreeMap<String, String> = routable.into_iter().map(entry).collect();
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
                "one AsyncJobConfig document per key, as read by `asyncd dev --config DIR`".into(),
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
        let cm = build("shop", [&a, &b]);
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
        assert_eq!(doc.metadata.namespace, None);
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
        assert_eq!(build("ns", [&a, &b]), build("ns", [&b, &a]));
        assert_eq!(build("ns", []).data, Some(BTreeMap::new()));
    }
}

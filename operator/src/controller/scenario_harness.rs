//! The scenarios' harness: a reconcile context over a scripted API server
//! ([`fixtures::ApiServer`]) and an in-memory broker ([`FakeAdmin`]), the paths the
//! scripts name, and the expectations several scenarios share.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde_json::json;

use super::Context;
use crate::builders::DispatcherSettings;
use crate::crd::{AsyncJobConfig, AsyncLimiter, FINALIZER};
use crate::fixtures::{self, ApiServer, Call, Reply};
use crate::kafka::fake::FakeAdmin;
use crate::metrics::Metrics;

pub(super) const CONFIGS: &str = "/apis/asyncd.example.io/v1/namespaces/shop/asyncjobconfigs";
pub(super) const LIMITERS: &str = "/apis/asyncd.example.io/v1/namespaces/shop/asynclimiters";
pub(super) const ROUTING: &str = "/api/v1/namespaces/shop/configmaps/asyncd-routing";
pub(super) const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/shop/deployments";
pub(super) const HPAS: &str = "/apis/autoscaling/v2/namespaces/shop/horizontalpodautoscalers";

pub(super) struct Harness {
    pub server: ApiServer,
    pub admin: Arc<FakeAdmin>,
    pub ctx: Arc<Context>,
    // keeps the cache the context reads alive
    _writer: Writer<AsyncJobConfig>,
}

/// A context whose cache holds `configs`, talking to a fresh scripted server.
pub(super) fn harness(configs: &[&AsyncJobConfig]) -> Harness {
    harness_with(configs, fixtures::settings())
}

/// [`harness`] with the operator's dispatcher settings (its flags) given.
pub(super) fn harness_with(configs: &[&AsyncJobConfig], settings: DispatcherSettings) -> Harness {
    let (server, client) = ApiServer::start();
    let mut writer = Writer::default();
    for config in configs {
        writer.apply_watcher_event(&watcher::Event::Apply((*config).clone()));
    }
    let admin = Arc::new(FakeAdmin::default());
    let ctx = Arc::new(Context::new(
        client,
        admin.clone(),
        settings,
        crate::policy::Policy::default(),
        writer.as_reader(),
        Arc::new(Metrics::default()),
    ));
    Harness {
        server,
        admin,
        ctx,
        _writer: writer,
    }
}

/// A config that already carries the finalizer (past its first reconcile).
pub(super) fn finalized(mut config: AsyncJobConfig) -> AsyncJobConfig {
    config.metadata.finalizers = Some(vec![FINALIZER.into()]);
    config
}

pub(super) fn deleting(config: AsyncJobConfig) -> AsyncJobConfig {
    let mut config = finalized(config);
    config.metadata.deletion_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap(),
    ));
    config
}

pub(super) fn json_of(config: &AsyncJobConfig) -> Reply {
    Reply::Json(serde_json::to_value(config).unwrap())
}

/// The namespace's AsyncLimiters, as a LIST answers them.
pub(super) fn limiter_list(limiters: &[&AsyncLimiter]) -> Reply {
    Reply::Json(json!({
        "apiVersion": "asyncd.example.io/v1",
        "kind": "AsyncLimiterList",
        "metadata": {"resourceVersion": "1"},
        "items": limiters,
    }))
}

/// Scripts the LIST of the namespace's AsyncLimiters (none) a routing rebuild begins with.
pub(super) fn expect_no_limiters(server: &ApiServer) -> &ApiServer {
    server.expect("GET", LIMITERS, limiter_list(&[]))
}

/// Scripts the calls of a pass that gets through every step (the namespace holding no
/// AsyncLimiter).
pub(super) fn expect_full_pass(server: &ApiServer, config: &AsyncJobConfig) {
    expect_no_limiters(server);
    expect_routed_and_deployed(server, config);
}

/// The routing ConfigMap, the Deployment and the HPA of a pass, after the rebuild's LIST.
pub(super) fn expect_routed_and_deployed(server: &ApiServer, config: &AsyncJobConfig) {
    let name = config.name();
    server
        .expect("PATCH", ROUTING, Reply::Echo)
        .expect(
            "PATCH",
            format!("{DEPLOYMENTS}/asyncd-dispatcher-{name}"),
            Reply::Echo,
        )
        .expect(
            "PATCH",
            format!("{HPAS}/asyncd-dispatcher-{name}"),
            Reply::Echo,
        );
}

pub(super) fn routing_keys(call: &Call) -> Vec<String> {
    assert_eq!(call.path, ROUTING);
    call.body["data"]
        .as_object()
        .map(|data| data.keys().cloned().collect())
        .unwrap_or_default()
}

/// `(type, status, reason)` of each condition in a status patch.
pub(super) fn conditions(call: &Call) -> Vec<(String, String, String)> {
    assert!(call.path.ends_with("/status"), "{}", call.path);
    call.body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let field = |k: &str| c[k].as_str().unwrap().to_string();
            (field("type"), field("status"), field("reason"))
        })
        .collect()
}

pub(super) fn triples(expected: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    expected
        .iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect()
}

//! The `Controller`: what it watches, and which configs a change sends back through
//! [`reconcile`].

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Context, error_policy, reconcile};
use crate::builders::{DispatcherSettings, MANAGED_BY, routing};
use crate::crd::AsyncJobConfig;
use crate::kafka::TopicAdmin;
use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::status;

/// Configs whose ownership may change when `changed` does: same namespace, and sharing
/// its task type or a topic, or currently in conflict.
pub fn peers_to_recheck(
    changed: &AsyncJobConfig,
    all: &[Arc<AsyncJobConfig>],
) -> Vec<ObjectRef<AsyncJobConfig>> {
    all.iter()
        .filter(|c| c.namespace() == changed.namespace() && c.name() != changed.name())
        .filter(|c| {
            c.spec.task_type == changed.spec.task_type
                || c.topics().iter().any(|t| changed.topics().contains(t))
                || c.status
                    .as_ref()
                    .and_then(|s| s.condition(status::CONFLICT))
                    .is_some_and(|s| s.status == "True")
        })
        .map(|c| ObjectRef::from_obj(c.as_ref()))
        .collect()
}

/// Where to watch: one namespace, or all.
fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Runs the controller until `shutdown`, then lets the reconciles in progress finish
/// (the caller bounds how long).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: Client,
    admin: Arc<dyn TopicAdmin>,
    settings: DispatcherSettings,
    policy: Policy,
    namespace: Option<String>,
    metrics: Arc<Metrics>,
    ready: Arc<std::sync::atomic::AtomicBool>,
    shutdown: CancellationToken,
) {
    let ns = namespace.as_deref();
    let configs: Api<AsyncJobConfig> = api(&client, ns);
    let managed =
        watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={MANAGED_BY}"));
    let controller = Controller::new(configs.clone(), watcher::Config::default().any_semantic())
        .owns(api::<Deployment>(&client, ns), managed.clone())
        .owns(api::<HorizontalPodAutoscaler>(&client, ns), managed);
    let store = controller.store();
    let peers_store = store.clone();
    let routing_store = store.clone();
    let controller = controller
        // a config's deletion or edit can settle another's conflict
        .watches(
            configs,
            watcher::Config::default(),
            move |changed: AsyncJobConfig| peers_to_recheck(&changed, &peers_store.state()),
        )
        // the routing ConfigMap edited or deleted by hand: rebuild it
        .watches(
            api::<ConfigMap>(&client, ns),
            watcher::Config::default()
                .fields(&format!("metadata.name={}", routing::ROUTING_CONFIGMAP)),
            move |cm: ConfigMap| {
                let ns = cm.namespace().unwrap_or_default();
                routing_store
                    .state()
                    .into_iter()
                    .filter(|c| c.namespace() == ns)
                    .min_by(|a, b| a.name().cmp(b.name()))
                    .map(|c| ObjectRef::from_obj(c.as_ref()))
            },
        )
        .with_config(
            kube::runtime::controller::Config::default().debounce(Duration::from_millis(300)),
        )
        .graceful_shutdown_on(shutdown.cancelled_owned());
    let ctx = Arc::new(Context::new(
        client, admin, settings, policy, store, metrics,
    ));
    info!(
        namespace = ns.unwrap_or("<all>"),
        "asyncd-operator watching AsyncJobConfigs"
    );
    ready.store(true, std::sync::atomic::Ordering::SeqCst);
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(err) = result {
                warn!(%err, "controller");
            }
        })
        .await;
    ready.store(false, std::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conflicts;
    use crate::fixtures;
    use crate::status::Verdict;

    #[test]
    fn peers_sharing_a_claim_or_in_conflict_are_rechecked() {
        let a = fixtures::aged("a", 1, |s| s.task_type = "x".into());
        let b = fixtures::aged("b", 2, |s| {
            s.task_type = "x".into();
            s.kafka.as_mut().unwrap().topic = "b".into();
        });
        let mut c = fixtures::aged("c", 3, |s| {
            s.task_type = "z".into();
            s.kafka.as_mut().unwrap().topic = "c".into();
        });
        let d = fixtures::aged("d", 4, |s| {
            s.task_type = "w".into();
            s.kafka.as_mut().unwrap().topic = "d".into();
        });
        c.status = Some(status::status(
            None,
            &Verdict::Conflict(conflicts::Conflict {
                owner: "q".into(),
                what: conflicts::Claimed::TaskType,
                value: "z".into(),
            }),
            None,
            "t",
        ));
        let all: Vec<_> = [&a, &b, &c, &d].map(|c| Arc::new(c.clone())).into();
        let names: Vec<String> = peers_to_recheck(&a, &all)
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["b", "c"]);
    }
}

//! The `Controller`: what it watches (AsyncJobConfigs, the Deployments and HPAs they
//! own, the routing ConfigMaps, AsyncLimiters), and which configs a change sends back
//! through [`reconcile`].

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
use crate::crd::{AsyncJobConfig, AsyncLimiter};
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

/// Configs to pass again when an AsyncLimiter changes (created, edited, deleted, or its
/// status written): those of its namespace that name it, whose routing and status depend
/// on it, and the namespace's first config by name, whose pass rebuilds the routing
/// ConfigMap (and the limiter's status) even when no config names it.
pub fn configs_for_limiter(
    limiter: &AsyncLimiter,
    all: &[Arc<AsyncJobConfig>],
) -> Vec<ObjectRef<AsyncJobConfig>> {
    let mut in_namespace: Vec<&Arc<AsyncJobConfig>> = all
        .iter()
        .filter(|c| c.namespace() == limiter.namespace())
        .collect();
    in_namespace.sort_by(|a, b| a.name().cmp(b.name()));
    in_namespace
        .into_iter()
        .enumerate()
        .filter(|(i, c)| *i == 0 || c.spec.limiters.iter().any(|n| n.trim() == limiter.name()))
        .map(|(_, c)| ObjectRef::from_obj(c.as_ref()))
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
    let limiters_store = store.clone();
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
        // an AsyncLimiter created, edited or deleted: rebuild the routing ConfigMap and
        // recheck the configs that name it (without the CRD installed, this watch fails
        // and retries with backoff; the passes see no limiters)
        .watches(
            api::<AsyncLimiter>(&client, ns),
            watcher::Config::default(),
            move |limiter: AsyncLimiter| configs_for_limiter(&limiter, &limiters_store.state()),
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
        "asyncd-operator watching AsyncJobConfigs and AsyncLimiters"
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

    #[test]
    fn a_limiter_change_rechecks_the_configs_naming_it_and_the_first_of_its_namespace() {
        let a = fixtures::config("a");
        let b = fixtures::config_with("b", |s| s.limiters = vec!["other".into()]);
        let c = fixtures::config_with("c", |s| s.limiters = vec!["x".into(), " psp ".into()]);
        let mut elsewhere = fixtures::config_with("d", |s| s.limiters = vec!["psp".into()]);
        elsewhere.metadata.namespace = Some("bank".into());
        let all: Vec<_> = [&c, &elsewhere, &b, &a].map(|c| Arc::new(c.clone())).into();
        let names = |limiter: &AsyncLimiter, all: &[Arc<AsyncJobConfig>]| -> Vec<String> {
            configs_for_limiter(limiter, all)
                .into_iter()
                .map(|r| r.name)
                .collect()
        };
        let psp = fixtures::limiter("psp", |s| s.concurrency = Some(2));
        assert_eq!(names(&psp, &all), ["a", "c"]);
        assert!(names(&psp, &[]).is_empty());
    }
}

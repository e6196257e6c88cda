//! The reconciler. One pass over a config is a pipeline:
//!
//! 1. **read** — the config and its namespace's other configs (from the controller's
//!    cache);
//! 2. **validate** — `asyncd_spec::JobSpec::validate`, the same check the dispatcher runs;
//!    then **ownership** ([`conflicts::resolve`]): a config in conflict changes nothing;
//! 3. **build** — the desired objects from [`builders`] (pure);
//! 4. **apply** — topic (create/grow, never shrink), routing ConfigMap, Deployment, HPA,
//!    each by server-side apply with field manager `asyncd-operator`, stopping at the
//!    first step that fails;
//! 5. **status** — conditions from what happened ([`status::status`]), written through
//!    the status subresource only when they changed, with Events on changes.
//!
//! Passes are level-based and idempotent: everything is recomputed from the current
//! state each time, and the routing ConfigMap is rebuilt whole from every routable config.
//! A finalizer makes deletion remove the route (and the topic only under
//! `deletePolicy: Delete`). Errors requeue with exponential backoff per object.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use asyncd_spec::{DeletePolicy, Job};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

use crate::builders::{self, DispatcherSettings, MANAGED_BY, deployment, hpa, routing, topic};
use crate::conflicts::{self, Ownership};
use crate::crd::{AsyncJobConfig, FINALIZER};
use crate::kafka::{TopicAdmin, TopicError};
use crate::metrics::Metrics;
use crate::status::{
    self, DISPATCHER_READY, ROUTING_READY, Report, SCALING_READY, Step, TOPIC_READY, Verdict,
};

/// Requeue after a good pass, to catch drift nobody told us about (a topic deleted by hand).
pub const RESYNC: Duration = Duration::from_secs(300);
/// Requeue for a config in conflict or with an invalid spec.
pub const RECHECK: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Kafka(#[from] TopicError),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("{0}")]
    Step(String),
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Kafka(_) => "kafka",
            Error::Finalizer(_) => "finalizer",
            Error::Step(_) => "step",
        }
    }
}

/// What every pass shares.
pub struct Context {
    pub client: Client,
    pub admin: Arc<dyn TopicAdmin>,
    pub settings: DispatcherSettings,
    /// The controller's cache of every watched AsyncJobConfig.
    pub store: Store<AsyncJobConfig>,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// One routing rebuild at a time per namespace, so a stale view never wins.
    routing_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Consecutive failures per config, for the backoff.
    failures: Mutex<HashMap<ObjectRef<AsyncJobConfig>, u32>>,
}

impl Context {
    pub fn new(
        client: Client,
        admin: Arc<dyn TopicAdmin>,
        settings: DispatcherSettings,
        store: Store<AsyncJobConfig>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let reporter = Reporter {
            controller: MANAGED_BY.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            admin,
            settings,
            store,
            metrics,
            routing_locks: Mutex::default(),
            failures: Mutex::default(),
        }
    }

    /// Step 1, read: every config of `namespace` as last seen.
    fn configs_in(&self, namespace: &str) -> Vec<Arc<AsyncJobConfig>> {
        let mut configs = self.store.state_filter(|c| c.namespace() == namespace);
        configs.sort_by(|a, b| a.name().cmp(b.name()));
        configs
    }

    fn routing_lock(&self, namespace: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.routing_locks
            .lock()
            .unwrap()
            .entry(namespace.to_string())
            .or_default()
            .clone()
    }

    async fn event(&self, config: &AsyncJobConfig, warning: bool, reason: &str, note: String) {
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, &config.object_ref(&())).await {
            warn!(config = config.name(), %err, "could not publish an event");
        }
    }

    fn backoff(&self, config: &AsyncJobConfig) -> Duration {
        let mut failures = self.failures.lock().unwrap();
        let n = failures.entry(ObjectRef::from_obj(config)).or_default();
        *n = n.saturating_add(1);
        backoff_after(*n)
    }

    fn succeeded(&self, config: &AsyncJobConfig) {
        self.failures
            .lock()
            .unwrap()
            .remove(&ObjectRef::from_obj(config));
    }
}

/// 2 s, 4 s, 8 s … up to 5 minutes.
pub fn backoff_after(failures: u32) -> Duration {
    let secs = 2u64.saturating_pow(failures.clamp(1, 16)).min(300);
    Duration::from_secs(secs)
}

fn apply_params() -> PatchParams {
    PatchParams::apply(MANAGED_BY).force()
}

/// The entry point the `Controller` calls.
pub async fn reconcile(config: Arc<AsyncJobConfig>, ctx: Arc<Context>) -> Result<Action, Error> {
    let api: Api<AsyncJobConfig> = Api::namespaced(ctx.client.clone(), config.namespace());
    let result = finalizer(&api, FINALIZER, config.clone(), |event| async {
        match event {
            Finalizer::Apply(config) => apply(config, &ctx).await,
            Finalizer::Cleanup(config) => cleanup(config, &ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(Box::new(other)),
    });
    let label = if result.is_ok() { "ok" } else { "error" };
    ctx.metrics
        .reconciliations
        .with_label_values(&[label])
        .inc();
    if result.is_ok() {
        ctx.succeeded(&config);
    }
    result
}

/// Errors requeue the config with exponential backoff.
pub fn error_policy(config: Arc<AsyncJobConfig>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics
        .failures
        .with_label_values(&[error.metric_label()])
        .inc();
    let delay = ctx.backoff(&config);
    warn!(
        namespace = config.namespace(),
        config = config.name(),
        %error,
        retry_in = ?delay,
        "reconcile failed"
    );
    Action::requeue(delay)
}

/// Step 2, validate: the dispatcher's own validation, plus what only a cluster needs.
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

async fn apply(config: Arc<AsyncJobConfig>, ctx: &Context) -> Result<Action, Error> {
    let _timer = ctx.metrics.timer("apply");
    let ns = config.namespace().to_string();
    let name = config.name().to_string();

    // read
    let peers = ctx.configs_in(&ns);
    // validate, then ownership
    let (verdict, error, requeue) = match validate(&config) {
        Err(err) => (
            Verdict::Invalid {
                field: err.field,
                message: err.message,
            },
            None,
            RECHECK,
        ),
        Ok(_) => match conflicts::resolve(peers.iter().map(|c| c.as_ref())).remove(&name) {
            Some(Ownership::Conflict(conflict)) => (Verdict::Conflict(conflict), None, RECHECK),
            // build + apply (a config not yet in the cache owns what nobody else claims)
            _ => {
                let (report, error) = run_pipeline(&config, ctx).await;
                (Verdict::Reconciled(report), error, RESYNC)
            }
        },
    };
    if !matches!(verdict, Verdict::Reconciled(_)) {
        // an invalid or conflicting config may have been routed before: drop its entry
        apply_routing(ctx, &ns).await?;
    }

    // status
    let previous = config.status.as_ref();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let next = status::status(previous, &verdict, config.metadata.generation, &now);
    ctx.metrics.set_state(
        &ns,
        &name,
        match &verdict {
            Verdict::Invalid { .. } => "invalid",
            Verdict::Conflict(_) => "conflict",
            Verdict::Reconciled(_)
                if next
                    .condition(status::READY)
                    .is_some_and(|c| c.status == "True") =>
            {
                "ready"
            }
            Verdict::Reconciled(_) => "not_ready",
        },
    );
    for (warning, reason, note) in status::transitions(previous, &next) {
        ctx.event(&config, warning, &reason, note).await;
    }
    if previous != Some(&next) {
        let api: Api<AsyncJobConfig> = Api::namespaced(ctx.client.clone(), &ns);
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": next })),
        )
        .await?;
    }
    match error {
        Some(err) => Err(err),
        None => Ok(Action::requeue(requeue)),
    }
}

/// Steps 3–4 for a config that owns its task type and topic: topic, route, Deployment,
/// HPA, stopping at the first failure (later steps stay Pending).
async fn run_pipeline(config: &AsyncJobConfig, ctx: &Context) -> (Report, Option<Error>) {
    let mut report = Report::new();
    let result: Result<(), Error> = async {
        let partitions = apply_topic(config, ctx, &mut report).await?;
        report.partitions = partitions;

        apply_routing(ctx, config.namespace())
            .await
            .inspect_err(|e| {
                report.set(
                    ROUTING_READY,
                    Step::failed("RoutingApplyFailed", e.to_string()),
                )
            })?;
        report.set(
            ROUTING_READY,
            Step::ok(
                "RouteApplied",
                format!(
                    "key {} of ConfigMap {}",
                    routing::key(config),
                    routing::ROUTING_CONFIGMAP
                ),
            ),
        );

        let desired = deployment::build(config, &ctx.settings);
        let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), config.namespace());
        let applied = deployments
            .patch(
                &builders::dispatcher_name(config),
                &apply_params(),
                &Patch::Apply(&desired),
            )
            .await
            .inspect_err(|e| {
                report.set(
                    DISPATCHER_READY,
                    Step::failed("DeploymentApplyFailed", e.to_string()),
                )
            })?;
        let (step, replicas, ready) = dispatcher_step(&applied);
        report.set(DISPATCHER_READY, step);
        report.replicas = replicas;
        report.ready_replicas = ready;

        let bounds = hpa::bounds(config.spec.scaling.as_ref(), partitions);
        let desired = hpa::build(config, bounds);
        let hpas: Api<HorizontalPodAutoscaler> =
            Api::namespaced(ctx.client.clone(), config.namespace());
        hpas.patch(
            &builders::dispatcher_name(config),
            &apply_params(),
            &Patch::Apply(&desired),
        )
        .await
        .inspect_err(|e| {
            report.set(
                SCALING_READY,
                Step::failed("AutoscalerApplyFailed", e.to_string()),
            )
        })?;
        report.set(SCALING_READY, scaling_step(config, bounds));
        Ok(())
    }
    .await;
    (report, result.err())
}

/// What the topic step did.
#[derive(Debug, PartialEq)]
pub struct TopicOutcome {
    pub step: Step,
    /// Partitions the topic has now (`None`: no topic).
    pub partitions: Option<u32>,
    /// An action worth an Event and a metric: `(reason, op, note)`.
    pub action: Option<(&'static str, &'static str, String)>,
}

/// The topic step: ask the broker, decide with [`topic::plan`], carry it out.
pub async fn topic_step(
    config: &AsyncJobConfig,
    admin: &dyn TopicAdmin,
) -> Result<TopicOutcome, TopicError> {
    let Some(kafka) = &config.spec.kafka else {
        return Ok(TopicOutcome {
            step: Step::ok(
                "NoTopic",
                "no kafka section: every task goes through the store",
            ),
            partitions: None,
            action: None,
        });
    };
    let current = admin.partitions(&kafka.topic).await?;
    let plan = topic::plan(kafka.partitions, current);
    let (step, action) = match plan {
        topic::TopicPlan::Create(n) => {
            admin.create(&kafka.topic, n).await?;
            let note = format!("created topic {} with {n} partitions", kafka.topic);
            (
                Step::ok("TopicCreated", note.clone()),
                Some(("TopicCreated", "create", note)),
            )
        }
        topic::TopicPlan::Grow { from, to } => {
            admin.grow(&kafka.topic, to).await?;
            let note = format!("grew topic {} from {from} to {to} partitions", kafka.topic);
            (
                Step::ok("PartitionsGrown", note.clone()),
                Some(("PartitionsGrown", "grow", note)),
            )
        }
        topic::TopicPlan::Keep(n) => (
            Step::ok(
                "TopicReady",
                format!("topic {} has the {n} partitions asked", kafka.topic),
            ),
            None,
        ),
        topic::TopicPlan::RefuseShrink { current, asked } => (
            Step::failed(
                "ShrinkRefused",
                format!(
                    "spec.kafka.partitions is {asked} but topic {} has {current}: Kafka cannot remove partitions, so the topic is left as is; set partitions to {current} or more",
                    kafka.topic
                ),
            ),
            Some(("ShrinkRefused", "shrink_refused", String::new())),
        ),
    };
    Ok(TopicOutcome {
        step,
        partitions: Some(plan.partitions_after()),
        action,
    })
}

async fn apply_topic(
    config: &AsyncJobConfig,
    ctx: &Context,
    report: &mut Report,
) -> Result<Option<u32>, Error> {
    let outcome = match topic_step(config, ctx.admin.as_ref()).await {
        Ok(outcome) => outcome,
        Err(err) => {
            report.set(
                TOPIC_READY,
                Step::failed("KafkaUnavailable", err.to_string()),
            );
            return Err(Error::Kafka(err));
        }
    };
    if let Some((reason, op, note)) = &outcome.action {
        ctx.metrics.topic_ops.with_label_values(&[op]).inc();
        // a refused shrink gets its Event from the status transition, once
        if !note.is_empty() {
            info!(config = config.name(), "{note}");
            ctx.event(config, false, reason, note.clone()).await;
        }
    }
    report.set(TOPIC_READY, outcome.step);
    Ok(outcome.partitions)
}

fn dispatcher_step(applied: &Deployment) -> (Step, Option<i32>, Option<i32>) {
    let name = applied.name_any();
    let status = applied.status.clone().unwrap_or_default();
    let replicas = status.replicas.unwrap_or(0);
    let ready = status.ready_replicas.unwrap_or(0);
    let failing = status.conditions.unwrap_or_default().into_iter().find(|c| {
        (c.type_ == "ReplicaFailure" && c.status == "True")
            || (c.type_ == "Progressing"
                && c.status == "False"
                && c.reason.as_deref() == Some("ProgressDeadlineExceeded"))
    });
    let step = match failing {
        Some(c) => Step::failed(
            c.reason.as_deref().unwrap_or("DeploymentFailing"),
            format!("{name}: {}", c.message.unwrap_or_default()),
        ),
        None if status.available_replicas.unwrap_or(0) > 0 => Step::ok(
            "DeploymentAvailable",
            format!("{name}: {ready}/{replicas} replicas ready"),
        ),
        None => Step::ok(
            "DeploymentApplied",
            format!("{name}: applied; {ready}/{replicas} replicas ready"),
        ),
    };
    (step, Some(replicas), Some(ready))
}

fn scaling_step(config: &AsyncJobConfig, bounds: hpa::Bounds) -> Step {
    let target = hpa::target_due_backlog(config.spec.scaling.as_ref());
    let base = format!(
        "{} scales {}..{} replicas on {} (target {target} per pod)",
        builders::dispatcher_name(config),
        bounds.min,
        bounds.max,
        hpa::METRIC
    );
    match bounds.clamped_from {
        Some(asked) => Step::ok(
            "MaxReplicasClamped",
            format!(
                "{base}; maxReplicas {asked} clamped to the {} partitions",
                bounds.max
            ),
        ),
        None => Step::ok("AutoscalerApplied", base),
    }
}

/// Rebuilds the namespace's routing ConfigMap from every routable config (owners with a
/// valid spec, not being deleted).
async fn apply_routing(ctx: &Context, namespace: &str) -> Result<(), Error> {
    let lock = ctx.routing_lock(namespace);
    let _guard = lock.lock().await;
    let configs = ctx.configs_in(namespace);
    let ownership = conflicts::resolve(configs.iter().map(|c| c.as_ref()));
    let routable: Vec<&AsyncJobConfig> = conflicts::routable(&configs, &ownership)
        .into_iter()
        .filter(|c| validate(c).is_ok())
        .collect();
    let desired = routing::build(namespace, routable);
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
    api.patch(
        routing::ROUTING_CONFIGMAP,
        &apply_params(),
        &Patch::Apply(&desired),
    )
    .await?;
    Ok(())
}

/// Deletion: drop the route, the Deployment and HPA (garbage collection would too, where
/// a controller-manager runs), and the topic only if this config owns it and says
/// `deletePolicy: Delete`.
async fn cleanup(config: Arc<AsyncJobConfig>, ctx: &Context) -> Result<Action, Error> {
    let _timer = ctx.metrics.timer("cleanup");
    let ns = config.namespace().to_string();
    let name = config.name().to_string();
    let owner = conflicts::resolve(ctx.configs_in(&ns).iter().map(|c| c.as_ref()))
        .get(&name)
        .is_none_or(|o| *o == Ownership::Owner);

    apply_routing(ctx, &ns).await?;
    let dispatcher = builders::dispatcher_name(&config);
    let uid = config.metadata.uid.clone();
    let owned_by_config =
        |refs: Option<&Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>| {
            refs.is_some_and(|refs| refs.iter().any(|r| Some(&r.uid) == uid.as_ref()))
        };
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    if let Some(d) = deployments.get_opt(&dispatcher).await?
        && owned_by_config(d.metadata.owner_references.as_ref())
    {
        deployments
            .delete(&dispatcher, &DeleteParams::background())
            .await?;
    }
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(ctx.client.clone(), &ns);
    if let Some(h) = hpas.get_opt(&dispatcher).await?
        && owned_by_config(h.metadata.owner_references.as_ref())
    {
        hpas.delete(&dispatcher, &DeleteParams::background())
            .await?;
    }

    let mut note = format!("removed route {}", routing::key(&config));
    if let Some(kafka) = &config.spec.kafka {
        if !owner {
            note.push_str(&format!(
                "; topic {} belongs to another config and is left alone",
                kafka.topic
            ));
        } else if kafka.delete_policy == DeletePolicy::Delete {
            ctx.admin.delete(&kafka.topic).await?;
            ctx.metrics.topic_ops.with_label_values(&["delete"]).inc();
            note.push_str(&format!(
                "; deleted topic {} (deletePolicy: Delete)",
                kafka.topic
            ));
        } else {
            note.push_str(&format!(
                "; kept topic {} (deletePolicy: Retain)",
                kafka.topic
            ));
        }
    }
    info!(namespace = %ns, config = %name, "{note}");
    ctx.event(&config, false, "Deleted", note).await;
    ctx.metrics.forget(&ns, &name);
    Ok(Action::await_change())
}

/// Configs whose ownership may change when `changed` does: same namespace, and sharing
/// its task type or topic, or currently in conflict.
pub fn peers_to_recheck(
    changed: &AsyncJobConfig,
    all: &[Arc<AsyncJobConfig>],
) -> Vec<ObjectRef<AsyncJobConfig>> {
    all.iter()
        .filter(|c| c.namespace() == changed.namespace() && c.name() != changed.name())
        .filter(|c| {
            c.spec.task_type == changed.spec.task_type
                || (c.topic().is_some() && c.topic() == changed.topic())
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

/// Runs the controller until shutdown (SIGTERM / Ctrl-C).
pub async fn run(
    client: Client,
    admin: Arc<dyn TopicAdmin>,
    settings: DispatcherSettings,
    namespace: Option<String>,
    metrics: Arc<Metrics>,
    ready: Arc<std::sync::atomic::AtomicBool>,
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
        .shutdown_on_signal();
    let ctx = Arc::new(Context::new(client, admin, settings, store, metrics));
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
    use crate::fixtures;
    use crate::kafka::fake::FakeAdmin;

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
    fn backoff_doubles_to_five_minutes() {
        let delays: Vec<u64> = [1, 2, 3, 8, 9, 20]
            .iter()
            .map(|n| backoff_after(*n).as_secs())
            .collect();
        assert_eq!(delays, [2, 4, 8, 256, 300, 300]);
    }

    #[test]
    fn dispatcher_step_reports_replicas_and_failures() {
        use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentStatus};
        let mut d = deployment::build(&fixtures::config("a"), &fixtures::settings());
        let (step, replicas, _) = dispatcher_step(&d);
        assert_eq!(
            (step.reason.as_str(), replicas),
            ("DeploymentApplied", Some(0))
        );
        d.status = Some(DeploymentStatus {
            replicas: Some(2),
            ready_replicas: Some(2),
            available_replicas: Some(2),
            ..Default::default()
        });
        let (step, replicas, ready) = dispatcher_step(&d);
        assert_eq!(
            (step.reason.as_str(), replicas, ready),
            ("DeploymentAvailable", Some(2), Some(2))
        );
        d.status.as_mut().unwrap().conditions = Some(vec![DeploymentCondition {
            type_: "Progressing".into(),
            status: "False".into(),
            reason: Some("ProgressDeadlineExceeded".into()),
            message: Some("image pull".into()),
            ..Default::default()
        }]);
        let (step, _, _) = dispatcher_step(&d);
        assert_eq!(step.state, status::State::False);
        assert_eq!(step.reason, "ProgressDeadlineExceeded");
    }

    #[test]
    fn scaling_step_says_when_partitions_clamp() {
        let config = fixtures::config_with("a", |s| {
            s.scaling = Some(asyncd_spec::job::ScalingSpec {
                max_replicas: Some(20),
                ..Default::default()
            })
        });
        let step = scaling_step(&config, hpa::bounds(config.spec.scaling.as_ref(), Some(6)));
        assert_eq!(step.reason, "MaxReplicasClamped");
        assert!(
            step.message
                .contains("maxReplicas 20 clamped to the 6 partitions"),
            "{}",
            step.message
        );
    }

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

    #[tokio::test]
    async fn topic_step_creates_grows_and_refuses_to_shrink() {
        let admin = FakeAdmin::default();
        let six = fixtures::config("a");
        let out = topic_step(&six, &admin).await.unwrap();
        assert_eq!(out.step.reason, "TopicCreated");
        assert_eq!(out.partitions, Some(6));
        // again: nothing to do
        let out = topic_step(&six, &admin).await.unwrap();
        assert_eq!((out.step.reason.as_str(), out.action), ("TopicReady", None));
        let twelve = fixtures::config_with("a", |s| s.kafka.as_mut().unwrap().partitions = 12);
        let out = topic_step(&twelve, &admin).await.unwrap();
        assert_eq!(out.step.reason, "PartitionsGrown");
        assert_eq!(out.partitions, Some(12));
        // shrinking back is refused, with the reason, and the broker is not touched
        let out = topic_step(&six, &admin).await.unwrap();
        assert_eq!(out.step.state, status::State::False);
        assert_eq!(out.step.reason, "ShrinkRefused");
        assert!(out.step.message.contains("has 12"), "{}", out.step.message);
        assert_eq!(out.partitions, Some(12));
        assert_eq!(
            *admin.calls.lock().unwrap(),
            ["create topic 6", "grow topic 12"]
        );
        assert_eq!(admin.topics.lock().unwrap()["topic"], 12);
        // no kafka section: no topic
        let none = fixtures::config_with("b", |s| s.kafka = None);
        let out = topic_step(&none, &admin).await.unwrap();
        assert_eq!(
            (out.step.reason.as_str(), out.partitions),
            ("NoTopic", None)
        );
    }
}

//! Steps 3–4, build and apply, for a config admitted by [`validate`](super::validate):
//! topic, route, Deployment, HPA — each built by its pure builder, then applied by
//! server-side apply with field manager `asyncd-operator`, stopping at the first step
//! that fails (later steps stay Pending in the report). A config the routing rebuild
//! leaves out (a limiter it names went away since the pass began) stops there too, with
//! `RoutingReady=False`: no dispatcher for a job no dispatcher can load.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use super::status::write_limiter_statuses;
use super::topic::apply_topic;
use super::validate::{check_limiters, validate};
use super::{Context, Error};
use crate::builders::{self, MANAGED_BY, deployment, hpa, routing};
use crate::conflicts;
use crate::crd::AsyncJobConfig;
use crate::status::{DISPATCHER_READY, ROUTING_READY, Report, SCALING_READY, Step};

fn apply_params() -> PatchParams {
    PatchParams::apply(MANAGED_BY).force()
}

/// Steps 3–4 for a config that owns its task type and topic: topic, route, Deployment,
/// HPA, stopping at the first failure (later steps stay Pending).
pub(super) async fn run_pipeline(
    config: &AsyncJobConfig,
    ctx: &Context,
) -> (Report, Option<Error>) {
    let mut report = Report::new();
    let result: Result<(), Error> = async {
        let partitions = apply_topic(config, ctx, &mut report).await?;
        report.partitions = partitions;

        let routed = apply_routing(ctx, config.namespace())
            .await
            .inspect_err(|e| {
                report.set(
                    ROUTING_READY,
                    Step::failed("RoutingApplyFailed", e.to_string()),
                )
            })?;
        if let Err(step) = routed.step(config) {
            let message = step.message.clone();
            report.set(ROUTING_READY, step);
            return Err(Error::Step(message));
        }
        report.set(ROUTING_READY, route_step(config));

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

        let mut bounds = hpa::bounds(config.spec.scaling.as_ref(), partitions);
        // maxReplicas defaults to the partitions, which may be above the replica cap
        bounds.max = bounds.max.min(ctx.policy.max_replicas);
        bounds.min = bounds.min.min(bounds.max);
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

fn route_step(config: &AsyncJobConfig) -> Step {
    let mut message = format!(
        "key {} of ConfigMap {}",
        routing::key(config),
        routing::ROUTING_CONFIGMAP
    );
    if !config.spec.limiters.is_empty() {
        let names: Vec<&str> = config.spec.limiters.iter().map(|n| n.trim()).collect();
        message.push_str(&format!(", beside AsyncLimiters {}", names.join(", ")));
    }
    Step::ok("RouteApplied", message)
}

/// What a routing rebuild left out for naming a limiter it could not bind (as the
/// rebuild's own list of limiters saw them), and why.
#[derive(Debug, Default)]
pub(super) struct Routed {
    pub unbound: Vec<(String, asyncd_spec::SpecError)>,
}

impl Routed {
    /// The RoutingReady step saying why `config` was left out when a limiter it names
    /// could not be bound. A config left out for another reason — the cache already
    /// shows it deleted, or its ownership changed under the pass — goes on as before the
    /// limiters: the pass the change itself triggers settles it, and a failure here would
    /// only log one more reconcile failure for an ordinary deletion.
    pub fn step(&self, config: &AsyncJobConfig) -> Result<(), Step> {
        match self.unbound.iter().find(|(n, _)| n == config.name()) {
            Some((_, err)) => Err(Step::failed(
                "LimiterUnavailable",
                format!("{}: {}", err.field, err.message),
            )),
            None => Ok(()),
        }
    }
}

/// Rebuilds the namespace's routing ConfigMap from every routable config (owners with a
/// valid spec whose limiters all bind, not being deleted, not refused by their claim
/// step) and every valid AsyncLimiter, then writes the limiters' statuses.
pub(super) async fn apply_routing(ctx: &Context, namespace: &str) -> Result<Routed, Error> {
    let lock = ctx.routing_lock(namespace);
    let _guard = lock.lock().await;
    let limiters = ctx.limiters_in(namespace).await?;
    let configs = ctx.configs_in(namespace);
    let ownership = conflicts::resolve(configs.iter().map(|c| c.as_ref()));
    let mut routed = Routed::default();
    let routable: Vec<&AsyncJobConfig> = conflicts::routable(&configs, &ownership)
        .into_iter()
        .filter(|c| !ctx.is_refused(c))
        .filter(|c| {
            let Ok(job) = validate(c, &ctx.policy) else {
                return false;
            };
            match check_limiters(&job, namespace, &limiters) {
                Ok(()) => true,
                Err(err) => {
                    routed.unbound.push((c.name().to_string(), err));
                    false
                }
            }
        })
        .collect();
    let desired = routing::build(namespace, routable, limiters.routable());
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
    api.patch(
        routing::ROUTING_CONFIGMAP,
        &apply_params(),
        &Patch::Apply(&desired),
    )
    .await?;
    write_limiter_statuses(ctx, namespace, &limiters, &configs).await;
    Ok(routed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use crate::status;

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
}

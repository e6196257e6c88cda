//! The finalizer's cleanup, when a config is deleted: drop the route, the Deployment and
//! HPA it owns, and, under `deletePolicy: Delete`, the topics the broker records as this
//! config's (with their records).

use std::sync::Arc;

use asyncd_spec::DeletePolicy;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;
use tracing::info;

use super::apply::apply_routing;
use super::claims::owner_id;
use super::{Context, Error};
use crate::builders::{self, routing};
use crate::conflicts::{self, Ownership};
use crate::crd::AsyncJobConfig;

/// Deletion: drop the route, the Deployment and HPA (garbage collection would too, where
/// a controller-manager runs), and, under `deletePolicy: Delete`, each topic this config
/// owns in its namespace *and* on the broker's owner record; any other topic is left.
pub(super) async fn cleanup(config: Arc<AsyncJobConfig>, ctx: &Context) -> Result<Action, Error> {
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
        let topics = kafka.topics().join(" and ");
        if !owner {
            note.push_str(&format!(
                "; topics {topics} belong to another config and are left alone"
            ));
        } else if kafka.delete_policy == DeletePolicy::Delete {
            let me = owner_id(&config);
            let owners = ctx.admin.owners().await?;
            let (mine, others): (Vec<String>, Vec<String>) = kafka
                .topics()
                .into_iter()
                .partition(|t| owners.get(t) == Some(&me));
            // the record goes after the topic: a retried cleanup still finds it ours
            for topic in &mine {
                ctx.admin.delete(topic).await?;
                ctx.admin.set_owner(topic, None).await?;
                ctx.metrics.topic_ops.with_label_values(&["delete"]).inc();
            }
            if !mine.is_empty() {
                note.push_str(&format!(
                    "; deleted topics {} (deletePolicy: Delete)",
                    mine.join(" and ")
                ));
            }
            if !others.is_empty() {
                note.push_str(&format!(
                    "; kept topics {}: the broker does not record them as this config's",
                    others.join(" and ")
                ));
            }
        } else {
            note.push_str(&format!("; kept topics {topics} (deletePolicy: Retain)"));
        }
    }
    info!(namespace = %ns, config = %name, "{note}");
    ctx.event(&config, false, "Deleted", note).await;
    ctx.metrics.forget(&ns, &name);
    ctx.forget_refusal(&config);
    Ok(Action::await_change())
}

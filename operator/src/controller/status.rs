//! Step 5, status: conditions from what the pass did ([`status::status`]), Events on
//! their transitions, the state gauge, and a write through the status subresource only
//! when something changed. The namespace's AsyncLimiters get theirs (which configs name
//! each) from every routing rebuild, [`write_limiter_statuses`].

use std::sync::Arc;

use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tracing::warn;

use super::Context;
use super::validate::Limiters;
use crate::crd::{AsyncJobConfig, AsyncLimiter};
use crate::status::{self, Verdict};

pub(super) async fn write_status(
    config: &AsyncJobConfig,
    ctx: &Context,
    verdict: &Verdict,
) -> Result<(), kube::Error> {
    let ns = config.namespace();
    let name = config.name();
    let previous = config.status.as_ref();
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let job = super::validate::validate(config, &ctx.policy).ok();
    let next = status::with_job(
        status::status(previous, verdict, config.metadata.generation, &now),
        job.as_ref(),
    );
    ctx.metrics.set_state(
        ns,
        name,
        match verdict {
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
        ctx.event(config, warning, &reason, note).await;
    }
    if previous != Some(&next) {
        let api: Api<AsyncJobConfig> = Api::namespaced(ctx.client.clone(), ns);
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": next })),
        )
        .await?;
    }
    Ok(())
}

/// Writes each limiter's `status` (its `jobs`, from `configs`, the namespace's) when it
/// changed. Best effort: a failed write is logged and counted
/// (`asyncd_operator_reconcile_failures_total{error="limiter_status"}`) but does not fail
/// the routing rebuild it follows; the next rebuild writes it again.
pub(super) async fn write_limiter_statuses(
    ctx: &Context,
    namespace: &str,
    limiters: &Limiters,
    configs: &[Arc<AsyncJobConfig>],
) {
    let api: Api<AsyncLimiter> = Api::namespaced(ctx.client.clone(), namespace);
    for limiter in &limiters.items {
        let next = status::limiter_status(limiter, configs.iter().map(|c| c.as_ref()));
        if limiter.status.as_ref() == Some(&next) {
            continue;
        }
        let patch = Patch::Merge(json!({ "status": next }));
        match api
            .patch_status(limiter.name(), &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => {}
            // deleted since the list: nothing to describe
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => {
                ctx.metrics
                    .failures
                    .with_label_values(&["limiter_status"])
                    .inc();
                warn!(
                    namespace,
                    limiter = limiter.name(),
                    %err,
                    "could not write an AsyncLimiter's status"
                );
            }
        }
    }
}

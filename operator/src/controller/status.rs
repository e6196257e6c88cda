//! Step 5, status: conditions from what the pass did ([`status::status`]), Events on
//! their transitions, the state gauge, and a write through the status subresource only
//! when something changed.

use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::Context;
use crate::crd::AsyncJobConfig;
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

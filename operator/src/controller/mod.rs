//! The reconciler. One pass over a config is a pipeline, one module per step:
//!
//! 1. **read** — the config and its namespace's other configs, from the controller's
//!    cache ([`Context`]), and, for a config that names limiters, the namespace's
//!    AsyncLimiters, listed from the API server;
//! 2. [`validate`] — `asyncd_spec::JobSpec::validate`, the same check the dispatcher
//!    runs, that every limiter it names exists and is valid (else `InvalidSpec` on
//!    `spec.limiters[i]`), then ownership
//!    ([`conflicts::resolve`](crate::conflicts::resolve)): a config that is invalid or
//!    in conflict changes nothing; then [`claims`]: the signing
//!    Secret must be labelled for the config, and its topics must not be recorded on the
//!    broker as owned elsewhere — a config refused there changes nothing either;
//! 3. **build** — the desired objects from [`builders`](crate::builders) (pure);
//! 4. [`apply`] — [`topic`] (create/grow, never shrink), routing ConfigMap, Deployment,
//!    HPA, each by server-side apply with field manager `asyncd-operator`, stopping at
//!    the first step that fails;
//! 5. [`status`] — conditions from what happened, written through the status subresource
//!    only when they changed, with Events on changes.
//!
//! Passes are level-based and idempotent: everything is recomputed from the current
//! state each time, and the routing ConfigMap is rebuilt whole from every routable config
//! and every valid AsyncLimiter of the namespace (listed again under the namespace's
//! routing lock), after which each limiter's `status.jobs` is written if it changed.
//! A finalizer makes deletion run [`cleanup`]: the route goes (and the topics only under
//! `deletePolicy: Delete`, and only those recorded as this config's). Errors requeue with
//! exponential backoff per object ([`error_policy`]). [`wiring`] sets up the `Controller`
//! itself.

mod apply;
mod claims;
mod cleanup;
mod context;
mod status;
mod topic;
mod validate;
mod wiring;

#[cfg(test)]
mod limiter_scenarios;
#[cfg(test)]
mod scenario_harness;
#[cfg(test)]
mod scenarios;

use std::sync::Arc;
use std::time::Duration;

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use tracing::warn;

pub use context::{Context, backoff_after};
pub use topic::{TopicOutcome, topic_step};
pub use validate::validate;
pub use wiring::{peers_to_recheck, run};

use crate::crd::{AsyncJobConfig, FINALIZER};
use crate::kafka::TopicError;
use crate::status::{Report, Step, TOPIC_READY, Verdict};

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

/// The entry point the `Controller` calls: the finalizer decides between a pass and a
/// cleanup.
pub async fn reconcile(config: Arc<AsyncJobConfig>, ctx: Arc<Context>) -> Result<Action, Error> {
    let api: Api<AsyncJobConfig> = Api::namespaced(ctx.client.clone(), config.namespace());
    let result = finalizer(&api, FINALIZER, config.clone(), |event| async {
        match event {
            Finalizer::Apply(config) => pass(&config, &ctx).await,
            Finalizer::Cleanup(config) => cleanup::cleanup(config, &ctx).await,
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

/// One pass over a live config: read → validate → build/apply → status.
async fn pass(config: &AsyncJobConfig, ctx: &Context) -> Result<Action, Error> {
    let _timer = ctx.metrics.timer("apply");
    let peers = ctx.configs_in(config.namespace());
    // listed only for a config that names limiters: the routing rebuild lists them anyway
    let limiters = if config.spec.limiters.is_empty() {
        validate::Limiters::default()
    } else {
        ctx.limiters_in(config.namespace()).await?
    };
    let admitted = match validate::admit(config, &peers, &limiters, &ctx.policy) {
        Ok(()) => claims::claim(config, ctx).await.map(|claimed| {
            ctx.set_refused(config, claimed.is_err());
            claimed.map_err(Verdict::Conflict)
        }),
        Err(rejected) => Ok(Err(rejected)),
    };
    let (verdict, error, requeue) = match admitted {
        Ok(Ok(())) => {
            let (report, error) = apply::run_pipeline(config, ctx).await;
            (Verdict::Reconciled(report), error, RESYNC)
        }
        Ok(Err(rejected)) => {
            // an invalid or conflicting config may have been routed before: drop its entry
            apply::apply_routing(ctx, config.namespace()).await?;
            (rejected, None, RECHECK)
        }
        // the owner registry unreadable: reported as the topic step failing would be
        Err(Error::Kafka(err)) => {
            let mut report = Report::new();
            report.set(
                TOPIC_READY,
                Step::failed("KafkaUnavailable", err.to_string()),
            );
            (Verdict::Reconciled(report), Some(Error::Kafka(err)), RESYNC)
        }
        Err(other) => return Err(other),
    };
    status::write_status(config, ctx, &verdict).await?;
    match error {
        Some(err) => Err(err),
        None => Ok(Action::requeue(requeue)),
    }
}

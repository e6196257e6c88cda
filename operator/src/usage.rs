//! Limiter usage: how many attempts run under each AsyncLimiter, for the RUNNING column
//! of `kubectl get asynclimiters`.
//!
//! The count lives in asyncd's store, which the operator does not reach. So every
//! `--usage-interval` the operator reads asyncd's API (`GET /v1/limiters`, with the
//! bearer token in `--asyncd-api-token-file`, re-read each time because a projected
//! ServiceAccount token rotates) and writes each limiter's `status.running` when it
//! changed. Without `--asyncd-api-url` the loop does not run and the column stays empty.
//!
//! [`step`] is one pass (read, then write what changed); [`running_of`] decides each
//! limiter's figure and is unit-tested; the e2e test (e2e/operator.sh) runs the loop
//! against a real API server and asyncd API.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use asyncd_contract::LimiterList;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::crd::AsyncLimiter;
use crate::metrics::Metrics;

/// How long one read of the API may take: it is a few indexed counts.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("asyncd API {url}: {source}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("asyncd API token file {path}: {source}")]
    Token {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
}

/// Where the operator reads limiter usage: asyncd's API.
pub struct UsageSource {
    url: String,
    token_file: Option<PathBuf>,
    http: reqwest::Client,
}

impl UsageSource {
    /// `api_url` is the API's base (`http://asyncd-api.asyncd-system:8080`).
    pub fn new(api_url: &str, token_file: Option<PathBuf>) -> Result<Self, reqwest::Error> {
        Ok(Self {
            url: format!("{}/v1/limiters", api_url.trim_end_matches('/')),
            token_file,
            http: reqwest::Client::builder().timeout(READ_TIMEOUT).build()?,
        })
    }

    /// Attempts running under each limiter the API lists, by its `namespace/name`.
    pub async fn read(&self) -> Result<BTreeMap<String, u64>, UsageError> {
        let mut request = self.http.get(&self.url);
        if let Some(path) = &self.token_file {
            let token = std::fs::read_to_string(path).map_err(|source| UsageError::Token {
                path: path.display().to_string(),
                source,
            })?;
            request = request.bearer_auth(token.trim());
        }
        let http = |source| UsageError::Http {
            url: self.url.clone(),
            source,
        };
        let list: LimiterList = request
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .map_err(http)?
            .json()
            .await
            .map_err(http)?;
        Ok(list
            .limiters
            .into_iter()
            .map(|l| (l.name, l.running))
            .collect())
    }
}

/// The `status.running` `limiter` should show, given `usage` from the API: its total
/// there; 0 when no config names it (nothing can run under it); otherwise `None`,
/// leaving the last figure, because the API has not routed its configs yet (or may not
/// read them: its token's RBAC).
pub fn running_of(limiter: &AsyncLimiter, usage: &BTreeMap<String, u64>) -> Option<u64> {
    let id = asyncd_spec::limiter_id(Some(limiter.namespace()), limiter.name());
    match usage.get(&id) {
        Some(&running) => Some(running),
        None if limiter.status.as_ref().is_none_or(|s| s.jobs.is_empty()) => Some(0),
        None => None,
    }
}

/// One pass: read the usage, list the limiters (of `namespace`, or every namespace),
/// write each one's `status.running` that changed. A limiter whose write fails is
/// counted and the others go on.
pub async fn step(
    client: &kube::Client,
    source: &UsageSource,
    namespace: Option<&str>,
    metrics: &Metrics,
) -> Result<(), UsageError> {
    let usage = source.read().await?;
    let api: Api<AsyncLimiter> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    for limiter in api.list(&ListParams::default()).await? {
        let Some(running) = running_of(&limiter, &usage) else {
            continue;
        };
        if limiter.status.as_ref().and_then(|s| s.running) == Some(running) {
            continue;
        }
        let api: Api<AsyncLimiter> = Api::namespaced(client.clone(), limiter.namespace());
        let patch = Patch::Merge(json!({ "status": { "running": running } }));
        match api
            .patch_status(limiter.name(), &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => debug!(
                namespace = limiter.namespace(),
                limiter = limiter.name(),
                running,
                "limiter usage written"
            ),
            // deleted since the list
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => {
                metrics.failures.with_label_values(&["limiter_usage"]).inc();
                warn!(namespace = limiter.namespace(), limiter = limiter.name(), %err,
                    "could not write an AsyncLimiter's usage");
            }
        }
    }
    Ok(())
}

/// [`step`] every `interval` until `shutdown`. A failed pass is logged and counted
/// (`asyncd_operator_reconcile_failures_total{error="limiter_usage"}`); the figures stay
/// as last written until a pass succeeds.
pub async fn run(
    client: kube::Client,
    source: UsageSource,
    namespace: Option<String>,
    interval: Duration,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = shutdown.cancelled() => return,
        }
        if let Err(err) = step(&client, &source, namespace.as_deref(), &metrics).await {
            metrics.failures.with_label_values(&["limiter_usage"]).inc();
            warn!(%err, "could not read the limiters' usage");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::AsyncLimiterStatus;

    fn limiter(namespace: &str, jobs: &[&str]) -> AsyncLimiter {
        let mut limiter = crate::fixtures::limiter("psp", |s| s.concurrency = Some(2));
        limiter.metadata.namespace = Some(namespace.into());
        limiter.status = Some(AsyncLimiterStatus {
            jobs: jobs.iter().map(|j| j.to_string()).collect(),
            job_count: jobs.len() as u32,
            ..Default::default()
        });
        limiter
    }

    #[test]
    fn a_limiter_shows_its_namespaced_total_from_the_api() {
        let usage = BTreeMap::from([("shop/psp".to_string(), 7), ("bank/psp".to_string(), 1)]);
        assert_eq!(running_of(&limiter("shop", &["refund"]), &usage), Some(7));
        assert_eq!(running_of(&limiter("bank", &["payout"]), &usage), Some(1));
    }

    #[test]
    fn a_limiter_no_config_names_runs_nothing() {
        assert_eq!(running_of(&limiter("shop", &[]), &BTreeMap::new()), Some(0));
        let mut fresh = limiter("shop", &[]);
        fresh.status = None;
        assert_eq!(running_of(&fresh, &BTreeMap::new()), Some(0));
    }

    #[test]
    fn a_limiter_the_api_does_not_list_yet_keeps_its_figure() {
        let usage = BTreeMap::from([("bank/psp".to_string(), 3)]);
        assert_eq!(running_of(&limiter("shop", &["refund"]), &usage), None);
    }
}

//! Routing from the operator's ConfigMap, watched through the Kubernetes API (no volume
//! mount needed, so a dispatcher outside the cluster can follow it too). Each data entry
//! is one AsyncJobConfig document, exactly as a `--config` folder holds them.
//!
//! The watch is narrowed to the one ConfigMap by a field selector, which is what lets
//! the dispatchers' Role grant list/watch on that single object name.

use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{RouteTable, Routes, table_from_documents};

#[derive(Debug, thiserror::Error)]
pub enum ConfigMapError {
    #[error("--routing-configmap must be NAMESPACE/NAME, not {0:?}")]
    BadName(String),
    #[error("cannot reach the Kubernetes API: {0}")]
    Client(#[from] kube::Error),
}

fn table(
    map: &ConfigMap,
    origin: &str,
    job: Option<&str>,
) -> Result<RouteTable, super::RoutingError> {
    let mut sources: Vec<(PathBuf, String)> = map
        .data
        .iter()
        .flatten()
        .filter(|(key, _)| key.ends_with(".yaml") || key.ends_with(".yml"))
        .map(|(key, text)| (PathBuf::from(format!("{origin}:{key}")), text.clone()))
        .collect();
    sources.sort();
    table_from_documents(sources, job)
}

/// Connects to follow `namespace/name` and returns the table with the watcher that keeps
/// it current until `shutdown`, for the caller to run; the table is empty until the
/// ConfigMap is seen (the operator creates it with the first AsyncJobConfig).
pub async fn watch_configmap(
    reference: &str,
    job: Option<String>,
    shutdown: CancellationToken,
) -> Result<(Routes, impl Future<Output = ()> + Send + 'static), ConfigMapError> {
    let (namespace, name) = reference
        .split_once('/')
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty())
        .ok_or_else(|| ConfigMapError::BadName(reference.to_string()))?;
    let client = Client::try_default().await?;
    let api: Api<ConfigMap> = Api::namespaced(client, namespace);
    let (tx, rx) = watch::channel(Arc::new(RouteTable::default()));
    let origin = reference.to_string();
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let watcher = async move {
        let mut events = watcher::watcher(api, config).boxed();
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => return,
                event = events.next() => event,
            };
            let map = match event {
                Some(Ok(Event::Apply(map) | Event::InitApply(map))) => Some(map),
                Some(Ok(Event::Delete(_))) => None,
                Some(Ok(Event::Init | Event::InitDone)) => continue,
                Some(Err(err)) => {
                    // The watcher retries by itself; the last good table stays.
                    tracing::warn!(%err, configmap = %origin, "routing watch error");
                    continue;
                }
                None => return,
            };
            let table = match &map {
                Some(map) => table(map, &origin, job.as_deref()),
                None => Ok(RouteTable::default()),
            };
            match table {
                Ok(table) => {
                    tracing::info!(configmap = %origin, jobs = ?table.task_types(), "routing loaded");
                    tx.send_replace(Arc::new(table));
                }
                Err(err) => {
                    tracing::error!(%err, "routing ConfigMap not applied; keeping the last good one")
                }
            }
        }
    };
    Ok((rx, watcher))
}

//! What every pass shares: the client, the broker, the cache, events, metrics, backoff.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, ListParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource};
use tracing::warn;

use super::validate::Limiters;
use crate::builders::{DispatcherSettings, MANAGED_BY};
use crate::crd::{AsyncJobConfig, AsyncLimiter};
use crate::kafka::TopicAdmin;
use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::status::CONFLICT;

pub struct Context {
    pub client: Client,
    pub admin: Arc<dyn TopicAdmin>,
    pub settings: DispatcherSettings,
    pub policy: Policy,
    /// The controller's cache of every watched AsyncJobConfig.
    pub store: Store<AsyncJobConfig>,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    /// One routing rebuild at a time per namespace, so a stale view never wins.
    routing_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Consecutive failures per config, for the backoff.
    failures: Mutex<HashMap<ObjectRef<AsyncJobConfig>, u32>>,
    /// Per config, whether its last pass refused it for what only the broker or the API
    /// server knows (a topic's owner record, its signing Secret's label), which the
    /// namespace's routing rebuild cannot see in the cache.
    refused: Mutex<HashMap<ObjectRef<AsyncJobConfig>, bool>>,
}

impl Context {
    pub fn new(
        client: Client,
        admin: Arc<dyn TopicAdmin>,
        settings: DispatcherSettings,
        policy: Policy,
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
            policy,
            store,
            metrics,
            routing_locks: Mutex::default(),
            failures: Mutex::default(),
            refused: Mutex::default(),
        }
    }

    /// Remembers the outcome of `config`'s claim step.
    pub(super) fn set_refused(&self, config: &AsyncJobConfig, refused: bool) {
        self.refused
            .lock()
            .unwrap()
            .insert(ObjectRef::from_obj(config), refused);
    }

    /// Forgets a deleted config's claim step.
    pub(super) fn forget_refusal(&self, config: &AsyncJobConfig) {
        self.refused
            .lock()
            .unwrap()
            .remove(&ObjectRef::from_obj(config));
    }

    /// Whether `config` was refused by its claim step: as this process last saw it, or,
    /// before its first pass here (a restarted operator), as its status says.
    pub(super) fn is_refused(&self, config: &AsyncJobConfig) -> bool {
        if let Some(refused) = self
            .refused
            .lock()
            .unwrap()
            .get(&ObjectRef::from_obj(config))
        {
            return *refused;
        }
        config
            .status
            .as_ref()
            .and_then(|s| s.condition(CONFLICT))
            .is_some_and(|c| {
                c.status == "True"
                    && super::claims::REFUSALS
                        .iter()
                        .any(|refusal| refusal.reason() == c.reason)
            })
    }

    /// The read step: every config of `namespace` as last seen.
    pub(super) fn configs_in(&self, namespace: &str) -> Vec<Arc<AsyncJobConfig>> {
        let mut configs = self.store.state_filter(|c| c.namespace() == namespace);
        configs.sort_by(|a, b| a.name().cmp(b.name()));
        configs
    }

    /// The read step for limiters: every AsyncLimiter of `namespace`, listed from the API
    /// server (not a cache: a routing rebuild must never see limiters older than the
    /// change that triggered it). Without the AsyncLimiter CRD (404) or the right to list
    /// them (403: RBAC older than this operator) there are none, and the configs that name
    /// one say why they are not routed; the others are routed as before.
    pub(super) async fn limiters_in(&self, namespace: &str) -> Result<Limiters, kube::Error> {
        let api: Api<AsyncLimiter> = Api::namespaced(self.client.clone(), namespace);
        let unavailable = |why: &str| Limiters {
            items: Vec::new(),
            unavailable: Some(why.into()),
        };
        match api.list(&ListParams::default()).await {
            Ok(list) => Ok(Limiters::new(list.items)),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(unavailable(
                "the AsyncLimiter CRD is not installed (kubectl apply -f crds/asyncjobconfigs.yaml)",
            )),
            Err(kube::Error::Api(status)) if status.code == 403 => Ok(unavailable(
                "the operator may not list AsyncLimiters (its RBAC needs asynclimiters: get, \
                 list, watch; config/rbac/operator.yaml)",
            )),
            Err(err) => Err(err),
        }
    }

    pub(super) fn routing_lock(&self, namespace: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.routing_locks
            .lock()
            .unwrap()
            .entry(namespace.to_string())
            .or_default()
            .clone()
    }

    pub(super) async fn event(
        &self,
        config: &AsyncJobConfig,
        warning: bool,
        reason: &str,
        note: String,
    ) {
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

    pub(super) fn backoff(&self, config: &AsyncJobConfig) -> Duration {
        let mut failures = self.failures.lock().unwrap();
        let n = failures.entry(ObjectRef::from_obj(config)).or_default();
        *n = n.saturating_add(1);
        backoff_after(*n)
    }

    pub(super) fn succeeded(&self, config: &AsyncJobConfig) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_five_minutes() {
        let delays: Vec<u64> = [1, 2, 3, 8, 9, 20]
            .iter()
            .map(|n| backoff_after(*n).as_secs())
            .collect();
        assert_eq!(delays, [2, 4, 8, 256, 300, 300]);
    }
}

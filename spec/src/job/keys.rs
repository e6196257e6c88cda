//! `spec.concurrencyKey`, `spec.ordering` and `spec.fairness`: one key per task,
//! rendered from its payload, that limits and orders the job's tasks key by key, and
//! shares the job between tenants before keys.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Between a task's tenant and its key in the stored key (`tenant␟key`): a control
/// character no tenant may contain, so the store can split the two.
pub const TENANT_SEPARATOR: char = '\u{1f}';

/// `spec.concurrencyKey`: a limit per key, the key rendered from the payload.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConcurrencyKeySpec {
    /// Template filled from the payload's top-level fields, like `uniqueKey`:
    /// `"{merchant_id}"`. A submit whose payload lacks a field is refused.
    pub key: String,
    /// Attempts of one key in flight at once, in total.
    #[cfg_attr(feature = "kube", schemars(range(min = 1, max = 1000000)))]
    pub limit: u32,
    /// Attempts of one key begun per second, a token bucket per key held in total
    /// across dispatchers (optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<crate::RateLimitSpec>,
    /// Back each key off on its own (default false): an overload answer to one key's
    /// call (429 or 503, or one slower than `adaptiveConcurrency.latency`) cuts that
    /// key's limit in the dispatcher that called, and successes win it back, between 1
    /// and `limit` (docs/design.md, "Per-key limits").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<bool>,
}

/// A validated [`ConcurrencyKeySpec`], with the job's [`OrderingSpec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConcurrencyKey {
    pub template: String,
    pub limit: u32,
    /// `concurrencyKey.rateLimit`: each key's own token bucket.
    pub rate: Option<crate::RateLimit>,
    /// `concurrencyKey.adaptive`: each key's limit backs off on its own.
    pub adaptive: bool,
    /// `spec.ordering`: the key's tasks begin one at a time in submission order.
    pub fifo: Option<OnDead>,
    /// `spec.fairness`: the key is rendered as `tenant␟key`, and the claim shares the
    /// job between tenants first, by weight.
    pub tenants: Option<Tenants>,
}

/// `spec.fairness`: the job's tasks are shared between tenants first (weighted fair
/// queuing), then between each tenant's keys in turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FairnessSpec {
    /// Template of a task's tenant, filled from the payload like `concurrencyKey.key`:
    /// `"{customer_id}"`.
    pub tenant: String,
    /// Tasks a tenant begins per round, against `defaultWeight` for the others
    /// (at most 100 tenants named, each 1 to 1000).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub weights: BTreeMap<String, u32>,
    /// The weight of a tenant `weights` does not name (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(range(min = 1, max = 1000)))]
    pub default_weight: Option<u32>,
}

/// A validated [`FairnessSpec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenants {
    pub template: String,
    pub weights: BTreeMap<String, u32>,
    pub default_weight: u32,
}

impl Tenants {
    /// How many tenants `weights` may name: each is a term of the claim's SQL.
    pub const MAX_WEIGHTS: usize = 100;
    /// The highest weight: a thousand of its tasks per round to one of the others'.
    pub const MAX_WEIGHT: u32 = 1000;

    /// The weight `spec.fairness` gives `tenant`.
    pub fn weight_of(&self, tenant: &str) -> u32 {
        self.weights
            .get(tenant)
            .copied()
            .unwrap_or(self.default_weight)
    }

    /// The spec's weights with those set at runtime laid over them: what the claim uses.
    /// A tenant in neither has [`Self::default_weight`].
    pub fn with_runtime(&self, runtime: BTreeMap<String, u32>) -> BTreeMap<String, u32> {
        let mut weights = self.weights.clone();
        weights.extend(runtime);
        weights
    }
}

/// `spec.ordering`: the order in which one key's tasks begin.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OrderingSpec {
    /// Template filled from the payload's top-level fields, like `concurrencyKey.key`
    /// (which it must equal when both are set): `"{account_id}"`.
    pub key: String,
    /// `fifo`: in submission order, one at a time.
    pub mode: OrderingMode,
    /// What the key's later tasks do once one of its tasks is dead (default `block`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_dead: Option<OnDead>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum OrderingMode {
    /// The key's tasks begin in the order the API accepted them, each after the one
    /// before it has ended.
    #[default]
    Fifo,
}

/// What an ordered key's later tasks do once one of its tasks is dead.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum OnDead {
    /// They wait until the dead task is redriven (it then runs first) or purged.
    #[default]
    Block,
    /// They go on: the dead task no longer holds its place.
    Continue,
}

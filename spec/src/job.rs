//! The AsyncJobConfig document, and its validation into a [`Job`].
//!
//! The document keeps durations and schedules as the strings users write, so the same
//! struct serves YAML files, the routing ConfigMap and (later) the CRD schema;
//! [`JobSpec::validate`] is the one place that checks them and names the field at fault.

use std::net::IpAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::CronSchedule;

mod executor;
mod keys;
mod retention;
mod validate;
pub mod window;

pub use executor::{
    Batch, BatchSpec, DEFAULT_SIGNING_KEY, ExecutorSpec, SecretKeysRef, SigningSpec,
};
pub use keys::{
    ConcurrencyKey, ConcurrencyKeySpec, FairnessSpec, OnDead, OrderingMode, OrderingSpec,
    TENANT_SEPARATOR, Tenants,
};
pub use retention::{Retention, RetentionSpec};
pub(crate) use validate::validate_rate_limit;
pub use window::{DebounceSpec, JobWindow, ThrottleSpec};

pub const API_VERSION: &str = "asyncd.example.io/v1";
pub const KIND: &str = "AsyncJobConfig";

/// One AsyncJobConfig document, exactly as `kubectl apply` would take it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AsyncJobConfig {
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: JobSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Labels, annotations and the rest that Kubernetes adds are accepted and ignored.
    #[serde(flatten, default, skip_serializing)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobSpec {
    /// The `type` that submits name; one job per task type.
    pub task_type: String,
    /// The service that executes this job's tasks.
    pub executor: ExecutorSpec,
    /// Retries after a failed attempt, then dead letters.
    #[serde(default)]
    pub retry: RetrySpec,
    /// Template for a task's unique key, filled from the payload's top-level fields:
    /// `"order:{order_id}"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique_key: Option<String>,
    /// Attempts in flight at once, in total across every dispatcher replica and both
    /// routes (default 100). Counted in the store when an attempt begins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// Attempts begun per second, in total across every dispatcher replica and both
    /// routes: a token bucket kept in the store. Without it, no rate limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitSpec>,
    /// Attempts in flight at once per key, a key rendered from each task's payload at
    /// submit: in total across every dispatcher replica and both routes, with the
    /// keys' due tasks claimed in turn so one key's flood does not starve the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<ConcurrencyKeySpec>,
    /// Tasks of one key begin in the order they were submitted, one at a time: a task
    /// begins only once the key's earlier tasks have ended, and a retry keeps its place.
    /// Its key is the job's concurrency key (`concurrencyKey.key`, with a limit of 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering: Option<OrderingSpec>,
    /// How each dispatcher backs its share of `concurrency` off when the executor says
    /// it is overloaded (on by default for 429 and 503).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive_concurrency: Option<AdaptiveConcurrencySpec>,
    /// The job's Kafka topic, for tasks due soon; without it every task goes through the
    /// SQL store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka: Option<KafkaSpec>,
    /// Cron schedules that submit tasks of this job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(feature = "kube", schemars(length(max = 100)))]
    pub cron: Vec<CronSpec>,
    /// Dispatcher replicas (in a cluster: the HPA on due backlog).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling: Option<ScalingSpec>,
    /// How long finished tasks are kept before they are purged (and with them their
    /// idempotency keys), and how long a succeeded task holds its unique key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionSpec>,
    /// How long after it falls due a task may still begin (humantime, at least 1ms, at
    /// most 3650d): past that it ends `expired`, never reaching the executor, and no
    /// retry of it begins either. A submit's own `expires_at` or `startWithin` wins.
    /// Without it, tasks do not expire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_within: Option<String>,
    /// Combines the submits whose payloads render the same key: a trailing debounce
    /// keeps one waiting task with the latest payload, a leading one runs the first and
    /// drops the rest until a quiet period. A submit's own `debounce` wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce: Option<DebounceSpec>,
    /// At most one task per key rendered from the payload and period; the rest are
    /// refused or dropped. A submit's own `throttle` wins. Not with `debounce`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle: Option<ThrottleSpec>,
    /// While true, no attempt of this job begins: its tasks (cron firings included) wait
    /// in the store and run, in order, once it is false again. `POST
    /// /v1/jobs/{name}/pause` pauses a job as well, without changing its config.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// AsyncLimiters declared beside the job (in its namespace) whose limits the job's
    /// attempts count against, in total with every other job that names them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limiters: Vec<String>,
    /// Share the job between tenants first, by weight, then between each tenant's
    /// `concurrencyKey` keys in turn (store route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairness: Option<FairnessSpec>,
}

/// `spec.rateLimit`: a token bucket shared by every dispatcher of the job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateLimitSpec {
    /// Attempts begun per second, on average.
    #[cfg_attr(feature = "kube", schemars(range(min = 1, max = 1000000)))]
    pub per_second: u32,
    /// Attempts that may begin at once after an idle spell (default: `perSecond`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(range(min = 1, max = 1000000)))]
    pub burst: Option<u32>,
}

/// `spec.adaptiveConcurrency`: additive increase, multiplicative decrease of each
/// dispatcher's share of `concurrency` (docs/design.md, "Adaptive concurrency").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AdaptiveConcurrencySpec {
    /// Back off on 429 and 503 answers (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// An attempt that takes longer than this counts as an overload signal too
    /// (default: latency is not a signal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<String>,
}

/// A validated [`AdaptiveConcurrencySpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adaptive {
    pub enabled: bool,
    pub latency: Option<Duration>,
}

impl Default for Adaptive {
    fn default() -> Self {
        Self {
            enabled: true,
            latency: None,
        }
    }
}

/// A validated [`RateLimitSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub per_second: u32,
    pub burst: u32,
}

impl RateLimit {
    /// The highest `perSecond` and `burst` accepted: far above what one job's executor
    /// takes, and low enough that the store's token arithmetic (thousandths of a token
    /// in 64 bits) cannot overflow.
    pub const MAX: u32 = 1_000_000;
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetrySpec {
    /// Retries after the first attempt before the task goes to dead letters (default 3).
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// `exponential` (the default) or `fixed`.
    #[serde(default)]
    pub backoff: BackoffKind,
    /// Delay before the first retry (default 1s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_backoff: Option<String>,
    /// Longest delay between retries (default 10m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_backoff: Option<String>,
}

impl Default for RetrySpec {
    fn default() -> Self {
        Self {
            max_retries: default_max_retries(),
            backoff: BackoffKind::default(),
            initial_backoff: None,
            max_backoff: None,
        }
    }
}

fn default_max_retries() -> u32 {
    3
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum BackoffKind {
    #[default]
    Exponential,
    Fixed,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KafkaSpec {
    /// Topic name; one config per topic in a namespace.
    pub topic: String,
    /// Partitions of the topic; the operator grows the topic when this grows and refuses
    /// to shrink it.
    #[serde(default = "default_partitions")]
    #[cfg_attr(feature = "kube", schemars(range(max = MAX_PARTITIONS)))]
    #[cfg_attr(
        feature = "kube",
        schemars(extend("x-kubernetes-validations" = [{
            "rule": "self >= 1",
            "message": "kafka.partitions must be at least 1",
        }]))
    )]
    pub partitions: u32,
    /// Consumer group of the job's dispatchers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer_group: Option<String>,
    /// What the operator does with the topic when the AsyncJobConfig is deleted: `Retain`
    /// (the default) keeps it and its data, `Delete` deletes it.
    #[serde(default, skip_serializing_if = "DeletePolicy::is_retain")]
    pub delete_policy: DeletePolicy,
}

/// Tasks of this priority or above travel through the job's high-priority topic
/// ([`KafkaSpec::high_topic`]), which dispatchers consume apart from the main one, so a
/// lagging flood of lower-priority messages cannot hold them up (docs/design.md,
/// "Priority").
pub const HIGH_PRIORITY: u8 = 5;

/// The most partitions the CRD accepts for a job's topic: a ceiling on what one config
/// may ask of a shared broker (the operator's `--max-partitions` may set it lower).
pub const MAX_PARTITIONS: u32 = 1024;

/// The most dispatcher replicas the CRD accepts (the operator's `--max-replicas` may set
/// it lower).
pub const MAX_REPLICAS: u32 = 1024;

/// What the high-priority topic's name adds to `spec.kafka.topic`.
pub const HIGH_TOPIC_SUFFIX: &str = "-high";

/// Kafka refuses longer topic names; the high-priority topic needs room for its suffix.
const MAX_TOPIC_LEN: usize = 249 - HIGH_TOPIC_SUFFIX.len();

impl KafkaSpec {
    /// The topic of tasks of priority [`HIGH_PRIORITY`] and above: `{topic}-high`, with
    /// the main topic's partitions.
    pub fn high_topic(&self) -> String {
        format!("{}{HIGH_TOPIC_SUFFIX}", self.topic)
    }

    /// The job's topics, the main one first: what the operator and `--create-topics`
    /// create and what the dispatchers consume.
    pub fn topics(&self) -> [String; 2] {
        [self.topic.clone(), self.high_topic()]
    }

    /// The topic a task of `priority` is produced to.
    pub fn topic_for(&self, priority: u8) -> std::borrow::Cow<'_, str> {
        if priority >= HIGH_PRIORITY {
            self.high_topic().into()
        } else {
            self.topic.as_str().into()
        }
    }
}

/// What happens to a job's Kafka topic when its AsyncJobConfig is deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
pub enum DeletePolicy {
    /// Keep the topic and its data.
    #[default]
    Retain,
    /// Delete the topic with the config.
    Delete,
}

impl DeletePolicy {
    pub fn is_retain(&self) -> bool {
        *self == DeletePolicy::Retain
    }
}

fn default_partitions() -> u32 {
    6
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CronSpec {
    /// Unique within the job; part of each firing's identity.
    pub name: String,
    /// `CRON_TZ=Area/City` followed by a 5- or 6-field cron expression.
    #[cfg_attr(
        feature = "kube",
        schemars(
            length(max = 256),
            extend("x-kubernetes-validations" = [{
                "rule": "self.startsWith('CRON_TZ=')",
                "message": "a cron schedule must start with CRON_TZ=<time zone>, e.g. \"CRON_TZ=Europe/Berlin 0 3 * * *\"",
            }])
        )
    )]
    pub schedule: String,
    /// Any JSON value; sent as each firing's payload.
    #[serde(default)]
    #[cfg_attr(feature = "kube", schemars(schema_with = "crate::job::any_json"))]
    pub payload: serde_json::Value,
    /// Priority of each firing, 0 to 9.
    #[serde(default)]
    #[cfg_attr(feature = "kube", schemars(range(max = 9)))]
    pub priority: u8,
    /// While the previous firing has not finished, a firing runs anyway (`Allow`, the
    /// default), is skipped (`Skip`), waits for it (`BufferOne`: at most one waits), or
    /// cancels it (`CancelOther`).
    #[serde(default)]
    pub overlap: Overlap,
    /// How far back firings missed while no scheduler could write them (an outage)
    /// are still created, and run at once: a duration up to 7d, or "0s" for none
    /// (default 1h).
    #[serde(default)]
    pub catch_up: Option<String>,
    /// While true, this entry creates no firings (those already created, at most the
    /// scheduler's horizon ahead, still run). The job's other entries go on.
    #[serde(default)]
    pub paused: bool,
}

/// What a cron entry or a schedule does when a firing comes while the previous one has
/// not finished: the wire's enum, so the config and the API spell it alike.
pub use asyncd_contract::CronOverlap as Overlap;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "kube",
    schemars(extend("x-kubernetes-validations" = [{
        "rule": "!has(self.minReplicas) || !has(self.maxReplicas) || self.maxReplicas >= self.minReplicas",
        "message": "scaling.maxReplicas must not be below scaling.minReplicas",
    }]))
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScalingSpec {
    /// Fewest dispatcher replicas (default 1).
    #[serde(default)]
    #[cfg_attr(feature = "kube", schemars(range(min = 1, max = MAX_REPLICAS)))]
    pub min_replicas: Option<u32>,
    /// Most dispatcher replicas; never above the topic's partitions (default: the
    /// partitions).
    #[serde(default)]
    #[cfg_attr(feature = "kube", schemars(range(min = 1, max = MAX_REPLICAS)))]
    pub max_replicas: Option<u32>,
    /// Due-and-undispatched tasks per replica the autoscaler aims for (default 100).
    #[serde(default)]
    #[cfg_attr(feature = "kube", schemars(range(min = 1)))]
    pub target_due_backlog: Option<u32>,
    /// Seconds the autoscaler waits, after the backlog fell, before it removes replicas
    /// (the HPA's scale-down stabilization window; default 300). Replicas then go one a
    /// minute, each handing its partitions and claims over.
    #[serde(default)]
    #[cfg_attr(feature = "kube", schemars(range(max = 3600)))]
    pub scale_down_stabilization_seconds: Option<u32>,
}

/// A spec that failed validation: the dotted path of the field, and what is wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    pub field: String,
    pub message: String,
}

impl SpecError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A validated job: what the runtime works with.
#[derive(Debug, Clone)]
pub struct Job {
    pub name: String,
    pub task_type: String,
    /// Parsed once here: the dispatcher calls it for every attempt.
    pub executor_url: url::Url,
    /// The host of `executor_url` when it is an IP address: no DNS resolver sees it, so
    /// the dispatcher checks it against its address policy before each call.
    pub executor_ip: Option<IpAddr>,
    /// `spec.executor.errorBodies`: see [`ExecutorSpec::error_bodies`].
    pub executor_error_bodies: bool,
    /// `spec.executor.retryAfterHeader`, lower-cased (default `retry-after`).
    pub executor_retry_after_header: String,
    /// `spec.executor.http2`: see [`ExecutorSpec::http2`].
    pub executor_http2: bool,
    pub timeout: Duration,
    pub signing: Option<Signing>,
    pub max_retries: u32,
    pub backoff: BackoffKind,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub unique_key: Option<String>,
    /// In total across every dispatcher; see [`JobSpec::concurrency`].
    pub concurrency: u32,
    /// See [`JobSpec::rate_limit`].
    pub rate_limit: Option<RateLimit>,
    /// See [`JobSpec::concurrency_key`].
    pub concurrency_key: Option<ConcurrencyKey>,
    /// See [`JobSpec::adaptive_concurrency`].
    pub adaptive: Adaptive,
    pub kafka: Option<KafkaSpec>,
    pub cron: Vec<CronEntry>,
    pub retention: Retention,
    /// `spec.startWithin`: see [`JobSpec::start_within`].
    pub start_within: Option<Duration>,
    /// `spec.debounce` or `spec.throttle`, the submits' default key window.
    pub window: Option<JobWindow>,
    /// `spec.paused`: see [`JobSpec::paused`].
    pub paused: bool,
    /// `spec.executor.batch`: see [`ExecutorSpec::batch`].
    pub batch: Option<Batch>,
    /// `spec.limiters`, validated names.
    pub limiter_names: Vec<String>,
    /// The limiters `limiter_names` name, sorted by id: empty until
    /// [`bind_limiters`](crate::bind_limiters) resolves them beside the other jobs.
    pub limiters: Vec<std::sync::Arc<crate::Limiter>>,
}

/// A validated signing config: a Secret name and its one or two keys, primary first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signing {
    pub secret: String,
    pub keys: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct CronEntry {
    pub name: String,
    pub schedule: CronSchedule,
    pub payload: serde_json::Value,
    pub priority: u8,
    pub overlap: Overlap,
    /// How far back missed firings are created after an outage (zero: none).
    pub catch_up: Duration,
    pub paused: bool,
}

impl CronEntry {
    /// The default and the most of [`CronSpec::catch_up`].
    pub const DEFAULT_CATCH_UP: Duration = Duration::from_secs(3600);
    pub const MAX_CATCH_UP: Duration = Duration::from_secs(7 * 24 * 3600);
}

pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The shortest executor timeout, a job's or a task's: timeouts are kept in whole
/// milliseconds, and a shorter one was kept as none at all, failing every attempt.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);
pub const MAX_RETRIES_LIMIT: u32 = 100;

impl AsyncJobConfig {
    /// Parses one YAML document and validates it.
    pub fn from_yaml(text: &str) -> Result<(Self, Job), SpecError> {
        let doc: Self = serde_yaml::from_str(text)
            .map_err(|err| SpecError::new("document", err.to_string()))?;
        let job = doc.validate()?;
        Ok((doc, job))
    }

    pub fn validate(&self) -> Result<Job, SpecError> {
        if self.api_version != API_VERSION {
            return Err(SpecError::new(
                "apiVersion",
                format!("must be {API_VERSION}, not {:?}", self.api_version),
            ));
        }
        if self.kind != KIND {
            return Err(SpecError::new("kind", format!("must be {KIND}")));
        }
        if self.metadata.name.trim().is_empty() {
            return Err(SpecError::new("metadata.name", "must not be empty"));
        }
        self.spec.validate(&self.metadata.name)
    }
}

/// Schema of a field that holds any JSON value (a cron payload): kept as written.
#[cfg(feature = "kube")]
fn any_json(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Fills `{field}` in `template` from the payload's top-level fields; `what` names the
/// template in the error for a missing field.
pub(crate) fn render(
    template: &str,
    what: &str,
    payload: &serde_json::Value,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let end = rest[start..]
            .find('}')
            .map(|e| start + e)
            .unwrap_or(rest.len());
        let field = &rest[start + 1..end];
        let value = payload
            .get(field)
            .ok_or_else(|| format!("the job's {what} needs payload field {field:?}"))?;
        match value {
            serde_json::Value::String(s) => out.push_str(s),
            other => out.push_str(&other.to_string()),
        }
        rest = &rest[(end + 1).min(rest.len())..];
    }
    out.push_str(rest);
    Ok(out)
}

impl Job {
    /// The job's tenants (`spec.fairness`), weighted in its fair claim; `None` without.
    pub fn tenants(&self) -> Option<&Tenants> {
        self.concurrency_key.as_ref()?.tenants.as_ref()
    }

    /// Renders the job's unique-key template from a payload's top-level fields; `None`
    /// when the job has no template. A missing field is an error naming it.
    pub fn render_unique_key(&self, payload: &serde_json::Value) -> Result<Option<String>, String> {
        self.unique_key
            .as_deref()
            .map(|template| render(template, "uniqueKey", payload))
            .transpose()
    }

    /// Renders the job's `concurrencyKey` template, as [`Job::render_unique_key`] does;
    /// with `fairness`, as `tenant␟key` ([`TENANT_SEPARATOR`]).
    pub fn render_concurrency_key(
        &self,
        payload: &serde_json::Value,
    ) -> Result<Option<String>, String> {
        let Some(key) = &self.concurrency_key else {
            return Ok(None);
        };
        let rendered = render(&key.template, "concurrencyKey", payload)?;
        let Some(tenants) = &key.tenants else {
            return Ok(Some(rendered));
        };
        let tenant = render(&tenants.template, "fairness.tenant", payload)?;
        if tenant.contains(TENANT_SEPARATOR) {
            return Err("the job's fairness.tenant must not contain U+001F".into());
        }
        Ok(Some(format!("{tenant}{TENANT_SEPARATOR}{rendered}")))
    }

    /// The retry delay after the given failed attempt (1-based), before jitter.
    pub fn backoff_for(&self, attempt: u32) -> Duration {
        match self.backoff {
            BackoffKind::Fixed => self.initial_backoff,
            BackoffKind::Exponential => {
                let factor = 2u32.saturating_pow(attempt.saturating_sub(1).min(30));
                self.initial_backoff
                    .saturating_mul(factor)
                    .min(self.max_backoff)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = include_str!("../../config/samples/order-cancel-job.yaml");

    #[test]
    fn the_committed_sample_is_valid() {
        let (doc, job) = AsyncJobConfig::from_yaml(SAMPLE).unwrap();
        assert_eq!(doc.metadata.name, "order-cancel-job");
        assert_eq!(job.task_type, "cancel_expired_order");
        assert_eq!(job.timeout, Duration::from_secs(30));
        assert_eq!(job.max_retries, 3);
        assert_eq!(job.cron.len(), 1);
        assert_eq!(job.kafka.as_ref().unwrap().partitions, 6);
    }

    fn with(edit: impl FnOnce(&mut AsyncJobConfig)) -> SpecError {
        let (mut doc, _) = AsyncJobConfig::from_yaml(SAMPLE).unwrap();
        edit(&mut doc);
        doc.validate().unwrap_err()
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(
            with(|d| d.spec.cron[0].schedule = "0 0 * * *".into()).field,
            "spec.cron[0].schedule"
        );
        assert_eq!(
            with(|d| d.spec.cron[0].catch_up = Some("8d".into())).field,
            "spec.cron[0].catchUp"
        );
        assert_eq!(
            with(|d| d.spec.cron[0].catch_up = Some("soon".into())).field,
            "spec.cron[0].catchUp"
        );
        assert_eq!(
            with(|d| d.spec.executor.url = "ftp://x".into()).field,
            "spec.executor.url"
        );
        assert_eq!(
            with(|d| d.spec.executor.timeout = Some("-1s".into())).field,
            "spec.executor.timeout"
        );
        assert_eq!(
            with(|d| d.spec.executor.timeout = Some("999us".into())).field,
            "spec.executor.timeout",
            "kept in whole milliseconds, it would be kept as none"
        );
        assert_eq!(
            with(|d| d.spec.retention = Some(RetentionSpec {
                unique_keys: Some("25h".into()),
                ..RetentionSpec::default()
            }))
            .field,
            "spec.retention.uniqueKeys",
            "longer than the default 24h the succeeded row is kept"
        );
        assert_eq!(
            with(|d| d.spec.retention = Some(RetentionSpec {
                dead: Some("3651d".into()),
                ..RetentionSpec::default()
            }))
            .field,
            "spec.retention.dead"
        );
        assert_eq!(
            with(|d| d.spec.retention = Some(RetentionSpec {
                succeeded: Some("soon".into()),
                ..RetentionSpec::default()
            }))
            .field,
            "spec.retention.succeeded"
        );
        assert_eq!(
            with(|d| d.spec.retry.max_retries = 1000).field,
            "spec.retry.maxRetries"
        );
        assert_eq!(
            with(|d| d.spec.task_type = String::new()).field,
            "spec.taskType"
        );
        assert_eq!(
            with(|d| d.spec.unique_key = Some("order:{id".into())).field,
            "spec.uniqueKey"
        );
        assert_eq!(with(|d| d.kind = "Job".into()).field, "kind");
        assert_eq!(
            with(|d| d.spec.rate_limit = Some(RateLimitSpec {
                per_second: 0,
                burst: None
            }))
            .field,
            "spec.rateLimit.perSecond"
        );
        assert_eq!(
            with(|d| d.spec.rate_limit = Some(RateLimitSpec {
                per_second: 5,
                burst: Some(RateLimit::MAX + 1)
            }))
            .field,
            "spec.rateLimit.burst"
        );
    }

    #[test]
    fn a_keys_adaptive_limit_is_off_unless_asked_for() {
        let job = |extra: &str| AsyncJobConfig::from_yaml(&SAMPLE.replace("spec:\n", extra));
        let key = |yaml: &str| job(yaml).unwrap().1.concurrency_key.unwrap();
        assert!(!key("spec:\n  concurrencyKey: {key: '{m}', limit: 4}\n").adaptive);
        assert!(key("spec:\n  concurrencyKey: {key: '{m}', limit: 4, adaptive: true}\n").adaptive);
    }

    #[test]
    fn a_bad_concurrency_key_is_named() {
        let key = |key: &str, limit: u32| {
            with(|d| {
                d.spec.concurrency_key = Some(ConcurrencyKeySpec {
                    key: key.into(),
                    limit,
                    rate_limit: None,
                    adaptive: None,
                })
            })
        };
        for (bad, message) in [
            ("{merchant_id", "unclosed"),
            ("merchant}", "unbalanced"),
            ("merchant", "names no payload field"),
            ("m:{}", "empty"),
        ] {
            let err = key(bad, 2);
            assert_eq!(err.field, "spec.concurrencyKey.key", "{bad}");
            assert!(err.message.contains(message), "{bad}: {}", err.message);
        }
        let err = key("{merchant_id}", 0);
        assert_eq!(err.field, "spec.concurrencyKey.limit");
        assert!(err.message.contains("must be 1 to"), "{}", err.message);
        assert_eq!(
            with(
                |d| d.spec.adaptive_concurrency = Some(AdaptiveConcurrencySpec {
                    enabled: None,
                    latency: Some("fast".into()),
                })
            )
            .field,
            "spec.adaptiveConcurrency.latency"
        );
        let err = AsyncJobConfig::from_yaml(&SAMPLE.replace(
            "spec:\n",
            "spec:\n  concurrencyKey: {key: '{merchant_id}', limit: 0}\n",
        ))
        .unwrap_err();
        assert!(
            err.to_string().contains("spec.concurrencyKey.limit"),
            "{err}"
        );
    }

    /// The dispatcher checks an IP-literal host against its address policy per call; it
    /// must see the address the URL parser (and so reqwest) will connect to.
    #[test]
    fn an_executor_url_s_ip_literal_host_is_read_as_the_client_reads_it() {
        let job = |url: &str| {
            let (mut doc, _) = AsyncJobConfig::from_yaml(SAMPLE).unwrap();
            doc.spec.executor.url = url.into();
            doc.validate()
        };
        for (url, ip) in [
            ("http://169.254.169.254/latest", Some("169.254.169.254")),
            ("http://2852039166/", Some("169.254.169.254")),
            ("http://0xA9.0xFE.0xA9.0xFE:80/", Some("169.254.169.254")),
            ("https://[::ffff:7f00:1]:8443/run", Some("::ffff:127.0.0.1")),
            ("http://executor.team-a.svc:8080/run", None),
        ] {
            let expected = ip.map(|ip| ip.parse::<IpAddr>().unwrap());
            assert_eq!(job(url).unwrap().executor_ip, expected, "{url}");
        }
        for bad in ["http://", "http://[::1/run", "http://exa mple/"] {
            assert_eq!(job(bad).unwrap_err().field, "spec.executor.url", "{bad}");
        }
        let (_, plain) = AsyncJobConfig::from_yaml(SAMPLE).unwrap();
        assert!(!plain.executor_error_bodies, "off unless asked");
        let (_, opted) = AsyncJobConfig::from_yaml(
            &SAMPLE.replace("    url: ", "    errorBodies: true\n    url: "),
        )
        .unwrap();
        assert!(opted.executor_error_bodies);
        assert!(!plain.executor_http2, "HTTP/1.1 unless asked");
        let (_, h2) =
            AsyncJobConfig::from_yaml(&SAMPLE.replace("    url: ", "    http2: true\n    url: "))
                .unwrap();
        assert!(h2.executor_http2);
    }

    #[test]
    fn the_retry_after_header_is_a_header_name_lower_cased() {
        let (_, default) = AsyncJobConfig::from_yaml(SAMPLE).unwrap();
        assert_eq!(default.executor_retry_after_header, "retry-after");
        let named = |name: &str| with(|d| d.spec.executor.retry_after_header = Some(name.into()));
        for bad in ["", "Rate Limit", "x:y", "é"] {
            assert_eq!(
                named(bad).field,
                "spec.executor.retryAfterHeader",
                "{bad:?}"
            );
        }
        let mut spec = AsyncJobConfig::from_yaml(SAMPLE).unwrap().0;
        spec.spec.executor.retry_after_header = Some("RateLimit-Reset".into());
        assert_eq!(
            spec.validate().unwrap().executor_retry_after_header,
            "ratelimit-reset"
        );
    }

    #[test]
    fn a_key_rate_is_validated_like_the_jobs() {
        let job = |extra: &str| AsyncJobConfig::from_yaml(&SAMPLE.replace("spec:\n", extra));
        let (_, paced) =
            job("spec:\n  concurrencyKey: {key: '{m}', limit: 2, rateLimit: {perSecond: 5}}\n")
                .unwrap();
        let rate = paced.concurrency_key.unwrap().rate.unwrap();
        assert_eq!((rate.per_second, rate.burst), (5, 5));
        let refused =
            job("spec:\n  concurrencyKey: {key: '{m}', limit: 2, rateLimit: {perSecond: 0}}\n")
                .unwrap_err();
        assert_eq!(refused.field, "spec.concurrencyKey.rateLimit.perSecond");
    }

    #[test]
    fn fairness_keys_each_task_by_tenant_and_key_and_checks_its_weights() {
        let job = |extra: &str| AsyncJobConfig::from_yaml(&SAMPLE.replace("spec:\n", extra));
        let (_, tenant_only) =
            job("spec:\n  fairness: {tenant: '{customer}', weights: {acme: 4}}\n").unwrap();
        let key = tenant_only.concurrency_key.as_ref().unwrap();
        assert_eq!(
            (key.limit, key.tenants.as_ref().unwrap().default_weight),
            (64, 1),
            "a tenant's key is limited by the job's concurrency"
        );
        let payload = serde_json::json!({"customer": "acme", "merchant": "m1"});
        assert_eq!(
            tenant_only
                .render_concurrency_key(&payload)
                .unwrap()
                .as_deref(),
            Some("acme\u{1f}")
        );
        let (_, keyed) = job("spec:\n  concurrencyKey: {key: '{merchant}', limit: 2}\n  \
             fairness: {tenant: '{customer}'}\n")
        .unwrap();
        assert_eq!(
            keyed.render_concurrency_key(&payload).unwrap().as_deref(),
            Some("acme\u{1f}m1")
        );
        let sneaky = serde_json::json!({"customer": "a\u{1f}b", "merchant": "m1"});
        assert!(keyed.render_concurrency_key(&sneaky).is_err());
        let refused = |extra: &str| job(extra).unwrap_err().field;
        assert_eq!(
            refused("spec:\n  fairness: {tenant: '{c}', weights: {acme: 0}}\n"),
            "spec.fairness.weights.acme"
        );
        assert_eq!(
            refused("spec:\n  fairness: {tenant: 'fixed'}\n"),
            "spec.fairness.tenant"
        );
        assert_eq!(
            refused("spec:\n  ordering: {key: '{a}', mode: fifo}\n  fairness: {tenant: '{c}'}\n"),
            "spec.fairness"
        );
    }

    #[test]
    fn ordering_keys_the_job_one_task_at_a_time_and_must_agree_with_its_concurrency_key() {
        let job = |extra: &str| AsyncJobConfig::from_yaml(&SAMPLE.replace("spec:\n", extra));
        let (_, ordered) = job("spec:\n  ordering: {key: '{account}', mode: fifo}\n").unwrap();
        assert_eq!(
            ordered.concurrency_key,
            Some(ConcurrencyKey {
                template: "{account}".into(),
                limit: 1,
                rate: None,
                adaptive: false,
                fifo: Some(OnDead::Block),
                tenants: None,
            }),
            "a key of its own, limit 1, dead tasks blocking by default"
        );
        let (_, both) = job(
            "spec:\n  concurrencyKey: {key: '{account}', limit: 1}\n  ordering: {key: '{account}', mode: fifo, onDead: continue}\n",
        )
        .unwrap();
        assert_eq!(both.concurrency_key.unwrap().fifo, Some(OnDead::Continue));
        for (extra, field, message) in [
            (
                "spec:\n  concurrencyKey: {key: '{merchant}', limit: 1}\n  ordering: {key: '{account}', mode: fifo}\n",
                "spec.ordering.key",
                "differs from spec.concurrencyKey.key",
            ),
            (
                "spec:\n  concurrencyKey: {key: '{account}', limit: 2}\n  ordering: {key: '{account}', mode: fifo}\n",
                "spec.concurrencyKey.limit",
                "must be 1 with spec.ordering",
            ),
            (
                "spec:\n  ordering: {key: 'account', mode: fifo}\n",
                "spec.ordering.key",
                "names no payload field",
            ),
        ] {
            let err = job(extra).unwrap_err();
            assert_eq!(err.field, field, "{extra}");
            assert!(err.message.contains(message), "{extra}: {}", err.message);
        }
        let err = job("spec:\n  ordering: {key: '{account}', mode: lifo}\n").unwrap_err();
        assert!(err.to_string().contains("lifo"), "{err}");
    }

    #[test]
    fn a_concurrency_key_renders_from_the_payload_and_adaptive_is_on_by_default() {
        let yaml = SAMPLE.replace(
            "spec:\n",
            "spec:\n  concurrencyKey: {key: 'm:{merchant_id}', limit: 2}\n",
        );
        let (_, job) = AsyncJobConfig::from_yaml(&yaml).unwrap();
        assert_eq!(job.concurrency_key.as_ref().unwrap().limit, 2);
        assert_eq!(
            job.render_concurrency_key(&serde_json::json!({"merchant_id": 7})),
            Ok(Some("m:7".into()))
        );
        let missing = job
            .render_concurrency_key(&serde_json::json!({}))
            .unwrap_err();
        assert!(missing.contains("concurrencyKey") && missing.contains("merchant_id"));
        assert_eq!(job.adaptive, Adaptive::default());
        assert!(job.adaptive.enabled);
    }

    #[test]
    fn batch_delivery_is_checked_and_waits_nothing_unless_told() {
        let (mut doc, job) = AsyncJobConfig::from_yaml(SAMPLE).unwrap();
        assert_eq!(job.batch, None);
        doc.spec.executor.batch = Some(BatchSpec {
            max_tasks: 100,
            max_wait: None,
        });
        assert_eq!(
            doc.validate().unwrap().batch,
            Some(Batch {
                max_tasks: 100,
                max_wait: Duration::ZERO
            })
        );
        doc.spec.executor.batch.as_mut().unwrap().max_wait = Some("20ms".into());
        assert_eq!(
            doc.validate().unwrap().batch.unwrap().max_wait,
            Duration::from_millis(20)
        );
        for (max_tasks, max_wait, field) in [
            (0, None, "spec.executor.batch.maxTasks"),
            (1001, None, "spec.executor.batch.maxTasks"),
            (10, Some("11s"), "spec.executor.batch.maxWait"),
            (10, Some("soon"), "spec.executor.batch.maxWait"),
        ] {
            doc.spec.executor.batch = Some(BatchSpec {
                max_tasks,
                max_wait: max_wait.map(Into::into),
            });
            assert_eq!(doc.validate().unwrap_err().field, field);
        }
        let yaml = SAMPLE.replace(
            "executor:\n",
            "executor:\n    batch: {maxTasks: 50, maxWait: 1s}\n",
        );
        let (_, job) = AsyncJobConfig::from_yaml(&yaml).unwrap();
        assert_eq!(
            job.batch,
            Some(Batch {
                max_tasks: 50,
                max_wait: Duration::from_secs(1)
            })
        );
    }

    #[test]
    fn a_rate_limit_bursts_one_seconds_worth_unless_told() {
        let (mut doc, _) = AsyncJobConfig::from_yaml(SAMPLE).unwrap();
        doc.spec.rate_limit = Some(RateLimitSpec {
            per_second: 20,
            burst: None,
        });
        let job = doc.validate().unwrap();
        assert_eq!(
            job.rate_limit,
            Some(RateLimit {
                per_second: 20,
                burst: 20
            })
        );
        doc.spec.rate_limit.as_mut().unwrap().burst = Some(1);
        assert_eq!(doc.validate().unwrap().rate_limit.unwrap().burst, 1);
    }

    #[test]
    fn the_signing_secret_and_keys_are_checked() {
        let (_, job) = AsyncJobConfig::from_yaml(SAMPLE).unwrap();
        assert_eq!(
            job.signing,
            Some(Signing {
                secret: "order-cancel-signing".into(),
                keys: vec!["key".into()],
            })
        );
        fn secret_ref(d: &mut AsyncJobConfig) -> &mut SecretKeysRef {
            &mut d.spec.executor.signing.as_mut().unwrap().secret_ref
        }
        let field = "spec.executor.signing.secretRef";
        for bad in [
            "",
            "../other",
            "a/b",
            "UPPER",
            "-x",
            "x..y",
            &"a".repeat(254),
        ] {
            let err = with(|d| secret_ref(d).name = bad.into());
            assert_eq!(err.field, format!("{field}.name"), "{bad:?}");
        }
        assert_eq!(
            with(|d| secret_ref(d).keys = vec![]).field,
            format!("{field}.keys")
        );
        assert_eq!(
            with(|d| secret_ref(d).keys = vec!["a".into(), "b".into(), "c".into()]).field,
            format!("{field}.keys")
        );
        for bad in ["", "..", "a/b", "a b"] {
            let err = with(|d| secret_ref(d).keys = vec!["key".into(), bad.into()]);
            assert_eq!(err.field, format!("{field}.keys[1]"), "{bad:?}");
        }
        assert_eq!(
            with(|d| secret_ref(d).keys = vec!["key".into(), "key".into()]).field,
            format!("{field}.keys[1]")
        );
        // Two keys while rotating; the default is `key`.
        let text = SAMPLE.replace("keys: [key]", "keys: [next, key]");
        let (_, job) = AsyncJobConfig::from_yaml(&text).unwrap();
        assert_eq!(job.signing.unwrap().keys, ["next", "key"]);
        let text = SAMPLE.replace("        keys: [key]\n", "");
        let (_, job) = AsyncJobConfig::from_yaml(&text).unwrap();
        assert_eq!(job.signing.unwrap().keys, [DEFAULT_SIGNING_KEY]);
        let text = SAMPLE.replace("    signing:", "    signingSecretEnv: X\n    signing:");
        assert!(
            AsyncJobConfig::from_yaml(&text).is_err(),
            "the old field is gone"
        );
    }

    #[test]
    fn unknown_fields_are_refused() {
        let text = SAMPLE.replace("taskType:", "taskTyp: x\n  taskType:");
        let err = AsyncJobConfig::from_yaml(&text).unwrap_err();
        assert!(err.message.contains("taskTyp"), "{err}");
    }

    #[test]
    fn unique_key_template_renders_from_payload() {
        let (_, job) = AsyncJobConfig::from_yaml(SAMPLE).unwrap();
        let key = job
            .render_unique_key(&serde_json::json!({"order_id": 42}))
            .unwrap();
        assert_eq!(key.as_deref(), Some("order:42"));
        let key = job
            .render_unique_key(&serde_json::json!({"order_id": "A7"}))
            .unwrap();
        assert_eq!(key.as_deref(), Some("order:A7"));
        assert!(
            job.render_unique_key(&serde_json::json!({}))
                .unwrap_err()
                .contains("order_id")
        );
    }

    #[test]
    fn topic_delete_policy_defaults_to_retain() {
        let (doc, _) = AsyncJobConfig::from_yaml(SAMPLE).unwrap();
        let kafka = doc.spec.kafka.as_ref().unwrap();
        assert_eq!(kafka.delete_policy, DeletePolicy::Retain);
        // the default is not written back, so existing documents serialise unchanged
        assert!(
            !serde_yaml::to_string(&doc)
                .unwrap()
                .contains("deletePolicy")
        );
        let text = SAMPLE.replace(
            "consumerGroup: asyncd-order-cancel-cg",
            "consumerGroup: asyncd-order-cancel-cg\n    deletePolicy: Delete",
        );
        let (doc, _) = AsyncJobConfig::from_yaml(&text).unwrap();
        assert_eq!(doc.spec.kafka.unwrap().delete_policy, DeletePolicy::Delete);
        let text = SAMPLE.replace(
            "consumerGroup: asyncd-order-cancel-cg",
            "consumerGroup: asyncd-order-cancel-cg\n    deletePolicy: Purge",
        );
        assert!(AsyncJobConfig::from_yaml(&text).is_err());
    }

    #[test]
    fn high_priority_tasks_have_a_topic_of_their_own() {
        let (_, job) = AsyncJobConfig::from_yaml(SAMPLE).unwrap();
        let kafka = job.kafka.as_ref().unwrap();
        let high = format!("{}-high", kafka.topic);
        assert_eq!(kafka.topics(), [kafka.topic.clone(), high.clone()]);
        for priority in 0..HIGH_PRIORITY {
            assert_eq!(kafka.topic_for(priority), kafka.topic.as_str());
        }
        for priority in HIGH_PRIORITY..=9 {
            assert_eq!(kafka.topic_for(priority), high.as_str());
        }
        // Kafka's topic names, with room for the suffix.
        for bad in ["has space", "slash/", &"t".repeat(245)] {
            let text = SAMPLE.replace(&kafka.topic, bad);
            let err = AsyncJobConfig::from_yaml(&text).unwrap_err();
            assert!(err.to_string().contains("spec.kafka.topic"), "{err}");
        }
        let longest = SAMPLE.replace(&kafka.topic, &"t".repeat(244));
        assert!(AsyncJobConfig::from_yaml(&longest).is_ok());
    }

    #[test]
    fn exponential_backoff_doubles_up_to_the_cap() {
        let (_, mut job) = AsyncJobConfig::from_yaml(SAMPLE).unwrap();
        job.initial_backoff = Duration::from_secs(1);
        job.max_backoff = Duration::from_secs(5);
        let delays: Vec<_> = (1..=5).map(|a| job.backoff_for(a).as_secs()).collect();
        assert_eq!(delays, vec![1, 2, 4, 5, 5]);
    }
}

//! The custom resources, group `asyncd.example.io`, version `v1`: `AsyncJobConfig` and
//! `AsyncLimiter`.
//!
//! Each spec *is* the `asyncd-spec` struct — [`asyncd_spec::JobSpec`],
//! [`asyncd_spec::LimiterSpec`] — that `asyncd dev --config DIR` and the dispatchers'
//! loader parse, wrapped in a transparent newtype so the derive can hang the CRD on it.
//! Their schemas (and the CEL rules the API server enforces) come from the `kube` feature
//! of `asyncd-spec`, so the document a team writes means the same thing on a laptop and in
//! a cluster. `crds/asyncjobconfigs.yaml` is [`yaml`]'s output (`crdgen`): both CRDs, one
//! YAML document each.

use std::ops::Deref;

use asyncd_spec::{JobSpec, LimiterSpec};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "asyncd.example.io";
pub const FINALIZER: &str = "asyncd.example.io/cleanup";

/// An AsyncJobConfig: one job (task type) of asyncd, with its executor, retries, Kafka
/// topic, cron schedules and scaling.
// clippy reads the repeated `printcolumn(type_ = …)` arguments as duplicated attributes
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "asyncd.example.io",
    version = "v1",
    kind = "AsyncJobConfig",
    plural = "asyncjobconfigs",
    singular = "asyncjobconfig",
    shortname = "asyncjobs",
    category = "asyncd",
    namespaced,
    status = "AsyncJobConfigStatus",
    derive = "PartialEq",
    doc = "One asyncd job: its task type, executor, retries, Kafka topic, cron schedules and scaling. The operator turns it into a Kafka topic, an entry in the namespace's asyncd-routing ConfigMap, a dispatcher Deployment and an HPA.",
    printcolumn(name = "Task Type", type_ = "string", json_path = ".spec.taskType"),
    printcolumn(name = "Topic", type_ = "string", json_path = ".spec.kafka.topic"),
    printcolumn(
        name = "Partitions",
        type_ = "integer",
        json_path = ".status.partitions",
        description = "Partitions the topic has"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".status.replicas",
        description = "Dispatcher replicas"
    ),
    printcolumn(
        name = "Paused",
        type_ = "boolean",
        json_path = ".spec.paused",
        description = "No attempt begins (spec.paused; a pause through the API shows in asyncd_job_paused)"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(transparent)]
pub struct AsyncJobConfigSpec(pub JobSpec);

impl Deref for AsyncJobConfigSpec {
    type Target = JobSpec;
    fn deref(&self) -> &JobSpec {
        &self.0
    }
}

/// What the operator last did with a config, written through the status subresource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AsyncJobConfigStatus {
    /// The `metadata.generation` these conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready, TopicReady, RoutingReady, DispatcherReady, ScalingReady and Conflict.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Partitions the Kafka topic has (which may be more than asked: Kafka never shrinks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<u32>,
    /// Dispatcher replicas (from the Deployment's status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Dispatcher replicas that are ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,
    /// Whether the config pauses the job (`spec.paused`) as last applied. A pause
    /// through the API (`POST /v1/jobs/{name}/pause`) is kept in the store, not here: it
    /// shows in `GET /v1/jobs/{name}` and `asyncd_job_paused{job}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// The job's limits in effect, defaults filled in, each in total across every
    /// dispatcher replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsStatus>,
}

/// `status.limits`: what the dispatchers keep (docs/api.md, "Concurrency and rate
/// limits of a job").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LimitsStatus {
    /// Attempts in flight at once.
    pub concurrency: u32,
    /// Attempts begun per second and the burst; null without a rate limit (written as
    /// null, so a merge patch removes a rate limit the spec no longer has).
    pub rate_limit: Option<RateLimitStatus>,
    /// Attempts of one `concurrencyKey` in flight at once; null without one.
    pub per_key: Option<u32>,
    /// Whether each dispatcher backs its share off on 429/503 (`adaptiveConcurrency`):
    /// its share in effect is `asyncd_job_effective_concurrency{job}`. (Absent from a
    /// status an older operator wrote.)
    #[serde(default)]
    pub adaptive: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitStatus {
    pub per_second: u32,
    pub burst: u32,
}

impl AsyncJobConfigStatus {
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

/// A status condition, shaped like `metav1.Condition`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// One CamelCase word saying why.
    pub reason: String,
    #[serde(default)]
    pub message: String,
    /// RFC 3339; changes only when `status` changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl AsyncJobConfig {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }

    /// The Kafka topics the config claims: its topic and its high-priority topic.
    pub fn topics(&self) -> Vec<String> {
        self.spec
            .kafka
            .as_ref()
            .filter(|k| !k.topic.trim().is_empty())
            .map_or_else(Vec::new, |k| k.topics().to_vec())
    }

    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
}

/// An AsyncLimiter: a concurrency limit, a rate limit or both, held in total across the
/// AsyncJobConfigs of its namespace that name it in `spec.limiters`.
// clippy reads the repeated `printcolumn(type_ = …)` arguments as duplicated attributes
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "asyncd.example.io",
    version = "v1",
    kind = "AsyncLimiter",
    plural = "asynclimiters",
    singular = "asynclimiter",
    shortname = "alim",
    category = "asyncd",
    namespaced,
    status = "AsyncLimiterStatus",
    derive = "PartialEq",
    doc = "A concurrency limit, a rate limit or both, shared by the AsyncJobConfigs of its namespace that name it in spec.limiters: their attempts count against it in total, across every dispatcher. The operator puts it in the namespace's asyncd-routing ConfigMap beside them.",
    printcolumn(
        name = "Concurrency",
        type_ = "integer",
        json_path = ".spec.concurrency",
        description = "Attempts running at once, in total across the jobs that name it"
    ),
    printcolumn(
        name = "Rate",
        type_ = "integer",
        json_path = ".spec.rateLimit.perSecond",
        description = "Attempts begun per second, in total across the jobs that name it"
    ),
    printcolumn(
        name = "Jobs",
        type_ = "integer",
        json_path = ".status.jobCount",
        description = "AsyncJobConfigs of the namespace that name it"
    ),
    printcolumn(
        name = "Running",
        type_ = "integer",
        json_path = ".status.running",
        description = "Attempts of those jobs running now, in total, as the operator last read it from asyncd's API"
    ),
    printcolumn(
        name = "Job Names",
        type_ = "string",
        json_path = ".status.jobs",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(transparent)]
pub struct AsyncLimiterSpec(pub LimiterSpec);

impl Deref for AsyncLimiterSpec {
    type Target = LimiterSpec;
    fn deref(&self) -> &LimiterSpec {
        &self.0
    }
}

/// Which configs name a limiter, written by the operator through the status subresource
/// whenever it rebuilds the namespace's routing ConfigMap.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AsyncLimiterStatus {
    /// The `metadata.generation` the operator last saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The AsyncJobConfigs of the namespace whose `spec.limiters` name this limiter, sorted
    /// (those being deleted left out). Only those that are routed count against it: a
    /// config in conflict or with an invalid spec is listed but not dispatched.
    #[serde(default)]
    pub jobs: Vec<String>,
    /// How many `jobs` there are (the JOBS column).
    #[serde(default)]
    pub job_count: u32,
    /// Attempts of those jobs running now, in total across every dispatcher (the RUNNING
    /// column), as asyncd's API answered the operator's last read (`GET /v1/limiters`,
    /// every `--usage-interval`). Absent when the operator is not given the API's URL
    /// (`--asyncd-api-url`) or has not read it yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<u64>,
}

impl AsyncLimiter {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }

    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
}

/// The AsyncJobConfig CRD, as applied to clusters: the derive's output, tidied for the API
/// server (see [`tidy`]), with `spec.limiters` capped at
/// [`MAX_LIMITERS_PER_JOB`](asyncd_spec::limiter::MAX_LIMITERS_PER_JOB) names.
pub fn definition() -> CustomResourceDefinition {
    let mut value = serde_json::to_value(AsyncJobConfig::crd()).expect("CRD serialises");
    tidy(&mut value);
    let spec = &mut value["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"];
    if let Some(limiters) = spec.get_mut("limiters").and_then(|l| l.as_object_mut()) {
        limiters.insert(
            "maxItems".into(),
            asyncd_spec::limiter::MAX_LIMITERS_PER_JOB.into(),
        );
    }
    serde_json::from_value(value).expect("CRD deserialises")
}

/// The CEL rule on an AsyncLimiter's spec: a limiter limits something.
pub const LIMITER_RULE: &str = "has(self.concurrency) || has(self.rateLimit)";

/// The AsyncLimiter CRD, tidied the same way, with [`LIMITER_RULE`] on its spec (what
/// `AsyncLimiter::validate` checks besides the ranges the schema holds).
pub fn limiter_definition() -> CustomResourceDefinition {
    let mut value = serde_json::to_value(AsyncLimiter::crd()).expect("CRD serialises");
    tidy(&mut value);
    let spec = value["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        .as_object_mut()
        .expect("the CRD has a spec schema");
    spec.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([{
            "rule": LIMITER_RULE,
            "message": "must set concurrency, rateLimit or both",
        }]),
    );
    serde_json::from_value(value).expect("CRD deserialises")
}

/// Every CRD of the operator, in the order `crdgen` prints them.
pub fn definitions() -> Vec<CustomResourceDefinition> {
    vec![definition(), limiter_definition()]
}

/// Removes what the API server refuses or warns about: `default: null` (from fields that
/// default to JSON null) and schemars' unsigned integer formats (`uint32`, `uint8`),
/// which Kubernetes does not know; `minimum` keeps those fields non-negative.
fn tidy(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            if map.get("default").is_some_and(|d| d.is_null()) {
                map.remove("default");
            }
            if map
                .get("format")
                .and_then(|f| f.as_str())
                .is_some_and(|f| f.starts_with("uint"))
            {
                map.remove("format");
            }
            map.values_mut().for_each(tidy);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(tidy),
        _ => {}
    }
}

pub const YAML_HEADER: &str = "# Generated by `cargo run -p asyncd-operator --bin crdgen > crds/asyncjobconfigs.yaml`.\n# Do not edit: change the Rust types (operator/src/crd.rs, spec/src/job.rs, spec/src/limiter.rs) and regenerate.\n# Two CRDs, one document each: AsyncJobConfig and AsyncLimiter.\n";

/// The CRDs as YAML, one document each, exactly as committed in `crds/asyncjobconfigs.yaml`.
pub fn yaml() -> String {
    let bodies: Vec<String> = definitions()
        .iter()
        .map(|crd| serde_yaml::to_string(crd).expect("CRD renders as YAML"))
        .collect();
    format!("{YAML_HEADER}{}", bodies.join("---\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn committed_path() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds/asyncjobconfigs.yaml")
    }

    #[test]
    fn committed_crd_matches_the_code() {
        let committed = std::fs::read_to_string(committed_path()).unwrap_or_default();
        assert!(
            committed == yaml(),
            "crds/asyncjobconfigs.yaml is stale: run\n  cargo run -p asyncd-operator --bin crdgen > crds/asyncjobconfigs.yaml"
        );
    }

    /// Helm installs the chart's copy: it must be the committed file (e2e/chart.sh checks
    /// the same; `e2e/chart.sh --sync-crd` copies it over).
    #[test]
    fn the_charts_copy_is_the_committed_crds() {
        let chart = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../charts/asyncd/crds/asyncjobconfigs.yaml");
        let copy = std::fs::read_to_string(chart).unwrap_or_default();
        assert!(
            copy == yaml(),
            "charts/asyncd/crds/asyncjobconfigs.yaml is stale: run\n  cp crds/asyncjobconfigs.yaml charts/asyncd/crds/"
        );
    }

    #[test]
    fn the_file_holds_both_crds_one_document_each() {
        let names: Vec<String> = serde_yaml::Deserializer::from_str(&yaml())
            .map(|doc| {
                let crd = CustomResourceDefinition::deserialize(doc).unwrap();
                crd.metadata.name.unwrap()
            })
            .collect();
        assert_eq!(
            names,
            [
                "asyncjobconfigs.asyncd.example.io",
                "asynclimiters.asyncd.example.io"
            ]
        );
    }

    #[test]
    fn names_scope_and_subresources() {
        let crd = definition();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("asyncjobconfigs.asyncd.example.io")
        );
        assert_eq!(crd.spec.group, GROUP);
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.kind, "AsyncJobConfig");
        assert_eq!(crd.spec.names.plural, "asyncjobconfigs");
        assert_eq!(
            crd.spec.names.short_names,
            Some(vec!["asyncjobs".to_string()])
        );
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1");
        assert!(version.subresources.as_ref().unwrap().status.is_some());
        let columns: Vec<_> = version
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(
            columns,
            [
                "Task Type",
                "Topic",
                "Partitions",
                "Replicas",
                "Paused",
                "Ready",
                "Reason",
                "Age"
            ]
        );
    }

    #[test]
    fn the_limiter_crd_names_scope_columns_and_rule() {
        let crd = limiter_definition();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("asynclimiters.asyncd.example.io")
        );
        assert_eq!(crd.spec.group, GROUP);
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.kind, "AsyncLimiter");
        assert_eq!(crd.spec.names.plural, "asynclimiters");
        assert_eq!(crd.spec.names.short_names, Some(vec!["alim".to_string()]));
        assert_eq!(crd.spec.names.categories, Some(vec!["asyncd".to_string()]));
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1");
        assert!(version.subresources.as_ref().unwrap().status.is_some());
        let columns: Vec<(&str, &str)> = version
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| (c.name.as_str(), c.json_path.as_str()))
            .collect();
        assert_eq!(
            columns,
            [
                ("Concurrency", ".spec.concurrency"),
                ("Rate", ".spec.rateLimit.perSecond"),
                ("Jobs", ".status.jobCount"),
                ("Running", ".status.running"),
                ("Job Names", ".status.jobs"),
                ("Age", ".metadata.creationTimestamp"),
            ]
        );
        let schema =
            serde_json::to_value(&crd).unwrap()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
                .clone();
        let spec = &schema["properties"]["spec"];
        assert_eq!(spec["x-kubernetes-validations"][0]["rule"], LIMITER_RULE);
        assert_eq!(spec["properties"]["concurrency"]["minimum"], 1.0);
        assert_eq!(
            spec["properties"]["rateLimit"]["required"],
            serde_json::json!(["perSecond"])
        );
        let status = &schema["properties"]["status"]["properties"];
        for field in ["observedGeneration", "jobs", "jobCount"] {
            assert!(status.get(field).is_some(), "status.{field}");
        }
    }

    #[test]
    fn a_config_names_at_most_four_limiters() {
        let limiters = &spec_schema()["properties"]["limiters"];
        assert_eq!(limiters["type"], "array");
        assert_eq!(limiters["maxItems"], 4);
        assert_eq!(limiters["items"]["type"], "string");
    }

    /// An AsyncLimiter sample reads the same through the dispatcher's loader and through
    /// the CRD type, and round-trips.
    fn limiter_sample_parses_identically(path: &std::path::Path, text: &str) {
        let doc: asyncd_spec::AsyncLimiter = serde_yaml::from_str(text).unwrap();
        let resource: AsyncLimiter = serde_yaml::from_str(text).unwrap();
        assert_eq!(resource.spec.0, doc.spec, "{}", path.display());
        assert_eq!(resource.name(), doc.metadata.name);
        let back: AsyncLimiter =
            serde_json::from_value(serde_json::to_value(&resource).unwrap()).unwrap();
        assert_eq!(back, resource);
        doc.validate()
            .unwrap_or_else(|e| panic!("{}: {}: {}", path.display(), e.field, e.message));
    }

    /// Every committed sample reads the same through the dispatcher's loader
    /// (`asyncd_spec::AsyncJobConfig`, `asyncd_spec::AsyncLimiter`) and through the CRD
    /// type, and round-trips.
    #[test]
    fn samples_parse_identically_as_documents_and_resources() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/samples");
        let mut seen = 0;
        let mut limiters = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let value: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
            if value["kind"].as_str() == Some(asyncd_spec::LIMITER_KIND) {
                limiter_sample_parses_identically(&path, &text);
                limiters += 1;
                continue;
            }
            let doc: asyncd_spec::AsyncJobConfig = serde_yaml::from_str(&text).unwrap();
            let resource: AsyncJobConfig = serde_yaml::from_str(&text).unwrap();
            assert_eq!(resource.spec.0, doc.spec, "{}", path.display());
            assert_eq!(resource.name(), doc.metadata.name);
            let back: AsyncJobConfig =
                serde_json::from_value(serde_json::to_value(&resource).unwrap()).unwrap();
            assert_eq!(back, resource);
            let valid = asyncd_spec::AsyncJobConfig::from_yaml(&text).is_ok();
            let is_invalid_sample = path
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("invalid");
            assert_eq!(valid, !is_invalid_sample, "{}", path.display());
            seen += 1;
        }
        assert!(seen >= 4, "samples: {seen}");
        assert!(limiters >= 1, "limiter samples: {limiters}");
    }

    fn spec_schema() -> serde_json::Value {
        let crd = serde_json::to_value(definition()).unwrap();
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
    }

    #[test]
    fn schema_is_the_job_spec_with_cel_rules() {
        let spec = spec_schema();
        let props = spec["properties"].as_object().unwrap();
        for field in [
            "taskType",
            "executor",
            "retry",
            "uniqueKey",
            "concurrency",
            "kafka",
            "cron",
            "scaling",
        ] {
            assert!(props.contains_key(field), "missing {field}");
        }
        assert_eq!(
            spec["required"],
            serde_json::json!(["executor", "taskType"])
        );
        let rules = |v: &serde_json::Value| v["x-kubernetes-validations"][0]["rule"].clone();
        assert_eq!(
            rules(&props["cron"]["items"]["properties"]["schedule"]),
            "self.startsWith('CRON_TZ=')"
        );
        assert_eq!(
            rules(&props["kafka"]["properties"]["partitions"]),
            "self >= 1"
        );
        assert!(
            rules(&props["scaling"])
                .as_str()
                .unwrap()
                .contains("self.maxReplicas >= self.minReplicas")
        );
        assert_eq!(
            props["kafka"]["properties"]["deletePolicy"]["enum"],
            serde_json::json!(["Retain", "Delete"])
        );
        // any JSON is kept as a cron payload, and no null default is left behind
        let payload = &props["cron"]["items"]["properties"]["payload"];
        assert_eq!(payload["x-kubernetes-preserve-unknown-fields"], true);
        assert!(!yaml().contains("default: null"));
        assert!(
            !yaml().contains("format: uint"),
            "Kubernetes warns about unknown formats"
        );
    }

    #[test]
    fn schema_is_structural() {
        // every property has a type, except the preserve-unknown-fields payload
        fn walk(path: &str, v: &serde_json::Value, out: &mut Vec<String>) {
            let Some(map) = v.as_object() else { return };
            if !map.contains_key("type")
                && map.get("x-kubernetes-preserve-unknown-fields").is_none()
            {
                out.push(path.to_string());
            }
            for key in ["anyOf", "oneOf", "allOf", "additionalProperties", "$ref"] {
                assert!(
                    !map.contains_key(key) || key == "additionalProperties",
                    "{path} has {key}"
                );
            }
            if let Some(props) = map.get("properties").and_then(|p| p.as_object()) {
                for (name, sub) in props {
                    walk(&format!("{path}.{name}"), sub, out);
                }
            }
            if let Some(items) = map.get("items") {
                walk(&format!("{path}[]"), items, out);
            }
        }
        let mut untyped = Vec::new();
        walk("spec", &spec_schema(), &mut untyped);
        let limiter = serde_json::to_value(limiter_definition()).unwrap();
        walk(
            "AsyncLimiter",
            &limiter["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
            &mut untyped,
        );
        assert!(untyped.is_empty(), "untyped: {untyped:?}");
    }
}

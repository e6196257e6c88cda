//! The AsyncLimiter document: a concurrency limit, a rate limit or both, declared once
//! and named by several jobs (`spec.limiters`), held in total across those jobs and
//! every dispatcher (docs/design.md, "Limiters shared across jobs").
//!
//! [`AsyncLimiter::validate`] checks one document; [`bind_limiters`] then resolves each
//! job's names against the limiters of its namespace and hands every limiter the task
//! types that count against it, so a dispatcher narrowed to one job (`--job`) still
//! counts the attempts of the others.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::job::{API_VERSION, Metadata, RateLimitSpec, validate_rate_limit};
use crate::{Job, RateLimit, SpecError};

pub const LIMITER_KIND: &str = "AsyncLimiter";

/// How many limiters one job may name: each is a row lock and a count on every start.
pub const MAX_LIMITERS_PER_JOB: usize = 4;

/// One AsyncLimiter document, exactly as `kubectl apply` would take it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AsyncLimiter {
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: LimiterSpec,
}

/// What an AsyncLimiter holds, in total across the jobs that name it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LimiterSpec {
    /// Attempts running at once, in total across the jobs that name the limiter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "kube", schemars(range(min = 1, max = 1000000)))]
    pub concurrency: Option<u32>,
    /// A token bucket the jobs that name the limiter spend together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimitSpec>,
}

/// A validated limiter, bound to the task types that count against it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limiter {
    /// `namespace/name`, or the bare name for a document without a namespace (a
    /// config folder): the store's key for the limiter's row.
    pub id: String,
    pub concurrency: Option<u32>,
    pub rate: Option<RateLimit>,
    /// Every job's task type that names the limiter, sorted.
    pub task_types: Vec<String>,
}

impl AsyncLimiter {
    pub fn validate(&self) -> Result<Limiter, SpecError> {
        if self.api_version != API_VERSION {
            return Err(SpecError::new(
                "apiVersion",
                format!("must be {API_VERSION}, not {:?}", self.api_version),
            ));
        }
        if self.kind != LIMITER_KIND {
            return Err(SpecError::new("kind", format!("must be {LIMITER_KIND}")));
        }
        let name = self.metadata.name.trim();
        check_name(name).map_err(|m| SpecError::new("metadata.name", m))?;
        if self.spec.concurrency == Some(0) {
            return Err(SpecError::new("spec.concurrency", "must be at least 1"));
        }
        if let Some(concurrency) = self.spec.concurrency
            && concurrency > RateLimit::MAX
        {
            return Err(SpecError::new(
                "spec.concurrency",
                format!("must be 1 to {}, not {concurrency}", RateLimit::MAX),
            ));
        }
        let rate = self
            .spec
            .rate_limit
            .as_ref()
            .map(|spec| validate_rate_limit(spec, "spec.rateLimit"))
            .transpose()?;
        if self.spec.concurrency.is_none() && rate.is_none() {
            return Err(SpecError::new(
                "spec",
                "must set concurrency, rateLimit or both",
            ));
        }
        Ok(Limiter {
            id: limiter_id(self.metadata.namespace.as_deref(), name),
            concurrency: self.spec.concurrency,
            rate,
            task_types: Vec::new(),
        })
    }
}

/// A limiter's name, as a job's `spec.limiters` names it: what Kubernetes accepts as an
/// object name (a DNS subdomain), so the same names work in a folder and a cluster.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{name:?} must be lower-case letters, digits, '-' and '.', starting and ending \
             with a letter or digit, at most 253 characters"
        ))
    }
}

/// The store's key for a limiter, and its name in asyncd's API (`GET /v1/limiters`).
pub fn limiter_id(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_string(),
    }
}

/// A job as [`bind_limiters`] takes it: validated, with the namespace of its document.
pub struct Declared<T> {
    pub namespace: Option<String>,
    pub value: T,
}

/// Resolves each job's `spec.limiters` against the limiters of its namespace, and gives
/// each limiter the task types of the jobs that name it. The error names the job and
/// its field when a limiter is missing.
pub fn bind_limiters(
    jobs: &mut [Declared<Job>],
    limiters: Vec<Limiter>,
) -> Result<(), (String, SpecError)> {
    let mut members: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let declared: HashMap<&str, &Limiter> = limiters.iter().map(|l| (l.id.as_str(), l)).collect();
    for job in jobs.iter() {
        for (index, name) in job.value.limiter_names.iter().enumerate() {
            let id = limiter_id(job.namespace.as_deref(), name);
            if !declared.contains_key(id.as_str()) {
                return Err((
                    job.value.name.clone(),
                    SpecError::new(
                        format!("spec.limiters[{index}]"),
                        format!("no AsyncLimiter {name:?} is declared beside this job"),
                    ),
                ));
            }
            members
                .entry(id)
                .or_default()
                .push(job.value.task_type.clone());
        }
    }
    let bound: HashMap<String, Arc<Limiter>> = limiters
        .into_iter()
        .map(|mut limiter| {
            let mut types = members.remove(&limiter.id).unwrap_or_default();
            types.sort();
            types.dedup();
            limiter.task_types = types;
            (limiter.id.clone(), Arc::new(limiter))
        })
        .collect();
    for job in jobs.iter_mut() {
        let mut ids: Vec<String> = job
            .value
            .limiter_names
            .iter()
            .map(|name| limiter_id(job.namespace.as_deref(), name))
            .collect();
        // Sorted: every start takes the limiters' rows in one order, so two starts
        // never wait on each other's.
        ids.sort();
        job.value.limiters = ids.iter().map(|id| bound[id].clone()).collect();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(text: &str) -> Result<Limiter, SpecError> {
        let doc: AsyncLimiter = serde_yaml::from_str(text).unwrap();
        doc.validate()
    }

    fn job(name: &str, limiters: &[&str]) -> Job {
        let (_, mut job) = crate::AsyncJobConfig::from_yaml(&format!(
            "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata: {{name: {name}}}\n\
             spec: {{taskType: {name}, executor: {{url: 'http://e/'}}}}"
        ))
        .unwrap();
        job.limiter_names = limiters.iter().map(|s| s.to_string()).collect();
        job
    }

    #[test]
    fn a_limiter_needs_a_limit_and_a_kubernetes_name() {
        let ok = limiter(
            "apiVersion: asyncd.example.io/v1\nkind: AsyncLimiter\nmetadata: {name: psp}\n\
             spec: {concurrency: 3, rateLimit: {perSecond: 10}}",
        )
        .unwrap();
        assert_eq!(
            (ok.id.as_str(), ok.concurrency, ok.rate.map(|r| r.burst)),
            ("psp", Some(3), Some(10))
        );
        let none = limiter(
            "apiVersion: asyncd.example.io/v1\nkind: AsyncLimiter\nmetadata: {name: psp}\nspec: {}",
        )
        .unwrap_err();
        assert_eq!(none.field, "spec");
        let zero = limiter(
            "apiVersion: asyncd.example.io/v1\nkind: AsyncLimiter\nmetadata: {name: psp}\n\
             spec: {concurrency: 0}",
        )
        .unwrap_err();
        assert_eq!(zero.field, "spec.concurrency");
        let rate = limiter(
            "apiVersion: asyncd.example.io/v1\nkind: AsyncLimiter\nmetadata: {name: psp}\n\
             spec: {rateLimit: {perSecond: 0}}",
        )
        .unwrap_err();
        assert_eq!(rate.field, "spec.rateLimit.perSecond");
        let name = limiter(
            "apiVersion: asyncd.example.io/v1\nkind: AsyncLimiter\nmetadata: {name: Big_Name}\n\
             spec: {concurrency: 1}",
        )
        .unwrap_err();
        assert_eq!(name.field, "metadata.name");
    }

    #[test]
    fn binding_gives_each_limiter_its_jobs_types_and_each_job_its_limiters_sorted() {
        let shared = |id: &str| Limiter {
            id: id.into(),
            concurrency: Some(2),
            rate: None,
            task_types: Vec::new(),
        };
        let mut jobs = vec![
            Declared {
                namespace: None,
                value: job("refund", &["psp", "bank"]),
            },
            Declared {
                namespace: None,
                value: job("payout", &["psp"]),
            },
            Declared {
                namespace: None,
                value: job("mail", &[]),
            },
        ];
        bind_limiters(
            &mut jobs,
            vec![shared("psp"), shared("bank"), shared("idle")],
        )
        .unwrap();
        let refund = &jobs[0].value.limiters;
        assert_eq!(
            refund.iter().map(|l| l.id.as_str()).collect::<Vec<_>>(),
            ["bank", "psp"]
        );
        assert_eq!(refund[1].task_types, ["payout", "refund"]);
        assert_eq!(refund[0].task_types, ["refund"]);
        assert!(jobs[2].value.limiters.is_empty());
    }

    #[test]
    fn a_job_names_only_the_limiters_of_its_own_namespace() {
        let mut jobs = vec![Declared {
            namespace: Some("shop".into()),
            value: job("refund", &["psp"]),
        }];
        let elsewhere = Limiter {
            id: "bank/psp".into(),
            concurrency: Some(1),
            rate: None,
            task_types: Vec::new(),
        };
        let (job, err) = bind_limiters(&mut jobs, vec![elsewhere]).unwrap_err();
        assert_eq!(
            (job.as_str(), err.field.as_str()),
            ("refund", "spec.limiters[0]")
        );
    }
}

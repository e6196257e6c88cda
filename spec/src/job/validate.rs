//! [`JobSpec::validate`]: the document, checked field by field into a [`Job`], each error
//! naming the field at fault.

use std::net::IpAddr;
use std::time::Duration;

use super::*;
use crate::limiter::{MAX_LIMITERS_PER_JOB, check_name as check_limiter_name};
use crate::{CronSchedule, parse_duration};

impl JobSpec {
    pub fn validate(&self, name: &str) -> Result<Job, SpecError> {
        let task_type = self.task_type.trim();
        if task_type.is_empty() || task_type.len() > 128 {
            return Err(SpecError::new(
                "spec.taskType",
                "must be 1 to 128 characters",
            ));
        }
        let url = self.executor.url.trim();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(SpecError::new(
                "spec.executor.url",
                format!("{url:?} must be an http:// or https:// URL"),
            ));
        }
        let parsed = url::Url::parse(url).map_err(|err| {
            SpecError::new("spec.executor.url", format!("{url:?} is not a URL: {err}"))
        })?;
        // As the URL parser reads it: `http://2852039166/` is 169.254.169.254 too.
        let executor_ip = match parsed.host() {
            Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
            Some(url::Host::Domain(_)) => None,
            None => {
                return Err(SpecError::new(
                    "spec.executor.url",
                    format!("{url:?} names no host"),
                ));
            }
        };
        let duration = |field: &str, text: &Option<String>, default: Duration| {
            text.as_deref()
                .map(parse_duration)
                .transpose()
                .map(|d| d.unwrap_or(default))
                .map_err(|message| SpecError::new(field, message))
        };
        let timeout = duration(
            "spec.executor.timeout",
            &self.executor.timeout,
            DEFAULT_TIMEOUT,
        )?;
        if timeout < MIN_TIMEOUT {
            return Err(SpecError::new(
                "spec.executor.timeout",
                "must be at least 1ms",
            ));
        }
        if self.retry.max_retries > MAX_RETRIES_LIMIT {
            return Err(SpecError::new(
                "spec.retry.maxRetries",
                format!("must be at most {MAX_RETRIES_LIMIT}"),
            ));
        }
        let initial_backoff = duration(
            "spec.retry.initialBackoff",
            &self.retry.initial_backoff,
            Duration::from_secs(1),
        )?;
        let max_backoff = duration(
            "spec.retry.maxBackoff",
            &self.retry.max_backoff,
            Duration::from_secs(600),
        )?;
        if max_backoff < initial_backoff {
            return Err(SpecError::new(
                "spec.retry.maxBackoff",
                "must not be below initialBackoff",
            ));
        }
        if let Some(template) = &self.unique_key {
            check_template(template).map_err(|m| SpecError::new("spec.uniqueKey", m))?;
        }
        if self.concurrency == Some(0) {
            return Err(SpecError::new("spec.concurrency", "must be at least 1"));
        }
        let rate_limit = self
            .rate_limit
            .as_ref()
            .map(|spec| validate_rate_limit(spec, "spec.rateLimit"))
            .transpose()?;
        if self.limiters.len() > MAX_LIMITERS_PER_JOB {
            return Err(SpecError::new(
                "spec.limiters",
                format!("at most {MAX_LIMITERS_PER_JOB} limiters"),
            ));
        }
        let mut limiter_names = Vec::with_capacity(self.limiters.len());
        for (index, name) in self.limiters.iter().enumerate() {
            let name = name.trim();
            check_limiter_name(name)
                .map_err(|m| SpecError::new(format!("spec.limiters[{index}]"), m))?;
            if limiter_names.iter().any(|n| n == name) {
                return Err(SpecError::new(
                    format!("spec.limiters[{index}]"),
                    format!("{name:?} is named twice"),
                ));
            }
            limiter_names.push(name.to_string());
        }
        let concurrency_key =
            validate_key_and_ordering(self.concurrency_key.as_ref(), self.ordering.as_ref())?;
        let concurrency_key = with_fairness(
            concurrency_key,
            self.fairness.as_ref(),
            self.concurrency.unwrap_or(DEFAULT_CONCURRENCY),
        )?;
        let adaptive = match &self.adaptive_concurrency {
            None => Adaptive::default(),
            Some(spec) => {
                let latency = spec
                    .latency
                    .as_deref()
                    .map(parse_duration)
                    .transpose()
                    .map_err(|m| SpecError::new("spec.adaptiveConcurrency.latency", m))?;
                if latency.is_some_and(|l| l.is_zero()) {
                    return Err(SpecError::new(
                        "spec.adaptiveConcurrency.latency",
                        "must be above zero",
                    ));
                }
                Adaptive {
                    enabled: spec.enabled.unwrap_or(true),
                    latency,
                }
            }
        };
        if let Some(kafka) = &self.kafka {
            if kafka.topic.trim().is_empty() {
                return Err(SpecError::new("spec.kafka.topic", "must not be empty"));
            }
            let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
            if kafka.topic.len() > MAX_TOPIC_LEN || !kafka.topic.chars().all(legal) {
                return Err(SpecError::new(
                    "spec.kafka.topic",
                    format!(
                        "must be at most {MAX_TOPIC_LEN} of the characters a-z, A-Z, 0-9, '.', '_' and '-' (Kafka's topic names, with room for the high-priority topic's suffix {HIGH_TOPIC_SUFFIX:?})"
                    ),
                ));
            }
            if kafka.partitions == 0 {
                return Err(SpecError::new(
                    "spec.kafka.partitions",
                    "must be at least 1",
                ));
            }
        }
        if let Some(scaling) = &self.scaling
            && let (Some(min), Some(max)) = (scaling.min_replicas, scaling.max_replicas)
            && max < min
        {
            return Err(SpecError::new(
                "spec.scaling.maxReplicas",
                "must not be below minReplicas",
            ));
        }
        let retention = retention::validate_retention(self.retention.as_ref())?;
        let window = window::validate_window(self.debounce.as_ref(), self.throttle.as_ref())?;
        let start_within = self
            .start_within
            .as_deref()
            .map(|text| {
                let field = "spec.startWithin";
                let within = parse_duration(text).map_err(|m| SpecError::new(field, m))?;
                if within < MIN_TIMEOUT || within > Retention::MAX {
                    return Err(SpecError::new(field, "must be 1ms to 3650d"));
                }
                Ok(within)
            })
            .transpose()?;
        let batch = self
            .executor
            .batch
            .as_ref()
            .map(validate_batch)
            .transpose()?;
        let mut cron = Vec::with_capacity(self.cron.len());
        for (index, entry) in self.cron.iter().enumerate() {
            let field = format!("spec.cron[{index}]");
            if entry.name.trim().is_empty() {
                return Err(SpecError::new(format!("{field}.name"), "must not be empty"));
            }
            if self.cron[..index].iter().any(|e| e.name == entry.name) {
                return Err(SpecError::new(
                    format!("{field}.name"),
                    format!("{:?} is used twice", entry.name),
                ));
            }
            if entry.priority > 9 {
                return Err(SpecError::new(format!("{field}.priority"), "must be 0..=9"));
            }
            let schedule = CronSchedule::parse(&entry.schedule)
                .map_err(|m| SpecError::new(format!("{field}.schedule"), m))?;
            let catch_up = entry
                .catch_up
                .as_deref()
                .map(parse_duration)
                .transpose()
                .map_err(|m| SpecError::new(format!("{field}.catchUp"), m))?
                .unwrap_or(CronEntry::DEFAULT_CATCH_UP);
            if catch_up > CronEntry::MAX_CATCH_UP {
                return Err(SpecError::new(
                    format!("{field}.catchUp"),
                    "must be at most 7d",
                ));
            }
            cron.push(CronEntry {
                name: entry.name.clone(),
                schedule,
                payload: entry.payload.clone(),
                priority: entry.priority,
                overlap: entry.overlap,
                catch_up,
                paused: entry.paused,
            });
        }
        Ok(Job {
            name: name.to_string(),
            task_type: task_type.to_string(),
            executor_url: parsed,
            executor_ip,
            executor_error_bodies: self.executor.error_bodies,
            executor_retry_after_header: validate_retry_after_header(
                self.executor.retry_after_header.as_deref(),
            )?,
            executor_http2: self.executor.http2,
            timeout,
            signing: self
                .executor
                .signing
                .as_ref()
                .map(validate_signing)
                .transpose()?,
            max_retries: self.retry.max_retries,
            backoff: self.retry.backoff,
            initial_backoff,
            max_backoff,
            unique_key: self.unique_key.clone(),
            concurrency: self.concurrency.unwrap_or(DEFAULT_CONCURRENCY),
            rate_limit,
            concurrency_key,
            adaptive,
            kafka: self.kafka.clone(),
            cron,
            retention,
            start_within,
            window,
            paused: self.paused,
            batch,
            limiter_names,
            limiters: Vec::new(),
        })
    }
}

fn validate_batch(spec: &BatchSpec) -> Result<Batch, SpecError> {
    if !(1..=Batch::MAX_TASKS).contains(&spec.max_tasks) {
        return Err(SpecError::new(
            "spec.executor.batch.maxTasks",
            format!("must be 1 to {}", Batch::MAX_TASKS),
        ));
    }
    let max_wait = spec
        .max_wait
        .as_deref()
        .map(parse_duration)
        .transpose()
        .map_err(|m| SpecError::new("spec.executor.batch.maxWait", m))?
        .unwrap_or(Duration::ZERO);
    if max_wait > Batch::MAX_WAIT {
        return Err(SpecError::new(
            "spec.executor.batch.maxWait",
            "must be at most 10s",
        ));
    }
    Ok(Batch {
        max_tasks: spec.max_tasks,
        max_wait,
    })
}

/// `spec` at `field` (`spec.rateLimit`), each error naming its sub-field.
pub(crate) fn validate_rate_limit(
    spec: &RateLimitSpec,
    field: &str,
) -> Result<RateLimit, SpecError> {
    let check = |field: &str, value: u32| {
        if (1..=RateLimit::MAX).contains(&value) {
            Ok(value)
        } else {
            Err(SpecError::new(
                field,
                format!("must be 1 to {}, not {value}", RateLimit::MAX),
            ))
        }
    };
    Ok(RateLimit {
        per_second: check(&format!("{field}.perSecond"), spec.per_second)?,
        burst: check(
            &format!("{field}.burst"),
            spec.burst.unwrap_or(spec.per_second),
        )?,
    })
}

/// `spec.concurrencyKey` and `spec.ordering` as one key: an ordered job's tasks are
/// keyed by the ordering's key, one of each key at a time.
fn validate_key_and_ordering(
    key: Option<&ConcurrencyKeySpec>,
    ordering: Option<&OrderingSpec>,
) -> Result<Option<ConcurrencyKey>, SpecError> {
    let Some(ordering) = ordering else {
        return key.map(validate_concurrency_key).transpose();
    };
    check_key_template("spec.ordering.key", &ordering.key)?;
    let fifo = Some(ordering.on_dead.unwrap_or_default());
    let Some(key) = key else {
        return Ok(Some(ConcurrencyKey {
            template: ordering.key.clone(),
            limit: 1,
            rate: None,
            adaptive: false,
            fifo,
            tenants: None,
        }));
    };
    let key = validate_concurrency_key(key)?;
    if key.template != ordering.key {
        return Err(SpecError::new(
            "spec.ordering.key",
            format!(
                "{:?} differs from spec.concurrencyKey.key {:?}: an ordered job has one key",
                ordering.key, key.template
            ),
        ));
    }
    if key.limit != 1 {
        return Err(SpecError::new(
            "spec.concurrencyKey.limit",
            format!(
                "must be 1 with spec.ordering (one task of a key at a time), not {}",
                key.limit
            ),
        ));
    }
    Ok(Some(ConcurrencyKey { fifo, ..key }))
}

fn check_key_template(field: &str, template: &str) -> Result<(), SpecError> {
    check_template(template).map_err(|m| SpecError::new(field, m))?;
    if !template.contains('{') {
        // One key for every task is what `concurrency` is for.
        return Err(SpecError::new(
            field,
            format!("{template:?} names no payload field ({{field}})"),
        ));
    }
    if template.contains("{}") {
        return Err(SpecError::new(
            field,
            format!("{template:?} has an empty {{}}"),
        ));
    }
    Ok(())
}

/// A header name as HTTP has it (RFC 9110 `token`), lower-cased as HTTP/2 sends it.
fn validate_retry_after_header(name: Option<&str>) -> Result<String, SpecError> {
    let Some(name) = name else {
        return Ok(asyncd_contract::headers::RETRY_AFTER.to_ascii_lowercase());
    };
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || name.len() > 64 || !name.chars().all(token) {
        return Err(SpecError::new(
            "spec.executor.retryAfterHeader",
            format!(
                "{name:?} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~, at most 64)"
            ),
        ));
    }
    Ok(name.to_ascii_lowercase())
}

fn validate_concurrency_key(spec: &ConcurrencyKeySpec) -> Result<ConcurrencyKey, SpecError> {
    check_key_template("spec.concurrencyKey.key", &spec.key)?;
    if !(1..=RateLimit::MAX).contains(&spec.limit) {
        return Err(SpecError::new(
            "spec.concurrencyKey.limit",
            format!("must be 1 to {}, not {}", RateLimit::MAX, spec.limit),
        ));
    }
    Ok(ConcurrencyKey {
        template: spec.key.clone(),
        limit: spec.limit,
        rate: spec
            .rate_limit
            .as_ref()
            .map(|rate| validate_rate_limit(rate, "spec.concurrencyKey.rateLimit"))
            .transpose()?,
        adaptive: spec.adaptive.unwrap_or(false),
        fifo: None,
        tenants: None,
    })
}

/// The job's attempts in flight when `spec.concurrency` is not set.
const DEFAULT_CONCURRENCY: u32 = 100;

/// `spec.fairness` on the job's key: a job without a `concurrencyKey` is keyed by tenant
/// alone (an empty key, limited only by `concurrency`).
fn with_fairness(
    key: Option<ConcurrencyKey>,
    fairness: Option<&FairnessSpec>,
    concurrency: u32,
) -> Result<Option<ConcurrencyKey>, SpecError> {
    let Some(fairness) = fairness else {
        return Ok(key);
    };
    check_key_template("spec.fairness.tenant", &fairness.tenant)?;
    if key.as_ref().is_some_and(|k| k.fifo.is_some()) {
        return Err(SpecError::new(
            "spec.fairness",
            "does not go with spec.ordering: an ordered key begins in submission order",
        ));
    }
    if fairness.weights.len() > Tenants::MAX_WEIGHTS {
        return Err(SpecError::new(
            "spec.fairness.weights",
            format!("at most {} tenants", Tenants::MAX_WEIGHTS),
        ));
    }
    let weight_ok = |w: u32| (1..=Tenants::MAX_WEIGHT).contains(&w);
    for (tenant, &weight) in &fairness.weights {
        if !weight_ok(weight) {
            return Err(SpecError::new(
                format!("spec.fairness.weights.{tenant}"),
                format!("must be 1 to {}, not {weight}", Tenants::MAX_WEIGHT),
            ));
        }
    }
    let default_weight = fairness.default_weight.unwrap_or(1);
    if !weight_ok(default_weight) {
        return Err(SpecError::new(
            "spec.fairness.defaultWeight",
            format!("must be 1 to {}, not {default_weight}", Tenants::MAX_WEIGHT),
        ));
    }
    let tenants = Some(Tenants {
        template: fairness.tenant.clone(),
        weights: fairness.weights.clone(),
        default_weight,
    });
    Ok(Some(match key {
        Some(key) => ConcurrencyKey { tenants, ..key },
        None => ConcurrencyKey {
            template: String::new(),
            limit: concurrency,
            rate: None,
            adaptive: false,
            fifo: None,
            tenants,
        },
    }))
}

fn validate_signing(signing: &SigningSpec) -> Result<Signing, SpecError> {
    let field = "spec.executor.signing.secretRef";
    let name = &signing.secret_ref.name;
    let dns_label = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    };
    // A DNS subdomain, as Kubernetes names Secrets: it also becomes a directory name,
    // so no `/` and no `..` can reach outside the signing directory.
    if name.len() > 253 || !name.split('.').all(dns_label) {
        return Err(SpecError::new(
            format!("{field}.name"),
            format!("{name:?} is not a Secret name (lowercase DNS subdomain)"),
        ));
    }
    let keys = &signing.secret_ref.keys;
    if keys.is_empty() || keys.len() > 2 {
        return Err(SpecError::new(
            format!("{field}.keys"),
            "must list one key, or two while rotating",
        ));
    }
    for (index, key) in keys.iter().enumerate() {
        let valid = !key.is_empty()
            && key.len() <= 253
            && key != "."
            && key != ".."
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        if !valid {
            return Err(SpecError::new(
                format!("{field}.keys[{index}]"),
                format!("{key:?} is not a Secret key ([-._a-zA-Z0-9]+)"),
            ));
        }
        if keys[..index].contains(key) {
            return Err(SpecError::new(
                format!("{field}.keys[{index}]"),
                format!("{key:?} is listed twice"),
            ));
        }
    }
    Ok(Signing {
        secret: name.clone(),
        keys: keys.clone(),
    })
}

pub(super) fn check_template(template: &str) -> Result<(), String> {
    let mut open = false;
    for c in template.chars() {
        match (c, open) {
            ('{', false) => open = true,
            ('}', true) => open = false,
            ('{', true) | ('}', false) => {
                return Err(format!("{template:?} has unbalanced braces"));
            }
            _ => {}
        }
    }
    if open {
        return Err(format!("{template:?} has an unclosed '{{'"));
    }
    Ok(())
}

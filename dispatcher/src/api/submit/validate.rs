//! Submit validation: a request body becomes a [`NewTask`] or an [`ApiError`] naming the
//! field. Pure, so every rule is unit-tested without a server.

use std::cell::Cell;
use std::time::Duration;

use asyncd_contract::{ErrorCode, MAX_BATCH};
use asyncd_spec::job::MAX_RETRIES_LIMIT;
use asyncd_spec::parse_duration;
use serde_json::value::RawValue;

use super::when::{due_at, expiry};
use crate::api::error::ApiError;
use crate::job_table::RouteTable;
use asyncd_contract::{Debounce, DebounceMode, OnLimit, Throttle};
use asyncd_spec::MIN_TIMEOUT;
use asyncd_spec::job::Job;
use asyncd_spec::job::window::{WindowRule as SpecRule, debounce_rule, window_duration};
use asyncd_store::{KeyWindow, Millis, NewTask, WindowRule};

pub const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);
pub const MAX_KEY_LEN: usize = 255;
pub use asyncd_contract::MAX_DEPENDENCIES;

/// What a request body may hold besides its payload: every other field is bounded
/// (keys at 255 bytes, 100 dependencies of 36), so 64 KiB leaves room for any valid
/// request, however it is spaced.
pub const ENVELOPE_BYTES: usize = 64 * 1024;

/// A submit body as the server reads it: the payload stays the JSON it was sent as.
pub type SubmitRequest = asyncd_contract::SubmitRequest<Box<RawValue>>;

/// Parses a submit body; a type error names the JSON path at fault.
pub fn parse(body: &[u8]) -> Result<SubmitRequest, ApiError> {
    parse_json(body)
}

/// Parses a JSON request body into `T`; a type error (an unknown field included) is
/// `malformed_json` naming the JSON path at fault.
pub(in crate::api) fn parse_json<T: serde::de::DeserializeOwned>(
    body: &[u8],
) -> Result<T, ApiError> {
    // Nearly every body parses: the path is tracked (a push and a pop per field) only
    // to name where one that does not went wrong, in a second reading.
    if let Ok(request) = serde_json::from_slice(body) {
        return Ok(request);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let request: T = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        // serde_path_to_error says "." for the root and "?" where it lost track.
        if path == "." || path == "?" {
            ApiError::new(ErrorCode::MalformedJson, inner.to_string())
        } else {
            ApiError::new(ErrorCode::MalformedJson, format!("{path}: {inner}")).with_field(path)
        }
    })?;
    de.end()
        .map_err(|e| ApiError::new(ErrorCode::MalformedJson, e.to_string()))?;
    Ok(request)
}

#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest `payload` of one task (`--max-payload-bytes`).
    pub max_payload_bytes: usize,
    /// Largest body of `POST /v1/tasks:batch` (`--max-batch-body-bytes`).
    pub max_batch_body_bytes: usize,
}

impl Limits {
    /// The largest body of every request but a batch: one task at the payload limit.
    pub fn body_bytes(&self) -> usize {
        self.max_payload_bytes.saturating_add(ENVELOPE_BYTES)
    }

    /// The largest batch body: never below [`Limits::body_bytes`], so any task that can
    /// be submitted alone can be submitted in a batch.
    pub fn batch_body_bytes(&self) -> usize {
        self.max_batch_body_bytes.max(self.body_bytes())
    }
}

/// Reads a batch body's items as raw JSON, one by one, and stops at item `MAX_BATCH +
/// 1`: an oversized batch is refused without parsing (or even reading as JSON) the rest.
pub fn parse_batch(body: &[u8]) -> Result<Vec<&RawValue>, ApiError> {
    let too_many = Cell::new(false);
    let mut de = serde_json::Deserializer::from_slice(body);
    let items = serde::de::DeserializeSeed::deserialize(
        BatchBody {
            too_many: &too_many,
        },
        &mut de,
    )
    .and_then(|items| de.end().map(|()| items));
    items.map_err(|e| {
        if too_many.get() {
            ApiError::field("tasks", format!("at most {MAX_BATCH} tasks per batch"))
        } else {
            ApiError::new(ErrorCode::MalformedJson, format!("tasks: {e}")).with_field("tasks")
        }
    })
}

/// `{"tasks": [...]}`; other members are ignored, as the contract's `BatchRequest` does.
struct BatchBody<'f> {
    too_many: &'f Cell<bool>,
}

impl<'de> serde::de::DeserializeSeed<'de> for BatchBody<'_> {
    type Value = Vec<&'de RawValue>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for BatchBody<'_> {
    type Value = Vec<&'de RawValue>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object with a `tasks` array")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        let mut tasks = None;
        while let Some(key) = map.next_key::<String>()? {
            if key != "tasks" {
                map.next_value::<serde::de::IgnoredAny>()?;
            } else if tasks.is_some() {
                return Err(A::Error::duplicate_field("tasks"));
            } else {
                tasks = Some(map.next_value_seed(BatchItems {
                    too_many: self.too_many,
                })?);
            }
        }
        tasks.ok_or_else(|| A::Error::missing_field("tasks"))
    }
}

struct BatchItems<'f> {
    too_many: &'f Cell<bool>,
}

impl<'de> serde::de::DeserializeSeed<'de> for BatchItems<'_> {
    type Value = Vec<&'de RawValue>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for BatchItems<'_> {
    type Value = Vec<&'de RawValue>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of submit bodies")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX_BATCH));
        // Borrowed: an item is a slice of the body, not a copy of it.
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            if items.len() == MAX_BATCH {
                self.too_many.set(true);
                return Err(serde::de::Error::custom("too many tasks"));
            }
            items.push(item);
        }
        Ok(items)
    }
}

// The bounds of a task's fields, whichever way the task arrives: a submit is held to them
// in `validate`, and so is each message the Kafka consumer reads (`kafka/envelope.rs`),
// so that whoever produces to a job's topic past the API gets no more than a submit would.

/// A task's priority, `0..=9`.
pub fn priority(value: i64) -> Result<u8, ApiError> {
    match value {
        0..=9 => Ok(value as u8),
        _ => Err(ApiError::field("priority", "must be 0..=9")),
    }
}

/// How often a task is retried: as often as a job may say (`spec.retry.maxRetries`).
pub fn max_retries(value: i64) -> Result<u32, ApiError> {
    u32::try_from(value)
        .ok()
        .filter(|n| *n <= MAX_RETRIES_LIMIT)
        .ok_or_else(|| ApiError::field("max_retries", format!("must be 0..={MAX_RETRIES_LIMIT}")))
}

/// A task's executor timeout: at least [`MIN_TIMEOUT`] (stored in milliseconds), at
/// most [`MAX_TIMEOUT`].
pub fn timeout(value: Duration) -> Result<Duration, ApiError> {
    if value < MIN_TIMEOUT || value > MAX_TIMEOUT {
        return Err(ApiError::field(
            "timeout",
            "must be at least 1ms and at most 24h",
        ));
    }
    Ok(value)
}

/// Refuses a payload over `--max-payload-bytes`.
pub(super) fn within_payload_limit(payload: &RawValue, limits: &Limits) -> Result<(), ApiError> {
    if payload.get().len() > limits.max_payload_bytes {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "payload: {} bytes is over the limit of {} bytes",
                payload.get().len(),
                limits.max_payload_bytes
            ),
        )
        .with_field("payload"));
    }
    Ok(())
}

/// The service a task says it comes from: at most 128 bytes of plain text; empty is none.
pub fn source_service(value: Option<String>) -> Result<Option<String>, ApiError> {
    let value = value.filter(|s| !s.is_empty());
    if let Some(source) = &value {
        if source.len() > 128 {
            return Err(ApiError::field(
                "source_service",
                "must be at most 128 bytes",
            ));
        }
        plain_text("source_service", source)?;
    }
    Ok(value)
}

/// A key (idempotency, unique, concurrency) given as `field`: 1 to [`MAX_KEY_LEN`] bytes
/// of plain text.
pub fn key(field: &str, value: Option<String>) -> Result<Option<String>, ApiError> {
    match value {
        Some(v) if v.is_empty() || v.len() > MAX_KEY_LEN => Err(ApiError::field(
            field,
            format!("must be 1 to {MAX_KEY_LEN} bytes"),
        )),
        Some(v) => plain_text(field, &v).map(|()| Some(v)),
        None => Ok(None),
    }
}

/// What the API stores must be storable on every backend, the strictest deciding:
/// PostgreSQL refuses NUL in text (a task accepted with one could never be written — on
/// the Kafka route it would block its partition), and no key or name needs a control
/// character.
pub(in crate::api) fn plain_text(field: &str, value: &str) -> Result<(), ApiError> {
    match value.chars().find(|c| c.is_control()) {
        Some(c) => Err(ApiError::field(
            field,
            format!(
                "must not contain control characters (found U+{:04X})",
                u32::from(c)
            ),
        )),
        None => Ok(()),
    }
}

/// Validates a request against the current jobs. `source_header` is the
/// `Asyncd-Source-Service` header, used when the body names no source.
pub fn validate(
    req: SubmitRequest,
    routes: &RouteTable,
    limits: &Limits,
    now: Millis,
    source_header: Option<&str>,
) -> Result<NewTask, ApiError> {
    // A batch takes these out before validating its items (api::workflow).
    if req.reference.is_some() {
        return Err(ApiError::field(
            "ref",
            "only items of a batch (POST /v1/tasks:batch) have refs",
        ));
    }
    if req.depends_on_refs.is_some() {
        return Err(ApiError::field(
            "depends_on_refs",
            "only items of a batch (POST /v1/tasks:batch) depend on refs",
        ));
    }
    let job = routes.job(&req.task_type).ok_or_else(|| {
        ApiError::new(
            ErrorCode::UnknownTaskType,
            format!(
                "type: no AsyncJobConfig declares task type {:?}",
                req.task_type
            ),
        )
        .with_field("type")
    })?;
    let payload = req
        .payload
        .unwrap_or_else(|| RawValue::from_string("null".into()).expect("null is JSON"));
    within_payload_limit(&payload, limits)?;
    let due = due_at(req.delay.as_deref(), req.eta.as_deref(), now)?;
    let trigger_at = due.unwrap_or(now);
    let expires_at = expiry(
        req.expires_at.as_deref(),
        req.start_within.as_deref(),
        job.start_within,
        trigger_at,
    )?;
    let priority = req.priority.map(priority).transpose()?.unwrap_or(0);
    let max_retries = match req.max_retries {
        None => job.max_retries,
        Some(n) => max_retries(n)?,
    };
    let timeout = match req.timeout {
        None => job.timeout,
        Some(text) => timeout(parse_duration(&text).map_err(|m| ApiError::field("timeout", m))?)?,
    };
    let idempotency_key = key("idempotency_key", req.idempotency_key)?;
    // Parsed once, and only for a job with a template to fill.
    let value: serde_json::Value =
        if job.unique_key.is_some() || job.concurrency_key.is_some() || job.window.is_some() {
            serde_json::from_str(payload.get()).map_err(|e| ApiError::field("payload", e))?
        } else {
            serde_json::Value::Null
        };
    let unique_key = match key("unique_key", req.unique_key)? {
        Some(k) => Some(k),
        None => checked_render("uniqueKey", job.render_unique_key(&value), false)?,
    };
    let tenant_keyed = job.tenants().is_some();
    let concurrency_key = checked_render(
        "concurrencyKey",
        job.render_concurrency_key(&value),
        tenant_keyed,
    )?;
    let window = key_window(req.debounce, req.throttle, job, &value)?;
    let depends_on = req.depends_on.unwrap_or_default();
    if let Some(window) = &window {
        if !depends_on.is_empty() {
            return Err(ApiError::field(
                "depends_on",
                "a debounced or throttled task cannot wait on other tasks",
            ));
        }
        if matches!(window.rule, WindowRule::Trailing { .. }) && due.is_some() {
            let field = if req.delay.is_some() { "delay" } else { "eta" };
            return Err(ApiError::field(
                field,
                "a trailing debounce sets the due time: its period after the latest submit",
            ));
        }
    }
    if depends_on.len() > MAX_DEPENDENCIES {
        return Err(ApiError::field(
            "depends_on",
            format!("at most {MAX_DEPENDENCIES} dependencies"),
        ));
    }
    for (i, id) in depends_on.iter().enumerate() {
        if uuid::Uuid::parse_str(id).is_err() {
            return Err(ApiError::field(
                format!("depends_on[{i}]"),
                format!("{id:?} is not a task id"),
            ));
        }
    }
    let source_service = source_service(
        req.source_service
            .or_else(|| source_header.map(str::to_string)),
    )?;
    Ok(NewTask {
        id: task_id(job, idempotency_key.as_deref()),
        task_type: job.task_type.clone(),
        payload,
        priority,
        trigger_at,
        max_retries,
        timeout_ms: timeout.as_millis() as i64,
        idempotency_key,
        unique_for: if unique_key.is_some() {
            job.retention.unique_keys
        } else {
            Duration::ZERO
        },
        unique_key,
        cron_key: None,
        depends_on,
        source_service,
        concurrency_key,
        // The API sets it from the request's headers.
        trace: None,
        expires_at,
        window,
    })
}

/// The submit's key window: its own `debounce` or `throttle` (at most one), else the
/// job's, its key rendered from the payload `value`.
fn key_window(
    debounce: Option<Debounce>,
    throttle: Option<Throttle>,
    job: &Job,
    value: &serde_json::Value,
) -> Result<Option<KeyWindow>, ApiError> {
    let refused = |(field, message): (String, String)| ApiError::field(field, message);
    let (key, rule) = match (debounce, throttle) {
        (Some(_), Some(_)) => {
            return Err(ApiError::field(
                "throttle",
                "give debounce or throttle, not both",
            ));
        }
        (Some(d), None) => {
            let key = key("debounce.key", Some(d.key))?.expect("a key was given");
            let leading = d.mode == DebounceMode::Leading;
            let rule = debounce_rule(
                &d.period,
                d.max_delay.as_deref(),
                leading,
                ("debounce", "max_delay"),
            )
            .map_err(refused)?;
            (key, rule)
        }
        (None, Some(t)) => {
            let key = key("throttle.key", Some(t.key))?.expect("a key was given");
            let period = window_duration("throttle.period", &t.period)
                .map_err(|m| ApiError::field("throttle.period", m))?;
            let rule = SpecRule::Throttle {
                period,
                drop: t.on_limit == OnLimit::Drop,
            };
            (key, rule)
        }
        (None, None) => match &job.window {
            None => return Ok(None),
            Some(window) => {
                let key = checked_render("window key", window.render(value).map(Some), false)?
                    .expect("a rendered key");
                (key, window.rule)
            }
        },
    };
    // A held debounce is always dropped; a held throttle as its `on_limit` says.
    let (rule, refuse_held) = match rule {
        SpecRule::Trailing { period, max_delay } => {
            (WindowRule::Trailing { period, max_delay }, false)
        }
        SpecRule::Leading { period } => (WindowRule::Leading { period }, false),
        SpecRule::Throttle { period, drop } => (WindowRule::Throttle { period }, !drop),
    };
    Ok(Some(KeyWindow {
        key,
        rule,
        refuse_held,
    }))
}

/// A key rendered from the job's template `what` and the payload's values: a long or
/// odd value makes a key the store cannot hold, so it is checked like a given one.
fn checked_render(
    what: &str,
    rendered: Result<Option<String>, String>,
    tenant_keyed: bool,
) -> Result<Option<String>, ApiError> {
    let rendered = rendered.map_err(|m| ApiError::field("payload", m))?;
    if let Some(rendered) = &rendered {
        if rendered.len() > MAX_KEY_LEN {
            return Err(ApiError::field(
                "payload",
                format!(
                    "the job's {what} renders to {} bytes from this payload; at most {MAX_KEY_LEN}",
                    rendered.len()
                ),
            ));
        }
        // A `fairness` job's key is `tenant␟key`: the separator is the job's, each part
        // the payload's (the tenant was refused if it held the separator).
        match rendered.split_once(asyncd_spec::TENANT_SEPARATOR) {
            Some((tenant, key)) if tenant_keyed => {
                plain_text("payload", tenant)?;
                plain_text("payload", key)?;
            }
            _ => plain_text("payload", rendered)?,
        }
    }
    Ok(rendered)
}

/// A new task's id: time-ordered (UUIDv7), except that a task of a job with a Kafka topic
/// and an idempotency key gets an id derived from its type and key (UUIDv8 over their
/// SHA-256; [`key_id`]). A repeat of a submit whose first copy is still in Kafka, not yet
/// in the store where the key is checked, is then produced under the same id, the
/// consumer keeps one copy by the primary key, and both answers name a task that exists.
///
/// A job without a topic has every task in the store, whose unique key index answers a
/// repeat with the first task, so its keyed tasks keep time-ordered ids: a derived id
/// lands at a random place in the primary key, and on SQLite that cost a keyed submit
/// two thirds of its rate (docs/benchmarks.md, "What a key cost").
pub fn task_id(job: &Job, idempotency_key: Option<&str>) -> String {
    match idempotency_key {
        Some(key) if job.kafka.is_some() => key_id(&job.task_type, key),
        _ => uuid::Uuid::now_v7().to_string(),
    }
}

/// The id a task of type `task_type` with idempotency key `key` gets on a job with a
/// Kafka topic. The type is part of it because keys are unique per type: two jobs using
/// the same key get two ids, and neither can hold the other's.
pub fn key_id(task_type: &str, key: &str) -> String {
    derived_id(&[
        b"asyncd idempotency key per type\0",
        task_type.as_bytes(),
        b"\0",
        key.as_bytes(),
    ])
}

/// The id the release before derived from an idempotency key alone. Only the Kafka
/// consumer still accepts it, for messages produced before an upgrade.
pub fn legacy_task_id(idempotency_key: &str) -> String {
    derived_id(&[b"asyncd idempotency key\0", idempotency_key.as_bytes()])
}

fn derived_id(parts: &[&[u8]]) -> String {
    use sha2::Digest;
    let mut digest = sha2::Sha256::new();
    for part in parts {
        digest.update(part);
    }
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest.finalize()[..16]);
    uuid::Uuid::new_v8(bytes).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idempotency_key_always_gives_the_same_id_within_its_type() {
        let first = key_id("t", "order-42");
        assert_eq!(first, key_id("t", "order-42"));
        assert_ne!(first, key_id("t", "order-43"));
        assert_ne!(first, key_id("u", "order-42"), "another job's key");
        // The separator keeps (type, key) pairs that concatenate alike apart.
        assert_ne!(key_id("ab", "c"), key_id("a", "bc"));
        assert_ne!(first, legacy_task_id("order-42"));
        assert!(uuid::Uuid::parse_str(&first).is_ok());
    }

    #[test]
    fn only_a_job_with_a_kafka_topic_derives_ids_from_keys() {
        let routes = routes();
        let kafka_job = routes.job("cancel_expired_order").unwrap();
        assert!(kafka_job.kafka.is_some(), "the sample routes through Kafka");
        assert_eq!(
            task_id(kafka_job, Some("order-42")),
            key_id("cancel_expired_order", "order-42")
        );
        let mut store_job = (**kafka_job).clone();
        store_job.kafka = None;
        let (a, b) = (
            task_id(&store_job, Some("order-42")),
            task_id(&store_job, Some("order-42")),
        );
        assert_ne!(a, b, "a job without a topic: each task a new id");
        for id in [&a, &b] {
            let uuid = uuid::Uuid::parse_str(id).unwrap();
            assert_eq!(uuid.get_version_num(), 7, "time-ordered: {id}");
        }
        assert_ne!(task_id(kafka_job, None), task_id(kafka_job, None));
    }
    use asyncd_spec::AsyncJobConfig;

    const NOW: Millis = Millis::new(1_700_000_000_000);

    fn routes() -> RouteTable {
        let (_, job) = AsyncJobConfig::from_yaml(include_str!(
            "../../../../config/samples/order-cancel-job.yaml"
        ))
        .unwrap();
        RouteTable::from_jobs([job])
    }

    fn check(body: &str) -> Result<NewTask, ApiError> {
        let req = parse(body.as_bytes())?;
        validate(
            req,
            &routes(),
            &Limits {
                max_payload_bytes: 64,
                max_batch_body_bytes: 1 << 20,
            },
            NOW,
            None,
        )
    }

    fn field_of(body: &str) -> (u16, String, Option<String>) {
        let err = check(body).unwrap_err();
        (
            err.status.as_u16(),
            err.error.code.to_string(),
            err.error.field,
        )
    }

    #[test]
    fn a_concurrency_key_is_rendered_from_the_payload_and_a_missing_field_named() {
        let yaml = include_str!("../../../../config/samples/order-cancel-job.yaml").replace(
            "spec:\n",
            "spec:\n  concurrencyKey: {key: 'merchant:{merchant_id}', limit: 2}\n",
        );
        let (_, job) = AsyncJobConfig::from_yaml(&yaml).unwrap();
        let routes = RouteTable::from_jobs([job]);
        let limits = Limits {
            max_payload_bytes: 4096,
            max_batch_body_bytes: 1 << 20,
        };
        let submit =
            |body: &str| validate(parse(body.as_bytes()).unwrap(), &routes, &limits, NOW, None);
        let task = submit(
            r#"{"type":"cancel_expired_order","payload":{"order_id":1,"merchant_id":"m7"}}"#,
        )
        .unwrap();
        assert_eq!(task.concurrency_key.as_deref(), Some("merchant:m7"));
        let err =
            submit(r#"{"type":"cancel_expired_order","payload":{"order_id":1}}"#).unwrap_err();
        assert_eq!(
            (err.status.as_u16(), err.error.field.as_deref()),
            (400, Some("payload"))
        );
        assert!(
            err.error.message.contains("concurrencyKey")
                && err.error.message.contains("merchant_id"),
            "{}",
            err.error.message
        );
        let long = "9".repeat(MAX_KEY_LEN);
        let err = submit(&format!(
            r#"{{"type":"cancel_expired_order","payload":{{"order_id":1,"merchant_id":"{long}"}}}}"#
        ))
        .unwrap_err();
        assert!(
            err.error.message.contains("concurrencyKey renders to"),
            "{}",
            err.error.message
        );
        // A job without a template stores no key.
        assert_eq!(
            check(r#"{"type":"cancel_expired_order","payload":{"order_id":7}}"#)
                .unwrap()
                .concurrency_key,
            None
        );
    }

    #[test]
    fn accepts_a_delayed_task_with_defaults_from_the_job() {
        let task =
            check(r#"{"type":"cancel_expired_order","payload":{"order_id":7},"delay":"90s"}"#)
                .unwrap();
        assert_eq!(task.trigger_at, NOW + Duration::from_secs(90));
        assert_eq!(task.max_retries, 3);
        assert_eq!(task.timeout_ms, 30_000);
        assert_eq!(
            task.unique_key.as_deref(),
            Some("order:7"),
            "rendered from the job's template"
        );
        assert_eq!(task.payload.get(), r#"{"order_id":7}"#);
    }

    /// Each would be accepted, then refused by PostgreSQL on every write.
    #[test]
    fn values_no_backend_can_store_are_refused_naming_the_field() {
        let t = r#""type":"cancel_expired_order""#;
        for (body, field) in [
            (
                format!(r#"{{{t},"payload":{{"order_id":1}},"idempotency_key":"a\u0000b"}}"#),
                "idempotency_key",
            ),
            (
                format!(r#"{{{t},"payload":{{"order_id":1}},"unique_key":"k\u0000"}}"#),
                "unique_key",
            ),
            (
                format!(r#"{{{t},"payload":{{"order_id":1}},"source_service":"svc\u0000"}}"#),
                "source_service",
            ),
            (
                format!(r#"{{{t},"payload":{{"order_id":"x\u0000y"}}}}"#),
                "payload",
            ),
        ] {
            assert_eq!(
                field_of(&body),
                (400, "invalid_field".into(), Some(field.into())),
                "{body}"
            );
        }
    }

    #[test]
    fn a_rendered_unique_key_is_length_checked() {
        let routes = routes();
        let long = "9".repeat(MAX_KEY_LEN);
        let req = parse(
            format!(r#"{{"type":"cancel_expired_order","payload":{{"order_id":"{long}"}}}}"#)
                .as_bytes(),
        )
        .unwrap();
        let err = validate(
            req,
            &routes,
            &Limits {
                max_payload_bytes: 4096,
                max_batch_body_bytes: 1 << 20,
            },
            NOW,
            None,
        )
        .unwrap_err();
        assert_eq!(err.error.field.as_deref(), Some("payload"));
        assert!(
            err.error.message.contains("uniqueKey"),
            "{}",
            err.error.message
        );
    }

    #[test]
    fn a_batch_is_read_up_to_its_limit_and_no_further() {
        let items = |n: usize| vec![r#"{"type":"t"}"#; n].join(",");
        let full = format!(r#"{{"tasks":[{}],"note":"ignored"}}"#, items(MAX_BATCH));
        assert_eq!(parse_batch(full.as_bytes()).unwrap().len(), MAX_BATCH);
        // What follows the first item too many is never parsed: here it is not JSON.
        let over = format!(r#"{{"tasks":[{}, !"#, items(MAX_BATCH + 1));
        let err = parse_batch(over.as_bytes()).unwrap_err();
        assert_eq!(
            (
                err.status.as_u16(),
                err.error.code,
                err.error.field.as_deref()
            ),
            (400, ErrorCode::InvalidField, Some("tasks"))
        );
        for bad in [r#"{"tasks":"no"}"#, r#"{}"#, r#"{"tasks":[1,"#, r#"[]"#] {
            let err = parse_batch(bad.as_bytes()).unwrap_err();
            assert_eq!(
                (err.error.code, err.error.field.as_deref()),
                (ErrorCode::MalformedJson, Some("tasks")),
                "{bad}"
            );
        }
    }

    #[test]
    fn dependencies_past_the_limit_are_not_kept() {
        let ids: Vec<String> = (0..MAX_DEPENDENCIES + 1)
            .map(|_| format!("\"{}\"", uuid::Uuid::now_v7()))
            .collect();
        // Items past the 101st are skipped unread, whatever their type.
        let body = format!(
            r#"{{"type":"cancel_expired_order","payload":{{"order_id":1}},"depends_on":[{}, 1, {{}}, null]}}"#,
            ids.join(",")
        );
        let req = parse(body.as_bytes()).unwrap();
        assert_eq!(req.depends_on.as_ref().unwrap().len(), MAX_DEPENDENCIES + 1);
        assert_eq!(
            field_of(&body),
            (400, "invalid_field".into(), Some("depends_on".into()))
        );
    }

    #[test]
    fn eta_in_the_past_runs_now() {
        let task = check(r#"{"type":"cancel_expired_order","payload":{"order_id":1},"eta":"2000-01-01T00:00:00Z"}"#).unwrap();
        assert_eq!(task.trigger_at, NOW);
    }

    #[test]
    fn bad_input_names_the_field() {
        let t = r#""type":"cancel_expired_order","payload":{"order_id":1}"#;
        assert_eq!(
            field_of(r#"{"type":"nope"}"#),
            (400, "unknown_task_type".into(), Some("type".into()))
        );
        assert_eq!(
            field_of(&format!(r#"{{{t},"delay":"-5s"}}"#)),
            (400, "invalid_field".into(), Some("delay".into()))
        );
        assert_eq!(
            field_of(&format!(r#"{{{t},"delay":"9999d"}}"#)),
            (400, "invalid_field".into(), Some("delay".into()))
        );
        assert_eq!(
            field_of(&format!(
                r#"{{{t},"delay":"1s","eta":"2030-01-01T00:00:00Z"}}"#
            ))
            .2,
            Some("eta".into())
        );
        assert_eq!(
            field_of(&format!(r#"{{{t},"eta":"tomorrow"}}"#)).2,
            Some("eta".into())
        );
        assert_eq!(
            field_of(&format!(r#"{{{t},"priority":10}}"#)).2,
            Some("priority".into())
        );
        assert_eq!(
            field_of(&format!(r#"{{{t},"max_retries":-1}}"#)).2,
            Some("max_retries".into())
        );
        assert_eq!(
            field_of(&format!(r#"{{{t},"timeout":"0s"}}"#)).2,
            Some("timeout".into())
        );
        // Kept in whole milliseconds, it would be kept as none at all.
        assert_eq!(
            field_of(&format!(r#"{{{t},"timeout":"999us"}}"#)).2,
            Some("timeout".into())
        );
        assert_eq!(
            field_of(&format!(r#"{{{t},"depends_on":["x"]}}"#)).2,
            Some("depends_on[0]".into())
        );
        assert_eq!(
            field_of(&format!(r#"{{{t},"idempotency_key":""}}"#)).2,
            Some("idempotency_key".into())
        );
        assert_eq!(
            field_of(r#"{"type":"cancel_expired_order","payload":{}}"#).2,
            Some("payload".into()),
            "template field missing"
        );
        assert_eq!(
            field_of(
                r#"{"type":"cancel_expired_order","payload":{"order_id":1,"pad":"0123456789012345678901234567890123456789012345678901234567890"}}"#
            ),
            (413, "payload_too_large".into(), Some("payload".into()))
        );
    }

    #[test]
    fn malformed_json_is_a_400_naming_the_path() {
        assert_eq!(field_of("{not json").1, "malformed_json");
        assert_eq!(
            field_of(r#"{"type":"cancel_expired_order","priority":"high"}"#),
            (400, "malformed_json".into(), Some("priority".into()))
        );
        assert_eq!(
            field_of(r#"{"type":"cancel_expired_order","dealy":"5s"}"#).1,
            "malformed_json",
            "typos are refused"
        );
        assert_eq!(
            field_of(r#"{"payload":{}}"#).1,
            "malformed_json",
            "type is required"
        );
    }
}

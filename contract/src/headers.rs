//! Header names of the API and of the executor call, spelled as `docs/api.md` writes
//! them (HTTP header names are case-insensitive).

/// Executor call: the task's `idempotency_key`, else its id.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// Executor call: the task id.
pub const TASK_ID: &str = "Asyncd-Task-Id";
/// Executor call: the 1-based attempt number.
pub const ATTEMPT: &str = "Asyncd-Attempt";
/// Executor call: the attempt's fencing token. Callbacks may send it instead of the
/// body's `lease_token`.
pub const LEASE_TOKEN: &str = "Asyncd-Lease-Token";
/// Batch executor call: how many tasks the body holds. Its presence is what tells a
/// batch call from a single one; a batch call has no `Asyncd-Task-Id`, `Asyncd-Attempt`,
/// `Idempotency-Key` or `Asyncd-Lease-Token` (each task carries them in the body).
pub const BATCH: &str = "Asyncd-Batch";
/// Executor call: the base URL of the API, for heartbeats and results.
pub const CALLBACK_URL: &str = "Asyncd-Callback-Url";
/// Executor call: the calling dispatcher instance.
pub const DISPATCHER: &str = "Asyncd-Dispatcher";
/// Executor call: unix seconds of the signature (only when a signing secret is set).
pub const TIMESTAMP: &str = "Asyncd-Timestamp";
/// Executor call: `v1=<hex HMAC-SHA256(secret, "<timestamp>.<body>")>`.
pub const SIGNATURE: &str = "Asyncd-Signature";
/// Submit: the submitting service, when the body names no `source_service`.
pub const SOURCE_SERVICE: &str = "Asyncd-Source-Service";
/// Executor answer (429, 503): seconds or an HTTP date.
pub const RETRY_AFTER: &str = "Retry-After";
/// Submit and executor call: the W3C Trace Context parent. At submit, the task's trace
/// (a malformed value is ignored, as the W3C spec asks); on the executor call, the same
/// trace id under the attempt's span.
pub const TRACEPARENT: &str = "traceparent";
/// Submit and executor call: the W3C `tracestate` that goes with `traceparent`.
pub const TRACESTATE: &str = "tracestate";

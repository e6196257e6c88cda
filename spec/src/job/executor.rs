//! `spec.executor`: where and how a job's attempts are called (URL, timeout, signing,
//! batch delivery, error bodies, the retry header, HTTP/2).

use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecutorSpec {
    /// http:// or https:// endpoint that receives each attempt as a POST.
    pub url: String,
    /// Per-attempt timeout; default 30s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// HMAC-SHA256 signing of every call with keys from a Secret in the job's
    /// namespace. Without it calls go unsigned (a warning is logged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing: Option<SigningSpec>,
    /// Batch delivery: up to `maxTasks` due tasks in one call, with one outcome per task
    /// in the answer (docs/api.md, "Batch delivery"). Without it, one call per task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchSpec>,
    /// Keep the start of the body of an executor's error answer (4xx, 5xx) in the task's
    /// `lastError`. Off by default: `lastError` then holds the status and asyncd's own
    /// reason, never text from whatever service the URL reaches.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub error_bodies: bool,
    /// The answer header that says, on a 429 or 503, when to try again: delay-seconds
    /// or an HTTP date, read like `Retry-After` (the default). For an upstream that
    /// names its own, e.g. `RateLimit-Reset`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_header: Option<String>,
    /// Call the executor over HTTP/2 only: by prior knowledge on an `http://` URL (h2c),
    /// negotiated by ALPN on `https://`. One connection per executor address then
    /// carries every attempt in flight as a stream of its own, where HTTP/1.1 opens a
    /// connection per attempt in flight. Off by default: HTTP/1.1.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub http2: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BatchSpec {
    /// The most tasks in one call, 1 to 1000.
    #[cfg_attr(feature = "kube", schemars(range(min = 1, max = 1000)))]
    pub max_tasks: u32,
    /// How long a due task may wait for the call to fill, at most 10s; default 0 (what is
    /// due goes at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<String>,
}

/// A validated [`BatchSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    pub max_tasks: u32,
    pub max_wait: Duration,
}

impl Batch {
    /// The most tasks a call may carry: a 1000-task call of 1 MiB payloads is already a
    /// gigabyte, and at this size the per-call cost is gone anyway.
    pub const MAX_TASKS: u32 = 1000;
    /// The longest a due task may be held to fill a call.
    pub const MAX_WAIT: Duration = Duration::from_secs(10);
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SigningSpec {
    /// The Secret holding the signing keys; the operator mounts it into this job's
    /// dispatchers only. While it is missing, or a listed key is missing or empty, the
    /// job's tasks wait undispatched.
    pub secret_ref: SecretKeysRef,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "kube", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeysRef {
    /// A Secret in the job's namespace.
    pub name: String,
    /// The Secret's keys that hold signing keys, the primary first (default `[key]`).
    /// Two while a key is rotated: every call then carries a signature by each.
    #[serde(default = "default_signing_keys")]
    #[cfg_attr(feature = "kube", schemars(length(min = 1, max = 2)))]
    pub keys: Vec<String>,
}

fn default_signing_keys() -> Vec<String> {
    vec![DEFAULT_SIGNING_KEY.to_string()]
}

/// The Secret key a signing config reads when it names none.
pub const DEFAULT_SIGNING_KEY: &str = "key";

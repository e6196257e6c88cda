//! For tests and benchmarks only, not part of the API: a [`NewTask`] with sensible
//! defaults, so a test spells out only what its scenario is about:
//! `NewTask::test("report", at).payload(r#"{"n":7}"#).max_retries(0)`.

use std::time::Duration;

use serde_json::value::RawValue;

use asyncd_contract::TraceContext;

use super::{Millis, NewTask};

impl NewTask {
    /// A task of `task_type` due at `trigger_at`: a fresh UUIDv7 id, the payload
    /// `{"k":1}`, priority 0, 3 retries, a 1 s timeout, and no keys, dependencies,
    /// source or trace.
    pub fn test(task_type: impl Into<String>, trigger_at: Millis) -> Self {
        Self {
            id: uuid::Uuid::now_v7().to_string(),
            task_type: task_type.into(),
            payload: raw(r#"{"k":1}"#.into()),
            priority: 0,
            trigger_at,
            max_retries: 3,
            timeout_ms: 1_000,
            idempotency_key: None,
            unique_key: None,
            unique_for: Duration::ZERO,
            cron_key: None,
            depends_on: Vec::new(),
            source_service: None,
            concurrency_key: None,
            trace: None,
            expires_at: None,
            window: None,
        }
    }

    pub fn expires_at(mut self, at: Millis) -> Self {
        self.expires_at = Some(at);
        self
    }

    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// The payload as JSON text; panics if it is not JSON.
    pub fn payload(mut self, json: impl Into<String>) -> Self {
        self.payload = raw(json.into());
        self
    }

    pub fn priority(mut self, priority: u8) -> Self {
        self.priority = priority;
        self
    }

    pub fn max_retries(mut self, max_retries: u32) -> Self {
        self.max_retries = max_retries;
        self
    }

    pub fn timeout_ms(mut self, timeout_ms: i64) -> Self {
        self.timeout_ms = timeout_ms;
        self
    }

    pub fn concurrency_key(mut self, key: impl Into<String>) -> Self {
        self.concurrency_key = Some(key.into());
        self
    }

    pub fn trace(mut self, trace: TraceContext) -> Self {
        self.trace = Some(trace);
        self
    }
}

fn raw(json: String) -> Box<RawValue> {
    RawValue::from_string(json).expect("a test payload is JSON")
}

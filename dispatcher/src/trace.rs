//! W3C Trace Context from submit to executor, and the spans asyncd adds to that trace,
//! exported over OTLP/HTTP when an endpoint is configured (docs/design.md, "Tracing").
//!
//! A task submitted with a `traceparent` keeps it in the store (and in the Kafka
//! envelope); every executor call carries it on. With an exporter, the API records a
//! `submit` span and the dispatcher a `dispatch` and an `attempt` span per attempt, and
//! the `traceparent` each hop passes on names its own span as the parent. Without one,
//! nothing is recorded and the caller's `traceparent` travels unchanged, so the
//! executor's spans hang under the caller's.

use std::time::{Duration, SystemTime};

use prometheus::IntCounterVec;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

// The trace context itself is wire vocabulary, kept with the contract: the store keeps
// it with each task, and an SDK may read or write it too.
pub use asyncd_contract::{MAX_TRACESTATE_BYTES, TraceContext};

/// A new span id: random, never zero.
pub fn new_span_id() -> [u8; 8] {
    loop {
        let id: [u8; 8] = rand::random();
        if id != [0; 8] {
            return id;
        }
    }
}

/// OTLP's `Span.SpanKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    Internal = 1,
    Server = 2,
    Client = 3,
    Producer = 4,
    Consumer = 5,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
}

/// A finished span, ready to export.
#[derive(Debug, Clone)]
pub struct SpanData {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent_id: [u8; 8],
    pub name: &'static str,
    pub kind: SpanKind,
    pub start: SystemTime,
    pub end: SystemTime,
    pub attributes: Vec<(&'static str, Value)>,
    /// OTLP's status: an error with this message, else unset.
    pub error: Option<String>,
}

/// A span being recorded: its context is known at once (for the `traceparent` passed
/// on), its end and attributes later.
#[derive(Debug)]
pub struct Span {
    pub context: TraceContext,
    parent_id: [u8; 8],
    name: &'static str,
    kind: SpanKind,
    start: SystemTime,
    attributes: Vec<(&'static str, Value)>,
}

impl Span {
    pub fn attr(&mut self, key: &'static str, value: Value) {
        self.attributes.push((key, value));
    }

    fn finish(self, error: Option<String>) -> SpanData {
        SpanData {
            trace_id: self.context.trace_id,
            span_id: self.context.parent_id,
            parent_id: self.parent_id,
            name: self.name,
            kind: self.kind,
            start: self.start,
            end: SystemTime::now(),
            attributes: self.attributes,
            error,
        }
    }
}

/// Where spans go: nowhere (no endpoint; every call is a no-op), or a bounded queue an
/// exporter task drains. Cheap to clone.
#[derive(Clone, Default)]
pub struct Tracer {
    queue: Option<mpsc::Sender<SpanData>>,
    dropped: Option<IntCounterVec>,
}

/// Spans waiting for export. Bounded so that a slow or absent collector costs a fixed
/// amount of memory: past it spans are dropped (and counted), never waited for, so
/// dispatch never slows down for tracing.
pub const QUEUE_SPANS: usize = 4096;
/// Spans per export request, and the longest a span waits for its batch to fill.
pub const BATCH_SPANS: usize = 512;
pub const BATCH_WAIT: Duration = Duration::from_secs(1);
/// How long one export request may take before its spans are given up.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and as whom spans are exported.
#[derive(Debug, Clone)]
pub struct OtlpSettings {
    /// The OTLP/HTTP base URL; spans go to `{endpoint}/v1/traces`.
    pub endpoint: String,
    /// The `service.name` resource attribute.
    pub service_name: String,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("enabled", &self.enabled())
            .finish()
    }
}

impl Tracer {
    /// A tracer that exports to `settings`, and the exporter loop to run until
    /// `shutdown` (it sends what is queued then, and stops).
    pub fn exporting(
        settings: OtlpSettings,
        dropped: IntCounterVec,
        shutdown: CancellationToken,
    ) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (tx, rx) = mpsc::channel(QUEUE_SPANS);
        let exporter = Exporter {
            client: reqwest::Client::builder()
                .timeout(EXPORT_TIMEOUT)
                .build()
                .expect("HTTP client builds"),
            url: format!("{}/v1/traces", settings.endpoint.trim_end_matches('/')),
            service_name: settings.service_name,
            dropped: dropped.clone(),
        };
        (
            Self {
                queue: Some(tx),
                dropped: Some(dropped),
            },
            exporter.run(rx, shutdown),
        )
    }

    pub fn enabled(&self) -> bool {
        self.queue.is_some()
    }

    /// Starts a span under `parent` when there is an exporter and the caller sampled
    /// the trace; `None` otherwise (nothing to record).
    pub fn start(&self, parent: &TraceContext, name: &'static str, kind: SpanKind) -> Option<Span> {
        if !self.enabled() || !parent.sampled() {
            return None;
        }
        Some(Span {
            context: parent.child(new_span_id()),
            parent_id: parent.parent_id,
            name,
            kind,
            start: SystemTime::now(),
            attributes: Vec::new(),
        })
    }

    /// Ends `span` and queues it, or drops and counts it when the queue is full.
    pub fn end(&self, span: Span, error: Option<String>) {
        let Some(queue) = &self.queue else { return };
        if queue.try_send(span.finish(error)).is_err()
            && let Some(dropped) = &self.dropped
        {
            dropped.with_label_values(&["queue_full"]).inc();
        }
    }
}

struct Exporter {
    client: reqwest::Client,
    url: String,
    service_name: String,
    dropped: IntCounterVec,
}

impl Exporter {
    async fn run(self, mut rx: mpsc::Receiver<SpanData>, shutdown: CancellationToken) {
        let mut batch = Vec::with_capacity(BATCH_SPANS);
        loop {
            let first = tokio::select! {
                span = rx.recv() => span,
                _ = shutdown.cancelled() => None,
            };
            let Some(first) = first else { break };
            batch.push(first);
            let deadline = tokio::time::Instant::now() + BATCH_WAIT;
            while batch.len() < BATCH_SPANS {
                tokio::select! {
                    span = rx.recv() => match span {
                        Some(span) => batch.push(span),
                        None => break,
                    },
                    _ = tokio::time::sleep_until(deadline) => break,
                    _ = shutdown.cancelled() => break,
                }
            }
            self.export(&mut batch).await;
        }
        // What was queued before shutdown still goes out.
        while let Ok(span) = rx.try_recv() {
            batch.push(span);
            if batch.len() == BATCH_SPANS {
                self.export(&mut batch).await;
            }
        }
        if !batch.is_empty() {
            self.export(&mut batch).await;
        }
    }

    async fn export(&self, batch: &mut Vec<SpanData>) {
        let body = encode_request(&self.service_name, env!("CARGO_PKG_VERSION"), batch);
        let sent = self
            .client
            .post(&self.url)
            .header("content-type", "application/x-protobuf")
            .body(body)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status);
        if let Err(err) = sent {
            tracing::warn!(%err, spans = batch.len(), url = %self.url, "could not export spans");
            self.dropped
                .with_label_values(&["export_failed"])
                .inc_by(batch.len() as u64);
        }
        batch.clear();
    }
}

/// `opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest`, encoded by hand:
/// the few messages asyncd sends, field numbers as in opentelemetry-proto's
/// `trace.proto`, `common.proto` and `resource.proto`.
/// The instrumentation scope is `asyncd` at `version`.
pub fn encode_request(service_name: &str, version: &str, spans: &[SpanData]) -> Vec<u8> {
    let mut resource = Vec::new();
    key_value(
        &mut resource,
        1,
        "service.name",
        &Value::Str(service_name.into()),
    );
    let mut scope = Vec::new();
    string(&mut scope, 1, "asyncd");
    string(&mut scope, 2, version);
    let mut scope_spans = Vec::new();
    message(&mut scope_spans, 1, &scope);
    for span in spans {
        message(&mut scope_spans, 2, &encode_span(span));
    }
    let mut resource_spans = Vec::new();
    message(&mut resource_spans, 1, &resource);
    message(&mut resource_spans, 2, &scope_spans);
    let mut request = Vec::new();
    message(&mut request, 1, &resource_spans);
    request
}

fn encode_span(span: &SpanData) -> Vec<u8> {
    let nanos = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64
    };
    let mut out = Vec::new();
    bytes(&mut out, 1, &span.trace_id);
    bytes(&mut out, 2, &span.span_id);
    bytes(&mut out, 4, &span.parent_id);
    string(&mut out, 5, span.name);
    varint_field(&mut out, 6, span.kind as u64);
    fixed64(&mut out, 7, nanos(span.start));
    fixed64(&mut out, 8, nanos(span.end).max(nanos(span.start)));
    for (key, value) in &span.attributes {
        key_value(&mut out, 9, key, value);
    }
    if let Some(message_text) = &span.error {
        let mut status = Vec::new();
        string(&mut status, 2, message_text);
        varint_field(&mut status, 3, 2); // STATUS_CODE_ERROR
        message(&mut out, 15, &status);
    }
    out
}

fn key_value(out: &mut Vec<u8>, field: u32, key: &str, value: &Value) {
    let mut any = Vec::new();
    match value {
        Value::Str(s) => string(&mut any, 1, s),
        Value::Int(i) => varint_field(&mut any, 3, *i as u64),
    }
    let mut kv = Vec::new();
    string(&mut kv, 1, key);
    message(&mut kv, 2, &any);
    message(out, field, &kv);
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn tag(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    varint(out, u64::from(field) << 3 | u64::from(wire_type));
}

fn varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, 0);
    varint(out, v);
}

fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, 1);
    out.extend_from_slice(&v.to_le_bytes());
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    tag(out, field, 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn string(out: &mut Vec<u8>, field: u32, s: &str) {
    bytes(out, field, s.as_bytes());
}

fn message(out: &mut Vec<u8>, field: u32, m: &[u8]) {
    bytes(out, field, m);
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    /// The bytes opentelemetry-proto's Python classes serialize the same request to
    /// (fields in number order, as both write them); e2e/tracing.sh decodes real ones.
    #[test]
    fn spans_encode_as_opentelemetry_proto_does() {
        let span = SpanData {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent_id: [3; 8],
            name: "attempt",
            kind: SpanKind::Client,
            start: SystemTime::UNIX_EPOCH + Duration::from_secs(1),
            end: SystemTime::UNIX_EPOCH + Duration::from_secs(2),
            attributes: vec![
                ("asyncd.task.id", Value::Str("t1".into())),
                ("asyncd.attempt", Value::Int(1)),
            ],
            error: Some("boom".into()),
        };
        assert_eq!(
            hex::encode(encode_request("svc", "0.1.0", &[span])),
            "0aaa010a170a150a0c736572766963652e6e616d6512050a03737663128e010a0f0a066173796e\
             63641205302e312e30127b0a100101010101010101010101010101010112080202020202020202\
             220803030303030303032a07617474656d707430033900ca9a3b000000004100943577000000004a\
             160a0e6173796e63642e7461736b2e696412040a0274314a140a0e6173796e63642e617474656d\
             7074120218017a081204626f6f6d1802"
        );
    }

    #[test]
    fn a_disabled_tracer_records_nothing() {
        let ctx = TraceContext::parse(VALID, None).unwrap();
        assert!(
            Tracer::default()
                .start(&ctx, "submit", SpanKind::Server)
                .is_none()
        );
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_without_waiting() {
        let dropped = IntCounterVec::new(prometheus::Opts::new("d", "d"), &["reason"]).unwrap();
        let (tracer, _exporter) = Tracer::exporting(
            OtlpSettings {
                endpoint: "http://127.0.0.1:1".into(),
                service_name: "t".into(),
            },
            dropped.clone(),
            CancellationToken::new(),
        );
        let ctx = TraceContext::parse(VALID, None).unwrap();
        // The exporter is not running: nothing drains the queue.
        for _ in 0..QUEUE_SPANS + 5 {
            let span = tracer.start(&ctx, "attempt", SpanKind::Client).unwrap();
            assert_eq!(span.context.trace_id, ctx.trace_id);
            tracer.end(span, None);
        }
        assert_eq!(dropped.with_label_values(&["queue_full"]).get(), 5);
    }

    #[test]
    fn unsampled_traces_are_not_recorded() {
        let (tracer, _exporter) = Tracer::exporting(
            OtlpSettings {
                endpoint: "http://127.0.0.1:1".into(),
                service_name: "t".into(),
            },
            IntCounterVec::new(prometheus::Opts::new("d", "d"), &["reason"]).unwrap(),
            CancellationToken::new(),
        );
        let ctx = TraceContext::parse(&VALID.replace("-01", "-00"), None).unwrap();
        assert!(tracer.start(&ctx, "submit", SpanKind::Server).is_none());
    }
}

//! Prometheus metrics, named as in the reference system (DESIGN.md) plus the due-work
//! signals autoscaling follows. One registry per process, served at `/metrics`.

use std::collections::HashSet;
use std::sync::Mutex;

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// How many distinct `source_service` values get series of their own in
/// `asyncd_task_submitted_total`; later values are counted as [`OTHER_SOURCE`].
/// The value comes from clients, and each new one would be a new series kept for the
/// life of the process: Prometheus and this process's memory must not grow with
/// whatever clients send.
pub const MAX_SOURCE_LABELS: usize = 100;
pub const OTHER_SOURCE: &str = "other";

pub struct Metrics {
    registry: Registry,
    /// The `source_service` values that have a series; at most [`MAX_SOURCE_LABELS`].
    sources: Mutex<HashSet<String>>,
    pub submitted: IntCounterVec,
    pub submit_latency: HistogramVec,
    pub dispatched: IntCounterVec,
    pub dispatch_delay: HistogramVec,
    pub executed: IntCounterVec,
    pub execution_duration: HistogramVec,
    pub retries: IntCounterVec,
    pub claimed: IntCounterVec,
    pub rescued: IntCounterVec,
    pub expired: IntCounterVec,
    pub purged: IntCounterVec,
    pub kafka_lag: IntGaugeVec,
    pub kafka_fallback: IntCounterVec,
    pub kafka_dead_letters: IntCounterVec,
    pub pending: IntGaugeVec,
    pub poll_duration: Histogram,
    pub due_backlog: IntGaugeVec,
    pub tenant_tasks: IntGaugeVec,
    pub key_tasks: IntGaugeVec,
    pub keys_cut: IntGaugeVec,
    pub oldest_due_age: GaugeVec,
    pub heap_size: IntGauge,
    pub clock_offset: Gauge,
    pub signing_unavailable: IntGaugeVec,
    pub job_paused: IntGaugeVec,
    pub limited: IntCounterVec,
    pub key_cooldowns: IntCounterVec,
    pub effective_concurrency: IntGaugeVec,
    pub trace_spans_dropped: IntCounterVec,
}

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let histogram = |name: &str, help: &str, labels: &[&str]| {
            let h = HistogramVec::new(
                HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
                labels,
            )
            .expect("valid metric");
            registry
                .register(Box::new(h.clone()))
                .expect("unique metric");
            h
        };
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric");
            g
        };
        let submitted = counter(
            "asyncd_task_submitted_total",
            "Tasks accepted by submit",
            &["task_type", "source_service"],
        );
        let submit_latency = histogram(
            "asyncd_task_submit_latency_seconds",
            "Time to accept a submit, store write included",
            &["task_type"],
        );
        let dispatched = counter(
            "asyncd_task_dispatched_total",
            "Attempts handed to an executor",
            &["task_type"],
        );
        let dispatch_delay = histogram(
            "asyncd_task_dispatch_delay_seconds",
            "Actual minus expected trigger time of each attempt",
            &["task_type"],
        );
        let executed = counter(
            "asyncd_task_executed_total",
            "Attempts by outcome: success, failed or timeout",
            &["task_type", "status"],
        );
        let execution_duration = histogram(
            "asyncd_task_execution_duration_seconds",
            "Executor call duration",
            &["task_type"],
        );
        let retries = counter(
            "asyncd_task_retry_total",
            "Attempts that will be retried",
            &["task_type"],
        );
        let claimed = counter(
            "asyncd_task_claimed_total",
            "Tasks claimed from the store or adopted from Kafka into a dispatcher",
            &["task_type"],
        );
        let rescued = counter(
            "asyncd_task_rescued_total",
            "Tasks the rescuer took back, by the state whose hold or lease lapsed (claimed or running)",
            &["task_type", "state"],
        );
        let expired = counter(
            "asyncd_task_expired_total",
            "Tasks that ended expired: no attempt had begun by their expires_at",
            &["task_type"],
        );
        let purged = counter(
            "asyncd_tasks_purged_total",
            "Finished tasks deleted past their job's retention, by the state they finished in",
            &["task_type", "state"],
        );
        let kafka_lag = gauge(
            "asyncd_kafka_consumer_lag",
            "Kafka consumer lag in messages",
            &["topic", "partition"],
        );
        let kafka_fallback = counter(
            "asyncd_kafka_produce_fallback_total",
            "Kafka-route tasks the broker did not acknowledge in time, stored instead",
            &["task_type"],
        );
        let kafka_dead_letters = counter(
            "asyncd_kafka_dead_letters_total",
            "Kafka messages that were no task or that the store refused, kept in the \
             kafka_dead_letters table with their bytes and passed, by reason: unreadable, \
             foreign_type, refused, store_refused, unsigned, bad_signature",
            &["job", "reason"],
        );
        let signing_unavailable = gauge(
            "asyncd_signing_unavailable",
            "1 while a job's signing secret is missing or empty: its tasks wait undispatched",
            &["job"],
        );
        let job_paused = gauge(
            "asyncd_job_paused",
            "1 while a job is paused (spec.paused, or POST /v1/jobs/{name}/pause): its tasks \
             wait in the store",
            &["job"],
        );
        let limited = counter(
            "asyncd_job_limited_total",
            "Attempts a job's limits held back when a dispatcher would have begun them, by \
             the limit that did (concurrency: in total across dispatchers; rate: the job's \
             or its key's; key: the task's concurrencyKey; limiter: an AsyncLimiter the job \
             shares); each \
             waits, claimed, and is tried again",
            &["job", "limit"],
        );
        let key_cooldowns = counter(
            "asyncd_job_key_cooldowns_total",
            "Concurrency keys of a job rested by an executor's 429 or 503 with Retry-After: \
             no other task of the key is claimed until then",
            &["job"],
        );
        let effective_concurrency = gauge(
            "asyncd_job_effective_concurrency",
            "Attempts of a job this dispatcher lets run at once: its concurrency, backed off \
             while the executor answers 429 or 503 (spec.adaptiveConcurrency)",
            &["job"],
        );
        let trace_spans_dropped = counter(
            "asyncd_trace_spans_dropped_total",
            "Spans not exported over OTLP, by reason: queue_full (the bounded export queue \
             was full) or export_failed (the collector did not take them)",
            &["reason"],
        );
        let pending = gauge(
            "asyncd_mysql_pending_tasks",
            "Unfinished tasks waiting in the SQL store (any backend; the name is the reference system's)",
            &["task_type"],
        );
        let poll_duration = Histogram::with_opts(
            HistogramOpts::new(
                "asyncd_mysql_poll_duration_seconds",
                "Duration of one claim poll against the SQL store",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
        )
        .expect("valid metric");
        registry
            .register(Box::new(poll_duration.clone()))
            .expect("unique metric");
        let due_backlog = gauge(
            "asyncd_due_backlog",
            "Tasks already due and not yet dispatched",
            &["task_type"],
        );
        let tenant_tasks = gauge(
            "asyncd_tenant_tasks",
            "Tasks of a spec.fairness job's busiest tenants, claimed or running and due: the \
             top 10 by running then due, the rest summed as tenant=\"others\"",
            &["task_type", "tenant", "state"],
        );
        let key_tasks = gauge(
            "asyncd_key_tasks",
            "Tasks of a keyed job's busiest concurrency keys, claimed or running and due: the \
             top 10 by running then due, the rest summed as key=\"others\"",
            &["task_type", "key", "state"],
        );
        let keys_cut = gauge(
            "asyncd_keys_cut",
            "Keys of a job with concurrencyKey.adaptive whose limit this dispatcher has cut \
             after overload answers and not yet won back (at most 1000 kept)",
            &["job"],
        );
        let oldest_due_age = GaugeVec::new(
            Opts::new(
                "asyncd_oldest_due_age_seconds",
                "Age of the oldest due, undispatched task",
            ),
            &["task_type"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(oldest_due_age.clone()))
            .expect("unique metric");
        let heap_size = IntGauge::new(
            "asyncd_heap_tasks",
            "Tasks held in this dispatcher's ETA heap",
        )
        .expect("valid metric");
        registry
            .register(Box::new(heap_size.clone()))
            .expect("unique metric");
        let clock_offset = Gauge::new(
            "asyncd_clock_offset_seconds",
            "The store's clock minus this process's, measured at each dispatcher heartbeat",
        )
        .expect("valid metric");
        registry
            .register(Box::new(clock_offset.clone()))
            .expect("unique metric");
        Self {
            registry,
            sources: Mutex::new(HashSet::new()),
            submitted,
            submit_latency,
            dispatched,
            dispatch_delay,
            executed,
            execution_duration,
            retries,
            claimed,
            rescued,
            expired,
            purged,
            kafka_lag,
            kafka_fallback,
            kafka_dead_letters,
            pending,
            poll_duration,
            due_backlog,
            tenant_tasks,
            key_tasks,
            keys_cut,
            oldest_due_age,
            heap_size,
            clock_offset,
            signing_unavailable,
            job_paused,
            limited,
            key_cooldowns,
            effective_concurrency,
            trace_spans_dropped,
        }
    }

    /// The `source_service` label for `source`: itself while it is one of the first
    /// [`MAX_SOURCE_LABELS`] distinct values seen (the empty one, for no source, always
    /// is), [`OTHER_SOURCE`] after that.
    pub fn source_label<'a>(&self, source: &'a str) -> &'a str {
        if source.is_empty() {
            return source;
        }
        let mut sources = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        if sources.contains(source) {
            return source;
        }
        if sources.len() < MAX_SOURCE_LABELS {
            sources.insert(source.to_string());
            return source;
        }
        OTHER_SOURCE
    }

    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding cannot fail");
        String::from_utf8(out).expect("prometheus text is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_labels_are_the_first_distinct_values_then_other() {
        let metrics = Metrics::new();
        let names: Vec<String> = (0..MAX_SOURCE_LABELS + 20)
            .map(|i| format!("svc-{i}"))
            .collect();
        for name in &names {
            metrics
                .submitted
                .with_label_values(&["t", metrics.source_label(name)])
                .inc();
        }
        assert_eq!(
            metrics.source_label("svc-0"),
            "svc-0",
            "a known value keeps its series"
        );
        assert_eq!(
            metrics.source_label(&names[MAX_SOURCE_LABELS - 1]),
            names[MAX_SOURCE_LABELS - 1]
        );
        assert_eq!(
            metrics.source_label(&names[MAX_SOURCE_LABELS]),
            OTHER_SOURCE
        );
        assert_eq!(metrics.source_label("new"), OTHER_SOURCE);
        assert_eq!(metrics.source_label(""), "", "no source is no new series");
        let text = metrics.render();
        let series = text
            .lines()
            .filter(|l| l.starts_with("asyncd_task_submitted_total{"))
            .count();
        assert_eq!(series, MAX_SOURCE_LABELS + 1, "{text}");
        assert!(
            text.contains(
                "asyncd_task_submitted_total{source_service=\"other\",task_type=\"t\"} 20"
            ),
            "{text}"
        );
    }
}

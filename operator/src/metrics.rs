//! The operator's own Prometheus metrics, served on `/metrics`.

use std::time::Instant;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    /// `asyncd_operator_reconciliations_total{result}`: ok, error.
    pub reconciliations: IntCounterVec,
    /// `asyncd_operator_reconcile_failures_total{error}`: kube, kafka, finalizer, step,
    /// limiter_status (an AsyncLimiter's status not written; the pass goes on), and
    /// limiter_usage (the limiters' usage not read from asyncd's API, or not written).
    pub failures: IntCounterVec,
    /// `asyncd_operator_reconcile_duration_seconds{phase}`: apply, cleanup.
    pub duration: HistogramVec,
    /// `asyncd_operator_topic_operations_total{op}`: create, grow, delete, shrink_refused.
    pub topic_ops: IntCounterVec,
    /// `asyncd_operator_configs{namespace,state}`: ready, not_ready, conflict, invalid.
    pub configs: IntGaugeVec,
    /// `asyncd_operator_leader`: 1 while this replica holds the leader Lease (or runs
    /// without leader election), 0 while it stands by.
    pub leader: IntGauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let registry = Registry::new();
        let reconciliations = IntCounterVec::new(
            Opts::new(
                "asyncd_operator_reconciliations_total",
                "Reconcile passes by result",
            ),
            &["result"],
        )
        .unwrap();
        let failures = IntCounterVec::new(
            Opts::new(
                "asyncd_operator_reconcile_failures_total",
                "Failed reconcile passes by error kind",
            ),
            &["error"],
        )
        .unwrap();
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "asyncd_operator_reconcile_duration_seconds",
                "Reconcile pass duration",
            )
            .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1., 2.5, 5., 15.]),
            &["phase"],
        )
        .unwrap();
        let topic_ops = IntCounterVec::new(
            Opts::new(
                "asyncd_operator_topic_operations_total",
                "Kafka topic operations",
            ),
            &["op"],
        )
        .unwrap();
        let configs = IntGaugeVec::new(
            Opts::new(
                "asyncd_operator_configs",
                "AsyncJobConfigs by state, as last reconciled",
            ),
            &["namespace", "name", "state"],
        )
        .unwrap();
        let leader = IntGauge::new(
            "asyncd_operator_leader",
            "1 while this replica leads (holds the Lease), 0 while it stands by",
        )
        .unwrap();
        for c in [
            Box::new(reconciliations.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(failures.clone()),
            Box::new(duration.clone()),
            Box::new(topic_ops.clone()),
            Box::new(configs.clone()),
            Box::new(leader.clone()),
        ] {
            registry.register(c).unwrap();
        }
        Self {
            registry,
            reconciliations,
            failures,
            duration,
            topic_ops,
            configs,
            leader,
        }
    }
}

impl Metrics {
    pub fn timer(&self, phase: &'static str) -> Timer<'_> {
        Timer {
            metrics: self,
            phase,
            start: Instant::now(),
        }
    }

    /// Records one config's state, clearing its other states.
    pub fn set_state(&self, namespace: &str, name: &str, state: &str) {
        for s in ["ready", "not_ready", "conflict", "invalid"] {
            let _ = self.configs.remove_label_values(&[namespace, name, s]);
        }
        self.configs
            .with_label_values(&[namespace, name, state])
            .set(1);
    }

    pub fn forget(&self, namespace: &str, name: &str) {
        for s in ["ready", "not_ready", "conflict", "invalid"] {
            let _ = self.configs.remove_label_values(&[namespace, name, s]);
        }
    }

    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding");
        String::from_utf8(out).expect("utf-8 metrics")
    }
}

pub struct Timer<'a> {
    metrics: &'a Metrics,
    phase: &'static str,
    start: Instant,
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        self.metrics
            .duration
            .with_label_values(&[self.phase])
            .observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_the_operator_metrics() {
        let m = Metrics::default();
        m.reconciliations.with_label_values(&["ok"]).inc();
        m.set_state("shop", "a", "conflict");
        m.set_state("shop", "a", "ready");
        drop(m.timer("apply"));
        let text = m.render();
        assert!(
            text.contains("asyncd_operator_reconciliations_total{result=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "asyncd_operator_configs{name=\"a\",namespace=\"shop\",state=\"ready\"} 1"
            ),
            "{text}"
        );
        assert!(!text.contains("state=\"conflict\""), "{text}");
        assert!(
            text.contains("asyncd_operator_reconcile_duration_seconds_count{phase=\"apply\"} 1")
        );
    }
}

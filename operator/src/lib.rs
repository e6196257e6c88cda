//! `asyncd-operator`: reconciles `AsyncJobConfig` resources, and the `AsyncLimiter`s they
//! name.
//!
//! Each config becomes, in its namespace:
//! - a Kafka topic with the partitions asked (grown, never shrunk; deleted with the config
//!   only under `kafka.deletePolicy: Delete`),
//! - a document in the `asyncd-routing` ConfigMap (one key per config, the format
//!   `asyncd dev --config DIR` reads), rebuilt from every routable config and every
//!   valid AsyncLimiter of the namespace (one key each, `limiter_<name>.yaml`),
//! - a dispatcher Deployment `asyncd-dispatcher-<config>` and its HPA on due backlog.
//!
//! A config naming an AsyncLimiter its namespace does not hold is not routed
//! (`InvalidSpec` on `spec.limiters[i]`); each limiter's status lists the configs naming it.
//!
//! Layout (after kube-rs/controller-rs):
//! - [`crd`]: the resource types (their specs are `asyncd_spec::JobSpec` and
//!   `asyncd_spec::LimiterSpec`) and the CRDs.
//! - [`controller`]: the reconcile pipeline read → validate → build → apply → status,
//!   `error_policy`, the finalizer, and the `Controller` wiring.
//! - [`builders`]: one pure builder per resource; [`conflicts`]: who owns a task type or
//!   topic; [`status`]: conditions from what a pass did. All unit-tested without a client.
//! - [`policy`]: the operator's caps on partitions and replicas, and its rule for topics
//!   without an owner record.
//! - [`leader`]: leader election on a Lease, so several replicas can run.
//! - [`usage`]: each limiter's `status.running`, read from asyncd's API (optional).
//! - [`kafka`]: the topic admin seam (`asyncd-kafka-admin`). [`metrics`], [`telemetry`]: observability.

pub mod builders;
pub mod conflicts;
pub mod controller;
pub mod crd;
pub mod kafka;
pub mod leader;
pub mod metrics;
pub mod policy;
pub mod status;
pub mod telemetry;
pub mod usage;

#[cfg(test)]
pub mod fixtures;

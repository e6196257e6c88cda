//! The AsyncJobConfig schema and the value types that travel with it.
//!
//! Shared by the `asyncd` binary (which reads AsyncJobConfig documents from a folder or a
//! routing ConfigMap) and the operator (which reconciles them), so a job config means the
//! same thing on a laptop and in a cluster.
//!
//! Layout:
//! - [`job`]: the document as written (`AsyncJobConfig`), and [`job::JobSpec::validate`],
//!   which turns it into a [`job::Job`] with parsed durations and schedules, or names the
//!   field at fault.
//! - [`schedule`]: cron schedules with a mandatory `CRON_TZ=`, and their DST rules.
//! - [`duration`]: the human duration strings (`"90s"`, `"3d"`) used everywhere.
//!
//! The `kube` feature adds `schemars::JsonSchema` derives (with the CEL rules the API
//! server enforces) to the document types, for the operator's CRD; the dispatcher build
//! does without.

pub mod duration;
pub mod job;
pub mod limiter;
pub mod schedule;

pub use duration::{format_duration, parse_duration};
pub use job::MIN_TIMEOUT;
pub use job::{
    Adaptive, AdaptiveConcurrencySpec, AsyncJobConfig, Batch, BatchSpec, ConcurrencyKey,
    ConcurrencyKeySpec, DeletePolicy, FairnessSpec, HIGH_PRIORITY, Job, JobSpec, KafkaSpec, OnDead,
    OrderingMode, OrderingSpec, RateLimit, RateLimitSpec, Retention, SpecError, TENANT_SEPARATOR,
    Tenants,
};
pub use limiter::{
    AsyncLimiter, Declared, LIMITER_KIND, Limiter, LimiterSpec, bind_limiters, limiter_id,
};
pub use schedule::CronSchedule;

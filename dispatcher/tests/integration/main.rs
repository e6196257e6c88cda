//! asyncd end to end, one module per feature, in one test binary (one link of the server
//! instead of one per feature).
//!
//! Most tests run the `dev` role in-process on a manual clock (so every ETA, backoff and
//! lease is asserted exactly, whatever the machine's load), with a real HTTP executor on
//! loopback, and assert on what the executor saw and what the API reports. Tests that
//! need a process of their own (SIGTERM, SIGKILL, a per-process environment variable,
//! the process log, several roles) run the real binary. Tests on MariaDB, PostgreSQL or
//! Kafka skip without their server, or fail with `ASYNCD_TEST_REQUIRE_BACKENDS=1`
//! ([`support::backends`]).
//!
//! The tests share one process: nothing here may set process-wide state (an environment
//! variable, a global subscriber). What they share beyond it is taken in turn: the Kafka
//! broker, which one test restarts ([`support::Broker`]), and the machine, which a
//! cluster of asyncd processes loads ([`support::cluster_turn`]).

#[path = "../support/mod.rs"]
mod support;

mod auth;
mod bad_params;
mod browser;
mod callbacks;
mod cancel;
mod changes;
mod claim_at_submit;
mod config_reload;
mod crash_recovery;
mod cron;
mod dead_letters;
mod dedup;
mod disk_full;
mod executor_policy;
mod expiry;
mod fairness;
mod http2;
mod jobs_overview;
mod kafka_path;
mod kafka_signing;
mod key_adaptive;
mod leases;
mod limiters;
mod limits;
mod logs;
mod metrics;
mod multi_process;
mod openapi;
mod ordering;
mod pause;
mod priority;
mod retention;
mod retries;
mod roles;
mod schedules;
mod schedules_scale;
mod search;
mod secret_hygiene;
mod slow_executor;
mod store_faults;
mod submit;
mod tls;
mod tracing;
mod windows;
mod workflow;

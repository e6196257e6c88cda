//! asyncd: a distributed asynchronous task queue.
//!
//! # Layout
//!
//! One binary, roles as subcommands (see `main.rs`); this library holds the parts:
//!
//! - [`api`]: the HTTP API — submit, inspect, cancel, dead letters, executor callbacks.
//! - [`auth`]: who may call the API: API tokens or Kubernetes token and access reviews.
//! - [`store`]: the task store behind one narrow trait (SQL lives only there), the
//!   `asyncd-store` crate.
//! - [`dispatch`]: claims due work into the [`heap`] and calls executors on time;
//!   [`holdings`] sizes how much of each job it may claim; [`adaptive`] backs a job's
//!   concurrency off while its executor answers 429 or 503.
//! - [`kafka`]: the short-delay path through Kafka — produce at submit, consume into
//!   the store and the heap, commit only what is durable.
//! - [`lease`]: the unguessable lease token executors receive, checked on callbacks.
//! - [`executor`]: the executor contract's client side; [`retry`]: what each outcome
//!   does to the task (shared by dispatcher, callbacks and rescuer).
//! - [`rescuer`]: brings back tasks whose lease lapsed (crashed holders, silent executors).
//! - [`outcomes`]: writes outcomes in batches so that one the store refuses blocks none.
//! - [`scheduler`]: creates cron firings, exactly once each.
//! - [`signing`]: each job's signing keys, read from its mounted Secret.
//! - [`ownership`]: which task types each dispatcher polls (rendezvous hashing).
//! - [`routing`]: the job table, hot-reloaded from AsyncJobConfig files.
//! - [`backlog`] and [`metrics`]: Prometheus gauges and counters.
//! - [`clock`]: injected time; [`clock_check`]: this clock against the store's; [`signals`]: test-only event hooks, so tests wait for
//!   events instead of polling.
//! - [`logging`]: text or JSON log lines on stderr, an attempt's lines tagged with its task.
//! - [`trace`]: W3C trace context from submit to executor, and spans over OTLP.
//! - [`tls`]: optional HTTPS on the listener, the certificate reloaded from its files.
//! - [`roles`]: wires the parts into the `dev`, `api`, `dispatcher` and `scheduler` roles
//!   under one supervisor that owns every task: one shutdown signal for all of them, and
//!   the first part to fail stops the role with its error.

pub mod api;
pub mod auth;
pub mod backlog;
pub mod clock;
pub mod clock_check;
pub mod dispatch;
pub mod executor;
pub mod kafka;
pub mod logging;
pub mod metrics;
pub mod outcomes;
pub mod rescuer;
pub mod retention;
pub mod retry;
pub mod roles;
pub mod routing;
pub mod scheduler;
pub mod signals;
pub mod signing;
pub mod tls;
pub mod trace;

// The old paths of what moved into `dispatch/`, until every caller uses the new ones.
pub use dispatch as dispatcher;
pub use dispatch::{adaptive, holdings, ownership};
// The task store, its lease secret and the heaps claimed tasks wait in are the
// `asyncd-store` crate; these keep their old paths (`crate::store::…`, `asyncd::heap::…`)
// until the callers name the crate.
pub use asyncd_store as store;
pub use asyncd_store::{heap, lease};

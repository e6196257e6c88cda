//! asyncd: a distributed asynchronous task queue.
//!
//! One binary, roles as subcommands (see `main.rs`); this library holds the parts, and
//! `wiring` wires them into the `dev`, `api`, `dispatcher` and `scheduler` roles. What
//! each module is for: the code map in `docs/design.md`, the one map of the code.

pub mod api;
pub mod auth;
pub mod backlog;
pub mod clock;
pub mod clock_check;
pub mod dispatch;
pub mod executor;
pub mod job_table;
pub mod kafka;
pub mod logging;
pub mod metrics;
pub mod outcomes;
pub mod reclaimer;
pub mod rescuer;
pub mod retention;
pub mod retry;
pub mod scheduler;
pub mod signing;
pub mod test_hooks;
pub mod tls;
pub mod trace;
pub mod wiring;

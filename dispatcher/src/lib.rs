//! asyncd: a distributed asynchronous task queue.
//!
//! One binary, roles as subcommands (see `main.rs`); this library holds the parts, and
//! `roles` wires them into the `dev`, `api`, `dispatcher` and `scheduler` roles. What
//! each module is for: the code map in `docs/design.md`, the one map of the code.

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

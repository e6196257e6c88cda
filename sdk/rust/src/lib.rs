//! Rust SDK for [asyncd](https://github.com/asyncd/asyncd), the async task queue.
//!
//! - [`Client`] submits, inspects, cancels and redrives tasks over the HTTP API
//!   (`docs/api.md`). Every submit needs an idempotency key;
//!   [`idempotency_key_from`] derives one exactly as the Go and Python SDKs do.
//! - [`Executor`] serves the executor side of the contract as an axum [`Router`]
//!   (a tower service): signature check, dispatch by task type, outcome → answer,
//!   long-running work with leases and heartbeats, and batch calls (one handler run
//!   per task, one result per task).
//! - [`Client::create_schedule`], [`Client::put_schedule`] and the other schedule calls
//!   manage schedules at runtime: a job's tasks fired on a cron or at a fixed interval,
//!   one per customer if need be (`docs/api.md`, "Schedules").
//! - [`cron::validate`] checks AsyncJobConfig cron schedules (`CRON_TZ=` required).
//! - The wire types, error codes, task states, header names and signing are
//!   [`asyncd_contract`]'s, re-exported here; it is the server's contract too.
//!
//! ```no_run
//! use asyncd_client::{Client, Task};
//! use std::time::Duration;
//!
//! # async fn run() -> Result<(), asyncd_client::Error> {
//! let client = Client::builder()
//!     .endpoint("http://127.0.0.1:7700")
//!     .service_name("orders")
//!     .build()?;
//! let task = Task::new("cancel_expired_order", serde_json::json!({"order_id": 42}))
//!     .derive_idempotency_key(&["order_id"])?;
//! let res = client.submit_delayed(&task, Duration::from_secs(15 * 60)).await?;
//! println!("task {} due at {}", res.id, res.eta);
//! # Ok(())
//! # }
//! ```
//!
//! [`Router`]: axum::Router

mod client;
pub mod cron;
mod error;
mod executor;
mod idempotency;
mod retry;
mod time;
mod verifier;

pub use asyncd_contract;

pub use asyncd_contract::{
    Debounce, DebounceMode, OnLimit, SIGNATURE_TOLERANCE, SignatureError, SignedCall, Throttle,
    sign, verify_signature,
};
pub use client::{
    BackfillResult, BatchItem, CancelResult, Change, Changed, Client, ClientBuilder, CronOverlap,
    CronTriggerResult, DEFAULT_ENDPOINT, DEFAULT_SUBMIT_CALLS, DEFAULT_TOKEN_FILE, DeadLetterBulk,
    DeadLetterBulkResult, JobOverview, JobStatus, MAX_BACKFILL, MAX_BATCH, MAX_SCHEDULE_NAME,
    MAX_SCHEDULE_PAGE, PendingChange, RedriveResult, ResultAck, ResultStatus,
    SOURCE_SERVICE_HEADER, Schedule, SchedulePage, SchedulePatch, ScheduleSource, ScheduleSpec,
    SubmitResult, TOKEN_FILE_REFRESH, Task, TaskPage, TaskQuery, TaskResult, TaskState, TaskStatus,
};
pub use error::{ApiError, Error, ErrorCode};
pub use executor::{
    BoxError, DEFAULT_BATCH_CONCURRENCY, DEFAULT_CANCEL_GRACE, DEFAULT_LEASE, Executor,
    HEADER_ATTEMPT, HEADER_BATCH, HEADER_CALLBACK_URL, HEADER_DISPATCHER, HEADER_IDEMPOTENCY_KEY,
    HEADER_LEASE_TOKEN, HEADER_SIGNATURE, HEADER_TASK_ID, HEADER_TIMESTAMP, InFlight, Outcome,
    TaskContext,
};
pub use idempotency::{canonical_json, idempotency_key_from};
pub use retry::RetryPolicy;
pub use time::{format_duration, format_time};
/// The type of [`TaskContext::cancellation`], re-exported so that a handler can name it
/// without depending on `tokio-util` itself.
pub use tokio_util::sync::CancellationToken;
pub use verifier::{
    MAX_REPLAY_ENTRIES, VerifiedBatch, Verifier, VerifyError, signed_batch_call, signed_call,
};

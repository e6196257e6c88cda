//! The HTTP API (docs/api.md): the router and the state its handlers share. By area:
//!
//! - `tasks`: submit, read, search and cancel tasks;
//! - [`submit`]: the one submit pipeline: validation, workflows, group commit, Kafka route;
//! - `callbacks`: the executor callbacks (heartbeat, result), authenticated by lease token;
//! - `dead_letters`: list and redrive dead letters, one or in bulk, and purge them;
//! - `kafka_dead_letters`: list and purge Kafka messages no task could be made of;
//! - `jobs`: the jobs overview, pause and resume, firing a cron entry now;
//! - `ops`: health, readiness, metrics and the OpenAPI document;
//! - [`console`]: the web console at `/ui`;
//! - [`guard`]: what a web page in the caller's browser may not do (`Host`, `Origin`,
//!   `Content-Type`), in front of every public endpoint;
//! - `listing`: the task as the API shows it, and the paging of task listings;
//! - [`error`]: the one error shape every refusal has;
//! - `extract`: the path and query extractors, which refuse a parameter that is not
//!   UTF-8 or holds a NUL with that error.

mod callbacks;
pub mod console;
mod dead_letters;
pub mod error;
mod extract;
pub mod guard;
mod jobs;
mod kafka_dead_letters;
mod listing;
mod ops;
mod schedules;
pub mod submit;
mod tasks;
mod tenant_weights;

use std::sync::Arc;

use asyncd_contract::ErrorCode;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::routing::{get, post, put};

use crate::auth::{Auth, Caller, Verb};
use crate::dispatch::ClaimerWakeup;
use crate::job_table::Routes;
use crate::metrics::Metrics;
use crate::trace::Tracer;
use asyncd_store::{Store, TaskRecord};
use error::ApiError;
use submit::Limits;

/// At the path `roles` wires it by, from before the submit pipeline had a module.
pub use submit::group_commit;

pub struct ApiState {
    pub store: Arc<dyn Store>,
    /// Where a submit of one store-routed task is written: with the others arriving
    /// meanwhile, in one transaction (`group_commit`).
    pub inserts: group_commit::GroupCommit,
    /// Where a batch of store-routed tasks is written.
    pub tasks: submit::task_writer::TaskWriter,
    pub routes: Routes,
    pub metrics: Arc<Metrics>,
    pub clock: crate::clock::SharedClock,
    /// Present when a dispatcher runs in this process, to claim near-due tasks at once.
    pub waker: Option<ClaimerWakeup>,
    pub lookahead_ms: i64,
    pub limits: Limits,
    /// The Kafka path, when brokers are configured.
    pub kafka: Option<crate::kafka::Producer>,
    /// A dispatcher in this process: its clock's offset from the store's.
    pub clock_check: Option<Arc<crate::clock_check::ClockCheck>>,
    /// A dispatcher in this process: the jobs it cannot sign calls for.
    pub signing_status: Option<Arc<crate::signing::SigningStatus>>,
    /// Who may call the public endpoints (docs/security.md).
    pub auth: Auth,
    /// Which `Host`, `Origin` and `Content-Type` the public endpoints accept ([`guard`]).
    pub guard: guard::RequestGuard,
    /// Where the `submit` spans go ([`crate::trace`]).
    pub tracer: Tracer,
}

impl axum::extract::FromRequestParts<Arc<ApiState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &Arc<ApiState>,
    ) -> Result<Self, ApiError> {
        // The peer's address: with `--auth kubernetes`, what token reviews are
        // rate-limited by. Absent only where the router is served without it (tests).
        let source = parts
            .extensions
            .get::<axum::extract::ConnectInfo<Peer>>()
            .map(|info| info.0.0.ip());
        Ok(state.auth.authenticate(&parts.headers, source).await?)
    }
}

/// The peer's address, recorded for each connection by either listener (plain TCP or
/// TLS): `router(..).into_make_service_with_connect_info::<Peer>()`.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub std::net::SocketAddr);

/// Written per listener type: a blanket impl over listeners would overlap axum's own.
macro_rules! peer_of {
    ($listener:ty) => {
        impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, $listener>>
            for Peer
        {
            fn connect_info(stream: axum::serve::IncomingStream<'_, $listener>) -> Self {
                Peer(*stream.remote_addr())
            }
        }
    };
}
peer_of!(tokio::net::TcpListener);
peer_of!(crate::tls::TlsListener);

type AppState = State<Arc<ApiState>>;

/// The endpoints of a role: `public` (the API role, and `dev`) adds submit, inspect,
/// cancel, dead letters and jobs, which need a credential, and the web console at `/ui`
/// (which asks the browser's user for one); every role serves the executor
/// callbacks (authenticated by their lease token), `/metrics` and the health endpoints.
pub fn router(state: Arc<ApiState>, public: bool) -> Router {
    // Enforced while the body is read: a body over its limit is refused as soon as the
    // limit is passed, never buffered whole first.
    let body_limit = state.limits.body_bytes();
    let batch_limit = state.limits.batch_body_bytes();
    let mut router = Router::new();
    if public {
        let public_routes = Router::new()
            .route(
                "/v1/tasks",
                post(tasks::submit_one)
                    .get(tasks::search)
                    .patch(tasks::change_by_key)
                    .delete(tasks::cancel_by_key),
            )
            // The route's own limit replaces the router-wide one below.
            .route(
                "/v1/tasks:batch",
                post(tasks::submit_batch).layer(DefaultBodyLimit::max(batch_limit)),
            )
            .route(
                "/v1/tasks/{id}",
                get(tasks::get).patch(tasks::change).delete(tasks::cancel),
            )
            .route("/v1/dead-letters", get(dead_letters::list))
            .route(
                "/v1/dead-letters/redrive",
                post(dead_letters::redrive_matching),
            )
            .route("/v1/dead-letters/purge", post(dead_letters::purge_matching))
            .route("/v1/dead-letters/{id}/redrive", post(dead_letters::redrive))
            .route("/v1/kafka-dead-letters", get(kafka_dead_letters::list))
            .route(
                "/v1/kafka-dead-letters/purge",
                post(kafka_dead_letters::purge),
            )
            .route("/v1/jobs", get(jobs::list))
            .route("/v1/jobs/{name}", get(jobs::get))
            .route("/v1/limiters", get(jobs::limiters))
            .route("/v1/jobs/{name}/pause", post(jobs::pause))
            .route("/v1/jobs/{name}/resume", post(jobs::resume))
            .route(
                "/v1/jobs/{name}/tenants/{tenant}/weight",
                put(tenant_weights::put).delete(tenant_weights::delete),
            )
            .route(
                "/v1/jobs/{name}/cron/{entry}/trigger",
                post(jobs::trigger_cron),
            )
            .route(
                "/v1/schedules",
                post(schedules::create).get(schedules::list),
            )
            .route(
                "/v1/schedules/{job}/{name}",
                get(schedules::get)
                    .put(schedules::put)
                    .patch(schedules::patch)
                    .delete(schedules::delete),
            )
            .route("/v1/schedules/{job}/{name}/pause", post(schedules::pause))
            .route("/v1/schedules/{job}/{name}/resume", post(schedules::resume))
            .route(
                "/v1/schedules/{job}/{name}/trigger",
                post(schedules::trigger),
            )
            .route(
                "/v1/schedules/{job}/{name}/backfill",
                post(schedules::backfill),
            )
            .merge(console::routes())
            .route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                guard::guard,
            ));
        router = router.merge(public_routes);
    }
    router
        .route("/v1/tasks/{id}/heartbeat", post(callbacks::heartbeat))
        .route("/v1/tasks/{id}/result", post(callbacks::result))
        .route("/metrics", get(ops::metrics))
        .route("/healthz", get(ops::health))
        .route("/readyz", get(ops::ready))
        .route("/v1/openapi.json", get(ops::openapi))
        .fallback(|| async { ApiError::new(ErrorCode::NotFound, "no such endpoint") })
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// The body, or why it could not be read; `limit` is the endpoint's body limit. The
/// router enforces it while reading where it is the route's own; an endpoint whose body
/// is a small filter, far below the router-wide limit, has it checked here.
fn body_bytes(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("the request body is over this endpoint's limit of {limit} bytes"),
        )
    };
    match body {
        Ok(body) if body.len() > limit => Err(too_large()),
        Ok(body) => Ok(body),
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(too_large()),
        Err(rejection) => Err(
            ApiError::new(ErrorCode::MalformedJson, rejection.body_text())
                .with_status(rejection.status()),
        ),
    }
}

impl ApiState {
    /// The AsyncJobConfig that declares `task_type`, which is what access is granted on;
    /// `None` when no job declares it (any more), which only a caller allowed on every
    /// job may then act on.
    fn job_name(&self, task_type: &str) -> Option<String> {
        self.routes
            .borrow()
            .job(task_type)
            .map(|job| job.name.clone())
    }

    /// The task `id` when `caller` may do `verb` on it. A caller who may not even read
    /// the task's job is answered exactly as for an unknown id, so nobody learns which
    /// tasks exist in jobs they cannot see; one who may read it but not do `verb` gets 403.
    async fn visible_task(
        &self,
        caller: &Caller,
        id: &str,
        verb: Verb,
    ) -> Result<TaskRecord, ApiError> {
        let task = self
            .store
            .get(id)
            .await?
            .ok_or_else(|| ApiError::not_found(id))?;
        let job = self.job_name(&task.task_type);
        if self.auth.allows(caller, verb, job.as_deref()).await? {
            return Ok(task);
        }
        if verb != Verb::Get && self.auth.allows(caller, Verb::Get, job.as_deref()).await? {
            return Err(crate::auth::forbidden(verb, job.as_deref()).into());
        }
        tracing::info!(
            caller = caller.name(),
            ?verb,
            id,
            "task hidden from a caller who may not read it"
        );
        Err(ApiError::not_found(id))
    }
}

//! Wiring: which parts each role runs, and the shutdown they share.
//!
//! Every part runs under one [`Supervisor`]: one task tracker and one cancellation token
//! for the whole role, so no task outlives it. SIGTERM or Ctrl-C cancels the token, the
//! API stops accepting, the dispatcher hands back what it has not started and waits for
//! what it has, and the role returns once every part has finished. A part that ends
//! before shutdown was asked for (an error, a panic, or returning when it should not)
//! cancels the token too, and the role returns that part's error, so a process whose
//! HTTP server died exits non-zero instead of dispatching on without health endpoints.
//!
//! [`start`] returns once the listener is bound, with its address, which is how tests run
//! a role in-process on `127.0.0.1:0`; [`run`] is `start` then [`Running::wait`].

use std::any::Any;
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use crate::api::guard::BrowserSettings;
use crate::api::guard::RequestGuard;
use crate::api::submit::task_writer::TaskWriter;
use crate::api::{self, ApiState, submit::Limits};
use crate::auth::Auth;
use crate::auth::kubernetes::KubeAuth;
use crate::auth::tokens::TokenFile;
use crate::clock::SharedClock;
use crate::dispatch::{ClaimerWakeup, Dispatcher, DispatcherConfig, OutcomeJournal};
use crate::executor::{AddressPolicy, ExecutorClient};
use crate::job_table::{self, Routes};
use crate::kafka::{self, Producer};
use crate::metrics::Metrics;
use crate::rescuer::Rescuer;
use crate::scheduler::Scheduler;
use crate::test_hooks::TestSignals;
use crate::tls::{self, TlsFiles};
use crate::trace::{OtlpSettings, Tracer};
use asyncd_kafka_admin::KafkaSecurity;
use asyncd_store::{self as store, Store};

/// Where the job table comes from.
#[derive(Debug, Clone)]
pub enum RoutingSource {
    Dir(PathBuf),
    /// `NAMESPACE/NAME` of the operator's routing ConfigMap.
    ConfigMap(String),
}

/// How the public API authenticates its callers (`--auth`; docs/security.md).
#[derive(Debug, Clone)]
pub enum AuthSettings {
    /// Every caller may do everything: refused on a non-loopback listener unless
    /// `insecure` (`--insecure-no-auth`).
    None { insecure: bool },
    /// Hashed API tokens from this file.
    Tokens(PathBuf),
    /// TokenReview for this audience, SubjectAccessReview on the jobs of `namespace`
    /// (default: the routing ConfigMap's).
    Kubernetes {
        audience: String,
        namespace: Option<String>,
    },
}

/// Which parts to run in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts {
    pub api: bool,
    pub dispatcher: bool,
    pub scheduler: bool,
}

impl Parts {
    pub const ALL: Self = Self {
        api: true,
        dispatcher: true,
        scheduler: true,
    };
}

#[derive(Clone)]
pub struct Settings {
    pub store_url: String,
    /// How long to wait at start for a database that is down or restarting.
    pub store_wait: Duration,
    /// How long a store call waits for its answer (`--store-timeout`,
    /// [`store::open_bounded`]).
    pub store_timeout: Duration,
    pub routing: RoutingSource,
    /// Serve only this job (`--job`).
    pub job: Option<String>,
    pub listen: SocketAddr,
    /// Serve HTTPS with this certificate instead of HTTP ([`crate::tls`]).
    pub tls: Option<TlsFiles>,
    /// Where executors call back; defaults to `http://<listen>` (`https://` with TLS).
    pub advertise_url: Option<String>,
    pub dispatcher: DispatcherConfig,
    /// Which addresses executors may be at ([`crate::executor::AddressPolicy`]).
    pub executor_addresses: AddressPolicy,
    pub max_payload_bytes: usize,
    /// Largest `POST /v1/tasks:batch` body (docs/api.md, "Limits").
    pub max_batch_body_bytes: usize,
    /// Tasks due within this go through Kafka (when the job has a topic).
    pub kafka_threshold: Duration,
    pub kafka_brokers: Option<String>,
    /// TLS and SASL settings of every Kafka client (`ASYNCD_KAFKA_*`).
    pub kafka_security: KafkaSecurity,
    /// How long a Kafka-route submit waits for the broker before storing the task.
    pub kafka_delivery_timeout: Duration,
    /// The API signs the messages it produces with the first key, and the consumers take
    /// only messages signed with one of them; `None`: unsigned, and every message taken.
    pub kafka_signing: Option<kafka::MessageKeys>,
    pub create_topics: bool,
    pub kafka_horizon: Duration,
    pub reload_interval: Duration,
    /// What every part reads the time from: [`crate::clock::SystemClock`] in production.
    pub clock: SharedClock,
    /// Test-only event hooks; `None` in production.
    pub signals: Option<TestSignals>,
    /// Only the API part serves the public endpoints, so only it uses this.
    pub auth: AuthSettings,
    /// Origins and hosts the public endpoints accept besides their own ([`api::guard`]).
    pub browser: BrowserSettings,
    /// Export spans over OTLP/HTTP ([`crate::trace`]); `None`: record none.
    pub otlp: Option<OtlpSettings>,
}

#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Routing(#[from] job_table::RoutingError),
    #[error(transparent)]
    RoutingConfigMap(#[from] job_table::configmap::ConfigMapError),
    #[error("Kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
    #[error("--advertise-url (ASYNCD_ADVERTISE_URL): {0}")]
    AdvertiseUrl(String),
    #[error("--auth: {0}")]
    Auth(String),
    #[error("{0}")]
    Browser(String),
    #[error(transparent)]
    TokenFile(#[from] crate::auth::tokens::TokenFileError),
    #[error(transparent)]
    Journal(#[from] crate::dispatch::JournalError),
    /// The part that ended first and took the role down.
    #[error("{part} {failure}")]
    Part {
        part: &'static str,
        #[source]
        failure: PartFailure,
    },
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a part ended when it should not have.
#[derive(Debug, thiserror::Error)]
pub enum PartFailure {
    #[error("failed: {0}")]
    Failed(BoxError),
    #[error("panicked: {0}")]
    Panicked(String),
    #[error("stopped before shutdown was requested")]
    Stopped,
}

/// Cancels `token` on SIGTERM or Ctrl-C; returns then, or as soon as `token` is cancelled
/// otherwise. Awaited next to the role (not spawned), so it is owned like every part.
pub async fn cancel_on_signal(token: CancellationToken) -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
        _ = token.cancelled() => return Ok(()),
    }
    tracing::info!("shutting down");
    token.cancel();
    Ok(())
}

pub async fn migrate(store_url: &str, wait: Duration) -> Result<(), RoleError> {
    store::open_migrated(
        store_url,
        wait,
        store::CALL_TIMEOUT,
        &CancellationToken::new(),
    )
    .await?;
    Ok(())
}

/// Owns a role's tasks: every part and every task a part spawns goes into its tracker,
/// and the first part to end unasked cancels the shared token and is what
/// [`Supervisor::wait`] reports.
#[derive(Clone)]
pub struct Supervisor {
    tasks: TaskTracker,
    shutdown: CancellationToken,
    failure: Arc<Mutex<Option<RoleError>>>,
}

impl Supervisor {
    pub fn new(shutdown: CancellationToken) -> Self {
        Self {
            tasks: TaskTracker::new(),
            shutdown,
            failure: Arc::default(),
        }
    }

    pub fn shutdown(&self) -> &CancellationToken {
        &self.shutdown
    }

    /// For parts that spawn long-lived tasks of their own (the dispatcher's loops, the
    /// Kafka consumers), so the role waits for those as well.
    pub fn tracker(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Runs `part` until it ends. Ending with `Ok` after shutdown was requested is the
    /// normal way out; anything else takes the role down with the reason.
    pub fn spawn<E: Into<BoxError>>(
        &self,
        part: &'static str,
        future: impl Future<Output = Result<(), E>> + Send + 'static,
    ) {
        let supervisor = self.clone();
        self.tasks.spawn(async move {
            let failure = match AssertUnwindSafe(future).catch_unwind().await {
                Ok(Ok(())) if supervisor.shutdown.is_cancelled() => return,
                Ok(Ok(())) => PartFailure::Stopped,
                Ok(Err(err)) => PartFailure::Failed(err.into()),
                Err(panic) => PartFailure::Panicked(panic_message(panic.as_ref())),
            };
            supervisor.fail(part, failure);
        });
    }

    /// [`Supervisor::spawn`] for parts that cannot fail, only stop.
    pub fn spawn_loop(
        &self,
        part: &'static str,
        future: impl Future<Output = ()> + Send + 'static,
    ) {
        self.spawn(part, async move {
            future.await;
            Ok::<_, std::convert::Infallible>(())
        });
    }

    fn fail(&self, part: &'static str, failure: PartFailure) {
        tracing::error!(part, error = %failure, "a part of the role ended; shutting the role down");
        self.failure
            .lock()
            .expect("failure lock")
            .get_or_insert(RoleError::Part { part, failure });
        self.shutdown.cancel();
    }

    /// Waits until every task has ended; the first part's failure, if any.
    pub async fn wait(self) -> Result<(), RoleError> {
        self.tasks.close();
        self.tasks.wait().await;
        match self.failure.lock().expect("failure lock").take() {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".into())
}

/// A started role: its parts run until the shutdown token is cancelled or one fails.
pub struct Running {
    addr: SocketAddr,
    supervisor: Supervisor,
}

impl Running {
    /// Where the HTTP server listens (the real port when started on port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits for every part to finish; see [`Supervisor::wait`].
    pub async fn wait(self) -> Result<(), RoleError> {
        self.supervisor.wait().await
    }
}

/// Runs the chosen parts until `shutdown` (or until one of them fails).
pub async fn run(
    settings: Settings,
    parts: Parts,
    shutdown: CancellationToken,
) -> Result<(), RoleError> {
    start(settings, parts, shutdown).await?.wait().await
}

/// Opens the store, loads the routing, binds the listener and starts the parts. Start-up
/// errors (a bad store URL, a broken config folder, a taken port) come back here, after
/// whatever had started has stopped again.
pub async fn start(
    settings: Settings,
    parts: Parts,
    shutdown: CancellationToken,
) -> Result<Running, RoleError> {
    // A child token: a failing part stops this role, not whatever else the caller's
    // token governs.
    let supervisor = Supervisor::new(shutdown.child_token());
    match wire(settings, parts, &supervisor).await {
        Ok(addr) => Ok(Running { addr, supervisor }),
        Err(err) => {
            supervisor.shutdown.cancel();
            // The start-up error is the one worth reporting.
            let _ = supervisor.wait().await;
            Err(err)
        }
    }
}

async fn wire(
    settings: Settings,
    parts: Parts,
    supervisor: &Supervisor,
) -> Result<SocketAddr, RoleError> {
    let shutdown = supervisor.shutdown().clone();
    let store: Arc<dyn Store> = store::open_migrated(
        &settings.store_url,
        settings.store_wait,
        settings.store_timeout,
        &shutdown,
    )
    .await?;
    let routes: Routes = match &settings.routing {
        RoutingSource::Dir(dir) => {
            let (routes, watcher) = job_table::watch_dir(
                dir.clone(),
                settings.job.clone(),
                settings.reload_interval,
                shutdown.clone(),
            )?;
            supervisor.spawn_loop("routing watcher", watcher);
            routes
        }
        RoutingSource::ConfigMap(reference) => {
            let (routes, watcher) = job_table::configmap::watch_configmap(
                reference,
                settings.job.clone(),
                shutdown.clone(),
            )
            .await?;
            supervisor.spawn_loop("routing ConfigMap watcher", watcher);
            routes
        }
    };
    let auth = if parts.api {
        auth(&settings).await?
    } else {
        Auth::None
    };
    let guard = RequestGuard::new(
        &settings.browser,
        settings.listen,
        !matches!(auth, Auth::None),
    )
    .map_err(RoleError::Browser)?;
    let metrics = Arc::new(Metrics::new());
    let tracer = match &settings.otlp {
        Some(otlp) => {
            let (tracer, exporter) = Tracer::exporting(
                otlp.clone(),
                metrics.trace_spans_dropped.clone(),
                shutdown.clone(),
            );
            supervisor.spawn_loop("OTLP span exporter", exporter);
            tracer
        }
        None => Tracer::default(),
    };
    let clock = settings.clock.clone();
    let waker = parts.dispatcher.then(ClaimerWakeup::default);

    // Bind before starting the other parts so a taken port fails start-up cleanly.
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| RoleError::Listen(settings.listen, e))?;
    let local = listener
        .local_addr()
        .map_err(|e| RoleError::Listen(settings.listen, e))?;
    tracing::info!(%local, "listening");
    let dispatcher = if parts.dispatcher {
        let callback = callback_url(
            settings.advertise_url.as_deref(),
            local,
            settings.tls.is_some(),
        )?;
        let journal = match &settings.dispatcher.outcome_journal {
            Some(dir) => Some(Arc::new(OutcomeJournal::open(dir)?)),
            None => None,
        };
        Some(Dispatcher::new(
            store.clone(),
            routes.clone(),
            metrics.clone(),
            clock.clone(),
            ExecutorClient::with_policy(
                callback,
                settings.dispatcher.owner.clone(),
                settings.executor_addresses.clone(),
            ),
            DispatcherConfig {
                signals: settings.signals.clone(),
                tracer: tracer.clone(),
                ..settings.dispatcher.clone()
            },
            waker.clone().unwrap_or_default(),
            shutdown.clone(),
            journal,
        ))
    } else {
        None
    };
    let tasks = TaskWriter::new(
        store.clone(),
        dispatcher.as_ref().map(Dispatcher::local_dispatch),
    );
    let (inserts, writer) = api::group_commit::new(tasks.clone());
    // Ends once the API's state is dropped, after writing what was queued before.
    supervisor.spawn_loop("submit group commit", writer.run());
    let state = Arc::new(ApiState {
        store: store.clone(),
        inserts,
        tasks,
        routes: routes.clone(),
        metrics: metrics.clone(),
        clock: clock.clone(),
        waker: waker.clone(),
        lookahead_ms: settings.dispatcher.lookahead.as_millis() as i64,
        limits: Limits {
            max_payload_bytes: settings.max_payload_bytes,
            max_batch_body_bytes: settings.max_batch_body_bytes,
        },
        kafka: match (&settings.kafka_brokers, parts.api) {
            (Some(brokers), true) => Some(Producer::new(
                brokers,
                &settings.kafka_security,
                settings.kafka_threshold,
                settings.kafka_delivery_timeout,
                settings.kafka_signing.clone(),
            )?),
            _ => None,
        },
        clock_check: parts
            .dispatcher
            .then(|| settings.dispatcher.clock_check.clone()),
        signing_status: parts
            .dispatcher
            .then(|| settings.dispatcher.signing_status.clone()),
        auth,
        guard,
        tracer: tracer.clone(),
    });
    if parts.api
        && settings.create_topics
        && let Some(brokers) = &settings.kafka_brokers
    {
        supervisor.spawn_loop(
            "Kafka topic creator",
            kafka::create_topics(
                brokers.clone(),
                settings.kafka_security.clone(),
                routes.clone(),
                shutdown.clone(),
            ),
        );
    }
    // Roles without the API serve only the executor callbacks, /metrics and the health
    // endpoints.
    // With the peer's address, which token reviews are rate-limited by.
    let app = api::router(state, parts.api).into_make_service_with_connect_info::<api::Peer>();
    let api_shutdown = shutdown.clone();
    match settings.tls.clone() {
        None => supervisor.spawn(
            "HTTP server",
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { api_shutdown.cancelled().await })
                .into_future(),
        ),
        Some(files) => {
            let (listener, accepting, reloading) = tls::listen(
                listener,
                local,
                files,
                supervisor.tracker().clone(),
                shutdown.clone(),
            )?;
            supervisor.spawn_loop("TLS acceptor", accepting);
            supervisor.spawn_loop("TLS certificate reloader", reloading);
            supervisor.spawn(
                "HTTPS server",
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move { api_shutdown.cancelled().await })
                    .into_future(),
            );
        }
    }

    if let Some(dispatcher) = dispatcher {
        if let Some(brokers) = &settings.kafka_brokers {
            let config = kafka::ConsumerConfig {
                brokers: brokers.clone(),
                security: settings.kafka_security.clone(),
                owner: settings.dispatcher.owner.clone(),
                horizon: settings.kafka_horizon,
                hold: settings.dispatcher.hold,
                create_topics: settings.create_topics,
                signing: settings.kafka_signing.clone(),
            };
            supervisor.spawn_loop(
                "Kafka consumers",
                kafka::supervise(
                    config,
                    routes.clone(),
                    store.clone(),
                    dispatcher.sink(),
                    clock.clone(),
                    metrics.clone(),
                    supervisor.tracker().clone(),
                    shutdown.clone(),
                ),
            );
        }
        let outcomes_written = dispatcher.outcomes_written();
        supervisor.spawn_loop("dispatcher", dispatcher.run(supervisor.tracker().clone()));
        let rescuer = Rescuer {
            store: store.clone(),
            routes: routes.clone(),
            metrics: metrics.clone(),
            clock: clock.clone(),
            interval: Duration::from_millis(500),
            signals: settings.signals.clone(),
        };
        supervisor.spawn_loop("rescuer", rescuer.run(shutdown.clone()));
        let purger = crate::retention::Purger {
            store: store.clone(),
            routes: routes.clone(),
            metrics: metrics.clone(),
            clock: clock.clone(),
            interval: Duration::from_secs(1),
            signals: settings.signals.clone(),
        };
        supervisor.spawn_loop("retention purger", purger.run(shutdown.clone()));
        supervisor.spawn_loop(
            "dead row reclaimer",
            crate::reclaimer::Reclaimer {
                store: store.clone(),
                outcomes_written,
            }
            .run(shutdown.clone()),
        );
        supervisor.spawn_loop(
            "backlog gauges",
            crate::backlog::run(
                store.clone(),
                routes.clone(),
                metrics.clone(),
                clock.clone(),
                Duration::from_secs(2),
                shutdown.clone(),
            ),
        );
    }
    if parts.scheduler {
        let mut scheduler =
            Scheduler::new(store.clone(), routes.clone(), clock.clone(), waker.clone());
        scheduler.signals = settings.signals.clone();
        supervisor.spawn_loop("scheduler", scheduler.run(shutdown.clone()));
    }
    if !parts.api && !parts.dispatcher && !parts.scheduler {
        shutdown.cancel();
    }
    Ok(local)
}

async fn auth(settings: &Settings) -> Result<Auth, RoleError> {
    Ok(match &settings.auth {
        AuthSettings::None { insecure } => {
            crate::auth::check_no_auth(settings.listen, *insecure).map_err(RoleError::Auth)?;
            Auth::None
        }
        AuthSettings::Tokens(path) => Auth::Tokens(TokenFile::open(path.clone())?),
        AuthSettings::Kubernetes {
            audience,
            namespace,
        } => {
            let from_routing = match &settings.routing {
                RoutingSource::ConfigMap(reference) => {
                    reference.split_once('/').map(|(ns, _)| ns.to_string())
                }
                RoutingSource::Dir(_) => None,
            };
            let namespace = namespace.clone().or(from_routing).ok_or_else(|| {
                RoleError::Auth(
                    "kubernetes needs the jobs' namespace: --auth-namespace, or                      --routing-configmap NAMESPACE/NAME"
                        .into(),
                )
            })?;
            Auth::Kubernetes(Box::new(
                KubeAuth::connect(audience.clone(), namespace)
                    .await
                    .map_err(|e| {
                        RoleError::Auth(format!("cannot reach the Kubernetes API: {e}"))
                    })?,
            ))
        }
    })
}

/// The base URL executors call back on (heartbeats, results). A dispatcher listening on
/// an unspecified address (0.0.0.0, [::]) must be told one: executors cannot call
/// 0.0.0.0, and in a cluster the pod's own address is the one to give (the operator sets
/// `ASYNCD_ADVERTISE_URL` from the pod IP).
fn callback_url(
    advertise: Option<&str>,
    local: SocketAddr,
    tls: bool,
) -> Result<String, RoleError> {
    let Some(url) = advertise else {
        if local.ip().is_unspecified() {
            return Err(RoleError::AdvertiseUrl(format!(
                "required when listening on {local}: executors cannot call back to an unspecified address"
            )));
        }
        let scheme = if tls { "https" } else { "http" };
        return Ok(format!("{scheme}://{local}"));
    };
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| RoleError::AdvertiseUrl(format!("{url:?} is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(RoleError::AdvertiseUrl(format!(
            "{url:?} must be an http:// or https:// URL"
        )));
    }
    let host = parsed.host_str().unwrap_or_default();
    let unspecified = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_unspecified());
    if host.is_empty() || unspecified {
        return Err(RoleError::AdvertiseUrl(format!(
            "{url:?} names no address an executor can reach"
        )));
    }
    Ok(url.trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_callback_url_is_never_an_unspecified_address() {
        let any: SocketAddr = "0.0.0.0:7700".parse().unwrap();
        let loopback: SocketAddr = "127.0.0.1:7700".parse().unwrap();
        assert_eq!(
            callback_url(None, loopback, false).unwrap(),
            "http://127.0.0.1:7700"
        );
        assert_eq!(
            callback_url(None, loopback, true).unwrap(),
            "https://127.0.0.1:7700"
        );
        for refused in [
            callback_url(None, any, false),
            callback_url(None, "[::]:7700".parse().unwrap(), false),
            callback_url(Some("http://0.0.0.0:7700"), loopback, false),
            callback_url(Some("http://[::]:7700"), loopback, false),
            callback_url(Some("not a url"), loopback, false),
            callback_url(Some("ftp://10.1.2.3/"), loopback, false),
        ] {
            let err = refused.unwrap_err().to_string();
            assert!(err.contains("--advertise-url"), "{err}");
        }
        assert_eq!(
            callback_url(Some("http://10.1.2.3:7700/"), any, false).unwrap(),
            "http://10.1.2.3:7700"
        );
        assert_eq!(
            callback_url(Some("https://asyncd-api.shop.svc:7700"), any, false).unwrap(),
            "https://asyncd-api.shop.svc:7700"
        );
    }

    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A part that runs until shutdown and then counts itself out.
    fn steady(supervisor: &Supervisor, drained: &Arc<AtomicUsize>) {
        let (token, drained) = (supervisor.shutdown().clone(), drained.clone());
        supervisor.spawn_loop("steady", async move {
            token.cancelled().await;
            drained.fetch_add(1, Ordering::SeqCst);
        });
    }

    async fn ended_with(
        part: impl Future<Output = Result<(), BoxError>> + Send + 'static,
    ) -> RoleError {
        let outer = CancellationToken::new();
        let supervisor = Supervisor::new(outer.child_token());
        let drained = Arc::new(AtomicUsize::new(0));
        steady(&supervisor, &drained);
        supervisor.spawn("broken", part);
        let err = supervisor.wait().await.expect_err("the role fails");
        assert_eq!(
            drained.load(Ordering::SeqCst),
            1,
            "the other part drained first"
        );
        assert!(
            !outer.is_cancelled(),
            "only this role stops, not the caller's token"
        );
        err
    }

    #[tokio::test]
    async fn a_failing_part_stops_the_role_with_its_error() {
        let err = ended_with(async { Err(std::io::Error::other("disk gone").into()) }).await;
        assert!(
            matches!(&err, RoleError::Part { part: "broken", failure: PartFailure::Failed(e) } if e.to_string() == "disk gone"),
            "{err:?}"
        );
        assert_eq!(err.to_string(), "broken failed: disk gone");
    }

    #[tokio::test]
    async fn a_panicking_part_is_reported_not_swallowed() {
        let err = ended_with(async { panic!("boom") }).await;
        assert!(
            matches!(&err, RoleError::Part { part: "broken", failure: PartFailure::Panicked(m) } if m == "boom"),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn a_part_returning_before_shutdown_is_an_error() {
        let err = ended_with(async { Ok(()) }).await;
        assert!(
            matches!(
                &err,
                RoleError::Part {
                    part: "broken",
                    failure: PartFailure::Stopped
                }
            ),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn only_the_first_failure_is_reported() {
        let supervisor = Supervisor::new(CancellationToken::new());
        supervisor.spawn("first", async {
            Err::<(), _>(std::io::Error::other("one"))
        });
        // The first failure is recorded before it cancels the token.
        supervisor.shutdown().cancelled().await;
        let token = supervisor.shutdown().clone();
        supervisor.spawn("second", async move {
            token.cancelled().await;
            Err::<(), _>(std::io::Error::other("two"))
        });
        let err = supervisor.wait().await.expect_err("fails");
        assert!(
            matches!(err, RoleError::Part { part: "first", .. }),
            "{err:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_waits_for_every_part_and_their_tasks() {
        let supervisor = Supervisor::new(CancellationToken::new());
        let drained = Arc::new(AtomicUsize::new(0));
        for delay in [0, 3, 7] {
            let (token, counter) = (supervisor.shutdown().clone(), drained.clone());
            // A part's own task, in the role's tracker, with a slow wind-down.
            supervisor.tracker().spawn(async move {
                token.cancelled().await;
                tokio::time::sleep(Duration::from_secs(delay)).await;
                counter.fetch_add(1, Ordering::SeqCst);
            });
            steady(&supervisor, &drained);
        }
        supervisor.shutdown().cancel();
        let started = tokio::time::Instant::now();
        supervisor.wait().await.expect("a clean shutdown");
        assert_eq!(drained.load(Ordering::SeqCst), 6);
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(7),
            "waited for the slowest"
        );
    }
}

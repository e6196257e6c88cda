//! The `asyncd` binary: roles as subcommands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use asyncd::clock::SystemClock;
use asyncd::dispatch::DispatcherConfig;
use asyncd::executor::AddressPolicy;
use asyncd::logging::LogFormat;
use asyncd::tls::TlsFiles;
use asyncd::trace::OtlpSettings;
use asyncd::wiring::{self, AuthSettings, BrowserSettings, Parts, RoutingSource, Settings};
use asyncd_kafka_admin::KafkaSecurity;
use clap::{Args, Parser, Subcommand};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "asyncd",
    version,
    about = "A distributed asynchronous task queue"
)]
struct Cli {
    /// How log lines look: `text` (colour only on a terminal) or `json` (one object per
    /// line, the task's id, type and attempt as fields of an attempt's lines). The filter
    /// is ASYNCD_LOG (default `info`).
    #[arg(
        long,
        global = true,
        env = "ASYNCD_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand)]
enum Role {
    /// Every role in one process on an embedded SQLite store.
    Dev {
        /// SQLite database file.
        #[arg(long, env = "ASYNCD_DB", default_value = "asyncd.db")]
        db: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// The submit API.
    Api(Server),
    /// Claims and dispatches tasks.
    Dispatcher(Server),
    /// Creates cron firings.
    Scheduler(Server),
    /// Prints the hex SHA-256 of a token, as `--auth-tokens-file` stores it. Reads the
    /// token from stdin (one line), so it stays out of the shell history and `ps`.
    HashToken,
    /// Applies the store's migrations and exits.
    Migrate {
        #[command(flatten)]
        store: StoreSource,
        #[arg(long, env = "ASYNCD_STORE_WAIT", default_value = "60s", value_parser = duration)]
        store_wait: Duration,
    },
}

#[derive(Args)]
struct Server {
    #[command(flatten)]
    store: StoreSource,
    /// How long to wait at start for a database that is down or restarting, before
    /// exiting with an error.
    #[arg(long, env = "ASYNCD_STORE_WAIT", default_value = "60s", value_parser = duration)]
    store_wait: Duration,
    /// How long a call to a MariaDB or PostgreSQL store waits for its answer before it
    /// fails as the store being unavailable (and is tried again): the longest a dead
    /// network path to the database goes unnoticed. The server also ends a transaction
    /// left idle this long.
    #[arg(long, env = "ASYNCD_STORE_TIMEOUT", default_value = "10s", value_parser = duration)]
    store_timeout: Duration,
    #[command(flatten)]
    common: Common,
}

/// Where the store URL comes from. It carries the database password, so it is read from
/// the environment or a file: a flag's value is visible to every user of the machine in
/// `ps` and `/proc/<pid>/cmdline`.
#[derive(Args)]
struct StoreSource {
    /// Store URL: sqlite://PATH, mysql://… or postgres://…. Prefer ASYNCD_STORE or
    /// --store-file: the value of a flag is visible to every user in `ps`.
    #[arg(
        long,
        env = "ASYNCD_STORE",
        hide_env_values = true,
        required_unless_present = "store_file",
        conflicts_with = "store_file"
    )]
    store: Option<String>,
    /// File whose content is the store URL (a mounted Secret key), read once at start.
    #[arg(long, env = "ASYNCD_STORE_FILE")]
    store_file: Option<PathBuf>,
}

impl StoreSource {
    fn url(self) -> anyhow::Result<String> {
        match (self.store, self.store_file) {
            (Some(url), _) => Ok(url),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(&path).with_context(|| {
                    format!(
                        "--store-file (ASYNCD_STORE_FILE): reading {}",
                        path.display()
                    )
                })?;
                Ok(text.trim().to_string())
            }
            (None, None) => unreachable!("clap requires one of them"),
        }
    }
}

#[derive(Args)]
struct Common {
    /// Folder of AsyncJobConfig YAML files, re-read when it changes.
    #[arg(
        long,
        env = "ASYNCD_CONFIG",
        required_unless_present = "routing_configmap",
        conflicts_with = "routing_configmap"
    )]
    config: Option<PathBuf>,
    /// In a cluster: follow the operator's routing ConfigMap (NAMESPACE/NAME) through the
    /// API instead of a folder.
    #[arg(long, env = "ASYNCD_ROUTING_CONFIGMAP")]
    routing_configmap: Option<String>,
    /// Serve only this AsyncJobConfig (the operator's per-job dispatchers).
    #[arg(long, env = "ASYNCD_JOB")]
    job: Option<String>,
    /// Address for the API, /metrics and health endpoints.
    #[arg(long, env = "ASYNCD_LISTEN", default_value = "127.0.0.1:7700")]
    listen: SocketAddr,
    /// Serve HTTPS with this PEM certificate chain (and --tls-key) instead of HTTP, on
    /// the same listener: the API, callbacks, /metrics and the health endpoints alike.
    #[arg(long, env = "ASYNCD_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "ASYNCD_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// How often the certificate and key files are re-read; a changed pair is served to
    /// new connections without a restart.
    #[arg(long, env = "ASYNCD_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = duration)]
    tls_reload_interval: Duration,
    /// Base URL executors use for heartbeats and results (default http://LISTEN; required
    /// for a dispatcher listening on 0.0.0.0 or [::]).
    #[arg(long, env = "ASYNCD_ADVERTISE_URL")]
    advertise_url: Option<String>,
    /// Where each job's signing Secret is: key files at DIR/<secret name>/<key> (the
    /// operator mounts the job's Secret there; spec.executor.signing names both).
    #[arg(long, env = "ASYNCD_SIGNING_DIR", default_value = asyncd::signing::DEFAULT_DIR)]
    signing_dir: PathBuf,
    /// Dispatching roles (dispatcher, dev): a directory for this process's outcome
    /// journal. Each outcome is appended there as its attempt ends, so that after a
    /// SIGKILL the process started again on the same directory writes the outcomes the
    /// kill left unwritten, instead of their tasks running again once their leases
    /// lapse. One directory per process (it is locked); in Kubernetes an emptyDir.
    #[arg(long, env = "ASYNCD_OUTCOME_JOURNAL")]
    outcome_journal: Option<PathBuf>,
    /// How long attempts in flight may run on after SIGTERM before they are abandoned to
    /// their leases. The process exits at most 15 s after that, whatever its store or
    /// broker do.
    #[arg(long, env = "ASYNCD_SHUTDOWN_GRACE", default_value = "25s", value_parser = duration)]
    shutdown_grace: Duration,
    /// Store poll interval.
    #[arg(long, env = "ASYNCD_POLL_INTERVAL", default_value = "200ms", value_parser = duration)]
    poll_interval: Duration,
    /// The longest wait between polls once they find nothing: polls back off from
    /// --poll-interval while the queue is idle (never beyond --lookahead). A task
    /// submitted through this process is claimed at once regardless; one submitted
    /// through another is found within this.
    #[arg(long, env = "ASYNCD_IDLE_POLL_INTERVAL", default_value = "1s", value_parser = duration)]
    idle_poll_interval: Duration,
    /// How far ahead of their ETA tasks are claimed into the heap.
    #[arg(long, env = "ASYNCD_LOOKAHEAD", default_value = "2s", value_parser = duration)]
    lookahead: Duration,
    /// How long past its ETA a dispatcher may hold a claimed task before the rescuer
    /// hands it to another. A dispatcher seen dying has its claims handed back at once;
    /// this bounds the rest, and what a slow job may claim ahead (half of it).
    #[arg(long, env = "ASYNCD_CLAIM_HOLD", default_value = "30s", value_parser = duration)]
    claim_hold: Duration,
    /// Names this process in the store and in the `Asyncd-Dispatcher` header (default:
    /// the host name, which is the pod name in a cluster).
    #[arg(long, env = "ASYNCD_INSTANCE")]
    instance: Option<String>,
    /// Tasks due within this go through Kafka when the job has a topic and brokers are
    /// configured; `0s` sends every task to the store.
    #[arg(long, env = "ASYNCD_KAFKA_THRESHOLD", default_value = "10m", value_parser = duration)]
    kafka_threshold: Duration,
    /// Kafka bootstrap servers (HOST:PORT,…); without them every task goes to the store.
    #[arg(long, env = "ASYNCD_KAFKA_BROKERS")]
    kafka_brokers: Option<String>,
    /// How long a Kafka-route submit waits for the broker's acknowledgement; past it the
    /// task is stored instead (the route the answer names is then `store`).
    #[arg(long, env = "ASYNCD_KAFKA_DELIVERY_TIMEOUT", default_value = "5s", value_parser = duration)]
    kafka_delivery_timeout: Duration,
    /// File (a mounted Secret key) of the keys Kafka messages are signed with: the api
    /// signs what it produces with the first, and dispatchers take only messages signed
    /// with one of them. Keys are separated by line breaks or commas, each at least 32
    /// bytes. Or the keys themselves in ASYNCD_KAFKA_SIGNING_KEY. Read once at start.
    #[arg(long, env = "ASYNCD_KAFKA_SIGNING_KEY_FILE")]
    kafka_signing_key_file: Option<PathBuf>,
    /// Outside a cluster: create a missing topic with its job config's partitions.
    #[arg(long, env = "ASYNCD_CREATE_TOPICS")]
    create_topics: bool,
    /// Tasks read from Kafka and due within this are claimed straight into the heap.
    #[arg(long, env = "ASYNCD_KAFKA_HORIZON", default_value = "30s", value_parser = duration)]
    kafka_horizon: Duration,
    /// Largest accepted payload; the body of a submit or callback may be 64 KiB more.
    #[arg(long, env = "ASYNCD_MAX_PAYLOAD_BYTES", default_value_t = 1024 * 1024)]
    max_payload_bytes: usize,
    /// Largest `POST /v1/tasks:batch` body (at least one task's): a full batch at the
    /// payload limit would be 1 GB, more than one request may make the API hold.
    #[arg(long, env = "ASYNCD_MAX_BATCH_BODY_BYTES", default_value_t = 16 * 1024 * 1024)]
    max_batch_body_bytes: usize,
    /// How API callers authenticate (docs/security.md): `none` (loopback listeners only,
    /// unless --insecure-no-auth), `tokens` (--auth-tokens-file) or `kubernetes`
    /// (TokenReview and SubjectAccessReview). Only the API and dev roles use it.
    #[arg(long, env = "ASYNCD_AUTH", value_enum, default_value = "none")]
    auth: AuthMode,
    /// `--auth tokens`: the YAML file of hashed API tokens, re-read when it changes.
    #[arg(
        long,
        env = "ASYNCD_AUTH_TOKENS_FILE",
        required_if_eq("auth", "tokens")
    )]
    auth_tokens_file: Option<PathBuf>,
    /// `--auth kubernetes`: the audience callers' tokens must be bound to.
    #[arg(long, env = "ASYNCD_AUTH_AUDIENCE", default_value = "asyncd")]
    auth_audience: String,
    /// `--auth kubernetes`: the namespace of the jobs' AsyncJobConfigs, which access is
    /// reviewed in (default: the --routing-configmap's).
    #[arg(long, env = "ASYNCD_AUTH_NAMESPACE")]
    auth_namespace: Option<String>,
    /// `--auth none` on a non-loopback address: serve every job's tasks to anyone who can
    /// reach the port.
    #[arg(long, env = "ASYNCD_INSECURE_NO_AUTH")]
    insecure_no_auth: bool,
    /// An origin (`https://console.example:8443`) whose web pages may call the API, besides
    /// the listener's own; repeatable, or comma-separated in the environment. Requests
    /// with any other `Origin` are refused (docs/security.md, "Browsers").
    #[arg(
        long = "allowed-origin",
        env = "ASYNCD_ALLOWED_ORIGINS",
        value_delimiter = ','
    )]
    allowed_origins: Vec<String>,
    /// `--auth none`: a host name requests may be addressed to besides localhost, loopback
    /// addresses and the --listen address; repeatable, or comma-separated in the
    /// environment. Requests naming any other `Host` are refused, against DNS rebinding.
    #[arg(
        long = "allowed-host",
        env = "ASYNCD_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    allowed_hosts: Vec<String>,
    /// Export submit, dispatch and attempt spans over OTLP/HTTP (protobuf) to this base
    /// URL (`{URL}/v1/traces`), for tasks submitted with a sampled `traceparent`.
    /// Unset: no spans are recorded.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// The `service.name` of the exported spans.
    #[arg(long, env = "OTEL_SERVICE_NAME", default_value = "asyncd")]
    otel_service_name: String,
    /// Which addresses executors may be at (docs/security.md, "Executor URL policy"):
    /// `cluster` refuses link-local, loopback and the Kubernetes API server's service
    /// address; `local` refuses link-local only; `auto` is `cluster` when
    /// KUBERNETES_SERVICE_HOST is set, except for `asyncd dev`, which is `local`.
    #[arg(
        long,
        env = "ASYNCD_EXECUTOR_ADDRESSES",
        value_enum,
        default_value = "auto"
    )]
    executor_addresses: ExecutorAddresses,
    /// Address ranges executors may not be at besides (CIDRs, comma-separated).
    #[arg(long, env = "ASYNCD_EXECUTOR_DENY_CIDRS", value_delimiter = ',')]
    executor_deny_cidrs: Vec<ipnet::IpNet>,
    /// Address ranges executors may be at even where a denied range covers them (CIDRs,
    /// comma-separated).
    #[arg(long, env = "ASYNCD_EXECUTOR_ALLOW_CIDRS", value_delimiter = ',')]
    executor_allow_cidrs: Vec<ipnet::IpNet>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ExecutorAddresses {
    Auto,
    Cluster,
    Local,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum AuthMode {
    None,
    Tokens,
    Kubernetes,
}

fn duration(text: &str) -> Result<Duration, String> {
    asyncd_spec::parse_duration(text)
}

impl Common {
    /// The executor address policy: `dev` is `asyncd dev`, which is `local` on `auto`.
    fn executor_addresses(&self, dev: bool) -> AddressPolicy {
        let api_server = std::env::var("KUBERNETES_SERVICE_HOST")
            .ok()
            .filter(|host| !host.is_empty());
        let cluster = match self.executor_addresses {
            ExecutorAddresses::Auto => api_server.is_some() && !dev,
            ExecutorAddresses::Cluster => true,
            ExecutorAddresses::Local => false,
        };
        let base = if cluster {
            AddressPolicy::cluster(api_server.and_then(|host| host.parse().ok()))
        } else {
            AddressPolicy::local()
        };
        base.with(&self.executor_deny_cidrs, &self.executor_allow_cidrs)
    }

    fn settings(
        self,
        store_url: String,
        store_wait: Duration,
        store_timeout: Duration,
        dev: bool,
    ) -> anyhow::Result<Settings> {
        let executor_addresses = self.executor_addresses(dev);
        let tls = match (self.tls_cert, self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert,
                key,
                reload_interval: self.tls_reload_interval,
            }),
            _ => None,
        };
        Ok(Settings {
            store_url,
            store_wait,
            store_timeout,
            routing: match (self.config, self.routing_configmap) {
                (Some(dir), _) => RoutingSource::Dir(dir),
                (None, Some(reference)) => RoutingSource::ConfigMap(reference),
                (None, None) => unreachable!("clap requires one of them"),
            },
            job: self.job.clone(),
            listen: self.listen,
            tls,
            advertise_url: self.advertise_url,
            dispatcher: DispatcherConfig {
                owner: instance_name(self.instance),
                job: self.job,
                poll_interval: self.poll_interval,
                idle_poll_interval: self
                    .idle_poll_interval
                    .clamp(self.poll_interval, self.lookahead.max(self.poll_interval)),
                lookahead: self.lookahead.max(self.poll_interval),
                hold: self.claim_hold,
                shutdown_grace: self.shutdown_grace,
                signing_dir: self.signing_dir,
                outcome_journal: self.outcome_journal,
                ..DispatcherConfig::default()
            },
            executor_addresses,
            max_payload_bytes: self.max_payload_bytes,
            max_batch_body_bytes: self.max_batch_body_bytes,
            kafka_threshold: self.kafka_threshold,
            kafka_brokers: self.kafka_brokers,
            // Environment only: a password in a flag would be in every `ps` listing.
            kafka_security: KafkaSecurity::from_env().context("Kafka security settings")?,
            kafka_delivery_timeout: self.kafka_delivery_timeout,
            kafka_signing: kafka_signing_keys(
                self.kafka_signing_key_file,
                std::env::var(KAFKA_SIGNING_KEY).ok(),
            )?,
            create_topics: self.create_topics,
            kafka_horizon: self.kafka_horizon,
            reload_interval: Duration::from_millis(500),
            clock: Arc::new(SystemClock),
            signals: None,
            auth: match self.auth {
                AuthMode::None => AuthSettings::None {
                    insecure: self.insecure_no_auth,
                },
                AuthMode::Tokens => AuthSettings::Tokens(
                    self.auth_tokens_file
                        .expect("clap requires it with --auth tokens"),
                ),
                AuthMode::Kubernetes => AuthSettings::Kubernetes {
                    audience: self.auth_audience,
                    namespace: self.auth_namespace,
                },
            },
            browser: BrowserSettings {
                allowed_origins: self.allowed_origins,
                allowed_hosts: self.allowed_hosts,
            },
            otlp: match self.otlp_endpoint.filter(|e| !e.is_empty()) {
                Some(endpoint) => {
                    let url = reqwest::Url::parse(&endpoint).with_context(|| {
                        format!("--otlp-endpoint (OTEL_EXPORTER_OTLP_ENDPOINT): {endpoint:?} is not a URL")
                    })?;
                    anyhow::ensure!(
                        matches!(url.scheme(), "http" | "https"),
                        "--otlp-endpoint (OTEL_EXPORTER_OTLP_ENDPOINT): {endpoint:?} is not an http(s) URL"
                    );
                    Some(OtlpSettings {
                        endpoint,
                        service_name: self.otel_service_name,
                    })
                }
                None => None,
            },
        })
    }
}

/// The variable holding the Kafka signing keys themselves: environment only, so they are
/// in no `ps` listing, and so they can come with the other `ASYNCD_KAFKA_*` variables
/// from the chart's Kafka Secret, which the operator also gives its dispatchers.
const KAFKA_SIGNING_KEY: &str = "ASYNCD_KAFKA_SIGNING_KEY";

/// The Kafka signing keys from `--kafka-signing-key-file` or `ASYNCD_KAFKA_SIGNING_KEY`
/// (`from_env`, its value if set), at most one of them. An empty file or variable is
/// refused rather than taken as "unsigned": a Secret that lost its key must not quietly
/// turn the check off.
fn kafka_signing_keys(
    file: Option<PathBuf>,
    from_env: Option<String>,
) -> anyhow::Result<Option<asyncd::kafka::MessageKeys>> {
    const FLAG: &str = "--kafka-signing-key-file (ASYNCD_KAFKA_SIGNING_KEY_FILE)";
    match (file, from_env) {
        (Some(_), Some(_)) => {
            anyhow::bail!("{FLAG} and {KAFKA_SIGNING_KEY} are both set; set one of them")
        }
        (Some(path), None) => {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("{FLAG}: reading {}", path.display()))?;
            let keys = asyncd::kafka::MessageKeys::parse(&text)
                .with_context(|| format!("{FLAG}: {}", path.display()))?;
            Ok(Some(keys))
        }
        (None, Some(text)) => Ok(Some(
            asyncd::kafka::MessageKeys::parse(&text).context(KAFKA_SIGNING_KEY)?,
        )),
        (None, None) => Ok(None),
    }
}

/// `<instance>-<pid>-<random>`: unique per process start, readable in logs and headers.
fn instance_name(instance: Option<String>) -> String {
    let base = instance
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "asyncd".into());
    format!(
        "{base}-{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

fn main() -> ExitCode {
    // Each runtime thread hands mimalloc's freed pages back as it goes idle.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(asyncd_allocator::thread_going_idle)
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(run()),
        Err(err) => {
            eprintln!("asyncd could not start its runtime: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> ExitCode {
    let cli = Cli::parse();
    asyncd::logging::init(cli.log_format, "info");
    // reqwest brings rustls with aws-lc-rs and kube with ring; with both compiled in,
    // rustls cannot pick a process default on its own, and the Kubernetes client needs one.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    match serve(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // The role has already stopped every part; say why, and exit non-zero so the
            // supervisor (Kubernetes, systemd) restarts or reports it.
            tracing::error!("asyncd stopped: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(cli: Cli) -> anyhow::Result<()> {
    let (settings, parts) = match cli.role {
        Role::HashToken => {
            let mut token = String::new();
            std::io::stdin()
                .read_line(&mut token)
                .context("reading the token from stdin")?;
            let token = token.trim_end_matches(['\r', '\n']);
            anyhow::ensure!(!token.is_empty(), "no token on stdin");
            println!("{}", asyncd::auth::tokens::hash(token));
            return Ok(());
        }
        Role::Migrate { store, store_wait } => {
            wiring::migrate(&store.url()?, store_wait)
                .await
                .context("migrate")?;
            println!("migrations applied");
            return Ok(());
        }
        Role::Dev { db, common } => (
            // An embedded database is never "restarting": fail at once.
            common.settings(
                format!("sqlite://{}", db.display()),
                Duration::ZERO,
                asyncd_store::CALL_TIMEOUT,
                true,
            )?,
            Parts::ALL,
        ),
        Role::Api(s) => (
            s.common
                .settings(s.store.url()?, s.store_wait, s.store_timeout, false)?,
            Parts {
                api: true,
                dispatcher: false,
                scheduler: false,
            },
        ),
        Role::Dispatcher(s) => (
            s.common
                .settings(s.store.url()?, s.store_wait, s.store_timeout, false)?,
            Parts {
                api: false,
                dispatcher: true,
                scheduler: false,
            },
        ),
        Role::Scheduler(s) => (
            s.common
                .settings(s.store.url()?, s.store_wait, s.store_timeout, false)?,
            Parts {
                api: false,
                dispatcher: false,
                scheduler: true,
            },
        ),
    };
    let stop_bound = settings.dispatcher.shutdown_grace + STOP_MARGIN;
    let shutdown = CancellationToken::new();
    let role = async {
        let result = tokio::select! {
            result = wiring::run(settings, parts, shutdown.clone()) => Some(result),
            () = async {
                shutdown.cancelled().await;
                tokio::time::sleep(stop_bound).await;
            } => None,
        };
        // Ends the signal handler too when the role stopped on its own.
        shutdown.cancel();
        result
    };
    let signals = async {
        let installed = wiring::cancel_on_signal(shutdown.clone()).await;
        if installed.is_err() {
            // Without them SIGTERM would kill in-flight work; don't run at all.
            shutdown.cancel();
        }
        installed
    };
    let (role, signals) = tokio::join!(role, signals);
    signals.context("installing the signal handlers")?;
    let Some(role) = role else {
        tracing::error!(
            bound = ?stop_bound,
            "still stopping after the bound (a store or broker that does not answer?): \
             exiting; what was not written comes back when its lease lapses"
        );
        // Not a return: dropping the runtime would wait for the very calls that hang.
        std::process::exit(1);
    };
    role.context("role")?;
    Ok(())
}

/// How long after `--shutdown-grace` a stopping role may take to hand back its claims and
/// write its outcomes before the process exits anyway: a store or broker that stopped
/// answering (a black hole, no reset) would otherwise hold those writes, and the
/// process, for as long as the TCP connection lasts. Nothing is lost by it: a task whose
/// outcome was not written is leased, and runs again when the lease lapses.
const STOP_MARGIN: Duration = Duration::from_secs(15);

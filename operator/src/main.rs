//! `asyncd-operator`: reconciles AsyncJobConfigs into Kafka topics, the routing ConfigMap,
//! dispatcher Deployments and HPAs. Kubeconfig from `KUBECONFIG` (or `~/.kube/config`),
//! else the in-cluster service account.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use asyncd_kafka_admin::KafkaSecurity;
use asyncd_operator::builders::{self, DispatcherSettings};
use asyncd_operator::kafka::{Broker, KafkaAdmin, TopicOwners};
use asyncd_operator::leader::{Elector, LeaseSettings};
use asyncd_operator::metrics::Metrics;
use asyncd_operator::policy::{DEFAULT_MAX_PARTITIONS, DEFAULT_MAX_REPLICAS, Policy};
use asyncd_operator::usage::{self, UsageSource};
use asyncd_operator::{controller, telemetry};
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use clap::Parser;
use ipnet::IpNet;
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(
    name = "asyncd-operator",
    version,
    about = "Reconciles asyncd AsyncJobConfig resources"
)]
struct Args {
    /// How log lines look: `text` (colour only on a terminal) or `json` (one object per
    /// line). The filter is ASYNCD_LOG.
    #[arg(long, env = "ASYNCD_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: telemetry::LogFormat,
    /// Kafka bootstrap servers, for topic admin and for the dispatchers.
    #[arg(long, env = "ASYNCD_KAFKA_BROKERS")]
    kafka_brokers: String,
    /// Image of the dispatcher Deployments (the `asyncd` binary).
    #[arg(long, env = "ASYNCD_DISPATCHER_IMAGE")]
    dispatcher_image: String,
    /// imagePullPolicy of the dispatcher containers (default: the cluster's).
    #[arg(long, env = "ASYNCD_DISPATCHER_IMAGE_PULL_POLICY")]
    dispatcher_image_pull_policy: Option<String>,
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "ASYNCD_WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "ASYNCD_OPERATOR_LISTEN", default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// Replication factor of created topics; -1 takes the broker's default.
    #[arg(long, env = "ASYNCD_KAFKA_REPLICATION_FACTOR", default_value_t = -1, allow_hyphen_values = true)]
    kafka_replication_factor: i32,
    /// The compacted topic where the broker keeps each topic's owner
    /// (`namespace/config`); created when missing. Only the operator (and an admin
    /// assigning a topic) may write it: docs/security.md, "Topic ownership".
    #[arg(long, env = "ASYNCD_TOPIC_OWNERS_TOPIC", default_value = asyncd_kafka_admin::owners::DEFAULT_REGISTRY)]
    topic_owners_topic: String,
    /// Most partitions a config may ask (`spec.kafka.partitions`); the CRD's maximum is
    /// the ceiling.
    #[arg(long, env = "ASYNCD_MAX_PARTITIONS", default_value_t = DEFAULT_MAX_PARTITIONS)]
    max_partitions: u32,
    /// Most dispatcher replicas a config may ask (`spec.scaling.minReplicas` and
    /// `maxReplicas`); also caps the default maxReplicas (the partitions).
    #[arg(long, env = "ASYNCD_MAX_REPLICAS", default_value_t = DEFAULT_MAX_REPLICAS)]
    max_replicas: u32,
    /// A config naming a topic that exists without an owner record takes it, instead of
    /// being refused with TopicNotOwned. For one run after upgrading from an operator that
    /// kept no records; leave it off otherwise.
    #[arg(long, env = "ASYNCD_ADOPT_UNOWNED_TOPICS")]
    adopt_unowned_topics: bool,
    /// Address ranges the dispatchers' executors may not be at (CIDRs; repeatable, or
    /// comma-separated), on top of the dispatcher's own policy in a pod: link-local,
    /// loopback and the API server's service address (docs/security.md, "Executor URL
    /// policy"). Each dispatcher gets them as ASYNCD_EXECUTOR_DENY_CIDRS.
    #[arg(
        long,
        env = "ASYNCD_EXECUTOR_DENY_CIDRS",
        value_delimiter = ',',
        value_parser = builders::cidr
    )]
    executor_deny_cidrs: Vec<IpNet>,
    /// Address ranges the dispatchers' executors may be at even where a denied range,
    /// the dispatcher's own included, holds them (CIDRs; repeatable, or comma-separated).
    /// Each dispatcher gets them as ASYNCD_EXECUTOR_ALLOW_CIDRS.
    #[arg(
        long,
        env = "ASYNCD_EXECUTOR_ALLOW_CIDRS",
        value_delimiter = ',',
        value_parser = builders::cidr
    )]
    executor_allow_cidrs: Vec<IpNet>,
    /// How long a dispatcher waits for any one answer from the store before it counts the
    /// store unavailable (each dispatcher's ASYNCD_STORE_TIMEOUT; unset: asyncd's default,
    /// 10 s): the longest a dead network path to the database goes unnoticed.
    #[arg(long, env = "ASYNCD_DISPATCHER_STORE_TIMEOUT", value_parser = asyncd_spec::parse_duration)]
    dispatcher_store_timeout: Option<std::time::Duration>,
    /// Secret (in each config's namespace) whose `url` key is the dispatchers' store URL.
    #[arg(long, default_value = "asyncd-store")]
    store_secret: String,
    /// ServiceAccount the dispatchers run as (see config/rbac/dispatcher.yaml).
    #[arg(long, default_value = "asyncd-dispatcher")]
    dispatcher_service_account: String,
    /// Secret (in each config's namespace) of ASYNCD_KAFKA_* settings (TLS, SASL) the
    /// dispatchers get as environment variables. The operator's own Kafka client reads
    /// the same variables from its own environment.
    #[arg(long, env = "ASYNCD_DISPATCHER_KAFKA_SECRET")]
    dispatcher_kafka_secret: Option<String>,
    /// Run several replicas: only the one holding the Lease reconciles, the others stand
    /// by (ready, not reconciling) and take over when it goes.
    #[arg(long, env = "ASYNCD_LEADER_ELECT")]
    leader_elect: bool,
    /// Namespace of the Lease (default: --namespace, else the pod's own namespace).
    #[arg(long, env = "ASYNCD_LEADER_ELECTION_NAMESPACE")]
    leader_election_namespace: Option<String>,
    /// Name of the Lease.
    #[arg(
        long,
        env = "ASYNCD_LEADER_ELECTION_ID",
        default_value = "asyncd-operator"
    )]
    leader_election_id: String,
    /// This replica's identity in the Lease (default: the host name, i.e. the pod name);
    /// `_<nonce>` is appended, so each process is a new holder.
    #[arg(long, env = "POD_NAME")]
    leader_identity: Option<String>,
    /// Seconds a standby waits on a Lease whose holder stopped renewing before taking it.
    #[arg(long, default_value_t = 15)]
    lease_duration_seconds: u64,
    /// Seconds the leader keeps trying to renew before it gives leadership up.
    #[arg(long, default_value_t = 10)]
    renew_deadline_seconds: u64,
    /// Seconds between tries to take or renew the Lease.
    #[arg(long, default_value_t = 2)]
    retry_period_seconds: u64,
    /// asyncd's API (`http://asyncd-api.asyncd-system:8080`): where the operator reads
    /// the attempts running under each AsyncLimiter for its `status.running` (the RUNNING
    /// column). Unset: that column stays empty.
    #[arg(long, env = "ASYNCD_API_URL")]
    asyncd_api_url: Option<String>,
    /// File holding the bearer token for asyncd's API (a projected ServiceAccount token
    /// with audience `asyncd`), re-read on each call. It needs `get` on the jobs'
    /// `asyncjobconfigs/tasks` (config/rbac/operator.yaml).
    #[arg(long, env = "ASYNCD_API_TOKEN_FILE")]
    asyncd_api_token_file: Option<std::path::PathBuf>,
    /// How often the limiters' usage is read and written.
    #[arg(long, env = "ASYNCD_USAGE_INTERVAL", default_value = "15s", value_parser = asyncd_spec::parse_duration)]
    usage_interval: Duration,
}

/// The namespace this pod runs in, from its ServiceAccount mount.
fn own_namespace() -> Option<String> {
    std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// A few hex digits that differ between processes (pid and start time).
fn process_nonce() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{:08x}", nanos ^ std::process::id().rotate_left(16))
}

fn host_name() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

#[derive(Clone)]
struct Http {
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    standby: Arc<AtomicBool>,
}

async fn render_metrics(State(http): State<Http>) -> String {
    http.metrics.render()
}

async fn readyz(State(http): State<Http>) -> (StatusCode, &'static str) {
    // a standby replica is healthy and ready to take over; it reconciles nothing
    if http.standby.load(Ordering::SeqCst) {
        (StatusCode::OK, "standby\n")
    } else if http.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    telemetry::init(args.log_format);
    // kube's TLS needs a process-level rustls provider; a workspace build compiles in two
    // (kube's ring, the dispatcher's aws-lc-rs) and rustls refuses to pick one itself.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    let client = kube::Client::try_default()
        .await
        .context("no kubeconfig (KUBECONFIG, ~/.kube/config) and not in a cluster")?;
    let kafka_security = KafkaSecurity::from_env().context("Kafka security settings")?;
    let admin = KafkaAdmin::new(
        &args.kafka_brokers,
        &kafka_security,
        "asyncd-operator",
        args.kafka_replication_factor,
        Duration::from_secs(15),
    )
    .context("kafka admin client")?;
    let owners = TopicOwners::new(
        &args.kafka_brokers,
        &kafka_security,
        &args.topic_owners_topic,
        Duration::from_secs(15),
    )
    .context("kafka owner registry client")?;
    let broker = Arc::new(Broker::new(admin, owners));
    // ready before the first config needs it, without holding up the start
    tokio::spawn({
        let broker = broker.clone();
        async move {
            if let Err(err) = broker.registry().await {
                tracing::warn!(%err, "topic owner registry not ready yet; retried on first use");
            }
        }
    });
    let policy = Policy {
        max_partitions: args.max_partitions,
        max_replicas: args.max_replicas,
        adopt_unowned_topics: args.adopt_unowned_topics,
    };
    let settings = DispatcherSettings {
        image: args.dispatcher_image,
        image_pull_policy: args.dispatcher_image_pull_policy,
        kafka_brokers: args.kafka_brokers,
        store_secret: args.store_secret,
        service_account: args.dispatcher_service_account,
        kafka_secret: args.dispatcher_kafka_secret,
        executor_deny_cidrs: args.executor_deny_cidrs,
        executor_allow_cidrs: args.executor_allow_cidrs,
        store_timeout: args.dispatcher_store_timeout,
    };
    let usage = args
        .asyncd_api_url
        .as_deref()
        .map(|url| UsageSource::new(url, args.asyncd_api_token_file.clone()))
        .transpose()
        .context("asyncd API client")?;
    let metrics = Arc::new(Metrics::default());
    let ready = Arc::new(AtomicBool::new(false));
    let standby = Arc::new(AtomicBool::new(args.leader_elect));

    let http = Http {
        metrics: metrics.clone(),
        ready: ready.clone(),
        standby: standby.clone(),
    };
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(http);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    tracing::info!(listen = %args.listen, "serving /metrics, /healthz, /readyz");
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let elector = if args.leader_elect {
        let namespace = args
            .leader_election_namespace
            .or_else(|| args.namespace.clone())
            .or_else(own_namespace)
            .context("--leader-elect needs --leader-election-namespace outside a pod")?;
        let identity = args.leader_identity.or_else(host_name).context(
            "--leader-elect needs --leader-identity (POD_NAME) when there is no host name",
        )?;
        // one identity per process, as client-go does: a container restarted in the same
        // pod must not take the Lease back as if it had never stopped renewing it
        let identity = format!("{identity}_{}", process_nonce());
        let elector = Elector::new(
            client.clone(),
            LeaseSettings {
                namespace,
                name: args.leader_election_id,
                identity,
                lease_duration: Duration::from_secs(args.lease_duration_seconds.max(1)),
                renew_deadline: Duration::from_secs(args.renew_deadline_seconds.max(1)),
                retry_period: Duration::from_secs(args.retry_period_seconds.max(1)),
            },
        );
        metrics.leader.set(0);
        // stand by until this replica holds the Lease (or the pod is told to stop)
        tokio::select! {
            _ = elector.acquire() => {}
            _ = shutdown.cancelled() => {
                server.abort();
                return Ok(());
            }
        }
        standby.store(false, Ordering::SeqCst);
        Some(elector)
    } else {
        None
    };
    metrics.leader.set(1);

    // only the leader writes usage, as it reconciles; it stops on the same signal
    let usage_loop = {
        let (client, namespace) = (client.clone(), args.namespace.clone());
        let (metrics, shutdown) = (metrics.clone(), shutdown.clone());
        async move {
            if let Some(source) = usage {
                usage::run(
                    client,
                    source,
                    namespace,
                    args.usage_interval,
                    metrics,
                    shutdown,
                )
                .await;
            }
        }
    };
    let run = controller::run(
        client,
        broker,
        settings,
        policy,
        args.namespace,
        metrics.clone(),
        ready,
        shutdown.clone(),
    );
    let run = async {
        tokio::join!(usage_loop, async {
            tokio::select! {
                () = run => {}
                () = async {
                    shutdown.cancelled().await;
                    tokio::time::sleep(SHUTDOWN_BOUND).await;
                } => {
                    tracing::warn!(
                        bound = ?SHUTDOWN_BOUND,
                        "the controller had not stopped after SIGTERM (watches or reconciles waiting on the API server): stopping without it"
                    );
                }
            }
        });
    };
    match &elector {
        None => run.await,
        Some(elector) => {
            tokio::select! {
                // the controller returns on SIGTERM / Ctrl-C: hand the Lease over at once
                _ = run => elector.release().await,
                _ = elector.hold() => {
                    // someone else may lead now: stop reconciling at once; the restarted
                    // pod stands by again
                    metrics.leader.set(0);
                    server.abort();
                    anyhow::bail!("lost the leader Lease");
                }
            }
        }
    }
    server.abort();
    Ok(())
}

/// How long after SIGTERM the operator waits for the reconciles in progress before it
/// stops without them: one waiting on an API server that does not answer would otherwise
/// hold it as long as that lasts (a supervisor outside a cluster waits forever). Well
/// within a pod's default 30 s grace period; an interrupted reconcile is redone by the
/// next leader, since each one is idempotent.
const SHUTDOWN_BOUND: Duration = Duration::from_secs(10);

/// Cancels `shutdown` on SIGTERM or Ctrl-C.
async fn cancel_on_signal(shutdown: CancellationToken) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("stopping");
    shutdown.cancel();
}

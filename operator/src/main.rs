//! `asyncd-operator`: reconciles AsyncJobConfigs into Kafka topics, the routing ConfigMap,
//! dispatcher Deployments and HPAs. Kubeconfig from `KUBECONFIG` (or `~/.kube/config`),
//! else the in-cluster service account.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use asyncd_kafka_admin::KafkaSecurity;
use asyncd_operator::builders::DispatcherSettings;
use asyncd_operator::kafka::KafkaAdmin;
use asyncd_operator::metrics::Metrics;
use asyncd_operator::{controller, telemetry};
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "asyncd-operator",
    version,
    about = "Reconciles asyncd AsyncJobConfig resources"
)]
struct Args {
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
}

#[derive(Clone)]
struct Http {
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
}

async fn render_metrics(State(http): State<Http>) -> String {
    http.metrics.render()
}

async fn readyz(State(http): State<Http>) -> (StatusCode, &'static str) {
    if http.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    telemetry::init();
    let args = Args::parse();
    // kube's TLS needs a process-level rustls provider; a workspace build compiles in two
    // (kube's ring, the dispatcher's aws-lc-rs) and rustls refuses to pick one itself.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
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
    let settings = DispatcherSettings {
        image: args.dispatcher_image,
        image_pull_policy: args.dispatcher_image_pull_policy,
        kafka_brokers: args.kafka_brokers,
        store_secret: args.store_secret,
        service_account: args.dispatcher_service_account,
        kafka_secret: args.dispatcher_kafka_secret,
    };
    let metrics = Arc::new(Metrics::default());
    let ready = Arc::new(AtomicBool::new(false));

    let http = Http {
        metrics: metrics.clone(),
        ready: ready.clone(),
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

    controller::run(
        client,
        Arc::new(admin),
        settings,
        args.namespace,
        metrics,
        ready,
    )
    .await;
    server.abort();
    Ok(())
}

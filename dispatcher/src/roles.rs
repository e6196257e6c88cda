//! Wiring: which parts each role runs, and the shutdown they share.
//!
//! Every part takes the same [`CancellationToken`]; SIGTERM or Ctrl-C cancels it, the
//! API stops accepting, the dispatcher hands back what it has not started and waits for
//! what it has, and the role returns once every part has finished.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::api::{self, ApiState, submit::Limits};
use crate::clock::{SharedClock, SystemClock};
use crate::dispatcher::{ClaimerWakeup, Dispatcher, DispatcherConfig};
use crate::executor::ExecutorClient;
use crate::kafka::{self, Producer};
use crate::metrics::Metrics;
use crate::rescuer::Rescuer;
use crate::routing::{self, Routes};
use crate::scheduler::Scheduler;
use crate::store::{self, Store};

/// Where the job table comes from.
#[derive(Debug, Clone)]
pub enum RoutingSource {
    Dir(PathBuf),
    /// `NAMESPACE/NAME` of the operator's routing ConfigMap.
    ConfigMap(String),
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

#[derive(Debug, Clone)]
pub struct Settings {
    pub store_url: String,
    pub routing: RoutingSource,
    /// Serve only this job (`--job`).
    pub job: Option<String>,
    pub listen: SocketAddr,
    /// Where executors call back; defaults to `http://<listen>`.
    pub advertise_url: Option<String>,
    pub dispatcher: DispatcherConfig,
    pub max_payload_bytes: usize,
    /// Tasks due within this go through Kafka (when the job has a topic).
    pub kafka_threshold: Duration,
    pub kafka_brokers: Option<String>,
    pub create_topics: bool,
    pub kafka_horizon: Duration,
    pub reload_interval: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Routing(#[from] routing::RoutingError),
    #[error(transparent)]
    RoutingConfigMap(#[from] routing::configmap::ConfigMapError),
    #[error("Kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
}

/// Cancels `token` on SIGTERM or Ctrl-C.
pub fn cancel_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler installs");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        tracing::info!("shutting down");
        token.cancel();
    });
}

pub async fn migrate(store_url: &str) -> Result<(), RoleError> {
    store::open(store_url).await?.migrate().await?;
    Ok(())
}

/// Runs the chosen parts until `shutdown`.
pub async fn run(
    settings: Settings,
    parts: Parts,
    shutdown: CancellationToken,
) -> Result<(), RoleError> {
    let store: Arc<dyn Store> = store::open(&settings.store_url).await?;
    store.migrate().await?;
    let routes: Routes = match &settings.routing {
        RoutingSource::Dir(dir) => routing::watch_dir(
            dir.clone(),
            settings.job.clone(),
            settings.reload_interval,
            shutdown.clone(),
        )?,
        RoutingSource::ConfigMap(reference) => {
            routing::configmap::watch_configmap(reference, settings.job.clone(), shutdown.clone())
                .await?
        }
    };
    let metrics = Arc::new(Metrics::new());
    let clock: SharedClock = Arc::new(SystemClock);
    let waker = parts.dispatcher.then(ClaimerWakeup::default);
    let mut tasks = JoinSet::new();

    // Bind before starting anything else so a taken port fails start-up cleanly.
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .map_err(|e| RoleError::Listen(settings.listen, e))?;
    let local = listener
        .local_addr()
        .map_err(|e| RoleError::Listen(settings.listen, e))?;
    tracing::info!(%local, "listening");
    let state = Arc::new(ApiState {
        store: store.clone(),
        routes: routes.clone(),
        metrics: metrics.clone(),
        clock: clock.clone(),
        waker: waker.clone(),
        lookahead_ms: settings.dispatcher.lookahead.as_millis() as i64,
        limits: Limits {
            max_payload_bytes: settings.max_payload_bytes,
        },
        kafka: match (&settings.kafka_brokers, parts.api) {
            (Some(brokers), true) => Some(Producer::new(brokers, settings.kafka_threshold)?),
            _ => None,
        },
    });
    if parts.api
        && settings.create_topics
        && let Some(brokers) = &settings.kafka_brokers
    {
        tasks.spawn(kafka::create_topics(
            brokers.clone(),
            routes.clone(),
            shutdown.clone(),
        ));
    }
    // Roles without the API still serve /metrics and the health endpoints.
    let app = api::router(state);
    let api_shutdown = shutdown.clone();
    tasks.spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move { api_shutdown.cancelled().await })
            .await;
        if let Err(err) = served {
            tracing::error!(%err, "HTTP server failed");
        }
    });

    if parts.dispatcher {
        let callback = settings
            .advertise_url
            .clone()
            .unwrap_or_else(|| format!("http://{local}"));
        let dispatcher = Dispatcher::new(
            store.clone(),
            routes.clone(),
            metrics.clone(),
            clock.clone(),
            ExecutorClient::new(callback, settings.dispatcher.owner.clone()),
            settings.dispatcher.clone(),
            waker.clone().unwrap_or_default(),
            shutdown.clone(),
        );
        if let Some(brokers) = &settings.kafka_brokers {
            let config = kafka::ConsumerConfig {
                brokers: brokers.clone(),
                owner: settings.dispatcher.owner.clone(),
                horizon: settings.kafka_horizon,
                hold: settings.dispatcher.hold,
                create_topics: settings.create_topics,
            };
            tasks.spawn(kafka::supervise(
                config,
                routes.clone(),
                store.clone(),
                dispatcher.sink(),
                clock.clone(),
                metrics.clone(),
                shutdown.clone(),
            ));
        }
        tasks.spawn(dispatcher.run());
        let rescuer = Rescuer {
            store: store.clone(),
            routes: routes.clone(),
            metrics: metrics.clone(),
            clock: clock.clone(),
            interval: Duration::from_millis(500),
        };
        tasks.spawn(rescuer.run(shutdown.clone()));
        tasks.spawn(crate::backlog::run(
            store.clone(),
            metrics.clone(),
            clock.clone(),
            Duration::from_secs(2),
            shutdown.clone(),
        ));
    }
    if parts.scheduler {
        let scheduler = Scheduler::new(store.clone(), routes.clone(), clock.clone(), waker.clone());
        tasks.spawn(scheduler.run(shutdown.clone()));
    }
    if !parts.api && !parts.dispatcher && !parts.scheduler {
        shutdown.cancel();
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

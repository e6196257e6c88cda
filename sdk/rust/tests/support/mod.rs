//! Test harness: a real `asyncd dev` process (see [`asyncd_bin`]) on a free
//! loopback port, with job configs pointing at the test's [`Executor`] served on
//! loopback. Waits are conditions with deadlines, never fixed sleeps.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use asyncd_client::{Client, Executor, TaskContext, TaskState, TaskStatus};
use chrono::{DateTime, Utc};
use serde_json::Value;

pub const DEADLINE: Duration = Duration::from_secs(20);
pub const SECRET: &str = "rust-it-signing-secret";
/// The signing Secret (a folder under `--signing-dir`, as the operator mounts it) whose
/// `key` is [`SECRET`].
pub const SECRET_NAME: &str = "rust-it-signing";
/// A signing Secret whose key the tests' executor does not know: its calls are refused
/// with 401.
pub const WRONG_SECRET_NAME: &str = "rust-it-wrong";

/// Polls `check` every 20 ms until it returns `Some`, or panics naming `what`.
pub async fn wait_for<T>(
    what: &str,
    deadline: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One executor call the tests' handlers saw.
#[derive(Debug, Clone)]
pub struct Run {
    pub ctx: TaskContext,
    pub payload: Value,
    pub at: DateTime<Utc>,
}

/// Every executor call the tests' handlers served, by task id.
#[derive(Clone, Default)]
pub struct Recorder(Arc<Mutex<HashMap<String, Vec<Run>>>>);

impl Recorder {
    pub fn add(&self, ctx: &TaskContext, payload: &Value) {
        self.0
            .lock()
            .unwrap()
            .entry(ctx.id.clone())
            .or_default()
            .push(Run {
                ctx: ctx.clone(),
                payload: payload.clone(),
                at: DateTime::<Utc>::from(SystemTime::now()),
            });
    }

    /// Every call of every task.
    pub fn all(&self) -> Vec<Run> {
        self.0.lock().unwrap().values().flatten().cloned().collect()
    }

    pub fn runs(&self, id: &str) -> Vec<Run> {
        self.0.lock().unwrap().get(id).cloned().unwrap_or_default()
    }

    pub async fn wait_runs(&self, id: &str, n: usize) -> Vec<Run> {
        wait_for(
            &format!("{n} executor calls for {id}"),
            DEADLINE,
            async || {
                let runs = self.runs(id);
                (runs.len() >= n).then_some(runs)
            },
        )
        .await
    }
}

/// A job of the test's config folder.
pub struct Job {
    pub task_type: &'static str,
    pub unique_key: Option<&'static str>,
    pub secret: &'static str,
    pub max_retries: u32,
    /// `executor.batch`: `maxTasks` and `maxWait`.
    pub batch: Option<(u32, &'static str)>,
    /// `kafka.topic`: the job's near-due tasks would go through Kafka. `asyncd dev`
    /// has no brokers, so its tasks still go to the store, but the API treats the job
    /// as Kafka-routed (e.g. a cancel naming it may be of a task not consumed yet).
    pub kafka_topic: Option<&'static str>,
    /// `spec.cron` entries: name and schedule (`CRON_TZ=… …`).
    pub cron: Vec<(&'static str, &'static str)>,
}

impl Job {
    pub fn new(task_type: &'static str) -> Self {
        Self {
            task_type,
            unique_key: None,
            secret: SECRET_NAME,
            max_retries: 2,
            batch: None,
            kafka_topic: None,
            cron: Vec::new(),
        }
    }

    /// A `spec.cron` entry: shown by `/v1/schedules` as a schedule with `source: config`.
    pub fn cron(mut self, name: &'static str, schedule: &'static str) -> Self {
        self.cron.push((name, schedule));
        self
    }

    /// Delivers the job's tasks in batch calls of up to `max_tasks`, waiting up to
    /// `max_wait` (humantime) to fill one.
    pub fn batch(mut self, max_tasks: u32, max_wait: &'static str) -> Self {
        self.batch = Some((max_tasks, max_wait));
        self
    }

    pub fn kafka(mut self, topic: &'static str) -> Self {
        self.kafka_topic = Some(topic);
        self
    }

    pub fn unique_key(mut self, template: &'static str) -> Self {
        self.unique_key = Some(template);
        self
    }

    pub fn secret(mut self, name: &'static str) -> Self {
        self.secret = name;
        self
    }

    fn yaml(&self, executor_base: &str) -> String {
        let batch = self.batch.map_or(String::new(), |(max_tasks, max_wait)| {
            format!("    batch:\n      maxTasks: {max_tasks}\n      maxWait: {max_wait}\n")
        });
        let mut doc = format!(
            "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata:\n  name: {name}-job\nspec:\n  taskType: {t}\n  executor:\n    url: {executor_base}/tasks/{t}\n    timeout: 10s\n    errorBodies: true\n{batch}    signing:\n      secretRef:\n        name: {secret}\n  retry:\n    maxRetries: {retries}\n    backoff: exponential\n    initialBackoff: 100ms\n    maxBackoff: 500ms\n",
            name = self.task_type.replace('_', "-"),
            t = self.task_type,
            secret = self.secret,
            retries = self.max_retries,
        );
        if let Some(template) = self.unique_key {
            doc.push_str(&format!("  uniqueKey: \"{template}\"\n"));
        }
        if let Some(topic) = self.kafka_topic {
            doc.push_str(&format!(
                "  kafka:\n    topic: {topic}\n    partitions: 1\n"
            ));
        }
        if !self.cron.is_empty() {
            doc.push_str("  cron:\n");
            for (name, schedule) in &self.cron {
                doc.push_str(&format!(
                    "    - name: {name}\n      schedule: \"{schedule}\"\n"
                ));
            }
        }
        doc
    }
}

/// The asyncd binary: `ASYNCD_BIN`, else the one `cargo test --workspace` built next to
/// this test, in whatever target folder. A missing one fails the test with directions
/// (never skips).
pub fn asyncd_bin() -> PathBuf {
    let path = match std::env::var_os("ASYNCD_BIN") {
        Some(bin) => PathBuf::from(bin),
        // target/debug/deps/integration-<hash> → target/debug/asyncd
        None => std::env::current_exe()
            .unwrap()
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("asyncd"),
    };
    assert!(
        path.is_file(),
        "no asyncd binary at {}: the integration tests run a real `asyncd dev`. Build it \
         (cargo build -p asyncd) or set ASYNCD_BIN to an asyncd binary",
        path.display()
    );
    path
}

/// A running `asyncd dev` with its own folder, database and port, and the tests'
/// executor served on loopback.
pub struct Dev {
    pub endpoint: String,
    pub client: Client,
    pub executor_base: String,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Dev {
    /// Serves `executor` on a loopback port, writes `jobs` pointing at it, and starts
    /// `asyncd dev`, returning once `/readyz` answers 200.
    pub async fn start(executor: Executor, jobs: &[Job]) -> Self {
        Self::start_with_args(executor, jobs, |_| Vec::new()).await
    }

    /// [`Dev::start`] with more `asyncd dev` arguments, made from the test's folder.
    pub async fn start_with_args(
        executor: Executor,
        jobs: &[Job],
        args: impl FnOnce(&std::path::Path) -> Vec<String>,
    ) -> Self {
        Self::start_app(executor.into_router(), jobs, args).await
    }

    /// [`Dev::start_with_args`] serving `app`: an executor's router, perhaps wrapped
    /// by the test to watch the calls.
    pub async fn start_app(
        app: axum::Router,
        jobs: &[Job],
        args: impl FnOnce(&std::path::Path) -> Vec<String>,
    ) -> Self {
        let bin = asyncd_bin();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let executor_base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("jobs");
        std::fs::create_dir(&config).unwrap();
        for job in jobs {
            std::fs::write(
                config.join(format!("{}.yaml", job.task_type)),
                job.yaml(&executor_base),
            )
            .unwrap();
        }
        let signing = dir.path().join("signing");
        for (name, key) in [
            (SECRET_NAME, SECRET),
            (WRONG_SECRET_NAME, "not-the-executor-secret"),
        ] {
            std::fs::create_dir_all(signing.join(name)).unwrap();
            std::fs::write(signing.join(name).join("key"), key).unwrap();
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let endpoint = format!("http://127.0.0.1:{port}");
        let log = std::fs::File::create(dir.path().join("asyncd.log")).unwrap();
        let child = Command::new(&bin)
            .arg("dev")
            .arg("--config")
            .arg(&config)
            .arg("--db")
            .arg(dir.path().join("asyncd.db"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(args(dir.path()))
            .arg("--signing-dir")
            .arg(&signing)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let mut dev = Dev {
            client: Client::builder()
                .endpoint(&endpoint)
                .service_name("rust-it")
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
            endpoint,
            executor_base,
            dir,
            child: Some(child),
        };
        let http = reqwest::Client::new();
        for path in ["/healthz", "/readyz"] {
            let url = format!("{}{path}", dev.endpoint);
            let start = Instant::now();
            loop {
                if let Some(status) = dev.child.as_mut().unwrap().try_wait().unwrap() {
                    panic!(
                        "asyncd dev exited ({status}) before {path} answered 200\n{}",
                        dev.log_tail()
                    );
                }
                if let Ok(resp) = http.get(&url).send().await
                    && resp.status().is_success()
                {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "GET {path} did not answer 200 within 60s\n{}",
                    dev.log_tail()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        dev
    }

    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("asyncd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Polls the task until it is in `state`, failing with its last seen shape.
    pub async fn wait_state(&self, id: &str, state: TaskState) -> TaskStatus {
        let start = Instant::now();
        loop {
            let got = self.client.get(id).await;
            if let Ok(task) = &got
                && task.state == state
            {
                return task.clone();
            }
            assert!(
                start.elapsed() < DEADLINE,
                "task {id} not {state} within {DEADLINE:?}: last {got:?}\nasyncd log:\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.endpoint))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A string no other test run uses.
pub fn uniq(prefix: &str) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{prefix}-{nanos}-{n}")
}

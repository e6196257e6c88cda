//! Test harness: the `dev` role in-process ([`InProcess`]: the test's runtime, a
//! `127.0.0.1:0` listener, a temp SQLite store, a [`ManualClock`] the test moves and test
//! signals it waits on), the real `asyncd dev` binary ([`Asyncd`], for the tests that
//! kill or signal a process), and a scripted HTTP executor that records every call.
//! Both runtimes answer the same [`Api`] helpers. Waits are conditions with deadlines.
//! The servers some tests need, and what a test does without one: [`backends`].
#![allow(dead_code)]

pub mod backends;
pub mod toxiproxy;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use asyncd::clock::{Clock, ManualClock};
use asyncd::dispatch::DispatcherConfig;
use asyncd::test_hooks::{Signal, TestSignals};
use asyncd::wiring::{self, Parts, RoleError, RoutingSource, Settings};
use asyncd_store::Millis;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

pub use backends::Service;

pub const DEADLINE: Duration = Duration::from_secs(20);

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

/// A port for a child process to listen on. Not one the kernel picks (that range,
/// 32768–60999 here, is also where outgoing connections get their ports, and with four
/// tests at a time one of them took a port between this check and the child's bind:
/// "Address already in use"), and not one of the test services' (all below 30000): one
/// of 61000–65535 found free, going round from a place set by the process id so that two
/// test binaries at once start apart.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 61_000;
    const SPAN: u32 = 65_536 - LOW;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id() * 97;
    for _ in 0..SPAN {
        let port = (LOW + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {LOW}..65536");
}

/// One call an executor received.
#[derive(Debug, Clone)]
pub struct Call {
    pub at: SystemTime,
    pub id: String,
    pub attempt: u32,
    pub lease_token: String,
    pub body: Value,
    pub raw: Vec<u8>,
    pub headers: HashMap<String, String>,
    /// The HTTP version the call came over.
    pub version: axum::http::Version,
}

pub struct Answer {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

impl Answer {
    pub fn status(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: String::new(),
        }
    }
    pub fn ok() -> Self {
        Self::status(200)
    }
    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
    pub fn with_body(mut self, body: impl Into<String>) -> Self {
        self.body = body.into();
        self
    }
}

type Script = Arc<dyn Fn(&Call) -> Answer + Send + Sync>;

/// A loopback HTTP executor answering by script.
#[derive(Clone)]
pub struct Executor {
    pub addr: SocketAddr,
    calls: Arc<Mutex<Vec<Call>>>,
    script: Arc<Mutex<Script>>,
}

impl Executor {
    pub async fn start(script: impl Fn(&Call) -> Answer + Send + Sync + 'static) -> Self {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Mutex<Script>> = Arc::new(Mutex::new(Arc::new(script)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (c, s) = (calls.clone(), script.clone());
        let app = axum::Router::new().fallback(
            move |version: axum::http::Version, headers: HeaderMap, body: Bytes| {
                let (calls, script) = (c.clone(), s.clone());
                async move {
                    let raw = body.to_vec();
                    let body: Value = serde_json::from_slice(&raw).unwrap_or(Value::Null);
                    let header = |name: &str| {
                        headers
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string()
                    };
                    let call = Call {
                        at: SystemTime::now(),
                        id: header("asyncd-task-id"),
                        attempt: header("asyncd-attempt").parse().unwrap_or(0),
                        lease_token: header("asyncd-lease-token"),
                        body,
                        raw,
                        headers: headers
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
                            .collect(),
                        version,
                    };
                    let script = script.lock().unwrap().clone();
                    let answer = script(&call);
                    calls.lock().unwrap().push(call);
                    let mut response: Response =
                        (StatusCode::from_u16(answer.status).unwrap(), answer.body).into_response();
                    for (name, value) in answer.headers {
                        response.headers_mut().insert(name, value.parse().unwrap());
                    }
                    response
                }
            },
        );
        // axum's server takes HTTP/1.1, and HTTP/2 by prior knowledge (h2c).
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self {
            addr,
            calls,
            script,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/run", self.addr)
    }

    pub fn set_script(&self, script: impl Fn(&Call) -> Answer + Send + Sync + 'static) {
        *self.script.lock().unwrap() = Arc::new(script);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn calls_for(&self, id: &str) -> Vec<Call> {
        self.calls().into_iter().filter(|c| c.id == id).collect()
    }

    /// Every call so far, grouped by task id, in arrival order.
    pub fn calls_by_task(&self) -> HashMap<String, Vec<Call>> {
        let mut by_task: HashMap<String, Vec<Call>> = HashMap::new();
        for call in self.calls() {
            by_task.entry(call.id.clone()).or_default().push(call);
        }
        by_task
    }

    pub async fn wait_calls(&self, id: &str, n: usize) -> Vec<Call> {
        wait_for(&format!("{n} calls for {id}"), DEADLINE, async || {
            let calls = self.calls_for(id);
            (calls.len() >= n).then_some(calls)
        })
        .await
    }
}

/// A job config document for the test's config folder.
/// Serves `app`, an executor written for one test, on a port of its own; its URL.
pub async fn serve_executor(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/run", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

pub fn job_yaml(name: &str, task_type: &str, url: &str, extra_spec: &str) -> String {
    format!(
        "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata:\n  name: {name}\nspec:\n  taskType: {task_type}\n  executor:\n    url: {url}\n    timeout: 5s\n{extra_spec}"
    )
}

/// The config folder of one job, `test-job`, running tasks of type `work` on `executor`.
pub fn one_job(executor: &Executor, extra_spec: &str) -> Vec<(&'static str, String)> {
    vec![(
        "job.yaml",
        job_yaml("test-job", "work", &executor.url(), extra_spec),
    )]
}

/// A running `asyncd dev` process with its own folder, database and port.
pub struct Asyncd {
    pub dir: tempfile::TempDir,
    pub addr: SocketAddr,
    pub child: Option<Child>,
    pub http: reqwest::Client,
    pub extra_args: Vec<String>,
    pub env: Vec<(String, String)>,
}

impl Asyncd {
    pub fn config_dir(&self) -> PathBuf {
        self.dir.path().join("jobs")
    }

    pub fn write_job(&self, file: &str, yaml: &str) {
        let path = self.config_dir().join(file);
        let tmp = self.config_dir().join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(tmp, path).unwrap();
    }

    /// Starts `asyncd dev` with the given job files.
    pub async fn start(jobs: &[(&str, String)], extra_args: &[&str]) -> Self {
        Self::start_with_env(jobs, extra_args, &[]).await
    }

    pub async fn start_with_env(
        jobs: &[(&str, String)],
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("jobs")).unwrap();
        let mut me = Self {
            dir,
            addr: SocketAddr::from(([127, 0, 0, 1], free_port())),
            child: None,
            http: reqwest::Client::new(),
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        for (file, yaml) in jobs {
            me.write_job(file, yaml);
        }
        me.spawn().await;
        me
    }

    pub async fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("asyncd.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_asyncd"))
            .arg("dev")
            .arg("--config")
            .arg(self.config_dir())
            .arg("--db")
            .arg(self.dir.path().join("asyncd.db"))
            .arg("--listen")
            .arg(self.addr.to_string())
            .args(&self.extra_args)
            .env("ASYNCD_LOG", "info")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("asyncd binary runs");
        self.child = Some(child);
        let url = self.url("/healthz");
        let http = self.http.clone();
        wait_for("asyncd /healthz", DEADLINE, async || {
            http.get(&url)
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
                .map(|_| ())
        })
        .await;
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("asyncd.log")).unwrap_or_default()
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
        }
    }

    /// SIGTERM, then wait for the process to exit.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        let child = self.child.take().expect("running");
        terminate(child, "asyncd", Duration::from_secs(40)).await
    }
}

/// SIGTERM to `child` (named `name`), then wait up to `deadline` for it to exit.
async fn terminate(mut child: Child, name: &str, deadline: Duration) -> std::process::ExitStatus {
    Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    let what = format!("{name} to exit after SIGTERM");
    wait_for(&what, deadline, async || child.try_wait().unwrap()).await
}

impl Drop for Asyncd {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The HTTP API of a running asyncd, in-process or not.
#[allow(async_fn_in_trait)]
pub trait Api {
    fn addr(&self) -> SocketAddr;
    fn http(&self) -> &reqwest::Client;

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr(), path)
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send_json(reqwest::Method::POST, path, body).await
    }

    async fn patch(&self, path: &str, body: Value) -> (u16, Value) {
        self.send_json(reqwest::Method::PATCH, path, body).await
    }

    async fn send_json(&self, method: reqwest::Method, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http()
            .request(method, self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// `body` as it is, sent as `application/json` (what it is meant to be).
    async fn post_raw(&self, path: &str, body: &str) -> (u16, Value) {
        let r = self
            .http()
            .post(self.url(path))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let r = self.http().get(self.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn delete(&self, path: &str) -> (u16, Value) {
        let r = self.http().delete(self.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn metrics(&self) -> String {
        self.http()
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Submits and asserts 201; returns the id.
    async fn submit(&self, body: Value) -> String {
        let (status, answer) = self.post("/v1/tasks", body.clone()).await;
        assert_eq!(status, 201, "submit {body} answered {answer}");
        answer["id"].as_str().unwrap().to_string()
    }

    async fn task(&self, id: &str) -> Value {
        let (status, task) = self.get(&format!("/v1/tasks/{id}")).await;
        assert_eq!(status, 200, "{task}");
        task
    }

    async fn wait_state(&self, id: &str, state: &str) -> Value {
        wait_for(&format!("task {id} to be {state}"), DEADLINE, async || {
            let task = self.task(id).await;
            (task["state"] == state).then_some(task)
        })
        .await
    }
}

impl Api for Asyncd {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
    fn http(&self) -> &reqwest::Client {
        &self.http
    }
}

/// When the in-process clock starts: a fixed instant, so ETAs in assertions are exact.
pub const T0: i64 = 1_800_000_000_000;

/// Moves `clock` on by a millisecond every 5 ms until the handle is aborted, for a test
/// that waits on retries due a millisecond after each refusal: time goes on as it would,
/// without the test stepping it.
pub fn tick_clock(clock: Arc<ManualClock>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            clock.advance(Duration::from_millis(1));
        }
    })
}

/// The `dev` role in the test's runtime: every part on a temp SQLite store, listening on
/// `127.0.0.1:0`, reading a [`ManualClock`] the test moves, and emitting test signals.
/// Cancelled when dropped.
pub struct InProcess {
    pub dir: tempfile::TempDir,
    pub addr: SocketAddr,
    pub http: reqwest::Client,
    pub clock: Arc<ManualClock>,
    pub signals: broadcast::Receiver<Signal>,
    shutdown: CancellationToken,
    role: Option<tokio::task::JoinHandle<Result<(), RoleError>>>,
    /// What the role was started with, for [`InProcess::restart`].
    settings: Settings,
}

impl InProcess {
    pub async fn start(jobs: &[(&str, String)]) -> Self {
        Self::start_with(jobs, |_| {}).await
    }

    /// Starts with `adjust` applied to the settings (payload limit, poll interval, …).
    pub async fn start_with(jobs: &[(&str, String)], adjust: impl FnOnce(&mut Settings)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("jobs")).unwrap();
        for (file, yaml) in jobs {
            std::fs::write(dir.path().join("jobs").join(file), yaml).unwrap();
        }
        let clock = ManualClock::at(chrono::DateTime::from_timestamp_millis(T0).unwrap());
        let (signals, receiver) = TestSignals::new();
        let mut settings = settings(&dir, clock.clone());
        settings.signals = Some(signals);
        adjust(&mut settings);
        let shutdown = CancellationToken::new();
        let running = wiring::start(settings.clone(), Parts::ALL, shutdown.clone())
            .await
            .expect("the dev role starts");
        let addr = running.addr();
        Self {
            dir,
            addr,
            http: reqwest::Client::new(),
            clock,
            signals: receiver,
            shutdown,
            role: Some(tokio::spawn(running.wait())),
            settings,
        }
    }

    /// Stops the role as SIGTERM would and starts it again on the same store, folder,
    /// clock and signals (a new listener address): a dispatcher restart.
    pub async fn restart(&mut self) {
        self.shutdown.cancel();
        let role = self.role.take().expect("running");
        tokio::time::timeout(DEADLINE, role)
            .await
            .expect("the role stops")
            .expect("the role task does not panic")
            .expect("the role ends cleanly");
        self.shutdown = CancellationToken::new();
        let running = wiring::start(self.settings.clone(), Parts::ALL, self.shutdown.clone())
            .await
            .expect("the dev role starts again");
        self.addr = running.addr();
        self.role = Some(tokio::spawn(running.wait()));
    }

    pub fn now(&self) -> i64 {
        self.clock.now_millis().as_i64()
    }

    pub fn write_job(&self, file: &str, yaml: &str) {
        let jobs = self.dir.path().join("jobs");
        let tmp = jobs.join(format!(".{file}.tmp"));
        std::fs::write(&tmp, yaml).unwrap();
        std::fs::rename(tmp, jobs.join(file)).unwrap();
    }

    /// The next signal `pick` accepts, skipping the others.
    pub async fn next<T>(&mut self, what: &str, mut pick: impl FnMut(Signal) -> Option<T>) -> T {
        let signals = &mut self.signals;
        let wait = async {
            loop {
                match signals.recv().await {
                    Ok(signal) => {
                        if let Some(found) = pick(signal) {
                            return found;
                        }
                    }
                    Err(err) => panic!("signals ended while waiting for {what}: {err}"),
                }
            }
        };
        tokio::time::timeout(DEADLINE, wait)
            .await
            .unwrap_or_else(|_| panic!("timed out after {DEADLINE:?} waiting for {what}"))
    }

    /// When the ticker handed `id` to its runner: `(eta, clock time)`.
    pub async fn dispatched(&mut self, id: &str) -> (i64, i64) {
        self.next(&format!("{id} dispatched"), |s| match s {
            Signal::Dispatched { id: got, eta, at } if got == id => {
                Some((eta.as_i64(), at.as_i64()))
            }
            _ => None,
        })
        .await
    }

    /// Waits until an outcome for `id` is recorded.
    pub async fn finished(&mut self, id: &str) {
        self.next(&format!("an outcome for {id}"), |s| match s {
            Signal::Finished { ids, .. } => ids.iter().any(|i| i == id).then_some(()),
            _ => None,
        })
        .await
    }

    /// Waits for `id` to wait for its next attempt (pending, or already claimed again) and
    /// moves the clock to its ETA; returns the ETA.
    pub async fn run_when_due(&self, id: &str) -> i64 {
        let task = wait_for(&format!("{id} to wait for a retry"), DEADLINE, async || {
            let task = self.task(id).await;
            matches!(task["state"].as_str(), Some("pending" | "claimed")).then_some(task)
        })
        .await;
        let eta = parse_time(&task["eta"]);
        self.clock.set_millis(Millis::new(eta));
        eta
    }

    /// Waits for a rescuer pass that read the clock at `at` or later.
    pub async fn rescue_pass(&mut self, at: i64) -> usize {
        self.next("a rescuer pass", |s| match s {
            Signal::Rescued { count, at: when } if when.as_i64() >= at => Some(count),
            _ => None,
        })
        .await
    }

    /// Waits for a retention pass that read the clock at `at` or later.
    pub async fn purge_pass(&mut self, at: i64) -> u64 {
        self.next("a retention pass", |s| match s {
            Signal::Purged { purged, at: when } if when.as_i64() >= at => Some(purged),
            _ => None,
        })
        .await
    }

    /// Stops the role and returns how it ended.
    pub async fn stop(mut self) -> Result<(), RoleError> {
        self.shutdown.cancel();
        let role = self.role.take().expect("running");
        tokio::time::timeout(DEADLINE, role)
            .await
            .expect("the role stops")
            .expect("the role task does not panic")
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Api for InProcess {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
    fn http(&self) -> &reqwest::Client {
        &self.http
    }
}

/// The `dev` role's settings for a test folder, as `asyncd dev` builds them from its
/// defaults, but polling often (the store is local) and on port 0.
pub fn settings(dir: &tempfile::TempDir, clock: Arc<ManualClock>) -> Settings {
    Settings {
        store_url: format!("sqlite://{}", dir.path().join("asyncd.db").display()),
        store_wait: Duration::from_secs(30),
        store_timeout: asyncd_store::CALL_TIMEOUT,
        routing: RoutingSource::Dir(dir.path().join("jobs")),
        job: None,
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        advertise_url: None,
        tls: None,
        dispatcher: DispatcherConfig {
            owner: format!("test-{}", uuid::Uuid::now_v7().simple()),
            poll_interval: Duration::from_millis(20),
            ..DispatcherConfig::default()
        },
        executor_addresses: asyncd::executor::AddressPolicy::local(),
        max_payload_bytes: 1024 * 1024,
        max_batch_body_bytes: 16 * 1024 * 1024,
        kafka_threshold: Duration::from_secs(600),
        kafka_brokers: None,
        kafka_security: Default::default(),
        kafka_delivery_timeout: Duration::from_secs(5),
        kafka_signing: None,
        create_topics: false,
        kafka_horizon: Duration::from_secs(30),
        reload_interval: Duration::from_millis(50),
        clock,
        signals: None,
        auth: asyncd::wiring::AuthSettings::None { insecure: false },
        browser: asyncd::wiring::BrowserSettings::default(),
        otlp: None,
    }
}
pub fn millis(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

pub fn parse_time(text: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(text.as_str().unwrap())
        .unwrap()
        .timestamp_millis()
}

pub fn task(task_type: &str, payload: Value) -> Value {
    json!({"type": task_type, "payload": payload})
}

/// A new, empty database on the server of `service` (MariaDB or PostgreSQL), or `None`
/// when the server is not there: the test skips ([`Service::address`]).
pub async fn fresh_database(service: Service) -> Option<String> {
    use sqlx::Connection;
    let server = service.address()?;
    let server = server.trim_end_matches('/').to_string();
    let name = format!("asyncd_mp_{}", uuid::Uuid::now_v7().simple());
    if server.starts_with("mysql:") {
        let mut conn = sqlx::MySqlConnection::connect(&server).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE {name} CHARACTER SET utf8mb4"
        )))
        .execute(&mut conn)
        .await
        .unwrap();
    } else {
        let mut conn = sqlx::PgConnection::connect(&format!("{server}/postgres"))
            .await
            .unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    Some(format!("{server}/{name}"))
}

/// Runs `asyncd migrate` on `store` and asserts that it succeeded.
pub fn migrate(store: &str) {
    let status = Command::new(env!("CARGO_BIN_EXE_asyncd"))
        .args(["migrate", "--store", store])
        .status()
        .unwrap();
    assert!(status.success(), "asyncd migrate");
}

/// One `asyncd` role process (api, dispatcher, scheduler) named by `ASYNCD_INSTANCE`,
/// its log in `dir`; restartable, and SIGKILLed when dropped.
pub struct Role {
    pub name: String,
    /// Where its /metrics answers.
    pub listen: String,
    args: Vec<String>,
    dir: PathBuf,
    child: Option<Child>,
}

impl Role {
    /// Starts role `name` (its subcommand is the part before any `-`, so two of one kind
    /// can be told apart: `dispatcher-2`) on `store` with the job configs in `config`, on
    /// a free port, with `extra` arguments.
    pub fn serve(
        name: &str,
        store: &str,
        config: &std::path::Path,
        dir: &std::path::Path,
        extra: &[&str],
    ) -> Self {
        let listen = format!("127.0.0.1:{}", free_port());
        let subcommand = name.split('-').next().unwrap_or(name);
        let config = config.display().to_string();
        let args = [
            subcommand, "--store", store, "--config", &config, "--listen", &listen,
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
        Self::start(name, &listen, args, dir)
    }

    pub fn start(name: &str, listen: &str, args: Vec<String>, dir: &std::path::Path) -> Self {
        let mut role = Self {
            name: name.into(),
            listen: listen.into(),
            args,
            dir: dir.to_path_buf(),
            child: None,
        };
        role.spawn();
        role
    }

    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", self.name)))
            .unwrap();
        self.child = Some(
            Command::new(env!("CARGO_BIN_EXE_asyncd"))
                .args(&self.args)
                .env("ASYNCD_LOG", "info")
                .env("ASYNCD_INSTANCE", &self.name)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
    }

    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// How the process ended, or `None` while it runs.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut()?.try_wait().unwrap()
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("{}.log", self.name))).unwrap_or_default()
    }

    /// SIGTERM, then wait up to `deadline` for the process to exit.
    pub async fn terminate(&mut self, deadline: Duration) -> std::process::ExitStatus {
        let child = self.child.take().expect("running");
        terminate(child, &self.name, deadline).await
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A TCP relay to a database server that a test can cut, as an outage looks to a client:
/// while cut, open connections are closed and new ones are closed as soon as accepted
/// (counted in `refused`). Or it can turn into a black hole, as a dead network path looks:
/// every connection, open or new, is held open and nothing more passes either way.
pub struct DbProxy {
    pub port: u16,
    up: Arc<std::sync::atomic::AtomicBool>,
    holes: Arc<std::sync::atomic::AtomicBool>,
    relays: Arc<Mutex<CancellationToken>>,
    pub refused: Arc<std::sync::atomic::AtomicUsize>,
}

impl DbProxy {
    /// Relays to the server of `database_url`, starting cut unless `up`.
    pub async fn start(database_url: &str, up: bool) -> Self {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let url = reqwest::Url::parse(database_url).unwrap();
        let target = SocketAddr::new(
            url.host_str().unwrap().parse().unwrap(),
            url.port().unwrap(),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(up));
        let holes = Arc::new(AtomicBool::new(false));
        let relays = Arc::new(Mutex::new(CancellationToken::new()));
        let refused = Arc::new(AtomicUsize::new(0));
        let (is_up, is_hole, tokens, count) =
            (up.clone(), holes.clone(), relays.clone(), refused.clone());
        tokio::spawn(async move {
            loop {
                let (mut client, _) = listener.accept().await.unwrap();
                if is_hole.load(Ordering::SeqCst) {
                    tokio::spawn(async move {
                        let _held = client;
                        std::future::pending::<()>().await
                    });
                    continue;
                }
                if !is_up.load(Ordering::SeqCst) {
                    count.fetch_add(1, Ordering::SeqCst);
                    continue; // dropped: closed
                }
                let cut = tokens.lock().unwrap().clone();
                let hole = is_hole.clone();
                tokio::spawn(async move {
                    let mut server = tokio::net::TcpStream::connect(target).await.unwrap();
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.cancelled() => {}
                    }
                    if hole.load(Ordering::SeqCst) {
                        // Both ends stay open; nothing passes.
                        let _held = (client, server);
                        std::future::pending::<()>().await
                    }
                });
            }
        });
        Self {
            port,
            up,
            holes,
            relays,
            refused,
        }
    }

    /// `database_url` with its port replaced by the proxy's.
    pub fn url(&self, database_url: &str) -> String {
        let mut url = reqwest::Url::parse(database_url).unwrap();
        url.set_port(Some(self.port)).unwrap();
        url.to_string()
    }

    pub fn cut(&self) {
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
        let mut relays = self.relays.lock().unwrap();
        relays.cancel();
        *relays = CancellationToken::new();
    }

    pub fn restore(&self) {
        self.up.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// From now on nothing passes, and every connection stays open: no reset, no answer.
    pub fn black_hole(&self) {
        self.holes.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut relays = self.relays.lock().unwrap();
        relays.cancel();
        *relays = CancellationToken::new();
    }
}

/// Waits until `addr` answers `/healthz` with a success.
pub async fn wait_healthy(http: &reqwest::Client, addr: &str) {
    let url = format!("http://{addr}/healthz");
    wait_for(&format!("{addr} healthy"), DEADLINE, async || {
        http.get(&url)
            .send()
            .await
            .ok()
            .filter(|r| r.status().is_success())
            .map(|_| ())
    })
    .await;
}

/// Where a test's asyncd runs.
#[derive(Debug, Clone, Copy)]
pub enum Backend {
    /// `asyncd dev`: every part in one process on SQLite.
    Sqlite,
    /// `asyncd api` and `asyncd dispatcher` as two processes, as a cluster runs them, on
    /// a fresh database of this server (MariaDB or PostgreSQL).
    Server(Service),
}

/// `asyncd api` and `asyncd dispatcher` processes on one fresh, migrated database; the
/// API answers at `addr`. Not started (`None`) when the server is not there.
pub struct Roles {
    pub addr: SocketAddr,
    pub http: reqwest::Client,
    pub api: Role,
    pub dispatcher: Role,
    pub store: String,
    /// Last, so the processes are killed before their folder goes.
    pub dir: tempfile::TempDir,
}

impl Roles {
    pub async fn start(server: Service, jobs: &[(&str, String)]) -> Option<Self> {
        let store = fresh_database(server).await?;
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("jobs");
        std::fs::create_dir(&config).unwrap();
        for (file, yaml) in jobs {
            std::fs::write(config.join(file), yaml).unwrap();
        }
        migrate(&store);
        let args = |role: &str, listen: &str| -> Vec<String> {
            vec![
                role.into(),
                "--store".into(),
                store.clone(),
                "--config".into(),
                config.display().to_string(),
                "--listen".into(),
                listen.into(),
            ]
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let api = Role::start(
            "api",
            &addr.to_string(),
            args("api", &addr.to_string()),
            dir.path(),
        );
        let listen = format!("127.0.0.1:{}", free_port());
        let dispatcher = Role::start(
            "dispatcher",
            &listen,
            args("dispatcher", &listen),
            dir.path(),
        );
        let http = reqwest::Client::new();
        wait_healthy(&http, &api.listen).await;
        wait_healthy(&http, &dispatcher.listen).await;
        Some(Self {
            addr,
            http,
            api,
            dispatcher,
            store,
            dir,
        })
    }
}

/// A test's asyncd on a [`Backend`]: the API, and the process serving it to kill and
/// start again. Not started (`None`) when the backend's server is not there.
pub enum Deployment {
    Dev(Asyncd),
    Roles(Roles),
}

impl Deployment {
    pub async fn start(backend: Backend, jobs: &[(&str, String)]) -> Option<Self> {
        Some(match backend {
            Backend::Sqlite => Self::Dev(Asyncd::start(jobs, &[]).await),
            Backend::Server(server) => Self::Roles(Roles::start(server, jobs).await?),
        })
    }

    /// SIGKILLs the process serving the API (`asyncd dev`, or `asyncd api` while the
    /// dispatcher goes on).
    pub fn kill9_api(&mut self) {
        match self {
            Self::Dev(asyncd) => asyncd.kill9(),
            Self::Roles(roles) => roles.api.kill9(),
        }
    }

    /// Starts the killed process again on the same store and waits until it answers.
    pub async fn respawn_api(&mut self) {
        match self {
            Self::Dev(asyncd) => asyncd.spawn().await,
            Self::Roles(roles) => {
                roles.api.spawn();
                wait_healthy(&roles.http, &roles.api.listen).await;
            }
        }
    }
}

impl Api for Deployment {
    fn addr(&self) -> SocketAddr {
        match self {
            Self::Dev(asyncd) => asyncd.addr,
            Self::Roles(roles) => roles.addr,
        }
    }
    fn http(&self) -> &reqwest::Client {
        match self {
            Self::Dev(asyncd) => &asyncd.http,
            Self::Roles(roles) => &roles.http,
        }
    }
}

/// The Kafka broker the tests share, held while a test uses it. One test restarts the
/// broker, which the others would see as an outage mid-test (a produce falling back to
/// the store, lag not reported): it holds the broker [`Broker::alone`], while the others
/// hold it [`Broker::shared`].
pub struct Broker {
    /// Its bootstrap servers.
    pub address: String,
    _held: BrokerHold,
}

enum BrokerHold {
    Shared(tokio::sync::RwLockReadGuard<'static, ()>),
    Alone(tokio::sync::RwLockWriteGuard<'static, ()>),
}

static BROKER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

impl Broker {
    /// The broker, beside the other tests using it; `None` when there is none: the test
    /// skips ([`Service::address`]).
    pub async fn shared() -> Option<Self> {
        let address = Service::Kafka.address()?;
        let held = BrokerHold::Shared(BROKER.read().await);
        Some(Self {
            address,
            _held: held,
        })
    }

    /// The broker, with no other test using it meanwhile.
    pub async fn alone() -> Option<Self> {
        let address = Service::Kafka.address()?;
        let held = BrokerHold::Alone(BROKER.write().await);
        Some(Self {
            address,
            _held: held,
        })
    }
}

/// Taken by the tests that run a cluster of asyncd processes — several dispatchers and
/// schedulers beside the API — and assert what load can break: that no lease lapsed on
/// a live dispatcher, that lateness stayed bounded. Each such test used to share its
/// binary's process with its own kind only; in one process two clusters would starve
/// each other on a small machine, so they take turns. (A Kafka test takes it after the
/// [`Broker`], never before.)
pub async fn cluster_turn() -> tokio::sync::MutexGuard<'static, ()> {
    static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    TURN.lock().await
}

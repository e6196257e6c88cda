//! The pieces every benchmark shares: a no-op HTTP executor that notes when each task
//! arrived, a release asyncd (`asyncd dev`, or `asyncd api` and `asyncd dispatcher` on a
//! server database) with its job in a temporary folder, and submit helpers.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use axum::body::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The no-op executor: answers 200 and notes (eta, arrival) of each call, and of the
/// one task whose payload is `{"probe": true}` its arrival and how many calls came
/// before it.
#[derive(Clone, Default)]
pub struct Sink {
    seen: Arc<Mutex<Vec<(i64, i64)>>>,
    probe: Arc<Mutex<Option<(i64, usize)>>>,
}

impl Sink {
    pub async fn serve(&self) -> Result<String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (seen, probe) = (self.seen.clone(), self.probe.clone());
        let app = axum::Router::new().fallback(move |body: Bytes| {
            let (seen, probe) = (seen.clone(), probe.clone());
            async move {
                let arrival = now_ms();
                let Ok(call) = serde_json::from_slice::<Value>(&body) else {
                    return String::new();
                };
                // A batch call (`executor.batch`) carries its tasks in `tasks`, and each
                // gets a result; a single call is one task.
                let batch = call["tasks"].as_array();
                let tasks = batch.map_or_else(|| vec![&call], |tasks| tasks.iter().collect());
                let mut seen = seen.lock().unwrap();
                for task in &tasks {
                    if task["payload"]["probe"] == true {
                        *probe.lock().unwrap() = Some((arrival, seen.len()));
                    }
                    if let Some(eta) = task["eta"].as_str()
                        && let Ok(eta) = chrono::DateTime::parse_from_rfc3339(eta)
                    {
                        seen.push((eta.timestamp_millis(), arrival));
                    }
                }
                match batch {
                    Some(_) => {
                        let results: Vec<Value> = tasks
                            .iter()
                            .map(|task| json!({"id": task["id"], "status": "success"}))
                            .collect();
                        json!({ "results": results }).to_string()
                    }
                    None => String::new(),
                }
            }
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(format!("http://{addr}/"))
    }

    /// The probe's arrival and how many calls came before it, once it came.
    pub fn probe(&self) -> Option<(i64, usize)> {
        *self.probe.lock().unwrap()
    }

    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    pub fn take(&self) -> Vec<(i64, i64)> {
        self.probe.lock().unwrap().take();
        std::mem::take(&mut *self.seen.lock().unwrap())
    }

    pub async fn wait_for(&self, n: usize, deadline: Duration) -> Result<Instant> {
        let start = Instant::now();
        while self.count() < n {
            if start.elapsed() > deadline {
                bail!(
                    "only {} of {n} tasks executed within {deadline:?}",
                    self.count()
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(Instant::now())
    }
}

/// How the asyncd under test runs.
#[derive(Clone, Copy)]
pub enum Topology<'a> {
    /// `asyncd dev`: every role in one process, on SQLite in the temporary folder.
    Dev,
    /// `asyncd api` and `asyncd dispatcher`, two processes on `store`, a migrated
    /// database, as a cluster runs them.
    Servers { store: &'a str },
}

/// A release asyncd with its job in a temporary folder.
pub struct Asyncd {
    /// The API's process first; the last one dispatches.
    children: Vec<Child>,
    pub base: String,
    dir: tempfile::TempDir,
}

impl Asyncd {
    /// `kafka`: brokers and topic, to route through Kafka.
    pub async fn start(
        executor_url: &str,
        http: &reqwest::Client,
        kafka: Option<(&str, &str)>,
    ) -> Result<Self> {
        Self::start_with(executor_url, http, kafka, "").await
    }

    /// [`Asyncd::start`] with `extra_spec` (indented YAML lines) added to the job's spec.
    pub async fn start_with(
        executor_url: &str,
        http: &reqwest::Client,
        kafka: Option<(&str, &str)>,
        extra_spec: &str,
    ) -> Result<Self> {
        Self::start_job(executor_url, "", 256, http, kafka, extra_spec).await
    }

    /// [`Asyncd::start_with`], with the job's `concurrency` and `executor_extra` (YAML
    /// flow members, e.g. `"batch: {maxTasks: 100}"`) added to its `executor`.
    pub async fn start_job(
        executor_url: &str,
        executor_extra: &str,
        concurrency: u32,
        http: &reqwest::Client,
        kafka: Option<(&str, &str)>,
        extra_spec: &str,
    ) -> Result<Self> {
        let job = Job {
            executor_url,
            executor_extra,
            concurrency,
            extra_spec,
        };
        Self::start_on(Topology::Dev, job, http, kafka).await
    }

    /// asyncd as `topology` says, serving `job`.
    pub async fn start_on(
        topology: Topology<'_>,
        job: Job<'_>,
        http: &reqwest::Client,
        kafka: Option<(&str, &str)>,
    ) -> Result<Self> {
        Self::launch(topology, job, http, kafka, false).await
    }

    /// `asyncd dev` serving `job`, logging every SQL statement it runs, with the rows
    /// it changed, as JSON lines for [`Asyncd::store_writes`]. The log costs time: for
    /// counting, not for timing.
    pub async fn start_counting_writes(job: Job<'_>, http: &reqwest::Client) -> Result<Self> {
        Self::launch(Topology::Dev, job, http, None, true).await
    }

    async fn launch(
        topology: Topology<'_>,
        job: Job<'_>,
        http: &reqwest::Client,
        kafka: Option<(&str, &str)>,
        log_statements: bool,
    ) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let jobs = dir.path().join("jobs");
        std::fs::create_dir(&jobs)?;
        std::fs::write(
            jobs.join("bench.yaml"),
            job.yaml(kafka.map(|(_, topic)| topic)),
        )?;
        let roles: &[&str] = match topology {
            Topology::Dev => &["dev"],
            Topology::Servers { .. } => &["api", "dispatcher"],
        };
        let binary = std::env::current_exe()?.with_file_name("asyncd");
        let mut asyncd = Self {
            children: Vec::new(),
            base: String::new(),
            dir,
        };
        for role in roles {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let mut command = Command::new(&binary);
            command.arg(role);
            match topology {
                Topology::Dev => {
                    command.arg("--db").arg(asyncd.db_path());
                }
                Topology::Servers { store } => {
                    command.env("ASYNCD_STORE", store);
                }
            }
            if let Some((brokers, _)) = kafka {
                command.args([
                    "--kafka-brokers",
                    brokers,
                    "--create-topics",
                    "--kafka-horizon",
                    "10m",
                ]);
            }
            if log_statements {
                command
                    .env("ASYNCD_LOG", "warn,sqlx::query=debug")
                    .env("ASYNCD_LOG_FORMAT", "json")
                    .stderr(std::fs::File::create(asyncd.statement_log())?);
            } else {
                // ASYNCD_BENCH_LOG, e.g. `warn,sqlx::query=debug` to time every statement.
                command.env(
                    "ASYNCD_LOG",
                    std::env::var("ASYNCD_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
                );
            }
            let child = command
                .arg("--config")
                .arg(&jobs)
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .stdout(Stdio::null())
                .spawn()
                .with_context(|| format!("starting {} {role}", binary.display()))?;
            asyncd.children.push(child);
            let base = format!("http://127.0.0.1:{port}");
            let start = Instant::now();
            while http.get(format!("{base}/healthz")).send().await.is_err() {
                if start.elapsed() > Duration::from_secs(20) {
                    bail!("asyncd {role} did not come up");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if asyncd.base.is_empty() {
                asyncd.base = base;
            }
        }
        Ok(asyncd)
    }

    /// The process that dispatches (with `dev`, the only one).
    fn worker(&self) -> u32 {
        self.children.last().map_or(0, Child::id)
    }

    /// Its SQLite store.
    pub fn db_path(&self) -> std::path::PathBuf {
        self.dir.path().join("bench.db")
    }

    fn statement_log(&self) -> std::path::PathBuf {
        self.dir.path().join("statements.jsonl")
    }

    /// What the statements logged so far changed (an asyncd started with
    /// [`Asyncd::start_counting_writes`]).
    pub fn store_writes(&self) -> Result<StoreWrites> {
        let log = std::fs::read_to_string(self.statement_log())?;
        let mut writes = StoreWrites::default();
        let mut kinds = std::collections::HashMap::new();
        for line in log.lines() {
            let Ok(event) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            // asyncd's JSON lines carry an event's fields at the top level.
            let summary = event["summary"].as_str().unwrap_or_default();
            if summary.is_empty() {
                continue;
            }
            writes.all_statements += 1;
            let kind: Vec<&str> = summary.split_whitespace().take(4).collect();
            *kinds.entry(kind.join(" ")).or_insert(0u64) += 1;
            let verb = summary.split_whitespace().next().unwrap_or_default();
            if ["INSERT", "UPDATE", "DELETE", "REPLACE"]
                .iter()
                .any(|w| verb.eq_ignore_ascii_case(w))
            {
                let rows = event["rows_affected"].as_u64().unwrap_or(0);
                writes.statements += 1;
                writes.rows += rows;
                // The table: the first word after the verb that is not a keyword
                // (`INSERT INTO tasks …`, `UPDATE tasks …`, `DELETE FROM tasks …`).
                let table = summary.split_whitespace().skip(1).find(|w| {
                    !["INTO", "FROM", "OR", "IGNORE"]
                        .iter()
                        .any(|k| w.eq_ignore_ascii_case(k))
                });
                if table == Some("tasks") {
                    writes.task_rows += rows;
                }
            }
        }
        writes.by_kind = kinds.into_iter().collect();
        writes
            .by_kind
            .sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Ok(writes)
    }

    /// CPU time the dispatching process used so far (user + system), in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.worker())).unwrap_or_default();
        // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace()
            .collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        (ticks(11) + ticks(12)) / 100.0
    }

    /// Peak resident memory of the dispatching process so far, in MiB.
    pub fn peak_rss_mib(&self) -> f64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.worker())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    }
}

impl Drop for Asyncd {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The writing statements an asyncd ran ([`Asyncd::store_writes`]): `INSERT`,
/// `UPDATE` and `DELETE`, and the rows they changed, in every table and in `tasks`.
#[derive(Debug, Default, Clone)]
pub struct StoreWrites {
    pub statements: u64,
    pub rows: u64,
    pub task_rows: u64,
    /// Every statement, reads and transaction control included: on SQLite each is a
    /// round trip to its connection's thread, a hand-off that costs as much as a write.
    pub all_statements: u64,
    /// Those by their first words, most frequent first.
    pub by_kind: Vec<(String, u64)>,
}

/// The benchmark's one job, of task type `noop`.
#[derive(Clone, Copy)]
pub struct Job<'a> {
    pub executor_url: &'a str,
    /// YAML flow members added to its `executor`, e.g. `"batch: {maxTasks: 100}"`.
    pub executor_extra: &'a str,
    pub concurrency: u32,
    /// Indented YAML lines added to its spec.
    pub extra_spec: &'a str,
}

impl Job<'_> {
    fn yaml(&self, kafka_topic: Option<&str>) -> String {
        let executor_extra = if self.executor_extra.is_empty() {
            String::new()
        } else {
            format!(", {}", self.executor_extra)
        };
        format!(
            "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata: {{name: bench}}\nspec:\n  taskType: noop\n  executor: {{url: '{}', timeout: 30s{executor_extra}}}\n  concurrency: {}\n{}{}",
            self.executor_url,
            self.concurrency,
            kafka_topic.map_or(String::new(), |topic| format!(
                "  kafka: {{topic: {topic}, partitions: 6}}\n"
            )),
            self.extra_spec
        )
    }
}

pub fn task(delay_ms: i64) -> Value {
    json!({"type": "noop", "payload": {"n": 1}, "delay": format!("{delay_ms}ms")})
}

pub fn eta_task(eta_ms: i64) -> Value {
    let eta = chrono::DateTime::from_timestamp_millis(eta_ms).unwrap();
    json!({"type": "noop", "payload": {"n": 1}, "eta": eta.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)})
}

pub async fn submit_single(
    http: &reqwest::Client,
    base: &str,
    tasks: Vec<Value>,
    concurrency: usize,
) -> Result<Duration> {
    let start = Instant::now();
    let url = format!("{base}/v1/tasks");
    let results: Vec<Result<()>> = futures::stream::iter(tasks)
        .map(|t| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let r = http.post(url).json(&t).send().await?;
                if r.status() != 201 {
                    bail!("submit answered {}", r.status());
                }
                Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(start.elapsed())
}

pub async fn submit_batches(
    http: &reqwest::Client,
    base: &str,
    tasks: Vec<Value>,
) -> Result<Duration> {
    let start = Instant::now();
    let url = format!("{base}/v1/tasks:batch");
    let batches: Vec<Vec<Value>> = tasks.chunks(1000).map(|c| c.to_vec()).collect();
    let results: Vec<Result<()>> = futures::stream::iter(batches)
        .map(|batch| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let r = http
                    .post(url)
                    .json(&json!({ "tasks": batch }))
                    .send()
                    .await?;
                let body: Value = r.json().await?;
                let ok = body["results"]
                    .as_array()
                    .is_some_and(|rs| rs.iter().all(|r| r["status"] == 201));
                if !ok {
                    bail!("batch refused: {body:.200}");
                }
                Ok(())
            }
        })
        .buffer_unordered(4)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(start.elapsed())
}

pub struct Lateness {
    pub p50: i64,
    pub p99: i64,
    pub max: i64,
    pub early: usize,
}

pub fn lateness(seen: &[(i64, i64)]) -> Lateness {
    let mut late: Vec<i64> = seen.iter().map(|(eta, at)| at - eta).collect();
    late.sort_unstable();
    let pick = |q: f64| late[((late.len() as f64 * q) as usize).min(late.len() - 1)];
    Lateness {
        p50: pick(0.50),
        p99: pick(0.99),
        max: *late.last().unwrap(),
        early: late.iter().filter(|l| **l < 0).count(),
    }
}

pub fn rate(n: usize, d: Duration) -> String {
    format!("{:.0}/s", n as f64 / d.as_secs_f64())
}

/// Submits `backlog` priority-0 tasks due at once, then a priority-9 probe, and prints a
/// table: how much of the backlog still waited at the probe's submit, the probe's
/// lateness (submit to call) and how many backlog calls came in between. Waits for the
/// backlog to drain, so the next run starts on an idle process.
pub async fn priority_under_backlog(
    http: &reqwest::Client,
    asyncd: &Asyncd,
    sink: &Sink,
    backlog: usize,
) -> Result<()> {
    sink.take();
    submit_batches(http, &asyncd.base, (0..backlog).map(|_| task(0)).collect()).await?;
    let submitted = now_ms();
    let ran = sink.count();
    let probe = json!({"type": "noop", "payload": {"probe": true}, "priority": 9});
    submit_single(http, &asyncd.base, vec![probe], 1).await?;
    let start = Instant::now();
    let (arrival, before) = loop {
        if let Some(seen) = sink.probe() {
            break seen;
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(300),
            "the priority-9 task did not run"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    println!(
        "| priority-0 tasks submitted | still waiting at the probe's submit | priority-9 probe: submit to call | backlog calls between |"
    );
    println!("|---:|---:|---:|---:|");
    println!(
        "| {backlog} | {} | {} ms | {} |",
        backlog - ran,
        arrival - submitted,
        before - ran
    );
    sink.wait_for(backlog, Duration::from_secs(600)).await?;
    Ok(())
}

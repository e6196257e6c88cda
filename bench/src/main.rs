//! `asyncd-bench`: starts a real `asyncd dev` (release build) with a no-op HTTP executor
//! served by this process, drives it over HTTP, and prints a table of what it measured.
//! Run through `e2e/bench.sh`, which builds both binaries first.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use axum::body::Bytes;
use clap::Parser;
use futures::StreamExt;
use serde_json::{Value, json};

#[derive(Parser)]
struct Args {
    /// Task counts for the throughput rows.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    sizes: Vec<usize>,
    /// Tasks falling due in the same second.
    #[arg(long, default_value_t = 10_000)]
    burst: usize,
    /// Tasks with random 1–10 s delays.
    #[arg(long, default_value_t = 2_000)]
    random: usize,
    /// Pending tasks for the heap push/pop rates.
    #[arg(long, default_value_t = 1_000_000)]
    heap: usize,
    /// Concurrent single submits in flight.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The no-op executor: answers 200 and notes (eta, arrival) of each call.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<(i64, i64)>>>);

impl Sink {
    async fn serve(&self) -> Result<String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let seen = self.0.clone();
        let app = axum::Router::new().fallback(move |body: Bytes| {
            let seen = seen.clone();
            async move {
                let arrival = now_ms();
                if let Ok(task) = serde_json::from_slice::<Value>(&body)
                    && let Some(eta) = task["eta"].as_str()
                    && let Ok(eta) = chrono::DateTime::parse_from_rfc3339(eta)
                {
                    seen.lock().unwrap().push((eta.timestamp_millis(), arrival));
                }
                ""
            }
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(format!("http://{addr}/"))
    }

    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn take(&self) -> Vec<(i64, i64)> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }

    async fn wait_for(&self, n: usize, deadline: Duration) -> Result<Instant> {
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

/// A release `asyncd dev` in a temporary folder.
struct Asyncd {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

impl Asyncd {
    async fn start(executor_url: &str, http: &reqwest::Client) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let jobs = dir.path().join("jobs");
        std::fs::create_dir(&jobs)?;
        std::fs::write(
            jobs.join("bench.yaml"),
            format!(
                "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata: {{name: bench}}\nspec:\n  taskType: noop\n  executor: {{url: '{executor_url}', timeout: 30s}}\n  concurrency: 256\n"
            ),
        )?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let binary = std::env::current_exe()?.with_file_name("asyncd");
        let child = Command::new(&binary)
            .args(["dev", "--config"])
            .arg(&jobs)
            .arg("--db")
            .arg(dir.path().join("bench.db"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("ASYNCD_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let base = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        while http.get(format!("{base}/healthz")).send().await.is_err() {
            if start.elapsed() > Duration::from_secs(20) {
                bail!("asyncd did not come up");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Self {
            child,
            base,
            _dir: dir,
        })
    }

    /// CPU time used so far (user + system), in seconds.
    fn cpu_seconds(&self) -> f64 {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
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

    /// Peak resident memory so far, in MiB.
    fn peak_rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    }
}

impl Drop for Asyncd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn task(delay_ms: i64) -> Value {
    json!({"type": "noop", "payload": {"n": 1}, "delay": format!("{delay_ms}ms")})
}

fn eta_task(eta_ms: i64) -> Value {
    let eta = chrono::DateTime::from_timestamp_millis(eta_ms).unwrap();
    json!({"type": "noop", "payload": {"n": 1}, "eta": eta.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)})
}

async fn submit_single(
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

async fn submit_batches(http: &reqwest::Client, base: &str, tasks: Vec<Value>) -> Result<Duration> {
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

struct Lateness {
    p50: i64,
    p99: i64,
    max: i64,
    early: usize,
}

fn lateness(seen: &[(i64, i64)]) -> Lateness {
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

fn rate(n: usize, d: Duration) -> String {
    format!("{:.0}/s", n as f64 / d.as_secs_f64())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()?;
    let sink = Sink::default();
    let executor = sink.serve().await?;

    println!("## Throughput (no-op HTTP executor, embedded SQLite)\n");
    println!(
        "| tasks | submit single | submit batch | end-to-end | lateness p50 / p99 / max | peak RSS | asyncd CPU |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for &n in &args.sizes {
        // Single submits of tasks due in an hour: the submit path alone.
        let asyncd = Asyncd::start(&executor, &http).await?;
        let single = submit_single(
            &http,
            &asyncd.base,
            (0..n).map(|_| task(3_600_000)).collect(),
            args.concurrency,
        )
        .await?;
        drop(asyncd);

        // Batch submits of tasks due now: submit, claim, dispatch and execute.
        let asyncd = Asyncd::start(&executor, &http).await?;
        sink.take();
        let start = Instant::now();
        let batch = submit_batches(&http, &asyncd.base, (0..n).map(|_| task(0)).collect()).await?;
        let done = sink.wait_for(n, Duration::from_secs(600)).await?;
        let e2e = done - start;
        let l = lateness(&sink.take());
        println!(
            "| {n} | {} | {} | {} | {} / {} / {} ms | {:.0} MiB | {:.1} s |",
            rate(n, single),
            rate(n, batch),
            rate(n, e2e),
            l.p50,
            l.p99,
            l.max,
            asyncd.peak_rss_mib(),
            asyncd.cpu_seconds()
        );
        assert_eq!(l.early, 0, "tasks ran before their ETA");
    }

    println!("\n## Lateness\n");
    println!("| scenario | tasks | p50 | p99 | max (= time to drain) |");
    println!("|---|---:|---:|---:|---:|");
    {
        let asyncd = Asyncd::start(&executor, &http).await?;
        sink.take();
        // All due in the same second, far enough ahead that submitting is over by then.
        let due = (now_ms() / 1000 + 8) * 1000;
        submit_batches(
            &http,
            &asyncd.base,
            (0..args.burst).map(|_| eta_task(due)).collect(),
        )
        .await?;
        anyhow::ensure!(now_ms() < due, "submitting the burst took past its ETA");
        sink.wait_for(args.burst, Duration::from_secs(300)).await?;
        let l = lateness(&sink.take());
        println!(
            "| same second | {} | {} ms | {} ms | {} ms |",
            args.burst, l.p50, l.p99, l.max
        );
    }
    {
        let asyncd = Asyncd::start(&executor, &http).await?;
        sink.take();
        let tasks = (0..args.random)
            .map(|_| task(rand::random_range(1_000..=10_000)))
            .collect();
        submit_single(&http, &asyncd.base, tasks, args.concurrency).await?;
        sink.wait_for(args.random, Duration::from_secs(300)).await?;
        let l = lateness(&sink.take());
        println!(
            "| random 1–10 s delays | {} | {} ms | {} ms | {} ms |",
            args.random, l.p50, l.p99, l.max
        );
    }

    println!("\n## ETA heap\n");
    let mut heap = asyncd::heap::EtaHeap::default();
    let base = now_ms();
    let tasks: Vec<_> = (0..args.heap)
        .map(|i| asyncd::store::ClaimedTask {
            id: format!("{i:012}"),
            task_type: "noop".into(),
            payload: serde_json::value::RawValue::from_string("null".into()).unwrap(),
            priority: (i % 10) as u8,
            trigger_at: base + rand::random_range(0..600_000),
            attempt: 0,
            max_retries: 3,
            timeout_ms: 1000,
            lease_token: 1,
            idempotency_key: None,
        })
        .collect();
    let start = Instant::now();
    for t in tasks {
        heap.push(t);
    }
    let push = start.elapsed();
    let start = Instant::now();
    let mut popped = 0;
    while heap.pop_due(i64::MAX).is_some() {
        popped += 1;
    }
    let pop = start.elapsed();
    println!("| pending | push | pop |\n|---:|---:|---:|");
    println!(
        "| {} | {} | {} |",
        args.heap,
        rate(args.heap, push),
        rate(popped, pop)
    );
    Ok(())
}

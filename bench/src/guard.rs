//! The hot path's regression guard, run by the test command: how fast `asyncd dev` drains
//! due tasks, as a fraction of what a plain HTTP loop gets from the same no-op executor
//! at the same concurrency. The two run in turn, in one process, so the ratio holds on
//! any machine: a busy or slow one slows both sides. Fails when the median ratio falls
//! below `--min-ratio`.
//!
//! Also prints what a task costs asyncd: CPU time, and the writing statements and rows
//! (a separate, smaller drain with every statement logged, since the log costs time).

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::harness::*;

#[derive(clap::Args)]
pub struct Args {
    /// Tasks per drain, and calls per HTTP loop.
    #[arg(long, default_value_t = 20_000)]
    tasks: usize,
    /// The job's `concurrency`, and the HTTP loop's calls in flight.
    #[arg(long, default_value_t = 256)]
    concurrency: u32,
    /// Rounds of (HTTP loop, drain); the median ratio counts.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Fail when the median of drain rate ÷ HTTP loop rate is below this.
    #[arg(long, default_value_t = 0.0)]
    min_ratio: f64,
    /// Tasks of the drain whose statements are counted (0: skip it).
    #[arg(long, default_value_t = 2_000)]
    count_writes: usize,
    /// Fail when that drain changes more rows of `tasks` per task than this (0: no
    /// bound): the insert, the claim that begins the attempt, and the outcome are 3.
    #[arg(long, default_value_t = 0.0)]
    max_task_rows: f64,
    /// Call the executor over HTTP/2 by prior knowledge (h2c): the job with
    /// `executor.http2`, and the HTTP loop alike.
    #[arg(long)]
    http2: bool,
}

pub async fn run(args: &Args) -> Result<()> {
    ensure!(
        args.tasks > 0 && args.rounds > 0,
        "--tasks and --rounds must be positive"
    );
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency as usize)
        .build()?;
    let executor_http = if args.http2 {
        reqwest::Client::builder().http2_prior_knowledge().build()?
    } else {
        http.clone()
    };
    let sink = Sink::default();
    let executor = sink.serve().await?;
    let job = Job {
        executor_url: &executor,
        executor_extra: if args.http2 { "http2: true" } else { "" },
        concurrency: args.concurrency,
        extra_spec: "",
    };
    let n = args.tasks;

    println!("## Hot-path guard: asyncd dev's drain against a plain HTTP loop\n");
    println!(
        "{n} tasks due at once, submitted in batches, until the no-op executor has seen the \
         last; the loop POSTs {n} executor calls to the same executor, {} in flight, over \
         {}. Rounds in turn.\n",
        args.concurrency,
        if args.http2 {
            "HTTP/2 (h2c)"
        } else {
            "HTTP/1.1"
        }
    );
    println!("| round | HTTP loop | asyncd drain | ratio | asyncd CPU per task |");
    println!("|---:|---:|---:|---:|---:|");
    let mut ratios = Vec::with_capacity(args.rounds);
    for round in 1..=args.rounds {
        let ceiling = http_loop(&executor_http, &executor, n, args.concurrency as usize).await?;
        sink.take();

        let asyncd = Asyncd::start_on(Topology::Dev, job, &http, None).await?;
        let start = Instant::now();
        submit_batches(&http, &asyncd.base, (0..n).map(|_| task(0)).collect()).await?;
        let drained = sink.wait_for(n, Duration::from_secs(600)).await? - start;
        let early = lateness(&sink.take()).early;
        ensure!(early == 0, "{early} tasks ran before their ETA");
        let cpu_us = asyncd.cpu_seconds() * 1e6 / n as f64;
        drop(asyncd);

        let (loop_rate, drain_rate) = (per_second(n, ceiling), per_second(n, drained));
        let ratio = drain_rate / loop_rate;
        ratios.push(ratio);
        println!(
            "| {round} | {loop_rate:.0}/s | {drain_rate:.0}/s | {ratio:.3} | {cpu_us:.0} µs |"
        );
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];

    if args.count_writes > 0 {
        let m = args.count_writes;
        let asyncd = Asyncd::start_counting_writes(job, &http).await?;
        sink.take();
        submit_batches(&http, &asyncd.base, (0..m).map(|_| task(0)).collect()).await?;
        sink.wait_for(m, Duration::from_secs(600)).await?;
        // The last outcomes are written after their calls.
        all_succeeded(&http, &asyncd.base, m).await?;
        let writes = asyncd.store_writes()?;
        let per_task = |x: u64| x as f64 / m as f64;
        println!(
            "\nStore writes per task ({m} tasks, submit to outcome, the membership \
             heartbeats of those seconds included): {:.2} writing statements, {:.2} rows \
             changed, {:.2} of them in `tasks`.",
            per_task(writes.statements),
            per_task(writes.rows),
            per_task(writes.task_rows)
        );
        println!(
            "Statements per task, reads and transaction control included: {:.2}, the most \
             frequent first:",
            per_task(writes.all_statements)
        );
        for (kind, count) in writes.by_kind.iter().take(12) {
            println!("- {:.3} `{kind} …`", per_task(*count));
        }
        ensure!(
            args.max_task_rows == 0.0 || per_task(writes.task_rows) <= args.max_task_rows,
            "{:.2} rows of `tasks` changed per task, above the guard's {:.2}: a change \
             added a write to the hot path (docs/benchmarks.md, \"Hot-path guard\")",
            per_task(writes.task_rows),
            args.max_task_rows
        );
    }

    println!(
        "\nMedian ratio {median:.3} (the guard: at least {:.3}).",
        args.min_ratio
    );
    ensure!(
        median >= args.min_ratio,
        "asyncd drained at {median:.3} of the HTTP loop's rate, below the guard's {:.3}: \
         a change slowed the hot path (docs/benchmarks.md, \"Hot-path guard\")",
        args.min_ratio
    );
    Ok(())
}

/// `n` executor calls shaped as asyncd makes them, `concurrency` in flight; how long
/// they took.
async fn http_loop(
    http: &reqwest::Client,
    executor: &str,
    n: usize,
    concurrency: usize,
) -> Result<Duration> {
    let eta = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let start = Instant::now();
    let results: Vec<Result<()>> = futures::stream::iter(0..n)
        .map(|i| {
            let body = json!({
                "id": format!("loop-{i}"),
                "type": "noop",
                "payload": {"n": 1},
                "attempt": 1,
                "eta": eta,
            });
            let http = http.clone();
            async move {
                let response = http.post(executor).json(&body).send().await?;
                if !response.status().is_success() {
                    bail!("the executor answered {}", response.status());
                }
                response.bytes().await?;
                Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(start.elapsed())
}

/// Waits (deadline 30 s) until the job overview counts `n` tasks succeeded and none
/// waiting or running: every outcome written.
async fn all_succeeded(http: &reqwest::Client, base: &str, n: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let job: Value = http
            .get(format!("{base}/v1/jobs/bench"))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let stats = &job["stats"];
        let waiting = ["due", "scheduled", "running"].map(|k| stats[k].as_u64());
        if waiting == [Some(0); 3]
            && stats["finished_last_minute"]["succeeded"].as_u64() == Some(n as u64)
        {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the outcomes were not all written within 30 s: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn per_second(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

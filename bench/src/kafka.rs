//! The Kafka path (`asyncd dev --kafka-brokers …`): submit throughput, end-to-end drain
//! and lateness through a real broker, a priority-9 task behind a due backlog, and memory
//! with many tasks waiting in the heap.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::json;

use crate::harness::*;

#[derive(clap::Args)]
pub struct Args {
    /// Kafka bootstrap servers (as e2e/services/kafka.sh url prints).
    #[arg(long, env = "ASYNCD_TEST_KAFKA_BROKERS")]
    brokers: String,
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    sizes: Vec<usize>,
    /// Tasks held in the heap for the memory rows.
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000")]
    heap: Vec<usize>,
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Overdue priority-0 tasks a priority-9 task is submitted behind.
    #[arg(long, default_value_t = 50_000)]
    backlog: usize,
}

fn topic() -> String {
    format!("asyncd-bench-{:x}", now_ms())
}

/// Waits until the process's heap holds `n` tasks.
async fn wait_heap(http: &reqwest::Client, base: &str, n: usize) -> Result<()> {
    let start = Instant::now();
    loop {
        let metrics = http
            .get(format!("{base}/metrics"))
            .send()
            .await?
            .text()
            .await?;
        let held = metrics
            .lines()
            .find_map(|l| l.strip_prefix("asyncd_heap_tasks "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0) as usize;
        if held >= n {
            return Ok(());
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(900),
            "heap reached {held} of {n}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The topics are created at start: waits until a first task of each priority class
/// made it through, then forgets them.
async fn wait_through(http: &reqwest::Client, asyncd: &Asyncd, sink: &Sink) -> Result<()> {
    for priority in [0, 9] {
        sink.take();
        let first = || json!({"type": "noop", "payload": {"n": 1}, "priority": priority});
        submit_single(http, &asyncd.base, vec![first()], 1)
            .await
            .ok();
        while sink.count() == 0 {
            submit_single(http, &asyncd.base, vec![first()], 1)
                .await
                .ok();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    sink.take();
    Ok(())
}

pub async fn run(args: &Args) -> Result<()> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()?;
    let sink = Sink::default();
    let executor = sink.serve().await?;

    println!("## Through Kafka (no-op HTTP executor, SQLite store, one process)\n");
    println!(
        "| tasks | submit single | submit batch | end-to-end | lateness p50 / p99 / max | peak RSS |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for &n in &args.sizes {
        let t = topic();
        let asyncd = Asyncd::start(&executor, &http, Some((&args.brokers, &t))).await?;
        wait_through(&http, &asyncd, &sink).await?;
        let single = submit_single(
            &http,
            &asyncd.base,
            (0..n).map(|_| task(0)).collect(),
            args.concurrency,
        )
        .await?;
        sink.wait_for(n, Duration::from_secs(600)).await?;
        sink.take();
        let start = Instant::now();
        let batch = submit_batches(&http, &asyncd.base, (0..n).map(|_| task(0)).collect()).await?;
        let done = sink.wait_for(n, Duration::from_secs(600)).await?;
        let l = lateness(&sink.take());
        println!(
            "| {n} | {} | {} | {} | {} / {} / {} ms | {:.0} MiB |",
            rate(n, single),
            rate(n, batch),
            rate(n, done - start),
            l.p50,
            l.p99,
            l.max,
            asyncd.peak_rss_mib()
        );
    }

    println!("\n## Priority under backlog (Kafka route)\n");
    {
        let t = topic();
        let asyncd = Asyncd::start(&executor, &http, Some((&args.brokers, &t))).await?;
        wait_through(&http, &asyncd, &sink).await?;
        priority_under_backlog(&http, &asyncd, &sink, args.backlog).await?;
    }

    println!("\n## Memory with tasks waiting in the heap\n");
    println!("| tasks in heap | RSS |\n|---:|---:|");
    for &n in &args.heap {
        let t = topic();
        let asyncd = Asyncd::start(&executor, &http, Some((&args.brokers, &t))).await?;
        let before = asyncd.peak_rss_mib();
        // Due in nine minutes: consumed, stored, claimed into the heap, not yet run.
        let tasks = (0..n).map(|_| task(540_000)).collect();
        submit_batches(&http, &asyncd.base, tasks).await?;
        wait_heap(&http, &asyncd.base, n).await?;
        println!(
            "| {n} | {:.0} MiB (idle process: {before:.0} MiB) |",
            asyncd.peak_rss_mib()
        );
    }
    Ok(())
}

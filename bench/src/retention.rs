//! Retention under a steady load: tasks pass through `asyncd dev` at a fixed rate, with
//! a short `retention.succeeded` and, for comparison, one long enough that nothing is
//! purged during the run. Samples the task table's row count every second and the
//! dispatch lateness of every task, so the table shows whether the table stays flat
//! while N tasks pass and what the purge costs the dispatch.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

use crate::harness::*;

#[derive(clap::Args)]
pub struct Args {
    /// Tasks passing through each run (10⁶ for the recorded figures).
    #[arg(long, default_value_t = 1_000_000)]
    tasks: usize,
    /// Tasks submitted per second, due at once: a steady load well under the embedded
    /// end-to-end rate, so the backlog stays near zero and the table holds the
    /// retained tail.
    #[arg(long, default_value_t = 2_000)]
    rate: usize,
    /// The short `retention.succeeded` of the purging run.
    #[arg(long, default_value = "10s")]
    retention: String,
}

/// One run's figures.
struct Run {
    rows_max: i64,
    rows_end: i64,
    /// (seconds into the run, rows), one per second.
    series: Vec<(u64, i64)>,
    late: Lateness,
    took: Duration,
    cpu: f64,
}

pub async fn run(args: &Args) -> Result<()> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    let sink = Sink::default();
    let executor = sink.serve().await?;

    println!("## Retention under a steady load (embedded SQLite)\n");
    println!(
        "{} tasks at {}/s, due at once, through `asyncd dev` with a no-op executor; the \
         purger runs every second. Rows: `SELECT COUNT(*) FROM tasks`, sampled every second.\n",
        args.tasks, args.rate
    );
    println!(
        "| retention.succeeded | tasks | took | rows max / at the end | lateness p50 / p99 / max | asyncd CPU |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let mut series = Vec::new();
    for (label, kept) in [
        (
            format!("{} (purging)", args.retention),
            args.retention.as_str(),
        ),
        ("3650d (nothing purged)".to_string(), "3650d"),
    ] {
        let run = steady(&http, &executor, &sink, args, kept).await?;
        println!(
            "| {label} | {} | {:.0} s | {} / {} | {} / {} / {} ms | {:.1} s |",
            args.tasks,
            run.took.as_secs_f64(),
            run.rows_max,
            run.rows_end,
            run.late.p50,
            run.late.p99,
            run.late.max,
            run.cpu
        );
        series.push((label, run.series));
    }
    println!("\nRows in the task table during each run, at tenths of it:\n");
    println!(
        "| retention.succeeded | 10 % | 20 % | 30 % | 40 % | 50 % | 60 % | 70 % | 80 % | 90 % | 100 % |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (label, points) in series {
        let cells: Vec<String> = (1..=10)
            .map(|tenth| {
                let i = (points.len() * tenth / 10).saturating_sub(1);
                points
                    .get(i)
                    .map_or("–".into(), |(_, rows)| rows.to_string())
            })
            .collect();
        println!("| {label} | {} |", cells.join(" | "));
    }
    Ok(())
}

async fn steady(
    http: &reqwest::Client,
    executor: &str,
    sink: &Sink,
    args: &Args,
    kept: &str,
) -> Result<Run> {
    let asyncd = Asyncd::start_with(
        executor,
        http,
        None,
        &format!("  retention: {{succeeded: {kept}}}\n"),
    )
    .await?;
    sink.take();
    let db = reader(&asyncd).await?;
    // A tenth of a second's tasks per batch, on a fixed schedule: a slow submit is
    // caught up by the next ticks rather than shifting the load.
    let per_tick = (args.rate / 10).max(1);
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let start = Instant::now();
    let mut next_sample = Duration::ZERO;
    let mut series = Vec::new();
    let mut submitted = 0;
    while submitted < args.tasks {
        ticker.tick().await;
        let n = per_tick.min(args.tasks - submitted);
        submit_batches(http, &asyncd.base, (0..n).map(|_| task(0)).collect()).await?;
        submitted += n;
        if start.elapsed() >= next_sample {
            series.push((start.elapsed().as_secs(), rows(&db).await?));
            next_sample += Duration::from_secs(1);
        }
    }
    sink.wait_for(args.tasks, Duration::from_secs(600)).await?;
    let took = start.elapsed();
    series.push((took.as_secs(), rows(&db).await?));
    let late = lateness(&sink.take());
    ensure!(late.early == 0, "tasks ran before their ETA");
    Ok(Run {
        rows_max: series.iter().map(|(_, r)| *r).max().unwrap_or(0),
        rows_end: series.last().map_or(0, |(_, r)| *r),
        series,
        late,
        took,
        cpu: asyncd.cpu_seconds(),
    })
}

/// A read-only connection to the run's store (WAL: it reads beside asyncd's writer).
async fn reader(asyncd: &Asyncd) -> Result<SqlitePool> {
    let options = SqliteConnectOptions::new()
        .filename(asyncd.db_path())
        .read_only(true);
    Ok(SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await?)
}

async fn rows(db: &SqlitePool) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT COUNT(*) FROM tasks")
        .fetch_one(db)
        .await?)
}

//! Embedded mode (`asyncd dev`, SQLite, no Kafka): submit throughput, end-to-end drain,
//! dispatch lateness, memory, and the ETA heap on its own.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::harness::*;

#[derive(clap::Args)]
pub struct Args {
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
    /// Tasks for the rows comparing the end-to-end rate with and without a rate limit.
    #[arg(long, default_value_t = 100_000)]
    limits: usize,
    /// Overdue priority-0 tasks a priority-9 task is submitted behind.
    #[arg(long, default_value_t = 50_000)]
    backlog: usize,
    /// The job's `concurrency` in the throughput and lateness rows: attempts in flight
    /// from their start until their outcome is written, so with the store's round trips
    /// it bounds the end-to-end rate (Little's law).
    #[arg(long, default_value_t = 1024)]
    job_concurrency: u32,
    /// `executor.batch.maxTasks` of the batch delivery rows (0: skip them).
    #[arg(long, default_value_t = 100)]
    batch_tasks: u32,
}

/// End to end and same-second lateness with `executor.batch`: up to `--batch-tasks`
/// tasks per executor call, with `--job-concurrency` (at least four calls' worth, so
/// calls overlap).
async fn batch_delivery(
    args: &Args,
    http: &reqwest::Client,
    sink: &Sink,
    executor: &str,
) -> Result<()> {
    let per_call = args.batch_tasks;
    let batch = format!("batch: {{maxTasks: {per_call}}}");
    let concurrency = args.job_concurrency.max(per_call * 4);
    println!("\n## Batch delivery (`executor.batch: {{maxTasks: {per_call}}}`)\n");
    println!("| scenario | tasks | end-to-end | lateness p50 / p99 / max | asyncd CPU |");
    println!("|---|---:|---:|---:|---:|");
    for &n in &args.sizes {
        let asyncd = Asyncd::start_job(executor, &batch, concurrency, http, None, "").await?;
        sink.take();
        let start = Instant::now();
        submit_batches(http, &asyncd.base, (0..n).map(|_| task(0)).collect()).await?;
        let done = sink.wait_for(n, Duration::from_secs(600)).await?;
        let l = lateness(&sink.take());
        println!(
            "| drain | {n} | {} | {} / {} / {} ms | {:.1} s |",
            rate(n, done - start),
            l.p50,
            l.p99,
            l.max,
            asyncd.cpu_seconds()
        );
        assert_eq!(l.early, 0, "tasks ran before their ETA");
    }
    let asyncd = Asyncd::start_job(executor, &batch, concurrency, http, None, "").await?;
    let l = same_second(http, sink, &asyncd, args.burst).await?;
    println!(
        "| same second | {} | | {} / {} / {} ms | {:.1} s |",
        args.burst,
        l.p50,
        l.p99,
        l.max,
        asyncd.cpu_seconds()
    );
    assert_eq!(l.early, 0, "tasks ran before their ETA");
    Ok(())
}

/// `n` tasks all due in the same second, far enough ahead that submitting is over by
/// then: their lateness once the executor has seen them all.
pub async fn same_second(
    http: &reqwest::Client,
    sink: &Sink,
    asyncd: &Asyncd,
    n: usize,
) -> Result<Lateness> {
    sink.take();
    let due = (now_ms() / 1000 + 8) * 1000;
    submit_batches(http, &asyncd.base, (0..n).map(|_| eta_task(due)).collect()).await?;
    anyhow::ensure!(now_ms() < due, "submitting the burst took past its ETA");
    sink.wait_for(n, Duration::from_secs(300)).await?;
    Ok(lateness(&sink.take()))
}

/// The embedded figures: submit, end-to-end, lateness, heap.
pub async fn run(args: &Args) -> Result<()> {
    // Each of these rows reports the lateness of what it ran: of no task there is none.
    anyhow::ensure!(
        args.burst > 0 && args.random > 0 && !args.sizes.contains(&0),
        "--burst, --random and every --sizes entry must be at least 1"
    );
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
        let asyncd = Asyncd::start(&executor, &http, None).await?;
        let single = submit_single(
            &http,
            &asyncd.base,
            (0..n).map(|_| task(3_600_000)).collect(),
            args.concurrency,
        )
        .await?;
        drop(asyncd);

        // Batch submits of tasks due now: submit, claim, dispatch and execute.
        let asyncd =
            Asyncd::start_job(&executor, "", args.job_concurrency, &http, None, "").await?;
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
        let asyncd = Asyncd::start(&executor, &http, None).await?;
        let l = same_second(&http, &sink, &asyncd, args.burst).await?;
        println!(
            "| same second | {} | {} ms | {} ms | {} ms |",
            args.burst, l.p50, l.p99, l.max
        );
    }
    {
        let asyncd = Asyncd::start(&executor, &http, None).await?;
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

    if args.batch_tasks > 0 {
        batch_delivery(args, &http, &sink, &executor).await?;
    }

    println!("\n## Limits that do not bind\n");
    println!(
        "Every attempt begins through the store's limits (`concurrency`, counted in total); \
         the second row adds a `rateLimit` far above the rate reached, whose token bucket \
         is one more statement per batch. Both at `--job-concurrency`, as the end-to-end \
         rows above: a smaller `concurrency` would bind the rate itself (Little's law).\n"
    );
    println!("| job spec | tasks | end-to-end | asyncd CPU |");
    println!("|---|---:|---:|---:|");
    let concurrency = args.job_concurrency;
    for (label, extra) in [
        (format!("`concurrency: {concurrency}`"), ""),
        (
            format!("`concurrency: {concurrency}`, `rateLimit: {{perSecond: 1000000}}`"),
            "  rateLimit: {perSecond: 1000000}\n",
        ),
    ] {
        let n = args.limits;
        let asyncd = Asyncd::start_job(&executor, "", concurrency, &http, None, extra).await?;
        sink.take();
        let start = Instant::now();
        submit_batches(&http, &asyncd.base, (0..n).map(|_| task(0)).collect()).await?;
        let done = sink.wait_for(n, Duration::from_secs(600)).await?;
        println!(
            "| {label} | {n} | {} | {:.1} s |",
            rate(n, done - start),
            asyncd.cpu_seconds()
        );
    }

    println!("\n## Priority under backlog (store route)\n");
    {
        let asyncd = Asyncd::start(&executor, &http, None).await?;
        priority_under_backlog(&http, &asyncd, &sink, args.backlog).await?;
    }

    println!("\n## ETA heap\n");
    let mut heap = asyncd_store::heap::EtaHeap::default();
    let base = now_ms();
    let tasks: Vec<_> = (0..args.heap)
        .map(|i| asyncd_store::ClaimedTask {
            id: format!("{i:012}"),
            task_type: "noop".into(),
            payload: serde_json::value::RawValue::from_string("null".into()).unwrap(),
            priority: (i % 10) as u8,
            trigger_at: asyncd_store::Millis::new(base + rand::random_range(0..600_000)),
            attempt: 0,
            max_retries: 3,
            timeout_ms: 1000,
            lease_token: 1,
            idempotency_key: None,
            lease_secret: String::new(),
            concurrency_key: None,
            trace: None,
            expires_at: None,
        })
        .collect();
    let start = Instant::now();
    for t in tasks {
        heap.push(t);
    }
    let push = start.elapsed();
    let start = Instant::now();
    let mut popped = 0;
    while heap.pop_due(asyncd_store::Millis::new(i64::MAX)).is_some() {
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

//! The SQL stores: end to end as a cluster runs them (`asyncd api` and one `asyncd
//! dispatcher` calling a no-op HTTP executor); on their own (no HTTP), how many rows per
//! second N dispatchers claim, begin and complete on one database, and whether a poll
//! gets slower as the backlog of not-yet-due rows grows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use asyncd_store::{
    self as store, ClaimParams, Finish, FinishKind, Millis, NewTask, StartParams, Store, TypeFilter,
};
use sqlx::Connection;

use crate::harness::{Asyncd, Job, Sink, Topology, lateness, now_ms, rate, submit_batches};

#[derive(clap::Args)]
pub struct Args {
    /// MariaDB/MySQL server URL without a database (as e2e/services/mariadb.sh url prints).
    #[arg(long, env = "ASYNCD_TEST_MYSQL_URL")]
    mysql: Option<String>,
    /// PostgreSQL server URL without a database.
    #[arg(long, env = "ASYNCD_TEST_POSTGRES_URL")]
    postgres: Option<String>,
    /// Due rows for the claim-and-complete runs.
    #[arg(long, default_value_t = 20_000)]
    rows: usize,
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    dispatchers: Vec<usize>,
    /// Not-yet-due rows sitting in the table while polls are timed.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
    backlogs: Vec<usize>,
    /// Due rows of another type ahead of the claimed type's, while one type's claims
    /// are timed.
    #[arg(long, value_delimiter = ',', default_value = "100000")]
    other_type_backlogs: Vec<usize>,
    /// Tasks per end-to-end run (empty: no end-to-end runs).
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    e2e_sizes: Vec<usize>,
    /// The end-to-end job's `concurrency`, as the embedded bench's `--job-concurrency`.
    #[arg(long, default_value_t = 1024)]
    job_concurrency: u32,
    /// Tasks due in the same second, end to end (0: none).
    #[arg(long, default_value_t = 10_000)]
    burst: usize,
}

/// `asyncd api` and one `asyncd dispatcher` on a fresh database of each server: batch
/// submits of tasks due now, and the time until the executor has seen them all; then a
/// same-second burst.
async fn end_to_end(args: &Args, servers: &[(&str, &str)]) -> Result<()> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()?;
    let sink = Sink::default();
    let executor = sink.serve().await?;
    let job = Job {
        executor_url: &executor,
        executor_extra: "",
        concurrency: args.job_concurrency,
        extra_spec: "",
    };
    println!(
        "## End to end: `asyncd api` + one `asyncd dispatcher`, job concurrency {}, a no-op HTTP executor\n",
        args.job_concurrency
    );
    println!(
        "| backend | tasks | submit batch | end-to-end | lateness p50 / p99 / max | dispatcher peak RSS | dispatcher CPU |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, server) in servers {
        for &n in &args.e2e_sizes {
            let url = fresh_database(server).await?;
            let asyncd = Asyncd::start_on(Topology::Servers { store: &url }, job, &http, None)
                .await
                .with_context(|| format!("asyncd on {name}"))?;
            sink.take();
            let start = Instant::now();
            let batch = submit_batches(
                &http,
                &asyncd.base,
                (0..n).map(|_| crate::harness::task(0)).collect(),
            )
            .await?;
            let done = sink.wait_for(n, Duration::from_secs(600)).await?;
            let l = lateness(&sink.take());
            println!(
                "| {name} | {n} | {} | {} | {} / {} / {} ms | {:.0} MiB | {:.1} s |",
                rate(n, batch),
                rate(n, done - start),
                l.p50,
                l.p99,
                l.max,
                asyncd.peak_rss_mib(),
                asyncd.cpu_seconds()
            );
            anyhow::ensure!(l.early == 0, "tasks ran before their ETA");
        }
    }
    if args.burst > 0 {
        println!("\n| backend | due in the same second | lateness p50 / p99 / max |");
        println!("|---|---:|---:|");
        for (name, server) in servers {
            let url = fresh_database(server).await?;
            let asyncd =
                Asyncd::start_on(Topology::Servers { store: &url }, job, &http, None).await?;
            let l = crate::embedded::same_second(&http, &sink, &asyncd, args.burst).await?;
            println!(
                "| {name} | {} | {} / {} / {} ms |",
                args.burst, l.p50, l.p99, l.max
            );
            anyhow::ensure!(l.early == 0, "tasks ran before their ETA");
        }
    }
    println!();
    Ok(())
}

pub(crate) async fn fresh_database(server: &str) -> Result<String> {
    let name = format!("asyncd_bench_{}", uuid_like());
    if server.starts_with("mysql:") {
        let mut conn = sqlx::MySqlConnection::connect(server).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE {name} CHARACTER SET utf8mb4"
        )))
        .execute(&mut conn)
        .await?;
    } else {
        let mut conn = sqlx::PgConnection::connect(&format!("{server}/postgres")).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await?;
    }
    let url = format!("{server}/{name}");
    store::open(&url).await?.migrate().await?;
    Ok(url)
}

fn uuid_like() -> String {
    format!("{:x}{:08x}", now_ms(), rand::random::<u32>())
}

fn task(i: usize, trigger_at: i64, task_type: &str) -> NewTask {
    NewTask::test(task_type, Millis::new(trigger_at))
        .id(format!("{:013x}-{i:022}", now_ms()))
        .payload(r#"{"n":1}"#)
        .timeout_ms(30_000)
}

async fn fill(store: &dyn Store, count: usize, trigger_at: i64) -> Result<()> {
    fill_type(store, count, trigger_at, "bench").await
}

async fn fill_type(
    store: &dyn Store,
    count: usize,
    trigger_at: i64,
    task_type: &str,
) -> Result<()> {
    let mut i = 0;
    while i < count {
        let n = (count - i).min(1000);
        let batch: Vec<_> = (i..i + n).map(|j| task(j, trigger_at, task_type)).collect();
        store.insert(&batch, Millis::new(now_ms())).await?;
        i += n;
    }
    Ok(())
}

/// Everything due by `now`, 100 at a time, held for 30 s.
fn claim_params(now: Millis, owner: &str) -> ClaimParams<'_> {
    ClaimParams {
        types: &TypeFilter::All,
        horizon: now,
        now,
        hold: Duration::from_secs(30),
        owner,
        limit: 100,
        ahead: false,
    }
}

/// One dispatcher's loop: claim 100, begin, complete, until nothing is due.
async fn drain(store: Arc<dyn Store>, owner: String) -> Result<usize> {
    let mut done = 0;
    loop {
        let now = Millis::new(now_ms());
        let claimed = store.claim(claim_params(now, &owner)).await?;
        if claimed.is_empty() {
            return Ok(done);
        }
        let claims: Vec<_> = claimed
            .iter()
            .map(|c| (c.id.clone(), c.lease_token))
            .collect();
        let started = store
            .start(StartParams {
                claims: &claims,
                now,
                grace: Duration::from_secs(5),
            })
            .await?;
        let finishes: Vec<_> = started
            .into_iter()
            .map(|s| Finish {
                id: s.id,
                lease_token: s.lease_token,
                kind: FinishKind::Succeeded { result: None },
            })
            .collect();
        done += finishes.len();
        store.finish(&finishes, Millis::new(now_ms())).await?;
    }
}

fn percentile(mut samples: Vec<Duration>, q: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)]
}

pub async fn run(args: &Args) -> Result<()> {
    let servers: Vec<(&str, &str)> = [
        ("MariaDB", args.mysql.as_deref()),
        ("PostgreSQL", args.postgres.as_deref()),
    ]
    .into_iter()
    .filter_map(|(name, url)| url.map(|u| (name, u.trim_end_matches('/'))))
    .collect();
    anyhow::ensure!(
        !servers.is_empty(),
        "give --mysql and/or --postgres (or ASYNCD_TEST_*_URL)"
    );

    if !args.e2e_sizes.is_empty() {
        end_to_end(args, &servers).await?;
    }

    println!(
        "## Claim, begin and complete (no HTTP), {} due rows\n",
        args.rows
    );
    println!("| backend | dispatchers | rows/s |\n|---|---:|---:|");
    for (name, server) in &servers {
        for &n in &args.dispatchers {
            let url = fresh_database(server)
                .await
                .with_context(|| format!("{name} database"))?;
            fill(store::open(&url).await?.as_ref(), args.rows, now_ms() - 1).await?;
            let start = Instant::now();
            let mut loops = Vec::new();
            for d in 0..n {
                let store = store::open(&url).await?;
                loops.push(tokio::spawn(drain(store, format!("bench-{d}"))));
            }
            let mut total = 0;
            for l in loops {
                total += l.await??;
            }
            anyhow::ensure!(
                total == args.rows,
                "{total} of {} rows completed",
                args.rows
            );
            println!(
                "| {name} | {n} | {:.0} |",
                total as f64 / start.elapsed().as_secs_f64()
            );
        }
    }

    println!("\n## Poll cost by backlog (rows not yet due in the table)\n");
    println!(
        "| backend | pending rows | empty poll p50 / p99 | claim of 100 due p50 | claim throughput |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (name, server) in &servers {
        for &backlog in &args.backlogs {
            let url = fresh_database(server).await?;
            let store = store::open(&url).await?;
            fill(store.as_ref(), backlog, now_ms() + 86_400_000).await?;
            let mut empty = Vec::new();
            for _ in 0..200 {
                let now = Millis::new(now_ms());
                let t = Instant::now();
                let got = store.claim(claim_params(now, "bench")).await?;
                empty.push(t.elapsed());
                anyhow::ensure!(got.is_empty());
            }
            fill(store.as_ref(), 5_000, now_ms() - 1).await?;
            let mut claims = Vec::new();
            let start = Instant::now();
            let mut claimed = 0;
            loop {
                let now = Millis::new(now_ms());
                let t = Instant::now();
                let got = store.claim(claim_params(now, "bench")).await?;
                if got.is_empty() {
                    break;
                }
                claims.push(t.elapsed());
                claimed += got.len();
            }
            let elapsed = start.elapsed();
            println!(
                "| {name} | {backlog} | {:.2} / {:.2} ms | {:.2} ms | {:.0} rows/s |",
                percentile(empty.clone(), 0.5).as_secs_f64() * 1e3,
                percentile(empty, 0.99).as_secs_f64() * 1e3,
                percentile(claims, 0.5).as_secs_f64() * 1e3,
                claimed as f64 / elapsed.as_secs_f64()
            );
        }
    }

    println!("\n## One type's claims behind another type's due backlog\n");
    println!(
        "2 000 due tasks of the claimed type, behind due tasks of another type that rank \
         first. A claim of one type walks that type's own index (`tasks_ranked_by_type`); \
         a claim of a list of types walks every type's pending tasks in claim order \
         (`tasks_ranked`), as every type-filtered claim did before migration 0013.\n"
    );
    println!(
        "| backend | other type's due rows | claim of 100, one type, p50 | claim of 100, a list of two types, p50 |"
    );
    println!("|---|---:|---:|---:|");
    for (name, server) in &servers {
        for &backlog in &args.other_type_backlogs {
            let url = fresh_database(server).await?;
            let store = store::open(&url).await?;
            fill_type(store.as_ref(), backlog, now_ms() - 60_000, "other").await?;
            let mut p50 = Vec::new();
            for types in [
                vec!["bench".to_string()],
                vec!["bench".to_string(), "absent".to_string()],
            ] {
                fill(store.as_ref(), 2_000, now_ms() - 1).await?;
                let filter = TypeFilter::Only(types);
                let mut claims = Vec::new();
                loop {
                    let now = Millis::new(now_ms());
                    let t = Instant::now();
                    let got = store
                        .claim(ClaimParams {
                            types: &filter,
                            ..claim_params(now, "bench")
                        })
                        .await?;
                    if got.is_empty() {
                        break;
                    }
                    anyhow::ensure!(got.iter().all(|c| c.task_type == "bench"));
                    claims.push(t.elapsed());
                }
                anyhow::ensure!(claims.len() == 20, "{} claims of 100", claims.len());
                p50.push(percentile(claims, 0.5).as_secs_f64() * 1e3);
            }
            println!(
                "| {name} | {backlog} | {:.2} ms | {:.2} ms |",
                p50[0], p50[1]
            );
        }
    }
    Ok(())
}

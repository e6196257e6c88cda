//! A million schedules held in PostgreSQL, fired on time by two schedulers (issue 33):
//! each with its own pool, on the injected clock, stepping through six minutes. The
//! schedules fire hourly, spread over the hour as a million customers' would be, so about
//! 278 fall due each second. Every firing due within the run (and the scheduler's 60 s
//! horizon past it) is created exactly once and before its instant; none other is.
//!
//! The wall-clock cost of the same run — a pass's duration, the schedulers' CPU — is a
//! benchmark (docs/benchmarks.md, "Schedules"), printed here, not asserted.

use std::sync::Arc;
use std::time::Instant;

use asyncd::clock::ManualClock;
use asyncd::job_table::{RouteTable, fixed};
use asyncd::scheduler::Scheduler;
use asyncd_spec::AsyncJobConfig;
use asyncd_store::{Millis, Store};
use sqlx::Connection;

use crate::support::*;

const SCHEDULES: i64 = 1_000_000;
const HOUR_MS: i64 = 3_600_000;
/// How far the clock moves between passes, and how long the run is, simulated.
const STEP_MS: i64 = 2_000;
const RUN_MS: i64 = 360_000;
/// The scheduler's horizon: firings of a schedule that allows overlaps exist this far
/// ahead of their instant.
const HORIZON_MS: i64 = 60_000;

/// Writes the million schedules as a planned schedule stands: schedule `i` created
/// `i mod 3600` seconds before `start`, firing hourly from then, looked at a horizon
/// before its next firing.
async fn seed(url: &str, start: i64) {
    let seeding = Instant::now();
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO schedules (task_type, name, source, spec, paused, next_at, wake_at, \
           buffered_at, last_task_id, last_fired_at, fired, version, created_at, updated_at) \
         SELECT 'hourly', 'customer-' || i, 'api', '{{\"every\":\"1h\"}}', 0, \
           c + {HOUR_MS}, c + {HOUR_MS} - {HORIZON_MS}, NULL, NULL, NULL, 0, 1, c, c \
         FROM generate_series(0, {last}) AS i, LATERAL (SELECT {start} - (i % 3600) * 1000 AS c) AS t",
        last = SCHEDULES - 1
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query("ANALYZE schedules")
        .execute(&mut conn)
        .await
        .unwrap();
    eprintln!("seeded {SCHEDULES} schedules in {:?}", seeding.elapsed());
}

fn hourly_job() -> asyncd::job_table::Routes {
    let (_, job) = AsyncJobConfig::from_yaml(
        "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata: {name: reports}\n\
         spec:\n  taskType: hourly\n  executor: {url: 'http://127.0.0.1:1/'}\n",
    )
    .unwrap();
    fixed(RouteTable::from_jobs([job]))
}

/// Schedule `i`'s first firing: created `i mod 3600` seconds before the run, hourly.
fn first_firing(i: i64) -> i64 {
    T0 - (i % 3600) * 1_000 + HOUR_MS
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_million_schedules_fire_on_time_with_two_schedulers() {
    let Some(url) = fresh_database(Service::Postgres).await else {
        return;
    };
    let setup = asyncd_store::open(&url).await.unwrap();
    setup.migrate().await.unwrap();
    seed(&url, T0).await;

    let routes = hourly_job();
    let clock = ManualClock::at(asyncd::clock::from_millis(Millis::new(T0)));
    let mut schedulers = Vec::new();
    for _ in 0..2 {
        let store: Arc<dyn Store> = asyncd_store::open(&url).await.unwrap();
        schedulers.push(Scheduler::new(store, routes.clone(), clock.clone(), None));
    }
    let [a, b] = schedulers.as_mut_slice() else {
        unreachable!()
    };

    let running = Instant::now();
    let cpu = cpu_seconds();
    let mut slowest = std::time::Duration::ZERO;
    let mut created = 0;
    for step in 0..=RUN_MS / STEP_MS {
        clock.set_millis(Millis::new(T0 + step * STEP_MS));
        let pass = Instant::now();
        let (one, other) = tokio::join!(a.schedule_once(), b.schedule_once());
        slowest = slowest.max(pass.elapsed());
        created += one.unwrap().len() + other.unwrap().len();
    }
    eprintln!(
        "{} simulated seconds in {:?}: {created} firings, slowest pass {slowest:?}, \
         schedulers' CPU {:.1} s",
        RUN_MS / 1000,
        running.elapsed(),
        cpu_seconds() - cpu
    );

    let expected = (0..SCHEDULES)
        .filter(|&i| first_firing(i) <= T0 + RUN_MS + HORIZON_MS)
        .count();
    assert_eq!(
        created, expected,
        "each firing due created once, by one scheduler"
    );
    let count = |sql: &'static str| {
        let url = url.clone();
        async move {
            let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&mut conn)
                .await
                .unwrap()
        }
    };
    assert_eq!(
        count("SELECT COUNT(*) FROM tasks WHERE task_type = 'hourly'").await,
        expected as i64,
        "one task per firing"
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM tasks WHERE created_at > trigger_at").await,
        0,
        "none created after its instant"
    );
    assert_eq!(
        count(
            "SELECT COUNT(*) FROM schedules WHERE fired = 1 AND next_at = last_fired_at + 3600000"
        )
        .await,
        expected as i64,
        "each fired schedule moved on to its next hour"
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM schedules WHERE fired = 0").await,
        SCHEDULES - expected as i64,
        "the rest held, untouched"
    );
}

/// This process's user and system CPU time so far, in seconds (both schedulers run in
/// it; PostgreSQL's own CPU is not counted).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |n: usize| {
        fields
            .get(n)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are the 14th and 15th fields; the rest starts at the 3rd.
    (ticks(11) + ticks(12)) / 100.0
}

/// The benchmark of docs/benchmarks.md, "Schedules": the same million schedules on the
/// real clock, two schedulers running their passes every second for
/// `ASYNCD_BENCH_SCHEDULE_SECS` (default 300); prints how far ahead of its instant each
/// firing was created (its lead; a negative one would be late), and the CPU of the
/// schedulers and of PostgreSQL. Run alone, in release:
/// `cargo test --release -p asyncd --test integration schedules_scale -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a benchmark: minutes of wall clock"]
async fn bench_a_million_schedules_on_the_real_clock() {
    let Some(url) = fresh_database(Service::Postgres).await else {
        return;
    };
    let setup = asyncd_store::open(&url).await.unwrap();
    setup.migrate().await.unwrap();
    // Planned a minute ahead, as a scheduler that has been running leaves them: the run
    // measures the steady state, not a first pass's catch-up of what is due at once.
    let start = asyncd::clock::Clock::now_millis(&asyncd::clock::SystemClock).as_i64();
    seed(&url, start + HORIZON_MS).await;
    let secs: u64 = std::env::var("ASYNCD_BENCH_SCHEDULE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let mut runs = Vec::new();
    let (cpu, postgres_cpu) = (cpu_seconds(), postgres_cpu_seconds());
    for _ in 0..2 {
        let store: Arc<dyn Store> = asyncd_store::open(&url).await.unwrap();
        let scheduler = Scheduler::new(
            store,
            hourly_job(),
            Arc::new(asyncd::clock::SystemClock),
            None,
        );
        runs.push(tokio::spawn(scheduler.run(shutdown.clone())));
    }
    tokio::time::sleep(std::time::Duration::from_secs(secs)).await;
    shutdown.cancel();
    for run in runs {
        run.await.unwrap();
    }
    let (cpu, postgres_cpu) = (cpu_seconds() - cpu, postgres_cpu_seconds() - postgres_cpu);
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let (firings, min_lead, p50, p99): (i64, Option<i64>, Option<f64>, Option<f64>) =
        sqlx::query_as(
            "SELECT COUNT(*), MIN(trigger_at - created_at), \
           percentile_cont(0.5) WITHIN GROUP (ORDER BY trigger_at - created_at), \
           percentile_cont(0.01) WITHIN GROUP (ORDER BY trigger_at - created_at) \
         FROM tasks WHERE task_type = 'hourly'",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
    eprintln!(
        "{secs} s: {firings} firings ({:.0}/s); lead ahead of the instant: min {} ms, \
         1st percentile {:.0} ms, median {:.0} ms; schedulers' CPU {cpu:.1} s ({:.1} % of a \
         core), PostgreSQL's {postgres_cpu:.1} s",
        firings as f64 / secs as f64,
        min_lead.unwrap_or_default(),
        p99.unwrap_or_default(),
        p50.unwrap_or_default(),
        100.0 * cpu / secs as f64,
    );
    assert!(
        min_lead.unwrap_or(0) >= 0,
        "a firing was created after its instant"
    );
}

/// The CPU seconds of every `postgres` process on the machine (the test's server),
/// with those of its exited backends (the postmaster's children's time).
fn postgres_cpu_seconds() -> f64 {
    let mut total = 0.0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if !head.ends_with("(postgres") {
            continue;
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |n: usize| {
            fields
                .get(n)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        total += (ticks(11) + ticks(12) + ticks(13) + ticks(14)) / 100.0;
    }
    total
}

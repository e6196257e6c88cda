//! The chaos soak: asyncd as separate real processes on PostgreSQL or MariaDB and Kafka
//! (migrate, APIs, dispatchers, schedulers), N tasks over both routes, executors that
//! misbehave in every way the contract allows and at the socket (an answer that never
//! comes, trickles, or is cut after its headers), and every role SIGKILLed and restarted over
//! and over, the database and the broker restarted once each. At the end every accepted task must have
//! reached the end state its executor's behaviour implies, no executor call may come before
//! the task's ETA, and successful executions beyond the first are counted.
//!
//! Every random choice comes from `--seed` (printed), so a failing run can be repeated.
//! Run through `e2e/soak.sh`, which builds the release binaries and starts a private
//! database server (`--store postgres|mariadb`), Kafka server and Toxiproxy server for
//! the soak to restart and fault.
//!
//! This file holds the options and the run, start to verdict; `behaviour` what each task
//! is, `executor` how the soak's executor answers it, `submit` the submits and the drain,
//! `fleet` the asyncd processes, `chaos` the kills, restarts, network faults and DNS
//! outages, and `ledger` the accounting and the verdict.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::harness::now_ms;

mod behaviour;
mod chaos;
mod executor;
mod fleet;
mod ledger;
mod submit;

use asyncd_toxiproxy::{Fault, Proxy};
use behaviour::*;
use chaos::*;
use executor::*;
use fleet::*;
use ledger::*;
use submit::*;

#[derive(clap::Args)]
pub struct Args {
    /// Tasks to submit (10⁶ for the full run).
    #[arg(long, default_value_t = 100_000)]
    tasks: usize,
    /// Seed of every random choice (default: from the clock; printed either way).
    #[arg(long)]
    seed: Option<u64>,
    /// Store URL of a fresh database for the run (`postgres://…` or `mysql://…`). Given to
    /// every asyncd process as ASYNCD_STORE, never as an argument (it holds the password).
    #[arg(long, env = "ASYNCD_STORE", hide_env_values = true)]
    store: String,
    /// Kafka bootstrap servers.
    #[arg(long)]
    kafka_brokers: String,
    /// With `--toxiproxy`: the broker's listener for proxied clients (`host:port`,
    /// e2e/services/kafka.sh's ASYNCD_KAFKA_PROXIED_PORT). A proxy listening at
    /// `--kafka-brokers` (the address that listener advertises) forwards to it, and the
    /// network faults fall on the broker link as on the store link.
    #[arg(long, requires = "toxiproxy")]
    kafka_upstream: Option<String>,
    /// Shell command that restarts the database server (run once, mid-run).
    #[arg(long)]
    db_restart: Option<String>,
    /// Shell command that restarts the broker (run once, mid-run).
    #[arg(long)]
    broker_restart: Option<String>,
    /// Longest submit delay; delays are spread over 0..=this.
    #[arg(long, default_value = "60s", value_parser = asyncd_spec::parse_duration)]
    max_delay: Duration,
    /// Tasks due within this take the Kafka route, later ones the store route.
    #[arg(long, default_value = "20s", value_parser = asyncd_spec::parse_duration)]
    kafka_threshold: Duration,
    /// Submit rate cap, tasks per second (spreads the run over the chaos).
    #[arg(long, default_value_t = 2000)]
    rate: u64,
    /// One SIGKILL and restart of a role process this often.
    #[arg(long, default_value = "3s", value_parser = asyncd_spec::parse_duration)]
    chaos_every: Duration,
    /// How long to wait, after the last ETA, for every accepted task to finish.
    #[arg(long, default_value = "120s", value_parser = asyncd_spec::parse_duration)]
    drain_deadline: Duration,
    /// Past the deadline, the drain goes on while tasks still finish: it ends when no
    /// task finished for this long (a stall), or at `--drain-limit`. A pipeline that is
    /// slow on a busy machine is told apart from one that stopped.
    #[arg(long, default_value = "60s", value_parser = asyncd_spec::parse_duration)]
    drain_stall: Duration,
    /// The drain's hard end, however it progresses.
    #[arg(long, default_value = "600s", value_parser = asyncd_spec::parse_duration)]
    drain_limit: Duration,
    /// Fail when duplicates exceed this percentage of accepted tasks (default: report only).
    #[arg(long)]
    max_duplicates_pct: Option<f64>,
    /// Fail when the duplicates no dispatcher kill explains exceed this percentage of
    /// accepted tasks (default: report only). Whatever this says, a run fails when one
    /// kill is set against more re-runs than the job's concurrency (docs/reliability.md,
    /// "Which duplicates a kill explains").
    #[arg(long)]
    max_unexplained_duplicates_pct: Option<f64>,
    #[arg(long, default_value_t = 2)]
    apis: usize,
    #[arg(long, default_value_t = 3)]
    dispatchers: usize,
    /// Whether each dispatcher keeps an outcome journal (`--outcome-journal`, a folder of
    /// its own under the soak's, kept across its kills as a pod's emptyDir is), so that
    /// it writes after a kill the outcomes the kill left unwritten. `false` measures the
    /// duplicates without it.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    outcome_journal: bool,
    #[arg(long, default_value_t = 2)]
    schedulers: usize,
    /// Toxiproxy's API (`e2e/services/toxiproxy.sh url`): every asyncd process reaches the
    /// store (and, with `--kafka-upstream`, the broker) through proxies there, one of
    /// whose links gets a network fault every `--net-fault-every` while the chaos lasts
    /// (none without this).
    #[arg(long)]
    toxiproxy: Option<String>,
    /// How often a network fault (black hole, 200 ms latency, 32 KiB/s, resets) is put on
    /// the store or the broker link, for 1–5 s.
    #[arg(long, default_value = "10s", value_parser = asyncd_spec::parse_duration)]
    net_fault_every: Duration,
    /// How often the executor's host name stops resolving in the dispatchers, for 1–4 s
    /// ("0s": never). The dispatchers then run in mount namespaces of their own, each
    /// with the soak's hosts file over `/etc/hosts`, which needs root.
    #[arg(long, default_value = "15s", value_parser = asyncd_spec::parse_duration)]
    dns_outage_every: Duration,
    /// Folder for the asyncd processes' logs (default: a new temporary folder, kept).
    #[arg(long)]
    logs: Option<PathBuf>,
}

/// The soak job's `concurrency`, a total across the dispatchers: also the most attempts
/// one dispatcher can have begun and not yet recorded, so the most re-runs one SIGKILL can
/// cause. 768 is the 256 each of three dispatchers had before limits held across replicas.
/// Less, and the long 202 tasks (which hold a slot for their whole lease) leave dispatch
/// far behind the submit rate, so a full run measures capacity instead of reliability.
const CONCURRENCY: usize = 768;
/// The executor's per-attempt timeout in the soak's job config; `Slow` answers at half of it.
const EXECUTOR_TIMEOUT: Duration = Duration::from_secs(3);
/// Retries allowed per task: `FailThenOk` uses at most 3, the rest is slack for attempts
/// lost to SIGKILLed dispatchers.
const MAX_RETRIES: u32 = 10;
const HUGE_BODY: usize = 2 << 20;
const NOT_FOUND: &str = "not found";

pub async fn run(args: &Args) -> Result<()> {
    let seed = args
        .seed
        .unwrap_or_else(|| mix(now_ms() as u64) % 1_000_000_000);
    println!(
        "seed: {seed} (repeat with --seed {seed} --tasks {})",
        args.tasks
    );
    let logs = match &args.logs {
        Some(dir) => dir.clone(),
        None => tempfile::Builder::new()
            .prefix("asyncd-soak-")
            .tempdir()?
            .keep(),
    };
    std::fs::create_dir_all(&logs)?;
    println!("process logs: {}", logs.display());
    // The verdict alone does not say which backend it was on; the password stays out.
    println!("store: {}", asyncd_store::redact_url(&args.store));
    let started = Instant::now();

    let ledger = Arc::new(Mutex::new(Ledger::new(seed, args.tasks)));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(64)
        .build()?;
    let apis: Vec<String> = (0..args.apis)
        .map(|_| Ok(format!("http://127.0.0.1:{}", free_port()?)))
        .collect::<Result<_>>()?;
    let executor_port = serve_executor(ExecutorState {
        ledger: ledger.clone(),
        http: http.clone(),
        apis: apis.clone(),
        huge: Bytes::from(vec![b'x'; HUGE_BODY]),
    })
    .await?;
    // With DNS outages the dispatchers reach the executor by a name only the soak's hosts
    // file knows, and that file is emptied now and then.
    let hosts = if args.dns_outage_every.is_zero() {
        None
    } else {
        let uid = std::fs::read_to_string("/proc/self/status")?
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().next().map(str::to_string));
        if uid.as_deref() != Some("0") {
            bail!(
                "DNS outages need root (the dispatchers get their own /etc/hosts in a mount namespace); run as root or pass --dns-outage-every 0s"
            );
        }
        let hosts = logs.join("hosts");
        std::fs::write(&hosts, HOSTS_RESOLVING)?;
        Some(hosts)
    };
    let executor = match hosts {
        Some(_) => format!("http://{EXECUTOR_HOST}:{executor_port}/run"),
        None => format!("http://127.0.0.1:{executor_port}/run"),
    };

    let jobs = logs.join("jobs");
    std::fs::create_dir_all(&jobs)?;
    std::fs::write(
        jobs.join("soak.yaml"),
        format!(
            "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata: {{name: soak}}\nspec:\n  taskType: soak\n  executor: {{url: '{executor}', timeout: {}s}}\n  concurrency: {CONCURRENCY}\n  retry: {{maxRetries: {MAX_RETRIES}, initialBackoff: 200ms, maxBackoff: 2s}}\n  kafka: {{topic: asyncd-soak-{seed}-{}, partitions: 6}}\n",
            EXECUTOR_TIMEOUT.as_secs(),
            std::process::id()
        ),
    )?;

    let binary = std::env::current_exe()?.with_file_name("asyncd");
    migrate(&binary, &args.store).await?;
    // The roles reach the store through the proxy; the soak's own steps (migrate, the
    // database restart) go to it directly.
    let proxy = match &args.toxiproxy {
        Some(api) => {
            let name = format!("soak-store-{}", std::process::id());
            Some(Arc::new(Proxy::create(api, &name, &args.store).await?))
        }
        None => None,
    };
    let broker_proxy = match (&args.toxiproxy, &args.kafka_upstream) {
        (Some(api), Some(upstream)) => {
            let name = format!("soak-broker-{}", std::process::id());
            Some(Arc::new(
                Proxy::create_tcp(api, &name, &args.kafka_brokers, upstream).await?,
            ))
        }
        _ => None,
    };
    let role_store = match &proxy {
        Some(proxy) => proxy.url(&args.store)?,
        None => args.store.clone(),
    };
    let fleet = Arc::new(Mutex::new(Fleet::start(
        binary,
        args,
        &role_store,
        hosts.clone(),
        &apis,
        &jobs,
        &logs,
    )?));
    for api in &apis {
        wait_healthy(&http, api).await?;
    }

    let stop_sampling = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn({
        let (fleet, stop) = (fleet.clone(), stop_sampling.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                fleet.lock().unwrap().sample();
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    });

    let submitted = Arc::new(AtomicUsize::new(0));
    let chaos_until = Arc::new(AtomicI64::new(i64::MAX));
    // The proxy lives until the run ends (dropping it deletes it): the roles reach the
    // store through it until the drain is over.
    let links: Vec<(&'static str, Arc<Proxy>)> = [("store", &proxy), ("broker", &broker_proxy)]
        .into_iter()
        .filter_map(|(link, proxy)| Some((link, proxy.clone()?)))
        .collect();
    let net_faults = (!links.is_empty()).then(|| {
        tokio::spawn(net_faults(
            links,
            seed,
            args.net_fault_every,
            logs.join("net-faults.log"),
            chaos_until.clone(),
        ))
    });
    let dns_outages = hosts.map(|hosts| {
        tokio::spawn(dns_outages(
            hosts,
            seed,
            args.dns_outage_every,
            logs.join("dns-outages.log"),
            chaos_until.clone(),
        ))
    });
    let chaos = tokio::spawn(chaos(
        fleet.clone(),
        ChaosPlan {
            seed,
            every: args.chaos_every,
            db_restart: args.db_restart.clone(),
            broker_restart: args.broker_restart.clone(),
            total: args.tasks,
            logs: logs.clone(),
        },
        submitted.clone(),
        chaos_until.clone(),
    ));

    let client = Submitter {
        http: http.clone(),
        apis: apis.clone(),
        next: AtomicUsize::new(0),
    };
    let submit_started = Instant::now();
    submit_all(&client, args, seed, &ledger, &submitted).await;
    let submit_time = submit_started.elapsed();
    // Chaos goes on until the last task is due, then the survivors drain in peace.
    chaos_until.store(
        now_ms() + args.max_delay.as_millis() as i64,
        Ordering::Relaxed,
    );
    let chaos_report = chaos.await?;
    println!(
        "chaos over: {} kills, database restart: {}, broker restart: {}",
        chaos_report.kills, chaos_report.db, chaos_report.broker
    );
    let net_report = match net_faults {
        Some(task) => Some(task.await?),
        None => None,
    };
    if let Some(report) = &net_report {
        println!("network faults: {}", report.summary());
    }
    let dns_report = match dns_outages {
        Some(task) => Some(task.await?),
        None => None,
    };
    if let Some(report) = &dns_report {
        println!("DNS outages of the executor's name: {}", report.summary());
    }

    let drain_started = Instant::now();
    let missing = drain(
        &client,
        &ledger,
        submit::DrainLimits {
            deadline: args.drain_deadline,
            stall: args.drain_stall,
            limit: args.drain_limit,
        },
    )
    .await;
    let drain_time = drain_started.elapsed();
    stop_sampling.store(true, Ordering::Relaxed);
    sampler.await?;
    let total = started.elapsed();

    let ledger = ledger.lock().unwrap();
    let mut store_out = net_report
        .as_ref()
        .map(|report| report.store_faulted.clone())
        .unwrap_or_default();
    store_out.extend(chaos_report.db_down);
    let v = ledger.verdict(&Timeline {
        dispatcher_kills: chaos_report.dispatcher_kills.clone(),
        store_out,
    });
    let fleet = fleet.lock().unwrap();
    println!("\n| | |\n|---|---|");
    println!("| tasks | {} |", args.tasks);
    println!("| accepted | {} |", v.accepted);
    println!(
        "| lost | {} (of which {} answered with an id that never appeared; their work ran) |",
        v.lost, v.lost_unknown_id
    );
    println!("| ran early | {} |", v.early);
    println!(
        "| duplicates | {} ({:.3} %) |",
        v.duplicates,
        v.duplicates_pct()
    );
    println!(
        "| duplicates set against a dispatcher kill (the kill of the dispatcher that made the successful call, at most {KILL_WINDOW_MS} ms of reachable store after it) | {} (at most {} for one kill; {} kills of a dispatcher) |",
        v.after_kills,
        v.most_per_kill,
        chaos_report.dispatcher_kills.len()
    );
    println!(
        "| duplicates no kill explains | {} ({:.3} %) |",
        v.unexplained,
        v.unexplained_pct()
    );
    let by_behaviour: Vec<String> = v
        .duplicates_by_behaviour
        .iter()
        .map(|(code, n)| format!("{code} {n}"))
        .collect();
    println!(
        "| duplicates by behaviour | {} |",
        if by_behaviour.is_empty() {
            "none".to_string()
        } else {
            by_behaviour.join(", ")
        }
    );
    println!(
        "| duplicates by tenth of the run (database restart in the 4th, broker in the 7th) | {:?} |",
        v.duplicates_by_tenth
    );
    println!("| wrong end state | {} |", v.wrong);
    println!(
        "| succeeded with no answer that said so (unearned) | {} |",
        v.unearned
    );
    println!(
        "| ran without a 2xx submit answer (allowed) | {} |",
        v.ran_unconfirmed
    );
    println!(
        "| succeeded tasks by their last failed attempt's cause (each in last-errors.tsv) | {} |",
        failure_causes(&ledger.records)
    );
    let errors: String = ledger
        .records
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let error = r.last_error.as_deref()?;
            let behaviour = Behaviour::of(seed, i as u64).code();
            Some(format!(
                "{i}\t{behaviour}\t{}\t{error}\n",
                failure_cause(error)
            ))
        })
        .collect();
    std::fs::write(logs.join("last-errors.tsv"), errors)?;
    println!(
        "| executor calls / successful executions | {} / {} |",
        v.calls, v.successes
    );
    for (role, usage) in &fleet.usage {
        println!(
            "| peak RSS {role} (VmHWM; {} kills, {} exits of its own) | {:.0} MiB |",
            fleet.kills.get(role).copied().unwrap_or(0),
            fleet.crashes.get(role).copied().unwrap_or(0),
            usage.peak_rss_kib as f64 / 1024.0
        );
        println!(
            "| last RSS {role} (VmRSS at the last sample, its largest process) | {:.0} MiB |",
            usage.last_rss_kib as f64 / 1024.0
        );
        println!(
            "| open descriptors {role}: peak / last (its largest process) | {} / {} |",
            usage.peak_fds, usage.last_fds
        );
    }
    println!(
        "| duration | {:.0} s (submit {:.0} s, drain {:.0} s) |",
        total.as_secs_f64(),
        submit_time.as_secs_f64(),
        drain_time.as_secs_f64()
    );
    println!(
        "| throughput | {:.0} submits/s, {:.0} executor calls/s over the run |",
        v.accepted as f64 / submit_time.as_secs_f64(),
        v.calls as f64 / total.as_secs_f64()
    );
    for sample in &ledger.early_samples {
        println!("early: {sample}");
    }
    for (index, state) in missing.iter().take(10) {
        let r = &ledger.records[*index];
        let id = r.id.as_deref().unwrap_or("?");
        println!(
            "lost: task {index} ({id}, idempotency key soak-{seed}-{index}) behaviour {} last state {state}, {} calls, {} successes; answered {}",
            Behaviour::of(seed, *index as u64).code(),
            r.calls,
            r.successes,
            r.answer.as_deref().unwrap_or("?"),
        );
        // What the roles logged about it (a produce that failed, a consumed task the
        // store refused), so a loss on a busy CI machine can be followed without a rerun.
        for line in fleet::log_lines_naming(&logs, id).iter().take(10) {
            println!("  {line}");
        }
    }
    // Which route a duplicate took and the first few ids, to look them up in the store's
    // rows and the dispatchers' logs; the route is judged from the delay the soak asked for,
    // so a task within a few ms of the threshold may be on the other one.
    let max_delay_ms = args.max_delay.as_millis() as u64;
    let threshold_ms = args.kafka_threshold.as_millis() as u64;
    let duplicated: Vec<(usize, &Record, u64)> = ledger
        .records
        .iter()
        .enumerate()
        .filter(|(_, r)| r.successes > 1)
        .map(|(index, r)| (index, r, delay_ms(seed, index as u64, max_delay_ms)))
        .collect();
    let on_kafka = duplicated
        .iter()
        .filter(|(_, _, delay)| *delay < threshold_ms)
        .count();
    println!(
        "duplicated tasks: {} ({on_kafka} on the Kafka route, {} on the store route; all in duplicates.tsv, kill times in kills.log)",
        duplicated.len(),
        duplicated.len() - on_kafka
    );
    let mut table = String::from(
        "index\tid\tbehaviour\tdelay_ms\tcalls\tsuccesses (ms@attempt/lease token by pid of the calling dispatcher)\n",
    );
    for (index, r, delay) in &duplicated {
        let at: Vec<String> = r
            .success_at
            .iter()
            .map(|s| {
                let caller = s.caller.map_or("?".into(), |pid| pid.to_string());
                format!("{}@{}/{} by pid {caller}", s.at, s.attempt, s.lease_token)
            })
            .collect();
        table.push_str(&format!(
            "{index}\t{}\t{}\t{delay}\t{}\t{}\n",
            r.id.as_deref().unwrap_or("?"),
            Behaviour::of(seed, *index as u64).code(),
            r.calls,
            at.join(" ")
        ));
    }
    std::fs::write(logs.join("duplicates.tsv"), table)?;
    for (index, r, delay) in duplicated.iter().take(10) {
        println!(
            "duplicate: task {index} ({}) behaviour {} delay {delay} ms, {} calls, {} successes",
            r.id.as_deref().unwrap_or("?"),
            Behaviour::of(seed, *index as u64).code(),
            r.calls,
            r.successes
        );
    }
    for (index, r) in ledger.records.iter().enumerate() {
        let behaviour = Behaviour::of(seed, index as u64);
        let expected = behaviour.expected().as_str();
        if let Some(end) = r.end.as_deref().filter(|end| *end != expected) {
            println!(
                "wrong: task {index} ({}) behaviour {} ended {end}, expected {expected}, {} calls",
                r.id.as_deref().unwrap_or("?"),
                behaviour.code(),
                r.calls
            );
        }
    }
    let mut failures = Vec::new();
    if v.lost > 0 {
        failures.push(format!("{} lost", v.lost));
    }
    if v.early > 0 {
        failures.push(format!("{} early", v.early));
    }
    if v.wrong > 0 {
        failures.push(format!("{} in the wrong end state", v.wrong));
    }
    if v.unearned > 0 {
        failures.push(format!(
            "{} succeeded with no answer that said so",
            v.unearned
        ));
    }
    if let Some(limit) = args.max_duplicates_pct
        && v.duplicates_pct() > limit
    {
        failures.push(format!(
            "duplicates {:.3} % over the {limit} % limit",
            v.duplicates_pct()
        ));
    }
    if let Some(limit) = args.max_unexplained_duplicates_pct
        && v.unexplained_pct() > limit
    {
        failures.push(format!(
            "duplicates no kill explains {:.3} % over the {limit} % limit",
            v.unexplained_pct()
        ));
    }
    if v.most_per_kill > CONCURRENCY {
        failures.push(format!(
            "one dispatcher kill was set against {} re-runs, more than the job's concurrency ({CONCURRENCY}) lets a dispatcher hold unrecorded",
            v.most_per_kill
        ));
    }
    if let Some(report) = &net_report
        && !report.failed.is_empty()
    {
        failures.push(format!(
            "{} network faults could not be put on or taken off",
            report.failed.len()
        ));
    }
    if let Some(report) = &dns_report
        && !report.failed.is_empty()
    {
        failures.push(format!(
            "{} DNS outages could not be started or ended",
            report.failed.len()
        ));
    }
    if !chaos_report.db_ok || !chaos_report.broker_ok {
        failures.push("a database or broker restart failed (see the logs folder)".into());
    }
    if v.accepted == 0 {
        failures.push("no task was accepted".into());
    }
    if !failures.is_empty() {
        bail!("soak failed (seed {seed}): {}", failures.join(", "));
    }
    println!("soak passed (seed {seed})");
    Ok(())
}

/// A port for a role or the executor to listen on, below the kernel's ephemeral range
/// (`ip_local_port_range`, from 32768 by default). The chaos restarts a role on the same
/// port again and again through the run, and a port of the ephemeral range can meanwhile
/// be the local end of any outgoing connection on the machine: one run left a scheduler,
/// then a dispatcher, failing to bind ("Address already in use") for most of it.
fn free_port() -> Result<u16> {
    /// Ports handed out so far: each probe starts past them, as they are not bound yet.
    static HANDED_OUT: AtomicU16 = AtomicU16::new(0);
    const FIRST: u16 = 21_000;
    const COUNT: u16 = 2_000;
    // Runs on one machine at once start at different places.
    let start = (std::process::id() % u32::from(COUNT)) as u16;
    for _ in 0..COUNT {
        let offset = (start + HANDED_OUT.fetch_add(1, Ordering::Relaxed)) % COUNT;
        let port = FIRST + offset;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    anyhow::bail!("no free port in {FIRST}..{}", FIRST + COUNT)
}

async fn migrate(binary: &Path, store: &str) -> Result<()> {
    let status = tokio::process::Command::new(binary)
        .arg("migrate")
        .env("ASYNCD_STORE", store)
        .stdout(Stdio::null())
        .status()
        .await
        .context("running asyncd migrate")?;
    if !status.success() {
        bail!("asyncd migrate failed: {status}");
    }
    Ok(())
}

async fn wait_healthy(http: &reqwest::Client, base: &str) -> Result<()> {
    let start = Instant::now();
    loop {
        if let Ok(r) = http.get(format!("{base}/readyz")).send().await
            && r.status().is_success()
        {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!("{base} did not become ready within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

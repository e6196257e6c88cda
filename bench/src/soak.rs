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
//! database server (`--store postgres|mariadb`) and Kafka server for the soak to restart.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::harness::now_ms;
use asyncd_toxiproxy::{Fault, Proxy};

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
    /// Fail when duplicates exceed this percentage of accepted tasks (default: report only).
    #[arg(long)]
    max_duplicates_pct: Option<f64>,
    #[arg(long, default_value_t = 2)]
    apis: usize,
    #[arg(long, default_value_t = 3)]
    dispatchers: usize,
    #[arg(long, default_value_t = 2)]
    schedulers: usize,
    /// Toxiproxy's API (`e2e/services/toxiproxy.sh url`): every asyncd process reaches the
    /// store through a proxy there, whose link gets a network fault every
    /// `--net-fault-every` while the chaos lasts (none without this).
    #[arg(long)]
    toxiproxy: Option<String>,
    /// How often a network fault (black hole, 200 ms latency, 32 KiB/s, resets) is put on
    /// the store link, for 1–5 s.
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

/// The executor's per-attempt timeout in the soak's job config; `Slow` answers at half of it.
const EXECUTOR_TIMEOUT: Duration = Duration::from_secs(3);
/// Retries allowed per task: `FailThenOk` uses at most 3, the rest is slack for attempts
/// lost to SIGKILLed dispatchers.
const MAX_RETRIES: u32 = 10;
const HUGE_BODY: usize = 2 << 20;
const NOT_FOUND: &str = "not found";

/// SplitMix64: a fixed, portable mixing function, so a seed means the same run everywhere.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn draw(seed: u64, stream: u64, index: u64) -> u64 {
    mix(mix(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03)) ^ index)
}

/// What the soak's executor does with a task, carried in its payload (`"b"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// 200 at once.
    Ok,
    /// 500 on the first n attempts, then 200.
    FailThenOk(u32),
    /// 200 after half the executor timeout.
    Slow,
    /// 200 with a body that is not JSON.
    InvalidJson200,
    /// 202 with a body that is not JSON (so the default lease), then heartbeat and result.
    InvalidJson202,
    /// 200 with NUL bytes in the body.
    NulBody,
    /// 200 with a 2 MiB body.
    HugeBody,
    /// 307 to the executor's own URL on every attempt. asyncd must not follow it (the
    /// target answers 200, which would end the task succeeded): it ends dead.
    Redirect,
    /// 202 with a lease, then heartbeat and a success result through the callback API.
    Callback,
    /// 422 on every attempt: must end in dead letters.
    Permanent,
    /// First attempt: the connection is accepted and never answered (the call runs into
    /// the attempt's timeout); then 200.
    Hang,
    /// First attempt: 200 and its headers at once, then the body one byte a second, far
    /// slower than the timeout allows; then 200.
    Trickle,
    /// First attempt: 200 and its headers with a `content-length` the body never reaches,
    /// then the connection is closed; then 200.
    CutAfterHeaders,
}

/// A task's end state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndState {
    Succeeded,
    Dead,
}

impl EndState {
    /// As the API names it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Dead => "dead",
        }
    }
}

impl Behaviour {
    /// The behaviour of task `index` in the run of `seed`: 80 % plain successes, the rest
    /// spread over the misbehaviours.
    pub fn of(seed: u64, index: u64) -> Self {
        let r = draw(seed, 1, index) % 1000;
        match r {
            0..785 => Self::Ok,
            785..790 => Self::Hang,
            790..795 => Self::Trickle,
            795..800 => Self::CutAfterHeaders,
            800..860 => Self::FailThenOk(1 + (r % 3) as u32),
            860..875 => Self::Slow,
            875..890 => Self::InvalidJson200,
            890..905 => Self::InvalidJson202,
            905..920 => Self::NulBody,
            920..925 => Self::HugeBody,
            925..940 => Self::Redirect,
            940..980 => Self::Callback,
            _ => Self::Permanent,
        }
    }

    pub fn code(self) -> String {
        match self {
            Self::Ok => "ok".into(),
            Self::FailThenOk(n) => format!("fail{n}"),
            Self::Slow => "slow".into(),
            Self::InvalidJson200 => "json200".into(),
            Self::InvalidJson202 => "json202".into(),
            Self::NulBody => "nul".into(),
            Self::HugeBody => "huge".into(),
            Self::Redirect => "redirect".into(),
            Self::Callback => "callback".into(),
            Self::Permanent => "permanent".into(),
            Self::Hang => "hang".into(),
            Self::Trickle => "trickle".into(),
            Self::CutAfterHeaders => "cut".into(),
        }
    }

    pub fn parse(code: &str) -> Option<Self> {
        Some(match code {
            "ok" => Self::Ok,
            "slow" => Self::Slow,
            "json200" => Self::InvalidJson200,
            "json202" => Self::InvalidJson202,
            "nul" => Self::NulBody,
            "huge" => Self::HugeBody,
            "redirect" => Self::Redirect,
            "callback" => Self::Callback,
            "permanent" => Self::Permanent,
            "hang" => Self::Hang,
            "trickle" => Self::Trickle,
            "cut" => Self::CutAfterHeaders,
            _ => Self::FailThenOk(code.strip_prefix("fail")?.parse().ok()?),
        })
    }

    pub fn expected(self) -> EndState {
        match self {
            // Redirects are never followed: every attempt fails, so the task dies.
            Self::Permanent | Self::Redirect => EndState::Dead,
            _ => EndState::Succeeded,
        }
    }
}

/// Submit delay of task `index`: one in ten due at once, the rest spread over 0..=max.
pub fn delay_ms(seed: u64, index: u64, max_ms: u64) -> u64 {
    let r = draw(seed, 2, index);
    if r.is_multiple_of(10) {
        0
    } else {
        (r >> 8) % (max_ms + 1)
    }
}

/// Submit units: `(first index, count, batch?)`, singles and batches of 10–100 mixed.
pub fn units(seed: u64, n: usize) -> Vec<(usize, usize, bool)> {
    let mut units = Vec::new();
    let mut i = 0;
    while i < n {
        let r = draw(seed, 3, i as u64);
        if r.is_multiple_of(2) {
            let count = (10 + (r >> 8) as usize % 91).min(n - i);
            units.push((i, count, true));
            i += count;
        } else {
            units.push((i, 1, false));
            i += 1;
        }
    }
    units
}

/// What the soak knows about one task.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// The task id, once a submit of it got a 2xx.
    pub id: Option<String>,
    pub calls: u32,
    /// Executions the executor completed successfully.
    pub successes: u32,
    /// When each success was completed (ms) and by which attempt and lease token, so a
    /// duplicate can be set against the kills in `kills.log`.
    pub success_at: Vec<(i64, u32, String)>,
    pub early: u32,
    /// The final state read back from the API (`succeeded`, `dead`, `cancelled`).
    pub end: Option<String>,
    /// The last state read back while the task was not final (`not found`: a 404).
    pub last: Option<String>,
    /// Why its last failed attempt failed, as read back once final (asyncd keeps it
    /// after a later success): shows what the socket faults and DNS outages did.
    pub last_error: Option<String>,
}

/// The accounting: executor calls and submit answers in, the verdict out.
pub struct Ledger {
    pub seed: u64,
    pub records: Vec<Record>,
    /// The first few early calls, for the report.
    pub early_samples: Vec<String>,
}

#[derive(Debug, Default, PartialEq)]
pub struct Verdict {
    pub accepted: usize,
    pub lost: usize,
    /// Lost tasks whose id answers 404 although their work ran: the submit's 2xx named an
    /// id that never reached the store (the work ran under another submit's id).
    pub lost_unknown_id: usize,
    pub early: usize,
    pub duplicates: usize,
    /// Duplicates by the task's behaviour code, to tell which path re-ran work.
    pub duplicates_by_behaviour: std::collections::BTreeMap<String, usize>,
    /// Duplicates by tenth of the run in submit order (tenth k holds tasks k·N/10..), to
    /// tell steady kills from the database and broker restarts (at a third, two thirds).
    pub duplicates_by_tenth: [usize; 10],
    pub wrong: usize,
    /// Tasks that ended succeeded although no execution of theirs answered so whole:
    /// asyncd took an answer that never arrived complete (hung, trickled, cut after its
    /// headers) for a success.
    pub unearned: usize,
    /// Tasks whose submit never got a 2xx but which ran anyway (allowed: the answer was lost).
    pub ran_unconfirmed: usize,
    pub calls: u64,
    pub successes: u64,
}

impl Verdict {
    pub fn duplicates_pct(&self) -> f64 {
        if self.accepted == 0 {
            0.0
        } else {
            self.duplicates as f64 * 100.0 / self.accepted as f64
        }
    }
}

impl Ledger {
    pub fn new(seed: u64, n: usize) -> Self {
        Self {
            seed,
            records: vec![Record::default(); n],
            early_samples: Vec::new(),
        }
    }

    /// One executor call of task `index` at `arrival_ms`. It is early when it comes before
    /// the ETA the soak asked for or the one asyncd sent with the call (a retry's), with 1 ms
    /// allowed for rounding to whole milliseconds.
    pub fn note_call(&mut self, index: usize, id: &str, arrival_ms: i64, etas_ms: &[i64]) {
        let Some(record) = self.records.get_mut(index) else {
            return;
        };
        record.calls += 1;
        if let Some(eta) = etas_ms.iter().copied().max()
            && arrival_ms + 1 < eta
        {
            record.early += 1;
            if self.early_samples.len() < 10 {
                self.early_samples.push(format!(
                    "task {index} ({id}): called at {arrival_ms}, {} ms before its ETA {eta}",
                    eta - arrival_ms
                ));
            }
        }
    }

    pub fn note_success(&mut self, index: usize, attempt: u32, lease_token: &str) {
        if let Some(record) = self.records.get_mut(index) {
            record.successes += 1;
            record
                .success_at
                .push((now_ms(), attempt, lease_token.to_string()));
        }
    }

    pub fn verdict(&self) -> Verdict {
        let mut v = Verdict::default();
        for (index, r) in self.records.iter().enumerate() {
            v.calls += u64::from(r.calls);
            v.successes += u64::from(r.successes);
            v.early += r.early as usize;
            let extra = r.successes.saturating_sub(1) as usize;
            if extra > 0 {
                v.duplicates += extra;
                let behaviour = Behaviour::of(self.seed, index as u64).code();
                *v.duplicates_by_behaviour.entry(behaviour).or_default() += extra;
                v.duplicates_by_tenth[index * 10 / self.records.len()] += extra;
            }
            if r.id.is_none() {
                if r.calls > 0 {
                    v.ran_unconfirmed += 1;
                }
                continue;
            }
            v.accepted += 1;
            let expected = Behaviour::of(self.seed, index as u64).expected().as_str();
            match r.end.as_deref() {
                None => {
                    v.lost += 1;
                    let ran = r.successes > 0 || (expected == "dead" && r.calls > 0);
                    if ran && r.last.as_deref() == Some(NOT_FOUND) {
                        v.lost_unknown_id += 1;
                    }
                }
                Some(end) if end != expected => v.wrong += 1,
                Some("succeeded") if r.successes == 0 => v.unearned += 1,
                Some(_) => {}
            }
        }
        v
    }
}

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
    // `concurrency` is a total across the three dispatchers: 768 is the 256 each they had
    // before limits held across replicas. Less, and the long 202 tasks (which hold a slot
    // for their whole lease) leave dispatch far behind the submit rate, so a full run
    // measures capacity instead of reliability.
    std::fs::write(
        jobs.join("soak.yaml"),
        format!(
            "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata: {{name: soak}}\nspec:\n  taskType: soak\n  executor: {{url: '{executor}', timeout: {}s}}\n  concurrency: 768\n  retry: {{maxRetries: {MAX_RETRIES}, initialBackoff: 200ms, maxBackoff: 2s}}\n  kafka: {{topic: asyncd-soak-{seed}-{}, partitions: 6}}\n",
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
    let net_faults = proxy.clone().map(|proxy| {
        tokio::spawn(net_faults(
            proxy,
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
        println!("network faults on the store link: {}", report.summary());
    }
    let dns_report = match dns_outages {
        Some(task) => Some(task.await?),
        None => None,
    };
    if let Some(report) = &dns_report {
        println!("DNS outages of the executor's name: {}", report.summary());
    }

    let drain_started = Instant::now();
    let missing = drain(&client, &ledger, args.drain_deadline).await;
    let drain_time = drain_started.elapsed();
    stop_sampling.store(true, Ordering::Relaxed);
    sampler.await?;
    let total = started.elapsed();

    let ledger = ledger.lock().unwrap();
    let v = ledger.verdict();
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
        println!(
            "lost: task {index} ({}, idempotency key soak-{seed}-{index}) behaviour {} last state {state}, {} calls, {} successes",
            r.id.as_deref().unwrap_or("?"),
            Behaviour::of(seed, *index as u64).code(),
            r.calls,
            r.successes
        );
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
    let mut table =
        String::from("index\tid\tbehaviour\tdelay_ms\tcalls\tsuccesses (ms@attempt/lease token)\n");
    for (index, r, delay) in &duplicated {
        let at: Vec<String> = r
            .success_at
            .iter()
            .map(|(ms, attempt, token)| format!("{ms}@{attempt}/{token}"))
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

/// The succeeded tasks that had a failed attempt, by its cause: evidence that the socket
/// faults and DNS outages reached asyncd as failed attempts, which it then retried.
fn failure_causes(records: &[Record]) -> String {
    let mut causes: BTreeMap<&'static str, usize> = BTreeMap::new();
    for r in records
        .iter()
        .filter(|r| r.end.as_deref() == Some("succeeded"))
    {
        let Some(error) = &r.last_error else { continue };
        *causes.entry(failure_cause(error)).or_default() += 1;
    }
    if causes.is_empty() {
        return "none".into();
    }
    causes
        .iter()
        .map(|(cause, n)| format!("{cause} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn failure_cause(error: &str) -> &'static str {
    if error.contains("dns error") {
        "name not resolved"
    } else if error.contains("timed out") {
        "timed out"
    } else if error.contains("body") {
        "answer cut"
    } else if error.contains("connection closed") {
        "connection closed"
    } else if error.contains("executor answered 5") {
        "5xx"
    } else {
        "other"
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
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

// ---- the executor ----------------------------------------------------------------------

#[derive(Clone)]
struct ExecutorState {
    ledger: Arc<Mutex<Ledger>>,
    http: reqwest::Client,
    apis: Vec<String>,
    huge: Bytes,
}

/// The executor's host name when DNS outages are on, and the soak's hosts file with and
/// without it (`localhost` always resolves: the roles' other addresses are numeric).
const EXECUTOR_HOST: &str = "soak-executor.test";
const HOSTS_RESOLVING: &str =
    "127.0.0.1 localhost\n::1 localhost ip6-localhost\n127.0.0.1 soak-executor.test\n";
const HOSTS_NOT_RESOLVING: &str = "127.0.0.1 localhost\n::1 localhost ip6-localhost\n";

/// Empties the executor's name out of `hosts` for 1–4 s every `every` (lengths drawn
/// from the seed) until `until_ms`, and leaves it resolving. The file is rewritten in
/// place: the dispatchers' bind mounts follow the inode, not the path.
async fn dns_outages(
    hosts: PathBuf,
    seed: u64,
    every: Duration,
    log: PathBuf,
    until_ms: Arc<AtomicI64>,
) -> NetFaultReport {
    let mut report = NetFaultReport::default();
    let mut lines = String::new();
    let mut k: u64 = 0;
    while now_ms() < until_ms.load(Ordering::Relaxed) {
        tokio::time::sleep(every).await;
        let hold = Duration::from_millis(1_000 + draw(seed, 7, k) % 3_000);
        k += 1;
        if let Err(err) = std::fs::write(&hosts, HOSTS_NOT_RESOLVING) {
            report.failed.push(format!("{err}"));
            continue;
        }
        let began = now_ms();
        tokio::time::sleep(hold).await;
        if let Err(err) = std::fs::write(&hosts, HOSTS_RESOLVING) {
            report.failed.push(format!("{err}"));
        }
        *report.by_fault.entry("outage").or_default() += 1;
        lines.push_str(&format!("{began} {}\n", now_ms()));
    }
    if let Err(err) = std::fs::write(&log, lines) {
        eprintln!("could not write {}: {err}", log.display());
    }
    report
}

/// Serves the soak's executor on a free port of 127.0.0.1; returns the port.
async fn serve_executor(state: ExecutorState) -> Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
        let state = state.clone();
        async move { execute(&state, &uri, &headers, &body).await }
    });
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr.port())
}

fn answer(status: u16, body: impl Into<Bytes>) -> Response {
    (StatusCode::from_u16(status).unwrap(), body.into()).into_response()
}

async fn execute(state: &ExecutorState, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> Response {
    let arrival = now_ms();
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let call: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let payload = &call["payload"];
    let (Some(index), Some(behaviour)) = (
        payload["i"].as_u64().map(|i| i as usize),
        payload["b"].as_str().and_then(Behaviour::parse),
    ) else {
        return answer(422, "not a soak task");
    };
    let id = header("asyncd-task-id");
    let attempt: u32 = header("asyncd-attempt").parse().unwrap_or(0);
    let lease_token = header("asyncd-lease-token");
    let redirected = uri.query().is_some_and(|q| q.contains("redirected"));
    if !redirected {
        let mut etas = Vec::with_capacity(2);
        etas.extend(payload["eta"].as_i64());
        etas.extend(
            call["eta"]
                .as_str()
                .and_then(|e| chrono::DateTime::parse_from_rfc3339(e).ok())
                .map(|e| e.timestamp_millis()),
        );
        state
            .ledger
            .lock()
            .unwrap()
            .note_call(index, &id, arrival, &etas);
    }
    let success = || {
        state
            .ledger
            .lock()
            .unwrap()
            .note_success(index, attempt, &lease_token)
    };
    match behaviour {
        Behaviour::Ok => {
            success();
            answer(200, "")
        }
        Behaviour::FailThenOk(n) if attempt <= n => answer(500, "failing on purpose"),
        Behaviour::FailThenOk(_) => {
            success();
            answer(200, "{}")
        }
        Behaviour::Slow => {
            tokio::time::sleep(EXECUTOR_TIMEOUT / 2).await;
            success();
            answer(200, "slow")
        }
        Behaviour::InvalidJson200 => {
            success();
            answer(200, "{\"ok\": tru")
        }
        Behaviour::NulBody => {
            success();
            answer(200, &b"\0ok\0\0{\0}"[..])
        }
        Behaviour::HugeBody => {
            success();
            answer(200, state.huge.clone())
        }
        Behaviour::Redirect if !redirected => {
            let mut response = answer(307, "");
            response
                .headers_mut()
                .insert("location", "/run?redirected=1".parse().unwrap());
            response
        }
        Behaviour::Redirect => {
            success();
            answer(200, "")
        }
        Behaviour::Callback | Behaviour::InvalidJson202 => {
            let state = state.clone();
            tokio::spawn(async move {
                finish_later(&state, index, attempt, &id, &lease_token).await;
            });
            if behaviour == Behaviour::Callback {
                answer(202, r#"{"lease": "10s"}"#)
            } else {
                answer(202, "{lease: ten seconds")
            }
        }
        Behaviour::Permanent => answer(422, r#"{"error": "never"}"#),
        // The first attempt's answer never arrives whole, so asyncd must count it failed
        // and try again; the work is noted as done only by an answer that can arrive.
        Behaviour::Hang if attempt <= 1 => {
            // Long past the timeout; the dispatcher has hung up by then.
            tokio::time::sleep(EXECUTOR_TIMEOUT * 4).await;
            answer(200, "too late")
        }
        Behaviour::Trickle if attempt <= 1 => {
            let bytes = futures::stream::unfold(0u32, |sent| async move {
                if sent > 0 {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                (sent < TRICKLE_BYTES)
                    .then(|| (Ok::<_, std::io::Error>(Bytes::from_static(b"x")), sent + 1))
            });
            body_answer(TRICKLE_BYTES, bytes)
        }
        Behaviour::CutAfterHeaders if attempt <= 1 => {
            // An error from the body stream makes hyper close the connection mid-body;
            // it comes a moment later, or hyper gives up before the headers are out.
            let bytes = futures::stream::iter([Ok(Bytes::from_static(b"{\"ok\": "))]).chain(
                futures::stream::once(async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Err(std::io::Error::other("the executor hangs up"))
                }),
            );
            body_answer(100, bytes)
        }
        Behaviour::Hang | Behaviour::Trickle | Behaviour::CutAfterHeaders => {
            success();
            answer(200, "")
        }
    }
}

/// How long a trickled answer is, in bytes (one a second): many times the timeout.
const TRICKLE_BYTES: u32 = 64;

/// A 200 whose headers promise `length` bytes and whose body is `bytes`.
fn body_answer<S>(length: u32, bytes: S) -> Response
where
    S: futures::Stream<Item = std::io::Result<Bytes>> + Send + 'static,
{
    let mut response = Response::new(axum::body::Body::from_stream(bytes));
    response
        .headers_mut()
        .insert("content-length", length.into());
    response
}

/// The long-running half of a 202: a heartbeat, then the success result, through any API
/// process that answers (they are being killed too).
async fn finish_later(
    state: &ExecutorState,
    index: usize,
    attempt: u32,
    id: &str,
    lease_token: &str,
) {
    tokio::time::sleep(Duration::from_millis(200)).await;
    let heartbeat = json!({"lease_token": lease_token, "lease": "10s"});
    let path = format!("/v1/tasks/{id}/heartbeat");
    if post_retrying(state, &path, &heartbeat).await != Some(200) {
        return; // stale: a newer attempt has the task
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    state
        .ledger
        .lock()
        .unwrap()
        .note_success(index, attempt, lease_token);
    let result = json!({"lease_token": lease_token, "status": "success", "output": {"i": index}});
    post_retrying(state, &format!("/v1/tasks/{id}/result"), &result).await;
}

async fn post_retrying(state: &ExecutorState, path: &str, body: &Value) -> Option<u16> {
    let start = Instant::now();
    let mut k = 0;
    while start.elapsed() < Duration::from_secs(30) {
        let base = &state.apis[k % state.apis.len()];
        k += 1;
        if let Ok(r) = state
            .http
            .post(format!("{base}{path}"))
            .json(body)
            .send()
            .await
            && r.status() != 503
        {
            return Some(r.status().as_u16());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

// ---- the processes ---------------------------------------------------------------------

struct Proc {
    role: &'static str,
    name: String,
    args: Vec<String>,
    child: Option<Child>,
}

struct Fleet {
    binary: PathBuf,
    /// The store URL, handed over in the environment.
    store: String,
    /// The soak's hosts file, which the dispatchers see as `/etc/hosts` (DNS outages).
    hosts: Option<PathBuf>,
    logs: PathBuf,
    procs: Vec<Proc>,
    /// Per role, across its processes and their restarts.
    usage: BTreeMap<&'static str, Usage>,
    kills: BTreeMap<&'static str, u32>,
    /// Exits nobody asked for.
    crashes: BTreeMap<&'static str, u32>,
}

impl Fleet {
    fn start(
        binary: PathBuf,
        args: &Args,
        store: &str,
        hosts: Option<PathBuf>,
        apis: &[String],
        jobs: &Path,
        logs: &Path,
    ) -> Result<Self> {
        let common = |listen: &str, instance: &str| -> Vec<String> {
            [
                "--config",
                &jobs.display().to_string(),
                "--listen",
                listen,
                "--instance",
                instance,
                "--kafka-brokers",
                &args.kafka_brokers,
                "--create-topics",
                "--kafka-threshold",
                &format!("{}ms", args.kafka_threshold.as_millis()),
                // A killed dispatcher's claims come back after this, not the default 30 s.
                "--claim-hold",
                "5s",
                "--advertise-url",
                &apis[0],
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        };
        let mut procs = Vec::new();
        let mut add = |role: &'static str, i: usize, listen: String| {
            let name = format!("soak-{role}-{i}");
            let mut argv = vec![role.to_string()];
            argv.extend(common(&listen, &name));
            procs.push(Proc {
                role,
                name,
                args: argv,
                child: None,
            });
        };
        for (i, api) in apis.iter().enumerate() {
            add("api", i, api.trim_start_matches("http://").to_string());
        }
        for i in 0..args.dispatchers {
            add("dispatcher", i, format!("127.0.0.1:{}", free_port()?));
        }
        for i in 0..args.schedulers {
            add("scheduler", i, format!("127.0.0.1:{}", free_port()?));
        }
        let mut fleet = Self {
            binary,
            store: store.to_string(),
            hosts,
            logs: logs.to_path_buf(),
            procs,
            usage: BTreeMap::new(),
            kills: BTreeMap::new(),
            crashes: BTreeMap::new(),
        };
        for i in 0..fleet.procs.len() {
            fleet.spawn(i)?;
        }
        Ok(fleet)
    }

    fn spawn(&mut self, i: usize) -> Result<()> {
        let p = &mut self.procs[i];
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.join(format!("{}.log", p.name)))?;
        // A dispatcher with the soak's hosts file: `unshare` and `sh` exec in place, so the
        // pid is asyncd's, and the bind mount is seen by it alone.
        let mut command = match &self.hosts {
            Some(hosts) if p.role == "dispatcher" => {
                let mut command = Command::new("unshare");
                command
                    .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
                    .arg(r#"hosts=$1; shift; mount --bind "$hosts" /etc/hosts && exec "$@""#)
                    .arg("soak-dispatcher")
                    .arg(hosts)
                    .arg(&self.binary);
                command
            }
            _ => Command::new(&self.binary),
        };
        let child = command
            .args(&p.args)
            .env("ASYNCD_STORE", &self.store)
            .env("ASYNCD_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", p.name))?;
        p.child = Some(child);
        Ok(())
    }

    /// SIGKILL, after one last look at its peak memory.
    /// SIGKILLs process `i`; returns its name.
    fn kill(&mut self, i: usize) -> String {
        self.sample();
        let p = &mut self.procs[i];
        if let Some(mut child) = p.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            *self.kills.entry(p.role).or_default() += 1;
        }
        p.name.clone()
    }

    /// Notes each live process's memory and open descriptors; restarts one that died on
    /// its own.
    fn sample(&mut self) {
        let mut crashed = Vec::new();
        // This sample's largest process per role: what the role's "last" figures become.
        let mut now: BTreeMap<&'static str, (u64, usize)> = BTreeMap::new();
        for (i, p) in self.procs.iter_mut().enumerate() {
            let Some(child) = &mut p.child else { continue };
            if let Ok(Some(status)) = child.try_wait() {
                eprintln!("{} exited by itself: {status}; restarting it", p.name);
                p.child = None;
                crashed.push(i);
                continue;
            }
            let pid = child.id();
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
            let usage = self.usage.entry(p.role).or_default();
            usage.peak_rss_kib = usage.peak_rss_kib.max(status_kib(&status, "VmHWM:"));
            usage.peak_fds = usage.peak_fds.max(fds);
            let last = now.entry(p.role).or_default();
            *last = (last.0.max(status_kib(&status, "VmRSS:")), last.1.max(fds));
        }
        for (role, (rss, fds)) in now {
            let usage = self.usage.entry(role).or_default();
            (usage.last_rss_kib, usage.last_fds) = (rss, fds);
        }
        for i in crashed {
            *self.crashes.entry(self.procs[i].role).or_default() += 1;
            if let Err(err) = self.spawn(i) {
                eprintln!("restart failed: {err:#}");
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for p in &mut self.procs {
            if let Some(mut child) = p.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// A role's memory and open descriptors over the run: a leak shows as a last value
/// near the peak that keeps climbing from run to run, where a flat role's last value
/// falls back once a burst has passed.
#[derive(Default)]
struct Usage {
    /// Highest VmHWM of any of its processes.
    peak_rss_kib: u64,
    /// VmRSS of its largest process at the last sample.
    last_rss_kib: u64,
    peak_fds: usize,
    last_fds: usize,
}

/// A `kB` field of `/proc/PID/status`.
fn status_kib(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The network faults put on the store link, by kind, and those the proxy refused.
#[derive(Default)]
struct NetFaultReport {
    by_fault: BTreeMap<&'static str, u32>,
    failed: Vec<String>,
}

impl NetFaultReport {
    fn summary(&self) -> String {
        let mut parts: Vec<String> = self
            .by_fault
            .iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        if parts.is_empty() {
            parts.push("none".into());
        }
        if !self.failed.is_empty() {
            parts.push(format!("{} FAILED ({})", self.failed.len(), self.failed[0]));
        }
        parts.join(", ")
    }
}

/// Puts one network fault after another on the store link (each `every`, for 1–5 s,
/// the kind drawn from the seed) until `until_ms`; every fault is taken off again before
/// the next, and before this returns.
async fn net_faults(
    proxy: Arc<Proxy>,
    seed: u64,
    every: Duration,
    log: PathBuf,
    until_ms: Arc<AtomicI64>,
) -> NetFaultReport {
    let mut report = NetFaultReport::default();
    let mut lines = String::new();
    let mut k: u64 = 0;
    while now_ms() < until_ms.load(Ordering::Relaxed) {
        tokio::time::sleep(every).await;
        let fault = Fault::ALL[(draw(seed, 5, k) % Fault::ALL.len() as u64) as usize];
        let hold = Duration::from_millis(1_000 + draw(seed, 6, k) % 4_000);
        k += 1;
        if let Err(err) = proxy.add(fault).await {
            report.failed.push(format!("{err}"));
            // A fault half put on (one direction of two) must not outlive this turn.
            let _ = proxy.remove(fault).await;
            continue;
        }
        let began = now_ms();
        tokio::time::sleep(hold).await;
        // The proxy's API is local and never faulted: a refusal here is a broken run.
        let mut removed = proxy.remove(fault).await;
        for _ in 0..3 {
            if removed.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            removed = proxy.remove(fault).await;
        }
        if let Err(err) = removed {
            report.failed.push(format!("{err}"));
        }
        *report.by_fault.entry(fault.name()).or_default() += 1;
        lines.push_str(&format!("{began} {} {}\n", now_ms(), fault.name()));
    }
    if let Err(err) = std::fs::write(&log, lines) {
        eprintln!("could not write {}: {err}", log.display());
    }
    report
}

struct ChaosPlan {
    seed: u64,
    every: Duration,
    db_restart: Option<String>,
    broker_restart: Option<String>,
    total: usize,
    logs: PathBuf,
}

#[derive(Default)]
struct ChaosReport {
    kills: u32,
    db: &'static str,
    broker: &'static str,
    db_ok: bool,
    broker_ok: bool,
}

/// Kills one role process after another (round robin, down for 0.2–1.5 s each), and
/// restarts the database once a third of the tasks are in and the broker at two thirds.
async fn chaos(
    fleet: Arc<Mutex<Fleet>>,
    plan: ChaosPlan,
    submitted: Arc<AtomicUsize>,
    until_ms: Arc<AtomicI64>,
) -> ChaosReport {
    let mut report = ChaosReport {
        db: "not run",
        broker: "not run",
        db_ok: true,
        broker_ok: true,
        ..ChaosReport::default()
    };
    let mut outages = Vec::new();
    let (mut db_pending, mut broker_pending) = (plan.db_restart, plan.broker_restart);
    let count = fleet.lock().unwrap().procs.len();
    let mut k: u64 = 0;
    let mut kill_log = String::new();
    while now_ms() < until_ms.load(Ordering::Relaxed) {
        tokio::time::sleep(plan.every).await;
        let done = submitted.load(Ordering::Relaxed);
        if done * 3 >= plan.total
            && let Some(cmd) = db_pending.take()
        {
            outages.push(("database", outage(cmd, plan.logs.join("db-restart.log"))));
        }
        if done * 3 >= plan.total * 2
            && let Some(cmd) = broker_pending.take()
        {
            outages.push(("broker", outage(cmd, plan.logs.join("broker-restart.log"))));
        }
        let victim = (k as usize) % count;
        let down = Duration::from_millis(200 + draw(plan.seed, 4, k) % 1300);
        k += 1;
        let name = fleet.lock().unwrap().kill(victim);
        report.kills += 1;
        kill_log.push_str(&format!("{} {name}\n", now_ms()));
        tokio::time::sleep(down).await;
        if let Err(err) = fleet.lock().unwrap().spawn(victim) {
            eprintln!("restart failed: {err:#}");
        }
    }
    if let Err(err) = std::fs::write(plan.logs.join("kills.log"), kill_log) {
        eprintln!("could not write kills.log: {err}");
    }
    for (what, handle) in outages {
        let ok = handle.await.unwrap_or(false);
        let text = if ok { "done" } else { "FAILED" };
        if what == "database" {
            (report.db, report.db_ok) = (text, ok);
        } else {
            (report.broker, report.broker_ok) = (text, ok);
        }
    }
    report
}

fn outage(cmd: String, log: PathBuf) -> tokio::task::JoinHandle<bool> {
    eprintln!("chaos: {cmd}");
    tokio::task::spawn_blocking(move || {
        let Ok(out) = std::fs::File::create(&log) else {
            return false;
        };
        let err = out.try_clone();
        let Ok(err) = err else { return false };
        Command::new("bash")
            .args(["-c", &cmd])
            .stdout(out)
            .stderr(err)
            .status()
            .is_ok_and(|s| s.success())
    })
}

// ---- submitting and draining -----------------------------------------------------------

struct Submitter {
    http: reqwest::Client,
    apis: Vec<String>,
    next: AtomicUsize,
}

impl Submitter {
    fn base(&self) -> &str {
        &self.apis[self.next.fetch_add(1, Ordering::Relaxed) % self.apis.len()]
    }

    /// One try on the next API process: the status and body, or None for a connection error.
    async fn post(&self, path: &str, body: &Value) -> Option<(u16, Value)> {
        let r = self
            .http
            .post(format!("{}{path}", self.base()))
            .json(body)
            .send()
            .await
            .ok()?;
        let status = r.status().as_u16();
        Some((status, r.json().await.unwrap_or(Value::Null)))
    }

    async fn get(&self, path: &str) -> Option<(u16, Value)> {
        let r = self
            .http
            .get(format!("{}{path}", self.base()))
            .send()
            .await
            .ok()?;
        let status = r.status().as_u16();
        Some((status, r.json().await.unwrap_or(Value::Null)))
    }
}

fn submit_body(seed: u64, index: usize, max_delay_ms: u64) -> Value {
    let eta = now_ms() + delay_ms(seed, index as u64, max_delay_ms) as i64;
    let behaviour = Behaviour::of(seed, index as u64);
    json!({
        "type": "soak",
        "payload": {"i": index, "b": behaviour.code(), "eta": eta},
        "eta": chrono::DateTime::from_timestamp_millis(eta)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "idempotency_key": format!("soak-{seed}-{index}"),
    })
}

async fn submit_all(
    client: &Submitter,
    args: &Args,
    seed: u64,
    ledger: &Arc<Mutex<Ledger>>,
    submitted: &Arc<AtomicUsize>,
) {
    let start = Instant::now();
    let max_delay_ms = args.max_delay.as_millis() as u64;
    let rate = args.rate.max(1) as f64;
    let refused = AtomicUsize::new(0);
    futures::stream::iter(units(seed, args.tasks))
        .for_each_concurrent(32, |(first, count, batch)| {
            let refused = &refused;
            async move {
                let due = Duration::from_secs_f64(first as f64 / rate);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    tokio::time::sleep(wait).await;
                }
                let bodies: Vec<(usize, Value)> = (first..first + count)
                    .map(|i| (i, submit_body(seed, i, max_delay_ms)))
                    .collect();
                let outcome = submit_unit(client, bodies, batch).await;
                let mut ledger = ledger.lock().unwrap();
                for (i, id) in outcome.accepted {
                    ledger.records[i].id = Some(id);
                }
                drop(ledger);
                if !outcome.refused.is_empty() {
                    refused.fetch_add(outcome.refused.len(), Ordering::Relaxed);
                    eprintln!("refused: {}", outcome.refused[0]);
                }
                submitted.fetch_add(count, Ordering::Relaxed);
            }
        })
        .await;
    let refused = refused.into_inner();
    if refused > 0 {
        eprintln!("{refused} submits were refused or never got a 2xx");
    }
}

#[derive(Default)]
struct UnitOutcome {
    accepted: Vec<(usize, String)>,
    refused: Vec<String>,
}

/// Submits until each task got a 2xx or a permanent refusal, retrying 503s and connection
/// errors for up to two minutes (the idempotency key makes a repeat safe).
async fn submit_unit(
    client: &Submitter,
    mut bodies: Vec<(usize, Value)>,
    batch: bool,
) -> UnitOutcome {
    let mut out = UnitOutcome::default();
    let start = Instant::now();
    let mut backoff = Duration::from_millis(50);
    while !bodies.is_empty() {
        if start.elapsed() > Duration::from_secs(120) {
            out.refused.extend(
                bodies
                    .iter()
                    .map(|(i, _)| format!("task {i}: no 2xx within 120 s")),
            );
            break;
        }
        let mut retry = Vec::new();
        if batch {
            let tasks: Vec<&Value> = bodies.iter().map(|(_, b)| b).collect();
            match client
                .post("/v1/tasks:batch", &json!({"tasks": tasks}))
                .await
            {
                Some((200, answer)) => {
                    let results = answer["results"].as_array().cloned().unwrap_or_default();
                    for ((i, body), result) in bodies
                        .into_iter()
                        .zip(results.into_iter().map(Some).chain(std::iter::repeat(None)))
                    {
                        match result {
                            Some(r) if matches!(r["status"].as_u64(), Some(200 | 201)) => {
                                out.accepted
                                    .push((i, r["id"].as_str().unwrap_or("").to_string()));
                            }
                            Some(r) if r["status"].as_u64().is_some_and(|s| s < 500) => {
                                out.refused.push(format!("task {i}: {r}"));
                            }
                            _ => retry.push((i, body)),
                        }
                    }
                }
                Some((status, answer)) if status < 500 => {
                    out.refused
                        .push(format!("batch at {}: {status} {answer}", bodies[0].0));
                    break;
                }
                _ => retry = bodies,
            }
        } else {
            for (i, body) in bodies {
                match client.post("/v1/tasks", &body).await {
                    Some((200 | 201, answer)) => out
                        .accepted
                        .push((i, answer["id"].as_str().unwrap_or("").to_string())),
                    Some((status, answer)) if status < 500 => {
                        out.refused.push(format!("task {i}: {status} {answer}"));
                    }
                    _ => retry.push((i, body)),
                }
            }
        }
        bodies = retry;
        if !bodies.is_empty() {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }
    out
}

/// Reads every accepted task back until all are final or the deadline passes; returns the
/// ones that never got there, with the last state seen.
async fn drain(
    client: &Submitter,
    ledger: &Arc<Mutex<Ledger>>,
    deadline: Duration,
) -> Vec<(usize, String)> {
    let start = Instant::now();
    let mut pending: Vec<(usize, String, String)> = ledger
        .lock()
        .unwrap()
        .records
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.id.clone().map(|id| (i, id, "unread".to_string())))
        .collect();
    let mut last_print = Instant::now();
    loop {
        // A pass over 10⁶ tasks takes minutes: only a read begun after the deadline may
        // call a task unfinished, or one that finished while an earlier pass went on
        // would be counted lost.
        let pass_began = start.elapsed();
        let pending_before = pending.len();
        let read: Vec<(usize, String, String, Option<String>)> = futures::stream::iter(pending)
            .map(|(i, id, last)| async move {
                let (state, error) = match client.get(&format!("/v1/tasks/{id}")).await {
                    Some((200, task)) => (
                        task["state"].as_str().unwrap_or("?").to_string(),
                        task["last_error"].as_str().map(str::to_string),
                    ),
                    Some((404, _)) => (NOT_FOUND.to_string(), None),
                    _ => (last, None),
                };
                (i, id, state, error)
            })
            .buffer_unordered(32)
            .collect()
            .await;
        let mut still: Vec<(usize, String, String)> = Vec::new();
        {
            let mut ledger = ledger.lock().unwrap();
            for (i, id, state, error) in read {
                if matches!(state.as_str(), "succeeded" | "dead" | "cancelled") {
                    ledger.records[i].end = Some(state);
                    ledger.records[i].last_error = error;
                } else {
                    ledger.records[i].last = Some(state.clone());
                    still.push((i, id, state));
                }
            }
        }
        if still.len() != pending_before || last_print.elapsed() > Duration::from_secs(30) {
            eprintln!(
                "drain: {} unfinished after {:.0} s",
                still.len(),
                start.elapsed().as_secs_f64()
            );
            last_print = Instant::now();
        }
        pending = still;
        if pending.is_empty() || pass_began > deadline {
            return pending.into_iter().map(|(i, _, s)| (i, s)).collect();
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn behaviour_is_a_function_of_the_seed_and_index_and_survives_the_payload() {
        for index in 0..10_000 {
            let b = Behaviour::of(7, index);
            assert_eq!(b, Behaviour::of(7, index));
            assert_eq!(Behaviour::parse(&b.code()), Some(b), "{b:?}");
        }
        assert_eq!(Behaviour::parse("fail"), None);
        assert_eq!(Behaviour::parse("bogus"), None);
        // Other seeds give other runs.
        let differing = (0..1000)
            .filter(|i| Behaviour::of(7, *i) != Behaviour::of(8, *i))
            .count();
        assert!(differing > 100, "{differing}");
    }

    #[test]
    fn every_behaviour_occurs_in_about_its_share() {
        let n = 100_000;
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for index in 0..n {
            let code = match Behaviour::of(42, index) {
                Behaviour::FailThenOk(k) => {
                    assert!((1..=3).contains(&k));
                    "fail".to_string()
                }
                b => b.code(),
            };
            *counts.entry(code).or_default() += 1;
        }
        let share = |code: &str| counts.get(code).copied().unwrap_or(0) as f64 / n as f64;
        assert!((share("ok") - 0.785).abs() < 0.01, "{counts:?}");
        assert!((share("fail") - 0.06).abs() < 0.005, "{counts:?}");
        assert!((share("permanent") - 0.02).abs() < 0.003, "{counts:?}");
        for socket in ["hang", "trickle", "cut"] {
            assert!((share(socket) - 0.005).abs() < 0.002, "{counts:?}");
        }
        assert_eq!(counts.len(), 13, "{counts:?}");
    }

    #[test]
    fn failed_attempts_are_told_apart_by_asyncds_reason() {
        // Reasons as asyncd wrote them in a soak run.
        for (reason, cause) in [
            (
                "executor call failed: error sending request for url (http://soak-executor.test:45285/run): client error (Connect): dns error: error resolving DNS: failed to lookup address information: Name or service not known",
                "name not resolved",
            ),
            (
                "executor call timed out after 3s (the attempt's timeout)",
                "timed out",
            ),
            (
                "executor call failed: error decoding response body: request or response body error",
                "answer cut",
            ),
            (
                "executor call failed: error sending request for url (http://soak-executor.test:45285/run): client error (SendRequest): connection closed before message completed",
                "connection closed",
            ),
            ("executor answered 500 Internal Server Error", "5xx"),
            ("executor answered 422 Unprocessable Entity", "other"),
        ] {
            assert_eq!(failure_cause(reason), cause, "{reason}");
        }
    }

    #[test]
    fn only_permanent_failures_and_redirects_end_dead() {
        assert_eq!(Behaviour::Permanent.expected(), EndState::Dead);
        assert_eq!(Behaviour::Redirect.expected(), EndState::Dead);
        for b in [
            Behaviour::Ok,
            Behaviour::FailThenOk(3),
            Behaviour::Slow,
            Behaviour::InvalidJson200,
            Behaviour::InvalidJson202,
            Behaviour::NulBody,
            Behaviour::HugeBody,
            Behaviour::Callback,
            Behaviour::Hang,
            Behaviour::Trickle,
            Behaviour::CutAfterHeaders,
        ] {
            assert_eq!(b.expected(), EndState::Succeeded, "{b:?}");
        }
    }

    #[test]
    fn delays_cover_both_routes_within_the_maximum() {
        let delays: Vec<u64> = (0..10_000).map(|i| delay_ms(3, i, 60_000)).collect();
        assert!(delays.iter().all(|d| *d <= 60_000));
        let now = delays.iter().filter(|d| **d == 0).count();
        assert!((800..1200).contains(&now), "{now}");
        let store_route = delays.iter().filter(|d| **d > 20_000).count();
        assert!((5500..6500).contains(&store_route), "{store_route}");
    }

    #[test]
    fn units_cover_every_index_once_with_singles_and_batches() {
        let units = units(5, 10_007);
        let mut next = 0;
        for (first, count, batch) in &units {
            assert_eq!(*first, next);
            assert!(*count >= 1 && *count <= 100);
            if !batch {
                assert_eq!(*count, 1);
            }
            next += count;
        }
        assert_eq!(next, 10_007);
        assert!(units.iter().any(|u| u.2) && units.iter().any(|u| !u.2));
    }

    fn index_of(seed: u64, wanted: Behaviour) -> usize {
        (0..).find(|i| Behaviour::of(seed, *i) == wanted).unwrap() as usize
    }

    #[test]
    fn the_verdict_counts_losses_wrong_ends_duplicates_and_early_calls() {
        let seed = 11;
        let ok = index_of(seed, Behaviour::Ok);
        let dead = index_of(seed, Behaviour::Permanent);
        // Room for more plain tasks than `ok`.
        let mut ledger = Ledger::new(seed, ok.max(dead) + 50);
        let n = ledger.records.len();
        // Everything accepted and ended as expected, each once...
        for i in 0..n {
            let r = &mut ledger.records[i];
            r.id = Some(format!("t{i}"));
            let expected = Behaviour::of(seed, i as u64).expected();
            r.end = Some(expected.as_str().into());
            r.successes = u32::from(expected == EndState::Succeeded);
        }
        assert_eq!(
            ledger.verdict(),
            Verdict {
                accepted: n,
                successes: ledger.records.iter().map(|r| u64::from(r.successes)).sum(),
                ..Verdict::default()
            }
        );
        // ...then one lost, one wrong, two extra successes, one early and one on-time call.
        ledger.records[ok].end = None;
        ledger.records[ok].successes = 0;
        ledger.records[dead].end = Some("succeeded".into());
        ledger.note_success(ok, 1, "a");
        ledger.note_success(ok, 2, "b");
        ledger.note_success(ok, 2, "c");
        ledger.note_call(ok, "t", 1_000, &[1_001]); // rounding: not early
        ledger.note_call(ok, "t", 1_000, &[1_002, 900]); // the later ETA counts: early
        let v = ledger.verdict();
        assert_eq!(v.accepted, n);
        assert_eq!(v.lost, 1);
        assert_eq!(v.wrong, 1);
        assert_eq!(v.duplicates, 2);
        assert_eq!(v.duplicates_by_behaviour.get("ok"), Some(&2));
        assert_eq!(v.duplicates_by_behaviour.len(), 1);
        assert_eq!(v.duplicates_by_tenth.iter().sum::<usize>(), 2);
        assert_eq!(v.duplicates_by_tenth[ok * 10 / n], 2);
        // Each success keeps its attempt and lease token, for duplicates.tsv.
        let kept: Vec<(u32, &str)> = ledger.records[ok]
            .success_at
            .iter()
            .map(|(_, attempt, token)| (*attempt, token.as_str()))
            .collect();
        assert_eq!(kept, [(1, "a"), (2, "b"), (2, "c")]);
        assert_eq!(v.early, 1);
        assert_eq!(v.calls, 2);
        assert_eq!(ledger.early_samples.len(), 1);
        assert!((v.duplicates_pct() - 200.0 / n as f64).abs() < 1e-9);
        assert_eq!(v.lost_unknown_id, 0);
        assert_eq!(v.unearned, 0, "the wrong end is not counted twice");
        // A success no executor answer reported is told apart.
        let other_ok = (0..n)
            .find(|i| *i != ok && Behaviour::of(seed, *i as u64) == Behaviour::Ok)
            .expect("two plain tasks");
        ledger.records[other_ok].successes = 0;
        assert_eq!(ledger.verdict().unearned, 1);
        ledger.records[other_ok].successes = 1;
        // A lost task whose id answers 404 while its work ran is told apart.
        ledger.records[ok].last = Some(NOT_FOUND.into());
        assert_eq!(ledger.verdict().lost_unknown_id, 1);
        ledger.records[ok].successes = 0;
        assert_eq!(ledger.verdict().lost_unknown_id, 0);
        assert_eq!(ledger.verdict().lost, 1);
    }

    #[test]
    fn a_task_without_a_2xx_is_not_accepted_and_may_still_run() {
        let mut ledger = Ledger::new(1, 2);
        ledger.records[0].id = Some("a".into());
        ledger.records[0].end = Some(Behaviour::of(1, 0).expected().as_str().into());
        ledger.note_call(1, "b", 5, &[5]);
        let v = ledger.verdict();
        assert_eq!(v.accepted, 1);
        assert_eq!(v.lost, 0);
        assert_eq!(v.ran_unconfirmed, 1);
    }
}

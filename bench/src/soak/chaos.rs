//! The chaos: role processes killed and restarted, the database and the broker
//! restarted, network faults on the store link and DNS outages of the executor's name.

use super::*;

/// The executor's host name when DNS outages are on, and the soak's hosts file with and
/// without it (`localhost` always resolves: the roles' other addresses are numeric).
pub(super) const EXECUTOR_HOST: &str = "soak-executor.test";
pub(super) const HOSTS_RESOLVING: &str =
    "127.0.0.1 localhost\n::1 localhost ip6-localhost\n127.0.0.1 soak-executor.test\n";
pub(super) const HOSTS_NOT_RESOLVING: &str = "127.0.0.1 localhost\n::1 localhost ip6-localhost\n";

/// Empties the executor's name out of `hosts` for 1–4 s every `every` (lengths drawn
/// from the seed) until `until_ms`, and leaves it resolving. The file is rewritten in
/// place: the dispatchers' bind mounts follow the inode, not the path.
pub(super) async fn dns_outages(
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
        *report.by_fault.entry("outage".into()).or_default() += 1;
        lines.push_str(&format!("{began} {}\n", now_ms()));
    }
    if let Err(err) = std::fs::write(&log, lines) {
        eprintln!("could not write {}: {err}", log.display());
    }
    report
}

/// The network faults put on the store link, by kind, and those the proxy refused.
#[derive(Default)]
pub(super) struct NetFaultReport {
    pub(super) by_fault: BTreeMap<String, u32>,
    pub(super) failed: Vec<String>,
    /// When the store link was faulted, from the fault's start to its removal (ms).
    pub(super) store_faulted: Vec<(i64, i64)>,
}

impl NetFaultReport {
    pub(super) fn summary(&self) -> String {
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

/// Puts one network fault after another on one of the `links` (each `every`, for 1–5 s,
/// the link and the kind drawn from the seed) until `until_ms`; every fault is taken off
/// again before the next, and before this returns.
pub(super) async fn net_faults(
    links: Vec<(&'static str, Arc<Proxy>)>,
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
        let (link, proxy) = &links[(draw(seed, 8, k) % links.len() as u64) as usize];
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
        *report
            .by_fault
            .entry(format!("{link}: {}", fault.name()))
            .or_default() += 1;
        let ended = now_ms();
        if *link == "store" {
            report.store_faulted.push((began, ended));
        }
        lines.push_str(&format!("{began} {ended} {link} {}\n", fault.name()));
    }
    if let Err(err) = std::fs::write(&log, lines) {
        eprintln!("could not write {}: {err}", log.display());
    }
    report
}

pub(super) struct ChaosPlan {
    pub(super) seed: u64,
    pub(super) every: Duration,
    pub(super) db_restart: Option<String>,
    pub(super) broker_restart: Option<String>,
    pub(super) total: usize,
    pub(super) logs: PathBuf,
}

#[derive(Default)]
pub(super) struct ChaosReport {
    pub(super) kills: u32,
    /// Each dispatcher SIGKILL: when, and which process.
    pub(super) dispatcher_kills: Vec<Kill>,
    /// When the database was down for its restart (ms), once it ran.
    pub(super) db_down: Option<(i64, i64)>,
    pub(super) db: &'static str,
    pub(super) broker: &'static str,
    pub(super) db_ok: bool,
    pub(super) broker_ok: bool,
}

/// Kills one role process after another (round robin, down for 0.2–1.5 s each), and
/// restarts the database once a third of the tasks are in and the broker at two thirds.
pub(super) async fn chaos(
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
        let (name, pid) = fleet.lock().unwrap().kill(victim);
        let killed_at = now_ms();
        report.kills += 1;
        if name.contains("dispatcher")
            && let Some(pid) = pid
        {
            report.dispatcher_kills.push(Kill { at: killed_at, pid });
        }
        let pid = pid.map_or("-".into(), |pid| pid.to_string());
        kill_log.push_str(&format!("{killed_at} {name} {pid}\n"));
        tokio::time::sleep(down).await;
        if let Err(err) = fleet.lock().unwrap().spawn(victim) {
            eprintln!("restart failed: {err:#}");
        }
    }
    if let Err(err) = std::fs::write(plan.logs.join("kills.log"), kill_log) {
        eprintln!("could not write kills.log: {err}");
    }
    for (what, handle) in outages {
        let (ok, down) = handle.await.unwrap_or((false, (0, 0)));
        let text = if ok { "done" } else { "FAILED" };
        if what == "database" {
            (report.db, report.db_ok) = (text, ok);
            report.db_down = Some(down);
        } else {
            (report.broker, report.broker_ok) = (text, ok);
        }
    }
    report
}

/// Runs `cmd` (a server restart): whether it succeeded, and when it began and ended (ms).
pub(super) fn outage(cmd: String, log: PathBuf) -> tokio::task::JoinHandle<(bool, (i64, i64))> {
    eprintln!("chaos: {cmd}");
    tokio::task::spawn_blocking(move || {
        let began = now_ms();
        let Ok(out) = std::fs::File::create(&log) else {
            return (false, (began, now_ms()));
        };
        let err = out.try_clone();
        let Ok(err) = err else {
            return (false, (began, now_ms()));
        };
        let ok = Command::new("bash")
            .args(["-c", &cmd])
            .stdout(out)
            .stderr(err)
            .status()
            .is_ok_and(|s| s.success());
        (ok, (began, now_ms()))
    })
}

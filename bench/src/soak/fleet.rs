//! The asyncd processes of the run: started, killed, restarted, and their memory and
//! descriptors sampled; what their logs say about a task.

use super::*;

pub(super) struct Proc {
    pub(super) role: &'static str,
    pub(super) name: String,
    pub(super) args: Vec<String>,
    pub(super) child: Option<Child>,
}

pub(super) struct Fleet {
    pub(super) binary: PathBuf,
    /// The store URL, handed over in the environment.
    pub(super) store: String,
    /// The soak's hosts file, which the dispatchers see as `/etc/hosts` (DNS outages).
    pub(super) hosts: Option<PathBuf>,
    pub(super) logs: PathBuf,
    pub(super) procs: Vec<Proc>,
    /// Per role, across its processes and their restarts.
    pub(super) usage: BTreeMap<&'static str, Usage>,
    pub(super) kills: BTreeMap<&'static str, u32>,
    /// Exits nobody asked for.
    pub(super) crashes: BTreeMap<&'static str, u32>,
}

impl Fleet {
    pub(super) fn start(
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
            if role == "dispatcher" && args.outcome_journal {
                let journal = logs.join(format!("{name}-journal"));
                argv.extend(["--outcome-journal".into(), journal.display().to_string()]);
            }
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

    pub(super) fn spawn(&mut self, i: usize) -> Result<()> {
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
            // The journal's recoveries at info: how many outcomes each restart wrote.
            .env("ASYNCD_LOG", "warn,asyncd::dispatch::journal=info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", p.name))?;
        p.child = Some(child);
        Ok(())
    }

    /// SIGKILLs process `i`, after one last look at its memory; returns its name and the
    /// pid killed (none when it was not running).
    pub(super) fn kill(&mut self, i: usize) -> (String, Option<u32>) {
        self.sample();
        let p = &mut self.procs[i];
        let mut pid = None;
        if let Some(mut child) = p.child.take() {
            pid = Some(child.id());
            let _ = child.kill();
            let _ = child.wait();
            *self.kills.entry(p.role).or_default() += 1;
        }
        (p.name.clone(), pid)
    }

    /// Notes each live process's memory and open descriptors; restarts one that died on
    /// its own.
    pub(super) fn sample(&mut self) {
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
pub(super) struct Usage {
    /// Highest VmHWM of any of its processes.
    pub(super) peak_rss_kib: u64,
    /// VmRSS of its largest process at the last sample.
    pub(super) last_rss_kib: u64,
    pub(super) peak_fds: usize,
    pub(super) last_fds: usize,
}

/// A `kB` field of `/proc/PID/status`.
pub(super) fn status_kib(status: &str, field: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The lines of the role logs in `logs` that name `id`, each prefixed with its file.
pub(super) fn log_lines_naming(logs: &Path, id: &str) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(logs) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "log"))
        .collect();
    files.sort();
    let mut lines = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let name = file.file_name().unwrap_or_default().to_string_lossy();
        lines.extend(
            text.lines()
                .filter(|line| line.contains(id))
                .map(|line| format!("{name}: {line}")),
        );
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lines_naming_an_id_are_found_in_every_role_log_and_only_there() {
        let dir = std::env::temp_dir().join(format!("soak-logs-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("soak-api-0.log"), "a\nproduce failed id=t-1\nb\n").unwrap();
        std::fs::write(
            dir.join("soak-dispatcher-0.log"),
            "stored t-2\nrefused t-1\n",
        )
        .unwrap();
        std::fs::write(dir.join("kills.tsv"), "t-1\n").unwrap();
        let lines = log_lines_naming(&dir, "t-1");
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            lines,
            [
                "soak-api-0.log: produce failed id=t-1",
                "soak-dispatcher-0.log: refused t-1"
            ]
        );
    }
}

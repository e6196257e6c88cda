//! The real `asyncctl` binary against a real `asyncd dev` (SQLite, a free port, API
//! tokens): every command a script would use, its `-o json` output and its exit codes.
//! The asyncd binary is `ASYNCD_BIN`, else the one `cargo test --workspace` built next to
//! this test.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(20);
const TOKEN: &str = "asyncctl-test-token";

fn asyncd_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("ASYNCD_BIN") {
        return PathBuf::from(bin);
    }
    // target/debug/deps/cli-<hash> → target/debug/asyncd
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("asyncd");
    assert!(
        bin.is_file(),
        "no asyncd binary at {}: build it (cargo build -p asyncd) or set ASYNCD_BIN",
        bin.display()
    );
    bin
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET /readyz` answered 200.
fn ready(addr: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /readyz HTTP/1.0\r\nHost: asyncd\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
        .lines()
        .next()
        .is_some_and(|status| status.contains(" 200 "))
}

/// Polls `check` until it returns `Some`, or panics naming `what`.
fn wait_for<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `asyncd dev` with API tokens: one job, `work`, whose executor refuses connections and
/// which has no retries, so its tasks die at their first attempt; and a cron entry.
struct Dev {
    server: String,
    dir: tempfile::TempDir,
    child: Child,
}

impl Dev {
    fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`Dev::start`] with more job configs: (file name, YAML).
    fn start_with(more_jobs: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let jobs = dir.path().join("jobs");
        std::fs::create_dir(&jobs).unwrap();
        for (name, yaml) in more_jobs {
            std::fs::write(jobs.join(name), yaml).unwrap();
        }
        std::fs::write(
            jobs.join("work.yaml"),
            "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata:\n  name: work-job\n\
             spec:\n  taskType: work\n  executor:\n    url: http://127.0.0.1:1/\n    timeout: 2s\n  \
             retry:\n    maxRetries: 0\n  cron:\n    - name: yearly\n      \
             schedule: \"CRON_TZ=UTC 0 3 1 1 *\"\n      payload: {from: cron}\n      \
             overlap: Skip\n      catchUp: 10m\n",
        )
        .unwrap();
        let mut hash = Command::new(asyncd_bin())
            .arg("hash-token")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        writeln!(hash.stdin.take().unwrap(), "{TOKEN}").unwrap();
        let hashed = hash.wait_with_output().unwrap();
        assert!(hashed.status.success());
        let sha = String::from_utf8(hashed.stdout).unwrap();
        let tokens = dir.path().join("tokens.yaml");
        std::fs::write(
            &tokens,
            format!(
                "tokens:\n  - {{name: ctl, sha256: \"{}\", jobs: [\"*\"], verbs: [\"*\"]}}\n",
                sha.trim()
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.path().join("asyncd.log")).unwrap();
        let child = Command::new(asyncd_bin())
            .arg("dev")
            .arg("--config")
            .arg(&jobs)
            .arg("--db")
            .arg(dir.path().join("asyncd.db"))
            .arg("--listen")
            .arg(&addr)
            .arg("--auth")
            .arg("tokens")
            .arg("--auth-tokens-file")
            .arg(&tokens)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let dev = Dev {
            server: format!("http://{addr}"),
            dir,
            child,
        };
        wait_for("asyncd /readyz", || ready(&addr).then_some(()));
        dev
    }

    /// `asyncctl ARGS` with the server and token from the environment and no config file.
    fn ctl(&self, args: &[&str]) -> Output {
        self.ctl_with(
            args,
            &[
                ("ASYNCD_SERVER", self.server.as_str()),
                ("ASYNCD_TOKEN", TOKEN),
            ],
        )
    }

    fn ctl_with(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_asyncctl"))
            .args(args)
            .env_remove("ASYNCD_SERVER")
            .env_remove("ASYNCD_TOKEN")
            .env_remove("ASYNCCTL_CONFIG")
            .env_remove("ASYNCCTL_OUTPUT")
            // An empty config folder: no file of the machine's user leaks in.
            .env("XDG_CONFIG_HOME", self.dir.path().join("xdg"))
            .envs(env.iter().copied())
            .output()
            .unwrap()
    }

    /// `asyncctl ARGS -o json`, which must succeed; its output parsed.
    fn json(&self, args: &[&str]) -> Value {
        let out = self.ctl(&[args, &["-o", "json"]].concat());
        assert_eq!(
            out.status.code(),
            Some(0),
            "asyncctl {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "asyncctl {args:?} -o json is not JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    fn wait_state(&self, id: &str, state: &str) -> Value {
        wait_for(&format!("task {id} to be {state}"), || {
            let task = self.json(&["get", id]);
            (task["state"] == state).then_some(task)
        })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("asyncd.log")).unwrap_or_default()
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn code(out: &Output) -> Option<i32> {
    out.status.code()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// An RFC 3339 time of an answer, in milliseconds.
fn parse_time(value: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(value.as_str().expect("a time"))
        .expect("RFC 3339")
        .timestamp_millis()
}

fn ids(page: &Value) -> Vec<&str> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect()
}

#[test]
fn tasks_dead_letters_jobs_and_cron_through_the_cli() {
    let dev = Dev::start();

    // submit → get → ls finds it; the table and -o json agree; cancel.
    let submitted = dev.json(&["submit", "work", r#"{"order": 42}"#, "--delay", "1h"]);
    let waiting = submitted["id"].as_str().unwrap().to_string();
    let task = dev.json(&["get", &waiting]);
    assert_eq!(
        (&task["type"], &task["state"], &task["payload"]),
        (&json!("work"), &json!("pending"), &json!({"order": 42}))
    );
    let page = dev.json(&["ls", "--job", "work-job", "--state", "pending"]);
    assert!(ids(&page).contains(&waiting.as_str()), "{page}");
    let table = dev.ctl(&["ls", "--type", "work"]);
    assert_eq!(code(&table), Some(0), "{}", stderr(&table));
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.starts_with("ID "), "{table}");
    assert!(
        table.contains(&waiting) && !table.contains('\x1b'),
        "{table}"
    );
    let changed = dev.json(&[
        "change",
        &waiting,
        "--payload",
        r#"{"order": 43}"#,
        "--priority",
        "4",
        "--delay",
        "2h",
    ]);
    assert_eq!(
        (&changed["id"], &changed["payload"], &changed["priority"]),
        (&json!(waiting), &json!({"order": 43}), &json!(4)),
        "{changed}"
    );
    let nothing = dev.ctl(&["change", &waiting]);
    assert_eq!(code(&nothing), Some(2), "usage: {}", stderr(&nothing));
    // An expiry: shown by get, and both kinds at once are a usage error.
    let expiring = dev.json(&["submit", "work", "--delay", "1h", "--start-within", "10m"]);
    let shown = dev.json(&["get", expiring["id"].as_str().unwrap()]);
    assert_eq!(
        parse_time(&shown["expires_at"]) - parse_time(&shown["eta"]),
        600_000,
        "{shown}"
    );
    let both = dev.ctl(&[
        "submit",
        "work",
        "--start-within",
        "10m",
        "--expires-at",
        "2030-01-01T00:00:00Z",
    ]);
    assert_eq!(code(&both), Some(2), "usage: {}", stderr(&both));
    // A debounce folds the second submit into the first's task; a throttle refuses.
    let debounce = ["submit", "work", "--debounce", "user:7", "--period", "1h"];
    let first = dev.json(&debounce);
    let second = dev.json(&debounce);
    assert_eq!(
        (&second["id"], &second["debounced"]),
        (&first["id"], &json!(true)),
        "{second}"
    );
    let throttle = [
        "submit",
        "work",
        "--delay",
        "1h",
        "--throttle",
        "r",
        "--period",
        "1h",
    ];
    dev.json(&throttle);
    let refused = dev.ctl(&throttle);
    assert_eq!(code(&refused), Some(5), "a conflict: {}", stderr(&refused));
    let no_period = dev.ctl(&["submit", "work", "--debounce", "k"]);
    assert_eq!(code(&no_period), Some(2), "usage: {}", stderr(&no_period));
    let cancelled = dev.json(&["cancel", &waiting]);
    assert_eq!(cancelled["state"], "cancelled");
    let late = dev.ctl(&["change", &waiting, "--now"]);
    assert_eq!(code(&late), Some(5), "a conflict: {}", stderr(&late));
    let again = dev.ctl(&["cancel", &waiting]);
    assert_eq!(code(&again), Some(5), "a conflict: {}", stderr(&again));
    // By unique key: the job's unfinished task holding it.
    let keyed = dev.json(&["submit", "work", "--delay", "1h", "--unique-key", "order-7"]);
    let by_key = dev.json(&["cancel", "--job", "work-job", "--unique-key", "order-7"]);
    assert_eq!(
        (&by_key["id"], &by_key["state"]),
        (&keyed["id"], &json!("cancelled")),
        "{by_key}"
    );
    let none = dev.ctl(&["cancel", "--job", "work-job", "--unique-key", "order-7"]);
    assert_eq!(code(&none), Some(3), "not found: {}", stderr(&none));
    let half = dev.ctl(&["cancel", "--unique-key", "order-7"]);
    assert_eq!(code(&half), Some(2), "usage: {}", stderr(&half));
    // By id naming the job (which also reaches a Kafka-routed task not consumed yet;
    // the SDK's integration tests cover that route): sent to the server, which checks
    // the job.
    let in_job = dev.json(&["submit", "work", "--delay", "1h"])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let unknown_job = dev.ctl(&["cancel", "--job", "no-such-job", &in_job]);
    assert_eq!(
        code(&unknown_job),
        Some(2),
        "the server refuses an unknown job: {}",
        stderr(&unknown_job)
    );
    assert!(
        stderr(&unknown_job).contains("job"),
        "{}",
        stderr(&unknown_job)
    );
    assert_eq!(dev.json(&["get", &in_job])["state"], "pending");
    let cancelled = dev.json(&["cancel", "--job", "work-job", &in_job]);
    assert_eq!(
        (&cancelled["id"], &cancelled["state"]),
        (&json!(in_job), &json!("cancelled")),
        "{cancelled}"
    );

    // Two tasks that die at once, redriven by filter while the job is paused, so they
    // wait where the test can see them.
    let dead: Vec<String> = (0..2)
        .map(|i| {
            dev.json(&["submit", "work", &format!("{{\"n\": {i}}}")])["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    for id in &dead {
        let task = dev.wait_state(id, "dead");
        assert!(task["last_error"].is_string(), "{task}");
    }
    let listed = dev.json(&["dlq", "ls", "--type", "work"]);
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    let paused = dev.json(&["jobs", "pause", "work-job"]);
    assert_eq!(paused["paused"], true, "{paused}");
    assert_eq!(dev.json(&["jobs", "get", "work-job"])["paused"], true);

    let dry = dev.json(&["dlq", "redrive", "--job", "work-job", "--dry-run"]);
    assert_eq!(
        (&dry["matched"], &dry["affected"], &dry["dry_run"]),
        (&json!(2), &json!(0), &json!(true)),
        "{dry}"
    );
    assert_eq!(
        dev.json(&["get", &dead[0]])["state"],
        "dead",
        "a dry run changes nothing"
    );
    let redriven = dev.json(&["dlq", "redrive", "--job", "work-job"]);
    assert_eq!(
        (
            &redriven["affected"],
            &redriven["remaining"],
            &redriven["dry_run"]
        ),
        (&json!(2), &json!(0), &json!(false)),
        "{redriven}"
    );
    let pending = dev.json(&["ls", "--job", "work-job", "--state", "pending"]);
    for id in &dead {
        assert!(
            ids(&pending).contains(&id.as_str()),
            "{id} waits: {pending}"
        );
        assert_eq!(dev.json(&["get", id])["attempt"], 0, "attempts reset");
    }

    // jobs ls and top show the job; resuming lets the redriven tasks run (and die again).
    let jobs = dev.json(&["jobs", "ls"]);
    let job = jobs
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["job"] == "work-job")
        .unwrap_or_else(|| panic!("work-job in {jobs}"));
    assert_eq!(job["paused"], true);
    assert!(job["stats"]["due"].as_u64().unwrap() >= 2, "{job}");
    let top = dev.json(&["top", "--once"]);
    assert_eq!(top[0]["job"], "work-job", "{top}");
    assert!(top[0]["due"].as_u64().unwrap() >= 2, "{top}");
    let resumed = dev.json(&["jobs", "resume", "work-job"]);
    assert_eq!(resumed["paused"], false, "{resumed}");
    for id in &dead {
        dev.wait_state(id, "dead");
    }

    // Purged by filter: gone.
    let purged = dev.json(&["dlq", "purge", "--type", "work"]);
    assert_eq!(purged["affected"], 2, "{purged}");
    let gone = dev.ctl(&["get", &dead[0]]);
    assert_eq!(code(&gone), Some(3), "{}", stderr(&gone));

    // Cron: listed with the next firings, and triggered now.
    let cron = dev.json(&["cron", "ls"]);
    assert_eq!(cron[0]["job"], "work-job", "{cron}");
    assert_eq!(cron[0]["name"], "yearly", "{cron}");
    assert_eq!(cron[0]["next"].as_array().unwrap().len(), 3, "{cron}");
    assert_eq!(
        (
            &cron[0]["overlap"],
            &cron[0]["catch_up"],
            &cron[0]["paused"]
        ),
        (&json!("Skip"), &json!("10m"), &json!(false)),
        "the entry's policies: {cron}"
    );
    let table = dev.ctl(&["cron", "ls"]);
    let text = String::from_utf8_lossy(&table.stdout);
    let row = text
        .lines()
        .find(|l| l.contains("yearly"))
        .unwrap_or_default();
    assert!(
        row.contains("Skip") && row.contains("10m") && row.contains("false"),
        "{text}"
    );
    let fired = dev.json(&["cron", "trigger", "work-job", "yearly"]);
    let task = dev.json(&["get", fired["id"].as_str().unwrap()]);
    assert_eq!(
        (&task["type"], &task["payload"]),
        (&json!("work"), &json!({"from": "cron"})),
        "{task}"
    );
    let unknown = dev.ctl(&["cron", "trigger", "work-job", "hourly"]);
    assert_eq!(code(&unknown), Some(3), "{}", stderr(&unknown));
    assert!(
        stderr(&unknown).contains("hourly") && stderr(&unknown).contains("yearly"),
        "names the entry and the job's entries: {}",
        stderr(&unknown)
    );

    // Exit codes: not found, unauthenticated.
    let missing = dev.ctl(&["get", "0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"]);
    assert_eq!(code(&missing), Some(3), "{}", stderr(&missing));
    let denied = dev.ctl_with(
        &["jobs", "ls"],
        &[
            ("ASYNCD_SERVER", dev.server.as_str()),
            ("ASYNCD_TOKEN", "not-the-token"),
        ],
    );
    assert_eq!(code(&denied), Some(4), "{}", stderr(&denied));
    let anonymous = dev.ctl_with(&["jobs", "ls"], &[("ASYNCD_SERVER", dev.server.as_str())]);
    assert_eq!(code(&anonymous), Some(4), "{}", stderr(&anonymous));
}

/// `change --job` also reaches a Kafka-routed task that no dispatcher has consumed (an id
/// never submitted to the Kafka job stands for one, as `asyncd dev` has no brokers): the
/// change waits for it, which a line says (the API's answer with `-o json`). A stored
/// task is changed and shown as without `--job`.
#[test]
fn change_in_a_job_through_the_cli() {
    let dev = Dev::start_with(&[(
        "stream.yaml",
        "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata:\n  name: stream-job\n\
         spec:\n  taskType: stream\n  executor:\n    url: http://127.0.0.1:1/\n  \
         kafka:\n    topic: asyncctl-it-stream\n    partitions: 1\n",
    )]);
    let unconsumed = "01934a6e-0004-7000-8000-000000000001";
    let plain = dev.ctl(&["change", unconsumed, "--priority", "7"]);
    assert_eq!(code(&plain), Some(3), "not found: {}", stderr(&plain));
    let pending = dev.json(&[
        "change",
        unconsumed,
        "--job",
        "stream-job",
        "--priority",
        "7",
    ]);
    assert_eq!(
        pending,
        json!({"id": unconsumed, "job": "stream-job", "type": "stream", "consumed": false})
    );
    let line = dev.ctl(&["change", unconsumed, "--job", "stream-job", "--delay", "1h"]);
    assert_eq!(code(&line), Some(0), "{}", stderr(&line));
    let line = String::from_utf8(line.stdout).unwrap();
    assert!(
        line.starts_with(&format!("{unconsumed} not consumed yet")) && line.contains("stream-job"),
        "{line}"
    );

    let waiting = dev.json(&["submit", "work", "--delay", "1h"])["id"]
        .as_str()
        .unwrap()
        .to_string();
    let changed = dev.json(&["change", &waiting, "--job", "work-job", "--priority", "4"]);
    assert_eq!(
        (&changed["id"], &changed["priority"], &changed["state"]),
        (&json!(waiting), &json!(4), &json!("pending")),
        "{changed}"
    );
    let table = dev.ctl(&["change", &waiting, "--job", "work-job", "--priority", "5"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.starts_with("FIELD "),
        "the task as get shows it: {text}"
    );
    let unknown = dev.ctl(&["change", &waiting, "--job", "no-such-job", "--now"]);
    assert_eq!(code(&unknown), Some(2), "{}", stderr(&unknown));
}

/// The names of a page of schedules (`schedule list -o json`).
fn names(page: &Value) -> Vec<&str> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect()
}

#[test]
fn schedules_through_the_cli() {
    let dev = Dev::start();

    // create: the flags are the spec.
    let created = dev.json(&[
        "schedule",
        "create",
        "work-job",
        "cust-1",
        "--every",
        "1h",
        "--payload",
        r#"{"customer": 1, "schedule": "{{schedule}}"}"#,
        "--priority",
        "3",
        "--overlap",
        "Skip",
        "--jitter",
        "5m",
        "--catch-up",
        "0s",
        "--end-at",
        "2099-01-01T00:00:00Z",
    ]);
    assert_eq!(
        (
            &created["job"],
            &created["name"],
            &created["type"],
            &created["source"]
        ),
        (
            &json!("work-job"),
            &json!("cust-1"),
            &json!("work"),
            &json!("api")
        ),
        "{created}"
    );
    assert_eq!(
        (
            &created["every"],
            &created["payload"],
            &created["priority"],
            &created["overlap"],
            &created["jitter"],
            &created["catch_up"],
            &created["paused"]
        ),
        (
            &json!("1h"),
            &json!({"customer": 1, "schedule": "{{schedule}}"}),
            &json!(3),
            &json!("Skip"),
            &json!("5m"),
            &json!("0s"),
            &json!(false)
        ),
        "{created}"
    );
    assert_eq!(parse_time(&created["end_at"]), 4_070_908_800_000);
    assert!(created["next_firing"].is_string(), "{created}");
    // The name is taken: a conflict.
    let taken = dev.ctl(&["schedule", "create", "work-job", "cust-1", "--every", "2h"]);
    assert_eq!(code(&taken), Some(5), "{}", stderr(&taken));
    assert!(
        stderr(&taken).contains("schedule_exists"),
        "{}",
        stderr(&taken)
    );

    // put: creates, then writes over (the flags are the whole spec).
    let put = dev.ctl(&[
        "schedule",
        "put",
        "work-job",
        "cust-2",
        "--cron",
        "CRON_TZ=Europe/Berlin 0 9 * * MON",
        "--paused",
    ]);
    assert_eq!(code(&put), Some(0), "{}", stderr(&put));
    assert!(stderr(&put).contains("created"), "{}", stderr(&put));
    let table = String::from_utf8_lossy(&put.stdout);
    assert!(
        table.starts_with("FIELD ") && table.contains("CRON_TZ=Europe/Berlin 0 9 * * MON"),
        "{table}"
    );
    let put = dev.ctl(&["schedule", "put", "work-job", "cust-2", "--every", "15m"]);
    assert_eq!(code(&put), Some(0), "{}", stderr(&put));
    assert!(stderr(&put).contains("written over"), "{}", stderr(&put));
    let got = dev.json(&["schedule", "get", "work-job", "cust-2"]);
    assert_eq!(
        (&got["every"], &got["cron"], &got["paused"]),
        (&json!("15m"), &Value::Null, &json!(false)),
        "{got}"
    );

    // list: one page, or every page through the cursor; the config entry among them
    // (once the scheduler's first pass has written it to the store).
    wait_for("the config entry among the schedules", || {
        (code(&dev.ctl(&["schedule", "get", "work-job", "yearly"])) == Some(0)).then_some(())
    });
    let first = dev.ctl(&["schedule", "list", "work-job", "--limit", "1", "-o", "json"]);
    assert_eq!(code(&first), Some(0), "{}", stderr(&first));
    let page: Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(names(&page), ["cust-1"], "{page}");
    assert_eq!(page["next_cursor"], "cust-1", "{page}");
    let next = dev.json(&[
        "schedule", "list", "work-job", "--limit", "1", "--cursor", "cust-1",
    ]);
    assert_eq!(names(&next), ["cust-2"], "{next}");
    let all = dev.json(&["schedule", "list", "work-job", "--limit", "1", "--all"]);
    assert_eq!(names(&all), ["cust-1", "cust-2", "yearly"], "{all}");
    assert!(all.get("next_cursor").is_none(), "{all}");
    assert_eq!(all["items"][2]["source"], "config", "{all}");
    let table = dev.ctl(&["schedule", "ls", "work-job", "--all"]);
    assert_eq!(code(&table), Some(0), "{}", stderr(&table));
    let text = String::from_utf8_lossy(&table.stdout);
    let header = text.lines().next().unwrap_or_default();
    for column in [
        "NAME",
        "SOURCE",
        "CRON/EVERY",
        "OVERLAP",
        "PAUSED",
        "NEXT",
        "LAST",
        "FIRED",
    ] {
        assert!(header.contains(column), "{column}: {text}");
    }
    let row = text
        .lines()
        .find(|l| l.starts_with("cust-1 "))
        .unwrap_or_default();
    assert!(
        row.contains("api") && row.contains("every 1h") && row.contains("Skip"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.starts_with("yearly "))
        .unwrap_or_default();
    assert!(
        row.contains("config") && row.contains("CRON_TZ=UTC 0 3 1 1 *"),
        "{text}"
    );

    // pause: no next firing; resume: one again.
    let paused = dev.json(&["schedule", "pause", "work-job", "cust-1"]);
    assert_eq!(
        (&paused["paused"], &paused["next_firing"]),
        (&json!(true), &Value::Null),
        "{paused}"
    );
    let resumed = dev.json(&["schedule", "resume", "work-job", "cust-1"]);
    assert_eq!(resumed["paused"], false, "{resumed}");
    assert!(resumed["next_firing"].is_string(), "{resumed}");

    // trigger: a task of the job, now, with the schedule's payload.
    let fired = dev.json(&["schedule", "trigger", "work-job", "cust-1"]);
    assert_eq!(
        (&fired["job"], &fired["entry"], &fired["type"]),
        (&json!("work-job"), &json!("cust-1"), &json!("work")),
        "{fired}"
    );
    let task = dev.json(&["get", fired["id"].as_str().unwrap()]);
    assert_eq!(
        task["payload"],
        json!({"customer": 1, "schedule": "cust-1"}),
        "{task}"
    );

    // backfill: the firings in [from, to), once.
    let t0 =
        chrono::DateTime::from_timestamp((chrono::Utc::now().timestamp() / 3600 - 24) * 3600, 0)
            .unwrap();
    let at = |hours: i64| {
        (t0 + chrono::Duration::hours(hours)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    };
    dev.json(&[
        "schedule",
        "create",
        "work-job",
        "hourly",
        "--every",
        "1h",
        "--start-at",
        &at(0),
    ]);
    let backfill = [
        "schedule",
        "backfill",
        "work-job",
        "hourly",
        "--from",
        &at(2),
        "--to",
        &at(7),
    ];
    let result = dev.json(&backfill);
    assert_eq!(result, json!({"firings": 5, "created": 5}));
    let table = dev.ctl(&backfill);
    assert_eq!(code(&table), Some(0), "{}", stderr(&table));
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.starts_with("FIRINGS "), "{text}");
    assert!(
        text.lines()
            .nth(1)
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            == ["5", "0", "5"],
        "repeated, it creates none: {text}"
    );
    let backwards = dev.ctl(&[
        "schedule",
        "backfill",
        "work-job",
        "hourly",
        "--from",
        &at(7),
        "--to",
        &at(2),
    ]);
    assert_eq!(code(&backwards), Some(2), "{}", stderr(&backwards));
    assert!(
        stderr(&backwards).contains("--to"),
        "{}",
        stderr(&backwards)
    );

    // delete: gone (not found after), and the config entry is read-only.
    let deleted = dev.json(&["schedule", "delete", "work-job", "cust-2"]);
    assert_eq!(deleted["deleted"], true, "{deleted}");
    let gone = dev.ctl(&["schedule", "get", "work-job", "cust-2"]);
    assert_eq!(code(&gone), Some(3), "{}", stderr(&gone));
    let again = dev.ctl(&["schedule", "delete", "work-job", "cust-2"]);
    assert_eq!(code(&again), Some(3), "{}", stderr(&again));
    let read_only = dev.ctl(&["schedule", "delete", "work-job", "yearly"]);
    assert_eq!(code(&read_only), Some(5), "{}", stderr(&read_only));
    assert!(
        stderr(&read_only).contains("schedule_read_only"),
        "{}",
        stderr(&read_only)
    );
    let no_job = dev.ctl(&["schedule", "get", "no-such-job", "x"]);
    assert_eq!(code(&no_job), Some(3), "{}", stderr(&no_job));

    // Bad input: a usage error naming the flag, before or from the server.
    for (bad, flag) in [
        (
            &["--cron", "CRON_TZ=UTC 0 3 * * *", "--every", "1h"][..],
            "--every",
        ),
        (&[], "--cron"),
        (&["--every", "1h", "--payload", "{nope"], "--payload"),
        (&["--every", "1h", "--priority", "12"], "--priority"),
        (&["--every", "1h", "--overlap", "Never"], "--overlap"),
        (&["--every", "1h", "--start-at", "monday"], "--start-at"),
        (&["--every", "500ms"], "--every"),
    ] {
        let out = dev.ctl(&[&["schedule", "create", "work-job", "bad"], bad].concat());
        assert_eq!(code(&out), Some(2), "{bad:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(flag), "{bad:?}: {}", stderr(&out));
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    }
    let no_zone = dev.ctl(&[
        "schedule",
        "create",
        "work-job",
        "bad",
        "--cron",
        "0 9 * * *",
    ]);
    assert_eq!(code(&no_zone), Some(2), "{}", stderr(&no_zone));
    assert!(
        stderr(&no_zone).contains("invalid_field") && stderr(&no_zone).contains("cron"),
        "{}",
        stderr(&no_zone)
    );
    let listed = dev.json(&["schedule", "list", "work-job"]);
    assert_eq!(names(&listed), ["cust-1", "hourly", "yearly"], "{listed}");
}

#[test]
fn the_server_and_token_come_from_the_config_file_when_not_given() {
    let dev = Dev::start();
    let xdg = dev.dir.path().join("xdg");
    std::fs::create_dir_all(xdg.join("asyncctl")).unwrap();
    let config = xdg.join("asyncctl").join("config.yaml");
    std::fs::write(&config, format!("server: {}\ntoken: {TOKEN}\n", dev.server)).unwrap();
    let out = dev.ctl_with(&["jobs", "get", "work-job", "-o", "yaml"], &[]);
    assert_eq!(code(&out), Some(0), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("job: work-job"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The flag wins over the file.
    let out = dev.ctl_with(&["jobs", "ls", "--token", "wrong"], &[]);
    assert_eq!(code(&out), Some(4), "{}", stderr(&out));
    // A file that does not parse is a usage error naming it.
    let other = dev.dir.path().join("bad.yaml");
    std::fs::write(&other, "servr: x\n").unwrap();
    let out = dev.ctl_with(&["jobs", "ls", "--config", path(&other)], &[]);
    assert_eq!(code(&out), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("bad.yaml"), "{}", stderr(&out));
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn usage_errors_exit_2_and_completions_print() {
    let home = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_asyncctl"))
            .args(args)
            .env_remove("ASYNCD_SERVER")
            .env_remove("ASYNCD_TOKEN")
            .env_remove("ASYNCCTL_CONFIG")
            .env("XDG_CONFIG_HOME", home.path())
            .output()
            .unwrap()
    };
    for bad in [
        &["ls", "--bogus"][..],
        &["ls", "--state", "gone"],
        &["submit", "work", "--delay", "soon"],
        &["cancel"],
        &["cancel", "--unique-key", "k"],
        &["cancel", "x", "--job", "j", "--unique-key", "k"],
        &["cancel", "--job", "j"],
        &["schedule", "create", "j", "n"],
        &[
            "schedule",
            "put",
            "j",
            "n",
            "--cron",
            "CRON_TZ=UTC 0 3 * * *",
            "--every",
            "1h",
        ],
        &[
            "schedule",
            "create",
            "j",
            "n",
            "--every",
            "1h",
            "--payload",
            "{x",
        ],
        &["schedule", "list", "j", "--limit", "0"],
        &["schedule", "list", "j", "--all", "--cursor", "c"],
        &[
            "schedule",
            "backfill",
            "j",
            "n",
            "--from",
            "2026-12-01T00:00:00Z",
        ],
        &["frobnicate"],
    ] {
        let out = run(bad);
        assert_eq!(code(&out), Some(2), "{bad:?}: {}", stderr(&out));
    }
    let out = run(&["dlq", "purge", "--dry-run"]);
    assert_eq!(code(&out), Some(2), "a bulk action needs a filter");
    assert!(stderr(&out).contains("--job or --type"), "{}", stderr(&out));
    let closed = format!("http://127.0.0.1:{}", free_port());
    let unreachable = run(&["get", "x", "--server", closed.as_str()]);
    assert_eq!(code(&unreachable), Some(1), "{}", stderr(&unreachable));
    for shell in ["bash", "zsh", "fish"] {
        let out = run(&["completion", shell]);
        assert_eq!(code(&out), Some(0));
        let script = String::from_utf8(out.stdout).unwrap();
        assert!(
            script.contains("asyncctl") && script.contains("redrive"),
            "{shell}: {script}"
        );
    }
}

/// `jobs weight`: a tenant's weight set at runtime, shown by `jobs get`, given back to the
/// spec's by `--reset`; a weight out of range refused naming the field.
#[test]
fn tenant_weights_through_the_cli() {
    let dev = Dev::start_with(&[(
        "shared.yaml",
        "apiVersion: asyncd.example.io/v1\nkind: AsyncJobConfig\nmetadata:\n  name: shared-job\n\
         spec:\n  taskType: shared\n  executor:\n    url: http://127.0.0.1:1/\n  \
         concurrencyKey: {key: '{m}', limit: 1}\n  fairness: {tenant: '{t}', weights: {acme: 2}}\n",
    )]);
    let set = dev.json(&["jobs", "weight", "shared-job", "acme", "7"]);
    assert_eq!(
        set,
        json!({"job": "shared-job", "tenant": "acme", "weight": 7, "set_at_runtime": true})
    );
    let job = dev.json(&["jobs", "get", "shared-job"]);
    assert_eq!(job["tenant_weights"], json!({"acme": 7}), "{job}");
    let table = dev.ctl(&["jobs", "get", "shared-job"]);
    let shown = String::from_utf8_lossy(&table.stdout);
    assert!(
        shown.contains("WEIGHT SET AT RUNTIME") && shown.lines().any(|l| l.starts_with("acme")),
        "{shown}"
    );

    let refused = dev.ctl(&["jobs", "weight", "shared-job", "acme", "1001"]);
    assert_eq!(code(&refused), Some(2), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("weight"), "{}", stderr(&refused));
    let neither = dev.ctl(&["jobs", "weight", "shared-job", "acme"]);
    assert_eq!(code(&neither), Some(2), "{}", stderr(&neither));

    let reset = dev.json(&["jobs", "weight", "shared-job", "acme", "--reset"]);
    assert_eq!(
        reset,
        json!({"job": "shared-job", "tenant": "acme", "weight": 2, "set_at_runtime": false})
    );
    let job = dev.json(&["jobs", "get", "shared-job"]);
    assert_eq!(job.get("tenant_weights"), None, "{job}");
}

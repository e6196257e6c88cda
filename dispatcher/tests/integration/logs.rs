//! Log lines people can use: the real `asyncd dev` binary with its output piped (not a
//! terminal) writes no ANSI escape codes as text, and with `--log-format json` every line
//! is a JSON object, the lines of an attempt carrying the task's id, type and attempt.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use crate::support::*;

/// `asyncd dev ARGS` with stdout and stderr piped into one buffer of lines.
struct Piped {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    http: reqwest::Client,
    addr: std::net::SocketAddr,
    _dir: tempfile::TempDir,
}

impl Piped {
    async fn start(executor: &Executor, args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let jobs = dir.path().join("jobs");
        std::fs::create_dir(&jobs).unwrap();
        // A retry (not a dead letter) after the first failed attempt, soon.
        let retry = "  retry:\n    maxRetries: 3\n    backoff: fixed\n    initialBackoff: 100ms\n";
        std::fs::write(
            jobs.join("work.yaml"),
            job_yaml("work-job", "work", &executor.url(), retry),
        )
        .unwrap();
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut child = Command::new(env!("CARGO_BIN_EXE_asyncd"))
            .arg("dev")
            .arg("--config")
            .arg(&jobs)
            .arg("--db")
            .arg(dir.path().join("asyncd.db"))
            .arg("--listen")
            .arg(addr.to_string())
            .args(args)
            .env("ASYNCD_LOG", "info")
            // Colour must be off because the output is no terminal, not because of this.
            .env_remove("NO_COLOR")
            .env_remove("ASYNCD_LOG_FORMAT")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("asyncd runs");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().unwrap();
        let stderr = child.stderr.take().unwrap();
        for pipe in [Box::new(stdout) as Box<dyn Read + Send>, Box::new(stderr)] {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    lines.lock().unwrap().push(line);
                }
            });
        }
        let me = Self {
            child,
            lines,
            http: reqwest::Client::new(),
            addr,
            _dir: dir,
        };
        let url = me.url("/readyz");
        let http = me.http.clone();
        wait_for("asyncd /readyz", DEADLINE, async || {
            http.get(&url)
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
                .map(|_| ())
        })
        .await;
        me
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits for a line containing `text`; returns every line so far.
    async fn wait_line(&self, text: &str) -> Vec<String> {
        wait_for(&format!("a log line with {text:?}"), DEADLINE, async || {
            let lines = self.lines();
            lines.iter().any(|l| l.contains(text)).then_some(lines)
        })
        .await
    }
}

impl Drop for Piped {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Api for Piped {
    fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }
    fn http(&self) -> &reqwest::Client {
        &self.http
    }
}

#[tokio::test]
async fn text_logs_into_a_pipe_have_no_colour_codes() {
    let executor = Executor::start(|_| Answer::status(500)).await;
    let asyncd = Piped::start(&executor, &[]).await;
    let id = asyncd
        .submit(json!({"type": "work", "payload": {"n": 1}}))
        .await;
    let lines = asyncd.wait_line("attempt failed; retrying").await;
    let failed = lines
        .iter()
        .find(|l| l.contains("attempt failed; retrying"))
        .unwrap();
    // The attempt's span names the task in text too.
    for field in [
        format!("task_id={id}"),
        "task_type=work".into(),
        "attempt=1".into(),
    ] {
        assert!(failed.contains(&field), "{field} missing from {failed:?}");
    }
    let all = lines.join("\n");
    assert!(
        !all.contains('\x1b'),
        "escape codes in piped output:\n{all}"
    );
}

#[tokio::test]
async fn json_logs_are_one_object_per_line_with_the_task_on_its_lines() {
    let executor = Executor::start(|_| Answer::status(500)).await;
    let asyncd = Piped::start(&executor, &["--log-format", "json"]).await;
    let id = asyncd
        .submit(json!({"type": "work", "payload": {"n": 2}}))
        .await;
    let lines = asyncd.wait_line("attempt failed; retrying").await;
    assert!(lines.len() > 1, "start-up lines too: {lines:?}");
    let parsed: Vec<Value> = lines
        .iter()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"))
        })
        .collect();
    for line in &parsed {
        assert!(line.is_object(), "{line}");
        for field in ["timestamp", "level", "target"] {
            assert!(line.get(field).is_some(), "no {field} in {line}");
        }
    }
    let failed = parsed
        .iter()
        .find(|l| l["message"] == "attempt failed; retrying")
        .expect("the failed attempt's line");
    assert_eq!(failed["level"], "INFO", "{failed}");
    assert_eq!(failed["span"]["name"], "attempt", "{failed}");
    assert_eq!(failed["span"]["task_id"], id.as_str(), "{failed}");
    assert_eq!(failed["span"]["task_type"], "work", "{failed}");
    assert_eq!(failed["span"]["attempt"], 1, "{failed}");
    assert!(
        failed["error"].as_str().is_some_and(|e| e.contains("500")),
        "the reason: {failed}"
    );
    assert!(failed["retry_at"].is_string(), "{failed}");
}

#[test]
fn the_format_comes_from_asyncd_log_format_too() {
    let out = Command::new(env!("CARGO_BIN_EXE_asyncd"))
        .args(["migrate", "--store", "unsupported://logs-test"])
        .env("ASYNCD_LOG_FORMAT", "json")
        .env_remove("ASYNCD_STORE_FILE")
        .output()
        .expect("asyncd runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    let line = stderr
        .lines()
        .find(|l| l.contains("is not supported"))
        .unwrap_or_else(|| panic!("the reason it stopped: {stderr}"));
    let line: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(line["level"], "ERROR", "{line}");
}

//! The binary starts whichever way it is built. In a workspace build both rustls crypto
//! providers are compiled in (kube's `ring`, the dispatcher's `aws-lc-rs`), and rustls then
//! panics at the first TLS client config unless main installs one. Building the kube
//! client is exactly that point, so: start the operator against an API server that is not
//! there and expect it to get past the client and start watching. And it does not start
//! with a setting it would hand every dispatcher broken. And SIGTERM stops it in bounded time
//! whatever the API server does.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The operator, started against the API server at `server` (a kubeconfig in a fresh
/// folder), with its log lines coming through the receiver.
struct Operator {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
    dir: std::path::PathBuf,
}

impl Operator {
    fn start(name: &str, server: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("asyncd-operator-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1
kind: Config
clusters:
- name: absent
  cluster: {{server: '{server}', insecure-skip-tls-verify: true}}
users:
- name: nobody
  user: {{token: nothing}}
contexts:
- name: absent
  context: {{cluster: absent, user: nobody}}
current-context: absent
"
            ),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_asyncd-operator"))
            .args([
                "--kafka-brokers",
                "127.0.0.1:1",
                "--dispatcher-image",
                "asyncd:test",
                "--listen",
                "127.0.0.1:0",
            ])
            .env("KUBECONFIG", &kubeconfig)
            .env("ASYNCD_LOG", "info")
            .env_remove("RUST_LOG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
            dir,
        }
    }

    /// Whether a log line containing `text` came before the process closed its stderr
    /// (or a minute passed).
    fn logged(&mut self, text: &str) -> bool {
        loop {
            match self.lines.recv_timeout(Duration::from_secs(60)) {
                Ok(line) => {
                    let found = line.contains(text);
                    self.seen.push(line);
                    if found {
                        return true;
                    }
                }
                // stderr closed: the process is gone
                Err(_) => return false,
            }
        }
    }

    fn log(&self) -> String {
        self.seen.join("\n")
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn starts_against_an_absent_api_server_without_panicking() {
    let mut operator = Operator::start("starts", "https://127.0.0.1:1");
    let started = operator.logged("watching AsyncJobConfigs");
    assert!(
        started && !operator.seen.iter().any(|l| l.contains("panicked")),
        "the operator did not start:\n{}",
        operator.log()
    );
}

/// An API server that accepts connections and never answers holds the controller's
/// first list forever; SIGTERM still ends the operator within its stated bound (10 s,
/// `SHUTDOWN_BOUND` in main.rs), where it once ran on for an hour.
#[test]
fn sigterm_stops_it_against_an_api_server_that_never_answers() {
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = format!("http://{}", hole.local_addr().unwrap());
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = accepted.clone();
    std::thread::spawn(move || {
        // Held open, never read from or answered.
        let mut held = Vec::new();
        for stream in hole.incoming().map_while(Result::ok) {
            held.push(stream);
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let mut operator = Operator::start("sigterm", &server);
    assert!(
        operator.logged("watching AsyncJobConfigs"),
        "{}",
        operator.log()
    );
    // Its watches are waiting on the black hole.
    let deadline = Instant::now() + Duration::from_secs(60);
    while accepted.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the operator never connected");
        std::thread::sleep(Duration::from_millis(20));
    }
    let term = Command::new("kill")
        .args(["-TERM", &operator.child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let sent = Instant::now();
    // The bound plus room for a busy machine; the failure this catches never ends.
    let deadline = sent + Duration::from_secs(45);
    let status = loop {
        if let Some(status) = operator.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "still running {:?} after SIGTERM:\n{}",
            sent.elapsed(),
            operator.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status}: {}", operator.log());
}

/// A bad executor range, by flag or by variable, stops the operator before it looks for a
/// cluster, with a usage error naming the flag and the value.
#[test]
fn refuses_an_executor_range_that_is_no_cidr() {
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let out = Command::new(env!("CARGO_BIN_EXE_asyncd-operator"))
            .args([
                "--kafka-brokers",
                "127.0.0.1:1",
                "--dispatcher-image",
                "asyncd:test",
            ])
            .args(args)
            .env_remove("ASYNCD_EXECUTOR_DENY_CIDRS")
            .env_remove("ASYNCD_EXECUTOR_ALLOW_CIDRS")
            .envs(env.iter().copied())
            // were the range accepted, the operator would stop here instead, status 1
            .env("KUBECONFIG", "/nonexistent/asyncd-operator-test-kubeconfig")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };

    let (code, stderr) = run(&["--executor-deny-cidrs", "10.0.0.0/8,10.0.0.1"], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--executor-deny-cidrs") && stderr.contains("\"10.0.0.1\" is not a CIDR"),
        "{stderr}"
    );

    let (code, stderr) = run(&[], &[("ASYNCD_EXECUTOR_ALLOW_CIDRS", "fd00::/129")]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--executor-allow-cidrs")
            && stderr.contains("\"fd00::/129\" is not a CIDR"),
        "{stderr}"
    );

    // good ranges get past the flags, to the missing kubeconfig
    let (code, stderr) = run(
        &[
            "--executor-deny-cidrs",
            "0.0.0.0/0",
            "--executor-deny-cidrs",
            "::/0",
        ],
        &[("ASYNCD_EXECUTOR_ALLOW_CIDRS", "10.0.5.0/24, fd00::/8")],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("kubeconfig"), "{stderr}");
}

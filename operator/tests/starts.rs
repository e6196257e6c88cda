//! The binary starts whichever way it is built. In a workspace build both rustls crypto
//! providers are compiled in (kube's `ring`, the dispatcher's `aws-lc-rs`), and rustls then
//! panics at the first TLS client config unless main installs one. Building the kube
//! client is exactly that point, so: start the operator against an API server that is not
//! there and expect it to get past the client and start watching.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

#[test]
fn starts_against_an_absent_api_server_without_panicking() {
    let dir = std::env::temp_dir().join(format!("asyncd-operator-starts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1
kind: Config
clusters:
- name: absent
  cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}
users:
- name: nobody
  user: {token: nothing}
contexts:
- name: absent
  context: {cluster: absent, user: nobody}
current-context: absent
",
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
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    let started = loop {
        match received.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => {
                let watching = line.contains("watching AsyncJobConfigs");
                seen.push(line);
                if watching {
                    break true;
                }
            }
            // stderr closed: the process is gone
            Err(_) => break false,
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        started && !seen.iter().any(|l| l.contains("panicked")),
        "the operator did not start:\n{}",
        seen.join("\n")
    );
}

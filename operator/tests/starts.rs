//! The binary starts whichever way it is built. In a workspace build both rustls crypto
//! providers are compiled in (kube's `ring`, the dispatcher's `aws-lc-rs`), and rustls then
//! panics at the first TLS client config unless main installs one. Building the kube
//! client is exactly that point, so: start the operator against an API server that is not
//! there and expect it to get past the client and start watching. And it does not start
//! with a setting it would hand every dispatcher broken.

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

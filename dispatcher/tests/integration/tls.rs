//! HTTPS on the listener: the real `asyncd` binary serves the API, health and metrics
//! over TLS with a self-signed certificate, and when the certificate files are replaced,
//! new connections get the new certificate without a restart.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(60);

struct Pair {
    cert_pem: String,
    key_pem: String,
    der: Vec<u8>,
}

fn self_signed() -> Pair {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    Pair {
        cert_pem: made.cert.pem(),
        key_pem: made.signing_key.serialize_pem(),
        der: made.cert.der().to_vec(),
    }
}

/// Replaces a file in one step, as a Secret volume update does.
fn replace(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A fresh client (so a fresh connection) that trusts only `pair`'s certificate.
fn client(pair: &Pair) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(pair.cert_pem.as_bytes()).unwrap()])
        .tls_info(true)
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// GET over HTTPS; the status and the certificate the server presented.
async fn get(pair: &Pair, url: &str) -> Result<(u16, Vec<u8>), reqwest::Error> {
    let response = client(pair).get(url).send().await?;
    let cert = response
        .extensions()
        .get::<reqwest::tls::TlsInfo>()
        .and_then(|info| info.peer_certificate())
        .expect("the TLS info of the connection")
        .to_vec();
    Ok((response.status().as_u16(), cert))
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn https_with_a_certificate_replaced_while_running() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = dir.path().join("jobs");
    std::fs::create_dir(&jobs).unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let first = self_signed();
    replace(&cert, &first.cert_pem);
    replace(&key, &first.key_pem);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = std::fs::File::create(dir.path().join("asyncd.log")).unwrap();
    let server = Server(
        Command::new(env!("CARGO_BIN_EXE_asyncd"))
            .arg("dev")
            .arg("--config")
            .arg(&jobs)
            .arg("--db")
            .arg(dir.path().join("asyncd.db"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .args(["--tls-reload-interval", "200ms"])
            .env("ASYNCD_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("asyncd runs"),
    );
    let base = format!("https://localhost:{port}");
    let log = || std::fs::read_to_string(dir.path().join("asyncd.log")).unwrap_or_default();

    // up, over HTTPS, with the first certificate
    let started = Instant::now();
    let (status, presented) = loop {
        match get(&first, &format!("{base}/healthz")).await {
            Ok(answer) => break answer,
            Err(err) => assert!(
                started.elapsed() < DEADLINE,
                "no HTTPS /healthz: {err:?}\n{}",
                log()
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!((status, presented == first.der), (200, true));
    // the API and /metrics are on the same TLS listener
    let (status, _) = get(&first, &format!("{base}/v1/dead-letters"))
        .await
        .unwrap();
    assert_eq!(status, 200);
    let (status, _) = get(&first, &format!("{base}/metrics")).await.unwrap();
    assert_eq!(status, 200);
    // plain HTTP is not served next to it
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/healthz"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(
        plain.is_err() || !plain.unwrap().status().is_success(),
        "plain HTTP answered"
    );

    // a half-written pair (new certificate, old key) is refused, the old one stays
    let second = self_signed();
    replace(&cert, &second.cert_pem);
    let started = Instant::now();
    while !log().contains("new TLS files refused") {
        assert!(
            started.elapsed() < DEADLINE,
            "mismatch not reported:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, presented) = get(&first, &format!("{base}/healthz")).await.unwrap();
    assert_eq!((status, presented == first.der), (200, true));

    // the key follows: new connections get the new certificate
    replace(&key, &second.key_pem);
    let started = Instant::now();
    loop {
        if let Ok((200, presented)) = get(&second, &format!("{base}/healthz")).await {
            assert_eq!(presented, second.der);
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the new certificate was not served:\n{}",
            log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(log().contains("TLS certificate reloaded"), "{}", log());
    // and a client trusting only the old one no longer connects
    assert!(get(&first, &format!("{base}/healthz")).await.is_err());
    drop(server);
}

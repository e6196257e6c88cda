//! A client of Toxiproxy's HTTP API (`e2e/services/toxiproxy.sh`): a proxy of the test's
//! own in front of a database server, and the faults a test puts on its links.
//!
//! Toxiproxy names a link's two directions `upstream` (client to server) and `downstream`
//! (server to client); a toxic is on one of them. Removing a `timeout` toxic closes the
//! connections that passed through it (its `Cleanup`), so a healed black hole ends the
//! connections stuck in it, which a real network path would not do.

use serde_json::{Value, json};

use super::Service;

/// One network fault, as a set of toxics on both directions of a proxy's links.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Nothing passes either way and nothing is closed or reset: a dead path.
    BlackHole,
    /// 200 ms added to everything the server sends: each round trip 200 ms longer.
    Latency,
    /// The server's answers trickle at 32 KiB/s.
    Bandwidth,
    /// Every connection is reset (RST) as soon as data passes, mid-transaction or not;
    /// new connections too, until the toxic goes.
    Reset,
}

impl Fault {
    fn toxics(self) -> Vec<(&'static str, &'static str, Value)> {
        let both = |kind, attributes: Value| {
            vec![
                ("upstream", kind, attributes.clone()),
                ("downstream", kind, attributes),
            ]
        };
        match self {
            Self::BlackHole => both("timeout", json!({"timeout": 0})),
            Self::Latency => vec![(
                "downstream",
                "latency",
                json!({"latency": 200, "jitter": 0}),
            )],
            Self::Bandwidth => vec![("downstream", "bandwidth", json!({"rate": 32}))],
            Self::Reset => both("reset_peer", json!({"timeout": 0})),
        }
    }
}

/// A proxy on the Toxiproxy server, deleted when dropped.
pub struct Proxy {
    api: String,
    name: String,
    /// Where clients connect, `127.0.0.1:<port>`.
    pub listen: String,
    http: reqwest::Client,
}

impl Proxy {
    /// A proxy to the server of `database_url`, or `None` when no Toxiproxy server is
    /// named: the test skips ([`Service::address`]; with `ASYNCD_TEST_REQUIRE_BACKENDS=1`
    /// that panics instead).
    pub async fn to(database_url: &str) -> Option<Self> {
        let api = Service::Toxiproxy
            .address()?
            .trim_end_matches('/')
            .to_string();
        let url = reqwest::Url::parse(database_url).unwrap();
        let upstream = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap());
        let name = format!("asyncd-{}", uuid::Uuid::now_v7().simple());
        let http = reqwest::Client::new();
        let created: Value = http
            .post(format!("{api}/proxies"))
            .json(&json!({"name": name, "listen": "127.0.0.1:0", "upstream": upstream, "enabled": true}))
            .send()
            .await
            .unwrap_or_else(|err| panic!("Toxiproxy at {api}: {err}"))
            .error_for_status()
            .unwrap()
            .json()
            .await
            .unwrap();
        let listen = created["listen"].as_str().expect("listen").to_string();
        Some(Self {
            api,
            name,
            listen,
            http,
        })
    }

    /// `database_url` with its host and port replaced by the proxy's.
    pub fn url(&self, database_url: &str) -> String {
        let mut url = reqwest::Url::parse(database_url).unwrap();
        let (host, port) = self.listen.rsplit_once(':').unwrap();
        url.set_host(Some(host)).unwrap();
        url.set_port(Some(port.parse().unwrap())).unwrap();
        url.to_string()
    }

    /// Puts `fault` on every link, open or new.
    pub async fn add(&self, fault: Fault) {
        for (stream, kind, attributes) in fault.toxics() {
            self.add_toxic(&format!("{kind}_{stream}"), stream, kind, attributes)
                .await;
        }
    }

    /// Takes `fault` off again.
    pub async fn remove(&self, fault: Fault) {
        for (stream, kind, _) in fault.toxics() {
            self.remove_toxic(&format!("{kind}_{stream}")).await;
        }
    }

    /// Puts toxic `name` of `kind` on `stream` of every link.
    pub async fn add_toxic(&self, name: &str, stream: &str, kind: &str, attributes: Value) {
        self.http
            .post(format!("{}/proxies/{}/toxics", self.api, self.name))
            .json(&json!({
                "name": name,
                "type": kind,
                "stream": stream,
                "toxicity": 1.0,
                "attributes": attributes,
            }))
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap();
    }

    pub async fn remove_toxic(&self, name: &str) {
        self.http
            .delete(format!("{}/proxies/{}/toxics/{name}", self.api, self.name))
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // A drop cannot await, and the test's runtime may not block in reqwest: one
        // plain HTTP/1.0 request over a blocking socket.
        use std::io::{Read, Write};
        let Ok(api) = reqwest::Url::parse(&self.api) else {
            return;
        };
        let addr = format!(
            "{}:{}",
            api.host_str().unwrap_or("127.0.0.1"),
            api.port().unwrap_or(80)
        );
        if let Ok(mut socket) = std::net::TcpStream::connect(addr) {
            let _ = socket.set_read_timeout(Some(std::time::Duration::from_secs(5)));
            let _ = write!(socket, "DELETE /proxies/{} HTTP/1.0\r\n\r\n", self.name);
            let _ = socket.read_to_end(&mut Vec::new());
        }
    }
}

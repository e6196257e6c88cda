//! A client of Toxiproxy's HTTP API (`e2e/services/toxiproxy.sh` runs the server): a
//! proxy of the caller's own in front of a database server, and the network faults put
//! on its links. The store fault tests (`dispatcher/tests/integration/store_faults.rs`)
//! and the chaos soak (`bench/src/soak/`) share it.
//!
//! Toxiproxy names a link's two directions `upstream` (client to server) and `downstream`
//! (server to client); a toxic is on one of them. Removing a `timeout` toxic closes the
//! connections that passed through it (its `Cleanup`), so a healed black hole ends the
//! connections stuck in it, which a real network path would not do.

use serde_json::{Value, json};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Toxiproxy at {api}: {source}")]
    Api {
        api: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("not a URL with a host and a port: {0}")]
    Url(String),
    #[error("Toxiproxy at {api} answered without the proxy's listen address")]
    NoListen { api: String },
}

pub type Result<T> = std::result::Result<T, Error>;

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
    pub const ALL: [Self; 4] = [Self::BlackHole, Self::Latency, Self::Bandwidth, Self::Reset];

    pub fn name(self) -> &'static str {
        match self {
            Self::BlackHole => "black hole",
            Self::Latency => "200 ms latency",
            Self::Bandwidth => "32 KiB/s",
            Self::Reset => "reset",
        }
    }

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
    /// A proxy named `name` on the server whose API is at `api`, to the server of
    /// `database_url`, listening on a free port of 127.0.0.1.
    pub async fn create(api: &str, name: &str, database_url: &str) -> Result<Self> {
        let url =
            reqwest::Url::parse(database_url).map_err(|_| Error::Url("the database URL".into()))?;
        let (Some(host), Some(port)) = (url.host_str(), url.port()) else {
            return Err(Error::Url("the database URL".into()));
        };
        Self::create_tcp(api, name, "127.0.0.1:0", &format!("{host}:{port}")).await
    }

    /// A proxy named `name` listening on `listen` (`host:port`; port 0 for a free one)
    /// and forwarding to `upstream` (`host:port`): for a server whose clients must be
    /// told the proxy's address beforehand, as a Kafka broker advertises it.
    pub async fn create_tcp(api: &str, name: &str, listen: &str, upstream: &str) -> Result<Self> {
        let api = api.trim_end_matches('/').to_string();
        // No kept-alive connections: calls come seconds apart, and a connection the
        // server closed while idle failed the next call now and then.
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|source| Error::Api {
                api: api.clone(),
                source,
            })?;
        let failed = |source| Error::Api {
            api: api.clone(),
            source,
        };
        let created: Value = http
            .post(format!("{api}/proxies"))
            .json(&json!({"name": name, "listen": listen, "upstream": upstream, "enabled": true}))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(failed)?
            .json()
            .await
            .map_err(failed)?;
        let listen = created["listen"]
            .as_str()
            .ok_or_else(|| Error::NoListen { api: api.clone() })?
            .to_string();
        Ok(Self {
            api,
            name: name.to_string(),
            listen,
            http,
        })
    }

    /// `database_url` with its host and port replaced by the proxy's.
    pub fn url(&self, database_url: &str) -> Result<String> {
        let bad = || Error::Url("the database URL".into());
        let mut url = reqwest::Url::parse(database_url).map_err(|_| bad())?;
        let (host, port) = self.listen.rsplit_once(':').ok_or_else(bad)?;
        url.set_host(Some(host)).map_err(|_| bad())?;
        url.set_port(Some(port.parse().map_err(|_| bad())?))
            .map_err(|_| bad())?;
        Ok(url.to_string())
    }

    /// Puts `fault` on every link, open or new.
    pub async fn add(&self, fault: Fault) -> Result<()> {
        for (stream, kind, attributes) in fault.toxics() {
            self.add_toxic(&format!("{kind}_{stream}"), stream, kind, attributes)
                .await?;
        }
        Ok(())
    }

    /// Takes `fault` off again.
    pub async fn remove(&self, fault: Fault) -> Result<()> {
        for (stream, kind, _) in fault.toxics() {
            self.remove_toxic(&format!("{kind}_{stream}")).await?;
        }
        Ok(())
    }

    /// Puts toxic `name` of `kind` on `stream` of every link.
    pub async fn add_toxic(
        &self,
        name: &str,
        stream: &str,
        kind: &str,
        attributes: Value,
    ) -> Result<()> {
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
            .and_then(reqwest::Response::error_for_status)
            .map_err(|source| self.failed(source))?;
        Ok(())
    }

    pub async fn remove_toxic(&self, name: &str) -> Result<()> {
        self.http
            .delete(format!("{}/proxies/{}/toxics/{name}", self.api, self.name))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|source| self.failed(source))?;
        Ok(())
    }

    fn failed(&self, source: reqwest::Error) -> Error {
        Error::Api {
            api: self.api.clone(),
            source,
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // A drop cannot await, and the caller's runtime may not block in reqwest: one
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

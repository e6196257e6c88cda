//! Optional TLS on the HTTP listener (`--tls-cert`, `--tls-key`), with the certificate
//! reloaded from its files without a restart.
//!
//! Everything the listener serves — the API, executor callbacks, `/metrics`, `/healthz`
//! and `/readyz` — is then HTTPS only: there is no plain-HTTP port next to it. Kubernetes
//! probes take `scheme: HTTPS` (the kubelet does not verify the certificate) and a
//! Prometheus scrape config takes `scheme: https` with the CA.
//!
//! Handshakes run on their own tasks, each bounded by [`HANDSHAKE_TIMEOUT`], and only
//! finished connections reach the HTTP server, so a client that opens a connection and
//! sends nothing holds up no one else.
//!
//! The crypto provider is aws-lc-rs, named explicitly (not the process default), like
//! the rest of the binary's rustls users.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long a client gets to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where the certificate chain and its key are, and how often to look for new ones.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// How often both files are re-read. Polling rather than a file watch: a mounted
    /// Secret changes by a symlink swap a watch on the file misses, and the kubelet takes
    /// up to a minute to sync it anyway; reading two small files every few seconds costs
    /// nothing and bounds how long a replaced certificate is still served.
    pub reload_interval: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("TLS: reading {0}: {1}")]
    Read(PathBuf, io::Error),
    #[error("TLS: {0} holds no PEM certificate")]
    NoCertificate(PathBuf),
    #[error("TLS: {0}: {1}")]
    Pem(PathBuf, rustls::pki_types::pem::Error),
    #[error("TLS: the key in {key} does not fit the certificate in {cert}: {error}")]
    Key {
        cert: PathBuf,
        key: PathBuf,
        error: rustls::Error,
    },
    #[error("TLS: {0}")]
    Config(#[from] rustls::Error),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The bytes of both files, to notice a change by comparing them.
type Pems = (Vec<u8>, Vec<u8>);

fn read(files: &TlsFiles) -> Result<Pems, TlsError> {
    let read = |path: &Path| std::fs::read(path).map_err(|e| TlsError::Read(path.into(), e));
    Ok((read(&files.cert)?, read(&files.key)?))
}

fn certified_key(
    files: &TlsFiles,
    (cert, key): &Pems,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem(files.cert.clone(), e))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(files.cert.clone()));
    }
    let key =
        PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsError::Pem(files.key.clone(), e))?;
    CertifiedKey::from_der(chain, key, provider)
        .map(Arc::new)
        .map_err(|error| TlsError::Key {
            cert: files.cert.clone(),
            key: files.key.clone(),
            error,
        })
}

/// Hands every handshake the certificate loaded last.
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().expect("certificate lock").clone())
    }
}

/// A listener whose connections have finished their TLS handshake.
pub struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(connection) => connection,
            // The acceptor stops only at shutdown, when the server stops accepting too.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// A TLS listener on `tcp` with the certificate in `files`, and the two loops that feed
/// it (accepting and handshaking) and keep its certificate current; both run until
/// `shutdown`. Fails at once on files that cannot be read or do not hold a usable
/// certificate and key.
pub fn listen(
    tcp: TcpListener,
    local: SocketAddr,
    files: TlsFiles,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) -> Result<
    (
        TlsListener,
        impl Future<Output = ()> + Send + 'static,
        impl Future<Output = ()> + Send + 'static,
    ),
    TlsError,
> {
    let provider = provider();
    let pems = read(&files)?;
    let current = Arc::new(Current(RwLock::new(certified_key(
        &files, &pems, &provider,
    )?)));
    let mut config = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(rustls::DEFAULT_VERSIONS)?
        .with_no_client_auth()
        .with_cert_resolver(current.clone());
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let (tx, accepted) = mpsc::channel(64);
    let accepting = accept_loop(tcp, acceptor, tx, tracker, shutdown.clone());
    let reloading = reload_loop(files, pems, current, provider, shutdown);
    Ok((TlsListener { accepted, local }, accepting, reloading))
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    accepted: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
) {
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            result = tcp.accept() => match result {
                Ok(connection) => connection,
                Err(err) => {
                    // Out of file descriptors and the like: back off as axum's own
                    // listener does instead of spinning.
                    tracing::warn!(%err, "accepting a connection failed");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            },
        };
        let (acceptor, accepted, shutdown) = (acceptor.clone(), accepted.clone(), shutdown.clone());
        tracker.spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream));
            let stream = tokio::select! {
                _ = shutdown.cancelled() => return,
                result = handshake => match result {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(err)) => {
                        tracing::debug!(%peer, %err, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                },
            };
            // Fails only when the server has stopped accepting: the connection is dropped.
            let _ = accepted.send((stream, peer)).await;
        });
    }
}

async fn reload_loop(
    files: TlsFiles,
    mut loaded: Pems,
    current: Arc<Current>,
    provider: Arc<CryptoProvider>,
    shutdown: CancellationToken,
) {
    // Bytes last refused, so a broken file is reported once, not on every pass.
    let mut refused: Option<Pems> = None;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(files.reload_interval) => {}
        }
        let pems = match read(&files) {
            Ok(pems) => pems,
            Err(err) => {
                // Mid-swap, or deleted: the loaded certificate stays in use.
                tracing::warn!(%err, "keeping the TLS certificate in use");
                continue;
            }
        };
        if pems == loaded || refused.as_ref() == Some(&pems) {
            continue;
        }
        match certified_key(&files, &pems, &provider) {
            Ok(key) => {
                *current.0.write().expect("certificate lock") = key;
                loaded = pems;
                refused = None;
                tracing::info!(cert = %files.cert.display(), "TLS certificate reloaded");
            }
            Err(err) => {
                // A certificate written before its key (or the other way round) fits
                // again on a later pass.
                tracing::warn!(%err, "new TLS files refused; keeping the certificate in use");
                refused = Some(pems);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let (cert, key) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        (cert, key)
    }

    fn files(cert: &Path, key: &Path) -> TlsFiles {
        TlsFiles {
            cert: cert.into(),
            key: key.into(),
            reload_interval: Duration::from_secs(1),
        }
    }

    #[test]
    fn unusable_files_are_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (cert_a, key_a) = write_pair(dir.path(), "a");
        let (_, key_b) = write_pair(dir.path(), "b");
        let provider = provider();
        let load = |cert: &Path, key: &Path| {
            let f = files(cert, key);
            read(&f).and_then(|pems| certified_key(&f, &pems, &provider))
        };
        assert!(load(&cert_a, &key_a).is_ok());

        let err = load(&cert_a, &key_b).unwrap_err().to_string();
        assert!(
            err.contains("does not fit") && err.contains("b.key"),
            "{err}"
        );
        let err = load(&key_a, &key_a).unwrap_err().to_string();
        assert!(
            err.contains("no PEM certificate") && err.contains("a.key"),
            "{err}"
        );
        let err = load(&cert_a, &cert_a).unwrap_err().to_string();
        assert!(err.contains("a.crt"), "{err}");
        let err = load(&dir.path().join("missing.crt"), &key_a)
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.crt"), "{err}");
    }
}

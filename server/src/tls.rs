//! TLS for the gRPC listener (rustls, ring): the server's certificate, optionally client
//! certificates verified against `--tls-client-ca` (mTLS), and rotation without restarts.
//!
//! outboxd runs its own accept loop instead of tonic's static TLS config: each new connection
//! is handshaken with the [`ServerConfig`] in force, and a watcher swaps that config when the
//! files change (or on SIGHUP). Connections already open keep the session they negotiated, so
//! rotating a certificate drops no stream. Files that do not load keep the config in force.
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::listen::{ConnectionLimit, Guarded};
use crate::metrics::{RELOADS, TLS_HANDSHAKE_FAILURES};

/// A client has this long to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The PEM files of `--tls-cert`, `--tls-key` and `--tls-client-ca`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// One of the TLS files, as the flag that names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsFile {
    Cert,
    Key,
    ClientCa,
}

impl TlsFile {
    /// What the file is, in a sentence.
    pub fn noun(self) -> &'static str {
        match self {
            TlsFile::Cert => "TLS certificate",
            TlsFile::Key => "TLS private key",
            TlsFile::ClientCa => "TLS client CA",
        }
    }

    /// The flag and the environment variable that give it.
    pub fn flag(self) -> (&'static str, &'static str) {
        match self {
            TlsFile::Cert => ("--tls-cert", "OUTBOXD_TLS_CERT"),
            TlsFile::Key => ("--tls-key", "OUTBOXD_TLS_KEY"),
            TlsFile::ClientCa => ("--tls-client-ca", "OUTBOXD_TLS_CLIENT_CA"),
        }
    }
}

/// TLS files that do not load: which file, and why.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {}: {source}", path.display())]
    Read { file: TlsFile, path: PathBuf, source: io::Error },
    #[error("{}: {cause}", path.display())]
    Invalid { file: TlsFile, path: PathBuf, cause: String },
    #[error("{} and {}: {cause}", cert.display(), key.display())]
    Mismatch { cert: PathBuf, key: PathBuf, cause: String },
    #[error("{0}")]
    Other(String),
}

/// What was read, to notice a change.
type Snapshot = Vec<Vec<u8>>;

impl TlsFiles {
    fn read(&self) -> Result<Snapshot, TlsError> {
        let read = |file: TlsFile, path: &PathBuf| {
            std::fs::read(path).map_err(|source| TlsError::Read { file, path: path.clone(), source })
        };
        let mut out = vec![read(TlsFile::Cert, &self.cert)?, read(TlsFile::Key, &self.key)?];
        if let Some(ca) = &self.client_ca {
            out.push(read(TlsFile::ClientCa, ca)?);
        }
        Ok(out)
    }

    fn build(&self, files: &Snapshot) -> Result<Arc<ServerConfig>, TlsError> {
        let err = |file: TlsFile, path: &PathBuf, e: &dyn std::fmt::Display| TlsError::Invalid {
            file,
            path: path.clone(),
            cause: e.to_string(),
        };
        let chain = CertificateDer::pem_slice_iter(&files[0])
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| err(TlsFile::Cert, &self.cert, &e))?;
        if chain.is_empty() {
            return Err(err(TlsFile::Cert, &self.cert, &"no PEM certificate in the file"));
        }
        let key = PrivateKeyDer::from_pem_slice(&files[1]).map_err(|e| match e {
            rustls_pki_types::pem::Error::NoItemsFound => {
                err(TlsFile::Key, &self.key, &"no PEM private key (PKCS#8, PKCS#1 or SEC1) in the file")
            }
            e => err(TlsFile::Key, &self.key, &e),
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Other(e.to_string()))?;
        let builder = match (&self.client_ca, files.get(2)) {
            (Some(path), Some(pem)) => {
                let mut roots = rustls::RootCertStore::empty();
                let ca = |e: &dyn std::fmt::Display| err(TlsFile::ClientCa, path, e);
                for c in CertificateDer::pem_slice_iter(pem) {
                    roots.add(c.map_err(|e| ca(&e))?).map_err(|e| ca(&e))?;
                }
                if roots.is_empty() {
                    return Err(ca(&"no PEM certificate in the file"));
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|e| ca(&e))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| TlsError::Mismatch {
            cert: self.cert.clone(),
            key: self.key.clone(),
            cause: match e {
                rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                    "the key is not the certificate's".to_owned()
                }
                e => e.to_string(),
            },
        })?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}

/// The server config in force, and what it was built from.
#[derive(Debug, Clone)]
pub struct TlsState {
    files: TlsFiles,
    config: Arc<RwLock<Arc<ServerConfig>>>,
    last: Arc<Mutex<Snapshot>>,
    /// The ALPN protocols this listener offers instead of the config's `h2` (the console
    /// speaks HTTP/1.1).
    alpn: Option<Vec<Vec<u8>>>,
}

impl TlsState {
    /// Loads the files; an error here stops start-up.
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        let snap = files.read()?;
        let config = files.build(&snap)?;
        Ok(Self { files, config: Arc::new(RwLock::new(config)), last: Arc::new(Mutex::new(snap)), alpn: None })
    }

    /// The same certificates (and their reloads), offering HTTP/1.1 instead of HTTP/2 in the
    /// handshake: for the console's listener.
    pub fn for_http1(&self) -> Self {
        Self { alpn: Some(vec![b"http/1.1".to_vec()]), ..self.clone() }
    }

    pub fn mtls(&self) -> bool {
        self.files.client_ca.is_some()
    }

    fn current(&self) -> Arc<ServerConfig> {
        let config = self.config.read().unwrap_or_else(|e| e.into_inner()).clone();
        match &self.alpn {
            Some(alpn) => {
                let mut c = (*config).clone();
                c.alpn_protocols = alpn.clone();
                Arc::new(c)
            }
            None => config,
        }
    }

    /// Rebuilds the config if any file changed; keeps the one in force if they do not load
    /// (a rotation half written is retried at the next look).
    pub fn reload(&self) {
        let snap = match self.files.read() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the TLS files; keeping the certificate in force");
                return;
            }
        };
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if *last == snap {
            return;
        }
        match self.files.build(&snap) {
            Ok(config) => {
                *self.config.write().unwrap_or_else(|e| e.into_inner()) = config;
                tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded; new connections use it");
                metrics::counter!(RELOADS, "file" => "tls", "outcome" => "ok").increment(1);
            }
            Err(e) => {
                // Logged once per content: a key written after its certificate changes the
                // files again, and they are tried again then.
                tracing::warn!(error = %e, "the TLS files do not load; keeping the certificate in force");
                metrics::counter!(RELOADS, "file" => "tls", "outcome" => "failed").increment(1);
            }
        }
        *last = snap;
    }

    /// Re-reads the files every `interval` and on SIGHUP until `cancel`.
    pub async fn watch(self, interval: Duration, cancel: CancellationToken) {
        crate::reload::every_interval_and_sighup(interval, cancel, move || self.reload()).await;
    }

    /// Accepts on `listener` and handshakes each connection (concurrently, bounded in time and
    /// by `limit`'s places, which the handshake already holds) with the config in force; yields
    /// the connections that completed it, with the preface deadline armed. Ends at `stop`.
    pub fn incoming(
        self,
        listener: TcpListener,
        limit: ConnectionLimit,
        stop: CancellationToken,
    ) -> ReceiverStream<io::Result<Guarded<TlsStream<TcpStream>>>> {
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tx.closed() => return,
                    a = listener.accept() => match a {
                        Ok(a) => a,
                        Err(e) => {
                            // Out of file descriptors and the like: wait a little, go on.
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                let Some(place) = limit.admit(peer) else { continue };
                let acceptor = TlsAcceptor::from(self.current());
                let (tx, limit) = (tx.clone(), limit.clone());
                tokio::spawn(async move {
                    // A connection whose place a full listener takes back during its handshake
                    // is dropped then, socket and all (ADR 0079): otherwise connections that
                    // never send a ClientHello would keep their sockets for the whole timeout
                    // beyond every place.
                    let evicted = place.evicted();
                    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
                    tokio::select! {
                        r = handshake => match r {
                            Ok(Ok(tls)) => {
                                let _ = tx.send(Ok(limit.guard(tls, place))).await;
                            }
                            Ok(Err(e)) => handshake_failed(peer, &e),
                            Err(_) => handshake_failed(peer, &"timed out"),
                        },
                        _ = evicted => handshake_failed(peer, &"its place went to a new connection"),
                    }
                });
            }
        });
        ReceiverStream::new(rx)
    }
}

fn handshake_failed(peer: SocketAddr, e: &dyn std::fmt::Display) {
    tracing::debug!(%peer, error = %e, "TLS handshake failed");
    metrics::counter!(TLS_HANDSHAKE_FAILURES).increment(1);
}

//! Who is calling: the principals of `--auth-file`, re-read when it changes, and the
//! [`Authenticator`] that finds a request's caller from its bearer token or client certificate.
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::caller::{Caller, Credential, count};
use super::identity::{cert_identities, shown_identity};
use super::permission::{Need, Principal};
use super::table::{AuthTable, InForce};
use crate::metrics::RELOADS;

/// An auth file that does not load at start-up.
#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    /// What is wrong and where in the file, never its text.
    #[error("{}: {cause}", path.display())]
    Invalid { path: PathBuf, cause: String },
}

/// The principals in force, re-read from `--auth-file` when it changes (or on SIGHUP). With no
/// file, every caller is unrestricted.
#[derive(Debug, Clone)]
pub struct Authenticator {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    path: Option<PathBuf>,
    in_force: Arc<InForce>,
    /// The text last read, parsed or not: a bad file is logged once, not at every poll.
    last_text: Mutex<Option<String>>,
}

impl Authenticator {
    /// No auth file: everyone may do everything.
    pub fn open() -> Self {
        Self {
            inner: Arc::new(Inner {
                path: None,
                in_force: Arc::new(InForce::new(AuthTable::default())),
                last_text: Mutex::new(None),
            }),
        }
    }

    /// Loads `path`; an unreadable or invalid file is an error here (at start-up).
    pub fn from_file(path: &Path) -> Result<Self, AuthFileError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| AuthFileError::Read { path: path.to_owned(), source })?;
        let table = AuthTable::parse(&text).map_err(|cause| AuthFileError::Invalid { path: path.to_owned(), cause })?;
        tracing::info!(path = %path.display(), principals = table.principals, "auth file loaded");
        Ok(Self {
            inner: Arc::new(Inner {
                path: Some(path.to_owned()),
                in_force: Arc::new(InForce::new(table)),
                last_text: Mutex::new(Some(text)),
            }),
        })
    }

    pub fn enabled(&self) -> bool {
        self.inner.path.is_some()
    }

    /// The principal of that name in the file in force.
    fn principal_named(&self, name: &str) -> Option<Arc<Principal>> {
        let table = self.table();
        table.by_token.values().chain(table.by_subject.values()).find(|p| p.name == name).cloned()
    }

    fn table(&self) -> Arc<AuthTable> {
        self.inner.in_force.table()
    }

    /// Re-reads the file if its text changed. A file that cannot be read or parsed keeps the
    /// principals in force and logs why.
    pub fn reload(&self) {
        let Some(path) = &self.inner.path else { return };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                let mut last = self.inner.last_text.lock().unwrap_or_else(|e| e.into_inner());
                if last.is_some() {
                    tracing::warn!(path = %path.display(), error = %e, "cannot read the auth file; keeping the principals in force");
                    metrics::counter!(RELOADS, "file" => "auth", "outcome" => "failed").increment(1);
                    *last = None;
                }
                return;
            }
        };
        let mut last = self.inner.last_text.lock().unwrap_or_else(|e| e.into_inner());
        if last.as_deref() == Some(text.as_str()) {
            return;
        }
        match AuthTable::parse(&text) {
            Ok(table) => {
                tracing::info!(path = %path.display(), principals = table.principals, "auth file reloaded");
                metrics::counter!(RELOADS, "file" => "auth", "outcome" => "ok").increment(1);
                self.inner.in_force.swap(table);
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "the auth file does not parse; keeping the principals in force");
                metrics::counter!(RELOADS, "file" => "auth", "outcome" => "failed").increment(1);
            }
        }
        *last = Some(text);
    }

    /// Who sent this request: a bearer token if there is an `authorization` header, else the
    /// client certificate's identities (its SAN URIs, then `CN=…`), the first the file names.
    pub fn authenticate(&self, headers: &http::HeaderMap, extensions: &http::Extensions) -> Result<Caller, Status> {
        let cert = extensions
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(|i| i.peer_certs())
            .and_then(|certs| certs.first().map(|c| c.as_ref().to_vec()));
        let token = match headers.get(http::header::AUTHORIZATION) {
            None => None,
            Some(value) => Some(
                value
                    .to_str()
                    .ok()
                    .and_then(|v| v.split_once(' '))
                    .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                    .map(|(_, t)| t.trim())
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| {
                        count("unknown", "unauthenticated");
                        Status::unauthenticated("malformed authorization header: expected \"Bearer <token>\"")
                    })?,
            ),
        };
        self.authenticate_credential(token, cert.as_deref())
    }

    /// [`Authenticator::authenticate`] from the credential itself: a bearer token, else the
    /// client certificate (DER) of the connection. The console signs in with these.
    pub fn authenticate_credential(&self, token: Option<&str>, cert: Option<&[u8]>) -> Result<Caller, Status> {
        let identities = || cert.map(cert_identities).unwrap_or_default();
        if !self.enabled() {
            let name = identities().first().map_or_else(|| "anonymous".into(), |k| shown_identity(k));
            return Ok(Caller::unrestricted(&name));
        }
        let table = self.table();
        if let Some(token) = token {
            let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
            return match table.by_token.get(&hash) {
                Some(p) => Ok(Caller::authenticated(p, self.inner.in_force.clone(), Credential::Token(hash))),
                None => {
                    count("unknown", "unauthenticated");
                    Err(Status::unauthenticated("the bearer token is not valid"))
                }
            };
        }
        for id in identities() {
            if let Some(p) = table.by_subject.get(&id) {
                return Ok(Caller::authenticated(p, self.inner.in_force.clone(), Credential::Subject(id)));
            }
        }
        count("unknown", "unauthenticated");
        Err(Status::unauthenticated(
            "no credential: send \"authorization: Bearer <token>\" or a client certificate that the auth file names",
        ))
    }

    /// The caller whose bearer token has this SHA-256, in the auth file in force (a console
    /// session, which keeps the hash of the token it signed in with).
    pub fn authenticate_token_hash(&self, hash: &[u8; 32]) -> Result<Caller, Status> {
        match self.table().by_token.get(hash) {
            Some(p) if self.enabled() => {
                Ok(Caller::authenticated(p, self.inner.in_force.clone(), Credential::Token(*hash)))
            }
            _ => Err(Status::unauthenticated("the token of this session is no longer valid")),
        }
    }

    /// Re-reads the file every `interval` and on SIGHUP until `cancel`.
    pub async fn watch(self, interval: Duration, cancel: CancellationToken) {
        if !self.enabled() {
            return;
        }
        crate::reload::every_interval_and_sighup(interval, cancel, move || self.reload()).await;
    }
}

/// A sink runs on its creator's authority: while the auth file in force still names that
/// principal with `sink:NAME` and `tail:` on each of the sink's topics (without an auth file,
/// every sink runs).
impl crate::sinks::supervisor::SinkOwners for Authenticator {
    fn may_run(&self, owner: &str, spec: &crate::domain::ConsumerSpec) -> Result<(), String> {
        if !self.enabled() {
            return Ok(());
        }
        let Some(p) = self.principal_named(owner) else {
            return Err(format!("its creator, principal {owner:?}, is no longer in the auth file"));
        };
        let name = spec.name.as_str();
        let needs = std::iter::once(Need::Sink(name)).chain(spec.topics.iter().map(Need::Tail));
        for need in needs {
            if !p.allows(&need) {
                return Err(format!("its creator, principal {owner:?}, no longer holds {need}"));
            }
        }
        Ok(())
    }

    fn changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.in_force.changes()
    }
}

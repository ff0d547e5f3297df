//! Who is calling, and may they: principals from `--auth-file`, bearer tokens and client
//! certificates, permissions, and the tower layer that authenticates every request.
//!
//! The layer ([`AuthLayer`]) runs before any service. It leaves gRPC health open, asks any valid
//! credential for reflection, checks the permissions that need no resource (`admin:read`,
//! `admin:write`) itself and hands a [`Caller`] to the services in the request's extensions.
//! The services check what depends on the request's content (a topic, a consumer) with
//! [`authorize`] before they act. A request that reaches a service without a [`Caller`] is
//! refused, so a service added without going through the layer fails closed.
//!
//! Decisions are counted in `outboxd_auth_decisions_total{principal, outcome}`.
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request as HttpRequest, Response as HttpResponse};
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tonic::body::Body;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::domain::TopicPattern;
use crate::metrics::{DECISIONS, RELOADS};

/// A consumer-name pattern of a permission: `*` matches any run of characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameGlob(String);

impl NameGlob {
    pub fn matches(&self, name: &str) -> bool {
        glob_match(self.0.as_bytes(), name.as_bytes())
    }

    /// Whether it names `name` itself, not by a pattern.
    pub fn names(&self, name: &str) -> bool {
        self.0 == name
    }
}

/// `*` matches any run (possibly empty); everything else matches itself.
fn glob_match(pat: &[u8], s: &[u8]) -> bool {
    // Iterative with one backtrack point: linear enough for names of at most 200 characters.
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        if p < pat.len() && pat[p] == b'*' {
            star = Some((p, i));
            p += 1;
        } else if p < pat.len() && pat[p] == s[i] {
            p += 1;
            i += 1;
        } else if let Some((sp, si)) = star {
            p = sp + 1;
            i = si + 1;
            star = Some((sp, si + 1));
        } else {
            return false;
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

/// One entry of a principal's `permissions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Permission {
    /// `*`: everything.
    All,
    /// `produce:PATTERN`: `Enqueue`, `EnqueueBatch` on matching topics.
    Produce(TopicPattern),
    /// `consume:NAME`: `Subscribe` to matching consumers.
    Consume(NameGlob),
    /// `tail:PATTERN`: `Tail` of matching topics (it shows payloads).
    Tail(TopicPattern),
    /// `admin:read`: stats, consumers, dead letters, messages.
    AdminRead,
    /// `admin:write`: create, delete, pause, resume consumers; prune.
    AdminWrite,
    /// `replay:NAME`: `Replay`, `ReplayStream`, `ReleaseKey` for matching consumers.
    Replay(NameGlob),
    /// `sink:NAME`: create a consumer named NAME that outboxd delivers itself (a sink), with
    /// `admin:write`, and only on topics that `tail:` lets the same principal read.
    Sink(NameGlob),
}

/// The kinds of permission that a method checks against the request's content: a caller that
/// holds no permission of the kind is refused from the request's headers, before its body is
/// read (ADR 0053).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Produce,
    Consume,
    Tail,
    Replay,
}

impl Kind {
    /// How the auth file writes a permission of this kind.
    fn written(self) -> &'static str {
        match self {
            Kind::Produce => "produce:PATTERN",
            Kind::Consume => "consume:NAME",
            Kind::Tail => "tail:PATTERN",
            Kind::Replay => "replay:NAME",
        }
    }
}

impl Permission {
    pub fn parse(s: &str) -> Result<Self, String> {
        let glob = |what: &str, g: &str| {
            if g.is_empty() || !g.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '*')) {
                Err(format!("{what}:{g:?}: a consumer name pattern is [A-Za-z0-9_.-] and `*`"))
            } else {
                Ok(NameGlob(g.to_owned()))
            }
        };
        let topics =
            |what: &str, p: &str| TopicPattern::parse(what, p).map_err(|e| format!("{what}:{p:?}: {}", e.reason));
        match s.split_once(':') {
            None if s == "*" => Ok(Permission::All),
            Some(("admin", "read")) => Ok(Permission::AdminRead),
            Some(("admin", "write")) => Ok(Permission::AdminWrite),
            Some(("produce", p)) => topics("produce", p).map(Permission::Produce),
            Some(("tail", p)) => topics("tail", p).map(Permission::Tail),
            Some(("consume", g)) => glob("consume", g).map(Permission::Consume),
            Some(("replay", g)) => glob("replay", g).map(Permission::Replay),
            Some(("sink", g)) => glob("sink", g).map(Permission::Sink),
            _ => Err(format!(
                "unknown permission {s:?}: one of produce:PATTERN, consume:NAME, tail:PATTERN, admin:read, \
                 admin:write, replay:NAME, sink:NAME, *"
            )),
        }
    }

    fn allows(&self, need: &Need<'_>) -> bool {
        match (self, need) {
            (Permission::All, _) => true,
            (Permission::Produce(p), Need::Produce(topic)) => p.matches(topic),
            (Permission::Consume(g), Need::Consume(name)) => g.matches(name),
            (Permission::Tail(p), Need::Tail(wanted)) => p.covers(wanted),
            (Permission::AdminRead, Need::AdminRead) | (Permission::AdminWrite, Need::AdminWrite) => true,
            (Permission::Replay(g), Need::Replay(name)) => g.matches(name),
            (Permission::Sink(g), Need::Sink(name)) => g.matches(name),
            _ => false,
        }
    }

    fn is_of(&self, kind: Kind) -> bool {
        matches!(
            (self, kind),
            (Permission::All, _)
                | (Permission::Produce(_), Kind::Produce)
                | (Permission::Consume(_), Kind::Consume)
                | (Permission::Tail(_), Kind::Tail)
                | (Permission::Replay(_), Kind::Replay)
        )
    }
}

/// What one request needs, with its resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need<'a> {
    Produce(&'a str),
    Consume(&'a str),
    Tail(&'a TopicPattern),
    AdminRead,
    AdminWrite,
    Replay(&'a str),
    Sink(&'a str),
    /// A method the layer does not know: only `*` may call it.
    Everything,
}

impl Need<'_> {
    /// The resource, as a denial names it.
    fn resource(&self) -> String {
        match self {
            Need::Produce(t) => format!("topic {t:?}"),
            Need::Tail(p) => format!("topics matching {:?}", p.as_str()),
            Need::Consume(c) | Need::Replay(c) | Need::Sink(c) => format!("consumer {c:?}"),
            Need::AdminRead => "the admin API (reads)".into(),
            Need::AdminWrite => "the admin API (changes)".into(),
            Need::Everything => "this method".into(),
        }
    }
}

/// The permission that would allow it, as written in the auth file.
impl fmt::Display for Need<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Need::Produce(t) => write!(f, "produce:{t}"),
            Need::Consume(c) => write!(f, "consume:{c}"),
            Need::Tail(p) => write!(f, "tail:{}", p.as_str()),
            Need::AdminRead => f.write_str("admin:read"),
            Need::AdminWrite => f.write_str("admin:write"),
            Need::Replay(c) => write!(f, "replay:{c}"),
            Need::Sink(c) => write!(f, "sink:{c}"),
            Need::Everything => f.write_str("*"),
        }
    }
}

/// A named holder of permissions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub permissions: Vec<Permission>,
}

impl Principal {
    pub fn allows(&self, need: &Need<'_>) -> bool {
        self.permissions.iter().any(|p| p.allows(need))
    }

    /// Whether it holds `*`, or `consume:` naming the consumer `name` itself (no pattern).
    fn owns_consumer_name(&self, name: &str) -> bool {
        self.permissions.iter().any(|p| match p {
            Permission::All => true,
            Permission::Consume(g) => g.names(name),
            _ => false,
        })
    }

    /// Whether it holds any permission of `kind` (on any resource).
    pub fn holds(&self, kind: Kind) -> bool {
        self.permissions.iter().any(|p| p.is_of(kind))
    }
}

/// A parsed auth file: principals by token hash and by certificate identity.
#[derive(Debug, Default)]
pub struct AuthTable {
    by_token: HashMap<[u8; 32], Arc<Principal>>,
    by_subject: HashMap<String, Arc<Principal>>,
    pub principals: usize,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthFile {
    #[serde(default)]
    principal: Vec<PrincipalEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrincipalEntry {
    name: String,
    #[serde(default)]
    tokens: Vec<String>,
    #[serde(default)]
    subjects: Vec<String>,
    #[serde(default)]
    permissions: Vec<String>,
}

/// `text` with every quoted value (the parser quotes back what it read) replaced by `"…"`;
/// field names, which serde writes in backticks, stay.
fn unquoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut quoted = false;
    for c in text.chars() {
        match (c, quoted) {
            ('"' | '\'', false) => {
                quoted = true;
                out.push_str("\"…");
            }
            ('"' | '\'', true) => {
                quoted = false;
                out.push('"');
            }
            (_, false) => out.push(c),
            (_, true) => {}
        }
    }
    out
}

/// `sha256:` and 64 lowercase hex digits.
fn parse_token_hash(s: &str) -> Option<[u8; 32]> {
    let hex = s.strip_prefix("sha256:")?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The `sha256:` line of a token, as the auth file holds it.
pub fn token_hash_line(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

impl AuthTable {
    /// Parses an auth file's text; the error says which principal and entry is wrong (never
    /// repeating a token hash).
    pub fn parse(text: &str) -> Result<Self, String> {
        // The parser's own message quotes the offending line, which may hold a token: say
        // where, and what was expected, but never the text.
        let file: AuthFile = toml::from_str(text).map_err(|e| {
            let at = e.span().map(|s| {
                let line = text[..s.start.min(text.len())].matches('\n').count() + 1;
                format!(" on line {line}")
            });
            format!("the auth file is not valid TOML{}: {}", at.unwrap_or_default(), unquoted(e.message()))
        })?;
        let mut table = AuthTable::default();
        let mut names = HashMap::new();
        for (i, p) in file.principal.into_iter().enumerate() {
            let at = format!("principal[{i}] ({:?})", p.name);
            if p.name.trim().is_empty() {
                return Err(format!("principal[{i}]: name must not be empty"));
            }
            if names.insert(p.name.clone(), i).is_some() {
                return Err(format!("{at}: another principal has the same name"));
            }
            if p.tokens.is_empty() && p.subjects.is_empty() {
                return Err(format!("{at}: has neither tokens nor subjects, so nobody can be it"));
            }
            let permissions = p
                .permissions
                .iter()
                .enumerate()
                .map(|(j, s)| Permission::parse(s).map_err(|e| format!("{at}: permissions[{j}]: {e}")))
                .collect::<Result<Vec<_>, _>>()?;
            let principal = Arc::new(Principal { name: p.name, permissions });
            for (j, t) in p.tokens.iter().enumerate() {
                let hash = parse_token_hash(t).ok_or_else(|| {
                    format!(
                        "{at}: tokens[{j}] is not \"sha256:\" and 64 lowercase hex digits (`outboxctl auth \
                             new-token` prints a token and the line for it)"
                    )
                })?;
                match table.by_token.entry(hash) {
                    Entry::Occupied(o) => {
                        return Err(format!("{at}: tokens[{j}] is also a token of {:?}", o.get().name));
                    }
                    Entry::Vacant(v) => {
                        v.insert(principal.clone());
                    }
                }
            }
            for (j, s) in p.subjects.iter().enumerate() {
                let Some(key) = subject_key(s) else {
                    return Err(format!(
                        "{at}: subjects[{j}] {s:?} is none of \"CN=name\" (or \"cn:name\"), a URI \
                         (spiffe://…, or \"uri:…\"), \"dns:name\""
                    ));
                };
                match table.by_subject.entry(key) {
                    Entry::Occupied(o) => {
                        return Err(format!("{at}: subjects[{j}] {s:?} is also a subject of {:?}", o.get().name));
                    }
                    Entry::Vacant(v) => {
                        v.insert(principal.clone());
                    }
                }
            }
            table.principals += 1;
        }
        Ok(table)
    }
}

/// A request's caller, put in the request's extensions by [`AuthLayer`].
#[derive(Clone)]
pub struct Caller {
    /// The principal's name; without an auth file, the client certificate's identity or
    /// `anonymous`.
    pub name: Arc<str>,
    /// `None`: no auth file, everything is allowed.
    principal: Option<Arc<Principal>>,
    /// How it was authenticated, to find it again in a reloaded auth file.
    credential: Option<(Authenticator, Credential)>,
}

/// Who, and as which principal: never the credential, nor the auth file it was checked against.
impl fmt::Debug for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Caller").field("name", &self.name).field("principal", &self.principal).finish()
    }
}

/// What authenticated a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Credential {
    /// A bearer token, by its SHA-256.
    Token([u8; 32]),
    /// A client certificate, by the identity the auth file named.
    Subject(String),
}

impl Caller {
    /// Everything allowed (no auth file): in tests and unauthenticated servers.
    pub fn unrestricted(name: &str) -> Self {
        Self { name: name.into(), principal: None, credential: None }
    }

    /// Resolves once this caller may no longer do what `still` asks of its principal: its
    /// credential is gone from a reloaded auth file (UNAUTHENTICATED), or the principal it now
    /// names lacks the permission (PERMISSION_DENIED). Open streams race it, so that revoking
    /// a principal ends them within a reload. Never resolves for an unrestricted caller.
    pub async fn revoked(&self, still: impl Fn(&Principal) -> bool) -> Status {
        self.revoked_unless(|p, _| {
            (!still(p)).then(|| {
                Status::permission_denied(format!(
                    "principal {:?} no longer holds the permission this stream needs (the auth file changed)",
                    p.name
                ))
            })
        })
        .await
    }

    /// Resolves once this caller may no longer consume `consumer`: as [`Self::revoked`] for
    /// `consume:NAME`, and also once the consumer's creator may no longer read one of its
    /// topics (see [`Self::check_creator`]).
    pub async fn revoked_consuming(&self, consumer: &crate::domain::Consumer) -> Status {
        let (spec, owner) = (consumer.spec.clone(), consumer.created_by.clone());
        self.revoked_unless(move |p, table| {
            let name = spec.name.as_str();
            if !p.allows(&Need::Consume(name)) {
                return Some(Status::permission_denied(format!(
                    "principal {:?} no longer holds the permission consume:{name} (the auth file changed)",
                    p.name
                )));
            }
            creator_refusal(table, owner.as_deref(), &spec).map(Status::permission_denied)
        })
        .await
    }

    /// `PERMISSION_DENIED` unless the principal that created `consumer` (when one is recorded and
    /// an auth file is in force) still may read each of its topics: a consumer reads on its
    /// creator's authority, as a sink runs on it, so a `tail:` taken away from its creator is
    /// not kept through a consumer made while it held (ADR 0072).
    pub fn check_creator(&self, consumer: &crate::domain::Consumer) -> Result<(), Status> {
        let Some((auth, _)) = &self.credential else { return Ok(()) };
        match creator_refusal(&auth.table(), consumer.created_by.as_deref(), &consumer.spec) {
            Some(why) => Err(Status::permission_denied(why)),
            None => Ok(()),
        }
    }

    async fn revoked_unless(&self, refusal: impl Fn(&Principal, &AuthTable) -> Option<Status>) -> Status {
        let Some((auth, credential)) = &self.credential else { return std::future::pending().await };
        let mut reloads = auth.inner.generation.subscribe();
        loop {
            if reloads.changed().await.is_err() {
                return std::future::pending().await;
            }
            let table = auth.table();
            let now = match credential {
                Credential::Token(hash) => table.by_token.get(hash),
                Credential::Subject(s) => table.by_subject.get(s),
            };
            match now {
                None => {
                    tracing::info!(principal = %self.name, "credential revoked: ending its stream");
                    return Status::unauthenticated(format!(
                        "the credential of principal {:?} was revoked (the auth file changed)",
                        self.name
                    ));
                }
                Some(p) => {
                    if let Some(status) = refusal(p, &table) {
                        tracing::info!(principal = %p.name, why = status.message(), "permission revoked: ending its stream");
                        return status;
                    }
                }
            }
        }
    }

    /// `PERMISSION_DENIED` naming the permission and the resource unless this caller holds it.
    pub fn check(&self, need: Need<'_>) -> Result<(), Status> {
        let Some(p) = &self.principal else { return Ok(()) };
        if p.allows(&need) {
            count(&p.name, "allowed");
            Ok(())
        } else {
            count(&p.name, "denied");
            tracing::debug!(principal = %p.name, permission = %need, "permission denied");
            Err(Status::permission_denied(format!(
                "principal {:?} lacks the permission {need} for {}",
                p.name,
                need.resource()
            )))
        }
    }
}

impl Caller {
    /// Whether it holds what `need` names (no refusal, nothing counted): for what a response
    /// shows, not whether it is answered.
    pub fn allows(&self, need: Need<'_>) -> bool {
        self.principal.as_ref().is_none_or(|p| p.allows(&need))
    }

    /// `PERMISSION_DENIED` unless this caller holds some permission of `kind`.
    pub fn check_kind(&self, kind: Kind) -> Result<(), Status> {
        let Some(p) = &self.principal else { return Ok(()) };
        if p.holds(kind) {
            Ok(())
        } else {
            count(&p.name, "denied");
            Err(Status::permission_denied(format!(
                "principal {:?} lacks the permission {} that this method needs",
                p.name,
                kind.written()
            )))
        }
    }

    /// The SHA-256 of the bearer token it was authenticated with (what a console session keeps
    /// to look it up again: never the token).
    pub fn token_hash(&self) -> Option<[u8; 32]> {
        match &self.credential {
            Some((_, Credential::Token(hash))) => Some(*hash),
            _ => None,
        }
    }

    /// The principal's name when an auth file is in force (for per-principal quotas); `None`
    /// without one, where every caller is unrestricted.
    pub fn principal_name(&self) -> Option<&str> {
        self.principal.as_ref().map(|p| p.name.as_str())
    }
}

/// A change to consumers, as [`Caller::check_consumer`] judges it (ADR 0072).
#[derive(Debug, Clone, Copy)]
pub enum ConsumerChange<'a> {
    /// Creating a consumer of this definition (beyond `admin:write`, which the layer checks).
    Create(&'a crate::domain::ConsumerSpec),
    /// Deleting this existing consumer.
    Delete(&'a crate::domain::Consumer),
}

impl Caller {
    /// The one rule of who may create and change consumers, besides `admin:write`:
    ///
    /// - a consumer takes only topics its creator may read: `tail:` covering each of them, as
    ///   for a sink, which also needs `sink:NAME`. Otherwise `admin:write` would read any topic
    ///   through a consumer of its own.
    /// - a consumer is deleted only by its creator, or by `*`: one principal cannot delete
    ///   another's consumer (and its waiting messages), nor create it again on other topics
    ///   under the name that application subscribes to. `consume:` does not delete one it did
    ///   not create: a pattern (`consume:team-*`) would let one team redirect another's stream
    ///   (ADR 0072, amended). A consumer created without an auth file (or before creators were
    ///   recorded) has none: `consume:NAME` or `*`.
    /// - pausing and resuming stay `admin:write`'s alone: the operator's brake, which moves no
    ///   message anywhere and is undone by resuming (both audited).
    ///
    /// Without an auth file there is one trusted caller and everything is allowed.
    pub fn check_consumer(&self, change: ConsumerChange<'_>) -> Result<(), Status> {
        let Some(p) = &self.principal else { return Ok(()) };
        match change {
            ConsumerChange::Create(spec) => {
                if spec.sink.is_some() {
                    // A sink sends every payload of its topics out of outboxd: a permission of its own.
                    self.check(Need::Sink(spec.name.as_str()))?;
                }
                for t in &spec.topics {
                    self.check(Need::Tail(t)).map_err(|s| {
                        Status::permission_denied(format!(
                            "{}: a consumer takes only topics its creator may read",
                            s.message()
                        ))
                    })?;
                }
                Ok(())
            }
            ConsumerChange::Delete(c) => {
                let name = c.spec.name.as_str();
                let allowed = match c.created_by.as_deref() {
                    Some(creator) => creator == p.name || p.allows(&Need::Everything),
                    // No principal owns it: the one its name is given to (not by a pattern,
                    // which may cover another team's names).
                    None => p.owns_consumer_name(name),
                };
                if allowed {
                    count(&p.name, "allowed");
                    return Ok(());
                }
                count(&p.name, "denied");
                Err(Status::permission_denied(match &c.created_by {
                    Some(creator) => format!(
                        "principal {:?} may not delete consumer {name:?}: it was created by principal {creator:?}, \
                         and only its creator or a principal with the permission * deletes it",
                        p.name
                    ),
                    None => format!(
                        "principal {:?} lacks the permission consume:{name} for consumer {name:?}: it has no \
                         recorded creator, and only a principal given consume:{name} itself (not a pattern) or * \
                         deletes it",
                        p.name
                    ),
                }))
            }
        }
    }
}

fn count(principal: &str, outcome: &'static str) {
    metrics::counter!(DECISIONS, "principal" => principal.to_owned(), "outcome" => outcome).increment(1);
}

/// The request's caller, or a refusal if the request did not pass [`AuthLayer`].
pub fn caller<T>(request: &tonic::Request<T>) -> Result<Caller, Status> {
    request
        .extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| Status::unauthenticated("the request was not authenticated"))
}

/// Checks that the request's caller holds what `need` names; returns the caller (for audit).
pub fn authorize<T>(request: &tonic::Request<T>, need: Need<'_>) -> Result<Caller, Status> {
    let c = caller(request)?;
    c.check(need)?;
    Ok(c)
}

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
    table: RwLock<Arc<AuthTable>>,
    /// The text last read, parsed or not: a bad file is logged once, not at every poll.
    last_text: Mutex<Option<String>>,
    /// Bumped at every table swapped in: open streams look their caller up again.
    generation: tokio::sync::watch::Sender<u64>,
}

impl Authenticator {
    /// No auth file: everyone may do everything.
    pub fn open() -> Self {
        Self {
            inner: Arc::new(Inner {
                path: None,
                table: RwLock::default(),
                last_text: Mutex::new(None),
                generation: tokio::sync::watch::Sender::new(0),
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
                table: RwLock::new(Arc::new(table)),
                last_text: Mutex::new(Some(text)),
                generation: tokio::sync::watch::Sender::new(0),
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
        self.inner.table.read().unwrap_or_else(|e| e.into_inner()).clone()
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
                *self.inner.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(table);
                self.inner.generation.send_modify(|g| *g += 1);
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
                Some(p) => Ok(Caller {
                    name: p.name.as_str().into(),
                    principal: Some(p.clone()),
                    credential: Some((self.clone(), Credential::Token(hash))),
                }),
                None => {
                    count("unknown", "unauthenticated");
                    Err(Status::unauthenticated("the bearer token is not valid"))
                }
            };
        }
        for id in identities() {
            if let Some(p) = table.by_subject.get(&id) {
                return Ok(Caller {
                    name: p.name.as_str().into(),
                    principal: Some(p.clone()),
                    credential: Some((self.clone(), Credential::Subject(id))),
                });
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
            Some(p) if self.enabled() => Ok(Caller {
                name: p.name.as_str().into(),
                principal: Some(p.clone()),
                credential: Some((self.clone(), Credential::Token(*hash))),
            }),
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

/// The identities of a client certificate that an auth file's `subjects` may name, each with
/// its kind, so that one kind can never pose as another (a SAN URI whose text is `CN=admin` is
/// `uri:CN=admin`, not the common name `cn:admin`): each SAN URI (`uri:`), each SAN DNS name
/// (`dns:`), then the subject's common name (`cn:`).
pub fn cert_identities(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else { return Vec::new() };
    let mut out = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::URI(u) = n {
                out.push(format!("uri:{u}"));
            }
        }
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                out.push(format!("dns:{d}"));
            }
        }
    }
    for cn in cert.subject().iter_common_name() {
        if let Ok(s) = cn.as_str() {
            out.push(format!("cn:{s}"));
        }
    }
    out
}

/// An auth file's subject as the key [`cert_identities`] gives: `CN=name` or `cn:name` is a
/// common name, `dns:name` a SAN DNS name, `uri:…` or a bare URI (a scheme, then `:`) a SAN URI.
/// `None` when it is none of them.
fn subject_key(s: &str) -> Option<String> {
    let non_empty = |v: &str| (!v.is_empty()).then(|| v.to_owned());
    if let Some(cn) = s.strip_prefix("CN=").or_else(|| s.strip_prefix("cn:")) {
        return non_empty(cn).map(|v| format!("cn:{v}"));
    }
    if let Some(d) = s.strip_prefix("dns:") {
        return non_empty(d).map(|v| format!("dns:{v}"));
    }
    if let Some(u) = s.strip_prefix("uri:") {
        return non_empty(u).map(|v| format!("uri:{v}"));
    }
    let (scheme, rest) = s.split_once(':')?;
    let valid = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    (valid && !rest.is_empty()).then(|| format!("uri:{s}"))
}

/// An identity as logs and audit lines show it: `CN=name`, the URI itself, `DNS:name`.
fn shown_identity(key: &str) -> String {
    if let Some(cn) = key.strip_prefix("cn:") {
        format!("CN={cn}")
    } else if let Some(d) = key.strip_prefix("dns:") {
        format!("DNS:{d}")
    } else {
        key.strip_prefix("uri:").unwrap_or(key).to_owned()
    }
}

/// How the layer treats a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// gRPC health checking: open to load balancers.
    Open,
    /// Reflection: any valid credential.
    AnyCredential,
    /// A permission without a resource, checked by the layer.
    Checked(Need<'static>),
    /// Checked by the service against the request's content (topic, consumer); the layer
    /// refuses at once a caller that holds no permission of the kind.
    ByService(Kind),
}

/// Every method of `outbox.v1.Outbox` and `outbox.v1.OutboxAdmin`, with what it needs. A
/// method missing here needs `*`.
pub fn route(path: &str) -> Route {
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return Route::Checked(Need::Everything);
    };
    match (service, method) {
        ("grpc.health.v1.Health", _) => Route::Open,
        ("grpc.reflection.v1.ServerReflection" | "grpc.reflection.v1alpha.ServerReflection", _) => Route::AnyCredential,
        ("outbox.v1.Outbox", "Enqueue" | "EnqueueBatch") => Route::ByService(Kind::Produce),
        ("outbox.v1.Outbox", "Subscribe") => Route::ByService(Kind::Consume),
        ("outbox.v1.OutboxAdmin", "Tail") => Route::ByService(Kind::Tail),
        ("outbox.v1.OutboxAdmin", "Replay" | "ReplayStream" | "ReleaseKey") => Route::ByService(Kind::Replay),
        (
            "outbox.v1.OutboxAdmin",
            "GetStats" | "GetConsumer" | "ListConsumers" | "ListDeadLetters" | "GetMessage" | "ListHeldKeys",
        ) => Route::Checked(Need::AdminRead),
        (
            "outbox.v1.OutboxAdmin",
            "CreateConsumer" | "DeleteConsumer" | "PauseConsumer" | "ResumeConsumer" | "Prune",
        ) => Route::Checked(Need::AdminWrite),
        _ => Route::Checked(Need::Everything),
    }
}

/// Authenticates every request before it reaches a service (see the module's doc).
#[derive(Debug, Clone)]
pub struct AuthLayer {
    pub auth: Authenticator,
}

impl<S> tower_layer::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService { inner, auth: self.auth.clone() }
    }
}

#[derive(Debug, Clone)]
pub struct AuthService<S> {
    inner: S,
    auth: Authenticator,
}

type BoxFuture<T, E> = Pin<Box<dyn std::future::Future<Output = Result<T, E>> + Send>>;

impl<S> tower_service::Service<HttpRequest<Body>> for AuthService<S>
where
    S: tower_service::Service<HttpRequest<Body>, Response = HttpResponse<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = HttpResponse<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: HttpRequest<Body>) -> Self::Future {
        // The clone that was not polled ready takes the place of the one that was.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let route = route(req.uri().path());
        if route == Route::Open {
            return answer(inner.call(req));
        }
        let caller = match self.auth.authenticate(req.headers(), req.extensions()) {
            Ok(c) => c,
            Err(status) => return refuse(&req, route, None, status),
        };
        match route {
            Route::AnyCredential if caller.principal.is_some() => count(&caller.name, "allowed"),
            Route::Checked(need) => {
                if let Err(status) = caller.check(need) {
                    return refuse(&req, route, Some(&caller), status);
                }
            }
            // Refused from the headers: the body of a caller that may not call this method at
            // all is never read, and it takes no slot of any limit.
            Route::ByService(kind) => {
                if let Err(status) = caller.check_kind(kind) {
                    return refuse(&req, route, Some(&caller), status);
                }
            }
            _ => {}
        }
        if caller.principal.is_some() {
            req.extensions_mut().insert(crate::limits::QuotaKey(caller.name.clone()));
        }
        req.extensions_mut().insert(caller);
        answer(inner.call(req))
    }
}

/// The service's answer, with a request that does not decode (malformed protobuf) answered
/// `INVALID_ARGUMENT`, as gRPC's status codes ask for a client's bad request: tonic's decoder
/// says `INTERNAL`, which tells a client the server is broken.
fn answer<F, E>(call: F) -> BoxFuture<HttpResponse<Body>, E>
where
    F: std::future::Future<Output = Result<HttpResponse<Body>, E>> + Send + 'static,
{
    Box::pin(async move {
        let mut response = call.await?;
        let headers = response.headers_mut();
        let undecodable = headers.get("grpc-status").is_some_and(|s| s.as_bytes() == b"13")
            && headers.get("grpc-message").is_some_and(|m| {
                percent_encoding::percent_decode(m.as_bytes())
                    .decode_utf8_lossy()
                    .starts_with("failed to decode Protobuf")
            });
        if undecodable {
            headers.insert("grpc-status", http::HeaderValue::from_static("3"));
        }
        Ok(response)
    })
}

/// The refusal as a response; admin writes refused before their request was read are
/// audited with their method.
fn refuse<E: Send + 'static>(
    req: &HttpRequest<Body>,
    route: Route,
    caller: Option<&Caller>,
    status: Status,
) -> BoxFuture<HttpResponse<Body>, E> {
    if route == Route::Checked(Need::AdminWrite) {
        let peer = crate::limits::peer_addr(req.extensions());
        let principal = caller.map_or("unknown", |c| &c.name);
        let action = req.uri().path();
        tracing::warn!(
            target: "outboxd::audit", principal, ?peer, action, outcome = ?status.code(), error = status.message(),
            "admin write refused"
        );
    }
    Box::pin(std::future::ready(Ok(status.into_http())))
}

/// Why a consumer created by principal `owner` may not be read now: its creator is gone from
/// `table`, or no longer holds `tail:` on one of its topics. `None` when it may, or when no
/// creator is recorded (created without an auth file, or before creators were recorded).
fn creator_refusal(table: &AuthTable, owner: Option<&str>, spec: &crate::domain::ConsumerSpec) -> Option<String> {
    let owner = owner?;
    let name = spec.name.as_str();
    let Some(p) = table.by_token.values().chain(table.by_subject.values()).find(|p| p.name == owner) else {
        return Some(format!(
            "consumer {name:?} reads on its creator's authority, and its creator, principal {owner:?}, is no longer \
             in the auth file: delete and create it again to read its topics on another principal's"
        ));
    };
    let missing = spec.topics.iter().map(Need::Tail).find(|need| !p.allows(need))?;
    Some(format!(
        "consumer {name:?} reads on its creator's authority, and its creator, principal {owner:?}, no longer holds \
         {missing}: its streams wait until it does (or delete and create it again)"
    ))
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
        self.inner.generation.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pat(s: &str) -> TopicPattern {
        TopicPattern::parse("t", s).unwrap()
    }

    #[test]
    fn globs_match_runs_of_characters() {
        let g = |p: &str, s: &str| NameGlob(p.into()).matches(s);
        assert!(g("inventory-*", "inventory-eu"));
        assert!(g("inventory-*", "inventory-"));
        assert!(!g("inventory-*", "inventory"));
        assert!(g("*", "anything"));
        assert!(g("a*b*c", "aXXbYYc"));
        assert!(!g("a*b*c", "aXXbYY"));
        assert!(g("billing", "billing"));
        assert!(!g("billing", "billing2"));
        assert!(g("*-eu", "x-eu"));
    }

    #[test]
    fn a_tail_permission_covers_only_patterns_whose_topics_it_matches() {
        let c = |mine: &str, theirs: &str| pat(mine).covers(&pat(theirs));
        assert!(c(">", ">"));
        assert!(c(">", "orders.*"));
        assert!(c("orders.>", "orders.>"));
        assert!(c("orders.>", "orders.eu.*"));
        assert!(c("orders.>", "orders.created"));
        assert!(!c("orders.>", "orders"));
        assert!(!c("orders.>", ">"));
        assert!(c("orders.*", "orders.created"));
        assert!(c("orders.*", "orders.*"));
        assert!(!c("orders.*", "orders.>"));
        assert!(!c("orders.*", "orders.a.b"));
        assert!(!c("orders.created", "orders.*"));
        assert!(c("*.created", "orders.created"));
        assert!(!c("*", "*.x"));
    }

    #[test]
    fn permissions_parse_and_reject_what_they_do_not_know() {
        assert_eq!(Permission::parse("*"), Ok(Permission::All));
        assert_eq!(Permission::parse("admin:read"), Ok(Permission::AdminRead));
        assert_eq!(Permission::parse("produce:orders.>"), Ok(Permission::Produce(pat("orders.>"))));
        assert!(Permission::parse("admin").is_err());
        assert!(Permission::parse("admin:*").is_err());
        assert!(Permission::parse("produce:orders.>.x").is_err());
        assert!(Permission::parse("consume:").is_err());
        assert!(Permission::parse("consume:a b").is_err());
        assert!(Permission::parse("delete:x").is_err());
    }

    const FILE: &str = r#"
[[principal]]
name = "orders-service"
tokens = ["sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"]
permissions = ["produce:orders.>", "consume:billing", "admin:read"]

[[principal]]
name = "inventory"
subjects = ["CN=inventory", "spiffe://example.org/inventory"]
permissions = ["consume:inventory-*"]
"#;

    #[test]
    fn the_issue_example_parses_and_its_token_is_the_hash_of_test() {
        let t = AuthTable::parse(FILE).unwrap();
        assert_eq!(t.principals, 2);
        assert_eq!(token_hash_line("test"), "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
        let hash: [u8; 32] = Sha256::digest(b"test").into();
        let p = &t.by_token[&hash];
        assert_eq!(p.name, "orders-service");
        assert!(p.allows(&Need::Produce("orders.eu.created")));
        assert!(!p.allows(&Need::Produce("payments.created")));
        assert!(p.allows(&Need::AdminRead));
        assert!(!p.allows(&Need::AdminWrite));
        assert!(p.allows(&Need::Consume("billing")));
        assert!(!p.allows(&Need::Consume("billing-2")));
        let inv = &t.by_subject["uri:spiffe://example.org/inventory"];
        assert!(inv.allows(&Need::Consume("inventory-eu")));
        assert!(!inv.allows(&Need::Replay("inventory-eu")));
    }

    #[test]
    fn identities_have_kinds_so_that_one_kind_cannot_pose_as_another() {
        assert_eq!(subject_key("CN=admincn").as_deref(), Some("cn:admincn"));
        assert_eq!(subject_key("cn:admincn").as_deref(), Some("cn:admincn"));
        assert_eq!(subject_key("spiffe://example.org/a").as_deref(), Some("uri:spiffe://example.org/a"));
        assert_eq!(subject_key("uri:urn:x").as_deref(), Some("uri:urn:x"));
        assert_eq!(subject_key("dns:billing.svc").as_deref(), Some("dns:billing.svc"));
        for bad in ["CN=", "admincn", "=x:y", ":x", "dns:", "1a:b"] {
            assert_eq!(subject_key(bad), None, "{bad}");
        }
        // A certificate whose SAN URI reads "CN=admincn" (its CN is someone else).
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "someone");
        params.subject_alt_names = vec![
            rcgen::SanType::URI("CN=admincn".try_into().unwrap()),
            rcgen::SanType::DnsName("a.svc".try_into().unwrap()),
        ];
        let cert = params.self_signed(&key).unwrap();
        let ids = cert_identities(cert.der());
        assert_eq!(ids, ["uri:CN=admincn", "dns:a.svc", "cn:someone"]);
        let table =
            AuthTable::parse("[[principal]]\nname = \"admin\"\nsubjects = [\"CN=admincn\"]\npermissions = [\"*\"]\n")
                .unwrap();
        assert!(ids.iter().all(|id| !table.by_subject.contains_key(id)), "the SAN URI does not pose as the CN");
        assert_eq!(shown_identity("cn:someone"), "CN=someone");
        assert_eq!(shown_identity("uri:spiffe://x/y"), "spiffe://x/y");
    }

    #[test]
    fn bad_files_say_what_is_wrong_without_repeating_tokens() {
        let err = |s: &str| AuthTable::parse(s).unwrap_err();
        assert!(err("[[principal]]\nname = \"a\"\ntokens = [\"sha256:ABC\"]\n").contains("tokens[0]"));
        assert!(err("[[principal]]\nname = \"a\"\ntokens = [\"secret\"]\n").contains("tokens[0]"));
        assert!(!err("[[principal]]\nname = \"a\"\ntokens = [\"secret\"]\n").contains("secret"));
        assert!(
            err("[[principal]]\nname = \"a\"\nsubjects = [\"CN=a\"]\npermissions = [\"root\"]\n")
                .contains("permissions[0]")
        );
        assert!(err("[[principal]]\nname = \"a\"\npermissions = [\"*\"]\n").contains("neither tokens nor subjects"));
        assert!(
            err("[[principal]]\nname = \"a\"\nsubjects = [\"CN=a\"]\npermission = [\"*\"]\n").contains("permission")
        );
        let dup = format!("{FILE}\n[[principal]]\nname = \"x\"\nsubjects = [\"CN=inventory\"]\n");
        assert!(err(&dup).contains("also a subject of \"inventory\""));
        assert!(err("[principal]\nname = 1").len() > 5);
        // A syntax error names the line, never its text (a raw token pasted by mistake).
        let e = err("[[principal]]\nname = \"a\"\ntokens = [\"tok-very-secret\"\npermissions = [\"*\"]\n");
        assert!(!e.contains("very-secret"), "{e}");
        assert!(e.contains("line"), "{e}");
        let e = err("[[principal]]\nname = \"a\"\ntokens = \"tok-very-secret\"\n");
        assert!(!e.contains("very-secret"), "{e}");
    }

    #[test]
    fn a_caller_is_refused_a_method_from_its_kind_alone_when_it_holds_no_permission_of_it() {
        let caller = |perms: &[&str]| Caller {
            name: "p".into(),
            principal: Some(Arc::new(Principal {
                name: "p".into(),
                permissions: perms.iter().map(|s| Permission::parse(s).unwrap()).collect(),
            })),
            credential: None,
        };
        let nobody = caller(&[]);
        for kind in [Kind::Produce, Kind::Consume, Kind::Tail, Kind::Replay] {
            let err = nobody.check_kind(kind).unwrap_err();
            assert_eq!(err.code(), tonic::Code::PermissionDenied);
            assert!(err.message().contains(kind.written()), "{err:?}");
            assert!(caller(&["*"]).check_kind(kind).is_ok());
        }
        let producer = caller(&["produce:orders.>", "admin:read"]);
        assert!(producer.check_kind(Kind::Produce).is_ok(), "any topic of the kind passes the layer");
        assert!(producer.check_kind(Kind::Consume).is_err());
        assert!(caller(&["sink:to-*"]).check_kind(Kind::Tail).is_err(), "sink: is not tail:");
        assert!(Caller::unrestricted("anonymous").check_kind(Kind::Replay).is_ok());
        assert_eq!(route("/outbox.v1.Outbox/Enqueue"), Route::ByService(Kind::Produce));
        assert_eq!(route("/outbox.v1.Outbox/Subscribe"), Route::ByService(Kind::Consume));
        assert_eq!(route("/outbox.v1.OutboxAdmin/Tail"), Route::ByService(Kind::Tail));
        assert_eq!(route("/outbox.v1.OutboxAdmin/ReplayStream"), Route::ByService(Kind::Replay));
        assert_eq!(route("/outbox.v1.OutboxAdmin/ReleaseKey"), Route::ByService(Kind::Replay));
        assert_eq!(route("/outbox.v1.OutboxAdmin/ListHeldKeys"), Route::Checked(Need::AdminRead));
    }

    #[test]
    fn a_sink_permission_names_consumers_and_allows_nothing_else() {
        let p = Permission::parse("sink:to-*").unwrap();
        assert_eq!(p, Permission::Sink(NameGlob("to-*".into())));
        assert!(p.allows(&Need::Sink("to-partner")));
        assert!(!p.allows(&Need::Sink("exfil")));
        assert!(!p.allows(&Need::AdminWrite));
        assert!(!p.allows(&Need::Consume("to-partner")));
        assert_eq!(Need::Sink("x").to_string(), "sink:x");
        assert!(Permission::parse("sink:").is_err());
    }

    #[test]
    fn a_consumer_takes_its_creators_topics_and_is_deleted_by_its_creator_or_a_consumer() {
        use crate::domain::Consumer;
        let caller = |name: &str, perms: &[&str]| Caller {
            name: name.into(),
            principal: Some(Arc::new(Principal {
                name: name.into(),
                permissions: perms.iter().map(|s| Permission::parse(s).unwrap()).collect(),
            })),
            credential: None,
        };
        let spec = |name: &str, topics: &[&str]| crate::store::tests::spec(name, topics, 5);
        let made_by = |name: &str, by: Option<&str>| Consumer {
            spec: spec(name, &["payments.>"]),
            paused: false,
            start_seq: 0,
            created_at: chrono::Utc::now(),
            created_by: by.map(str::to_owned),
        };
        let team = caller("team", &["admin:write", "consume:team-*"]);
        let err = team.check_consumer(ConsumerChange::Create(&spec("team-x", &["payments.>"]))).unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert!(err.message().contains("tail:payments.>"), "{err:?}");
        let orders = caller("orders", &["admin:write", "tail:orders.>"]);
        assert!(orders.check_consumer(ConsumerChange::Create(&spec("o", &["orders.*", "orders.eu.>"]))).is_ok());
        assert!(orders.check_consumer(ConsumerChange::Create(&spec("o", &["orders.*", ">"]))).is_err());

        let billing = made_by("billing", Some("payments"));
        let err = orders.check_consumer(ConsumerChange::Delete(&billing)).unwrap_err();
        assert!(err.message().contains("created by principal \"payments\""), "{err:?}");
        assert!(caller("payments", &["admin:write"]).check_consumer(ConsumerChange::Delete(&billing)).is_ok());
        assert!(caller("root", &["*"]).check_consumer(ConsumerChange::Delete(&billing)).is_ok());
        // consume: (a pattern above all) does not delete another's consumer: it would redirect
        // that application's stream.
        assert!(caller("app", &["consume:bill*"]).check_consumer(ConsumerChange::Delete(&billing)).is_err());
        assert!(caller("app", &["consume:billing"]).check_consumer(ConsumerChange::Delete(&billing)).is_err());
        let unowned = made_by("billing", None);
        assert!(
            caller("app", &["consume:bill*"]).check_consumer(ConsumerChange::Delete(&unowned)).is_err(),
            "a pattern does not delete a consumer without a creator"
        );
        assert!(
            caller("app", &["consume:billing"])
                .check_consumer(ConsumerChange::Delete(&made_by("billing", None)))
                .is_ok()
        );
        assert!(caller("root", &["*"]).check_consumer(ConsumerChange::Delete(&made_by("x", None))).is_ok());
        assert!(orders.check_consumer(ConsumerChange::Delete(&made_by("billing", None))).is_err(), "no creator");
        let anyone = Caller::unrestricted("anonymous");
        assert!(anyone.check_consumer(ConsumerChange::Delete(&billing)).is_ok(), "no auth file");
        assert!(anyone.check_consumer(ConsumerChange::Create(&spec("x", &[">"]))).is_ok());
    }

    #[test]
    fn every_method_of_both_services_has_a_route_and_none_is_open() {
        use prost::Message as _;
        let fds = prost_types::FileDescriptorSet::decode(outbox_proto::FILE_DESCRIPTOR_SET).unwrap();
        let mut n = 0;
        for file in fds.file {
            for svc in &file.service {
                for m in &svc.method {
                    let path = format!("/{}.{}/{}", file.package(), svc.name(), m.name());
                    let r = route(&path);
                    assert!(
                        !matches!(r, Route::Open | Route::AnyCredential | Route::Checked(Need::Everything)),
                        "{path} is routed as {r:?}"
                    );
                    n += 1;
                }
            }
        }
        assert_eq!(n, 18, "methods of outbox.v1");
        assert_eq!(route("/outbox.v1.OutboxAdmin/Unknown"), Route::Checked(Need::Everything));
        assert_eq!(route("/grpc.health.v1.Health/Check"), Route::Open);
    }
}

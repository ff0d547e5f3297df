//! What a principal may do: the permissions an auth file grants ([`Permission`], with its
//! consumer-name patterns, [`NameGlob`]), what one request needs ([`Need`]), and the kinds a
//! method checks from its headers alone ([`Kind`]).
use std::fmt;

use crate::domain::TopicPattern;

/// A consumer-name pattern of a permission: `*` matches any run of characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameGlob(pub(super) String);

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
    pub(super) fn written(self) -> &'static str {
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

    pub(super) fn allows(&self, need: &Need<'_>) -> bool {
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
    pub(super) fn resource(&self) -> String {
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
    pub(super) fn owns_consumer_name(&self, name: &str) -> bool {
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

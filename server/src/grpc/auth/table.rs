//! The auth file: its text parsed into principals by token hash and by certificate identity
//! ([`AuthTable`]), and the table in force that reloads swap ([`InForce`]).
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::{Arc, RwLock};

use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use super::identity::subject_key;
use super::permission::{Permission, Principal};

/// A parsed auth file: principals by token hash and by certificate identity.
#[derive(Debug, Default)]
pub struct AuthTable {
    pub(super) by_token: HashMap<[u8; 32], Arc<Principal>>,
    pub(super) by_subject: HashMap<String, Arc<Principal>>,
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

/// The table in force, swapped whole at each reload, and its generation: shared by the
/// authenticator that swaps it and every caller it authenticated, whose open streams look their
/// principal up again at each swap.
#[derive(Debug)]
pub(super) struct InForce {
    table: RwLock<Arc<AuthTable>>,
    /// Bumped at every table swapped in: open streams look their caller up again.
    generation: tokio::sync::watch::Sender<u64>,
}

impl InForce {
    pub(super) fn new(table: AuthTable) -> Self {
        Self { table: RwLock::new(Arc::new(table)), generation: tokio::sync::watch::Sender::new(0) }
    }

    pub(super) fn table(&self) -> Arc<AuthTable> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `table` in force and tells the open streams.
    pub(super) fn swap(&self, table: AuthTable) {
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(table);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Changes at every swap.
    pub(super) fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }
}

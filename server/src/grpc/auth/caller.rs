//! May they: the [`Caller`] of a request, as the layer authenticated it, and every check of
//! what it may do, of the request's content ([`Caller::check`]), of changes to consumers
//! ([`Caller::check_consumer`]), and again while its stream is open ([`Caller::revoked`]).
use std::fmt;
use std::sync::Arc;

use tonic::Status;

use super::permission::{Kind, Need, Principal};
use super::table::{AuthTable, InForce};
use crate::metrics::DECISIONS;

/// A request's caller, put in the request's extensions by [`AuthLayer`].
#[derive(Clone)]
pub struct Caller {
    /// The principal's name; without an auth file, the client certificate's identity or
    /// `anonymous`.
    pub name: Arc<str>,
    /// `None`: no auth file, everything is allowed.
    pub(super) principal: Option<Arc<Principal>>,
    /// How it was authenticated, to find it again in a reloaded auth file (the one in force
    /// when it was).
    pub(super) credential: Option<(Arc<InForce>, Credential)>,
}

/// Who, and as which principal: never the credential, nor the auth file it was checked against.
impl fmt::Debug for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Caller").field("name", &self.name).field("principal", &self.principal).finish()
    }
}

/// What authenticated a caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Credential {
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

    /// The principal `p` of the table `in_force`, authenticated by `credential`.
    pub(super) fn authenticated(p: &Arc<Principal>, in_force: Arc<InForce>, credential: Credential) -> Self {
        Self { name: p.name.as_str().into(), principal: Some(p.clone()), credential: Some((in_force, credential)) }
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
        let Some((in_force, _)) = &self.credential else { return Ok(()) };
        match creator_refusal(&in_force.table(), consumer.created_by.as_deref(), &consumer.spec) {
            Some(why) => Err(Status::permission_denied(why)),
            None => Ok(()),
        }
    }

    async fn revoked_unless(&self, refusal: impl Fn(&Principal, &AuthTable) -> Option<Status>) -> Status {
        let Some((in_force, credential)) = &self.credential else { return std::future::pending().await };
        let mut reloads = in_force.changes();
        loop {
            if reloads.changed().await.is_err() {
                return std::future::pending().await;
            }
            let table = in_force.table();
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

pub(super) fn count(principal: &str, outcome: &'static str) {
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

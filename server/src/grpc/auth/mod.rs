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
mod authenticator;
mod caller;
mod identity;
mod layer;
mod permission;
mod table;
#[cfg(test)]
mod tests;

pub use authenticator::{AuthFileError, Authenticator};
pub use caller::{Caller, ConsumerChange, authorize, caller};
pub use identity::cert_identities;
pub use layer::{AuthLayer, AuthService, Route, route};
pub use permission::{Kind, NameGlob, Need, Permission, Principal};
pub use table::{AuthTable, token_hash_line};

//! Who is looking at a page ([`Viewer`]): the principal a request was signed in as, what it may
//! do, the CSRF check of its changes, and its calls into the admin service as that principal,
//! with the permission the RPC's route needs checked first, as the gRPC edge checks it; and why
//! a page cannot be shown to a request ([`Refusal`]).
use axum::http::HeaderMap;
use subtle::ConstantTimeEq as _;
use tonic::Status;

use super::nav::referring_page;
use crate::grpc::auth::{self, Caller, Need, Route};

/// The signed-in principal of a request, and its session's CSRF token.
#[derive(Debug, Clone)]
pub struct Viewer {
    pub caller: Caller,
    pub csrf: String,
    pub peer: Option<std::net::SocketAddr>,
    /// Signed in with a token (it can sign out); not over mutual TLS or without an auth file.
    pub signed_in: bool,
    /// The SHA-256 of the stored session's id, when signed in with a token.
    pub session: Option<[u8; 32]>,
}

/// Why a page cannot be shown to this request.
#[derive(Debug)]
pub enum Refusal {
    /// Not signed in (or the token no longer works): to the sign-in page, which leads back to
    /// the page asked for, when there is one ([`super::nav::return_path`]).
    SignIn(Option<String>),
    /// Without an auth file, a browser without a session cookie yet: it gets one first, and
    /// comes back to the page asked for (or the overview).
    NewSession(String, bool, Option<String>),
    /// A request that changes something without this session's CSRF token, or from another
    /// site; with the page of this console it was sent from, when the browser says.
    Forged(Option<String>),
    Status(Status),
}

impl From<Status> for Refusal {
    fn from(s: Status) -> Self {
        Refusal::Status(s)
    }
}

impl Viewer {
    /// Refuses a state-changing request that does not carry this session's CSRF token, or
    /// that a browser says comes from another site.
    pub fn check_csrf(&self, headers: &HeaderMap, given: &str) -> Result<(), Refusal> {
        let cross_site = headers
            .get("sec-fetch-site")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| !matches!(v, "same-origin" | "none"));
        // Constant time, whatever the given token is.
        let matches: bool = given.as_bytes().ct_eq(self.csrf.as_bytes()).into();
        if cross_site || !matches {
            tracing::warn!(
                target: "outboxd::audit", principal = &*self.caller.name, peer = ?self.peer, action = "console",
                outcome = "forged", "console request without its CSRF token refused"
            );
            return Err(Refusal::Forged(referring_page(headers)));
        }
        Ok(())
    }

    /// An audit line for a refused request, as the gRPC edge writes one.
    pub fn refused(&self, action: &str, s: &Status) {
        tracing::warn!(
            target: "outboxd::audit", principal = &*self.caller.name, peer = ?self.peer, action,
            outcome = ?s.code(), error = s.message(), "console request refused"
        );
    }

    /// Whether the principal may do what `need` names (to show or hide an action).
    pub fn may(&self, need: Need<'_>) -> bool {
        self.caller.allows(need)
    }

    /// A request to the admin service as this viewer, after the check the gRPC edge makes for
    /// `method` (`/outbox.v1.OutboxAdmin/…`).
    pub fn request<T>(&self, method: &str, message: T) -> Result<tonic::Request<T>, Status> {
        let checked = match auth::route(method) {
            Route::Checked(need) => self.caller.check(need),
            Route::ByService(kind) => self.caller.check_kind(kind),
            Route::Open | Route::AnyCredential => Ok(()),
        };
        if let Err(s) = checked {
            self.refused(method, &s);
            return Err(s);
        }
        let mut r = tonic::Request::new(message);
        r.extensions_mut().insert(self.caller.clone());
        r.extensions_mut()
            .insert(tonic::transport::server::TcpConnectInfo { local_addr: None, remote_addr: self.peer });
        Ok(r)
    }
}

//! Who is looking: sign-in with a token kept in an `HttpOnly`, `SameSite=Strict` cookie
//! (`Secure` over TLS), or a client certificate over mutual TLS; the CSRF token every
//! state-changing request must carry; and calls into the admin service as that principal, with
//! the permission the RPC's route needs checked first, as the gRPC edge checks it.
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use base64::Engine as _;
use cookie::{Cookie, SameSite};
use hmac::{Hmac, Mac};
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;
use tonic::Status;

use super::{Peer, PeerCert, State};
use crate::grpc::auth::{self, Caller, Need, Route};

/// The cookie that holds the signed-in principal's token (or, without an auth file, a random
/// session id that the CSRF token is bound to). Over TLS it is `__Host-` prefixed: the browser
/// then keeps it to this host, `Secure`, on every path, set by no other.
pub const SESSION_COOKIE: &str = "outboxd_console";
const SECURE_SESSION_COOKIE: &str = "__Host-outboxd_console";
/// How long a sign-in lasts in the browser.
const SESSION_HOURS: i64 = 12;
/// The longest token the sign-in form takes.
const MAX_TOKEN_BYTES: usize = 4096;

/// The signed-in principal of a request, and its session's CSRF token.
#[derive(Debug, Clone)]
pub struct Viewer {
    pub caller: Caller,
    pub csrf: String,
    pub peer: Option<std::net::SocketAddr>,
    /// Signed in with a token (it can sign out); not over mutual TLS or without an auth file.
    pub signed_in: bool,
}

/// Why a page cannot be shown to this request.
#[derive(Debug)]
pub enum Refusal {
    /// Not signed in (or the token no longer works): to the sign-in page.
    SignIn,
    /// Without an auth file, a browser without a session cookie yet: it gets one first.
    NewSession(String),
    /// A request that changes something without this session's CSRF token, or from another
    /// site.
    Forged,
    Status(Status),
}

impl From<Status> for Refusal {
    fn from(s: Status) -> Self {
        Refusal::Status(s)
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::SignIn => Redirect::to("/login").into_response(),
            Refusal::NewSession(id) => {
                let mut r = Redirect::to("/").into_response();
                if let Ok(v) = header::HeaderValue::from_str(&session_cookie(&id, false, None).to_string()) {
                    r.headers_mut().append(header::SET_COOKIE, v);
                }
                r
            }
            Refusal::Forged => (
                StatusCode::FORBIDDEN,
                "refused: this request changes something and does not carry this session's CSRF token (reload the page)",
            )
                .into_response(),
            Refusal::Status(s) => super::views::status_page(&s).into_response(),
        }
    }
}

/// The session cookie: `HttpOnly`, `SameSite=Strict`, on every path; `Secure` over TLS;
/// `max_age` zero removes it.
pub fn session_cookie(value: &str, secure: bool, max_age: Option<cookie::time::Duration>) -> Cookie<'static> {
    let name = if secure { SECURE_SESSION_COOKIE } else { SESSION_COOKIE };
    Cookie::build((name, value.to_owned()))
        .http_only(true)
        .same_site(SameSite::Strict)
        .path("/")
        .secure(secure)
        .max_age(max_age.unwrap_or(cookie::time::Duration::hours(SESSION_HOURS)))
        .build()
}

fn cookie_value(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == SESSION_COOKIE || c.name() == SECURE_SESSION_COOKIE)
        .map(|c| c.value().to_owned())
        .filter(|v| !v.is_empty())
}

/// A new random session id (without an auth file).
pub fn new_session_id() -> Result<String, Status> {
    let mut b = [0u8; 24];
    getrandom::fill(&mut b).map_err(|e| Status::internal(format!("no randomness: {e}")))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b))
}

/// Whether `token` can be a cookie value as it is (RFC 6265 cookie-octets).
pub fn cookie_safe(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= MAX_TOKEN_BYTES
        && token.bytes().all(|b| {
            b == 0x21
                || (0x23..=0x2b).contains(&b)
                || (0x2d..=0x3a).contains(&b)
                || (0x3c..=0x5b).contains(&b)
                || (0x5d..=0x7e).contains(&b)
        })
}

impl State {
    /// The CSRF token of a session: HMAC-SHA256 of what identifies the session, under this
    /// process's key.
    pub fn csrf_for(&self, session: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.csrf_mac(session).finalize().into_bytes())
    }

    fn csrf_mac(&self, session: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.csrf_key).unwrap_or_else(|_| unreachable!());
        mac.update(b"outboxd console csrf\0");
        mac.update(session);
        mac
    }

    /// The viewer of a request from its parts.
    fn viewer(&self, parts: &Parts) -> Result<Viewer, Refusal> {
        let peer = parts.extensions.get::<Peer>().and_then(|p| p.0);
        let cert = parts.extensions.get::<PeerCert>().map(|c| c.0.clone());
        let cookie = cookie_value(&parts.headers);
        if !self.auth.enabled() {
            let caller = self.auth.authenticate_credential(None, cert.as_deref())?;
            let Some(id) = cookie else { return Err(Refusal::NewSession(new_session_id()?)) };
            return Ok(Viewer { caller, csrf: self.csrf_for(id.as_bytes()), peer, signed_in: false });
        }
        match (cookie, cert) {
            (Some(token), _) => match self.auth.authenticate_credential(Some(&token), None) {
                Ok(caller) => Ok(Viewer { caller, csrf: self.csrf_for(token.as_bytes()), peer, signed_in: true }),
                Err(_) => Err(Refusal::SignIn),
            },
            (None, Some(cert)) => match self.auth.authenticate_credential(None, Some(&cert)) {
                Ok(caller) => {
                    let session: [u8; 32] = Sha256::digest(&cert).into();
                    Ok(Viewer { caller, csrf: self.csrf_for(&session), peer, signed_in: false })
                }
                Err(_) => Err(Refusal::SignIn),
            },
            (None, None) => Err(Refusal::SignIn),
        }
    }
}

impl FromRequestParts<Arc<State>> for Viewer {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<State>) -> Result<Self, Refusal> {
        state.viewer(parts)
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
            return Err(Refusal::Forged);
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

//! Who is looking: sign-in with a token, which starts a session kept in the database and named
//! by a random id in an `HttpOnly`, `SameSite=Strict` cookie (`Secure` over TLS), or a client
//! certificate over mutual TLS; the CSRF token every state-changing request must carry; and the
//! [`Viewer`] of each request, and what a [`Refusal`] answers.
//!
//! The cookie is never a credential (ADR 0073): browsers send a host's cookies to every port of
//! it, so whatever the cookie holds, any other service on the host may read. A session id is
//! worth something only to this console, and only until it ends: signed out (its row is
//! deleted), idle for `--console-session-idle`, older than `--console-session-max`, or its
//! token or principal gone from the auth file in force (looked up again at every request).
use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use base64::Engine as _;
use cookie::{Cookie, SameSite};
use hmac::{Hmac, Mac};
use sha2::{Digest as _, Sha256};
use tonic::Status;

use super::viewer::{Refusal, Viewer};
use super::{Peer, PeerCert, State};
use crate::grpc::auth::Caller;
use crate::grpc::store_status;
use crate::store::ConsoleSession;

/// The cookie that holds the session's random id (with an auth file, the id of a session row;
/// without one, an id the CSRF token is bound to). Over TLS it is `__Host-` prefixed: the
/// browser then keeps it to this host, `Secure`, on every path, set by no other.
pub const SESSION_COOKIE: &str = "outboxd_console";
const SECURE_SESSION_COOKIE: &str = "__Host-outboxd_console";
/// The longest token the sign-in form takes.
const MAX_TOKEN_BYTES: usize = 4096;
/// Random bytes of a session id: 256 bits, base64url in the cookie (43 characters).
const SESSION_ID_BYTES: usize = 32;
/// Sessions one principal keeps at most: signing in again ends its oldest, so that a loop of
/// sign-ins cannot grow the table without bound.
const MAX_SESSIONS_PER_PRINCIPAL: i64 = 16;
/// A session's last request is written at most this often (and at most every half of
/// `--console-session-idle`): a page's polling does not write at every request.
const TOUCH_EVERY: Duration = Duration::from_secs(60);

/// How long a signed-in session lasts: `--console-session-idle` without a request,
/// `--console-session-max` in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionTimes {
    pub idle: Duration,
    pub max: Duration,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::SignIn(next) => Redirect::to(&super::nav::sign_in_location(next.as_deref())).into_response(),
            Refusal::NewSession(id, secure, next) => {
                let mut r = Redirect::to(next.as_deref().unwrap_or("/")).into_response();
                let age = Some(cookie::time::Duration::hours(12));
                if let Ok(v) = header::HeaderValue::from_str(&session_cookie(&id, secure, age).to_string()) {
                    r.headers_mut().append(header::SET_COOKIE, v);
                }
                r
            }
            Refusal::Forged(back) => {
                (StatusCode::FORBIDDEN, super::views::refused_change(back.as_deref())).into_response()
            }
            Refusal::Status(s) => super::views::status_page(&s).into_response(),
        }
    }
}

/// The session cookie: `HttpOnly`, `SameSite=Strict`, on every path; `Secure` over TLS;
/// `max_age` zero removes it.
pub fn session_cookie(value: &str, secure: bool, max_age: Option<cookie::time::Duration>) -> Cookie<'static> {
    let name = if secure { SECURE_SESSION_COOKIE } else { SESSION_COOKIE };
    let mut c =
        Cookie::build((name, value.to_owned())).http_only(true).same_site(SameSite::Strict).path("/").secure(secure);
    // Without one, a browser session's cookie: the stored session's own expiry decides.
    if let Some(age) = max_age {
        c = c.max_age(age);
    }
    c.build()
}

/// The session id of a request: the one cookie of this console's name (`__Host-` over TLS,
/// which only this host's HTTPS origin can set). Another service of the host, or of a parent
/// domain, can set the plain name (cookies are not bound to a port), so over TLS that name is
/// ignored; and a request that carries the name twice is refused rather than served under
/// whichever came first (a tossed cookie would choose the session: fixation, or a lock-out).
fn cookie_value(headers: &HeaderMap, secure: bool) -> Option<String> {
    let name = if secure { SECURE_SESSION_COOKIE } else { SESSION_COOKIE };
    let mut found = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(Cookie::split_parse)
        .filter_map(Result::ok)
        .filter(|c| c.name() == name)
        .map(|c| c.value().to_owned());
    let one = found.next()?;
    if found.next().is_some() || one.is_empty() {
        return None;
    }
    Some(one)
}

/// A new random session id.
pub fn new_session_id() -> Result<String, Status> {
    let mut b = [0u8; SESSION_ID_BYTES];
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

/// Whether `id` can be a session id this console made (base64url of [`SESSION_ID_BYTES`]): any
/// other cookie is refused without a look in the database.
fn well_formed_id(id: &str) -> bool {
    id.len() == (SESSION_ID_BYTES * 4).div_ceil(3)
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The id of the stored session a request names, when an auth file is in force (without one,
/// or over mutual TLS without a cookie, no session is stored).
pub(super) fn session_id(headers: &HeaderMap, state: &State) -> Option<String> {
    if !state.auth.enabled() {
        return None;
    }
    cookie_value(headers, state.secure).filter(|id| well_formed_id(id))
}

/// Sessions this process found valid in the last [`RECENT_FOR`], by the hash of their id: a
/// request that names one takes a signed-in place of the console without a database read
/// first. Bounded: past [`RECENT_MAX`] entries the old ones go, then all.
#[derive(Debug, Default)]
pub struct RecentSessions(std::sync::Mutex<std::collections::HashMap<[u8; 32], Recent>>);

/// When a session was last found valid, and its principal.
type Recent = (std::time::Instant, Arc<str>);

const RECENT_FOR: std::time::Duration = std::time::Duration::from_secs(600);
const RECENT_MAX: usize = 4096;

impl RecentSessions {
    fn seen(&self, hash: [u8; 32], principal: &Arc<str>) {
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= RECENT_MAX && !map.contains_key(&hash) {
            map.retain(|_, (at, _)| at.elapsed() < RECENT_FOR);
            if map.len() >= RECENT_MAX {
                map.clear();
            }
        }
        map.insert(hash, (std::time::Instant::now(), principal.clone()));
    }

    fn forget(&self, hash: &[u8; 32]) {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(hash);
    }

    /// The principal of the session `id`, if this process found it valid lately.
    pub fn holds(&self, id: &str) -> Option<Arc<str>> {
        let map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(&id_hash(id)).filter(|(at, _)| at.elapsed() < RECENT_FOR).map(|(_, p)| p.clone())
    }
}

/// How a session is found in the database: the SHA-256 of its id, so that a copy of the table
/// opens no session.
fn id_hash(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

/// The CSRF token of a stored session: derived from its secret id alone, so that every replica
/// computes the same one.
fn stored_csrf(id: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"outboxd console csrf\0");
    h.update(id.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(h.finalize())
}

fn chrono_of(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

impl State {
    /// Starts a session for `caller`, signed in with a token: its row, then the cookie's value
    /// (the random id). Ended sessions, and the principal's oldest beyond
    /// [`MAX_SESSIONS_PER_PRINCIPAL`], are deleted on the way.
    pub async fn start_session(&self, caller: &Caller) -> Result<String, Status> {
        let (Some(principal), Some(token_hash)) = (caller.principal_name(), caller.token_hash()) else {
            return Err(Status::internal("a console session is started only for a principal signed in with a token"));
        };
        let store = &self.admin.ctx.store;
        let now = self.admin.ctx.clock.now();
        let idle_since = now.checked_sub_signed(chrono_of(self.sessions.idle)).unwrap_or(now);
        store.console_session_delete_expired(now, idle_since).await.map_err(store_status)?;
        let id = new_session_id()?;
        let session = ConsoleSession {
            id_hash: id_hash(&id),
            principal: principal.to_owned(),
            token_hash,
            created_at: now,
            seen_at: now,
            expires_at: now.checked_add_signed(chrono_of(self.sessions.max)).unwrap_or(now),
        };
        store.console_session_insert(&session).await.map_err(store_status)?;
        store.console_session_delete_oldest(principal, MAX_SESSIONS_PER_PRINCIPAL).await.map_err(store_status)?;
        self.recent.seen(id_hash(&id), &caller.name);
        Ok(id)
    }

    /// Ends the session of this id hash (sign-out).
    pub async fn end_session(&self, id_hash: &[u8; 32]) -> Result<(), Status> {
        self.recent.forget(id_hash);
        self.admin.ctx.store.console_session_delete(id_hash).await.map_err(store_status).map(drop)
    }

    /// The caller of a stored session, if it is still one: not expired, and its token still
    /// naming the same principal in the auth file in force. A session found ended is deleted.
    async fn session_caller(&self, id: &str) -> Result<Option<Caller>, Status> {
        if !well_formed_id(id) {
            return Ok(None);
        }
        let hash = id_hash(id);
        let store = &self.admin.ctx.store;
        let Some(s) = store.console_session_find(&hash).await.map_err(store_status)? else {
            // Ended elsewhere (a sign-out on another replica, pushed out by newer sessions).
            self.recent.forget(&hash);
            return Ok(None);
        };
        let now = self.admin.ctx.clock.now();
        let idle = chrono_of(self.sessions.idle);
        let caller = match self.auth.authenticate_token_hash(&s.token_hash) {
            Ok(c) if *c.name == *s.principal => Some(c),
            _ => None,
        };
        let ended = s.expires_at <= now || s.seen_at.checked_add_signed(idle).is_none_or(|t| t <= now);
        match caller {
            Some(c) if !ended => {
                let touch = chrono_of(TOUCH_EVERY.min(self.sessions.idle / 2));
                if now - s.seen_at >= touch {
                    store.console_session_touch(&hash, now).await.map_err(store_status)?;
                }
                self.recent.seen(hash, &c.name);
                Ok(Some(c))
            }
            _ => {
                self.recent.forget(&hash);
                store.console_session_delete(&hash).await.map_err(store_status)?;
                Ok(None)
            }
        }
    }

    /// The CSRF token of a session that is not stored: HMAC-SHA256 of what identifies the
    /// session, under this process's key.
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
    async fn viewer(&self, parts: &Parts) -> Result<Viewer, Refusal> {
        let peer = parts.extensions.get::<Peer>().and_then(|p| p.0);
        let cert = parts.extensions.get::<PeerCert>().map(|c| c.0.clone());
        let cookie = cookie_value(&parts.headers, self.secure);
        // Where a browser sent to sign in (or to get its first cookie) comes back to.
        let back = || super::nav::return_path(parts);
        if !self.auth.enabled() {
            let caller = self.auth.authenticate_credential(None, cert.as_deref())?;
            let Some(id) = cookie else { return Err(Refusal::NewSession(new_session_id()?, self.secure, back())) };
            return Ok(Viewer { caller, csrf: self.csrf_for(id.as_bytes()), peer, signed_in: false, session: None });
        }
        match (cookie, cert) {
            (Some(id), _) => match self.session_caller(&id).await? {
                Some(caller) => {
                    Ok(Viewer { caller, csrf: stored_csrf(&id), peer, signed_in: true, session: Some(id_hash(&id)) })
                }
                None => Err(Refusal::SignIn(back())),
            },
            (None, Some(cert)) => match self.auth.authenticate_credential(None, Some(&cert)) {
                Ok(caller) => {
                    let session: [u8; 32] = Sha256::digest(&cert).into();
                    Ok(Viewer { caller, csrf: self.csrf_for(&session), peer, signed_in: false, session: None })
                }
                Err(_) => Err(Refusal::SignIn(back())),
            },
            (None, None) => Err(Refusal::SignIn(back())),
        }
    }
}

impl FromRequestParts<Arc<State>> for Viewer {
    type Rejection = Refusal;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<State>) -> Result<Self, Refusal> {
        state.viewer(parts).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(cookies: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for c in cookies {
            h.append(header::COOKIE, header::HeaderValue::from_str(c).unwrap_or_else(|_| unreachable!()));
        }
        h
    }

    /// Cookies are not bound to a port: another service of the host can set the plain name. Over
    /// TLS only the `__Host-` name counts, and a name sent twice chooses no session.
    #[test]
    fn a_tossed_or_second_session_cookie_chooses_no_session() {
        let plain = "outboxd_console=a";
        let host = "__Host-outboxd_console=b";
        assert_eq!(cookie_value(&headers(&[plain]), false).as_deref(), Some("a"));
        assert_eq!(cookie_value(&headers(&[host]), true).as_deref(), Some("b"));
        assert_eq!(
            cookie_value(&headers(&[&format!("{plain}; {host}")]), true).as_deref(),
            Some("b"),
            "over TLS the plain name is ignored"
        );
        assert_eq!(cookie_value(&headers(&[plain]), true), None);
        assert_eq!(cookie_value(&headers(&["outboxd_console=a; outboxd_console=c"]), false), None);
        assert_eq!(cookie_value(&headers(&[host, "__Host-outboxd_console=c"]), true), None, "in two headers too");
        assert_eq!(cookie_value(&headers(&["outboxd_console="]), false), None);
    }
}

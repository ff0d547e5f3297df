//! Signing in with a token, and out.
use std::sync::Arc;

use axum::extract::{Form, Query, State as Ctx};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::{CsrfForm, Page, html};
use crate::console::State;
use crate::console::nav::safe_next;
use crate::console::session::{cookie_safe, session_cookie};
use crate::console::viewer::Viewer;
use crate::console::views::{self};
use crate::grpc::auth::Need;

#[derive(Debug, Deserialize)]
pub(super) struct NextQuery {
    #[serde(default)]
    next: String,
}

pub(super) async fn login_page(Ctx(state): Ctx<Arc<State>>, Query(q): Query<NextQuery>) -> Response {
    let next = safe_next(&q.next).unwrap_or("/");
    if !state.auth.enabled() {
        return Redirect::to(next).into_response();
    }
    html(views::login(None, next))
}

#[derive(Debug, Deserialize)]
pub(super) struct LoginForm {
    #[serde(default)]
    token: String,
    /// The page to go to once signed in ([`safe_next`]; the overview otherwise).
    #[serde(default)]
    next: String,
}

/// Checks the token as the gRPC edge would, and keeps it in the session cookie. A sign-in
/// posted from another site is refused (login CSRF).
pub(super) async fn login(
    Ctx(state): Ctx<Arc<State>>,
    headers: HeaderMap,
    peer: Option<axum::Extension<crate::console::Peer>>,
    Form(f): Form<LoginForm>,
) -> Response {
    let next = safe_next(&f.next).unwrap_or("/");
    if !state.auth.enabled() {
        return Redirect::to(next).into_response();
    }
    let peer = peer.and_then(|p| p.0.0);
    let cross_site = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !matches!(v, "same-origin" | "none"));
    let token = f.token.trim();
    // Refusals are logged by the listener, a line per client and minute (`places`).
    let refused = |why: &str| (StatusCode::UNAUTHORIZED, views::login(Some(why), next)).into_response();
    if cross_site {
        return refused("a sign-in from another site is refused");
    }
    if !cookie_safe(token) {
        return refused(
            "not a token this console takes: a token is at most 4096 characters without spaces, quotes, commas, semicolons or backslashes",
        );
    }
    match state.auth.authenticate_credential(Some(token), None) {
        Ok(caller) if !caller.allows(Need::AdminRead) => {
            // Every page needs admin:read: a session would open nothing, and would take a
            // signed-in place of the console with each request (ADR 0079).
            tracing::info!(target: "outboxd::audit", principal = &*caller.name, ?peer, action = "console_sign_in", outcome = "denied", "console sign-in refused: no admin:read");
            (
                StatusCode::FORBIDDEN,
                views::login(
                    Some(&format!(
                        "principal {:?} lacks admin:read, which every page of this console needs: it is not signed in",
                        &*caller.name
                    )),
                    next,
                ),
            )
                .into_response()
        }
        Ok(caller) => {
            // The cookie gets a random session id, never the token (ADR 0073).
            let id = match state.start_session(&caller).await {
                Ok(id) => id,
                Err(s) => return views::status_page(&s).into_response(),
            };
            tracing::info!(target: "outboxd::audit", principal = &*caller.name, ?peer, action = "console_sign_in", outcome = "ok", "console sign-in");
            let mut r = Redirect::to(next).into_response();
            let age = cookie::time::Duration::try_from(state.sessions.max).ok();
            if let Ok(v) = HeaderValue::from_str(&session_cookie(&id, state.secure, age).to_string()) {
                r.headers_mut().append(header::SET_COOKIE, v);
            }
            r
        }
        Err(_) => refused("this token is not valid here"),
    }
}

pub(super) async fn logout(
    Ctx(state): Ctx<Arc<State>>,
    viewer: Viewer,
    headers: HeaderMap,
    Form(f): Form<CsrfForm>,
) -> Page {
    viewer.check_csrf(&headers, &f.csrf)?;
    // The session ends here, on every replica: its cookie, wherever a copy went, opens nothing.
    if let Some(session) = &viewer.session {
        state.end_session(session).await?;
    }
    tracing::info!(target: "outboxd::audit", principal = &*viewer.caller.name, peer = ?viewer.peer, action = "console_sign_out", outcome = "ok", "console sign-out");
    let mut r = Redirect::to("/login").into_response();
    let gone = session_cookie("", state.secure, Some(cookie::time::Duration::ZERO));
    if let Ok(v) = HeaderValue::from_str(&gone.to_string()) {
        r.headers_mut().append(header::SET_COOKIE, v);
    }
    Ok(r)
}

//! The console's routes: each page checks what its RPC would need, reads through the admin
//! service or the stats snapshot, and renders ([`super::views`]). Every POST checks the
//! session's CSRF token first, then calls the RPC it stands for (audited there).
//!
//! One file per page or group of pages; the router, the checks every request passes first and
//! the helpers the pages share are here.
use std::sync::Arc;

use axum::Router;
use axum::extract::State as Ctx;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use tonic::Status;

use super::State;
use super::nav::referring_page;
use super::viewer::Refusal;
use super::views;
use crate::domain::ConsumerName;
use crate::store::StoreError;

mod consumer;
mod message;
mod overview;
mod replays;
mod sign_in;

use consumer::{consumer, consumer_fragment, dead_letters, deliveries, pause, release_key, replay, resume};
use message::{message, message_replay, search};
use overview::{overview, overview_fragment};
use replays::{replay_job, replay_job_fragment, replays};
use sign_in::{login, login_page, logout};

type Page = Result<Response, Refusal>;

/// Rows a list page shows at once.
const PAGE_ROWS: i64 = 50;

/// Dead-letter groups a consumer page shows.
const MAX_GROUPS: i64 = 50;

/// Messages one search page reads at most; and pending deliveries one page of retries reads.
const SEARCH_WINDOW: i64 = 10_000;

const ADMIN: &str = "/outbox.v1.OutboxAdmin/";

pub fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/", get(overview))
        .route("/fragments/overview", get(overview_fragment))
        .route("/consumers/{name}", get(consumer))
        .route("/fragments/consumers/{name}", get(consumer_fragment))
        .route("/consumers/{name}/pause", post(pause))
        .route("/consumers/{name}/resume", post(resume))
        .route("/consumers/{name}/replay", post(replay))
        .route("/consumers/{name}/keys/release", post(release_key))
        .route("/consumers/{name}/dead", get(dead_letters))
        .route("/consumers/{name}/deliveries", get(deliveries))
        .route("/messages/{id}", get(message))
        .route("/messages/{id}/replay", post(message_replay))
        .route("/search", get(search))
        .route("/replays", get(replays))
        .route("/replays/{id}", get(replay_job))
        .route("/fragments/replays/{id}", get(replay_job_fragment))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/assets/{name}", get(super::assets::asset))
        .route("/favicon.ico", get(super::assets::favicon))
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(state)
}

/// Whether `host` (a `Host` header: a name or an address, with or without a port) names a
/// loopback address.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host
            .rsplit_once(':')
            .map_or(host, |(h, port)| if port.bytes().all(|b| b.is_ascii_digit()) { h } else { host }),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(crate::listen::is_loopback)
}

/// Before any route: a console served without authentication answers only requests addressed
/// to a loopback host (a web page that rebinds its name to 127.0.0.1 would otherwise be
/// same-origin with it); and a request that changes something and says where it comes from
/// (`Origin`) must come from this console.
async fn guard(Ctx(state): Ctx<Arc<State>>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let headers = req.headers();
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    if state.loopback_only && !loopback_host(host) {
        tracing::warn!(target: "outboxd::audit", host, action = "console", outcome = "refused", "console request for another host refused");
        return (
            StatusCode::MISDIRECTED_REQUEST,
            "refused: this console serves without authentication, only to addresses of this machine (http://127.0.0.1:PORT/)",
        )
            .into_response();
    }
    if !matches!(*req.method(), axum::http::Method::GET | axum::http::Method::HEAD)
        && let Some(origin) = headers.get(header::ORIGIN)
    {
        let scheme = if state.secure { "https" } else { "http" };
        let same_site = headers.get("sec-fetch-site").is_some_and(|v| v == "same-origin");
        let ours = origin.to_str().ok() == Some(&format!("{scheme}://{host}")) || (origin == "null" && same_site);
        if !ours {
            tracing::warn!(target: "outboxd::audit", host, origin = ?origin, action = "console", outcome = "forged", "console request from another origin refused");
            return (StatusCode::FORBIDDEN, views::refused_change(referring_page(headers).as_deref())).into_response();
        }
    }
    next.run(req).await
}

/// What every answer carries: no framing, no sniffing, no referrer, only this origin's
/// scripts and styles, and pages not cached (they hold a principal's view).
async fn security_headers(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    // `same-origin`, not `no-referrer`: under `no-referrer` a browser sends `Origin: null` with
    // the console's own form posts, which the origin check below could not tell from a
    // sandboxed frame's.
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    r
}

fn html(m: maud::Markup) -> Response {
    m.into_response()
}

fn store_refusal(e: StoreError) -> Refusal {
    Refusal::Status(crate::grpc::store_status(e))
}

fn consumer_name(s: &str) -> Result<ConsumerName, Refusal> {
    ConsumerName::parse("consumer", s).map_err(|e| Refusal::Status(Status::invalid_argument(e.to_string())))
}

#[derive(Debug, Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

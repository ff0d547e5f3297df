//! The console's routes: each page checks what its RPC would need, reads through the admin
//! service or the stats snapshot, and renders ([`super::views`]). Every POST checks the
//! session's CSRF token first, then calls the RPC it stands for (audited there).
use std::sync::Arc;

use axum::Router;
use axum::extract::{Form, Path, Query, State as Ctx};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use outbox_proto::v1 as pb;
use outbox_proto::v1::outbox_admin_server::OutboxAdmin as _;
use serde::Deserialize;
use tonic::Status;

use super::State;
use super::session::{Refusal, Viewer, cookie_safe, session_cookie};
use super::views::{self, SearchForm};
use crate::domain::{ConsumerName, MessageId, TopicPattern};
use crate::grpc::auth::Need;
use crate::maintenance::replay::Origin;
use crate::store::{MessageQuery, StoreError};

type Page = Result<Response, Refusal>;

/// Rows a list page shows at once.
const PAGE_ROWS: i64 = 50;
/// Dead-letter groups a consumer page shows.
const MAX_GROUPS: i64 = 50;
/// Messages one search page reads at most.
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
        .route("/messages/{id}", get(message))
        .route("/search", get(search))
        .route("/replays", get(replays))
        .route("/replays/{id}", get(replay_job))
        .route("/fragments/replays/{id}", get(replay_job_fragment))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/assets/{name}", get(super::assets::asset))
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
            return (StatusCode::FORBIDDEN, "refused: a change to this console must come from its own pages")
                .into_response();
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

// Overview.

async fn overview_live(state: &State, viewer: &Viewer) -> Result<maud::Markup, Refusal> {
    viewer.caller.check(Need::AdminRead)?;
    let snap = state.history.snapshot().await.map_err(store_refusal)?;
    let age = |t: Option<chrono::DateTime<chrono::Utc>>| t.map(|t| crate::metrics::age(snap.at, t));
    let sink_states = crate::metrics::sink_states();
    let rows: Vec<views::ConsumerRow<'_>> = snap
        .stats
        .consumers
        .iter()
        .map(|c| views::ConsumerRow {
            stats: c,
            oldest_s: age(c.oldest_unacked_at),
            streams: snap.streams.get(&c.consumer).copied().unwrap_or(0),
            sink: snap.sinks.get(&c.consumer).copied().unwrap_or(""),
            sink_state: sink_states.get(&c.consumer).map(|s| s.as_str()),
            samples: state.history.samples(&c.consumer),
        })
        .collect();
    let relay = views::Relay {
        unrelayed: snap.stats.unrelayed,
        oldest_unrelayed_s: age(snap.stats.oldest_unrelayed_at),
        last_seq: snap.last_seq,
    };
    let alerts = alerts(&snap, &rows, relay.oldest_unrelayed_s);
    Ok(views::overview_live(&rows, &relay, &alerts, snap.at))
}

/// The conditions of the shipped alert rules (deploy/prometheus/alerts.yml) that hold now, as
/// this process sees them.
fn alerts(
    snap: &super::history::Snapshot,
    rows: &[views::ConsumerRow<'_>],
    oldest_unrelayed: Option<f64>,
) -> Vec<String> {
    let mut out = Vec::new();
    if oldest_unrelayed.is_some_and(|s| s > 60.0) {
        out.push(format!("OutboxRelayBehind: committed messages wait {} to be relayed", views::age(oldest_unrelayed)));
    }
    for r in rows {
        let c = r.stats;
        if !c.paused && r.oldest_s.is_some_and(|s| s > 300.0) {
            out.push(format!("OutboxConsumerLagging: {} is {} behind", c.consumer, views::age(r.oldest_s)));
        }
        let recent: Vec<_> = r.samples.iter().rev().take(16).collect();
        if recent.len() >= 2
            && recent.first().map(|s| s.dead_lettered_total) > recent.last().map(|s| s.dead_lettered_total)
        {
            out.push(format!(
                "OutboxDeadLettersIncreasing: {} dead-lettered messages in the last 15 minutes",
                c.consumer
            ));
        }
        if !c.paused && c.backlog > 0 && r.streams == 0 && r.sink.is_empty() {
            out.push(format!(
                "OutboxConsumerWithoutStream: {} has a backlog and no stream on this process",
                c.consumer
            ));
        }
        if r.sink_state == Some("disconnected") {
            out.push(format!(
                "OutboxSinkDisconnected: {}'s {} target is not reachable from this process",
                c.consumer, r.sink
            ));
        }
        if r.sink_state == Some("suspended") {
            out.push(format!(
                "{} is suspended: its creator may no longer run it, or its secrets cannot be opened here",
                c.consumer
            ));
        }
        if c.held_keys > 0 {
            out.push(format!(
                "OutboxOrderingKeyHeld: {} holds {} ordering keys after dead letters",
                c.consumer, c.held_keys
            ));
        }
    }
    if let Some(h) = &snap.horizon
        && let Some(since) = h.since
        && crate::metrics::age(snap.at, since) > 600.0
    {
        out.push(format!(
            "OutboxVacuumHeldBack: a {} (pid {}, {}) holds back vacuum for {}",
            h.kind,
            h.pid,
            h.application_name,
            views::age(Some(crate::metrics::age(snap.at, since)))
        ));
    }
    out
}

async fn overview(Ctx(state): Ctx<Arc<State>>, viewer: Viewer) -> Page {
    let live = overview_live(&state, &viewer).await?;
    Ok(html(views::overview(&viewer, live)))
}

async fn overview_fragment(Ctx(state): Ctx<Arc<State>>, viewer: Viewer) -> Page {
    Ok(html(overview_live(&state, &viewer).await?))
}

// A consumer.

async fn consumer(Ctx(state): Ctx<Arc<State>>, viewer: Viewer, Path(name): Path<String>) -> Page {
    let n = consumer_name(&name)?;
    let c = state
        .admin
        .get_consumer(
            viewer.request(&format!("{ADMIN}GetConsumer"), pb::GetConsumerRequest { consumer: name.clone() })?,
        )
        .await?
        .into_inner()
        .consumer
        .unwrap_or_default();
    let held = state
        .admin
        .list_held_keys(
            viewer.request(&format!("{ADMIN}ListHeldKeys"), pb::ListHeldKeysRequest { consumer: name.clone() })?,
        )
        .await?
        .into_inner()
        .keys;
    viewer.caller.check(Need::AdminRead)?;
    let groups = state.history.dead_groups(&n, MAX_GROUPS).await.map_err(store_refusal)?.as_ref().clone();
    let snap = state.history.snapshot().await.map_err(store_refusal)?;
    let stats = snap.stats.consumers.iter().find(|s| s.consumer == name);
    let page = views::ConsumerPage {
        consumer: &c,
        stats,
        oldest_s: stats.and_then(|s| s.oldest_unacked_at).map(|t| crate::metrics::age(snap.at, t)),
        streams: snap.streams.get(&name).copied().unwrap_or(0),
        samples: state.history.samples(&name),
        groups,
        held,
    };
    let may_write = viewer.may(Need::AdminWrite);
    let may_replay = viewer.may(Need::Replay(&name));
    Ok(html(views::consumer(&viewer, &page, may_write, may_replay)))
}

async fn consumer_fragment(Ctx(state): Ctx<Arc<State>>, viewer: Viewer, Path(name): Path<String>) -> Page {
    viewer.caller.check(Need::AdminRead)?;
    let snap = state.history.snapshot().await.map_err(store_refusal)?;
    let stats = snap.stats.consumers.iter().find(|s| s.consumer == name);
    let oldest = stats.and_then(|s| s.oldest_unacked_at).map(|t| crate::metrics::age(snap.at, t));
    Ok(html(views::consumer_stats(stats, oldest, snap.streams.get(&name).copied().unwrap_or(0))))
}

#[derive(Debug, Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

async fn pause(
    Ctx(state): Ctx<Arc<State>>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(f): Form<CsrfForm>,
) -> Page {
    viewer.check_csrf(&headers, &f.csrf)?;
    state
        .admin
        .pause_consumer(
            viewer.request(&format!("{ADMIN}PauseConsumer"), pb::PauseConsumerRequest { consumer: name.clone() })?,
        )
        .await?;
    state.history.invalidate().await;
    Ok(Redirect::to(&format!("/consumers/{}", views::urlencode(&name))).into_response())
}

async fn resume(
    Ctx(state): Ctx<Arc<State>>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(f): Form<CsrfForm>,
) -> Page {
    viewer.check_csrf(&headers, &f.csrf)?;
    state
        .admin
        .resume_consumer(
            viewer.request(&format!("{ADMIN}ResumeConsumer"), pb::ResumeConsumerRequest { consumer: name.clone() })?,
        )
        .await?;
    state.history.invalidate().await;
    Ok(Redirect::to(&format!("/consumers/{}", views::urlencode(&name))).into_response())
}

#[derive(Debug, Deserialize)]
struct ReplayForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    last_error: String,
    #[serde(default)]
    dry_run: String,
    #[serde(default)]
    max_per_second: String,
    #[serde(default)]
    allow_beyond_retention: String,
}

/// A group of dead letters (one last error): a dry run that counts, or the replay itself,
/// paced, in the background; its page shows the progress.
async fn replay(
    Ctx(state): Ctx<Arc<State>>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(f): Form<ReplayForm>,
) -> Page {
    viewer.check_csrf(&headers, &f.csrf)?;
    if f.last_error.is_empty() {
        return Err(Status::invalid_argument("last_error: required: the error of the group to replay").into());
    }
    let max_per_second = match f.max_per_second.trim() {
        "" => 0,
        s => s.parse::<u32>().map_err(|_| {
            Status::invalid_argument(format!("max_per_second: {s:?} is not a whole number from 1 to 4294967295"))
        })?,
    };
    let req = pb::ReplayRequest {
        consumer: name.clone(),
        dead_letters: true,
        last_error: f.last_error.clone(),
        dry_run: f.dry_run != "false",
        allow_beyond_retention: f.allow_beyond_retention == "true",
        max_per_second,
        ..Default::default()
    };
    if req.dry_run {
        let r = state.admin.replay(viewer.request(&format!("{ADMIN}Replay"), req)?).await?.into_inner();
        return Ok(html(views::dry_run(&viewer, &name, &f.last_error, &r)));
    }
    // The same checks as the Replay RPC; the replayer writes its audit line.
    let _ = viewer.request(&format!("{ADMIN}Replay"), ())?;
    if let Err(s) = viewer.caller.check(Need::Replay(&name)) {
        viewer.refused("replay", &s);
        return Err(s.into());
    }
    let plan = crate::grpc::admin::replay_plan(req)?;
    let origin = Origin { principal: viewer.caller.name.to_string(), peer: viewer.peer };
    // A principal whose `replay:` is taken away (a reloaded auth file) stops its replay.
    let (caller, consumer) = (viewer.caller.clone(), name.clone());
    let revoked = async move {
        let _ = caller.revoked(move |p| p.allows(&Need::Replay(consumer.as_str()))).await;
    };
    state.history.invalidate().await;
    let Some(id) = state.admin.replayer.start(plan, origin, &state.admin.ctx.tasks, revoked) else {
        let s = Status::resource_exhausted(format!(
            "{} replays of yours are running: wait for one to finish",
            crate::maintenance::replay::MAX_RUNNING_PER_PRINCIPAL
        ));
        viewer.refused("replay", &s);
        return Err(s.into());
    };
    Ok(Redirect::to(&format!("/replays/{id}")).into_response())
}

#[derive(Debug, Deserialize)]
struct ReleaseForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    ordering_key: String,
    #[serde(default)]
    skip_dead: String,
}

async fn release_key(
    Ctx(state): Ctx<Arc<State>>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(f): Form<ReleaseForm>,
) -> Page {
    viewer.check_csrf(&headers, &f.csrf)?;
    let req = pb::ReleaseKeyRequest {
        consumer: name.clone(),
        ordering_key: f.ordering_key,
        skip_dead: f.skip_dead == "true",
    };
    state.admin.release_key(viewer.request(&format!("{ADMIN}ReleaseKey"), req)?).await?;
    state.history.invalidate().await;
    Ok(Redirect::to(&format!("/consumers/{}", views::urlencode(&name))).into_response())
}

#[derive(Debug, Deserialize)]
struct DeadQuery {
    #[serde(default)]
    error: String,
    #[serde(default)]
    after: i64,
}

async fn dead_letters(
    Ctx(state): Ctx<Arc<State>>,
    viewer: Viewer,
    Path(name): Path<String>,
    Query(q): Query<DeadQuery>,
) -> Page {
    viewer.caller.check(Need::AdminRead)?;
    let n = consumer_name(&name)?;
    let rows = state
        .admin
        .ctx
        .store
        .dead_letter_list_with_error(&n, Some(&q.error), q.after.max(0), PAGE_ROWS)
        .await
        .map_err(store_refusal)?;
    let next = (rows.len() as i64 == PAGE_ROWS).then(|| {
        format!(
            "/consumers/{}/dead?error={}&after={}",
            views::urlencode(&name),
            views::urlencode(&q.error),
            rows.last().map_or(0, |d| d.message.seq)
        )
    });
    Ok(html(views::dead_list(&viewer, &name, &q.error, &rows, next)))
}

// A message.

async fn message(Ctx(state): Ctx<Arc<State>>, viewer: Viewer, Path(id): Path<String>) -> Page {
    let r = state
        .admin
        .get_message(viewer.request(&format!("{ADMIN}GetMessage"), pb::GetMessageRequest { message_id: id })?)
        .await?
        .into_inner();
    let m = r.message.unwrap_or_default();
    let may_read = TopicPattern::parse("topic", &m.topic).is_ok_and(|t| viewer.may(Need::Tail(&t)));
    Ok(html(views::message(&viewer, &m, &r.deliveries, may_read, state.trace_url.as_deref())))
}

// Search.

/// An instant as the form takes it: RFC 3339, or `YYYY-MM-DDTHH:MM[:SS]` in UTC (what a
/// browser's datetime-local field sends).
fn instant(field: &str, s: &str) -> Result<Option<chrono::DateTime<chrono::Utc>>, String> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(None);
    }
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(s) {
        return Ok(Some(t.with_timezone(&chrono::Utc)));
    }
    for f in ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(s, f) {
            return Ok(Some(t.and_utc()));
        }
    }
    Err(format!("{field}: {s:?} is not a time: write 2026-12-05T10:00 (UTC) or an RFC 3339 time"))
}

async fn search(Ctx(state): Ctx<Arc<State>>, viewer: Viewer, Query(form): Query<SearchForm>) -> Page {
    viewer.caller.check(Need::AdminRead)?;
    let id = form.message_id.trim();
    if !id.is_empty() {
        return match MessageId::parse("message_id", id) {
            Ok(id) => Ok(Redirect::to(&format!("/messages/{id}")).into_response()),
            Err(e) => Ok(html(views::search(&viewer, &form, None, Some(&e.to_string())))),
        };
    }
    let searched = [&form.topic, &form.type_, &form.ordering_key, &form.after, &form.before, &form.cursor]
        .iter()
        .any(|v| !v.trim().is_empty());
    if !searched {
        return Ok(html(views::search(&viewer, &form, None, None)));
    }
    let parsed = (|| {
        let text = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_owned());
        let query = MessageQuery {
            topic: text(&form.topic)
                .map(|t| TopicPattern::parse("topic", &t))
                .transpose()
                .map_err(|e| e.to_string())?,
            type_: text(&form.type_),
            ordering_key: text(&form.ordering_key),
            after: instant("after", &form.after)?,
            before: instant("before", &form.before)?,
        };
        let cursor = match form.cursor.trim() {
            "" => None,
            c => Some(c.parse::<i64>().map_err(|_| format!("cursor: {c:?} is not a cursor this page made"))?),
        };
        Ok::<_, String>((query, cursor))
    })();
    let (query, cursor) = match parsed {
        Ok(p) => p,
        Err(e) => return Ok(html(views::search(&viewer, &form, None, Some(&e)))),
    };
    let page =
        state.admin.ctx.store.message_search(&query, cursor, PAGE_ROWS, SEARCH_WINDOW).await.map_err(store_refusal)?;
    let next = page.next_before_seq.map(|seq| {
        let next_form = SearchForm { cursor: seq.to_string(), ..form.clone() };
        format!("/search?{}", serde_urlencoded::to_string(&next_form).unwrap_or_default())
    });
    Ok(html(views::search(&viewer, &form, Some((&page.messages, page.scanned, next)), None)))
}

// Replays.

async fn replays(Ctx(state): Ctx<Arc<State>>, viewer: Viewer) -> Page {
    viewer.caller.check(Need::AdminRead)?;
    Ok(html(views::replays(&viewer, &state.admin.replayer.jobs().list())))
}

fn job(state: &State, viewer: &Viewer, id: &str) -> Result<crate::maintenance::replay::ReplayJob, Refusal> {
    viewer.caller.check(Need::AdminRead)?;
    id.parse::<u64>()
        .ok()
        .and_then(|id| state.admin.replayer.jobs().get(id))
        .ok_or_else(|| Refusal::Status(Status::not_found(format!("no replay {id:?} on this process"))))
}

async fn replay_job(Ctx(state): Ctx<Arc<State>>, viewer: Viewer, Path(id): Path<String>) -> Page {
    let j = job(&state, &viewer, &id)?;
    Ok(html(views::job(&viewer, &j)))
}

async fn replay_job_fragment(Ctx(state): Ctx<Arc<State>>, viewer: Viewer, Path(id): Path<String>) -> Page {
    let j = job(&state, &viewer, &id)?;
    Ok(html(views::job_progress(&j)))
}

// Signing in and out.

async fn login_page(Ctx(state): Ctx<Arc<State>>) -> Response {
    if !state.auth.enabled() {
        return Redirect::to("/").into_response();
    }
    html(views::login(None))
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    #[serde(default)]
    token: String,
}

/// Checks the token as the gRPC edge would, and keeps it in the session cookie. A sign-in
/// posted from another site is refused (login CSRF).
async fn login(
    Ctx(state): Ctx<Arc<State>>,
    headers: HeaderMap,
    peer: Option<axum::Extension<super::Peer>>,
    Form(f): Form<LoginForm>,
) -> Response {
    if !state.auth.enabled() {
        return Redirect::to("/").into_response();
    }
    let peer = peer.and_then(|p| p.0.0);
    let cross_site = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !matches!(v, "same-origin" | "none"));
    let token = f.token.trim();
    // Refusals are logged by the listener, a line per client and minute (`places`).
    let refused = |why: &str| (StatusCode::UNAUTHORIZED, views::login(Some(why))).into_response();
    if cross_site {
        return refused("a sign-in from another site is refused");
    }
    if !cookie_safe(token) {
        return refused(
            "not a token this console takes: a token is at most 4096 characters without spaces, quotes, commas, semicolons or backslashes",
        );
    }
    match state.auth.authenticate_credential(Some(token), None) {
        Ok(caller) => {
            // The cookie gets a random session id, never the token (ADR 0073).
            let id = match state.start_session(&caller).await {
                Ok(id) => id,
                Err(s) => return views::status_page(&s).into_response(),
            };
            tracing::info!(target: "outboxd::audit", principal = &*caller.name, ?peer, action = "console_sign_in", outcome = "ok", "console sign-in");
            let mut r = Redirect::to("/").into_response();
            let age = cookie::time::Duration::try_from(state.sessions.max).ok();
            if let Ok(v) = HeaderValue::from_str(&session_cookie(&id, state.secure, age).to_string()) {
                r.headers_mut().append(header::SET_COOKIE, v);
            }
            r
        }
        Err(_) => refused("this token is not valid here"),
    }
}

async fn logout(Ctx(state): Ctx<Arc<State>>, viewer: Viewer, headers: HeaderMap, Form(f): Form<CsrfForm>) -> Page {
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

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
use crate::store::{DeadLetterPageParams, MessageQuery, SearchParams, StoreError, UnackedKind, UnackedPageParams};

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

/// The longest path a sign-in leads back to.
const MAX_NEXT_BYTES: usize = 2048;

/// `next` if it is a page of this console that a browser may be sent to: a path of this origin
/// (`/` and not `//` or `/\`), in printable ASCII without `\` (a browser reads `\` as `/`, and
/// drops tabs and line breaks, either of which can turn a path into `//host`), at most
/// [`MAX_NEXT_BYTES`], and not the sign-in or sign-out itself. Anything else — `//host`,
/// `/\host`, `https://host`, `javascript:` — would make the console an open redirect: a link
/// to it could send a browser that has just signed in to another site.
pub(super) fn safe_next(next: &str) -> Option<&str> {
    let b = next.as_bytes();
    let ok = b.first() == Some(&b'/')
        && !matches!(b.get(1), Some(b'/' | b'\\'))
        && b.len() <= MAX_NEXT_BYTES
        && b.iter().all(|c| c.is_ascii_graphic() && *c != b'\\');
    let path = next.split(['?', '#']).next().unwrap_or(next);
    (ok && !matches!(path, "/login" | "/logout")).then_some(next)
}

/// The page a request that must first sign in was going to: a page (GET or HEAD) with its
/// query, not a fragment a page refreshes itself with (the page reloads when it gets the
/// sign-in page instead), not an asset, not the overview (the default).
pub(super) fn return_path(parts: &axum::http::request::Parts) -> Option<String> {
    if !matches!(parts.method, axum::http::Method::GET | axum::http::Method::HEAD) {
        return None;
    }
    let path = parts.uri.path();
    if path == "/" || path.starts_with("/fragments/") || path.starts_with("/assets/") {
        return None;
    }
    let full = parts.uri.path_and_query().map_or(path, |p| p.as_str());
    safe_next(full).map(str::to_owned)
}

/// Where a request that must sign in is sent: the sign-in page, with the page to come back to.
pub(super) fn sign_in_location(next: Option<&str>) -> String {
    match next.and_then(safe_next) {
        Some(n) => format!("/login?next={}", views::urlencode(n)),
        None => "/login".to_owned(),
    }
}

/// The page of this console a request was sent from (its `Referer`, which browsers send to the
/// same origin under this console's referrer policy), as a page to go back to: a form's action
/// leads back to the page that showed the form.
pub(super) fn referring_page(headers: &HeaderMap) -> Option<String> {
    let referer = headers.get(header::REFERER)?.to_str().ok()?;
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let rest = referer.strip_prefix("http://").or_else(|| referer.strip_prefix("https://"))?;
    let path = rest.strip_prefix(host)?.split('#').next()?;
    let page = safe_next(path)?;
    let bare = page.split('?').next().unwrap_or(page);
    let segments: Vec<&str> = bare.split('/').collect();
    // ["", "consumers", NAME, ACTION, ...] and ["", "messages", ID, "replay"]: the page of the form.
    Some(match segments.as_slice() {
        ["", "consumers", name, "pause" | "resume" | "replay" | "keys", ..] => format!("/consumers/{name}"),
        ["", "messages", id, "replay"] => format!("/messages/{id}"),
        _ => page.to_owned(),
    })
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
    // Acks as this process counts them now, not as of the last sample: a figure that moves as
    // the tab refreshes, with no read of the acked history.
    let tallies = crate::metrics::tallies();
    let rows: Vec<views::ConsumerRow<'_>> = snap
        .stats
        .consumers
        .iter()
        .map(|c| {
            let samples = state.history.samples(&c.consumer);
            let acked_now = tallies.get(&c.consumer).map_or(0, |t| t.acked);
            views::ConsumerRow {
                stats: c,
                oldest_s: age(c.oldest_unacked_at),
                streams: snap.streams.get(&c.consumer).copied().unwrap_or(0),
                sink: snap.sinks.get(&c.consumer).copied().unwrap_or(""),
                sink_state: sink_states.get(&c.consumer).map(|s| s.as_str()),
                acked: super::history::since_oldest(&samples, acked_now, |s| s.acked_total),
                samples,
            }
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

/// What the last action on a consumer's page did, as its redirect says: a held key released.
#[derive(Debug, Default, Deserialize, serde::Serialize)]
struct Released {
    #[serde(default)]
    released: Option<String>,
    #[serde(default)]
    skipped: bool,
    #[serde(default)]
    waiting: i64,
}

impl Released {
    fn notice(&self) -> Option<String> {
        let key = self.released.as_ref()?;
        let waiting = self.waiting;
        Some(if self.skipped {
            format!(
                "Skipped the dead message of ordering key {key}: it stays a dead letter, and the {waiting} message(s) \
                 waiting behind it are delivered now."
            )
        } else {
            format!(
                "Released ordering key {key}: its dead message is delivered again first, then the {waiting} message(s) \
                 waiting behind it."
            )
        })
    }
}

async fn consumer(
    Ctx(state): Ctx<Arc<State>>,
    viewer: Viewer,
    Path(name): Path<String>,
    Query(done): Query<Released>,
) -> Page {
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
    Ok(html(views::consumer(&viewer, &page, may_write, may_replay, done.notice().as_deref())))
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
    /// A skip is confirmed on a page of its own first.
    #[serde(default)]
    confirmed: String,
}

async fn release_key(
    Ctx(state): Ctx<Arc<State>>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(f): Form<ReleaseForm>,
) -> Page {
    viewer.check_csrf(&headers, &f.csrf)?;
    let skip_dead = f.skip_dead == "true";
    if skip_dead && f.confirmed != "true" {
        // Skipping gives the dead message up for the key's order: say so, and ask, first. The
        // same permission as the release itself.
        let _ = viewer.request(&format!("{ADMIN}ReleaseKey"), ())?;
        if let Err(s) = viewer.caller.check(Need::Replay(&name)) {
            viewer.refused("release_key", &s);
            return Err(s.into());
        }
        let held = state
            .admin
            .list_held_keys(
                viewer.request(&format!("{ADMIN}ListHeldKeys"), pb::ListHeldKeysRequest { consumer: name.clone() })?,
            )
            .await?
            .into_inner()
            .keys;
        let Some(k) = held.into_iter().find(|k| k.ordering_key == f.ordering_key) else {
            return Err(Status::not_found(format!(
                "consumer {name} holds no ordering key {} (any more): it may have been released meanwhile",
                f.ordering_key
            ))
            .into());
        };
        return Ok(html(views::skip_key(&viewer, &name, &k)));
    }
    let req = pb::ReleaseKeyRequest { consumer: name.clone(), ordering_key: f.ordering_key, skip_dead };
    let key = state.admin.release_key(viewer.request(&format!("{ADMIN}ReleaseKey"), req)?).await?.into_inner().key;
    state.history.invalidate().await;
    let done = Released {
        released: key.as_ref().map(|k| k.ordering_key.clone()),
        skipped: skip_dead,
        waiting: key.as_ref().map_or(0, |k| k.waiting),
    };
    let query = serde_urlencoded::to_string(&done).unwrap_or_default();
    Ok(Redirect::to(&format!("/consumers/{}?{query}", views::urlencode(&name))).into_response())
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
        .dead_letter_list_with_error(
            &n,
            &DeadLetterPageParams {
                last_error: Some(&q.error),
                after_seq: q.after.max(0),
                limit: PAGE_ROWS,
                with_payloads: false,
            },
        )
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

/// What the last action on a message's page did, as its redirect says: a replay to a consumer.
#[derive(Debug, Default, Deserialize, serde::Serialize)]
struct Replayed {
    #[serde(default)]
    replayed: Option<String>,
    #[serde(default)]
    count: i64,
}

impl Replayed {
    fn notice(&self) -> Option<String> {
        let c = self.replayed.as_ref()?;
        Some(if self.count > 0 {
            format!("Replayed to {c}: its delivery is due now, with a fresh delivery count.")
        } else {
            format!("Nothing was replayed to {c}: its delivery is in flight, or beyond the retention.")
        })
    }
}

async fn message(
    Ctx(state): Ctx<Arc<State>>,
    viewer: Viewer,
    Path(id): Path<String>,
    Query(done): Query<Replayed>,
) -> Page {
    let r = state
        .admin
        .get_message(viewer.request(&format!("{ADMIN}GetMessage"), pb::GetMessageRequest { message_id: id })?)
        .await?
        .into_inner();
    let m = r.message.unwrap_or_default();
    let may_read = TopicPattern::parse("topic", &m.topic).is_ok_and(|t| viewer.may(Need::Tail(&t)));
    let notice = done.notice();
    let shown = views::MessageView { may_read, trace_url: state.trace_url.as_deref(), done: notice.as_deref() };
    Ok(html(views::message(&viewer, &m, &r.deliveries, &shown)))
}

#[derive(Debug, Deserialize)]
struct MessageReplayForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    consumer: String,
    #[serde(default)]
    confirmed: String,
    #[serde(default)]
    allow_beyond_retention: String,
}

/// A replay of one message to one consumer, with the Replay RPC's checks and audit: a dry run
/// that says what it would do, then the replay once confirmed, back on the message's page.
async fn message_replay(
    Ctx(state): Ctx<Arc<State>>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<MessageReplayForm>,
) -> Page {
    viewer.check_csrf(&headers, &f.csrf)?;
    let message_id = MessageId::parse("message_id", &id).map_err(|e| Status::invalid_argument(e.to_string()))?;
    let confirmed = f.confirmed == "true";
    let req = pb::ReplayRequest {
        consumer: f.consumer.clone(),
        message_ids: vec![message_id.to_string()],
        dry_run: !confirmed,
        allow_beyond_retention: f.allow_beyond_retention == "true",
        ..Default::default()
    };
    let r = state.admin.replay(viewer.request(&format!("{ADMIN}Replay"), req)?).await?.into_inner();
    if !confirmed {
        let delivery =
            state
                .admin
                .get_message(viewer.request(
                    &format!("{ADMIN}GetMessage"),
                    pb::GetMessageRequest { message_id: message_id.to_string() },
                )?)
                .await?
                .into_inner()
                .deliveries
                .into_iter()
                .find(|d| d.consumer == f.consumer);
        let shown = delivery.map_or("none yet", |d| {
            pb::delivery_state::State::try_from(d.state).map_or("UNKNOWN", |s| s.as_str_name())
        });
        return Ok(html(views::message_replay(&viewer, &message_id.to_string(), &f.consumer, shown, &r)));
    }
    state.history.invalidate().await;
    let done = Replayed { replayed: Some(f.consumer), count: r.replayed };
    let query = serde_urlencoded::to_string(&done).unwrap_or_default();
    Ok(Redirect::to(&format!("/messages/{message_id}?{query}")).into_response())
}

#[derive(Debug, Deserialize)]
struct DeliveriesQuery {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    after: i64,
}

/// A page of a consumer's pending, retrying or in-flight deliveries, by keyset.
async fn deliveries(
    Ctx(state): Ctx<Arc<State>>,
    viewer: Viewer,
    Path(name): Path<String>,
    Query(q): Query<DeliveriesQuery>,
) -> Page {
    viewer.caller.check(Need::AdminRead)?;
    let n = consumer_name(&name)?;
    let kind = match q.kind.as_str() {
        "" => UnackedKind::Pending,
        k => UnackedKind::parse(k)
            .ok_or_else(|| Status::invalid_argument(format!("kind: {k:?} is none of pending, retrying, in-flight")))?,
    };
    let page = state
        .admin
        .ctx
        .store
        .delivery_list_unacked(
            &n,
            &UnackedPageParams { kind, after_seq: q.after.max(0), limit: PAGE_ROWS, scan: SEARCH_WINDOW },
        )
        .await
        .map_err(store_refusal)?;
    let next = page
        .next_after_seq
        .map(|after| format!("/consumers/{}/deliveries?kind={}&after={after}", views::urlencode(&name), kind.as_str()));
    Ok(html(views::deliveries(&viewer, &name, kind, &page.deliveries, next)))
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
    let page = state
        .admin
        .ctx
        .store
        .message_search(&SearchParams { query: &query, before_seq: cursor, limit: PAGE_ROWS, scan: SEARCH_WINDOW })
        .await
        .map_err(store_refusal)?;
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

#[derive(Debug, Deserialize)]
struct NextQuery {
    #[serde(default)]
    next: String,
}

async fn login_page(Ctx(state): Ctx<Arc<State>>, Query(q): Query<NextQuery>) -> Response {
    let next = safe_next(&q.next).unwrap_or("/");
    if !state.auth.enabled() {
        return Redirect::to(next).into_response();
    }
    html(views::login(None, next))
}

#[derive(Debug, Deserialize)]
struct LoginForm {
    #[serde(default)]
    token: String,
    /// The page to go to once signed in ([`safe_next`]; the overview otherwise).
    #[serde(default)]
    next: String,
}

/// Checks the token as the gRPC edge would, and keeps it in the session cookie. A sign-in
/// posted from another site is refused (login CSRF).
async fn login(
    Ctx(state): Ctx<Arc<State>>,
    headers: HeaderMap,
    peer: Option<axum::Extension<super::Peer>>,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A sign-in leads back only to a page of this console: never to another host, however the
    /// path is spelt to look like one to a browser.
    #[test]
    fn a_sign_in_leads_back_to_a_path_of_this_console_only() {
        for ok in
            ["/messages/0190a6a0-0000-7000-8000-000000000000", "/consumers/billing?x=1#dead", "/search?topic=orders.*"]
        {
            assert_eq!(safe_next(ok), Some(ok));
        }
        for bad in [
            "",
            "//evil.example/",
            "/\\evil.example",
            "\\\\evil.example",
            "/\t/evil.example",
            "/\n/evil.example",
            "/ /evil.example",
            "https://evil.example/",
            "http:/evil.example",
            "javascript:alert(1)",
            "evil.example",
            "/consumers\\..\\x",
            "/login",
            "/login?next=/",
            "/logout",
            "/caf\u{e9}",
        ] {
            assert_eq!(safe_next(bad), None, "{bad:?}");
        }
        assert_eq!(safe_next(&format!("/{}", "a".repeat(MAX_NEXT_BYTES))), None, "too long");
        assert_eq!(sign_in_location(Some("/consumers/a b")), "/login");
        assert_eq!(sign_in_location(Some("/consumers/x?y=1")), "/login?next=%2Fconsumers%2Fx%3Fy%3D1");
        assert_eq!(sign_in_location(Some("//evil.example")), "/login");
        assert_eq!(sign_in_location(None), "/login");
    }

    fn parts(method: &str, uri: &str) -> axum::http::request::Parts {
        let r = axum::http::Request::builder().method(method).uri(uri).body(()).unwrap_or_default();
        r.into_parts().0
    }

    /// The page a refused request was going to: pages asked for, not the polling of a page, its
    /// assets, its forms or the overview.
    #[test]
    fn only_a_page_asked_for_is_returned_to_after_signing_in() {
        assert_eq!(return_path(&parts("GET", "/messages/abc?x=1")).as_deref(), Some("/messages/abc?x=1"));
        assert_eq!(return_path(&parts("HEAD", "/replays")).as_deref(), Some("/replays"));
        for (method, uri) in [
            ("GET", "/"),
            ("GET", "/fragments/overview"),
            ("GET", "/assets/console.css"),
            ("POST", "/consumers/x/pause"),
            ("GET", "//evil.example/x"),
            ("GET", "/login?next=/x"),
        ] {
            assert_eq!(return_path(&parts(method, uri)), None, "{method} {uri}");
        }
    }

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(k, HeaderValue::from_str(v).unwrap_or_else(|_| HeaderValue::from_static("")));
        }
        h
    }

    /// A refused form leads back to the page that showed it, on this host only.
    #[test]
    fn a_refused_change_leads_back_to_the_page_of_its_form_on_this_host() {
        let back =
            |referer: &str| referring_page(&headers(&[(header::HOST, "127.0.0.1:8080"), (header::REFERER, referer)]));
        assert_eq!(back("http://127.0.0.1:8080/consumers/billing").as_deref(), Some("/consumers/billing"));
        assert_eq!(back("https://127.0.0.1:8080/consumers/billing/replay").as_deref(), Some("/consumers/billing"));
        assert_eq!(back("http://127.0.0.1:8080/consumers/replay").as_deref(), Some("/consumers/replay"));
        assert_eq!(back("http://127.0.0.1:8080/consumers/b/keys/release").as_deref(), Some("/consumers/b"));
        assert_eq!(back("http://127.0.0.1:8080/messages/m/replay").as_deref(), Some("/messages/m"));
        assert_eq!(back("http://127.0.0.1:8080/search?topic=a#x").as_deref(), Some("/search?topic=a"));
        for foreign in [
            "http://evil.example/consumers/billing",
            "http://127.0.0.1:8080.evil.example/x",
            "http://127.0.0.1:8080@evil.example/x",
            "http://127.0.0.1:8080//evil.example/x",
            "ftp://127.0.0.1:8080/x",
        ] {
            assert_eq!(back(foreign), None, "{foreign}");
        }
        assert_eq!(referring_page(&headers(&[(header::REFERER, "http://127.0.0.1:8080/x")])), None, "no Host");
    }
}

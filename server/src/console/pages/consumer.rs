//! A consumer's pages and what they change: pause, resume, a replay of its dead letters, the
//! release of a held key; its lists of dead letters and of unfinished deliveries.
use std::sync::Arc;

use axum::extract::{Form, Path, Query, State as Ctx};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect};
use outbox_proto::v1 as pb;
use outbox_proto::v1::outbox_admin_server::OutboxAdmin as _;
use serde::Deserialize;
use tonic::Status;

use super::{ADMIN, CsrfForm, MAX_GROUPS, PAGE_ROWS, Page, SEARCH_WINDOW, consumer_name, html, store_refusal};
use crate::console::State;
use crate::console::nav::urlencode;
use crate::console::viewer::Viewer;
use crate::console::views::{self};
use crate::grpc::auth::Need;
use crate::maintenance::replay::Origin;
use crate::store::{DeadLetterPageParams, UnackedKind, UnackedPageParams};

/// What the last action on a consumer's page did, as its redirect says: a held key released.
#[derive(Debug, Default, Deserialize, serde::Serialize)]
pub(super) struct Released {
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

pub(super) async fn consumer(
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

pub(super) async fn consumer_fragment(Ctx(state): Ctx<Arc<State>>, viewer: Viewer, Path(name): Path<String>) -> Page {
    viewer.caller.check(Need::AdminRead)?;
    let snap = state.history.snapshot().await.map_err(store_refusal)?;
    let stats = snap.stats.consumers.iter().find(|s| s.consumer == name);
    let oldest = stats.and_then(|s| s.oldest_unacked_at).map(|t| crate::metrics::age(snap.at, t));
    Ok(html(views::consumer_stats(stats, oldest, snap.streams.get(&name).copied().unwrap_or(0))))
}

pub(super) async fn pause(
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
    Ok(Redirect::to(&format!("/consumers/{}", urlencode(&name))).into_response())
}

pub(super) async fn resume(
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
    Ok(Redirect::to(&format!("/consumers/{}", urlencode(&name))).into_response())
}

#[derive(Debug, Deserialize)]
pub(super) struct ReplayForm {
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
pub(super) async fn replay(
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
pub(super) struct ReleaseForm {
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

pub(super) async fn release_key(
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
    Ok(Redirect::to(&format!("/consumers/{}?{query}", urlencode(&name))).into_response())
}

#[derive(Debug, Deserialize)]
pub(super) struct DeadQuery {
    #[serde(default)]
    error: String,
    #[serde(default)]
    after: i64,
}

pub(super) async fn dead_letters(
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
            urlencode(&name),
            urlencode(&q.error),
            rows.last().map_or(0, |d| d.message.seq)
        )
    });
    Ok(html(views::dead_list(&viewer, &name, &q.error, &rows, next)))
}

#[derive(Debug, Deserialize)]
pub(super) struct DeliveriesQuery {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    after: i64,
}

/// A page of a consumer's pending, retrying or in-flight deliveries, by keyset.
pub(super) async fn deliveries(
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
        .map(|after| format!("/consumers/{}/deliveries?kind={}&after={after}", urlencode(&name), kind.as_str()));
    Ok(html(views::deliveries(&viewer, &name, kind, &page.deliveries, next)))
}

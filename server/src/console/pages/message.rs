//! A message's page, a replay of it to one consumer, and the search for messages.
use std::sync::Arc;

use axum::extract::{Form, Path, Query, State as Ctx};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect};
use outbox_proto::v1 as pb;
use outbox_proto::v1::outbox_admin_server::OutboxAdmin as _;
use serde::Deserialize;
use tonic::Status;

use super::{ADMIN, PAGE_ROWS, Page, SEARCH_WINDOW, html, store_refusal};
use crate::console::State;
use crate::console::viewer::Viewer;
use crate::console::views::{self, SearchForm};
use crate::domain::{MessageId, TopicPattern};
use crate::grpc::auth::Need;
use crate::store::{MessageQuery, SearchParams};

/// What the last action on a message's page did, as its redirect says: a replay to a consumer.
#[derive(Debug, Default, Deserialize, serde::Serialize)]
pub(super) struct Replayed {
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

pub(super) async fn message(
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
pub(super) struct MessageReplayForm {
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
pub(super) async fn message_replay(
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

pub(super) async fn search(Ctx(state): Ctx<Arc<State>>, viewer: Viewer, Query(form): Query<SearchForm>) -> Page {
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

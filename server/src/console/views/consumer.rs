//! A consumer's pages: its figures, dead-letter groups and held keys, its lists of unfinished
//! deliveries and of dead letters, and the confirmation of skipping a held key.
use maud::{Markup, html};
use outbox_proto::v1 as pb;

use super::{age, error_text, layout, notice, pb_time, time};
use crate::console::history::Sample;
use crate::console::nav::urlencode;
use crate::console::viewer::Viewer;
use crate::store::{ConsumerStats, DeadGroup, DeadLetter, UnackedDelivery, UnackedKind};

pub struct ConsumerPage<'a> {
    pub consumer: &'a pb::Consumer,
    pub stats: Option<&'a ConsumerStats>,
    pub oldest_s: Option<f64>,
    pub streams: u32,
    pub samples: Vec<Sample>,
    pub groups: Vec<DeadGroup>,
    pub held: Vec<pb::HeldKey>,
}

pub fn consumer(
    viewer: &Viewer,
    p: &ConsumerPage<'_>,
    may_write: bool,
    may_replay: bool,
    done: Option<&str>,
) -> Markup {
    let name = &p.consumer.name;
    let chart = serde_json::json!({
        "series": ["backlog", "oldest unacked (s)"],
        "data": [
            p.samples.iter().map(|s| s.at.timestamp()).collect::<Vec<_>>(),
            p.samples.iter().map(|s| s.backlog).collect::<Vec<_>>(),
            p.samples.iter().map(|s| s.oldest_unacked.round()).collect::<Vec<_>>(),
        ],
    });
    layout(
        Some(viewer),
        name,
        html! {
            h1 { "Consumer " code { (name) } }
            (notice(done))
            p.muted { "Topics " code { (p.consumer.topics.join(", ")) } " · max deliveries " (p.consumer.max_deliveries)
                " · dead key policy " (if p.consumer.dead_key_policy == pb::DeadKeyPolicy::Hold as i32 { "hold" } else { "skip" })
                @if p.consumer.sink.is_some() { " · sink" } }
            div #consumer-live data-refresh=(format!("/fragments/consumers/{name}")) data-every="10" {
                (consumer_stats(p.stats, p.oldest_s, p.streams))
            }
            (delivery_tabs(name, None))
            @if may_write {
                div.actions {
                    @if p.consumer.paused {
                        form #resume .inline method="post" action=(format!("/consumers/{name}/resume")) {
                            input type="hidden" name="csrf" value=(viewer.csrf);
                            button #resume-button type="submit" { "Resume" }
                        }
                    } @else {
                        form #pause .inline method="post" action=(format!("/consumers/{name}/pause")) {
                            input type="hidden" name="csrf" value=(viewer.csrf);
                            button #pause-button type="submit" { "Pause" }
                        }
                    }
                }
            }
            h2 { "Lag, last hour" }
            @if p.samples.len() >= 2 {
                div.chart #lag-chart data-chart=(chart.to_string()) {}
            } @else {
                p.muted { "One sample a minute: the chart appears after two." }
            }
            h2 { "Dead letters by last error" }
            table #dead-groups {
                thead { tr { th { "Last error" } th.num { "Count" } th { "First" } th { "Last" } th { "Topics" } th { "Types" } th {} } }
                tbody {
                    @for g in &p.groups {
                        @let error = g.last_error.clone().unwrap_or_default();
                        tr.dead-group {
                            td.error { (error_text(&error)) }
                            td.num.count { (g.count) }
                            td.first { (time(g.first_dead_at)) }
                            td.last { (time(g.last_dead_at)) }
                            td.topics { (g.topics.join(", ")) }
                            td.types { (g.types.join(", ")) }
                            td {
                                a.show-messages href=(format!("/consumers/{name}/dead?error={}", urlencode(&error))) { "Show messages" }
                                @if may_replay && g.last_error.is_some() {
                                    " "
                                    form.dry-run.inline method="post" action=(format!("/consumers/{name}/replay")) {
                                        input type="hidden" name="csrf" value=(viewer.csrf);
                                        input type="hidden" name="last_error" value=(error);
                                        input type="hidden" name="dry_run" value="true";
                                        button.dry-run-button type="submit" { "Replay…" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @if p.groups.is_empty() { p.muted #no-dead { "No dead letters." } }
            h2 { "Held ordering keys" }
            table #held-keys {
                thead { tr { th { "Key" } th { "Dead message" } th.num { "Waiting" } th { "Held since" } th { "Last error" } th {} } }
                tbody {
                    @for k in &p.held {
                        tr.held-key data-key=(k.ordering_key) {
                            td.mono { (k.ordering_key) }
                            td { a href=(format!("/messages/{}", k.message_id)) { code { (k.message_id) } } }
                            td.num { (k.waiting) }
                            td { (pb_time(k.held_at.as_ref())) }
                            td.error { (error_text(&k.last_error)) }
                            td {
                                @if may_replay {
                                    form.release.inline method="post" action=(format!("/consumers/{name}/keys/release")) {
                                        input type="hidden" name="csrf" value=(viewer.csrf);
                                        input type="hidden" name="ordering_key" value=(k.ordering_key);
                                        input type="hidden" name="skip_dead" value="false";
                                        button type="submit" { "Deliver it again" }
                                    }
                                    " "
                                    form.release-skip.inline method="post" action=(format!("/consumers/{name}/keys/release")) {
                                        input type="hidden" name="csrf" value=(viewer.csrf);
                                        input type="hidden" name="ordering_key" value=(k.ordering_key);
                                        input type="hidden" name="skip_dead" value="true";
                                        button.danger type="submit" { "Skip it…" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @if p.held.is_empty() { p.muted { "No held keys." } }
        },
    )
}

pub fn consumer_stats(stats: Option<&ConsumerStats>, oldest_s: Option<f64>, streams: u32) -> Markup {
    html! {
        div #stats .cards {
            @if let Some(s) = stats {
                div.card { div.label { "Backlog" } div.value.backlog { (s.backlog) } }
                div.card { div.label { "Oldest unacked" } div.value.oldest { (age(oldest_s)) } }
                div.card { div.label { "In flight" } div.value.in-flight { (s.in_flight) } }
                div.card { div.label { "Retrying" } div.value.retrying { (s.retrying) } }
                div.card { div.label { "Dead" } div.value.dead { (s.dead) } }
                div.card { div.label { "Held keys" } div.value.held { (s.held_keys) } }
                div.card { div.label { "Paused" } div.value.paused { @if s.paused { "yes" } @else { "no" } } }
                div.card { div.label { "Streams here" } div.value.streams { (streams) } }
            }
        }
    }
}

/// The confirmation of "Skip it" on a held key: what stays dead and what goes.
pub fn skip_key(viewer: &Viewer, consumer: &str, k: &pb::HeldKey) -> Markup {
    layout(
        Some(viewer),
        "Skip a dead message",
        html! {
            h1 { "Skip the dead message of key " code { (k.ordering_key) } }
            div #skip-confirm-text .confirm {
                p { "Message " a href=(format!("/messages/{}", k.message_id)) { code { (k.message_id) } }
                    " stays a dead letter of " code { (consumer) } " and is not delivered before the others: "
                    strong.waiting { (k.waiting) } " message(s) of key " code { (k.ordering_key) } " waiting behind it are delivered now, in order." }
                p { "Its last error: " (error_text(&k.last_error)) }
                p.muted { "It can still be replayed later from its dead letters, out of order then." }
            }
            form #skip-confirm method="post" action=(format!("/consumers/{consumer}/keys/release")) {
                input type="hidden" name="csrf" value=(viewer.csrf);
                input type="hidden" name="ordering_key" value=(k.ordering_key);
                input type="hidden" name="skip_dead" value="true";
                input type="hidden" name="confirmed" value="true";
                button #skip-button .danger type="submit" { "Skip it" }
                " "
                a #cancel .button href=(format!("/consumers/{consumer}")) { "Cancel" }
            }
        },
    )
}

/// The links from a consumer to its lists of deliveries; `current` is not a link.
pub fn delivery_tabs(consumer: &str, current: Option<UnackedKind>) -> Markup {
    let kinds =
        [(UnackedKind::Pending, "Pending"), (UnackedKind::Retrying, "Retrying"), (UnackedKind::InFlight, "In flight")];
    html! {
        p.tabs #delivery-tabs {
            "Deliveries: "
            @for (i, (k, label)) in kinds.iter().enumerate() {
                @if i > 0 { " · " }
                @if current == Some(*k) { strong { (label) } }
                @else { a id=(format!("list-{}", k.as_str())) href=(format!("/consumers/{}/deliveries?kind={}", urlencode(consumer), k.as_str())) { (label) } }
            }
            " · " a #list-dead href=(format!("/consumers/{}#dead-groups", urlencode(consumer))) { "Dead letters" }
        }
    }
}

/// A page of a consumer's unfinished deliveries of one kind.
pub fn deliveries(
    viewer: &Viewer,
    consumer: &str,
    kind: UnackedKind,
    rows: &[UnackedDelivery],
    next: Option<String>,
) -> Markup {
    let title = match kind {
        UnackedKind::Pending => "Pending deliveries",
        UnackedKind::Retrying => "Retrying deliveries",
        UnackedKind::InFlight => "Deliveries in flight",
    };
    layout(
        Some(viewer),
        title,
        html! {
            h1 { (title) " of " a href=(format!("/consumers/{}", urlencode(consumer))) { code { (consumer) } } }
            (delivery_tabs(consumer, Some(kind)))
            p.muted { @match kind {
                UnackedKind::Pending => "Waiting to be delivered, first or again, oldest first.",
                UnackedKind::Retrying => "Waiting to be delivered again after a failed delivery (a nack or an expired lease), oldest first.",
                UnackedKind::InFlight => "Held by a stream or a sink, not acked yet, oldest first.",
            } }
            table #deliveries data-kind=(kind.as_str()) {
                thead { tr { th { "Message" } th.num { "Seq" } th { "Topic" } th { "Type" } th { "Ordering key" } th { "Enqueued" } th.num { "Deliveries" }
                    th { @if kind == UnackedKind::InFlight { "Lease until" } @else { "Due" } } th { "Last error" } } }
                tbody {
                    @for d in rows {
                        tr data-message-id=(d.message.message_id) {
                            td { a href=(format!("/messages/{}", d.message.message_id)) { code { (d.message.message_id) } } }
                            td.num { (d.message.seq) }
                            td.topic { (d.message.topic) }
                            td { (d.message.type_) }
                            td.mono { (d.message.ordering_key.as_deref().unwrap_or("")) }
                            td { (time(Some(d.message.enqueued_at))) }
                            td.num.count { (d.delivery_count) }
                            td.due { @if let Some(t) = d.lease_expires_at { (time(Some(t))) } @else { (time(Some(d.available_at))) } }
                            td.error { (error_text(d.last_error.as_deref().unwrap_or(""))) }
                        }
                    }
                }
            }
            @if rows.is_empty() { p.muted #none { "None." } }
            @if let Some(n) = next { p.pager { a #next href=(n) { "More →" } } }
        },
    )
}

pub fn dead_list(viewer: &Viewer, consumer: &str, error: &str, rows: &[DeadLetter], next: Option<String>) -> Markup {
    layout(
        Some(viewer),
        "Dead letters",
        html! {
            h1 { "Dead letters of " a href=(format!("/consumers/{consumer}")) { code { (consumer) } } }
            p { "Last error " (error_text(error)) }
            table #dead-letters {
                thead { tr { th { "Message" } th { "Topic" } th { "Type" } th.num { "Deliveries" } th { "Dead since" } } }
                tbody {
                    @for d in rows {
                        tr data-message-id=(d.message.message_id) {
                            td { a href=(format!("/messages/{}", d.message.message_id)) { code { (d.message.message_id) } } }
                            td { (d.message.topic) }
                            td { (d.message.type_) }
                            td.num { (d.delivery_count) }
                            td { (time(d.dead_at)) }
                        }
                    }
                }
            }
            @if let Some(n) = next { p.pager { a #next href=(n) { "More →" } } }
        },
    )
}

//! The overview: every consumer's figures and the relay's, refreshed in place.
use chrono::{DateTime, Utc};
use maud::{Markup, html};

use super::{age, layout, spark, time};
use crate::console::history::{Sample, rates};
use crate::console::viewer::Viewer;
use crate::store::ConsumerStats;

/// One consumer of the overview.
pub struct ConsumerRow<'a> {
    pub stats: &'a ConsumerStats,
    pub oldest_s: Option<f64>,
    pub streams: u32,
    pub sink: &'a str,
    /// How the sink stands on this process ("connected", "disconnected", "suspended").
    pub sink_state: Option<&'static str>,
    pub samples: Vec<Sample>,
    /// Acks this process counted in the last hour (since it started, if later).
    pub acked: u64,
}

pub struct Relay {
    pub unrelayed: i64,
    pub oldest_unrelayed_s: Option<f64>,
    pub last_seq: i64,
}

pub fn overview(viewer: &Viewer, live: Markup) -> Markup {
    layout(
        Some(viewer),
        "Overview",
        html! {
            h1 { "Overview" }
            div #overview-live data-refresh="/fragments/overview" data-every="10" { (live) }
        },
    )
}

pub fn overview_live(rows: &[ConsumerRow<'_>], relay: &Relay, alerts: &[String], at: DateTime<Utc>) -> Markup {
    html! {
        section #alerts {
            h2 { "Alert conditions now" }
            ul.alerts {
                @for a in alerts { li.alert { (a) } }
                @if alerts.is_empty() { li.no-alert.ok { "None." } }
            }
        }
        section #relay {
            h2 { "Relay" }
            div.cards {
                div.card { div.label { "Unrelayed messages" } div.value.unrelayed { (relay.unrelayed) } }
                div.card { div.label { "Oldest unrelayed" } div.value.oldest-unrelayed { (age(relay.oldest_unrelayed_s)) } }
                div.card { div.label { "Last committed seq" } div.value.last-seq { (relay.last_seq) } }
            }
        }
        section #consumers-section {
            h2 { "Consumers" }
            table #consumers {
                thead { tr {
                    th { "Consumer" } th.num { "Backlog" } th.num { "Oldest unacked" } th.num { "In flight" }
                    th.num { "Dead" }
                    th.num title="Acks of this process's streams and sinks in the last hour (since it started, if later)" { "Acked (1 h)" }
                    th { "Acked / min (1 h)" } th { "Dead / min (1 h)" } th { "Paused" }
                    th.num { "Streams here" } th.num { "Held keys" } th { "Sink" }
                } }
                tbody {
                    @for r in rows {
                        tr data-consumer=(r.stats.consumer) {
                            td { a.consumer-link href=(format!("/consumers/{}", r.stats.consumer)) { (r.stats.consumer) } }
                            td.num.backlog { (r.stats.backlog) }
                            td.num.oldest { (age(r.oldest_s)) }
                            td.num.in-flight { (r.stats.in_flight) }
                            td.num.dead { (r.stats.dead) }
                            td.num.acked { (r.acked) }
                            td.acked-rate { (spark(&rates(&r.samples, |s| s.acked_total), "acked")) }
                            td.dead-rate { (spark(&rates(&r.samples, |s| s.dead_lettered_total), "dead")) }
                            td.paused { @if r.stats.paused { "yes" } @else { "no" } }
                            td.num.streams { (r.streams) }
                            td.num.held { (r.stats.held_keys) }
                            td.sink { (r.sink) @if let Some(s) = r.sink_state { " · " span class=(format!("sink-state {s}")) { (s) } } }
                        }
                    }
                }
            }
            @if rows.is_empty() { p.muted { "No consumers yet." } }
            p.muted { "As of " (time(Some(at))) "; refreshed every 10 s while this tab is visible. Acks and rates are this process's streams' and sinks'." }
        }
    }
}

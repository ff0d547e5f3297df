//! The overview: every consumer's figures, the relay's, and the alerts they raise.
use std::sync::Arc;

use axum::extract::State as Ctx;

use super::{Page, html, store_refusal};
use crate::console::State;
use crate::console::viewer::{Refusal, Viewer};
use crate::console::views::{self};
use crate::grpc::auth::Need;

pub(super) async fn overview_live(state: &State, viewer: &Viewer) -> Result<maud::Markup, Refusal> {
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
                acked: crate::console::history::since_oldest(&samples, acked_now, |s| s.acked_total),
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
    snap: &crate::console::history::Snapshot,
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

pub(super) async fn overview(Ctx(state): Ctx<Arc<State>>, viewer: Viewer) -> Page {
    let live = overview_live(&state, &viewer).await?;
    Ok(html(views::overview(&viewer, live)))
}

pub(super) async fn overview_fragment(Ctx(state): Ctx<Arc<State>>, viewer: Viewer) -> Page {
    Ok(html(overview_live(&state, &viewer).await?))
}

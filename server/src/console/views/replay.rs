//! Replays: a dry run to confirm, a managed replay's progress, and the list of replays.
use maud::{Markup, html};
use outbox_proto::v1 as pb;

use super::{error_text, layout, time};
use crate::console::viewer::Viewer;
use crate::maintenance::replay::ReplayJob;

pub fn dry_run(viewer: &Viewer, consumer: &str, last_error: &str, r: &pb::ReplayResponse) -> Markup {
    layout(
        Some(viewer),
        "Replay: dry run",
        html! {
            h1 { "Replay dead letters of " code { (consumer) } }
            div #dry-run-result {
                p { "Dead letters whose last error is " (error_text(last_error)) ": " strong.selected { (r.selected) } " would be delivered again, with a fresh delivery count, bypassing the inbox." }
                @if r.beyond_retention > 0 {
                    p.warn.beyond { (r.beyond_retention) " of them are older than the retention: the consumer's inbox may no longer remember them, so they may take effect twice." }
                }
            }
            @if r.selected > 0 {
                form #replay-confirm method="post" action=(format!("/consumers/{consumer}/replay")) {
                    input type="hidden" name="csrf" value=(viewer.csrf);
                    input type="hidden" name="last_error" value=(last_error);
                    input type="hidden" name="dry_run" value="false";
                    label { "At most " input type="number" name="max_per_second" value="100" min="1" max="100000"; " per second " }
                    @if r.beyond_retention > 0 {
                        label { input type="checkbox" name="allow_beyond_retention" value="true"; " also those beyond the retention " }
                    }
                    button #replay-button .primary type="submit" { "Replay " (r.selected) }
                }
            }
            p { a href=(format!("/consumers/{consumer}")) { "Back to " (consumer) } }
        },
    )
}

pub fn job(viewer: &Viewer, j: &ReplayJob) -> Markup {
    layout(
        Some(viewer),
        "Replay",
        html! {
            h1 { "Replay " (j.id) " of " a href=(format!("/consumers/{}", j.consumer)) { code { (j.consumer) } } }
            div #job-live data-refresh=(format!("/fragments/replays/{}", j.id)) data-every="2" { (job_progress(j)) }
        },
    )
}

pub fn job_progress(j: &ReplayJob) -> Markup {
    html! {
        div #progress .progress {
            p { "Selected " strong.selected { (j.progress.selected) } ", replayed " strong.replayed { (j.progress.replayed) }
                " — " strong.state { (j.outcome.as_str()) } }
            @if let crate::maintenance::replay::JobOutcome::Failed(e) = &j.outcome { p.bad.error { (error_text(e)) } }
            p.muted { (selection(j)) " · at most " (j.rate) "/s · started by " span.principal { (j.principal) } " at " (time(Some(j.started_at)))
                @if let Some(t) = j.finished_at { " · finished " (time(Some(t))) } }
        }
    }
}

/// What a replay selected: its words, and the last error it selected by as every error text is
/// shown.
fn selection(j: &ReplayJob) -> Markup {
    html! {
        (j.selection)
        @if let Some(e) = &j.last_error { @if !j.selection.is_empty() { "; " } "last error " (error_text(e)) }
    }
}

pub fn replays(viewer: &Viewer, jobs: &[ReplayJob]) -> Markup {
    layout(
        Some(viewer),
        "Replays",
        html! {
            h1 { "Replays" }
            p.muted { "The replays this process ran since it started, newest first (dry runs are not listed). The audit log (" code { "outboxd::audit" } ") has every one." }
            table #replays {
                thead { tr { th { "#" } th { "Consumer" } th { "Selection" } th { "Started by" } th { "Started" } th.num { "Selected" } th.num { "Replayed" } th { "State" } } }
                tbody {
                    @for j in jobs {
                        tr data-replay=(j.id) {
                            td { a href=(format!("/replays/{}", j.id)) { (j.id) } }
                            td.consumer { (j.consumer) }
                            td.selection { (selection(j)) }
                            td.principal { (j.principal) }
                            td { (time(Some(j.started_at))) }
                            td.num.selected { (j.progress.selected) }
                            td.num.replayed { (j.progress.replayed) }
                            td.state { (j.outcome.as_str()) }
                        }
                    }
                }
            }
            @if jobs.is_empty() { p.muted { "None yet." } }
        },
    )
}

//! The console's HTML, written with maud (compile-time templates that escape every value).
//! Element ids and classes are a contract with the browser test (`tests/console/`).
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};
use outbox_proto::v1 as pb;
use tonic::{Code, Status};

use super::history::{Sample, rates};
use super::session::Viewer;
use crate::maintenance::replay::ReplayJob;
use crate::store::{ConsumerStats, DeadGroup, DeadLetter, MessageSummary, UnackedDelivery, UnackedKind};

pub fn layout(viewer: Option<&Viewer>, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if let Some(v) = viewer { meta name="csrf-token" content=(v.csrf); }
                title { (title) " · outboxd" }
                link rel="icon" type="image/svg+xml" href="/assets/favicon.svg";
                link rel="stylesheet" href="/assets/console.css";
                link rel="stylesheet" href="/assets/uplot-1.6.32.min.css";
                script src="/assets/uplot-1.6.32.iife.min.js" defer {}
                script src="/assets/console.js" defer {}
            }
            body {
                header {
                    span.brand { "outboxd" }
                    @if let Some(v) = viewer {
                        nav {
                            a #nav-overview href="/" { "Overview" }
                            a #nav-search href="/search" { "Search" }
                            a #nav-replays href="/replays" { "Replays" }
                        }
                        span.who {
                            span #principal { (v.caller.name) }
                            @if v.signed_in {
                                form #sign-out .inline method="post" action="/logout" {
                                    input type="hidden" name="csrf" value=(v.csrf);
                                    button type="submit" { "Sign out" }
                                }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

pub fn status_page(s: &Status) -> (StatusCode, Markup) {
    let code = match s.code() {
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::AlreadyExists => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let body = html! {
        h1 { (code.canonical_reason().unwrap_or("Error")) }
        p #error .bad { (s.message()) }
        p { a href="/" { "Back to the overview" } }
    };
    (code, layout(None, "Error", body))
}

/// What a refused change (`403`: no CSRF token of this session, or sent from another site)
/// shows: what happened, that nothing changed, and the way back to the page it came from.
pub fn refused_change(back: Option<&str>) -> Markup {
    let back = back.unwrap_or("/");
    layout(
        None,
        "Refused",
        html! {
            div.notice-page #refused {
                h1 { "Refused: nothing was changed" }
                p #error .bad { "This change did not carry this page's security token (CSRF), or came from another site." }
                p { "It happens when a page was left open while outboxd restarted, or while you signed out or in again: its forms no longer count. Go back to the page, which gets a fresh form, and try again." }
                p.actions {
                    a #back .button.primary href=(back) { "Back to the page" }
                    @if back != "/" { " " a.button href="/" { "Overview" } }
                }
            }
        },
    )
}

/// The sign-in page, whose form leads to `next` (a page of this console) once signed in.
pub fn login(error: Option<&str>, next: &str) -> Markup {
    layout(
        None,
        "Sign in",
        html! {
            div.login {
                h1 { "Sign in to outboxd" }
                p.muted { "With a token of the auth file (" code { "outboxctl auth new-token" } " makes one). The token is checked and not kept: this browser gets a cookie with a random session id, which opens this console only, until you sign out or the session expires." }
                @if let Some(e) = error { p #login-error .bad { (e) } }
                form method="post" action="/login" {
                    @if next != "/" { input type="hidden" name="next" value=(next); }
                    label for="token" { "Token" }
                    input #token type="password" name="token" autocomplete="current-password" required autofocus;
                    button #sign-in .primary type="submit" { "Sign in" }
                }
            }
        },
    )
}

pub fn time(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(|| "—".to_owned(), |t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
}

pub fn pb_time(t: Option<&prost_types::Timestamp>) -> String {
    time(t.and_then(|t| DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).unwrap_or(0))))
}

/// "4m 10s", "2h 5m", "—" for none.
pub fn age(seconds: Option<f64>) -> String {
    match seconds {
        None => "—".to_owned(),
        Some(s) if s < 1.0 => "<1s".to_owned(),
        Some(s) => {
            let s = s as u64;
            match s {
                0..60 => format!("{s}s"),
                60..3600 => format!("{}m {}s", s / 60, s % 60),
                3600..86400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
                _ => format!("{}d {}h", s / 86400, s % 86400 / 3600),
            }
        }
    }
}

/// A sparkline of per-minute counts, drawn on the server (no script needed); a dash until there
/// are two minutes to draw (three samples).
fn spark(values: &[u64], class: &str) -> Markup {
    if values.len() < 2 {
        return html! { span.dash title="no rate yet: one sample a minute, a line after three" { "—" } };
    }
    let (w, h) = (90.0, 18.0);
    let max = values.iter().copied().max().unwrap_or(0).max(1) as f64;
    let n = values.len().max(2) as f64 - 1.0;
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| format!("{:.1},{:.1}", i as f64 * w / n, h - 1.0 - (*v as f64 / max) * (h - 2.0)))
        .collect();
    let total: u64 = values.iter().sum();
    html! {
        svg.spark width="90" height="18" viewBox="0 0 90 18" role="img" aria-label=(format!("{total} in the last hour")) {
            title { (total) " in the last hour" }
            polyline class=(class) points=(points.join(" ")) {}
        }
    }
}

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

/// `s` percent-encoded for a path segment or a query value: all but RFC 3986's unreserved
/// characters (so that `console-demo` stays as it is, in the address bar too).
pub fn urlencode(s: &str) -> String {
    const RESERVED: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');
    percent_encoding::utf8_percent_encode(s, RESERVED).to_string()
}

/// An error text (a delivery's last error, the error a replay selected by) as every screen
/// shows it: as the consumer gave it, in one style, never quoted or escaped.
pub fn error_text(e: &str) -> Markup {
    html! { span.error-text { (e) } }
}

/// A message that says what an action did, on the page it leads back to.
pub fn notice(text: Option<&str>) -> Markup {
    html! { @if let Some(t) = text { p #notice .notice role="status" { (t) } } }
}

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

/// The most of a payload a page shows: indented JSON can be many times its input (deep
/// nesting), so only payloads up to this size are indented, and no form shows more than this.
pub const PAYLOAD_SHOWN: usize = 64 * 1024;

/// A payload as people read it: indented JSON when it is JSON (and small enough), else text
/// when it is UTF-8 without control characters, else hex; at most [`PAYLOAD_SHOWN`] bytes of
/// it, and what is left out is said.
pub fn shown_payload(p: &[u8]) -> (String, &'static str) {
    if p.len() <= PAYLOAD_SHOWN / 4
        && let Ok(text) = std::str::from_utf8(p)
        && serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
        && let Some(s) = indent_json(text, PAYLOAD_SHOWN)
    {
        return (s, "json");
    }
    let more = |shown: usize| {
        if shown < p.len() { format!("\n… {} more bytes not shown", p.len() - shown) } else { String::new() }
    };
    if let Ok(s) = std::str::from_utf8(p)
        && !s.chars().any(|c| c.is_control() && c != '\n' && c != '\t' && c != '\r')
    {
        let mut end = s.len().min(PAYLOAD_SHOWN);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        return (format!("{}{}", &s[..end], more(end)), "text");
    }
    let shown = p.len().min(PAYLOAD_SHOWN / 4);
    let mut out = String::new();
    for (i, chunk) in p[..shown].chunks(16).enumerate() {
        out.push_str(&format!("{:08x}  ", i * 16));
        for b in chunk {
            out.push_str(&format!("{b:02x} "));
        }
        out.push('\n');
    }
    out.push_str(&more(shown));
    (out, "hex")
}

/// `json` (valid JSON: checked before) indented by two spaces a level, as it was written: its
/// keys in their order (a map would sort them, or keep one of two keys of the same name), its
/// numbers and strings byte for byte. `None` once it grows past `max` bytes.
fn indent_json(json: &str, max: usize) -> Option<String> {
    fn line(out: &mut String, depth: usize) {
        out.push('\n');
        for _ in 0..depth {
            out.push_str("  ");
        }
    }
    let mut out = String::with_capacity(json.len() * 2);
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    let mut chars = json.chars().peekable();
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
        } else {
            match c {
                '"' => {
                    in_string = true;
                    out.push(c);
                }
                '{' | '[' => {
                    out.push(c);
                    while chars.peek().is_some_and(|c| c.is_ascii_whitespace()) {
                        chars.next();
                    }
                    // An empty object or array stays on its line.
                    match chars.next_if(|c| matches!(c, '}' | ']')) {
                        Some(close) => out.push(close),
                        None => {
                            depth += 1;
                            line(&mut out, depth);
                        }
                    }
                }
                '}' | ']' => {
                    depth = depth.saturating_sub(1);
                    line(&mut out, depth);
                    out.push(c);
                }
                ',' => {
                    out.push(c);
                    line(&mut out, depth);
                }
                ':' => out.push_str(": "),
                c if c.is_ascii_whitespace() => {}
                c => out.push(c),
            }
        }
        if out.len() > max {
            return None;
        }
    }
    Some(out)
}

/// The trace id of a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), when it is one.
pub fn trace_id(traceparent: &str) -> Option<&str> {
    let id = traceparent.split('-').nth(1)?;
    (id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// What a message's page shows besides the message: whether the payload may be read, the
/// tracing UI's link, and what the last action did.
pub struct MessageView<'a> {
    pub may_read: bool,
    pub trace_url: Option<&'a str>,
    pub done: Option<&'a str>,
}

pub fn message(viewer: &Viewer, m: &pb::Message, deliveries: &[pb::DeliveryState], v: &MessageView<'_>) -> Markup {
    let (may_read, trace_url) = (v.may_read, v.trace_url);
    let trace = m.headers.get("traceparent").and_then(|t| trace_id(t));
    layout(
        Some(viewer),
        "Message",
        html! {
            h1 { "Message " code { (m.message_id) } }
            (notice(v.done))
            table #meta {
                tr { th { "Topic" } td.topic { (m.topic) } }
                tr { th { "Type" } td.type { (m.r#type) } }
                tr { th { "Seq" } td { (m.seq) } }
                tr { th { "Ordering key" } td.mono { (m.ordering_key) } }
                tr { th { "Enqueued" } td { (pb_time(m.enqueued_at.as_ref())) } }
                tr { th { "Available" } td { (pb_time(m.available_at.as_ref())) } }
                tr { th { "Relayed" } td { (pb_time(m.relayed_at.as_ref())) } }
                @if let Some(id) = trace {
                    tr { th { "Trace" } td.mono #trace {
                        @if let Some(t) = trace_url {
                            a #trace-link href=(t.replace("{trace_id}", id)) rel="noreferrer noopener" target="_blank" { (id) }
                        } @else { (id) }
                    } }
                }
            }
            h2 { "Payload" }
            @if may_read {
                @let (text, kind) = shown_payload(&m.payload);
                p.muted { (m.payload.len()) " bytes, shown as " (kind) }
                pre #payload { (text) }
            } @else {
                p #payload-hidden .muted { "Hidden: your principal may not read topic " code { (m.topic) } " (it needs a " code { "tail:" } " permission that covers it)." }
            }
            h2 { "Headers" }
            table #headers {
                @for (k, v) in &m.headers { tr { th.mono { (k) } td.mono { (v) } } }
            }
            @if m.headers.is_empty() { p.muted { "None." } }
            h2 { "Deliveries" }
            table #timeline {
                thead { tr { th { "Consumer" } th { "State" } th.num { "Deliveries" } th { "Created" } th { "Last change" } th { "Acked" } th { "Dead" } th { "Due / lease until" } th { "Last error" } th {} } }
                tbody {
                    @for d in deliveries {
                        @let leased = d.state == pb::delivery_state::State::Leased as i32;
                        tr data-consumer=(d.consumer) {
                            td { a href=(format!("/consumers/{}", d.consumer)) { (d.consumer) } }
                            td.state { (pb::delivery_state::State::try_from(d.state).map_or("UNKNOWN", |s| s.as_str_name())) }
                            td.num.count { (d.delivery_count) }
                            td { (pb_time(d.created_at.as_ref())) }
                            td { (pb_time(d.updated_at.as_ref())) }
                            td { (pb_time(d.acked_at.as_ref())) }
                            td { (pb_time(d.dead_at.as_ref())) }
                            td { @if d.lease_expires_at.is_some() { (pb_time(d.lease_expires_at.as_ref())) } @else { (pb_time(d.available_at.as_ref())) } }
                            td.error { (error_text(&d.last_error)) }
                            td {
                                // A replay leaves a leased delivery alone: its stream has it.
                                @if !leased && viewer.may(crate::grpc::auth::Need::Replay(&d.consumer)) {
                                    form.replay-message.inline method="post" action=(format!("/messages/{}/replay", m.message_id)) {
                                        input type="hidden" name="csrf" value=(viewer.csrf);
                                        input type="hidden" name="consumer" value=(d.consumer);
                                        button.replay-message-button type="submit" { "Replay…" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            @if deliveries.is_empty() { p.muted { "No consumer has a delivery of it (yet)." } }
        },
    )
}

/// The confirmation of a replay of one message to one consumer, after its dry run.
pub fn message_replay(
    viewer: &Viewer,
    message_id: &str,
    consumer: &str,
    state: &str,
    r: &pb::ReplayResponse,
) -> Markup {
    layout(
        Some(viewer),
        "Replay a message",
        html! {
            h1 { "Replay message " a href=(format!("/messages/{message_id}")) { code { (message_id) } } " to " code { (consumer) } }
            div #replay-message-result .confirm {
                @if r.selected > 0 {
                    p { "Its delivery to " code { (consumer) } " (" span.state { (state) } ") is made due now with a fresh delivery count, bypassing the consumer's inbox: "
                        @if state == "ACKED" { strong { "the consumer has acked it, so it may take effect twice" } } @else { "it is delivered again" } "." }
                    @if r.beyond_retention > 0 {
                        p.warn.beyond { "It is older than the retention: the consumer's inbox may no longer remember it." }
                    }
                } @else {
                    p.selected-none { "Nothing to replay: " code { (consumer) } " has no delivery of it that a replay may take (one in flight is left to its stream)." }
                }
            }
            @if r.selected > 0 {
                form #replay-message-confirm method="post" action=(format!("/messages/{message_id}/replay")) {
                    input type="hidden" name="csrf" value=(viewer.csrf);
                    input type="hidden" name="consumer" value=(consumer);
                    input type="hidden" name="confirmed" value="true";
                    @if r.beyond_retention > 0 {
                        label { input type="checkbox" name="allow_beyond_retention" value="true"; " replay it although it is beyond the retention " }
                    }
                    button #replay-message-button .primary type="submit" { "Replay it" }
                    " "
                    a #cancel .button href=(format!("/messages/{message_id}")) { "Cancel" }
                }
            } @else {
                p { a href=(format!("/messages/{message_id}")) { "Back to the message" } }
            }
        },
    )
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

/// The search form's values, as given (shown back in the form, and in the next page's link).
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize)]
pub struct SearchForm {
    #[serde(default)]
    pub message_id: String,
    #[serde(default)]
    pub topic: String,
    #[serde(default, rename = "type")]
    pub type_: String,
    #[serde(default)]
    pub ordering_key: String,
    #[serde(default)]
    pub after: String,
    #[serde(default)]
    pub before: String,
    #[serde(default)]
    pub cursor: String,
}

pub fn search(
    viewer: &Viewer,
    form: &SearchForm,
    results: Option<(&[MessageSummary], i64, Option<String>)>,
    error: Option<&str>,
) -> Markup {
    layout(
        Some(viewer),
        "Search",
        html! {
            h1 { "Search messages" }
            form #search .search method="get" action="/search" {
                label { "Message id" input name="message_id" value=(form.message_id) size="38"; }
                label { "Topic or pattern" input name="topic" value=(form.topic) placeholder="orders.* or orders.>"; }
                label { "Type" input name="type" value=(form.type_); }
                label { "Ordering key" input name="ordering_key" value=(form.ordering_key); }
                label { "Enqueued from (UTC)" input name="after" value=(form.after) placeholder="2026-12-05T10:00"; }
                label { "Enqueued before (UTC)" input name="before" value=(form.before) placeholder="2026-12-05T11:00"; }
                button.primary type="submit" { "Search" }
            }
            @if let Some(e) = error { p #search-error .bad { (e) } }
            @if let Some((rows, scanned, next)) = results {
                table #results {
                    thead { tr { th { "Message" } th { "Seq" } th { "Topic" } th { "Type" } th { "Ordering key" } th { "Enqueued" } } }
                    tbody {
                        @for m in rows {
                            tr data-message-id=(m.message_id) {
                                td { a href=(format!("/messages/{}", m.message_id)) { code { (m.message_id) } } }
                                td.num { (m.seq) }
                                td { (m.topic) }
                                td { (m.type_) }
                                td.mono { (m.ordering_key.as_deref().unwrap_or("")) }
                                td { (time(Some(m.enqueued_at))) }
                            }
                        }
                    }
                }
                p.muted.pager { (rows.len()) " found among the " (scanned) " newest messages below the cursor. "
                    @if let Some(n) = next { a #next href=(n) { "Older →" } } @else { "No older messages." } }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_id_is_taken_only_from_a_well_formed_traceparent() {
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        assert_eq!(trace_id(&format!("00-{id}-00f067aa0ba902b7-01")), Some(id));
        assert_eq!(trace_id("00-\"><script>-00f067aa0ba902b7-01"), None);
        assert_eq!(trace_id("garbage"), None);
    }

    #[test]
    fn payloads_show_as_json_text_or_hex() {
        assert_eq!(shown_payload(br#"{"a":1}"#), ("{\n  \"a\": 1\n}".to_owned(), "json"));
        // As written: keys in their order, numbers and escapes as they are, empty ones inline.
        let (shown, kind) =
            shown_payload(br#" {"zeta": 1, "alpha":[2.50, 1e3, {}, []], "m":"a\"b,:{[", "dup":1,"dup":2} "#);
        assert_eq!(kind, "json");
        assert_eq!(
            shown,
            "{\n  \"zeta\": 1,\n  \"alpha\": [\n    2.50,\n    1e3,\n    {},\n    []\n  ],\n  \"m\": \"a\\\"b,:{[\",\n  \"dup\": 1,\n  \"dup\": 2\n}"
        );
        assert_eq!(shown_payload(b"[]").0, "[]");
        assert_eq!(shown_payload(br#""\u00e9""#).0, r#""\u00e9""#, "an escape is not rewritten");
        assert_eq!(shown_payload(b"{\"a\":").1, "text", "not JSON: shown as text");
        assert_eq!(shown_payload(b"plain text").1, "text");
        let (hex, kind) = shown_payload(&[0, 1, 0xff]);
        assert_eq!((hex.as_str(), kind), ("00000000  00 01 ff \n", "hex"));
        // A nesting bomb is not indented, and no form shows more than the cap.
        let bomb = format!("{}0{}", "[".repeat(100), "]".repeat(100)).repeat(200);
        let (shown, kind) = shown_payload(format!("[{}]", bomb.replace("][", "],[")).as_bytes());
        assert!(kind == "text" && shown.len() <= PAYLOAD_SHOWN + 64, "{kind} {}", shown.len());
        let big = vec![b'x'; 1 << 20];
        let (shown, _) = shown_payload(&big);
        assert!(shown.len() <= PAYLOAD_SHOWN + 64 && shown.ends_with("983040 more bytes not shown"), "{}", shown.len());
        let (shown, _) = shown_payload(&vec![0u8; 1 << 20]);
        assert!(shown.len() < PAYLOAD_SHOWN * 4 && shown.ends_with("1032192 more bytes not shown"));
    }
}

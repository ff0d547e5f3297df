//! The console's HTML, written with maud (compile-time templates that escape every value).
//! Element ids and classes are a contract with the browser test (`tests/console/`).
//! One file per page or group of pages; the frame of every page and the formats they share
//! are here.
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};
use tonic::{Code, Status};

use super::viewer::Viewer;

mod consumer;
mod message;
mod overview;
mod replay;

pub use consumer::{ConsumerPage, consumer, consumer_stats, dead_list, deliveries, skip_key};
pub use message::{MessageView, SearchForm, message, message_replay, search};
pub use overview::{ConsumerRow, Relay, overview, overview_live};
pub use replay::{dry_run, job, job_progress, replays};

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

/// An error text (a delivery's last error, the error a replay selected by) as every screen
/// shows it: as the consumer gave it, in one style, never quoted or escaped.
pub fn error_text(e: &str) -> Markup {
    html! { span.error-text { (e) } }
}

/// A message that says what an action did, on the page it leads back to.
pub fn notice(text: Option<&str>) -> Markup {
    html! { @if let Some(t) = text { p #notice .notice role="status" { (t) } } }
}

//! A message's page (its payload as people read it, its deliveries, a replay of it to one
//! consumer) and the search for messages.
use maud::{Markup, html};
use outbox_proto::v1 as pb;

use super::{error_text, layout, notice, pb_time, time};
use crate::console::viewer::Viewer;
use crate::store::MessageSummary;

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

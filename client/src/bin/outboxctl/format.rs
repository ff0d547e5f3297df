//! Times, durations and payloads as outboxctl prints them, in tables and in JSON.
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

pub(crate) fn pb_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

pub(crate) fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: t.timestamp(), nanos: t.timestamp_subsec_nanos() as i32 }
}

pub(crate) fn fmt_duration(d: Option<&prost_types::Duration>) -> String {
    match d {
        Some(d) if d.seconds > 0 || d.nanos > 0 => {
            let ms = d.seconds as u64 * 1000 + (d.nanos as u64) / 1_000_000;
            humantime::format_duration(Duration::from_millis(ms)).to_string()
        }
        _ => "-".to_owned(),
    }
}

pub(crate) fn secs(d: Option<&prost_types::Duration>) -> Value {
    d.map_or(Value::Null, |d| json!(d.seconds as f64 + f64::from(d.nanos) / 1e9))
}

pub(crate) fn fmt_time(t: Option<&prost_types::Timestamp>) -> String {
    t.and_then(|t| DateTime::from_timestamp(t.seconds, t.nanos as u32))
        .map_or_else(|| "-".to_owned(), |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

pub(crate) fn time_json(t: Option<&prost_types::Timestamp>) -> Value {
    match t {
        Some(_) => json!(fmt_time(t)),
        None => Value::Null,
    }
}

/// `n deliveries`, or `1 delivery`.
pub(crate) fn deliveries(n: i64) -> String {
    if n == 1 { "1 delivery".to_owned() } else { format!("{n} deliveries") }
}

pub(crate) fn payload_text(p: &[u8]) -> String {
    match std::str::from_utf8(p) {
        Ok(s) => s.to_owned(),
        Err(_) => format!("<{} bytes of binary>", p.len()),
    }
}

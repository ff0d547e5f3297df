//! `outboxctl stats`: the figures per consumer, the relay's and the database's.

use comfy_table::Table;
use outbox_proto::v1 as pb;
use serde_json::{Value, json};

use crate::Output;
use crate::format::{fmt_duration, fmt_time, secs, time_json};

pub(crate) fn print_stats(out: Output, s: &pb::GetStatsResponse) {
    if out == Output::Json {
        let consumers: Vec<Value> = s
            .consumers
            .iter()
            .map(|c| {
                json!({
                    "consumer": c.consumer,
                    "backlog": c.backlog,
                    "in_flight": c.in_flight,
                    "retrying": c.retrying,
                    "dead": c.dead,
                    "acked": c.acked,
                    "oldest_unacked_age_s": secs(c.oldest_unacked_age.as_ref()),
                    "paused": c.paused,
                    "streams": c.streams,
                    "sink": c.sink,
                    "held_keys": c.held_keys,
                })
            })
            .collect();
        println!(
            "{}",
            json!({
                "unrelayed": s.unrelayed,
                "oldest_unrelayed_age_s": secs(s.oldest_unrelayed_age.as_ref()),
                "consumers": consumers,
                "tables": s.tables.iter().map(|t| json!({
                    "table": t.table,
                    "live_rows": t.live_rows,
                    "dead_rows": t.dead_rows,
                    "bytes": t.bytes,
                    "last_vacuum": time_json(t.last_vacuum.as_ref()),
                })).collect::<Vec<_>>(),
                "vacuum_horizon": s.vacuum_horizon.as_ref().map(|h| json!({
                    "kind": h.kind,
                    "age_s": secs(h.age.as_ref()),
                    "xmin_age": h.xmin_age,
                    "pid": h.pid,
                    "application_name": h.application_name,
                    "state": h.state,
                    "name": h.name,
                })),
            })
        );
        return;
    }
    println!("unrelayed: {}   oldest unrelayed: {}", s.unrelayed, fmt_duration(s.oldest_unrelayed_age.as_ref()));
    let mut t = Table::new();
    t.load_style(comfy_table::presets::NOTHING);
    t.set_header([
        "CONSUMER",
        "BACKLOG",
        "IN FLIGHT",
        "RETRYING",
        "DEAD",
        "OLDEST UNACKED",
        "ACKED",
        "STREAMS",
        "PAUSED",
        "HELD KEYS",
        "SINK",
    ]);
    for c in &s.consumers {
        t.add_row([
            c.consumer.clone(),
            c.backlog.to_string(),
            c.in_flight.to_string(),
            c.retrying.to_string(),
            c.dead.to_string(),
            fmt_duration(c.oldest_unacked_age.as_ref()),
            c.acked.to_string(),
            c.streams.to_string(),
            c.paused.to_string(),
            c.held_keys.to_string(),
            c.sink.clone(),
        ]);
    }
    println!("{t}");
    if !s.tables.is_empty() {
        let mut t = Table::new();
        t.load_style(comfy_table::presets::NOTHING);
        t.set_header(["TABLE", "LIVE ROWS", "DEAD ROWS", "SIZE", "LAST VACUUM"]);
        for x in &s.tables {
            t.add_row([
                x.table.clone(),
                x.live_rows.to_string(),
                x.dead_rows.to_string(),
                format!("{:.1} MiB", x.bytes as f64 / (1024.0 * 1024.0)),
                fmt_time(x.last_vacuum.as_ref()),
            ]);
        }
        println!();
        println!("{t}");
    }
    if let Some(h) = &s.vacuum_horizon {
        println!();
        println!("vacuum held back by: {}", horizon_line(h));
    }
}

/// Who holds back vacuum, in one line: what it is, for how long, how far behind.
pub(crate) fn horizon_line(h: &pb::VacuumHorizon) -> String {
    let who = match h.kind.as_str() {
        "transaction" if h.application_name.is_empty() => format!("transaction of pid {}", h.pid),
        "transaction" => format!("transaction of pid {} ({})", h.pid, h.application_name),
        "replication_slot" => format!("replication slot {:?}", h.name),
        "prepared_transaction" => format!("prepared transaction {:?}", h.name),
        other => other.to_owned(),
    };
    let state = if h.state.is_empty() { String::new() } else { format!(", {}", h.state) };
    let held = if h.age.is_some() { format!(" for {}", fmt_duration(h.age.as_ref())) } else { String::new() };
    format!("{who}{state}{held}, {} transactions behind", h.xmin_age)
}

//! The report: every figure with the parameters it was measured under, as a table or JSON.

use crate::latency::{Latency, Quantiles, QuietLatency};
use crate::{KEYED_KEYS, KEYED_MAX_IN_FLIGHT, KEYED_STREAMS, Params};
use anyhow::Result;
use serde::{Serialize, Serializer};

pub(crate) fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Figures keyed by consumer count, in the order measured.
#[derive(Debug, Clone, Default)]
pub(crate) struct ByConsumers(pub(crate) Vec<(u32, f64)>);

impl Serialize for ByConsumers {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k.to_string(), v)))
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct Rss {
    pub(crate) start: u64,
    pub(crate) end: u64,
}

/// Figures that explain the headline ones.
#[derive(Debug, Serialize)]
pub(crate) struct Details {
    pub(crate) enqueue_unrelayed_at_end: i64,
    pub(crate) end_to_end_committed_per_s: f64,
    pub(crate) end_to_end_backlog_at_end: u64,
    pub(crate) drain_s: f64,
    pub(crate) drain_relayed_s: f64,
    pub(crate) fanout_messages_per_s: ByConsumers,
    pub(crate) fanout_s: ByConsumers,
    pub(crate) fanout_relayed_s: ByConsumers,
    pub(crate) redeliveries: u64,
}

#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) params: Params,
    pub(crate) ceiling_per_s: f64,
    pub(crate) enqueue_per_s: f64,
    pub(crate) end_to_end_per_s: f64,
    pub(crate) ratio_to_ceiling: f64,
    pub(crate) latency_ms: Latency,
    pub(crate) drain_per_s: f64,
    pub(crate) fanout_per_s: ByConsumers,
    pub(crate) idle_queries_per_s: f64,
    pub(crate) outboxd_rss_kib: Rss,
    pub(crate) details: Details,
    /// Commit → delivery with producers paced to `--latency-rate`.
    pub(crate) latency_fixed_ms: Latency,
    pub(crate) sql_function_end_to_end_per_s: f64,
    pub(crate) sql_function_ratio_to_ceiling: f64,
    /// `outbox.enqueue` over a plain INSERT into the same table, no outboxd running.
    pub(crate) enqueue_function_vs_insert: f64,
    pub(crate) enqueue_function_per_s: f64,
    pub(crate) outbox_insert_per_s: f64,
    /// Drain time with k consumers over the time with one.
    pub(crate) fanout_time_ratio: ByConsumers,
    /// Keyed backlog drain rate by depth per key, from the streams attaching to the last ack.
    pub(crate) keyed_drain_per_s: ByDepth,
    /// The same from the first ack to the last.
    pub(crate) keyed_drain_acking_per_s: ByDepth,
    /// Commit → delivery of single messages from the SQL function, each after a quiet spell.
    pub(crate) latency_after_quiet_ms: QuietLatency,
    /// The JetStream reference phase (`None`, null in the JSON, with `--no-jetstream`):
    /// deliveries per second of the same fan-out to k durable pull consumers.
    pub(crate) jetstream_fanout_per_s: Option<ByConsumers>,
    /// `fanout_per_s` over `jetstream_fanout_per_s`, for each k.
    pub(crate) fanout_vs_jetstream: Option<ByConsumers>,
    /// Messages per second of the same drain by one durable pull consumer.
    pub(crate) jetstream_drain_per_s: Option<f64>,
    /// `drain_per_s` over `jetstream_drain_per_s`.
    pub(crate) drain_vs_jetstream: Option<f64>,
    /// WAL bytes the server wrote during each fan-out round (its backlog's commit included),
    /// over the round's messages.
    pub(crate) wal_bytes_per_message: ByConsumers,
}

/// Figures keyed by depth per key.
#[derive(Debug, Clone, Default)]
pub(crate) struct ByDepth(pub(crate) Vec<(u64, f64)>);

impl Serialize for ByDepth {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k.to_string(), v)))
    }
}

/// `12345.6` → `12,346`.
pub(crate) fn grouped(x: f64) -> String {
    let digits = format!("{:.0}", x.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub(crate) fn quantiles_text(q: &Quantiles) -> String {
    format!("p50 {:.1} / p90 {:.1} / p99 {:.1} / max {:.1} ms", q.p50, q.p90, q.p99, q.max)
}

pub(crate) fn print_table(r: &Report) {
    let p = &r.params;
    let d = &r.details;
    let producers = format!("{} producers, {} s", p.producers, p.seconds);
    let mut rows: Vec<[String; 3]> = vec![
        [
            "ceiling".into(),
            format!("{} rows/s", grouped(r.ceiling_per_s)),
            format!("{producers}; 1 INSERT per autocommit transaction, plain table, no outboxd"),
        ],
        [
            "enqueue".into(),
            format!("{} msg/s", grouped(r.enqueue_per_s)),
            format!(
                "{producers}; enqueue + COMMIT per message; 1 consumer, no stream; {} unrelayed at end",
                grouped(d.enqueue_unrelayed_at_end as f64)
            ),
        ],
        [
            "end_to_end".into(),
            format!("{} msg/s acked", grouped(r.end_to_end_per_s)),
            format!(
                "{producers}; {} streams x max_in_flight {}; {:.2} of ceiling; committed {} msg/s, {} behind at end",
                p.streams,
                p.end_to_end_max_in_flight,
                r.ratio_to_ceiling,
                grouped(d.end_to_end_committed_per_s),
                grouped(d.end_to_end_backlog_at_end as f64)
            ),
        ],
        [
            "latency".into(),
            format!("commit->delivery {}", quantiles_text(&r.latency_ms.delivery)),
            format!(
                "offered {} msg/s (half of end_to_end), achieved {}; {producers}; {} streams; {} samples",
                grouped(r.latency_ms.offered_per_s),
                grouped(r.latency_ms.achieved_per_s),
                p.streams,
                r.latency_ms.samples
            ),
        ],
        ["".into(), format!("commit->ack      {}", quantiles_text(&r.latency_ms.ack)), "".into()],
        [
            "latency after quiet".into(),
            format!("commit->delivery {}", quantiles_text(&r.latency_after_quiet_ms.delivery)),
            format!(
                "one message at a time from outbox.enqueue, each {:.1} s after the last; {} samples",
                r.latency_after_quiet_ms.gap_s, r.latency_after_quiet_ms.samples
            ),
        ],
        [
            "drain".into(),
            format!("{} msg/s", grouped(r.drain_per_s)),
            format!(
                "{} committed messages, 1 consumer, {} streams x max_in_flight {}; {:.1} s, relayed after {:.1} s",
                grouped(p.drain_messages as f64),
                p.streams,
                p.drain_max_in_flight,
                d.drain_s,
                d.drain_relayed_s
            ),
        ],
    ];
    for (k, per_s) in &r.fanout_per_s.0 {
        let find = |v: &ByConsumers| v.0.iter().find(|(c, _)| c == k).map_or(0.0, |(_, x)| *x);
        rows.push([
            format!("fanout x{k}"),
            format!("{} deliveries/s", grouped(*per_s)),
            format!(
                "{} messages to {k} consumer{}, {} streams each x max_in_flight {}; {} msg/s; {:.1} s, relayed after {:.1} s",
                grouped(p.fanout_messages as f64),
                if *k == 1 { "" } else { "s" },
                p.fanout_streams_per_consumer,
                p.drain_max_in_flight,
                grouped(find(&d.fanout_messages_per_s)),
                find(&d.fanout_s),
                find(&d.fanout_relayed_s)
            ),
        ]);
    }
    rows.push([
        "WAL per message".into(),
        r.wal_bytes_per_message
            .0
            .iter()
            .map(|(k, v)| format!("x{k}: {} B", grouped(*v)))
            .collect::<Vec<_>>()
            .join(", "),
        "pg_wal_lsn_diff around each fanout round (backlog commit, relay, leases, acks) / its messages".into(),
    ]);
    match (&r.jetstream_drain_per_s, &r.drain_vs_jetstream, &r.jetstream_fanout_per_s, &r.fanout_vs_jetstream) {
        (Some(drain), Some(drain_ratio), Some(fanout), Some(fanout_ratio)) => {
            rows.push([
                "jetstream drain".into(),
                format!("{} msg/s", grouped(*drain)),
                format!(
                    "same backlog published to a file stream first; 1 durable pull consumer, {} fetch loops, \
                     explicit acks; outboxd's drain {drain_ratio:.2} x this",
                    p.streams
                ),
            ]);
            for (k, per_s) in &fanout.0 {
                let ratio = fanout_ratio.0.iter().find(|(c, _)| c == k).map_or(0.0, |(_, x)| *x);
                rows.push([
                    format!("jetstream fanout x{k}"),
                    format!("{} deliveries/s", grouped(*per_s)),
                    format!(
                        "{} messages to {k} durable pull consumer{}, {} fetch loops each; outboxd's fanout {ratio:.2} x this",
                        grouped(p.fanout_messages as f64),
                        if *k == 1 { "" } else { "s" },
                        p.fanout_streams_per_consumer
                    ),
                ]);
            }
        }
        _ => rows.push(["jetstream".into(), "skipped".into(), "--no-jetstream".into()]),
    }
    rows.push([
        "latency fixed".into(),
        format!("commit->delivery {}", quantiles_text(&r.latency_fixed_ms.delivery)),
        format!(
            "offered {} msg/s (--latency-rate), achieved {}; {} samples",
            grouped(r.latency_fixed_ms.offered_per_s),
            grouped(r.latency_fixed_ms.achieved_per_s),
            r.latency_fixed_ms.samples
        ),
    ]);
    rows.push([
        "sql function".into(),
        format!("{} msg/s acked", grouped(r.sql_function_end_to_end_per_s)),
        format!(
            "producers calling SELECT outbox.enqueue(...); {:.2} of ceiling; {} streams",
            r.sql_function_ratio_to_ceiling, p.streams
        ),
    ]);
    rows.push([
        "enqueue fn".into(),
        format!("{:.2} x plain INSERT", r.enqueue_function_vs_insert),
        format!(
            "outbox.enqueue {} vs INSERT INTO outbox.messages {} per s, no outboxd",
            grouped(r.enqueue_function_per_s),
            grouped(r.outbox_insert_per_s)
        ),
    ]);
    rows.push([
        "fanout time".into(),
        r.fanout_time_ratio.0.iter().map(|(k, v)| format!("x{k}: {v:.2}")).collect::<Vec<_>>().join(", "),
        "drain time with k consumers over the time with one".into(),
    ]);
    rows.push([
        "keyed drain".into(),
        r.keyed_drain_per_s
            .0
            .iter()
            .zip(&r.keyed_drain_acking_per_s.0)
            .map(|((k, v), (_, a))| format!("{k} deep: {} msg/s ({} first to last ack)", grouped(*v), grouped(*a)))
            .collect::<Vec<_>>()
            .join(", "),
        format!("{KEYED_KEYS} ordering keys, {KEYED_STREAMS} streams x max_in_flight {KEYED_MAX_IN_FLIGHT}"),
    ]);
    rows.push([
        "idle".into(),
        format!("{:.1} queries/s", r.idle_queries_per_s),
        format!("1 idle stream, {} s, xact_commit + xact_rollback", p.idle_seconds),
    ]);
    rows.push([
        "outboxd RSS".into(),
        format!("{} -> {} KiB", grouped(r.outboxd_rss_kib.start as f64), grouped(r.outboxd_rss_kib.end as f64)),
        "start -> end of the run".into(),
    ]);

    println!(
        "outbox-bench: PostgreSQL {}, {} cores, payload {} B{}; outboxd {}",
        p.postgres,
        p.cores,
        p.payload_bytes,
        if p.quick { ", quick" } else { "" },
        p.outboxd_flags
    );
    if d.redeliveries > 0 {
        println!("note: {} redeliveries were acked besides the counted first deliveries", d.redeliveries);
    }
    let w0 = rows.iter().map(|r| r[0].len()).max().unwrap_or(0);
    let w1 = rows.iter().map(|r| r[1].len()).max().unwrap_or(0);
    println!();
    println!("{:w0$}  {:w1$}  parameters", "phase", "result");
    for [phase, result, params] in &rows {
        println!("{phase:w0$}  {result:w1$}  {params}");
    }
}

//! Drain phases: a backlog drained by streams, its fan-out to 1, 4 and 16 consumers, and one
//! under a few ordering keys.
use std::time::Duration;

use crate::consumers::Streams;
use crate::database::{insert_committed, time_until_relayed, wal_bytes_since, wal_lsn};
use crate::report::{ByConsumers, round};
use crate::{
    Bench, DRAIN_MAX_IN_FLIGHT, FANOUT_CONSUMERS, FANOUT_STREAMS_PER_CONSUMER, KEYED_DEPTHS, KEYED_KEYS,
    KEYED_MAX_IN_FLIGHT, KEYED_STREAMS, STREAMS, budget, per_second,
};
use anyhow::Result;
use outbox_client::grpc::AdminClient;
use outbox_proto::v1 as pb;
use outbox_tests::{consumer, create_consumer};
use tokio::time::Instant;

/// A committed backlog delivered to every consumer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Drained {
    pub(crate) messages: u64,
    pub(crate) deliveries: u64,
    /// From the streams attaching to the last ack.
    pub(crate) elapsed: Duration,
    /// From the streams attaching until the relay had fanned everything out (to 100 ms).
    pub(crate) relayed: Duration,
    /// From the first ack to the last: `elapsed` without the streams' start-up and the wait
    /// for the first delivery.
    pub(crate) acking: Duration,
    pub(crate) redelivered: u64,
}

/// Commits `n` messages on `topic` with no stream attached, then times `consumers` (with
/// `per_consumer` streams each) from attaching until every delivery is acked.
pub(crate) async fn drain_backlog(
    b: &Bench,
    admin: &mut AdminClient,
    endpoint: &str,
    topic: &str,
    consumers: &[String],
    n: u64,
    per_consumer: u32,
) -> Result<Drained> {
    drain_backlog_of(b, admin, endpoint, topic, consumers, (n, 0), per_consumer, DRAIN_MAX_IN_FLIGHT).await
}

/// [`drain_backlog`] of `(messages, ordering keys)` with streams of `max_in_flight`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn drain_backlog_of(
    b: &Bench,
    admin: &mut AdminClient,
    endpoint: &str,
    topic: &str,
    consumers: &[String],
    (n, keys): (u64, u64),
    per_consumer: u32,
    max_in_flight: u32,
) -> Result<Drained> {
    for name in consumers {
        create_consumer(admin, consumer(name, &[topic])).await?;
    }
    tracing::info!(topic, messages = n, keys, "loading the backlog");
    insert_committed(&b.db, topic, n, keys, &b.payload).await?;
    let deliveries = n * consumers.len() as u64;
    let within = budget(deliveries);
    let start = Instant::now();
    let mut streams = Streams::attach(endpoint, consumers, per_consumer, max_in_flight, false).await?;
    let what = format!("{deliveries} deliveries of {topic}");
    let (relayed, acked) =
        tokio::join!(time_until_relayed(&b.db, start, within), streams.wait_acked(deliveries, within, &what));
    acked?;
    let relayed = relayed?;
    let elapsed = streams.progress.last_ack().saturating_duration_since(start);
    let acking = streams.progress.acking();
    let redelivered = streams.progress.redelivered();
    streams.stop().await?;
    Ok(Drained { messages: n, deliveries, elapsed, relayed, acking, redelivered })
}

/// Phase 5: one consumer, `STREAMS` streams.
pub(crate) async fn drain(b: &Bench, admin: &mut AdminClient, endpoint: &str) -> Result<Drained> {
    drain_backlog(b, admin, endpoint, "bench.drain", &["bench-drain".to_owned()], b.params.drain_messages, STREAMS)
        .await
}

/// Phase 6: the same with several consumers on one topic (a topic per round, so rounds do not
/// feed each other). Also returns, by consumer count, the WAL each round wrote per message: the
/// server's WAL position before the round (before its consumers are created and its backlog is
/// committed) and after it (once outboxd counts every delivery of the round acked), over the
/// round's messages.
pub(crate) async fn fanout(
    b: &Bench,
    admin: &mut AdminClient,
    endpoint: &str,
) -> Result<(Vec<(u32, Drained)>, ByConsumers)> {
    let mut out = Vec::new();
    let mut wal = ByConsumers::default();
    for k in FANOUT_CONSUMERS {
        let topic = format!("bench.fanout.c{k}");
        let names: Vec<String> = (1..=k).map(|i| format!("bench-fanout-c{k}-{i}")).collect();
        let n = b.params.fanout_messages;
        let lsn = wal_lsn(&b.db).await?;
        let d = drain_backlog(b, admin, endpoint, &topic, &names, n, FANOUT_STREAMS_PER_CONSUMER).await?;
        settle(admin, &names).await?;
        let bytes = wal_bytes_since(&b.db, &lsn).await?;
        tracing::info!(
            consumers = k,
            deliveries_per_s = per_second(d.deliveries, d.elapsed),
            wal_bytes = bytes,
            "fanout round done"
        );
        out.push((k, d));
        wal.0.push((k, round(bytes as f64 / n.max(1) as f64, 1)));
    }
    Ok((out, wal))
}

/// Waits, for at most 10 s, until outboxd counts no delivery of the consumers `names` pending or
/// in flight: the bench counts an ack when it sends it, and outboxd writes the last acks after
/// that. (A warning, not an error, if it does not: only the WAL figure depends on it.)
pub(crate) async fn settle(admin: &mut AdminClient, names: &[String]) -> Result<()> {
    let by = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = admin.get_stats(pb::GetStatsRequest { consumer: String::new() }).await?.into_inner();
        let left: i64 =
            stats.consumers.iter().filter(|c| names.contains(&c.consumer)).map(|c| c.backlog + c.in_flight).sum();
        if left == 0 {
            return Ok(());
        }
        if Instant::now() >= by {
            tracing::warn!(left, "deliveries not acked 10 s after a fan-out round: its WAL figure misses their acks");
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Phase 8: a backlog under `KEYED_KEYS` ordering keys, drained by `KEYED_STREAMS` streams, at
/// each depth per key: the rate must not depend on the depth. Returns, per depth, the rate from
/// the streams attaching to the last ack, and the rate from the first ack to the last (the
/// drain itself: at 100 deep the whole round lasts a second or two, so the streams' start-up
/// weighs on the first).
pub(crate) async fn keyed_drain(b: &Bench, admin: &mut AdminClient, endpoint: &str) -> Result<Vec<(u64, f64, f64)>> {
    let mut out = Vec::new();
    for depth in KEYED_DEPTHS {
        let topic = format!("bench.keyed.d{depth}");
        let name = format!("bench-keyed-d{depth}");
        let n = depth * KEYED_KEYS;
        let d = drain_backlog_of(
            b,
            admin,
            endpoint,
            &topic,
            std::slice::from_ref(&name),
            (n, KEYED_KEYS),
            KEYED_STREAMS,
            KEYED_MAX_IN_FLIGHT,
        )
        .await?;
        let rate = per_second(d.messages, d.elapsed);
        let acking = per_second(d.messages, d.acking);
        tracing::info!(depth, rate, acking, "keyed drain done");
        out.push((depth, round(rate, 1), round(acking, 1)));
    }
    Ok(out)
}

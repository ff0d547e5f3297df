//! Latency phases: commit → delivery and → ack at a paced rate, and after a quiet gap.
use std::collections::HashMap;
use std::time::Duration;

use crate::producers::Work;
use crate::report::round;
use crate::throughput::flow;
use crate::{Bench, QUIET_GAP, QUIET_SAMPLES, per_second};
use anyhow::{Result, ensure};
use outbox_client::grpc::AdminClient;
use outbox_tests::{RawStream, consumer, create_consumer};
use serde::Serialize;
use tokio::time::Instant;
use uuid::Uuid;

/// Nearest-rank percentiles, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Quantiles {
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
}

impl Quantiles {
    pub(crate) fn of(mut samples: Vec<Duration>) -> Result<Self> {
        ensure!(!samples.is_empty(), "no latency samples");
        samples.sort_unstable();
        let at = |p: f64| {
            let rank = (p / 100.0 * samples.len() as f64).ceil() as usize;
            ms(samples[rank.clamp(1, samples.len()) - 1])
        };
        Ok(Self { p50: at(50.0), p90: at(90.0), p99: at(99.0), max: at(100.0) })
    }
}

pub(crate) fn ms(d: Duration) -> f64 {
    round(d.as_secs_f64() * 1000.0, 3)
}

#[derive(Debug, Serialize)]
pub(crate) struct Latency {
    /// Commit returned → delivery received.
    #[serde(flatten)]
    pub(crate) delivery: Quantiles,
    /// Commit returned → ack sent.
    pub(crate) ack: Quantiles,
    pub(crate) offered_per_s: f64,
    pub(crate) achieved_per_s: f64,
    pub(crate) samples: usize,
}

/// Phase 4: producers paced to `rate`; every message's commit, delivery and ack instants, all
/// on this process's monotonic clock.
pub(crate) async fn latency(
    b: &Bench,
    admin: &mut AdminClient,
    endpoint: &str,
    topic: &'static str,
    rate: f64,
) -> Result<Latency> {
    let f = flow(b, admin, endpoint, topic, Some(rate), true).await?;
    let committed: HashMap<Uuid, Instant> = f.produced.commits.into_iter().collect();
    let mut to_delivery = Vec::with_capacity(f.receipts.len());
    let mut to_ack = Vec::with_capacity(f.receipts.len());
    for r in &f.receipts {
        let Some(at) = Uuid::parse_str(&r.message_id).ok().and_then(|id| committed.get(&id)) else { continue };
        // A delivery can be seen before its producer task resumes after the commit: count it as 0.
        to_delivery.push(r.delivered.saturating_duration_since(*at));
        to_ack.push(r.acked.saturating_duration_since(*at));
    }
    let samples = to_delivery.len();
    Ok(Latency {
        delivery: Quantiles::of(to_delivery)?,
        ack: Quantiles::of(to_ack)?,
        offered_per_s: round(rate, 1),
        achieved_per_s: round(per_second(f.produced.in_window, b.params.window()), 1),
        samples,
    })
}

/// Commit → delivery of messages that each come after a quiet spell.
#[derive(Debug, Serialize)]
pub(crate) struct QuietLatency {
    #[serde(flatten)]
    pub(crate) delivery: Quantiles,
    pub(crate) gap_s: f64,
    pub(crate) samples: usize,
}

/// Phase 7b: one message at a time, each `QUIET_GAP` after the last was delivered, committed by
/// a producer's own transaction (the SQL function): outboxd hears of it only by polling or by
/// being woken by the commit (ADR 0051), not through its own `Enqueue`.
pub(crate) async fn latency_after_quiet(b: &Bench, admin: &mut AdminClient, endpoint: &str) -> Result<QuietLatency> {
    create_consumer(admin, consumer("bench-quiet", &["bench.quiet"])).await?;
    let mut stream = RawStream::open(endpoint, "bench-quiet", 16).await?;
    let mut conn = b.producers.acquire().await?;
    let n = if b.params.quick { 4 } else { QUIET_SAMPLES };
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        tokio::time::sleep(QUIET_GAP).await;
        let id = Uuid::now_v7();
        Work::SqlFunction { topic: "bench.quiet" }.commit_one(&mut conn, id, &b.payload).await?;
        let committed = Instant::now();
        let d = stream.take(1, Duration::from_secs(30)).await?.remove(0);
        let delivered = Instant::now();
        ensure!(d.message_id == id.to_string(), "the quiet phase got {} instead of {id}", d.message_id);
        stream.ack(&[&d.message_id]).await;
        samples.push(delivered.saturating_duration_since(committed));
    }
    stream.close();
    Ok(QuietLatency { delivery: Quantiles::of(samples)?, gap_s: QUIET_GAP.as_secs_f64(), samples: n })
}

//! Throughput phases: the ceiling, enqueue, end to end, and `outbox.enqueue` against a plain
//! INSERT.
use std::str::FromStr as _;

use crate::consumers::{Receipt, Streams};
use crate::database::{drop_database, pool, recreate_database, unrelayed, wait_relayed};
use crate::producers::{Produced, Producers, Work};
use crate::{Bench, FLOW_MAX_IN_FLIGHT, STREAMS, budget, per_second};
use anyhow::{Context as _, Result, ensure};
use outbox_client::grpc::AdminClient;
use outbox_tests::{consumer, create_consumer};
use sqlx::ConnectOptions as _;
use sqlx::postgres::PgConnectOptions;

/// Phase 1: single-row autocommit inserts into a plain table, with no outboxd running.
pub(crate) async fn ceiling(b: &Bench) -> Result<f64> {
    sqlx::query(
        "CREATE TABLE bench_ceiling (seq bigserial PRIMARY KEY, id uuid, topic text, type text, payload bytea,
                                     headers jsonb, enqueued_at timestamptz DEFAULT now())",
    )
    .execute(&b.db)
    .await?;
    let p = &b.params;
    let run =
        Producers::start(&b.producers, p.producers, Work::PlainInsert, p.window(), None, false, &b.payload).await?;
    let produced = run.finish().await?;
    Ok(per_second(produced.in_window, p.window()))
}

#[derive(Debug)]
pub(crate) struct Enqueued {
    pub(crate) per_s: f64,
    /// Messages the relay had not fanned out yet when the window closed.
    pub(crate) unrelayed_at_end: i64,
}

/// Phase 2: producers enqueue in their own transactions; outboxd relays to one consumer that
/// has no stream, so the relay's work competes with the producers, and nothing else does.
pub(crate) async fn enqueue(b: &Bench, admin: &mut AdminClient) -> Result<Enqueued> {
    const TOPIC: &str = "bench.enqueue";
    create_consumer(admin, consumer("bench-enqueue", &[TOPIC])).await?;
    let p = &b.params;
    let run = Producers::start(
        &b.producers,
        p.producers,
        Work::Enqueue { topic: TOPIC },
        p.window(),
        None,
        false,
        &b.payload,
    )
    .await?;
    let produced = run.finish().await?;
    let unrelayed_at_end = unrelayed(&b.db).await?;
    // The next phase starts with the relay idle.
    wait_relayed(&b.db, budget(produced.total)).await?;
    Ok(Enqueued { per_s: per_second(produced.in_window, p.window()), unrelayed_at_end })
}

/// One run of producers on `topic` while `STREAMS` streams of one consumer ack.
#[derive(Debug)]
pub(crate) struct Flow {
    pub(crate) acked_in_window: u64,
    pub(crate) produced: Produced,
    pub(crate) receipts: Vec<Receipt>,
    pub(crate) redelivered: u64,
}

pub(crate) async fn flow(
    b: &Bench,
    admin: &mut AdminClient,
    endpoint: &str,
    topic: &'static str,
    rate: Option<f64>,
    record: bool,
) -> Result<Flow> {
    flow_of(b, admin, endpoint, Work::Enqueue { topic }, topic, rate, record).await
}

/// [`flow`] with producers doing `work` (which must write to `topic`).
pub(crate) async fn flow_of(
    b: &Bench,
    admin: &mut AdminClient,
    endpoint: &str,
    work: Work,
    topic: &'static str,
    rate: Option<f64>,
    record: bool,
) -> Result<Flow> {
    let name = topic.replace('.', "-");
    create_consumer(admin, consumer(&name, &[topic])).await?;
    let mut streams = Streams::attach(endpoint, &[name], STREAMS, FLOW_MAX_IN_FLIGHT, record).await?;
    let p = &b.params;
    let run = Producers::start(&b.producers, p.producers, work, p.window(), rate, record, &b.payload).await?;
    tokio::time::sleep_until(run.window.end).await;
    let acked_in_window = streams.progress.acked();
    let produced = run.finish().await?;
    // Whatever is still in flight is delivered before the next phase, which then starts clean.
    streams.wait_acked(produced.total, budget(produced.total), &format!("{topic} to be delivered")).await?;
    let redelivered = streams.progress.redelivered();
    let receipts = streams.stop().await?;
    Ok(Flow { acked_in_window, produced, receipts, redelivered })
}

#[derive(Debug)]
pub(crate) struct EndToEnd {
    pub(crate) per_s: f64,
    /// Producers' commits per second meanwhile.
    pub(crate) committed_per_s: f64,
    /// Committed in the window but not acked by its end.
    pub(crate) backlog_at_end: u64,
    pub(crate) redelivered: u64,
}

/// Phase 3: producers flat out while four streams of one consumer receive and ack.
pub(crate) async fn end_to_end(b: &Bench, admin: &mut AdminClient, endpoint: &str) -> Result<EndToEnd> {
    let f = flow(b, admin, endpoint, "bench.e2e", None, false).await?;
    let len = b.params.window();
    Ok(EndToEnd {
        per_s: per_second(f.acked_in_window, len),
        committed_per_s: per_second(f.produced.in_window, len),
        backlog_at_end: f.produced.in_window.saturating_sub(f.acked_in_window),
        redelivered: f.redelivered,
    })
}

/// Phase 1b, before outboxd starts: producers calling `outbox.enqueue` against producers
/// inserting the same row into `outbox.messages` directly; the ratio of their rates. In a
/// database of its own (`<database>_enqueue`, dropped afterwards), so that outboxd starts on an
/// empty outbox whose statistics never saw these rows: PostgreSQL publishes an idle
/// connection's counts up to 10 s late, and rows counted after their TRUNCATE looked like a
/// table that grew, which outboxd's vacuum round then took up inside the idle phase.
pub(crate) async fn enqueue_function_vs_insert(b: &Bench, bin: &std::path::Path, url: &str) -> Result<(f64, f64)> {
    let options = PgConnectOptions::from_str(url).context("parsing --database-url")?;
    let name = format!("{}_enqueue", options.get_database().context("--database-url names no database")?);
    let url = options.database(&name).to_url_lossy().to_string();
    recreate_database(&url).await?;
    let status = tokio::process::Command::new(bin)
        .args(["migrate", "--database-url", &url])
        .stdout(std::process::Stdio::null())
        .status()
        .await
        .context("running outboxd migrate")?;
    ensure!(status.success(), "outboxd migrate failed: {status}");
    let p = &b.params;
    let producers = pool(&url, p.producers).await?;
    let mut rates = Vec::new();
    for work in [Work::OutboxInsert { topic: "bench.insert" }, Work::SqlFunction { topic: "bench.function" }] {
        let run = Producers::start(&producers, p.producers, work, p.window(), None, false, &b.payload).await?;
        rates.push(per_second(run.finish().await?.in_window, p.window()));
    }
    producers.close().await;
    drop_database(&url).await?;
    Ok((rates[0], rates[1]))
}

//! `outbox-bench`: what outboxd delivers and costs on this machine, measured in one run against
//! a real PostgreSQL and a real `outboxd` process.
//!
//! Phases, in order; every figure is printed with the parameters it was measured under:
//!
//! 1. **ceiling**: producers commit one plain row per autocommit transaction, no outboxd running:
//!    what the database itself allows, the yardstick for the rest.
//! 2. **enqueue**: the same producers, one message per transaction through
//!    `outbox_client::enqueue`, while outboxd relays to one consumer that has no stream.
//! 3. **end_to_end**: producers as in 2 while four `Subscribe` streams of one consumer receive
//!    and ack; messages acked per second during the window.
//! 4. **latency**: producers paced to half the end-to-end rate; commit → delivery and
//!    commit → ack percentiles.
//! 5. **drain**: a backlog committed while no stream is attached, timed from the moment streams
//!    attach until the last message is acked; the relay's fan-out is part of it.
//! 6. **fanout**: the same with 1, 4 and 16 consumers on one topic. The server's WAL position
//!    (`pg_current_wal_lsn()`) is read before each round's backlog is committed and again once
//!    outboxd counts every delivery of the round acked; the difference over the round's messages
//!    is `wal_bytes_per_message`, what a message costs in WAL, committed and delivered to k
//!    consumers.
//! 7. **idle**: transactions per second outboxd runs while nothing happens.
//!
//! And the figures of the storage targets: `outbox.enqueue` against a plain INSERT into the
//! same table (before outboxd starts), commit → delivery at a fixed rate (`--latency-rate`,
//! default 1,000/s), end to end with producers calling the SQL function, fan-out as a time
//! ratio, and a backlog under 20 ordering keys drained at two depths per key.
//!
//! Last, once outboxd has stopped so that the two never share the CPU, a **JetStream reference**
//! (`jetstream.rs`): the drain and the fan-out rounds again against NATS JetStream at
//! `--nats-url`, with the same message counts and payload. Each backlog is published first to
//! a file-backed stream of its own; the clock runs from the fetch loops starting until every
//! durable pull consumer has acked every message (explicit acks, one per message): one consumer
//! with as many fetch loops as the drain has streams, and k consumers with as many each as a
//! fan-out consumer has. outboxd's rates over JetStream's are `drain_vs_jetstream` and
//! `fanout_vs_jetstream`. `--no-jetstream` skips it (its keys are then null); without that flag
//! a NATS that cannot be reached fails the run at its start.
//!
//! The database named by `--database-url` is dropped and recreated at start, so its name must
//! contain "bench". With a `sqlite://PATH` URL the embedded store is measured instead (see
//! `sqlite.rs`: ceiling, end to end, fixed-rate latency, drain). Results go to stdout (a table, or one JSON object with `--json`); progress
//! and outboxd's own log go to stderr.
#![forbid(unsafe_code)]

mod console;
mod consumers;
mod database;
mod drain;
mod idle;
mod jetstream;
mod latency;
mod outboxd;
mod producers;
mod report;
mod sinks;
mod soak;
mod sqlite;
mod subscriber;
mod throughput;

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::database::{pool, recreate_database, server_settings};
use crate::drain::{Drained, drain, fanout, keyed_drain};
use crate::idle::idle;
use crate::latency::{latency, latency_after_quiet};
use crate::outboxd::{Secure, find_outboxd, rss_kib, start_outboxd};
use crate::producers::Work;
use crate::report::{ByConsumers, ByDepth, Details, Report, Rss, grouped, print_table, round};
use crate::soak::soak;
use crate::subscriber::subscriber_throughput;
use crate::throughput::{ceiling, end_to_end, enqueue, enqueue_function_vs_insert, flow_of};
use anyhow::{Result, ensure};
use clap::Parser;
use outbox_tests::create_consumer;
use serde::Serialize;
use sqlx::postgres::PgPool;

const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/outbox_bench";
/// The fixed rate of the latency phase on PostgreSQL when `--latency-rate` is not given.
const DEFAULT_LATENCY_RATE: f64 = 1000.0;
/// Ordering keys of the keyed backlog phase, and its depths (messages per key).
const KEYED_KEYS: u64 = 20;
const KEYED_DEPTHS: [u64; 2] = [100, 5_000];
const KEYED_STREAMS: u32 = 6;
const KEYED_MAX_IN_FLIGHT: u32 = 64;
/// Producers on PostgreSQL when `--producers` is not given.
const DEFAULT_PRODUCERS: u32 = 16;

/// Flags for the outboxd under test: the defaults, but for a short drain timeout that keeps the
/// final shutdown quick (every stream is closed by then).
const OUTBOXD_FLAGS: &[&str] = &["--drain-timeout", "2s"];

/// Payload size: with the other columns, a row of about 230 bytes, the size the PostgreSQL
/// measurements this bench is compared with used.
const PAYLOAD_BYTES: usize = 160;
const EVENT_TYPE: &str = "BenchEvent";
/// Streams of the one consumer in end_to_end, latency and drain.
const STREAMS: u32 = 4;
const FLOW_MAX_IN_FLIGHT: u32 = 256;
const DRAIN_MAX_IN_FLIGHT: u32 = 1000;
const FANOUT_CONSUMERS: [u32; 3] = [1, 4, 16];
const FANOUT_STREAMS_PER_CONSUMER: u32 = 2;
const IDLE_MAX_IN_FLIGHT: u32 = 16;
/// The quiet-latency phase: the wait before each message, longer than the relay stays hot (1 s)
/// after its last work, so that each finds the relay backed off, as the first message after a
/// quiet spell does; and how many messages [with --quick: 4].
const QUIET_GAP: Duration = Duration::from_millis(2_500);
const QUIET_SAMPLES: usize = 12;
/// Rows per INSERT statement when loading a backlog.
const INSERT_CHUNK: u64 = 50_000;
/// Most message ids in one ack request.
const ACK_BATCH: usize = 1000;
/// Producers acquire their connections before a timed window opens; this is their head start.
const WINDOW_LEAD: Duration = Duration::from_millis(250);

/// Measures outboxd against a real PostgreSQL: the commit ceiling, enqueue, end-to-end
/// throughput, latency, backlog drain, fan-out and idle cost, in one run.
#[derive(Debug, Parser)]
#[command(name = "outbox-bench")]
struct Args {
    /// The benchmark database. It is dropped and recreated, so its name must contain "bench".
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, default_value = DEFAULT_DATABASE_URL)]
    database_url: String,
    /// Everything smaller: the whole run takes well under two minutes.
    #[arg(long)]
    quick: bool,
    /// Print exactly one JSON object on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Concurrent producers, each on its own database connection [default: 16 on PostgreSQL,
    /// 4 on SQLite].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
    producers: Option<u32>,
    /// The offered rate of the fixed-rate latency phase, messages per second [default: 500 on
    /// SQLite].
    #[arg(long)]
    latency_rate: Option<f64>,
    /// Length of each timed phase in seconds [default: 10, with --quick 3].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=3600))]
    seconds: Option<u64>,
    /// The outboxd binary [default: `outboxd`, else `outboxd-e2e`, next to this executable].
    #[arg(long, env = "OUTBOXD_BIN")]
    outboxd: Option<PathBuf>,
    /// Instead of the phases: a steady load for this many seconds, sampling outboxd's memory
    /// (RSS) ten times, to see that it stays flat.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(10..=86_400))]
    soak: Option<u64>,
    /// The soak's offered rate, messages per second over all producers.
    #[arg(long, default_value_t = 2000.0)]
    soak_rate: f64,
    /// With --soak: hold one transaction open with a snapshot (REPEATABLE READ, as a report or
    /// a forgotten `idle in transaction` session would) for the soak's whole length, so that
    /// vacuum cannot remove any dead row of outboxd's tables; the samples show whether outboxd
    /// keeps up regardless (backlog, p99, dead rows).
    #[arg(long, requires = "soak")]
    soak_hold_transaction: bool,
    /// Serve outboxd over TLS with an auth file; streams and admin calls use a certificate
    /// authority made for the run and a token. Compared with a run without it: what TLS and
    /// authentication cost.
    #[arg(long)]
    secure: bool,
    /// Instead of the phases: the sink phase, each broker's own publish-with-confirm rate with a
    /// plain client publishing directly (RabbitMQ with publisher confirms, JetStream with
    /// PubAcks), pipelined as a sink is, persistent, the bench's payload size; and the committed
    /// → confirmed rate through a sink to each, as a ratio to it.
    #[arg(long)]
    sinks: bool,
    /// Instead of the phases: the Rust `outbox_client::Subscriber`'s throughput, measured as the
    /// Python and TypeScript clients' benches measure theirs (`clients/*/bench`): N messages
    /// committed first, one Subscriber whose handler does nothing, `--subscriber-concurrency`
    /// (64) handlers and as many in flight, timed until outboxd counts all of them acked.
    #[arg(long)]
    subscriber: bool,
    #[arg(long, default_value_t = 64)]
    subscriber_concurrency: u32,
    /// The sink phase's RabbitMQ.
    #[arg(
        long,
        env = "OUTBOX_BENCH_AMQP_URL",
        hide_env_values = true,
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    amqp_url: String,
    /// The NATS server (with JetStream) of the JetStream reference phase and of the sink phase.
    #[arg(long, env = "OUTBOX_BENCH_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// Skip the JetStream reference phase: no NATS needed, and the JSON's `jetstream_*` and
    /// `*_vs_jetstream` keys are null.
    #[arg(long)]
    no_jetstream: bool,
    /// Measure the web console instead: each page's time on a database with
    /// --console-messages retained messages (a tenth of them dead letters), and the database's
    /// transactions per second with 0, 1 and 3 idle tabs open (console.rs). PostgreSQL.
    #[arg(long)]
    console_cost: bool,
    /// Retained messages of --console-cost.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1_000..=100_000_000))]
    console_messages: u64,
    /// Messages per broker in the sink phase [default: 20000, with --quick 5000].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    sink_messages: Option<u64>,
}

/// Everything the figures depend on; reported with them.
#[derive(Debug, Clone, Serialize)]
struct Params {
    producers: u32,
    seconds: u64,
    quick: bool,
    drain_messages: u64,
    fanout_messages: u64,
    streams: u32,
    end_to_end_max_in_flight: u32,
    drain_max_in_flight: u32,
    fanout_consumers: Vec<u32>,
    fanout_streams_per_consumer: u32,
    idle_seconds: u64,
    payload_bytes: usize,
    outboxd_flags: String,
    /// TLS, an auth file and a token on every stream and admin call (`--secure`).
    secure: bool,
    postgres: String,
    autovacuum: String,
    synchronous_commit: String,
    cores: usize,
}

impl Params {
    fn new(args: &Args, (postgres, autovacuum, synchronous_commit): (String, String, String)) -> Self {
        let quick = args.quick;
        Self {
            producers: args.producers.unwrap_or(DEFAULT_PRODUCERS),
            seconds: args.seconds.unwrap_or(if quick { 3 } else { 10 }),
            quick,
            drain_messages: if quick { 100_000 } else { 1_000_000 },
            fanout_messages: if quick { 10_000 } else { 100_000 },
            streams: STREAMS,
            end_to_end_max_in_flight: FLOW_MAX_IN_FLIGHT,
            drain_max_in_flight: DRAIN_MAX_IN_FLIGHT,
            fanout_consumers: FANOUT_CONSUMERS.to_vec(),
            fanout_streams_per_consumer: FANOUT_STREAMS_PER_CONSUMER,
            idle_seconds: if quick { 5 } else { 10 },
            payload_bytes: PAYLOAD_BYTES,
            outboxd_flags: OUTBOXD_FLAGS.join(" "),
            secure: args.secure,
            postgres,
            autovacuum,
            synchronous_commit,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }

    fn window(&self) -> Duration {
        Duration::from_secs(self.seconds)
    }
}

/// How long to wait for `work` messages or deliveries to go through: generous (30 s plus a
/// floor of 1,000 a second), and bounded, so that the bench always ends by itself.
fn budget(work: u64) -> Duration {
    Duration::from_secs(30 + work / 1000)
}

/// What every phase uses.
struct Bench {
    params: Params,
    /// The bench's own connections: setup, backlog loads, and checks between phases.
    db: PgPool,
    /// One connection per producer.
    producers: PgPool,
    payload: Arc<[u8]>,
}

/// A JSON object payload of exactly `PAYLOAD_BYTES`.
fn payload() -> Arc<[u8]> {
    let pad = PAYLOAD_BYTES - r#"{"pad":""}"#.len();
    format!(r#"{{"pad":"{}"}}"#, "x".repeat(pad)).into_bytes().into()
}

fn per_second(count: u64, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(1e-9)
}

async fn run(args: Args) -> Result<Report> {
    let bin = find_outboxd(args.outboxd.clone())?;
    // Reached now, so that a missing NATS fails the run before its PostgreSQL phases, not after.
    let reference = match args.no_jetstream {
        true => None,
        false => Some(jetstream::Reference::connect(&args.nats_url).await?),
    };
    let url = args.database_url.clone();
    recreate_database(&url).await?;
    let db = pool(&url, 4).await?;
    let params = Params::new(&args, server_settings(&db).await?);
    let producers = pool(&url, params.producers).await?;
    let b = Bench { params, db, producers, payload: payload() };
    let p = &b.params;
    tracing::info!(producers = p.producers, seconds = p.seconds, quick = p.quick, outboxd = %bin.display(), "starting");

    tracing::info!("phase 1: ceiling");
    let ceiling_per_s = ceiling(&b).await?;
    tracing::info!(ceiling_per_s, "phase 1b: outbox.enqueue against a plain INSERT into the outbox table");
    let (insert_per_s, function_per_s) = enqueue_function_vs_insert(&b, &bin, &url).await?;

    let secure = args.secure.then(Secure::new).transpose()?;
    let outboxd = start_outboxd(&bin, &url, secure.as_ref()).await?;
    let rss_start = rss_kib(outboxd.pid())?;
    let mut admin = outboxd.admin().await?;
    let endpoint = outboxd.endpoint.clone();

    // Idle first, while outboxd has done nothing else: its counters are then its own.
    tracing::info!(ceiling_per_s, "phase 7 (run first): idle");
    let idle_queries_per_s = idle(&url, &mut admin, &endpoint, Duration::from_secs(b.params.idle_seconds)).await?;
    tracing::info!(idle_queries_per_s, "phase 7b: latency after a quiet spell");
    let quiet = latency_after_quiet(&b, &mut admin, &endpoint).await?;

    tracing::info!(idle_queries_per_s, "phase 2: enqueue");
    let enq = enqueue(&b, &mut admin).await?;
    tracing::info!(enqueue_per_s = enq.per_s, "phase 3: end_to_end");
    let e2e = end_to_end(&b, &mut admin, &endpoint).await?;
    ensure!(e2e.per_s > 0.0, "nothing was delivered end to end: no rate to pace the latency phase at");
    tracing::info!(end_to_end_per_s = e2e.per_s, "phase 4: latency");
    let lat = latency(&b, &mut admin, &endpoint, "bench.latency", e2e.per_s / 2.0).await?;
    let fixed_rate = args.latency_rate.unwrap_or(DEFAULT_LATENCY_RATE);
    tracing::info!(p99_ms = lat.delivery.p99, rate = fixed_rate, "phase 4b: latency at a fixed rate");
    let fixed = latency(&b, &mut admin, &endpoint, "bench.latency-fixed", fixed_rate).await?;
    tracing::info!(p99_ms = fixed.delivery.p99, "phase 3b: end_to_end through the SQL function");
    let sqlf =
        flow_of(&b, &mut admin, &endpoint, Work::SqlFunction { topic: "bench.sqlfn" }, "bench.sqlfn", None, false)
            .await?;
    let sql_function_per_s = per_second(sqlf.acked_in_window, b.params.window());
    tracing::info!(p99_ms = lat.delivery.p99, "phase 5: drain");
    let dr = drain(&b, &mut admin, &endpoint).await?;
    tracing::info!(drain_per_s = per_second(dr.messages, dr.elapsed), "phase 6: fanout");
    let (fan, wal_bytes_per_message) = fanout(&b, &mut admin, &endpoint).await?;
    tracing::info!("phase 8: keyed backlog");
    let keyed = keyed_drain(&b, &mut admin, &endpoint).await?;

    let Bench { params, db, producers, payload } = b;
    producers.close().await;
    db.close().await;
    let rss_end = rss_kib(outboxd.pid())?;
    if !outboxd.terminate(Duration::from_secs(20)).await? {
        tracing::warn!("outboxd exited with an error status");
    }

    // With outboxd stopped, so that the two never share the CPU.
    let js = match &reference {
        Some(r) => {
            tracing::info!("phase 9: the JetStream reference (drain, then fanout)");
            Some(
                r.run(jetstream::Shape {
                    drain_messages: params.drain_messages,
                    drain_loops: STREAMS,
                    fanout_messages: params.fanout_messages,
                    fanout_consumers: &FANOUT_CONSUMERS,
                    fanout_loops_per_consumer: FANOUT_STREAMS_PER_CONSUMER,
                    max_in_flight: DRAIN_MAX_IN_FLIGHT,
                    payload: &payload,
                })
                .await?,
            )
        }
        None => None,
    };

    let fan_by = |f: &dyn Fn(&Drained) -> f64| ByConsumers(fan.iter().map(|(k, d)| (*k, f(d))).collect());
    let drain_per_s = round(per_second(dr.messages, dr.elapsed), 1);
    let fanout_per_s = fan_by(&|d| round(per_second(d.deliveries, d.elapsed), 1));
    let jetstream_fanout_per_s =
        js.as_ref().map(|j| ByConsumers(j.fanout.iter().map(|(k, r)| (*k, round(r.deliveries_per_s(), 1))).collect()));
    // Of the unrounded rates, as the other ratios.
    let fanout_vs_jetstream = js.as_ref().map(|j| {
        ByConsumers(
            fan.iter()
                .filter_map(|(k, d)| {
                    let (_, r) = j.fanout.iter().find(|(c, _)| c == k)?;
                    Some((*k, round(per_second(d.deliveries, d.elapsed) / r.deliveries_per_s().max(1e-9), 3)))
                })
                .collect(),
        )
    });
    let one = fan.iter().find(|(k, _)| *k == 1).map_or(1.0, |(_, d)| d.elapsed.as_secs_f64().max(1e-9));
    let redeliveries = e2e.redelivered + dr.redelivered + fan.iter().map(|(_, d)| d.redelivered).sum::<u64>();
    Ok(Report {
        latency_fixed_ms: fixed,
        sql_function_end_to_end_per_s: round(sql_function_per_s, 1),
        sql_function_ratio_to_ceiling: round(sql_function_per_s / ceiling_per_s.max(1e-9), 3),
        enqueue_function_vs_insert: round(function_per_s / insert_per_s.max(1e-9), 3),
        enqueue_function_per_s: round(function_per_s, 1),
        outbox_insert_per_s: round(insert_per_s, 1),
        fanout_time_ratio: fan_by(&|d| round(d.elapsed.as_secs_f64() / one, 2)),
        keyed_drain_per_s: ByDepth(keyed.iter().map(|&(d, r, _)| (d, r)).collect()),
        keyed_drain_acking_per_s: ByDepth(keyed.iter().map(|&(d, _, a)| (d, a)).collect()),
        latency_after_quiet_ms: quiet,
        ceiling_per_s: round(ceiling_per_s, 1),
        enqueue_per_s: round(enq.per_s, 1),
        end_to_end_per_s: round(e2e.per_s, 1),
        ratio_to_ceiling: round(e2e.per_s / ceiling_per_s.max(1e-9), 3),
        latency_ms: lat,
        jetstream_fanout_per_s,
        fanout_vs_jetstream,
        jetstream_drain_per_s: js.as_ref().map(|j| round(j.drain.deliveries_per_s(), 1)),
        drain_vs_jetstream: js
            .as_ref()
            .map(|j| round(per_second(dr.messages, dr.elapsed) / j.drain.deliveries_per_s().max(1e-9), 3)),
        wal_bytes_per_message,
        drain_per_s,
        fanout_per_s,
        idle_queries_per_s: round(idle_queries_per_s, 2),
        outboxd_rss_kib: Rss { start: rss_start, end: rss_end },
        details: Details {
            enqueue_unrelayed_at_end: enq.unrelayed_at_end,
            end_to_end_committed_per_s: round(e2e.committed_per_s, 1),
            end_to_end_backlog_at_end: e2e.backlog_at_end,
            drain_s: round(dr.elapsed.as_secs_f64(), 3),
            drain_relayed_s: round(dr.relayed.as_secs_f64(), 3),
            fanout_messages_per_s: fan_by(&|d| round(per_second(d.messages, d.elapsed), 1)),
            fanout_s: fan_by(&|d| round(d.elapsed.as_secs_f64(), 3)),
            fanout_relayed_s: fan_by(&|d| round(d.relayed.as_secs_f64(), 3)),
            redeliveries,
        },
        params,
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=error")),
        )
        .init();
    let args = Args::parse();
    let json = args.json;
    if args.subscriber {
        let messages = args.sink_messages.unwrap_or(20_000);
        let bin = find_outboxd(args.outboxd.clone())?;
        let per_s = subscriber_throughput(&bin, &args.database_url, messages, args.subscriber_concurrency).await?;
        if json {
            println!(
                "{}",
                serde_json::json!({ "subscriber_rust_acked_per_s": round(per_s, 1), "messages": messages, "concurrency": args.subscriber_concurrency })
            );
        } else {
            println!(
                "Rust Subscriber: {} msg/s acked ({messages} messages, concurrency {})",
                grouped(per_s),
                args.subscriber_concurrency
            );
        }
        return Ok(());
    }
    if args.sinks {
        let messages = args.sink_messages.unwrap_or(if args.quick { 5_000 } else { 20_000 });
        let window = usize::try_from(outbox_server::domain::Sink::DEFAULT_MAX_IN_FLIGHT)?;
        let bin = find_outboxd(args.outboxd.clone())?;
        let through = sinks::Through { outboxd: &bin, database_url: &args.database_url };
        let r = sinks::run(through, &args.amqp_url, &args.nats_url, messages, window, &payload()).await?;
        if json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            println!(
                "sinks: {} messages of {} B, {} unconfirmed at a time, published directly",
                r.sink_messages, r.sink_payload_bytes, r.sink_window
            );
            println!(
                "  RabbitMQ publish + confirm   {} msg/s directly, {} msg/s committed → confirmed through outboxd ({:.2} ×)",
                grouped(r.sink_rabbitmq_direct_per_s),
                grouped(r.sink_rabbitmq_per_s),
                r.sink_rabbitmq_ratio_to_direct
            );
            println!(
                "  JetStream publish + PubAck   {} msg/s directly, {} msg/s committed → confirmed through outboxd ({:.2} ×)",
                grouped(r.sink_nats_direct_per_s),
                grouped(r.sink_nats_per_s),
                r.sink_nats_ratio_to_direct
            );
        }
        return Ok(());
    }
    if args.database_url.starts_with("sqlite:") {
        ensure!(args.soak.is_none(), "--soak measures PostgreSQL; give a postgres:// --database-url");
        let report = sqlite::run(&args).await?;
        if json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            sqlite::print_table(&report);
        }
        return Ok(());
    }
    if args.console_cost {
        let r = console::run(&args).await?;
        if json {
            println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "console": r }))?);
        } else {
            println!(
                "console: {} messages retained, {} dead letters of one consumer",
                grouped(r.messages as f64),
                grouped(r.dead_letters as f64)
            );
            for p in &r.pages {
                println!("  {:<70} median {:>7.1} ms   max {:>7.1} ms", p.path, p.median_ms, p.max_ms);
            }
            println!(
                "  idle: {} tx/s with no tab, {} with one, {} with three: {} per tab",
                r.idle_tx_per_s, r.one_tab_tx_per_s, r.three_tabs_tx_per_s, r.per_tab_tx_per_s
            );
        }
        return Ok(());
    }
    if let Some(seconds) = args.soak {
        let r = soak(&args, seconds).await?;
        if json {
            // The run's figures at the top level, as before, and the same under "soak".
            let mut out = serde_json::to_value(&r)?;
            if let serde_json::Value::Object(map) = &mut out {
                map.insert("soak".to_owned(), serde_json::to_value(&r)?);
            }
            println!("{}", serde_json::to_string_pretty(&out)?);
        } else {
            println!(
                "soak: {} s at {} msg/s offered ({} producers), {} messages acked",
                r.seconds, r.offered_per_s, r.producers, r.acked
            );
            println!(
                "autovacuum {}, synchronous_commit {}{}; kept up: {}",
                r.autovacuum,
                r.synchronous_commit,
                if r.held_transaction { ", one transaction held open throughout" } else { "" },
                r.kept_up
            );
            for s in &r.samples {
                println!(
                    "  t = {:>5} s   RSS {:>6.1} MiB   backlog {:>8}   acked {:>8} msg/s   p99 {:>7.1} ms   dead rows {:>9}   vacuum held {:>6.0} s",
                    s.at_s,
                    s.rss_mib,
                    s.backlog,
                    grouped(s.acked_per_s),
                    s.p99_ms,
                    s.dead_rows,
                    s.vacuum_held_s
                );
            }
        }
        return Ok(());
    }
    let report = run(args).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    Ok(())
}

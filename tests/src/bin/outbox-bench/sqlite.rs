//! `outbox-bench --database-url sqlite://PATH`: the embedded store, measured like PostgreSQL.
//!
//! Producers are connections of this process (to outboxd, another process writing the same
//! file, as a producer in any language is), committing one row per autocommit transaction with
//! SQLite's defaults (WAL, `synchronous = FULL`, a 5 s busy timeout). Phases:
//!
//! 1. **ceiling**: single-row inserts into a plain table of the same file, no outboxd running;
//! 2. **end_to_end**: the documented INSERT (docs/sql-api.md) into `outbox_messages`, flat out, while
//!    four streams of one consumer receive and ack;
//! 3. **latency**: producers paced to `--latency-rate` (default 500/s); commit → delivery;
//! 4. **drain**: a backlog committed while no stream is attached, timed until the last ack.
//!
//! The file (and its `-wal`, `-shm` and `.lock` companions) is deleted at start, so its name
//! must contain "bench".
use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use outbox_client::grpc::AdminClient;
use outbox_tests::{consumer, create_consumer};
use serde::Serialize;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions as _, Connection as _};
use tokio::task::JoinSet;
use tokio::time::Instant;
use uuid::Uuid;

use crate::consumers::Streams;
use crate::latency::Quantiles;
use crate::outboxd::{find_outboxd, rss_kib};
use crate::report::round;
use crate::{Args, EVENT_TYPE, FLOW_MAX_IN_FLIGHT, STREAMS, budget, per_second};

/// Producers when `--producers` is not given: SQLite has one writer at a time.
pub const DEFAULT_PRODUCERS: u32 = 4;
/// The fixed rate of the latency phase when `--latency-rate` is not given.
pub const DEFAULT_LATENCY_RATE: f64 = 500.0;

#[derive(Debug, Serialize)]
pub struct Params {
    backend: &'static str,
    sqlite: String,
    file: String,
    producers: u32,
    seconds: u64,
    quick: bool,
    drain_messages: u64,
    streams: u32,
    max_in_flight: u32,
    payload_bytes: usize,
    producer_settings: &'static str,
    /// TLS, an auth file and a token on every stream and admin call (`--secure`).
    secure: bool,
    cores: usize,
}

#[derive(Debug, Serialize)]
pub struct Fixed {
    offered_per_s: f64,
    achieved_per_s: f64,
    #[serde(flatten)]
    delivery: Quantiles,
    samples: usize,
}

#[derive(Debug, Serialize)]
pub struct Report {
    params: Params,
    ceiling_per_s: f64,
    end_to_end_per_s: f64,
    ratio_to_ceiling: f64,
    end_to_end_committed_per_s: f64,
    end_to_end_backlog_at_end: u64,
    latency_fixed_ms: Fixed,
    drain_per_s: f64,
    drain_s: f64,
    redeliveries: u64,
    outboxd_rss_kib: (u64, u64),
}

/// The file a `sqlite://PATH` URL names.
fn file_of(url: &str) -> Result<PathBuf> {
    let options = SqliteConnectOptions::from_str(url).context("parsing --database-url")?;
    Ok(options.get_filename().to_path_buf())
}

/// Deletes the file and its companions; refuses a file whose name does not say "bench".
fn remove_file(path: &Path) -> Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    ensure!(
        name.contains("bench"),
        "refusing to use {}: the bench deletes it first, so its name must contain \"bench\"",
        path.display()
    );
    for suffix in ["", "-wal", "-shm", "-journal", ".lock"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", PathBuf::from(p).display())),
        }
    }
    Ok(())
}

/// A producer's connection, with SQLite's own defaults as a producer in any language has them.
async fn connect(path: &Path) -> Result<SqliteConnection> {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("opening {}", path.display()))
}

#[derive(Debug, Clone, Copy)]
enum Work {
    /// One row into `bench_ceiling`.
    Plain,
    /// The documented INSERT into `outbox_messages`.
    Outbox { topic: &'static str },
}

#[derive(Debug, Default)]
struct Produced {
    in_window: u64,
    total: u64,
    commits: Vec<(Uuid, Instant)>,
}

/// One producer: commits until `end`, paced (`period`, starting at `first`) or flat out.
async fn produce(
    mut conn: SqliteConnection,
    work: Work,
    first: Instant,
    end: Instant,
    period: Option<Duration>,
    record: bool,
    payload: Arc<[u8]>,
) -> Result<Produced> {
    let mut out = Produced::default();
    let mut due = first;
    while due < end {
        if due > Instant::now() {
            tokio::time::sleep_until(due).await;
        }
        let id = Uuid::now_v7();
        let sql = match work {
            Work::Plain => "INSERT INTO bench_ceiling (id, topic, type, payload) VALUES (?1, 'bench.ceiling', ?2, ?3)",
            Work::Outbox { .. } => {
                "INSERT INTO outbox_messages (message_id, topic, type, payload) VALUES (?1, ?4, ?2, ?3)"
            }
        };
        let topic = match work {
            Work::Plain => "",
            Work::Outbox { topic } => topic,
        };
        sqlx::query(sql)
            .bind(id.to_string())
            .bind(EVENT_TYPE)
            .bind(&payload[..])
            .bind(topic)
            .execute(&mut conn)
            .await
            .context("a producer's commit")?;
        let at = Instant::now();
        out.total += 1;
        if at <= end {
            out.in_window += 1;
        }
        if record {
            out.commits.push((id, at));
        }
        due = match period {
            Some(p) => due + p,
            None => at,
        };
    }
    conn.close().await.ok();
    Ok(out)
}

/// `n` producers through one window of `len`; `rate` paces them (messages per second in all).
async fn producers(path: &Path, n: u32, work: Work, len: Duration, rate: Option<f64>, record: bool) -> Result<Run> {
    let mut conns = Vec::new();
    for _ in 0..n {
        conns.push(connect(path).await?);
    }
    let start = Instant::now() + Duration::from_millis(250);
    let end = start + len;
    let period = rate.map(|r| Duration::from_secs_f64(f64::from(n) / r.max(1.0)));
    let mut tasks = JoinSet::new();
    for (i, conn) in (0..n).zip(conns) {
        let first = start + period.map_or(Duration::ZERO, |p| p * i / n);
        tasks.spawn(produce(conn, work, first, end, period, record, crate::payload()));
    }
    Ok(Run { end, tasks })
}

struct Run {
    end: Instant,
    tasks: JoinSet<Result<Produced>>,
}

impl Run {
    async fn finish(mut self) -> Result<Produced> {
        let mut all = Produced::default();
        while let Some(joined) = tokio::time::timeout_at(self.end + Duration::from_secs(30), self.tasks.join_next())
            .await
            .context("producers still running 30 s after their window closed")?
        {
            let p = joined.context("a producer panicked")??;
            all.in_window += p.in_window;
            all.total += p.total;
            all.commits.extend(p.commits);
        }
        Ok(all)
    }
}

struct Flow {
    acked_in_window: u64,
    produced: Produced,
    receipts: Vec<crate::consumers::Receipt>,
    redelivered: u64,
}

/// Producers on `topic` while `STREAMS` streams of one consumer ack.
async fn flow(
    path: &Path,
    p: &Params,
    admin: &mut AdminClient,
    endpoint: &str,
    topic: &'static str,
    rate: Option<f64>,
    record: bool,
) -> Result<Flow> {
    let name = topic.replace('.', "-");
    create_consumer(admin, consumer(&name, &[topic])).await?;
    let mut streams = Streams::attach(endpoint, &[name], STREAMS, FLOW_MAX_IN_FLIGHT, record).await?;
    let len = Duration::from_secs(p.seconds);
    let run = producers(path, p.producers, Work::Outbox { topic }, len, rate, record).await?;
    tokio::time::sleep_until(run.end).await;
    let acked_in_window = streams.progress.acked();
    let produced = run.finish().await?;
    streams.wait_acked(produced.total, budget(produced.total), &format!("{topic} to be delivered")).await?;
    let redelivered = streams.progress.redelivered();
    let receipts = streams.stop().await?;
    Ok(Flow { acked_in_window, produced, receipts, redelivered })
}

pub async fn run(args: &Args) -> Result<Report> {
    let bin = find_outboxd(args.outboxd.clone())?;
    let path = file_of(&args.database_url)?;
    remove_file(&path)?;
    let quick = args.quick;
    let mut setup = connect(&path).await?;
    let sqlite: String = sqlx::query_scalar("SELECT sqlite_version()").fetch_one(&mut setup).await?;
    let p = Params {
        backend: "sqlite",
        sqlite,
        file: path.display().to_string(),
        producers: args.producers.unwrap_or(DEFAULT_PRODUCERS),
        seconds: args.seconds.unwrap_or(if quick { 3 } else { 10 }),
        quick,
        drain_messages: if quick { 20_000 } else { 200_000 },
        streams: STREAMS,
        max_in_flight: FLOW_MAX_IN_FLIGHT,
        payload_bytes: crate::PAYLOAD_BYTES,
        producer_settings: "WAL, synchronous=FULL, busy_timeout 5 s, autocommit",
        secure: args.secure,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let len = Duration::from_secs(p.seconds);

    tracing::info!(file = %path.display(), producers = p.producers, "phase 1: ceiling");
    sqlx::query(
        "CREATE TABLE bench_ceiling (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT, topic TEXT, type TEXT,
                                     payload BLOB, headers TEXT DEFAULT '{}', enqueued_at INTEGER)",
    )
    .execute(&mut setup)
    .await?;
    let ceiling = producers(&path, p.producers, Work::Plain, len, None, false).await?.finish().await?;
    let ceiling_per_s = per_second(ceiling.in_window, len);
    sqlx::query("DROP TABLE bench_ceiling").execute(&mut setup).await?;
    setup.close().await?;

    let url = format!("sqlite://{}", path.display());
    let secure = args.secure.then(crate::outboxd::Secure::new).transpose()?;
    let outboxd = crate::outboxd::start_outboxd(&bin, &url, secure.as_ref()).await?;
    let rss_start = rss_kib(outboxd.pid())?;
    let mut admin = outboxd.admin().await?;
    let endpoint = outboxd.endpoint.clone();

    tracing::info!(ceiling_per_s, "phase 2: end_to_end");
    let e2e = flow(&path, &p, &mut admin, &endpoint, "bench.e2e", None, false).await?;
    let end_to_end_per_s = per_second(e2e.acked_in_window, len);

    let rate = args.latency_rate.unwrap_or(DEFAULT_LATENCY_RATE);
    tracing::info!(end_to_end_per_s, rate, "phase 3: latency at a fixed rate");
    let lat = flow(&path, &p, &mut admin, &endpoint, "bench.latency", Some(rate), true).await?;
    let committed: std::collections::HashMap<Uuid, Instant> = lat.produced.commits.iter().copied().collect();
    let samples: Vec<Duration> = lat
        .receipts
        .iter()
        .filter_map(|r| {
            let at = committed.get(&Uuid::parse_str(&r.message_id).ok()?)?;
            Some(r.delivered.saturating_duration_since(*at))
        })
        .collect();
    let latency_fixed_ms = Fixed {
        offered_per_s: round(rate, 1),
        achieved_per_s: round(per_second(lat.produced.in_window, len), 1),
        samples: samples.len(),
        delivery: Quantiles::of(samples)?,
    };

    tracing::info!(p99_ms = latency_fixed_ms.delivery.p99, "phase 4: drain");
    const DRAIN_TOPIC: &str = "bench.drain";
    create_consumer(&mut admin, consumer("bench-drain", &[DRAIN_TOPIC])).await?;
    let mut load = connect(&path).await?;
    let mut tx = load.begin().await?;
    let payload = crate::payload();
    for _ in 0..p.drain_messages {
        sqlx::query("INSERT INTO outbox_messages (message_id, topic, type, payload) VALUES (?1, ?2, ?3, ?4)")
            .bind(Uuid::now_v7().to_string())
            .bind(DRAIN_TOPIC)
            .bind(EVENT_TYPE)
            .bind(&payload[..])
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    load.close().await?;
    let start = Instant::now();
    let mut streams =
        Streams::attach(&endpoint, &["bench-drain".to_owned()], STREAMS, crate::DRAIN_MAX_IN_FLIGHT, false).await?;
    streams.wait_acked(p.drain_messages, budget(p.drain_messages), "the drain").await?;
    let drained = streams.progress.last_ack().saturating_duration_since(start);
    let drain_redelivered = streams.progress.redelivered();
    streams.stop().await?;

    let rss_end = rss_kib(outboxd.pid())?;
    if !outboxd.terminate(Duration::from_secs(20)).await? {
        tracing::warn!("outboxd exited with an error status");
    }
    Ok(Report {
        ceiling_per_s: round(ceiling_per_s, 1),
        end_to_end_per_s: round(end_to_end_per_s, 1),
        ratio_to_ceiling: round(end_to_end_per_s / ceiling_per_s.max(1e-9), 3),
        end_to_end_committed_per_s: round(per_second(e2e.produced.in_window, len), 1),
        end_to_end_backlog_at_end: e2e.produced.in_window.saturating_sub(e2e.acked_in_window),
        latency_fixed_ms,
        drain_per_s: round(per_second(p.drain_messages, drained), 1),
        drain_s: round(drained.as_secs_f64(), 3),
        redeliveries: e2e.redelivered + lat.redelivered + drain_redelivered,
        outboxd_rss_kib: (rss_start, rss_end),
        params: p,
    })
}

pub fn print_table(r: &Report) {
    let p = &r.params;
    let q = &r.latency_fixed_ms;
    println!(
        "outbox-bench: SQLite {} ({}), {} cores, {} producers ({}), {} s per phase{}",
        p.sqlite,
        p.file,
        p.cores,
        p.producers,
        p.producer_settings,
        p.seconds,
        if p.quick { ", quick" } else { "" }
    );
    println!(
        "ceiling     {:>10.0} rows/s   1 INSERT per autocommit transaction, plain table, no outboxd",
        r.ceiling_per_s
    );
    println!(
        "end_to_end  {:>10.0} msg/s    {:.2} of ceiling; committed {:.0} msg/s, {} behind at end; {} streams",
        r.end_to_end_per_s, r.ratio_to_ceiling, r.end_to_end_committed_per_s, r.end_to_end_backlog_at_end, p.streams
    );
    println!(
        "latency     commit->delivery p50 {:.1} / p90 {:.1} / p99 {:.1} / max {:.1} ms at {:.0} msg/s offered ({:.0} achieved, {} samples)",
        q.delivery.p50, q.delivery.p90, q.delivery.p99, q.delivery.max, q.offered_per_s, q.achieved_per_s, q.samples
    );
    println!(
        "drain       {:>10.0} msg/s    {} committed messages, {:.1} s",
        r.drain_per_s, p.drain_messages, r.drain_s
    );
    if r.redeliveries > 0 {
        println!("note: {} redeliveries were acked besides the counted first deliveries", r.redeliveries);
    }
}

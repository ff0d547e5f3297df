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
mod jetstream;
mod sinks;
mod sqlite;

use std::collections::HashMap;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::str::FromStr as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use clap::Parser;
use outbox_client::grpc::AdminClient;
use outbox_proto::v1 as pb;
use outbox_tests::{Outboxd, RawStream, consumer, create_consumer};
use serde::{Serialize, Serializer};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions as _, Connection as _, PgConnection, Postgres};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

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

/// The files and flags of a `--secure` run; removed when dropped.
struct Secure {
    _pki: outbox_tests::pki::Pki,
    flags: Vec<String>,
}

impl Secure {
    /// A CA, a server certificate, an auth file with one principal allowed everything, and the
    /// harness set to connect with TLS and its token.
    fn new() -> Result<Self> {
        let pki = outbox_tests::pki::Pki::new("bench")?;
        let server = pki.server("server")?;
        let token = "bench-token";
        let auth = pki.dir.join("auth.toml");
        std::fs::write(
            &auth,
            format!(
                "[[principal]]\nname = \"bench\"\ntokens = [{:?}]\npermissions = [\"*\"]\n",
                outbox_server::grpc::auth::token_hash_line(token)
            ),
        )?;
        outbox_tests::use_credentials(outbox_client::Credentials {
            tls_ca: Some(pki.ca.clone()),
            ..outbox_client::Credentials::token(token)
        });
        let path = |p: &std::path::Path| p.display().to_string();
        let flags = vec![
            "--tls-cert".into(),
            path(&server.cert),
            "--tls-key".into(),
            path(&server.key),
            "--auth-file".into(),
            path(&auth),
        ];
        Ok(Self { _pki: pki, flags })
    }
}

/// Starts outboxd with the bench's flags, and with TLS and the auth file in a `--secure` run.
async fn start_outboxd(bin: &std::path::Path, url: &str, secure: Option<&Secure>) -> Result<Outboxd> {
    let mut flags: Vec<&str> = OUTBOXD_FLAGS.to_vec();
    if let Some(s) = secure {
        flags.extend(s.flags.iter().map(String::as_str));
    }
    let mut outboxd = Outboxd::start_binary(bin, url, &flags).await?;
    if secure.is_some() {
        outboxd.endpoint = format!("https://localhost:{}", outboxd.addr.port());
    }
    Ok(outboxd)
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

// ---------------------------------------------------------------------------------------------
// The database

/// Runs `statements` from database "postgres" on the database `url` names, written `{db}` in
/// them; refuses a name without "bench", since the bench drops the databases it uses.
async fn on_bench_database(url: &str, statements: &[&str]) -> Result<()> {
    let options = PgConnectOptions::from_str(url).context("parsing a database URL")?;
    let name = options.get_database().context("the database URL names no database")?.to_owned();
    ensure!(
        name.contains("bench"),
        "refusing to use database {name:?}: the bench drops and recreates it, so its name must contain \"bench\""
    );
    let quoted = format!("\"{}\"", name.replace('"', "\"\""));
    let mut conn = options.database("postgres").connect().await.context("connecting to database \"postgres\"")?;
    for sql in statements {
        sqlx::query(sqlx::AssertSqlSafe(sql.replace("{db}", &quoted))).execute(&mut conn).await?;
    }
    conn.close().await?;
    Ok(())
}

/// Drops and recreates the benchmark database, so that every run starts from empty tables.
async fn recreate_database(url: &str) -> Result<()> {
    on_bench_database(url, &["DROP DATABASE IF EXISTS {db} WITH (FORCE)", "CREATE DATABASE {db}"]).await
}

/// Drops a database that [`recreate_database`] made.
async fn drop_database(url: &str) -> Result<()> {
    on_bench_database(url, &["DROP DATABASE IF EXISTS {db} WITH (FORCE)"]).await
}

/// The server's version, `autovacuum` and `synchronous_commit`: the figures depend on them.
async fn server_settings(db: &PgPool) -> Result<(String, String, String)> {
    let show = |name: &'static str| async move {
        anyhow::Ok(sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!("SHOW {name}"))).fetch_one(db).await?)
    };
    Ok((show("server_version").await?, show("autovacuum").await?, show("synchronous_commit").await?))
}

async fn connect(url: &str) -> Result<PgConnection> {
    Ok(PgConnectOptions::from_str(url)?.application_name("outbox-bench").connect().await?)
}

/// A pool whose connections stay open for the whole run: producers keep theirs from one phase
/// to the next, and reconnecting would show up in the figures.
async fn pool(url: &str, size: u32) -> Result<PgPool> {
    let options = PgConnectOptions::from_str(url)?.application_name("outbox-bench");
    Ok(PgPoolOptions::new()
        .max_connections(size)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await?)
}

/// Commits `n` messages on `topic` in one transaction, as fast as SQL can write them.
///
/// One transaction, with `ANALYZE` inside it, so that the relay sees nothing until everything is
/// there, with planner statistics that know the backlog (a claim planned for an empty table is
/// slow on a large one): the whole fan-out then happens after the streams attach, inside the
/// timed drain.
///
/// The messages are spread round-robin over `keys` ordering keys (0: none).
async fn insert_committed(db: &PgPool, topic: &str, n: u64, keys: u64, payload: &[u8]) -> Result<()> {
    let mut tx = db.begin().await?;
    let mut left = n;
    while left > 0 {
        let chunk = left.min(INSERT_CHUNK);
        sqlx::query(
            "INSERT INTO outbox.messages (message_id, topic, type, payload, ordering_key)
             SELECT outbox.uuid_v7(), $1, $2, $3, CASE WHEN $5 > 0 THEN 'key-' || (g % $5) END
               FROM generate_series(1, $4::bigint) g",
        )
        .bind(topic)
        .bind(EVENT_TYPE)
        .bind(payload)
        .bind(i64::try_from(chunk)?)
        .bind(i64::try_from(keys)?)
        .execute(&mut *tx)
        .await
        .with_context(|| format!("inserting the {topic} backlog"))?;
        left -= chunk;
    }
    sqlx::query("ANALYZE outbox.messages").execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(())
}

async fn unrelayed(db: &PgPool) -> Result<i64> {
    // The relay cursor's own view of what it has not read (ADR 0027).
    Ok(sqlx::query_scalar("SELECT count(*) FROM outbox.unrelayed_messages").fetch_one(db).await?)
}

/// How long after `since` the relay had nothing left to fan out, to 100 ms; polls while a drain
/// runs.
async fn time_until_relayed(db: &PgPool, since: Instant, within: Duration) -> Result<Duration> {
    loop {
        // The relay's own access path (the cursor, then the primary key), so that the check
        // stays cheap beside it.
        let left: Option<i64> =
            sqlx::query_scalar("SELECT seq FROM outbox.unrelayed_messages LIMIT 1").fetch_optional(db).await?;
        if left.is_none() {
            return Ok(since.elapsed());
        }
        ensure!(since.elapsed() < within, "the relay did not fan out the backlog within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_relayed(db: &PgPool, within: Duration) -> Result<()> {
    time_until_relayed(db, Instant::now(), within).await.map(|_| ())
}

// ---------------------------------------------------------------------------------------------
// Producers

/// What one producer commits per transaction.
#[derive(Debug, Clone, Copy)]
enum Work {
    /// One row into the plain table `bench_ceiling`, autocommit: the database's own ceiling.
    PlainInsert,
    /// One message through `outbox_client::enqueue`, autocommit: one message per committed
    /// transaction, the same shape as the ceiling. (Inside an explicit BEGIN … COMMIT both the
    /// ceiling and the enqueue pay two more round trips per commit, about half the rate.)
    Enqueue { topic: &'static str },
    /// `SELECT outbox.enqueue(...)`, autocommit: what a producer in any language calls.
    SqlFunction { topic: &'static str },
    /// A plain `INSERT INTO outbox.messages`, autocommit: the table's own cost, the yardstick
    /// for the SQL function.
    OutboxInsert { topic: &'static str },
}

impl Work {
    async fn commit_one(self, conn: &mut PgConnection, id: Uuid, payload: &[u8]) -> Result<()> {
        match self {
            Work::PlainInsert => {
                sqlx::query(
                    "INSERT INTO bench_ceiling (id, topic, type, payload, headers)
                     VALUES ($1, 'bench.ceiling', $2, $3, '{}')",
                )
                .bind(id)
                .bind(EVENT_TYPE)
                .bind(payload)
                .execute(conn)
                .await?;
            }
            Work::Enqueue { topic } => {
                let msg = outbox_client::Message::new(topic, EVENT_TYPE, payload).message_id(id);
                outbox_client::enqueue(&mut *conn, &msg).await?;
            }
            Work::SqlFunction { topic } => {
                sqlx::query("SELECT outbox.enqueue($1, $2, $3, '{}', $4)")
                    .bind(topic)
                    .bind(EVENT_TYPE)
                    .bind(payload)
                    .bind(id)
                    .execute(conn)
                    .await?;
            }
            Work::OutboxInsert { topic } => {
                sqlx::query("INSERT INTO outbox.messages (message_id, topic, type, payload) VALUES ($1, $2, $3, $4)")
                    .bind(id)
                    .bind(topic)
                    .bind(EVENT_TYPE)
                    .bind(payload)
                    .execute(conn)
                    .await?;
            }
        }
        Ok(())
    }
}

/// A timed window. Producers have their connections in hand before it opens.
#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    end: Instant,
}

/// Open-loop pacing: producer `i` of `n` commits at `start + (i/n + k) * period`, however long
/// the previous commit took (a late producer catches up at once), so the offered rate holds
/// whatever the latency.
#[derive(Debug, Clone, Copy)]
struct Pace {
    period: Duration,
    offset: Duration,
}

#[derive(Debug, Default)]
struct Produced {
    /// Commits that returned inside the window.
    in_window: u64,
    /// Every commit, including the last ones that returned after the window closed.
    total: u64,
    /// When each message's commit returned, when asked for.
    commits: Vec<(Uuid, Instant)>,
}

impl Produced {
    fn merge(&mut self, other: Produced) {
        self.in_window += other.in_window;
        self.total += other.total;
        self.commits.extend(other.commits);
    }
}

async fn producer(
    mut conn: PoolConnection<Postgres>,
    work: Work,
    window: Window,
    pace: Option<Pace>,
    record: bool,
    payload: Arc<[u8]>,
) -> Result<Produced> {
    let mut out = Produced::default();
    let mut due = window.start + pace.map_or(Duration::ZERO, |p| p.offset);
    while due < window.end {
        if due > Instant::now() {
            tokio::time::sleep_until(due).await;
        }
        let id = Uuid::now_v7();
        work.commit_one(&mut conn, id, &payload).await?;
        let at = Instant::now();
        out.total += 1;
        if at <= window.end {
            out.in_window += 1;
        }
        if record {
            out.commits.push((id, at));
        }
        due = match pace {
            Some(p) => due + p.period,
            None => at,
        };
    }
    Ok(out)
}

/// Producers running through one window, each on its own connection.
struct Producers {
    window: Window,
    tasks: JoinSet<Result<Produced>>,
}

impl Producers {
    /// Takes one connection per producer, then starts them all together. `rate` (messages per
    /// second across all producers) paces them; `None` runs them flat out.
    async fn start(
        pool: &PgPool,
        n: u32,
        work: Work,
        len: Duration,
        rate: Option<f64>,
        record: bool,
        payload: &Arc<[u8]>,
    ) -> Result<Self> {
        let mut conns = Vec::with_capacity(n as usize);
        for _ in 0..n {
            conns.push(pool.acquire().await.context("a producer connection")?);
        }
        let start = Instant::now() + WINDOW_LEAD;
        let window = Window { start, end: start + len };
        let period = rate.map(|r| Duration::from_secs_f64(f64::from(n) / r.max(1.0)));
        let mut tasks = JoinSet::new();
        for (i, conn) in (0..n).zip(conns) {
            let pace = period.map(|period| Pace { period, offset: period * i / n });
            tasks.spawn(producer(conn, work, window, pace, record, payload.clone()));
        }
        Ok(Self { window, tasks })
    }

    async fn finish(mut self) -> Result<Produced> {
        let mut all = Produced::default();
        let late = self.window.end + Duration::from_secs(30);
        while let Some(joined) = tokio::time::timeout_at(late, self.tasks.join_next())
            .await
            .context("producers still running 30 s after their window closed")?
        {
            all.merge(joined.context("a producer panicked")??);
        }
        Ok(all)
    }
}

// ---------------------------------------------------------------------------------------------
// Consumers

/// What the streams of one phase have acked, shared with their tasks.
#[derive(Debug)]
struct Progress {
    origin: Instant,
    /// Acked first deliveries: each is one message.
    first: AtomicU64,
    /// Acked redeliveries (a lease expired, or a stream closed before its ack landed).
    again: AtomicU64,
    /// When the latest ack was sent, in nanoseconds after `origin`.
    last_ack_ns: AtomicU64,
    /// When the earliest ack was sent, in nanoseconds after `origin` (`u64::MAX` before any).
    first_ack_ns: AtomicU64,
    /// While set, each first delivery's enqueue → receipt time (wall clock, milliseconds) is
    /// kept in `latencies` (the soak samples them).
    sample_latency: std::sync::atomic::AtomicBool,
    latencies: std::sync::Mutex<Vec<f32>>,
}

impl Progress {
    fn new() -> Self {
        Self {
            origin: Instant::now(),
            first: AtomicU64::new(0),
            again: AtomicU64::new(0),
            last_ack_ns: AtomicU64::new(0),
            first_ack_ns: AtomicU64::new(u64::MAX),
            sample_latency: std::sync::atomic::AtomicBool::new(false),
            latencies: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn record(&self, batch: &[(pb::Delivery, Instant)], acked: Instant) {
        let first = batch.iter().filter(|(d, _)| d.delivery_count <= 1).count() as u64;
        if self.sample_latency.load(Ordering::Relaxed) {
            let now = chrono::Utc::now();
            let mut l = self.latencies.lock().unwrap_or_else(|e| e.into_inner());
            for (d, _) in batch.iter().filter(|(d, _)| d.delivery_count <= 1) {
                if let Some(t) = d.enqueued_at.as_ref()
                    && let Some(at) = chrono::DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).unwrap_or(0))
                {
                    l.push((now - at).num_microseconds().unwrap_or(0) as f32 / 1000.0);
                }
            }
        }
        self.count(first, batch.len() as u64 - first, acked);
    }

    /// Counts `first` first deliveries and `again` redeliveries acked at `acked`.
    fn count(&self, first: u64, again: u64, acked: Instant) {
        let ns = u64::try_from(acked.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX);
        // The instant first, so that whoever sees the count sees an instant at least this late.
        self.last_ack_ns.fetch_max(ns, Ordering::SeqCst);
        self.first_ack_ns.fetch_min(ns, Ordering::SeqCst);
        self.again.fetch_add(again, Ordering::SeqCst);
        self.first.fetch_add(first, Ordering::SeqCst);
    }

    fn acked(&self) -> u64 {
        self.first.load(Ordering::SeqCst)
    }

    fn redelivered(&self) -> u64 {
        self.again.load(Ordering::SeqCst)
    }

    fn last_ack(&self) -> Instant {
        self.origin + Duration::from_nanos(self.last_ack_ns.load(Ordering::SeqCst))
    }

    /// From the first ack to the last (zero before two acks).
    fn acking(&self) -> Duration {
        let first = self.first_ack_ns.load(Ordering::SeqCst);
        Duration::from_nanos(self.last_ack_ns.load(Ordering::SeqCst).saturating_sub(first))
    }
}

/// One first delivery as a stream saw it, for the latency phase.
#[derive(Debug)]
struct Receipt {
    message_id: String,
    delivered: Instant,
    acked: Instant,
}

/// Receives on one stream and acks, in one request, whatever has arrived; until `stop`.
async fn consume(
    mut stream: RawStream,
    stop: CancellationToken,
    progress: Arc<Progress>,
    record: bool,
) -> Result<Vec<Receipt>> {
    let mut receipts = Vec::new();
    let mut batch: Vec<(pb::Delivery, Instant)> = Vec::with_capacity(ACK_BATCH);
    while !stop.is_cancelled() {
        // A short wait, so that an idle stream notices `stop` promptly.
        let Some(first) = stream.next(Duration::from_millis(100)).await.context("subscribe stream")? else {
            continue;
        };
        batch.push((first, Instant::now()));
        // What is already buffered goes into the same ack.
        while batch.len() < ACK_BATCH {
            match stream.next(Duration::ZERO).await.context("subscribe stream")? {
                Some(d) => batch.push((d, Instant::now())),
                None => break,
            }
        }
        let ids: Vec<&str> = batch.iter().map(|(d, _)| d.message_id.as_str()).collect();
        stream.ack(&ids).await;
        let acked = Instant::now();
        progress.record(&batch, acked);
        if record {
            receipts.extend(batch.drain(..).filter(|(d, _)| d.delivery_count <= 1).map(|(d, delivered)| Receipt {
                message_id: d.message_id,
                delivered,
                acked,
            }));
        }
        batch.clear();
    }
    stream.close();
    Ok(receipts)
}

/// The streams of one phase, each in its own task.
struct Streams {
    stop: CancellationToken,
    progress: Arc<Progress>,
    tasks: JoinSet<Result<Vec<Receipt>>>,
}

impl Streams {
    async fn attach(
        endpoint: &str,
        consumers: &[String],
        per_consumer: u32,
        max_in_flight: u32,
        record: bool,
    ) -> Result<Self> {
        let stop = CancellationToken::new();
        let progress = Arc::new(Progress::new());
        let mut tasks = JoinSet::new();
        for name in consumers {
            for _ in 0..per_consumer {
                let stream = RawStream::open(endpoint, name, max_in_flight)
                    .await
                    .with_context(|| format!("opening a stream of consumer {name}"))?;
                tasks.spawn(consume(stream, stop.clone(), progress.clone(), record));
            }
        }
        Ok(Self { stop, progress, tasks })
    }

    /// Waits until `target` messages have been acked; fails after `within`, or at once if a
    /// stream fails.
    async fn wait_acked(&mut self, target: u64, within: Duration, what: &str) -> Result<()> {
        let deadline = Instant::now() + within;
        while self.progress.acked() < target {
            if let Some(joined) = self.tasks.try_join_next() {
                joined.context("a stream task panicked")??;
                bail!("a stream ended while waiting for {what}");
            }
            ensure!(
                Instant::now() < deadline,
                "timed out after {within:?} waiting for {what}: {} of {target} acked",
                self.progress.acked()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// Closes every stream (the server releases what they still hold) and returns the receipts.
    async fn stop(mut self) -> Result<Vec<Receipt>> {
        self.stop.cancel();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut receipts = Vec::new();
        while let Some(joined) = tokio::time::timeout_at(deadline, self.tasks.join_next())
            .await
            .context("streams did not stop within 10 s")?
        {
            receipts.extend(joined.context("a stream task panicked")??);
        }
        Ok(receipts)
    }
}

// ---------------------------------------------------------------------------------------------
// Phases

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

/// Phase 1: single-row autocommit inserts into a plain table, with no outboxd running.
async fn ceiling(b: &Bench) -> Result<f64> {
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
struct Enqueued {
    per_s: f64,
    /// Messages the relay had not fanned out yet when the window closed.
    unrelayed_at_end: i64,
}

/// Phase 2: producers enqueue in their own transactions; outboxd relays to one consumer that
/// has no stream, so the relay's work competes with the producers, and nothing else does.
async fn enqueue(b: &Bench, admin: &mut AdminClient) -> Result<Enqueued> {
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
struct Flow {
    acked_in_window: u64,
    produced: Produced,
    receipts: Vec<Receipt>,
    redelivered: u64,
}

async fn flow(
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
async fn flow_of(
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
struct EndToEnd {
    per_s: f64,
    /// Producers' commits per second meanwhile.
    committed_per_s: f64,
    /// Committed in the window but not acked by its end.
    backlog_at_end: u64,
    redelivered: u64,
}

/// Phase 3: producers flat out while four streams of one consumer receive and ack.
async fn end_to_end(b: &Bench, admin: &mut AdminClient, endpoint: &str) -> Result<EndToEnd> {
    let f = flow(b, admin, endpoint, "bench.e2e", None, false).await?;
    let len = b.params.window();
    Ok(EndToEnd {
        per_s: per_second(f.acked_in_window, len),
        committed_per_s: per_second(f.produced.in_window, len),
        backlog_at_end: f.produced.in_window.saturating_sub(f.acked_in_window),
        redelivered: f.redelivered,
    })
}

/// Nearest-rank percentiles, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
struct Quantiles {
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

impl Quantiles {
    fn of(mut samples: Vec<Duration>) -> Result<Self> {
        ensure!(!samples.is_empty(), "no latency samples");
        samples.sort_unstable();
        let at = |p: f64| {
            let rank = (p / 100.0 * samples.len() as f64).ceil() as usize;
            ms(samples[rank.clamp(1, samples.len()) - 1])
        };
        Ok(Self { p50: at(50.0), p90: at(90.0), p99: at(99.0), max: at(100.0) })
    }
}

fn ms(d: Duration) -> f64 {
    round(d.as_secs_f64() * 1000.0, 3)
}

#[derive(Debug, Serialize)]
struct Latency {
    /// Commit returned → delivery received.
    #[serde(flatten)]
    delivery: Quantiles,
    /// Commit returned → ack sent.
    ack: Quantiles,
    offered_per_s: f64,
    achieved_per_s: f64,
    samples: usize,
}

/// Phase 4: producers paced to `rate`; every message's commit, delivery and ack instants, all
/// on this process's monotonic clock.
async fn latency(
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

/// A committed backlog delivered to every consumer.
#[derive(Debug, Clone, Copy)]
struct Drained {
    messages: u64,
    deliveries: u64,
    /// From the streams attaching to the last ack.
    elapsed: Duration,
    /// From the streams attaching until the relay had fanned everything out (to 100 ms).
    relayed: Duration,
    /// From the first ack to the last: `elapsed` without the streams' start-up and the wait
    /// for the first delivery.
    acking: Duration,
    redelivered: u64,
}

/// Commits `n` messages on `topic` with no stream attached, then times `consumers` (with
/// `per_consumer` streams each) from attaching until every delivery is acked.
async fn drain_backlog(
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
async fn drain_backlog_of(
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
async fn drain(b: &Bench, admin: &mut AdminClient, endpoint: &str) -> Result<Drained> {
    drain_backlog(b, admin, endpoint, "bench.drain", &["bench-drain".to_owned()], b.params.drain_messages, STREAMS)
        .await
}

/// Phase 6: the same with several consumers on one topic (a topic per round, so rounds do not
/// feed each other). Also returns, by consumer count, the WAL each round wrote per message: the
/// server's WAL position before the round (before its consumers are created and its backlog is
/// committed) and after it (once outboxd counts every delivery of the round acked), over the
/// round's messages.
async fn fanout(b: &Bench, admin: &mut AdminClient, endpoint: &str) -> Result<(Vec<(u32, Drained)>, ByConsumers)> {
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

/// The server's current WAL write position (`pg_lsn`, as text).
async fn wal_lsn(db: &PgPool) -> Result<String> {
    Ok(sqlx::query_scalar("SELECT pg_current_wal_lsn()::text").fetch_one(db).await?)
}

/// WAL bytes the whole server wrote since `lsn` (every database, outboxd's vacuum rounds and
/// checkpoints' full-page images included).
async fn wal_bytes_since(db: &PgPool, lsn: &str) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint")
        .bind(lsn)
        .fetch_one(db)
        .await?)
}

/// Waits, for at most 10 s, until outboxd counts no delivery of the consumers `names` pending or
/// in flight: the bench counts an ack when it sends it, and outboxd writes the last acks after
/// that. (A warning, not an error, if it does not: only the WAL figure depends on it.)
async fn settle(admin: &mut AdminClient, names: &[String]) -> Result<()> {
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
async fn keyed_drain(b: &Bench, admin: &mut AdminClient, endpoint: &str) -> Result<Vec<(u64, f64, f64)>> {
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

/// Phase 1b, before outboxd starts: producers calling `outbox.enqueue` against producers
/// inserting the same row into `outbox.messages` directly; the ratio of their rates. In a
/// database of its own (`<database>_enqueue`, dropped afterwards), so that outboxd starts on an
/// empty outbox whose statistics never saw these rows: PostgreSQL publishes an idle
/// connection's counts up to 10 s late, and rows counted after their TRUNCATE looked like a
/// table that grew, which outboxd's vacuum round then took up inside the idle phase.
async fn enqueue_function_vs_insert(b: &Bench, bin: &std::path::Path, url: &str) -> Result<(f64, f64)> {
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

/// `xact_commit + xact_rollback` of the current database. PostgreSQL counts every autocommit
/// statement as a transaction, so this counts outboxd's queries (and this reading's own).
async fn transactions(conn: &mut PgConnection) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(conn)
    .await?)
}

async fn autovacuum_running(conn: &mut PgConnection) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                         WHERE datname = current_database() AND backend_type = 'autovacuum worker')",
    )
    .fetch_one(conn)
    .await?)
}

/// Phase 7: transactions per second in the database while outboxd has one idle stream and
/// nothing to do. Runs right after outboxd starts, before any load, so that the delayed
/// statistics of busy connections cannot land in the window.
async fn idle(url: &str, admin: &mut AdminClient, endpoint: &str, len: Duration) -> Result<f64> {
    create_consumer(admin, consumer("bench-idle", &["bench.idle"])).await?;
    let streams = Streams::attach(endpoint, &["bench-idle".to_owned()], 1, IDLE_MAX_IN_FLIGHT, false).await?;
    let mut conn = connect(url).await?;
    // Autovacuum cleaning up after the drain would count as well: let it finish (bounded).
    let quiet_by = Instant::now() + Duration::from_secs(60);
    while autovacuum_running(&mut conn).await? && Instant::now() < quiet_by {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Flushes this connection's statistics now rather than inside the window.
    sqlx::query("SELECT pg_stat_force_next_flush()").execute(&mut conn).await?;
    // PostgreSQL flushes an idle backend's counters up to 10 s late: wait that out, so that
    // earlier work (the ceiling's producers, outboxd's migrations) does not land in the window.
    // It is also long enough for the relay to back off to its longest poll.
    tokio::time::sleep(Duration::from_millis(11_000)).await;
    let before = transactions(&mut conn).await?;
    let start = Instant::now();
    tokio::time::sleep(len).await;
    let after = transactions(&mut conn).await?;
    let elapsed = start.elapsed();
    if autovacuum_running(&mut conn).await? {
        tracing::warn!("autovacuum ran during the idle window; idle_queries_per_s includes it");
    }
    streams.stop().await?;
    conn.close().await?;
    // The first reading's own transaction commits inside the window; the second's after it.
    let outboxd = (after - before - 1).max(0);
    Ok(per_second(outboxd as u64, elapsed))
}

/// Commit → delivery of messages that each come after a quiet spell.
#[derive(Debug, Serialize)]
struct QuietLatency {
    #[serde(flatten)]
    delivery: Quantiles,
    gap_s: f64,
    samples: usize,
}

/// Phase 7b: one message at a time, each `QUIET_GAP` after the last was delivered, committed by
/// a producer's own transaction (the SQL function): outboxd hears of it only by polling or by
/// being woken by the commit (ADR 0051), not through its own `Enqueue`.
async fn latency_after_quiet(b: &Bench, admin: &mut AdminClient, endpoint: &str) -> Result<QuietLatency> {
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

/// Resident memory of a process, from `/proc/PID/status`.
fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading the status of outboxd (pid {pid})"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS line")?;
    line.split_whitespace().nth(1).context("empty VmRSS line")?.parse().context("VmRSS is not a number")
}

/// `outboxd` (the server crate's build), else `outboxd-e2e` (this crate's copy), next to this
/// executable.
fn find_outboxd(explicit: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(path) = explicit {
        ensure!(path.is_file(), "--outboxd {}: no such file", path.display());
        return Ok(path);
    }
    let exe = std::env::current_exe().context("locating this executable")?;
    let dir = exe.parent().context("this executable has no directory")?;
    for name in ["outboxd", "outboxd-e2e"] {
        let path = dir.join(name);
        if path.is_file() {
            return Ok(path);
        }
    }
    bail!(
        "no outboxd or outboxd-e2e next to {}: run `cargo build --release -p outbox-server -p outbox-tests --bins` \
         first, or pass --outboxd PATH",
        exe.display()
    )
}

// ---------------------------------------------------------------------------------------------
// The report

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Figures keyed by consumer count, in the order measured.
#[derive(Debug, Clone, Default)]
struct ByConsumers(Vec<(u32, f64)>);

impl Serialize for ByConsumers {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k.to_string(), v)))
    }
}

#[derive(Debug, Serialize)]
struct Rss {
    start: u64,
    end: u64,
}

/// Figures that explain the headline ones.
#[derive(Debug, Serialize)]
struct Details {
    enqueue_unrelayed_at_end: i64,
    end_to_end_committed_per_s: f64,
    end_to_end_backlog_at_end: u64,
    drain_s: f64,
    drain_relayed_s: f64,
    fanout_messages_per_s: ByConsumers,
    fanout_s: ByConsumers,
    fanout_relayed_s: ByConsumers,
    redeliveries: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    params: Params,
    ceiling_per_s: f64,
    enqueue_per_s: f64,
    end_to_end_per_s: f64,
    ratio_to_ceiling: f64,
    latency_ms: Latency,
    drain_per_s: f64,
    fanout_per_s: ByConsumers,
    idle_queries_per_s: f64,
    outboxd_rss_kib: Rss,
    details: Details,
    /// Commit → delivery with producers paced to `--latency-rate`.
    latency_fixed_ms: Latency,
    sql_function_end_to_end_per_s: f64,
    sql_function_ratio_to_ceiling: f64,
    /// `outbox.enqueue` over a plain INSERT into the same table, no outboxd running.
    enqueue_function_vs_insert: f64,
    enqueue_function_per_s: f64,
    outbox_insert_per_s: f64,
    /// Drain time with k consumers over the time with one.
    fanout_time_ratio: ByConsumers,
    /// Keyed backlog drain rate by depth per key, from the streams attaching to the last ack.
    keyed_drain_per_s: ByDepth,
    /// The same from the first ack to the last.
    keyed_drain_acking_per_s: ByDepth,
    /// Commit → delivery of single messages from the SQL function, each after a quiet spell.
    latency_after_quiet_ms: QuietLatency,
    /// The JetStream reference phase (`None`, null in the JSON, with `--no-jetstream`):
    /// deliveries per second of the same fan-out to k durable pull consumers.
    jetstream_fanout_per_s: Option<ByConsumers>,
    /// `fanout_per_s` over `jetstream_fanout_per_s`, for each k.
    fanout_vs_jetstream: Option<ByConsumers>,
    /// Messages per second of the same drain by one durable pull consumer.
    jetstream_drain_per_s: Option<f64>,
    /// `drain_per_s` over `jetstream_drain_per_s`.
    drain_vs_jetstream: Option<f64>,
    /// WAL bytes the server wrote during each fan-out round (its backlog's commit included),
    /// over the round's messages.
    wal_bytes_per_message: ByConsumers,
}

/// Figures keyed by depth per key.
#[derive(Debug, Clone, Default)]
struct ByDepth(Vec<(u64, f64)>);

impl Serialize for ByDepth {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k.to_string(), v)))
    }
}

/// `12345.6` → `12,346`.
fn grouped(x: f64) -> String {
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

fn quantiles_text(q: &Quantiles) -> String {
    format!("p50 {:.1} / p90 {:.1} / p99 {:.1} / max {:.1} ms", q.p50, q.p90, q.p99, q.max)
}

fn print_table(r: &Report) {
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

// ---------------------------------------------------------------------------------------------

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

/// One soak sample: the interval since the previous one.
#[derive(Debug, Serialize)]
struct SoakSample {
    at_s: u64,
    rss_mib: f64,
    /// Unrelayed messages plus the consumer's pending and in-flight deliveries.
    backlog: i64,
    acked_per_s: f64,
    /// Commit → delivery (enqueue time to receipt), 99th percentile over the interval.
    p99_ms: f64,
    /// Dead rows of outboxd's tables not yet vacuumed (PostgreSQL's statistics).
    dead_rows: i64,
    /// How long the oldest holder of the vacuum horizon has held it (GetStats), 0 if none.
    vacuum_held_s: f64,
}

/// What a soak run saw.
#[derive(Debug, Serialize)]
struct Soak {
    seconds: u64,
    offered_per_s: f64,
    producers: u32,
    acked: u64,
    autovacuum: String,
    synchronous_commit: String,
    samples: Vec<SoakSample>,
    /// A transaction held a snapshot open for the whole run (`--soak-hold-transaction`).
    held_transaction: bool,
    /// The backlog did not grow: at the end it is at most twice the median sample's, or one
    /// second of the offered rate.
    kept_up: bool,
    /// `(seconds since start, RSS KiB)`, as before.
    outboxd_rss_kib: Vec<(u64, u64)>,
}

/// `--soak`: one consumer, four streams, producers paced to `rate` for `seconds`; sampled every
/// tenth of the run, and at least once a minute.
async fn soak(args: &Args, seconds: u64) -> Result<Soak> {
    const TOPIC: &str = "bench.soak";
    let bin = find_outboxd(args.outboxd.clone())?;
    let url = args.database_url.clone();
    recreate_database(&url).await?;
    let db = pool(&url, 4).await?;
    let settings = server_settings(&db).await?;
    let (autovacuum, synchronous_commit) = (settings.1.clone(), settings.2.clone());
    let mut params = Params::new(args, settings);
    params.seconds = seconds;
    let producers = pool(&url, params.producers).await?;
    let b = Bench { params, db, producers, payload: payload() };
    let secure = args.secure.then(Secure::new).transpose()?;
    let outboxd = start_outboxd(&bin, &url, secure.as_ref()).await?;
    let mut admin = outboxd.admin().await?;
    let endpoint = outboxd.endpoint.clone();
    let pid = outboxd.pid();
    let name = TOPIC.replace('.', "-");
    create_consumer(&mut admin, consumer(&name, &[TOPIC])).await?;
    let mut streams =
        Streams::attach(&endpoint, std::slice::from_ref(&name), STREAMS, FLOW_MAX_IN_FLIGHT, false).await?;
    streams.progress.sample_latency.store(true, Ordering::Relaxed);
    // The snapshot every dead row of the run stays visible to, until the end.
    let mut holder = match args.soak_hold_transaction {
        true => {
            let mut conn = b.db.acquire().await?;
            sqlx::query("SET application_name = 'outbox-bench-holder'").execute(&mut *conn).await?;
            sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ").execute(&mut *conn).await?;
            sqlx::query("SELECT count(*) FROM outbox.consumers").execute(&mut *conn).await?;
            Some(conn)
        }
        false => None,
    };
    let run = Producers::start(
        &b.producers,
        b.params.producers,
        Work::Enqueue { topic: TOPIC },
        b.params.window(),
        Some(args.soak_rate),
        false,
        &b.payload,
    )
    .await?;
    let started = Instant::now();
    let n = (seconds / 60).max(10);
    let mut samples = Vec::new();
    let mut rss = vec![(0, rss_kib(pid)?)];
    let (mut last_acked, mut last_at) = (0u64, started);
    for i in 1..=n {
        tokio::time::sleep_until(started + Duration::from_secs(seconds * i / n)).await;
        let at = Instant::now();
        let acked = streams.progress.acked();
        let lat = std::mem::take(&mut *streams.progress.latencies.lock().unwrap_or_else(|e| e.into_inner()));
        let p99_ms =
            Quantiles::of(lat.iter().map(|ms| Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1000.0)).collect())
                .map_or(0.0, |q| q.p99);
        let st = admin.get_stats(pb::GetStatsRequest { consumer: name.clone() }).await?.into_inner();
        let c = st.consumers.first().cloned().unwrap_or_default();
        let rss_now = rss_kib(pid)?;
        let sample = SoakSample {
            at_s: seconds * i / n,
            rss_mib: round(rss_now as f64 / 1024.0, 2),
            backlog: st.unrelayed + c.backlog + c.in_flight,
            acked_per_s: round(per_second(acked - last_acked, at - last_at), 1),
            p99_ms,
            dead_rows: st.tables.iter().map(|t| t.dead_rows).sum(),
            vacuum_held_s: round(
                st.vacuum_horizon
                    .as_ref()
                    .and_then(|h| h.age)
                    .map_or(0.0, |d| d.seconds as f64 + f64::from(d.nanos) / 1e9),
                1,
            ),
        };
        tracing::info!(
            at_s = sample.at_s,
            rss_mib = sample.rss_mib,
            backlog = sample.backlog,
            acked_per_s = sample.acked_per_s,
            p99_ms = sample.p99_ms,
            dead_rows = sample.dead_rows,
            vacuum_held_s = sample.vacuum_held_s,
            "soak"
        );
        rss.push((sample.at_s, rss_now));
        samples.push(sample);
        (last_acked, last_at) = (acked, at);
    }
    let produced = run.finish().await?;
    if let Some(conn) = holder.as_mut() {
        sqlx::query("COMMIT").execute(&mut **conn).await?;
    }
    drop(holder);
    streams.wait_acked(produced.total, budget(produced.total), "the soak's messages").await?;
    streams.stop().await?;
    if !outboxd.terminate(Duration::from_secs(20)).await? {
        tracing::warn!("outboxd exited with an error status");
    }
    let mut backlogs: Vec<i64> = samples.iter().map(|s| s.backlog).collect();
    backlogs.sort_unstable();
    let median = backlogs.get(backlogs.len() / 2).copied().unwrap_or(0);
    let last = samples.last().map_or(0, |s| s.backlog);
    let kept_up = last <= (2 * median).max(args.soak_rate as i64);
    Ok(Soak {
        seconds,
        offered_per_s: args.soak_rate,
        producers: b.params.producers,
        acked: produced.total,
        autovacuum,
        synchronous_commit,
        samples,
        held_transaction: args.soak_hold_transaction,
        kept_up,
        outboxd_rss_kib: rss,
    })
}

/// One `outbox_client::Subscriber` with a handler that does nothing: acked per second, from
/// `run()` to outboxd counting every message acked.
async fn subscriber_throughput(bin: &std::path::Path, url: &str, messages: u64, concurrency: u32) -> Result<f64> {
    recreate_database(url).await?;
    let db = pool(url, 2).await?;
    let outboxd = Outboxd::start_binary(bin, url, OUTBOXD_FLAGS).await?;
    let mut admin = outboxd.admin().await?;
    admin
        .create_consumer(outbox_proto::v1::CreateConsumerRequest {
            consumer: Some(outbox_tests::consumer("bench-subscriber", &["bench.subscriber"])),
        })
        .await?;
    sqlx::query("SELECT count(outbox.enqueue('bench.subscriber', 'Tick', $1)) FROM generate_series(1, $2::bigint)")
        .bind(&payload()[..])
        .bind(i64::try_from(messages)?)
        .execute(&db)
        .await?;
    let within = budget(messages);
    // Polls the consumer's stats until `done` holds, for at most `within`.
    async fn until(
        admin: &mut AdminClient,
        within: Duration,
        what: &str,
        done: impl Fn(&outbox_proto::v1::ConsumerStats) -> bool,
    ) -> Result<()> {
        let started = Instant::now();
        loop {
            let s = admin.get_stats(outbox_proto::v1::GetStatsRequest { consumer: "bench-subscriber".into() }).await?;
            if s.into_inner().consumers.first().is_some_and(&done) {
                return Ok(());
            }
            ensure!(started.elapsed() < within, "{what} within {within:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let all = |n: i64| u64::try_from(n).unwrap_or(0) >= messages;
    until(&mut admin, within, "the relay did not fan out every message", |c| all(c.backlog)).await?;
    let mut config = outbox_client::SubscriberConfig::new(outboxd.endpoint.clone(), "bench-subscriber");
    config.concurrency = usize::try_from(concurrency)?;
    config.max_in_flight = concurrency;
    let stop = tokio_util::sync::CancellationToken::new();
    let started = Instant::now();
    let run = tokio::spawn(
        outbox_client::Subscriber::new(config)
            .run(|_d| async { Ok::<(), outbox_client::HandlerError>(()) }, stop.clone()),
    );
    until(&mut admin, within, "the Subscriber did not ack every message", |c| all(c.acked)).await?;
    let elapsed = started.elapsed();
    stop.cancel();
    run.await??;
    Ok(per_second(messages, elapsed))
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

//! PostgreSQL only (replicas, a database that goes away): the chaos check, in the project's own
//! tests.
//!
//! Three outboxd replicas share one database, reached through a proxy that the test can cut.
//! Producers commit messages (some with ordering keys, some in transactions held open, some
//! rolled back). Consumers apply each delivery's effect with the transactional ack, as a
//! consumer in any language does: the effect and `SELECT outbox.ack(...)` in one transaction,
//! committed when the ack says true, rolled back when it says false, and acked on the stream
//! either way. Some handlers outlast the ack deadline, so leases expire under them while the
//! load goes on. Meanwhile, at random: a replica is SIGKILLed and restarted, a replica is
//! SIGSTOPped for a few seconds (a zombie whose leases expire), outboxd's database sessions are
//! terminated, the database disappears for a moment.
//!
//! Then a history check: every committed message has exactly one effect, no rolled-back
//! message has any, and each ordering key's effects were committed in `seq` order.
//!
//! It runs for `OUTBOX_CHAOS_SECS` seconds (40 by default; the chaos run quoted in the docs is
//! `OUTBOX_CHAOS_SECS=600 cargo test -p outbox-tests --test e2e chaos -- --nocapture`).
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use outbox_proto::v1 as pb;
use outbox_tests::{DbProxy, FAST, Outboxd, RawStream, TestDb, consumer, create_consumer, dur, eventually};
use rand::Rng as _;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::{Mutex, RwLock};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const CONSUMER: &str = "chaos";
const REPLICAS: usize = 3;
const STREAMS: usize = 6;
const PRODUCERS: usize = 2;
/// The consumer's ack deadline; the slow handlers take longer than this.
const ACK_DEADLINE: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Counters {
    deliveries: AtomicU64,
    redeliveries: AtomicU64,
    acked_true: AtomicU64,
    acked_false: AtomicU64,
    handler_errors: AtomicU64,
    slow_handlers: AtomicU64,
    kills: AtomicU64,
    stops: AtomicU64,
    terminations: AtomicU64,
    outages: AtomicU64,
}

/// The running replicas, by slot; consumers pick an endpoint among them.
struct Replicas {
    url: String,
    slots: Mutex<Vec<Option<Outboxd>>>,
    endpoints: RwLock<Vec<String>>,
}

impl Replicas {
    async fn start(url: String) -> Result<Arc<Self>> {
        let mut slots = Vec::new();
        for _ in 0..REPLICAS {
            slots.push(Some(Outboxd::start(&url, FAST).await?));
        }
        let endpoints = slots.iter().flatten().map(|s| s.endpoint.clone()).collect();
        Ok(Arc::new(Self { url, slots: Mutex::new(slots), endpoints: RwLock::new(endpoints) }))
    }

    async fn refresh(&self, slots: &[Option<Outboxd>]) {
        *self.endpoints.write().await = slots.iter().flatten().map(|s| s.endpoint.clone()).collect();
    }

    async fn pick(&self) -> Option<String> {
        let endpoints = self.endpoints.read().await;
        if endpoints.is_empty() {
            return None;
        }
        Some(endpoints[rand::rng().random_range(0..endpoints.len())].clone())
    }

    /// SIGKILL one replica and start a new one in its slot.
    async fn kill_and_restart(&self, slot: usize) -> Result<()> {
        let mut slots = self.slots.lock().await;
        if let Some(srv) = slots[slot].take() {
            srv.kill().await?;
        }
        self.refresh(&slots).await;
        slots[slot] = Some(Outboxd::start(&self.url, FAST).await?);
        self.refresh(&slots).await;
        Ok(())
    }

    /// SIGSTOP one replica for `pause`, then SIGCONT: its streams hang, its leases expire.
    async fn freeze(&self, slot: usize, pause: Duration) -> Result<()> {
        let pid = match &self.slots.lock().await[slot] {
            Some(srv) => srv.pid(),
            None => return Ok(()),
        };
        signal(pid, "-STOP")?;
        tokio::time::sleep(pause).await;
        signal(pid, "-CONT")
    }

    /// Every slot running again (after a failed restart).
    async fn all_running(&self) -> Result<()> {
        let mut slots = self.slots.lock().await;
        for slot in slots.iter_mut() {
            if slot.is_none() {
                *slot = Some(Outboxd::start(&self.url, FAST).await?);
            }
        }
        self.refresh(&slots).await;
        Ok(())
    }
}

fn signal(pid: u32, sig: &str) -> Result<()> {
    let status = std::process::Command::new("kill").args([sig, &pid.to_string()]).status()?;
    if !status.success() {
        bail!("kill {sig} {pid} failed");
    }
    Ok(())
}

/// One consumer stream, reopened on another replica whenever it breaks. Each delivery runs in
/// a handler task of its own (at most `max_in_flight` at once, as the stream bounds them).
async fn consume(replicas: Arc<Replicas>, pool: PgPool, counters: Arc<Counters>, stop: CancellationToken) {
    let mut handlers = JoinSet::new();
    while !stop.is_cancelled() {
        let Some(endpoint) = replicas.pick().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Ok(mut stream) = RawStream::open(&endpoint, CONSUMER, 16).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Some(requests) = stream.requests() else { continue };
        loop {
            match stream.next(Duration::from_millis(200)).await {
                Ok(Some(d)) => {
                    counters.deliveries.fetch_add(1, Ordering::Relaxed);
                    if d.delivery_count > 1 {
                        counters.redeliveries.fetch_add(1, Ordering::Relaxed);
                    }
                    let (pool, counters, requests) = (pool.clone(), counters.clone(), requests.clone());
                    handlers.spawn(async move {
                        let id = d.message_id.clone();
                        match handle(&pool, &counters, d).await {
                            Ok(()) => {
                                // Acked on the stream whatever the transactional ack said.
                                let ack = pb::subscribe_request::Request::Ack(pb::Ack { message_ids: vec![id] });
                                let _ = requests.send(pb::SubscribeRequest { request: Some(ack) }).await;
                            }
                            // The database went away under the handler: no ack; redelivered.
                            Err(_) => {
                                counters.handler_errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                }
                Ok(None) if stop.is_cancelled() => break,
                Ok(None) => {}
                Err(_) => break,
            }
            while handlers.try_join_next().is_some() {}
        }
    }
    while handlers.join_next().await.is_some() {}
}

/// The handler: its effect and the transactional ack in one transaction; committed on true,
/// rolled back on false. A few outlast the ack deadline on purpose.
async fn handle(pool: &PgPool, counters: &Counters, d: pb::Delivery) -> Result<()> {
    let slow = rand::rng().random_bool(0.03);
    let wait = if slow {
        counters.slow_handlers.fetch_add(1, Ordering::Relaxed);
        Duration::from_millis(rand::rng().random_range(1_200..2_500))
    } else {
        Duration::from_millis(rand::rng().random_range(0..15))
    };
    tokio::time::sleep(wait).await;
    let id: Uuid = d.message_id.parse()?;
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO chaos_effects (message_id, seq, ordering_key) VALUES ($1, $2, $3)")
        .bind(id)
        .bind(d.seq)
        .bind(if d.ordering_key.is_empty() { None } else { Some(d.ordering_key.as_str()) })
        .execute(&mut *tx)
        .await?;
    let acked: bool =
        sqlx::query_scalar("SELECT outbox.ack($1, $2)").bind(CONSUMER).bind(id).fetch_one(&mut *tx).await?;
    if acked {
        tx.commit().await?;
        counters.acked_true.fetch_add(1, Ordering::Relaxed);
    } else {
        tx.rollback().await?;
        counters.acked_false.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// A producer: transactions of 1 to 5 messages through `outbox.enqueue`, a third of them keyed
/// (20 keys of its own: seq order is commit order only within one producer's sequence of
/// transactions, and a key's order is seq order); one in 20 held open up to 1.5 s (later messages are relayed first), one in 10
/// rolled back. Returns the ids it committed and those it rolled back.
async fn produce(producer: usize, pool: PgPool, stop: CancellationToken) -> Result<(Vec<Uuid>, Vec<Uuid>)> {
    let (mut committed, mut rolled_back) = (Vec::new(), Vec::new());
    while !stop.is_cancelled() {
        let (n, hold, commit) = {
            let mut rng = rand::rng();
            let hold = rng.random_bool(0.05).then(|| Duration::from_millis(rng.random_range(100..1_500)));
            (rng.random_range(1..=5), hold, !rng.random_bool(0.1))
        };
        let mut tx = pool.begin().await?;
        let mut ids = Vec::with_capacity(n);
        for _ in 0..n {
            let id = Uuid::now_v7();
            let key = {
                let mut rng = rand::rng();
                rng.random_bool(0.33).then(|| format!("p{producer}-k{}", rng.random_range(0..20)))
            };
            sqlx::query("SELECT outbox.enqueue('chaos.orders', 'OrderPlaced', $1, '{}', $2, $3)")
                .bind(id.as_bytes().as_slice())
                .bind(id)
                .bind(key)
                .execute(&mut *tx)
                .await?;
            ids.push(id);
        }
        if let Some(hold) = hold {
            tokio::time::sleep(hold).await;
        }
        if commit {
            tx.commit().await?;
            committed.extend(ids);
        } else {
            tx.rollback().await?;
            rolled_back.extend(ids);
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    Ok((committed, rolled_back))
}

/// Faults at random every 2 to 5 s until `stop`.
async fn faults(
    replicas: Arc<Replicas>,
    owner: PgPool,
    proxy: DbProxy,
    counters: Arc<Counters>,
    stop: CancellationToken,
) {
    loop {
        let (wait, action, slot) = {
            let mut rng = rand::rng();
            (
                Duration::from_millis(rng.random_range(2_000..5_000)),
                rng.random_range(0..4),
                rng.random_range(0..REPLICAS),
            )
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        let done = match action {
            0 => replicas.kill_and_restart(slot).await.map(|()| &counters.kills),
            1 => replicas.freeze(slot, Duration::from_millis(2_500)).await.map(|()| &counters.stops),
            2 => sqlx::query(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name = 'outboxd'",
            )
            .execute(&owner)
            .await
            .map(|_| &counters.terminations)
            .map_err(Into::into),
            _ => {
                proxy.set_up(false);
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                proxy.set_up(true);
                Ok(&counters.outages)
            }
        };
        match done {
            Ok(counter) => {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => eprintln!("chaos: fault {action} on replica {slot} failed: {e:#}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactional_ack_consumers_make_one_effect_per_message_through_kills_stops_and_expiring_leases() -> Result<()>
{
    let secs: u64 = std::env::var("OUTBOX_CHAOS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(40);
    let db = TestDb::create().await?;
    let proxy = DbProxy::start(outbox_tests::db_addr().await?).await?;
    let replicas = Replicas::start(proxy.url_for(&db.url)).await?;
    // Producers, consumers and the test reach the database directly.
    let pool = PgPoolOptions::new().max_connections(40).connect(&db.url).await?;
    sqlx::query("CREATE TABLE chaos_effects (n bigserial PRIMARY KEY, message_id uuid NOT NULL, seq bigint NOT NULL, ordering_key text)")
        .execute(&pool)
        .await?;
    let mut admin = replicas.slots.lock().await[0].as_ref().context("no replica")?.admin().await?;
    let mut spec = consumer(CONSUMER, &["chaos.>"]);
    spec.max_deliveries = 100_000;
    spec.backoff_base = Some(dur(Duration::from_millis(100)));
    spec.backoff_max = Some(dur(Duration::from_secs(1)));
    spec.ack_deadline = Some(dur(ACK_DEADLINE));
    create_consumer(&mut admin, spec).await?;

    let counters = Arc::new(Counters::default());
    let stop_consumers = CancellationToken::new();
    let mut consumers = JoinSet::new();
    for _ in 0..STREAMS {
        consumers.spawn(consume(replicas.clone(), pool.clone(), counters.clone(), stop_consumers.clone()));
    }
    let stop_producers = CancellationToken::new();
    let mut producers = JoinSet::new();
    for p in 0..PRODUCERS {
        producers.spawn(produce(p, pool.clone(), stop_producers.clone()));
    }
    let stop_faults = CancellationToken::new();
    let chaos =
        tokio::spawn(faults(replicas.clone(), pool.clone(), proxy.clone(), counters.clone(), stop_faults.clone()));

    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop_producers.cancel();
    let (mut committed, mut rolled_back) = (Vec::new(), Vec::new());
    while let Some(done) = producers.join_next().await {
        let (c, r) = done??;
        committed.extend(c);
        rolled_back.extend(r);
    }
    stop_faults.cancel();
    chaos.await?;
    proxy.set_up(true);
    replicas.all_running().await?;

    // Every committed message reaches its effect once everything runs again.
    let want = committed.len() as i64;
    let drain = Duration::from_secs(120 + secs / 2);
    let effects = eventually("every committed message's effect", drain, || {
        let pool = pool.clone();
        async move {
            let n: i64 =
                sqlx::query_scalar("SELECT count(DISTINCT message_id) FROM chaos_effects").fetch_one(&pool).await?;
            Ok((n >= want).then_some(n))
        }
    })
    .await;
    stop_consumers.cancel();
    while consumers.join_next().await.is_some() {}

    let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
    eprintln!(
        "chaos: {:.0} s, {} committed, {} rolled back; {} deliveries ({} redeliveries), transactional acks {} true / \
         {} false, {} handler errors, {} slow handlers; {} kills, {} stops, {} session terminations, {} outages",
        started.elapsed().as_secs_f64(),
        committed.len(),
        rolled_back.len(),
        c(&counters.deliveries),
        c(&counters.redeliveries),
        c(&counters.acked_true),
        c(&counters.acked_false),
        c(&counters.handler_errors),
        c(&counters.slow_handlers),
        c(&counters.kills),
        c(&counters.stops),
        c(&counters.terminations),
        c(&counters.outages),
    );

    // The history check.
    let rows: Vec<(Uuid, i64)> =
        sqlx::query_as("SELECT message_id, count(*) FROM chaos_effects GROUP BY message_id").fetch_all(&pool).await?;
    let per_message: HashMap<Uuid, i64> = rows.into_iter().collect();
    let lost: Vec<&Uuid> = committed.iter().filter(|id| !per_message.contains_key(id)).collect();
    let twice: Vec<(&Uuid, &i64)> = per_message.iter().filter(|(_, n)| **n > 1).collect();
    let committed_set: HashSet<&Uuid> = committed.iter().collect();
    let phantom: Vec<&Uuid> = per_message.keys().filter(|id| !committed_set.contains(id)).collect();
    let (stuck,): (i64,) = sqlx::query_as("SELECT count(*) FROM outbox.inbox WHERE consumer = $1 AND state <> 'acked'")
        .bind(CONSUMER)
        .fetch_one(&pool)
        .await?;
    // Per ordering key, effects committed in seq order (the next message of a key is delivered
    // only once the one before is acked, and the ack commits with the effect).
    let keyed: Vec<(String, i64)> =
        sqlx::query_as("SELECT ordering_key, seq FROM chaos_effects WHERE ordering_key IS NOT NULL ORDER BY n")
            .fetch_all(&pool)
            .await?;
    let mut last: HashMap<String, i64> = HashMap::new();
    let mut order_breaks = 0;
    for (key, seq) in keyed {
        if last.get(&key).is_some_and(|prev| *prev > seq) {
            order_breaks += 1;
        }
        last.insert(key, seq);
    }
    eprintln!(
        "chaos: {} lost, {} with two effects, {} effects of rolled-back messages, {} not acked, {} key-order breaks",
        lost.len(),
        twice.len(),
        phantom.len(),
        stuck,
        order_breaks
    );
    effects?;
    assert!(lost.is_empty(), "committed messages with no effect: {lost:?}");
    assert!(twice.is_empty(), "messages with two effects: {twice:?}");
    assert!(phantom.is_empty(), "effects of messages never committed: {phantom:?}");
    assert_eq!(stuck, 0, "deliveries of the consumer not acked");
    assert_eq!(order_breaks, 0, "an ordering key's effects out of seq order");
    assert!(!rolled_back.is_empty() && want > 0, "the run produced both kinds");
    assert!(c(&counters.redeliveries) > 0, "leases expired and were redelivered during the run");
    assert!(c(&counters.kills) + c(&counters.stops) + c(&counters.terminations) + c(&counters.outages) > 0);
    Ok(())
}

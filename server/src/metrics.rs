//! Prometheus metrics on their own listen address (`--metrics-listen`).
//!
//! Counters and histograms are recorded where things happen (sessions, sweeper, relay); the
//! per-consumer gauges come from one stats query every `--metrics-interval`, run by
//! [`GaugeCollector`], so scraping never touches the database.
use std::net::SocketAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::hub::Hub;
use crate::store::SharedStore;

pub const DELIVERIES: &str = "outboxd_deliveries_total";
pub const ACKS: &str = "outboxd_acks_total";
pub const NACKS: &str = "outboxd_nacks_total";
pub const EXPIRED: &str = "outboxd_lease_expirations_total";
pub const DEAD_LETTERED: &str = "outboxd_dead_lettered_total";
pub const RELAYED: &str = "outboxd_relayed_messages_total";
pub const COMMIT_TO_DELIVERY: &str = "outboxd_commit_to_delivery_seconds";
pub const COMMIT_TO_ACK: &str = "outboxd_commit_to_ack_seconds";
pub const RELAY_BATCH_SIZE: &str = "outboxd_relay_batch_messages";
pub const RELAY_BATCH_DURATION: &str = "outboxd_relay_batch_duration_seconds";
pub const SINK_PUBLISHED: &str = "outboxd_sink_published_total";
pub const SINK_CONFIRMED: &str = "outboxd_sink_confirmed_total";
pub const SINK_FAILED: &str = "outboxd_sink_failed_total";
pub const SINK_UNAVAILABLE: &str = "outboxd_sink_unavailable_total";
pub const SINK_CONFIRM: &str = "outboxd_sink_confirm_seconds";
pub const SINK_CONNECTED: &str = "outboxd_sink_connected";

const LATENCY_BUCKETS: &[f64] =
    &[0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0];

/// Installs the global recorder and serves `/metrics` on `addr`.
pub fn install(addr: SocketAddr) -> Result<(), BuildError> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(RELAY_BATCH_SIZE.into()), BATCH_BUCKETS)?
        .install()?;
    describe();
    Ok(())
}

fn describe() {
    describe_counter!(DELIVERIES, "Deliveries sent to streams (each redelivery counts).");
    describe_counter!(ACKS, "Deliveries acked over streams.");
    describe_counter!(NACKS, "Deliveries nacked by consumers.");
    describe_counter!(EXPIRED, "Leases that passed their ack deadline.");
    describe_counter!(DEAD_LETTERED, "Deliveries that became dead letters.");
    describe_counter!(RELAYED, "Messages fanned out to inboxes by this process's relay.");
    describe_counter!(
        crate::grpc::auth::DECISIONS,
        "Authentication and permission decisions by principal and outcome (allowed, denied, unauthenticated)."
    );
    describe_counter!(
        crate::grpc::auth::RELOADS,
        "Re-reads of the auth file and the TLS files that changed, by outcome."
    );
    describe_counter!("outboxd_tls_handshake_failures_total", "TLS handshakes that failed or timed out.");
    describe_histogram!(COMMIT_TO_DELIVERY, Unit::Seconds, "From enqueue to being sent on a stream.");
    describe_histogram!(COMMIT_TO_ACK, Unit::Seconds, "From enqueue to the ack arriving.");
    describe_counter!(SINK_PUBLISHED, "Deliveries a sink published to its target (each redelivery counts).");
    describe_counter!(SINK_CONFIRMED, "Publishes the sink's target confirmed (acked).");
    describe_counter!(SINK_FAILED, "Publishes the target refused or failed, by reason (nacked).");
    describe_counter!(
        SINK_UNAVAILABLE,
        "Publishes left unconfirmed when the target became unreachable (released, published again)."
    );
    describe_histogram!(SINK_CONFIRM, Unit::Seconds, "From publish to the target's confirmation.");
    describe_gauge!(SINK_CONNECTED, "1 while this process's sink is connected to its target.");
    describe_gauge!(
        SINK_SUSPENDED,
        "1 while a sink is stopped: its creator may no longer run it, or its secrets cannot be opened."
    );
    describe_histogram!(RELAY_BATCH_SIZE, "Messages per non-empty relay pass.");
    describe_histogram!(RELAY_BATCH_DURATION, Unit::Seconds, "Duration of non-empty relay passes.");
    describe_gauge!("outboxd_unrelayed_messages", "Committed messages not yet fanned out.");
    describe_gauge!("outboxd_oldest_unrelayed_age_seconds", Unit::Seconds, "Age of the oldest unrelayed message.");
    describe_gauge!("outboxd_consumer_backlog", "Deliveries waiting (pending, including retries).");
    describe_gauge!("outboxd_consumer_in_flight", "Deliveries sent and not yet acked.");
    describe_gauge!("outboxd_consumer_retrying", "Pending deliveries after at least one failure.");
    describe_gauge!("outboxd_consumer_dead", "Dead letters.");
    describe_gauge!("outboxd_consumer_held_keys", "Ordering keys held after a dead letter (dead_key_policy hold).");
    describe_gauge!("outboxd_consumer_oldest_unacked_age_seconds", Unit::Seconds, "Age of the oldest unacked message.");
    describe_gauge!("outboxd_consumer_paused", "1 while the consumer is paused.");
    describe_gauge!("outboxd_consumer_streams", "Streams attached to this process.");
    describe_gauge!("outboxd_table_dead_rows", "Dead rows of an outboxd table not yet vacuumed (SQLite: free pages).");
    describe_gauge!("outboxd_table_live_rows", "Estimated live rows of an outboxd table.");
    describe_gauge!("outboxd_table_bytes", Unit::Bytes, "On-disk size of an outboxd table with its indexes.");
    describe_gauge!(
        VACUUM_HORIZON_AGE,
        Unit::Seconds,
        "How long the oldest transaction or prepared transaction holding back vacuum of outboxd's tables has held it (0: none)."
    );
    describe_gauge!(
        VACUUM_HORIZON_XMIN_AGE,
        "Transactions since the snapshot of the oldest transaction, replication slot or prepared transaction holding back vacuum of outboxd's tables (0: none)."
    );
    describe_gauge!("outboxd_db_pool_connections", "Open database connections.");
    describe_gauge!("outboxd_db_pool_idle_connections", "Idle database connections.");
}

/// Seconds from `since` to `now`, never negative.
pub fn age(now: DateTime<Utc>, since: DateTime<Utc>) -> f64 {
    (now - since).to_std().unwrap_or(Duration::ZERO).as_secs_f64()
}

pub fn delivered(consumer: &str, now: DateTime<Utc>, enqueued_at: DateTime<Utc>) {
    counter!(DELIVERIES, "consumer" => consumer.to_owned()).increment(1);
    histogram!(COMMIT_TO_DELIVERY, "consumer" => consumer.to_owned()).record(age(now, enqueued_at));
}

pub fn acked(consumer: &str, now: DateTime<Utc>, enqueued_at: impl Iterator<Item = DateTime<Utc>>) {
    let h = histogram!(COMMIT_TO_ACK, "consumer" => consumer.to_owned());
    let mut n = 0;
    for t in enqueued_at {
        h.record(age(now, t));
        n += 1;
    }
    counter!(ACKS, "consumer" => consumer.to_owned()).increment(n);
    tally(consumer, |t| t.acked += n);
}

/// What this process counted per consumer since it started, for the console's rates (the
/// Prometheus counters above cannot be read back).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Acks received over this process's streams and sinks.
    pub acked: u64,
    /// Deliveries this process made dead (nacks, expired leases).
    pub dead_lettered: u64,
}

static TALLIES: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<String, Tally>>> =
    std::sync::LazyLock::new(Default::default);

fn tally(consumer: &str, add: impl FnOnce(&mut Tally)) {
    let mut t = TALLIES.lock().unwrap_or_else(|e| e.into_inner());
    match t.get_mut(consumer) {
        Some(x) => add(x),
        None => add(t.entry(consumer.to_owned()).or_default()),
    }
}

/// Every consumer's [`Tally`] so far.
pub fn tallies() -> std::collections::HashMap<String, Tally> {
    TALLIES.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

pub fn nacked(consumer: &str, dead: bool) {
    counter!(NACKS, "consumer" => consumer.to_owned()).increment(1);
    if dead {
        counter!(DEAD_LETTERED, "consumer" => consumer.to_owned()).increment(1);
        tally(consumer, |t| t.dead_lettered += 1);
    }
}

pub fn expired(consumer: &str, dead: bool) {
    counter!(EXPIRED, "consumer" => consumer.to_owned()).increment(1);
    if dead {
        counter!(DEAD_LETTERED, "consumer" => consumer.to_owned()).increment(1);
        tally(consumer, |t| t.dead_lettered += 1);
    }
}

pub fn relayed(messages: u64, took: Duration) {
    counter!(RELAYED).increment(messages);
    histogram!(RELAY_BATCH_SIZE).record(messages as f64);
    histogram!(RELAY_BATCH_DURATION).record(took.as_secs_f64());
}

/// 1 while a sink consumer is stopped: its creator may no longer run it, or it cannot be opened.
pub const SINK_SUSPENDED: &str = "outboxd_sink_suspended";

/// The vacuum horizon's holder (PostgreSQL): how long it has held it, and how many transactions.
pub const VACUUM_HORIZON_AGE: &str = "outboxd_vacuum_horizon_age_seconds";
pub const VACUUM_HORIZON_XMIN_AGE: &str = "outboxd_vacuum_horizon_xmin_age";

/// Refreshes the per-consumer gauges from the store every `interval`.
#[derive(Debug, Clone)]
pub struct GaugeCollector {
    pub store: SharedStore,
    pub clock: SharedClock,
    pub hub: Hub,
    pub interval: Duration,
}

impl GaugeCollector {
    pub async fn run_once(&self) -> Result<(), crate::store::StoreError> {
        let stats = self.store.stats(None, false).await?;
        let now = self.clock.now();
        gauge!("outboxd_unrelayed_messages").set(stats.unrelayed as f64);
        gauge!("outboxd_oldest_unrelayed_age_seconds").set(stats.oldest_unrelayed_at.map_or(0.0, |t| age(now, t)));
        for c in stats.consumers {
            let label = c.consumer;
            gauge!("outboxd_consumer_backlog", "consumer" => label.clone()).set(c.backlog as f64);
            gauge!("outboxd_consumer_in_flight", "consumer" => label.clone()).set(c.in_flight as f64);
            gauge!("outboxd_consumer_retrying", "consumer" => label.clone()).set(c.retrying as f64);
            gauge!("outboxd_consumer_dead", "consumer" => label.clone()).set(c.dead as f64);
            gauge!("outboxd_consumer_held_keys", "consumer" => label.clone()).set(c.held_keys as f64);
            gauge!("outboxd_consumer_oldest_unacked_age_seconds", "consumer" => label.clone())
                .set(c.oldest_unacked_at.map_or(0.0, |t| age(now, t)));
            gauge!("outboxd_consumer_paused", "consumer" => label.clone()).set(if c.paused { 1.0 } else { 0.0 });
            gauge!("outboxd_consumer_streams", "consumer" => label.clone()).set(f64::from(self.hub.streams(&label)));
        }
        let (size, idle) = self.store.pool_status();
        for t in self.store.table_health().await? {
            gauge!("outboxd_table_dead_rows", "table" => t.table.clone()).set(t.dead_rows as f64);
            gauge!("outboxd_table_live_rows", "table" => t.table.clone()).set(t.live_rows as f64);
            gauge!("outboxd_table_bytes", "table" => t.table).set(t.bytes as f64);
        }
        let horizon = self.store.vacuum_horizon().await?;
        gauge!(VACUUM_HORIZON_AGE).set(horizon.as_ref().and_then(|h| h.longest).map_or(0.0, |t| age(now, t)));
        gauge!(VACUUM_HORIZON_XMIN_AGE).set(horizon.map_or(0.0, |h| h.xmin_age as f64));
        gauge!("outboxd_db_pool_connections").set(f64::from(size));
        gauge!("outboxd_db_pool_idle_connections").set(idle as f64);
        Ok(())
    }

    pub async fn run(self, cancel: CancellationToken) {
        loop {
            if let Err(e) = self.run_once().await {
                tracing::warn!(error = %e, "could not refresh metrics gauges");
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }
}

/// One sink's metrics, labelled with its consumer and target kind.
#[derive(Debug, Clone)]
pub struct SinkMetrics {
    consumer: String,
    sink: &'static str,
}

impl SinkMetrics {
    pub fn new(consumer: &str, sink: &'static str) -> Self {
        Self { consumer: consumer.to_owned(), sink }
    }

    pub fn published(&self) {
        counter!(SINK_PUBLISHED, "consumer" => self.consumer.clone(), "sink" => self.sink).increment(1);
    }

    pub fn confirmed(&self, took: Duration) {
        counter!(SINK_CONFIRMED, "consumer" => self.consumer.clone(), "sink" => self.sink).increment(1);
        histogram!(SINK_CONFIRM, "consumer" => self.consumer.clone(), "sink" => self.sink).record(took.as_secs_f64());
    }

    pub fn failed(&self, reason: &'static str) {
        counter!(SINK_FAILED, "consumer" => self.consumer.clone(), "sink" => self.sink, "reason" => reason)
            .increment(1);
    }

    pub fn unavailable(&self) {
        counter!(SINK_UNAVAILABLE, "consumer" => self.consumer.clone(), "sink" => self.sink).increment(1);
    }

    pub fn connected(&self, up: bool) {
        gauge!(SINK_CONNECTED, "consumer" => self.consumer.clone(), "sink" => self.sink).set(if up {
            1.0
        } else {
            0.0
        });
    }
}

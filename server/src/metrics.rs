//! Prometheus metrics on their own listen address (`--metrics-listen`): every metric's name,
//! its description, and the helpers that record them.
//!
//! Counters and histograms are recorded where things happen (sessions, sweeper, relay, the
//! edge); the per-consumer gauges come from one stats query every `--metrics-interval`, run by
//! `maintenance::gauges`, so scraping never touches the database. This module knows no other
//! part of the server: any of them may record.
use std::net::SocketAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder};

pub const DELIVERIES: &str = "outboxd_deliveries_total";
pub const ACKS: &str = "outboxd_acks_total";
pub const NACKS: &str = "outboxd_nacks_total";
pub const EXPIRED: &str = "outboxd_lease_expirations_total";
pub const DEAD_LETTERED: &str = "outboxd_dead_lettered_total";
pub const RELAYED: &str = "outboxd_relayed_messages_total";
pub const COMMIT_TO_DELIVERY: &str = "outboxd_commit_to_delivery_seconds";
pub const COMMIT_TO_ACK: &str = "outboxd_commit_to_ack_seconds";
pub const RELAY_PASS_MESSAGES: &str = "outboxd_relay_batch_messages";
pub const RELAY_PASS_DURATION: &str = "outboxd_relay_batch_duration_seconds";
pub const SINK_PUBLISHED: &str = "outboxd_sink_published_total";
pub const SINK_CONFIRMED: &str = "outboxd_sink_confirmed_total";
pub const SINK_FAILED: &str = "outboxd_sink_failed_total";
pub const SINK_UNAVAILABLE: &str = "outboxd_sink_unavailable_total";
pub const SINK_CONFIRM: &str = "outboxd_sink_confirm_seconds";
pub const SINK_CONNECTED: &str = "outboxd_sink_connected";
/// `outboxd_auth_decisions_total{principal, outcome}`: `allowed`, `denied` or
/// `unauthenticated` (whose principal is `unknown`).
pub const DECISIONS: &str = "outboxd_auth_decisions_total";
/// `outboxd_config_reloads_total{file, outcome}`: re-reads of the auth file and the TLS files.
pub const RELOADS: &str = "outboxd_config_reloads_total";
/// TLS handshakes that failed or timed out.
pub const TLS_HANDSHAKE_FAILURES: &str = "outboxd_tls_handshake_failures_total";
/// Connections closed by the listeners' bounds, by `reason` (`max_client_connections`,
/// `max_connections_per_peer`, `preface_timeout`, `first_stream_timeout`, `control_frame_flood`,
/// `evicted`).
pub const CONNECTIONS_CLOSED: &str = "outboxd_connections_closed_total";
/// Requests refused by a resource limit, by `limit` (the flag's name without dashes).
pub const LIMIT_REFUSALS: &str = "outboxd_limit_refusals_total";

/// The gauges refreshed from the store (`maintenance::gauges`).
pub const UNRELAYED_MESSAGES: &str = "outboxd_unrelayed_messages";
pub const OLDEST_UNRELAYED_AGE: &str = "outboxd_oldest_unrelayed_age_seconds";
pub const CONSUMER_BACKLOG: &str = "outboxd_consumer_backlog";
pub const CONSUMER_IN_FLIGHT: &str = "outboxd_consumer_in_flight";
pub const CONSUMER_RETRYING: &str = "outboxd_consumer_retrying";
pub const CONSUMER_DEAD: &str = "outboxd_consumer_dead";
pub const CONSUMER_HELD_KEYS: &str = "outboxd_consumer_held_keys";
pub const CONSUMER_OLDEST_UNACKED_AGE: &str = "outboxd_consumer_oldest_unacked_age_seconds";
pub const CONSUMER_PAUSED: &str = "outboxd_consumer_paused";
pub const CONSUMER_STREAMS: &str = "outboxd_consumer_streams";
pub const TABLE_DEAD_ROWS: &str = "outboxd_table_dead_rows";
pub const TABLE_LIVE_ROWS: &str = "outboxd_table_live_rows";
pub const TABLE_BYTES: &str = "outboxd_table_bytes";
pub const DB_POOL_CONNECTIONS: &str = "outboxd_db_pool_connections";
pub const DB_POOL_IDLE_CONNECTIONS: &str = "outboxd_db_pool_idle_connections";

const LATENCY_BUCKETS: &[f64] =
    &[0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0];

/// Installs the global recorder and serves `/metrics` on `addr`.
pub fn install(addr: SocketAddr) -> Result<(), BuildError> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(RELAY_PASS_MESSAGES.into()), BATCH_BUCKETS)?
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
    describe_counter!(RELAYED, "Messages fanned out to consumers by this process's relay.");
    describe_counter!(
        DECISIONS,
        "Authentication and permission decisions by principal and outcome (allowed, denied, unauthenticated)."
    );
    describe_counter!(RELOADS, "Re-reads of the auth file and the TLS files that changed, by outcome.");
    describe_counter!(TLS_HANDSHAKE_FAILURES, "TLS handshakes that failed or timed out.");
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
    describe_histogram!(RELAY_PASS_MESSAGES, "Messages per non-empty relay pass.");
    describe_histogram!(RELAY_PASS_DURATION, Unit::Seconds, "Duration of non-empty relay passes.");
    describe_gauge!(UNRELAYED_MESSAGES, "Committed messages not yet fanned out.");
    describe_gauge!(OLDEST_UNRELAYED_AGE, Unit::Seconds, "Age of the oldest unrelayed message.");
    describe_gauge!(CONSUMER_BACKLOG, "Deliveries waiting (pending, including retries).");
    describe_gauge!(CONSUMER_IN_FLIGHT, "Deliveries sent and not yet acked.");
    describe_gauge!(CONSUMER_RETRYING, "Pending deliveries after at least one failure.");
    describe_gauge!(CONSUMER_DEAD, "Dead letters.");
    describe_gauge!(CONSUMER_HELD_KEYS, "Ordering keys held after a dead letter (dead_key_policy hold).");
    describe_gauge!(CONSUMER_OLDEST_UNACKED_AGE, Unit::Seconds, "Age of the oldest unacked message.");
    describe_gauge!(CONSUMER_PAUSED, "1 while the consumer is paused.");
    describe_gauge!(CONSUMER_STREAMS, "Streams attached to this process.");
    describe_gauge!(TABLE_DEAD_ROWS, "Dead rows of an outboxd table not yet vacuumed (SQLite: free pages).");
    describe_gauge!(TABLE_LIVE_ROWS, "Estimated live rows of an outboxd table.");
    describe_gauge!(TABLE_BYTES, Unit::Bytes, "On-disk size of an outboxd table with its indexes.");
    describe_gauge!(
        VACUUM_HORIZON_AGE,
        Unit::Seconds,
        "How long the oldest transaction or prepared transaction holding back vacuum of outboxd's tables has held it (0: none)."
    );
    describe_gauge!(
        VACUUM_HORIZON_XMIN_AGE,
        "Transactions since the snapshot of the oldest transaction, replication slot or prepared transaction holding back vacuum of outboxd's tables (0: none)."
    );
    describe_gauge!(DB_POOL_CONNECTIONS, "Open database connections.");
    describe_gauge!(DB_POOL_IDLE_CONNECTIONS, "Idle database connections.");
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

/// How a sink stands on this process, for the console (the gauges above say the same to
/// Prometheus).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkState {
    Connected,
    Disconnected,
    /// Stopped: its creator may no longer run it, or its secrets cannot be opened here.
    Suspended,
}

impl SinkState {
    pub fn as_str(self) -> &'static str {
        match self {
            SinkState::Connected => "connected",
            SinkState::Disconnected => "disconnected",
            SinkState::Suspended => "suspended",
        }
    }
}

static SINK_STATES: std::sync::LazyLock<std::sync::Mutex<std::collections::HashMap<String, SinkState>>> =
    std::sync::LazyLock::new(Default::default);

/// Records how a sink stands (`None`: it no longer runs here).
pub fn sink_state(consumer: &str, state: Option<SinkState>) {
    let mut s = SINK_STATES.lock().unwrap_or_else(|e| e.into_inner());
    match state {
        Some(state) => {
            s.insert(consumer.to_owned(), state);
        }
        None => {
            s.remove(consumer);
        }
    }
}

/// Every sink's state on this process.
pub fn sink_states() -> std::collections::HashMap<String, SinkState> {
    SINK_STATES.lock().unwrap_or_else(|e| e.into_inner()).clone()
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
    histogram!(RELAY_PASS_MESSAGES).record(messages as f64);
    histogram!(RELAY_PASS_DURATION).record(took.as_secs_f64());
}

/// 1 while a sink consumer is stopped: its creator may no longer run it, or it cannot be opened.
pub const SINK_SUSPENDED: &str = "outboxd_sink_suspended";

/// The vacuum horizon's holder (PostgreSQL): how long it has held it, and how many transactions.
pub const VACUUM_HORIZON_AGE: &str = "outboxd_vacuum_horizon_age_seconds";
pub const VACUUM_HORIZON_XMIN_AGE: &str = "outboxd_vacuum_horizon_xmin_age";

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
        sink_state(&self.consumer, Some(if up { SinkState::Connected } else { SinkState::Disconnected }));
    }
}

//! The PostgreSQL store: schema `outbox`, migrations in `server/migrations`.
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::types::Json;
use sqlx::{Executor, PgConnection, Postgres, Row, Transaction};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::records::{
    ConsumerRecord, DeliveryRecord, ExpiredRecord, MessageRef, delivery_count, headers_from_json, headers_to_json, ms,
};
use super::{
    ConsoleSession, ConsumerStats, DeadGroup, DeadLetter, DeadLetterPageParams, Enqueued, ExpiredLease, ExtendParams,
    HeldKey, HintSender, LeaseParams, LeasedDelivery, MessageSummary, NewMessage, Pruned, RelayTx, Release,
    ReleaseGuard, ReplayCandidate, ReplayCandidatesParams, Result, SearchPage, SearchParams, Store, StoreError,
    StoreTx, StoredMessage, TableHealth, TailEntry, UnackedDelivery, UnackedKind, UnackedPage, UnackedPageParams,
    VacuumHorizon,
};
use crate::domain::{Attempt, Consumer, ConsumerName, ConsumerSpec, DeliveryState, MessageId};
use listener::WorkListener;

mod conninfo;
mod listener;
mod relay;

/// The named statements of `queries/*.sql` (ADR 0061), one constant each, generated at compile
/// time by `build.rs`.
pub(crate) mod q {
    include!(concat!(env!("OUT_DIR"), "/postgres_queries.rs"));
}

/// Serialises consumer creation and deletion against relay passes (shared by relays, exclusive
/// for consumer changes), so a relay pass never fans out with a stale list of consumers.
pub(super) const CONSUMERS_LOCK: i64 = 0x6f75_7462_6f78_0001;

/// Held (per transaction) by the replica that is pruning.
pub(crate) const PRUNE_LOCK: i64 = 0x6f75_7462_6f78_0002;

/// The channel on which relays announce new deliveries, before the database's channel key
/// (`outbox.settings.channel_key`, migration 0028: any login may NOTIFY a channel it can name):
/// the payload is a comma-separated list of consumer names, or empty for "all".
pub const WORK_CHANNEL: &str = "outbox_work_";
/// Where producers' statements wake a relay that asked for it (ADR 0051), before the wake key
/// (`outbox.settings.wake_key`; `outbox.wake_relay` in server/sql/functions.sql names it too).
pub const ENQUEUED_CHANNEL: &str = "outbox_enqueued_";

/// This database's two notification channels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Channels {
    pub work: String,
    pub enqueued: String,
}

/// How long opening the database at start-up waits for an answer, as the pools' acquire timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `f`, a connection of its own with no timeout, given [`CONNECT_TIMEOUT`]: a host that takes
/// the connection and never answers (or drops the packets) would hold start-up for ever.
async fn answered<T>(f: impl Future<Output = T>) -> Result<T> {
    tokio::time::timeout(CONNECT_TIMEOUT, f).await.map_err(|_| StoreError::ConnectTimeout(CONNECT_TIMEOUT))
}

/// How long a relay pass's transaction may sit idle between its statements before PostgreSQL
/// ends it (and with it the relays' turn it holds). A pass's statements follow each other
/// within milliseconds.
const RELAY_IDLE_IN_TRANSACTION: &str = "10s";

/// Connections of the relay's own pool (a relay loop and its helper).
const RELAY_CONNECTIONS: u32 = 2;
/// The session advisory lock of the vacuum round (one replica at a time).
const VACUUM_LOCK: i64 = 0x6f75_7462_6f78_0003;
/// Connections of the lease pool (see `PgStore::lease_pool`).
const LEASE_CONNECTIONS: u32 = 4;
/// Settings of the lease pool's connections (see `PgStore::lease_pool`).
pub(crate) const LEASE_SETTINGS: &[(&str, &str)] =
    &[("plan_cache_mode", "force_generic_plan"), ("enable_seqscan", "off")];

pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Every SQL function of schema `outbox`, as it is now (ADR 0043): applied after the migrations
/// when the database holds an older revision, or this revision with another digest.
pub(crate) const FUNCTIONS: &str = include_str!("../../../sql/functions.sql");

/// The revision of [`FUNCTIONS`], which its first line states too: one more with every release
/// that changes the file, so that an older release never replaces a newer one's functions.
pub(crate) const FUNCTIONS_REVISION: i32 = 12;

/// The last migration that defined SQL functions; later ones leave that to [`FUNCTIONS`].
#[cfg(test)]
pub(crate) const LAST_MIGRATION_WITH_FUNCTIONS: i64 = 14;

/// Applies [`FUNCTIONS`] unless the database holds this version of it or a later revision.
/// Returns whether it applied. Replicas starting together take turns on the table's lock; the
/// one that comes second finds the version current and writes nothing.
async fn apply_functions(pool: &PgPool) -> Result<bool> {
    let mut tx = pool.begin().await?;
    sqlx::query(q::FUNCTION_SOURCE_LOCK).execute(&mut *tx).await?;
    let held: Option<(i32, bool)> =
        sqlx::query_as(q::FUNCTION_SOURCE_HELD).bind(FUNCTIONS).fetch_optional(&mut *tx).await?;
    match held {
        Some((revision, _)) if revision > FUNCTIONS_REVISION => {
            tracing::warn!(
                held = revision,
                ours = FUNCTIONS_REVISION,
                "the database holds the SQL functions of a newer release; leaving them"
            );
            tx.commit().await?;
            return Ok(false);
        }
        Some((revision, true)) if revision == FUNCTIONS_REVISION => {
            tx.commit().await?;
            return Ok(false);
        }
        _ => {}
    }
    sqlx::raw_sql(FUNCTIONS).execute(&mut *tx).await?;
    sqlx::query(q::FUNCTION_SOURCE_RECORD).bind(FUNCTIONS).bind(FUNCTIONS_REVISION).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(true)
}

/// Seqs as runs of consecutive values, `[lo[i], hi[i])`, in order, each seq once.
fn seq_runs(seqs: impl Iterator<Item = i64>) -> (Vec<i64>, Vec<i64>) {
    let mut seqs: Vec<i64> = seqs.collect();
    seqs.sort_unstable();
    seqs.dedup();
    let (mut lo, mut hi) = (Vec::new(), Vec::<i64>::new());
    for seq in seqs {
        match hi.last_mut() {
            Some(end) if *end == seq => *end = seq + 1,
            _ => {
                lo.push(seq);
                hi.push(seq + 1);
            }
        }
    }
    (lo, hi)
}

/// The PostgreSQL driver. Cheap to clone (pool handles).
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    /// For relay passes only: commits without waiting for the WAL flush (see `relay_pass`).
    relay_pool: PgPool,
    /// For leases and next-due reads only: `plan_cache_mode = force_generic_plan`, so that each
    /// connection plans these statements once instead of at every call (their plans do not
    /// depend on the values, by construction and by test: ADR 0016; planning them costs more
    /// than running them, and streams lease many times a second under load), and
    /// `enable_seqscan = off`, so that a plan cached while the tables were empty still reads
    /// them through their indexes once they are not (ADR 0046).
    lease_pool: PgPool,
    /// The consumers as the last relay pass of this process read them, at their version
    /// (ADR 0078): a pass's claim brings them again only when the version moved.
    relay_consumers: Arc<std::sync::Mutex<relay::RelayConsumers>>,
}

fn message_from_row(row: &PgRow) -> Result<StoredMessage> {
    Ok(StoredMessage {
        message_id: MessageId(row.try_get("message_id")?),
        seq: row.try_get("seq")?,
        topic: row.try_get("topic")?,
        type_: row.try_get("type")?,
        payload: row.try_get("payload")?,
        headers: headers_from_json(row.try_get::<Json<serde_json::Value>, _>("headers")?.0),
        ordering_key: row.try_get("ordering_key")?,
        enqueued_at: row.try_get("enqueued_at")?,
        available_at: row.try_get("available_at")?,
        relayed_at: row.try_get("relayed_at")?,
    })
}

/// Seqs as an `int8multirange` literal: `{[1,4),[7,8)}`.
pub(crate) fn multirange(seqs: &[i64]) -> String {
    let (lo, hi) = seq_runs(seqs.iter().copied());
    let parts: Vec<String> = lo.iter().zip(&hi).map(|(lo, hi)| format!("[{lo},{hi})")).collect();
    format!("{{{}}}", parts.join(","))
}

fn consumer_from_row(row: &PgRow) -> Result<ConsumerRecord> {
    Ok(ConsumerRecord {
        name: row.try_get("name")?,
        topics: row.try_get("topics")?,
        max_deliveries: i64::from(row.try_get::<i32, _>("max_deliveries")?),
        backoff_base_ms: row.try_get("backoff_base_ms")?,
        backoff_max_ms: row.try_get("backoff_max_ms")?,
        ack_deadline_ms: row.try_get("ack_deadline_ms")?,
        start_from: row.try_get("start_from")?,
        sink: row.try_get::<Option<Json<serde_json::Value>>, _>("sink")?.map(|s| s.0),
        dead_key_policy: row.try_get("dead_key_policy")?,
        paused: row.try_get("paused")?,
        start_seq: row.try_get("start_seq")?,
        created_at: row.try_get("created_at")?,
        created_by: row.try_get("created_by")?,
    })
}

/// One consumer's row, on the caller's executor (a pool or a transaction).
async fn consumer_find<'e, E>(exec: E, name: &str) -> Result<Option<ConsumerRecord>>
where
    E: Executor<'e, Database = Postgres>,
{
    let row = sqlx::query(q::CONSUMER_FIND).bind(name).fetch_optional(exec).await?;
    row.as_ref().map(consumer_from_row).transpose()
}

fn delivery_from_row(row: &PgRow) -> Result<DeliveryRecord> {
    Ok(DeliveryRecord {
        consumer: row.try_get("consumer")?,
        state: row.try_get("state")?,
        delivery_count: i64::from(row.try_get::<i32, _>("delivery_count")?),
        available_at: row.try_get("available_at")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        last_error: row.try_get("last_error")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        acked_at: row.try_get("acked_at")?,
        dead_at: row.try_get("dead_at")?,
    })
}

fn count(row: &PgRow, column: &str) -> Result<u32> {
    delivery_count(i64::from(row.try_get::<i32, _>(column)?))
}

/// Inserts one message through `outbox.enqueue_message`, on the caller's executor (a pool, a
/// connection, or the producer's own transaction). `at` is the enqueue time; `None` lets the
/// database use `now()`.
pub async fn message_insert<'e, E>(exec: E, msg: &NewMessage, at: Option<DateTime<Utc>>) -> Result<Enqueued>
where
    E: Executor<'e, Database = Postgres>,
{
    let row = sqlx::query(q::MESSAGE_INSERT)
        .bind(msg.topic.as_str())
        .bind(&msg.type_)
        .bind(&msg.payload)
        .bind(Json(headers_to_json(&msg.headers)))
        .bind(msg.message_id.map(|m| m.0))
        .bind(msg.ordering_key.as_deref())
        .bind(msg.delay.map(ms))
        .bind(at)
        .fetch_one(exec)
        .await?;
    Ok(Enqueued {
        message_id: MessageId(row.try_get("id")?),
        seq: row.try_get("message_seq")?,
        duplicate: row.try_get("is_duplicate")?,
    })
}

impl PgStore {
    /// Connects, creating the database first if it does not exist. Every connection, the
    /// maintenance one that checks for the database included, takes the URL's TLS parameters
    /// as [`conninfo::prepare`] left them.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let url = &*conninfo::prepare(url)?;
        if !answered(Postgres::database_exists(url)).await?? {
            // Another replica may create it at the same moment; only a still-missing database is an error.
            if let Err(e) = answered(Postgres::create_database(url)).await?
                && !answered(Postgres::database_exists(url)).await??
            {
                return Err(e.into());
            }
            tracing::info!("created database");
        }
        // JIT compiles a plan on every execution once its estimated cost passes a threshold; for
        // outboxd's short statements that costs 100 ms or more per call and never pays back (a
        // relay pass went from 13 to 130 ms with it).
        let options = PgConnectOptions::from_str(url)?.application_name("outboxd").options([("jit", "off")]);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.clone())
            .await?;
        let relay_pool = PgPoolOptions::new()
            .max_connections(RELAY_CONNECTIONS)
            .acquire_timeout(Duration::from_secs(10))
            // A pass holds the relays' turn and the consumers lock across its round trips
            // (ADR 0067): a relay whose process froze or whose network went mid-pass must not
            // hold every replica's relaying, and consumer changes, for the kernel's keepalive.
            .connect_lazy_with(options.clone().options([
                ("synchronous_commit", "off"),
                ("idle_in_transaction_session_timeout", RELAY_IDLE_IN_TRANSACTION),
            ]));
        // Connected now, not at the first lease: a stream's first lease must not wait for a
        // connection to open while the relay pushes later messages to it.
        let lease_pool = PgPoolOptions::new()
            .max_connections(LEASE_CONNECTIONS.min(max_connections.max(1)))
            .min_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.options(LEASE_SETTINGS.iter().copied()))
            .await?;
        // Whether the connections are encrypted, which `sslmode=prefer` (the default) leaves
        // to the server: said once, so that an operator need not guess. Behind a connection
        // pooler this is the pooler's session with PostgreSQL.
        match sqlx::query_scalar::<_, Option<String>>(q::CONNECTION_TLS).fetch_optional(&pool).await {
            Ok(tls) => {
                tracing::info!(database_tls = tls.flatten().as_deref().unwrap_or("off"), "connected to PostgreSQL")
            }
            Err(e) => tracing::warn!(error = %e, "connected to PostgreSQL; cannot read whether the session uses TLS"),
        }
        Ok(Self { pool, relay_pool, lease_pool, relay_consumers: Arc::default() })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// This database's notification channels: [`WORK_CHANNEL`] with its channel key and
    /// [`ENQUEUED_CHANNEL`] with its wake key.
    pub async fn channels(&self) -> Result<Channels> {
        let (work, wake): (String, String) = sqlx::query_as(q::SETTINGS_CHANNEL_KEYS).fetch_one(&self.pool).await?;
        Ok(Channels { work: format!("{WORK_CHANNEL}{work}"), enqueued: format!("{ENQUEUED_CHANNEL}{wake}") })
    }

    /// A listener on this database's channels, on its own connection, and their names.
    pub async fn work_listener(&self) -> Result<(PgListener, Channels)> {
        let channels = self.channels().await?;
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen_all([channels.work.as_str(), channels.enqueued.as_str()]).await?;
        Ok((listener, channels))
    }
}

#[async_trait::async_trait]
impl Store for PgStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    /// A pass costs per consumer and topic, not per message (ADR 0042): larger passes drain a
    /// backlog faster, and a pass that found little goes again at once.
    fn relay_defaults(&self) -> super::RelayDefaults {
        super::RelayDefaults { pass_size: 2000, gather: Duration::ZERO }
    }

    async fn close(&self) {
        self.lease_pool.close().await;
        self.relay_pool.close().await;
        self.pool.close().await;
    }

    fn pool_status(&self) -> (u32, usize) {
        (self.pool.size(), self.pool.num_idle())
    }

    async fn watch(&self, hints: HintSender, cancel: CancellationToken) {
        WorkListener::new(self.clone(), hints).run(cancel).await;
    }

    async fn begin(&self) -> Result<Box<dyn StoreTx>> {
        Ok(Box::new(PgTx(self.pool.begin().await?)))
    }

    /// Holds [`CONSUMERS_LOCK`] exclusively until the transaction ends.
    async fn begin_consumer_change(&self) -> Result<Box<dyn StoreTx>> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(q::CONSUMERS_LOCK).bind(CONSUMERS_LOCK).execute(&mut *tx).await?;
        Ok(Box::new(PgTx(tx)))
    }

    /// Applies pending migrations (safe to run from several replicas at once: sqlx takes an
    /// advisory lock) and then the SQL functions' source when it changed, then refreshes planner
    /// statistics so cached claim plans start sane.
    async fn migrate(&self) -> Result<()> {
        MIGRATOR.run(&self.pool).await?;
        if apply_functions(&self.pool).await? {
            tracing::info!("SQL functions applied");
        }
        sqlx::query(q::TABLES_ANALYZE).execute(&self.pool).await?;
        Ok(())
    }

    async fn settings_write(&self, max_payload_bytes: usize) -> Result<()> {
        sqlx::query(q::SETTINGS_WRITE)
            .bind(i32::try_from(max_payload_bytes).unwrap_or(i32::MAX))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// One autocommit statement.
    async fn message_insert(&self, msg: &NewMessage, now: DateTime<Utc>) -> Result<Enqueued> {
        message_insert(&self.pool, msg, Some(now)).await
    }

    async fn message_find(&self, id: MessageId) -> Result<Option<StoredMessage>> {
        let row = sqlx::query(q::MESSAGE_FIND).bind(id.0).fetch_optional(&self.pool).await?;
        row.as_ref().map(message_from_row).transpose()
    }

    async fn message_unrelayed_summary(&self) -> Result<(i64, Option<DateTime<Utc>>)> {
        let row = sqlx::query(q::MESSAGE_UNRELAYED_SUMMARY).fetch_one(&self.pool).await?;
        Ok((row.try_get("unrelayed")?, row.try_get("oldest")?))
    }

    async fn begin_relay(&self) -> Result<Box<dyn RelayTx>> {
        Ok(Box::new(self.relay_tx().await?))
    }

    async fn consumer_find(&self, name: &str) -> Result<Option<ConsumerRecord>> {
        consumer_find(&self.pool, name).await
    }

    async fn consumer_list(&self) -> Result<Vec<Consumer>> {
        let rows = sqlx::query(q::CONSUMER_LIST).fetch_all(&self.pool).await?;
        rows.iter().map(|r| Consumer::try_from(consumer_from_row(r)?)).collect()
    }

    async fn console_session_insert(&self, s: &ConsoleSession) -> Result<()> {
        sqlx::query(q::CONSOLE_SESSION_INSERT)
            .bind(&s.id_hash[..])
            .bind(&s.principal)
            .bind(&s.token_hash[..])
            .bind(s.created_at)
            .bind(s.expires_at)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn console_session_find(&self, id_hash: &[u8; 32]) -> Result<Option<ConsoleSession>> {
        let Some(row) = sqlx::query(q::CONSOLE_SESSION_FIND).bind(&id_hash[..]).fetch_optional(&self.pool).await?
        else {
            return Ok(None);
        };
        let token: Vec<u8> = row.try_get("token_hash")?;
        Ok(Some(ConsoleSession {
            id_hash: *id_hash,
            principal: row.try_get("principal")?,
            token_hash: token
                .try_into()
                .map_err(|_| StoreError::InvalidValue("stored console session: token_hash is not 32 bytes".into()))?,
            created_at: row.try_get("created_at")?,
            seen_at: row.try_get("seen_at")?,
            expires_at: row.try_get("expires_at")?,
        }))
    }

    async fn console_session_touch(&self, id_hash: &[u8; 32], now: DateTime<Utc>) -> Result<()> {
        sqlx::query(q::CONSOLE_SESSION_TOUCH).bind(&id_hash[..]).bind(now).execute(&self.pool).await?;
        Ok(())
    }

    async fn console_session_delete(&self, id_hash: &[u8; 32]) -> Result<bool> {
        let done = sqlx::query(q::CONSOLE_SESSION_DELETE).bind(&id_hash[..]).execute(&self.pool).await?;
        Ok(done.rows_affected() > 0)
    }

    async fn console_session_delete_expired(&self, now: DateTime<Utc>, idle_since: DateTime<Utc>) -> Result<u64> {
        let done =
            sqlx::query(q::CONSOLE_SESSION_DELETE_EXPIRED).bind(now).bind(idle_since).execute(&self.pool).await?;
        Ok(done.rows_affected())
    }

    async fn console_session_delete_oldest(&self, principal: &str, keep: i64) -> Result<u64> {
        let done = sqlx::query(q::CONSOLE_SESSION_DELETE_OLDEST).bind(principal).bind(keep).execute(&self.pool).await?;
        Ok(done.rows_affected())
    }

    async fn consumer_set_paused(&self, name: &ConsumerName, paused: bool) -> Result<Consumer> {
        let row =
            sqlx::query(q::CONSUMER_SET_PAUSED).bind(name.as_str()).bind(paused).fetch_optional(&self.pool).await?;
        let row = row.ok_or_else(|| StoreError::ConsumerNotFound(name.to_string()))?;
        Consumer::try_from(consumer_from_row(&row)?)
    }

    /// Leases up to `limit` due deliveries of one consumer to a delivery session (see
    /// `delivery_lease` in queries/lease.sql). Nothing is leased while the consumer is paused.
    async fn delivery_lease(&self, p: &LeaseParams<'_>) -> Result<Vec<LeasedDelivery>> {
        let LeaseParams { consumer, session, limit, keys_after, lease_until, now } = *p;
        let rows = sqlx::query(q::DELIVERY_LEASE)
            .bind(consumer.as_str())
            .bind(now)
            .bind(limit)
            .bind(lease_until)
            .bind(session)
            .bind(keys_after)
            .fetch_all(&self.lease_pool)
            .await?;
        let mut out = rows
            .iter()
            .map(|row| {
                Ok(LeasedDelivery {
                    message: message_from_row(row)?,
                    delivery_count: count(row, "delivery_count")?,
                    lease_expires_at: lease_until,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        out.sort_by_key(|d| d.message.seq);
        Ok(out)
    }

    /// Acks deliveries; acking an acked delivery changes nothing. Returns how many changed.
    async fn delivery_ack_many(&self, consumer: &ConsumerName, ids: &[MessageId], now: DateTime<Utc>) -> Result<u64> {
        let ids: Vec<Uuid> = ids.iter().map(|m| m.0).collect();
        // Rows and leased ranges alike, in one call (ADR 0041, 0065).
        let changed: i64 = sqlx::query_scalar(q::DELIVERY_ACK_BATCH)
            .bind(consumer.as_str())
            .bind(&ids)
            .bind(now)
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(changed).unwrap_or(0))
    }

    /// The seqs go as runs of consecutive values, so the call finds range-held deliveries
    /// without a look-up per id (ADR 0045), and rows by a range scan per run (ADR 0048).
    async fn delivery_ack_held(
        &self,
        consumer: &ConsumerName,
        held: &[(MessageId, i64)],
        now: DateTime<Utc>,
    ) -> Result<u64> {
        let (lo, hi) = seq_runs(held.iter().map(|(_, seq)| *seq));
        let changed: i64 = sqlx::query_scalar(q::DELIVERY_ACK_SEQS)
            .bind(consumer.as_str())
            .bind(&lo)
            .bind(&hi)
            .bind(now)
            .fetch_one(&self.pool)
            .await?;
        Ok(u64::try_from(changed).unwrap_or(0))
    }

    /// Moves leased deliveries back to pending (with their next due time) or to dead, in one
    /// statement. Only leases that `guard` allows are touched, so a release never undoes an
    /// ack or another session's lease.
    async fn delivery_release_many(
        &self,
        releases: &[Release],
        guard: ReleaseGuard<'_>,
        now: DateTime<Utc>,
    ) -> Result<u64> {
        if releases.is_empty() {
            return Ok(0);
        }
        let consumers: Vec<&str> = releases.iter().map(|r| r.consumer.as_str()).collect();
        let ids: Vec<Uuid> = releases.iter().map(|r| r.message_id.0).collect();
        let states: Vec<&str> = releases.iter().map(|r| r.state.as_str()).collect();
        let due: Vec<DateTime<Utc>> = releases.iter().map(|r| r.available_at).collect();
        let errors: Vec<Option<&str>> = releases.iter().map(|r| r.error.as_deref()).collect();
        let withdrawn: Vec<bool> = releases.iter().map(|r| r.attempt == Attempt::Withdrawn).collect();
        let (session, expired_at) = match guard {
            ReleaseGuard::Session(s) => (Some(s), None),
            ReleaseGuard::ExpiredAt(t) => (None, Some(t)),
        };
        let mut tx = self.pool.begin().await?;
        // Range-held first deliveries become leased rows first, so that one statement below
        // decides every release (ADR 0041).
        sqlx::query(q::DELIVERY_RANGES_TO_ROWS)
            .bind(&consumers)
            .bind(&ids)
            .bind(session)
            .bind(expired_at)
            .execute(&mut *tx)
            .await?;
        let done = sqlx::query(q::DELIVERY_RELEASE_ROWS)
            .bind(&consumers)
            .bind(&ids)
            .bind(&states)
            .bind(&due)
            .bind(&errors)
            .bind(now)
            .bind(session)
            .bind(expired_at)
            .bind(&withdrawn)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(u64::try_from(done.try_get::<i64, _>(0)?).unwrap_or(0))
    }

    /// Leases whose deadline has passed, oldest first.
    async fn delivery_expired(&self, now: DateTime<Utc>, limit: i64) -> Result<Vec<ExpiredLease>> {
        // Expired leased ranges become leased rows (count 1) that the query below finds.
        sqlx::query(q::DELIVERY_RANGES_TO_ROWS_EXPIRED).bind(now).execute(&self.pool).await?;
        let rows = sqlx::query(q::DELIVERY_EXPIRED_ROWS).bind(now).bind(limit).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                ExpiredLease::try_from(ExpiredRecord {
                    consumer: row.try_get("consumer")?,
                    message_id: MessageId(row.try_get("message_id")?),
                    delivery_count: i64::from(row.try_get::<i32, _>("delivery_count")?),
                    max_deliveries: i64::from(row.try_get::<i32, _>("max_deliveries")?),
                    backoff_base_ms: row.try_get("backoff_base_ms")?,
                    backoff_max_ms: row.try_get("backoff_max_ms")?,
                })
            })
            .collect()
    }

    async fn delivery_next_expiry(&self) -> Result<Option<DateTime<Utc>>> {
        Ok(sqlx::query_scalar(q::DELIVERY_NEXT_EXPIRY).fetch_one(&self.pool).await?)
    }

    /// Pushes the deadline of the named leases this session holds, and of no other: a
    /// range-held one first becomes a `leased` row of its own (`outbox.unbatch`, as a release
    /// does), so that the deliveries pushed beside it keep their deadline (T7, as on SQLite).
    async fn delivery_extend_many(&self, p: &ExtendParams<'_>) -> Result<u64> {
        let ExtendParams { consumer, session, ids, until, now } = *p;
        let id_list: Vec<Uuid> = ids.iter().map(|m| m.0).collect();
        let consumers: Vec<&str> = ids.iter().map(|_| consumer.as_str()).collect();
        let mut tx = self.pool.begin().await?;
        sqlx::query(q::DELIVERY_RANGES_TO_ROWS_TO_EXTEND)
            .bind(&consumers)
            .bind(&id_list)
            .bind(session)
            .execute(&mut *tx)
            .await?;
        let changed = sqlx::query(q::DELIVERY_EXTEND_ROWS)
            .bind(consumer.as_str())
            .bind(&id_list)
            .bind(session)
            .bind(until)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(changed.rows_affected())
    }

    /// The earliest `available_at` among a consumer's pending deliveries, to sleep until then
    /// (see `delivery_next_due` in queries/lease.sql).
    async fn delivery_next_due(&self, consumer: &ConsumerName) -> Result<Option<DateTime<Utc>>> {
        let row = sqlx::query(q::DELIVERY_NEXT_DUE).bind(consumer.as_str()).fetch_one(&self.lease_pool).await?;
        if !row.try_get::<bool, _>("present")? {
            return Err(StoreError::ConsumerNotFound(consumer.to_string()));
        }
        Ok(row.try_get("due")?)
    }

    /// From `pg_stat_user_tables` (the statistics collector's counts, no scan) and the
    /// relations' sizes with their indexes and TOAST.
    /// The oldest snapshot that keeps vacuum from removing dead rows of outboxd's tables: a
    /// session of this database (or a walsender) with a `backend_xmin` or a transaction id, a replication slot's
    /// `xmin` (a standby's feedback; a logical slot's `catalog_xmin` holds back only the
    /// catalogs), a prepared transaction. Sessions of other roles show their `backend_xmin`
    /// but not their details unless outboxd's login has `pg_read_all_stats`.
    async fn vacuum_horizon(&self) -> Result<Option<VacuumHorizon>> {
        let row = sqlx::query(q::VACUUM_HORIZON).fetch_optional(&self.pool).await?;
        row.map(|r| {
            Ok(VacuumHorizon {
                kind: r.try_get("kind")?,
                since: r.try_get("since")?,
                xmin_age: r.try_get("xmin_age")?,
                pid: r.try_get("pid")?,
                application_name: r.try_get("application_name")?,
                state: r.try_get("state")?,
                name: r.try_get("name")?,
                longest: r.try_get("longest")?,
            })
        })
        .transpose()
    }

    async fn table_health(&self) -> Result<Vec<TableHealth>> {
        let rows = sqlx::query(q::TABLE_HEALTH).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(TableHealth {
                    table: r.try_get("table_name")?,
                    live_rows: r.try_get("live")?,
                    dead_rows: r.try_get("dead")?,
                    bytes: r.try_get("bytes")?,
                    last_vacuum: r.try_get("last_vacuum")?,
                })
            })
            .collect()
    }

    /// `VACUUM (ANALYZE)` (not FULL: it takes no lock that blocks reads or writes; ANALYZE,
    /// so that cached plans are made again for the table's new size) of each table, on one
    /// connection holding a session advisory lock, so that of several replicas one vacuums at a
    /// time and the others skip the round.
    async fn vacuum_tables(&self, tables: &[String]) -> Result<Vec<String>> {
        if tables.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.pool.acquire().await?;
        let locked: bool = sqlx::query_scalar(q::VACUUM_LOCK_TRY).bind(VACUUM_LOCK).fetch_one(&mut *conn).await?;
        if !locked {
            return Ok(Vec::new());
        }
        let mut done = Vec::new();
        let mut failed = None;
        for table in tables {
            // Names from the catalog of our own schema, quoted.
            let sql = format!("VACUUM (ANALYZE) outbox.\"{}\"", table.replace('"', "\"\""));
            match sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut *conn).await {
                Ok(_) => done.push(table.clone()),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let unlocked = sqlx::query(q::VACUUM_UNLOCK).bind(VACUUM_LOCK).execute(&mut *conn).await;
        if unlocked.is_err() {
            conn.close_on_drop();
        }
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(done),
        }
    }

    async fn consumer_stats(&self, only: Option<&str>, include_acked: bool) -> Result<Vec<ConsumerStats>> {
        let rows = sqlx::query(q::CONSUMER_STATS).bind(only).bind(include_acked).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(ConsumerStats {
                    consumer: r.try_get("name")?,
                    paused: r.try_get("paused")?,
                    backlog: r.try_get("backlog")?,
                    in_flight: r.try_get("in_flight")?,
                    retrying: r.try_get("retrying")?,
                    dead: r.try_get("dead")?,
                    acked: r.try_get("acked")?,
                    oldest_unacked_at: r.try_get("oldest")?,
                    held_keys: r.try_get("held_keys")?,
                })
            })
            .collect()
    }

    /// A page of a consumer's dead letters in `seq` order, after `after_seq`.
    async fn dead_letter_page(&self, consumer: &str, p: &DeadLetterPageParams<'_>) -> Result<Vec<DeadLetter>> {
        let DeadLetterPageParams { last_error, after_seq, limit, with_payloads } = *p;
        let sql = if with_payloads { q::DEAD_LETTER_PAGE } else { q::DEAD_LETTER_PAGE_WITHOUT_BODIES };
        let rows =
            sqlx::query(sql).bind(consumer).bind(after_seq).bind(limit).bind(last_error).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(DeadLetter {
                    message: message_from_row(r)?,
                    consumer: r.try_get("consumer")?,
                    delivery_count: count(r, "delivery_count")?,
                    last_error: r.try_get("last_error")?,
                    dead_at: r.try_get("dead_at")?,
                })
            })
            .collect()
    }

    /// Counted and dated from `deliveries_dead_errors` alone; the topics and types of a group
    /// from its first dead letters, their messages read by primary key.
    async fn dead_letter_group_page(&self, consumer: &str, limit: i64) -> Result<Vec<DeadGroup>> {
        let rows = sqlx::query(q::DEAD_LETTER_GROUPS)
            .bind(consumer)
            .bind(limit)
            .bind(DeadGroup::NAMES_SHOWN as i32)
            .bind(DeadGroup::SAMPLED)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(DeadGroup {
                    last_error: r.try_get("last_error")?,
                    count: r.try_get("n")?,
                    first_dead_at: r.try_get("first")?,
                    last_dead_at: r.try_get("last")?,
                    topics: r.try_get("topics")?,
                    types: r.try_get("types")?,
                })
            })
            .collect()
    }

    /// A time range first becomes a range of seqs (one probe of `messages_enqueued_at` at each
    /// end); then the window of the `scan` newest messages below the cursor in it, by primary
    /// key; then the matches in the window.
    async fn message_search(&self, p: &SearchParams<'_>) -> Result<SearchPage> {
        let SearchParams { query, before_seq, limit, scan } = *p;
        let (lower, upper): (Option<i64>, Option<i64>) =
            sqlx::query_as(q::MESSAGE_SEARCH_BOUNDS).bind(query.after).bind(query.before).fetch_one(&self.pool).await?;
        let (Some(lower), Some(upper)) = (lower, upper) else {
            return Ok(SearchPage::default());
        };
        let upper = before_seq.map_or(upper, |c| c.min(upper));
        let (topic, pattern) = super::search_topic(query.topic.as_ref());
        // `*` one segment, `>` (last) one or more: as `outbox.topic_matches` reads a pattern.
        let pattern = pattern.map(|p| {
            let segments: Vec<&str> = p
                .as_str()
                .split('.')
                .map(|s| match s {
                    "*" => "[^.]+",
                    ">" => ".+",
                    literal => literal,
                })
                .collect();
            format!("^{}$", segments.join("\\."))
        });
        let rows = sqlx::query(q::MESSAGE_SEARCH_WINDOW)
            .bind(upper)
            .bind(lower)
            .bind(scan)
            .bind(topic)
            .bind(query.type_.as_deref())
            .bind(query.ordering_key.as_deref())
            .bind(query.after)
            .bind(query.before)
            .bind(limit)
            .bind(pattern)
            .persistent(false)
            .fetch_all(&self.pool)
            .await?;
        let messages = rows
            .iter()
            .map(|r| {
                Ok(MessageSummary {
                    message_id: MessageId(r.try_get("message_id")?),
                    seq: r.try_get("seq")?,
                    topic: r.try_get("topic")?,
                    type_: r.try_get("type")?,
                    ordering_key: r.try_get("ordering_key")?,
                    enqueued_at: r.try_get("enqueued_at")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // No match in the window still says how far it reached.
        let (scanned, lowest): (i64, Option<i64>) = match rows.first() {
            Some(r) => (r.try_get("scanned")?, r.try_get("lowest")?),
            None => {
                sqlx::query_as(q::MESSAGE_SEARCH_WINDOW_SIZE)
                    .bind(upper)
                    .bind(lower)
                    .bind(scan)
                    .persistent(false)
                    .fetch_one(&self.pool)
                    .await?
            }
        };
        Ok(super::search_page(messages, scanned, lowest.filter(|l| *l > lower), limit, scan))
    }

    async fn delivery_unacked_page(&self, consumer: &str, p: &UnackedPageParams) -> Result<UnackedPage> {
        let UnackedPageParams { kind, after_seq, limit, scan } = *p;
        let sql = match kind {
            UnackedKind::Pending => q::DELIVERY_PENDING_PAGE,
            UnackedKind::Retrying => q::DELIVERY_RETRYING_PAGE,
            UnackedKind::InFlight => q::DELIVERY_LEASED_PAGE,
        };
        let mut query = sqlx::query(sql).bind(consumer).bind(after_seq).bind(limit);
        if kind == UnackedKind::Retrying {
            query = query.bind(scan);
        }
        let rows = query.fetch_all(&self.pool).await?;
        let mut reached = None;
        let mut deliveries = Vec::with_capacity(rows.len());
        for r in &rows {
            reached = r.try_get("reached")?;
            // The one row of an empty page carries `reached` alone.
            let Some(id) = r.try_get::<Option<Uuid>, _>("message_id")? else { continue };
            deliveries.push(UnackedDelivery {
                message: MessageSummary {
                    message_id: MessageId(id),
                    seq: r.try_get("seq")?,
                    topic: r.try_get("topic")?,
                    type_: r.try_get("type")?,
                    ordering_key: r.try_get("ordering_key")?,
                    enqueued_at: r.try_get("enqueued_at")?,
                },
                state: DeliveryState::try_from(r.try_get::<&str, _>("state")?)?,
                delivery_count: count(r, "delivery_count")?,
                available_at: r.try_get("available_at")?,
                lease_expires_at: r.try_get("lease_expires_at")?,
                last_error: r.try_get("last_error")?,
            });
        }
        Ok(super::unacked_page(deliveries, limit, reached))
    }

    async fn delivery_list_of_message(&self, id: MessageId) -> Result<Vec<DeliveryRecord>> {
        // Through `outbox.inbox`: its rows, then what ranges say for the consumers without one.
        let rows = sqlx::query(q::DELIVERY_LIST_OF_MESSAGE).bind(id.0).fetch_all(&self.pool).await?;
        rows.iter().map(delivery_from_row).collect()
    }

    async fn message_list_after(&self, after: i64, limit: i64) -> Result<Vec<StoredMessage>> {
        let rows = sqlx::query(q::MESSAGE_LIST_AFTER).bind(after).bind(limit).fetch_all(&self.pool).await?;
        rows.iter().map(message_from_row).collect()
    }

    async fn message_tail_window(&self, after: i64, limit: i64) -> Result<Vec<TailEntry>> {
        let rows = sqlx::query(q::MESSAGE_TAIL_WINDOW).bind(after).bind(limit).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|r| {
                Ok(TailEntry {
                    seq: r.try_get("seq")?,
                    topic: r.try_get("topic")?,
                    bytes: usize::try_from(r.try_get::<i64, _>("bytes")?).unwrap_or(usize::MAX),
                })
            })
            .collect()
    }

    async fn message_list_of_seqs(&self, seqs: &[i64]) -> Result<Vec<StoredMessage>> {
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(q::MESSAGE_LIST_OF_SEQS).bind(seqs).fetch_all(&self.pool).await?;
        rows.iter().map(message_from_row).collect()
    }

    async fn message_unrelayed_exists(&self) -> Result<bool> {
        Ok(sqlx::query_scalar(q::MESSAGE_UNRELAYED_EXISTS).fetch_one(&self.pool).await?)
    }

    async fn message_unrelayed_exists_asking_wakeup(&self, wake_for: Duration) -> Result<bool> {
        // The request holds until the database's clock passes it (the trigger compares with
        // the database's clock too), or until a relay pass that finds work sets it back to 0
        // (server/sql/functions.sql). One statement: the probe costs no extra query.
        let (found, _): (bool, i64) = sqlx::query_as(q::MESSAGE_UNRELAYED_EXISTS_ASKING_WAKEUP)
            .bind(wake_for.as_secs_f64())
            .fetch_one(&self.pool)
            .await?;
        Ok(found)
    }

    async fn message_last_seq(&self) -> Result<i64> {
        Ok(sqlx::query_scalar(q::MESSAGE_LAST_SEQ).fetch_one(&self.pool).await?)
    }

    async fn replay_candidates(
        &self,
        consumer: &ConsumerName,
        p: &ReplayCandidatesParams<'_>,
    ) -> Result<Vec<ReplayCandidate>> {
        let ReplayCandidatesParams { filter, after_seq, limit } = *p;
        // Dead letters are paged by the delivery's seq (the message's), from the dead-letter
        // indexes; the rest by the message's. Unprepared: a plan cached for one set of filters
        // would not suit another, nor one cached on a small table a large one.
        let sql = if filter.dead_only { q::REPLAY_CANDIDATES_DEAD } else { q::REPLAY_CANDIDATES_ANY };
        let ids: Vec<Uuid> = filter.message_ids.iter().map(|m| m.0).collect();
        let rows = sqlx::query(sql)
            .bind(consumer.as_str())
            .bind(after_seq)
            .bind(&ids)
            .bind(filter.enqueued_after)
            .bind(filter.enqueued_before)
            .bind(&filter.types)
            .bind(filter.last_error.as_deref())
            .bind(limit)
            .persistent(false)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(ReplayCandidate {
                    message_id: MessageId(r.try_get("message_id")?),
                    seq: r.try_get("seq")?,
                    topic: r.try_get("topic")?,
                    enqueued_at: r.try_get("enqueued_at")?,
                })
            })
            .collect()
    }

    async fn held_key_page(&self, consumer: &str, ordering_key: Option<&str>, limit: i64) -> Result<Vec<HeldKey>> {
        let rows = sqlx::query(q::HELD_KEY_LIST)
            .bind(consumer)
            .bind(ordering_key)
            .bind(limit)
            .bind(HeldKey::WAITING_COUNTED)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(HeldKey {
                    ordering_key: r.try_get("ordering_key")?,
                    message_id: MessageId(r.try_get("message_id")?),
                    last_error: r.try_get("last_error")?,
                    waiting: r.try_get("waiting")?,
                    held_at: r.try_get("held_at")?,
                })
            })
            .collect()
    }

    /// Under [`PRUNE_LOCK`] (per transaction): messages locked by another pruner are skipped.
    async fn prune_before(&self, cutoff: DateTime<Utc>, limit: i64) -> Result<Option<Pruned>> {
        let mut tx = self.pool.begin().await?;
        let mine: bool = sqlx::query_scalar(q::PRUNE_LOCK_TRY).bind(PRUNE_LOCK).fetch_one(&mut *tx).await?;
        if !mine {
            tx.rollback().await?;
            return Ok(None);
        }
        // Folds the acked rows that transactional acks wrote for messages still waiting in a
        // pending range into the ranges (ADR 0042): those seqs leave their range, so that
        // nothing holds their messages back from the prune below.
        let folded = sqlx::query(q::PRUNE_FOLD_ACKED_ROWS).execute(&mut *tx).await?;
        if folded.rows_affected() > 0 {
            sqlx::query(q::PRUNE_EMPTY_RANGES).execute(&mut *tx).await?;
        }
        let row = sqlx::query(q::PRUNE_MESSAGES).bind(cutoff).bind(limit).fetch_one(&mut *tx).await?;
        let messages: i64 = row.try_get("messages")?;
        if messages > 0 {
            // The relay log's rows that name only pruned messages.
            sqlx::query(q::PRUNE_RELAY_LOG).execute(&mut *tx).await?;
            // Ack times older than the retention that name no message any more.
            sqlx::query(q::PRUNE_ACKED_RANGES).bind(cutoff).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(Some(Pruned { messages, deliveries: row.try_get("deliveries")? }))
    }
}

/// A write transaction of this backend (see [`StoreTx`]).
pub struct PgTx(Transaction<'static, Postgres>);

#[async_trait::async_trait]
impl StoreTx for PgTx {
    async fn message_insert(&mut self, msg: &NewMessage, now: DateTime<Utc>) -> Result<Enqueued> {
        let conn: &mut PgConnection = &mut self.0;
        message_insert(conn, msg, Some(now)).await
    }

    async fn message_page(&mut self, after: i64, limit: i64) -> Result<Vec<MessageRef>> {
        let conn: &mut PgConnection = &mut self.0;
        let rows = sqlx::query(q::MESSAGE_PAGE).bind(after).bind(limit).fetch_all(&mut *conn).await?;
        rows.iter()
            .map(|r| {
                Ok(MessageRef {
                    message_id: MessageId(r.try_get("message_id")?),
                    seq: r.try_get("seq")?,
                    topic: r.try_get("topic")?,
                    ordering_key: r.try_get("ordering_key")?,
                    available_at: r.try_get("available_at")?,
                })
            })
            .collect()
    }

    async fn consumer_find(&mut self, name: &str) -> Result<Option<ConsumerRecord>> {
        consumer_find(&mut *self.0, name).await
    }

    async fn consumer_count(&mut self) -> Result<i64> {
        let conn: &mut PgConnection = &mut self.0;
        Ok(sqlx::query(q::CONSUMER_COUNT).fetch_one(conn).await?.try_get("n")?)
    }

    async fn consumer_insert(
        &mut self,
        spec: &ConsumerSpec,
        created_by: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<ConsumerRecord> {
        let conn: &mut PgConnection = &mut self.0;
        let topics: Vec<&str> = spec.topics.iter().map(|t| t.as_str()).collect();
        let row = sqlx::query(q::CONSUMER_INSERT)
            .bind(spec.name.as_str())
            .bind(&topics)
            .bind(i32::try_from(spec.max_deliveries).unwrap_or(i32::MAX))
            .bind(ms(spec.backoff.base))
            .bind(ms(spec.backoff.max))
            .bind(ms(spec.ack_deadline))
            .bind(spec.start_from.as_str())
            .bind(now)
            .bind(spec.sink.as_ref().map(Json))
            .bind(spec.dead_key_policy.as_str())
            .bind(created_by)
            .fetch_one(conn)
            .await?;
        consumer_from_row(&row)
    }

    /// Its delivery rows go by cascade; its ranges are deleted here.
    async fn consumer_delete(&mut self, name: &str) -> Result<bool> {
        let conn: &mut PgConnection = &mut self.0;
        let done = sqlx::query(q::CONSUMER_DELETE).bind(name).execute(conn).await?;
        Ok(done.rows_affected() > 0)
    }

    /// Inserts pending rows from arrays (`unnest`), one statement for the page.
    async fn delivery_insert_pending(
        &mut self,
        consumer: &str,
        messages: &[MessageRef],
        now: DateTime<Utc>,
    ) -> Result<u64> {
        let conn: &mut PgConnection = &mut self.0;
        if messages.is_empty() {
            return Ok(0);
        }
        let ids: Vec<Uuid> = messages.iter().map(|m| m.message_id.0).collect();
        let seqs: Vec<i64> = messages.iter().map(|m| m.seq).collect();
        let keys: Vec<Option<&str>> = messages.iter().map(|m| m.ordering_key.as_deref()).collect();
        let available: Vec<DateTime<Utc>> = messages.iter().map(|m| m.available_at).collect();
        let done = sqlx::query(q::DELIVERY_INSERT_PENDING)
            .bind(consumer)
            .bind(&ids)
            .bind(&seqs)
            .bind(&keys)
            .bind(&available)
            .bind(now)
            .execute(conn)
            .await?;
        Ok(done.rows_affected())
    }

    /// Upserts: bypasses the inbox on purpose and restarts the delivery count. The replayed
    /// delivery's row becomes its one place: its seq leaves the consumer's ranges (a leased one
    /// only where a row already decided it) in the same transaction, so that no
    /// reader counts it twice (docs/delivery-states.md, T5, T20–T22).
    async fn delivery_replay(&mut self, consumer: &str, ids: &[MessageId], now: DateTime<Utc>) -> Result<u64> {
        let conn: &mut PgConnection = &mut self.0;
        let ids: Vec<Uuid> = ids.iter().map(|m| m.0).collect();
        // A relay pass that has claimed some of these messages and not yet written their
        // deliveries read this consumer's `backfill_seq` and rows before this replay wrote them:
        // it would put a seq in a range that this replay gives a row too. Relay passes and
        // replays take turns.
        sqlx::query(q::RELAY_TURN_TAKE).execute(&mut *conn).await?;
        let seqs: Vec<i64> = sqlx::query_scalar(q::MESSAGE_SEQS_OF_IDS).bind(&ids).fetch_all(&mut *conn).await?;
        if seqs.is_empty() {
            return Ok(0);
        }
        let (lo, hi) = seq_runs(seqs.into_iter());
        // The ranges that hold any of them, locked in the order `outbox.ack_seqs` locks them
        // (pending, then leased ranges): a lease cannot move one of these seqs out of a pending
        // range, nor an ack out of a leased one, between the statement below reading the ranges
        // and this transaction's end. The statement below takes its snapshot after these locks
        // are held.
        for state in ["pending", "leased"] {
            sqlx::query(q::DELIVERY_RANGES_LOCK_HOLDING)
                .bind(consumer)
                .bind(&lo)
                .bind(&hi)
                .bind(state)
                .execute(&mut *conn)
                .await?;
        }
        let done: i64 =
            sqlx::query_scalar(q::DELIVERY_REPLAY).bind(consumer).bind(&ids).bind(now).fetch_one(&mut *conn).await?;
        Ok(u64::try_from(done).unwrap_or(0))
    }

    async fn held_key_delete(&mut self, consumer: &str, ordering_key: &str) -> Result<Option<MessageId>> {
        let conn: &mut PgConnection = &mut self.0;
        let id: Option<Uuid> =
            sqlx::query_scalar(q::HELD_KEY_DELETE).bind(consumer).bind(ordering_key).fetch_optional(conn).await?;
        Ok(id.map(MessageId))
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        Ok(self.0.commit().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::{multirange, seq_runs};

    #[test]
    fn seqs_become_sorted_runs_of_consecutive_values() {
        assert_eq!(multirange(&[1, 2, 3, 5, 7, 8]), "{[1,4),[5,6),[7,9)}");
        assert_eq!(multirange(&[]), "{}");
        assert_eq!(seq_runs([7, 3, 4, 9, 8, 3, 1].into_iter()), (vec![1, 3, 7], vec![2, 5, 10]));
        assert_eq!(seq_runs(std::iter::empty()), (vec![], vec![]));
        assert_eq!(seq_runs([5].into_iter()), (vec![5], vec![6]));
    }
}

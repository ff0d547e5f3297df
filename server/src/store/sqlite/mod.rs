//! The embedded SQLite store: one file, WAL mode, migrations in `server/migrations-sqlite`.
//!
//! SQLite has one writer at a time and no `SKIP LOCKED`, so exactly one `outboxd` may serve a
//! file: [`SqliteStore::open`] takes an exclusive lock on `<file>.lock` and a second server
//! exits with a clear error. Producers in other processes still write to the file; the store's
//! watcher notices their commits through `PRAGMA data_version` and wakes the relay. Every
//! write transaction starts with `BEGIN IMMEDIATE`, so writers queue on the busy timeout
//! instead of failing on a lock upgrade. Batches are passed as JSON arrays (`json_each`),
//! SQLite's counterpart of PostgreSQL's `unnest`.
use std::fs::File;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqlitePool};
use sqlx::{Row, SqliteExecutor};
use tokio_util::sync::CancellationToken;

use super::records::{ConsumerRecord, DeliveryRecord, ExpiredRecord};
use super::{
    ConsoleSession, ConsumerStats, DeadGroup, DeadLetter, DeadLetterPageParams, Enqueued, ExpiredLease, ExtendParams,
    HeldKey, HintSender, LeaseParams, LeasedDelivery, MessageSummary, NewMessage, Pruned, RelayTx, Release,
    ReleaseGuard, ReplayCandidate, ReplayCandidatesParams, Result, SearchPage, SearchParams, Store, StoreError,
    StoreTx, StoredMessage, TableHealth, TailEntry, UnackedDelivery, UnackedKind, UnackedPage, UnackedPageParams,
    VacuumHorizon,
};
use crate::domain::{Attempt, Consumer, ConsumerName, DeliveryState, MessageId};
use key_heads::ready_key_heads;
pub(crate) use open::MIGRATOR;
use rows::{consumer_from_row, count, delivery_from_row, ids_json, message_from_row, opt_time, time, us, uuid};
pub use tx::SqliteTx;
use writer::retry_busy;

mod key_heads;
mod open;
mod relay;
mod rows;
mod tx;
mod watch;
mod writer;

/// The named statements of `queries/*.sql` (ADR 0061), one constant each, generated at compile
/// time by `build.rs`.
pub(crate) mod q {
    include!(concat!(env!("OUT_DIR"), "/sqlite_queries.rs"));
}

/// The SQLite driver. Cheap to clone; the file lock lives as long as any clone.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// Reads (WAL readers never wait for the writer).
    pool: SqlitePool,
    /// Every write of this process, on one connection: SQLite has one writer at a time, and
    /// writers that collide wait in SQLite's busy handler, which sleeps 1, 2, 5, 10 … ms between
    /// tries. Queued here instead, this process's writes follow each other at once; only
    /// other processes' commits (producers) can still make one wait.
    writer: SqlitePool,
    options: SqliteConnectOptions,
    _lock: Option<Arc<File>>,
}

/// Inserts one message on the caller's executor (a pool, a connection or a transaction).
async fn message_insert<'e, E>(exec: E, msg: &NewMessage, now: DateTime<Utc>) -> Result<Option<i64>>
where
    E: SqliteExecutor<'e>,
{
    let id = msg.message_id.unwrap_or_else(MessageId::generate);
    let available = msg.delay.map(|d| us(crate::clock::add(now, d)));
    let headers = serde_json::to_string(&msg.headers).unwrap_or_else(|_| "{}".to_owned());
    let seq: Option<i64> = sqlx::query_scalar(q::MESSAGE_INSERT)
        .bind(id.to_string())
        .bind(msg.topic.as_str())
        .bind(&msg.type_)
        .bind(&msg.payload)
        .bind(headers)
        .bind(msg.ordering_key.as_deref())
        .bind(us(now))
        .bind(available)
        .fetch_optional(exec)
        .await?;
    Ok(seq)
}

pub(super) async fn message_insert_tx(
    conn: &mut SqliteConnection,
    msg: &NewMessage,
    now: DateTime<Utc>,
) -> Result<Enqueued> {
    let id = msg.message_id.unwrap_or_else(MessageId::generate);
    let msg = NewMessage { message_id: Some(id), ..msg.clone() };
    if let Some(seq) = message_insert(&mut *conn, &msg, now).await? {
        return Ok(Enqueued { message_id: id, seq, duplicate: false });
    }
    let seq: i64 = sqlx::query_scalar(q::MESSAGE_SEQ_OF_ID).bind(id.to_string()).fetch_one(&mut *conn).await?;
    Ok(Enqueued { message_id: id, seq, duplicate: true })
}

/// One consumer's row, on the caller's executor (the read pool or a transaction).
pub(super) async fn consumer_find<'e, E>(exec: E, name: &str) -> Result<Option<ConsumerRecord>>
where
    E: SqliteExecutor<'e>,
{
    let row = sqlx::query(q::CONSUMER_FIND).bind(name).fetch_optional(exec).await?;
    row.as_ref().map(consumer_from_row).transpose()
}

/// The consumers, decoded: the relay pass matches topics against them.
/// Every consumer, in name order, on `conn` (the relay's transaction or a pooled connection).
async fn consumer_records_on(conn: &mut SqliteConnection) -> Result<Vec<ConsumerRecord>> {
    let rows = sqlx::query(q::CONSUMER_LIST).fetch_all(&mut *conn).await?;
    rows.iter().map(consumer_from_row).collect()
}

pub(super) async fn consumers_on(conn: &mut SqliteConnection) -> Result<Vec<Consumer>> {
    consumer_records_on(conn).await?.into_iter().map(Consumer::try_from).collect()
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    /// A pass holds the file's one writer, which producers and acks wait for: passes of at most
    /// 500, and after one that found fewer than that, one tick of the timer (about a
    /// millisecond) so that a busy flow gathers into fewer, larger passes.
    fn relay_defaults(&self) -> super::RelayDefaults {
        super::RelayDefaults { pass_size: 500, gather: Duration::from_millis(1) }
    }

    async fn migrate(&self) -> Result<()> {
        // On a reader connection, which waits in SQLite's busy handler: a migration may meet a
        // producer's commit, and nothing of this process writes yet.
        MIGRATOR.run(&self.pool).await?;
        sqlx::query(q::OPTIMIZE).execute(&self.pool).await?;
        Ok(())
    }

    async fn settings_write(&self, max_payload_bytes: usize) -> Result<()> {
        let mut tx = self.begin_write().await?;
        sqlx::query(q::SETTINGS_WRITE)
            .bind(i64::try_from(max_payload_bytes).unwrap_or(i64::MAX))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn close(&self) {
        self.writer.close().await;
        self.pool.close().await;
    }

    fn pool_status(&self) -> (u32, usize) {
        (self.pool.size(), self.pool.num_idle())
    }

    async fn watch(&self, hints: HintSender, cancel: CancellationToken) {
        watch::watch(&self.options, hints, cancel).await;
    }

    /// `BEGIN IMMEDIATE` on the writer connection (see [`SqliteStore::begin_write`]).
    async fn begin(&self) -> Result<Box<dyn StoreTx>> {
        Ok(Box::new(SqliteTx(self.begin_write().await?)))
    }

    /// The write lock itself serialises consumer changes against relay passes.
    async fn begin_consumer_change(&self) -> Result<Box<dyn StoreTx>> {
        Ok(Box::new(SqliteTx(self.begin_write().await?)))
    }

    async fn message_insert(&self, msg: &NewMessage, now: DateTime<Utc>) -> Result<Enqueued> {
        let mut tx = self.begin_write().await?;
        let out = message_insert_tx(&mut tx, msg, now).await?;
        tx.commit().await?;
        Ok(out)
    }

    async fn message_find(&self, id: MessageId) -> Result<Option<StoredMessage>> {
        let row = sqlx::query(q::MESSAGE_FIND).bind(id.to_string()).fetch_optional(&self.pool).await?;
        row.as_ref().map(message_from_row).transpose()
    }

    async fn message_unrelayed_summary(&self) -> Result<(i64, Option<DateTime<Utc>>)> {
        let row = sqlx::query(q::MESSAGE_UNRELAYED_SUMMARY).fetch_one(&self.pool).await?;
        Ok((row.try_get("unrelayed")?, opt_time(row.try_get("oldest")?)))
    }

    async fn begin_relay(&self) -> Result<Box<dyn RelayTx>> {
        Ok(Box::new(self.relay_tx().await?))
    }

    async fn consumer_find(&self, name: &str) -> Result<Option<ConsumerRecord>> {
        consumer_find(&self.pool, name).await
    }

    async fn consumer_list(&self) -> Result<Vec<Consumer>> {
        consumers_on(&mut *self.pool.acquire().await?).await
    }

    async fn console_session_insert(&self, s: &ConsoleSession) -> Result<()> {
        retry_busy(|| {
            sqlx::query(q::CONSOLE_SESSION_INSERT)
                .bind(&s.id_hash[..])
                .bind(&s.principal)
                .bind(&s.token_hash[..])
                .bind(us(s.created_at))
                .bind(us(s.expires_at))
                .execute(&self.writer)
        })
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
            created_at: time(row.try_get("created_at")?),
            seen_at: time(row.try_get("seen_at")?),
            expires_at: time(row.try_get("expires_at")?),
        }))
    }

    async fn console_session_touch(&self, id_hash: &[u8; 32], now: DateTime<Utc>) -> Result<()> {
        retry_busy(|| sqlx::query(q::CONSOLE_SESSION_TOUCH).bind(&id_hash[..]).bind(us(now)).execute(&self.writer))
            .await?;
        Ok(())
    }

    async fn console_session_delete(&self, id_hash: &[u8; 32]) -> Result<bool> {
        let done =
            retry_busy(|| sqlx::query(q::CONSOLE_SESSION_DELETE).bind(&id_hash[..]).execute(&self.writer)).await?;
        Ok(done.rows_affected() > 0)
    }

    async fn console_session_delete_expired(&self, now: DateTime<Utc>, idle_since: DateTime<Utc>) -> Result<u64> {
        let done = retry_busy(|| {
            sqlx::query(q::CONSOLE_SESSION_DELETE_EXPIRED).bind(us(now)).bind(us(idle_since)).execute(&self.writer)
        })
        .await?;
        Ok(done.rows_affected())
    }

    async fn console_session_delete_oldest(&self, principal: &str, keep: i64) -> Result<u64> {
        let done = retry_busy(|| {
            sqlx::query(q::CONSOLE_SESSION_DELETE_OLDEST).bind(principal).bind(keep).execute(&self.writer)
        })
        .await?;
        Ok(done.rows_affected())
    }

    async fn consumer_set_paused(&self, name: &ConsumerName, paused: bool) -> Result<Consumer> {
        let row = retry_busy(|| {
            sqlx::query(q::CONSUMER_SET_PAUSED).bind(name.as_str()).bind(i64::from(paused)).fetch_optional(&self.writer)
        })
        .await?;
        let row = row.ok_or_else(|| StoreError::ConsumerNotFound(name.to_string()))?;
        Consumer::try_from(consumer_from_row(&row)?)
    }

    async fn delivery_lease(&self, p: &LeaseParams<'_>) -> Result<Vec<LeasedDelivery>> {
        let LeaseParams { consumer, session, limit, keys_after, lease_until, now } = *p;
        let mut tx = self.begin_write().await?;
        let heads = ready_key_heads(&mut tx, consumer, keys_after, limit, now).await?;
        // Unkeyed due deliveries in due order from their own index, stopped after `limit`, and
        // the ready key heads: of both, the `limit` lowest seqs.
        let leased = sqlx::query(q::DELIVERY_LEASE_ROWS)
            .bind(consumer.as_str())
            .bind(us(now))
            .bind(limit)
            .bind(us(lease_until))
            .bind(session)
            .bind(serde_json::Value::Array(heads.into_iter().map(|id| json!(id)).collect()).to_string())
            .fetch_all(&mut *tx)
            .await?;
        if leased.is_empty() {
            tx.rollback().await?;
            return Ok(Vec::new());
        }
        let mut counts = std::collections::HashMap::new();
        for r in &leased {
            counts.insert(r.try_get::<String, _>("message_id")?, count(r, "delivery_count")?);
        }
        let ids: Vec<serde_json::Value> = counts.keys().map(|k| json!(k)).collect();
        let rows = sqlx::query(q::MESSAGE_LIST_OF_IDS)
            .bind(serde_json::Value::Array(ids).to_string())
            .fetch_all(&mut *tx)
            .await?;
        // Parsed before the commit: a row that cannot be read leases nothing.
        let mut out = rows
            .iter()
            .map(|row| {
                let message = message_from_row(row)?;
                let delivery_count = counts.get(&message.message_id.to_string()).copied().unwrap_or(1);
                Ok(LeasedDelivery { message, delivery_count, lease_expires_at: lease_until })
            })
            .collect::<Result<Vec<_>>>()?;
        tx.commit().await?;
        out.sort_by_key(|d| d.message.seq);
        Ok(out)
    }

    /// One write transaction in one round trip: the first deliveries an acked range can say
    /// leave their rows for the consumer's acked ranges (ADR 0070), the others stay rows, marked
    /// acked. Tried again while another process holds the write lock (`retry_busy`). It runs in
    /// a task of its own, so that a caller that stops waiting cannot leave the writer
    /// connection inside the transaction the statement opened.
    async fn delivery_ack_many(&self, consumer: &ConsumerName, ids: &[MessageId], now: DateTime<Utc>) -> Result<u64> {
        let (writer, consumer, ids) = (self.writer.clone(), consumer.to_string(), ids_json(ids));
        let ack = tokio::spawn(async move {
            retry_busy(|| async {
                let mut conn = writer.acquire().await?;
                let acked = sqlx::query(q::DELIVERY_ACK_MANY)
                    .bind(&consumer)
                    .bind(&ids)
                    .bind(us(now))
                    .fetch_all(&mut *conn)
                    .await;
                if acked.is_err() {
                    // Whatever the error left open; an error here only means there was none.
                    let _ = sqlx::query(q::ROLLBACK).execute(&mut *conn).await;
                }
                acked.map(|rows| rows.len() as u64)
            })
            .await
        });
        // A panic of the task (none is expected) is reported as the worker's end.
        ack.await.map_err(|_| StoreError::Database(sqlx::Error::WorkerCrashed))?
    }

    async fn delivery_release_many(
        &self,
        releases: &[Release],
        guard: ReleaseGuard<'_>,
        now: DateTime<Utc>,
    ) -> Result<u64> {
        if releases.is_empty() {
            return Ok(0);
        }
        let batch: Vec<serde_json::Value> = releases
            .iter()
            .map(|r| {
                json!({
                    "c": r.consumer.as_str(),
                    "m": r.message_id.to_string(),
                    "s": r.state.as_str(),
                    "a": us(r.available_at),
                    "e": r.error,
                    "w": r.attempt == Attempt::Withdrawn,
                })
            })
            .collect();
        let (session, expired_at) = match guard {
            ReleaseGuard::Session(s) => (Some(s), None),
            ReleaseGuard::ExpiredAt(t) => (None, Some(us(t))),
        };
        let batch_json = serde_json::Value::Array(batch).to_string();
        let mut tx = self.begin_write().await?;
        let released: Vec<(String, String, i64, Option<String>, String)> = sqlx::query_as(q::DELIVERY_RELEASE_ROWS)
            .bind(batch_json)
            .bind(us(now))
            .bind(session)
            .bind(expired_at)
            .fetch_all(&mut *tx)
            .await?;
        // A keyed delivery that dies holds its key if its consumer says so (ADR 0057), in the
        // same transaction: no lease can see the dead row without the hold.
        let dead: Vec<serde_json::Value> = released
            .iter()
            .filter(|(_, _, _, key, state)| key.is_some() && state == "dead")
            .map(|(c, m, seq, key, _)| json!({"c": c, "m": m, "s": seq, "k": key}))
            .collect();
        if !dead.is_empty() {
            sqlx::query(q::HELD_KEY_INSERT)
                .bind(serde_json::Value::Array(dead).to_string())
                .bind(us(now))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(released.len() as u64)
    }

    async fn delivery_expired(&self, now: DateTime<Utc>, limit: i64) -> Result<Vec<ExpiredLease>> {
        let rows = sqlx::query(q::DELIVERY_EXPIRED_ROWS).bind(us(now)).bind(limit).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                ExpiredLease::try_from(ExpiredRecord {
                    consumer: row.try_get("consumer")?,
                    message_id: uuid(row.try_get("message_id")?)?,
                    delivery_count: row.try_get("delivery_count")?,
                    max_deliveries: row.try_get("max_deliveries")?,
                    backoff_base_ms: row.try_get("backoff_base_ms")?,
                    backoff_max_ms: row.try_get("backoff_max_ms")?,
                })
            })
            .collect()
    }

    async fn delivery_next_expiry(&self) -> Result<Option<DateTime<Utc>>> {
        let t: Option<i64> = sqlx::query_scalar(q::DELIVERY_NEXT_EXPIRY).fetch_one(&self.pool).await?;
        Ok(opt_time(t))
    }

    async fn delivery_extend_many(&self, p: &ExtendParams<'_>) -> Result<u64> {
        let ExtendParams { consumer, session, ids, until, now } = *p;
        let done = retry_busy(|| {
            sqlx::query(q::DELIVERY_EXTEND_ROWS)
                .bind(consumer.as_str())
                .bind(ids_json(ids))
                .bind(session)
                .bind(us(until))
                .bind(us(now))
                .execute(&self.writer)
        })
        .await?;
        Ok(done.rows_affected())
    }

    async fn delivery_next_due(&self, consumer: &ConsumerName) -> Result<Option<DateTime<Utc>>> {
        let row = sqlx::query(q::DELIVERY_NEXT_DUE).bind(consumer.as_str()).fetch_one(&self.pool).await?;
        if row.try_get::<i64, _>("present")? == 0 {
            return Err(StoreError::ConsumerNotFound(consumer.to_string()));
        }
        Ok(opt_time(row.try_get("due")?))
    }

    /// The whole file, from its header (no scan): SQLite keeps no per-table counts, and space
    /// freed by deletes is kept as free pages, reused before the file grows.
    /// SQLite keeps no snapshots for others: nothing holds back reclaiming its pages but a
    /// reader of the WAL, which a checkpoint waits for.
    async fn vacuum_horizon(&self) -> Result<Option<VacuumHorizon>> {
        Ok(None)
    }

    async fn table_health(&self) -> Result<Vec<TableHealth>> {
        let row = sqlx::query(q::TABLE_HEALTH).fetch_one(&self.pool).await?;
        let (pages, free, size): (i64, i64, i64) =
            (row.try_get("pages")?, row.try_get("free")?, row.try_get("page_size")?);
        Ok(vec![TableHealth {
            table: "(file)".to_owned(),
            live_rows: 0,
            dead_rows: free,
            bytes: pages * size,
            last_vacuum: None,
        }])
    }

    /// SQLite reuses the pages that deletes free; nothing to do.
    async fn vacuum_tables(&self, _tables: &[String]) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    /// Each figure from the partial index of its state, so the cost follows the unfinished
    /// work; `acked` (the history) only when asked.
    async fn consumer_stats(&self, only: Option<&str>, include_acked: bool) -> Result<Vec<ConsumerStats>> {
        let rows = sqlx::query(q::CONSUMER_STATS).bind(only).bind(include_acked).fetch_all(&self.pool).await?;
        let mut consumers = Vec::with_capacity(rows.len());
        for r in &rows {
            let oldest_seq =
                match (r.try_get::<Option<i64>, _>("oldest_pending")?, r.try_get::<Option<i64>, _>("oldest_leased")?) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            let oldest = match oldest_seq {
                Some(seq) => sqlx::query_scalar::<_, i64>(q::MESSAGE_ENQUEUED_AT)
                    .bind(seq)
                    .fetch_optional(&self.pool)
                    .await?
                    .map(time),
                None => None,
            };
            consumers.push(ConsumerStats {
                consumer: r.try_get("name")?,
                paused: r.try_get::<i64, _>("paused")? != 0,
                backlog: r.try_get("backlog")?,
                in_flight: r.try_get("in_flight")?,
                retrying: r.try_get("retrying")?,
                dead: r.try_get("dead")?,
                acked: r.try_get("acked")?,
                oldest_unacked_at: oldest,
                held_keys: r.try_get("held_keys")?,
            });
        }
        Ok(consumers)
    }

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
                    dead_at: opt_time(r.try_get("dead_at")?),
                })
            })
            .collect()
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
            let Some(id) = r.try_get::<Option<&str>, _>("message_id")? else { continue };
            deliveries.push(UnackedDelivery {
                message: MessageSummary {
                    message_id: uuid(id)?,
                    seq: r.try_get("seq")?,
                    topic: r.try_get("topic")?,
                    type_: r.try_get("type")?,
                    ordering_key: r.try_get("ordering_key")?,
                    enqueued_at: time(r.try_get("enqueued_at")?),
                },
                state: DeliveryState::try_from(r.try_get::<&str, _>("state")?)?,
                delivery_count: count(r, "delivery_count")?,
                available_at: time(r.try_get("available_at")?),
                lease_expires_at: opt_time(r.try_get("lease_expires_at")?),
                last_error: r.try_get("last_error")?,
            });
        }
        Ok(super::unacked_page(deliveries, limit, reached))
    }

    async fn delivery_list_of_message(&self, id: MessageId) -> Result<Vec<DeliveryRecord>> {
        let rows = sqlx::query(q::DELIVERY_LIST_OF_MESSAGE).bind(id.to_string()).fetch_all(&self.pool).await?;
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
        let rows = sqlx::query(q::MESSAGE_LIST_OF_SEQS)
            .bind(serde_json::Value::from(seqs.to_vec()).to_string())
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(message_from_row).collect()
    }

    async fn message_unrelayed_exists(&self) -> Result<bool> {
        Ok(sqlx::query_scalar(q::MESSAGE_UNRELAYED_EXISTS).fetch_one(&self.pool).await?)
    }

    async fn message_unrelayed_exists_asking_wakeup(&self, wake_for: Duration) -> Result<bool> {
        // The watcher wakes the relay on every commit to the file (`PRAGMA data_version`).
        let _ = wake_for;
        self.message_unrelayed_exists().await
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
        let sql = if filter.dead_only { q::REPLAY_CANDIDATES_DEAD } else { q::REPLAY_CANDIDATES_ANY };
        let ids = (!filter.message_ids.is_empty()).then(|| ids_json(&filter.message_ids));
        let types = (!filter.types.is_empty()).then(|| json!(filter.types).to_string());
        let rows = sqlx::query(sql)
            .bind(consumer.as_str())
            .bind(after_seq)
            .bind(ids)
            .bind(filter.enqueued_after.map(us))
            .bind(filter.enqueued_before.map(us))
            .bind(types)
            .bind(filter.last_error.as_deref())
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(ReplayCandidate {
                    message_id: uuid(r.try_get("message_id")?)?,
                    seq: r.try_get("seq")?,
                    topic: r.try_get("topic")?,
                    enqueued_at: time(r.try_get("enqueued_at")?),
                })
            })
            .collect()
    }

    async fn dead_letter_group_page(&self, consumer: &str, limit: i64) -> Result<Vec<DeadGroup>> {
        let rows = sqlx::query(q::DEAD_LETTER_GROUPS)
            .bind(consumer)
            .bind(limit)
            .bind(DeadGroup::SAMPLED)
            .fetch_all(&self.pool)
            .await?;
        let names = |text: &str| -> Result<Vec<String>> {
            let mut v: Vec<String> = serde_json::from_str(text)
                .map_err(|e| StoreError::InvalidValue(format!("dead letter group names: {e}")))?;
            v.sort();
            v.truncate(DeadGroup::NAMES_SHOWN);
            Ok(v)
        };
        rows.iter()
            .map(|r| {
                Ok(DeadGroup {
                    last_error: r.try_get("last_error")?,
                    count: r.try_get("n")?,
                    first_dead_at: opt_time(r.try_get("first")?),
                    last_dead_at: opt_time(r.try_get("last")?),
                    topics: names(r.try_get("topics")?)?,
                    types: names(r.try_get("types")?)?,
                })
            })
            .collect()
    }

    async fn message_search(&self, p: &SearchParams<'_>) -> Result<SearchPage> {
        let SearchParams { query, before_seq, limit, scan } = *p;
        // A time range first becomes a range of seqs, one probe of the enqueued_at index at
        // each end; the window is then a range of the primary key.
        let (lower, upper): (Option<i64>, Option<i64>) = sqlx::query_as(q::MESSAGE_SEARCH_BOUNDS)
            .bind(query.after.map(us))
            .bind(query.before.map(us))
            .fetch_one(&self.pool)
            .await?;
        let (Some(lower), Some(upper)) = (lower, upper) else {
            return Ok(SearchPage::default());
        };
        let upper = before_seq.map_or(upper, |c| c.min(upper));
        let (scanned, lowest): (i64, Option<i64>) = sqlx::query_as(q::MESSAGE_SEARCH_WINDOW_SIZE)
            .bind(upper)
            .bind(lower)
            .bind(scan)
            .fetch_one(&self.pool)
            .await?;
        let (topic, pattern) = super::search_topic(query.topic.as_ref());
        // A pattern's GLOB takes more than the pattern (a `*` of it also spans dots): every
        // candidate of the window is read, and the pattern keeps its own, newest first.
        let glob = pattern.map(|p| {
            p.as_str().split('.').map(|s| if s == "*" || s == ">" { "*" } else { s }).collect::<Vec<_>>().join(".")
        });
        let rows = sqlx::query(q::MESSAGE_SEARCH_WINDOW)
            .bind(upper)
            .bind(lower)
            .bind(scan)
            .bind(topic)
            .bind(query.type_.as_deref())
            .bind(query.ordering_key.as_deref())
            .bind(query.after.map(us))
            .bind(query.before.map(us))
            .bind(if pattern.is_some() { scan } else { limit })
            .bind(glob)
            .fetch_all(&self.pool)
            .await?;
        let messages = rows
            .iter()
            .filter(|r| match pattern {
                Some(p) => r.try_get::<&str, _>("topic").is_ok_and(|t| p.matches(t)),
                None => true,
            })
            .take(usize::try_from(limit).unwrap_or(0))
            .map(|r| {
                Ok(MessageSummary {
                    message_id: uuid(r.try_get("message_id")?)?,
                    seq: r.try_get("seq")?,
                    topic: r.try_get("topic")?,
                    type_: r.try_get("type")?,
                    ordering_key: r.try_get("ordering_key")?,
                    enqueued_at: time(r.try_get("enqueued_at")?),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(super::search_page(messages, scanned, lowest.filter(|l| *l > lower), limit, scan))
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
                    message_id: uuid(r.try_get("message_id")?)?,
                    last_error: r.try_get("last_error")?,
                    waiting: r.try_get("waiting")?,
                    held_at: time(r.try_get("held_at")?),
                })
            })
            .collect()
    }

    /// One server per file: nobody else prunes, so this never answers `None`.
    async fn prune_before(&self, cutoff: DateTime<Utc>, limit: i64) -> Result<Option<Pruned>> {
        let mut tx = self.begin_write().await?;
        let doomed: Vec<(String, i64)> =
            sqlx::query_as(q::PRUNE_CANDIDATES).bind(us(cutoff)).bind(limit).fetch_all(&mut *tx).await?;
        let ids = serde_json::Value::Array(doomed.iter().map(|(id, _)| json!(id)).collect()).to_string();
        let held =
            serde_json::Value::Array(doomed.iter().map(|(id, seq)| json!({"m": id, "s": seq})).collect()).to_string();
        // Counted before the rows go: a row decides over a range holding the same seq.
        let in_ranges: i64 = sqlx::query_scalar(q::PRUNE_RANGE_DELIVERIES).bind(&held).fetch_one(&mut *tx).await?;
        let deliveries = sqlx::query(q::PRUNE_DELIVERIES).bind(&ids).execute(&mut *tx).await?.rows_affected();
        let messages = sqlx::query(q::PRUNE_MESSAGES).bind(&ids).execute(&mut *tx).await?.rows_affected();
        if messages > 0 {
            sqlx::query(q::PRUNE_RELAY_LOG).execute(&mut *tx).await?;
            sqlx::query(q::PRUNE_ACKED_RANGES).bind(&held).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(Some(Pruned { messages: messages as i64, deliveries: deliveries as i64 + in_ranges }))
    }
}

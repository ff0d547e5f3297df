//! The PostgreSQL store: schema `outbox`, migrations in `server/migrations`.
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgPool;
use sqlx::types::Json;
use sqlx::{Executor, Postgres, Row};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::records::{ConsumerRecord, DeliveryRecord, ExpiredRecord, headers_to_json, ms};
use super::{
    ConsoleSession, ConsumerStats, DeadGroup, DeadLetter, DeadLetterPageParams, Enqueued, ExpiredLease, ExtendParams,
    HeldKey, HintSender, LeaseParams, LeasedDelivery, MessageSummary, NewMessage, Pruned, RelayTx, Release,
    ReleaseGuard, ReplayCandidate, ReplayCandidatesParams, Result, SearchPage, SearchParams, Store, StoreError,
    StoreTx, StoredMessage, TableHealth, TailEntry, UnackedDelivery, UnackedKind, UnackedPage, UnackedPageParams,
    VacuumHorizon,
};
use crate::domain::{Attempt, Consumer, ConsumerName, DeliveryState, MessageId};
pub(crate) use connect::MIGRATOR;
use connect::apply_functions;
#[cfg(test)]
pub(crate) use connect::{FUNCTIONS, FUNCTIONS_REVISION, LAST_MIGRATION_WITH_FUNCTIONS, LEASE_SETTINGS};
use listener::WorkListener;
use rows::{consumer_from_row, count, delivery_from_row, message_from_row};
#[cfg(test)]
pub(crate) use seqs::multirange;
use seqs::seq_runs;
pub use tx::PgTx;

mod connect;
mod conninfo;
mod listener;
mod maintenance;
mod relay;
mod rows;
mod seqs;
mod tx;

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

/// One consumer's row, on the caller's executor (a pool or a transaction).
pub(super) async fn consumer_find<'e, E>(exec: E, name: &str) -> Result<Option<ConsumerRecord>>
where
    E: Executor<'e, Database = Postgres>,
{
    let row = sqlx::query(q::CONSUMER_FIND).bind(name).fetch_optional(exec).await?;
    row.as_ref().map(consumer_from_row).transpose()
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

    async fn vacuum_horizon(&self) -> Result<Option<VacuumHorizon>> {
        maintenance::vacuum_horizon(&self.pool).await
    }

    async fn table_health(&self) -> Result<Vec<TableHealth>> {
        maintenance::table_health(&self.pool).await
    }

    async fn vacuum_tables(&self, tables: &[String]) -> Result<Vec<String>> {
        maintenance::vacuum_tables(&self.pool, tables).await
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

    async fn prune_before(&self, cutoff: DateTime<Utc>, limit: i64) -> Result<Option<Pruned>> {
        maintenance::prune_before(&self.pool, cutoff, limit).await
    }
}

//! The driver seam: what one database backend implements. Each method is one narrow,
//! entity-first statement (or the one round trip a backend needs for it), returning plain
//! records ([`super::records`]); operations made of several statements — create-or-compare,
//! the EARLIEST backfill, the prune loop, batches in one transaction, decoding into the domain —
//! are written once, over any driver, in [`super::composite`]. The per-method suite
//! (`driver_tests`) runs every driver through the same cases, as River's `riverdrivertest`
//! does.
//!
//! Methods that a composite runs inside its transaction take `conn` (a transaction or a pooled
//! connection dereferences to it); the others run on the driver's own pools.
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Transaction;
use sqlx::pool::PoolConnection;
use tokio_util::sync::CancellationToken;

use super::records::{ConsumerRecord, DeliveryRecord, ExpiredRecord, MessageRef};
use super::{
    ConsumerStats, DeadGroup, DeadLetter, Enqueued, HeldKey, HintSender, LeasedDelivery, MessageQuery, NewMessage,
    Pruned, PushOffer, RelayOutcome, Release, ReleaseGuard, ReplayCandidate, ReplayFilter, Result, SearchPage,
    StoredMessage, TableHealth, VacuumHorizon,
};
use crate::domain::{ConsumerName, ConsumerSpec, MessageId};

/// A connection of driver `D`'s database.
pub type Conn<D> = <<D as Driver>::Db as sqlx::Database>::Connection;

#[async_trait::async_trait]
pub trait Driver: Send + Sync + std::fmt::Debug + Clone + 'static {
    type Db: sqlx::Database;

    // The database.

    /// `"postgres"` or `"sqlite"`, for logs.
    fn backend(&self) -> &'static str;
    /// See [`super::Store::relay_defaults`].
    fn relay_defaults(&self) -> super::RelayDefaults;
    /// Applies pending migrations, then refreshes what the planner knows.
    async fn migrate(&self) -> Result<()>;
    /// Writes the settings that the SQL entry points enforce for every writer (the payload
    /// limit of `outbox.enqueue` and of SQLite's insert).
    async fn settings_write(&self, max_payload_bytes: i64) -> Result<()>;
    async fn close(&self);
    /// Open and idle connections of the main pool.
    fn pool_status(&self) -> (u32, usize);
    /// See [`super::Store::watch`].
    async fn watch(&self, hints: HintSender, cancel: CancellationToken);
    /// A pooled connection for reads.
    async fn read(&self) -> Result<PoolConnection<Self::Db>>;
    /// A write transaction.
    async fn begin(&self) -> Result<Transaction<'static, Self::Db>>;
    /// A write transaction for creating or deleting a consumer: serialised against relay passes
    /// (which must never fan out with a stale list of consumers) and against each other.
    async fn begin_consumer_change(&self) -> Result<Transaction<'static, Self::Db>>;

    // Messages.

    /// Inserts one message on `conn` (a producer's or a batch's transaction); an existing
    /// `message_id` writes nothing and says `duplicate`.
    async fn message_insert(&self, conn: &mut Conn<Self>, msg: &NewMessage, now: DateTime<Utc>) -> Result<Enqueued>;
    /// Inserts and commits one message, by the shortest path the backend has.
    async fn message_insert_one(&self, msg: &NewMessage, now: DateTime<Utc>) -> Result<Enqueued>;
    async fn message_find(&self, id: MessageId) -> Result<Option<StoredMessage>>;
    /// Up to `limit` messages with `seq > after`, in `seq` order: what a backfill needs of each.
    async fn message_page(&self, conn: &mut Conn<Self>, after: i64, limit: i64) -> Result<Vec<MessageRef>>;
    /// See [`super::Store::message_list_after`].
    async fn message_list_after(&self, after: i64, limit: i64) -> Result<Vec<StoredMessage>>;
    /// See [`super::Store::message_unrelayed_exists`].
    async fn message_unrelayed_exists(&self) -> Result<bool>;
    /// See [`super::Store::message_unrelayed_exists_asking_wakeup`].
    async fn message_unrelayed_exists_asking_wakeup(&self, wake_for: Duration) -> Result<bool>;
    async fn message_last_seq(&self) -> Result<i64>;
    /// How many committed messages the relay has not read, and the oldest one's enqueue time.
    async fn message_unrelayed_summary(&self) -> Result<(i64, Option<DateTime<Utc>>)>;

    // The relay.

    /// See [`super::Store::relay_batch`].
    async fn relay_batch(
        &self,
        limit: i64,
        now: DateTime<Utc>,
        notify: bool,
        offers: &[PushOffer],
    ) -> Result<RelayOutcome>;

    // Consumers.

    async fn consumer_find(&self, conn: &mut Conn<Self>, name: &str) -> Result<Option<ConsumerRecord>>;
    async fn consumer_list(&self) -> Result<Vec<ConsumerRecord>>;
    /// Inserts a consumer: `start_seq` is the highest `seq` so far for NEW, 0 for EARLIEST.
    async fn consumer_insert(
        &self,
        conn: &mut Conn<Self>,
        spec: &ConsumerSpec,
        now: DateTime<Utc>,
    ) -> Result<ConsumerRecord>;
    /// Deletes a consumer and its inbox rows; false when there was none.
    async fn consumer_delete(&self, conn: &mut Conn<Self>, name: &str) -> Result<bool>;
    async fn consumer_set_paused(&self, name: &str, paused: bool) -> Result<Option<ConsumerRecord>>;
    /// Counts per consumer (all, or only `only`), in name order. See [`super::Store::stats`].
    async fn consumer_stats(&self, only: Option<&str>, include_acked: bool) -> Result<Vec<ConsumerStats>>;

    // Deliveries.

    /// Creates pending inbox rows of `consumer` for `messages`; existing rows are left alone.
    /// Returns how many it created.
    async fn delivery_insert_pending(
        &self,
        conn: &mut Conn<Self>,
        consumer: &str,
        messages: &[MessageRef],
        now: DateTime<Utc>,
    ) -> Result<u64>;
    /// See [`super::Store::delivery_lease_batch`].
    async fn delivery_lease_batch(
        &self,
        consumer: &ConsumerName,
        session: &str,
        limit: i64,
        keys_after: &str,
        lease_until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<LeasedDelivery>>;
    async fn delivery_ack_many(&self, consumer: &ConsumerName, ids: &[MessageId], now: DateTime<Utc>) -> Result<u64>;
    /// Acks by id, with each message's seq known: a backend that finds deliveries by seq uses
    /// them; the others ack by id.
    async fn delivery_ack_held(
        &self,
        consumer: &ConsumerName,
        held: &[(MessageId, i64)],
        now: DateTime<Utc>,
    ) -> Result<u64> {
        let ids: Vec<MessageId> = held.iter().map(|(id, _)| *id).collect();
        self.delivery_ack_many(consumer, &ids, now).await
    }
    async fn delivery_release_many(
        &self,
        releases: &[Release],
        guard: ReleaseGuard<'_>,
        now: DateTime<Utc>,
    ) -> Result<u64>;
    async fn delivery_expired_batch(&self, now: DateTime<Utc>, limit: i64) -> Result<Vec<ExpiredRecord>>;
    async fn delivery_next_expiry(&self) -> Result<Option<DateTime<Utc>>>;
    async fn delivery_extend_many(
        &self,
        consumer: &ConsumerName,
        session: &str,
        ids: &[MessageId],
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<u64>;
    /// The earliest `available_at` of the consumer's pending deliveries; `None` when the
    /// consumer does not exist (`Some(None)`: it exists and nothing is pending).
    async fn delivery_next_due(&self, consumer: &str) -> Result<Option<Option<DateTime<Utc>>>>;
    /// Every consumer's inbox row for one message, in consumer order.
    async fn delivery_list_of_message(&self, id: MessageId) -> Result<Vec<DeliveryRecord>>;
    /// Makes `consumer`'s deliveries of `ids` due now with a fresh count, creating the missing
    /// ones; leased ones are left alone. Returns how many changed.
    async fn delivery_replay(
        &self,
        conn: &mut Conn<Self>,
        consumer: &str,
        ids: &[MessageId],
        now: DateTime<Utc>,
    ) -> Result<u64>;
    /// A page of the consumer's dead letters in `seq` order after `after_seq` (only those whose
    /// last error is `last_error` when given); without their payloads and headers (left empty)
    /// unless `with_payloads`.
    async fn dead_letter_page(
        &self,
        consumer: &str,
        last_error: Option<&str>,
        after_seq: i64,
        limit: i64,
        with_payloads: bool,
    ) -> Result<Vec<DeadLetter>>;
    /// See [`super::Store::dead_letter_groups`].
    async fn dead_letter_groups(&self, consumer: &str, limit: i64) -> Result<Vec<DeadGroup>>;
    /// See [`super::Store::message_search`].
    async fn message_search(
        &self,
        query: &MessageQuery,
        before_seq: Option<i64>,
        limit: i64,
        scan: i64,
    ) -> Result<SearchPage>;
    /// See [`super::Store::replay_candidates`].
    async fn replay_candidates(
        &self,
        consumer: &ConsumerName,
        filter: &ReplayFilter,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<ReplayCandidate>>;
    /// Up to `limit` of the keys `consumer` holds, oldest hold first (only `ordering_key` when
    /// given), each with its dead message's last error and its waiting messages counted up to
    /// [`super::HeldKey::WAITING_COUNTED`].
    async fn held_key_list(&self, consumer: &str, ordering_key: Option<&str>, limit: i64) -> Result<Vec<HeldKey>>;
    /// Deletes the hold of one key; returns the dead message that held it (`None`: none held).
    async fn held_key_delete(
        &self,
        conn: &mut Conn<Self>,
        consumer: &str,
        ordering_key: &str,
    ) -> Result<Option<MessageId>>;

    // Upkeep.

    async fn table_health(&self) -> Result<Vec<TableHealth>>;
    async fn vacuum_horizon(&self) -> Result<Option<VacuumHorizon>>;
    async fn vacuum_tables(&self, tables: &[String]) -> Result<Vec<String>>;
    /// Deletes up to `batch` relayed, fully acked messages enqueued before `cutoff`, with their
    /// inbox rows, in one transaction; `None` when another replica is pruning.
    async fn prune_batch(&self, cutoff: DateTime<Utc>, batch: i64) -> Result<Option<Pruned>>;
}

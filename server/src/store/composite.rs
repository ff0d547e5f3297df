//! [`super::Store`] implemented once over any [`Driver`]: each method is either one driver
//! statement or a composite of several, written here for every backend — create-or-compare and
//! the EARLIEST backfill of a consumer, the prune loop, batches in one transaction, lookups that
//! turn "no row" into the error naming it, and decoding records into domain values.
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::driver::Driver;
use super::{
    DeadGroup, DeadLetter, DeliveryRow, Enqueued, ExpiredLease, HeldKey, HintSender, LeasedDelivery, MessageQuery,
    NewMessage, Pruned, PushOffer, RelayOutcome, Release, ReleaseGuard, ReplayCandidate, ReplayFilter, Result,
    SearchPage, Stats, Store, StoreError, StoredMessage, TableHealth, VacuumHorizon,
};
use crate::domain::{Consumer, ConsumerName, ConsumerSpec, MessageId, StartFrom};

/// Messages read per round trip when a consumer starting from EARLIEST walks the log.
pub const SCAN_BATCH: i64 = 5_000;

/// The store over one database driver. Cheap to clone when the driver is (pool handles).
#[derive(Debug, Clone)]
pub struct DriverStore<D> {
    driver: D,
}

impl<D: Driver> DriverStore<D> {
    pub fn new(driver: D) -> Self {
        Self { driver }
    }

    pub fn driver(&self) -> &D {
        &self.driver
    }
}

/// The driver's own methods (its pools, backend-specific helpers) on the store.
impl<D> std::ops::Deref for DriverStore<D> {
    type Target = D;

    fn deref(&self) -> &D {
        &self.driver
    }
}

#[async_trait::async_trait]
impl<D: Driver> Store for DriverStore<D> {
    fn backend(&self) -> &'static str {
        self.driver.backend()
    }

    fn relay_defaults(&self) -> super::RelayDefaults {
        self.driver.relay_defaults()
    }

    async fn migrate(&self) -> Result<()> {
        self.driver.migrate().await
    }

    async fn settings_write(&self, max_payload_bytes: usize) -> Result<()> {
        self.driver.settings_write(i64::try_from(max_payload_bytes).unwrap_or(i64::MAX)).await
    }

    async fn close(&self) {
        self.driver.close().await
    }

    fn pool_status(&self) -> (u32, usize) {
        self.driver.pool_status()
    }

    async fn watch(&self, hints: HintSender, cancel: CancellationToken) {
        self.driver.watch(hints, cancel).await
    }

    async fn message_insert(&self, msg: &NewMessage, now: DateTime<Utc>) -> Result<Enqueued> {
        self.driver.message_insert_one(msg, now).await
    }

    async fn message_insert_batch(&self, msgs: &[NewMessage], now: DateTime<Utc>) -> Result<Vec<Enqueued>> {
        let mut tx = self.driver.begin().await?;
        let mut out = Vec::with_capacity(msgs.len());
        for msg in msgs {
            out.push(self.driver.message_insert(&mut tx, msg, now).await?);
        }
        tx.commit().await?;
        Ok(out)
    }

    async fn relay_batch(
        &self,
        limit: i64,
        now: DateTime<Utc>,
        notify: bool,
        offers: &[PushOffer],
    ) -> Result<RelayOutcome> {
        self.driver.relay_batch(limit, now, notify, offers).await
    }

    /// Under the consumer-change lock: the same definition again returns the stored consumer, a
    /// different one is a conflict; a new EARLIEST consumer gets a pending row for every
    /// retained message it matches, relayed or not (the relay's insert later finds it there),
    /// in the same transaction.
    async fn consumer_create(&self, spec: &ConsumerSpec, now: DateTime<Utc>) -> Result<Consumer> {
        let mut tx = self.driver.begin_consumer_change().await?;
        if let Some(existing) = self.driver.consumer_find(&mut tx, spec.name.as_str()).await? {
            let existing = Consumer::try_from(existing)?;
            return match existing.spec.first_difference(spec) {
                None => Ok(existing),
                Some(field) => Err(StoreError::ConsumerConflict { name: spec.name.to_string(), field }),
            };
        }
        let consumer = Consumer::try_from(self.driver.consumer_insert(&mut tx, spec, now).await?)?;
        if spec.start_from == StartFrom::Earliest {
            let mut after = 0;
            loop {
                let page = self.driver.message_page(&mut tx, after, SCAN_BATCH).await?;
                let Some(last) = page.last() else { break };
                after = last.seq;
                let full = page.len() as i64 == SCAN_BATCH;
                let mine: Vec<_> = page.into_iter().filter(|m| spec.matches(&m.topic)).collect();
                self.driver.delivery_insert_pending(&mut tx, spec.name.as_str(), &mine, now).await?;
                if !full {
                    break;
                }
            }
        }
        tx.commit().await?;
        Ok(consumer)
    }

    async fn consumer_get(&self, name: &ConsumerName) -> Result<Consumer> {
        let mut conn = self.driver.read().await?;
        let row = self.driver.consumer_find(&mut conn, name.as_str()).await?;
        Consumer::try_from(row.ok_or_else(|| StoreError::ConsumerNotFound(name.to_string()))?)
    }

    async fn consumer_list(&self) -> Result<Vec<Consumer>> {
        self.driver.consumer_list().await?.into_iter().map(Consumer::try_from).collect()
    }

    async fn consumer_delete(&self, name: &ConsumerName) -> Result<()> {
        let mut tx = self.driver.begin_consumer_change().await?;
        if !self.driver.consumer_delete(&mut tx, name.as_str()).await? {
            return Err(StoreError::ConsumerNotFound(name.to_string()));
        }
        tx.commit().await?;
        Ok(())
    }

    async fn consumer_set_paused(&self, name: &ConsumerName, paused: bool) -> Result<Consumer> {
        let row = self.driver.consumer_set_paused(name.as_str(), paused).await?;
        Consumer::try_from(row.ok_or_else(|| StoreError::ConsumerNotFound(name.to_string()))?)
    }

    async fn delivery_lease_batch(
        &self,
        consumer: &ConsumerName,
        session: &str,
        limit: i64,
        keys_after: &str,
        lease_until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<LeasedDelivery>> {
        let mut out = self.driver.delivery_lease_batch(consumer, session, limit, keys_after, lease_until, now).await?;
        out.sort_by_key(|d| d.message.seq);
        Ok(out)
    }

    async fn delivery_ack_many(&self, consumer: &ConsumerName, ids: &[MessageId], now: DateTime<Utc>) -> Result<u64> {
        self.driver.delivery_ack_many(consumer, ids, now).await
    }

    async fn delivery_ack_held(
        &self,
        consumer: &ConsumerName,
        held: &[(MessageId, i64)],
        now: DateTime<Utc>,
    ) -> Result<u64> {
        self.driver.delivery_ack_held(consumer, held, now).await
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
        self.driver.delivery_release_many(releases, guard, now).await
    }

    async fn delivery_expired_batch(&self, now: DateTime<Utc>, limit: i64) -> Result<Vec<ExpiredLease>> {
        self.driver.delivery_expired_batch(now, limit).await?.into_iter().map(ExpiredLease::try_from).collect()
    }

    async fn delivery_next_expiry(&self) -> Result<Option<DateTime<Utc>>> {
        self.driver.delivery_next_expiry().await
    }

    async fn delivery_extend_many(
        &self,
        consumer: &ConsumerName,
        session: &str,
        ids: &[MessageId],
        until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<u64> {
        self.driver.delivery_extend_many(consumer, session, ids, until, now).await
    }

    async fn delivery_next_due(&self, consumer: &ConsumerName) -> Result<Option<DateTime<Utc>>> {
        self.driver
            .delivery_next_due(consumer.as_str())
            .await?
            .ok_or_else(|| StoreError::ConsumerNotFound(consumer.to_string()))
    }

    async fn stats(&self, only: Option<&ConsumerName>, include_acked: bool) -> Result<Stats> {
        let (unrelayed, oldest_unrelayed_at) = self.driver.message_unrelayed_summary().await?;
        let consumers = self.driver.consumer_stats(only.map(|c| c.as_str()), include_acked).await?;
        if let Some(name) = only
            && consumers.is_empty()
        {
            return Err(StoreError::ConsumerNotFound(name.to_string()));
        }
        Ok(Stats { unrelayed, oldest_unrelayed_at, consumers })
    }

    async fn table_health(&self) -> Result<Vec<TableHealth>> {
        self.driver.table_health().await
    }

    async fn vacuum_horizon(&self) -> Result<Option<VacuumHorizon>> {
        self.driver.vacuum_horizon().await
    }

    async fn vacuum_tables(&self, tables: &[String]) -> Result<Vec<String>> {
        if tables.is_empty() {
            return Ok(Vec::new());
        }
        self.driver.vacuum_tables(tables).await
    }

    async fn dead_letter_list(&self, consumer: &ConsumerName, after_seq: i64, limit: i64) -> Result<Vec<DeadLetter>> {
        self.consumer_get(consumer).await?;
        self.driver.dead_letter_page(consumer.as_str(), None, after_seq, limit, true).await
    }

    async fn dead_letter_groups(&self, consumer: &ConsumerName, limit: i64) -> Result<Vec<DeadGroup>> {
        self.consumer_get(consumer).await?;
        self.driver.dead_letter_groups(consumer.as_str(), limit).await
    }

    async fn dead_letter_list_with_error(
        &self,
        consumer: &ConsumerName,
        last_error: Option<&str>,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<DeadLetter>> {
        self.consumer_get(consumer).await?;
        self.driver.dead_letter_page(consumer.as_str(), last_error, after_seq, limit, false).await
    }

    async fn message_search(
        &self,
        query: &MessageQuery,
        before_seq: Option<i64>,
        limit: i64,
        scan: i64,
    ) -> Result<SearchPage> {
        self.driver.message_search(query, before_seq, limit, scan).await
    }

    async fn message_get(&self, id: MessageId) -> Result<(StoredMessage, Vec<DeliveryRow>)> {
        let message = self.driver.message_find(id).await?.ok_or(StoreError::MessageNotFound(id))?;
        let deliveries = self
            .driver
            .delivery_list_of_message(id)
            .await?
            .into_iter()
            .map(DeliveryRow::try_from)
            .collect::<Result<Vec<_>>>()?;
        Ok((message, deliveries))
    }

    async fn message_list_after(&self, after: i64, limit: i64) -> Result<Vec<StoredMessage>> {
        self.driver.message_list_after(after, limit).await
    }

    async fn message_unrelayed_exists(&self) -> Result<bool> {
        self.driver.message_unrelayed_exists().await
    }

    async fn message_unrelayed_exists_asking_wakeup(&self, wake_for: Duration) -> Result<bool> {
        self.driver.message_unrelayed_exists_asking_wakeup(wake_for).await
    }

    async fn message_last_seq(&self) -> Result<i64> {
        self.driver.message_last_seq().await
    }

    async fn replay_candidates(
        &self,
        consumer: &ConsumerName,
        filter: &ReplayFilter,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<ReplayCandidate>> {
        self.driver.replay_candidates(consumer, filter, after_seq, limit).await
    }

    async fn held_key_list(&self, consumer: &ConsumerName, limit: i64) -> Result<Vec<HeldKey>> {
        self.consumer_get(consumer).await?;
        self.driver.held_key_list(consumer.as_str(), None, limit).await
    }

    async fn held_key_release(
        &self,
        consumer: &ConsumerName,
        ordering_key: &str,
        skip_dead: bool,
        now: DateTime<Utc>,
    ) -> Result<Option<HeldKey>> {
        self.consumer_get(consumer).await?;
        let Some(held) = self.driver.held_key_list(consumer.as_str(), Some(ordering_key), 1).await?.pop() else {
            return Ok(None);
        };
        let mut tx = self.driver.begin().await?;
        // Released by someone else in between: nothing to do.
        if self.driver.held_key_delete(&mut tx, consumer.as_str(), ordering_key).await?.is_none() {
            return Ok(None);
        }
        if !skip_dead {
            self.driver.delivery_replay(&mut tx, consumer.as_str(), &[held.message_id], now).await?;
        }
        tx.commit().await?;
        Ok(Some(held))
    }

    async fn replay_apply(&self, consumer: &ConsumerName, ids: &[MessageId], now: DateTime<Utc>) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let mut tx = self.driver.begin().await?;
        let changed = self.driver.delivery_replay(&mut tx, consumer.as_str(), ids, now).await?;
        tx.commit().await?;
        Ok(changed)
    }

    /// Batch after batch, each its own transaction, until one finds fewer than `batch` or
    /// another replica is pruning.
    async fn prune(&self, cutoff: DateTime<Utc>, batch: i64) -> Result<Pruned> {
        let mut total = Pruned::default();
        while let Some(done) = self.driver.prune_batch(cutoff, batch).await? {
            total.messages += done.messages;
            total.deliveries += done.deliveries;
            if done.messages < batch {
                break;
            }
        }
        Ok(total)
    }
}

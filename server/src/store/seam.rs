//! The storage seam, one trait: [`Store`] is everything the relay, the delivery sessions, the
//! maintenance loops and the admin service ask of a database. Each backend (`postgres`,
//! `sqlite`) implements its required methods, each one narrow, entity-first statement (or the
//! one round trip a backend needs for it); the operations made of several statements —
//! create-or-compare and the EARLIEST backfill of a consumer, several messages in one transaction, the
//! prune loop, a lookup of the consumer before a listing that must name a missing one — are its
//! provided methods, written here once for every backend. Two required methods,
//! [`Store::consumer_set_paused`] and [`Store::delivery_next_due`], tell a missing consumer from
//! their own statement's answer, so each backend raises [`StoreError::ConsumerNotFound`] itself
//! (the per-method suite checks it on both). Statements that such an operation runs inside its
//! transaction are the methods of [`StoreTx`], the transaction a backend opens for it.
//!
//! The conformance suite runs every backend through the same cases (`tests`, one file per
//! subject): some call the required methods directly (River's `riverdrivertest`), some the
//! operations.
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::records::{ConsumerRecord, DeliveryRecord, MessageRef};
use super::relay_pass::RelayTx;
use super::{
    ConsoleSession, ConsumerCreateParams, ConsumerStats, DeadGroup, DeadLetter, DeadLetterPageParams, DeliveryRow,
    Enqueued, ExpiredLease, ExtendParams, HeldKey, HintSender, KeyReleaseParams, LeaseParams, NewMessage, Pruned,
    RelayDefaults, ReplayCandidate, ReplayCandidatesParams, Result, SearchPage, SearchParams, Stats, StoreError,
    TableHealth, TailEntry, TailPage, TailParams, UnackedPage, UnackedPageParams, VacuumHorizon,
};
use crate::domain::{
    Consumer, ConsumerName, ConsumerSpec, LeasedDelivery, MessageId, PushOffer, RelayOutcome, Release, ReleaseGuard,
    StartFrom, StoredMessage,
};

/// Messages read per round trip when a consumer starting from EARLIEST walks the log.
pub const BACKFILL_PAGE: i64 = 5_000;

/// The storage seam. Each backend gives the same semantics; the conformance suite runs against
/// every one.
#[async_trait::async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    // ---- The database (required).

    /// `"postgres"` or `"sqlite"`, for logs.
    fn backend(&self) -> &'static str;
    /// How the relay best runs on this database, where the configuration leaves it open.
    fn relay_defaults(&self) -> RelayDefaults;
    /// Applies pending migrations, then refreshes what the planner knows.
    async fn migrate(&self) -> Result<()>;
    /// Writes the limits that the database's own entry points enforce for every writer (the
    /// payload limit of `outbox.enqueue` and of SQLite's insert).
    async fn settings_write(&self, max_payload_bytes: usize) -> Result<()>;
    /// Closes the connections (at shutdown).
    async fn close(&self);
    /// Open and idle connections of the main pool.
    fn pool_status(&self) -> (u32, usize);
    /// Runs until cancelled, sending a [`super::WorkHint`] whenever work appears that this
    /// process did not cause: another replica's relay (PostgreSQL: LISTEN), or a producer in
    /// another process committing to the same file (SQLite: `PRAGMA data_version`). Whom to
    /// wake is the caller's business.
    async fn watch(&self, hints: HintSender, cancel: CancellationToken);
    /// A write transaction, for the statements of [`StoreTx`]. Dropped without
    /// [`StoreTx::commit`], it rolls back.
    async fn begin(&self) -> Result<Box<dyn StoreTx>>;
    /// A write transaction for creating or deleting a consumer: serialised against relay passes
    /// (which must never fan out with a stale list of consumers) and against each other.
    async fn begin_consumer_change(&self) -> Result<Box<dyn StoreTx>>;

    // ---- Messages (required).

    /// Inserts and commits one message, by the shortest path the backend has; an existing
    /// `message_id` writes nothing and says `duplicate`.
    async fn message_insert(&self, msg: &NewMessage, now: DateTime<Utc>) -> Result<Enqueued>;
    async fn message_find(&self, id: MessageId) -> Result<Option<StoredMessage>>;
    /// Up to `limit` messages with `seq > after`, in `seq` order (for tailing).
    async fn message_list_after(&self, after: i64, limit: i64) -> Result<Vec<StoredMessage>>;
    /// Up to `limit` messages with `seq > after`, in `seq` order, without their payloads: seq,
    /// topic and size, for a tail to match before it reads anything large.
    async fn message_tail_window(&self, after: i64, limit: i64) -> Result<Vec<TailEntry>>;
    /// The messages of `seqs` that are still there, in `seq` order.
    async fn message_list_of_seqs(&self, seqs: &[i64]) -> Result<Vec<StoredMessage>>;
    /// Whether a committed message waits for the relay: one indexed probe.
    async fn message_unrelayed_exists(&self) -> Result<bool>;
    /// [`Store::message_unrelayed_exists`], for a relay that has backed off: the same statement
    /// asks producers' commits to wake the relay for the next `wake_for` or until a relay pass
    /// next finds work (PostgreSQL: a `NOTIFY outbox_enqueued` from their statement, which
    /// [`Store::watch`] turns into [`super::WorkHint::Enqueued`]; ADR 0051). SQLite's watcher
    /// notices every commit anyway: there it is the plain probe.
    async fn message_unrelayed_exists_asking_wakeup(&self, wake_for: Duration) -> Result<bool>;
    /// The highest `seq` committed so far (0 when empty).
    async fn message_last_seq(&self) -> Result<i64>;
    /// How many committed messages the relay has not read, and the oldest one's enqueue time.
    async fn message_unrelayed_summary(&self) -> Result<(i64, Option<DateTime<Utc>>)>;
    /// Messages matching `query`, newest first, among at most `scan` messages with
    /// `seq < before_seq` (all when `None`), at most `limit` of them: a page costs what it
    /// scans, never the whole history.
    async fn message_search(&self, p: &SearchParams<'_>) -> Result<SearchPage>;

    // ---- The relay (required).

    /// A transaction for one relay pass, with its statements ([`super::relay_pass`]). The pass
    /// itself is [`Store::relay_pass`], written once for every backend.
    async fn begin_relay(&self) -> Result<Box<dyn RelayTx>>;

    // ---- Consumers (required).

    /// The consumer's row, read outside any transaction.
    async fn consumer_find(&self, name: &str) -> Result<Option<ConsumerRecord>>;
    /// Every consumer, in name order.
    async fn consumer_list(&self) -> Result<Vec<Consumer>>;
    /// [`StoreError::ConsumerNotFound`] when there is no such consumer.
    async fn consumer_set_paused(&self, name: &ConsumerName, paused: bool) -> Result<Consumer>;
    /// Counts per consumer (all, or only `only`), in name order. See [`Store::stats`].
    async fn consumer_stats(&self, only: Option<&str>, include_acked: bool) -> Result<Vec<ConsumerStats>>;

    // ---- Console sessions (required; ADR 0073).

    async fn console_session_insert(&self, session: &ConsoleSession) -> Result<()>;
    async fn console_session_find(&self, id_hash: &[u8; 32]) -> Result<Option<ConsoleSession>>;
    /// Records a request of the session at `now` (idle expiry counts from it).
    async fn console_session_touch(&self, id_hash: &[u8; 32], now: DateTime<Utc>) -> Result<()>;
    /// Ends a session (sign-out, or found expired); false when there was none.
    async fn console_session_delete(&self, id_hash: &[u8; 32]) -> Result<bool>;
    /// Deletes the sessions past `expires_at` or not seen since `idle_since`.
    async fn console_session_delete_expired(&self, now: DateTime<Utc>, idle_since: DateTime<Utc>) -> Result<u64>;
    /// Deletes `principal`'s oldest sessions beyond its newest `keep`.
    async fn console_session_delete_oldest(&self, principal: &str, keep: i64) -> Result<u64>;

    // ---- Deliveries (required).

    /// Leases up to `limit` due deliveries to `session`, returned in `seq` order, honouring
    /// ordering keys and pausing; each lease increments `delivery_count`. Unkeyed deliveries go
    /// in due order; ordering keys are visited from the first key after `keys_after` (byte
    /// order, wrapping around; "" = from the first), so that a session that passes the key
    /// cursor of its last lease ([`super::next_key_cursor`]) serves every key in turn. The cost
    /// follows what the lease returns, not the backlog behind it.
    async fn delivery_lease(&self, p: &LeaseParams<'_>) -> Result<Vec<LeasedDelivery>>;
    /// Acks leased or pending deliveries; returns how many changed.
    async fn delivery_ack_many(&self, consumer: &ConsumerName, ids: &[MessageId], now: DateTime<Utc>) -> Result<u64>;
    /// [`Store::delivery_ack_many`] for deliveries whose `seq` the caller holds (a stream's
    /// window): a backend that finds deliveries by seq uses them (PostgreSQL overrides this);
    /// by default, the one SQLite keeps, it acks by id. Each pair must be a message's id and seq.
    async fn delivery_ack_held(
        &self,
        consumer: &ConsumerName,
        held: &[(MessageId, i64)],
        now: DateTime<Utc>,
    ) -> Result<u64> {
        let ids: Vec<MessageId> = held.iter().map(|(id, _)| *id).collect();
        self.delivery_ack_many(consumer, &ids, now).await
    }
    /// Moves leased deliveries to pending or dead, only where `guard` allows.
    async fn delivery_release_many(
        &self,
        releases: &[Release],
        guard: ReleaseGuard<'_>,
        now: DateTime<Utc>,
    ) -> Result<u64>;
    /// Leases whose deadline is at or before `now`, oldest first, with the policy that decides
    /// their next state.
    async fn delivery_expired(&self, now: DateTime<Utc>, limit: i64) -> Result<Vec<ExpiredLease>>;
    /// The earliest deadline of any lease (one probe of the leased index), so that the sweeper
    /// sleeps until then instead of polling.
    async fn delivery_next_expiry(&self) -> Result<Option<DateTime<Utc>>>;
    /// Pushes the deadline of leases that `session` holds.
    async fn delivery_extend_many(&self, p: &ExtendParams<'_>) -> Result<u64>;
    /// The earliest `available_at` of a consumer's pending deliveries;
    /// [`StoreError::ConsumerNotFound`] once the consumer is gone.
    async fn delivery_next_due(&self, consumer: &ConsumerName) -> Result<Option<DateTime<Utc>>>;
    /// Every consumer's delivery of one message, in consumer order.
    async fn delivery_list_of_message(&self, id: MessageId) -> Result<Vec<DeliveryRecord>>;
    /// A page of the consumer's unfinished deliveries of `kind`, in `seq` order after
    /// `after_seq`, at most `limit`. Each kind is read from the partial indexes of its state,
    /// never from the history: pending ones from the pending rows and (PostgreSQL) the pending
    /// ranges, in flight ones from the leases; retrying ones are the pending rows with a
    /// delivery count, found among at most `scan` pending rows per page.
    async fn delivery_unacked_page(&self, consumer: &str, p: &UnackedPageParams) -> Result<UnackedPage>;

    // ---- Dead letters, replay and held keys (required).

    /// A page of the consumer's dead letters in `seq` order after `after_seq` (only those whose
    /// last error is `last_error` when given); without their payloads and headers (left empty)
    /// unless `with_payloads`.
    async fn dead_letter_page(&self, consumer: &str, p: &DeadLetterPageParams<'_>) -> Result<Vec<DeadLetter>>;
    /// The consumer's dead letters grouped by last error, largest group first, at most `limit`
    /// groups.
    async fn dead_letter_group_page(&self, consumer: &str, limit: i64) -> Result<Vec<DeadGroup>>;
    /// Up to `limit` replay candidates in `seq` order after `after_seq`: messages that `filter`
    /// selects and whose delivery to `consumer` is not leased right now (a leased one is left
    /// to its stream). Fewer than `limit` means there are no more.
    async fn replay_candidates(
        &self,
        consumer: &ConsumerName,
        p: &ReplayCandidatesParams<'_>,
    ) -> Result<Vec<ReplayCandidate>>;
    /// Up to `limit` of the keys `consumer` holds, oldest hold first (only `ordering_key` when
    /// given), each with its dead message's last error and its waiting messages counted up to
    /// [`HeldKey::WAITING_COUNTED`].
    async fn held_key_page(&self, consumer: &str, ordering_key: Option<&str>, limit: i64) -> Result<Vec<HeldKey>>;

    // ---- Upkeep (required).

    /// Size and dead rows of outboxd's own tables, from the database's catalog (no table scan).
    async fn table_health(&self) -> Result<Vec<TableHealth>>;
    /// The oldest holder of the vacuum horizon of outboxd's tables; `None` when nothing holds
    /// it back, and always on SQLite.
    async fn vacuum_horizon(&self) -> Result<Option<VacuumHorizon>>;
    /// Vacuums these of outboxd's tables (as [`Store::table_health`] names them), unless another
    /// process is doing it; returns the tables vacuumed. A no-op on stores that need none.
    async fn vacuum_tables(&self, tables: &[String]) -> Result<Vec<String>>;
    /// Deletes up to `limit` relayed, fully acked messages enqueued before `cutoff`, with their
    /// deliveries, in one transaction; `None` when another replica is pruning.
    async fn prune_before(&self, cutoff: DateTime<Utc>, limit: i64) -> Result<Option<Pruned>>;

    // ---- Operations of several statements (provided, the same on every backend).

    /// One relay pass: claim up to `limit` unrelayed messages, fan each out to every matching
    /// consumer, mark them relayed; one transaction. `notify` announces the new deliveries to
    /// other replicas where the store supports that. A delivery that one of the `offers` can
    /// take at once (due now, no ordering key, consumer not paused) is created leased to that
    /// stream instead of pending, never more than an offer's room, and returned in
    /// [`RelayOutcome::pushed`]. Room is the caller's: the pass only reads the offers. Both
    /// stores read after a cursor (PostgreSQL's with gaps for late commits, ADR 0027; SQLite's
    /// needs none, ADR 0066); [`crate::domain::fanout::plan`] decides who gets what (ADR 0067),
    /// and the pass is written once over the backend's statements (ADR 0087).
    async fn relay_pass(
        &self,
        limit: i64,
        now: DateTime<Utc>,
        notify: bool,
        offers: &[PushOffer],
    ) -> Result<RelayOutcome> {
        super::relay_pass::run(self.begin_relay().await?, limit, now, notify, offers).await
    }

    /// What a tail of `patterns` reads next: among at most `scan` messages after `after`, the
    /// first `limit` whose topic a pattern matches (`domain::topic_matches`, as the relay
    /// matches). Only topics and sizes are read here: a tail loads the payloads of its matches
    /// alone, and only as many as its reader has room for ([`Store::message_list_of_seqs`]).
    async fn message_tail(&self, p: &TailParams<'_>) -> Result<TailPage> {
        let TailParams { after, patterns, scan, limit } = *p;
        let window = self.message_tail_window(after, scan).await?;
        let mut page = TailPage { hits: Vec::new(), next_after: after, more: window.len() as i64 >= scan };
        for entry in window {
            if patterns.iter().any(|p| p.matches(&entry.topic)) {
                if page.hits.len() >= limit {
                    page.more = true;
                    break;
                }
                page.next_after = entry.seq;
                page.hits.push(entry);
            } else {
                page.next_after = entry.seq;
            }
        }
        Ok(page)
    }

    /// All or nothing: one transaction for the whole batch.
    async fn message_insert_many(&self, msgs: &[NewMessage], now: DateTime<Utc>) -> Result<Vec<Enqueued>> {
        let mut tx = self.begin().await?;
        let mut out = Vec::with_capacity(msgs.len());
        for msg in msgs {
            out.push(tx.message_insert(msg, now).await?);
        }
        tx.commit().await?;
        Ok(out)
    }

    /// A message and every consumer's delivery of it.
    async fn message_get(&self, id: MessageId) -> Result<(StoredMessage, Vec<DeliveryRow>)> {
        let message = self.message_find(id).await?.ok_or(StoreError::MessageNotFound(id))?;
        let deliveries = self
            .delivery_list_of_message(id)
            .await?
            .into_iter()
            .map(DeliveryRow::try_from)
            .collect::<Result<Vec<_>>>()?;
        Ok((message, deliveries))
    }

    /// Creates a consumer; the same definition again returns the existing one, a different
    /// one is [`StoreError::ConsumerConflict`]. Under the consumer-change lock: a new EARLIEST
    /// consumer gets a pending row for every retained message it matches, relayed or not (the
    /// relay's insert later finds it there), in the same transaction.
    async fn consumer_create(&self, spec: &ConsumerSpec, now: DateTime<Utc>) -> Result<Consumer> {
        self.consumer_create_by(&ConsumerCreateParams { spec, created_by: None, max: usize::MAX, now }).await
    }

    /// [`Store::consumer_create`] on behalf of `created_by`, refused with
    /// [`StoreError::ConsumerLimit`] when `max` consumers exist already: counted under the
    /// consumer-change lock, so concurrent creates (on any replica) never exceed it.
    async fn consumer_create_by(&self, p: &ConsumerCreateParams<'_>) -> Result<Consumer> {
        let ConsumerCreateParams { spec, created_by, max, now } = *p;
        let mut tx = self.begin_consumer_change().await?;
        if let Some(existing) = tx.consumer_find(spec.name.as_str()).await? {
            let existing = Consumer::try_from(existing)?;
            return match existing.spec.first_difference(spec) {
                None => Ok(existing),
                Some(field) => Err(StoreError::ConsumerConflict { name: spec.name.to_string(), field }),
            };
        }
        let count = usize::try_from(tx.consumer_count().await?).unwrap_or(usize::MAX);
        if count >= max {
            return Err(StoreError::ConsumerLimit { count, max });
        }
        let consumer = Consumer::try_from(tx.consumer_insert(spec, created_by, now).await?)?;
        if spec.start_from == StartFrom::Earliest {
            let mut after = 0;
            loop {
                let page = tx.message_page(after, BACKFILL_PAGE).await?;
                let Some(last) = page.last() else { break };
                after = last.seq;
                let full = page.len() as i64 == BACKFILL_PAGE;
                let mine: Vec<_> = page.into_iter().filter(|m| spec.matches(&m.topic)).collect();
                tx.delivery_insert_pending(spec.name.as_str(), &mine, now).await?;
                if !full {
                    break;
                }
            }
        }
        tx.commit().await?;
        Ok(consumer)
    }

    async fn consumer_get(&self, name: &ConsumerName) -> Result<Consumer> {
        let row = self.consumer_find(name.as_str()).await?;
        Consumer::try_from(row.ok_or_else(|| StoreError::ConsumerNotFound(name.to_string()))?)
    }

    /// Deletes a consumer and its deliveries.
    async fn consumer_delete(&self, name: &ConsumerName) -> Result<()> {
        let mut tx = self.begin_consumer_change().await?;
        if !tx.consumer_delete(name.as_str()).await? {
            return Err(StoreError::ConsumerNotFound(name.to_string()));
        }
        tx.commit().await?;
        Ok(())
    }

    /// Counts per consumer; `acked` reads history, so it is 0 unless `include_acked`
    /// (both stores: it is the history, never read otherwise).
    async fn stats(&self, only: Option<&ConsumerName>, include_acked: bool) -> Result<Stats> {
        let (unrelayed, oldest_unrelayed_at) = self.message_unrelayed_summary().await?;
        let consumers = self.consumer_stats(only.map(|c| c.as_str()), include_acked).await?;
        if let Some(name) = only
            && consumers.is_empty()
        {
            return Err(StoreError::ConsumerNotFound(name.to_string()));
        }
        Ok(Stats { unrelayed, oldest_unrelayed_at, consumers })
    }

    /// A page of dead letters in `seq` order after `after_seq`.
    async fn dead_letter_list(&self, consumer: &ConsumerName, after_seq: i64, limit: i64) -> Result<Vec<DeadLetter>> {
        self.consumer_get(consumer).await?;
        self.dead_letter_page(
            consumer.as_str(),
            &DeadLetterPageParams { last_error: None, after_seq, limit, with_payloads: true },
        )
        .await
    }

    /// [`Store::dead_letter_page`] (the list of what failed, without payloads and headers,
    /// unless `with_payloads`); [`StoreError::ConsumerNotFound`] for an unknown consumer.
    async fn dead_letter_list_with_error(
        &self,
        consumer: &ConsumerName,
        p: &DeadLetterPageParams<'_>,
    ) -> Result<Vec<DeadLetter>> {
        self.consumer_get(consumer).await?;
        self.dead_letter_page(consumer.as_str(), p).await
    }

    /// [`Store::delivery_unacked_page`]; [`StoreError::ConsumerNotFound`] for an unknown
    /// consumer.
    async fn delivery_list_unacked(&self, consumer: &ConsumerName, p: &UnackedPageParams) -> Result<UnackedPage> {
        self.consumer_get(consumer).await?;
        self.delivery_unacked_page(consumer.as_str(), p).await
    }

    /// The consumer's dead letters grouped by last error, largest group first, at most `limit`
    /// groups; [`StoreError::ConsumerNotFound`] for an unknown consumer.
    async fn dead_letter_groups(&self, consumer: &ConsumerName, limit: i64) -> Result<Vec<DeadGroup>> {
        self.consumer_get(consumer).await?;
        self.dead_letter_group_page(consumer.as_str(), limit).await
    }

    /// Makes `consumer`'s deliveries of `ids` due now with a fresh count, creating the ones
    /// that do not exist; leased ones are left alone. Returns how many changed.
    async fn replay_apply(&self, consumer: &ConsumerName, ids: &[MessageId], now: DateTime<Utc>) -> Result<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let mut tx = self.begin().await?;
        let changed = tx.delivery_replay(consumer.as_str(), ids, now).await?;
        tx.commit().await?;
        Ok(changed)
    }

    /// Up to `limit` of the ordering keys `consumer` holds, oldest hold first.
    async fn held_key_list(&self, consumer: &ConsumerName, limit: i64) -> Result<Vec<HeldKey>> {
        self.consumer_get(consumer).await?;
        self.held_key_page(consumer.as_str(), None, limit).await
    }

    /// Lets a held key flow again and returns it as it was held (`None`: not held). Without
    /// `skip_dead` the dead message is made due again first, in the same transaction (as
    /// [`Store::replay_apply`] would), so that the key resumes with it, in order.
    async fn held_key_release(&self, p: &KeyReleaseParams<'_>) -> Result<Option<HeldKey>> {
        let KeyReleaseParams { consumer, ordering_key, skip_dead, now } = *p;
        self.consumer_get(consumer).await?;
        let Some(held) = self.held_key_page(consumer.as_str(), Some(ordering_key), 1).await?.pop() else {
            return Ok(None);
        };
        let mut tx = self.begin().await?;
        // Released by someone else in between: nothing to do.
        if tx.held_key_delete(consumer.as_str(), ordering_key).await?.is_none() {
            return Ok(None);
        }
        if !skip_dead {
            tx.delivery_replay(consumer.as_str(), &[held.message_id], now).await?;
        }
        tx.commit().await?;
        Ok(Some(held))
    }

    /// Deletes relayed, fully acked messages enqueued before `cutoff`: batch after batch, each
    /// its own transaction, until one finds fewer than `batch` or another replica is pruning.
    async fn prune(&self, cutoff: DateTime<Utc>, batch: i64) -> Result<Pruned> {
        let mut total = Pruned::default();
        while let Some(done) = self.prune_before(cutoff, batch).await? {
            total.messages += done.messages;
            total.deliveries += done.deliveries;
            if done.messages < batch {
                break;
            }
        }
        Ok(total)
    }
}

/// A write transaction of a backend, open until [`StoreTx::commit`] (dropped: rolled back):
/// the statements that [`Store`]'s operations run together.
#[async_trait::async_trait]
pub trait StoreTx: Send {
    /// Inserts one message; an existing `message_id` writes nothing and says `duplicate`.
    async fn message_insert(&mut self, msg: &NewMessage, now: DateTime<Utc>) -> Result<Enqueued>;
    /// Up to `limit` messages with `seq > after`, in `seq` order: what a backfill needs of each.
    async fn message_page(&mut self, after: i64, limit: i64) -> Result<Vec<MessageRef>>;
    async fn consumer_find(&mut self, name: &str) -> Result<Option<ConsumerRecord>>;
    /// How many consumers exist (under the consumer-change lock: no create slips in after it).
    async fn consumer_count(&mut self) -> Result<i64>;
    /// Inserts a consumer: `start_seq` is the highest `seq` so far for NEW, 0 for EARLIEST;
    /// `created_by` is the principal that creates it (ADR 0072).
    async fn consumer_insert(
        &mut self,
        spec: &ConsumerSpec,
        created_by: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<ConsumerRecord>;
    /// Deletes a consumer and its deliveries; false when there was none.
    async fn consumer_delete(&mut self, name: &str) -> Result<bool>;
    /// Creates pending delivery rows of `consumer` for `messages`; existing rows are left alone.
    /// Returns how many it created.
    async fn delivery_insert_pending(
        &mut self,
        consumer: &str,
        messages: &[MessageRef],
        now: DateTime<Utc>,
    ) -> Result<u64>;
    /// Makes `consumer`'s deliveries of `ids` due now with a fresh count, creating the missing
    /// ones; leased ones are left alone. Returns how many changed.
    async fn delivery_replay(&mut self, consumer: &str, ids: &[MessageId], now: DateTime<Utc>) -> Result<u64>;
    /// Deletes the hold of one key; returns the dead message that held it (`None`: none held).
    async fn held_key_delete(&mut self, consumer: &str, ordering_key: &str) -> Result<Option<MessageId>>;
    async fn commit(self: Box<Self>) -> Result<()>;
}

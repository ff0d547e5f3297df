//! The store's writes that make work for someone, each waking whom it made work for (ADR 0085).
//!
//! A write that makes deliveries leasable (a relay pass's pending deliveries, a release to
//! pending or dead, a replay, a key released, a consumer resumed or created with a backfill, an
//! ack that lets an ordering key go on) or messages relayable (an enqueue) goes through
//! [`Waking`]: it calls the store, then wakes the streams of the consumers concerned, the relay,
//! the relay's helper, the vacuum rounds or the sink supervisor, as what the call wrote and what
//! it returned say. No caller wakes anyone itself, and none can forget to. The store still
//! wakes nobody: it returns data and [`WorkHint`]s; the hub only carries the signals.
//!
//! The tests hold it: every method of the store seam is classified (a write that goes through
//! here, one that makes no work for anyone, or the store's own), no code outside the store and
//! this module calls a write that wakes or signals the hub, and every method here is driven on
//! both stores against the wake-ups it must give, and those it must not.
use chrono::{DateTime, Utc};
use tokio::sync::mpsc;

use crate::domain::{
    Consumer, ConsumerName, ConsumerSpec, DeliveryState, MessageId, PushOffer, RelayOutcome, Release, ReleaseGuard,
};
use crate::hub::Hub;
use crate::store::{
    ConsumerCreateParams, Enqueued, HeldKey, KeyReleaseParams, NewMessage, Result, SharedStore, Store, WorkHint,
};

#[cfg(test)]
mod tests;

/// The store's writes that make work, over a store and the hub of this process; a borrow of
/// both, made where it is used.
#[derive(Debug, Clone, Copy)]
pub struct Waking<'a> {
    store: &'a dyn Store,
    hub: &'a Hub,
}

/// Whom a write made work for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Whom {
    /// The relay: messages wait for it.
    Relay,
    /// The streams of these consumers.
    Consumers(Vec<String>),
    /// The relay's helper: a pass claimed a full batch, so a backlog waits.
    Backlog,
    /// The vacuum rounds: a pass read messages, so outboxd's tables move.
    Relayed,
    /// The sink supervisor: a consumer came or went.
    ConsumersChanged,
}

fn wake(hub: &Hub, whom: &Whom) {
    match whom {
        Whom::Relay => hub.wake(&WorkHint::Enqueued),
        Whom::Consumers(names) => names.iter().for_each(|c| hub.notify_consumer(c)),
        Whom::Backlog => hub.relay_backlog().notify(),
        Whom::Relayed => hub.relayed().notify(),
        Whom::ConsumersChanged => hub.consumers_changed().notify(),
    }
}

/// The wake-ups a relay pass owes, given when this is dropped: the relay holds them until it
/// has handed the pass's pushed deliveries to their streams, so that a stream hears of its
/// pending work after what was leased to it.
#[derive(Debug)]
#[must_use = "dropped, it wakes at once"]
pub struct Owed<'a> {
    hub: &'a Hub,
    whom: Vec<Whom>,
}

impl Drop for Owed<'_> {
    fn drop(&mut self) {
        for w in &self.whom {
            wake(self.hub, w);
        }
    }
}

impl<'a> Waking<'a> {
    pub fn new(store: &'a SharedStore, hub: &'a Hub) -> Self {
        Self { store: store.as_ref(), hub }
    }

    fn wake(&self, whom: &Whom) {
        wake(self.hub, whom);
    }

    fn wake_consumer(&self, consumer: &ConsumerName) {
        self.wake(&Whom::Consumers(vec![consumer.to_string()]));
    }

    /// [`Store::message_insert`]; a message written (not a duplicate) wakes the relay.
    pub async fn enqueue(self, msg: &NewMessage, now: DateTime<Utc>) -> Result<Enqueued> {
        let out = self.store.message_insert(msg, now).await?;
        if !out.duplicate {
            self.wake(&Whom::Relay);
        }
        Ok(out)
    }

    /// [`Store::message_insert_many`]; wakes the relay unless every message was a duplicate.
    pub async fn enqueue_batch(self, msgs: &[NewMessage], now: DateTime<Utc>) -> Result<Vec<Enqueued>> {
        let out = self.store.message_insert_many(msgs, now).await?;
        if out.iter().any(|e| !e.duplicate) {
            self.wake(&Whom::Relay);
        }
        Ok(out)
    }

    /// One relay pass ([`Store::relay_pass`]), and the wake-ups it owes: the streams of the
    /// consumers that got pending deliveries, the vacuum rounds when it read messages, the
    /// relay's helper when it claimed a full batch of `limit`.
    pub async fn run_pass(
        self,
        limit: i64,
        now: DateTime<Utc>,
        notify: bool,
        offers: &[PushOffer],
    ) -> Result<(RelayOutcome, Owed<'a>)> {
        let out = self.store.relay_pass(limit, now, notify, offers).await?;
        let whom = relay_wakes(&out, limit);
        Ok((out, Owed { hub: self.hub, whom }))
    }

    /// [`Store::delivery_ack_held`]. An ack makes work only when it lets an ordering key go on
    /// (`keyed`: a delivery it acks has one, which the caller knows and the ack does not read):
    /// then the consumer's streams wake, as the key's next message may be due.
    pub async fn ack(
        self,
        consumer: &ConsumerName,
        held: &[(MessageId, i64)],
        keyed: bool,
        now: DateTime<Utc>,
    ) -> Result<u64> {
        let n = self.store.delivery_ack_held(consumer, held, now).await?;
        if keyed && n > 0 {
            self.wake_consumer(consumer);
        }
        Ok(n)
    }

    /// [`Store::delivery_ack_many`], for a caller that does not know which acked deliveries have
    /// an ordering key: an ack that changed anything wakes the consumer's streams.
    pub async fn ack_ids(self, consumer: &ConsumerName, ids: &[MessageId], now: DateTime<Utc>) -> Result<u64> {
        let n = self.store.delivery_ack_many(consumer, ids, now).await?;
        if n > 0 {
            self.wake_consumer(consumer);
        }
        Ok(n)
    }

    /// [`Store::delivery_release_many`]; a release that moved anything wakes the consumers it
    /// made work for ([`released_for`]).
    pub async fn release(self, releases: &[Release], guard: ReleaseGuard<'_>, now: DateTime<Utc>) -> Result<u64> {
        let n = self.store.delivery_release_many(releases, guard, now).await?;
        if n > 0 {
            let woken = released_for(releases, guard, now);
            if !woken.is_empty() {
                self.wake(&Whom::Consumers(woken));
            }
        }
        Ok(n)
    }

    /// [`Store::consumer_set_paused`]; resuming wakes the consumer's streams (pausing makes no
    /// work).
    pub async fn set_paused(self, name: &ConsumerName, paused: bool) -> Result<Consumer> {
        let consumer = self.store.consumer_set_paused(name, paused).await?;
        if !paused {
            self.wake_consumer(name);
        }
        Ok(consumer)
    }

    /// [`Store::consumer_create_by`]: wakes the sink supervisor, and the consumer's streams, for
    /// what an EARLIEST consumer's backfill made pending.
    pub async fn create_consumer(
        self,
        spec: &ConsumerSpec,
        created_by: Option<&str>,
        max: usize,
        now: DateTime<Utc>,
    ) -> Result<Consumer> {
        let consumer = self.store.consumer_create_by(&ConsumerCreateParams { spec, created_by, max, now }).await?;
        self.wake_consumer(&spec.name);
        self.wake(&Whom::ConsumersChanged);
        Ok(consumer)
    }

    /// [`Store::consumer_delete`]: wakes its streams, which find it gone and end, and the sink
    /// supervisor.
    pub async fn delete_consumer(self, name: &ConsumerName) -> Result<()> {
        self.store.consumer_delete(name).await?;
        self.wake_consumer(name);
        self.wake(&Whom::ConsumersChanged);
        Ok(())
    }

    /// [`Store::replay_apply`]; deliveries made due wake the consumer's streams.
    pub async fn replay(self, consumer: &ConsumerName, ids: &[MessageId], now: DateTime<Utc>) -> Result<u64> {
        let n = self.store.replay_apply(consumer, ids, now).await?;
        if n > 0 {
            self.wake_consumer(consumer);
        }
        Ok(n)
    }

    /// [`Store::held_key_release`]; a key released wakes the consumer's streams, for its dead
    /// message made due again or the messages behind it.
    pub async fn release_key(
        self,
        consumer: &ConsumerName,
        ordering_key: &str,
        skip_dead: bool,
        now: DateTime<Utc>,
    ) -> Result<Option<HeldKey>> {
        let held = self.store.held_key_release(&KeyReleaseParams { consumer, ordering_key, skip_dead, now }).await?;
        if held.is_some() {
            self.wake_consumer(consumer);
        }
        Ok(held)
    }
}

/// Whom a relay pass made work for (see [`Waking::run_pass`]).
fn relay_wakes(out: &RelayOutcome, limit: i64) -> Vec<Whom> {
    let mut whom = Vec::new();
    if out.messages > 0 {
        whom.push(Whom::Relayed);
    }
    if out.messages as i64 >= limit {
        whom.push(Whom::Backlog);
    }
    if !out.consumers.is_empty() {
        whom.push(Whom::Consumers(out.consumers.clone()));
    }
    whom
}

/// The consumers a release makes work for: those of a delivery made due now, of one made dead
/// (its ordering key's next message may go on, when the policy skips it), and of one made
/// pending for later by anyone but its own stream (the sweeper: no stream has the retry in
/// view, so the streams wake to read when it comes due). A stream that releases for later
/// (a nack's retry) schedules that retry itself, and wakes no one.
fn released_for(releases: &[Release], guard: ReleaseGuard<'_>, now: DateTime<Utc>) -> Vec<String> {
    let by_its_stream = matches!(guard, ReleaseGuard::Session(_));
    let mut woken: Vec<String> = releases
        .iter()
        .filter(|r| r.state == DeliveryState::Dead || r.available_at <= now || !by_its_stream)
        .map(|r| r.consumer.to_string())
        .collect();
    woken.sort_unstable();
    woken.dedup();
    woken
}

/// Wakes whom the store's watcher hints at ([`Store::watch`]: work that other processes made)
/// until the watcher ends.
pub async fn follow(hub: Hub, mut hints: mpsc::UnboundedReceiver<WorkHint>) {
    while let Some(hint) = hints.recv().await {
        hub.wake(&hint);
    }
}

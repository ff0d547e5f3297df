//! In-process wake-ups and stream bookkeeping shared by the relay, the lease sweeper and the
//! delivery sessions. A wake-up is a counter in a `watch` channel, so a waiter that was busy
//! when it was signalled still sees the change: no wake-up is lost.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, mpsc, watch};

use crate::store::{LeasedDelivery, PushOffer};

#[derive(Debug, Clone, Default)]
pub struct Hub(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    enqueued: Signal,
    relay_backlog: Signal,
    relayed: Signal,
    consumers_changed: Signal,
    consumers: Mutex<HashMap<String, Entry>>,
}

#[derive(Debug, Default)]
struct Entry {
    signal: Signal,
    streams: u32,
    /// Streams that take deliveries straight from the relay.
    slots: Vec<PushSlot>,
}

/// How many more deliveries a stream may be given: its `max_in_flight` less what it holds and
/// what the relay has set aside for it. Shared by the stream's session and the relay, so that
/// the two together never exceed the window.
#[derive(Debug, Default)]
pub struct Credits {
    free: AtomicUsize,
    /// The session has pending deliveries to lease: the relay leaves its room alone, so that
    /// older pending work goes before newer pushes.
    wants_pending: AtomicBool,
    /// Signalled when the relay gives back room that such a session is waiting for.
    returned: Notify,
}

impl Credits {
    pub fn new(n: usize) -> Self {
        Self { free: AtomicUsize::new(n), ..Self::default() }
    }

    /// Takes up to `want`; returns how many were taken.
    pub fn take(&self, want: usize) -> usize {
        let mut taken = 0;
        let _ = self.free.fetch_update(Ordering::AcqRel, Ordering::Acquire, |free| {
            taken = free.min(want);
            Some(free - taken)
        });
        taken
    }

    pub fn give(&self, n: usize) {
        if n > 0 {
            self.free.fetch_add(n, Ordering::AcqRel);
        }
    }

    pub fn available(&self) -> usize {
        self.free.load(Ordering::Acquire)
    }

    /// What the session says about pending work (see `wants_pending`).
    pub fn set_wants_pending(&self, wants: bool) {
        self.wants_pending.store(wants, Ordering::Release);
    }

    /// Room given back by the relay, while the session wants to lease pending work.
    pub async fn returned(&self) {
        self.returned.notified().await;
    }

    /// The relay's side of giving back: wakes a session that waits for room.
    fn give_back(&self, n: usize) {
        self.give(n);
        if n > 0 && self.wants_pending.load(Ordering::Acquire) {
            self.returned.notify_one();
        }
    }
}

/// A stream the relay may hand new deliveries to, leased to its session at fan-out time.
#[derive(Debug, Clone)]
pub struct PushSlot {
    pub session: String,
    pub ack_deadline: Duration,
    pub credits: Arc<Credits>,
    pub tx: mpsc::UnboundedSender<Vec<LeasedDelivery>>,
}

/// The push slots of every consumer at one instant: what one relay pass hands out.
#[derive(Debug, Default)]
pub struct PushSlots {
    slots: HashMap<String, Vec<PushSlot>>,
}

impl PushSlots {
    /// The slot of `session`, to send it what was leased to it.
    pub fn slot(&self, consumer: &str, session: &str) -> Option<&PushSlot> {
        self.slots.get(consumer)?.iter().find(|s| s.session == session)
    }

    /// Takes the room of every stream that has some, at most `max` each, for one relay pass:
    /// the offers are data for the store. The room comes back when the returned guard is
    /// dropped, less what [`Offered::used`] says the pass leased; so a failed pass gives back
    /// everything without anyone having to remember to.
    pub fn offer(&self, max: usize, now: DateTime<Utc>) -> Offered<'_> {
        let mut offers = Vec::new();
        for (consumer, slots) in &self.slots {
            for slot in slots.iter().filter(|s| !s.credits.wants_pending.load(Ordering::Acquire)) {
                let room = slot.credits.take(max);
                if room > 0 {
                    offers.push(PushOffer {
                        consumer: consumer.clone(),
                        session: slot.session.clone(),
                        room,
                        lease_until: crate::clock::add(now, slot.ack_deadline),
                    });
                }
            }
        }
        let used = vec![0; offers.len()];
        Offered { slots: self, offers, used }
    }
}

/// Room taken from streams for one relay pass; what the pass did not lease goes back on drop.
#[derive(Debug)]
pub struct Offered<'a> {
    slots: &'a PushSlots,
    offers: Vec<PushOffer>,
    used: Vec<usize>,
}

impl Offered<'_> {
    pub fn offers(&self) -> &[PushOffer] {
        &self.offers
    }

    /// Records what the pass leased to the offering streams: that room stays taken.
    pub fn used(&mut self, pushed: &[(String, String, LeasedDelivery)]) {
        for (consumer, session, _) in pushed {
            if let Some(i) = self.offers.iter().position(|o| &o.consumer == consumer && &o.session == session) {
                self.used[i] = (self.used[i] + 1).min(self.offers[i].room);
            }
        }
    }
}

impl Drop for Offered<'_> {
    fn drop(&mut self) {
        for (o, used) in self.offers.iter().zip(&self.used) {
            if let Some(slot) = self.slots.slot(&o.consumer, &o.session) {
                slot.credits.give_back(o.room - used);
            }
        }
    }
}

/// A wake-up source.
#[derive(Debug, Clone)]
pub struct Signal(Arc<watch::Sender<u64>>);

impl Default for Signal {
    fn default() -> Self {
        Self(Arc::new(watch::channel(0).0))
    }
}

impl Signal {
    pub fn notify(&self) {
        self.0.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }
}

impl Hub {
    /// Signalled when a message was enqueued through this process; wakes the relay.
    pub fn enqueued(&self) -> &Signal {
        &self.0.enqueued
    }

    /// Signalled when this process created, deleted, paused or resumed a consumer: the sink
    /// supervisor looks again.
    pub fn consumers_changed(&self) -> &Signal {
        &self.0.consumers_changed
    }

    /// Signalled when a relay pass claimed a full batch: there is a backlog to share.
    pub fn relay_backlog(&self) -> &Signal {
        &self.0.relay_backlog
    }

    /// Signalled when a relay pass of this process read messages: the vacuum rounds, which
    /// back off while outboxd's tables stand still, return to their interval.
    pub fn relayed(&self) -> &Signal {
        &self.0.relayed
    }

    fn with_entry<T>(&self, consumer: &str, f: impl FnOnce(&mut Entry) -> T) -> T {
        let mut map = self.0.consumers.lock().unwrap_or_else(|e| e.into_inner());
        f(map.entry(consumer.to_owned()).or_default())
    }

    /// Wakes the streams of one consumer: it may have something new to deliver.
    pub fn notify_consumer(&self, consumer: &str) {
        let map = self.0.consumers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = map.get(consumer) {
            e.signal.notify();
        }
    }

    /// Wakes the streams of every consumer.
    pub fn notify_all(&self) {
        let map = self.0.consumers.lock().unwrap_or_else(|e| e.into_inner());
        for e in map.values() {
            e.signal.notify();
        }
    }

    /// Registers a stream of `consumer`; the returned guard unregisters it when dropped.
    pub fn attach(&self, consumer: &str) -> (watch::Receiver<u64>, StreamGuard) {
        let rx = self.with_entry(consumer, |e| {
            e.streams += 1;
            e.signal.subscribe()
        });
        (rx, StreamGuard { hub: self.clone(), consumer: consumer.to_owned() })
    }

    /// Lets the relay lease new deliveries of `consumer` straight to this stream; the returned
    /// guard withdraws the slot when dropped.
    pub fn offer(&self, consumer: &str, slot: PushSlot) -> PushGuard {
        let session = slot.session.clone();
        self.with_entry(consumer, |e| e.slots.push(slot));
        PushGuard { hub: self.clone(), consumer: consumer.to_owned(), session }
    }

    /// Every push slot now, for one relay pass.
    pub fn push_slots(&self) -> PushSlots {
        let map = self.0.consumers.lock().unwrap_or_else(|e| e.into_inner());
        PushSlots {
            slots: map.iter().filter(|(_, e)| !e.slots.is_empty()).map(|(c, e)| (c.clone(), e.slots.clone())).collect(),
        }
    }

    /// Streams attached to `consumer` in this process.
    pub fn streams(&self, consumer: &str) -> u32 {
        let map = self.0.consumers.lock().unwrap_or_else(|e| e.into_inner());
        map.get(consumer).map_or(0, |e| e.streams)
    }
}

#[derive(Debug)]
pub struct StreamGuard {
    hub: Hub,
    consumer: String,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut map = self.hub.0.consumers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = map.get_mut(&self.consumer) {
            e.streams = e.streams.saturating_sub(1);
            if e.streams == 0 {
                map.remove(&self.consumer);
            }
        }
    }
}

#[derive(Debug)]
pub struct PushGuard {
    hub: Hub,
    consumer: String,
    session: String,
}

impl Drop for PushGuard {
    fn drop(&mut self) {
        let mut map = self.hub.0.consumers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = map.get_mut(&self.consumer) {
            e.slots.retain(|s| s.session != self.session);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credits_are_never_handed_out_twice() {
        let c = Credits::new(3);
        assert_eq!(c.take(2), 2);
        assert_eq!(c.take(5), 1);
        assert_eq!(c.take(1), 0);
        c.give(2);
        assert_eq!(c.available(), 2);
    }

    fn leased(id: u128) -> LeasedDelivery {
        let now = Utc::now();
        LeasedDelivery {
            message: crate::store::StoredMessage {
                message_id: crate::domain::MessageId(uuid::Uuid::from_u128(id)),
                seq: 1,
                topic: "t".into(),
                type_: "x".into(),
                payload: vec![],
                headers: Default::default(),
                ordering_key: None,
                enqueued_at: now,
                available_at: now,
                relayed_at: None,
            },
            delivery_count: 1,
            lease_expires_at: now,
        }
    }

    #[test]
    fn an_offer_takes_the_room_of_streams_that_have_some_and_gives_back_what_the_pass_did_not_use() {
        let hub = Hub::default();
        let (tx, _rx) = mpsc::unbounded_channel();
        let full = Arc::new(Credits::new(0));
        let open = Arc::new(Credits::new(5));
        let slot = |session: &str, credits: &Arc<Credits>| PushSlot {
            session: session.into(),
            ack_deadline: Duration::from_secs(30),
            credits: credits.clone(),
            tx: tx.clone(),
        };
        let _a = hub.offer("c", slot("full", &full));
        let b = hub.offer("c", slot("open", &open));
        let slots = hub.push_slots();
        let now = Utc::now();
        let mut offered = slots.offer(3, now);
        assert_eq!(
            offered.offers(),
            [PushOffer {
                consumer: "c".into(),
                session: "open".into(),
                room: 3,
                lease_until: now + chrono::Duration::seconds(30)
            }]
        );
        assert_eq!(open.available(), 2);
        // The pass leased two to "open" (and names a stream that offered nothing, ignored).
        let pushed = |session: &str, id| ("c".to_owned(), session.to_owned(), leased(id));
        offered.used(&[pushed("open", 1), pushed("open", 2), pushed("gone", 3)]);
        drop(offered);
        assert_eq!(open.available(), 3, "the one slot not used comes back");
        assert_eq!(full.available(), 0);
        // More recorded than offered cannot give back less than nothing.
        let mut offered = slots.offer(1, now);
        offered.used(&[pushed("open", 1), pushed("open", 2)]);
        drop(offered);
        assert_eq!(open.available(), 2);
        drop(slots.offer(3, now));
        assert_eq!(open.available(), 2, "a failed pass (nothing used) gives back all it took");
        open.set_wants_pending(true);
        assert!(
            hub.push_slots().offer(3, now).offers().is_empty(),
            "a stream with pending work to lease is left alone"
        );
        open.set_wants_pending(false);
        drop(b);
        assert!(hub.push_slots().offer(3, now).offers().is_empty(), "a withdrawn slot gets nothing");
    }

    #[tokio::test]
    async fn room_given_back_wakes_a_stream_that_waits_to_lease_pending_work() {
        let hub = Hub::default();
        let (tx, _rx) = mpsc::unbounded_channel();
        let credits = Arc::new(Credits::new(4));
        let slot =
            PushSlot { session: "s".into(), ack_deadline: Duration::from_secs(30), credits: credits.clone(), tx };
        let _g = hub.offer("c", slot);
        let slots = hub.push_slots();
        let offered = slots.offer(10, Utc::now());
        assert_eq!(offered.offers().len(), 1, "the relay takes the room");
        credits.set_wants_pending(true);
        drop(offered);
        tokio::time::timeout(Duration::from_secs(5), credits.returned()).await.expect("woken by the give-back");
        assert_eq!(credits.available(), 4);
    }
}

//! In-process wake-ups and stream bookkeeping shared by the relay, the lease sweeper and the
//! delivery sessions. A wake-up is a counter in a `watch` channel, so a waiter that was busy
//! when it was signalled still sees the change: no wake-up is lost.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, mpsc, watch};

use crate::domain::{LeasedDelivery, PushOffer};
use crate::limits::ByteBudget;

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
    turn: Arc<LeaseTurn>,
}

/// Whose turn it is to lease pending work of one consumer in this process, and what the last
/// lease that drained it saw.
///
/// A wake-up reaches every stream of the consumer. Were they all to lease at once, each would
/// hold its room out of the relay's pushes while it waits on the others' leases (they queue on
/// the same pending batches), so the relay would park the next messages as pending work too,
/// whose wake-up starts it all again: a cycle that, under steady load, cost more than the
/// relay itself. So the streams of a consumer lease one at a time, and a stream whose wake-up
/// came before the start of a lease that drained everything due skips its own: that lease
/// already saw the work the wake-up announced.
#[derive(Debug, Default)]
pub struct LeaseTurn {
    busy: AtomicBool,
    /// Counts the turns given back, so that a stream that found the turn taken wakes when
    /// it is free again, without waiting for it (it keeps serving its stream meanwhile).
    released: Signal,
    /// One more than the wake-up count read before the latest lease that found less than it
    /// asked for (0: none yet).
    drained: std::sync::atomic::AtomicU64,
    /// When that lease's consumer has its next delivery due, as read after it.
    next_due: Mutex<Option<DateTime<Utc>>>,
}

impl LeaseTurn {
    /// This process's turn to lease for the consumer, if no other stream of it has it; the
    /// turn passes on when the guard is dropped.
    pub fn try_take(&self) -> Option<TurnGuard<'_>> {
        self.busy.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).ok().map(|_| TurnGuard(self))
    }

    /// Changes each time a turn is given back.
    pub fn released(&self) -> watch::Receiver<u64> {
        self.released.subscribe()
    }

    /// Whether a lease that started after wake-up `woken` found everything that was due.
    pub fn drained_since(&self, woken: u64) -> bool {
        woken < self.drained.load(Ordering::Acquire)
    }

    /// A lease that started when the wake-up count was `seen` found less than it asked for.
    pub fn drained(&self, seen: u64) {
        self.drained.fetch_max(seen.saturating_add(1), Ordering::AcqRel);
    }

    pub fn set_next_due(&self, due: Option<DateTime<Utc>>) {
        *self.next_due.lock().unwrap_or_else(|e| e.into_inner()) = due;
    }

    pub fn next_due(&self) -> Option<DateTime<Utc>> {
        *self.next_due.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A stream's share of a [`ByteBudget`]: the budget, and the bytes one slot reserves.
#[derive(Debug, Clone)]
pub struct InFlightBytes {
    pub budget: Arc<ByteBudget>,
    /// The largest a delivery can be.
    pub unit: usize,
}

/// How many more deliveries a stream may be given: its `max_in_flight` less what it holds and
/// what the relay has set aside for it. Shared by the stream's session and the relay, so that
/// the two together never exceed the window. With a [`ByteBudget`], room is also bounded by
/// the bytes its principal's streams hold.
#[derive(Debug, Default)]
pub struct Credits {
    free: AtomicUsize,
    bytes: Option<InFlightBytes>,
    /// The session has pending deliveries to lease: the relay takes only the smaller half of
    /// its room (none of its last slot), so that older pending work is not starved by pushes.
    wants_pending: AtomicBool,
    /// Signalled when the relay gives back room that such a session is waiting for.
    returned: Notify,
    /// Relay passes holding room of this stream that have not handed over what they pushed, by
    /// the number each got when it took the room (counted by `offered`).
    passes: std::sync::Mutex<Vec<u64>>,
    offered: AtomicU64,
    /// Signalled when such a pass has handed over (or pushed nothing) and given back its room.
    pass_done: Notify,
}

impl Credits {
    pub fn new(n: usize) -> Self {
        Self { free: AtomicUsize::new(n), ..Self::default() }
    }

    /// Room of `n` drawing on `bytes` as well.
    pub fn bounded(n: usize, bytes: Option<InFlightBytes>) -> Self {
        Self { free: AtomicUsize::new(n), bytes, ..Self::default() }
    }

    /// Takes up to `want` (each with a unit of the byte budget, if any); returns how many were
    /// taken.
    pub fn take(&self, want: usize) -> usize {
        let want = match &self.bytes {
            Some(b) => {
                let got = b.budget.take_units(want, b.unit);
                if got < want {
                    crate::limits::refused("max_in_flight_bytes_per_principal");
                }
                got
            }
            None => want,
        };
        let mut taken = 0;
        let _ = self.free.fetch_update(Ordering::AcqRel, Ordering::Acquire, |free| {
            taken = free.min(want);
            Some(free - taken)
        });
        if let Some(b) = &self.bytes {
            b.budget.give((want - taken) * b.unit);
        }
        taken
    }

    /// Gives back `n` taken and not used (with their units of the byte budget).
    pub fn give(&self, n: usize) {
        if n > 0 {
            self.free.fetch_add(n, Ordering::AcqRel);
            if let Some(b) = &self.bytes {
                b.budget.give(n * b.unit);
            }
        }
    }

    /// A slot taken is now a delivery of `bytes`: what its unit reserved beyond that goes back.
    pub fn settle(&self, bytes: usize) {
        if let Some(b) = &self.bytes {
            b.budget.give(b.unit.saturating_sub(bytes));
        }
    }

    /// A delivery of `bytes` (settled) left the stream: its slot and its bytes come back.
    pub fn give_held(&self, bytes: usize) {
        self.free.fetch_add(1, Ordering::AcqRel);
        self.release_bytes(bytes);
    }

    /// A delivery of `bytes` (settled) left the stream, which takes no more: only its bytes
    /// come back, to the principal's other streams.
    pub fn release_bytes(&self, bytes: usize) {
        if let Some(b) = &self.bytes {
            b.budget.give(bytes.min(b.unit));
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

    /// Waits until no relay pass holds room of this stream without having handed over what it
    /// pushed: whatever a pass that committed before now pushed to this stream is then in the
    /// stream's channel. A session calls it before sending what it leased, so that a lower seq
    /// pushed by a concurrent pass is not sent after a higher one it leased (guarantee 6).
    /// Passes that take room later are not waited for: a busy relay cannot hold a session up.
    pub async fn passes_handed_over(&self) {
        let upto = self.offered.load(Ordering::Acquire);
        loop {
            let done = self.pass_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if !self.in_pass().iter().any(|p| *p < upto) {
                return;
            }
            done.await;
        }
    }

    fn in_pass(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        // Plain numbers: a panic elsewhere cannot leave them half-written.
        self.passes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A relay pass takes room: its number, until [`Credits::pass_over`].
    fn pass_begins(&self) -> u64 {
        let mut passes = self.in_pass();
        let n = self.offered.fetch_add(1, Ordering::AcqRel);
        passes.push(n);
        n
    }

    fn pass_over(&self, n: u64) {
        self.in_pass().retain(|p| *p != n);
        self.pass_done.notify_waiters();
    }
}

/// A consumer's lease turn, held; given back (and the waiting streams woken) when dropped.
#[derive(Debug)]
pub struct TurnGuard<'a>(&'a LeaseTurn);

impl Drop for TurnGuard<'_> {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
        self.0.released.notify();
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

    /// Takes room of every stream that has some, for one relay pass: half of its free room
    /// (rounded up), at most `max`, so that the stream can always lease pending work (retries,
    /// keyed and delayed messages, what waited while it had no room) beside the pushes, and
    /// never starves it however busy the relay is. The offers are data for the store. The room comes back when the returned guard is
    /// dropped, less what [`Offered::used`] says the pass leased; so a failed pass gives back
    /// everything without anyone having to remember to.
    pub fn offer(&self, max: usize, now: DateTime<Utc>) -> Offered<'_> {
        let (mut offers, mut passes) = (Vec::new(), Vec::new());
        for (consumer, slots) in &self.slots {
            for slot in slots {
                // A stream waiting to lease pending work keeps the larger half, and its last slot.
                let free = slot.credits.available();
                let half = if slot.credits.wants_pending.load(Ordering::Acquire) { free / 2 } else { free.div_ceil(2) };
                let room = slot.credits.take(half.min(max));
                if room > 0 {
                    passes.push(slot.credits.pass_begins());
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
        Offered { slots: self, offers, used, passes }
    }
}

/// Room taken from streams for one relay pass; what the pass did not lease goes back on drop.
/// The relay drops it only after handing the pushed deliveries over to their streams.
#[derive(Debug)]
pub struct Offered<'a> {
    slots: &'a PushSlots,
    offers: Vec<PushOffer>,
    used: Vec<usize>,
    /// Each offer's pass number on its stream.
    passes: Vec<u64>,
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
        for ((o, used), pass) in self.offers.iter().zip(&self.used).zip(&self.passes) {
            if let Some(slot) = self.slots.slot(&o.consumer, &o.session) {
                slot.credits.give_back(o.room - used);
                slot.credits.pass_over(*pass);
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

    /// Registers a stream of `consumer`: its wake-ups, the consumer's [`LeaseTurn`] in this
    /// process, and a guard that unregisters the stream when dropped.
    pub fn attach(&self, consumer: &str) -> (watch::Receiver<u64>, Arc<LeaseTurn>, StreamGuard) {
        let (rx, turn) = self.with_entry(consumer, |e| {
            e.streams += 1;
            (e.signal.subscribe(), e.turn.clone())
        });
        (rx, turn, StreamGuard { hub: self.clone(), consumer: consumer.to_owned() })
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
            message: crate::domain::StoredMessage {
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
        let room = |o: &Offered<'_>| o.offers().iter().map(|o| o.room).sum::<usize>();
        let big = Arc::new(Credits::new(9));
        let _c = hub.offer("d", slot("big", &big));
        let slots = hub.push_slots();
        let offered = slots.offer(100, now);
        assert_eq!(room(&offered), 1 + 5, "half of each stream's room, rounded up: the rest is for its own leases");
        drop(offered);
        assert_eq!(room(&slots.offer(2, now)), 1 + 2, "at most the pass's batch");
        open.set_wants_pending(true);
        big.set_wants_pending(true);
        assert_eq!(room(&slots.offer(100, now)), 1 + 4, "a stream waiting to lease pending work keeps the larger half");
        assert_eq!(big.take(8), 8);
        assert_eq!(open.take(1), 1);
        assert_eq!(room(&slots.offer(100, now)), 0, "and its last slot");
        big.give(8);
        open.give(1);
        open.set_wants_pending(false);
        drop(b);
        assert!(
            hub.push_slots().offer(3, now).offers().iter().all(|o| o.session != "open"),
            "a withdrawn slot gets nothing"
        );
    }

    #[tokio::test]
    async fn a_session_waits_for_the_passes_that_held_its_room_and_not_for_later_ones() {
        use futures::FutureExt as _;
        let hub = Hub::default();
        let (tx, _rx) = mpsc::unbounded_channel();
        let credits = Arc::new(Credits::new(8));
        let _slot = hub.offer(
            "c",
            PushSlot { session: "s".into(), ack_deadline: Duration::from_secs(30), credits: credits.clone(), tx },
        );
        let (slots, now) = (hub.push_slots(), Utc::now());
        assert!(credits.passes_handed_over().now_or_never().is_some(), "no pass: no wait");

        let first = slots.offer(2, now);
        let mut wait = Box::pin(credits.passes_handed_over());
        assert!((&mut wait).now_or_never().is_none(), "a pass holds room: wait for its hand-over");
        // A pass that takes room after the wait began is not waited for.
        let second = slots.offer(2, now);
        drop(first);
        assert!(wait.now_or_never().is_some(), "the first pass handed over");
        let mut wait = Box::pin(credits.passes_handed_over());
        assert!((&mut wait).now_or_never().is_none(), "the second one now counts");
        drop(second);
        assert!(wait.now_or_never().is_some());
    }

    #[tokio::test]
    async fn streams_of_a_consumer_share_one_lease_turn_that_remembers_the_last_drain() {
        let hub = Hub::default();
        let (_rx_a, turn_a, _a) = hub.attach("c");
        let (_rx_b, turn_b, _b) = hub.attach("c");
        let (_rx_o, turn_o, _o) = hub.attach("other");
        assert!(Arc::ptr_eq(&turn_a, &turn_b));
        assert!(!Arc::ptr_eq(&turn_a, &turn_o));
        let released = turn_b.released();
        let held = turn_a.try_take().expect("free");
        assert!(turn_b.try_take().is_none(), "one lease at a time per consumer");
        assert!(turn_o.try_take().is_some(), "other consumers lease meanwhile");
        assert!(!released.has_changed().unwrap_or(true));
        drop(held);
        assert!(released.has_changed().unwrap_or(false), "a stream that found it taken is woken");
        assert!(turn_b.try_take().is_some());
        assert!(!turn_a.drained_since(0), "no drain yet, not even of wake-up 0");
        turn_a.drained(3);
        assert!(turn_b.drained_since(0));
        assert!(turn_b.drained_since(3), "a wake-up read before the draining lease started");
        assert!(!turn_b.drained_since(4), "a later wake-up may announce work that lease never saw");
        turn_a.drained(1);
        assert!(turn_b.drained_since(3), "an older drain never moves it back");
        assert!(!turn_o.drained_since(0));
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

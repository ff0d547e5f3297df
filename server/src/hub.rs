//! In-process wake-ups and stream bookkeeping shared by the relay, the lease sweeper and the
//! delivery sessions. A wake-up is a counter in a `watch` channel, so a waiter that was busy
//! when it was signalled still sees the change: no wake-up is lost.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, watch};

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
/// the same pending ranges), so the relay would park the next messages as pending work too,
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

impl InFlightBytes {
    /// Takes a unit for each of up to `want` slots, as many as the budget has; a shortfall is
    /// counted as a refusal of `max_in_flight_bytes_per_principal`.
    pub fn take_units(&self, want: usize) -> usize {
        let got = self.budget.take_units(want, self.unit);
        if got < want {
            crate::limits::refused("max_in_flight_bytes_per_principal");
        }
        got
    }
}

/// Room a stream lends the relay, so that a pass can lease new deliveries straight to it.
///
/// The stream alone decides how much: it sets the lend, and takes it back, while no pass holds
/// it ([`Lend::adjust`]). A pass takes the whole lend for its length ([`Lend::take`]) and ends
/// with one step ([`Lend::hand_over`]) that sends the stream what the pass leased to it and
/// keeps the rest lent. So at every moment outside that step what the stream counts as lent is
/// the room here plus the deliveries on their way to it, and the stream can reconcile its room
/// and its order itself: nothing it counts is changed behind its back.
///
/// The lend is a count of slots. A stream whose principal has a byte budget takes the budget's
/// units only for what a pass holds, when it takes the lend: room lent and unused holds no
/// bytes, so it never keeps the stream's own leases, or the principal's other streams, from
/// the budget. Each delivery handed over carries its unit to the stream (see [`Handed`]).
#[derive(Debug, Default)]
pub struct Lend {
    state: Mutex<LendState>,
    bytes: Option<InFlightBytes>,
}

#[derive(Debug, Default)]
struct LendState {
    room: usize,
    /// A pass holds the lend, with this many units of the byte budget.
    taken: Option<usize>,
    /// Passes that have held the lend and ended.
    passes: u64,
    /// The stream wants word when the pass that holds the lend ends, even with nothing for it.
    wake: bool,
}

/// What a relay pass hands a stream as it ends, in one message: the deliveries it leased to
/// the stream, and its number among the passes that held the stream's lend. Each delivery
/// holds a unit of its principal's byte budget until the stream holds it
/// ([`Handed::take_deliveries`]); a message dropped unread gives those units back.
#[derive(Debug)]
pub struct Handed {
    deliveries: Vec<LeasedDelivery>,
    pub pass: u64,
    bytes: Option<InFlightBytes>,
}

impl Handed {
    /// The deliveries, whose units of the byte budget are the taker's from now on (the window
    /// that holds one settles its unit to its size).
    pub fn take_deliveries(&mut self) -> Vec<LeasedDelivery> {
        std::mem::take(&mut self.deliveries)
    }

    /// The deliveries, their units given back (they will not be held).
    fn take_deliveries_giving_back(&mut self) -> Vec<LeasedDelivery> {
        let deliveries = self.take_deliveries();
        if let Some(b) = &self.bytes {
            b.budget.give(deliveries.len() * b.unit);
        }
        deliveries
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        if let Some(b) = &self.bytes {
            b.budget.give(self.deliveries.len() * b.unit);
        }
    }
}

impl Lend {
    /// A lend whose passes take units of a principal's byte budget (none without one).
    pub fn bounded(bytes: Option<InFlightBytes>) -> Self {
        Self { state: Mutex::default(), bytes }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, LendState> {
        // Plain numbers: a panic elsewhere cannot leave them half-written.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The stream's side: while no pass holds the lend, `set` gets the room lent now and returns
    /// the room to lend from now on; `false` (and `set` is not called) while a pass holds it.
    pub fn adjust(&self, set: impl FnOnce(usize) -> usize) -> bool {
        let mut s = self.state();
        if s.taken.is_some() {
            return false;
        }
        s.room = set(s.room);
        true
    }

    /// The number the pass that holds the lend will carry in its [`Handed`], which it sends
    /// even if it leases nothing; `None` while no pass holds it.
    pub fn wake_when_handed(&self) -> Option<u64> {
        let mut s = self.state();
        s.taken.is_some().then(|| {
            s.wake = true;
            s.passes + 1
        })
    }

    /// The relay's side: the lend for one pass, at most `max` of it and as much as the byte
    /// budget has units for; `None` when there is nothing to lend or another pass holds it.
    pub fn take(&self, max: usize) -> Option<usize> {
        let mut s = self.state();
        if s.taken.is_some() || s.room == 0 || max == 0 {
            return None;
        }
        let want = s.room.min(max);
        let got = self.bytes.as_ref().map_or(want, |b| b.take_units(want));
        if got == 0 {
            return None;
        }
        s.taken = Some(got);
        Some(got)
    }

    /// Ends a pass's hold: sends what it leased to the stream (if anything, or if the stream
    /// asked for word) and lends the rest on, in one step; the units the pass did not use go
    /// back to the budget. The deliveries come back, their units given back too, when the
    /// stream has gone.
    pub fn hand_over(
        &self,
        deliveries: Vec<LeasedDelivery>,
        tx: &mpsc::UnboundedSender<Handed>,
    ) -> Result<(), Vec<LeasedDelivery>> {
        let mut s = self.state();
        let units = s.taken.take().unwrap_or(0);
        if let Some(b) = &self.bytes {
            b.budget.give(units.saturating_sub(deliveries.len()) * b.unit);
        }
        s.passes += 1;
        s.room = s.room.saturating_sub(deliveries.len());
        if deliveries.is_empty() && !std::mem::take(&mut s.wake) {
            return Ok(());
        }
        s.wake = false;
        let handed = Handed { deliveries, pass: s.passes, bytes: self.bytes.clone() };
        // Dropping the unsent message gives the deliveries' units back.
        tx.send(handed).map_err(|mut unsent| unsent.0.take_deliveries_giving_back())
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
    pub lend: Arc<Lend>,
    pub tx: mpsc::UnboundedSender<Handed>,
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

    /// Takes the lend of every stream that lends some room, at most `max` of each, for one
    /// relay pass. The offers are data for the store. Every lend taken is handed back by
    /// [`Offered::hand_over`], or when the returned guard is dropped (a failed pass), so no one
    /// has to remember to.
    pub fn offer(&self, max: usize, now: DateTime<Utc>) -> Offered<'_> {
        let mut offers = Vec::new();
        for (consumer, slots) in &self.slots {
            for slot in slots {
                if let Some(room) = slot.lend.take(max) {
                    offers.push(PushOffer {
                        consumer: consumer.clone(),
                        session: slot.session.clone(),
                        room,
                        lease_until: crate::clock::add(now, slot.ack_deadline),
                    });
                }
            }
        }
        Offered { slots: self, offers, handed: false }
    }
}

/// The lends one relay pass holds.
#[derive(Debug)]
pub struct Offered<'a> {
    slots: &'a PushSlots,
    offers: Vec<PushOffer>,
    handed: bool,
}

impl Offered<'_> {
    pub fn offers(&self) -> &[PushOffer] {
        &self.offers
    }

    /// Ends the pass's hold on every lend it took: each stream gets what the pass leased to it
    /// as one message. Returns, by consumer and session, what could not be handed over because
    /// its stream has gone (to be released).
    pub fn hand_over(
        mut self,
        pushed: Vec<(String, String, LeasedDelivery)>,
    ) -> Vec<(String, String, Vec<LeasedDelivery>)> {
        let mut by_stream: HashMap<(String, String), Vec<LeasedDelivery>> = HashMap::new();
        for (consumer, session, d) in pushed {
            by_stream.entry((consumer, session)).or_default().push(d);
        }
        let mut unsent = Vec::new();
        for o in &self.offers {
            let mut deliveries = by_stream.remove(&(o.consumer.clone(), o.session.clone())).unwrap_or_default();
            deliveries.sort_by_key(|d| d.message.seq);
            if let Some(slot) = self.slots.slot(&o.consumer, &o.session)
                && let Err(back) = slot.lend.hand_over(deliveries, &slot.tx)
            {
                unsent.push((o.consumer.clone(), o.session.clone(), back));
            }
        }
        // Leased to a stream the pass did not offer (never expected): released, not lost.
        unsent.extend(by_stream.into_iter().map(|((c, s), d)| (c, s, d)));
        self.handed = true;
        unsent
    }
}

impl Drop for Offered<'_> {
    fn drop(&mut self) {
        if self.handed {
            return;
        }
        for o in &self.offers {
            if let Some(slot) = self.slots.slot(&o.consumer, &o.session) {
                let _ = slot.lend.hand_over(Vec::new(), &slot.tx);
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

    fn at(id: u128, seq: i64) -> LeasedDelivery {
        let mut d = LeasedDelivery::sample(seq, Utc::now());
        d.message.message_id = crate::domain::MessageId(uuid::Uuid::from_u128(id));
        d
    }

    #[test]
    fn a_pass_takes_each_lend_whole_and_hands_over_what_it_leased_in_one_message() {
        let hub = Hub::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (none, open) = (Arc::new(Lend::default()), Arc::new(Lend::default()));
        assert!(open.adjust(|room| room + 5), "the stream lends 5");
        let slot = |session: &str, lend: &Arc<Lend>| PushSlot {
            session: session.into(),
            ack_deadline: Duration::from_secs(30),
            lend: lend.clone(),
            tx: tx.clone(),
        };
        let _a = hub.offer("c", slot("none", &none));
        let b = hub.offer("c", slot("open", &open));
        let slots = hub.push_slots();
        let now = Utc::now();
        let offered = slots.offer(3, now);
        assert_eq!(
            offered.offers(),
            [PushOffer {
                consumer: "c".into(),
                session: "open".into(),
                room: 3,
                lease_until: now + chrono::Duration::seconds(30)
            }],
            "at most the pass's batch, of the streams that lend"
        );
        assert!(slots.offer(3, now).offers().is_empty(), "a concurrent pass finds the lend held");
        assert!(!open.adjust(|_| 0), "nor can the stream change it meanwhile");
        assert_eq!(open.wake_when_handed(), Some(1), "the first pass to hold it");
        let pushed = |session: &str, id, seq| ("c".to_owned(), session.to_owned(), at(id, seq));
        let unsent = offered.hand_over(vec![pushed("open", 2, 20), pushed("open", 1, 10), pushed("gone", 3, 30)]);
        let mut handed = rx.try_recv().expect("one message");
        assert_eq!(handed.pass, 1);
        assert_eq!(
            handed.take_deliveries().iter().map(|d| d.message.seq).collect::<Vec<_>>(),
            [10, 20],
            "in seq order"
        );
        assert!(rx.try_recv().is_err(), "and only one");
        assert_eq!(unsent.len(), 1, "leased to a stream it did not offer: given back to be released");
        let mut lent = 0;
        assert!(open.adjust(|room| {
            lent = room;
            room
        }));
        assert_eq!(lent, 3, "what was not pushed stays lent");

        // A failed pass ends its hold as it is dropped; with nothing pushed and no one asking,
        // it sends nothing.
        drop(slots.offer(10, now));
        assert!(rx.try_recv().is_err());
        let offered = slots.offer(10, now);
        assert_eq!(offered.offers()[0].room, 3);
        assert_eq!(open.wake_when_handed(), Some(3));
        drop(offered);
        let mut handed = rx.try_recv().expect("word for a stream that asked for it");
        assert!(handed.take_deliveries().is_empty());
        assert_eq!(handed.pass, 3);
        assert_eq!(open.wake_when_handed(), None, "no pass holds it");

        drop(b);
        assert!(hub.push_slots().offer(3, now).offers().is_empty(), "a withdrawn slot gets nothing");
        drop(rx);
        let slots = hub.push_slots();
        assert!(none.adjust(|_| 1));
        let offered = slots.offer(3, now);
        let back = offered.hand_over(vec![pushed("none", 4, 40)]);
        assert_eq!(back.len(), 1, "a stream that has gone gets nothing: its deliveries come back");
        assert_eq!(back[0].2.len(), 1);
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
}

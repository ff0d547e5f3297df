//! The in-flight window of one stream: the leases it holds, the room it has for more (part of
//! which it lends the relay, which leases new deliveries straight to the stream), their
//! deadlines, and the leases that expired while held, whose late ack still counts.
//!
//! Plain data: no I/O, no clock of its own. The session asks it what to do and tells the store;
//! tests drive it with explicit times.
use std::collections::HashMap;

use chrono::{DateTime, Utc};

use crate::domain::{LeasedDelivery, MessageId};
use crate::hub::{InFlightBytes, Lend};

/// Expired leases a window remembers for late acks; past this it forgets them all (the
/// deliveries are the sweeper's then, and an ack of one is only an ack too late).
pub const MAX_REMEMBERED_EXPIRED: usize = 10_000;

/// One lease the stream holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub delivery_count: u32,
    pub deadline: DateTime<Utc>,
    pub enqueued_at: DateTime<Utc>,
    /// Its ack may make the next message with the same key due.
    pub has_ordering_key: bool,
    /// The message's seq, which the store finds range-held deliveries by.
    pub seq: i64,
    /// What the delivery weighs against its principal's byte budget.
    pub bytes: usize,
    /// Handed to the stream's transport: only then may the consumer have seen it, and only
    /// then can a broken stream count it as a failed attempt.
    pub sent: bool,
}

impl Held {
    pub fn of(d: &LeasedDelivery) -> Self {
        Self {
            delivery_count: d.delivery_count,
            deadline: d.lease_expires_at,
            enqueued_at: d.message.enqueued_at,
            has_ordering_key: d.message.ordering_key.is_some(),
            seq: d.message.seq,
            bytes: size_of(d),
            sent: false,
        }
    }
}

/// A delivery's size as a stream holds it: payload, headers, and the names that come with it.
pub fn size_of(d: &LeasedDelivery) -> usize {
    let m = &d.message;
    let headers: usize = m.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    m.payload.len() + headers + m.topic.len() + m.type_.len() + m.ordering_key.as_ref().map_or(0, String::len)
}

/// Held leases plus room: what is held, lent to the relay and reserved for a lease under way
/// never exceeds `max`. The window alone counts its room; the relay sees only what the window
/// lends it (see [`Lend`]).
#[derive(Debug)]
pub struct Window {
    max: usize,
    bytes: Option<InFlightBytes>,
    held: HashMap<MessageId, Held>,
    expired: HashMap<MessageId, Held>,
    /// Room lent to the relay: still in the lend, or pushed deliveries on their way here.
    lent: usize,
    /// Room taken for a lease under way.
    reserved: usize,
}

impl Window {
    pub fn new(max: usize) -> Self {
        Self::bounded(max, None)
    }

    /// A window whose room also draws on a principal's byte budget.
    pub fn bounded(max: usize, bytes: Option<InFlightBytes>) -> Self {
        Self { max, bytes, held: HashMap::new(), expired: HashMap::new(), lent: 0, reserved: 0 }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Free room right now: neither held, lent nor reserved.
    pub fn room(&self) -> usize {
        self.max.saturating_sub(self.held.len() + self.lent + self.reserved)
    }

    /// Room lent to the relay, as this window counts it.
    pub fn lent(&self) -> usize {
        self.lent
    }

    /// Takes up to `want` units of the principal's byte budget (all of them without one).
    fn take_units(&self, want: usize) -> usize {
        self.bytes.as_ref().map_or(want, |b| b.take_units(want))
    }

    fn give_units(&self, n: usize) {
        if let Some(b) = &self.bytes {
            b.budget.give(n * b.unit);
        }
    }

    fn give_bytes(&self, bytes: usize) {
        if let Some(b) = &self.bytes {
            b.budget.give(bytes.min(b.unit));
        }
    }

    /// Takes up to `want` of the room for a lease about to be made; returns how much it got.
    /// What the lease does not use goes back with [`Window::unreserve`].
    pub fn reserve(&mut self, want: usize) -> usize {
        let got = self.take_units(want.min(self.room()));
        self.reserved += got;
        got
    }

    pub fn unreserve(&mut self, n: usize) {
        let n = n.min(self.reserved);
        self.reserved -= n;
        self.give_units(n);
    }

    /// Sets what the window lends the relay, unless a pass holds the lend (then `false`): half
    /// of the room that is free or lent and not yet pushed, rounded up, so that the stream can
    /// always lease pending work (retries, keyed and delayed messages, what waited while it had
    /// no room) beside the pushes and is never starved however busy the relay is. With pending
    /// work to lease (`keep_larger_half`) it rounds down: the stream keeps the larger half, and
    /// its last slot.
    pub fn lend(&mut self, lend: &Lend, keep_larger_half: bool) -> bool {
        lend.adjust(|current| {
            // Pushed by a pass and not here yet: lent, and no longer in the lend.
            let travelling = self.lent.saturating_sub(current);
            let free = self.max.saturating_sub(self.held.len() + self.reserved + travelling);
            let target = if keep_larger_half { free / 2 } else { free.div_ceil(2) };
            self.lent = travelling + target;
            target
        })
    }

    /// The free room for a lease while work may be pending. Room lent to the relay is the
    /// relay's only while a pass holds it: a lease takes back all of the lend that no pass holds
    /// (the relay is lent half of what is free again once the lease is made), so that a stream
    /// draining a backlog leases with its whole window, not with what a standing lend leaves
    /// it. While a pass holds the lend and no room is free, the pass is asked for word at its
    /// hand-over; if it handed over in between (with nothing for the stream, and no word
    /// asked), the lend is taken back at once instead of idling until a fallback poll.
    pub fn room_for_pending(&mut self, lend: &Lend) -> usize {
        // Each round either takes the lend back or finds a pass holding it; it goes round again
        // only if that pass handed over between the two (each pass is a database round trip).
        loop {
            if self.lent == 0 || self.withdraw(lend) || self.room() > 0 || lend.wake_when_handed().is_some() {
                return self.room();
            }
        }
    }

    /// Of `deliveries` about to be sent, those the window still holds: one whose lease
    /// expired while it waited for a pass's hand-over (see `super::order`) is the sweeper's
    /// now, and sending it could deliver it twice at once.
    pub fn still_held(&self, mut deliveries: Vec<LeasedDelivery>) -> Vec<LeasedDelivery> {
        deliveries.retain(|d| self.holds(&d.message.message_id));
        deliveries
    }

    /// Takes back all the lend (the stream takes no more pushes), unless a pass holds it.
    pub fn withdraw(&mut self, lend: &Lend) -> bool {
        lend.adjust(|current| {
            self.lent = self.lent.saturating_sub(current);
            0
        })
    }

    /// Holds a delivery this stream leased; its room was reserved by [`Window::reserve`].
    pub fn hold(&mut self, d: &LeasedDelivery) {
        self.reserved = self.reserved.saturating_sub(1);
        self.insert(d);
    }

    /// Holds a delivery the relay pushed; its room was lent.
    pub fn hold_pushed(&mut self, d: &LeasedDelivery) {
        self.lent = self.lent.saturating_sub(1);
        self.insert(d);
    }

    fn insert(&mut self, d: &LeasedDelivery) {
        let held = Held::of(d);
        // The slot's unit becomes the delivery's bytes: what it reserved beyond them goes back.
        if let Some(b) = &self.bytes {
            b.budget.give(b.unit.saturating_sub(held.bytes));
        }
        if let Some(before) = self.held.insert(d.message.message_id, held) {
            // Held twice (never expected): its earlier bytes are not held any more.
            self.give_bytes(before.bytes);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    pub fn held(&self) -> usize {
        self.held.len()
    }

    pub fn holds(&self, id: &MessageId) -> bool {
        self.held.contains_key(id)
    }

    /// Leases past their deadline at `now` leave the window (the sweeper owns them now) and
    /// free their room; they are remembered for a late ack. Returns how many expired.
    pub fn expire(&mut self, now: DateTime<Utc>) -> usize {
        let gone: Vec<MessageId> = self.held.iter().filter(|(_, h)| h.deadline <= now).map(|(id, _)| *id).collect();
        for id in &gone {
            if let Some(h) = self.held.remove(id) {
                self.give_bytes(h.bytes);
                self.expired.insert(*id, h);
            }
        }
        if self.expired.len() > MAX_REMEMBERED_EXPIRED {
            self.expired.clear();
        }
        gone.len()
    }

    /// The acked ids this stream held, or held until their lease expired (a late ack still
    /// counts: the handler did the work). Ids it never held are left out.
    pub fn ack(&mut self, ids: &[MessageId]) -> Vec<(MessageId, Held)> {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(h) = self.held.remove(id) {
                self.give_bytes(h.bytes);
                out.push((*id, h));
            } else if let Some(h) = self.expired.remove(id) {
                out.push((*id, h));
            }
        }
        out
    }

    /// The nacked lease, if this stream holds it (a nack after expiry is the sweeper's).
    pub fn nack(&mut self, id: &MessageId) -> Option<Held> {
        let h = self.held.remove(id)?;
        self.give_bytes(h.bytes);
        Some(h)
    }

    /// Marks a held delivery as handed to the stream's transport.
    pub fn sent(&mut self, id: &MessageId) {
        if let Some(h) = self.held.get_mut(id) {
            h.sent = true;
        }
    }

    /// The ids among `ids` that this stream holds.
    pub fn holding(&self, ids: &[MessageId]) -> Vec<MessageId> {
        ids.iter().copied().filter(|id| self.held.contains_key(id)).collect()
    }

    /// Moves the deadline of held leases (after the store has extended them).
    pub fn extend(&mut self, ids: &[MessageId], until: DateTime<Utc>) {
        for id in ids {
            if let Some(h) = self.held.get_mut(id) {
                h.deadline = until;
            }
        }
    }

    /// When the next held lease expires.
    pub fn next_deadline(&self) -> Option<DateTime<Utc>> {
        self.held.values().map(|h| h.deadline).min()
    }

    /// Everything held, for release as the stream ends; the window has no room from now on.
    /// The bytes go back to the principal's other streams.
    pub fn drain(&mut self) -> Vec<(MessageId, Held)> {
        self.max = 0;
        let all: Vec<(MessageId, Held)> = self.held.drain().collect();
        for (_, h) in &all {
            self.give_bytes(h.bytes);
        }
        all
    }
}

/// A window dropped while it holds deliveries, lends room or reserves it (a session that
/// ended without draining) still gives their bytes back to its principal.
impl Drop for Window {
    fn drop(&mut self) {
        for h in self.held.values() {
            self.give_bytes(h.bytes);
        }
        // Lent room holds no units: a pass takes them as it takes the lend (see [`Lend`]).
        self.give_units(self.reserved);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::{Clock, ManualClock, add};

    fn start() -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000, 0).unwrap()
    }

    fn leased(deadline: DateTime<Utc>, key: Option<&str>) -> LeasedDelivery {
        let mut d = LeasedDelivery::sample(1, start());
        d.message.ordering_key = key.map(str::to_owned);
        d.lease_expires_at = deadline;
        d
    }

    /// Leases `n` deliveries with deadline `deadline` the way the session does.
    fn lease(w: &mut Window, n: usize, deadline: DateTime<Utc>) -> Vec<MessageId> {
        let got = w.reserve(n);
        assert_eq!(got, n, "room for {n}");
        (0..n)
            .map(|_| {
                let d = leased(deadline, None);
                w.hold(&d);
                d.message.message_id
            })
            .collect()
    }

    #[test]
    fn room_and_held_never_exceed_the_window() {
        let mut w = Window::new(4);
        let clock = ManualClock::new(start());
        let ids = lease(&mut w, 3, add(clock.now(), Duration::from_secs(30)));
        assert_eq!((w.room(), w.held()), (1, 3));
        assert_eq!(w.reserve(5), 1, "only the free room is taken");
        w.unreserve(1);
        assert_eq!(w.ack(&ids[..2]).len(), 2);
        assert_eq!((w.room(), w.held()), (3, 1));
        // An ack twice, or of an id never held, frees nothing.
        assert!(w.ack(&ids[..1]).is_empty());
        assert!(w.ack(&[MessageId::generate()]).is_empty());
        assert_eq!(w.room() + w.held(), 4);
    }

    #[test]
    fn an_expired_lease_frees_its_room_and_its_late_ack_still_counts_once() {
        let mut w = Window::new(2);
        let clock = ManualClock::new(start());
        let ids = lease(&mut w, 2, add(clock.now(), Duration::from_secs(30)));
        assert_eq!(w.next_deadline(), Some(add(start(), Duration::from_secs(30))));
        clock.advance(Duration::from_secs(29));
        assert_eq!(w.expire(clock.now()), 0);
        clock.advance(Duration::from_secs(1));
        assert_eq!(w.expire(clock.now()), 2, "due at the deadline itself");
        assert_eq!((w.room(), w.held(), w.next_deadline()), (2, 0, None));
        // Neither a nack nor an extend reaches an expired lease; an ack does, once, and gives
        // no room twice.
        assert_eq!(w.nack(&ids[0]), None);
        assert!(w.holding(&ids).is_empty());
        assert_eq!(w.ack(&ids).len(), 2);
        assert!(w.ack(&ids).is_empty());
        assert_eq!(w.room(), 2);
    }

    #[test]
    fn an_extended_lease_outlives_its_first_deadline() {
        let mut w = Window::new(2);
        let clock = ManualClock::new(start());
        let ids = lease(&mut w, 2, add(clock.now(), Duration::from_secs(10)));
        let later = add(clock.now(), Duration::from_secs(60));
        w.extend(&w.holding(&ids[..1]), later);
        clock.advance(Duration::from_secs(10));
        assert_eq!(w.expire(clock.now()), 1);
        assert!(w.holds(&ids[0]) && !w.holds(&ids[1]));
        assert_eq!(w.next_deadline(), Some(later));
    }

    #[test]
    fn a_nack_frees_room_and_reports_the_delivery_count() {
        let mut w = Window::new(1);
        let d = LeasedDelivery { delivery_count: 3, ..leased(add(start(), Duration::from_secs(5)), Some("k")) };
        assert_eq!(w.reserve(1), 1);
        w.hold(&d);
        assert_eq!(w.room(), 0);
        let h = w.nack(&d.message.message_id).unwrap();
        assert_eq!((h.delivery_count, h.has_ordering_key), (3, true));
        assert_eq!(w.room(), 1);
        assert_eq!(w.nack(&d.message.message_id), None);
    }

    #[test]
    fn the_window_lends_the_relay_half_its_room_and_counts_pushes_on_their_way() {
        let mut w = Window::new(8);
        let lend = Lend::default();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        assert!(w.lend(&lend, false));
        assert_eq!((w.lent(), w.room()), (4, 4), "half, rounded up");
        // A pass takes the lend and pushes one; until it arrives it is still lent.
        assert_eq!(lend.take(100), Some(4));
        assert!(!w.lend(&lend, true), "held by the pass: unchanged");
        assert!(lend.hand_over(vec![leased(add(start(), Duration::from_secs(5)), None)], &tx).is_ok());
        assert!(w.lend(&lend, false));
        assert_eq!((w.lent(), w.room()), (1 + 4, 3), "one on its way, and half of the other 7");
        let mut handed = rx.try_recv().unwrap();
        w.hold_pushed(&handed.take_deliveries()[0]);
        assert_eq!((w.held(), w.lent(), w.room()), (1, 4, 3));
        assert!(w.lend(&lend, true), "pending work to lease: the smaller half");
        assert_eq!((w.lent(), w.room()), (3, 4));
        assert_eq!(w.reserve(10), 4, "a lease has the rest");
        w.unreserve(4);
        let mut one = Window::new(1);
        assert!(one.lend(&Lend::default(), true));
        assert_eq!((one.lent(), one.room()), (0, 1), "a stream with pending work keeps its last slot");
        assert!(w.withdraw(&lend));
        assert_eq!((w.lent(), w.room()), (0, 7));
    }

    #[test]
    fn a_lease_takes_back_the_lend_no_pass_holds_and_asks_a_pass_that_holds_it_for_word() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        // Half of the room is lent while nothing is pending; a lease takes all of it back.
        let mut w = Window::new(8);
        let lend = Lend::default();
        assert!(w.lend(&lend, false));
        assert_eq!((w.lent(), w.room()), (4, 4));
        assert_eq!(w.room_for_pending(&lend), 8, "the whole window for a backlog");
        assert_eq!(lend.take(10), None, "nothing lent until the stream lends again");
        assert!(w.lend(&lend, true));
        assert_eq!((w.lent(), w.room()), (4, 4), "after the lease: half of what is free");
        // A pass holds the lend: the rest of the room is the lease's, the lend stays the pass's.
        assert_eq!(lend.take(10), Some(4));
        assert_eq!(w.room_for_pending(&lend), 4);
        assert!(lend.hand_over(Vec::new(), &tx).is_ok());
        assert!(rx.try_recv().is_err(), "no word asked while there was room");
        // One slot, lent while nothing was pending (half rounded up: the whole slot), held by a
        // pass: it is asked for word, and the room stays lent.
        let mut w = Window::new(1);
        let lend = Lend::default();
        assert!(w.lend(&lend, false));
        assert_eq!((w.lent(), w.room()), (1, 0));
        assert_eq!(lend.take(10), Some(1));
        assert_eq!(w.room_for_pending(&lend), 0);
        assert!(lend.hand_over(Vec::new(), &tx).is_ok());
        assert!(rx.try_recv().is_ok(), "the pass sends word although it pushed nothing");
        // A pass that took the lend and handed it over with nothing, while no one asked: no
        // word comes, so the stream takes its room back at once (it waited for a 2 s poll).
        assert_eq!(lend.take(10), Some(1));
        assert!(lend.hand_over(Vec::new(), &tx).is_ok());
        assert!(rx.try_recv().is_err());
        assert_eq!(w.room_for_pending(&lend), 1);
        assert_eq!(w.lent(), 0);
        // What is on its way is not room: held and travelling fill the window, and nothing spins.
        let mut full = Window::new(2);
        let lend = Lend::default();
        assert!(full.lend(&lend, false));
        assert_eq!(lend.take(10), Some(1));
        let pushed = leased(add(start(), Duration::from_secs(5)), None);
        assert!(lend.hand_over(vec![pushed.clone()], &tx).is_ok());
        assert_eq!(full.reserve(1), 1);
        full.hold(&leased(add(start(), Duration::from_secs(5)), None));
        assert_eq!(full.room_for_pending(&lend), 0, "held and travelling fill it");
        full.hold_pushed(&pushed);
        assert_eq!((full.lent(), full.room_for_pending(&lend)), (0, 0));
    }

    #[test]
    fn a_lease_that_expired_while_it_waited_to_be_sent_is_not_sent() {
        let mut w = Window::new(3);
        let clock = ManualClock::new(start());
        let soon = leased(add(clock.now(), Duration::from_secs(1)), None);
        let later = leased(add(clock.now(), Duration::from_secs(30)), None);
        assert_eq!(w.reserve(2), 2);
        w.hold(&soon);
        w.hold(&later);
        clock.advance(Duration::from_secs(1));
        assert_eq!(w.expire(clock.now()), 1);
        let sent = w.still_held(vec![soon.clone(), later.clone()]);
        assert_eq!(
            sent.iter().map(|d| d.message.message_id).collect::<Vec<_>>(),
            [later.message.message_id],
            "the sweeper's now"
        );
        assert_eq!(w.ack(&[soon.message.message_id]).len(), 1, "a late ack of it still counts");
    }

    #[test]
    fn drain_hands_over_everything_held_without_giving_room_back() {
        let mut w = Window::new(3);
        let ids = lease(&mut w, 3, add(start(), Duration::from_secs(5)));
        let mut drained: Vec<MessageId> = w.drain().into_iter().map(|(id, _)| id).collect();
        drained.sort();
        let mut ids = ids;
        ids.sort();
        assert_eq!(drained, ids);
        assert!(w.is_empty());
        assert_eq!(w.room(), 0);
    }

    #[test]
    fn forgets_expired_leases_beyond_its_memory() {
        let mut w = Window::new(MAX_REMEMBERED_EXPIRED + 1);
        let ids = lease(&mut w, MAX_REMEMBERED_EXPIRED + 1, start());
        assert_eq!(w.expire(start()), MAX_REMEMBERED_EXPIRED + 1);
        assert!(w.ack(&ids).is_empty());
        assert_eq!(w.room(), MAX_REMEMBERED_EXPIRED + 1);
    }

    /// A delivery whose size as a window counts it is `bytes` (topic "t" and type "x" included).
    fn sized(bytes: usize) -> LeasedDelivery {
        let mut d = leased(add(start(), Duration::from_secs(5)), None);
        d.message.payload = vec![0; bytes - 2];
        d
    }

    #[test]
    fn a_principals_streams_share_its_bytes_and_get_them_back_as_deliveries_leave() {
        let budget = crate::limits::ByteBudget::new(100);
        let bytes = Some(InFlightBytes { budget: budget.clone(), unit: 40 });
        let mut a = Window::bounded(10, bytes.clone());
        let mut b = Window::bounded(10, bytes.clone());
        assert_eq!(a.reserve(10), 2, "room is reserved a largest delivery at a time: two of 40 in 100");
        assert_eq!(b.reserve(10), 0, "the principal's other stream waits");
        assert_eq!(budget.available(), 20);
        let d = sized(10);
        a.hold(&d);
        assert_eq!(budget.available(), 50, "a delivery of 10 gives back the 30 its unit did not need");
        a.unreserve(1);
        assert_eq!(budget.available(), 90);
        assert_eq!(b.reserve(10), 2);
        assert_eq!(a.ack(&[d.message.message_id]).len(), 1);
        assert_eq!(budget.available(), 20, "the ack gives back the delivery's 10");
        b.unreserve(2);
        assert_eq!(budget.available(), 100);

        // Nacked, expired, drained, or held when the window goes: every byte comes back.
        let (n, e, r, kept) = (sized(20), sized(20), sized(20), sized(20));
        assert_eq!(a.reserve(2), 2);
        a.hold(&n);
        a.hold(&e);
        assert_eq!(budget.available(), 60);
        assert!(a.nack(&n.message.message_id).is_some());
        assert_eq!(a.expire(add(start(), Duration::from_secs(6))), 1);
        assert_eq!(budget.available(), 100);
        assert_eq!(a.reserve(1), 1);
        a.hold(&r);
        assert_eq!(a.drain().len(), 1);
        assert_eq!(budget.available(), 100);
        let mut c = Window::bounded(10, bytes.clone());
        assert_eq!(c.reserve(1), 1);
        c.hold(&kept);
        assert_eq!(budget.available(), 80);
        // Room lent to the relay holds no units until a pass takes it, and then only as many
        // as the budget has: a lend never keeps the stream's own leases from the bytes.
        let lend = Lend::bounded(bytes.clone());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        assert!(c.lend(&lend, false));
        assert_eq!((c.lent(), budget.available()), (5, 80), "half of 9, rounded up; no bytes");
        assert_eq!(lend.take(100), Some(2), "a pass takes the 2 units that are free");
        assert_eq!(budget.available(), 0);
        // It pushes two: one the stream holds (its unit settles to its 20 bytes), one whose
        // message is dropped unread (its unit comes back).
        assert!(lend.hand_over(vec![sized(20)], &tx).is_ok());
        let mut handed = rx.try_recv().unwrap();
        c.hold_pushed(&handed.take_deliveries()[0]);
        assert_eq!(budget.available(), 60, "one unit settled to 20 bytes, the unused one back");
        assert_eq!(lend.take(100), Some(1));
        assert!(lend.hand_over(vec![sized(20)], &tx).is_ok());
        drop(rx.try_recv().unwrap());
        assert_eq!(budget.available(), 60);
        // A hand-over to a stream that has gone gives the units back with the deliveries.
        assert_eq!(lend.take(100), Some(1));
        drop(rx);
        assert_eq!(lend.hand_over(vec![sized(20)], &tx).map_err(|d| d.len()), Err(1));
        assert_eq!(budget.available(), 60);
        assert!(c.withdraw(&lend));
        assert!(c.lend(&lend, false));
        drop(c);
        assert_eq!(budget.available(), 100);
    }

    #[test]
    fn without_a_budget_room_is_counted_in_deliveries_only() {
        let mut w = Window::new(3);
        assert_eq!(w.reserve(3), 3);
        w.hold(&sized(10_000_000));
        assert_eq!(w.room(), 0);
    }
}

//! The in-flight window of one stream: the leases it holds, the room it has for more (shared
//! with the relay, which leases new deliveries straight to the stream while there is room),
//! their deadlines, and the leases that expired while held, whose late ack still counts.
//!
//! Plain data: no I/O, no clock of its own. The session asks it what to do and tells the store;
//! tests drive it with explicit times.
use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::domain::MessageId;
use crate::hub::Credits;
use crate::store::LeasedDelivery;

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
    /// The message's seq, which the store finds batch-held deliveries by.
    pub seq: i64,
}

impl Held {
    pub fn of(d: &LeasedDelivery) -> Self {
        Self {
            delivery_count: d.delivery_count,
            deadline: d.lease_expires_at,
            enqueued_at: d.message.enqueued_at,
            has_ordering_key: d.message.ordering_key.is_some(),
            seq: d.message.seq,
        }
    }
}

/// Held leases plus room: `room() + held()` never exceeds `max` (the relay's share of the room
/// is taken from the same [`Credits`]).
#[derive(Debug)]
pub struct Window {
    max: usize,
    credits: Arc<Credits>,
    held: HashMap<MessageId, Held>,
    expired: HashMap<MessageId, Held>,
}

impl Window {
    pub fn new(max: usize) -> Self {
        Self { max, credits: Arc::new(Credits::new(max)), held: HashMap::new(), expired: HashMap::new() }
    }

    /// The room, as shared with the relay.
    pub fn credits(&self) -> &Arc<Credits> {
        &self.credits
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Free room right now.
    pub fn room(&self) -> usize {
        self.credits.available()
    }

    /// Takes up to `want` of the room for a lease about to be made; returns how much it got.
    /// What the lease does not use goes back with [`Window::unreserve`].
    pub fn reserve(&self, want: usize) -> usize {
        self.credits.take(want)
    }

    pub fn unreserve(&self, n: usize) {
        self.credits.give(n);
    }

    /// Holds a delivery leased to this stream; its room is already taken (by [`Window::reserve`],
    /// or by the relay when it pushed the delivery).
    pub fn hold(&mut self, d: &LeasedDelivery) {
        self.held.insert(d.message.message_id, Held::of(d));
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
                self.expired.insert(*id, h);
            }
        }
        self.credits.give(gone.len());
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
                self.credits.give(1);
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
        self.credits.give(1);
        Some(h)
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

    /// Everything held, for release as the stream ends. The room is not given back: the
    /// stream takes nothing more.
    pub fn drain(&mut self) -> Vec<(MessageId, Held)> {
        self.held.drain().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;
    use crate::clock::{Clock, ManualClock, add};
    use crate::store::StoredMessage;

    fn start() -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000, 0).unwrap()
    }

    fn leased(deadline: DateTime<Utc>, key: Option<&str>) -> LeasedDelivery {
        LeasedDelivery {
            message: StoredMessage {
                message_id: MessageId::generate(),
                seq: 1,
                topic: "t".into(),
                type_: "x".into(),
                payload: vec![],
                headers: BTreeMap::new(),
                ordering_key: key.map(str::to_owned),
                enqueued_at: start(),
                available_at: start(),
                relayed_at: None,
            },
            delivery_count: 1,
            lease_expires_at: deadline,
        }
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
    fn the_relay_and_the_session_share_one_room() {
        let mut w = Window::new(3);
        // The relay takes room through the shared credits and pushes a delivery.
        assert_eq!(w.credits().take(2), 2);
        let pushed = leased(add(start(), Duration::from_secs(5)), None);
        w.hold(&pushed);
        w.credits().give(1); // it pushed one of the two it took
        assert_eq!(w.room(), 2);
        assert_eq!(w.reserve(3), 2);
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
}

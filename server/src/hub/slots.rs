//! Push slots: the streams a relay pass may lease new deliveries to, the lends one pass
//! holds, and their hand-over when it ends.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;

use super::{Handed, Lend};
use crate::domain::{LeasedDelivery, PushOffer};

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
    pub(super) slots: HashMap<String, Vec<PushSlot>>,
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

#[cfg(test)]
mod tests {
    use super::super::Hub;
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
}

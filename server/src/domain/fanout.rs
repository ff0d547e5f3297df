//! The relay's policy, once for both stores: which consumer gets which message of a pass, which
//! deliveries go straight to a stream that offered room, which wait as a pending range, and
//! which need a row of their own (see `docs/delivery-states.md`, T1–T3).
//!
//! A pure function over what the pass read: the stores read and write, this decides. Each
//! store writes the [`Plan`] in its own places (PostgreSQL: leased and pending ranges and rows;
//! SQLite: a row per delivery, which its documented transactional ack needs).
use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use super::{PushOffer, StoredMessage};

/// What the policy needs of one message a pass read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassMessage {
    pub seq: i64,
    pub topic: String,
    pub keyed: bool,
    pub enqueued_at: DateTime<Utc>,
    pub available_at: DateTime<Utc>,
}

impl PassMessage {
    /// Whether a range can hold its deliveries: unkeyed and due. A message with no delay is
    /// due once committed, whatever the clocks: its `available_at` is its producer's `now()`,
    /// which can be a little after `at` (read by outboxd as the pass began) for a message
    /// committed just in time for the pass's read. Compared with `at` alone, such messages, some
    /// 7 % of a steady flow, were taken for delayed ones and got a row and a lease each.
    pub fn rangeable(&self, at: DateTime<Utc>) -> bool {
        !self.keyed && self.available_at <= at.max(self.enqueued_at)
    }
}

impl From<&StoredMessage> for PassMessage {
    fn from(m: &StoredMessage) -> Self {
        Self {
            seq: m.seq,
            topic: m.topic.clone(),
            keyed: m.ordering_key.is_some(),
            enqueued_at: m.enqueued_at,
            available_at: m.available_at,
        }
    }
}

/// A consumer whose topics match at least one message of the pass.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Subscriber {
    pub name: String,
    pub paused: bool,
    /// Only messages after this seq are its (`start_from`).
    pub start_seq: i64,
    /// The topics of the pass it subscribes to.
    pub topics: HashSet<String>,
    /// Seqs of the pass it has a row for already (an `EARLIEST` consumer's backfill, or a
    /// replay, writes rows for messages not relayed yet): the row decides, the pass writes
    /// nothing for them.
    pub has_row: HashSet<i64>,
}

/// What a pass writes, in seq order everywhere.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// For each offer that got deliveries: its index in the offers and the seqs leased to it
    /// (delivery count 1), the lowest of its consumer's share first, offers in their order.
    pub leased: Vec<(usize, Vec<i64>)>,
    /// For each consumer: the seqs that wait, due, for a lease (delivery count 0).
    pub pending: Vec<(String, Vec<i64>)>,
    /// `(consumer, seq)` of the deliveries a range cannot hold (keyed, delayed): a pending row
    /// each.
    pub rows: Vec<(String, i64)>,
}

impl Plan {
    /// Every delivery the plan writes.
    pub fn deliveries(&self) -> usize {
        self.leased.iter().map(|(_, s)| s.len()).sum::<usize>()
            + self.pending.iter().map(|(_, s)| s.len()).sum::<usize>()
            + self.rows.len()
    }
}

/// Fans `messages` (in seq order) out to `subscribers`:
///
/// - a consumer gets the messages after its `start_seq` whose topic it subscribes to, except
///   those it has a row for already;
/// - keyed and delayed messages get a pending row each (their order and due time are a row's);
/// - the rest, unless the consumer is paused, go to its offers in their order, each offer
///   taking the lowest seqs left up to its room, as one leased range;
/// - what is left waits as one pending range of the consumer.
pub fn plan(messages: &[PassMessage], subscribers: &[Subscriber], offers: &[PushOffer], at: DateTime<Utc>) -> Plan {
    let mut by_consumer: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, o) in offers.iter().enumerate() {
        by_consumer.entry(o.consumer.as_str()).or_default().push(i);
    }
    // The messages of each topic, in seq order, with whether a range can hold them: a
    // subscriber reads only its topics' messages.
    let mut by_topic: HashMap<&str, Vec<(i64, bool)>> = HashMap::new();
    for m in messages {
        by_topic.entry(m.topic.as_str()).or_default().push((m.seq, m.rangeable(at)));
    }
    let mut out = Plan::default();
    for s in subscribers {
        let mut mine: Vec<(i64, bool)> = s
            .topics
            .iter()
            .filter_map(|t| by_topic.get(t.as_str()))
            .flatten()
            .filter(|(seq, _)| *seq > s.start_seq && !s.has_row.contains(seq))
            .copied()
            .collect();
        if s.topics.len() > 1 {
            mine.sort_unstable();
        }
        let mut share = Vec::with_capacity(mine.len());
        for (seq, rangeable) in mine {
            if rangeable {
                share.push(seq);
            } else {
                out.rows.push((s.name.clone(), seq));
            }
        }
        let mut rest = share.as_slice();
        if !s.paused {
            for &i in by_consumer.get(s.name.as_str()).map(Vec::as_slice).unwrap_or_default() {
                if rest.is_empty() {
                    break;
                }
                let (taken, left) = rest.split_at(offers[i].room.min(rest.len()));
                if !taken.is_empty() {
                    out.leased.push((i, taken.to_vec()));
                }
                rest = left;
            }
        }
        if !rest.is_empty() {
            out.pending.push((s.name.clone(), rest.to_vec()));
        }
    }
    out.leased.sort_by_key(|(i, _)| *i);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000, 0).unwrap_or_default()
    }

    fn msg(seq: i64, topic: &str) -> PassMessage {
        PassMessage { seq, topic: topic.into(), keyed: false, enqueued_at: at(), available_at: at() }
    }

    fn sub(name: &str, topics: &[&str]) -> Subscriber {
        Subscriber { name: name.into(), topics: topics.iter().map(|t| (*t).into()).collect(), ..Subscriber::default() }
    }

    fn offer(consumer: &str, session: &str, room: usize) -> PushOffer {
        PushOffer { consumer: consumer.into(), session: session.into(), room, lease_until: at() }
    }

    #[test]
    fn offers_take_the_lowest_seqs_in_their_order_and_the_rest_waits_as_one_range() {
        let messages: Vec<_> = (1..=6).map(|s| msg(s, "a")).collect();
        let offers = [offer("c", "s1", 2), offer("other", "x", 9), offer("c", "s2", 3)];
        let p = plan(&messages, &[sub("c", &["a"])], &offers, at());
        assert_eq!(p.leased, vec![(0, vec![1, 2]), (2, vec![3, 4, 5])]);
        assert_eq!(p.pending, vec![("c".into(), vec![6])]);
        assert!(p.rows.is_empty());
        assert_eq!(p.deliveries(), 6);
    }

    #[test]
    fn keyed_and_delayed_messages_get_rows_and_never_go_to_a_range() {
        let mut keyed = msg(2, "a");
        keyed.keyed = true;
        let mut delayed = msg(3, "a");
        delayed.available_at = at() + chrono::Duration::seconds(5);
        // Its producer's clock a little ahead of outboxd's: due all the same.
        let mut ahead = msg(4, "a");
        ahead.enqueued_at = at() + chrono::Duration::milliseconds(3);
        ahead.available_at = ahead.enqueued_at;
        let messages = [msg(1, "a"), keyed, delayed, ahead];
        let p = plan(&messages, &[sub("c", &["a"])], &[offer("c", "s", 10)], at());
        assert_eq!(p.leased, vec![(0, vec![1, 4])]);
        assert_eq!(p.rows, vec![("c".into(), 2), ("c".into(), 3)]);
        assert!(p.pending.is_empty());
    }

    #[test]
    fn topics_start_seq_rows_already_there_and_pauses_decide_who_gets_what() {
        let messages = [msg(1, "a"), msg(2, "b"), msg(3, "a"), msg(4, "a")];
        let mut late = sub("late", &["a"]);
        late.start_seq = 3;
        let mut backfilled = sub("backfilled", &["a", "b"]);
        backfilled.has_row = HashSet::from([1, 2]);
        let mut paused = sub("paused", &["a"]);
        paused.paused = true;
        let offers = [offer("late", "l", 5), offer("backfilled", "b", 5), offer("paused", "p", 5)];
        let p = plan(&messages, &[late, backfilled, paused], &offers, at());
        assert_eq!(p.leased, vec![(0, vec![4]), (1, vec![3, 4])]);
        assert_eq!(p.pending, vec![("paused".into(), vec![1, 3, 4])]);
        assert!(p.rows.is_empty());
    }

    #[test]
    fn a_consumer_with_no_offer_gets_everything_pending_and_no_match_gets_nothing() {
        let messages = [msg(1, "a"), msg(2, "a")];
        let p = plan(&messages, &[sub("c", &["a"]), sub("none", &["z"])], &[], at());
        assert_eq!(p, Plan { pending: vec![("c".into(), vec![1, 2])], ..Plan::default() });
    }
}

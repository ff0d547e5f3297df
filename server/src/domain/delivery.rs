//! A message as the store holds it and the vocabulary of its deliveries: what a stream holds
//! ([`LeasedDelivery`]), where a delivery goes when it is not acked ([`Release`], within what
//! [`ReleaseGuard`] allows), the room a stream offers the relay ([`PushOffer`]) and what one
//! relay pass did ([`RelayOutcome`]). The store returns and takes them, and every layer above
//! it shares them: the hub, which never calls the store, hands them from the relay to the
//! sessions.
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use super::{ConsumerName, DeliveryState, MessageId};

/// A message as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredMessage {
    pub message_id: MessageId,
    pub seq: i64,
    pub topic: String,
    pub type_: String,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
    pub ordering_key: Option<String>,
    pub enqueued_at: DateTime<Utc>,
    pub available_at: DateTime<Utc>,
    pub relayed_at: Option<DateTime<Utc>>,
}

/// A delivery just leased to a stream.
#[derive(Debug, Clone)]
pub struct LeasedDelivery {
    pub message: StoredMessage,
    pub delivery_count: u32,
    pub lease_expires_at: DateTime<Utc>,
}

#[cfg(test)]
impl LeasedDelivery {
    /// A first delivery of an empty, unkeyed message of topic "t" and type "x", leased until
    /// `at` (enqueued then too), for tests of what holds and orders deliveries.
    pub fn sample(seq: i64, at: DateTime<Utc>) -> Self {
        Self {
            message: StoredMessage {
                message_id: MessageId::generate(),
                seq,
                topic: "t".into(),
                type_: "x".into(),
                payload: vec![],
                headers: Default::default(),
                ordering_key: None,
                enqueued_at: at,
                available_at: at,
                relayed_at: None,
            },
            delivery_count: 1,
            lease_expires_at: at,
        }
    }
}

/// Where a leased delivery goes when it is not acked.
#[derive(Debug, Clone)]
pub struct Release {
    pub consumer: ConsumerName,
    pub message_id: MessageId,
    /// `Pending` (retry at `available_at`) or `Dead`.
    pub state: DeliveryState,
    pub available_at: DateTime<Utc>,
    pub error: Option<String>,
    /// Whether the lease being released was an attempt (ADR 0074).
    pub attempt: Attempt,
}

/// Whether a released lease counts as an attempt. Every lease adds one to `delivery_count`
/// when it is taken, before the consumer sees anything; a release says whether that one
/// stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// A failed attempt: a nack, a refused publish, an expired lease, a broken stream holding
    /// what it had sent. The count stays, and decides `dead` against `max_deliveries`.
    Failed,
    /// Not an attempt: a clean close, a shutdown, an unreachable sink target, or a delivery the
    /// stream was never sent. The release takes back the one its lease added, so that the next
    /// lease counts the same attempt again and `delivery_count` never passes `max_deliveries`.
    Withdrawn,
}

/// Which leases a release may touch.
#[derive(Debug, Clone, Copy)]
pub enum ReleaseGuard<'a> {
    /// Only leases held by this delivery session (nack, closed stream).
    Session(&'a str),
    /// Only leases whose deadline is at or before this instant (the lease sweeper).
    ExpiredAt(DateTime<Utc>),
}

/// What one relay pass did.
#[derive(Debug, Clone, Default)]
pub struct RelayOutcome {
    pub messages: u64,
    /// The highest `seq` claimed.
    pub last_seq: Option<i64>,
    pub deliveries: u64,
    /// Consumers that got new pending deliveries, to wake their streams.
    pub consumers: Vec<String>,
    /// `(message_id, traceparent)` of the relayed messages that carry a trace context.
    pub traced: Vec<(String, String)>,
    /// Deliveries leased at fan-out to a stream of this process: `(consumer, session, delivery)`
    /// (the relay takes them out to hand them over).
    pub pushed: Vec<(String, String, LeasedDelivery)>,
}

/// Room on one stream for deliveries leased to it at fan-out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushOffer {
    pub consumer: String,
    pub session: String,
    pub room: usize,
    pub lease_until: DateTime<Utc>,
}

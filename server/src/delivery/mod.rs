//! Delivery of leased messages: the [`session`] loop that serves one `Subscribe` stream (or
//! one sink), its in-flight [`window`] (held leases, room and what of it is lent to the
//! relay, expiry), its [`pace`] (when it leases: pending work, turns, timers, batching,
//! backoff) and its [`order`] (what it leased waits for the pass that held its lend), plain
//! structs that tests drive with explicit times, and the [`Command`]s a client gives its stream.
//! What a failed attempt makes of a delivery is [`crate::domain::Failure`]'s to decide.
use std::time::Duration;

use crate::domain::MessageId;

pub mod order;
pub mod pace;
pub mod session;
pub mod window;

/// What a client asks of its stream once it has started. The edge parses each request of a
/// `Subscribe` stream into one; a sink's runner makes them from its target's answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// The handler finished these: never deliver them to this consumer again.
    Ack(Vec<MessageId>),
    /// The handler failed: retry after `retry_after`, or the consumer's backoff when `None`.
    Nack { id: MessageId, error: String, retry_after: Option<Duration> },
    /// Still working on these: hold the leases for `deadline` from now.
    Extend { ids: Vec<MessageId>, deadline: Duration },
    /// Nothing to do (a request whose ids were all malformed, for example).
    Nothing,
}

//! Sinks: consumers that outboxd delivers itself, to a broker or a webhook.
//!
//! A sink consumer is served by the same delivery core as a `Subscribe` stream (leases, the
//! in-flight window, pushes from the relay, ordering keys, retries, dead letters); where a
//! stream sends each delivery to a client, a sink hands it to its [`Target`], which publishes
//! it and answers with an [`Outcome`] once the target has confirmed it (or refused it). The
//! outcome becomes the ack or the nack.
//!
//! One more target is one more file: a module here with a type that implements [`Target`],
//! and one arm in [`connect`].
use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;

use crate::domain::{MessageId, SinkKind};

/// One delivery, as a target publishes it.
#[derive(Debug, Clone)]
pub struct Publish {
    pub message_id: MessageId,
    pub seq: i64,
    pub topic: String,
    pub type_: String,
    pub payload: Vec<u8>,
    /// The message's headers, with this delivery's `traceparent` when the message is traced.
    pub headers: BTreeMap<String, String>,
    pub ordering_key: Option<String>,
    pub enqueued_at: DateTime<Utc>,
    /// 1 on the first delivery.
    pub delivery_count: u32,
}

impl From<crate::store::LeasedDelivery> for Publish {
    fn from(d: crate::store::LeasedDelivery) -> Self {
        let m = d.message;
        Publish {
            message_id: m.message_id,
            seq: m.seq,
            topic: m.topic,
            type_: m.type_,
            payload: m.payload,
            headers: m.headers,
            ordering_key: m.ordering_key,
            enqueued_at: m.enqueued_at,
            delivery_count: d.delivery_count,
        }
    }
}

/// What a target answers for one publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The target has it durably (a publisher confirm, a PubAck, a 2xx): ack.
    Confirmed,
    /// The target refused this message, or failed it: a failed attempt (nack; the consumer's
    /// backoff or `retry_after`, then dead at `max_deliveries`). `reason` is a short,
    /// low-cardinality label for metrics (`unroutable`, `nacked`, `no_stream`, `http_4xx`,
    /// `http_5xx`, `timeout`, …); `error` is what the dead letter shows.
    Failed { reason: &'static str, error: String, retry_after: Option<Duration> },
    /// The target cannot be reached (connection or channel lost): the delivery is released
    /// without counting as a failure of the message, and the sink reconnects with backoff
    /// before it leases again.
    Unavailable { error: String },
}

/// Why a target could not connect.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConnectError(pub String);

/// One target: a connection (or client) to a broker or a webhook endpoint.
///
/// `publish` is called concurrently, up to the sink's `max_in_flight` at once: a target
/// pipelines them (publishes without waiting, then waits for each confirmation).
pub trait Target: Send + Sync + 'static {
    fn kind(&self) -> SinkKind;

    /// Connects, or checks that the connection is up; called before the sink leases anything
    /// and again, with backoff, after an [`Outcome::Unavailable`].
    fn connect(&self) -> BoxFuture<'_, Result<(), ConnectError>>;

    /// Publishes one delivery and waits for the target's confirmation.
    fn publish(&self, message: Publish) -> BoxFuture<'_, Outcome>;

    /// Closes the connection (on shutdown, or when the sink consumer is deleted).
    fn close(&self) -> BoxFuture<'_, ()>;
}

pub mod round;
pub mod runner;
pub mod supervisor;

/// The target for a sink's configuration (not yet connected).
pub fn connect(target: &crate::domain::SinkTarget) -> Box<dyn Target> {
    Box::new(NotBuilt(target.kind()))
}

/// A target kind this build cannot publish to.
struct NotBuilt(SinkKind);

impl Target for NotBuilt {
    fn kind(&self) -> SinkKind {
        self.0
    }

    fn connect(&self) -> BoxFuture<'_, Result<(), ConnectError>> {
        Box::pin(async move { Err(ConnectError(format!("{} sinks are not built into this outboxd", self.0))) })
    }

    fn publish(&self, _message: Publish) -> BoxFuture<'_, Outcome> {
        Box::pin(
            async move { Outcome::Unavailable { error: format!("{} sinks are not built into this outboxd", self.0) } },
        )
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

//! The storage layer: every SQL statement of the server lives below this module.
//!
//! Query functions are named entity-first (`message_insert`, `delivery_lease_batch`,
//! `delivery_ack_many`); writes that a producer joins take the caller's executor.
use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::{ConsumerName, DeliveryState, MessageId, Topic};

pub mod postgres;
#[cfg(test)]
mod tests;

pub use postgres::PgStore;

/// Errors of the storage layer, carrying the ids involved.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("consumer {0:?} not found")]
    ConsumerNotFound(String),
    #[error("consumer {0:?} already exists with a different definition")]
    ConsumerConflict(String),
    #[error("message {0} not found")]
    MessageNotFound(MessageId),
    /// The database rejected a value (SQLSTATE class 22, or a CHECK constraint).
    #[error("invalid value: {0}")]
    InvalidValue(String),
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &e {
            let code = db.code().unwrap_or_default();
            // data_exception (22xxx) and check_violation (23514): the caller's value is wrong.
            if code.starts_with("22") || code == "23514" {
                return StoreError::InvalidValue(db.message().to_owned());
            }
        }
        StoreError::Database(e)
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A message to enqueue, already validated.
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub message_id: Option<MessageId>,
    pub topic: Topic,
    pub type_: String,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
    pub ordering_key: Option<String>,
    pub delay: Option<Duration>,
}

/// The outcome of an enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    pub message_id: MessageId,
    pub seq: i64,
    /// A message with this id existed already; nothing was written.
    pub duplicate: bool,
}

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

/// One consumer's inbox row for a message.
#[derive(Debug, Clone)]
pub struct DeliveryRow {
    pub consumer: String,
    pub state: DeliveryState,
    pub delivery_count: u32,
    pub available_at: DateTime<Utc>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub acked_at: Option<DateTime<Utc>>,
    pub dead_at: Option<DateTime<Utc>>,
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
}

/// Which leases a release may touch.
#[derive(Debug, Clone, Copy)]
pub enum ReleaseGuard<'a> {
    /// Only leases held by this delivery session (nack, closed stream).
    Session(&'a str),
    /// Only leases whose deadline is at or before this instant (the lease sweeper).
    ExpiredAt(DateTime<Utc>),
}

/// A lease past its deadline, with the policy needed to decide its next state.
#[derive(Debug, Clone)]
pub struct ExpiredLease {
    pub consumer: ConsumerName,
    pub message_id: MessageId,
    pub delivery_count: u32,
    pub max_deliveries: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

/// What one relay pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayOutcome {
    pub messages: u64,
    pub deliveries: u64,
    /// Consumers that got new deliveries, to wake their streams.
    pub consumers: Vec<String>,
}

#[derive(Debug, Clone, Default)]
pub struct ConsumerStats {
    pub consumer: String,
    pub paused: bool,
    pub backlog: i64,
    pub in_flight: i64,
    pub retrying: i64,
    pub dead: i64,
    pub acked: i64,
    pub oldest_unacked_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub unrelayed: i64,
    pub oldest_unrelayed_at: Option<DateTime<Utc>>,
    pub consumers: Vec<ConsumerStats>,
}

#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub message: StoredMessage,
    pub consumer: String,
    pub delivery_count: u32,
    pub last_error: Option<String>,
    pub dead_at: Option<DateTime<Utc>>,
}

/// Which deliveries a replay makes due again.
#[derive(Debug, Clone)]
pub enum ReplaySelector {
    MessageIds(Vec<MessageId>),
    DeadLetters,
    /// `after` inclusive, `before` exclusive, on `enqueued_at`.
    EnqueuedBetween {
        after: DateTime<Utc>,
        before: DateTime<Utc>,
    },
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub messages: i64,
    pub deliveries: i64,
}

//! What a producer enqueues.
use std::collections::BTreeMap;
use std::time::Duration;

use uuid::Uuid;

/// A message to enqueue. Topic and type are required; the rest is optional.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub topic: String,
    pub type_: String,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
    /// Chosen by the producer for idempotency; outboxd generates a UUIDv7 when `None`.
    pub message_id: Option<Uuid>,
    /// Messages sharing a key are delivered one at a time per consumer.
    pub ordering_key: Option<String>,
    /// Not delivered before enqueue time + delay.
    pub delay: Option<Duration>,
}

impl Message {
    pub fn new(topic: impl Into<String>, type_: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        Self {
            topic: topic.into(),
            type_: type_.into(),
            payload: payload.into(),
            headers: BTreeMap::new(),
            message_id: None,
            ordering_key: None,
            delay: None,
        }
    }

    pub fn header(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(key.into(), value.into());
        self
    }

    pub fn message_id(mut self, id: Uuid) -> Self {
        self.message_id = Some(id);
        self
    }

    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }
}

/// The outcome of an enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    pub message_id: Uuid,
    pub seq: i64,
    /// A message with this id existed already; nothing new was written.
    pub duplicate: bool,
}

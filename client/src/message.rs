//! What a producer enqueues.
use std::collections::BTreeMap;
use std::time::Duration;

use uuid::Uuid;

use crate::ClientError;

/// Longest topic, as the database enforces it.
pub const MAX_TOPIC_LEN: usize = 255;
/// The limits the database and outboxd hold every message to (bytes, UTF-8).
pub const MAX_TYPE_BYTES: usize = 255;
pub const MAX_ORDERING_KEY_BYTES: usize = 255;
pub const MAX_HEADERS: usize = 64;
pub const MAX_HEADER_KEY_BYTES: usize = 256;
/// Keys and values of all headers together.
pub const MAX_HEADERS_BYTES: usize = 16 * 1024;
/// outboxd's default `--max-payload-bytes`. A producer's login cannot read the server's flag:
/// where it is raised, set `OUTBOXD_MAX_PAYLOAD_BYTES` to the same value for the clients.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// The payload limit checked before any SQL runs: `OUTBOXD_MAX_PAYLOAD_BYTES` when set, else
/// [`DEFAULT_MAX_PAYLOAD_BYTES`].
pub fn max_payload_bytes() -> Result<usize, ClientError> {
    match std::env::var("OUTBOXD_MAX_PAYLOAD_BYTES") {
        Ok(raw) if !raw.is_empty() => match raw.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(ClientError::InvalidMessage(format!(
                "OUTBOXD_MAX_PAYLOAD_BYTES is {raw:?}; it must be a positive number of bytes"
            ))),
        },
        _ => Ok(DEFAULT_MAX_PAYLOAD_BYTES),
    }
}

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

    /// Checks what outboxd and the database would refuse, with a message naming the field: a
    /// topic of dot-separated segments of `[A-Za-z0-9_-]` (at most 255 characters), a type of at
    /// most 255 bytes, an ordering key of at most 255 bytes, and at most 64 headers with keys of
    /// 1 to 256 bytes and 16 KiB of keys and values in all.
    pub fn validate(&self) -> Result<(), ClientError> {
        let segment_ok =
            |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if self.topic.len() > MAX_TOPIC_LEN || !self.topic.split('.').all(segment_ok) {
            return Err(ClientError::InvalidMessage(format!(
                "invalid topic {:?}: dot-separated segments of [A-Za-z0-9_-], at most {MAX_TOPIC_LEN} characters, required",
                self.topic
            )));
        }
        if self.type_.is_empty() {
            return Err(ClientError::InvalidMessage("type must not be empty".to_owned()));
        }
        let invalid = |m: String| Err(ClientError::InvalidMessage(m));
        if self.type_.len() > MAX_TYPE_BYTES {
            return invalid(format!("type is {} bytes; the limit is {MAX_TYPE_BYTES}", self.type_.len()));
        }
        if let Some(k) = &self.ordering_key
            && k.len() > MAX_ORDERING_KEY_BYTES
        {
            return invalid(format!("ordering_key is {} bytes; the limit is {MAX_ORDERING_KEY_BYTES}", k.len()));
        }
        let limit = max_payload_bytes()?;
        if self.payload.len() > limit {
            return invalid(format!(
                "payload is {} bytes; the limit is {limit} bytes (outboxd's --max-payload-bytes; set \
                 OUTBOXD_MAX_PAYLOAD_BYTES to the server's value where it is raised)",
                self.payload.len()
            ));
        }
        check_headers(&self.headers)
    }
}

/// The header limits, on the headers as they are written (the client adds `traceparent`).
pub(crate) fn check_headers(headers: &BTreeMap<String, String>) -> Result<(), ClientError> {
    let invalid = |m: String| Err(ClientError::InvalidMessage(m));
    if headers.len() > MAX_HEADERS {
        return invalid(format!("headers: {} entries; the limit is {MAX_HEADERS}", headers.len()));
    }
    if headers.keys().any(|k| k.is_empty()) {
        return invalid("headers: a key is empty; keys must not be empty".to_owned());
    }
    if let Some(k) = headers.keys().find(|k| k.len() > MAX_HEADER_KEY_BYTES) {
        return invalid(format!("headers: a key is {} bytes; the limit is {MAX_HEADER_KEY_BYTES}", k.len()));
    }
    let total: usize = headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > MAX_HEADERS_BYTES {
        return invalid(format!("headers: {total} bytes of keys and values; the limit is {MAX_HEADERS_BYTES}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_bad_field() {
        let ok = Message::new("orders.created-v2.eu_1", "OrderCreated", b"{}".to_vec());
        assert!(ok.validate().is_ok());
        for topic in ["", "orders.", ".orders", "orders..created", "orders created", "orders.*", "ä"] {
            let err = Message { topic: topic.into(), ..ok.clone() }.validate().unwrap_err().to_string();
            assert!(err.contains("invalid topic"), "{topic:?}: {err}");
        }
        let long = "a".repeat(256);
        assert!(Message { topic: long, ..ok.clone() }.validate().is_err());
        assert!(Message { topic: "a".repeat(255), ..ok.clone() }.validate().is_ok());
        let err = Message { type_: String::new(), ..ok.clone() }.validate().unwrap_err().to_string();
        assert!(err.contains("type"), "{err}");
    }

    /// The topic grammar of the client contract (contract/topics.json, ADR 0084), which the
    /// server, the other clients and the SQL of both stores are tested against too.
    #[test]
    fn topics_follow_the_client_contract() {
        let grammar: serde_json::Value =
            serde_json::from_str(include_str!("../../contract/topics.json")).expect("contract/topics.json parses");
        let max = grammar["max_length"].as_u64().expect("max_length");
        assert_eq!(MAX_TOPIC_LEN as u64, max);
        let vectors = |kind: &str| -> Vec<String> {
            let list = grammar["topics"][kind].as_array().expect("topic vectors");
            list.iter().map(|v| v.as_str().expect("a topic").to_owned()).collect()
        };
        let check = |topic: String| Message::new(topic, "T", Vec::new()).validate();
        for topic in vectors("valid").into_iter().chain(["a".repeat(MAX_TOPIC_LEN)]) {
            assert!(check(topic.clone()).is_ok(), "{topic:?} is a topic");
        }
        for topic in vectors("invalid").into_iter().chain(["a".repeat(MAX_TOPIC_LEN + 1)]) {
            let err = check(topic.clone()).expect_err("not a topic").to_string();
            assert!(err.contains("invalid topic"), "{topic:?}: {err}");
        }
    }

    #[test]
    fn the_message_limits_are_checked_before_the_database_sees_them() {
        let ok = Message::new("orders.created", "T".repeat(255), Vec::new()).ordering_key("k".repeat(255));
        let full: BTreeMap<String, String> = (0..63).map(|i| (format!("h{i:02}"), "v".repeat(253))).collect();
        let at_limit = Message { headers: full.clone(), ..ok.clone() }.header("k".repeat(256), "");
        assert!(at_limit.validate().is_ok());
        let err = |m: Message| m.validate().unwrap_err().to_string();
        assert!(err(Message { type_: "T".repeat(256), ..ok.clone() }).contains("type is 256 bytes"));
        assert!(err(ok.clone().ordering_key("k".repeat(256))).contains("ordering_key is 256 bytes"));
        assert!(err(at_limit.clone().header("x", "")).contains("65 entries"));
        assert!(err(ok.clone().header("", "v")).contains("key is empty"));
        assert!(err(ok.clone().header("k".repeat(257), "")).contains("257 bytes"));
        let over = Message { headers: full, ..ok.clone() }.header("k".repeat(256), "v");
        assert!(err(over).contains("16385 bytes"));
        // The server's default --max-payload-bytes (this test's environment sets no other).
        assert!(Message { payload: vec![0; DEFAULT_MAX_PAYLOAD_BYTES], ..ok.clone() }.validate().is_ok());
        let big = err(Message { payload: vec![0; 5 * 1024 * 1024], ..ok });
        assert!(
            big.contains("payload is 5242880 bytes; the limit is 1048576 bytes (outboxd's --max-payload-bytes"),
            "{big}"
        );
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

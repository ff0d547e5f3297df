//! Rows as a driver reads them, before they are domain values: each backend turns its columns
//! into these plain records (its own types: timestamps, ids, booleans), and the conversions into
//! the domain live here, once, for every backend. A value the domain does not know (a state, a
//! `start_from`, a topic pattern, a negative count) is an error naming the row, never a default.
use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{DeliveryRow, ExpiredLease, StoreError};
use crate::domain::{
    Backoff, Consumer, ConsumerName, ConsumerSpec, DeadKeyPolicy, DeliveryState, RetryPolicy, Sink, StartFrom,
    TopicPattern,
};

/// A row of the consumers table.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumerRecord {
    pub name: String,
    pub topics: Vec<String>,
    pub max_deliveries: i64,
    pub backoff_base_ms: i64,
    pub backoff_max_ms: i64,
    pub ack_deadline_ms: i64,
    pub start_from: String,
    pub sink: Option<serde_json::Value>,
    pub dead_key_policy: String,
    pub paused: bool,
    pub start_seq: i64,
    pub created_at: DateTime<Utc>,
    pub created_by: Option<String>,
}

impl TryFrom<ConsumerRecord> for Consumer {
    type Error = StoreError;

    fn try_from(r: ConsumerRecord) -> Result<Self, StoreError> {
        let bad = |what: &str, e: &dyn std::fmt::Display| {
            StoreError::InvalidValue(format!("stored consumer {:?}: {what}: {e}", r.name))
        };
        let topics = r
            .topics
            .iter()
            .map(|t| TopicPattern::parse("topics", t))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad("topics", &e))?;
        let sink = r.sink.clone().map(serde_json::from_value::<Sink>).transpose().map_err(|e| bad("sink", &e))?;
        let start_from = StartFrom::try_from(r.start_from.as_str()).map_err(|e| bad("start_from", &e))?;
        let dead_key_policy =
            DeadKeyPolicy::try_from(r.dead_key_policy.as_str()).map_err(|e| bad("dead_key_policy", &e))?;
        let max_deliveries = u32::try_from(r.max_deliveries).map_err(|e| bad("max_deliveries", &e))?;
        let name = ConsumerName::parse("name", &r.name).map_err(|e| bad("name", &e))?;
        Ok(Consumer {
            spec: ConsumerSpec {
                name,
                topics,
                max_deliveries,
                backoff: Backoff { base: duration_ms(r.backoff_base_ms), max: duration_ms(r.backoff_max_ms) },
                ack_deadline: duration_ms(r.ack_deadline_ms),
                start_from,
                sink,
                dead_key_policy,
            },
            paused: r.paused,
            start_seq: r.start_seq,
            created_at: r.created_at,
            created_by: r.created_by,
        })
    }
}

/// A row of the deliveries table (one consumer's delivery of one message).
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryRecord {
    pub consumer: String,
    pub state: String,
    pub delivery_count: i64,
    pub available_at: DateTime<Utc>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub acked_at: Option<DateTime<Utc>>,
    pub dead_at: Option<DateTime<Utc>>,
}

impl TryFrom<DeliveryRecord> for DeliveryRow {
    type Error = StoreError;

    fn try_from(r: DeliveryRecord) -> Result<Self, StoreError> {
        Ok(DeliveryRow {
            state: DeliveryState::try_from(r.state.as_str())?,
            delivery_count: delivery_count(r.delivery_count)?,
            consumer: r.consumer,
            available_at: r.available_at,
            lease_expires_at: r.lease_expires_at,
            last_error: r.last_error,
            created_at: r.created_at,
            updated_at: r.updated_at,
            acked_at: r.acked_at,
            dead_at: r.dead_at,
        })
    }
}

/// A lease past its deadline joined with its consumer's retry policy.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpiredRecord {
    pub consumer: String,
    pub message_id: crate::domain::MessageId,
    pub delivery_count: i64,
    pub max_deliveries: i64,
    pub backoff_base_ms: i64,
    pub backoff_max_ms: i64,
}

impl TryFrom<ExpiredRecord> for ExpiredLease {
    type Error = StoreError;

    fn try_from(r: ExpiredRecord) -> Result<Self, StoreError> {
        Ok(ExpiredLease {
            consumer: ConsumerName::parse("consumer", &r.consumer)
                .map_err(|e| StoreError::InvalidValue(format!("stored delivery: {e}")))?,
            message_id: r.message_id,
            delivery_count: delivery_count(r.delivery_count)?,
            retry: RetryPolicy {
                max_deliveries: u32::try_from(r.max_deliveries).map_err(|e| {
                    StoreError::InvalidValue(format!("stored consumer {:?}: max_deliveries: {e}", r.consumer))
                })?,
                backoff: Backoff { base: duration_ms(r.backoff_base_ms), max: duration_ms(r.backoff_max_ms) },
            },
        })
    }
}

/// A message as the EARLIEST backfill needs it: enough to create its delivery rows.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageRef {
    pub message_id: crate::domain::MessageId,
    pub seq: i64,
    pub topic: String,
    pub ordering_key: Option<String>,
    pub available_at: DateTime<Utc>,
}

/// A delivery count as stored; a negative one is a corrupt row.
pub fn delivery_count(v: i64) -> Result<u32, StoreError> {
    u32::try_from(v).map_err(|_| StoreError::InvalidValue(format!("stored delivery_count {v} is out of range")))
}

/// Milliseconds as stored (never negative: the tables' CHECKs).
pub fn duration_ms(v: i64) -> Duration {
    Duration::from_millis(u64::try_from(v).unwrap_or(0))
}

/// A duration as stored, in milliseconds.
pub fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Message headers as stored (a JSON object of strings); a value that is not a string is kept
/// as its JSON text, anything but an object is no headers.
pub fn headers_from_json(v: serde_json::Value) -> BTreeMap<String, String> {
    match v {
        serde_json::Value::Object(map) => map
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect(),
        _ => BTreeMap::new(),
    }
}

/// Message headers as stored.
pub fn headers_to_json(h: &BTreeMap<String, String>) -> serde_json::Value {
    serde_json::Value::Object(h.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn consumer() -> ConsumerRecord {
        ConsumerRecord {
            name: "billing".into(),
            topics: vec!["orders.*".into()],
            max_deliveries: 5,
            backoff_base_ms: 1_000,
            backoff_max_ms: 60_000,
            ack_deadline_ms: 30_000,
            start_from: "new".into(),
            sink: None,
            dead_key_policy: "hold".into(),
            paused: false,
            start_seq: 7,
            created_at: Utc::now(),
            created_by: None,
        }
    }

    fn delivery(state: &str, count: i64) -> DeliveryRecord {
        let now = Utc::now();
        DeliveryRecord {
            consumer: "billing".into(),
            state: state.into(),
            delivery_count: count,
            available_at: now,
            lease_expires_at: None,
            last_error: None,
            created_at: now,
            updated_at: now,
            acked_at: None,
            dead_at: None,
        }
    }

    #[test]
    fn a_stored_consumer_decodes_to_its_spec() {
        let c = Consumer::try_from(consumer()).unwrap();
        assert_eq!(c.spec.name.as_str(), "billing");
        assert_eq!(c.spec.max_deliveries, 5);
        assert_eq!(c.spec.backoff.max, Duration::from_secs(60));
        assert_eq!(c.spec.start_from, StartFrom::New);
        assert_eq!(c.spec.dead_key_policy, DeadKeyPolicy::Hold);
        assert_eq!(c.start_seq, 7);
    }

    #[test]
    fn unknown_or_corrupt_consumer_values_are_errors_naming_the_field() {
        for (field, r) in [
            ("start_from", ConsumerRecord { start_from: "latest".into(), ..consumer() }),
            ("topics", ConsumerRecord { topics: vec!["".into()], ..consumer() }),
            ("max_deliveries", ConsumerRecord { max_deliveries: -1, ..consumer() }),
            ("sink", ConsumerRecord { sink: Some(serde_json::json!({"carrier_pigeon": {}})), ..consumer() }),
            ("name", ConsumerRecord { name: "".into(), ..consumer() }),
            ("dead_key_policy", ConsumerRecord { dead_key_policy: "park".into(), ..consumer() }),
        ] {
            let e = Consumer::try_from(r).unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn a_delivery_state_the_domain_does_not_know_is_an_error_not_pending() {
        assert_eq!(DeliveryRow::try_from(delivery("dead", 3)).unwrap().state, DeliveryState::Dead);
        let e = DeliveryRow::try_from(delivery("parked", 1)).unwrap_err().to_string();
        assert!(e.contains("parked"), "{e}");
        let e = DeliveryRow::try_from(delivery("pending", -1)).unwrap_err().to_string();
        assert!(e.contains("delivery_count -1"), "{e}");
    }

    #[test]
    fn headers_round_trip_and_odd_values_keep_their_json_text() {
        let h: BTreeMap<String, String> = [("a".to_owned(), "1".to_owned())].into();
        assert_eq!(headers_from_json(headers_to_json(&h)), h);
        let odd = headers_from_json(serde_json::json!({"n": 5, "s": "x"}));
        assert_eq!(odd["n"], "5");
        assert_eq!(odd["s"], "x");
        assert!(headers_from_json(serde_json::json!([1, 2])).is_empty());
    }
}

//! Values between Rust and SQLite's columns: times as microseconds, ids as text, JSON arrays
//! for `json_each`, and rows decoded into the store's records.
use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use crate::domain::MessageId;
use crate::store::records::{ConsumerRecord, DeliveryRecord, delivery_count, headers_from_json};
use crate::store::{Result, StoreError, StoredMessage};

pub(super) fn us(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

pub(super) fn time(v: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(v).unwrap_or_default()
}

pub(super) fn opt_time(v: Option<i64>) -> Option<DateTime<Utc>> {
    v.map(time)
}

pub(super) fn count(row: &SqliteRow, column: &str) -> Result<u32> {
    delivery_count(row.try_get(column)?)
}

pub(super) fn uuid(s: &str) -> Result<MessageId> {
    MessageId::parse("message_id", s).map_err(|e| StoreError::InvalidValue(format!("stored message id: {e}")))
}

pub(super) fn headers_from_text(s: &str) -> std::collections::BTreeMap<String, String> {
    headers_from_json(serde_json::from_str(s).unwrap_or_default())
}

pub(super) fn message_from_row(row: &SqliteRow) -> Result<StoredMessage> {
    Ok(StoredMessage {
        message_id: uuid(row.try_get("message_id")?)?,
        seq: row.try_get("seq")?,
        topic: row.try_get("topic")?,
        type_: row.try_get("type")?,
        payload: row.try_get("payload")?,
        headers: headers_from_text(row.try_get("headers")?),
        ordering_key: row.try_get("ordering_key")?,
        enqueued_at: time(row.try_get("enqueued_at")?),
        available_at: time(row.try_get("available_at")?),
        relayed_at: opt_time(row.try_get("relayed_at")?),
    })
}

pub(super) fn consumer_from_row(row: &SqliteRow) -> Result<ConsumerRecord> {
    let name: String = row.try_get("name")?;
    let json = |column: &str, text: &str| {
        serde_json::from_str::<serde_json::Value>(text)
            .map_err(|e| StoreError::InvalidValue(format!("stored consumer {name:?}: {column}: {e}")))
    };
    let topics = serde_json::from_value(json("topics", row.try_get("topics")?)?)
        .map_err(|e| StoreError::InvalidValue(format!("stored consumer {name:?}: topics: {e}")))?;
    let sink = row.try_get::<Option<&str>, _>("sink")?.map(|s| json("sink", s)).transpose()?;
    Ok(ConsumerRecord {
        topics,
        max_deliveries: row.try_get("max_deliveries")?,
        backoff_base_ms: row.try_get("backoff_base_ms")?,
        backoff_max_ms: row.try_get("backoff_max_ms")?,
        ack_deadline_ms: row.try_get("ack_deadline_ms")?,
        start_from: row.try_get("start_from")?,
        sink,
        dead_key_policy: row.try_get("dead_key_policy")?,
        paused: row.try_get::<i64, _>("paused")? != 0,
        start_seq: row.try_get("start_seq")?,
        created_at: time(row.try_get("created_at")?),
        created_by: row.try_get("created_by")?,
        name,
    })
}

pub(super) fn delivery_from_row(row: &SqliteRow) -> Result<DeliveryRecord> {
    Ok(DeliveryRecord {
        consumer: row.try_get("consumer")?,
        state: row.try_get("state")?,
        delivery_count: row.try_get("delivery_count")?,
        available_at: time(row.try_get("available_at")?),
        lease_expires_at: opt_time(row.try_get("lease_expires_at")?),
        last_error: row.try_get("last_error")?,
        created_at: time(row.try_get("created_at")?),
        updated_at: time(row.try_get("updated_at")?),
        acked_at: opt_time(row.try_get("acked_at")?),
        dead_at: opt_time(row.try_get("dead_at")?),
    })
}

pub(super) fn ids_json(ids: &[MessageId]) -> String {
    serde_json::Value::Array(ids.iter().map(|i| json!(i.to_string())).collect()).to_string()
}

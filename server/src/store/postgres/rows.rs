//! Rows of the statements' results decoded into the store's records.
use sqlx::Row;
use sqlx::postgres::PgRow;
use sqlx::types::Json;

use crate::domain::MessageId;
use crate::store::records::{ConsumerRecord, DeliveryRecord, delivery_count, headers_from_json};
use crate::store::{Result, StoredMessage};

pub(super) fn message_from_row(row: &PgRow) -> Result<StoredMessage> {
    Ok(StoredMessage {
        message_id: MessageId(row.try_get("message_id")?),
        seq: row.try_get("seq")?,
        topic: row.try_get("topic")?,
        type_: row.try_get("type")?,
        payload: row.try_get("payload")?,
        headers: headers_from_json(row.try_get::<Json<serde_json::Value>, _>("headers")?.0),
        ordering_key: row.try_get("ordering_key")?,
        enqueued_at: row.try_get("enqueued_at")?,
        available_at: row.try_get("available_at")?,
        relayed_at: row.try_get("relayed_at")?,
    })
}

pub(super) fn consumer_from_row(row: &PgRow) -> Result<ConsumerRecord> {
    Ok(ConsumerRecord {
        name: row.try_get("name")?,
        topics: row.try_get("topics")?,
        max_deliveries: i64::from(row.try_get::<i32, _>("max_deliveries")?),
        backoff_base_ms: row.try_get("backoff_base_ms")?,
        backoff_max_ms: row.try_get("backoff_max_ms")?,
        ack_deadline_ms: row.try_get("ack_deadline_ms")?,
        start_from: row.try_get("start_from")?,
        sink: row.try_get::<Option<Json<serde_json::Value>>, _>("sink")?.map(|s| s.0),
        dead_key_policy: row.try_get("dead_key_policy")?,
        paused: row.try_get("paused")?,
        start_seq: row.try_get("start_seq")?,
        created_at: row.try_get("created_at")?,
        created_by: row.try_get("created_by")?,
    })
}

pub(super) fn delivery_from_row(row: &PgRow) -> Result<DeliveryRecord> {
    Ok(DeliveryRecord {
        consumer: row.try_get("consumer")?,
        state: row.try_get("state")?,
        delivery_count: i64::from(row.try_get::<i32, _>("delivery_count")?),
        available_at: row.try_get("available_at")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        last_error: row.try_get("last_error")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        acked_at: row.try_get("acked_at")?,
        dead_at: row.try_get("dead_at")?,
    })
}

pub(super) fn count(row: &PgRow, column: &str) -> Result<u32> {
    delivery_count(i64::from(row.try_get::<i32, _>(column)?))
}

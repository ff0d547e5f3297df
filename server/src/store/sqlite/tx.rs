//! The write transaction that the layers above open through [`Store::begin`](crate::store::Store::begin).
use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::sqlite::SqliteConnection;
use sqlx::{Row, Sqlite, Transaction};

use super::rows::{consumer_from_row, ids_json, time, us, uuid};
use super::{consumer_find, message_insert_tx, q};
use crate::domain::{ConsumerSpec, MessageId};
use crate::store::records::{ConsumerRecord, MessageRef, ms};
use crate::store::{Enqueued, NewMessage, Result, StoreError, StoreTx};

/// A write transaction of this backend (see [`StoreTx`]).
pub struct SqliteTx(pub(super) Transaction<'static, Sqlite>);

#[async_trait::async_trait]
impl StoreTx for SqliteTx {
    async fn message_insert(&mut self, msg: &NewMessage, now: DateTime<Utc>) -> Result<Enqueued> {
        let conn: &mut SqliteConnection = &mut self.0;
        message_insert_tx(conn, msg, now).await
    }

    async fn message_page(&mut self, after: i64, limit: i64) -> Result<Vec<MessageRef>> {
        let conn: &mut SqliteConnection = &mut self.0;
        let rows = sqlx::query(q::MESSAGE_PAGE).bind(after).bind(limit).fetch_all(&mut *conn).await?;
        rows.iter()
            .map(|r| {
                Ok(MessageRef {
                    message_id: uuid(r.try_get("message_id")?)?,
                    seq: r.try_get("seq")?,
                    topic: r.try_get("topic")?,
                    ordering_key: r.try_get("ordering_key")?,
                    available_at: time(r.try_get("available_at")?),
                })
            })
            .collect()
    }

    async fn consumer_find(&mut self, name: &str) -> Result<Option<ConsumerRecord>> {
        consumer_find(&mut *self.0, name).await
    }

    async fn consumer_count(&mut self) -> Result<i64> {
        let conn: &mut SqliteConnection = &mut self.0;
        Ok(sqlx::query(q::CONSUMER_COUNT).fetch_one(conn).await?.try_get("n")?)
    }

    async fn consumer_insert(
        &mut self,
        spec: &ConsumerSpec,
        created_by: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<ConsumerRecord> {
        let conn: &mut SqliteConnection = &mut self.0;
        let topics: Vec<&str> = spec.topics.iter().map(|t| t.as_str()).collect();
        let sink = spec
            .sink
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(|e| StoreError::InvalidValue(format!("consumer {}: sink: {e}", spec.name)))?;
        let row = sqlx::query(q::CONSUMER_INSERT)
            .bind(spec.name.as_str())
            .bind(serde_json::to_string(&topics).unwrap_or_else(|_| "[]".to_owned()))
            .bind(i64::from(spec.max_deliveries))
            .bind(ms(spec.backoff.base))
            .bind(ms(spec.backoff.max))
            .bind(ms(spec.ack_deadline))
            .bind(spec.start_from.as_str())
            .bind(us(now))
            .bind(sink)
            .bind(spec.dead_key_policy.as_str())
            .bind(created_by)
            .fetch_one(conn)
            .await?;
        consumer_from_row(&row)
    }

    /// Its deliveries go by cascade (foreign keys are on).
    async fn consumer_delete(&mut self, name: &str) -> Result<bool> {
        let conn: &mut SqliteConnection = &mut self.0;
        let done = sqlx::query(q::CONSUMER_DELETE).bind(name).execute(conn).await?;
        Ok(done.rows_affected() > 0)
    }

    /// Inserts pending rows from a JSON array (`json_each`), one statement for the page.
    async fn delivery_insert_pending(
        &mut self,
        consumer: &str,
        messages: &[MessageRef],
        now: DateTime<Utc>,
    ) -> Result<u64> {
        let conn: &mut SqliteConnection = &mut self.0;
        if messages.is_empty() {
            return Ok(0);
        }
        let rows: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| json!({"m": m.message_id.to_string(), "s": m.seq, "k": m.ordering_key, "a": us(m.available_at)}))
            .collect();
        let done = sqlx::query(q::DELIVERY_INSERT_PENDING)
            .bind(consumer)
            .bind(serde_json::Value::Array(rows).to_string())
            .bind(us(now))
            .execute(conn)
            .await?;
        Ok(done.rows_affected())
    }

    /// Upserts: bypasses the inbox on purpose and restarts the delivery count.
    async fn delivery_replay(&mut self, consumer: &str, ids: &[MessageId], now: DateTime<Utc>) -> Result<u64> {
        let conn: &mut SqliteConnection = &mut self.0;
        // A key held by a dead message flows again once that message is due again: it is the
        // key's head, so the key resumes with it, in order.
        sqlx::query(q::HELD_KEY_DELETE_OF_MESSAGES).bind(consumer).bind(ids_json(ids)).execute(&mut *conn).await?;
        let done =
            sqlx::query(q::DELIVERY_REPLAY).bind(consumer).bind(ids_json(ids)).bind(us(now)).execute(conn).await?;
        Ok(done.rows_affected())
    }

    async fn held_key_delete(&mut self, consumer: &str, ordering_key: &str) -> Result<Option<MessageId>> {
        let conn: &mut SqliteConnection = &mut self.0;
        let id: Option<String> =
            sqlx::query_scalar(q::HELD_KEY_DELETE).bind(consumer).bind(ordering_key).fetch_optional(conn).await?;
        id.as_deref().map(uuid).transpose()
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        Ok(self.0.commit().await?)
    }
}

//! The write transaction that the layers above open through [`Store::begin`](crate::store::Store::begin).
use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, Postgres, Row, Transaction};
use uuid::Uuid;

use super::rows::consumer_from_row;
use super::seqs::seq_runs;
use super::{consumer_find, message_insert, q};
use crate::domain::{ConsumerSpec, MessageId};
use crate::store::records::{ConsumerRecord, MessageRef, ms};
use crate::store::{Enqueued, NewMessage, Result, StoreTx};

/// A write transaction of this backend (see [`StoreTx`]).
pub struct PgTx(pub(super) Transaction<'static, Postgres>);

#[async_trait::async_trait]
impl StoreTx for PgTx {
    async fn message_insert(&mut self, msg: &NewMessage, now: DateTime<Utc>) -> Result<Enqueued> {
        let conn: &mut PgConnection = &mut self.0;
        message_insert(conn, msg, Some(now)).await
    }

    async fn message_page(&mut self, after: i64, limit: i64) -> Result<Vec<MessageRef>> {
        let conn: &mut PgConnection = &mut self.0;
        let rows = sqlx::query(q::MESSAGE_PAGE).bind(after).bind(limit).fetch_all(&mut *conn).await?;
        rows.iter()
            .map(|r| {
                Ok(MessageRef {
                    message_id: MessageId(r.try_get("message_id")?),
                    seq: r.try_get("seq")?,
                    topic: r.try_get("topic")?,
                    ordering_key: r.try_get("ordering_key")?,
                    available_at: r.try_get("available_at")?,
                })
            })
            .collect()
    }

    async fn consumer_find(&mut self, name: &str) -> Result<Option<ConsumerRecord>> {
        consumer_find(&mut *self.0, name).await
    }

    async fn consumer_count(&mut self) -> Result<i64> {
        let conn: &mut PgConnection = &mut self.0;
        Ok(sqlx::query(q::CONSUMER_COUNT).fetch_one(conn).await?.try_get("n")?)
    }

    async fn consumer_insert(
        &mut self,
        spec: &ConsumerSpec,
        created_by: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<ConsumerRecord> {
        let conn: &mut PgConnection = &mut self.0;
        let topics: Vec<&str> = spec.topics.iter().map(|t| t.as_str()).collect();
        let row = sqlx::query(q::CONSUMER_INSERT)
            .bind(spec.name.as_str())
            .bind(&topics)
            .bind(i32::try_from(spec.max_deliveries).unwrap_or(i32::MAX))
            .bind(ms(spec.backoff.base))
            .bind(ms(spec.backoff.max))
            .bind(ms(spec.ack_deadline))
            .bind(spec.start_from.as_str())
            .bind(now)
            .bind(spec.sink.as_ref().map(Json))
            .bind(spec.dead_key_policy.as_str())
            .bind(created_by)
            .fetch_one(conn)
            .await?;
        consumer_from_row(&row)
    }

    /// Its delivery rows go by cascade; its ranges are deleted here.
    async fn consumer_delete(&mut self, name: &str) -> Result<bool> {
        let conn: &mut PgConnection = &mut self.0;
        let done = sqlx::query(q::CONSUMER_DELETE).bind(name).execute(conn).await?;
        Ok(done.rows_affected() > 0)
    }

    /// Inserts pending rows from arrays (`unnest`), one statement for the page.
    async fn delivery_insert_pending(
        &mut self,
        consumer: &str,
        messages: &[MessageRef],
        now: DateTime<Utc>,
    ) -> Result<u64> {
        let conn: &mut PgConnection = &mut self.0;
        if messages.is_empty() {
            return Ok(0);
        }
        let ids: Vec<Uuid> = messages.iter().map(|m| m.message_id.0).collect();
        let seqs: Vec<i64> = messages.iter().map(|m| m.seq).collect();
        let keys: Vec<Option<&str>> = messages.iter().map(|m| m.ordering_key.as_deref()).collect();
        let available: Vec<DateTime<Utc>> = messages.iter().map(|m| m.available_at).collect();
        let done = sqlx::query(q::DELIVERY_INSERT_PENDING)
            .bind(consumer)
            .bind(&ids)
            .bind(&seqs)
            .bind(&keys)
            .bind(&available)
            .bind(now)
            .execute(conn)
            .await?;
        Ok(done.rows_affected())
    }

    /// Upserts: bypasses the inbox on purpose and restarts the delivery count. The replayed
    /// delivery's row becomes its one place: its seq leaves the consumer's ranges (a leased one
    /// only where a row already decided it) in the same transaction, so that no
    /// reader counts it twice (docs/delivery-states.md, T5, T20–T22).
    async fn delivery_replay(&mut self, consumer: &str, ids: &[MessageId], now: DateTime<Utc>) -> Result<u64> {
        let conn: &mut PgConnection = &mut self.0;
        let ids: Vec<Uuid> = ids.iter().map(|m| m.0).collect();
        // A relay pass that has claimed some of these messages and not yet written their
        // deliveries read this consumer's `backfill_seq` and rows before this replay wrote them:
        // it would put a seq in a range that this replay gives a row too. Relay passes and
        // replays take turns.
        sqlx::query(q::RELAY_TURN_TAKE).execute(&mut *conn).await?;
        let seqs: Vec<i64> = sqlx::query_scalar(q::MESSAGE_SEQS_OF_IDS).bind(&ids).fetch_all(&mut *conn).await?;
        if seqs.is_empty() {
            return Ok(0);
        }
        let (lo, hi) = seq_runs(seqs.into_iter());
        // The ranges that hold any of them, locked in the order `outbox.ack_seqs` locks them
        // (pending, then leased ranges): a lease cannot move one of these seqs out of a pending
        // range, nor an ack out of a leased one, between the statement below reading the ranges
        // and this transaction's end. The statement below takes its snapshot after these locks
        // are held.
        for state in ["pending", "leased"] {
            sqlx::query(q::DELIVERY_RANGES_LOCK_HOLDING)
                .bind(consumer)
                .bind(&lo)
                .bind(&hi)
                .bind(state)
                .execute(&mut *conn)
                .await?;
        }
        let done: i64 =
            sqlx::query_scalar(q::DELIVERY_REPLAY).bind(consumer).bind(&ids).bind(now).fetch_one(&mut *conn).await?;
        Ok(u64::try_from(done).unwrap_or(0))
    }

    async fn held_key_delete(&mut self, consumer: &str, ordering_key: &str) -> Result<Option<MessageId>> {
        let conn: &mut PgConnection = &mut self.0;
        let id: Option<Uuid> =
            sqlx::query_scalar(q::HELD_KEY_DELETE).bind(consumer).bind(ordering_key).fetch_optional(conn).await?;
        Ok(id.map(MessageId))
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        Ok(self.0.commit().await?)
    }
}

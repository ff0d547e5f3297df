//! The ready heads of a consumer's ordering keys, which a lease takes with the unkeyed due
//! deliveries.
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::SqliteConnection;

use super::q;
use super::rows::us;
use crate::domain::ConsumerName;
use crate::store::Result;

/// The message ids of up to `limit` ready heads of a consumer's ordering keys, visiting keys in
/// byte order from the first after `keys_after` and wrapping around. A head (the lowest
/// unfinished seq of its key) is ready when it is pending and due, nothing of its key is in
/// flight and no earlier message of its key is still unrelayed. One index probe per key visited:
/// the messages blocked behind a head are never read. Statements on the caller's (write)
/// transaction; each is a few microseconds in process.
pub(super) async fn ready_key_heads(
    conn: &mut SqliteConnection,
    consumer: &ConsumerName,
    keys_after: &str,
    limit: i64,
    now: DateTime<Utc>,
) -> Result<Vec<String>> {
    let mut ready = Vec::new();
    let limit = usize::try_from(limit).unwrap_or(0);
    // (lower bound exclusive, upper bound inclusive): the keys after the cursor, then the rest.
    for upper in [None, Some(keys_after)] {
        let mut after: Option<String> = if upper.is_none() { Some(keys_after.to_owned()) } else { None };
        while ready.len() < limit {
            // One statement per bound shape, so that each is an index range (an `OR` is not).
            let sql = match (&after, upper) {
                (Some(_), None) => q::KEY_HEAD_AFTER,
                (None, Some(_)) => q::KEY_HEAD_UP_TO,
                _ => q::KEY_HEAD_BETWEEN,
            };
            let head = sqlx::query(sql)
                .bind(consumer.as_str())
                .bind(after.as_deref())
                .bind(upper)
                .bind(us(now))
                .fetch_optional(&mut *conn)
                .await?;
            let Some(head) = head else { break };
            let key: String = head.try_get("ordering_key")?;
            if head.try_get::<bool, _>("due")? {
                let blocked: bool = sqlx::query_scalar(q::KEY_HELD_OR_BLOCKED)
                    .bind(consumer.as_str())
                    .bind(&key)
                    .bind(head.try_get::<i64, _>("seq")?)
                    .fetch_one(&mut *conn)
                    .await?;
                if !blocked {
                    ready.push(head.try_get("message_id")?);
                }
            }
            after = Some(key);
        }
    }
    Ok(ready)
}

//! Every SQL statement of the client, read from the client contract (`contract/sql`). On
//! PostgreSQL the transactional ack goes through the SQL function that outboxd's migrations
//! install; enqueue is one plain INSERT (the SQL function `outbox.enqueue` does the same for
//! other languages, a little slower). SQLite has no stored functions, so there the ack and the
//! enqueue are statements (documented in docs/sql-api.md).
use futures::future::BoxFuture;
use sqlx::types::Json;
use sqlx::{Executor, Postgres, Row, Sqlite};
use tracing::Instrument as _;
use uuid::Uuid;

use crate::{ClientError, Enqueued, Message};

// The statements of the client contract (contract/sql, ADR 0084), which the Python and
// TypeScript clients and docs/sql-api.md share: the parameters are bound in the order each
// file's `-- parameters:` line names them.
const PG_ACK: &str = include_str!("../../contract/sql/postgres-ack.sql");
const PG_INSERT: &str = include_str!("../../contract/sql/postgres-insert.sql");
const SQLITE_ACK: &str = include_str!("../../contract/sql/sqlite-ack.sql");
const SQLITE_ENQUEUE_RETURNING: &str = include_str!("../../contract/sql/sqlite-enqueue-returning.sql");

/// A database outboxd can run on: PostgreSQL, or the embedded SQLite file.
pub trait OutboxDatabase: sqlx::Database {
    #[doc(hidden)]
    fn enqueue_on<'e, E>(exec: E, msg: &'e Message, headers: Headers) -> BoxFuture<'e, Result<Enqueued, ClientError>>
    where
        E: Executor<'e, Database = Self> + 'e;

    #[doc(hidden)]
    fn ack_on<'e, E>(exec: E, consumer: &'e str, message_id: Uuid) -> BoxFuture<'e, Result<bool, ClientError>>
    where
        E: Executor<'e, Database = Self> + 'e;
}

impl OutboxDatabase for Postgres {
    fn enqueue_on<'e, E>(exec: E, msg: &'e Message, headers: Headers) -> BoxFuture<'e, Result<Enqueued, ClientError>>
    where
        E: Executor<'e, Database = Self> + 'e,
    {
        Box::pin(pg_enqueue(exec, msg, headers))
    }

    fn ack_on<'e, E>(exec: E, consumer: &'e str, message_id: Uuid) -> BoxFuture<'e, Result<bool, ClientError>>
    where
        E: Executor<'e, Database = Self> + 'e,
    {
        Box::pin(async move { Ok(sqlx::query_scalar(PG_ACK).bind(consumer).bind(message_id).fetch_one(exec).await?) })
    }
}

impl OutboxDatabase for Sqlite {
    fn enqueue_on<'e, E>(exec: E, msg: &'e Message, headers: Headers) -> BoxFuture<'e, Result<Enqueued, ClientError>>
    where
        E: Executor<'e, Database = Self> + 'e,
    {
        Box::pin(sqlite_enqueue(exec, msg, headers))
    }

    fn ack_on<'e, E>(exec: E, consumer: &'e str, message_id: Uuid) -> BoxFuture<'e, Result<bool, ClientError>>
    where
        E: Executor<'e, Database = Self> + 'e,
    {
        Box::pin(async move {
            let now = chrono::Utc::now().timestamp_micros();
            let done =
                sqlx::query(SQLITE_ACK).bind(consumer).bind(message_id.to_string()).bind(now).execute(exec).await?;
            Ok(done.rows_affected() == 1)
        })
    }
}

/// The headers as stored: a JSON object of strings.
#[doc(hidden)]
pub type Headers = serde_json::Map<String, serde_json::Value>;

/// Enqueues `msg` on the caller's executor, PostgreSQL or SQLite: pass `&mut *tx` to make it
/// part of your own transaction, so the message exists if and only if that transaction
/// commits. Enqueueing an existing `message_id` succeeds with `duplicate = true` and does not
/// abort the transaction.
///
/// Runs in an `outbox.enqueue` span whose trace context is stored in the message's
/// `traceparent` header (see [`crate::trace`]), unless the message carries one already.
pub async fn enqueue<'e, DB, E>(exec: E, msg: &'e Message) -> Result<Enqueued, ClientError>
where
    DB: OutboxDatabase,
    E: Executor<'e, Database = DB> + 'e,
{
    let span = tracing::info_span!("outbox.enqueue", otel.kind = "producer", topic = %msg.topic, r#type = %msg.type_);
    let mut headers = msg.headers.clone();
    crate::trace::inject(&span, &mut headers);
    msg.validate()?;
    crate::message::check_headers(&headers)?;
    let headers: Headers = headers.into_iter().map(|(k, v)| (k, serde_json::Value::String(v))).collect();
    DB::enqueue_on(exec, msg, headers).instrument(span).await
}

/// SQLite's enqueue, in one statement (a generic executor can run only one): the contract's
/// `sqlite-enqueue-returning.sql`, which tells a duplicate by its `enqueued_at`.
async fn sqlite_enqueue<'e, E>(exec: E, msg: &'e Message, headers: Headers) -> Result<Enqueued, ClientError>
where
    E: Executor<'e, Database = Sqlite> + 'e,
{
    msg.validate()?;
    let id = msg.message_id.unwrap_or_else(Uuid::now_v7);
    let now = chrono::Utc::now().timestamp_micros();
    let available = msg.delay.map(|d| now.saturating_add(i64::try_from(d.as_micros()).unwrap_or(i64::MAX)));
    let headers = serde_json::Value::Object(headers).to_string();
    let row = sqlx::query(SQLITE_ENQUEUE_RETURNING)
        .bind(id.to_string())
        .bind(&msg.topic)
        .bind(&msg.type_)
        .bind(&msg.payload)
        .bind(headers)
        .bind(msg.ordering_key.as_deref())
        .bind(now)
        .bind(available)
        .fetch_one(exec)
        .await?;
    let enqueued_at: i64 = row.try_get("enqueued_at")?;
    Ok(Enqueued { message_id: id, seq: row.try_get("seq")?, duplicate: enqueued_at != now })
}

/// PostgreSQL's enqueue: one plain INSERT (the contract's `postgres-insert.sql`), the cheapest
/// statement a producer's commit can carry (a quarter faster than calling
/// `outbox.enqueue_message`, which does the same checks in PL/pgSQL for other languages; the
/// table's CHECK constraints hold either way). Its no-op `DO UPDATE` sets a column no key
/// covers, so the row lock it takes does not block foreign-key checks.
async fn pg_enqueue<'e, E>(exec: E, msg: &'e Message, headers: Headers) -> Result<Enqueued, ClientError>
where
    E: Executor<'e, Database = Postgres> + 'e,
{
    msg.validate()?;
    let id = msg.message_id.unwrap_or_else(Uuid::now_v7);
    let delay_ms = msg.delay.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let row = sqlx::query(PG_INSERT)
        .bind(id)
        .bind(&msg.topic)
        .bind(&msg.type_)
        .bind(&msg.payload)
        .bind(Json(serde_json::Value::Object(headers)))
        .bind(msg.ordering_key.as_deref())
        .bind(delay_ms)
        .fetch_one(exec)
        .await?;
    // The same refusal as `outbox.same_message`: an id names one message, and the refusal
    // names no field, so that it cannot be used to guess the stored one's topic or type.
    if row.try_get::<bool, _>("differs")? {
        return Err(ClientError::MessageIdTaken(format!(
            "outbox.enqueue: message_id {id} exists already with a different topic, type or payload"
        )));
    }
    Ok(Enqueued { message_id: id, seq: row.try_get("seq")?, duplicate: row.try_get("is_duplicate")? })
}

/// Transactional ack, for consumers that share outboxd's database: call it inside the
/// transaction that performs the effect, so effect and ack commit together or not at all.
///
/// `Ok(())` when this call acked the delivery. [`ClientError::AlreadyAcked`] when there is
/// nothing for it to ack: the delivery was acked already (another delivery of the message got
/// there first), is dead (only a replay delivers it again), or there is no delivery of the
/// message to this consumer (unknown, not its topics, or not relayed yet: that delivery comes
/// later). Propagate it (roll back) and the [`Subscriber`](crate::Subscriber) treats it as done:
/// it never leaves a delivery that can still be delivered without its effect (`outbox.ack` in
/// docs/sql-api.md; on PostgreSQL the answer is decided from one consistent view, ADR 0052).
pub async fn ack_in_tx<'e, DB, E>(exec: E, consumer: &'e str, message_id: Uuid) -> Result<(), ClientError>
where
    DB: OutboxDatabase,
    E: Executor<'e, Database = DB> + 'e,
{
    let acked = DB::ack_on(exec, consumer, message_id).await?;
    if acked { Ok(()) } else { Err(ClientError::AlreadyAcked { consumer: consumer.to_owned(), message_id }) }
}

/// The inbox for a consumer that keeps its own PostgreSQL database: a table
/// `outbox_inbox (consumer, message_id)` in that database, written in the same transaction as
/// the effect, turns redeliveries into no second effect.
#[derive(Debug, Clone, Copy, Default)]
pub struct Inbox;

impl Inbox {
    /// Creates the inbox table if it does not exist.
    pub async fn install<'e, E>(exec: E) -> Result<(), ClientError>
    where
        E: Executor<'e, Database = Postgres>,
    {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS outbox_inbox (
                 consumer     text        NOT NULL,
                 message_id   uuid        NOT NULL,
                 processed_at timestamptz NOT NULL DEFAULT now(),
                 PRIMARY KEY (consumer, message_id))",
        )
        .execute(exec)
        .await?;
        Ok(())
    }

    /// Records `(consumer, message_id)` inside the caller's transaction. `true`: first time,
    /// perform the effect and commit. `false`: already processed, skip the effect and ack.
    /// Two concurrent deliveries of one message serialise on the primary key: the second
    /// waits for the first transaction and then sees `false`.
    pub async fn claim<'e, E>(exec: E, consumer: &str, message_id: Uuid) -> Result<bool, ClientError>
    where
        E: Executor<'e, Database = Postgres>,
    {
        let done =
            sqlx::query("INSERT INTO outbox_inbox (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING")
                .bind(consumer)
                .bind(message_id)
                .execute(exec)
                .await?;
        Ok(done.rows_affected() == 1)
    }
}

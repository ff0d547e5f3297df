//! `outbox-client`: the producer and consumer side of outboxd.
//!
//! # Layout
//!
//! - [`message`]: [`Message`], what a producer enqueues, and [`Enqueued`], what it gets back.
//! - [`store`]: every SQL statement of the client: [`enqueue`] in the caller's own
//!   transaction, the transactional ack, and the inbox for consumers with their own database.
//! - [`subscriber`]: [`Subscriber`], runs a handler per delivery with bounded concurrency,
//!   acks on `Ok`, nacks on `Err`, reconnects with backoff, stops gracefully.
//! - [`trace`]: the W3C trace context carried in message headers.
//! - [`grpc`]: connecting to outboxd (TLS, tokens, client certificates: [`Credentials`]): the
//!   `Enqueue` RPC and the admin client.
//!
//! # Producing inside your transaction
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let mut tx = pool.begin().await?;
//! // ... your own writes on &mut *tx ...
//! let msg = outbox_client::Message::new("orders.created", "OrderCreated", br#"{"id":42}"#.to_vec());
//! outbox_client::enqueue(&mut *tx, &msg).await?;
//! tx.commit().await?; // the message exists if and only if this commit succeeds
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub mod grpc;
pub mod message;
pub mod store;
pub mod subscriber;
pub mod trace;

pub use grpc::Credentials;
pub use message::{Enqueued, Message};
pub use store::{Inbox, OutboxDatabase, ack_in_tx, enqueue};
pub use subscriber::{Delivery, HandlerError, Subscriber, SubscriberConfig};

pub use outbox_proto::v1 as pb;

/// Errors of the client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The database rejected the message (bad topic, empty type, ...); the text says which.
    /// On SQLite the text is the trigger's sentence naming the column.
    #[error("invalid message: {0}")]
    InvalidMessage(String),
    /// A transactional ack found nothing to ack: the delivery was acked already (another
    /// delivery of the same message got there first), is dead, or does not exist for this
    /// consumer (yet). Roll back the effect: it was made already, or its delivery comes later.
    #[error("message {message_id} was already acked by consumer {consumer:?}")]
    AlreadyAcked { consumer: String, message_id: uuid::Uuid },
    /// The message_id names another message already (a different topic, type or payload): an
    /// id names one message; enqueue this one under a new id. The text names the field.
    #[error("{0}")]
    MessageIdTaken(String),
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    #[error("cannot connect to outboxd at {endpoint}: {source}")]
    Connect { endpoint: String, source: tonic::transport::Error },
    #[error("outboxd answered {}: {}", .0.code(), .0.message())]
    Status(#[from] tonic::Status),
    #[error("invalid endpoint {0:?}")]
    Endpoint(String),
    /// A token or TLS file that cannot be used (unreadable, empty, incomplete).
    #[error("credentials: {0}")]
    Credentials(String),
}

impl From<sqlx::Error> for ClientError {
    fn from(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &e
            && db.message().contains("message_id")
            && db.message().contains("exists already with a different")
        {
            return ClientError::MessageIdTaken(db.message().to_owned());
        }
        if let sqlx::Error::Database(db) = &e
            && (matches!(db.kind(), sqlx::error::ErrorKind::CheckViolation | sqlx::error::ErrorKind::NotNullViolation)
                || db.code().is_some_and(|c| c.starts_with("22")))
        {
            return ClientError::InvalidMessage(db.message().to_owned());
        }
        ClientError::Database(e)
    }
}

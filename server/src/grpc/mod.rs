//! The gRPC edge: services, conversion between wire (`pb`) and domain types, and the one place
//! that turns errors into `tonic::Status`.
pub mod admin;
pub mod auth;
pub mod convert;
pub mod outbox;
pub mod stream;

#[cfg(test)]
mod hostile_tests;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::domain::InvalidField;
use crate::store::StoreError;

/// `INVALID_ARGUMENT` naming the field, with a `BadRequest` detail for clients that read them.
pub fn invalid(e: InvalidField) -> Status {
    Status::with_error_details(
        Code::InvalidArgument,
        e.to_string(),
        ErrorDetails::with_bad_request_violation(e.field, e.reason),
    )
}

/// Store errors as statuses. Internal failures are logged here and reported without details.
pub fn store_status(e: StoreError) -> Status {
    match e {
        StoreError::ConsumerNotFound(name) => consumer_not_found(&name),
        StoreError::MessageNotFound(_) => Status::not_found(e.to_string()),
        StoreError::ConsumerConflict { .. } | StoreError::MessageConflict(_) => Status::already_exists(e.to_string()),
        StoreError::BeyondRetention(_) => Status::failed_precondition(e.to_string()),
        StoreError::ConsumerLimit { .. } => {
            crate::limits::refused("max_consumers");
            Status::resource_exhausted(e.to_string())
        }
        StoreError::InvalidValue(msg) => Status::invalid_argument(msg),
        StoreError::ConnectTimeout(_) => {
            tracing::warn!(error = %e, "database unavailable");
            Status::unavailable("the database is unavailable; retry")
        }
        StoreError::Database(ref inner) if is_unavailable(inner) => {
            tracing::warn!(error = %e, "database unavailable");
            Status::unavailable("the database is unavailable; retry")
        }
        StoreError::Database(_) | StoreError::Migrate(_) | StoreError::Locked(_) | StoreError::Io { .. } => {
            tracing::error!(error = %e, "internal error");
            Status::internal("internal error; see the outboxd log")
        }
    }
}

/// `NOT_FOUND` for a consumer that does not exist, saying how to create one.
pub fn consumer_not_found(name: &str) -> Status {
    Status::not_found(format!(
        "consumer {name:?} not found: create it first (`outboxctl consumers create {name} --topic TOPIC`, or the \
         CreateConsumer RPC)"
    ))
}

/// Failures a retry can cure: connection loss, an exhausted pool, a PostgreSQL shutdown,
/// serialization failure or deadlock (class 40), or a busy/locked SQLite file (codes 5, 6).
fn is_unavailable(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed)
        || matches!(e, sqlx::Error::Database(db) if db.code().is_some_and(|c| {
            c.starts_with("57P") || c.starts_with("08") || c.starts_with("40")
                // SQLITE_BUSY, SQLITE_LOCKED and their extended codes
                || matches!(c.as_ref(), "5" | "6" | "261" | "262" | "517")
        }))
}

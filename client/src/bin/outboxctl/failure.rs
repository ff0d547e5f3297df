//! How outboxctl fails: the exit code of each failure, the cause it names, and a confirmation
//! refused.
use std::io::{BufRead as _, IsTerminal as _, Write as _};

use anyhow::Result;
use tonic::Code;

/// A failure with the exit code it maps to.
pub(crate) struct Failure {
    pub(crate) code: u8,
    pub(crate) message: String,
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        if let Some(status) = e.downcast_ref::<tonic::Status>() {
            return status_failure(status);
        }
        if let Some(outbox_client::ClientError::Status(status)) = e.downcast_ref::<outbox_client::ClientError>() {
            return status_failure(status);
        }
        if let Some(outbox_client::ClientError::Credentials(_)) = e.downcast_ref::<outbox_client::ClientError>() {
            return Failure { code: 2, message: format!("{e:#}") };
        }
        if let Some(outbox_client::ClientError::Connect { .. } | outbox_client::ClientError::Endpoint(_)) =
            e.downcast_ref::<outbox_client::ClientError>()
        {
            return Failure { code: 5, message: format!("{e:#}") };
        }
        Failure { code: 1, message: format!("{e:#}") }
    }
}

pub(crate) fn status_failure(s: &tonic::Status) -> Failure {
    let code = match s.code() {
        Code::NotFound => 3,
        Code::InvalidArgument | Code::AlreadyExists | Code::FailedPrecondition => 4,
        Code::Unavailable | Code::DeadlineExceeded => 5,
        Code::Unauthenticated | Code::PermissionDenied => 7,
        _ => 1,
    };
    Failure { code, message: format!("{:?}: {}", s.code(), s.message()) }
}

/// The innermost cause of an error, once (transport errors repeat their own text in layers),
/// as a cause in a sentence: `connection refused`, without the `(os error 111)`.
pub(crate) fn root_cause(e: &dyn std::error::Error) -> String {
    let mut last = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        last = s.to_string();
        source = s.source();
    }
    if let Some(i) = last.rfind(" (os error ")
        && last.ends_with(')')
    {
        last.truncate(i);
    }
    let mut chars = last.chars();
    match (chars.next(), chars.next()) {
        (Some(first), Some(second)) if first.is_uppercase() && second.is_lowercase() => {
            first.to_lowercase().chain(last[first.len_utf8()..].chars()).collect()
        }
        _ => last,
    }
}

pub(crate) fn confirm(question: &str, yes: bool) -> Result<(), Failure> {
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(Failure { code: 6, message: format!("{question} Refusing without a terminal; pass --yes") });
    }
    print!("{question} [y/N] ");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    if matches!(line.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err(Failure { code: 6, message: "not confirmed".to_owned() })
    }
}

//! `outboxd healthcheck`: asks a running outboxd for its gRPC health status and exits 0 only if
//! it is `SERVING`.
//!
//! The container image has no shell and no other gRPC client, so a health check that runs inside
//! it (compose's `healthcheck`, a Kubernetes `exec` probe) needs the binary itself. It speaks
//! plaintext gRPC only: an outboxd that serves TLS is checked by the platform's own prober.
use std::time::Duration;

use clap::Args;
use tonic::transport::Endpoint;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

#[derive(Debug, Clone, Args)]
pub struct HealthcheckArgs {
    /// The outboxd to ask: HOST:PORT or http://HOST:PORT (plaintext gRPC).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub addr: String,
    /// The service to ask about: "" (the default) is the whole server, or `outbox.v1.Outbox`,
    /// `outbox.v1.OutboxAdmin`.
    #[arg(long, default_value = "")]
    pub service: String,
    /// Give up after this long (connecting and asking together).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// Why a health check did not pass; each names the address asked.
#[derive(Debug, thiserror::Error)]
pub enum HealthcheckError {
    #[error("--addr {addr:?} {reason}")]
    Addr { addr: String, reason: &'static str },
    #[error("cannot reach outboxd at {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("outboxd at {addr} did not answer the health check of {service:?}: {code:?}: {message}")]
    Rpc { addr: String, service: String, code: tonic::Code, message: String },
    #[error("outboxd at {addr} reports {service:?} as {status}")]
    NotServing { addr: String, service: String, status: &'static str },
    #[error("outboxd at {addr} did not answer within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
}

/// Asks the server at `args.addr` once; `Ok` only for `SERVING`.
pub async fn check(args: &HealthcheckArgs) -> Result<(), HealthcheckError> {
    let addr = endpoint_uri(&args.addr)?;
    match tokio::time::timeout(args.timeout, ask(&addr, &args.service, args.timeout)).await {
        Ok(result) => result,
        Err(_) => Err(HealthcheckError::Timeout { addr, timeout: args.timeout }),
    }
}

async fn ask(addr: &str, service: &str, timeout: Duration) -> Result<(), HealthcheckError> {
    let endpoint = Endpoint::from_shared(addr.to_owned())
        .map_err(|_| HealthcheckError::Addr { addr: addr.to_owned(), reason: "is not a valid address" })?
        .connect_timeout(timeout)
        .timeout(timeout);
    let channel =
        endpoint.connect().await.map_err(|source| HealthcheckError::Connect { addr: addr.to_owned(), source })?;
    let response =
        HealthClient::new(channel).check(HealthCheckRequest { service: service.to_owned() }).await.map_err(|s| {
            HealthcheckError::Rpc {
                addr: addr.to_owned(),
                service: service.to_owned(),
                code: s.code(),
                message: s.message().to_owned(),
            }
        })?;
    match ServingStatus::try_from(response.into_inner().status) {
        Ok(ServingStatus::Serving) => Ok(()),
        other => Err(HealthcheckError::NotServing {
            addr: addr.to_owned(),
            service: service.to_owned(),
            status: other.map_or("an unknown status", |s| s.as_str_name()),
        }),
    }
}

/// The error and its causes on one line, each said once (transport errors repeat themselves).
pub fn report(e: &HealthcheckError) -> String {
    let mut line = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.ends_with(&text) {
            line = format!("{line}: {text}");
        }
        source = cause.source();
    }
    line
}

/// `HOST:PORT` or `http://HOST:PORT`; TLS (`https://`) is refused by name rather than failing
/// later with a transport error.
fn endpoint_uri(addr: &str) -> Result<String, HealthcheckError> {
    if addr.starts_with("https://") {
        return Err(HealthcheckError::Addr {
            addr: addr.to_owned(),
            reason: "uses TLS, which healthcheck does not speak: check a plaintext listener",
        });
    }
    if addr.starts_with("http://") {
        Ok(addr.to_owned())
    } else if addr.contains("://") {
        Err(HealthcheckError::Addr { addr: addr.to_owned(), reason: "must be HOST:PORT or http://HOST:PORT" })
    } else {
        Ok(format!("http://{addr}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_without_a_scheme_are_plaintext_and_tls_is_refused_by_name() {
        assert_eq!(endpoint_uri("127.0.0.1:50051").ok().as_deref(), Some("http://127.0.0.1:50051"));
        assert_eq!(endpoint_uri("http://outboxd:50051").ok().as_deref(), Some("http://outboxd:50051"));
        let tls = endpoint_uri("https://outboxd:50051").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(tls.contains("https://outboxd:50051") && tls.contains("TLS"), "{tls}");
        assert!(endpoint_uri("unix:///run/outboxd.sock").is_err());
    }
}

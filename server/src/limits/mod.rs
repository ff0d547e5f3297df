//! What any one client can make outboxd hold (ADR 0023): the fixed bounds on a message's and a
//! consumer's shape, which the database enforces too, and the per-process resource limits, which
//! are flags — streams per process and per connection, and unary requests in progress, beyond
//! which requests are shed at once instead of queueing without bound.
//!
//! One file per limit that holds places: the byte budget, open streams, unary calls in progress,
//! health and reflection streams, request-body deadlines.
use std::net::SocketAddr;
use std::time::Duration;

use tonic::codegen::http;

mod body_deadline;
mod budget;
mod service_streams;
mod streams;
#[cfg(test)]
mod tests;
mod unary;

pub use body_deadline::{BodyDeadline, BodyDeadlineLayer};
pub use budget::ByteBudget;
pub use service_streams::{
    MAX_SERVICE_STREAMS, MAX_SERVICE_STREAMS_PER_CONNECTION, ServiceStreams, ServiceStreamsLayer,
};
pub use streams::{PrincipalStreamPermit, QuotaKey, StreamLimiter, StreamPermit};
pub use unary::{UnaryLimit, UnaryLimitLayer, is_limited_unary};

/// Header entries per message.
pub const MAX_HEADERS: usize = 64;

/// Header keys and values of one message together, in bytes.
pub const MAX_HEADERS_BYTES: usize = 16 * 1024;

/// One header key, in bytes (keys must not be empty).
pub const MAX_HEADER_KEY_BYTES: usize = 256;

/// A message's `type`, in bytes.
pub const MAX_TYPE_BYTES: usize = 255;

/// A message's `ordering_key`, in bytes.
pub const MAX_ORDERING_KEY_BYTES: usize = 255;

/// Counts a request refused by the limit `limit` (the flag's name without dashes).
pub fn refused(limit: &'static str) {
    metrics::counter!(crate::metrics::LIMIT_REFUSALS, "limit" => limit).increment(1);
}

/// The largest a delivery can be, as a stream's byte budget counts it: the payload limit, the
/// headers' limit, and room for topic, type and ordering key.
pub fn delivery_unit(max_payload_bytes: usize) -> usize {
    max_payload_bytes + MAX_HEADERS_BYTES + 1024
}

/// Topics and patterns per consumer.
pub const MAX_CONSUMER_TOPICS: usize = 100;

/// The longest `backoff_base` and `backoff_max` of a consumer.
pub const MAX_BACKOFF: Duration = Duration::from_secs(24 * 3600);

/// The resource limits of one process; each is a flag of `outboxd serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct Limits {
    /// Most streams (Subscribe, Tail and ReplayStream) this process serves at once; the excess gets
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "OUTBOXD_MAX_STREAMS", default_value_t = Limits::DEFAULT.max_streams)]
    pub max_streams: usize,
    /// Most streams (Subscribe, Tail and ReplayStream) on one client connection; the excess gets
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "OUTBOXD_MAX_STREAMS_PER_CONNECTION", default_value_t = Limits::DEFAULT.max_streams_per_connection)]
    pub max_streams_per_connection: usize,
    /// Most unary requests in progress at once, over all connections; the excess is refused
    /// at once with UNAVAILABLE (load shedding) instead of waiting.
    #[arg(long, env = "OUTBOXD_MAX_CONCURRENT_REQUESTS", default_value_t = Limits::DEFAULT.max_concurrent_requests)]
    pub max_concurrent_requests: usize,
    /// Most unary requests of one principal in progress at once (with an auth file); the
    /// excess gets RESOURCE_EXHAUSTED, so that one tenant cannot take every slot of
    /// --max-concurrent-requests.
    #[arg(long, env = "OUTBOXD_MAX_REQUESTS_PER_PRINCIPAL", default_value_t = Limits::DEFAULT.max_requests_per_principal)]
    pub max_requests_per_principal: usize,
    /// Most streams (Subscribe, Tail and ReplayStream) of one principal at once (with an auth
    /// file), counted from the moment a stream opens, before its `start`; the excess gets
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "OUTBOXD_MAX_STREAMS_PER_PRINCIPAL", default_value_t = Limits::DEFAULT.max_streams_per_principal)]
    pub max_streams_per_principal: usize,
    /// How long a request's body may take to arrive in full (every method but Subscribe, whose
    /// `start` has the same deadline); a body that stalls gets DEADLINE_EXCEEDED and gives its
    /// slot back.
    #[arg(long, env = "OUTBOXD_REQUEST_BODY_TIMEOUT", value_parser = humantime::parse_duration,
          default_value = "10s")]
    pub request_body_timeout: Duration,
    /// How long a new connection may take to send HTTP/2's connection preface (after the TLS
    /// handshake, with TLS); a connection that sends nothing is closed.
    #[arg(long, env = "OUTBOXD_HTTP2_PREFACE_TIMEOUT", value_parser = humantime::parse_duration,
          default_value = "10s")]
    pub http2_preface_timeout: Duration,
    /// Most client connections open at once on each listener; a connection beyond it is closed
    /// as soon as it is accepted.
    #[arg(long, env = "OUTBOXD_MAX_CLIENT_CONNECTIONS", default_value_t = Limits::DEFAULT.max_client_connections)]
    pub max_client_connections: usize,
    /// Most connections open at once from one client address (an IPv4 address, or an IPv6
    /// /64) on each listener; a connection beyond it is closed as soon as it is accepted, so that
    /// one client cannot take every place of --max-client-connections.
    #[arg(long, env = "OUTBOXD_MAX_CONNECTIONS_PER_PEER", default_value_t = Limits::DEFAULT.max_connections_per_peer)]
    pub max_connections_per_peer: usize,
    /// How long a new connection may take to open its first stream (a call of outboxd's own
    /// services that authentication lets through; health checks, reflection and unknown paths
    /// do not count), counted from its accept (from the end of the TLS handshake, with TLS); a
    /// connection that opens none, answering keepalive PINGs or reading nothing, is closed.
    #[arg(long, env = "OUTBOXD_HTTP2_FIRST_STREAM_TIMEOUT", value_parser = humantime::parse_duration,
          default_value = "30s")]
    pub http2_first_stream_timeout: Duration,
    /// Most consumers (sinks included) the database may hold; CreateConsumer beyond it gets
    /// RESOURCE_EXHAUSTED. Every relay pass matches every consumer's topics.
    #[arg(long, env = "OUTBOXD_MAX_CONSUMERS", default_value_t = Limits::DEFAULT.max_consumers)]
    pub max_consumers: usize,
    /// Most bytes of deliveries one principal's Subscribe and Tail streams hold at once:
    /// leased to them and not yet acked, nacked or expired, or read for a tail and not yet
    /// taken by its transport, whatever their max_in_flight. Without an auth file every caller
    /// is one principal and shares it. A stream at the limit gets no more until some come back. Each
    /// delivery counts its payload, headers, topic, type and key; room is reserved at the
    /// largest a delivery may be (--max-payload-bytes plus 16 KiB of headers and 1 KiB of
    /// names), so the limit must hold at least one of those.
    #[arg(long, env = "OUTBOXD_MAX_IN_FLIGHT_BYTES_PER_PRINCIPAL",
          default_value_t = Limits::DEFAULT.max_in_flight_bytes_per_principal)]
    pub max_in_flight_bytes_per_principal: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl Limits {
    pub const DEFAULT: Limits = Limits {
        max_streams: 1000,
        max_streams_per_connection: 100,
        max_concurrent_requests: 256,
        max_requests_per_principal: 64,
        max_streams_per_principal: 250,
        request_body_timeout: Duration::from_secs(10),
        http2_preface_timeout: Duration::from_secs(10),
        max_client_connections: 4096,
        max_connections_per_peer: 128,
        http2_first_stream_timeout: Duration::from_secs(30),
        max_consumers: 1000,
        max_in_flight_bytes_per_principal: 256 * 1024 * 1024,
    };

    /// Names the flag that cannot work.
    pub fn validate(&self) -> Result<(), String> {
        for (flag, v) in [
            ("--max-streams", self.max_streams),
            ("--max-streams-per-connection", self.max_streams_per_connection),
            ("--max-concurrent-requests", self.max_concurrent_requests),
            ("--max-requests-per-principal", self.max_requests_per_principal),
            ("--max-streams-per-principal", self.max_streams_per_principal),
            ("--max-client-connections", self.max_client_connections),
            ("--max-connections-per-peer", self.max_connections_per_peer),
            ("--max-consumers", self.max_consumers),
        ] {
            if v == 0 || v > 1_000_000 {
                return Err(format!("{flag} must be between 1 and 1000000, not {v}"));
            }
        }
        for (flag, d) in [
            ("--request-body-timeout", self.request_body_timeout),
            ("--http2-preface-timeout", self.http2_preface_timeout),
            ("--http2-first-stream-timeout", self.http2_first_stream_timeout),
        ] {
            if d.is_zero() || d > Duration::from_secs(3600) {
                return Err(format!("{flag} must be between 1ms and 1h, not {d:?}"));
            }
        }
        Ok(())
    }

    /// HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`: room for a connection's streams and as many
    /// unary calls as the process takes at once, so that the stream limit answers with a status
    /// rather than a client waiting for HTTP/2 credit, while a connection still cannot open
    /// streams without bound.
    pub fn http2_max_concurrent_streams(&self) -> u32 {
        u32::try_from(self.max_streams_per_connection.saturating_add(self.max_concurrent_requests)).unwrap_or(u32::MAX)
    }
}

/// The client address of a request, over plain TCP or TLS (`None` on other transports).
pub fn peer_addr(ext: &http::Extensions) -> Option<SocketAddr> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    ext.get::<TcpConnectInfo>()
        .and_then(|i| i.remote_addr())
        .or_else(|| ext.get::<TlsConnectInfo<TcpConnectInfo>>().and_then(|i| i.get_ref().remote_addr()))
}

//! Accepting client connections, bounded (ADR 0075): at most `--max-client-connections` open on
//! each listener and `--max-connections-per-peer` from one client address; each must send
//! HTTP/2's connection preface within `--http2-preface-timeout` (after the TLS handshake, with
//! TLS) and open its first stream within `--http2-first-stream-timeout`, or it is closed; and it
//! may send only so many PING and SETTINGS frames. Without these, a client that opens
//! connections and says nothing, or only answers keepalive PINGs, holds a socket, a task and a
//! connection's buffers each, for as long as it likes, and with enough of them shuts every
//! other client out, health checks included.
//!
//! The main port keeps a few places for health checks beyond the general ones: a connection
//! that finds the general places full is served health only, so that a prober still sees the
//! process answer while an attack holds every general place.
use std::io;
use std::net::IpAddr;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt as _};
use tokio_util::sync::CancellationToken;

mod frames;
mod guarded;
mod layers;
mod places;

pub use frames::{CONTROL_FRAME_WINDOW, MAX_CONTROL_FRAMES};
pub use guarded::Guarded;
pub use layers::{HealthOnly, HealthOnlyLayer, StreamOpened, StreamOpenedLayer};
pub use places::{ConnectionLimit, Place};

/// How long a retired connection (one sent a GOAWAY) is kept for its client to close it.
pub const RETIRE_GRACE: Duration = Duration::from_secs(2);

/// 127.0.0.0/8 and ::1, also written as an IPv4-mapped IPv6 address: where outboxd serves
/// without authentication.
pub fn is_loopback(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4.is_loopback(),
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(v6.is_loopback(), |v4| v4.is_loopback()),
    }
}

/// The client whose connections count together: an IPv4 address, or an IPv6 /64 (a host is
/// routinely given a whole /64, so counting single IPv6 addresses would bound nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerKey {
    V4(std::net::Ipv4Addr),
    V6Net(u64),
}

impl PeerKey {
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => PeerKey::V4(v4),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => PeerKey::V4(v4),
                None => PeerKey::V6Net((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

impl std::fmt::Display for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerKey::V4(v4) => write!(f, "{v4}"),
            PeerKey::V6Net(net) => write!(f, "{}/64", std::net::Ipv6Addr::from(u128::from(*net) << 64)),
        }
    }
}

/// The bounds of one listener's connections.
#[derive(Debug, Clone, Copy)]
pub struct ListenerLimits {
    /// General places (`--max-client-connections`).
    pub max: usize,
    /// Places one [`PeerKey`] may hold, health places included (`--max-connections-per-peer`).
    pub per_peer: usize,
    /// Places beyond `max` for connections served health checks only (0: none).
    pub health_reserve: usize,
    pub preface_timeout: Duration,
    /// `--http2-first-stream-timeout`; `None` where requests are not HTTP/2 streams (the console).
    pub first_stream_timeout: Option<Duration>,
    /// Count PING and SETTINGS frames (HTTP/2 listeners).
    pub http2: bool,
}

/// What a place lets its connection do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    General,
    /// A place kept for health checks: the connection is served health and nothing else.
    HealthOnly,
}

/// Splits guarded connections into those with a general place and those with a place kept for
/// health, each for its own server, until `stop`.
#[allow(clippy::type_complexity)]
pub fn split<S, I>(
    incoming: I,
    stop: CancellationToken,
) -> (ReceiverStream<io::Result<Guarded<S>>>, ReceiverStream<io::Result<Guarded<S>>>)
where
    S: Send + 'static,
    I: Stream<Item = io::Result<Guarded<S>>> + Send + 'static,
{
    let (general, general_rx) = mpsc::channel(64);
    let (health, health_rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut incoming = std::pin::pin!(incoming);
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return,
                n = incoming.next() => n,
            };
            let Some(conn) = next else { return };
            let to = match &conn {
                Ok(c) if c.kind() == Kind::HealthOnly => &health,
                _ => &general,
            };
            if to.send(conn).await.is_err() {
                return;
            }
        }
    });
    (ReceiverStream::new(general_rx), ReceiverStream::new(health_rx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_ipv4_addresses_and_ipv6_slash_64s() {
        let key = |s: &str| PeerKey::of(s.parse().unwrap());
        assert_eq!(key("::ffff:10.0.0.1"), key("10.0.0.1"));
        assert_eq!(key("2001:db8::1"), key("2001:db8::ffff:1"));
        assert_ne!(key("2001:db8::1"), key("2001:db8:0:1::1"));
        assert_eq!(key("2001:db8::1").to_string(), "2001:db8::/64");
    }
}

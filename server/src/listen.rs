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
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt as _};
use tokio_util::sync::CancellationToken;
use tonic::transport::server::Connected;

use crate::metrics::CONNECTIONS_CLOSED;

/// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`: what an HTTP/2 client sends first.
const PREFACE_LEN: usize = 24;
/// PING and SETTINGS frames (not acknowledgements) one HTTP/2 connection may send per
/// [`CONTROL_FRAME_WINDOW`]; h2 answers each one, at whatever pace the client reads, so without a
/// bound a client makes outboxd answer for ever; beyond it the connection is sent GOAWAY
/// (ENHANCE_YOUR_CALM) and closed. A client sends a keepalive PING every few
/// seconds and SETTINGS a few times; one that measures its bandwidth (BDP) a PING per round
/// trip while data flows: this leaves room for that and stops a flood.
pub const MAX_CONTROL_FRAMES: u32 = 1000;
pub const CONTROL_FRAME_WINDOW: Duration = Duration::from_secs(10);
const FRAME_PING: u8 = 6;
const FRAME_SETTINGS: u8 = 4;
const FRAME_HEADERS: u8 = 1;
const FRAME_GOAWAY: u8 = 7;
const ENHANCE_YOUR_CALM: u32 = 0xb;
const NO_ERROR: u32 = 0;
/// How long a retired connection (one sent a GOAWAY) is kept for its client to close it.
pub const RETIRE_GRACE: Duration = Duration::from_secs(2);
const FLAG_ACK: u8 = 1;

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

/// The connections of one listener: a place for each, up to the limits.
#[derive(Debug, Clone)]
pub struct ConnectionLimit {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    limits: ListenerLimits,
    general: Arc<Semaphore>,
    reserve: Arc<Semaphore>,
    per_peer: Mutex<HashMap<PeerKey, usize>>,
    /// Connections that have not shown yet that they are used (opened a stream on an HTTP/2
    /// listener, made a signed-in request on the console): what a full listener takes places
    /// back from.
    waiting: Mutex<Waiting>,
}

/// Connections not shown used yet, by their peer's address (unique on one listener), and in
/// the order they were accepted, each kind apart.
#[derive(Debug, Default)]
struct Waiting {
    by_addr: HashMap<SocketAddr, (u64, Kind, Arc<Slot>)>,
    general: std::collections::BTreeMap<u64, SocketAddr>,
    health_only: std::collections::BTreeMap<u64, SocketAddr>,
    next: u64,
}

impl Waiting {
    fn by_age(&mut self, kind: Kind) -> &mut std::collections::BTreeMap<u64, SocketAddr> {
        match kind {
            Kind::General => &mut self.general,
            Kind::HealthOnly => &mut self.health_only,
        }
    }

    fn insert(&mut self, addr: SocketAddr, kind: Kind, slot: Arc<Slot>) {
        let seq = self.next;
        self.next += 1;
        if let Some((old, old_kind, _)) = self.by_addr.insert(addr, (seq, kind, slot)) {
            self.by_age(old_kind).remove(&old);
        }
        self.by_age(kind).insert(seq, addr);
    }

    /// Removes `addr`'s entry if it is `slot`'s (or any, without `slot`).
    fn remove(&mut self, addr: &SocketAddr, slot: Option<&Arc<Slot>>) {
        let ours = self.by_addr.get(addr).is_some_and(|(_, _, s)| slot.is_none_or(|slot| Arc::ptr_eq(s, slot)));
        if ours && let Some((seq, kind, _)) = self.by_addr.remove(addr) {
            self.by_age(kind).remove(&seq);
        }
    }

    fn contains(&self, addr: &SocketAddr) -> bool {
        self.by_addr.contains_key(addr)
    }

    /// The oldest of `kind`, taken out.
    fn pop_oldest(&mut self, kind: Kind) -> Option<(SocketAddr, Arc<Slot>)> {
        let (_, addr) = self.by_age(kind).pop_first()?;
        self.by_addr.remove(&addr).map(|(_, _, slot)| (addr, slot))
    }
}

/// What a connection's place is made of: the permit it holds (taken away when another
/// connection is given it) and the signal that closes the connection when that happens.
#[derive(Debug)]
struct Slot {
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    evicted: CancellationToken,
    /// Asks the connection to tell its client, with a GOAWAY, to open no more streams on it.
    retired: CancellationToken,
}

/// A connection's place: given back, with its peer's count, when dropped.
#[derive(Debug)]
pub struct Place {
    slot: Arc<Slot>,
    kind: Kind,
    peer: PeerKey,
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Place {
    /// Resolves when another connection has been given this place: a connection still in its
    /// TLS handshake gives up then, as a guarded one fails its next read or write.
    pub fn evicted(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.slot.evicted.clone().cancelled_owned()
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut counts = self.shared.per_peer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.peer);
            }
        }
        drop(counts);
        self.shared.waiting.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.addr, Some(&self.slot));
    }
}

impl ConnectionLimit {
    pub fn new(limits: ListenerLimits) -> Self {
        Self {
            shared: Arc::new(Shared {
                limits,
                general: Arc::new(Semaphore::new(limits.max)),
                reserve: Arc::new(Semaphore::new(limits.health_reserve)),
                per_peer: Mutex::new(HashMap::new()),
                waiting: Mutex::new(Waiting::default()),
            }),
        }
    }

    /// A place for a connection from `addr` just accepted, or `None` (and it is counted) when
    /// its peer holds all it may or every place is taken by a connection in use: the caller
    /// drops the connection. When every place is taken, the connection that has waited longest
    /// without being used gives its place up and is closed (ADR 0079): a client that connects
    /// and uses its connection at once gets in however many idle ones others keep opening,
    /// from however many addresses.
    pub fn admit(&self, addr: SocketAddr) -> Option<Place> {
        let limits = &self.shared.limits;
        let peer = PeerKey::of(addr.ip());
        let mut counts = self.shared.per_peer.lock().unwrap_or_else(|p| p.into_inner());
        let held = counts.get(&peer).copied().unwrap_or(0);
        if held >= limits.per_peer {
            metrics::counter!(CONNECTIONS_CLOSED, "reason" => "max_connections_per_peer").increment(1);
            tracing::debug!(%peer, max = limits.per_peer, "connection refused: --max-connections-per-peer reached");
            return None;
        }
        let mut waiting = self.shared.waiting.lock().unwrap_or_else(|p| p.into_inner());
        // A general place, free or taken back from an idle connection; only when every general
        // connection is in use, a health place, free or taken back: a client is not given a
        // health place while an idle connection holds a general one.
        let general = match self.shared.general.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => Self::evict(&mut waiting, Kind::General),
        };
        let taken = match general {
            Some(p) => Some((p, Kind::General)),
            None => match self.shared.reserve.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => Self::evict(&mut waiting, Kind::HealthOnly),
            }
            .map(|p| (p, Kind::HealthOnly)),
        };
        let Some((permit, kind)) = taken else {
            metrics::counter!(CONNECTIONS_CLOSED, "reason" => "max_client_connections").increment(1);
            tracing::debug!(max = limits.max, "connection refused: --max-client-connections reached");
            return None;
        };
        counts.insert(peer, held + 1);
        drop(counts);
        let slot = Arc::new(Slot {
            permit: Mutex::new(Some(permit)),
            evicted: CancellationToken::new(),
            retired: CancellationToken::new(),
        });
        waiting.insert(addr, kind, slot.clone());
        Some(Place { slot, kind, peer, addr, shared: self.shared.clone() })
    }

    /// The place of the connection of `kind` that has waited longest without being used,
    /// taken from it (it is closed).
    fn evict(waiting: &mut Waiting, kind: Kind) -> Option<OwnedSemaphorePermit> {
        while let Some((addr, slot)) = waiting.pop_oldest(kind) {
            let taken = slot.permit.lock().unwrap_or_else(|p| p.into_inner()).take();
            slot.evicted.cancel();
            if let Some(permit) = taken {
                metrics::counter!(CONNECTIONS_CLOSED, "reason" => "evicted").increment(1);
                tracing::debug!(peer = %addr, "connection closed: its place went to a new connection (it had not been used)");
                return Some(permit);
            }
        }
        None
    }

    /// Retires the connection from `addr` if it has not been used (a health-only connection
    /// asked for something else): it sends its client a GOAWAY once the answers under way are
    /// out, so that the client opens its next stream on a new connection, for a place that
    /// serves it, and it is closed [`RETIRE_GRACE`] later if the client keeps it.
    pub fn retire_unused(&self, addr: SocketAddr) {
        let waiting = self.shared.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, _, slot)) = waiting.by_addr.get(&addr) {
            slot.retired.cancel();
        }
    }

    /// The connection from `addr` is used (it opened a stream; on the console, made a
    /// signed-in request): its first-stream deadline no longer holds, and its place is its own.
    pub fn opened(&self, addr: SocketAddr) {
        let mut waiting = self.shared.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if waiting.contains(&addr) {
            waiting.remove(&addr, None);
        }
    }

    /// `io` with its place, and its deadlines armed.
    pub fn guard<S>(&self, io: S, place: Place) -> Guarded<S> {
        let limits = &self.shared.limits;
        Guarded {
            inner: io,
            preface: Some((Box::pin(tokio::time::sleep(limits.preface_timeout)), 0)),
            first_stream: limits.first_stream_timeout.map(|d| Box::pin(tokio::time::sleep(d))),
            frames: limits.http2.then(FrameCounter::default),
            evicted: Box::pin(place.slot.evicted.clone().cancelled_owned()),
            retired: Box::pin(place.slot.retired.clone().cancelled_owned()),
            retiring: None,
            broken: false,
            place,
        }
    }

    /// Plaintext connections accepted on `listener`, guarded.
    pub fn incoming(self, listener: TcpListener) -> impl Stream<Item = io::Result<Guarded<TcpStream>>> {
        tokio_stream::wrappers::TcpListenerStream::new(listener).filter_map(move |accepted| match accepted {
            Ok(tcp) => {
                let addr = tcp.peer_addr().ok()?;
                self.admit(addr).map(|place| Ok(self.guard(tcp, place)))
            }
            Err(e) => Some(Err(e)),
        })
    }

    /// A layer that tells this limit of each stream a connection opens (put it inside
    /// authentication, so that refused requests do not count).
    pub fn stream_layer(&self) -> StreamOpenedLayer {
        StreamOpenedLayer { limit: self.clone() }
    }
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

/// Follows the frames of one direction of an HTTP/2 connection, reading only their headers.
#[derive(Debug)]
struct FrameScan {
    /// Preface bytes still to pass.
    preface_left: usize,
    header: [u8; 9],
    have: usize,
    /// Payload bytes of the current frame still to pass.
    skip: usize,
}

impl FrameScan {
    fn new(preface: usize) -> Self {
        Self { preface_left: preface, header: [0; 9], have: 0, skip: 0 }
    }

    /// Passes `bytes`, handing `each` every frame header completed, until it returns false.
    fn pass(&mut self, mut bytes: &[u8], mut each: impl FnMut(&[u8; 9]) -> bool) -> bool {
        let pass = self.preface_left.min(bytes.len());
        self.preface_left -= pass;
        bytes = &bytes[pass..];
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have < 9 {
                break;
            }
            self.have = 0;
            let h = self.header;
            self.skip = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
            if !each(&h) {
                return false;
            }
        }
        true
    }

    /// Between two frames: a frame of our own can go here.
    fn at_boundary(&self) -> bool {
        self.preface_left == 0 && self.have == 0 && self.skip == 0
    }
}

/// Counts a connection's PING and SETTINGS frames, and follows what h2 writes, so that a
/// flooding connection can be sent GOAWAY between two of h2's frames before it is closed.
#[derive(Debug)]
struct FrameCounter {
    read: FrameScan,
    written: FrameScan,
    /// The highest stream the client opened (the GOAWAY's last stream).
    last_stream: u32,
    window: Instant,
    count: u32,
}

impl Default for FrameCounter {
    fn default() -> Self {
        Self {
            read: FrameScan::new(PREFACE_LEN),
            written: FrameScan::new(0),
            last_stream: 0,
            window: Instant::now(),
            count: 0,
        }
    }
}

impl FrameCounter {
    /// Whether the bytes read keep the connection under its bound.
    fn read(&mut self, bytes: &[u8]) -> bool {
        let (window, count, last_stream) = (&mut self.window, &mut self.count, &mut self.last_stream);
        self.read.pass(bytes, |h| {
            if h[3] == FRAME_HEADERS {
                let id = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                *last_stream = (*last_stream).max(id);
            }
            if !(matches!(h[3], FRAME_PING | FRAME_SETTINGS) && h[4] & FLAG_ACK == 0) {
                return true;
            }
            if window.elapsed() >= CONTROL_FRAME_WINDOW {
                *window = Instant::now();
                *count = 0;
            }
            *count += 1;
            *count <= MAX_CONTROL_FRAMES
        })
    }

    fn written(&mut self, bytes: &[u8]) {
        self.written.pass(bytes, |_| true);
    }

    /// GOAWAY with ENHANCE_YOUR_CALM, if it can go between two of h2's frames.
    fn goaway(&self, error: u32) -> Option<[u8; 17]> {
        if !self.written.at_boundary() {
            return None;
        }
        let mut f = [0u8; 17];
        f[2] = 8;
        f[3] = FRAME_GOAWAY;
        f[9..13].copy_from_slice(&self.last_stream.to_be_bytes());
        f[13..17].copy_from_slice(&error.to_be_bytes());
        Some(f)
    }
}

/// A connection that holds its place until it is dropped, and fails its reads with
/// `TimedOut` if the preface, or its first stream, has not arrived by its deadline, or when it
/// floods PING or SETTINGS frames.
#[derive(Debug)]
pub struct Guarded<S> {
    inner: S,
    /// The deadline and the bytes read so far, until the preface's 24 have arrived.
    preface: Option<(Pin<Box<tokio::time::Sleep>>, usize)>,
    /// The first stream's deadline, until it is found to have opened.
    first_stream: Option<Pin<Box<tokio::time::Sleep>>>,
    frames: Option<FrameCounter>,
    /// Ready when another connection has been given this one's place.
    evicted: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    /// Ready when the connection is to be retired: a GOAWAY goes out, then `retiring` runs.
    retired: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    /// Once the GOAWAY is out, how long the client has left to close the connection.
    retiring: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A GOAWAY went out in part: the connection's framing is broken, it fails at once.
    broken: bool,
    place: Place,
}

impl<S> Guarded<S> {
    /// The connection inside (its peer, its TLS session).
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// What its place lets it do.
    pub fn kind(&self) -> Kind {
        self.place.kind
    }
}

impl<S: AsyncWrite + Unpin> Guarded<S> {
    /// A write that waits (the client does not read) fails instead when a deadline has passed
    /// or the place was taken back: a connection whose client stops reading is not read from
    /// either, and would otherwise outlive every deadline, and its place, with its socket.
    fn unless_expired<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match r {
            Poll::Pending => match self.expired(cx) {
                Some(e) => Poll::Ready(Err(e)),
                None => Poll::Pending,
            },
            ready => ready,
        }
    }

    /// A retired connection's GOAWAY, if it can go now: between two of h2's frames (the
    /// answers under way keep going). When h2 is in the middle of a frame, it goes after one of
    /// h2's next writes ends a frame. The error when the connection is to close instead.
    fn send_goaway(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        if self.retiring.is_some() || !self.place.slot.retired.is_cancelled() {
            return None;
        }
        let Some(frames) = &self.frames else {
            return Some(io::Error::new(io::ErrorKind::ConnectionAborted, "retired"));
        };
        let frame = frames.goaway(NO_ERROR)?;
        match Pin::new(&mut self.inner).poll_write(cx, &frame) {
            Poll::Ready(Ok(n)) if n == frame.len() => {
                let _ = Pin::new(&mut self.inner).poll_flush(cx);
                let mut grace = Box::pin(tokio::time::sleep(RETIRE_GRACE));
                let _ = grace.as_mut().poll(cx);
                self.retiring = Some(grace);
                None
            }
            Poll::Pending => None,
            Poll::Ready(Ok(n)) if n > 0 => {
                self.broken = true;
                Some(io::Error::new(io::ErrorKind::ConnectionAborted, "a GOAWAY went out in part"))
            }
            _ => Some(io::Error::new(io::ErrorKind::ConnectionAborted, "retired")),
        }
    }

    /// Whether a deadline has passed: the error to fail the read with.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        if self.broken {
            return Some(io::Error::new(io::ErrorKind::ConnectionAborted, "a GOAWAY went out in part"));
        }
        if self.evicted.as_mut().poll(cx).is_ready() {
            return Some(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "every place was taken: this connection, not used yet, gave its place to a new one",
            ));
        }
        if let Some(grace) = &mut self.retiring {
            if grace.as_mut().poll(cx).is_ready() {
                return Some(io::Error::new(io::ErrorKind::ConnectionAborted, "retired, and kept past its GOAWAY"));
            }
        } else if self.retired.as_mut().poll(cx).is_ready()
            && let Some(e) = self.send_goaway(cx)
        {
            return Some(e);
        }
        if let Some((deadline, _)) = &mut self.preface
            && deadline.as_mut().poll(cx).is_ready()
        {
            metrics::counter!(CONNECTIONS_CLOSED, "reason" => "preface_timeout").increment(1);
            return Some(io::Error::new(io::ErrorKind::TimedOut, "no HTTP/2 preface within --http2-preface-timeout"));
        }
        if let Some(deadline) = &mut self.first_stream
            && deadline.as_mut().poll(cx).is_ready()
        {
            let waiting =
                self.place.shared.waiting.lock().unwrap_or_else(|p| p.into_inner()).contains(&self.place.addr);
            self.first_stream = None;
            if waiting {
                metrics::counter!(CONNECTIONS_CLOSED, "reason" => "first_stream_timeout").increment(1);
                tracing::debug!(peer = %self.place.addr, "connection closed: no stream within --http2-first-stream-timeout");
                return Some(io::Error::new(io::ErrorKind::TimedOut, "no stream within --http2-first-stream-timeout"));
            }
        }
        None
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                if let Some((_, got)) = &mut this.preface {
                    *got += read.len();
                    if *got >= PREFACE_LEN {
                        this.preface = None;
                    }
                }
                if let Some(frames) = &mut this.frames
                    && !frames.read(read)
                {
                    metrics::counter!(CONNECTIONS_CLOSED, "reason" => "control_frame_flood").increment(1);
                    tracing::debug!(peer = %this.place.addr, "connection closed: PING or SETTINGS flood");
                    // Best effort: the connection is closed whether or not the GOAWAY fits.
                    if let Some(goaway) = frames.goaway(ENHANCE_YOUR_CALM) {
                        let _ = Pin::new(&mut this.inner).poll_write(cx, &goaway);
                        let _ = Pin::new(&mut this.inner).poll_flush(cx);
                    }
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        format!(
                            "more than {MAX_CONTROL_FRAMES} HTTP/2 PING and SETTINGS frames in {CONTROL_FRAME_WINDOW:?}"
                        ),
                    )));
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match this.expired(cx) {
                Some(e) => Poll::Ready(Err(e)),
                None => Poll::Pending,
            },
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.broken {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "a GOAWAY went out in part")));
        }
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let (Poll::Ready(Ok(n)), Some(frames)) = (&written, &mut this.frames) {
            frames.written(&buf[..*n]);
            // A GOAWAY that waited for h2 to end its frame (an error shows on the next read).
            let _ = this.send_goaway(cx);
        }
        this.unless_expired(cx, written)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let flushed = Pin::new(&mut this.inner).poll_flush(cx);
        this.unless_expired(cx, flushed)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.broken {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "a GOAWAY went out in part")));
        }
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let (Poll::Ready(Ok(n)), Some(frames)) = (&written, &mut this.frames) {
            let mut left = *n;
            for b in bufs {
                if left == 0 {
                    break;
                }
                let take = left.min(b.len());
                frames.written(&b[..take]);
                left -= take;
            }
            let _ = this.send_goaway(cx);
        }
        this.unless_expired(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The connection's address (and certificates) as the bare stream gives them, so that the
/// auth layer and the limits find them in each request's extensions as before.
impl<S: Connected> Connected for Guarded<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// Tells a [`ConnectionLimit`] of each stream its connections open.
#[derive(Debug, Clone)]
pub struct StreamOpenedLayer {
    limit: ConnectionLimit,
}

/// The gRPC health service's methods.
const HEALTH_PATH: &str = "/grpc.health.v1.Health/";
/// outboxd's own services (`Outbox`, `OutboxAdmin`): what a connection is used for.
const OWN_SERVICES: &str = "/outbox.v1.";

impl<S> tower::Layer<S> for StreamOpenedLayer {
    type Service = StreamOpened<S>;

    fn layer(&self, inner: S) -> Self::Service {
        StreamOpened { inner, limit: self.limit.clone() }
    }
}

#[derive(Debug, Clone)]
pub struct StreamOpened<S> {
    inner: S,
    limit: ConnectionLimit,
}

impl<S, B> tower::Service<http::Request<B>> for StreamOpened<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> S::Future {
        // Only outboxd's own services count, which authentication has let through for a caller
        // holding a permission of the method's kind. Health is answered to anyone, reflection
        // to any valid credential, an unknown path (answered UNIMPLEMENTED) to anyone: none of
        // them lifts the deadline or keeps the place when the listener is full, or one request
        // would let a connection that answers PINGs keep its place (a health place too) for
        // ever. A connection used for them alone is closed at the deadline, and its client
        // connects again for its next check.
        if !req.uri().path().starts_with(OWN_SERVICES) {
            return self.inner.call(req);
        }
        if let Some(addr) = crate::limits::peer_addr(req.extensions()) {
            self.limit.opened(addr);
        }
        self.inner.call(req)
    }
}

/// In front of a server of health checks only (the places kept for health, `--health-listen`):
/// anything else is answered UNAVAILABLE and its connection closed, so that a client that was
/// given such a place (every general one in use) connects again for a place that serves it,
/// instead of keeping a connection that answers its calls UNIMPLEMENTED. Nothing on such a
/// connection counts as use: it keeps its first-stream deadline and can be taken back.
#[derive(Debug, Clone)]
pub struct HealthOnlyLayer {
    limit: ConnectionLimit,
}

impl ConnectionLimit {
    /// The layer for this listener's health-only server.
    pub fn health_only_layer(&self) -> HealthOnlyLayer {
        HealthOnlyLayer { limit: self.clone() }
    }
}

impl<S> tower::Layer<S> for HealthOnlyLayer {
    type Service = HealthOnly<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HealthOnly { inner, limit: self.limit.clone() }
    }
}

#[derive(Debug, Clone)]
pub struct HealthOnly<S> {
    inner: S,
    limit: ConnectionLimit,
}

impl<S, B> tower::Service<http::Request<B>> for HealthOnly<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = futures::future::Either<S::Future, std::future::Ready<Result<Self::Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path().starts_with(HEALTH_PATH) {
            return futures::future::Either::Left(self.inner.call(req));
        }
        if let Some(addr) = crate::limits::peer_addr(req.extensions()) {
            self.limit.retire_unused(addr);
        }
        let status = tonic::Status::unavailable(
            "this connection was given a place for health checks only (every other place is in use): connect again",
        );
        futures::future::Either::Right(std::future::ready(Ok(status.into_http())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, len: usize) -> Vec<u8> {
        let l = u32::try_from(len).unwrap().to_be_bytes();
        let mut f = vec![l[1], l[2], l[3], kind, flags, 0, 0, 0, 1];
        f.resize(9 + len, 0);
        f
    }

    #[test]
    fn control_frames_are_counted_across_reads_of_any_size_and_acks_are_not() {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        // A DATA frame whose payload holds PING-looking bytes, then PINGs, SETTINGS and acks.
        let mut data = frame(0, 0, 9);
        data[9..].copy_from_slice(&frame(FRAME_PING, 0, 0));
        bytes.extend(data);
        for _ in 0..MAX_CONTROL_FRAMES / 2 {
            bytes.extend(frame(FRAME_PING, 0, 8));
            bytes.extend(frame(FRAME_SETTINGS, 0, 6));
            bytes.extend(frame(FRAME_PING, FLAG_ACK, 8));
            bytes.extend(frame(FRAME_SETTINGS, FLAG_ACK, 0));
        }
        for chunk in [1, 7, 9, 4096] {
            let mut c = FrameCounter::default();
            assert!(bytes.chunks(chunk).all(|b| c.read(b)), "chunks of {chunk}");
            assert_eq!(c.count, MAX_CONTROL_FRAMES, "chunks of {chunk}");
            assert!(!c.read(&frame(FRAME_PING, 0, 8)), "one more");
        }
    }

    #[test]
    fn a_goaway_goes_only_between_two_written_frames() {
        let mut c = FrameCounter::default();
        assert!(c.goaway(ENHANCE_YOUR_CALM).is_some());
        let settings = frame(FRAME_SETTINGS, 0, 12);
        c.written(&settings[..5]);
        assert!(c.goaway(ENHANCE_YOUR_CALM).is_none());
        c.written(&settings[5..]);
        let goaway = c.goaway(ENHANCE_YOUR_CALM).unwrap();
        assert_eq!((goaway[3], &goaway[13..]), (FRAME_GOAWAY, &[0, 0, 0, 0xb][..]));
    }

    #[test]
    fn peers_are_ipv4_addresses_and_ipv6_slash_64s() {
        let key = |s: &str| PeerKey::of(s.parse().unwrap());
        assert_eq!(key("::ffff:10.0.0.1"), key("10.0.0.1"));
        assert_eq!(key("2001:db8::1"), key("2001:db8::ffff:1"));
        assert_ne!(key("2001:db8::1"), key("2001:db8:0:1::1"));
        assert_eq!(key("2001:db8::1").to_string(), "2001:db8::/64");
    }
}

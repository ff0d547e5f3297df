//! What any one client can make outboxd hold (ADR 0023): the fixed bounds on a message's and a
//! consumer's shape, which the database enforces too, and the per-process resource limits, which
//! are flags — streams per process and per connection, and unary requests in progress, beyond
//! which requests are shed at once instead of queueing without bound.
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Semaphore;
use tonic::Status;
use tonic::codegen::http;
use tower::limit::ConcurrencyLimit;
use tower::load_shed::LoadShed;
use tower::{Layer, Service, ServiceExt};

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

/// The bytes of deliveries one principal's streams may hold at once: leased to them and not
/// yet acked, nacked or expired (`--max-in-flight-bytes-per-principal`). Shared by all of the
/// principal's streams, so that a tenant's slow readers cannot make outboxd hold more of its
/// payloads than this, whatever their `max_in_flight`.
///
/// Room is taken before the deliveries are read, so each slot taken reserves a delivery's
/// largest size (the unit); a delivery that arrives gives back what it did not need, and its
/// ack (nack, expiry, the stream's end) gives back the rest.
#[derive(Debug)]
pub struct ByteBudget {
    free: AtomicUsize,
    limit: usize,
    /// A take fell short since the last give that announced bytes coming back.
    refused: AtomicBool,
    /// Counts gives that followed a refusal: a stream refused its room waits for this instead
    /// of a fallback poll.
    returned: tokio::sync::watch::Sender<u64>,
}

impl ByteBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            free: AtomicUsize::new(limit),
            limit,
            refused: AtomicBool::new(false),
            returned: tokio::sync::watch::channel(0).0,
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes free now.
    pub fn available(&self) -> usize {
        self.free.load(Ordering::SeqCst)
    }

    /// Takes `unit` bytes up to `want` times, as many times as there are bytes for. A take
    /// that falls short makes the next give announce itself ([`ByteBudget::returned`]).
    pub fn take_units(&self, want: usize, unit: usize) -> usize {
        let unit = unit.max(1);
        let mut taken = 0;
        let _ = self.free.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |free| {
            taken = (free / unit).min(want);
            Some(free - taken * unit)
        });
        if taken < want {
            self.refused.store(true, Ordering::SeqCst);
            // A give between the take and the flag saw no refusal and announced nothing:
            // announce it here, so that the refused caller, who waits for the next
            // announcement, does not wait for a give that has come already.
            if self.free.load(Ordering::SeqCst) >= unit {
                self.announce();
            }
        }
        taken
    }

    /// Gives back `bytes` taken.
    pub fn give(&self, bytes: usize) {
        if bytes > 0 {
            self.free.fetch_add(bytes, Ordering::SeqCst);
            if self.refused.swap(false, Ordering::SeqCst) {
                self.announce();
            }
        }
    }

    /// Changes whenever bytes come back after a take fell short.
    pub fn returned(&self) -> tokio::sync::watch::Receiver<u64> {
        self.returned.subscribe()
    }

    fn announce(&self) {
        self.returned.send_modify(|v| *v = v.wrapping_add(1));
    }
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

/// Counts the open streams of the process and of each client connection (known by its peer
/// address). [`StreamLimiter::acquire`] hands out a permit that gives its place back when dropped.
#[derive(Debug, Clone)]
pub struct StreamLimiter {
    limits: Limits,
    open: Arc<Mutex<OpenStreams>>,
    /// Without an auth file every caller is the one trusted caller: its streams share this
    /// budget, so that the process holds a bounded number of bytes for them too (ADR 0076).
    unauthenticated: Arc<ByteBudget>,
}

#[derive(Debug, Default)]
struct OpenStreams {
    total: usize,
    per_peer: HashMap<SocketAddr, usize>,
    per_principal: HashMap<Arc<str>, usize>,
    /// Each principal's in-flight byte budget, while a stream of it holds one.
    budgets: HashMap<Arc<str>, Arc<ByteBudget>>,
}

/// Who a request's quotas are counted against: the principal's name, put in the request's
/// extensions by the auth layer when an auth file is in force (without one there is no
/// per-principal quota: every caller is the same unrestricted one, whose streams share one
/// byte budget).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaKey(pub Arc<str>);

/// One principal's open stream (counted from the moment it opens); returned when dropped.
#[derive(Debug)]
pub struct PrincipalStreamPermit {
    open: Arc<Mutex<OpenStreams>>,
    principal: Option<Arc<str>>,
    budget: Option<Arc<ByteBudget>>,
}

impl PrincipalStreamPermit {
    /// The byte budget the principal's streams share (without an auth file, the one every
    /// caller shares).
    pub fn in_flight_bytes(&self) -> Option<Arc<ByteBudget>> {
        self.budget.clone()
    }
}

impl Drop for PrincipalStreamPermit {
    fn drop(&mut self) {
        let Some(principal) = &self.principal else { return };
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.per_principal.get_mut(principal) {
            *n -= 1;
            if *n == 0 {
                open.per_principal.remove(principal);
            }
        }
    }
}

/// One open stream's place; returned when dropped.
#[derive(Debug)]
pub struct StreamPermit {
    open: Arc<Mutex<OpenStreams>>,
    peer: Option<SocketAddr>,
}

impl StreamLimiter {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            open: Arc::default(),
            unauthenticated: ByteBudget::new(limits.max_in_flight_bytes_per_principal),
        }
    }

    /// A place for one more stream from `peer`, or RESOURCE_EXHAUSTED naming the limit that is
    /// reached. A request without a peer address (not TCP) counts only towards the process.
    #[allow(clippy::result_large_err)] // a Status is what the caller returns
    pub fn acquire(&self, peer: Option<SocketAddr>) -> Result<StreamPermit, Status> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.total >= self.limits.max_streams {
            refused("max_streams");
            return Err(Status::resource_exhausted(format!(
                "too many streams: this outboxd already serves {} streams, the limit is {} (--max-streams)",
                open.total, self.limits.max_streams
            )));
        }
        if let Some(peer) = peer {
            let on_connection = open.per_peer.get(&peer).copied().unwrap_or(0);
            if on_connection >= self.limits.max_streams_per_connection {
                refused("max_streams_per_connection");
                return Err(Status::resource_exhausted(format!(
                    "too many streams on this connection: {on_connection} open, the limit is {} \
                     (--max-streams-per-connection); open another connection or close streams",
                    self.limits.max_streams_per_connection
                )));
            }
            *open.per_peer.entry(peer).or_default() += 1;
        }
        open.total += 1;
        Ok(StreamPermit { open: self.open.clone(), peer })
    }

    /// A place for one more stream of `principal`, taken as the stream opens, before it has
    /// said what it wants: one principal's streams cannot take every place of the process. With
    /// no principal (no auth file) it always succeeds, and its streams share one byte budget.
    #[allow(clippy::result_large_err)] // a Status is what the caller returns
    pub fn acquire_principal(&self, principal: Option<&QuotaKey>) -> Result<PrincipalStreamPermit, Status> {
        let Some(QuotaKey(name)) = principal else {
            let budget = Some(self.unauthenticated.clone());
            return Ok(PrincipalStreamPermit { open: self.open.clone(), principal: None, budget });
        };
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let held = open.per_principal.get(name).copied().unwrap_or(0);
        if held >= self.limits.max_streams_per_principal {
            refused("max_streams_per_principal");
            return Err(Status::resource_exhausted(format!(
                "too many streams of principal {name:?}: {held} open, the limit is {} (--max-streams-per-principal)",
                self.limits.max_streams_per_principal
            )));
        }
        *open.per_principal.entry(name.clone()).or_default() += 1;
        // Budgets nobody holds any more are forgotten (a reloaded auth file may have renamed
        // the principal): a stream, its window and the relay's offers hold theirs.
        open.budgets.retain(|_, b| Arc::strong_count(b) > 1);
        let limit = self.limits.max_in_flight_bytes_per_principal;
        let budget = open.budgets.entry(name.clone()).or_insert_with(|| ByteBudget::new(limit)).clone();
        Ok(PrincipalStreamPermit { open: self.open.clone(), principal: Some(name.clone()), budget: Some(budget) })
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Streams open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.total = open.total.saturating_sub(1);
        if let Some(peer) = self.peer
            && let Some(n) = open.per_peer.get_mut(&peer)
        {
            *n -= 1;
            if *n == 0 {
                open.per_peer.remove(&peer);
            }
        }
    }
}

/// Methods that stream: they are bounded by the stream limits and never count as unary calls
/// in progress (a stream lasts as long as its client wants).
const STREAMING_METHODS: [&str; 3] =
    ["/outbox.v1.Outbox/Subscribe", "/outbox.v1.OutboxAdmin/Tail", "/outbox.v1.OutboxAdmin/ReplayStream"];

/// Whether a request path is a unary call of outboxd's own services (health checking and
/// reflection are never shed: load balancers and tools must reach a busy server).
pub fn is_limited_unary(path: &str) -> bool {
    path.starts_with("/outbox.v1.") && !STREAMING_METHODS.contains(&path)
}

/// Load shedding for unary calls: at most `max` in progress over the whole process (tower's
/// concurrency limit on one shared semaphore); a call beyond that is answered at once with
/// UNAVAILABLE naming the limit (tower's load shed), so that a burst cannot queue without
/// bound. Streams and health/reflection pass through untouched.
///
/// Before that, each principal's own quota (`--max-requests-per-principal`, with an auth file):
/// a call beyond it is refused with RESOURCE_EXHAUSTED without taking a place of the process, so
/// that one tenant's stalled or slow calls leave the others served. The auth layer runs first:
/// a caller refused there takes no place of either.
#[derive(Debug, Clone)]
pub struct UnaryLimitLayer {
    semaphore: Arc<Semaphore>,
    max: usize,
    per_principal: Arc<Mutex<HashMap<Arc<str>, Arc<Semaphore>>>>,
    max_per_principal: usize,
}

impl UnaryLimitLayer {
    pub fn new(max: usize, max_per_principal: usize) -> Self {
        Self { semaphore: Arc::new(Semaphore::new(max)), max, per_principal: Arc::default(), max_per_principal }
    }
}

impl<S: Clone> Layer<S> for UnaryLimitLayer {
    type Service = UnaryLimit<S>;

    fn layer(&self, inner: S) -> UnaryLimit<S> {
        UnaryLimit {
            limited: LoadShed::new(ConcurrencyLimit::with_semaphore(inner.clone(), self.semaphore.clone())),
            inner,
            max: self.max,
            per_principal: self.per_principal.clone(),
            max_per_principal: self.max_per_principal,
        }
    }
}

#[derive(Debug, Clone)]
pub struct UnaryLimit<S> {
    inner: S,
    limited: LoadShed<ConcurrencyLimit<S>>,
    max: usize,
    per_principal: Arc<Mutex<HashMap<Arc<str>, Arc<Semaphore>>>>,
    max_per_principal: usize,
}

impl<S> UnaryLimit<S> {
    /// A place in `principal`'s quota, or the refusal. The map holds one semaphore per
    /// principal of the auth file that has called (names come from the file, not the client).
    #[allow(clippy::result_large_err)]
    fn principal_permit(&self, principal: &QuotaKey) -> Result<tokio::sync::OwnedSemaphorePermit, Status> {
        let semaphore = {
            let mut map = self.per_principal.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(principal.0.clone()).or_insert_with(|| Arc::new(Semaphore::new(self.max_per_principal))).clone()
        };
        semaphore.try_acquire_owned().map_err(|_| {
            refused("max_requests_per_principal");
            Status::resource_exhausted(format!(
                "principal {:?} already has {} requests in progress, its limit (--max-requests-per-principal); \
                 retry with backoff",
                principal.0, self.max_per_principal
            ))
        })
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B, R> Service<http::Request<B>> for UnaryLimit<S>
where
    S: Service<http::Request<B>, Response = R> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Send + 'static,
{
    type Response = R;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<R, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if !is_limited_unary(req.uri().path()) {
            let fut = self.inner.call(req);
            return Box::pin(async move { fut.await.map_err(Into::into) });
        }
        let mine = match req.extensions().get::<QuotaKey>().map(|k| self.principal_permit(k)).transpose() {
            Ok(permit) => permit,
            Err(status) => return Box::pin(async move { Err(Box::new(status) as BoxError) }),
        };
        // `ready` on the clone takes a permit if one is free; load shed turns "none free" into
        // an immediate error instead of a wait. The permit is held until the call is answered.
        let limited = self.limited.clone();
        let max = self.max;
        Box::pin(async move {
            let _mine = mine;
            limited.oneshot(req).await.map_err(|e| {
                if e.is::<tower::load_shed::error::Overloaded>() {
                    refused("max_concurrent_requests");
                    Box::new(Status::unavailable(format!(
                        "outboxd is at its limit of {max} requests in progress (--max-concurrent-requests); retry with backoff"
                    ))) as BoxError
                } else {
                    e
                }
            })
        })
    }
}

/// The one method whose request body stays open for as long as its client wants (a `Subscribe`
/// stream's acks): its first message, `start`, has the same deadline in the service instead.
const OPEN_ENDED_BODY: &str = "/outbox.v1.Outbox/Subscribe";

/// The client address of a request, over plain TCP or TLS (`None` on other transports).
pub fn peer_addr(ext: &http::Extensions) -> Option<SocketAddr> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    ext.get::<TcpConnectInfo>()
        .and_then(|i| i.remote_addr())
        .or_else(|| ext.get::<TlsConnectInfo<TcpConnectInfo>>().and_then(|i| i.get_ref().remote_addr()))
}

/// The streams of the services beside outboxd's own that a caller may open and keep open:
/// health's `Watch` (anyone, no credential needed) and reflection (any valid credential). They
/// hold no delivery, so they are not `Subscribe`'s places (`--max-streams`), which a caller
/// with no permission must not be able to take; they are counted apart, here.
const SERVICE_STREAMS: [&str; 3] = [
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];
/// Health `Watch` and reflection streams open at once in the process.
pub const MAX_SERVICE_STREAMS: usize = 256;
/// The same on one connection.
pub const MAX_SERVICE_STREAMS_PER_CONNECTION: usize = 4;

#[derive(Debug, Default)]
struct OpenServiceStreams {
    total: usize,
    per_peer: HashMap<SocketAddr, usize>,
}

/// Counts health `Watch` and reflection streams against [`MAX_SERVICE_STREAMS`] and
/// [`MAX_SERVICE_STREAMS_PER_CONNECTION`], from their opening until their answer's body is
/// dropped; one more is answered RESOURCE_EXHAUSTED at once.
#[derive(Debug, Clone, Default)]
pub struct ServiceStreamsLayer {
    open: Arc<Mutex<OpenServiceStreams>>,
}

impl<S> Layer<S> for ServiceStreamsLayer {
    type Service = ServiceStreams<S>;

    fn layer(&self, inner: S) -> ServiceStreams<S> {
        ServiceStreams { inner, open: self.open.clone() }
    }
}

#[derive(Debug, Clone)]
pub struct ServiceStreams<S> {
    inner: S,
    open: Arc<Mutex<OpenServiceStreams>>,
}

/// One such stream's place, given back when its answer's body is dropped.
#[derive(Debug)]
struct ServiceStreamPlace {
    open: Arc<Mutex<OpenServiceStreams>>,
    peer: Option<SocketAddr>,
}

impl Drop for ServiceStreamPlace {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.total = open.total.saturating_sub(1);
        if let Some(peer) = self.peer
            && let Some(n) = open.per_peer.get_mut(&peer)
        {
            *n -= 1;
            if *n == 0 {
                open.per_peer.remove(&peer);
            }
        }
    }
}

fn service_stream_place(
    open: &Arc<Mutex<OpenServiceStreams>>,
    peer: Option<SocketAddr>,
) -> Result<ServiceStreamPlace, Status> {
    let mut o = open.lock().unwrap_or_else(|p| p.into_inner());
    if o.total >= MAX_SERVICE_STREAMS {
        refused("max_service_streams");
        return Err(Status::resource_exhausted(format!(
            "too many health watches and reflection streams: {} open, the limit is {MAX_SERVICE_STREAMS}",
            o.total
        )));
    }
    if let Some(peer) = peer {
        let here = o.per_peer.entry(peer).or_default();
        if *here >= MAX_SERVICE_STREAMS_PER_CONNECTION {
            refused("max_service_streams_per_connection");
            return Err(Status::resource_exhausted(format!(
                "too many health watches and reflection streams on this connection: {here} open, the limit is \
                 {MAX_SERVICE_STREAMS_PER_CONNECTION}"
            )));
        }
        *here += 1;
    }
    o.total += 1;
    Ok(ServiceStreamPlace { open: open.clone(), peer })
}

impl<S> Service<http::Request<tonic::body::Body>> for ServiceStreams<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if !SERVICE_STREAMS.contains(&req.uri().path()) {
            return Box::pin(self.inner.call(req));
        }
        let place = match service_stream_place(&self.open, peer_addr(req.extensions())) {
            Ok(place) => place,
            Err(status) => return Box::pin(std::future::ready(Ok(status.into_http()))),
        };
        let answer = self.inner.call(req);
        Box::pin(async move {
            let r = answer.await?;
            Ok(r.map(|inner| tonic::body::Body::new(PlacedBody { inner, _place: place })))
        })
    }
}

/// An answer's body that holds its stream's place until it is dropped.
struct PlacedBody {
    inner: tonic::body::Body,
    _place: ServiceStreamPlace,
}

impl http_body::Body for PlacedBody {
    type Data = tonic::codegen::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Status>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A deadline on every request body (but [`OPEN_ENDED_BODY`]'s): the whole body must have
/// arrived within `--request-body-timeout`, or the call ends with DEADLINE_EXCEEDED and gives
/// back every place it held. Without it, a client that declares a message and stops sending
/// holds a slot of the unary limit, and the bytes sent so far, for as long as it keeps the
/// connection open.
#[derive(Debug, Clone, Copy)]
pub struct BodyDeadlineLayer {
    pub timeout: Duration,
}

impl<S> Layer<S> for BodyDeadlineLayer {
    type Service = BodyDeadline<S>;

    fn layer(&self, inner: S) -> BodyDeadline<S> {
        BodyDeadline { inner, timeout: self.timeout }
    }
}

#[derive(Debug, Clone)]
pub struct BodyDeadline<S> {
    inner: S,
    timeout: Duration,
}

impl<S> Service<http::Request<tonic::body::Body>> for BodyDeadline<S>
where
    S: Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> S::Future {
        if req.uri().path() == OPEN_ENDED_BODY {
            return self.inner.call(req);
        }
        let timeout = self.timeout;
        self.inner.call(req.map(|inner| {
            tonic::body::Body::new(DeadlineBody { inner, deadline: Box::pin(tokio::time::sleep(timeout)), timeout })
        }))
    }
}

/// A request body that fails with DEADLINE_EXCEEDED once its deadline passes while it waits for
/// more bytes.
struct DeadlineBody {
    inner: tonic::body::Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
}

impl http_body::Body for DeadlineBody {
    type Data = tonic::codegen::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Status>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame),
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    refused("request_body_timeout");
                    Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                        "the request's body did not arrive within {:?} (--request-body-timeout)",
                        this.timeout
                    )))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_that_come_back_after_a_refusal_are_announced_and_no_others() {
        let budget = ByteBudget::new(250);
        let mut returned = budget.returned();
        assert_eq!(budget.take_units(2, 100), 2);
        budget.give(100);
        assert!(!returned.has_changed().unwrap(), "no one was refused: a give says nothing");
        assert_eq!(budget.take_units(3, 100), 1, "150 free: one unit");
        assert!(!returned.has_changed().unwrap(), "nothing came back yet");
        budget.give(100);
        assert!(returned.has_changed().unwrap(), "a refused taker is told");
        returned.borrow_and_update();
        budget.give(100);
        assert!(!returned.has_changed().unwrap(), "once per refusal");
        assert_eq!(budget.available(), 250);
        // A refusal while too little is free announces nothing; the next give does. (A give
        // that races with a refusal, between its take and its flag, is announced by the
        // refusal itself, which looks at what is free once more: `take_units`.)
        assert_eq!(budget.take_units(1, 300), 0);
        assert!(!returned.has_changed().unwrap(), "250 free is no unit of 300");
        assert_eq!(budget.take_units(5, 50), 5);
        assert_eq!(budget.take_units(1, 50), 0);
        budget.give(50);
        assert!(returned.has_changed().unwrap());
    }

    #[test]
    fn a_principals_streams_are_bounded_apart_from_the_process_and_given_back() {
        let limits = Limits { max_streams_per_principal: 2, ..Limits::DEFAULT };
        let l = StreamLimiter::new(limits);
        let (a, b) = (QuotaKey("a".into()), QuotaKey("b".into()));
        let first = l.acquire_principal(Some(&a)).unwrap();
        let _second = l.acquire_principal(Some(&a)).unwrap();
        let err = l.acquire_principal(Some(&a)).unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("--max-streams-per-principal") && err.message().contains("\"a\""), "{err:?}");
        assert!(l.acquire_principal(Some(&b)).is_ok(), "another principal is not affected");
        assert_eq!(l.open(), 0, "waiting streams take no place of the process");
        drop(first);
        assert!(l.acquire_principal(Some(&a)).is_ok(), "given back when dropped");
        let unrestricted: Vec<_> = (0..10).map(|_| l.acquire_principal(None).unwrap()).collect();
        assert_eq!(unrestricted.len(), 10, "no auth file: no per-principal quota");
        let shared = unrestricted.iter().map(|p| p.in_flight_bytes().expect("a byte budget without an auth file"));
        assert!(shared.clone().all(|b| Arc::ptr_eq(&b, &unrestricted[0].in_flight_bytes().unwrap())), "one budget");
        assert_eq!(shared.map(|b| b.limit()).max(), Some(Limits::DEFAULT.max_in_flight_bytes_per_principal));
    }

    fn peer(port: u16) -> Option<SocketAddr> {
        Some(SocketAddr::from(([127, 0, 0, 1], port)))
    }

    #[test]
    fn streams_are_counted_per_connection_and_per_process_and_given_back() {
        let limiter = StreamLimiter::new(Limits { max_streams: 3, max_streams_per_connection: 2, ..Limits::DEFAULT });
        let a1 = limiter.acquire(peer(1)).unwrap();
        let _a2 = limiter.acquire(peer(1)).unwrap();
        let e = limiter.acquire(peer(1)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("--max-streams-per-connection") && e.message().contains("2"), "{e:?}");
        let _b1 = limiter.acquire(peer(2)).unwrap();
        let e = limiter.acquire(peer(3)).unwrap_err();
        assert!(e.message().contains("(--max-streams)") && e.message().contains("3"), "{e:?}");
        assert_eq!(limiter.open(), 3);
        drop(a1);
        assert_eq!(limiter.open(), 2);
        let _c1 = limiter.acquire(peer(3)).unwrap();
        let _a3 = limiter.acquire(None).unwrap_err();
    }

    #[test]
    fn only_outboxd_unary_calls_are_shed() {
        assert!(is_limited_unary("/outbox.v1.Outbox/Enqueue"));
        assert!(is_limited_unary("/outbox.v1.OutboxAdmin/GetStats"));
        assert!(!is_limited_unary("/outbox.v1.Outbox/Subscribe"));
        assert!(!is_limited_unary("/outbox.v1.OutboxAdmin/Tail"));
        assert!(!is_limited_unary("/outbox.v1.OutboxAdmin/ReplayStream"));
        assert!(!is_limited_unary("/grpc.health.v1.Health/Check"));
        assert!(!is_limited_unary("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"));
    }

    /// A call in progress holds its place until it is answered; the next one is refused at once
    /// with UNAVAILABLE naming the flag; streams pass while the limit is reached.
    #[tokio::test]
    async fn unary_calls_beyond_the_limit_are_shed_and_streams_pass() {
        let (release, released) = tokio::sync::watch::channel(false);
        let inner = tower::service_fn(move |req: http::Request<()>| {
            let mut released = released.clone();
            async move {
                if req.uri().path().ends_with("/Slow") {
                    let _ = released.wait_for(|r| *r).await;
                }
                Ok::<_, std::convert::Infallible>(req.uri().path().to_owned())
            }
        });
        let svc = UnaryLimitLayer::new(1, 1).layer(inner);
        let call = |path: &str| {
            let req = http::Request::builder().uri(path).body(()).unwrap();
            svc.clone().oneshot(req)
        };
        let slow = tokio::spawn(call("/outbox.v1.OutboxAdmin/Slow"));
        // The slow call holds the only place once it is in progress.
        let mut shed = None;
        for _ in 0..1000 {
            match call("/outbox.v1.Outbox/Enqueue").await {
                Err(e) => {
                    shed = Some(e);
                    break;
                }
                Ok(_) => tokio::task::yield_now().await,
            }
        }
        let shed = shed.expect("no call was shed while the slow one was in progress");
        let status = shed.downcast::<Status>().unwrap();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(status.message().contains("limit of 1") && status.message().contains("--max-concurrent-requests"));
        assert!(call("/outbox.v1.Outbox/Subscribe").await.is_ok());
        assert!(call("/grpc.health.v1.Health/Check").await.is_ok());
        release.send_replace(true);
        assert_eq!(slow.await.unwrap().unwrap(), "/outbox.v1.OutboxAdmin/Slow");
        assert!(call("/outbox.v1.Outbox/Enqueue").await.is_ok(), "the place was not given back");
    }

    #[test]
    fn flags_are_validated_and_size_http2() {
        assert!(Limits::DEFAULT.validate().is_ok());
        let e = Limits { max_streams: 0, ..Limits::DEFAULT }.validate().unwrap_err();
        assert!(e.contains("--max-streams"), "{e}");
        let e = Limits { request_body_timeout: Duration::ZERO, ..Limits::DEFAULT }.validate().unwrap_err();
        assert!(e.contains("--request-body-timeout"), "{e}");
        let e = Limits { max_requests_per_principal: 0, ..Limits::DEFAULT }.validate().unwrap_err();
        assert!(e.contains("--max-requests-per-principal"), "{e}");
        assert_eq!(Limits::DEFAULT.http2_max_concurrent_streams(), 356);
    }
}

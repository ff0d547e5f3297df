//! What any one client can make outboxd hold (ADR 0023): the fixed bounds on a message's and a
//! consumer's shape, which the database enforces too, and the per-process resource limits, which
//! are flags — streams per process and per connection, and unary requests in progress, beyond
//! which requests are shed at once instead of queueing without bound.
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
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
/// Requests refused by a resource limit, by `limit` (the flag's name without dashes).
pub const REFUSALS: &str = "outboxd_limit_refusals_total";

fn refused(limit: &'static str) {
    metrics::counter!(REFUSALS, "limit" => limit).increment(1);
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
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl Limits {
    pub const DEFAULT: Limits =
        Limits { max_streams: 1000, max_streams_per_connection: 100, max_concurrent_requests: 256 };

    /// Names the flag that cannot work.
    pub fn validate(&self) -> Result<(), String> {
        for (flag, v) in [
            ("--max-streams", self.max_streams),
            ("--max-streams-per-connection", self.max_streams_per_connection),
            ("--max-concurrent-requests", self.max_concurrent_requests),
        ] {
            if v == 0 || v > 1_000_000 {
                return Err(format!("{flag} must be between 1 and 1000000, not {v}"));
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
}

#[derive(Debug, Default)]
struct OpenStreams {
    total: usize,
    per_peer: HashMap<SocketAddr, usize>,
}

/// One open stream's place; returned when dropped.
#[derive(Debug)]
pub struct StreamPermit {
    open: Arc<Mutex<OpenStreams>>,
    peer: Option<SocketAddr>,
}

impl StreamLimiter {
    pub fn new(limits: Limits) -> Self {
        Self { limits, open: Arc::default() }
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
#[derive(Debug, Clone)]
pub struct UnaryLimitLayer {
    semaphore: Arc<Semaphore>,
    max: usize,
}

impl UnaryLimitLayer {
    pub fn new(max: usize) -> Self {
        Self { semaphore: Arc::new(Semaphore::new(max)), max }
    }
}

impl<S: Clone> Layer<S> for UnaryLimitLayer {
    type Service = UnaryLimit<S>;

    fn layer(&self, inner: S) -> UnaryLimit<S> {
        UnaryLimit {
            limited: LoadShed::new(ConcurrencyLimit::with_semaphore(inner.clone(), self.semaphore.clone())),
            inner,
            max: self.max,
        }
    }
}

#[derive(Debug, Clone)]
pub struct UnaryLimit<S> {
    inner: S,
    limited: LoadShed<ConcurrencyLimit<S>>,
    max: usize,
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
        // `ready` on the clone takes a permit if one is free; load shed turns "none free" into
        // an immediate error instead of a wait. The permit is held until the call is answered.
        let limited = self.limited.clone();
        let max = self.max;
        Box::pin(async move {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let svc = UnaryLimitLayer::new(1).layer(inner);
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
        assert_eq!(Limits::DEFAULT.http2_max_concurrent_streams(), 356);
    }
}

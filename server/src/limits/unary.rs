//! Load shedding of unary calls: the process's bound on calls in progress, and each principal's
//! quota before it.
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::Semaphore;
use tonic::Status;
use tonic::codegen::http;
use tower::limit::ConcurrencyLimit;
use tower::load_shed::LoadShed;
use tower::{Layer, Service, ServiceExt};

use super::refused;
use super::streams::QuotaKey;

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

//! The layers that tell a listener's places what each connection's requests are: a stream of
//! outboxd's own services makes a connection used; on a health-only place, anything but health
//! retires it.
use std::task::{Context, Poll};

use super::places::ConnectionLimit;

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

impl ConnectionLimit {
    /// A layer that tells this limit of each stream a connection opens (put it inside
    /// authentication, so that refused requests do not count).
    pub fn stream_layer(&self) -> StreamOpenedLayer {
        StreamOpenedLayer { limit: self.clone() }
    }
}

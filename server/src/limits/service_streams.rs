//! The streams of health checking and reflection, counted apart from `Subscribe`'s places.
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tonic::Status;
use tonic::codegen::http;
use tower::{Layer, Service};

use super::{peer_addr, refused};

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

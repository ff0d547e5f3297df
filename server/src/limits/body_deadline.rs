//! The deadline on every request body but the one that stays open (`Subscribe`'s acks).
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::Status;
use tonic::codegen::http;
use tower::{Layer, Service};

use super::refused;

/// The one method whose request body stays open for as long as its client wants (a `Subscribe`
/// stream's acks): its first message, `start`, has the same deadline in the service instead.
const OPEN_ENDED_BODY: &str = "/outbox.v1.Outbox/Subscribe";

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

//! The tower layer in front of every service: which method needs what ([`route`]), and the
//! [`AuthLayer`] that authenticates each request and refuses, from its headers, what its caller
//! may not call at all.
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Request as HttpRequest, Response as HttpResponse};
use tonic::Status;
use tonic::body::Body;

use super::authenticator::Authenticator;
use super::caller::{Caller, count};
use super::permission::{Kind, Need};

/// How the layer treats a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// gRPC health checking: open to load balancers.
    Open,
    /// Reflection: any valid credential.
    AnyCredential,
    /// A permission without a resource, checked by the layer.
    Checked(Need<'static>),
    /// Checked by the service against the request's content (topic, consumer); the layer
    /// refuses at once a caller that holds no permission of the kind.
    ByService(Kind),
}

/// Every method of `outbox.v1.Outbox` and `outbox.v1.OutboxAdmin`, with what it needs. A
/// method missing here needs `*`.
pub fn route(path: &str) -> Route {
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return Route::Checked(Need::Everything);
    };
    match (service, method) {
        ("grpc.health.v1.Health", _) => Route::Open,
        ("grpc.reflection.v1.ServerReflection" | "grpc.reflection.v1alpha.ServerReflection", _) => Route::AnyCredential,
        ("outbox.v1.Outbox", "Enqueue" | "EnqueueBatch") => Route::ByService(Kind::Produce),
        ("outbox.v1.Outbox", "Subscribe") => Route::ByService(Kind::Consume),
        ("outbox.v1.OutboxAdmin", "Tail") => Route::ByService(Kind::Tail),
        ("outbox.v1.OutboxAdmin", "Replay" | "ReplayStream" | "ReleaseKey") => Route::ByService(Kind::Replay),
        (
            "outbox.v1.OutboxAdmin",
            "GetStats" | "GetConsumer" | "ListConsumers" | "ListDeadLetters" | "GetMessage" | "ListHeldKeys",
        ) => Route::Checked(Need::AdminRead),
        (
            "outbox.v1.OutboxAdmin",
            "CreateConsumer" | "DeleteConsumer" | "PauseConsumer" | "ResumeConsumer" | "Prune",
        ) => Route::Checked(Need::AdminWrite),
        _ => Route::Checked(Need::Everything),
    }
}

/// Authenticates every request before it reaches a service (see the module's doc).
#[derive(Debug, Clone)]
pub struct AuthLayer {
    pub auth: Authenticator,
}

impl<S> tower_layer::Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService { inner, auth: self.auth.clone() }
    }
}

#[derive(Debug, Clone)]
pub struct AuthService<S> {
    inner: S,
    auth: Authenticator,
}

type BoxFuture<T, E> = Pin<Box<dyn std::future::Future<Output = Result<T, E>> + Send>>;

impl<S> tower_service::Service<HttpRequest<Body>> for AuthService<S>
where
    S: tower_service::Service<HttpRequest<Body>, Response = HttpResponse<Body>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = HttpResponse<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: HttpRequest<Body>) -> Self::Future {
        // The clone that was not polled ready takes the place of the one that was.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let route = route(req.uri().path());
        if route == Route::Open {
            return answer(inner.call(req));
        }
        let caller = match self.auth.authenticate(req.headers(), req.extensions()) {
            Ok(c) => c,
            Err(status) => return refuse(&req, route, None, status),
        };
        match route {
            Route::AnyCredential if caller.principal.is_some() => count(&caller.name, "allowed"),
            Route::Checked(need) => {
                if let Err(status) = caller.check(need) {
                    return refuse(&req, route, Some(&caller), status);
                }
            }
            // Refused from the headers: the body of a caller that may not call this method at
            // all is never read, and it takes no slot of any limit.
            Route::ByService(kind) => {
                if let Err(status) = caller.check_kind(kind) {
                    return refuse(&req, route, Some(&caller), status);
                }
            }
            _ => {}
        }
        if caller.principal.is_some() {
            req.extensions_mut().insert(crate::limits::QuotaKey(caller.name.clone()));
        }
        req.extensions_mut().insert(caller);
        answer(inner.call(req))
    }
}

/// The service's answer, with a request that does not decode (malformed protobuf) answered
/// `INVALID_ARGUMENT`, as gRPC's status codes ask for a client's bad request: tonic's decoder
/// says `INTERNAL`, which tells a client the server is broken.
fn answer<F, E>(call: F) -> BoxFuture<HttpResponse<Body>, E>
where
    F: std::future::Future<Output = Result<HttpResponse<Body>, E>> + Send + 'static,
{
    Box::pin(async move {
        let mut response = call.await?;
        let headers = response.headers_mut();
        let undecodable = headers.get("grpc-status").is_some_and(|s| s.as_bytes() == b"13")
            && headers.get("grpc-message").is_some_and(|m| {
                percent_encoding::percent_decode(m.as_bytes())
                    .decode_utf8_lossy()
                    .starts_with("failed to decode Protobuf")
            });
        if undecodable {
            headers.insert("grpc-status", http::HeaderValue::from_static("3"));
        }
        Ok(response)
    })
}

/// The refusal as a response; admin writes refused before their request was read are
/// audited with their method.
fn refuse<E: Send + 'static>(
    req: &HttpRequest<Body>,
    route: Route,
    caller: Option<&Caller>,
    status: Status,
) -> BoxFuture<HttpResponse<Body>, E> {
    if route == Route::Checked(Need::AdminWrite) {
        let peer = crate::limits::peer_addr(req.extensions());
        let principal = caller.map_or("unknown", |c| &c.name);
        let action = req.uri().path();
        tracing::warn!(
            target: "outboxd::audit", principal, ?peer, action, outcome = ?status.code(), error = status.message(),
            "admin write refused"
        );
    }
    Box::pin(std::future::ready(Ok(status.into_http())))
}

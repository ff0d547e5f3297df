//! The web console (`--console-listen`): pages for the people who run outboxd, served on their
//! own listener, rendered on the server ([`views`], compile-time HTML with escaping), with two
//! small scripts of its own and a vendored chart library, all compiled into the binary
//! ([`assets`]).
//!
//! It holds no data of its own: every page reads and acts through the admin API's service
//! ([`crate::grpc::admin::AdminService`]), called in-process as the signed-in principal, so the
//! permissions, payload redaction, limits and audit lines are the RPCs' own ([`session`],
//! [`viewer`]).
//! Figures come from the stats outboxd keeps, cached for a moment and shared by every tab
//! ([`history`]); every list is bounded (limits, cursors).
//!
//! The listener takes connections as the gRPC one does (bounded in number and per client
//! address, TLS with the same certificate when configured), HTTP/1.1 only, with a deadline on
//! each request's headers; requests of signed-in principals and of anyone else take places of
//! separate counts, and failed sign-ins are limited per client address ([`places`]).
mod assets;
mod history;
mod nav;
mod pages;
mod places;
mod session;
mod viewer;
mod views;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_stream::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::grpc::admin::AdminService;
use crate::grpc::auth::Authenticator;
use crate::listen::ConnectionLimit;
use crate::tls::TlsState;

pub use session::SessionTimes;

/// How long a client may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request may take in all, its body included: a slow body gives up its place.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// Connections the console's listener keeps open at once (each may hold a page being sent).
pub const MAX_CONNECTIONS: usize = 256;
/// Connections one client address may keep open on the console (browsers open six or so).
pub const MAX_CONNECTIONS_PER_PEER: usize = 16;
/// The largest form a page posts (a token, a CSRF token, an error text).
const MAX_BODY_BYTES: usize = 16 * 1024;

/// What every handler shares.
#[derive(Debug)]
pub(crate) struct State {
    pub admin: AdminService,
    pub auth: Authenticator,
    /// Signs the CSRF tokens of the sessions that are not stored (without an auth file, over
    /// mutual TLS): HMAC-SHA256 of what identifies the session.
    pub csrf_key: [u8; 32],
    /// How long a signed-in session lasts (ADR 0073).
    pub sessions: SessionTimes,
    /// Served over TLS: cookies are `Secure`.
    pub secure: bool,
    pub history: history::History,
    /// `--console-trace-url`.
    pub trace_url: Option<String>,
    /// Served without authentication on a loopback address: only requests addressed to a
    /// loopback host are answered (no DNS rebinding from a web page).
    pub loopback_only: bool,
    /// Sessions this process found valid lately: which requests take a signed-in place.
    pub recent: session::RecentSessions,
}

/// The console of one outboxd process.
#[derive(Debug, Clone)]
pub struct Console {
    state: Arc<State>,
}

/// The peer of a console connection, for audit lines.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub Option<SocketAddr>);

/// The client certificate (DER) of a console connection over mutual TLS.
#[derive(Debug, Clone)]
pub(crate) struct PeerCert(pub Arc<[u8]>);

impl Console {
    pub fn new(
        admin: AdminService,
        auth: Authenticator,
        secure: bool,
        trace_url: Option<String>,
        listen: SocketAddr,
        sessions: SessionTimes,
    ) -> Result<Self, getrandom::Error> {
        let loopback_only = !auth.enabled() && crate::listen::is_loopback(listen.ip());
        let mut csrf_key = [0u8; 32];
        getrandom::fill(&mut csrf_key)?;
        let history = history::History::new(admin.ctx.store.clone(), admin.ctx.clock.clone(), admin.ctx.hub.clone());
        Ok(Self {
            state: Arc::new(State {
                admin,
                auth,
                csrf_key,
                sessions,
                secure,
                history,
                trace_url,
                loopback_only,
                recent: session::RecentSessions::default(),
            }),
        })
    }

    /// Samples the stats for the lag charts every minute until `cancel`.
    pub async fn sample(self, cancel: CancellationToken) {
        self.state.history.run(cancel).await;
    }

    fn router(&self) -> Router {
        pages::router(self.state.clone()).layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
    }

    /// Serves on `listener` (with TLS when `tls` is given) until `stop`, then lets requests in
    /// progress finish.
    pub async fn serve(
        self,
        listener: TcpListener,
        tls: Option<TlsState>,
        limit: ConnectionLimit,
        stop: CancellationToken,
    ) {
        // Place counts for the whole listener (a layer on the router would count per route).
        let router =
            Handler { state: self.state.clone(), places: Arc::default(), router: self.router(), limit: limit.clone() };
        let flush = router.places.clone();
        let flushing = stop.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(places::SIGN_IN_WINDOW / 4);
            loop {
                tokio::select! {
                    _ = flushing.cancelled() => return flush.flush(),
                    _ = every.tick() => flush.flush(),
                }
            }
        });
        match tls {
            Some(tls) => {
                let mut incoming = tls.incoming(listener, limit, stop.clone());
                while let Some(Ok(conn)) = incoming.next().await {
                    let (tcp, session) = conn.get_ref().get_ref();
                    let peer = Peer(tcp.peer_addr().ok());
                    let cert = session.peer_certificates().and_then(|c| c.first()).map(|c| PeerCert(c.as_ref().into()));
                    tokio::spawn(connection(conn, router.clone(), peer, cert, stop.clone()));
                }
            }
            None => loop {
                let (tcp, addr) = tokio::select! {
                    _ = stop.cancelled() => return,
                    a = listener.accept() => match a {
                        Ok(a) => a,
                        Err(e) => {
                            tracing::warn!(error = %e, "console accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                let Some(place) = limit.admit(addr) else { continue };
                let conn = limit.guard(tcp, place);
                tokio::spawn(connection(conn, router.clone(), Peer(Some(addr)), None, stop.clone()));
            },
        }
    }
}

/// The router behind its places (ADR 0075).
#[derive(Debug, Clone)]
struct Handler {
    state: Arc<State>,
    places: Arc<places::Places>,
    router: Router,
    /// The listener's connections: a connection that serves a signed-in request keeps its
    /// place when the listener is full (ADR 0079).
    limit: ConnectionLimit,
}

impl Handler {
    /// A request in a place of its kind: a signed-in principal's, or anyone else's (bounded per
    /// client), the kind known from its headers before any of its body is read; a client that
    /// has failed to sign in too often is answered 429 before its form is read.
    async fn handle(self, peer: Peer, req: axum::extract::Request) -> axum::response::Response {
        use axum::http::{Method, StatusCode, header};
        use axum::response::IntoResponse as _;
        let busy = |why: &'static str| (StatusCode::SERVICE_UNAVAILABLE, why).into_response();
        let sign_in = req.method() == Method::POST && req.uri().path() == "/login";
        if sign_in && let Some(wait) = self.places.sign_in_blocked(peer.0) {
            let secs = wait.as_secs().max(1);
            let mut r = (
                StatusCode::TOO_MANY_REQUESTS,
                format!("too many failed sign-ins from this address: try again in {secs} s"),
            )
                .into_response();
            r.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(secs));
            return r;
        }
        let (mut parts, body) = req.into_parts();
        // A stored session is checked in the database, so the kind of place is decided without
        // it: a cookie of a session this process found valid lately takes a signed-in place (the
        // page checks it again), any other cookie an anonymous one, so that made-up cookies
        // cost a database read only inside the anonymous places.
        let signed_in = match session::session_id(&parts.headers, &self.state) {
            Some(id) => self.state.recent.holds(&id),
            None => <viewer::Viewer as axum::extract::FromRequestParts<Arc<State>>>::from_request_parts(
                &mut parts,
                &self.state,
            )
            .await
            .ok()
            .map(|v| v.caller.name),
        };
        // The body is read before a place is taken: a stalled body holds its connection (bounded
        // per client, and by the request's deadline), never a place that others wait for. At
        // most MAX_BODY_BYTES: the pages take small forms only.
        let started = tokio::time::Instant::now();
        let body = match tokio::time::timeout(REQUEST_TIMEOUT, axum::body::to_bytes(body, MAX_BODY_BYTES)).await {
            Ok(Ok(bytes)) => axum::body::Body::from(bytes),
            Ok(Err(_)) => {
                return (StatusCode::PAYLOAD_TOO_LARGE, format!("a request body is at most {MAX_BODY_BYTES} bytes"))
                    .into_response();
            }
            Err(_) => {
                return (StatusCode::REQUEST_TIMEOUT, "the request's body did not arrive in time").into_response();
            }
        };
        let req = axum::extract::Request::from_parts(parts, body);
        let place = match &signed_in {
            Some(principal) => self.places.signed_in(principal.clone()),
            None => self.places.anonymous(peer.0),
        };
        let Some(_place) = place else { return busy("the console is busy: try again in a moment") };
        let left = REQUEST_TIMEOUT.saturating_sub(started.elapsed());
        let answer = match tokio::time::timeout(left, tower::ServiceExt::oneshot(self.router, req)).await {
            Ok(Ok(r)) => r,
            Ok(Err(never)) => match never {},
            Err(_) => busy("the request took too long (its body or its reads)"),
        };
        if sign_in && answer.status() == StatusCode::UNAUTHORIZED {
            self.places.sign_in_failed(peer.0);
        }
        if signed_in.is_some()
            && answer.status().is_success()
            && let Some(addr) = peer.0
        {
            self.limit.opened(addr);
        }
        answer
    }
}

/// One HTTP/1.1 connection, closed gracefully at `stop`.
async fn connection<S>(io: S, router: Handler, peer: Peer, cert: Option<PeerCert>, stop: CancellationToken)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(peer);
        if let Some(c) = &cert {
            req.extensions_mut().insert(c.clone());
        }
        let router = router.clone();
        async move { Ok::<_, Infallible>(router.handle(peer, req.map(axum::body::Body::new)).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), service);
    let mut conn = std::pin::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(error = %e, "console connection ended");
            }
        }
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
        }
    }
}

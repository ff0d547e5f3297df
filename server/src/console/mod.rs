//! The web console (`--console-listen`): pages for the people who run outboxd, served on their
//! own listener, rendered on the server ([`views`], compile-time HTML with escaping), with two
//! small scripts of its own and a vendored chart library, all compiled into the binary
//! ([`assets`]).
//!
//! It holds no data of its own: every page reads and acts through the admin API's service
//! ([`crate::grpc::admin::AdminService`]), called in-process as the signed-in principal, so the
//! permissions, payload redaction, limits and audit lines are the RPCs' own ([`session`]).
//! Figures come from the stats outboxd keeps, cached for a moment and shared by every tab
//! ([`history`]); every list is bounded (limits, cursors).
//!
//! The listener takes connections as the gRPC one does (bounded in number, TLS with the same
//! certificate when configured), HTTP/1.1 only, with a deadline on each request's headers.
mod assets;
mod history;
mod pages;
mod session;
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
/// Requests handled at once, on the whole listener; more are answered 503 at once rather than
/// queued. Each reads the database through the pool the data plane uses, so this bounds what
/// the console can take of it.
const MAX_CONCURRENT_REQUESTS: usize = 8;
/// Connections the console's listener keeps open at once (each may hold a page being sent).
pub const MAX_CONNECTIONS: usize = 256;
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
            state: Arc::new(State { admin, auth, csrf_key, sessions, secure, history, trace_url, loopback_only }),
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
        // One place count for the whole listener (a layer on the router would count per route).
        let router = tower::ServiceBuilder::new()
            .load_shed()
            .layer(tower::limit::GlobalConcurrencyLimitLayer::new(MAX_CONCURRENT_REQUESTS))
            .service(self.router());
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
                let Some(place) = limit.admit() else { continue };
                let conn = limit.guard(tcp, place);
                tokio::spawn(connection(conn, router.clone(), Peer(Some(addr)), None, stop.clone()));
            },
        }
    }
}

type Service = tower::load_shed::LoadShed<tower::limit::ConcurrencyLimit<Router>>;

/// One HTTP/1.1 connection, closed gracefully at `stop`.
async fn connection<S>(io: S, router: Service, peer: Peer, cert: Option<PeerCert>, stop: CancellationToken)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(peer);
        if let Some(c) = &cert {
            req.extensions_mut().insert(c.clone());
        }
        let router = router.clone();
        async move {
            let req = req.map(axum::body::Body::new);
            let busy = |why: &'static str| {
                axum::response::IntoResponse::into_response((axum::http::StatusCode::SERVICE_UNAVAILABLE, why))
            };
            let answer = match tokio::time::timeout(REQUEST_TIMEOUT, tower::ServiceExt::oneshot(router, req)).await {
                Ok(Ok(r)) => r,
                Ok(Err(_)) => busy("the console is busy: try again in a moment"),
                Err(_) => busy("the request took too long (its body or its reads)"),
            };
            Ok::<_, Infallible>(answer)
        }
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

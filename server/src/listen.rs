//! Accepting client connections, bounded: at most `--max-client-connections` open on each listener,
//! and each one must send HTTP/2's connection preface within `--http2-preface-timeout` (after
//! the TLS handshake, with TLS), or it is closed. Without these, a client that opens
//! connections and sends nothing holds a socket, a task and a connection's buffers each, for as
//! long as it likes, on every listener, the unauthenticated health listener included.
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::{Stream, StreamExt as _};
use tonic::transport::server::Connected;

use crate::metrics::CONNECTIONS_CLOSED;

/// `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`: what an HTTP/2 client sends first.
const PREFACE_LEN: usize = 24;

/// 127.0.0.0/8 and ::1, also written as an IPv4-mapped IPv6 address: where outboxd serves
/// without authentication.
pub fn is_loopback(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4.is_loopback(),
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(v6.is_loopback(), |v4| v4.is_loopback()),
    }
}

/// The connections of one listener: a place for each, up to the limit.
#[derive(Debug, Clone)]
pub struct ConnectionLimit {
    places: Arc<Semaphore>,
    max: usize,
    preface_timeout: Duration,
}

impl ConnectionLimit {
    pub fn new(max: usize, preface_timeout: Duration) -> Self {
        Self { places: Arc::new(Semaphore::new(max)), max, preface_timeout }
    }

    /// A place for a connection just accepted, or `None` (and it is counted) when every place
    /// is taken: the caller drops the connection.
    pub fn admit(&self) -> Option<OwnedSemaphorePermit> {
        let place = self.places.clone().try_acquire_owned().ok();
        if place.is_none() {
            metrics::counter!(CONNECTIONS_CLOSED, "reason" => "max_client_connections").increment(1);
            tracing::debug!(max = self.max, "connection refused: --max-client-connections reached");
        }
        place
    }

    /// `io` with its place, and the preface deadline armed.
    pub fn guard<S>(&self, io: S, place: OwnedSemaphorePermit) -> Guarded<S> {
        Guarded { inner: io, preface: Some((Box::pin(tokio::time::sleep(self.preface_timeout)), 0)), _place: place }
    }

    /// Plaintext connections accepted on `listener`, guarded.
    pub fn incoming(self, listener: TcpListener) -> impl Stream<Item = io::Result<Guarded<TcpStream>>> {
        tokio_stream::wrappers::TcpListenerStream::new(listener).filter_map(move |accepted| match accepted {
            Ok(tcp) => self.admit().map(|place| Ok(self.guard(tcp, place))),
            Err(e) => Some(Err(e)),
        })
    }
}

/// A connection that holds its place until it is dropped, and fails its reads with
/// `TimedOut` if the preface has not arrived by its deadline.
#[derive(Debug)]
pub struct Guarded<S> {
    inner: S,
    /// The deadline and the bytes read so far, until the preface's 24 have arrived.
    preface: Option<(Pin<Box<tokio::time::Sleep>>, usize)>,
    _place: OwnedSemaphorePermit,
}

impl<S> Guarded<S> {
    /// The connection inside (its peer, its TLS session).
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if let Some((_, got)) = &mut this.preface {
                    *got += buf.filled().len() - before;
                    if *got >= PREFACE_LEN {
                        this.preface = None;
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let expired = match &mut this.preface {
                    Some((deadline, _)) => deadline.as_mut().poll(cx).is_ready(),
                    None => false,
                };
                if !expired {
                    return Poll::Pending;
                }
                metrics::counter!(CONNECTIONS_CLOSED, "reason" => "preface_timeout").increment(1);
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no HTTP/2 preface within --http2-preface-timeout",
                )))
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
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

//! A connection with its place: its reads and writes fail once a deadline passes, its place
//! is taken back, or it floods control frames; a retired one is sent GOAWAY first.
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::{Stream, StreamExt as _};
use tonic::transport::server::Connected;

use crate::metrics::CONNECTIONS_CLOSED;

use super::frames::{CONTROL_FRAME_WINDOW, ENHANCE_YOUR_CALM, FrameCounter, MAX_CONTROL_FRAMES, NO_ERROR, PREFACE_LEN};
use super::places::{ConnectionLimit, Place};
use super::{Kind, RETIRE_GRACE};

/// A connection that holds its place until it is dropped, and fails its reads with
/// `TimedOut` if the preface, or its first stream, has not arrived by its deadline, or when it
/// floods PING or SETTINGS frames.
#[derive(Debug)]
pub struct Guarded<S> {
    inner: S,
    /// The deadline and the bytes read so far, until the preface's 24 have arrived.
    preface: Option<(Pin<Box<tokio::time::Sleep>>, usize)>,
    /// The first stream's deadline, until it is found to have opened.
    first_stream: Option<Pin<Box<tokio::time::Sleep>>>,
    frames: Option<FrameCounter>,
    /// Ready when another connection has been given this one's place.
    evicted: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    /// Ready when the connection is to be retired: a GOAWAY goes out, then `retiring` runs.
    retired: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    /// Once the GOAWAY is out, how long the client has left to close the connection.
    retiring: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A GOAWAY went out in part: the connection's framing is broken, it fails at once.
    broken: bool,
    place: Place,
}

impl<S> Guarded<S> {
    /// The connection inside (its peer, its TLS session).
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// What its place lets it do.
    pub fn kind(&self) -> Kind {
        self.place.kind
    }
}

impl<S: AsyncWrite + Unpin> Guarded<S> {
    /// A write that waits (the client does not read) fails instead when a deadline has passed
    /// or the place was taken back: a connection whose client stops reading is not read from
    /// either, and would otherwise outlive every deadline, and its place, with its socket.
    fn unless_expired<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match r {
            Poll::Pending => match self.expired(cx) {
                Some(e) => Poll::Ready(Err(e)),
                None => Poll::Pending,
            },
            ready => ready,
        }
    }

    /// A retired connection's GOAWAY, if it can go now: between two of h2's frames (the
    /// answers under way keep going). When h2 is in the middle of a frame, it goes after one of
    /// h2's next writes ends a frame. The error when the connection is to close instead.
    fn send_goaway(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        if self.retiring.is_some() || !self.place.slot.retired.is_cancelled() {
            return None;
        }
        let Some(frames) = &self.frames else {
            return Some(io::Error::new(io::ErrorKind::ConnectionAborted, "retired"));
        };
        let frame = frames.goaway(NO_ERROR)?;
        match Pin::new(&mut self.inner).poll_write(cx, &frame) {
            Poll::Ready(Ok(n)) if n == frame.len() => {
                let _ = Pin::new(&mut self.inner).poll_flush(cx);
                let mut grace = Box::pin(tokio::time::sleep(RETIRE_GRACE));
                let _ = grace.as_mut().poll(cx);
                self.retiring = Some(grace);
                None
            }
            Poll::Pending => None,
            Poll::Ready(Ok(n)) if n > 0 => {
                self.broken = true;
                Some(io::Error::new(io::ErrorKind::ConnectionAborted, "a GOAWAY went out in part"))
            }
            _ => Some(io::Error::new(io::ErrorKind::ConnectionAborted, "retired")),
        }
    }

    /// Whether a deadline has passed: the error to fail the read with.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        if self.broken {
            return Some(io::Error::new(io::ErrorKind::ConnectionAborted, "a GOAWAY went out in part"));
        }
        if self.evicted.as_mut().poll(cx).is_ready() {
            return Some(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "every place was taken: this connection, not used yet, gave its place to a new one",
            ));
        }
        if let Some(grace) = &mut self.retiring {
            if grace.as_mut().poll(cx).is_ready() {
                return Some(io::Error::new(io::ErrorKind::ConnectionAborted, "retired, and kept past its GOAWAY"));
            }
        } else if self.retired.as_mut().poll(cx).is_ready()
            && let Some(e) = self.send_goaway(cx)
        {
            return Some(e);
        }
        if let Some((deadline, _)) = &mut self.preface
            && deadline.as_mut().poll(cx).is_ready()
        {
            metrics::counter!(CONNECTIONS_CLOSED, "reason" => "preface_timeout").increment(1);
            return Some(io::Error::new(io::ErrorKind::TimedOut, "no HTTP/2 preface within --http2-preface-timeout"));
        }
        if let Some(deadline) = &mut self.first_stream
            && deadline.as_mut().poll(cx).is_ready()
        {
            let waiting = self.place.unused();
            self.first_stream = None;
            if waiting {
                metrics::counter!(CONNECTIONS_CLOSED, "reason" => "first_stream_timeout").increment(1);
                tracing::debug!(peer = %self.place.addr, "connection closed: no stream within --http2-first-stream-timeout");
                return Some(io::Error::new(io::ErrorKind::TimedOut, "no stream within --http2-first-stream-timeout"));
            }
        }
        None
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = &buf.filled()[before..];
                if let Some((_, got)) = &mut this.preface {
                    *got += read.len();
                    if *got >= PREFACE_LEN {
                        this.preface = None;
                    }
                }
                if let Some(frames) = &mut this.frames
                    && !frames.read(read)
                {
                    metrics::counter!(CONNECTIONS_CLOSED, "reason" => "control_frame_flood").increment(1);
                    tracing::debug!(peer = %this.place.addr, "connection closed: PING or SETTINGS flood");
                    // Best effort: the connection is closed whether or not the GOAWAY fits.
                    if let Some(goaway) = frames.goaway(ENHANCE_YOUR_CALM) {
                        let _ = Pin::new(&mut this.inner).poll_write(cx, &goaway);
                        let _ = Pin::new(&mut this.inner).poll_flush(cx);
                    }
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        format!(
                            "more than {MAX_CONTROL_FRAMES} HTTP/2 PING and SETTINGS frames in {CONTROL_FRAME_WINDOW:?}"
                        ),
                    )));
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match this.expired(cx) {
                Some(e) => Poll::Ready(Err(e)),
                None => Poll::Pending,
            },
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.broken {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "a GOAWAY went out in part")));
        }
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let (Poll::Ready(Ok(n)), Some(frames)) = (&written, &mut this.frames) {
            frames.written(&buf[..*n]);
            // A GOAWAY that waited for h2 to end its frame (an error shows on the next read).
            let _ = this.send_goaway(cx);
        }
        this.unless_expired(cx, written)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let flushed = Pin::new(&mut this.inner).poll_flush(cx);
        this.unless_expired(cx, flushed)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.broken {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "a GOAWAY went out in part")));
        }
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let (Poll::Ready(Ok(n)), Some(frames)) = (&written, &mut this.frames) {
            let mut left = *n;
            for b in bufs {
                if left == 0 {
                    break;
                }
                let take = left.min(b.len());
                frames.written(&b[..take]);
                left -= take;
            }
            let _ = this.send_goaway(cx);
        }
        this.unless_expired(cx, written)
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

impl ConnectionLimit {
    /// `io` with its place, and its deadlines armed.
    pub fn guard<S>(&self, io: S, place: Place) -> Guarded<S> {
        let limits = &self.shared.limits;
        Guarded {
            inner: io,
            preface: Some((Box::pin(tokio::time::sleep(limits.preface_timeout)), 0)),
            first_stream: limits.first_stream_timeout.map(|d| Box::pin(tokio::time::sleep(d))),
            frames: limits.http2.then(FrameCounter::default),
            evicted: Box::pin(place.slot.evicted.clone().cancelled_owned()),
            retired: Box::pin(place.slot.retired.clone().cancelled_owned()),
            retiring: None,
            broken: false,
            place,
        }
    }

    /// Plaintext connections accepted on `listener`, guarded.
    pub fn incoming(self, listener: TcpListener) -> impl Stream<Item = io::Result<Guarded<TcpStream>>> {
        tokio_stream::wrappers::TcpListenerStream::new(listener).filter_map(move |accepted| match accepted {
            Ok(tcp) => {
                let addr = tcp.peer_addr().ok()?;
                self.admit(addr).map(|place| Ok(self.guard(tcp, place)))
            }
            Err(e) => Some(Err(e)),
        })
    }
}

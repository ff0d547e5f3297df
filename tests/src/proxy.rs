//! A TCP proxy that a test can cut and restore: a broker (or any TCP service) disappears for
//! whoever connects through the proxy, while it stays up for everyone else.
//!
//! [`TcpProxy::cut`] closes every proxied connection and refuses new ones (the port stays
//! reserved, bound but not listening, so a connect gets `ECONNREFUSED` at once rather than a
//! hang, and no other process can take the port in between); [`TcpProxy::restore`] listens on
//! the same address again.
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context as _, Result};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;

/// A cuttable TCP proxy on 127.0.0.1 in front of `upstream`. Clones share the proxy; it stops
/// (its port closed, its connections cut) when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct TcpProxy {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    addr: SocketAddr,
    upstream: SocketAddr,
    state: Mutex<State>,
    /// Bumped by every cut: each connection ends when it changes.
    generation: watch::Sender<u64>,
    accepted: Arc<AtomicU64>,
}

#[derive(Debug)]
enum State {
    Serving(JoinHandle<()>),
    /// Bound, not listening: connections are refused and the port stays ours.
    Cut(TcpSocket),
    /// Listening again failed: the proxy refuses connections for good.
    Broken,
}

impl TcpProxy {
    /// Listens on an ephemeral port of 127.0.0.1 and forwards each connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.context("binding the proxy's port")?;
        let addr = listener.local_addr()?;
        let (generation, _) = watch::channel(0);
        let accepted = Arc::new(AtomicU64::new(0));
        let serving = spawn_accept(listener, upstream, generation.clone(), accepted.clone());
        Ok(Self {
            inner: Arc::new(Inner { addr, upstream, state: Mutex::new(State::Serving(serving)), generation, accepted }),
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// The service behind the proxy.
    pub fn upstream(&self) -> SocketAddr {
        self.inner.upstream
    }

    /// How many connections the proxy has accepted so far (reconnects show here).
    pub fn connections(&self) -> u64 {
        self.inner.accepted.load(Ordering::SeqCst)
    }

    /// `url` with its host and port replaced by the proxy's (user, password, path and query
    /// kept): `amqp://guest:guest@127.0.0.1:5672/%2f` → `amqp://guest:guest@127.0.0.1:PORT/%2f`.
    pub fn url_for(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let userinfo = authority.rsplit_once('@').map(|(u, _)| format!("{u}@")).unwrap_or_default();
        let prefix = if scheme.is_empty() { String::new() } else { format!("{scheme}://") };
        format!("{prefix}{userinfo}{}{tail}", self.inner.addr)
    }

    /// Closes every proxied connection and refuses new ones until [`TcpProxy::restore`].
    /// Cutting a cut proxy only closes connections again (there are none).
    pub async fn cut(&self) -> Result<()> {
        let mut state = self.inner.state.lock().await;
        if let State::Serving(handle) = &mut *state {
            handle.abort();
            // The listener is dropped (its port closed) once the aborted task has finished.
            let _ = handle.await;
            let socket = TcpSocket::new_v4()?;
            socket.set_reuseaddr(true)?;
            socket.bind(self.inner.addr).with_context(|| format!("keeping {} while cut", self.inner.addr))?;
            *state = State::Cut(socket);
        }
        self.inner.generation.send_modify(|g| *g += 1);
        Ok(())
    }

    /// Accepts connections again, on the same address. Restoring a serving proxy does nothing.
    pub async fn restore(&self) -> Result<()> {
        let mut state = self.inner.state.lock().await;
        match std::mem::replace(&mut *state, State::Broken) {
            State::Cut(socket) => {
                let listener =
                    socket.listen(1024).with_context(|| format!("listening on {} again", self.inner.addr))?;
                *state = State::Serving(spawn_accept(
                    listener,
                    self.inner.upstream,
                    self.inner.generation.clone(),
                    self.inner.accepted.clone(),
                ));
                Ok(())
            }
            State::Broken => anyhow::bail!("the proxy on {} could not listen again", self.inner.addr),
            serving @ State::Serving(_) => {
                *state = serving;
                Ok(())
            }
        }
    }

    /// Whether the proxy is cut.
    pub async fn is_cut(&self) -> bool {
        !matches!(&*self.inner.state.lock().await, State::Serving(_))
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let State::Serving(handle) = self.state.get_mut() {
            handle.abort();
        }
        self.generation.send_modify(|g| *g += 1);
    }
}

fn spawn_accept(
    listener: TcpListener,
    upstream: SocketAddr,
    generation: watch::Sender<u64>,
    accepted: Arc<AtomicU64>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            accepted.fetch_add(1, Ordering::SeqCst);
            let mut cut = generation.subscribe();
            let born = *cut.borrow_and_update();
            tokio::spawn(async move {
                let ended = cut.wait_for(|g| *g != born);
                tokio::pin!(ended);
                let server = tokio::select! {
                    s = TcpStream::connect(upstream) => s,
                    _ = &mut ended => return,
                };
                let (Ok(mut server), mut client) = (server, client) else { return };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                    _ = &mut ended => {}
                }
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// An echo server: what a client writes comes back.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(addr: SocketAddr) -> Result<TcpStream> {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut buf)).await??;
        anyhow::ensure!(&buf == b"ping", "echoed {buf:?}");
        Ok(s)
    }

    #[tokio::test]
    async fn cut_closes_connections_and_refuses_new_ones_until_restored() {
        let proxy = TcpProxy::start(echo().await).await.unwrap();
        let mut open = round_trip(proxy.addr()).await.unwrap();
        proxy.cut().await.unwrap();
        assert!(proxy.is_cut().await);
        // The open connection is closed: a read ends (EOF or reset) instead of waiting.
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), open.read(&mut buf)).await.unwrap();
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        // New connections are refused at once.
        let e = TcpStream::connect(proxy.addr()).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        proxy.restore().await.unwrap();
        round_trip(proxy.addr()).await.unwrap();
        assert_eq!(proxy.connections(), 2);
        // Cut and restore twice over: the same port each time.
        proxy.cut().await.unwrap();
        proxy.cut().await.unwrap();
        proxy.restore().await.unwrap();
        proxy.restore().await.unwrap();
        round_trip(proxy.addr()).await.unwrap();
    }

    #[test]
    fn url_for_keeps_everything_but_the_address() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let proxy = TcpProxy::start("127.0.0.1:9".parse().unwrap()).await.unwrap();
            let a = proxy.addr();
            assert_eq!(proxy.url_for("amqp://guest:guest@127.0.0.1:5672/%2f"), format!("amqp://guest:guest@{a}/%2f"));
            assert_eq!(proxy.url_for("nats://127.0.0.1:4222"), format!("nats://{a}"));
            assert_eq!(proxy.url_for("http://localhost:80/hook?x=1"), format!("http://{a}/hook?x=1"));
        });
    }
}

//! The attacks of a hostile tenant, each against a real outboxd with an auth file: what a token
//! with no permission, a tenant flooding its own quota, a raw HTTP/2 client and a slow socket
//! can make outboxd hold, and what another tenant's calls see meanwhile. Raw HTTP/2 (the `h2`
//! crate) where a gRPC client cannot express the attack: a declared message whose bytes stop
//! coming, a connection that never says anything.
//!
//! One file per subject; the tenants, raw HTTP/2 client and probes they share are here.
mod resources;
mod sinks;
mod tenants;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use outbox_client::grpc::{admin_with, outbox_with};
use outbox_proto::v1 as pb;
use outbox_tests::{Backend, Outboxd, TestStore};
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::security::{Scratch, auth_file, s, start, tok};

const TENANTS: &[(&str, &[&str])] = &[
    ("nobody", &[]),
    ("producer", &["produce:orders.>"]),
    ("other-producer", &["produce:payments.>"]),
    ("billing", &["consume:billing"]),
    ("reader", &["admin:read"]),
    ("writer", &["admin:write"]),
    ("sinker", &["admin:write", "sink:to-*", "tail:orders.>"]),
    ("replayer", &["replay:billing", "consume:billing"]),
    ("root", &["*"]),
];

async fn serve(extra: &[&str]) -> Result<(TestStore, Scratch, Outboxd)> {
    serve_as(TENANTS, extra).await
}

/// An outboxd on SQLite whose auth file (`auth.toml` in the scratch directory) names `principals`.
async fn serve_as(principals: &[(&str, &[&str])], extra: &[&str]) -> Result<(TestStore, Scratch, Outboxd)> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let file = scratch.write("auth.toml", &auth_file(principals))?;
    let mut args = vec!["--auth-file", s(&file)];
    args.extend_from_slice(extra);
    let srv = start(&store, &args).await?;
    Ok((store, scratch, srv))
}

/// A raw HTTP/2 connection to outboxd.
struct Raw {
    addr: SocketAddr,
    client: h2::client::SendRequest<Bytes>,
}

impl Raw {
    async fn connect(addr: SocketAddr) -> Result<Self> {
        let tcp = TcpStream::connect(addr).await?;
        let (client, conn) = h2::client::handshake(tcp).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Self { addr, client })
    }

    /// Starts a call of `path` whose message declares `declared` bytes, of which `sent` are
    /// sent, and then nothing more (the stream is left open).
    async fn stalled(
        &mut self,
        path: &str,
        token: Option<&str>,
        declared: u32,
        sent: usize,
    ) -> Result<(h2::client::ResponseFuture, h2::SendStream<Bytes>)> {
        let mut req = http::Request::builder()
            .method("POST")
            .uri(format!("http://{}{path}", self.addr))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let mut client = self.client.clone().ready().await?;
        let (response, mut body) = client.send_request(req.body(())?, false)?;
        let mut frame = vec![0u8];
        frame.extend_from_slice(&declared.to_be_bytes());
        frame.resize(5 + sent, b'x');
        body.reserve_capacity(frame.len());
        body.send_data(Bytes::from(frame), false)?;
        Ok((response, body))
    }
}

/// The gRPC status of a response: from its headers (a trailers-only answer) or its trailers.
async fn status_of(response: h2::client::ResponseFuture, within: Duration) -> Result<(i32, String)> {
    let response = tokio::time::timeout(within, response).await.context("no response in time")??;
    let find = |h: &http::HeaderMap| {
        h.get("grpc-status").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<i32>().ok()).map(|c| {
            let msg = h.get("grpc-message").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
            (c, percent_decode(&msg))
        })
    };
    if let Some(s) = find(response.headers()) {
        return Ok(s);
    }
    let mut body = response.into_body();
    while let Some(chunk) = tokio::time::timeout(within, body.data()).await.context("no body in time")? {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = tokio::time::timeout(within, body.trailers()).await.context("no trailers in time")??;
    trailers.as_ref().and_then(find).context("no grpc-status")
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned()
}

/// Waits (at most a second) until `n` of the calls have been answered; returns how many were.
async fn eventually_count(answers: &[tokio::task::JoinHandle<Result<(i32, String)>>], n: usize) -> Result<usize> {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        let done = answers.iter().filter(|a| a.is_finished()).count();
        if done >= n {
            return Ok(done);
        }
        if Instant::now() >= deadline {
            anyhow::bail!("only {done} of {n} calls answered within a second");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The resident memory of a process, in bytes.
fn rss(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no VmRSS")?;
    Ok(kb * 1024)
}

/// The status a server stream ends with, reading past what it still sends; within 3 s.
async fn ending_status<T>(stream: &mut tonic::Streaming<T>) -> Result<tonic::Status> {
    tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => bail!("the stream ended without a status"),
                Err(status) => return Ok(status),
            }
        }
    })
    .await
    .context("the stream stayed open")?
}

/// Reads until the server closes the connection (whatever it sent before).
async fn closed(c: &mut TcpStream) -> Result<()> {
    let mut buf = [0u8; 1024];
    loop {
        match c.read(&mut buf).await {
            Ok(0) | Err(_) => return Ok(()),
            Ok(_) => continue,
        }
    }
}

/// A GetStats call of `who`, which must be answered within a second.
async fn served_within_a_second(srv: &Outboxd, who: &str) -> Result<()> {
    let mut admin = admin_with(&srv.endpoint, &tok(who)).await?;
    let began = Instant::now();
    tokio::time::timeout(Duration::from_secs(1), admin.get_stats(pb::GetStatsRequest::default()))
        .await
        .with_context(|| format!("{who}'s call was not answered within a second"))??;
    assert!(began.elapsed() < Duration::from_secs(1));
    Ok(())
}

/// Opens a Subscribe stream of `who` on `consumer` that reads deliveries but acks nothing
/// (yet): the sender is for its acks.
async fn subscriber(
    srv: &Outboxd,
    who: &str,
    consumer: &str,
    max_in_flight: u32,
) -> Result<(mpsc::Sender<pb::SubscribeRequest>, tonic::Streaming<pb::SubscribeResponse>)> {
    let mut c = outbox_with(&srv.endpoint, &tok(who)).await?;
    let (tx, rx) = mpsc::channel(16);
    let start_req = pb::Start { consumer: consumer.into(), max_in_flight, ack_deadline: None };
    tx.send(pb::SubscribeRequest { request: Some(pb::subscribe_request::Request::Start(start_req)) }).await?;
    let stream = c.subscribe(ReceiverStream::new(rx)).await?.into_inner();
    Ok((tx, stream))
}

/// The next delivery of a stream, within ten seconds.
async fn next_delivery(stream: &mut tonic::Streaming<pb::SubscribeResponse>) -> Result<pb::Delivery> {
    loop {
        let r = tokio::time::timeout(Duration::from_secs(10), stream.message()).await.context("no delivery")??;
        if let Some(pb::subscribe_response::Response::Delivery(d)) = r.context("the stream ended")?.response {
            return Ok(d);
        }
    }
}

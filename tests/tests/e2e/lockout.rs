//! Attacks on the gRPC transport that need no credentials, against a real outboxd with an auth
//! file: connections that send HTTP/2's preface and then only answer PINGs, from a few client
//! addresses (the attackers' sockets are bound to 127.0.0.2 and 127.0.0.3, the operator's
//! clients use 127.0.0.1), and PING and SETTINGS floods (ADR 0075).
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use outbox_client::grpc::admin_with;
use outbox_proto::v1 as pb;
use outbox_tests::{Backend, Outboxd, TestStore};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinHandle;

use crate::security::{Scratch, auth_file, s, start, tok};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

async fn serve(extra: &[&str]) -> Result<(TestStore, Scratch, Outboxd)> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let file = scratch.write("auth.toml", &auth_file(&[("reader", &["admin:read"])]))?;
    let mut args = vec!["--auth-file", s(&file)];
    args.extend_from_slice(extra);
    let srv = start(&store, &args).await?;
    Ok((store, scratch, srv))
}

/// A TCP connection to `to` from the loopback address `from`.
async fn connect_from(from: &str, to: SocketAddr) -> Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from.parse::<IpAddr>()?, 0))?;
    Ok(socket.connect(to).await?)
}

/// An HTTP/2 connection from `from` that sends the preface and its SETTINGS, answers the
/// server's PINGs, and opens no stream; the task ends when the server closes it.
async fn idle_h2(from: &str, to: SocketAddr) -> Result<(h2::client::SendRequest<bytes::Bytes>, JoinHandle<()>)> {
    let tcp = connect_from(from, to).await?;
    let (client, conn) = h2::client::handshake(tcp).await?;
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok((client, task))
}

/// Reads until the server closes the connection.
async fn closed(c: &mut TcpStream) -> Result<()> {
    let mut buf = [0u8; 4096];
    loop {
        match c.read(&mut buf).await {
            Ok(0) | Err(_) => return Ok(()),
            Ok(_) => continue,
        }
    }
}

/// A GetStats call of `reader` on a new connection from 127.0.0.1, answered within a second.
async fn authenticated_call(endpoint: &str) -> Result<()> {
    let call = async {
        let mut admin = admin_with(endpoint, &tok("reader")).await?;
        admin.get_stats(pb::GetStatsRequest::default()).await?;
        anyhow::Ok(())
    };
    tokio::time::timeout(Duration::from_secs(1), call).await.context("the call was not answered within a second")?
}

/// A health check on a new connection from 127.0.0.1, answered SERVING within a second.
async fn health_check(endpoint: &str) -> Result<()> {
    let check = async {
        let channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())?.connect().await?;
        let status = tonic_health::pb::health_client::HealthClient::new(channel)
            .check(tonic_health::pb::HealthCheckRequest { service: String::new() })
            .await?
            .into_inner()
            .status;
        ensure!(status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32, "status {status}");
        anyhow::Ok(())
    };
    tokio::time::timeout(Duration::from_secs(1), check)
        .await
        .context("the health check was not answered within a second")?
}

/// Waits until every one of the idle connections has been closed by the server.
async fn all_closed(idle: Vec<JoinHandle<()>>, within: Duration) -> Result<()> {
    for task in idle {
        tokio::time::timeout(within, task).await.context("an idle connection was kept open")??;
    }
    Ok(())
}

/// Issue 47, item 4: connections that send the preface and then only answer PINGs are bounded
/// per client address, are closed when they open no stream in time, and while they are open
/// another client's calls and health checks are served; when they hold every general place,
/// health checks still are.
#[tokio::test]
async fn preface_only_connections_are_bounded_per_peer_closed_and_lock_out_nobody() -> Result<()> {
    let (_store, _scratch, srv) = serve(&[
        "--max-client-connections",
        "8",
        "--max-connections-per-peer",
        "4",
        "--http2-first-stream-timeout",
        "2s",
    ])
    .await?;
    let began = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(idle_h2("127.0.0.2", srv.addr).await?);
    }
    // The fifth from the same address is closed as soon as it is accepted.
    let mut fifth = connect_from("127.0.0.2", srv.addr).await?;
    fifth.write_all(PREFACE).await?;
    tokio::time::timeout(Duration::from_millis(500), closed(&mut fifth)).await.context("the fifth kept open")??;
    // Another client is served meanwhile, its calls and its health checks.
    authenticated_call(&srv.endpoint).await?;
    health_check(&srv.endpoint).await?;
    // A second address takes the other four general places: health checks are still answered,
    // on the places kept for them.
    for _ in 0..4 {
        idle.push(idle_h2("127.0.0.3", srv.addr).await?);
    }
    health_check(&srv.endpoint).await?;
    // None of them opened a stream: all are closed after --http2-first-stream-timeout, and
    // not before it.
    // (Their handles are kept: h2 ends a connection whose handles are all dropped.)
    let (_clients, tasks): (Vec<_>, Vec<_>) = idle.into_iter().unzip();
    all_closed(tasks, Duration::from_secs(6)).await?;
    assert!(began.elapsed() >= Duration::from_secs(2), "closed before the deadline: {:?}", began.elapsed());
    // The places are free again for every client.
    authenticated_call(&srv.endpoint).await?;
    Ok(())
}

/// A connection that opens a stream in time is kept past the deadline (it is not a timeout
/// of every connection); one used for health checks or reflection alone is not: health is
/// answered to anyone and reflection to any valid credential, so neither must let a connection
/// keep its place for ever.
#[tokio::test]
async fn a_connection_that_opens_a_stream_in_time_is_kept() -> Result<()> {
    let (_store, _scratch, srv) = serve(&["--http2-first-stream-timeout", "1s"]).await?;
    let mut admin = admin_with(&srv.endpoint, &tok("reader")).await?;
    admin.list_consumers(pb::ListConsumersRequest {}).await?;
    // A raw connection that makes one health check and then only answers PINGs.
    let to: SocketAddr = srv.endpoint.trim_start_matches("http://").parse()?;
    let (mut h2c, task) = idle_h2("127.0.0.2", to).await?;
    let check = http::Request::builder()
        .method("POST")
        .uri(format!("http://{to}/grpc.health.v1.Health/Check"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())?;
    let (answer, mut body) = h2c.send_request(check, false)?;
    body.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)?;
    let answer = answer.await?;
    ensure!(answer.status() == 200, "the health check: {}", answer.status());
    // Another that opens a reflection stream, which any valid credential may, permissions or not.
    let (mut h2r, reflecting) = idle_h2("127.0.0.3", to).await?;
    let reflect = http::Request::builder()
        .method("POST")
        .uri(format!("http://{to}/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", "Bearer tok-reader")
        .body(())?;
    let (answer, _open) = h2r.send_request(reflect, false)?;
    let answer = answer.await?;
    ensure!(answer.status() == 200, "the reflection stream: {}", answer.status());
    // Past the deadline, and then some, the first connection still answers; the health-only
    // and reflection-only ones are closed.
    tokio::time::timeout(Duration::from_secs(3), task).await.context("a health-only connection was kept")??;
    tokio::time::timeout(Duration::from_secs(1), reflecting)
        .await
        .context("a reflection-only connection was kept")??;
    tokio::time::timeout(Duration::from_secs(1), admin.list_consumers(pb::ListConsumersRequest {}))
        .await
        .context("no answer")??;
    Ok(())
}

/// Issue 47, item 4, on `--health-listen`: the same bounds hold there.
#[tokio::test]
async fn the_health_listener_bounds_idle_connections_per_peer_and_closes_them() -> Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let health_addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let (_store, _scratch, _srv) = serve(&[
        "--health-listen",
        &health_addr.to_string(),
        "--max-connections-per-peer",
        "3",
        "--http2-first-stream-timeout",
        "2s",
    ])
    .await?;
    let endpoint = format!("http://{health_addr}");
    outbox_tests::eventually("the health listener answers", crate::WAIT, || async {
        Ok(health_check(&endpoint).await.ok())
    })
    .await?;
    let began = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(idle_h2("127.0.0.2", health_addr).await?);
    }
    let mut fourth = connect_from("127.0.0.2", health_addr).await?;
    fourth.write_all(PREFACE).await?;
    tokio::time::timeout(Duration::from_millis(500), closed(&mut fourth)).await.context("the fourth kept open")??;
    health_check(&endpoint).await?;
    // (Their handles are kept: h2 ends a connection whose handles are all dropped.)
    let (_clients, tasks): (Vec<_>, Vec<_>) = idle.into_iter().unzip();
    all_closed(tasks, Duration::from_secs(6)).await?;
    assert!(began.elapsed() >= Duration::from_secs(2), "closed before the deadline: {:?}", began.elapsed());
    Ok(())
}

/// An HTTP/2 frame header and payload.
fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags, 0, 0, 0, 0];
    f.extend_from_slice(payload);
    f
}

/// What the server did with a flood.
struct Flooded {
    /// How long it took to close the connection, if it did within 5 s.
    closed: Option<Duration>,
    /// The error code of the GOAWAY it sent, if it sent one.
    goaway: Option<u32>,
}

/// Sends the preface and then `frames`, and reads what the server answers.
async fn flood(addr: SocketAddr, frames: Vec<u8>) -> Result<Flooded> {
    let mut c = TcpStream::connect(addr).await?;
    let began = Instant::now();
    let (mut read, mut write) = c.split();
    let mut answer = Vec::new();
    let reading = async {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    };
    let writing = async {
        let _ = write.write_all(PREFACE).await;
        let _ = write.write_all(&frames).await;
        // Then nothing: the connection is left to the server.
        std::future::pending::<()>().await
    };
    let done = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::select! {
            _ = reading => {}
            _ = writing => {}
        }
    })
    .await;
    let closed = done.ok().map(|_| began.elapsed());
    // The server's frames, one after another, for a GOAWAY.
    let (mut at, mut goaway) = (0, None);
    while at + 9 <= answer.len() {
        let len = usize::from(answer[at]) << 16 | usize::from(answer[at + 1]) << 8 | usize::from(answer[at + 2]);
        if answer[at + 3] == 7 && at + 17 <= answer.len() {
            goaway = Some(u32::from_be_bytes(answer[at + 13..at + 17].try_into()?));
        }
        at += 9 + len;
    }
    Ok(Flooded { closed, goaway })
}

/// Issue 47, item 7: a PING flood and a SETTINGS flood are not answered for ever: the
/// connection is sent GOAWAY (ENHANCE_YOUR_CALM) and closed once it passes the bound, while a
/// client under it is kept.
#[tokio::test]
async fn ping_and_settings_floods_are_cut_off() -> Result<()> {
    const ENHANCE_YOUR_CALM: u32 = 0xb;
    let (_store, _scratch, srv) = serve(&["--http2-first-stream-timeout", "60s"]).await?;
    let settings = frame(4, 0, &[]);
    let ping = frame(6, 0, &[7; 8]);
    let mut frames = settings.clone();
    for _ in 0..1500 {
        frames.extend_from_slice(&ping);
    }
    let f = flood(srv.addr, frames).await?;
    assert!(f.closed.is_some(), "a PING flood was answered for 5 s");
    assert_eq!(f.goaway, Some(ENHANCE_YOUR_CALM), "the PING flood's GOAWAY");
    let mut frames = Vec::new();
    for _ in 0..1500 {
        frames.extend_from_slice(&settings);
    }
    let f = flood(srv.addr, frames).await?;
    assert!(f.closed.is_some(), "a SETTINGS flood was answered for 5 s");
    assert_eq!(f.goaway, Some(ENHANCE_YOUR_CALM), "the SETTINGS flood's GOAWAY");
    // Under the bound, the connection is kept (until its first-stream deadline, a minute away).
    let mut frames = settings.clone();
    for _ in 0..500 {
        frames.extend_from_slice(&ping);
    }
    let f = flood(srv.addr, frames).await?;
    assert!(f.closed.is_none() && f.goaway.is_none(), "a connection under the bound was closed after {:?}", f.closed);
    Ok(())
}

/// Health `Watch` streams, open to anyone, and reflection streams are counted apart from
/// `Subscribe`'s places (`--max-streams`, which a caller with no permission must not take): at
/// most 4 on one connection and 256 in the process. One more is refused at once, and a closed
/// one gives its place back.
#[tokio::test]
async fn health_watches_are_bounded_per_connection() -> Result<()> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let (_store, _scratch, srv) = serve(&[]).await?;
    let channel = tonic::transport::Endpoint::from_shared(srv.endpoint.clone())?.connect().await?;
    let health = HealthClient::new(channel);
    let watch = || {
        let mut h = health.clone();
        async move { h.watch(HealthCheckRequest { service: String::new() }).await }
    };
    let mut open = Vec::new();
    for i in 0..4 {
        let mut s = watch().await.with_context(|| format!("watch {i}"))?.into_inner();
        s.message().await?.context("the current status")?;
        open.push(s);
    }
    let err = watch().await.map(drop).unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("the limit is 4"), "{err:?}");
    drop(open.pop());
    outbox_tests::eventually("the closed watch's place back", crate::WAIT, || async {
        Ok(watch().await.ok().map(drop))
    })
    .await?;
    Ok(())
}

/// An authenticated GetStats call of `reader` on the raw HTTP/2 connection `h2c`: its HTTP and
/// gRPC status.
async fn raw_get_stats(h2c: &mut h2::client::SendRequest<bytes::Bytes>, to: SocketAddr) -> Result<()> {
    let call = http::Request::builder()
        .method("POST")
        .uri(format!("http://{to}/outbox.v1.OutboxAdmin/GetStats"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", "Bearer tok-reader")
        .body(())?;
    let mut ready = h2c.clone().ready().await?;
    let (answer, mut body) = ready.send_request(call, false)?;
    body.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true)?;
    let answer = answer.await?;
    ensure!(answer.status() == 200, "GetStats: HTTP {}", answer.status());
    let mut body = answer.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await?.context("no trailers")?;
    let status = trailers.get("grpc-status").context("no grpc-status")?;
    ensure!(status == "0", "GetStats: grpc-status {status:?}");
    Ok(())
}

/// Issue 47, item 4 (the review of ADR 0075): idle connections from many client addresses,
/// each address within its own bound, fill every place, general and health's; a client that
/// connects and uses its connection still gets in, because the connection that has waited
/// longest without a stream gives its place up (ADR 0079), and a connection in use keeps its
/// place however many idle ones arrive after it.
#[tokio::test]
async fn idle_connections_from_many_addresses_give_their_places_to_clients_that_use_theirs() -> Result<()> {
    // 8 general places and the 16 kept for health; the deadline far away, so that only the
    // eviction can free a place within this test.
    let (_store, _scratch, srv) = serve(&[
        "--max-client-connections",
        "8",
        "--max-connections-per-peer",
        "4",
        "--http2-first-stream-timeout",
        "5m",
    ])
    .await?;
    let to: SocketAddr = srv.endpoint.trim_start_matches("http://").parse()?;
    // A client's connection in use: it made a call before the flood.
    let (mut used, used_task) = idle_h2("127.0.0.9", to).await?;
    raw_get_stats(&mut used, to).await?;
    // Seven addresses, four idle connections each: 28, more than the 23 places left.
    let mut idle = Vec::new();
    for a in 2..=8 {
        for _ in 0..4 {
            idle.push(idle_h2(&format!("127.0.0.{a}"), to).await?);
        }
    }
    // The oldest idle ones have given their places to the newest already.
    let (_clients, mut tasks): (Vec<_>, Vec<_>) = idle.into_iter().unzip();
    let rest = tasks.split_off(5);
    all_closed(tasks, Duration::from_secs(2)).await.context("the five oldest idle connections")?;
    // New clients that use their connections at once are served, calls and health checks alike.
    for _ in 0..2 {
        authenticated_call(&srv.endpoint).await?;
        health_check(&srv.endpoint).await?;
    }
    // The connection in use kept its place through all of it.
    ensure!(!used_task.is_finished(), "the connection in use was closed");
    raw_get_stats(&mut used, to).await?;
    drop(rest);
    Ok(())
}

/// A raw request to `path` on `h2c`: its grpc-status (from the trailers, or from the headers
/// of a trailers-only answer), or `None` when the connection went before an answer.
async fn raw_status(h2c: &mut h2::client::SendRequest<bytes::Bytes>, to: SocketAddr, path: &str) -> Option<String> {
    let call = http::Request::builder()
        .method("POST")
        .uri(format!("http://{to}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", "Bearer tok-reader")
        .body(())
        .ok()?;
    let mut ready = h2c.clone().ready().await.ok()?;
    let (answer, mut body) = ready.send_request(call, false).ok()?;
    body.send_data(bytes::Bytes::from_static(&[0, 0, 0, 0, 0]), true).ok()?;
    let answer = answer.await.ok()?;
    if let Some(s) = answer.headers().get("grpc-status") {
        return s.to_str().ok().map(str::to_owned);
    }
    let mut body = answer.into_body();
    while let Some(chunk) = body.data().await {
        let _ = chunk.ok()?;
    }
    body.trailers().await.ok()??.get("grpc-status")?.to_str().ok().map(str::to_owned)
}

/// The review of ADR 0079: on a connection served health only (`--health-listen`, or a place
/// kept for health when every general connection is in use), a request for anything else
/// neither keeps the connection (it would hold the place for ever) nor leaves a client with a
/// connection that answers its calls UNIMPLEMENTED: it is answered UNAVAILABLE, or the
/// connection closed, and the connection goes, so that the client connects again.
#[tokio::test]
async fn other_requests_do_not_keep_a_health_only_connection() -> Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let health_addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let (_store, _scratch, srv) = serve(&[
        "--health-listen",
        &health_addr.to_string(),
        "--max-client-connections",
        "2",
        "--http2-first-stream-timeout",
        "5m",
    ])
    .await?;
    let endpoint = format!("http://{health_addr}");
    outbox_tests::eventually("the health listener answers", crate::WAIT, || async {
        Ok(health_check(&endpoint).await.ok())
    })
    .await?;
    // --health-listen: an unknown path and an admin call.
    for path in ["/x/y", "/outbox.v1.OutboxAdmin/GetStats"] {
        let (mut h2c, task) = idle_h2("127.0.0.2", health_addr).await?;
        let status = raw_status(&mut h2c, health_addr, path).await;
        ensure!(status.as_deref().is_none_or(|s| s == "14"), "{path} on --health-listen: grpc-status {status:?}");
        tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .with_context(|| format!("{path} kept its connection"))??;
    }
    // The main port with its two general places in use: a third client gets a place kept for
    // health, and its call is answered UNAVAILABLE and its connection closed.
    let to: SocketAddr = srv.endpoint.trim_start_matches("http://").parse()?;
    let mut used = Vec::new();
    for a in ["127.0.0.5", "127.0.0.6"] {
        let (mut h2c, task) = idle_h2(a, to).await?;
        raw_get_stats(&mut h2c, to).await?;
        used.push((h2c, task));
    }
    let (mut third, task) = idle_h2("127.0.0.7", to).await?;
    let status = raw_status(&mut third, to, "/outbox.v1.OutboxAdmin/GetStats").await;
    ensure!(status.as_deref().is_none_or(|s| s == "14"), "a call on a health place: grpc-status {status:?}");
    tokio::time::timeout(Duration::from_secs(4), task).await.context("the health place kept its connection")??;
    health_check(&srv.endpoint).await?;
    // A general place free again: the client's next connection is served.
    drop(used.pop());
    outbox_tests::eventually("a call once a general place is free", crate::WAIT, || async {
        Ok(authenticated_call(&srv.endpoint).await.ok())
    })
    .await?;
    Ok(())
}

/// What a client that never reads sends: HTTP/2's preface and `requests` health checks
/// without a message, pipelined.
fn unread_requests(to: SocketAddr, requests: u32) -> Vec<u8> {
    // HPACK by hand. The first request's header block adds :path, :authority, content-type and
    // te to the dynamic table (literals with incremental indexing); every later one is six
    // bytes of indexes, so that outboxd's answers (an error: the request has no message)
    // outweigh what it reads, and fill the socket.
    let literal = |name: &str, value: &str| {
        let mut b = vec![0x40u8, u8::try_from(name.len()).unwrap()];
        b.extend_from_slice(name.as_bytes());
        b.push(u8::try_from(value.len()).unwrap());
        b.extend_from_slice(value.as_bytes());
        b
    };
    let path = "/grpc.health.v1.Health/Check";
    let authority = to.to_string();
    let mut first = vec![0x83, 0x86, 0x44, u8::try_from(path.len()).unwrap()];
    first.extend_from_slice(path.as_bytes());
    first.push(0x41);
    first.push(u8::try_from(authority.len()).unwrap());
    first.extend_from_slice(authority.as_bytes());
    first.extend(literal("content-type", "application/grpc"));
    first.extend(literal("te", "trailers"));
    // Dynamic table, newest first: te 62, content-type 63, :authority 64, :path 65.
    let again = [0x83, 0x86, 0x80 | 65, 0x80 | 64, 0x80 | 63, 0x80 | 62];
    let mut bytes = PREFACE.to_vec();
    bytes.extend(frame(4, 0, &[]));
    for i in 0..requests {
        // HEADERS with END_HEADERS and END_STREAM: a request without a message.
        let mut headers = frame(1, 0x5, if i == 0 { &first } else { &again });
        headers[5..9].copy_from_slice(&(2 * i + 1).to_be_bytes());
        bytes.extend(headers);
    }
    bytes
}

/// Clients from each of `from` (`per` connections each) with a tiny receive buffer and
/// segment size (Python's socket module sets both; the test's own sockets cannot set the
/// second) that send `bytes` as fast as outboxd reads them and never read: once the answers
/// fill the socket, outboxd can write no more and reads no more. Killed when dropped.
async fn never_reading(to: SocketAddr, from: &[&str], per: usize, bytes: Vec<u8>) -> Result<tokio::process::Child> {
    const CLIENTS: &str = r#"
import socket, sys, time
data = sys.stdin.buffer.read()
host, port, froms, per = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), int(sys.argv[4])
socks = []
for f in froms:
    for _ in range(per):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
        s.bind((f, 0))
        s.connect((host, port))
        s.setblocking(False)
        socks.append([s, 0])
print("connected", flush=True)
while True:
    for e in socks:
        if e[1] < len(data):
            try:
                e[1] += e[0].send(data[e[1]:e[1] + 65536])
            except BlockingIOError:
                pass
            except OSError:
                e[1] = len(data)
    time.sleep(0.01)
"#;
    let mut child = tokio::process::Command::new("python3")
        .args(["-c", CLIENTS, &to.ip().to_string(), &to.port().to_string(), &from.join(","), &per.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdin = child.stdin.take().context("stdin")?;
    stdin.write_all(&bytes).await?;
    drop(stdin);
    let mut out = tokio::io::BufReader::new(child.stdout.take().context("stdout")?);
    let mut line = String::new();
    tokio::time::timeout(crate::WAIT, tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line))
        .await
        .context("the clients did not connect")??;
    ensure!(line.trim() == "connected", "the clients: {line:?}");
    Ok(child)
}

/// The sockets outboxd holds open.
fn open_fds(pid: u32) -> Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

/// The review of ADR 0079: a client that sends requests and never reads what it is answered
/// stops outboxd from writing, and so from reading: the first-stream deadline and the taking
/// back of places were checked only when outboxd waited to read, and such connections (no
/// credential needed) kept their sockets past both, until the process ran out of descriptors.
/// They are closed at the deadline while outboxd waits to write too.
#[tokio::test]
async fn connections_whose_clients_never_read_are_closed_at_the_deadline() -> Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let health_addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let (_store, _scratch, srv) =
        serve(&["--health-listen", &health_addr.to_string(), "--http2-first-stream-timeout", "2s"]).await?;
    let endpoint = format!("http://{health_addr}");
    outbox_tests::eventually("the health listener answers", crate::WAIT, || async {
        Ok(health_check(&endpoint).await.ok())
    })
    .await?;
    let pid = srv.pid();
    let before = open_fds(pid)?;
    let clients =
        never_reading(health_addr, &["127.0.0.2", "127.0.0.3"], 4, unread_requests(health_addr, 20_000)).await?;
    // (The health check's own connection may have gone meanwhile: one fewer.)
    outbox_tests::eventually("the eight connections accepted", crate::WAIT, || async {
        Ok((open_fds(pid)? + 1 >= before + 8).then_some(()))
    })
    .await?;
    outbox_tests::eventually("the eight connections closed", Duration::from_secs(15), || async {
        Ok((open_fds(pid)? <= before + 1).then_some(()))
    })
    .await?;
    health_check(&endpoint).await?;
    drop(clients);
    Ok(())
}

/// The third review of ADR 0079: on a TLS listener a connection takes its place before its
/// handshake; one whose place was taken back kept its socket until the handshake's timeout
/// (10 s), so that connections that never send a ClientHello, from enough addresses, held
/// sockets far beyond every place. They are closed as soon as their place goes.
#[tokio::test]
async fn tls_connections_that_never_say_hello_hold_no_socket_beyond_the_places() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let pki = outbox_tests::pki::Pki::new("ca")?;
    let server = pki.server("server")?;
    let srv = start(
        &store,
        &[
            "--tls-cert",
            s(&server.cert),
            "--tls-key",
            s(&server.key),
            "--max-client-connections",
            "4",
            "--max-connections-per-peer",
            "8",
        ],
    )
    .await?;
    let pid = srv.pid();
    let before = open_fds(pid)?;
    // 48 silent connections from six addresses, for 4 general places and 16 kept for health.
    let mut silent = Vec::new();
    for a in 2..=7 {
        for _ in 0..8 {
            silent.push(connect_from(&format!("127.0.0.{a}"), srv.addr).await?);
        }
    }
    // Well within the handshake's 10 s: the 28 oldest are closed, the sockets beyond the 20
    // places gone.
    let began = Instant::now();
    for (i, c) in silent.iter_mut().take(28).enumerate() {
        let left = Duration::from_secs(5).saturating_sub(began.elapsed());
        tokio::time::timeout(left, closed(c)).await.with_context(|| format!("silent connection {i} kept"))??;
    }
    ensure!(open_fds(pid)? <= before + 20 + 2, "sockets held beyond the places");
    drop(silent);
    Ok(())
}

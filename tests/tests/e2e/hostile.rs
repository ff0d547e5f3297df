//! The attacks of a hostile tenant, each against a real outboxd with an auth file: what a token
//! with no permission, a tenant flooding its own quota, a raw HTTP/2 client and a slow socket
//! can make outboxd hold, and what another tenant's calls see meanwhile. Raw HTTP/2 (the `h2`
//! crate) where a gRPC client cannot express the attack: a declared message whose bytes stop
//! coming, a connection that never says anything.
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use bytes::Bytes;
use outbox_client::grpc::{admin_with, outbox_with};
use outbox_proto::v1 as pb;
use outbox_tests::{Backend, Outboxd, TestStore, consumer};
use tokio::io::AsyncReadExt as _;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::security::{Scratch, auth_file, s, start, tok};
use crate::sinks::webhook_sink;

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

/// Finding 2: a token with no produce permission sends Enqueue calls whose bodies never come.
/// Each is refused from its headers at once, takes no place of --max-concurrent-requests, and
/// the tenants' calls are served meanwhile.
#[tokio::test]
async fn a_caller_without_the_methods_permission_is_refused_before_its_body_and_holds_nothing() -> Result<()> {
    let (_store, _scratch, srv) = serve(&["--max-concurrent-requests", "4"]).await?;
    let mut raw = Raw::connect(srv.addr).await?;
    let mut open = Vec::new();
    for _ in 0..20 {
        let (response, body) =
            raw.stalled("/outbox.v1.Outbox/Enqueue", Some("tok-nobody"), 16 * 1024 * 1024, 1024).await?;
        let (code, message) = status_of(response, Duration::from_secs(2)).await?;
        assert_eq!(code, Code::PermissionDenied as i32, "{message}");
        assert!(message.contains("produce:PATTERN"), "{message}");
        open.push(body);
    }
    // The bodies are still "coming": none of them holds a place of the four.
    let mut producer = outbox_with(&srv.endpoint, &tok("producer")).await?;
    for i in 0..6 {
        let req = pb::EnqueueRequest { topic: "orders.created".into(), r#type: format!("T{i}"), ..Default::default() };
        tokio::time::timeout(Duration::from_secs(1), producer.enqueue(req)).await.context("enqueue")??;
    }
    served_within_a_second(&srv, "reader").await?;
    drop(open);
    Ok(())
}

/// Finding 2, from a tenant that may call the method: its stalled bodies take at most its own
/// quota (--max-requests-per-principal), beyond which it is refused at once; another tenant is
/// served in under a second; and each stalled call ends with DEADLINE_EXCEEDED after
/// --request-body-timeout, giving its place back.
#[tokio::test]
async fn a_tenants_stalled_bodies_fill_only_its_own_quota_and_time_out() -> Result<()> {
    let (_store, _scratch, srv) = serve(&[
        "--max-concurrent-requests",
        "8",
        "--max-requests-per-principal",
        "3",
        "--request-body-timeout",
        "1500ms",
    ])
    .await?;
    let mut raw = Raw::connect(srv.addr).await?;
    // Five calls whose bodies stall: three take the quota, two are refused at once (which ones
    // depends on the order in which the server takes the streams).
    let mut bodies = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..5 {
        let (response, body) = raw.stalled("/outbox.v1.Outbox/Enqueue", Some("tok-producer"), 1024, 10).await?;
        bodies.push(body);
        answers.push(tokio::spawn(status_of(response, Duration::from_secs(10))));
    }
    let began = Instant::now();
    let refused = eventually_count(&answers, 2).await?;
    assert!(began.elapsed() < Duration::from_secs(1), "refused at once");
    // Another producer and an admin are served meanwhile.
    let mut other = outbox_with(&srv.endpoint, &tok("other-producer")).await?;
    let req = pb::EnqueueRequest { topic: "payments.created".into(), r#type: "T".into(), ..Default::default() };
    tokio::time::timeout(Duration::from_secs(1), other.enqueue(req)).await.context("other tenant's enqueue")??;
    served_within_a_second(&srv, "reader").await?;
    // The stalled calls end by themselves, and the quota is free again.
    let mut codes = Vec::new();
    for answer in answers {
        let (code, message) = answer.await??;
        if code == Code::ResourceExhausted as i32 {
            assert!(message.contains("--max-requests-per-principal"), "{message}");
        } else {
            assert_eq!(code, Code::DeadlineExceeded as i32, "{message}");
            assert!(message.contains("--request-body-timeout"), "{message}");
        }
        codes.push(code);
    }
    assert_eq!(codes.iter().filter(|c| **c == Code::ResourceExhausted as i32).count(), 2, "{codes:?}");
    assert_eq!(refused, 2);
    drop(bodies);
    let mut producer = outbox_with(&srv.endpoint, &tok("producer")).await?;
    let req = pb::EnqueueRequest { topic: "orders.created".into(), r#type: "T".into(), ..Default::default() };
    tokio::time::timeout(Duration::from_secs(1), producer.enqueue(req)).await.context("quota back")??;
    Ok(())
}

/// Finding 1: health answers anyone, so what it buffers must be tiny. 100 health streams on one
/// connection, each declaring a 4 MiB message and sending 64 KiB of it, are refused at once,
/// and outboxd's memory stays within 30 MB of where it was.
#[tokio::test]
async fn health_refuses_a_large_declared_message_before_buffering_it() -> Result<()> {
    let (_store, _scratch, srv) = serve(&[]).await?;
    let before = rss(srv.pid())?;
    let mut raw = Raw::connect(srv.addr).await?;
    let mut calls = Vec::new();
    for _ in 0..100 {
        calls.push(raw.stalled("/grpc.health.v1.Health/Check", None, 4 * 1024 * 1024, 64 * 1024).await?);
    }
    for (response, _body) in calls {
        let (code, message) = status_of(response, Duration::from_secs(5)).await?;
        assert_ne!(code, Code::Ok as i32, "a declared 4 MiB health request is refused: {message}");
    }
    let grown = rss(srv.pid())?.saturating_sub(before);
    assert!(grown < 30 * 1024 * 1024, "RSS grew by {} MB", grown / (1024 * 1024));
    // Health still answers.
    let channel = outbox_client::grpc::connect(&srv.endpoint).await?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await?;
    Ok(())
}

/// Findings 1 and 14: a connection that never sends HTTP/2's preface is closed after
/// --http2-preface-timeout, and beyond --max-client-connections and the 16 places kept for
/// health checks a new connection takes the place of the oldest that has not been used, which
/// is closed at once.
#[tokio::test]
async fn silent_connections_are_closed_and_their_number_is_bounded() -> Result<()> {
    let (_store, _scratch, srv) = serve(&["--http2-preface-timeout", "700ms", "--max-client-connections", "5"]).await?;
    let mut silent = Vec::new();
    for _ in 0..5 + 16 {
        silent.push(TcpStream::connect(srv.addr).await?);
    }
    // Every place is taken: the next takes the place of the oldest, which is closed at once
    // (ADR 0079), while the others still hold theirs.
    silent.push(TcpStream::connect(srv.addr).await?);
    let mut oldest = silent.remove(0);
    tokio::time::timeout(Duration::from_millis(500), closed(&mut oldest)).await.context("the oldest kept open")??;
    // They are all closed after the preface deadline (having been sent the server's SETTINGS).
    let began = Instant::now();
    for mut c in silent {
        tokio::time::timeout(Duration::from_secs(5), closed(&mut c)).await.context("a silent one kept open")??;
    }
    assert!(began.elapsed() < Duration::from_secs(5));
    // And the places are free again for a real client.
    served_within_a_second(&srv, "reader").await?;
    Ok(())
}

/// Finding 6: streams take a place of the process only once their `start` is authorised. A
/// principal with no consume permission is refused from its headers; one with a permission can
/// hold at most its own quota of streams waiting for their start; another tenant still
/// subscribes.
#[tokio::test]
async fn streams_waiting_for_their_start_hold_only_their_principals_places() -> Result<()> {
    let (_store, _scratch, srv) =
        serve(&["--max-streams", "6", "--max-streams-per-principal", "4", "--request-body-timeout", "30s"]).await?;
    let mut admin = admin_with(&srv.endpoint, &tok("root")).await?;
    for name in ["billing", "audit"] {
        admin.create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer(name, &["orders.*"])) }).await?;
    }
    let mut raw = Raw::connect(srv.addr).await?;
    // No consume permission at all: refused at once.
    let (response, _body) = raw.stalled("/outbox.v1.Outbox/Subscribe", Some("tok-nobody"), 64, 0).await?;
    let (code, message) = status_of(response, Duration::from_secs(1)).await?;
    assert_eq!(code, Code::PermissionDenied as i32, "{message}");
    // billing's streams without a start: four wait, a fifth is refused at once.
    let mut waiting = Vec::new();
    let mut answers = Vec::new();
    for _ in 0..5 {
        let (response, body) = raw.stalled("/outbox.v1.Outbox/Subscribe", Some("tok-billing"), 64, 0).await?;
        waiting.push(body);
        answers.push(tokio::spawn(status_of(response, Duration::from_secs(60))));
    }
    eventually_count(&answers, 1).await?;
    let refused = answers.iter().position(|a| a.is_finished()).context("one answered")?;
    let (code, message) = answers.remove(refused).await??;
    assert_eq!(code, Code::ResourceExhausted as i32, "{message}");
    assert!(message.contains("--max-streams-per-principal"), "{message}");
    assert!(answers.iter().all(|a| !a.is_finished()), "the other four wait for their start");
    // root subscribes to audit three times: the process's six places were not taken.
    let mut streams = Vec::new();
    for _ in 0..3 {
        let mut c = outbox_with(&srv.endpoint, &tok("root")).await?;
        let (tx, rx) = mpsc::channel(4);
        let start = pb::Start { consumer: "audit".into(), max_in_flight: 1, ack_deadline: None };
        tx.send(pb::SubscribeRequest { request: Some(pb::subscribe_request::Request::Start(start)) }).await?;
        let s = tokio::time::timeout(Duration::from_secs(2), c.subscribe(ReceiverStream::new(rx)))
            .await
            .context("subscribe")??;
        streams.push((s, tx));
    }
    drop(waiting);
    for a in answers {
        a.abort();
    }
    Ok(())
}

/// Finding 3: `admin:write` alone cannot create a sink; `sink:` may, on topics its holder may
/// read (`tail:`) only.
#[tokio::test]
async fn a_sink_needs_its_own_permission_and_only_topics_its_creator_may_read() -> Result<()> {
    let (_store, _scratch, srv) = serve(&[]).await?;
    let secret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3";
    let sink = |name: &str, topics: &[&str]| pb::CreateConsumerRequest {
        consumer: Some(pb::Consumer {
            sink: Some(webhook_sink("https://partner.example/hook", secret)),
            ..consumer(name, topics)
        }),
    };
    let mut writer = admin_with(&srv.endpoint, &tok("writer")).await?;
    let err = writer.create_consumer(sink("to-exfil", &[">"])).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("sink:to-exfil"), "{err:?}");
    // A consumer without a sink takes only readable topics too (ADR 0072).
    let err = writer
        .create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer("plain", &[">"])) })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("tail:>"), "{err:?}");

    let mut sinker = admin_with(&srv.endpoint, &tok("sinker")).await?;
    for topics in [&[">"][..], &["payments.*"], &["orders.*", "secrets.>"]] {
        let err = sinker.create_consumer(sink("to-partner", topics)).await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{topics:?}: {err:?}");
        assert!(err.message().contains("tail:"), "{err:?}");
    }
    let err = sinker.create_consumer(sink("exfil", &["orders.*"])).await.unwrap_err();
    assert!(err.message().contains("sink:exfil"), "the name must match its sink: permission: {err:?}");
    sinker.create_consumer(sink("to-partner", &["orders.*", "orders.eu.>"])).await?;
    let list = admin_with(&srv.endpoint, &tok("root")).await?.list_consumers(pb::ListConsumersRequest {}).await?;
    let names: Vec<String> = list.into_inner().consumers.into_iter().map(|c| c.name).collect();
    assert_eq!(names, ["to-partner"]);
    Ok(())
}

/// Finding 4: a replay by message id stays inside the consumer's topics, and its dry run says
/// nothing of ids outside them.
#[tokio::test]
async fn a_replay_by_id_stays_inside_the_consumers_topics() -> Result<()> {
    let (_store, _scratch, srv) = serve(&[]).await?;
    let root = tok("root");
    let mut admin = admin_with(&srv.endpoint, &root).await?;
    admin.create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer("billing", &["orders.*"])) }).await?;
    let mut client = outbox_with(&srv.endpoint, &root).await?;
    let mut ids = Vec::new();
    for topic in ["orders.created", "secrets.key", "payments.card"] {
        let req = pb::EnqueueRequest { topic: topic.into(), r#type: "T".into(), ..Default::default() };
        ids.push(client.enqueue(req).await?.into_inner().message_id);
    }
    let mut replayer = admin_with(&srv.endpoint, &tok("replayer")).await?;
    let replay = |ids: Vec<String>, dry_run: bool| pb::ReplayRequest {
        consumer: "billing".into(),
        message_ids: ids,
        dry_run,
        ..Default::default()
    };
    for dry_run in [true, false] {
        let foreign = replayer.replay(replay(ids[1..].to_vec(), dry_run)).await?.into_inner();
        assert_eq!((foreign.selected, foreign.replayed), (0, 0), "dry run {dry_run}: {foreign:?}");
        let unknown = replayer.replay(replay(vec![uuid::Uuid::now_v7().to_string()], dry_run)).await?.into_inner();
        assert_eq!(foreign, pb::ReplayResponse { dry_run, ..unknown }, "ids outside look like unknown ones");
    }
    let own = replayer.replay(replay(ids[..1].to_vec(), true)).await?.into_inner();
    assert_eq!(own.selected, 1, "{own:?}");
    Ok(())
}

/// Finding 7: revoking a principal ends its open streams. The auth file loses billing's token
/// and takes tail: away from the tailer; within a reload their open Subscribe and Tail end with
/// UNAUTHENTICATED and PERMISSION_DENIED, and nothing more reaches them.
#[tokio::test]
async fn revoking_a_principal_ends_its_open_streams_within_a_reload() -> Result<()> {
    let before: &[(&str, &[&str])] =
        &[("billing", &["consume:billing"]), ("tailer", &["tail:orders.>"]), ("root", &["*"])];
    let (_store, scratch, srv) = serve_as(before, &["--reload-interval", "200ms"]).await?;
    let mut admin = admin_with(&srv.endpoint, &tok("root")).await?;
    admin.create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer("billing", &["orders.*"])) }).await?;

    let mut c = outbox_with(&srv.endpoint, &tok("billing")).await?;
    let (tx, rx) = mpsc::channel(4);
    let start_req = pb::Start { consumer: "billing".into(), max_in_flight: 10, ack_deadline: None };
    tx.send(pb::SubscribeRequest { request: Some(pb::subscribe_request::Request::Start(start_req)) }).await?;
    let mut subscribed = c.subscribe(ReceiverStream::new(rx)).await?.into_inner();
    let mut tailer = admin_with(&srv.endpoint, &tok("tailer")).await?;
    let mut tail = tailer.tail(pb::TailRequest { topics: vec!["orders.*".into()] }).await?.into_inner();
    // Both work before.
    let mut producer = outbox_with(&srv.endpoint, &tok("root")).await?;
    let req = || pb::EnqueueRequest { topic: "orders.created".into(), r#type: "T".into(), ..Default::default() };
    producer.enqueue(req()).await?;
    tokio::time::timeout(Duration::from_secs(10), subscribed.message()).await.context("delivery before")??;
    tokio::time::timeout(Duration::from_secs(10), tail.message()).await.context("tail before")??;

    let after: &[(&str, &[&str])] = &[("tailer", &["admin:read"]), ("root", &["*"])];
    let _ = scratch.write("auth.toml", &auth_file(after))?;
    let ended = Instant::now();
    let sub_end = ending_status(&mut subscribed).await.context("the revoked principal's Subscribe")?;
    assert_eq!(sub_end.code(), Code::Unauthenticated, "{sub_end:?}");
    assert!(sub_end.message().contains("revoked"), "{sub_end:?}");
    let tail_end = ending_status(&mut tail).await.context("the tail of a principal that lost tail:")?;
    assert_eq!(tail_end.code(), Code::PermissionDenied, "{tail_end:?}");
    assert!(ended.elapsed() < Duration::from_secs(3));
    // New calls are refused too, and the delivery the stream held is free for others.
    let err = outbox_with(&srv.endpoint, &tok("billing")).await?.enqueue(req()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    Ok(())
}

/// A payload is readable only by a principal that may read its topic: `admin:read` sees a
/// message's metadata and states through GetMessage and ListDeadLetters, and its payload only
/// where its own `tail:` covers the topic.
#[tokio::test]
async fn admin_read_shows_payloads_only_of_topics_its_holder_may_tail() -> Result<()> {
    let principals: &[(&str, &[&str])] =
        &[("reader", &["admin:read"]), ("orders-reader", &["admin:read", "tail:orders.>"]), ("root", &["*"])];
    let (_store, _scratch, srv) = serve_as(principals, &[]).await?;
    let mut client = outbox_with(&srv.endpoint, &tok("root")).await?;
    let mut ids = Vec::new();
    for topic in ["orders.created", "payments.card"] {
        let req = pb::EnqueueRequest {
            topic: topic.into(),
            r#type: "T".into(),
            payload: b"secret".to_vec(),
            ..Default::default()
        };
        ids.push(client.enqueue(req).await?.into_inner().message_id);
    }
    let payload = |who: &'static str, id: String| {
        let endpoint = srv.endpoint.clone();
        async move {
            let mut admin = admin_with(&endpoint, &tok(who)).await?;
            let m = admin.get_message(pb::GetMessageRequest { message_id: id }).await?.into_inner().message;
            anyhow::Ok(m.context("no message")?.payload.to_vec())
        }
    };
    assert_eq!(payload("reader", ids[0].clone()).await?, b"");
    assert_eq!(payload("reader", ids[1].clone()).await?, b"");
    assert_eq!(payload("orders-reader", ids[0].clone()).await?, b"secret");
    assert_eq!(payload("orders-reader", ids[1].clone()).await?, b"");
    assert_eq!(payload("root", ids[1].clone()).await?, b"secret");
    Ok(())
}

crate::conformance!(a_message_id_names_one_message_on_every_enqueue_path);

/// Finding 10: a message id names one message. Enqueued again with the same topic, type and
/// payload it is an idempotent duplicate; with another topic, type or payload it is refused
/// (ALREADY_EXISTS; SQLSTATE 23505 from SQL) on every path: the RPC, the Rust client in the
/// producer's transaction, `outbox.enqueue` and SQLite's documented insert. A producer cannot
/// claim an id that another topic's message will use. The refusal is the same whichever field
/// differs, so that it cannot be used to find the stored message's topic or type by guessing.
async fn a_message_id_names_one_message_on_every_enqueue_path(backend: Backend) -> Result<()> {
    let (_store, srv, db) = crate::setup(backend, &[]).await?;
    let mut client = srv.client().await?;
    let id = uuid::Uuid::now_v7();
    let req = |topic: &str, type_: &str, payload: &[u8]| pb::EnqueueRequest {
        topic: topic.into(),
        r#type: type_.into(),
        payload: payload.to_vec(),
        message_id: Some(id.to_string()),
        ..Default::default()
    };
    assert!(!client.enqueue(req("orders.created", "T", b"a")).await?.into_inner().duplicate);
    assert!(client.enqueue(req("orders.created", "T", b"a")).await?.into_inner().duplicate);
    for (topic, type_, payload, field) in [
        ("payments.card", "T", &b"a"[..], "topic"),
        ("orders.created", "U", b"a", "type"),
        ("orders.created", "T", b"b", "payload"),
    ] {
        let err = client.enqueue(req(topic, type_, payload)).await.unwrap_err();
        assert_eq!(err.code(), Code::AlreadyExists, "{field}: {err:?}");
        assert!(err.message().contains("different topic, type or payload"), "{err:?}");
        let batch = pb::EnqueueBatchRequest { messages: vec![req(topic, type_, payload)] };
        assert_eq!(client.enqueue_batch(batch).await.unwrap_err().code(), Code::AlreadyExists);
    }
    // The Rust client, in the producer's transaction.
    let same = outbox_client::Message::new("orders.created", "T", b"a".to_vec()).message_id(id);
    assert!(db.enqueue(&same).await?.duplicate);
    let other = outbox_client::Message::new("payments.card", "T", b"a".to_vec()).message_id(id);
    let err = db.enqueue(&other).await.unwrap_err().to_string();
    assert!(err.contains("different topic, type or payload"), "{err}");
    let other_type = outbox_client::Message::new("orders.created", "U", b"a".to_vec()).message_id(id);
    let err = db.enqueue(&other_type).await.unwrap_err().to_string();
    assert!(err.contains("different topic, type or payload"), "the same words for another field: {err}");
    // SQL, as any language does it.
    match &db {
        outbox_tests::Db::Postgres(pool) => {
            let err = sqlx::query("SELECT outbox.enqueue('payments.card', 'T', '\\x61'::bytea, '{}', $1)")
                .bind(id)
                .execute(pool)
                .await
                .unwrap_err();
            let db_err = err.as_database_error().context("a database error")?;
            assert_eq!(db_err.code().as_deref(), Some("23505"), "{err}");
            assert!(db_err.message().contains("different topic, type or payload"), "{err}");
            let dup: uuid::Uuid =
                sqlx::query_scalar("SELECT outbox.enqueue('orders.created', 'T', '\\x61'::bytea, '{}', $1)")
                    .bind(id)
                    .fetch_one(pool)
                    .await?;
            assert_eq!(dup, id, "the same message again is a duplicate");
        }
        outbox_tests::Db::Sqlite(pool) => {
            let insert = "INSERT INTO outbox_messages (topic, type, payload, message_id) VALUES (?1, 'T', x'61', ?2)
                          ON CONFLICT (message_id) DO NOTHING";
            let err = sqlx::query(insert).bind("payments.card").bind(id.to_string()).execute(pool).await.unwrap_err();
            assert!(err.to_string().contains("different topic, type or payload"), "{err}");
            let done = sqlx::query(insert).bind("orders.created").bind(id.to_string()).execute(pool).await?;
            assert_eq!(done.rows_affected(), 0, "the same message again is a duplicate");
        }
    }
    assert_eq!(db.message_count().await?, 1);
    Ok(())
}

/// Finding 16: a request that does not decode is the client's error (INVALID_ARGUMENT, not
/// INTERNAL); a time outside protobuf's range is named as such, not passed to the database;
/// the number of consumers is bounded (--max-consumers).
#[tokio::test]
async fn bad_requests_are_the_clients_error_and_consumers_are_bounded() -> Result<()> {
    let (_store, _scratch, srv) = serve(&["--max-consumers", "2"]).await?;
    // A message whose bytes are not protobuf: field 1 declared with a length past its end.
    let raw = Raw::connect(srv.addr).await?;
    let mut req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{}/outbox.v1.Outbox/Enqueue", srv.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", "Bearer tok-producer")
        .body(())?;
    req.headers_mut().insert("grpc-accept-encoding", http::HeaderValue::from_static("identity"));
    let mut client = raw.client.clone().ready().await?;
    let (response, mut body) = client.send_request(req, false)?;
    body.send_data(Bytes::from_static(&[0, 0, 0, 0, 3, 0x0a, 0x7f, 0x01]), true)?;
    let (code, message) = status_of(response, Duration::from_secs(5)).await?;
    assert_eq!(code, Code::InvalidArgument as i32, "{message}");
    drop(raw);

    let mut root = admin_with(&srv.endpoint, &tok("root")).await?;
    root.create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer("billing", &["orders.*"])) }).await?;
    let far = prost_types::Timestamp { seconds: i64::MAX / 2, nanos: 0 };
    let err = root
        .replay(pb::ReplayRequest {
            consumer: "billing".into(),
            enqueued_after: Some(far),
            dry_run: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("enqueued_after") && err.message().contains("9999"), "{err:?}");

    root.create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer("audit", &["orders.*"])) }).await?;
    let err = root
        .create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer("third", &["orders.*"])) })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("--max-consumers"), "{err:?}");
    // The same definition again is still the idempotent answer.
    root.create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer("audit", &["orders.*"])) }).await?;
    Ok(())
}

/// Finding 12: a sink's secrets never come back: a NATS token in the URL's user part and a
/// webhook's query values are shown as `***` by GetConsumer and ListConsumers, and logged so.
#[tokio::test]
async fn sink_urls_are_shown_without_tokens_or_query_values() -> Result<()> {
    let (_store, _scratch, srv) = serve(&[]).await?;
    let mut root = admin_with(&srv.endpoint, &tok("root")).await?;
    let nats = pb::Sink {
        target: Some(pb::sink::Target::Nats(pb::NatsSink {
            url: "nats://s3cr3t-token@127.0.0.1:1".into(),
            subject: "events.{topic}".into(),
        })),
        max_in_flight: 0,
    };
    let hook =
        webhook_sink("https://partner.example/hook?token=s3cr3t-query", "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3");
    for (name, sink) in [("to-nats", nats), ("to-hook", hook)] {
        let c = pb::Consumer { sink: Some(sink), ..consumer(name, &["orders.*"]) };
        root.create_consumer(pb::CreateConsumerRequest { consumer: Some(c) }).await?;
    }
    let listed = format!("{:?}", root.list_consumers(pb::ListConsumersRequest {}).await?.into_inner());
    let got =
        format!("{:?}", root.get_consumer(pb::GetConsumerRequest { consumer: "to-hook".into() }).await?.into_inner());
    for shown in [&listed, &got] {
        assert!(!shown.contains("s3cr3t"), "{shown}");
    }
    assert!(listed.contains("nats://***@127.0.0.1:1"), "{listed}");
    assert!(got.contains("token=***"), "{got}");
    assert!(srv.log_lines(&["s3cr3t"]).is_empty(), "a secret in the log: {:?}", srv.log_lines(&["s3cr3t"]));
    Ok(())
}

/// Finding 5: a sink may not reach outboxd's own network unless the operator allows it. A
/// webhook sink pointed at a loopback port (in several spellings) never connects there: the
/// listener accepts nothing, and the sink says why.
#[tokio::test]
async fn a_sink_cannot_reach_internal_addresses_unless_allowed() -> Result<()> {
    let (_store, _scratch, srv) = serve(&["--sink-poll", "100ms"]).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    let accepting = tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let mut root = admin_with(&srv.endpoint, &tok("root")).await?;
    let secret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3";
    for (i, host) in ["127.0.0.1", "2130706433", "0x7f.1", "localhost"].iter().enumerate() {
        let url = format!("http://{host}:{port}/exfil");
        let c = pb::Consumer { sink: Some(webhook_sink(&url, secret)), ..consumer(&format!("to-{i}"), &["orders.*"]) };
        root.create_consumer(pb::CreateConsumerRequest { consumer: Some(c) }).await?;
    }
    let mut producer = outbox_with(&srv.endpoint, &tok("root")).await?;
    let req = pb::EnqueueRequest { topic: "orders.created".into(), r#type: "T".into(), ..Default::default() };
    producer.enqueue(req).await?;
    for i in 0..4 {
        let name = format!("consumer=to-{i} ");
        outbox_tests::eventually("the sink to say why it cannot connect", Duration::from_secs(15), || {
            let found = !srv.log_lines(&[&name, "sink cannot reach its target", "--sink-allow-private"]).is_empty();
            async move { Ok(found.then_some(())) }
        })
        .await?;
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 0, "the internal listener was reached");
    drop(srv);

    // The operator allows that one network: the sink reaches it.
    let (_store2, _scratch2, allowed) = serve(&["--sink-poll", "100ms", "--sink-allow", "127.0.0.1/32"]).await?;
    let mut root = admin_with(&allowed.endpoint, &tok("root")).await?;
    let url = format!("http://127.0.0.1:{port}/partner");
    let c = pb::Consumer { sink: Some(webhook_sink(&url, secret)), ..consumer("to-partner", &["orders.*"]) };
    root.create_consumer(pb::CreateConsumerRequest { consumer: Some(c) }).await?;
    outbox_tests::eventually("the allowed network reached", Duration::from_secs(15), || {
        let n = accepted.load(std::sync::atomic::Ordering::SeqCst);
        async move { Ok((n > 0).then_some(())) }
    })
    .await?;
    accepting.abort();
    Ok(())
}

/// Finding 11 (pages): a page of dead letters is bounded in bytes, not only in count: with
/// 1 MiB payloads, a page_size of 300 comes back in pages of about 4 MiB, each leading to the
/// next, and every dead letter is listed once.
#[tokio::test]
async fn dead_letter_pages_are_bounded_in_bytes() -> Result<()> {
    let (_store, srv, db) = crate::setup(Backend::Sqlite, &[]).await?;
    let mut admin = srv.admin().await?;
    let mut c = consumer("poison", &["orders.*"]);
    c.max_deliveries = 1;
    admin.create_consumer(pb::CreateConsumerRequest { consumer: Some(c) }).await?;
    let big = vec![b'x'; 1024 * 1024 - 1024];
    for i in 0..12 {
        db.enqueue(&outbox_client::Message::new("orders.created", format!("T{i}"), big.clone())).await?;
    }
    let mut s = outbox_tests::RawStream::open(&srv.endpoint, "poison", 20).await?;
    for d in s.take(12, Duration::from_secs(15)).await? {
        s.nack(&d.message_id, "poison").await;
    }
    outbox_tests::eventually("12 dead letters", Duration::from_secs(15), || async {
        Ok((crate::stats(&srv, "poison").await?.dead == 12).then_some(()))
    })
    .await?;
    let (mut seen, mut token, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let page = admin
            .list_dead_letters(pb::ListDeadLettersRequest {
                consumer: "poison".into(),
                page_size: 300,
                page_token: token.clone(),
            })
            .await?
            .into_inner();
        let bytes: usize = page.dead_letters.iter().map(|d| d.message.as_ref().map_or(0, |m| m.payload.len())).sum();
        assert!(bytes <= 5 * 1024 * 1024, "a page of {bytes} bytes");
        seen.extend(page.dead_letters.into_iter().map(|d| d.message.map(|m| m.message_id).unwrap_or_default()));
        pages += 1;
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert!(pages >= 3, "{pages} pages");
    let unique: std::collections::HashSet<_> = seen.iter().collect();
    assert_eq!((seen.len(), unique.len()), (12, 12));
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

/// Review finding (slow readers): a tenant's streams that take deliveries and never ack them
/// hold at most --max-in-flight-bytes-per-principal of payloads, whatever their max_in_flight,
/// shared by all the tenant's streams; another tenant's stream is served meanwhile, and an ack
/// gives the bytes back.
#[tokio::test]
async fn a_tenants_unacked_deliveries_are_bounded_in_bytes() -> Result<()> {
    let principals: &[(&str, &[&str])] =
        &[("hog", &["consume:hog-*"]), ("billing", &["consume:billing"]), ("root", &["*"])];
    // A delivery reserves 64 KiB + 16 KiB of headers + 1 KiB = 82,944 bytes until it arrives.
    let (_store, _scratch, srv) =
        serve_as(principals, &["--max-payload-bytes", "65536", "--max-in-flight-bytes-per-principal", "400000"])
            .await?;
    let mut admin = admin_with(&srv.endpoint, &tok("root")).await?;
    for (name, topic) in [("hog-a", "big.a"), ("hog-b", "big.b"), ("billing", "orders.created")] {
        admin.create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer(name, &[topic])) }).await?;
    }
    let mut producer = outbox_with(&srv.endpoint, &tok("root")).await?;
    for topic in std::iter::repeat_n("big.a", 20).chain(std::iter::repeat_n("big.b", 5)) {
        let req = pb::EnqueueRequest {
            topic: topic.into(),
            r#type: "T".into(),
            payload: vec![7; 60_000],
            ..Default::default()
        };
        producer.enqueue(req).await?;
    }
    let (ack_a, mut a) = subscriber(&srv, "hog", "hog-a", 1000).await?;
    // Held 60,011 bytes each: after six, 39,934 of the 400,000 are left, less than a delivery's
    // reservation.
    let mut held = Vec::new();
    for _ in 0..6 {
        held.push(next_delivery(&mut a).await?);
    }
    let in_flight = |stats: pb::GetStatsResponse| stats.consumers.first().map_or(-1, |c| c.in_flight);
    let stats = admin.get_stats(pb::GetStatsRequest { consumer: "hog-a".into() }).await?.into_inner();
    assert_eq!(in_flight(stats), 6, "leased beyond the byte budget");
    // The same tenant's other stream shares the budget: nothing is leased to it.
    let (ack_b, b) = subscriber(&srv, "hog", "hog-b", 1000).await?;
    // Another tenant is served meanwhile.
    producer
        .enqueue(pb::EnqueueRequest { topic: "orders.created".into(), r#type: "T".into(), ..Default::default() })
        .await?;
    let (_ack_billing, mut billing) = subscriber(&srv, "billing", "billing", 10).await?;
    let began = Instant::now();
    next_delivery(&mut billing).await?;
    assert!(began.elapsed() < Duration::from_secs(1), "the other tenant waited {:?}", began.elapsed());
    let stats = admin.get_stats(pb::GetStatsRequest { consumer: "hog-b".into() }).await?.into_inner();
    assert_eq!(in_flight(stats), 0, "the tenant's second stream got room its budget does not have");
    let stats = admin.get_stats(pb::GetStatsRequest { consumer: "hog-a".into() }).await?.into_inner();
    assert_eq!(in_flight(stats), 6);
    // An ack gives its bytes back: one more delivery comes (the second stream gone, to this one).
    drop((ack_b, b));
    let ids = vec![held[0].message_id.clone()];
    ack_a
        .send(pb::SubscribeRequest { request: Some(pb::subscribe_request::Request::Ack(pb::Ack { message_ids: ids })) })
        .await?;
    let more = next_delivery(&mut a).await?;
    assert!(held.iter().all(|d| d.message_id != more.message_id));
    Ok(())
}

/// Revocation ends a running ReplayStream too: the replayer loses `replay:` while a paced
/// replay runs, and its stream ends with PERMISSION_DENIED before the replay is through.
#[tokio::test]
async fn revoking_replay_ends_a_running_replay_stream() -> Result<()> {
    let before: &[(&str, &[&str])] = &[("replayer", &["replay:billing"]), ("root", &["*"])];
    let (_store, scratch, srv) = serve_as(before, &["--reload-interval", "200ms"]).await?;
    let mut admin = admin_with(&srv.endpoint, &tok("root")).await?;
    admin.create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer("billing", &["orders.*"])) }).await?;
    let mut producer = outbox_with(&srv.endpoint, &tok("root")).await?;
    let messages = (0..40)
        .map(|_| pb::EnqueueRequest { topic: "orders.created".into(), r#type: "T".into(), ..Default::default() })
        .collect();
    producer.enqueue_batch(pb::EnqueueBatchRequest { messages }).await?;
    let mut replayer = admin_with(&srv.endpoint, &tok("replayer")).await?;
    // Two a second: the whole replay would take 20 s.
    let req = pb::ReplayRequest {
        consumer: "billing".into(),
        enqueued_after: Some(prost_types::Timestamp { seconds: 0, nanos: 0 }),
        max_per_second: 2,
        allow_beyond_retention: true,
        ..Default::default()
    };
    let mut progress = replayer.replay_stream(req).await?.into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), progress.message()).await.context("first progress")??;
    assert_eq!(first.context("the replay ended at once")?.selected, 40);
    let after: &[(&str, &[&str])] = &[("replayer", &["admin:read"]), ("root", &["*"])];
    let _ = scratch.write("auth.toml", &auth_file(after))?;
    let end = ending_status(&mut progress).await.context("the replay of a principal that lost replay:")?;
    assert_eq!(end.code(), Code::PermissionDenied, "{end:?}");
    Ok(())
}

/// A sink runs on its creator's authority: once a reloaded auth file takes `sink:` away from
/// the principal that created it, the sink delivers nothing more (a sink created by another
/// principal on the same topic goes on), and it resumes when the permission comes back.
#[tokio::test]
async fn a_sink_stops_when_its_creator_loses_the_permission() -> Result<()> {
    let sinker: (&str, &[&str]) = ("sinker", &["admin:write", "sink:to-*", "tail:orders.>"]);
    let demoted: (&str, &[&str]) = ("sinker", &["admin:write", "tail:orders.>"]);
    let root: (&str, &[&str]) = ("root", &["*"]);
    let flags = ["--sink-poll", "100ms", "--sink-allow", "127.0.0.1/32", "--reload-interval", "200ms"];
    let (_store, scratch, srv) = serve_as(&[sinker, root], &flags).await?;
    let (revoked, control) =
        (outbox_tests::brokers::WebhookPartner::start().await?, outbox_tests::brokers::WebhookPartner::start().await?);
    let secret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3";
    let sink = |name: &str, url: &str| pb::CreateConsumerRequest {
        consumer: Some(pb::Consumer { sink: Some(webhook_sink(url, secret)), ..consumer(name, &["orders.*"]) }),
    };
    admin_with(&srv.endpoint, &tok("sinker")).await?.create_consumer(sink("to-partner", &revoked.url)).await?;
    admin_with(&srv.endpoint, &tok("root")).await?.create_consumer(sink("to-control", &control.url)).await?;
    let mut producer = outbox_with(&srv.endpoint, &tok("root")).await?;
    let req = || pb::EnqueueRequest { topic: "orders.created".into(), r#type: "T".into(), ..Default::default() };
    producer.enqueue(req()).await?;
    received(&revoked, 1, "the creator's sink delivers").await?;
    received(&control, 1, "the other sink delivers").await?;

    let _ = scratch.write("auth.toml", &auth_file(&[demoted, root]))?;
    outbox_tests::eventually("the sink to stop", Duration::from_secs(10), || {
        let found =
            !srv.log_lines(&["consumer=to-partner", "sink stopped", "no longer holds sink:to-partner"]).is_empty();
        async move { Ok(found.then_some(())) }
    })
    .await?;
    producer.enqueue(req()).await?;
    received(&control, 2, "the other sink goes on").await?;
    assert_eq!(revoked.received().len(), 1, "a sink whose creator lost sink: delivered");
    let mut admin = admin_with(&srv.endpoint, &tok("root")).await?;
    let stats = admin.get_stats(pb::GetStatsRequest { consumer: "to-partner".into() }).await?.into_inner();
    assert_eq!(stats.consumers.first().map(|c| (c.backlog, c.in_flight)), Some((1, 0)), "{stats:?}");

    let _ = scratch.write("auth.toml", &auth_file(&[sinker, root]))?;
    received(&revoked, 2, "the sink resumes with the permission").await?;
    Ok(())
}

/// Until `partner` has received `n` requests (within 15 s).
async fn received(partner: &outbox_tests::brokers::WebhookPartner, n: usize, what: &str) -> Result<()> {
    outbox_tests::eventually(what, Duration::from_secs(15), || {
        let got = partner.received().len();
        async move { Ok((got >= n).then_some(())) }
    })
    .await
}

/// Finding 16 (sink secrets at rest): with --sink-key-file, a sink's URL (its token, its query
/// values) and a webhook's signing secret are sealed in `outbox.consumers`: the table holds
/// none of them, answers show them redacted as before, and the sink still delivers, signed
/// with its secret. An outboxd without the key does not run the sink, and says why.
#[tokio::test]
async fn sink_secrets_are_sealed_at_rest_with_the_operators_key() -> Result<()> {
    use base64::Engine as _;
    let store = TestStore::create(Backend::Postgres).await?;
    let scratch = Scratch::new()?;
    let key = base64::engine::general_purpose::STANDARD.encode([42u8; 64]);
    let key_file = scratch.write("sink.key", &format!("{key}\n"))?;
    let flags = ["--sink-poll", "100ms", "--sink-allow", "127.0.0.1/32", "--sink-key-file", s(&key_file)];
    let srv = Outboxd::start(store.url(), &flags).await?;
    let partner = outbox_tests::brokers::WebhookPartner::start().await?;
    let secret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3";
    let c = pb::Consumer { sink: Some(webhook_sink(&partner.url, secret)), ..consumer("to-partner", &["orders.*"]) };
    let mut admin = srv.admin().await?;
    admin.create_consumer(pb::CreateConsumerRequest { consumer: Some(c.clone()) }).await?;
    // The same definition again is the same consumer (sealing is deterministic).
    admin.create_consumer(pb::CreateConsumerRequest { consumer: Some(c) }).await?;

    let db = sqlx::PgPool::connect(store.url()).await?;
    let stored: String =
        sqlx::query_scalar("SELECT sink::text FROM outbox.consumers WHERE name = 'to-partner'").fetch_one(&db).await?;
    assert!(!stored.contains("q-s3cr3t") && !stored.contains("whsec_") && !stored.contains("127.0.0.1"), "{stored}");
    assert!(stored.contains("sealed:v1:"), "{stored}");
    let shown = admin.get_consumer(pb::GetConsumerRequest { consumer: "to-partner".into() }).await?.into_inner();
    let shown = format!("{shown:?}");
    assert!(shown.contains("127.0.0.1") && shown.contains("token=***") && !shown.contains("sealed:"), "{shown}");

    let mut producer = srv.client().await?;
    let req = pb::EnqueueRequest { topic: "orders.created".into(), r#type: "T".into(), ..Default::default() };
    producer.enqueue(req).await?;
    received(&partner, 1, "the sealed sink delivers").await?;
    let first = &partner.received()[0];
    assert!(first.headers.iter().any(|(k, _)| k == "webhook-signature"), "{:?}", first.headers);
    drop(srv);

    // Without the key, the sink cannot run: it says so, and nothing is sent.
    let keyless = Outboxd::start(store.url(), &["--sink-poll", "100ms", "--sink-allow", "127.0.0.1/32"]).await?;
    outbox_tests::eventually("the keyless outboxd to say why", Duration::from_secs(10), || {
        let found = !keyless.log_lines(&["consumer=to-partner", "--sink-key-file"]).is_empty();
        async move { Ok(found.then_some(())) }
    })
    .await?;
    let shown = keyless.admin().await?.get_consumer(pb::GetConsumerRequest { consumer: "to-partner".into() }).await?;
    assert!(!format!("{shown:?}").contains("sealed:"), "{shown:?}");
    Ok(())
}

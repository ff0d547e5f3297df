//! What slow and stalled readers can make outboxd hold, against a real outboxd: Tail streams
//! while other tenants commit large payloads, and Subscribe streams of the one trusted caller
//! when there is no auth file. Each reader takes nothing (a 1-byte HTTP/2 receive window), so
//! whatever outboxd reads for it stays in outboxd. Loopback only, a few dozen messages.
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use outbox_client::grpc::admin_with;
use outbox_proto::v1 as pb;
use outbox_tests::{Backend, Db, Outboxd, TestStore, consumer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::security::{Scratch, auth_file, s, start, tok};

const MIB: usize = 1024 * 1024;

/// The resident memory of a process, in bytes.
fn rss(pid: u32) -> Result<usize> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("no VmRSS")?;
    Ok(kb * 1024)
}

/// A channel whose streams take (almost) nothing: a 1-byte receive window per stream.
async fn stalled_channel(srv: &Outboxd) -> Result<tonic::transport::Channel> {
    Ok(tonic::transport::Endpoint::from_shared(format!("http://{}", srv.addr))?
        .initial_stream_window_size(Some(1))
        .connect()
        .await?)
}

/// Watches outboxd's memory for `within`: fails as soon as it has grown by more than `limit`
/// over `before`.
async fn holds_at_most(srv: &Outboxd, before: usize, limit: usize, within: Duration) -> Result<()> {
    let until = Instant::now() + within;
    let mut most = 0;
    while Instant::now() < until {
        let grown = rss(srv.pid())?.saturating_sub(before);
        anyhow::ensure!(grown <= limit, "outboxd grew by {} MiB, more than {} MiB", grown / MIB, limit / MIB);
        most = most.max(grown);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("outboxd grew by at most {} MiB", most / MIB);
    Ok(())
}

fn big(topic: &str, i: usize) -> outbox_client::Message {
    outbox_client::Message::new(topic, format!("T{i}"), vec![b'x'; MIB - 4096])
}

/// Issue 47 item 2: stalled Tail streams, on a busy pattern and on a quiet one, while another
/// tenant commits 1 MiB payloads. A tail reads only its own topics' payloads, only as many as
/// its reader has room for, and its principal's tails together hold at most its in-flight byte
/// budget; a tail that reads keeps getting its topic's messages, in order.
#[tokio::test]
async fn stalled_tails_hold_only_their_budget_and_read_only_their_topics() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let principals: &[(&str, &[&str])] =
        &[("watcher", &["tail:>"]), ("quiet", &["tail:quiet.>"]), ("reader", &["tail:orders.>"]), ("root", &["*"])];
    let file = scratch.write("auth.toml", &auth_file(principals))?;
    // The watcher's budget: four of the largest messages.
    let budget = (4 * (MIB + 17 * 1024)).to_string();
    let srv = start(&store, &["--auth-file", s(&file), "--max-in-flight-bytes-per-principal", &budget]).await?;
    let db = Db::connect(store.url()).await?;

    let stalled = stalled_channel(&srv).await?;
    let mut tails = Vec::new();
    for (who, topics) in std::iter::repeat_n(("watcher", vec![]), 10).chain(std::iter::repeat_n(("quiet", vec![]), 6)) {
        let token = format!("Bearer tok-{who}");
        let mut admin = pb::outbox_admin_client::OutboxAdminClient::with_interceptor(
            stalled.clone(),
            move |mut r: tonic::Request<()>| {
                r.metadata_mut().insert("authorization", token.parse().expect("ascii"));
                Ok(r)
            },
        );
        let topics: Vec<String> = if who == "quiet" { vec!["quiet.>".into()] } else { topics };
        tails.push(admin.tail(pb::TailRequest { topics }).await?.into_inner());
    }
    let mut reader = admin_with(&srv.endpoint, &tok("reader")).await?;
    // A tail keeps its patterns and matches each message against every one: at most 100, as a
    // consumer's (a 4 MiB request could otherwise carry half a million, kept for its life).
    let many = reader.tail(pb::TailRequest { topics: vec!["orders.a".into(); 101] }).await.unwrap_err();
    assert_eq!(many.code(), tonic::Code::InvalidArgument, "{many:?}");
    assert!(many.message().contains("101 topics; the limit is 100 per tail"), "{many:?}");
    let mut orders = reader.tail(pb::TailRequest { topics: vec!["orders.>".into()] }).await?.into_inner();

    let before = rss(srv.pid())?;
    for i in 0..40 {
        db.enqueue(&big("payments.captured", i)).await?;
        if i % 10 == 9 {
            db.enqueue(&outbox_client::Message::new("orders.created", format!("O{i}"), b"small".to_vec())).await?;
        }
    }
    // The reading tail gets its four, and nothing else, while the others stall.
    for i in [9, 19, 29, 39] {
        let m = tokio::time::timeout(Duration::from_secs(10), orders.message()).await.context("no message")??;
        let m = m.context("the tail ended")?;
        assert_eq!((m.topic.as_str(), m.r#type.clone()), ("orders.created", format!("O{i}")));
    }
    // Sixteen stalled tails: before, each read 32 messages of every topic with their payloads
    // and blocked with them (some 38 MiB a tail). Now the watcher's ten share four MiB, and the
    // quiet ones read no payload at all.
    holds_at_most(&srv, before, 80 * MIB, Duration::from_secs(2)).await?;
    drop(tails);
    Ok(())
}

/// Issue 47 item 8: without an auth file, three slow Subscribe readers with a max_in_flight of
/// 300 and a 1-byte receive window get no more than the process's in-flight byte budget
/// (`--max-in-flight-bytes-per-principal`, shared by every caller when there is no auth file),
/// not every waiting message.
#[tokio::test]
async fn without_an_auth_file_slow_readers_hold_only_the_byte_budget() -> Result<()> {
    let budget = (6 * (MIB + 17 * 1024)).to_string();
    let (_store, srv, db) = crate::setup(Backend::Sqlite, &["--max-in-flight-bytes-per-principal", &budget]).await?;
    let mut admin = srv.admin().await?;
    admin.create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer("slow", &["big.*"])) }).await?;
    for i in 0..45 {
        db.enqueue(&big("big.one", i)).await?;
    }
    let before = rss(srv.pid())?;
    let stalled = stalled_channel(&srv).await?;
    let mut streams = Vec::new();
    for _ in 0..3 {
        let (tx, rx) = mpsc::channel(4);
        let start_req = pb::Start { consumer: "slow".into(), max_in_flight: 300, ack_deadline: None };
        tx.send(pb::SubscribeRequest { request: Some(pb::subscribe_request::Request::Start(start_req)) }).await?;
        let mut client = pb::outbox_client::OutboxClient::new(stalled.clone());
        let stream = client.subscribe(ReceiverStream::new(rx)).await?.into_inner();
        streams.push((tx, stream));
    }
    let in_flight = outbox_tests::eventually("deliveries leased to the slow readers", crate::WAIT, || async {
        let n = crate::stats(&srv, "slow").await?.in_flight;
        Ok((n >= 6).then_some(n))
    })
    .await?;
    // Six fit in the budget; before, every one of the 45 was leased and held.
    assert!(in_flight <= 6, "{in_flight} deliveries held by slow readers, beyond the byte budget");
    holds_at_most(&srv, before, 40 * MIB, Duration::from_secs(2)).await?;
    assert_eq!(crate::stats(&srv, "slow").await?.in_flight, 6);
    drop(streams);
    Ok(())
}

/// Issue 47 item 8: a refused webhook URL's password is in neither the gRPC error nor
/// outboxd's log (the audit line of the refused CreateConsumer included).
#[tokio::test]
async fn a_refused_sink_urls_password_is_neither_answered_nor_logged() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let file = scratch.write("auth.toml", &auth_file(&[("root", &["*"])]))?;
    let srv = start(&store, &["--auth-file", s(&file)]).await?;
    let mut root = admin_with(&srv.endpoint, &tok("root")).await?;
    let sink = crate::sinks::webhook_sink(
        "http://u:PASSWORD-7f3a@10.0.0.1/x?token=QUERY-7f3a",
        "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3",
    );
    let c = pb::Consumer { sink: Some(sink), ..consumer("to-partner", &["orders.*"]) };
    let e = root.create_consumer(pb::CreateConsumerRequest { consumer: Some(c) }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("plain http://"), "{e:?}");
    assert!(!e.message().contains("PASSWORD-7f3a") && !e.message().contains("QUERY-7f3a"), "{e:?}");
    let audit = outbox_tests::eventually("the refusal audited", crate::WAIT, || {
        let lines = srv.log_lines(&["create_consumer refused"]);
        async move { Ok((!lines.is_empty()).then_some(lines)) }
    })
    .await?;
    assert!(audit.iter().any(|l| l.contains("plain http://")), "{audit:?}");
    let leaked = srv.log_lines(&["7f3a"]);
    assert!(leaked.is_empty(), "a secret in the log: {leaked:?}");
    Ok(())
}

//! Every limit hit against a real outboxd (ADR 0023): message and consumer shapes, streams per
//! connection and per process, and load shedding of unary calls; each refusal names the limit
//! and the value that broke it.
use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context as _, Result};
use outbox_client::grpc::OutboxClient;
use outbox_proto::v1 as pb;
use outbox_tests::{Backend, Outboxd, RawStream, TestStore, consumer, create_consumer, dur, eventually};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::metrics::{sample, scrape};
use crate::{WAIT, conformance, setup, setup_pg};

conformance!(messages_at_their_limits_are_delivered_intact_and_one_byte_more_is_refused_naming_the_limit);

fn message(topic: &str) -> pb::EnqueueRequest {
    pb::EnqueueRequest { topic: topic.into(), r#type: "T".into(), payload: b"{}".to_vec(), ..Default::default() }
}

fn headers(n: usize, value_len: usize) -> HashMap<String, String> {
    (0..n).map(|i| (format!("h{i:02}"), "v".repeat(value_len))).collect()
}

/// INVALID_ARGUMENT whose message starts with `field` and contains every one of `words`.
fn assert_invalid(r: Result<tonic::Response<impl std::fmt::Debug>, tonic::Status>, field: &str, words: &[&str]) {
    let s = r.expect_err(field);
    assert_eq!(s.code(), Code::InvalidArgument, "{field}: {s:?}");
    assert!(s.message().starts_with(&format!("{field}: ")), "{field}: {}", s.message());
    for w in words {
        assert!(s.message().contains(w), "{field}: {:?} lacks {w:?}", s.message());
    }
}

async fn messages_at_their_limits_are_delivered_intact_and_one_byte_more_is_refused_naming_the_limit(
    backend: Backend,
) -> Result<()> {
    let (_store, srv, _db) = setup(backend, &[]).await?;
    let mut admin = srv.admin().await?;
    create_consumer(&mut admin, consumer("c", &["t"])).await?;
    let mut client = srv.client().await?;

    // At every limit at once: 64 headers of exactly 16 KiB in all (63 of 3-byte keys and
    // 253-byte values, and a 256-byte key with an empty value), 255-byte type and ordering key.
    let mut at_limit = headers(63, 253);
    at_limit.insert("k".repeat(256), String::new());
    assert_eq!(at_limit.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>(), 16 * 1024);
    assert_eq!(at_limit.len(), 64);
    let big = pb::EnqueueRequest {
        r#type: "T".repeat(255),
        ordering_key: Some("k".repeat(255)),
        headers: at_limit.clone(),
        ..message("t")
    };
    client.enqueue(big).await?;
    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let d = s.next(WAIT).await?.context("the message at its limits was not delivered")?;
    assert_eq!((d.r#type.len(), d.ordering_key.len()), (255, 255));
    assert_eq!(d.headers, at_limit);

    // One over each limit, and the values the issue found accepted.
    assert_invalid(
        client.enqueue(pb::EnqueueRequest { headers: headers(65, 1), ..message("t") }).await,
        "headers",
        &["65", "64"],
    );
    let huge: HashMap<String, String> = (0..100_000).map(|i| (format!("k{i}"), String::new())).collect();
    assert_invalid(
        client.enqueue(pb::EnqueueRequest { headers: huge, ..message("t") }).await,
        "headers",
        &["100000", "64"],
    );
    let mut over = headers(64, 253);
    over.insert("h00".into(), "v".repeat(254));
    assert_invalid(
        client.enqueue(pb::EnqueueRequest { headers: over, ..message("t") }).await,
        "headers",
        &["16385", "16384"],
    );
    let empty_key = HashMap::from([(String::new(), "v".to_owned())]);
    assert_invalid(
        client.enqueue(pb::EnqueueRequest { headers: empty_key, ..message("t") }).await,
        "headers",
        &["empty"],
    );
    let long_key = HashMap::from([("k".repeat(257), "v".to_owned())]);
    assert_invalid(
        client.enqueue(pb::EnqueueRequest { headers: long_key, ..message("t") }).await,
        "headers",
        &["257", "256"],
    );
    assert_invalid(
        client.enqueue(pb::EnqueueRequest { r#type: "T".repeat(256), ..message("t") }).await,
        "type",
        &["256", "255"],
    );
    let mb = 1024 * 1024;
    assert_invalid(
        client.enqueue(pb::EnqueueRequest { r#type: "T".repeat(mb), ..message("t") }).await,
        "type",
        &["1048576", "255"],
    );
    assert_invalid(
        client.enqueue(pb::EnqueueRequest { ordering_key: Some("k".repeat(mb)), ..message("t") }).await,
        "ordering_key",
        &["1048576", "255"],
    );
    // In a batch, the field names the message; nothing of the batch is written.
    let batch = vec![message("t"), pb::EnqueueRequest { headers: headers(65, 1), ..message("t") }];
    assert_invalid(
        client.enqueue_batch(pb::EnqueueBatchRequest { messages: batch }).await,
        "messages[1].headers",
        &["65"],
    );
    assert!(s.next(Duration::from_millis(300)).await?.is_none(), "a refused message was delivered");

    // Consumers: topics per consumer, backoff and ack deadline.
    let topics: Vec<String> = (0..10_000).map(|i| format!("t{i}")).collect();
    let req = |c: pb::Consumer| pb::CreateConsumerRequest { consumer: Some(c) };
    assert_invalid(
        admin.create_consumer(req(pb::Consumer { topics, ..consumer("many", &[]) })).await,
        "consumer.topics",
        &["10000", "100"],
    );
    let hundred: Vec<String> = (0..100).map(|i| format!("t{i}")).collect();
    admin.create_consumer(req(pb::Consumer { topics: hundred, ..consumer("hundred", &[]) })).await?;
    let base = prost_types::Duration { seconds: 100_000_000_000, nanos: 0 };
    assert_invalid(
        admin
            .create_consumer(req(pb::Consumer {
                backoff_base: Some(base),
                backoff_max: Some(base),
                ..consumer("slow", &["t"])
            }))
            .await,
        "consumer.backoff_base",
        &["24h"],
    );
    assert_invalid(
        admin
            .create_consumer(req(pb::Consumer {
                backoff_max: Some(dur(Duration::from_secs(25 * 3600))),
                ..consumer("slow", &["t"])
            }))
            .await,
        "consumer.backoff_max",
        &["25h", "24h"],
    );
    admin
        .create_consumer(req(pb::Consumer {
            backoff_base: Some(dur(Duration::from_secs(24 * 3600))),
            backoff_max: Some(dur(Duration::from_secs(24 * 3600))),
            ..consumer("daily", &["t"])
        }))
        .await?;
    assert_invalid(
        admin
            .create_consumer(req(pb::Consumer {
                ack_deadline: Some(dur(Duration::from_secs(25 * 3600))),
                ..consumer("slow", &["t"])
            }))
            .await,
        "consumer.ack_deadline",
        &["25h", "24h"],
    );
    Ok(())
}

/// A `Subscribe` stream on an existing connection (a tonic client shares its channel's one
/// HTTP/2 connection between its clones).
#[derive(Debug)]
struct Stream {
    _tx: mpsc::Sender<pb::SubscribeRequest>,
    _inbound: tonic::Streaming<pb::SubscribeResponse>,
}

async fn subscribe(client: &OutboxClient, consumer: &str) -> Result<Stream, tonic::Status> {
    let (tx, rx) = mpsc::channel(4);
    let start = pb::Start { consumer: consumer.into(), max_in_flight: 1, ack_deadline: None };
    tx.send(pb::SubscribeRequest { request: Some(pb::subscribe_request::Request::Start(start)) })
        .await
        .map_err(|_| tonic::Status::internal("send"))?;
    let inbound = client.clone().subscribe(ReceiverStream::new(rx)).await?.into_inner();
    Ok(Stream { _tx: tx, _inbound: inbound })
}

fn assert_exhausted<T: std::fmt::Debug>(r: Result<T, tonic::Status>, words: &[&str]) {
    let s = r.expect_err("the stream was accepted");
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    for w in words {
        assert!(s.message().contains(w), "{:?} lacks {w:?}", s.message());
    }
}

/// Stream counting is the gRPC edge's, the same on every store: tested on SQLite.
#[tokio::test]
async fn streams_beyond_the_connection_and_process_limits_are_refused_and_a_closed_one_gives_its_place_back()
-> Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let metrics = format!("127.0.0.1:{port}");
    let (_store, srv, _db) = setup(
        Backend::Sqlite,
        &["--max-streams", "3", "--max-streams-per-connection", "2", "--metrics-listen", &metrics],
    )
    .await?;
    let mut admin = srv.admin().await?;
    create_consumer(&mut admin, consumer("c", &["t"])).await?;

    let a = srv.client().await?;
    let a1 = subscribe(&a, "c").await?;
    let _a2 = subscribe(&a, "c").await?;
    assert_exhausted(subscribe(&a, "c").await, &["--max-streams-per-connection", "limit is 2", "2 open"]);
    // The connection still serves unary calls: HTTP/2 leaves room beyond the stream limit.
    a.clone().enqueue(message("t")).await?;

    let b = srv.client().await?;
    let _b1 = subscribe(&b, "c").await?;
    assert_exhausted(subscribe(&b, "c").await, &["(--max-streams)", "limit is 3", "serves 3"]);
    // Tail and ReplayStream streams count too.
    let tail = admin.tail(pb::TailRequest { topics: vec![] }).await;
    assert_exhausted(tail, &["(--max-streams)"]);
    let replay = pb::ReplayRequest { consumer: "c".into(), dead_letters: true, ..Default::default() };
    assert_exhausted(admin.replay_stream(replay).await, &["(--max-streams)"]);

    // Each refusal is counted by the limit that refused it.
    let text = scrape(&metrics).await?;
    let count = |limit: &str| sample(&text, &format!("outboxd_limit_refusals_total{{limit=\"{limit}\"}}"));
    assert_eq!((count("max_streams_per_connection"), count("max_streams")), (Some(1.0), Some(3.0)), "{text}");

    // A stream that ends gives its place back (once its session has noticed).
    drop(a1);
    let b2 = eventually("a place after a stream closed", WAIT, || async {
        match subscribe(&b, "c").await {
            Ok(s) => Ok(Some(s)),
            Err(s) if s.code() == Code::ResourceExhausted => Ok(None),
            Err(s) => Err(s.into()),
        }
    })
    .await?;
    drop(b2);
    Ok(())
}

/// The defaults: 100 streams on one connection, the 101st refused at once (not left waiting for
/// HTTP/2 credit). The default poll interval, so that 100 idle streams cost little.
#[tokio::test]
async fn by_default_one_connection_holds_100_streams_and_the_101st_is_refused() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let srv = Outboxd::start(store.url(), &[]).await?;
    let mut admin = srv.admin().await?;
    create_consumer(&mut admin, consumer("c", &["t"])).await?;
    let client = srv.client().await?;
    let mut open = Vec::new();
    for _ in 0..100 {
        open.push(subscribe(&client, "c").await?);
    }
    let refused = tokio::time::timeout(WAIT, subscribe(&client, "c")).await.context("the 101st stream hung")?;
    assert_exhausted(refused, &["--max-streams-per-connection", "limit is 100"]);
    // Another connection is still welcome.
    let other = srv.client().await?;
    subscribe(&other, "c").await?;
    Ok(())
}

/// Load shedding needs unary calls that stay in progress for as long as the test wants: each
/// waits on a table lock the test holds, which takes PostgreSQL.
#[tokio::test]
async fn a_burst_of_unary_calls_beyond_the_limit_is_refused_at_once_while_streams_and_health_pass() -> Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let metrics = format!("127.0.0.1:{port}");
    let (_db, srv, pool) = setup_pg(&["--max-concurrent-requests", "2", "--metrics-listen", &metrics]).await?;
    let mut admin = srv.admin().await?;
    create_consumer(&mut admin, consumer("c", &["t"])).await?;

    let mut lock = pool.begin().await?;
    sqlx::query("LOCK TABLE outbox.consumers IN ACCESS EXCLUSIVE MODE").execute(&mut *lock).await?;
    let held: Vec<_> = (0..2)
        .map(|_| {
            let mut admin = admin.clone();
            tokio::spawn(async move { admin.get_consumer(pb::GetConsumerRequest { consumer: "c".into() }).await })
        })
        .collect();
    eventually("two calls waiting on the lock", WAIT, || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'
                AND query = 'SELECT * FROM outbox.consumers WHERE name = $1'",
        )
        .fetch_one(&pool)
        .await?;
        Ok((waiting == 2).then_some(()))
    })
    .await?;

    // A burst now is refused at once, every call naming the limit.
    let burst: Vec<_> = (0..20)
        .map(|i| {
            let mut client = admin.clone();
            tokio::spawn(async move {
                if i % 2 == 0 {
                    client.list_consumers(pb::ListConsumersRequest {}).await.map(|_| ())
                } else {
                    client.get_stats(pb::GetStatsRequest::default()).await.map(|_| ())
                }
            })
        })
        .collect();
    for call in burst {
        let r = tokio::time::timeout(WAIT, call).await.context("a shed call waited")??;
        let s = r.expect_err("a call beyond the limit was served");
        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
        assert!(s.message().contains("--max-concurrent-requests") && s.message().contains("limit of 2"), "{s:?}");
    }
    let mut producer = srv.client().await?;
    let shed = producer.enqueue(message("t")).await.expect_err("enqueue was served");
    assert_eq!(shed.code(), Code::Unavailable);
    let text = scrape(&metrics).await?;
    let shed = sample(&text, "outboxd_limit_refusals_total{limit=\"max_concurrent_requests\"}");
    assert_eq!(shed, Some(21.0), "{text}");

    // Health checking and streams are not unary calls of outboxd's: they pass.
    let channel = outbox_client::grpc::connect(&srv.endpoint).await?;
    let health = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest { service: String::new() })
        .await?
        .into_inner();
    assert_eq!(health.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);
    let _tail = admin.tail(pb::TailRequest { topics: vec!["t".into()] }).await?;

    // The calls in progress finish once the lock goes, and their places are free again.
    lock.commit().await?;
    for call in held {
        call.await??;
    }
    producer.enqueue(message("t")).await?;
    admin.list_consumers(pb::ListConsumersRequest {}).await?;
    Ok(())
}

/// The payload limit, and the request size that tonic decodes at most, which follows from it.
#[tokio::test]
async fn payloads_beyond_the_flag_and_requests_beyond_the_decoding_limit_are_refused() -> Result<()> {
    let (_store, srv, _db) = setup(Backend::Sqlite, &["--max-payload-bytes", "1024"]).await?;
    let mut client = srv.client().await?;
    client.enqueue(pb::EnqueueRequest { payload: vec![7; 1024], ..message("t") }).await?;
    assert_invalid(
        client.enqueue(pb::EnqueueRequest { payload: vec![7; 1025], ..message("t") }).await,
        "payload",
        // The words of `outbox.enqueue`'s refusal, naming the flag that sets the limit.
        &["1025 bytes", "the limit is 1024 bytes", "--max-payload-bytes"],
    );
    // (1024 + 64 KiB) x 16 = 1,064,960 bytes decoded at most.
    let s = client
        .enqueue(pb::EnqueueRequest { r#type: "T".repeat(1_100_000), ..message("t") })
        .await
        .expect_err("an oversized request was decoded");
    assert_eq!(s.code(), Code::OutOfRange, "{s:?}");
    assert!(s.message().contains("1064960"), "{s:?}");
    Ok(())
}

#[tokio::test]
async fn limit_flags_that_cannot_work_are_refused_at_start_naming_the_flag() -> Result<()> {
    for (flag, value) in
        [("--max-streams", "0"), ("--max-streams-per-connection", "0"), ("--max-concurrent-requests", "0")]
    {
        let out = tokio::process::Command::new(outbox_tests::outboxd_path())
            .args(["serve", "--database-url", "sqlite://unused-limits.db", "--listen", "127.0.0.1:0", flag, value])
            .output()
            .await?;
        assert!(!out.status.success(), "{flag} {value} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag) && stderr.contains("between 1 and"), "{flag}: {stderr}");
    }
    Ok(())
}

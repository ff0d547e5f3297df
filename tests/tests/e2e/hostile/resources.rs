//! What a hostile tenant can make outboxd hold: bodies refused before they are read, stalled
//! bodies, silent connections and unacked deliveries bounded, within its own quota.
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use bytes::Bytes;
use outbox_client::grpc::{admin_with, outbox_with};
use outbox_proto::v1 as pb;
use outbox_tests::{Backend, consumer};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use super::{
    Raw, closed, eventually_count, next_delivery, rss, serve, serve_as, served_within_a_second, status_of, subscriber,
};
use crate::security::tok;

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

//! Delivery semantics: fan-out, order, ordering keys, flow control, retries, bad input,
//! graceful shutdown.
use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::Result;
use outbox_client::Message;
use outbox_proto::v1 as pb;
use outbox_tests::{Backend, DbProxy, FAST, Outboxd, RawStream, consumer, create_consumer, dur, eventually};
use tonic::Code;

use crate::{WAIT, conformance, setup, stats};

conformance!(
    fan_out_reaches_every_matching_consumer_and_only_those,
    deliveries_come_in_seq_order_within_max_in_flight,
    an_ordering_key_is_delivered_one_at_a_time_through_retries,
    nack_retries_after_backoff_with_a_growing_count,
    a_delay_postpones_delivery,
    acks_for_ids_the_stream_does_not_hold_are_ignored,
    subscribe_errors_unknown_consumer_and_missing_start,
    bad_input_gets_invalid_argument_naming_the_field_and_writes_nothing,
    sigterm_drains_streams_and_releases_leases_for_immediate_redelivery,
    health_and_reflection_are_served,
    a_late_ack_after_the_deadline_still_counts,
    a_clean_close_does_not_count_against_what_the_stream_held,
    a_stream_that_acks_one_of_three_and_half_closes_gives_the_other_two_back_uncounted,
    a_cancelled_call_counts_what_it_was_sent_and_dies_at_max_deliveries,
    a_broken_connection_counts_against_what_the_stream_held_and_dies_at_max_deliveries,
    a_stream_that_breaks_the_protocol_ends_with_invalid_argument_after_what_came_before,
);

async fn fan_out_reaches_every_matching_consumer_and_only_those(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    let mut admin = srv.admin().await?;
    create_consumer(&mut admin, consumer("exact", &["orders.created"])).await?;
    create_consumer(&mut admin, consumer("one", &["orders.*"])).await?;
    create_consumer(&mut admin, consumer("rest", &["orders.>"])).await?;
    create_consumer(&mut admin, consumer("users", &["users.created", "users.deleted"])).await?;

    let a = db.sql_enqueue("orders.created", "T", b"").await?;
    let b = db.sql_enqueue("orders.created.v2", "T", b"").await?;
    let c = db.sql_enqueue("users.deleted", "T", b"").await?;
    let consumers_of = |id: uuid::Uuid| {
        let mut admin = admin.clone();
        async move {
            let m = admin.get_message(pb::GetMessageRequest { message_id: id.to_string() }).await?.into_inner();
            if m.message.as_ref().and_then(|m| m.relayed_at.as_ref()).is_none() {
                return Ok(None);
            }
            Ok(Some(m.deliveries.into_iter().map(|d| d.consumer).collect::<Vec<_>>()))
        }
    };
    assert_eq!(eventually("a relayed", WAIT, || consumers_of(a)).await?, ["exact", "one", "rest"]);
    assert_eq!(eventually("b relayed", WAIT, || consumers_of(b)).await?, ["rest"]);
    assert_eq!(eventually("c relayed", WAIT, || consumers_of(c)).await?, ["users"]);
    Ok(())
}

async fn deliveries_come_in_seq_order_within_max_in_flight(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    create_consumer(&mut srv.admin().await?, consumer("c", &["t"])).await?;
    db.enqueue_all(&(0..12u8).map(|i| Message::new("t", "T", vec![i])).collect::<Vec<_>>()).await?;
    let mut s = RawStream::open(&srv.endpoint, "c", 4).await?;
    let first = s.take(4, WAIT).await?;
    // A second stream gets the lowest message that is left: the fifth, had the first stream
    // taken more than its four it would get a later one (leases are exclusive).
    let mut control = RawStream::open(&srv.endpoint, "c", 1).await?;
    let fifth = control.take(1, WAIT).await?.remove(0);
    assert_eq!(fifth.payload, [4], "the first stream held no more than max_in_flight");
    assert!(s.next(Duration::ZERO).await?.is_none(), "nothing beyond max_in_flight was sent");
    control.ack(&[&fifth.message_id]).await;
    control.close();
    assert!(control.end_status(WAIT).await?.is_none_or(|st| st.code() == Code::Ok), "a clean close");
    s.ack(&first.iter().map(|d| d.message_id.as_str()).collect::<Vec<_>>()).await;
    let mut all = first;
    for n in [4, 3] {
        let batch = s.take(n, WAIT).await?;
        s.ack(&batch.iter().map(|d| d.message_id.as_str()).collect::<Vec<_>>()).await;
        all.extend(batch);
    }
    let seqs: Vec<i64> = all.iter().map(|d| d.seq).collect();
    let mut sorted = seqs.clone();
    sorted.sort();
    assert_eq!(seqs, sorted, "seq order");
    let expected: Vec<u8> = (0..12).filter(|i| *i != 4).collect();
    assert_eq!(all.iter().map(|d| d.payload[0]).collect::<Vec<_>>(), expected);
    Ok(())
}

async fn an_ordering_key_is_delivered_one_at_a_time_through_retries(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    create_consumer(&mut srv.admin().await?, consumer("c", &["t"])).await?;
    let msgs = [("k1", "a"), ("k1", "b"), ("k2", "x"), ("k1", "c")]
        .map(|(key, name)| Message::new("t", name, b"".to_vec()).ordering_key(key));
    db.enqueue_all(&msgs).await?;
    // Room for two: a and x fill it.
    let mut s = RawStream::open(&srv.endpoint, "c", 2).await?;
    let first = s.take(2, WAIT).await?;
    let names: Vec<&str> = first.iter().map(|d| d.r#type.as_str()).collect();
    assert_eq!(names, ["a", "x"]);
    // b waits for a, across streams too: a second stream with room gets y, a later message of
    // another key, and not b, which a lease would return first (lower seq) if it were ready.
    let mut other = RawStream::open(&srv.endpoint, "c", 10).await?;
    db.enqueue(&Message::new("t", "y", b"".to_vec()).ordering_key("k3")).await?;
    let y = other.take(1, WAIT).await?.remove(0);
    assert_eq!(y.r#type, "y", "b waits for a");
    assert!(other.next(Duration::ZERO).await?.is_none(), "b waits for a");
    other.ack(&[&y.message_id]).await;
    other.close();
    assert!(other.end_status(WAIT).await?.is_none_or(|st| st.code() == Code::Ok), "a clean close");
    s.ack(&[&first[0].message_id]).await;
    let b = s.take(1, WAIT).await?.remove(0);
    assert_eq!(b.r#type, "b");
    s.nack(&b.message_id, "transient").await;
    let b2 = s.take(1, WAIT).await?.remove(0);
    assert_eq!((b2.r#type.as_str(), b2.delivery_count), ("b", 2), "the retry comes before c");
    s.ack(&[&b2.message_id]).await;
    let c = s.take(1, WAIT).await?.remove(0);
    assert_eq!(c.r#type, "c");
    assert_eq!(c.ordering_key, "k1");
    Ok(())
}

async fn nack_retries_after_backoff_with_a_growing_count(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    let mut c = consumer("c", &["t"]);
    c.backoff_base = Some(dur(Duration::from_millis(300)));
    c.backoff_max = Some(dur(Duration::from_secs(5)));
    create_consumer(&mut srv.admin().await?, c).await?;
    db.sql_enqueue("t", "T", b"").await?;
    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let d = s.take(1, WAIT).await?.remove(0);
    let nacked = Instant::now();
    s.nack(&d.message_id, "try later").await;
    let d2 = s.take(1, WAIT).await?.remove(0);
    assert!(nacked.elapsed() >= Duration::from_millis(280), "waited the backoff, got {:?}", nacked.elapsed());
    assert_eq!(d2.delivery_count, 2);
    let nacked = Instant::now();
    s.nack(&d2.message_id, "try later").await;
    let d3 = s.take(1, WAIT).await?.remove(0);
    assert!(nacked.elapsed() >= Duration::from_millis(580), "backoff doubled, got {:?}", nacked.elapsed());
    assert_eq!(d3.delivery_count, 3);
    Ok(())
}

async fn a_delay_postpones_delivery(backend: Backend) -> Result<()> {
    let (_store, srv, _db) = setup(backend, &[]).await?;
    create_consumer(&mut srv.admin().await?, consumer("c", &["t"])).await?;
    let mut client = srv.client().await?;
    let sent = Instant::now();
    outbox_client::grpc::enqueue_rpc(
        &mut client,
        &Message::new("t", "Later", b"".to_vec()).delay(Duration::from_millis(800)),
    )
    .await?;
    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let d = s.take(1, WAIT).await?.remove(0);
    assert_eq!(d.r#type, "Later");
    assert!(sent.elapsed() >= Duration::from_millis(790), "delivered after {:?}", sent.elapsed());
    Ok(())
}

async fn acks_for_ids_the_stream_does_not_hold_are_ignored(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    create_consumer(&mut srv.admin().await?, consumer("c", &["t"])).await?;
    let mut holder = RawStream::open(&srv.endpoint, "c", 10).await?;
    db.sql_enqueue("t", "T", b"").await?;
    let d = holder.take(1, WAIT).await?.remove(0);
    // Another stream of the same consumer acks and nacks the id the first one holds (and some
    // that nobody holds), then closes; the server handles a stream's requests in order, so
    // once that stream has ended they have all been seen.
    let mut other = RawStream::open(&srv.endpoint, "c", 10).await?;
    other.ack(&["not-a-uuid", &uuid::Uuid::new_v4().to_string(), &d.message_id]).await;
    other.nack(&d.message_id, "not mine").await;
    other.nack(&uuid::Uuid::new_v4().to_string(), "nothing").await;
    other.close();
    assert!(other.end_status(WAIT).await?.is_none_or(|st| st.code() == Code::Ok), "a clean close");
    let st = stats(&srv, "c").await?;
    assert_eq!((st.acked, st.in_flight, st.retrying), (0, 1, 0), "the lease is still the first stream's: {st:?}");
    holder.ack(&[&d.message_id]).await;
    eventually("acked", WAIT, || async { Ok((stats(&srv, "c").await?.acked == 1).then_some(())) }).await?;
    assert_eq!(stats(&srv, "c").await?.in_flight, 0);
    Ok(())
}

async fn subscribe_errors_unknown_consumer_and_missing_start(backend: Backend) -> Result<()> {
    let (_store, srv, _db) = setup(backend, &[]).await?;
    let err = RawStream::open(&srv.endpoint, "nobody", 10).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("nobody"), "{}", err.message());
    let err = RawStream::open(&srv.endpoint, "bad name!", 10).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("start.consumer"), "{}", err.message());

    // A first request that is not `start`.
    let mut client = srv.client().await?;
    let first =
        pb::SubscribeRequest { request: Some(pb::subscribe_request::Request::Ack(pb::Ack { message_ids: vec![] })) };
    let err = client.subscribe(tokio_stream::iter(vec![first])).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("start"), "{}", err.message());
    Ok(())
}

async fn bad_input_gets_invalid_argument_naming_the_field_and_writes_nothing(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &["--max-payload-bytes", "1024"]).await?;
    let mut client = srv.client().await?;
    let ok = || pb::EnqueueRequest { topic: "orders.created".into(), r#type: "T".into(), ..Default::default() };
    let cases = [
        (pb::EnqueueRequest { topic: "".into(), ..ok() }, "topic"),
        (pb::EnqueueRequest { topic: "orders..created".into(), ..ok() }, "topic"),
        (pb::EnqueueRequest { topic: "orders.*".into(), ..ok() }, "topic"),
        (pb::EnqueueRequest { r#type: "".into(), ..ok() }, "type"),
        (pb::EnqueueRequest { message_id: Some("12345".into()), ..ok() }, "message_id"),
        (pb::EnqueueRequest { payload: vec![0; 1025], ..ok() }, "payload"),
    ];
    for (req, field) in cases {
        let err = client.enqueue(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}");
        assert!(err.message().starts_with(field), "{field}: {}", err.message());
    }
    // All or nothing: one bad message in a batch rejects the batch.
    let err = client
        .enqueue_batch(pb::EnqueueBatchRequest {
            messages: vec![ok(), pb::EnqueueRequest { topic: "a b".into(), ..ok() }],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("messages[1].topic"), "{}", err.message());
    let count = db.message_count().await?;
    assert_eq!(count, 0, "nothing written");

    let batch = client.enqueue_batch(pb::EnqueueBatchRequest { messages: vec![ok(), ok()] }).await?.into_inner();
    assert_eq!(batch.results.len(), 2);
    assert!(batch.results[0].seq < batch.results[1].seq);

    // Admin input too.
    let mut admin = srv.admin().await?;
    let err = admin
        .create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer("c", &["orders.>.x"])) })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("consumer.topics[0]"), "{}", err.message());
    Ok(())
}

async fn sigterm_drains_streams_and_releases_leases_for_immediate_redelivery(backend: Backend) -> Result<()> {
    let (store, srv, db) = setup(backend, &[]).await?;
    create_consumer(&mut srv.admin().await?, consumer("c", &["t"])).await?; // 30 s ack deadline
    for i in 0..3u8 {
        db.sql_enqueue("t", "T", &[i]).await?;
    }
    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let held = s.take(3, WAIT).await?;
    s.ack(&[&held[0].message_id]).await;
    eventually("first ack applied", WAIT, || async { Ok((stats(&srv, "c").await?.acked == 1).then_some(())) }).await?;

    let stopping = tokio::spawn(srv.terminate(Duration::from_secs(20)));
    let status = s.end_status(Duration::from_secs(20)).await?.expect("the stream ends with a status");
    assert_eq!(status.code(), Code::Unavailable);
    assert!(stopping.await??, "outboxd exits 0 after SIGTERM");

    // Released at shutdown: redelivered at once, long before the 30 s deadline.
    let srv = Outboxd::start(store.url(), FAST).await?;
    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let again = s.take(2, Duration::from_secs(5)).await?;
    let ids: HashSet<_> = again.iter().map(|d| d.message_id.clone()).collect();
    let expected: HashSet<_> = held[1..].iter().map(|d| d.message_id.clone()).collect();
    assert_eq!(ids, expected);
    assert!(again.iter().all(|d| d.delivery_count == 1), "a shutdown counts no attempt: {again:?}");
    Ok(())
}

async fn health_and_reflection_are_served(backend: Backend) -> Result<()> {
    let (_store, srv, _db) = setup(backend, &[]).await?;
    let channel = outbox_client::grpc::connect(&srv.endpoint).await?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    for service in ["", "outbox.v1.Outbox", "outbox.v1.OutboxAdmin"] {
        let r = health.check(tonic_health::pb::HealthCheckRequest { service: service.into() }).await?.into_inner();
        assert_eq!(r.status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32, "{service:?}");
    }
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut reflection = ServerReflectionClient::new(channel);
    let req = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut resp = reflection.server_reflection_info(tokio_stream::iter(vec![req])).await?.into_inner();
    let msg = resp.message().await?.unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = msg.message_response else {
        anyhow::bail!("unexpected reflection answer")
    };
    let names: HashSet<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(names.contains("outbox.v1.Outbox") && names.contains("outbox.v1.OutboxAdmin"), "{names:?}");
    Ok(())
}

async fn a_late_ack_after_the_deadline_still_counts(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    let mut c = consumer("c", &["t"]);
    c.backoff_base = Some(dur(Duration::from_secs(60))); // released, not redelivered meanwhile
    c.backoff_max = Some(dur(Duration::from_secs(60)));
    create_consumer(&mut srv.admin().await?, c).await?;
    let id = db.sql_enqueue("t", "Slow", b"").await?.to_string();
    let start =
        pb::Start { consumer: "c".into(), max_in_flight: 10, ack_deadline: Some(dur(Duration::from_millis(200))) };
    let mut s = RawStream::open_with(&srv.endpoint, start).await?;
    s.take(1, WAIT).await?;
    let mut admin = srv.admin().await?;
    let state = |want: pb::delivery_state::State| {
        let (mut admin, id) = (admin.clone(), id.clone());
        async move {
            let m = admin.get_message(pb::GetMessageRequest { message_id: id }).await?.into_inner();
            Ok((m.deliveries[0].state == want as i32).then_some(()))
        }
    };
    eventually("the lease to expire", WAIT, || state(pb::delivery_state::State::Pending)).await?;
    s.ack(&[&id]).await; // the slow handler finished after all
    eventually("the late ack to be applied", WAIT, || state(pb::delivery_state::State::Acked)).await?;
    let m = admin.get_message(pb::GetMessageRequest { message_id: id.clone() }).await?.into_inner();
    assert_eq!(m.deliveries[0].delivery_count, 1);
    Ok(())
}

async fn a_clean_close_does_not_count_against_what_the_stream_held(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    let mut c = consumer("c", &["t"]);
    c.max_deliveries = 1;
    create_consumer(&mut srv.admin().await?, c).await?;
    db.sql_enqueue("t", "T", b"").await?;
    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let d = s.take(1, WAIT).await?.remove(0);
    s.close(); // a consumer stopping on purpose, before handling it
    assert!(s.end_status(WAIT).await?.is_none(), "the server ends the stream cleanly");
    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let again = s.take(1, WAIT).await?.remove(0);
    assert_eq!(again.message_id, d.message_id, "released, not dead-lettered, at max_deliveries 1");
    assert_eq!(again.delivery_count, 1, "the same attempt again, within max_deliveries");
    assert_eq!(stats(&srv, "c").await?.dead, 0);
    Ok(())
}

/// T16 (issue 47): a consumer of `max_deliveries` 1 whose stream receives three deliveries,
/// acks one and half-closes gets the other two back at once, counted 1 as before its close:
/// nothing is retrying in between, and no delivery counts more than `max_deliveries`.
async fn a_stream_that_acks_one_of_three_and_half_closes_gives_the_other_two_back_uncounted(
    backend: Backend,
) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    let mut c = consumer("c", &["t"]);
    c.max_deliveries = 1;
    create_consumer(&mut srv.admin().await?, c).await?; // 30 s ack deadline: only the close releases
    for i in 0..3u8 {
        db.sql_enqueue("t", "T", &[i]).await?;
    }
    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let held = s.take(3, WAIT).await?;
    assert!(held.iter().all(|d| d.delivery_count == 1), "{held:?}");
    s.ack(&[&held[0].message_id]).await;
    s.close();
    assert!(s.end_status(WAIT).await?.is_none(), "the server ends the stream cleanly");
    let st = eventually("the close's release", WAIT, || async {
        let st = stats(&srv, "c").await?;
        Ok((st.acked == 1 && st.in_flight == 0 && st.streams == 0).then_some(st))
    })
    .await?;
    assert_eq!((st.backlog, st.retrying, st.dead), (2, 0, 0), "a clean close is no failed attempt");

    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let again = s.take(2, WAIT).await?;
    let ids: HashSet<_> = again.iter().map(|d| d.message_id.clone()).collect();
    let expected: HashSet<_> = held[1..].iter().map(|d| d.message_id.clone()).collect();
    assert_eq!(ids, expected);
    assert_eq!(again.iter().map(|d| d.delivery_count).collect::<Vec<_>>(), [1, 1], "within max_deliveries 1");
    // Still the last attempt: a nack now makes a dead letter, as max_deliveries 1 says.
    s.nack(&again[0].message_id, "poison").await;
    eventually("dead at its one attempt", WAIT, || async { Ok((stats(&srv, "c").await?.dead == 1).then_some(())) })
        .await?;
    Ok(())
}

/// A client that cancels its call (HTTP/2 `RST_STREAM`, as some gRPC libraries do when a handler
/// fails or a deadline passes) has not closed cleanly: what it was sent counts, and at
/// `max_deliveries` it is dead, instead of coming back at count 1 for ever. (Before, the count
/// depended on whether the server saw the end of the requests or the reset first.)
async fn a_cancelled_call_counts_what_it_was_sent_and_dies_at_max_deliveries(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    let mut c = consumer("c", &["t"]);
    c.max_deliveries = 1;
    create_consumer(&mut srv.admin().await?, c).await?; // 30 s ack deadline: only the cancel releases
    db.sql_enqueue("t", "T", b"poison").await?;
    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    assert_eq!(s.take(1, WAIT).await?[0].delivery_count, 1);
    // Dropped whole: the client's HTTP/2 stack ends the requests and resets the call, in
    // either order; both are a cancel.
    drop(s);
    let st = eventually("the cancel's release", WAIT, || async {
        let st = stats(&srv, "c").await?;
        Ok((st.in_flight == 0 && st.streams == 0 && st.dead + st.backlog == 1).then_some(st))
    })
    .await?;
    assert_eq!((st.dead, st.backlog), (1, 0), "a cancel is no clean close: its one attempt is used");
    Ok(())
}

/// T16 (broken) and T17: a connection cut under a stream (no half-close, no reset from the
/// client: the TCP connection just goes) releases what the stream held at once, due now, with
/// "stream broke before ack" and the attempt counted; at `max_deliveries` the delivery is dead.
async fn a_broken_connection_counts_against_what_the_stream_held_and_dies_at_max_deliveries(
    backend: Backend,
) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    let mut c = consumer("c", &["t"]);
    c.max_deliveries = 2;
    create_consumer(&mut srv.admin().await?, c).await?; // 30 s ack deadline: only the break releases
    let id = db.sql_enqueue("t", "T", b"").await?.to_string();
    let admin = srv.admin().await?;
    for attempt in 1..=2u32 {
        let proxy = DbProxy::start(srv.addr).await?;
        let mut s = RawStream::open(&format!("http://127.0.0.1:{}", proxy.port), "c", 10).await?;
        let d = s.take(1, WAIT).await?.remove(0);
        assert_eq!((d.message_id.as_str(), d.delivery_count), (id.as_str(), attempt));
        proxy.set_up(false); // the connection is cut
        let want = if attempt < 2 { pb::delivery_state::State::Pending } else { pb::delivery_state::State::Dead };
        let row = eventually("the broken stream's release", WAIT, || {
            let (mut admin, id) = (admin.clone(), id.clone());
            async move {
                let m = admin.get_message(pb::GetMessageRequest { message_id: id }).await?.into_inner();
                Ok(m.deliveries.into_iter().find(|r| r.consumer == "c" && r.state == want as i32))
            }
        })
        .await?;
        assert_eq!(row.last_error, "stream broke before ack");
        assert_eq!(row.delivery_count, attempt);
    }
    assert_eq!(stats(&srv, "c").await?.dead, 1);
    Ok(())
}

/// A second `start`, or an ack of more ids than one request may carry, ends the stream with
/// INVALID_ARGUMENT naming the field; what the client sent before it still counts, and the
/// leases the stream held are released at once for the next stream, as a clean close releases
/// them: the refusal is the server's, not a failed attempt of the consumer's.
async fn a_stream_that_breaks_the_protocol_ends_with_invalid_argument_after_what_came_before(
    backend: Backend,
) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    create_consumer(&mut srv.admin().await?, consumer("c", &["t"])).await?;
    db.sql_enqueue("t", "T", b"1").await?;
    db.sql_enqueue("t", "T", b"2").await?;
    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let got = s.take(2, WAIT).await?;
    s.ack(&[&got[0].message_id]).await;
    s.send(pb::subscribe_request::Request::Start(pb::Start { consumer: "c".into(), ..Default::default() })).await;
    let st = s.end_status(WAIT).await?.expect("the stream ends with a status");
    assert_eq!(st.code(), Code::InvalidArgument, "{st:?}");
    assert!(st.message().starts_with("start:"), "{}", st.message());
    let after = eventually("the ack applied and the other lease released", WAIT, || async {
        let st = stats(&srv, "c").await?;
        Ok((st.acked == 1 && st.in_flight == 0).then_some(st))
    })
    .await?;
    assert_eq!(after.backlog, 1, "{after:?}");

    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let again = s.take(1, WAIT).await?.remove(0);
    assert_eq!(again.message_id, got[1].message_id);
    assert_eq!(again.delivery_count, 1, "the same attempt again: a refused stream counts none (ADR 0074)");
    let too_many: Vec<String> = (0..10_001).map(|_| uuid::Uuid::new_v4().to_string()).collect();
    s.send(pb::subscribe_request::Request::Ack(pb::Ack { message_ids: too_many })).await;
    let st = s.end_status(WAIT).await?.expect("the stream ends with a status");
    assert_eq!(st.code(), Code::InvalidArgument, "{st:?}");
    assert!(st.message().contains("ack.message_ids") && st.message().contains("10000"), "{}", st.message());
    Ok(())
}

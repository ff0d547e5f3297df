//! The admin API: consumers, replay, message inspection, prune; and the SQL producer path.
use std::time::Duration;

use anyhow::Result;
use outbox_proto::v1 as pb;
use outbox_tests::{Backend, Db, Outboxd, RawStream, consumer, create_consumer, eventually};
use tonic::Code;

use crate::{WAIT, conformance, setup, setup_pg, stats};

conformance!(
    consumers_are_created_idempotently_listed_paused_resumed_and_deleted,
    start_from_earliest_gets_retained_messages_and_new_does_not,
    replay_by_ids_and_by_range_redelivers_acked_messages_from_count_one,
    get_message_shows_each_consumers_delivery_and_prune_removes_acked_history,
    replay_counts_with_a_dry_run_and_refuses_messages_beyond_the_dedup_horizon,
    replay_filters_by_type_topic_time_range_and_dead_only,
    replay_stream_reports_progress_batch_by_batch_at_the_requested_rate,
    the_client_refuses_a_bad_message_naming_the_field,
);

const QUIET: Duration = Duration::from_millis(300);

async fn consumers_are_created_idempotently_listed_paused_resumed_and_deleted(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    let mut admin = srv.admin().await?;
    let c = create_consumer(&mut admin, consumer("c", &["t"])).await?;
    assert_eq!(c.max_deliveries, 5);
    assert!(c.created_at.is_some());
    // Same definition again: success. A different one: ALREADY_EXISTS.
    create_consumer(&mut admin, consumer("c", &["t"])).await?;
    let err = create_consumer(&mut admin, consumer("c", &["other"])).await.unwrap_err();
    assert_eq!(err.downcast_ref::<tonic::Status>().map(|s| s.code()), Some(Code::AlreadyExists));
    assert!(err.to_string().contains("different topics"), "the differing field is named: {err}");
    let mut longer = consumer("c", &["t"]);
    longer.max_deliveries = 9;
    let err = create_consumer(&mut admin, longer).await.unwrap_err();
    assert!(err.to_string().contains("different max_deliveries"), "{err}");
    let list = admin.list_consumers(pb::ListConsumersRequest {}).await?.into_inner();
    assert_eq!(list.consumers.len(), 1);
    let err = admin.get_consumer(pb::GetConsumerRequest { consumer: "nobody".into() }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let paused = admin.pause_consumer(pb::PauseConsumerRequest { consumer: "c".into() }).await?.into_inner();
    assert!(paused.consumer.unwrap().paused);
    db.sql_enqueue("t", "T", b"").await?;
    eventually("relayed while paused", WAIT, || async { Ok((stats(&srv, "c").await?.backlog == 1).then_some(())) })
        .await?;
    assert!(s.next(QUIET).await?.is_none(), "nothing delivered while paused");
    admin.resume_consumer(pb::ResumeConsumerRequest { consumer: "c".into() }).await?;
    s.take(1, WAIT).await?;

    admin.delete_consumer(pb::DeleteConsumerRequest { consumer: "c".into() }).await?;
    let status = s.end_status(WAIT).await?.expect("stream ends");
    assert_eq!(status.code(), Code::NotFound);
    let err = admin.delete_consumer(pb::DeleteConsumerRequest { consumer: "c".into() }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    Ok(())
}

async fn start_from_earliest_gets_retained_messages_and_new_does_not(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    let mut admin = srv.admin().await?;
    create_consumer(&mut admin, consumer("first", &["t"])).await?;
    let old = db.sql_enqueue("t", "Old", b"").await?;
    eventually("old relayed", WAIT, || async { Ok((stats(&srv, "first").await?.backlog == 1).then_some(())) }).await?;

    let mut early = consumer("early", &["t"]);
    early.start_from = pb::consumer::StartFrom::Earliest as i32;
    create_consumer(&mut admin, early).await?;
    create_consumer(&mut admin, consumer("late", &["t"])).await?;
    let new = db.sql_enqueue("t", "New", b"").await?;

    let mut e = RawStream::open(&srv.endpoint, "early", 10).await?;
    let got: Vec<String> = e.take(2, WAIT).await?.into_iter().map(|d| d.message_id).collect();
    assert_eq!(got, [old.to_string(), new.to_string()]);
    let mut l = RawStream::open(&srv.endpoint, "late", 10).await?;
    let got: Vec<String> = l.take(1, WAIT).await?.into_iter().map(|d| d.message_id).collect();
    assert_eq!(got, [new.to_string()]);
    assert!(l.next(QUIET).await?.is_none());
    Ok(())
}

async fn replay_by_ids_and_by_range_redelivers_acked_messages_from_count_one(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    let mut admin = srv.admin().await?;
    create_consumer(&mut admin, consumer("c", &["t"])).await?;
    let a = db.sql_enqueue("t", "A", b"").await?;
    let b = db.sql_enqueue("t", "B", b"").await?;
    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    for d in s.take(2, WAIT).await? {
        s.ack(&[&d.message_id]).await;
    }
    eventually("acked", WAIT, || async { Ok((stats(&srv, "c").await?.acked == 2).then_some(())) }).await?;
    assert!(s.next(QUIET).await?.is_none(), "acked messages are not redelivered");

    let r = admin
        .replay(pb::ReplayRequest { consumer: "c".into(), message_ids: vec![a.to_string()], ..Default::default() })
        .await?;
    assert_eq!(r.into_inner().replayed, 1);
    let d = s.take(1, WAIT).await?.remove(0);
    assert_eq!((d.message_id.clone(), d.delivery_count), (a.to_string(), 1));
    s.ack(&[&d.message_id]).await;

    let m = admin.get_message(pb::GetMessageRequest { message_id: b.to_string() }).await?.into_inner();
    let enqueued = m.message.unwrap().enqueued_at.unwrap();
    let r = admin
        .replay(pb::ReplayRequest {
            consumer: "c".into(),
            enqueued_after: Some(enqueued),
            enqueued_before: Some(prost_types::Timestamp { seconds: enqueued.seconds + 60, nanos: 0 }),
            ..Default::default()
        })
        .await?;
    assert_eq!(r.into_inner().replayed, 1, "only b is in the range");
    let d = s.take(1, WAIT).await?.remove(0);
    assert_eq!(d.message_id, b.to_string());

    // Exactly one selector.
    let err = admin
        .replay(pb::ReplayRequest {
            consumer: "c".into(),
            dead_letters: true,
            message_ids: vec![a.to_string()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = admin.replay(pb::ReplayRequest { consumer: "c".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    Ok(())
}

async fn get_message_shows_each_consumers_delivery_and_prune_removes_acked_history(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    let mut admin = srv.admin().await?;
    create_consumer(&mut admin, consumer("a", &["t"])).await?;
    create_consumer(&mut admin, consumer("b", &["t"])).await?;
    let id = db.sql_enqueue("t", "T", b"payload").await?;
    let mut s = RawStream::open(&srv.endpoint, "a", 10).await?;
    let d = s.take(1, WAIT).await?.remove(0);
    s.ack(&[&d.message_id]).await;
    eventually("a acked", WAIT, || async { Ok((stats(&srv, "a").await?.acked == 1).then_some(())) }).await?;

    let m = admin.get_message(pb::GetMessageRequest { message_id: id.to_string() }).await?.into_inner();
    assert_eq!(m.message.as_ref().unwrap().payload, b"payload");
    let states: Vec<(String, i32)> = m.deliveries.iter().map(|d| (d.consumer.clone(), d.state)).collect();
    use pb::delivery_state::State;
    assert_eq!(states, [("a".into(), State::Acked as i32), ("b".into(), State::Pending as i32)]);
    let err =
        admin.get_message(pb::GetMessageRequest { message_id: uuid::Uuid::new_v4().to_string() }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // b has not acked: nothing is pruned.
    let older_than = Some(prost_types::Duration { seconds: 0, nanos: 1 });
    let p = admin.prune(pb::PruneRequest { older_than }).await?.into_inner();
    assert_eq!(p.messages_deleted, 0);
    let mut s = RawStream::open(&srv.endpoint, "b", 10).await?;
    let d = s.take(1, WAIT).await?.remove(0);
    s.ack(&[&d.message_id]).await;
    eventually("b acked", WAIT, || async { Ok((stats(&srv, "b").await?.acked == 1).then_some(())) }).await?;
    let p = admin.prune(pb::PruneRequest { older_than }).await?.into_inner();
    assert_eq!((p.messages_deleted, p.deliveries_deleted), (1, 2));
    // The default retention (7 days) keeps recent history.
    db.sql_enqueue("t", "T", b"").await?;
    let p = admin.prune(pb::PruneRequest { older_than: None }).await?.into_inner();
    assert_eq!(p.messages_deleted, 0);
    Ok(())
}

/// PostgreSQL only: SQLite has no stored functions (its producers use the documented INSERT,
/// exercised by every conformance case through `Db::sql_enqueue`).
#[tokio::test]
async fn the_sql_function_joins_the_callers_transaction_and_tolerates_duplicates() -> Result<()> {
    let (_db, _srv, pool) = setup_pg(&[]).await?;
    let id = uuid::Uuid::new_v4();
    let mut tx = pool.begin().await?;
    sqlx::query("CREATE TABLE orders (id int)").execute(&mut *tx).await?;
    let first: uuid::Uuid = sqlx::query_scalar("SELECT outbox.enqueue('orders.created', 'OrderCreated', '\\x7b7d'::bytea, '{\"traceparent\":\"00-abc\"}'::jsonb, $1)")
        .bind(id)
        .fetch_one(&mut *tx)
        .await?;
    let again: uuid::Uuid = sqlx::query_scalar(
        "SELECT outbox.enqueue('orders.created', 'OrderCreated', '\\x7b7d'::bytea, '{}'::jsonb, $1)",
    )
    .bind(id)
    .fetch_one(&mut *tx)
    .await?;
    assert_eq!((first, again), (id, id));
    sqlx::query("INSERT INTO orders VALUES (1)").execute(&mut *tx).await?; // the transaction is still usable
    tx.commit().await?;
    let (count, traceparent): (i64, Option<String>) =
        sqlx::query_as("SELECT count(*), max(headers->>'traceparent') FROM outbox.messages").fetch_one(&pool).await?;
    assert_eq!((count, traceparent.as_deref()), (1, Some("00-abc")));

    let err = sqlx::query("SELECT outbox.enqueue('bad topic', 'T', ''::bytea)").execute(&pool).await.unwrap_err();
    assert!(err.to_string().contains("invalid topic"), "{err}");
    // The table enforces the same rule for writers that insert directly.
    let err = sqlx::query(
        "INSERT INTO outbox.messages (message_id, topic, type, payload) VALUES (gen_random_uuid(), 'a..b', 'T', '')",
    )
    .execute(&pool)
    .await
    .unwrap_err();
    assert!(err.to_string().contains("messages_topic_format"), "{err}");
    Ok(())
}

/// The Rust client refuses a bad message before it reaches the database, naming the field;
/// a duplicate id reports the existing message.
async fn the_client_refuses_a_bad_message_naming_the_field(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    let bad = outbox_client::Message::new("orders..created", "OrderCreated", b"{}".to_vec());
    let good = outbox_client::Message::new("orders.created", "OrderCreated", b"{}".to_vec());
    let dup = good.clone().message_id(uuid::Uuid::now_v7());
    let outcomes = db.enqueue_all(&[dup.clone(), dup.clone()]).await?;
    assert_eq!(outcomes.iter().map(|e| e.duplicate).collect::<Vec<_>>(), [false, true]);
    assert_eq!(outcomes[0].seq, outcomes[1].seq, "a duplicate reports the existing message");
    let err = db.enqueue_all(&[good.clone(), bad]).await.unwrap_err();
    assert!(format!("{err:#}").contains("invalid topic \"orders..created\""), "{err:#}");
    let err = db.enqueue(&outbox_client::Message::new("t", "", b"".to_vec())).await.unwrap_err();
    assert!(format!("{err:#}").contains("type must not be empty"), "{err:#}");
    assert_eq!(db.message_count().await?, 1, "the failed batch left nothing behind");
    drop(srv);
    Ok(())
}

async fn replay_counts_with_a_dry_run_and_refuses_messages_beyond_the_dedup_horizon(backend: Backend) -> Result<()> {
    // A retention of 1 ms: every message is beyond the dedup horizon at once.
    let (_store, srv, db) = setup(backend, &["--retention", "1ms"]).await?;
    let mut admin = srv.admin().await?;
    let mut c = consumer("c", &["t"]);
    c.max_deliveries = 1;
    create_consumer(&mut admin, c).await?;
    db.sql_enqueue("t", "T", b"").await?;
    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let d = s.take(1, WAIT).await?.remove(0);
    s.nack(&d.message_id, "boom").await;
    eventually("dead", WAIT, || async { Ok((stats(&srv, "c").await?.dead == 1).then_some(())) }).await?;

    let all_dead = || pb::ReplayRequest { consumer: "c".into(), dead_letters: true, ..Default::default() };
    let err = admin.replay(all_dead()).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("allow_beyond_retention"), "{}", err.message());
    assert_eq!(stats(&srv, "c").await?.dead, 1, "a refused replay changes nothing");

    let dry = admin
        .replay(pb::ReplayRequest { dry_run: true, allow_beyond_retention: true, ..all_dead() })
        .await?
        .into_inner();
    assert_eq!((dry.replayed, dry.dry_run, dry.beyond_retention), (1, true, 1));
    assert_eq!(stats(&srv, "c").await?.dead, 1, "a dry run changes nothing");

    let done = admin.replay(pb::ReplayRequest { allow_beyond_retention: true, ..all_dead() }).await?.into_inner();
    assert_eq!((done.replayed, done.dry_run), (1, false));
    let again = s.take(1, WAIT).await?.remove(0);
    assert_eq!((again.message_id, again.delivery_count), (d.message_id, 1));
    Ok(())
}

/// Enqueues `(topic, type)` messages, lets `consumer` receive them all and acks all but the ids
/// for which `nack` returns true (nacked with `max_deliveries` 1: dead); returns the ids.
async fn deliver_all(
    srv: &Outboxd,
    db: &Db,
    consumer: &str,
    msgs: &[(&str, &str)],
    nack: impl Fn(&str) -> bool,
) -> Result<Vec<String>> {
    let mut ids = Vec::new();
    for (topic, type_) in msgs {
        ids.push(db.sql_enqueue(topic, type_, b"").await?.to_string());
    }
    let mut s = RawStream::open(&srv.endpoint, consumer, 100).await?;
    for d in s.take(msgs.len(), WAIT).await? {
        if nack(&d.r#type) { s.nack(&d.message_id, "boom").await } else { s.ack(&[&d.message_id]).await }
    }
    let settled = msgs.len() as i64;
    eventually("all settled", WAIT, || async {
        let st = stats(srv, consumer).await?;
        Ok((st.acked + st.dead == settled).then_some(()))
    })
    .await?;
    Ok(ids)
}

async fn replay_filters_by_type_topic_time_range_and_dead_only(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    let mut admin = srv.admin().await?;
    let mut c = consumer("c", &["orders.>"]);
    c.max_deliveries = 1;
    create_consumer(&mut admin, c).await?;
    let ids = deliver_all(
        &srv,
        &db,
        "c",
        &[("orders.created", "A"), ("orders.created", "B"), ("orders.paid", "A"), ("orders.paid", "Poison")],
        |t| t == "Poison",
    )
    .await?;
    let first = admin.get_message(pb::GetMessageRequest { message_id: ids[0].clone() }).await?.into_inner();
    let start = first.message.unwrap().enqueued_at.unwrap();
    let all =
        || pb::ReplayRequest { consumer: "c".into(), enqueued_after: Some(start), dry_run: true, ..Default::default() };
    let count = |r: pb::ReplayRequest| {
        let mut admin = admin.clone();
        async move { Ok::<_, anyhow::Error>(admin.replay(r).await?.into_inner().replayed) }
    };
    assert_eq!(count(all()).await?, 4);
    assert_eq!(count(pb::ReplayRequest { types: vec!["A".into()], ..all() }).await?, 2);
    assert_eq!(count(pb::ReplayRequest { topics: vec!["orders.paid".into()], ..all() }).await?, 2);
    assert_eq!(
        count(pb::ReplayRequest { topics: vec!["*.created".into()], types: vec!["A".into()], ..all() }).await?,
        1
    );
    assert_eq!(count(pb::ReplayRequest { types: vec!["A".into(), "B".into()], ..all() }).await?, 3);
    assert_eq!(count(pb::ReplayRequest { dead_letters: true, ..all() }).await?, 1, "dead only, within the range");
    let later = prost_types::Timestamp { seconds: start.seconds + 3600, nanos: 0 };
    assert_eq!(count(pb::ReplayRequest { dead_letters: true, enqueued_after: Some(later), ..all() }).await?, 0);

    // Only the selected messages are made due: the two of type A.
    let done = admin.replay(pb::ReplayRequest { dry_run: false, types: vec!["A".into()], ..all() }).await?.into_inner();
    assert_eq!((done.replayed, done.selected), (2, 2));
    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let mut got: Vec<String> = s.take(2, WAIT).await?.into_iter().map(|d| d.message_id).collect();
    got.sort();
    let mut want = vec![ids[0].clone(), ids[2].clone()];
    want.sort();
    assert_eq!(got, want);
    assert!(s.next(QUIET).await?.is_none(), "nothing else was replayed");

    // Bad filters are named.
    let err = admin.replay(pb::ReplayRequest { topics: vec!["orders..x".into()], ..all() }).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("topics[0]"), "{}", err.message());
    let err = admin.replay(pb::ReplayRequest { types: vec![" ".into()], ..all() }).await.unwrap_err();
    assert!(err.message().contains("types[0]"), "{}", err.message());
    Ok(())
}

async fn replay_stream_reports_progress_batch_by_batch_at_the_requested_rate(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    let mut admin = srv.admin().await?;
    create_consumer(&mut admin, consumer("c", &["t"])).await?;
    let msgs = vec![("t", "T"); 25];
    deliver_all(&srv, &db, "c", &msgs, |_| false).await?;

    // 10 per second: batches of 10, so progress comes as 0, 10, 20, 25 (done).
    let req = pb::ReplayRequest {
        consumer: "c".into(),
        enqueued_after: Some(prost_types::Timestamp { seconds: 0, nanos: 0 }),
        max_per_second: 10,
        ..Default::default()
    };
    let mut stream = admin.replay_stream(req).await?.into_inner();
    let mut seen = Vec::new();
    while let Some(p) = stream.message().await? {
        assert_eq!(p.selected, 25);
        seen.push((p.replayed, p.done));
    }
    assert_eq!(seen, [(0, false), (10, false), (20, false), (25, true)]);
    let mut s = RawStream::open(&srv.endpoint, "c", 100).await?;
    assert_eq!(s.take(25, WAIT).await?.len(), 25);
    Ok(())
}

//! Between tenants: replays inside a consumer's topics, payloads shown only to who may tail
//! them, one message per id, and revocations that end open streams.
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use outbox_client::grpc::{admin_with, outbox_with};
use outbox_proto::v1 as pb;
use outbox_tests::{Backend, consumer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use super::{ending_status, serve, serve_as};
use crate::security::{auth_file, tok};

crate::conformance!(a_message_id_names_one_message_on_every_enqueue_path);

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

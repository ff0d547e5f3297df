//! One test per row of DESIGN.md's failure matrix.
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use outbox_client::{Inbox, Message, Subscriber, SubscriberConfig};
use outbox_proto::v1 as pb;
use outbox_tests::{
    Backend, Db, DbProxy, FAST, Outboxd, RawStream, TestDb, TestStore, consumer, create_consumer, dur, eventually,
};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::{WAIT, conformance, setup, setup_pg, stats};

conformance!(
    producer_commit_fails_leaves_no_message,
    crash_after_commit_before_relay_is_delivered_by_a_restarted_relay,
    outboxd_killed_mid_stream_redelivers_with_a_higher_count,
    ack_lost_on_the_wire_is_redelivered_and_the_inbox_prevents_a_second_effect,
    ack_lost_after_a_transactional_ack_is_not_redelivered,
    same_message_twice_even_in_parallel_has_one_delivery_and_one_effect,
    poison_message_is_dead_after_max_deliveries_visible_and_replayable,
    slow_consumer_shows_as_backlog_and_oldest_unacked_age,
    the_subscriber_reconnects_when_outboxd_restarts,
    the_subscriber_extends_the_lease_of_a_slow_handler,
);

async fn producer_commit_fails_leaves_no_message(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    create_consumer(&mut srv.admin().await?, consumer("c", &["orders.*"])).await?;
    db.enqueue_rolled_back(&Message::new("orders.created", "RolledBack", b"x".to_vec())).await?;
    assert!(
        db.enqueue_with_failing_commit(&Message::new("orders.created", "CommitFailed", b"x".to_vec())).await?,
        "the commit must fail"
    );
    db.enqueue(&Message::new("orders.created", "Committed", b"x".to_vec())).await?;

    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let got = s.take(1, WAIT).await?;
    assert_eq!(got[0].r#type, "Committed", "only the committed message is delivered");
    assert_eq!(db.message_count().await?, 1, "only the committed message exists");
    Ok(())
}

async fn crash_after_commit_before_relay_is_delivered_by_a_restarted_relay(backend: Backend) -> Result<()> {
    let (store, srv, db) = setup(backend, &[]).await?;
    create_consumer(&mut srv.admin().await?, consumer("c", &["orders.*"])).await?;
    srv.kill().await?;

    let mut ids = HashSet::new();
    for i in 0..10 {
        let e = db.enqueue(&Message::new("orders.created", "OrderCreated", vec![i])).await?;
        ids.insert(e.message_id.to_string());
    }

    let srv = Outboxd::start(store.url(), FAST).await?;
    let mut s = RawStream::open(&srv.endpoint, "c", 100).await?;
    let got = s.take(10, WAIT).await?;
    let got_ids: HashSet<String> = got.iter().map(|d| d.message_id.clone()).collect();
    assert_eq!(got_ids, ids);
    s.ack(&got.iter().map(|d| d.message_id.as_str()).collect::<Vec<_>>()).await;
    eventually("all acked", WAIT, || async { Ok((stats(&srv, "c").await?.acked == 10).then_some(())) }).await?;
    Ok(())
}

async fn outboxd_killed_mid_stream_redelivers_with_a_higher_count(backend: Backend) -> Result<()> {
    let (store, srv, db) = setup(backend, &[]).await?;
    let mut c = consumer("c", &["orders.*"]);
    c.ack_deadline = Some(dur(Duration::from_millis(500)));
    create_consumer(&mut srv.admin().await?, c).await?;
    for i in 0..3u8 {
        db.sql_enqueue("orders.created", "OrderCreated", &[i]).await?;
    }
    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let first = s.take(3, WAIT).await?;
    assert!(first.iter().all(|d| d.delivery_count == 1));
    srv.kill().await?;

    let srv = Outboxd::start(store.url(), FAST).await?;
    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let again = s.take(3, WAIT).await?;
    let ids = |v: &[pb::Delivery]| v.iter().map(|d| d.message_id.clone()).collect::<HashSet<_>>();
    assert_eq!(ids(&first), ids(&again));
    assert!(
        again.iter().all(|d| d.delivery_count == 2),
        "counts: {:?}",
        again.iter().map(|d| d.delivery_count).collect::<Vec<_>>()
    );
    Ok(())
}

async fn ack_lost_on_the_wire_is_redelivered_and_the_inbox_prevents_a_second_effect(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    create_consumer(&mut srv.admin().await?, consumer("billing", &["orders.*"])).await?;
    // The consumer keeps its own database, with the client's inbox table in it.
    let own = TestDb::create().await?;
    let own_pool = PgPool::connect(&own.url).await?;
    Inbox::install(&own_pool).await?;
    sqlx::query("CREATE TABLE effects (message_id uuid, n int)").execute(&own_pool).await?;

    let id = db.sql_enqueue("orders.created", "OrderCreated", b"{}").await?;
    let handle = |d: pb::Delivery| {
        let own_pool = own_pool.clone();
        async move {
            let id: uuid::Uuid = d.message_id.parse()?;
            let mut tx = own_pool.begin().await?;
            if Inbox::claim(&mut *tx, "billing", id).await? {
                sqlx::query("INSERT INTO effects VALUES ($1, 1)").bind(id).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            anyhow::Ok(())
        }
    };

    let mut s = RawStream::open(&srv.endpoint, "billing", 10).await?;
    let d = s.take(1, WAIT).await?.remove(0);
    assert_eq!(d.delivery_count, 1);
    handle(d).await?;
    drop(s); // the ack never reaches the server

    let mut s = RawStream::open(&srv.endpoint, "billing", 10).await?;
    let d = s.take(1, WAIT).await?.remove(0);
    assert_eq!(d.message_id, id.to_string());
    // A drop half-closes the stream and resets it: whichever the server sees first decides
    // whether the attempt counts (a clean close gives it back, ADR 0074; a broken stream keeps
    // it), and either is within max_deliveries.
    assert!(matches!(d.delivery_count, 1 | 2), "redelivered: {d:?}");
    handle(d.clone()).await?;
    s.ack(&[&d.message_id]).await;

    let effects: i64 = sqlx::query_scalar("SELECT count(*) FROM effects").fetch_one(&own_pool).await?;
    assert_eq!(effects, 1, "one effect despite two deliveries");
    eventually("acked", WAIT, || async { Ok((stats(&srv, "billing").await?.acked == 1).then_some(())) }).await?;
    Ok(())
}

async fn ack_lost_after_a_transactional_ack_is_not_redelivered(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    create_consumer(&mut srv.admin().await?, consumer("ledger", &["orders.*"])).await?;
    db.create_effects_table().await?;
    db.sql_enqueue("orders.created", "First", b"{}").await?;

    let mut s = RawStream::open(&srv.endpoint, "ledger", 10).await?;
    let d = s.take(1, WAIT).await?.remove(0);
    assert!(db.effect_with_transactional_ack("ledger", d.message_id.parse()?).await?);
    drop(s); // effect and ack committed together; the stream's ack is lost

    let marker = db.sql_enqueue("orders.created", "Marker", b"{}").await?;
    let mut s = RawStream::open(&srv.endpoint, "ledger", 10).await?;
    let d = s.take(1, WAIT).await?.remove(0);
    assert_eq!(d.message_id, marker.to_string(), "the acked message is not delivered again");
    assert_eq!(db.effect_count().await?, 1);
    Ok(())
}

async fn same_message_twice_even_in_parallel_has_one_delivery_and_one_effect(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    create_consumer(&mut srv.admin().await?, consumer("c", &["orders.*"])).await?;
    db.create_effects_table().await?;

    // Two producers enqueue one id at the same time, in transactions of their own.
    let id = uuid::Uuid::now_v7();
    let msg = Message::new("orders.created", "OrderCreated", b"{}".to_vec()).message_id(id);
    let (a, b) = tokio::join!(db.enqueue(&msg), db.enqueue(&msg));
    let (a, b) = (a?, b?);
    assert!(a.duplicate ^ b.duplicate, "exactly one of them is a duplicate");
    assert_eq!((a.message_id, b.message_id), (id, id));
    // And over gRPC.
    let mut client = srv.client().await?;
    let r = outbox_client::grpc::enqueue_rpc(&mut client, &msg).await?;
    assert!(r.duplicate);
    assert_eq!(r.message_id, id);

    // The same delivery is in two consumers' hands at once: the first one's stream ended while
    // its handler was still working, and the message was redelivered to a second stream. Both
    // run the effect with a transactional ack: exactly one commits.
    let mut s1 = RawStream::open(&srv.endpoint, "c", 10).await?;
    let d1 = s1.take(1, WAIT).await?.remove(0);
    drop(s1);
    let mut s2 = RawStream::open(&srv.endpoint, "c", 10).await?;
    let d2 = s2.take(1, WAIT).await?.remove(0);
    assert_eq!(d1.message_id, d2.message_id);
    // As above, the drop counts the first attempt or gives it back (ADR 0074).
    assert!(matches!(d2.delivery_count, 1 | 2), "{d2:?}");
    let (r1, r2) = tokio::join!(db.effect_with_transactional_ack("c", id), db.effect_with_transactional_ack("c", id));
    assert!(r1? ^ r2?, "exactly one transactional ack wins");
    assert_eq!(db.effect_count().await?, 1);
    assert_eq!(db.message_count().await?, 1);
    Ok(())
}

async fn poison_message_is_dead_after_max_deliveries_visible_and_replayable(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    let mut admin = srv.admin().await?;
    let mut c = consumer("c", &["orders.*"]);
    c.max_deliveries = 3;
    create_consumer(&mut admin, c).await?;
    let id = db.sql_enqueue("orders.created", "Poison", b"{}").await?;

    let failing = Arc::new(AtomicBool::new(true));
    let seen = Arc::new(AtomicU32::new(0));
    let last_count = Arc::new(AtomicU32::new(0));
    let stop = CancellationToken::new();
    let (f, n, lc) = (failing.clone(), seen.clone(), last_count.clone());
    let sub = tokio::spawn(Subscriber::new(SubscriberConfig::new(srv.endpoint.clone(), "c")).run(
        move |d| {
            let (f, n, lc) = (f.clone(), n.clone(), lc.clone());
            async move {
                n.fetch_add(1, Ordering::SeqCst);
                lc.store(d.delivery_count, Ordering::SeqCst);
                if f.load(Ordering::SeqCst) { Err("boom: cannot parse".into()) } else { Ok(()) }
            }
        },
        stop.clone(),
    ));

    eventually("dead letter", WAIT, || async { Ok((stats(&srv, "c").await?.dead == 1).then_some(())) }).await?;
    assert_eq!(seen.load(Ordering::SeqCst), 3, "delivered exactly max_deliveries times");
    let dl = admin
        .list_dead_letters(pb::ListDeadLettersRequest {
            consumer: "c".into(),
            page_size: 10,
            page_token: String::new(),
        })
        .await?
        .into_inner();
    assert_eq!(dl.dead_letters.len(), 1);
    let d = &dl.dead_letters[0];
    assert_eq!(d.message.as_ref().unwrap().message_id, id.to_string());
    assert_eq!(d.delivery_count, 3);
    assert_eq!(d.last_error, "boom: cannot parse");
    assert!(d.dead_at.is_some());

    failing.store(false, Ordering::SeqCst);
    let r = admin
        .replay(pb::ReplayRequest { consumer: "c".into(), dead_letters: true, ..Default::default() })
        .await?
        .into_inner();
    assert_eq!(r.replayed, 1);
    eventually("replayed and acked", WAIT, || async { Ok((stats(&srv, "c").await?.acked == 1).then_some(())) }).await?;
    assert_eq!(last_count.load(Ordering::SeqCst), 1, "replay restarts the delivery count");
    assert_eq!(stats(&srv, "c").await?.dead, 0);
    stop.cancel();
    sub.await??;
    Ok(())
}

/// PostgreSQL only: one server per SQLite file.
#[tokio::test]
async fn two_relays_at_once_make_one_delivery_per_consumer() -> Result<()> {
    let (db, a, pool) = setup_pg(&[]).await?;
    let b = Outboxd::start(&db.url, FAST).await?;
    let mut admin = a.admin().await?;
    for name in ["c1", "c2"] {
        create_consumer(&mut admin, consumer(name, &["orders.*"])).await?;
    }
    const N: usize = 400;
    for chunk in 0..(N / 100) {
        let mut tx = pool.begin().await?;
        for i in 0..100 {
            let payload = format!("{}", chunk * 100 + i);
            outbox_client::enqueue(&mut *tx, &Message::new("orders.created", "OrderCreated", payload.into_bytes()))
                .await?;
        }
        tx.commit().await?;
    }
    // Both replicas relay and serve: a stream per consumer on each, reading until that
    // consumer has seen every message (bounded), acking each.
    let seen: std::collections::HashMap<&str, Arc<std::sync::Mutex<Vec<String>>>> =
        ["c1", "c2"].into_iter().map(|n| (n, Arc::default())).collect();
    let mut handles = Vec::new();
    for name in ["c1", "c2"] {
        for srv in [&a, &b] {
            let endpoint = srv.endpoint.clone();
            let seen = seen[name].clone();
            handles.push(tokio::spawn(async move {
                let mut s = RawStream::open(&endpoint, name, 50).await?;
                let deadline = Instant::now() + WAIT;
                loop {
                    let got = {
                        let all = seen.lock().unwrap();
                        all.iter().collect::<HashSet<_>>().len()
                    };
                    if got >= N {
                        break;
                    }
                    anyhow::ensure!(Instant::now() < deadline, "{name}: {got} of {N} delivered within {WAIT:?}");
                    if let Some(d) = s.next(Duration::from_millis(50)).await? {
                        s.ack(&[&d.message_id]).await;
                        seen.lock().unwrap().push(d.message_id);
                    }
                }
                s.close();
                s.end_status(WAIT).await?;
                anyhow::Ok(())
            }));
        }
    }
    for h in handles {
        h.await??;
    }
    for name in ["c1", "c2"] {
        let got = seen[name].lock().unwrap().clone();
        let unique: HashSet<&String> = got.iter().collect();
        assert_eq!(unique.len(), N, "{name}: every message delivered");
        assert_eq!(got.len(), N, "{name}: none delivered twice so far");
    }
    // And none ever will be: every delivery is acked after exactly one lease. A second
    // delivery, now or later, would have needed a second lease (a count of 2) or a second row.
    eventually("every ack applied", WAIT, || async {
        let open: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outbox.inbox WHERE state <> 'acked'").fetch_one(&pool).await?;
        Ok((open == 0).then_some(()))
    })
    .await?;
    let recounted: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox.inbox WHERE delivery_count <> 1").fetch_one(&pool).await?;
    assert_eq!(recounted, 0, "no delivery was leased twice");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.inbox").fetch_one(&pool).await?;
    assert_eq!(rows, 2 * N as i64, "one inbox row per (message, consumer)");
    Ok(())
}

/// PostgreSQL only: an embedded file cannot go down while its server runs.
#[tokio::test]
async fn database_down_loses_nothing_and_the_backlog_drains_when_it_returns() -> Result<()> {
    let db = TestDb::create().await?;
    let proxy = DbProxy::start(outbox_tests::db_addr().await?).await?;
    let srv = Outboxd::start(&proxy.url_for(&db.url), FAST).await?;
    let pool = PgPool::connect(&db.url).await?; // producers reach the database directly
    let mut admin = srv.admin().await?;
    create_consumer(&mut admin, consumer("c", &["orders.*"])).await?;

    let mut s = RawStream::open(&srv.endpoint, "c", 100).await?;
    for i in 0..5u8 {
        outbox_tests::sql_enqueue(&pool, "orders.created", "Before", &[i]).await?;
    }
    for d in s.take(5, WAIT).await? {
        s.ack(&[&d.message_id]).await;
    }
    eventually("first acks", WAIT, || async { Ok((stats(&srv, "c").await?.acked == 5).then_some(())) }).await?;

    proxy.set_up(false);
    for i in 0..20u8 {
        outbox_tests::sql_enqueue(&pool, "orders.created", "During", &[i]).await?;
    }
    eventually("outboxd to notice the outage", WAIT, || {
        let mut admin = admin.clone();
        async move {
            let r = admin.get_stats(pb::GetStatsRequest::default()).await;
            Ok(r.is_err().then_some(()))
        }
    })
    .await?;

    proxy.set_up(true);
    let mut got = HashSet::new();
    while got.len() < 20 {
        let Some(d) = s.next(WAIT).await? else { anyhow::bail!("only {} of 20 delivered after recovery", got.len()) };
        s.ack(&[&d.message_id]).await;
        if d.r#type == "During" {
            got.insert(d.message_id);
        }
    }
    eventually("all acked", WAIT, || async {
        let st = stats(&srv, "c").await?;
        Ok((st.acked == 25 && st.backlog == 0).then_some(()))
    })
    .await?;
    Ok(())
}

async fn slow_consumer_shows_as_backlog_and_oldest_unacked_age(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    create_consumer(&mut srv.admin().await?, consumer("slow", &["orders.*"])).await?;
    for i in 0..20u8 {
        db.sql_enqueue("orders.created", "OrderCreated", &[i]).await?;
    }
    let mut s = RawStream::open(&srv.endpoint, "slow", 5).await?;
    s.take(5, WAIT).await?;
    let st = eventually("stats to show the slow consumer", WAIT, || async {
        let st = stats(&srv, "slow").await?;
        Ok((st.in_flight == 5 && st.backlog == 15).then_some(st))
    })
    .await?;
    let age = st.oldest_unacked_age.unwrap();
    assert!(age.seconds > 0 || age.nanos > 0, "oldest unacked age is reported");
    assert_eq!(st.streams, 1);
    Ok(())
}

/// PostgreSQL only: replicas.
#[tokio::test]
async fn a_replica_wakes_streams_on_another_replica_without_waiting_for_the_poll() -> Result<()> {
    // `a` relays; `b` runs no relay and polls only once a minute: a delivery on `b` within
    // seconds can only come from `a`'s NOTIFY.
    let (db, a, _pool) = setup_pg(&[]).await?;
    let b = Outboxd::start(&db.url, &["--no-relay", "--stream-poll", "60s"]).await?;
    create_consumer(&mut a.admin().await?, consumer("c", &["t"])).await?;
    let mut s = RawStream::open(&b.endpoint, "c", 10).await?;
    let mut client = a.client().await?;
    let sent = std::time::Instant::now();
    outbox_client::grpc::enqueue_rpc(&mut client, &Message::new("t", "T", b"".to_vec())).await?;
    let d = s.next(Duration::from_secs(10)).await?;
    assert!(d.is_some(), "delivered through the other replica's notification");
    assert!(sent.elapsed() < Duration::from_secs(10));
    Ok(())
}

async fn the_subscriber_reconnects_when_outboxd_restarts(backend: Backend) -> Result<()> {
    let store = TestStore::create(backend).await?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let listen = format!("127.0.0.1:{port}");
    let args: Vec<&str> = FAST.iter().copied().chain(["--listen", listen.as_str()]).collect();
    let srv = Outboxd::start(store.url(), &args).await?;
    let db = Db::connect(store.url()).await?;
    create_consumer(&mut srv.admin().await?, consumer("c", &["t"])).await?;

    let handled = Arc::new(AtomicU32::new(0));
    let stop = CancellationToken::new();
    let h = handled.clone();
    let mut config = SubscriberConfig::new(format!("http://{listen}"), "c");
    config.reconnect_max = Duration::from_millis(200);
    let sub = tokio::spawn(Subscriber::new(config).run(
        move |_d| {
            let h = h.clone();
            async move {
                h.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        },
        stop.clone(),
    ));
    db.sql_enqueue("t", "Before", b"").await?;
    eventually("first handled", WAIT, || async { Ok((handled.load(Ordering::SeqCst) == 1).then_some(())) }).await?;
    assert!(srv.terminate(WAIT).await?);

    db.sql_enqueue("t", "During", b"").await?;
    let srv = Outboxd::start(store.url(), &args).await?;
    eventually("handled after the restart", WAIT, || async { Ok((handled.load(Ordering::SeqCst) == 2).then_some(())) })
        .await?;
    eventually("acked", WAIT, || async { Ok((stats(&srv, "c").await?.acked == 2).then_some(())) }).await?;
    stop.cancel();
    sub.await??;
    Ok(())
}

/// PostgreSQL only: replicas. Three outboxd share one database while producers commit and two
/// consumers read through streams spread over all three; one consumer applies its effect with
/// a transactional ack. Every message is acked once per consumer, nothing is lost, and no
/// effect happens twice.
#[tokio::test]
async fn three_replicas_split_relay_and_streams_with_no_loss_and_no_second_effect() -> Result<()> {
    let (pg, a, _pool) = setup_pg(&[]).await?;
    let b = Outboxd::start(&pg.url, FAST).await?;
    let c = Outboxd::start(&pg.url, FAST).await?;
    let mut admin = a.admin().await?;
    create_consumer(&mut admin, consumer("effects", &["orders.*"])).await?;
    create_consumer(&mut admin, consumer("audit", &["orders.>"])).await?;
    let db = Db::connect(&pg.url).await?;
    db.create_effects_table().await?;

    const PRODUCERS: usize = 6;
    const PER_PRODUCER: usize = 60;
    const N: usize = PRODUCERS * PER_PRODUCER;
    let stop = CancellationToken::new();
    let mut readers = Vec::new();
    for name in ["effects", "audit"] {
        for srv in [&a, &b, &c] {
            let (endpoint, db, stop) = (srv.endpoint.clone(), db.clone(), stop.clone());
            readers.push(tokio::spawn(async move {
                let mut s = RawStream::open(&endpoint, name, 20).await?;
                let mut got = Vec::new();
                loop {
                    let Some(d) = s.next(Duration::from_millis(100)).await? else {
                        if stop.is_cancelled() {
                            break;
                        }
                        continue;
                    };
                    if name == "effects" {
                        // Applied, or already applied by another delivery: ack either way.
                        db.effect_with_transactional_ack(name, d.message_id.parse()?).await?;
                    }
                    s.ack(&[&d.message_id]).await;
                    got.push(d.message_id);
                }
                anyhow::Ok((name, got))
            }));
        }
    }
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let db = db.clone();
        producers.push(tokio::spawn(async move {
            for i in 0..PER_PRODUCER {
                db.enqueue(&Message::new("orders.created", "OrderCreated", format!("{p}-{i}").into_bytes())).await?;
            }
            anyhow::Ok(())
        }));
    }
    for p in producers {
        p.await??;
    }
    for name in ["effects", "audit"] {
        eventually("every message acked", Duration::from_secs(60), || async {
            Ok((stats(&a, name).await?.acked == N as i64).then_some(()))
        })
        .await?;
    }
    stop.cancel();
    let mut per_consumer: std::collections::HashMap<&str, Vec<String>> = Default::default();
    for r in readers {
        let (name, got) = r.await??;
        per_consumer.entry(name).or_default().extend(got);
    }
    for name in ["effects", "audit"] {
        let unique: HashSet<&String> = per_consumer[name].iter().collect();
        assert_eq!(unique.len(), N, "{name}: every message delivered");
    }
    assert_eq!(db.effect_count().await?, N as i64, "one effect per message");
    for name in ["effects", "audit"] {
        let st = stats(&a, name).await?;
        assert_eq!((st.acked, st.backlog, st.in_flight), (N as i64, 0, 0), "{name}");
    }
    assert_eq!(db.delivery_count().await?, 2 * N as i64, "one inbox row per (message, consumer)");
    Ok(())
}

async fn the_subscriber_extends_the_lease_of_a_slow_handler(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    let mut c = consumer("c", &["t"]);
    c.ack_deadline = Some(dur(Duration::from_millis(300)));
    create_consumer(&mut srv.admin().await?, c).await?;
    db.sql_enqueue("t", "Slow", b"").await?;
    let calls = Arc::new(AtomicU32::new(0));
    let stop = CancellationToken::new();
    let n = calls.clone();
    let sub = tokio::spawn(Subscriber::new(SubscriberConfig::new(srv.endpoint.clone(), "c")).run(
        move |_d| {
            let n = n.clone();
            async move {
                n.fetch_add(1, Ordering::SeqCst);
                // The behaviour under test: work that outlasts the 300 ms ack deadline.
                tokio::time::sleep(Duration::from_millis(1200)).await;
                Ok(())
            }
        },
        stop.clone(),
    ));
    eventually("acked", WAIT, || async { Ok((stats(&srv, "c").await?.acked == 1).then_some(())) }).await?;
    assert_eq!(calls.load(Ordering::SeqCst), 1, "never redelivered while the handler ran");
    let st = stats(&srv, "c").await?;
    assert_eq!((st.backlog, st.in_flight, st.retrying), (0, 0, 0));
    stop.cancel();
    sub.await??;
    Ok(())
}

/// PostgreSQL only (SQLite has one writer, so commits cannot overtake each other). A producer
/// whose transaction commits after a later message was relayed (its `seq` is lower) is still
/// delivered, also when nothing else happens afterwards.
#[tokio::test]
async fn a_message_committed_after_a_later_one_was_relayed_is_still_delivered() -> Result<()> {
    let (_db, srv, pool) = setup_pg(&[]).await?;
    let mut admin = srv.admin().await?;
    create_consumer(&mut admin, consumer("c", &["t"])).await?;
    let mut slow = pool.begin().await?;
    let early = outbox_client::enqueue(&mut *slow, &Message::new("t", "Early", b"".to_vec())).await?;
    let late = outbox_client::enqueue(&pool, &Message::new("t", "Late", b"".to_vec())).await?;
    assert!(early.seq < late.seq);
    let mut s = RawStream::open(&srv.endpoint, "c", 10).await?;
    let d = s.take(1, WAIT).await?.remove(0);
    assert_eq!(d.message_id, late.message_id.to_string());
    s.ack(&[&d.message_id]).await;
    slow.commit().await?;
    let d = s.take(1, WAIT).await?.remove(0);
    assert_eq!(d.message_id, early.message_id.to_string(), "the straggler is relayed too");
    Ok(())
}

//! The relay on every store, driven with `run_once()` and a manual clock on a fresh PostgreSQL
//! database and a fresh SQLite file (the store's harness, `store::tests`); and, on PostgreSQL,
//! the producers' commits that wake a relay that backed off.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use chrono::{SubsecRound, Utc};

use super::{Relay, RelayConfig};
use crate::clock::{ManualClock, SharedClock};
use crate::hub::Hub;
use crate::store::tests::{msg, on_every_store, spec};
use crate::store::{LeaseParams, NewMessage, PgStore, SharedStore, Store as _, WorkHint};
use crate::testing::TestDb;

on_every_store!(
    a_second_relay_pass_and_concurrent_relays_add_no_delivery,
    deliveries_pushed_to_a_stream_that_ended_before_the_hand_over_are_released_at_once,
);

async fn a_second_relay_pass_and_concurrent_relays_add_no_delivery(store: SharedStore) {
    let clock: SharedClock = Arc::new(ManualClock::new(Utc::now().trunc_subsecs(6)));
    store.consumer_create(&spec("a", &["t.*"], 5), clock.now()).await.unwrap();
    store.consumer_create(&spec("b", &["t.>"], 5), clock.now()).await.unwrap();
    let batch: Vec<NewMessage> = (0..1200).map(|_| msg("t.x")).collect();
    store.message_insert_many(&batch, clock.now()).await.unwrap();

    let relay = |size| {
        Relay::new(store.clone(), clock.clone(), Hub::default(), RelayConfig { pass_size: size, ..Default::default() })
    };
    let (r1, r2) = (relay(100), relay(100));
    let mut relayed = 0;
    loop {
        let (a, b) = tokio::join!(r1.run_once(), r2.run_once());
        let (a, b) = (a.unwrap(), b.unwrap());
        if a.messages + b.messages == 0 {
            break;
        }
        relayed += a.messages + b.messages;
    }
    assert_eq!(relayed, 1200, "each message claimed by exactly one pass");
    let stats = store.stats(None, true).await.unwrap();
    assert_eq!(stats.unrelayed, 0);
    assert!(stats.consumers.iter().all(|c| c.backlog == 1200), "{stats:?}");
    assert_eq!(relay(500).run_once().await.unwrap().messages, 0);
}

/// T18: a relay pass that pushed to a stream which ended before the hand-over (its channel
/// closed) releases what it pushed there at once, due now, with the count its push took given
/// back (no consumer saw it), and ends its hold on the stream's lend; the next lease says 1.
async fn deliveries_pushed_to_a_stream_that_ended_before_the_hand_over_are_released_at_once(store: SharedStore) {
    use crate::domain::{ConsumerName, DeliveryState};
    use crate::hub::{Lend, PushSlot};
    let clock: SharedClock = Arc::new(ManualClock::new(Utc::now().trunc_subsecs(6)));
    store.consumer_create(&spec("c", &["t"], 5), clock.now()).await.unwrap();
    let sent = store.message_insert_many(&[msg("t"), msg("t")], clock.now()).await.unwrap();
    let hub = Hub::default();
    let lend = Arc::new(Lend::default());
    assert!(lend.adjust(|_| 10));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    drop(rx); // the stream ended
    let _slot = hub
        .offer("c", PushSlot { session: "gone".into(), ack_deadline: Duration::from_secs(30), lend: lend.clone(), tx });
    let relay = Relay::new(store.clone(), clock.clone(), hub, RelayConfig::default());
    let out = relay.run_once().await.unwrap();
    assert_eq!(out.messages, 2);
    assert!(lend.adjust(|room| room), "the pass no longer holds the lend");
    for e in &sent {
        let (_, rows) = store.message_get(e.message_id).await.unwrap();
        let row = rows.iter().find(|r| r.consumer == "c").unwrap();
        assert_eq!((row.state, row.delivery_count, row.available_at), (DeliveryState::Pending, 0, clock.now()));
    }
    let c = ConsumerName::parse("consumer", "c").unwrap();
    let until = clock.now() + chrono::Duration::seconds(30);
    let again = store
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "next",
            limit: 10,
            keys_after: "",
            lease_until: until,
            now: clock.now(),
        })
        .await
        .unwrap();
    assert_eq!(again.len(), 2);
    assert!(again.iter().all(|l| l.delivery_count == 1), "the same first attempt: {again:?}");
}

/// A sleeping relay is woken by a producer's commit instead of its next poll (ADR 0051, 0063):
/// a plain INSERT by a role that may only insert sends one `NOTIFY outbox_enqueued_KEY` while a
/// relay's request holds, and none while none does, after a pass that found work withdrew it, or
/// after it lapsed (a notification on every commit would serialise producers' commits). The
/// relay asks again each time it is about to sleep, so every quiet moment ends with the first
/// commit. It polls every 60 s here, so only the notifications can relay the messages within
/// the bound.
#[tokio::test]
async fn a_sleeping_relay_is_woken_by_a_producers_insert_and_only_then_notified() {
    use sqlx::postgres::PgListener;
    let db = TestDb::create().await.unwrap();
    let pg = PgStore::connect(&db.url, 4).await.unwrap();
    pg.migrate().await.unwrap();
    let store: SharedStore = Arc::new(pg.clone());
    store.consumer_create(&spec("c", &["t"], 5), Utc::now()).await.unwrap();
    let writer = format!("outboxd_test_writer_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE ROLE {writer} NOLOGIN; GRANT USAGE ON SCHEMA outbox TO {writer};
         GRANT INSERT ON outbox.messages TO {writer}; GRANT USAGE ON SEQUENCE outbox.messages_seq TO {writer};"
    )))
    .execute(pg.pool())
    .await
    .unwrap();
    let insert = |type_: &'static str| {
        let (pool, writer) = (pg.pool().clone(), writer.clone());
        async move {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query(sqlx::AssertSqlSafe(format!("SET LOCAL ROLE {writer}"))).execute(&mut *tx).await.unwrap();
            sqlx::query("INSERT INTO outbox.messages (message_id, topic, type, payload) VALUES ($1, 't', $2, '')")
                .bind(uuid::Uuid::new_v4())
                .bind(type_)
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
    };
    let wanted = || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT coalesce(pg_sequence_last_value('outbox.relay_wakeup') > extract(epoch FROM now()), false)",
        )
        .fetch_one(pg.pool())
        .await
        .unwrap()
    };
    let channels = pg.channels().await.unwrap();
    let mut heard = PgListener::connect_with(pg.pool()).await.unwrap();
    heard.listen(&channels.enqueued).await.unwrap();
    // Notifications of different transactions arrive in commit order: a marker sent after an
    // insert is heard first exactly when the insert sent nothing.
    async fn next_heard(heard: &mut PgListener) -> String {
        tokio::time::timeout(Duration::from_secs(10), heard.recv()).await.unwrap().unwrap().payload().to_owned()
    }
    let marker = || async {
        sqlx::query("SELECT pg_notify($1, 'marker')").bind(&channels.enqueued).execute(pg.pool()).await.unwrap();
    };

    // No relay has asked: an insert notifies nobody.
    assert!(!wanted().await);
    insert("quiet").await;
    marker().await;
    assert_eq!(next_heard(&mut heard).await, "marker", "an insert while no relay asked sent a notification");
    store.relay_pass(100, Utc::now(), false, &[]).await.unwrap();

    // A request, then a pass that finds work withdraws it: while passes find work, inserts
    // notify nobody.
    assert!(!store.message_unrelayed_exists_asking_wakeup(Duration::from_secs(30)).await.unwrap());
    assert!(wanted().await);
    insert("asked").await;
    assert_eq!(next_heard(&mut heard).await, "", "the insert notified the relay that asked");
    assert_eq!(store.relay_pass(100, Utc::now(), false, &[]).await.unwrap().messages, 1);
    assert!(!wanted().await, "the relay pass that found work withdrew the request");
    insert("busy").await;
    marker().await;
    assert_eq!(next_heard(&mut heard).await, "marker", "an insert while the relay was busy sent a notification");
    store.relay_pass(100, Utc::now(), false, &[]).await.unwrap();

    // A relay that polls every 60 s, woken as outboxd wires it: watch → hint → the relay.
    let hub = Hub::default();
    let config =
        RelayConfig { poll_min: Duration::from_secs(60), poll_max: Duration::from_secs(60), ..RelayConfig::default() };
    let relay = Relay::new(store.clone(), Arc::new(crate::clock::SystemClock), hub.clone(), config);
    let cancel = tokio_util::sync::CancellationToken::new();
    let (hints, mut hinted) = tokio::sync::mpsc::unbounded_channel();
    let watch = tokio::spawn({
        let (store, cancel) = (store.clone(), cancel.clone());
        async move { store.watch(hints, cancel).await }
    });
    let wake = tokio::spawn({
        let hub = hub.clone();
        async move {
            while let Some(hint) = hinted.recv().await {
                if hint == WorkHint::Enqueued {
                    hub.enqueued().notify();
                }
            }
        }
    });
    let relaying = tokio::spawn(relay.run(cancel.clone()));
    // Nothing to do since it started: its probe asks to be woken, and it sleeps. Woken and done,
    // it asks again before it sleeps again: each insert below is relayed by its notification.
    for type_ in ["wakes", "wakes again"] {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !wanted().await {
            assert!(std::time::Instant::now() < deadline, "the relay did not ask to be woken before {type_:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        insert(type_).await;
        assert_eq!(next_heard(&mut heard).await, "", "the insert {type_:?} notified the relay that asked");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while store.message_unrelayed_exists().await.unwrap() {
            assert!(std::time::Instant::now() < deadline, "the relay slept through the notification of {type_:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    cancel.cancel();
    relaying.await.unwrap();

    // A request that lapsed (its relay died before renewing it) wakes nobody either.
    sqlx::query("SELECT setval('outbox.relay_wakeup', extract(epoch FROM now())::bigint - 1)")
        .execute(pg.pool())
        .await
        .unwrap();
    insert("lapsed").await;
    marker().await;
    assert_eq!(next_heard(&mut heard).await, "marker", "an insert under a lapsed request sent a notification");

    watch.await.unwrap();
    wake.abort();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP OWNED BY {writer}; DROP ROLE {writer};")))
        .execute(pg.pool())
        .await
        .unwrap();
}

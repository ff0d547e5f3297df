//! The lease sweeper, the pruner and the vacuumer on every store, driven with `run_once()` and
//! a manual clock on a fresh PostgreSQL database and a fresh SQLite file (the store's harness,
//! `store::tests`).
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use chrono::{SubsecRound, Utc};

use super::pruner::Pruner;
use super::sweeper::LeaseSweeper;
use super::vacuum::Vacuumer;
use crate::clock::{Clock, ManualClock, SharedClock};
use crate::domain::{ConsumerSpec, DeadKeyPolicy, DeliveryState, MessageId};
use crate::hub::Hub;
use crate::relay::{Relay, RelayConfig};
use crate::store::tests::{msg, on_every_store, spec};
use crate::store::{LeaseParams, NewMessage, Pruned, SharedStore, StoreError};

on_every_store!(
    expired_leases_back_off_then_die_at_max_deliveries,
    the_pruner_keeps_unfinished_messages_and_removes_acked_ones_past_retention,
    table_health_shows_the_size_and_dead_rows_of_outboxds_tables,
    an_expired_lease_that_dies_holds_its_key_too,
);

async fn expired_leases_back_off_then_die_at_max_deliveries(store: SharedStore) {
    let clock = ManualClock::new(Utc::now().trunc_subsecs(6));
    let shared: SharedClock = Arc::new(clock.clone());
    let hub = Hub::default();
    let c = spec("c", &["t"], 3);
    store.consumer_create(&c, clock.now()).await.unwrap();
    let id = store.message_insert(&msg("t"), clock.now()).await.unwrap().message_id;
    Relay::new(store.clone(), shared.clone(), hub.clone(), RelayConfig::default()).run_once().await.unwrap();
    let sweeper = LeaseSweeper::new(store.clone(), shared.clone(), hub, Duration::from_secs(5));
    assert_eq!(sweeper.next_wait().await, Duration::from_secs(5), "no lease: the longest sleep");

    for attempt in 1..=3u32 {
        let now = clock.now();
        let leased = store
            .delivery_lease(&LeaseParams {
                consumer: &c.name,
                session: "s",
                limit: 10,
                keys_after: "",
                lease_until: crate::clock::add(now, c.ack_deadline),
                now,
            })
            .await
            .unwrap();
        assert_eq!(leased.len(), 1, "attempt {attempt} leases the message");
        assert_eq!(leased[0].delivery_count, attempt);
        assert_eq!(sweeper.run_once().await.unwrap(), 0, "not expired yet");
        assert_eq!(sweeper.next_wait().await, Duration::from_secs(5), "the deadline is further off than that");
        clock.advance(c.ack_deadline - Duration::from_secs(2));
        assert_eq!(sweeper.next_wait().await, Duration::from_secs(2), "sleeps until the deadline");
        clock.advance(Duration::from_secs(2) + Duration::from_millis(1));
        assert_eq!(sweeper.next_wait().await, Duration::ZERO, "due now");
        assert_eq!(sweeper.run_once().await.unwrap(), 1);
        let (_, rows) = store.message_get(id).await.unwrap();
        if attempt < 3 {
            assert_eq!(rows[0].state, DeliveryState::Pending);
            let wait = rows[0].available_at - clock.now();
            assert_eq!(wait.to_std().unwrap(), c.backoff.delay(attempt), "backoff after attempt {attempt}");
            assert!(
                store
                    .delivery_lease(&LeaseParams {
                        consumer: &c.name,
                        session: "s",
                        limit: 10,
                        keys_after: "",
                        lease_until: clock.now(),
                        now: clock.now()
                    })
                    .await
                    .unwrap()
                    .is_empty(),
                "not due during backoff"
            );
            clock.advance(c.backoff.delay(attempt));
        } else {
            assert_eq!(rows[0].state, DeliveryState::Dead);
            assert_eq!(rows[0].last_error.as_deref(), Some("ack deadline expired"));
        }
    }
    let stats = store.stats(Some(&c.name), true).await.unwrap();
    assert_eq!(stats.consumers[0].dead, 1);
}

async fn the_pruner_keeps_unfinished_messages_and_removes_acked_ones_past_retention(store: SharedStore) {
    let clock = ManualClock::new(Utc::now().trunc_subsecs(6));
    let shared: SharedClock = Arc::new(clock.clone());
    let c = spec("c", &["t"], 5);
    store.consumer_create(&c, clock.now()).await.unwrap();
    let done = store.message_insert(&msg("t"), clock.now()).await.unwrap().message_id;
    let open = store.message_insert(&msg("t"), clock.now()).await.unwrap().message_id;
    store.relay_pass(10, clock.now(), false, &[]).await.unwrap();
    store.delivery_ack_many(&c.name, &[done], clock.now()).await.unwrap();
    let pruner = Pruner::new(store.clone(), shared, Duration::from_secs(7 * 86400), Duration::from_secs(600));
    assert_eq!(pruner.run_once().await.unwrap(), Pruned::default(), "within retention");
    clock.advance(Duration::from_secs(8 * 86400));
    assert_eq!(pruner.run_once().await.unwrap(), Pruned { messages: 1, deliveries: 1 });
    assert!(matches!(store.message_get(done).await, Err(StoreError::MessageNotFound(_))));
    assert!(store.message_get(open).await.is_ok(), "a pending delivery keeps its message");
}

/// Stats show what vacuum has still to reclaim: PostgreSQL's dead rows per outboxd table (each
/// lease and ack leaves one), SQLite's file size and free pages.
async fn table_health_shows_the_size_and_dead_rows_of_outboxds_tables(store: SharedStore) {
    let now = Utc::now();
    let c = spec("c", &["t"], 5);
    store.consumer_create(&c, now).await.unwrap();
    // Keyed, so that every delivery is a row on PostgreSQL too (unkeyed ones wait in ranges).
    let keyed = |i: usize| NewMessage { ordering_key: Some(format!("k{i}")), ..msg("t") };
    store.message_insert_many(&(0..20).map(keyed).collect::<Vec<_>>(), now).await.unwrap();
    store.relay_pass(100, now, false, &[]).await.unwrap();
    let later = crate::clock::add(now, Duration::from_secs(30));
    let leased = store
        .delivery_lease(&LeaseParams {
            consumer: &c.name,
            session: "s",
            limit: 100,
            keys_after: "",
            lease_until: later,
            now,
        })
        .await
        .unwrap();
    let ids: Vec<MessageId> = leased.iter().map(|d| d.message.message_id).collect();
    assert_eq!(store.delivery_ack_many(&c.name, &ids, now).await.unwrap(), 20);
    if store.backend() == "sqlite" {
        let t = store.table_health().await.unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].table, "(file)");
        assert!(t[0].bytes >= 4096, "{t:?}");
        return;
    }
    // PostgreSQL's statistics arrive asynchronously (within about a second): poll, bounded.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let t = store.table_health().await.unwrap();
        let names: Vec<&str> = t.iter().map(|t| t.table.as_str()).collect();
        assert!(["consumers", "deliveries", "messages"].iter().all(|n| names.contains(n)), "{names:?}");
        assert!(t.iter().all(|t| t.bytes > 0), "{t:?}");
        let deliveries = t.iter().find(|t| t.table == "deliveries").unwrap();
        // 20 leased and 20 acked: two dead versions per delivery row.
        if deliveries.dead_rows >= 20 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "dead rows never showed: {t:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Below the thresholds nothing is vacuumed; above them the table is, and says so.
    let vacuumer = Vacuumer::new(store.clone(), Duration::from_secs(10));
    assert!(vacuumer.run_once().await.unwrap().is_empty(), "20 dead rows are below the default threshold");
    let mut eager = vacuumer.clone();
    (eager.min_dead_rows, eager.dead_ratio) = (10, 0.0);
    let done = eager.run_once().await.unwrap();
    assert!(done.contains(&"deliveries".to_owned()), "{done:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let t = store.table_health().await.unwrap();
        let deliveries = t.iter().find(|t| t.table == "deliveries").unwrap();
        if deliveries.last_vacuum.is_some() && deliveries.dead_rows < 20 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the vacuum never showed: {t:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The lease sweeper's path to dead holds the key as a nack does (ADR 0057; the other ways a
/// key is held and released are in `store::quarantine_tests`).
async fn an_expired_lease_that_dies_holds_its_key_too(store: SharedStore) {
    let clock = ManualClock::new(Utc::now().trunc_subsecs(6));
    let shared: SharedClock = Arc::new(clock.clone());
    let c = ConsumerSpec { dead_key_policy: DeadKeyPolicy::Hold, ..spec("c", &["t"], 1) };
    store.consumer_create(&c, clock.now()).await.unwrap();
    // Keys a (a1, a2, a3) and b (b1, b2) and one unkeyed message (u), relayed.
    let mut ids = Vec::new();
    for key in [Some("a"), Some("b"), None, Some("a"), Some("b"), Some("a")] {
        let m = NewMessage { ordering_key: key.map(str::to_owned), ..msg("t") };
        ids.push(store.message_insert(&m, clock.now()).await.unwrap().message_id);
    }
    let (a1, b1, u, b2) = (ids[0], ids[1], ids[2], ids[4]);
    store.relay_pass(100, clock.now(), false, &[]).await.unwrap();
    let lease = |now| {
        let (store, c) = (store.clone(), c.clone());
        async move {
            let until = crate::clock::add(now, c.ack_deadline);
            let mut leased = store
                .delivery_lease(&LeaseParams {
                    consumer: &c.name,
                    session: "s",
                    limit: 10,
                    keys_after: "",
                    lease_until: until,
                    now,
                })
                .await
                .unwrap();
            leased.sort_by_key(|d| d.message.seq);
            leased.iter().map(|d| d.message.message_id).collect::<Vec<_>>()
        }
    };
    assert_eq!(lease(clock.now()).await, vec![a1, b1, u]);
    store.delivery_ack_many(&c.name, &[b1, u], clock.now()).await.unwrap();
    clock.advance(c.ack_deadline + Duration::from_millis(1));
    let sweeper = LeaseSweeper::new(store.clone(), shared, Hub::default(), Duration::from_secs(5));
    assert_eq!(sweeper.run_once().await.unwrap(), 1);
    let (_, rows) = store.message_get(a1).await.unwrap();
    assert_eq!((rows[0].state, rows[0].delivery_count), (DeliveryState::Dead, 1));
    let held = store.held_key_list(&c.name, 10).await.unwrap();
    assert_eq!((held.len(), held[0].last_error.as_deref()), (1, Some("ack deadline expired")));
    assert_eq!(lease(clock.now()).await, vec![b2]);
}

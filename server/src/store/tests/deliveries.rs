//! Deliveries: leases (ordering keys in turn), releases, extends and expiry, on both stores
//! and wherever each store holds a delivery.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use chrono::{SubsecRound, Utc};

use super::*;
use crate::domain::{Attempt, DeliveryState, StartFrom};

on_every_store!(
    a_release_never_undoes_an_ack_or_another_sessions_lease,
    leases_take_every_ordering_key_in_turn_and_one_message_of_a_key_at_a_time,
    delivery_insert_pending_creates_only_missing_rows,
    delivery_next_due_tells_a_missing_consumer_from_one_with_nothing_due,
    expired_records_carry_the_consumers_retry_policy,
    pushed_deliveries_ack_release_extend_and_expire_like_leased_ones,
    pending_deliveries_wait_in_seq_order_and_count_like_rows,
);

async fn a_release_never_undoes_an_ack_or_another_sessions_lease(store: SharedStore) {
    let now = Utc::now();
    let c = spec("c", &["t"], 5);
    store.consumer_create(&c, now).await.unwrap();
    let a = store.message_insert(&msg("t"), now).await.unwrap().message_id;
    let b = store.message_insert(&msg("t"), now).await.unwrap().message_id;
    store.relay_pass(10, now, false, &[]).await.unwrap();
    let later = crate::clock::add(now, Duration::from_secs(30));
    assert_eq!(
        store
            .delivery_lease(&LeaseParams {
                consumer: &c.name,
                session: "s1",
                limit: 1,
                keys_after: "",
                lease_until: later,
                now
            })
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        store
            .delivery_lease(&LeaseParams {
                consumer: &c.name,
                session: "s2",
                limit: 1,
                keys_after: "",
                lease_until: later,
                now
            })
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(store.delivery_ack_many(&c.name, &[a], now).await.unwrap(), 1);
    assert_eq!(store.delivery_ack_many(&c.name, &[a], now).await.unwrap(), 0, "ack is idempotent");
    let release = |id| Release {
        consumer: c.name.clone(),
        message_id: id,
        state: DeliveryState::Pending,
        available_at: now,
        error: None,
        attempt: Attempt::Failed,
    };
    // s1 held a (acked now), s2 holds b: s1 can release neither.
    assert_eq!(
        store.delivery_release_many(&[release(a), release(b)], ReleaseGuard::Session("s1"), now).await.unwrap(),
        0
    );
    assert_eq!(
        store.delivery_release_many(&[release(b)], ReleaseGuard::ExpiredAt(now), now).await.unwrap(),
        0,
        "b is not expired"
    );
    assert_eq!(store.delivery_release_many(&[release(b)], ReleaseGuard::Session("s2"), now).await.unwrap(), 1);
}

/// Keys late in byte order are not starved by keys before them: with the key cursor, ten
/// keys of three messages each (written key by key, so the lowest seqs all belong to the first
/// keys) are each served once before any is served twice; a key's messages go one at a time,
/// in seq order; a key with one message in flight yields nothing more until it is acked.
async fn leases_take_every_ordering_key_in_turn_and_one_message_of_a_key_at_a_time(store: SharedStore) {
    let now = Utc::now().trunc_subsecs(6);
    let c = spec("c", &["t"], 5);
    store.consumer_create(&c, now).await.unwrap();
    let mut seqs_of: std::collections::HashMap<String, Vec<i64>> = Default::default();
    for k in 0..10 {
        for _ in 0..3 {
            let key = format!("key-{k}");
            let e =
                store.message_insert(&NewMessage { ordering_key: Some(key.clone()), ..msg("t") }, now).await.unwrap();
            seqs_of.entry(key).or_default().push(e.seq);
        }
    }
    store.relay_pass(100, now, false, &[]).await.unwrap();
    let later = crate::clock::add(now, Duration::from_secs(30));

    let mut cursor = String::new();
    let mut served: Vec<String> = Vec::new();
    let mut next_seq: std::collections::HashMap<String, usize> = Default::default();
    for round in 0..15 {
        let leased = store
            .delivery_lease(&LeaseParams {
                consumer: &c.name,
                session: "s",
                limit: 2,
                keys_after: &cursor,
                lease_until: later,
                now,
            })
            .await
            .unwrap();
        assert_eq!(leased.len(), 2, "round {round}: two ready keys");
        let keys: Vec<String> = leased.iter().map(|d| d.message.ordering_key.clone().unwrap()).collect();
        assert_ne!(keys[0], keys[1], "round {round}: one message of a key at a time");
        for d in &leased {
            let key = d.message.ordering_key.clone().unwrap();
            let i = next_seq.entry(key.clone()).or_default();
            assert_eq!(d.message.seq, seqs_of[&key][*i], "key {key}: in seq order");
            *i += 1;
        }
        // While in flight, those two keys have nothing more to give.
        let more = store
            .delivery_lease(&LeaseParams {
                consumer: &c.name,
                session: "s",
                limit: 30,
                keys_after: "",
                lease_until: later,
                now,
            })
            .await
            .unwrap();
        assert!(more.iter().all(|d| !keys.contains(d.message.ordering_key.as_ref().unwrap())), "round {round}");
        let mut ids: Vec<MessageId> = leased.iter().map(|d| d.message.message_id).collect();
        ids.extend(more.iter().map(|d| d.message.message_id));
        store
            .delivery_release_many(
                &more
                    .iter()
                    .map(|d| Release {
                        consumer: c.name.clone(),
                        message_id: d.message.message_id,
                        state: DeliveryState::Pending,
                        available_at: now,
                        error: None,
                        attempt: Attempt::Failed,
                    })
                    .collect::<Vec<_>>(),
                ReleaseGuard::Session("s"),
                now,
            )
            .await
            .unwrap();
        store.delivery_ack_many(&c.name, &ids[..2], now).await.unwrap();
        cursor = next_key_cursor(&cursor, &leased);
        served.extend(keys);
    }
    for (i, window) in served.chunks(10).enumerate() {
        let distinct: std::collections::HashSet<_> = window.iter().collect();
        assert_eq!(distinct.len(), 10, "pass {i} over the keys serves each key once: {window:?}");
    }
    assert!(
        store
            .delivery_lease(&LeaseParams {
                consumer: &c.name,
                session: "s",
                limit: 10,
                keys_after: &cursor,
                lease_until: later,
                now
            })
            .await
            .unwrap()
            .is_empty()
    );
}

async fn delivery_insert_pending_creates_only_missing_rows(store: SharedStore) {
    let d = &store;
    let at = now();
    let sent = insert(&*store, &["t", "t", "t"], at).await;
    create(&*store, &spec_from("c", &["t"], StartFrom::Earliest), at).await;
    let mut conn = d.begin().await.unwrap();
    let page = conn.message_page(0, 10).await.unwrap();
    drop(conn);

    let mut tx = d.begin().await.unwrap();
    assert_eq!(tx.delivery_insert_pending("c", &page[..2], at).await.unwrap(), 2);
    assert_eq!(tx.delivery_insert_pending("c", &page, at).await.unwrap(), 1, "only the missing one");
    assert_eq!(tx.delivery_insert_pending("c", &[], at).await.unwrap(), 0);
    tx.commit().await.unwrap();
    for e in &sent {
        assert_eq!(state_of(&*store, e.message_id, "c").await, Some(("pending".to_owned(), 0)));
    }
}

async fn delivery_next_due_tells_a_missing_consumer_from_one_with_nothing_due(store: SharedStore) {
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    assert!(matches!(d.delivery_next_due(&c).await, Err(StoreError::ConsumerNotFound(n)) if n == "c"));
    create(&*store, &spec_from("c", &["t"], StartFrom::Earliest), at).await;
    assert_eq!(d.delivery_next_due(&c).await.unwrap(), None);

    let mut delayed = msg("t");
    delayed.delay = Some(Duration::from_secs(5));
    d.message_insert(&delayed, at).await.unwrap();
    let mut tx = d.begin().await.unwrap();
    let page = tx.message_page(0, 10).await.unwrap();
    tx.delivery_insert_pending("c", &page, at).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(d.delivery_next_due(&c).await.unwrap(), Some(at + chrono::Duration::seconds(5)));
}

async fn expired_records_carry_the_consumers_retry_policy(store: SharedStore) {
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&*store, &spec_from("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&*store, &["t", "t"], at).await;
    d.relay_pass(10, at, false, &[]).await.unwrap();
    let soon = at + chrono::Duration::seconds(1);
    assert_eq!(
        d.delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s",
            limit: 1,
            keys_after: "",
            lease_until: soon,
            now: at
        })
        .await
        .unwrap()
        .len(),
        1
    );
    assert_eq!(d.delivery_next_expiry().await.unwrap(), Some(soon));
    assert!(d.delivery_expired(at, 10).await.unwrap().is_empty(), "not yet");

    let expired = d.delivery_expired(soon, 10).await.unwrap();
    assert_eq!(expired.len(), 1);
    let e = &expired[0];
    assert_eq!((e.consumer.as_str(), e.message_id), ("c", sent[0].message_id));
    assert_eq!((e.delivery_count, e.retry.max_deliveries), (1, 4));
    assert_eq!((e.retry.backoff.base, e.retry.backoff.max), (Duration::from_millis(250), Duration::from_secs(90)));
}

/// A delivery pushed at fan-out is leased with count 1 (on PostgreSQL held in a leased range, with
/// no row of its own: ADR 0041) and goes through every transition as a leased row does.
async fn pushed_deliveries_ack_release_extend_and_expire_like_leased_ones(store: SharedStore) {
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&*store, &spec_from("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&*store, &["t", "t", "t", "t"], at).await;
    let ids: Vec<MessageId> = sent.iter().map(|e| e.message_id).collect();
    let until = at + chrono::Duration::seconds(30);
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 4, lease_until: until };
    let out = d.relay_pass(10, at, false, &[offer]).await.unwrap();
    assert_eq!(out.pushed.len(), 4);
    assert!(
        out.pushed.iter().all(|(c, s, l)| c == "c" && s == "s1" && l.delivery_count == 1 && l.message.payload == b"{}")
    );
    for id in &ids {
        assert_eq!(state_of(&*store, *id, "c").await, Some(("leased".to_owned(), 1)));
    }
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].in_flight, stats[0].backlog, stats[0].acked), (4, 0, 0));
    assert_eq!(stats[0].oldest_unacked_at, Some(at));
    assert_eq!(d.delivery_next_expiry().await.unwrap(), Some(until));

    // Acked once, and never again.
    assert_eq!(d.delivery_ack_many(&c, &ids[..1], at).await.unwrap(), 1);
    assert_eq!(d.delivery_ack_many(&c, &ids[..1], at).await.unwrap(), 0, "an ack is applied once");
    let timeline = d.delivery_list_of_message(ids[0]).await.unwrap();
    assert_eq!(timeline.len(), 1);
    assert_eq!((timeline[0].state.as_str(), timeline[0].delivery_count, timeline[0].acked_at), ("acked", 1, Some(at)));

    // Released by the session that holds it (a nack), never by another one.
    let nack = Release {
        consumer: c.clone(),
        message_id: ids[1],
        state: DeliveryState::Pending,
        available_at: at,
        error: Some("refused".into()),
        attempt: Attempt::Failed,
    };
    assert_eq!(d.delivery_release_many(std::slice::from_ref(&nack), ReleaseGuard::Session("s2"), at).await.unwrap(), 0);
    assert_eq!(d.delivery_release_many(&[nack], ReleaseGuard::Session("s1"), at).await.unwrap(), 1);
    assert_eq!(state_of(&*store, ids[1], "c").await, Some(("pending".to_owned(), 1)));
    assert_eq!(d.delivery_ack_many(&c, &ids[1..2], at).await.unwrap(), 1, "a late ack of a released one counts");

    // Extended by its session, and only the one named: the delivery pushed beside it keeps its
    // deadline (on PostgreSQL the two share a leased range). Past each deadline the sweeper
    // finds what expired, count 1.
    let later = until + chrono::Duration::seconds(10);
    assert_eq!(
        d.delivery_extend_many(&ExtendParams { consumer: &c, session: "s2", ids: &ids[2..3], until: later, now: at })
            .await
            .unwrap(),
        0,
        "not s2's"
    );
    assert_eq!(
        d.delivery_extend_many(&ExtendParams { consumer: &c, session: "s1", ids: &ids[2..3], until: later, now: at })
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        d.delivery_extend_many(&ExtendParams { consumer: &c, session: "s1", ids: &ids[2..3], until: later, now: at })
            .await
            .unwrap(),
        1,
        "again, as a row"
    );
    assert_eq!(d.delivery_next_expiry().await.unwrap(), Some(until), "the other one keeps its deadline");
    let first: Vec<MessageId> = d.delivery_expired(until, 10).await.unwrap().iter().map(|e| e.message_id).collect();
    assert_eq!(first, [ids[3]], "only the one not extended");
    let timeline = d.delivery_list_of_message(ids[2]).await.unwrap();
    assert_eq!((timeline[0].state.as_str(), timeline[0].lease_expires_at), ("leased", Some(later)));
    let mut expired = d.delivery_expired(later, 10).await.unwrap();
    expired.sort_by_key(|e| e.message_id.0);
    let mut want = ids[2..].to_vec();
    want.sort_by_key(|m| m.0);
    assert_eq!(expired.iter().map(|e| e.message_id).collect::<Vec<_>>(), want);
    assert!(expired.iter().all(|e| e.delivery_count == 1));
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].in_flight, stats[0].backlog, stats[0].acked), (2, 0, 2));
    let release = |id| Release {
        consumer: c.clone(),
        message_id: id,
        state: DeliveryState::Pending,
        available_at: later,
        error: Some("lease expired".into()),
        attempt: Attempt::Failed,
    };
    let releases: Vec<Release> = ids[2..].iter().map(|id| release(*id)).collect();
    assert_eq!(d.delivery_release_many(&releases, ReleaseGuard::ExpiredAt(later), later).await.unwrap(), 2);
    // Their next delivery says 2.
    let again = d
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s3",
            limit: 10,
            keys_after: "",
            lease_until: later + chrono::Duration::seconds(30),
            now: later,
        })
        .await
        .unwrap();
    assert_eq!(again.len(), 2);
    assert!(again.iter().all(|l| l.delivery_count == 2), "{again:?}");
}

/// Deliveries the relay cannot push (no room) are pending with count 0 (on PostgreSQL held in
/// pending ranges, with no row of their own: ADR 0042): counted as backlog, due, kept from
/// pruning, leased in seq order with count 1, and from then on like any lease.
async fn pending_deliveries_wait_in_seq_order_and_count_like_rows(store: SharedStore) {
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&*store, &spec_from("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&*store, &["t", "t", "t", "t", "t"], at).await;
    let ids: Vec<MessageId> = sent.iter().map(|e| e.message_id).collect();
    let until = at + chrono::Duration::seconds(30);
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 2, lease_until: until };
    let out = d.relay_pass(10, at, false, &[offer]).await.unwrap();
    assert_eq!((out.pushed.len(), out.deliveries), (2, 5));
    assert_eq!(out.consumers, ["c"], "the consumer with pending work is woken");
    for id in &ids[2..] {
        assert_eq!(state_of(&*store, *id, "c").await, Some(("pending".to_owned(), 0)));
    }
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].in_flight, stats[0].backlog, stats[0].retrying), (2, 3, 0));
    assert_eq!(stats[0].oldest_unacked_at, Some(at));
    let due = d.delivery_next_due(&c).await.unwrap().unwrap();
    assert!(due <= at, "due since it was relayed: {due}");
    assert_eq!(d.prune_before(at + chrono::Duration::hours(1), 10).await.unwrap(), Some(Pruned::default()));

    // The lowest seqs first, count 1, and no more than asked.
    let first = d
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s2",
            limit: 2,
            keys_after: "",
            lease_until: until,
            now: at,
        })
        .await
        .unwrap();
    assert_eq!(first.iter().map(|l| l.message.message_id).collect::<Vec<_>>(), ids[2..4]);
    assert!(first.iter().all(|l| l.delivery_count == 1 && l.message.payload == b"{}" && l.lease_expires_at == until));
    assert_eq!(state_of(&*store, ids[2], "c").await, Some(("leased".to_owned(), 1)));
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].in_flight, stats[0].backlog), (4, 1));

    // A nack makes a retry that the next lease takes with the last pending one.
    let nack = Release {
        consumer: c.clone(),
        message_id: ids[2],
        state: DeliveryState::Pending,
        available_at: at,
        error: Some("refused".into()),
        attempt: Attempt::Failed,
    };
    assert_eq!(d.delivery_release_many(&[nack], ReleaseGuard::Session("s2"), at).await.unwrap(), 1);
    assert_eq!(state_of(&*store, ids[2], "c").await, Some(("pending".to_owned(), 1)));
    let mut next = d
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s3",
            limit: 10,
            keys_after: "",
            lease_until: until,
            now: at,
        })
        .await
        .unwrap();
    next.sort_by_key(|l| l.message.seq);
    let got: Vec<(MessageId, u32)> = next.iter().map(|l| (l.message.message_id, l.delivery_count)).collect();
    assert_eq!(got, [(ids[2], 2), (ids[4], 1)]);
    assert!(
        d.delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s3",
            limit: 10,
            keys_after: "",
            lease_until: until,
            now: at
        })
        .await
        .unwrap()
        .is_empty(),
        "nothing twice"
    );
    assert_eq!(d.delivery_next_due(&c).await.unwrap(), None);

    // Every one acked once.
    assert_eq!(d.delivery_ack_many(&c, &ids, at).await.unwrap(), 5);
    assert_eq!(d.delivery_ack_many(&c, &ids, at).await.unwrap(), 0);
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].in_flight, stats[0].backlog, stats[0].acked), (0, 0, 5));
    assert_eq!(stats[0].oldest_unacked_at, None);
    assert_eq!(state_of(&*store, ids[4], "c").await, Some(("acked".to_owned(), 1)));
}

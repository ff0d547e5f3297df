//! Consumers (created, found, paused, counted, deleted) and console sessions, statement by
//! statement.
#![allow(clippy::unwrap_used)]

use chrono::{DateTime, Utc};

use super::*;
use crate::domain::{Consumer, StartFrom};

on_every_store!(
    consumer_insert_stores_the_spec_and_find_reads_it_back,
    consumer_delete_says_whether_there_was_one_and_rolls_back_with_its_transaction,
    consumer_set_paused_returns_the_row_or_none,
    consumer_insert_records_its_creator_and_count_counts,
    console_sessions_are_found_touched_and_deleted_by_their_id_hash,
);

async fn consumer_insert_stores_the_spec_and_find_reads_it_back(store: SharedStore) {
    let d = &store;
    let at = now();
    let sent = insert(&*store, &["a.x", "a.y"], at).await;
    create(&*store, &spec_from("fresh", &["a.*"], StartFrom::New), at).await;
    create(&*store, &spec_from("all", &["a.>"], StartFrom::Earliest), at).await;

    let fresh = d.consumer_find("fresh").await.unwrap().unwrap();
    assert_eq!(fresh.start_seq, sent[1].seq, "NEW starts after the highest seq at creation");
    assert_eq!((fresh.max_deliveries, fresh.backoff_base_ms, fresh.backoff_max_ms), (4, 250, 90_000));
    assert_eq!((fresh.ack_deadline_ms, fresh.start_from.as_str()), (15_000, "new"));
    assert_eq!(fresh.topics, vec!["a.*".to_owned()]);
    assert!(!fresh.paused);
    assert_eq!(fresh.created_at, at);
    let decoded = Consumer::try_from(fresh).unwrap();
    assert_eq!(decoded.spec, spec_from("fresh", &["a.*"], StartFrom::New));

    let all = d.consumer_find("all").await.unwrap().unwrap();
    assert_eq!((all.start_seq, all.start_from.as_str()), (0, "earliest"));
    assert!(d.consumer_find("nobody").await.unwrap().is_none());
    let names: Vec<String> = d.consumer_list().await.unwrap().into_iter().map(|c| c.spec.name.to_string()).collect();
    assert_eq!(names, ["all", "fresh"], "in name order");
}

async fn consumer_delete_says_whether_there_was_one_and_rolls_back_with_its_transaction(store: SharedStore) {
    let d = &store;
    create(&*store, &spec_from("c", &["t"], StartFrom::New), now()).await;

    let mut tx = d.begin_consumer_change().await.unwrap();
    assert!(tx.consumer_delete("c").await.unwrap());
    drop(tx);
    assert_eq!(d.consumer_list().await.unwrap().len(), 1, "an uncommitted delete is rolled back");

    let mut tx = d.begin_consumer_change().await.unwrap();
    assert!(tx.consumer_delete("c").await.unwrap());
    assert!(!tx.consumer_delete("c").await.unwrap(), "nothing left to delete");
    tx.commit().await.unwrap();
    assert!(d.consumer_list().await.unwrap().is_empty());
}

async fn consumer_set_paused_returns_the_row_or_none(store: SharedStore) {
    let d = &store;
    create(&*store, &spec_from("c", &["t"], StartFrom::New), now()).await;
    let name = |n: &str| ConsumerName::parse("name", n).unwrap();
    assert!(d.consumer_set_paused(&name("c"), true).await.unwrap().paused);
    assert!(!d.consumer_set_paused(&name("c"), false).await.unwrap().paused);
    assert!(matches!(
        d.consumer_set_paused(&name("nobody"), true).await,
        Err(StoreError::ConsumerNotFound(n)) if n == "nobody"
    ));
}

async fn consumer_insert_records_its_creator_and_count_counts(store: SharedStore) {
    let at = now();
    let mut tx = store.begin_consumer_change().await.unwrap();
    assert_eq!(tx.consumer_count().await.unwrap(), 0);
    tx.consumer_insert(&spec_from("owned", &["a.*"], StartFrom::New), Some("payments"), at).await.unwrap();
    tx.consumer_insert(&spec_from("unowned", &["a.*"], StartFrom::New), None, at).await.unwrap();
    assert_eq!(tx.consumer_count().await.unwrap(), 2, "its own inserts, inside the transaction");
    tx.commit().await.unwrap();
    assert_eq!(store.consumer_find("owned").await.unwrap().unwrap().created_by.as_deref(), Some("payments"));
    assert_eq!(store.consumer_find("unowned").await.unwrap().unwrap().created_by, None);
    let listed: Vec<_> = store.consumer_list().await.unwrap().into_iter().map(|c| c.created_by).collect();
    assert_eq!(listed, [Some("payments".to_owned()), None]);
}

async fn console_sessions_are_found_touched_and_deleted_by_their_id_hash(store: SharedStore) {
    let at = now();
    let session = |id: u8, principal: &str, created: DateTime<Utc>| ConsoleSession {
        id_hash: [id; 32],
        principal: principal.to_owned(),
        token_hash: [id ^ 0xff; 32],
        created_at: created,
        seen_at: created,
        expires_at: created + chrono::Duration::hours(12),
    };
    let first = session(1, "root", at);
    store.console_session_insert(&first).await.unwrap();
    assert_eq!(store.console_session_find(&[1; 32]).await.unwrap(), Some(first.clone()));
    assert_eq!(store.console_session_find(&[2; 32]).await.unwrap(), None);
    let later = at + chrono::Duration::minutes(5);
    store.console_session_touch(&[1; 32], later).await.unwrap();
    store.console_session_touch(&[1; 32], at).await.unwrap();
    assert_eq!(store.console_session_find(&[1; 32]).await.unwrap().unwrap().seen_at, later, "never moved back");

    // Expired (absolute) and idle sessions go; the rest stay.
    let mut expired = session(2, "root", at - chrono::Duration::hours(13));
    expired.seen_at = at;
    store.console_session_insert(&expired).await.unwrap();
    store.console_session_insert(&session(3, "reader", at - chrono::Duration::hours(2))).await.unwrap();
    let gone = store.console_session_delete_expired(at, at - chrono::Duration::hours(1)).await.unwrap();
    assert_eq!(gone, 2, "the expired one and the idle one");
    assert!(store.console_session_find(&[1; 32]).await.unwrap().is_some());

    // A principal keeps its newest `keep`.
    for i in 10..14u8 {
        store.console_session_insert(&session(i, "root", at + chrono::Duration::seconds(i64::from(i)))).await.unwrap();
    }
    assert_eq!(store.console_session_delete_oldest("root", 3).await.unwrap(), 2);
    for (id, kept) in [(1, false), (10, false), (11, true), (12, true), (13, true)] {
        assert_eq!(store.console_session_find(&[id; 32]).await.unwrap().is_some(), kept, "session {id}");
    }
    assert!(store.console_session_delete(&[12; 32]).await.unwrap());
    assert!(!store.console_session_delete(&[12; 32]).await.unwrap(), "deleted once");
}

//! Prune: finished messages before the cutoff only, and one replica at a time.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::domain::StartFrom;
use crate::testing::TestDb;

on_every_store!(prune_before_removes_finished_messages_before_the_cutoff_only,);

async fn prune_before_removes_finished_messages_before_the_cutoff_only(store: SharedStore) {
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&*store, &spec_from("c", &["t"], StartFrom::New), at).await;
    // acked, pending, nobody's.
    let sent = insert(&*store, &["t", "t", "other"], at).await;
    let unrelayed = insert(&*store, &["other"], at + chrono::Duration::seconds(1)).await;
    assert_eq!(d.relay_pass(3, at, false, &[]).await.unwrap().messages, 3);
    assert_eq!(d.delivery_ack_many(&c, &[sent[0].message_id], at).await.unwrap(), 1);

    let later = at + chrono::Duration::hours(1);
    assert_eq!(
        d.prune_before(at, 10).await.unwrap(),
        Some(Pruned::default()),
        "nothing is older than a cutoff at its own enqueue time"
    );
    // The acked one and nobody's, whichever comes first (same enqueue time), one per batch.
    let first = d.prune_before(later, 1).await.unwrap().unwrap();
    let second = d.prune_before(later, 10).await.unwrap().unwrap();
    assert_eq!((first.messages, second.messages), (1, 1));
    assert_eq!(first.deliveries + second.deliveries, 1, "the acked row goes with its message");
    assert_eq!(d.prune_before(later, 10).await.unwrap(), Some(Pruned::default()));
    assert!(d.message_find(sent[0].message_id).await.unwrap().is_none());
    assert!(d.message_find(sent[2].message_id).await.unwrap().is_none());
    assert!(d.message_find(sent[1].message_id).await.unwrap().is_some(), "still pending for c");
    assert!(d.message_find(unrelayed[0].message_id).await.unwrap().is_some(), "not relayed yet");
}

#[tokio::test]
async fn a_postgres_prune_yields_to_the_replica_that_holds_the_prune_lock() {
    let db = TestDb::create().await.unwrap();
    let store = PgStore::connect(&db.url, 8).await.unwrap();
    ready(&store).await;
    let mut other = store.pool().begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(super::postgres::PRUNE_LOCK)
        .execute(&mut *other)
        .await
        .unwrap();
    let later = now() + chrono::Duration::hours(1);
    assert_eq!(store.prune_before(later, 10).await.unwrap(), None, "another replica is pruning");
    other.rollback().await.unwrap();
    assert_eq!(store.prune_before(later, 10).await.unwrap(), Some(Pruned::default()));
}

//! SQLite's one file: one server at a time, and producers in other processes writing to it.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use chrono::Utc;
use sqlx::Connection as _;

use super::*;
use crate::testing::TestSqlite;

/// SQLite only: several replicas on one database is what PostgreSQL is for.
#[tokio::test]
async fn a_second_server_on_one_sqlite_file_is_refused() {
    let held = TestSqlite::create().unwrap();
    let _first = connect(&held.url, 2).await.unwrap();
    let err = connect(&held.url, 2).await.unwrap_err();
    assert!(matches!(err, StoreError::Locked(_)), "{err}");
    assert!(err.to_string().contains("only one server"), "{err}");
}

/// outboxd's writes wait for the write lock that another process (a producer) holds, instead
/// of failing or sleeping in SQLite's escalating busy handler: an ack and a relay pass issued
/// while another connection holds `BEGIN IMMEDIATE` both complete once it commits, and the
/// producer's row is relayed.
#[tokio::test]
async fn sqlite_writes_wait_for_a_write_lock_another_connection_holds() {
    let db = TestSqlite::create().unwrap();
    let store = connect(&db.url, 2).await.unwrap();
    store.migrate().await.unwrap();
    let now = Utc::now();
    let c = spec("c", &["t"], 5);
    store.consumer_create(&c, now).await.unwrap();
    store.message_insert(&msg("t"), now).await.unwrap();
    store.relay_pass(10, now, false, &[]).await.unwrap();
    let later = crate::clock::add(now, Duration::from_secs(30));
    let leased = store
        .delivery_lease(&LeaseParams {
            consumer: &c.name,
            session: "s",
            limit: 10,
            keys_after: "",
            lease_until: later,
            now,
        })
        .await
        .unwrap();
    assert_eq!(leased.len(), 1);

    let mut producer = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql("BEGIN IMMEDIATE; INSERT INTO outbox_messages (topic, type, payload) VALUES ('t', 'T', x'00')")
        .execute(&mut producer)
        .await
        .unwrap();
    let holder = tokio::spawn(async move {
        // Longer than a write that does not wait would take to fail.
        tokio::time::sleep(Duration::from_millis(200)).await;
        sqlx::raw_sql("COMMIT").execute(&mut producer).await.unwrap();
    });
    let acked = store.delivery_ack_many(&c.name, &[leased[0].message.message_id], now).await.unwrap();
    assert_eq!(acked, 1, "the ack waited for the lock and applied");
    // The lock was free only once the producer had committed: its row is there.
    assert_eq!(store.message_list_after(0, 10).await.unwrap().len(), 2, "the ack went after the producer's commit");
    let relayed = store.relay_pass(10, now, false, &[]).await.unwrap();
    assert_eq!(relayed.messages, 1, "the producer's row");
    holder.await.unwrap();
}

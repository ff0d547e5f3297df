//! PostgreSQL only: a row of a consumer decides over its ranges, in every statement that reads
//! or writes them.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::domain::StartFrom;
use crate::testing::TestDb;

/// PostgreSQL only: a row of its own wins over a pending range. A message acked in the
/// consumer's transaction, acked by a stream it was never sent to, or replayed while it waits
/// is never leased from the range; deleting the consumer takes its ranges with it.
#[tokio::test]
async fn a_postgres_pending_range_yields_to_rows_of_its_own() {
    let db = TestDb::create().await.unwrap();
    let store = PgStore::connect(&db.url, 8).await.unwrap();
    ready(&store).await;
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&store, &spec_from("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&store, &["t", "t", "t", "t", "nobodys"], at).await;
    let ids: Vec<MessageId> = sent[..4].iter().map(|e| e.message_id).collect();
    assert_eq!(d.relay_pass(10, at, false, &[]).await.unwrap().deliveries, 4);
    let pruned = d.prune_before(at + chrono::Duration::hours(1), 10).await.unwrap().unwrap();
    assert_eq!(pruned.messages, 1, "a waiting backlog holds back its own messages only");
    assert!(d.message_find(sent[4].message_id).await.unwrap().is_none());
    let ranges: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.delivery_ranges WHERE state = 'pending'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(ranges, 1, "one pending range, no row per message");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.deliveries").fetch_one(store.pool()).await.unwrap();
    assert_eq!(rows, 0);

    let acked: bool =
        sqlx::query_scalar("SELECT outbox.ack('c', $1)").bind(ids[0].0).fetch_one(store.pool()).await.unwrap();
    assert!(acked, "a transactional ack of a pending delivery");
    assert_eq!(state_of(&store, ids[0], "c").await, Some(("acked".to_owned(), 0)));
    assert_eq!(d.delivery_ack_many(&c, &ids[1..2], at).await.unwrap(), 1, "a stream's ack of a pending one");
    assert_eq!(d.delivery_ack_many(&c, &ids[1..2], at).await.unwrap(), 0);
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].backlog, stats[0].acked), (2, 2));

    let leased = d
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s",
            limit: 10,
            keys_after: "",
            lease_until: at + chrono::Duration::seconds(30),
            now: at,
        })
        .await
        .unwrap();
    assert_eq!(leased.iter().map(|l| l.message.message_id).collect::<Vec<_>>(), ids[2..], "never the acked ones");
    assert_eq!(d.delivery_ack_many(&c, &ids[2..], at).await.unwrap(), 2);

    // A replay of an acked one and of a newer one that waits in a range: each once.
    let more = insert(&store, &["t"], at).await;
    assert_eq!(d.relay_pass(10, at, false, &[]).await.unwrap().deliveries, 1);
    let mut tx = d.begin().await.unwrap();
    assert_eq!(
        tx.delivery_replay("c", &[ids[2], more[0].message_id], at).await.unwrap(),
        2,
        "the waiting one leaves its range for a row, as on SQLite"
    );
    tx.commit().await.unwrap();
    let mut again = d
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s",
            limit: 10,
            keys_after: "",
            lease_until: at + chrono::Duration::seconds(30),
            now: at,
        })
        .await
        .unwrap();
    again.sort_by_key(|l| l.message.seq);
    let got: Vec<(MessageId, u32)> = again.iter().map(|l| (l.message.message_id, l.delivery_count)).collect();
    assert_eq!(got, [(ids[2], 1), (more[0].message_id, 1)]);

    let held: Vec<MessageId> = again.iter().map(|l| l.message.message_id).collect();
    assert_eq!(d.delivery_ack_many(&c, &held, at).await.unwrap(), 2);

    // Acked in the consumer's transaction while it waits, and never leased: the prune folds the
    // acked row into the range and takes the message.
    let waiting = insert(&store, &["t"], at).await;
    d.relay_pass(10, at, false, &[]).await.unwrap();
    let acked: bool = sqlx::query_scalar("SELECT outbox.ack('c', $1)")
        .bind(waiting[0].message_id.0)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(acked);
    let pruned = d.prune_before(at + chrono::Duration::hours(1), 100).await.unwrap().unwrap();
    assert!(pruned.messages >= 1, "{pruned:?}");
    assert!(d.message_find(waiting[0].message_id).await.unwrap().is_none(), "pruned though never leased");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.delivery_ranges WHERE state = 'pending'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(left, 0, "the folded range is gone");

    let another = insert(&store, &["t"], at).await;
    d.relay_pass(10, at, false, &[]).await.unwrap();
    assert_eq!(state_of(&store, another[0].message_id, "c").await, Some(("pending".to_owned(), 0)));
    let mut tx = d.begin_consumer_change().await.unwrap();
    assert!(tx.consumer_delete("c").await.unwrap());
    tx.commit().await.unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.delivery_ranges WHERE state = 'pending'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(left, 0, "deleted with its consumer");
}

/// PostgreSQL only: the list of a consumer's pending deliveries leaves out the seqs of its
/// pending ranges that rows of their own decide over (acked in the consumer's transaction while
/// they wait, which leaves the range as it is), and pages of any size still walk every other
/// one: a page that finds only such seqs is short, and the next starts past what it saw.
#[tokio::test]
async fn a_postgres_pending_list_skips_range_seqs_that_rows_decide_and_misses_none() {
    let db = TestDb::create().await.unwrap();
    let store = PgStore::connect(&db.url, 8).await.unwrap();
    ready(&store).await;
    let at = now();
    create(&store, &spec_from("c", &["t"], StartFrom::New), at).await;
    let first: Vec<MessageId> = insert(&store, &["t", "t", "t", "t"], at).await.iter().map(|e| e.message_id).collect();
    store.relay_pass(10, at, false, &[]).await.unwrap();
    let second: Vec<MessageId> = insert(&store, &["t", "t"], at).await.iter().map(|e| e.message_id).collect();
    store.relay_pass(10, at, false, &[]).await.unwrap();
    let ranges: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.delivery_ranges WHERE state = 'pending'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(ranges, 2, "two passes, two pending ranges");
    for id in &first[..2] {
        let acked: bool =
            sqlx::query_scalar("SELECT outbox.ack('c', $1)").bind(id.0).fetch_one(store.pool()).await.unwrap();
        assert!(acked);
    }
    let want = [first[2], first[3], second[0], second[1]];
    for limit in [1, 2, 3, 100] {
        let mut got = Vec::new();
        let mut after = 0;
        for _ in 0..20 {
            let page = store
                .delivery_unacked_page(
                    "c",
                    &UnackedPageParams { kind: UnackedKind::Pending, after_seq: after, limit, scan: 100 },
                )
                .await
                .unwrap();
            got.extend(page.deliveries.iter().map(|d| d.message.message_id));
            match page.next_after_seq {
                Some(next) => after = next,
                None => break,
            }
        }
        assert_eq!(got, want, "pages of {limit}");
    }
    let stats = store.consumer_stats(Some("c"), false).await.unwrap();
    assert_eq!(stats[0].backlog, 4);
}

//! Acks: by id and by the seqs a stream holds, the transactional ack on each store, and
//! SQLite's acked ranges.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::domain::{Attempt, DeliveryState, StartFrom};
use crate::testing::{TestDb, TestSqlite};

on_every_store!(acks_with_the_seqs_a_stream_holds_apply_as_acks_by_id,);

/// A stream acks with the seqs of what it holds (`delivery_ack_held`): range-held and row-held
/// deliveries alike are acked once, what it names nothing of is left alone, and an ack by id
/// alone still works beside it.
async fn acks_with_the_seqs_a_stream_holds_apply_as_acks_by_id(store: SharedStore) {
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&*store, &spec_from("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&*store, &["t", "t", "t", "t", "t", "t"], at).await;
    let held = |i: usize| (sent[i].message_id, sent[i].seq);
    let until = at + chrono::Duration::seconds(30);
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 5, lease_until: until };
    assert_eq!(d.relay_pass(10, at, false, &[offer]).await.unwrap().pushed.len(), 5, "the sixth waits");
    // The second one nacked and leased again: a row of its own with count 2.
    let nack = Release {
        consumer: c.clone(),
        message_id: sent[1].message_id,
        state: DeliveryState::Pending,
        available_at: at,
        error: Some("refused".into()),
        attempt: Attempt::Failed,
    };
    assert_eq!(d.delivery_release_many(&[nack], ReleaseGuard::Session("s1"), at).await.unwrap(), 1);
    let again = d
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s1",
            limit: 1,
            keys_after: "",
            lease_until: until,
            now: at,
        })
        .await
        .unwrap();
    assert_eq!((again[0].message.message_id, again[0].delivery_count), (sent[1].message_id, 2));

    // Out of order, with a gap (the fourth is not acked): both runs of seqs are found.
    let acks = [held(2), held(0), held(1), held(4)];
    assert_eq!(d.delivery_ack_held(&c, &acks, at).await.unwrap(), 4);
    assert_eq!(d.delivery_ack_held(&c, &acks, at).await.unwrap(), 0, "an ack is applied once");
    for (i, count) in [(0, 1), (1, 2), (2, 1), (4, 1)] {
        assert_eq!(state_of(&*store, sent[i].message_id, "c").await, Some(("acked".to_owned(), count)), "message {i}");
    }
    assert_eq!(state_of(&*store, sent[3].message_id, "c").await, Some(("leased".to_owned(), 1)), "not named: held");
    assert_eq!(state_of(&*store, sent[5].message_id, "c").await, Some(("pending".to_owned(), 0)), "not named: waits");
    // Acks by id alone, of a pushed one and of one still waiting, beside them.
    assert_eq!(d.delivery_ack_many(&c, &[sent[3].message_id, sent[5].message_id], at).await.unwrap(), 2);
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].in_flight, stats[0].backlog, stats[0].acked), (0, 0, 6));
}

/// PostgreSQL only: the transactional ack of a delivery held in a leased range is applied once,
/// and the stream's later ack of it changes nothing.
#[tokio::test]
async fn a_postgres_transactional_ack_of_a_pushed_delivery_is_applied_once() {
    let db = TestDb::create().await.unwrap();
    let store = PgStore::connect(&db.url, 8).await.unwrap();
    ready(&store).await;
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&store, &spec_from("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&store, &["t", "t"], at).await;
    let offer = PushOffer {
        consumer: "c".into(),
        session: "s1".into(),
        room: 2,
        lease_until: at + chrono::Duration::seconds(30),
    };
    assert_eq!(d.relay_pass(10, at, false, &[offer]).await.unwrap().pushed.len(), 2);
    let ack = |id: MessageId| {
        let pool = store.pool().clone();
        async move { sqlx::query_scalar::<_, bool>("SELECT outbox.ack('c', $1)").bind(id.0).fetch_one(&pool).await.unwrap() }
    };
    let mut tx = store.pool().begin().await.unwrap();
    let first: bool =
        sqlx::query_scalar("SELECT outbox.ack('c', $1)").bind(sent[0].message_id.0).fetch_one(&mut *tx).await.unwrap();
    assert!(first);
    tx.rollback().await.unwrap();
    assert_eq!(
        state_of(&store, sent[0].message_id, "c").await,
        Some(("leased".to_owned(), 1)),
        "rolled back with its effect"
    );
    assert!(ack(sent[0].message_id).await);
    assert!(!ack(sent[0].message_id).await, "the second ack says already acked");
    assert_eq!(d.delivery_ack_many(&c, &[sent[0].message_id], at).await.unwrap(), 0);
    assert_eq!(state_of(&store, sent[0].message_id, "c").await, Some(("acked".to_owned(), 1)));
    // Acked over the stream first: the transactional ack says already acked.
    assert_eq!(d.delivery_ack_many(&c, &[sent[1].message_id], at).await.unwrap(), 1);
    assert!(!ack(sent[1].message_id).await);
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].in_flight, stats[0].acked), (0, 2));
}

/// SQLite only (T9, T10): the transactional ack, as docs/sql-api.md gives it and the clients
/// run it, in the consumer's own transaction: rolled back with it, applied once when it
/// commits, whether the delivery is pending (never sent) or leased; an acked delivery is never
/// leased again and is counted once.
#[tokio::test]
async fn a_sqlite_transactional_ack_applies_once_to_pending_and_leased_deliveries() {
    let db = TestSqlite::create().unwrap();
    let store = SqliteStore::open(&db.url).await.unwrap();
    ready(&store).await;
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&store, &spec_from("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&store, &["t", "t"], at).await;
    assert_eq!(d.relay_pass(10, at, false, &[]).await.unwrap().deliveries, 2);
    let leased = d
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s",
            limit: 1,
            keys_after: "",
            lease_until: at + chrono::Duration::seconds(30),
            now: at,
        })
        .await
        .unwrap();
    assert_eq!(leased.iter().map(|l| l.message.message_id).collect::<Vec<_>>(), [sent[0].message_id]);
    const ACK: &str = include_str!("../../../../contract/sql/sqlite-ack.sql");
    let ack = |id: MessageId| async move {
        let mut tx = d.pool().begin().await.unwrap();
        let n = sqlx::query(ACK)
            .bind("c")
            .bind(id.0.to_string())
            .bind(at.timestamp_micros())
            .execute(&mut *tx)
            .await
            .unwrap()
            .rows_affected();
        (tx, n)
    };
    for e in &sent {
        let (tx, n) = ack(e.message_id).await;
        assert_eq!(n, 1);
        tx.rollback().await.unwrap();
    }
    assert_eq!(state_of(&store, sent[0].message_id, "c").await, Some(("leased".to_owned(), 1)), "rolled back");
    assert_eq!(state_of(&store, sent[1].message_id, "c").await, Some(("pending".to_owned(), 0)), "rolled back");
    for e in &sent {
        let (tx, n) = ack(e.message_id).await;
        assert_eq!(n, 1);
        tx.commit().await.unwrap();
        let (tx, n) = ack(e.message_id).await;
        assert_eq!(n, 0, "already acked");
        tx.rollback().await.unwrap();
    }
    assert_eq!(state_of(&store, sent[0].message_id, "c").await, Some(("acked".to_owned(), 1)));
    assert_eq!(state_of(&store, sent[1].message_id, "c").await, Some(("acked".to_owned(), 0)));
    assert!(
        d.delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s",
            limit: 10,
            keys_after: "",
            lease_until: at + chrono::Duration::seconds(30),
            now: at
        })
        .await
        .unwrap()
        .is_empty()
    );
    assert_eq!(d.delivery_ack_many(&c, &[sent[0].message_id, sent[1].message_id], at).await.unwrap(), 0);
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].backlog, stats[0].in_flight, stats[0].acked), (0, 0, 2));
}

/// SQLite only (T8 and its readers, ADR 0070): a stream's ack of first deliveries that a range
/// can say (leased once, unkeyed, no error) moves them from rows to the consumer's acked ranges,
/// one range per run of consecutive seqs; a retried or keyed delivery stays a row. Every reader
/// sees them acked (GetMessage, the acked count, `outbox_inbox`), the documented transactional
/// ack answers "acked already", a replay makes a row that decides over the range and stays a
/// row when acked again (no overlapping range), and the prune removes the ranges with their
/// messages and counts each delivery once.
#[tokio::test]
async fn a_sqlite_streams_ack_of_first_deliveries_holds_them_in_acked_ranges() {
    let db = TestSqlite::create().unwrap();
    let store = SqliteStore::open(&db.url).await.unwrap();
    ready(&store).await;
    let d = &store;
    let at = now();
    let until = at + chrono::Duration::seconds(30);
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&store, &spec_from("c", &["t"], StartFrom::New), at).await;
    let mut sent = insert(&store, &["t", "t", "t", "t", "t", "t"], at).await;
    let keyed = NewMessage { ordering_key: Some("k".into()), ..msg("t") };
    sent.push(d.message_insert(&keyed, at).await.unwrap());
    let ids: Vec<MessageId> = sent.iter().map(|e| e.message_id).collect();
    let seqs: Vec<i64> = sent.iter().map(|e| e.seq).collect();
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 10, lease_until: until };
    assert_eq!(d.relay_pass(10, at, false, &[offer]).await.unwrap().pushed.len(), 6, "a keyed one waits as a row");
    // The sixth is nacked and leased again (a retry, so a row for good), with the keyed one.
    let nack = Release {
        consumer: c.clone(),
        message_id: ids[5],
        state: DeliveryState::Pending,
        available_at: at,
        error: Some("refused".into()),
        attempt: Attempt::Failed,
    };
    assert_eq!(d.delivery_release_many(&[nack], ReleaseGuard::Session("s1"), at).await.unwrap(), 1);
    let leased = d
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s1",
            limit: 10,
            keys_after: "",
            lease_until: until,
            now: at,
        })
        .await
        .unwrap();
    assert_eq!(
        leased.iter().map(|l| (l.message.message_id, l.delivery_count)).collect::<Vec<_>>(),
        [(ids[5], 2), (ids[6], 1)]
    );

    let acked = [ids[0], ids[1], ids[2], ids[4], ids[5], ids[6]];
    assert_eq!(d.delivery_ack_many(&c, &acked, at).await.unwrap(), 6);
    let ranges = || async {
        sqlx::query_as::<_, (i64, i64)>("SELECT lo, hi FROM outbox_acked_ranges WHERE consumer = 'c' ORDER BY lo")
            .fetch_all(d.pool())
            .await
            .unwrap()
    };
    assert_eq!(ranges().await, [(seqs[0], seqs[0] + 3), (seqs[4], seqs[4] + 1)], "one range per run");
    let rows: Vec<(String, String)> =
        sqlx::query_as("SELECT message_id, state FROM outbox_deliveries WHERE consumer = 'c' ORDER BY seq")
            .fetch_all(d.pool())
            .await
            .unwrap();
    let row = |i: usize, state: &str| (ids[i].0.to_string(), state.to_owned());
    assert_eq!(rows, [row(3, "leased"), row(5, "acked"), row(6, "acked")], "retried and keyed stay rows");
    for i in [0, 1, 2, 4] {
        assert_eq!(state_of(&store, ids[i], "c").await, Some(("acked".to_owned(), 1)), "message {i}");
    }
    let (_, timeline) = d.message_get(ids[0]).await.unwrap();
    assert_eq!(timeline.len(), 1);
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].in_flight, stats[0].backlog, stats[0].acked), (1, 0, 6));
    let inbox: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_inbox").fetch_one(d.pool()).await.unwrap();
    assert_eq!(inbox, 7, "one delivery per message, wherever it is held");

    // The documented transactional ack: acked already.
    let n = sqlx::query(include_str!("../../../../contract/sql/sqlite-ack.sql"))
        .bind("c")
        .bind(ids[1].0.to_string())
        .bind(at.timestamp_micros())
        .execute(d.pool())
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(n, 0, "acked already");
    assert_eq!(d.delivery_ack_many(&c, &[ids[1]], at).await.unwrap(), 0, "a second stream ack changes nothing");
    assert!(
        d.delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s1",
            limit: 10,
            keys_after: "",
            lease_until: until,
            now: at
        })
        .await
        .unwrap()
        .is_empty(),
        "nothing is due"
    );

    // A replay makes a row that decides over the range; acked again, it adds no range.
    assert_eq!(d.replay_apply(&c, &[ids[1]], at).await.unwrap(), 1);
    assert_eq!(state_of(&store, ids[1], "c").await, Some(("pending".to_owned(), 0)));
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].backlog, stats[0].acked), (1, 5));
    let again = d
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s1",
            limit: 10,
            keys_after: "",
            lease_until: until,
            now: at,
        })
        .await
        .unwrap();
    assert_eq!(again.iter().map(|l| (l.message.message_id, l.delivery_count)).collect::<Vec<_>>(), [(ids[1], 1)]);
    assert_eq!(d.delivery_ack_many(&c, &[ids[1], ids[3]], at).await.unwrap(), 2);
    assert_eq!(ranges().await, [(seqs[0], seqs[0] + 3), (seqs[3], seqs[3] + 1), (seqs[4], seqs[4] + 1)]);
    assert_eq!(state_of(&store, ids[1], "c").await, Some(("acked".to_owned(), 1)));
    let row: Option<i64> =
        sqlx::query_scalar("SELECT acked_at FROM outbox_deliveries WHERE consumer = 'c' AND message_id = ?1")
            .bind(ids[1].0.to_string())
            .fetch_optional(d.pool())
            .await
            .unwrap();
    assert_eq!(row, Some(at.timestamp_micros()), "the replayed delivery stays a row, acked by this ack");
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].in_flight, stats[0].backlog, stats[0].acked), (0, 0, 7));

    // The prune takes the ranges with their messages and counts every delivery once.
    let pruned = d.prune(at + chrono::Duration::seconds(1), 4).await.unwrap();
    assert_eq!((pruned.messages, pruned.deliveries), (7, 7));
    assert!(ranges().await.is_empty());
    let inbox: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_inbox").fetch_one(d.pool()).await.unwrap();
    assert_eq!(inbox, 0);
}

/// SQLite only (ADR 0070): a delivery made before the relay read its message (an `EARLIEST`
/// backfill, a replay by id) and acked by a stream stays a row, so the relay's pass, which
/// writes no delivery where a row is, does not deliver it again; duplicate ids in one ack write
/// no overlapping range and count each delivery once.
#[tokio::test]
async fn a_sqlite_stream_ack_before_the_relay_read_the_message_is_never_delivered_again() {
    let db = TestSqlite::create().unwrap();
    let store = SqliteStore::open(&db.url).await.unwrap();
    ready(&store).await;
    let d = &store;
    let at = now();
    let until = at + chrono::Duration::seconds(30);
    let c = ConsumerName::parse("name", "c").unwrap();
    let sent = insert(&store, &["t", "t", "t"], at).await;
    let ids: Vec<MessageId> = sent.iter().map(|e| e.message_id).collect();
    d.consumer_create(&spec_from("c", &["t"], StartFrom::Earliest), at).await.unwrap();
    let leased = d
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s1",
            limit: 10,
            keys_after: "",
            lease_until: until,
            now: at,
        })
        .await
        .unwrap();
    assert_eq!(leased.len(), 3, "backfilled before the relay read them");
    assert_eq!(d.delivery_ack_many(&c, &[ids[0], ids[1], ids[1], ids[2]], at).await.unwrap(), 3);
    let ranges: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_acked_ranges").fetch_one(d.pool()).await.unwrap();
    assert_eq!(ranges, 0, "above the relay cursor: rows");
    let out = d.relay_pass(10, at, false, &[]).await.unwrap();
    assert_eq!((out.messages, out.deliveries), (3, 0), "the relay meets the rows: no second delivery");
    for id in &ids {
        assert_eq!(state_of(&store, *id, "c").await, Some(("acked".to_owned(), 1)));
    }

    // Relayed now: pushed, acked with a duplicate id, one range, each counted once.
    let more = insert(&store, &["t", "t"], at).await;
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 10, lease_until: until };
    assert_eq!(d.relay_pass(10, at, false, &[offer]).await.unwrap().pushed.len(), 2);
    let (a, b) = (more[0].message_id, more[1].message_id);
    assert_eq!(d.delivery_ack_many(&c, &[a, b, b], at).await.unwrap(), 2);
    let ranges: Vec<(i64, i64)> =
        sqlx::query_as("SELECT lo, hi FROM outbox_acked_ranges").fetch_all(d.pool()).await.unwrap();
    assert_eq!(ranges, [(more[0].seq, more[1].seq + 1)]);
    assert!(d.relay_pass(10, at, false, &[]).await.unwrap().messages == 0);
    assert_eq!(d.consumer_stats(Some("c"), true).await.unwrap()[0].acked, 5);
    let pruned = d.prune(at + chrono::Duration::seconds(1), 100).await.unwrap();
    assert_eq!((pruned.messages, pruned.deliveries), (5, 5));
}

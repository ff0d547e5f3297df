//! Replay: the candidates it selects, and what it writes wherever a delivery was held.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::domain::{Attempt, DeliveryState, StartFrom};
use crate::testing::TestDb;

on_every_store!(
    delivery_replay_restarts_rows_but_never_a_held_lease,
    a_replayed_delivery_is_selected_written_and_counted_once_wherever_it_was,
);

async fn delivery_replay_restarts_rows_but_never_a_held_lease(store: SharedStore) {
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&*store, &spec_from("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&*store, &["t", "t", "t"], at).await;
    let ids: Vec<MessageId> = sent.iter().map(|e| e.message_id).collect();
    let mut tx = d.begin().await.unwrap();
    let mut conn_page = tx.message_page(0, 10).await.unwrap();
    conn_page.truncate(2);
    tx.delivery_insert_pending("c", &conn_page, at).await.unwrap();
    tx.commit().await.unwrap();

    // The first is acked, the second held by a stream, the third has no row at all.
    let held = d
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s1",
            limit: 2,
            keys_after: "",
            lease_until: at + chrono::Duration::seconds(30),
            now: at,
        })
        .await
        .unwrap();
    assert_eq!(held.len(), 2);
    assert_eq!(d.delivery_ack_many(&c, &ids[..1], at).await.unwrap(), 1);

    let mut tx = d.begin().await.unwrap();
    assert_eq!(tx.delivery_replay("c", &ids, at).await.unwrap(), 2, "the acked one and the missing one");
    tx.commit().await.unwrap();
    assert_eq!(state_of(&*store, ids[0], "c").await, Some(("pending".to_owned(), 0)));
    assert_eq!(state_of(&*store, ids[1], "c").await, Some(("leased".to_owned(), 1)), "left to its stream");
    assert_eq!(state_of(&*store, ids[2], "c").await, Some(("pending".to_owned(), 0)));
}

/// PostgreSQL only: a delivery acked in the consumer's transaction while its seq is still in
/// the stream's leased range is a candidate for replay, and its replay leaves the range: counted
/// once (backlog, not in flight), leased again from count 1 (T20).
#[tokio::test]
async fn a_postgres_replay_of_a_delivery_acked_in_a_leased_range_moves_it_out_of_the_range() {
    let db = TestDb::create().await.unwrap();
    let store = PgStore::connect(&db.url, 8).await.unwrap();
    ready(&store).await;
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&store, &spec_from("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&store, &["t", "t"], at).await;
    let until = at + chrono::Duration::seconds(30);
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 2, lease_until: until };
    assert_eq!(d.relay_pass(10, at, false, &[offer]).await.unwrap().pushed.len(), 2);
    let id = sent[0].message_id;
    let acked: bool =
        sqlx::query_scalar("SELECT outbox.ack('c', $1)").bind(id.0).fetch_one(store.pool()).await.unwrap();
    assert!(acked);
    let candidates = d
        .replay_candidates(&c, &ReplayCandidatesParams { filter: &ReplayFilter::default(), after_seq: 0, limit: 10 })
        .await
        .unwrap();
    assert_eq!(candidates.iter().map(|r| r.message_id).collect::<Vec<_>>(), [id], "not the one still leased");
    let mut tx = d.begin().await.unwrap();
    assert_eq!(tx.delivery_replay("c", &[id], at).await.unwrap(), 1);
    tx.commit().await.unwrap();
    let in_range: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(upper(r) - lower(r)), 0)::bigint FROM outbox.delivery_ranges b, unnest(b.seqs) r
          WHERE b.state = 'leased'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(in_range, 1, "only the other delivery is left in the range");
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].backlog, stats[0].in_flight, stats[0].acked), (1, 1, 0));
    let again = d
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s2",
            limit: 10,
            keys_after: "",
            lease_until: until,
            now: at,
        })
        .await
        .unwrap();
    assert_eq!(again.iter().map(|l| (l.message.message_id, l.delivery_count)).collect::<Vec<_>>(), [(id, 1)]);
    assert_eq!(d.delivery_ack_many(&c, &[id, sent[1].message_id], at).await.unwrap(), 2);
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].backlog, stats[0].in_flight, stats[0].acked), (0, 0, 2));
}

/// A replay selects and rewrites the same deliveries on both stores, whatever held them (on
/// PostgreSQL: an acked range, a pending range, a row), leaves a leased one alone, and from then on
/// the replayed delivery is in one place: counted once in every figure, leased once, acked once,
/// pruned once (T20, T22).
async fn a_replayed_delivery_is_selected_written_and_counted_once_wherever_it_was(store: SharedStore) {
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&*store, &spec_from("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&*store, &["t", "t", "t", "t", "t"], at).await;
    let ids: Vec<MessageId> = sent.iter().map(|e| e.message_id).collect();
    let until = at + chrono::Duration::seconds(30);
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 2, lease_until: until };
    assert_eq!(d.relay_pass(10, at, false, &[offer]).await.unwrap().pushed.len(), 2);
    // ids[0] acked by its stream, ids[1] still leased, ids[2] made a retry by a lease and a
    // nack, ids[3..] pending and never delivered.
    assert_eq!(d.delivery_ack_many(&c, &ids[..1], at).await.unwrap(), 1);
    let leased = d
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s2",
            limit: 1,
            keys_after: "",
            lease_until: until,
            now: at,
        })
        .await
        .unwrap();
    assert_eq!(leased.iter().map(|l| l.message.message_id).collect::<Vec<_>>(), [ids[2]]);
    let nack = Release {
        consumer: c.clone(),
        message_id: ids[2],
        state: DeliveryState::Pending,
        available_at: at,
        error: None,
        attempt: Attempt::Failed,
    };
    assert_eq!(d.delivery_release_many(&[nack], ReleaseGuard::Session("s2"), at).await.unwrap(), 1);
    assert_eq!(state_of(&*store, ids[2], "c").await, Some(("pending".to_owned(), 1)));

    let everything = ReplayFilter::default();
    let mut candidates: Vec<MessageId> = d
        .replay_candidates(&c, &ReplayCandidatesParams { filter: &everything, after_seq: 0, limit: 100 })
        .await
        .unwrap()
        .iter()
        .map(|r| r.message_id)
        .collect();
    candidates.sort_by_key(|m| m.0);
    let mut want = vec![ids[0], ids[2], ids[3], ids[4]];
    want.sort_by_key(|m| m.0);
    assert_eq!(candidates, want, "every delivery but the leased one");

    let mut tx = d.begin().await.unwrap();
    assert_eq!(tx.delivery_replay("c", &ids, at).await.unwrap(), 4, "all but the leased one");
    tx.commit().await.unwrap();
    assert_eq!(state_of(&*store, ids[0], "c").await, Some(("pending".to_owned(), 0)));
    assert_eq!(state_of(&*store, ids[1], "c").await, Some(("leased".to_owned(), 1)), "a lease is left alone");
    assert_eq!(state_of(&*store, ids[2], "c").await, Some(("pending".to_owned(), 0)), "a fresh count");
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!(
        (stats[0].backlog, stats[0].in_flight, stats[0].retrying, stats[0].acked),
        (4, 1, 0, 0),
        "each delivery in one place"
    );

    let mut again = d
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
    again.sort_by_key(|l| l.message.seq);
    let got: Vec<(MessageId, u32)> = again.iter().map(|l| (l.message.message_id, l.delivery_count)).collect();
    assert_eq!(got, [(ids[0], 1), (ids[2], 1), (ids[3], 1), (ids[4], 1)], "each once, from count 1");
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
    assert_eq!(d.delivery_ack_many(&c, &ids, at).await.unwrap(), 5);
    assert_eq!(d.delivery_ack_many(&c, &ids, at).await.unwrap(), 0);
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].backlog, stats[0].in_flight, stats[0].acked), (0, 0, 5), "acked once each");
    let pruned = d.prune_before(at + chrono::Duration::hours(1), 100).await.unwrap().unwrap();
    assert_eq!(pruned, Pruned { messages: 5, deliveries: 5 });
}

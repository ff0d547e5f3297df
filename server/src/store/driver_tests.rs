//! The per-method driver suite: each backend's statement (a required method of [`Store`] or of
//! its transaction, [`StoreTx`]), called directly, on a fresh PostgreSQL database and on a fresh
//! SQLite file, with the same cases (River's `riverdrivertest`). The store-level half of the conformance suite, through [`Store`], is in
//! `tests.rs`.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};

use super::records::MessageRef;
use super::*;
use crate::domain::{Attempt, Backoff, Consumer, ConsumerSpec, DeliveryState, StartFrom, Topic, TopicPattern};
use crate::testing::{TestDb, TestSqlite};

/// Runs each named case once per driver, as `on_postgres::NAME` and `on_sqlite::NAME`.
macro_rules! on_every_driver {
    ($($case:ident),* $(,)?) => {
        mod on_postgres {
            $(#[tokio::test]
            async fn $case() {
                let db = crate::testing::TestDb::create().await.unwrap();
                let store = super::PgStore::connect(&db.url, 8).await.unwrap();
                super::$case(store, db).await;
            })*
        }
        mod on_sqlite {
            $(#[tokio::test]
            async fn $case() {
                let db = crate::testing::TestSqlite::create().unwrap();
                let store = super::SqliteStore::open(&db.url).await.unwrap();
                super::$case(store, db).await;
            })*
        }
    };
}

on_every_driver!(
    consumer_insert_stores_the_spec_and_find_reads_it_back,
    consumer_delete_says_whether_there_was_one_and_rolls_back_with_its_transaction,
    consumer_set_paused_returns_the_row_or_none,
    message_insert_writes_once_per_id_and_message_find_reads_it,
    message_page_walks_the_log_in_seq_order,
    delivery_insert_pending_creates_only_missing_rows,
    delivery_replay_restarts_rows_but_never_a_held_lease,
    delivery_next_due_tells_a_missing_consumer_from_one_with_nothing_due,
    prune_batch_removes_finished_messages_before_the_cutoff_only,
    expired_records_carry_the_consumers_retry_policy,
    pushed_deliveries_ack_release_extend_and_expire_like_leased_ones,
    pending_deliveries_wait_in_seq_order_and_count_like_rows,
    acks_with_the_seqs_a_stream_holds_apply_as_acks_by_id,
    a_replayed_delivery_is_selected_written_and_counted_once_wherever_it_was,
    consumer_insert_records_its_creator_and_count_counts,
    console_sessions_are_found_touched_and_deleted_by_their_id_hash,
);

/// Keeps the database of a case alive for as long as the case runs.
trait Held: Send + 'static {}
impl Held for TestDb {}
impl Held for TestSqlite {}

fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(3)
}

fn spec(name: &str, topics: &[&str], start_from: StartFrom) -> ConsumerSpec {
    ConsumerSpec {
        name: ConsumerName::parse("name", name).unwrap(),
        topics: topics.iter().map(|t| TopicPattern::parse("topics", t).unwrap()).collect(),
        max_deliveries: 4,
        backoff: Backoff { base: Duration::from_millis(250), max: Duration::from_secs(90) },
        ack_deadline: Duration::from_secs(15),
        start_from,
        sink: None,
        dead_key_policy: Default::default(),
    }
}

fn msg(topic: &str) -> NewMessage {
    NewMessage {
        message_id: None,
        topic: Topic::parse("topic", topic).unwrap(),
        type_: "T".into(),
        payload: b"{}".to_vec(),
        headers: Default::default(),
        ordering_key: None,
        delay: None,
    }
}

async fn ready<S: Store>(store: &S) {
    store.migrate().await.unwrap();
}

async fn insert<S: Store>(store: &S, topics: &[&str], at: DateTime<Utc>) -> Vec<Enqueued> {
    let mut out = Vec::new();
    for t in topics {
        out.push(store.message_insert(&msg(t), at).await.unwrap());
    }
    out
}

async fn create<S: Store>(store: &S, spec: &ConsumerSpec, at: DateTime<Utc>) {
    let d = &store;
    let mut tx = d.begin_consumer_change().await.unwrap();
    tx.consumer_insert(spec, None, at).await.unwrap();
    tx.commit().await.unwrap();
}

async fn state_of<S: Store>(store: &S, id: MessageId, consumer: &str) -> Option<(String, i64)> {
    let rows = store.delivery_list_of_message(id).await.unwrap();
    rows.into_iter().find(|r| r.consumer == consumer).map(|r| (r.state, r.delivery_count))
}

async fn consumer_insert_stores_the_spec_and_find_reads_it_back<S: Store>(store: S, _db: impl Held) {
    ready(&store).await;
    let d = &store;
    let at = now();
    let sent = insert(&store, &["a.x", "a.y"], at).await;
    create(&store, &spec("fresh", &["a.*"], StartFrom::New), at).await;
    create(&store, &spec("all", &["a.>"], StartFrom::Earliest), at).await;

    let fresh = d.consumer_find("fresh").await.unwrap().unwrap();
    assert_eq!(fresh.start_seq, sent[1].seq, "NEW starts after the highest seq at creation");
    assert_eq!((fresh.max_deliveries, fresh.backoff_base_ms, fresh.backoff_max_ms), (4, 250, 90_000));
    assert_eq!((fresh.ack_deadline_ms, fresh.start_from.as_str()), (15_000, "new"));
    assert_eq!(fresh.topics, vec!["a.*".to_owned()]);
    assert!(!fresh.paused);
    assert_eq!(fresh.created_at, at);
    let decoded = Consumer::try_from(fresh).unwrap();
    assert_eq!(decoded.spec, spec("fresh", &["a.*"], StartFrom::New));

    let all = d.consumer_find("all").await.unwrap().unwrap();
    assert_eq!((all.start_seq, all.start_from.as_str()), (0, "earliest"));
    assert!(d.consumer_find("nobody").await.unwrap().is_none());
    let names: Vec<String> = d.consumer_list().await.unwrap().into_iter().map(|c| c.spec.name.to_string()).collect();
    assert_eq!(names, ["all", "fresh"], "in name order");
}

async fn consumer_delete_says_whether_there_was_one_and_rolls_back_with_its_transaction<S: Store>(
    store: S,
    _db: impl Held,
) {
    ready(&store).await;
    let d = &store;
    create(&store, &spec("c", &["t"], StartFrom::New), now()).await;

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

async fn consumer_set_paused_returns_the_row_or_none<S: Store>(store: S, _db: impl Held) {
    ready(&store).await;
    let d = &store;
    create(&store, &spec("c", &["t"], StartFrom::New), now()).await;
    let name = |n: &str| ConsumerName::parse("name", n).unwrap();
    assert!(d.consumer_set_paused(&name("c"), true).await.unwrap().paused);
    assert!(!d.consumer_set_paused(&name("c"), false).await.unwrap().paused);
    assert!(matches!(
        d.consumer_set_paused(&name("nobody"), true).await,
        Err(StoreError::ConsumerNotFound(n)) if n == "nobody"
    ));
}

async fn message_insert_writes_once_per_id_and_message_find_reads_it<S: Store>(store: S, _db: impl Held) {
    ready(&store).await;
    let d = &store;
    let at = now();
    let id = MessageId::generate();
    let mut m = msg("orders.created");
    m.message_id = Some(id);
    m.headers.insert("h".into(), "v".into());
    m.ordering_key = Some("k".into());

    let mut tx = d.begin().await.unwrap();
    let first = tx.message_insert(&m, at).await.unwrap();
    let again = tx.message_insert(&m, at).await.unwrap();
    tx.commit().await.unwrap();
    assert!(!first.duplicate);
    assert!(again.duplicate);
    assert_eq!((again.message_id, again.seq), (id, first.seq));
    assert!(d.message_insert(&m, at).await.unwrap().duplicate);
    assert_eq!(d.message_last_seq().await.unwrap(), first.seq, "the duplicates wrote nothing");

    let found = d.message_find(id).await.unwrap().unwrap();
    assert_eq!((found.topic.as_str(), found.type_.as_str()), ("orders.created", "T"));
    assert_eq!((found.payload.as_slice(), found.ordering_key.as_deref()), (&b"{}"[..], Some("k")));
    assert_eq!(found.headers.get("h").map(String::as_str), Some("v"));
    assert_eq!((found.enqueued_at, found.available_at), (at, at));
    assert!(d.message_find(MessageId::generate()).await.unwrap().is_none());
}

async fn message_page_walks_the_log_in_seq_order<S: Store>(store: S, _db: impl Held) {
    ready(&store).await;
    let d = &store;
    let at = now();
    let sent = insert(&store, &["a", "b", "c", "d", "e"], at).await;
    let mut delayed = msg("f");
    delayed.delay = Some(Duration::from_secs(60));
    let late = d.message_insert(&delayed, at).await.unwrap();

    let mut conn = d.begin().await.unwrap();
    let mut seen: Vec<MessageRef> = Vec::new();
    let mut after = 0;
    loop {
        let page = conn.message_page(after, 2).await.unwrap();
        assert!(page.len() <= 2);
        let Some(last) = page.last() else { break };
        after = last.seq;
        seen.extend(page);
    }
    let topics: Vec<&str> = seen.iter().map(|m| m.topic.as_str()).collect();
    assert_eq!(topics, ["a", "b", "c", "d", "e", "f"]);
    assert!(seen.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(seen[0].message_id, sent[0].message_id);
    assert_eq!(seen[0].available_at, at, "due at once without a delay");
    assert_eq!(seen[5].message_id, late.message_id);
    assert_eq!(seen[5].available_at, at + chrono::Duration::seconds(60));
}

async fn delivery_insert_pending_creates_only_missing_rows<S: Store>(store: S, _db: impl Held) {
    ready(&store).await;
    let d = &store;
    let at = now();
    let sent = insert(&store, &["t", "t", "t"], at).await;
    create(&store, &spec("c", &["t"], StartFrom::Earliest), at).await;
    let mut conn = d.begin().await.unwrap();
    let page = conn.message_page(0, 10).await.unwrap();
    drop(conn);

    let mut tx = d.begin().await.unwrap();
    assert_eq!(tx.delivery_insert_pending("c", &page[..2], at).await.unwrap(), 2);
    assert_eq!(tx.delivery_insert_pending("c", &page, at).await.unwrap(), 1, "only the missing one");
    assert_eq!(tx.delivery_insert_pending("c", &[], at).await.unwrap(), 0);
    tx.commit().await.unwrap();
    for e in &sent {
        assert_eq!(state_of(&store, e.message_id, "c").await, Some(("pending".to_owned(), 0)));
    }
}

async fn delivery_replay_restarts_rows_but_never_a_held_lease<S: Store>(store: S, _db: impl Held) {
    ready(&store).await;
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&store, &spec("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&store, &["t", "t", "t"], at).await;
    let ids: Vec<MessageId> = sent.iter().map(|e| e.message_id).collect();
    let mut tx = d.begin().await.unwrap();
    let mut conn_page = tx.message_page(0, 10).await.unwrap();
    conn_page.truncate(2);
    tx.delivery_insert_pending("c", &conn_page, at).await.unwrap();
    tx.commit().await.unwrap();

    // The first is acked, the second held by a stream, the third has no row at all.
    let held = d.delivery_lease_batch(&c, "s1", 2, "", at + chrono::Duration::seconds(30), at).await.unwrap();
    assert_eq!(held.len(), 2);
    assert_eq!(d.delivery_ack_many(&c, &ids[..1], at).await.unwrap(), 1);

    let mut tx = d.begin().await.unwrap();
    assert_eq!(tx.delivery_replay("c", &ids, at).await.unwrap(), 2, "the acked one and the missing one");
    tx.commit().await.unwrap();
    assert_eq!(state_of(&store, ids[0], "c").await, Some(("pending".to_owned(), 0)));
    assert_eq!(state_of(&store, ids[1], "c").await, Some(("leased".to_owned(), 1)), "left to its stream");
    assert_eq!(state_of(&store, ids[2], "c").await, Some(("pending".to_owned(), 0)));
}

async fn delivery_next_due_tells_a_missing_consumer_from_one_with_nothing_due<S: Store>(store: S, _db: impl Held) {
    ready(&store).await;
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    assert!(matches!(d.delivery_next_due(&c).await, Err(StoreError::ConsumerNotFound(n)) if n == "c"));
    create(&store, &spec("c", &["t"], StartFrom::Earliest), at).await;
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

async fn prune_batch_removes_finished_messages_before_the_cutoff_only<S: Store>(store: S, _db: impl Held) {
    ready(&store).await;
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&store, &spec("c", &["t"], StartFrom::New), at).await;
    // acked, pending, nobody's.
    let sent = insert(&store, &["t", "t", "other"], at).await;
    let unrelayed = insert(&store, &["other"], at + chrono::Duration::seconds(1)).await;
    assert_eq!(d.relay_batch(3, at, false, &[]).await.unwrap().messages, 3);
    assert_eq!(d.delivery_ack_many(&c, &[sent[0].message_id], at).await.unwrap(), 1);

    let later = at + chrono::Duration::hours(1);
    assert_eq!(
        d.prune_batch(at, 10).await.unwrap(),
        Some(Pruned::default()),
        "nothing is older than a cutoff at its own enqueue time"
    );
    // The acked one and nobody's, whichever comes first (same enqueue time), one per batch.
    let first = d.prune_batch(later, 1).await.unwrap().unwrap();
    let second = d.prune_batch(later, 10).await.unwrap().unwrap();
    assert_eq!((first.messages, second.messages), (1, 1));
    assert_eq!(first.deliveries + second.deliveries, 1, "the acked row goes with its message");
    assert_eq!(d.prune_batch(later, 10).await.unwrap(), Some(Pruned::default()));
    assert!(d.message_find(sent[0].message_id).await.unwrap().is_none());
    assert!(d.message_find(sent[2].message_id).await.unwrap().is_none());
    assert!(d.message_find(sent[1].message_id).await.unwrap().is_some(), "still pending for c");
    assert!(d.message_find(unrelayed[0].message_id).await.unwrap().is_some(), "not relayed yet");
}

async fn expired_records_carry_the_consumers_retry_policy<S: Store>(store: S, _db: impl Held) {
    ready(&store).await;
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&store, &spec("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&store, &["t", "t"], at).await;
    d.relay_batch(10, at, false, &[]).await.unwrap();
    let soon = at + chrono::Duration::seconds(1);
    assert_eq!(d.delivery_lease_batch(&c, "s", 1, "", soon, at).await.unwrap().len(), 1);
    assert_eq!(d.delivery_next_expiry().await.unwrap(), Some(soon));
    assert!(d.delivery_expired_batch(at, 10).await.unwrap().is_empty(), "not yet");

    let expired = d.delivery_expired_batch(soon, 10).await.unwrap();
    assert_eq!(expired.len(), 1);
    let e = &expired[0];
    assert_eq!((e.consumer.as_str(), e.message_id), ("c", sent[0].message_id));
    assert_eq!((e.delivery_count, e.retry.max_deliveries), (1, 4));
    assert_eq!((e.retry.backoff.base, e.retry.backoff.max), (Duration::from_millis(250), Duration::from_secs(90)));
}

/// A stream acks with the seqs of what it holds (`delivery_ack_held`): batch-held and row-held
/// deliveries alike are acked once, what it names nothing of is left alone, and an ack by id
/// alone still works beside it.
async fn acks_with_the_seqs_a_stream_holds_apply_as_acks_by_id<S: Store>(store: S, _db: impl Held) {
    ready(&store).await;
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&store, &spec("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&store, &["t", "t", "t", "t", "t", "t"], at).await;
    let held = |i: usize| (sent[i].message_id, sent[i].seq);
    let until = at + chrono::Duration::seconds(30);
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 5, lease_until: until };
    assert_eq!(d.relay_batch(10, at, false, &[offer]).await.unwrap().pushed.len(), 5, "the sixth waits");
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
    let again = d.delivery_lease_batch(&c, "s1", 1, "", until, at).await.unwrap();
    assert_eq!((again[0].message.message_id, again[0].delivery_count), (sent[1].message_id, 2));

    // Out of order, with a gap (the fourth is not acked): both runs of seqs are found.
    let acks = [held(2), held(0), held(1), held(4)];
    assert_eq!(d.delivery_ack_held(&c, &acks, at).await.unwrap(), 4);
    assert_eq!(d.delivery_ack_held(&c, &acks, at).await.unwrap(), 0, "an ack is applied once");
    for (i, count) in [(0, 1), (1, 2), (2, 1), (4, 1)] {
        assert_eq!(state_of(&store, sent[i].message_id, "c").await, Some(("acked".to_owned(), count)), "message {i}");
    }
    assert_eq!(state_of(&store, sent[3].message_id, "c").await, Some(("leased".to_owned(), 1)), "not named: held");
    assert_eq!(state_of(&store, sent[5].message_id, "c").await, Some(("pending".to_owned(), 0)), "not named: waits");
    // Acks by id alone, of a pushed one and of one still waiting, beside them.
    assert_eq!(d.delivery_ack_many(&c, &[sent[3].message_id, sent[5].message_id], at).await.unwrap(), 2);
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].in_flight, stats[0].backlog, stats[0].acked), (0, 0, 6));
}

/// A delivery pushed at fan-out is leased with count 1 (on PostgreSQL held in a lease batch, with
/// no row of its own: ADR 0041) and goes through every transition as a leased row does.
async fn pushed_deliveries_ack_release_extend_and_expire_like_leased_ones<S: Store>(store: S, _db: impl Held) {
    ready(&store).await;
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&store, &spec("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&store, &["t", "t", "t", "t"], at).await;
    let ids: Vec<MessageId> = sent.iter().map(|e| e.message_id).collect();
    let until = at + chrono::Duration::seconds(30);
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 4, lease_until: until };
    let out = d.relay_batch(10, at, false, &[offer]).await.unwrap();
    assert_eq!(out.pushed.len(), 4);
    assert!(
        out.pushed.iter().all(|(c, s, l)| c == "c" && s == "s1" && l.delivery_count == 1 && l.message.payload == b"{}")
    );
    for id in &ids {
        assert_eq!(state_of(&store, *id, "c").await, Some(("leased".to_owned(), 1)));
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
    assert_eq!(state_of(&store, ids[1], "c").await, Some(("pending".to_owned(), 1)));
    assert_eq!(d.delivery_ack_many(&c, &ids[1..2], at).await.unwrap(), 1, "a late ack of a released one counts");

    // Extended by its session, and only the one named: the delivery pushed beside it keeps its
    // deadline (on PostgreSQL the two share a lease batch). Past each deadline the sweeper
    // finds what expired, count 1.
    let later = until + chrono::Duration::seconds(10);
    assert_eq!(d.delivery_extend_many(&c, "s2", &ids[2..3], later, at).await.unwrap(), 0, "not s2's");
    assert_eq!(d.delivery_extend_many(&c, "s1", &ids[2..3], later, at).await.unwrap(), 1);
    assert_eq!(d.delivery_extend_many(&c, "s1", &ids[2..3], later, at).await.unwrap(), 1, "again, as a row");
    assert_eq!(d.delivery_next_expiry().await.unwrap(), Some(until), "the other one keeps its deadline");
    let first: Vec<MessageId> =
        d.delivery_expired_batch(until, 10).await.unwrap().iter().map(|e| e.message_id).collect();
    assert_eq!(first, [ids[3]], "only the one not extended");
    let timeline = d.delivery_list_of_message(ids[2]).await.unwrap();
    assert_eq!((timeline[0].state.as_str(), timeline[0].lease_expires_at), ("leased", Some(later)));
    let mut expired = d.delivery_expired_batch(later, 10).await.unwrap();
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
    let again = d.delivery_lease_batch(&c, "s3", 10, "", later + chrono::Duration::seconds(30), later).await.unwrap();
    assert_eq!(again.len(), 2);
    assert!(again.iter().all(|l| l.delivery_count == 2), "{again:?}");
}

/// PostgreSQL only: the transactional ack of a delivery held in a lease batch is applied once,
/// and the stream's later ack of it changes nothing.
#[tokio::test]
async fn a_postgres_transactional_ack_of_a_pushed_delivery_is_applied_once() {
    let db = TestDb::create().await.unwrap();
    let store = PgStore::connect(&db.url, 8).await.unwrap();
    ready(&store).await;
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&store, &spec("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&store, &["t", "t"], at).await;
    let offer = PushOffer {
        consumer: "c".into(),
        session: "s1".into(),
        room: 2,
        lease_until: at + chrono::Duration::seconds(30),
    };
    assert_eq!(d.relay_batch(10, at, false, &[offer]).await.unwrap().pushed.len(), 2);
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

/// PostgreSQL only: a delivery acked in the consumer's transaction while its seq is still in
/// the stream's lease batch is a candidate for replay, and its replay leaves the batch: counted
/// once (backlog, not in flight), leased again from count 1 (T20).
#[tokio::test]
async fn a_postgres_replay_of_a_delivery_acked_while_batched_moves_it_out_of_the_batch() {
    let db = TestDb::create().await.unwrap();
    let store = PgStore::connect(&db.url, 8).await.unwrap();
    ready(&store).await;
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&store, &spec("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&store, &["t", "t"], at).await;
    let until = at + chrono::Duration::seconds(30);
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 2, lease_until: until };
    assert_eq!(d.relay_batch(10, at, false, &[offer]).await.unwrap().pushed.len(), 2);
    let id = sent[0].message_id;
    let acked: bool =
        sqlx::query_scalar("SELECT outbox.ack('c', $1)").bind(id.0).fetch_one(store.pool()).await.unwrap();
    assert!(acked);
    let candidates = d.replay_candidates(&c, &ReplayFilter::default(), 0, 10).await.unwrap();
    assert_eq!(candidates.iter().map(|r| r.message_id).collect::<Vec<_>>(), [id], "not the one still leased");
    let mut tx = d.begin().await.unwrap();
    assert_eq!(tx.delivery_replay("c", &[id], at).await.unwrap(), 1);
    tx.commit().await.unwrap();
    let batched: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(upper(r) - lower(r)), 0)::bigint FROM outbox.delivery_ranges b, unnest(b.seqs) r
          WHERE b.state = 'leased'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(batched, 1, "only the other delivery is left in the batch");
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].backlog, stats[0].in_flight, stats[0].acked), (1, 1, 0));
    let again = d.delivery_lease_batch(&c, "s2", 10, "", until, at).await.unwrap();
    assert_eq!(again.iter().map(|l| (l.message.message_id, l.delivery_count)).collect::<Vec<_>>(), [(id, 1)]);
    assert_eq!(d.delivery_ack_many(&c, &[id, sent[1].message_id], at).await.unwrap(), 2);
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].backlog, stats[0].in_flight, stats[0].acked), (0, 0, 2));
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
    create(&store, &spec("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&store, &["t", "t"], at).await;
    assert_eq!(d.relay_batch(10, at, false, &[]).await.unwrap().deliveries, 2);
    let leased = d.delivery_lease_batch(&c, "s", 1, "", at + chrono::Duration::seconds(30), at).await.unwrap();
    assert_eq!(leased.iter().map(|l| l.message.message_id).collect::<Vec<_>>(), [sent[0].message_id]);
    const ACK: &str = include_str!("../../../contract/sql/sqlite-ack.sql");
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
    assert!(d.delivery_lease_batch(&c, "s", 10, "", at + chrono::Duration::seconds(30), at).await.unwrap().is_empty());
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
    create(&store, &spec("c", &["t"], StartFrom::New), at).await;
    let mut sent = insert(&store, &["t", "t", "t", "t", "t", "t"], at).await;
    let keyed = NewMessage { ordering_key: Some("k".into()), ..msg("t") };
    sent.push(d.message_insert(&keyed, at).await.unwrap());
    let ids: Vec<MessageId> = sent.iter().map(|e| e.message_id).collect();
    let seqs: Vec<i64> = sent.iter().map(|e| e.seq).collect();
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 10, lease_until: until };
    assert_eq!(d.relay_batch(10, at, false, &[offer]).await.unwrap().pushed.len(), 6, "a keyed one waits as a row");
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
    let leased = d.delivery_lease_batch(&c, "s1", 10, "", until, at).await.unwrap();
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
    let n = sqlx::query(include_str!("../../../contract/sql/sqlite-ack.sql"))
        .bind("c")
        .bind(ids[1].0.to_string())
        .bind(at.timestamp_micros())
        .execute(d.pool())
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(n, 0, "acked already");
    assert_eq!(d.delivery_ack_many(&c, &[ids[1]], at).await.unwrap(), 0, "a second stream ack changes nothing");
    assert!(d.delivery_lease_batch(&c, "s1", 10, "", until, at).await.unwrap().is_empty(), "nothing is due");

    // A replay makes a row that decides over the range; acked again, it adds no range.
    assert_eq!(d.replay_apply(&c, &[ids[1]], at).await.unwrap(), 1);
    assert_eq!(state_of(&store, ids[1], "c").await, Some(("pending".to_owned(), 0)));
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].backlog, stats[0].acked), (1, 5));
    let again = d.delivery_lease_batch(&c, "s1", 10, "", until, at).await.unwrap();
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
    d.consumer_create(&spec("c", &["t"], StartFrom::Earliest), at).await.unwrap();
    let leased = d.delivery_lease_batch(&c, "s1", 10, "", until, at).await.unwrap();
    assert_eq!(leased.len(), 3, "backfilled before the relay read them");
    assert_eq!(d.delivery_ack_many(&c, &[ids[0], ids[1], ids[1], ids[2]], at).await.unwrap(), 3);
    let ranges: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_acked_ranges").fetch_one(d.pool()).await.unwrap();
    assert_eq!(ranges, 0, "above the relay cursor: rows");
    let out = d.relay_batch(10, at, false, &[]).await.unwrap();
    assert_eq!((out.messages, out.deliveries), (3, 0), "the relay meets the rows: no second delivery");
    for id in &ids {
        assert_eq!(state_of(&store, *id, "c").await, Some(("acked".to_owned(), 1)));
    }

    // Relayed now: pushed, acked with a duplicate id, one range, each counted once.
    let more = insert(&store, &["t", "t"], at).await;
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 10, lease_until: until };
    assert_eq!(d.relay_batch(10, at, false, &[offer]).await.unwrap().pushed.len(), 2);
    let (a, b) = (more[0].message_id, more[1].message_id);
    assert_eq!(d.delivery_ack_many(&c, &[a, b, b], at).await.unwrap(), 2);
    let ranges: Vec<(i64, i64)> =
        sqlx::query_as("SELECT lo, hi FROM outbox_acked_ranges").fetch_all(d.pool()).await.unwrap();
    assert_eq!(ranges, [(more[0].seq, more[1].seq + 1)]);
    assert!(d.relay_batch(10, at, false, &[]).await.unwrap().messages == 0);
    assert_eq!(d.consumer_stats(Some("c"), true).await.unwrap()[0].acked, 5);
    let pruned = d.prune(at + chrono::Duration::seconds(1), 100).await.unwrap();
    assert_eq!((pruned.messages, pruned.deliveries), (5, 5));
}

/// Deliveries the relay cannot push (no room) are pending with count 0 (on PostgreSQL held in
/// pending batches, with no row of their own: ADR 0042): counted as backlog, due, kept from
/// pruning, leased in seq order with count 1, and from then on like any lease.
async fn pending_deliveries_wait_in_seq_order_and_count_like_rows<S: Store>(store: S, _db: impl Held) {
    ready(&store).await;
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&store, &spec("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&store, &["t", "t", "t", "t", "t"], at).await;
    let ids: Vec<MessageId> = sent.iter().map(|e| e.message_id).collect();
    let until = at + chrono::Duration::seconds(30);
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 2, lease_until: until };
    let out = d.relay_batch(10, at, false, &[offer]).await.unwrap();
    assert_eq!((out.pushed.len(), out.deliveries), (2, 5));
    assert_eq!(out.consumers, ["c"], "the consumer with pending work is woken");
    for id in &ids[2..] {
        assert_eq!(state_of(&store, *id, "c").await, Some(("pending".to_owned(), 0)));
    }
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].in_flight, stats[0].backlog, stats[0].retrying), (2, 3, 0));
    assert_eq!(stats[0].oldest_unacked_at, Some(at));
    let due = d.delivery_next_due(&c).await.unwrap().unwrap();
    assert!(due <= at, "due since it was relayed: {due}");
    assert_eq!(d.prune_batch(at + chrono::Duration::hours(1), 10).await.unwrap(), Some(Pruned::default()));

    // The lowest seqs first, count 1, and no more than asked.
    let first = d.delivery_lease_batch(&c, "s2", 2, "", until, at).await.unwrap();
    assert_eq!(first.iter().map(|l| l.message.message_id).collect::<Vec<_>>(), ids[2..4]);
    assert!(first.iter().all(|l| l.delivery_count == 1 && l.message.payload == b"{}" && l.lease_expires_at == until));
    assert_eq!(state_of(&store, ids[2], "c").await, Some(("leased".to_owned(), 1)));
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
    assert_eq!(state_of(&store, ids[2], "c").await, Some(("pending".to_owned(), 1)));
    let mut next = d.delivery_lease_batch(&c, "s3", 10, "", until, at).await.unwrap();
    next.sort_by_key(|l| l.message.seq);
    let got: Vec<(MessageId, u32)> = next.iter().map(|l| (l.message.message_id, l.delivery_count)).collect();
    assert_eq!(got, [(ids[2], 2), (ids[4], 1)]);
    assert!(d.delivery_lease_batch(&c, "s3", 10, "", until, at).await.unwrap().is_empty(), "nothing twice");
    assert_eq!(d.delivery_next_due(&c).await.unwrap(), None);

    // Every one acked once.
    assert_eq!(d.delivery_ack_many(&c, &ids, at).await.unwrap(), 5);
    assert_eq!(d.delivery_ack_many(&c, &ids, at).await.unwrap(), 0);
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].in_flight, stats[0].backlog, stats[0].acked), (0, 0, 5));
    assert_eq!(stats[0].oldest_unacked_at, None);
    assert_eq!(state_of(&store, ids[4], "c").await, Some(("acked".to_owned(), 1)));
}

/// PostgreSQL only: a row of its own wins over a pending batch. A message acked in the
/// consumer's transaction, acked by a stream it was never sent to, or replayed while it waits
/// is never leased from the batch; deleting the consumer takes its batches with it.
#[tokio::test]
async fn a_postgres_pending_batch_yields_to_rows_of_its_own() {
    let db = TestDb::create().await.unwrap();
    let store = PgStore::connect(&db.url, 8).await.unwrap();
    ready(&store).await;
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&store, &spec("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&store, &["t", "t", "t", "t", "nobodys"], at).await;
    let ids: Vec<MessageId> = sent[..4].iter().map(|e| e.message_id).collect();
    assert_eq!(d.relay_batch(10, at, false, &[]).await.unwrap().deliveries, 4);
    let pruned = d.prune_batch(at + chrono::Duration::hours(1), 10).await.unwrap().unwrap();
    assert_eq!(pruned.messages, 1, "a waiting backlog holds back its own messages only");
    assert!(d.message_find(sent[4].message_id).await.unwrap().is_none());
    let batches: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.delivery_ranges WHERE state = 'pending'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(batches, 1, "one pending batch, no row per message");
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

    let leased = d.delivery_lease_batch(&c, "s", 10, "", at + chrono::Duration::seconds(30), at).await.unwrap();
    assert_eq!(leased.iter().map(|l| l.message.message_id).collect::<Vec<_>>(), ids[2..], "never the acked ones");
    assert_eq!(d.delivery_ack_many(&c, &ids[2..], at).await.unwrap(), 2);

    // A replay of an acked one and of a newer one that waits in a batch: each once.
    let more = insert(&store, &["t"], at).await;
    assert_eq!(d.relay_batch(10, at, false, &[]).await.unwrap().deliveries, 1);
    let mut tx = d.begin().await.unwrap();
    assert_eq!(
        tx.delivery_replay("c", &[ids[2], more[0].message_id], at).await.unwrap(),
        2,
        "the waiting one leaves its batch for a row, as on SQLite"
    );
    tx.commit().await.unwrap();
    let mut again = d.delivery_lease_batch(&c, "s", 10, "", at + chrono::Duration::seconds(30), at).await.unwrap();
    again.sort_by_key(|l| l.message.seq);
    let got: Vec<(MessageId, u32)> = again.iter().map(|l| (l.message.message_id, l.delivery_count)).collect();
    assert_eq!(got, [(ids[2], 1), (more[0].message_id, 1)]);

    let held: Vec<MessageId> = again.iter().map(|l| l.message.message_id).collect();
    assert_eq!(d.delivery_ack_many(&c, &held, at).await.unwrap(), 2);

    // Acked in the consumer's transaction while it waits, and never leased: the prune folds the
    // acked row into the batch and takes the message.
    let waiting = insert(&store, &["t"], at).await;
    d.relay_batch(10, at, false, &[]).await.unwrap();
    let acked: bool = sqlx::query_scalar("SELECT outbox.ack('c', $1)")
        .bind(waiting[0].message_id.0)
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(acked);
    let pruned = d.prune_batch(at + chrono::Duration::hours(1), 100).await.unwrap().unwrap();
    assert!(pruned.messages >= 1, "{pruned:?}");
    assert!(d.message_find(waiting[0].message_id).await.unwrap().is_none(), "pruned though never leased");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.delivery_ranges WHERE state = 'pending'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(left, 0, "the folded batch is gone");

    let another = insert(&store, &["t"], at).await;
    d.relay_batch(10, at, false, &[]).await.unwrap();
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
    create(&store, &spec("c", &["t"], StartFrom::New), at).await;
    let first: Vec<MessageId> = insert(&store, &["t", "t", "t", "t"], at).await.iter().map(|e| e.message_id).collect();
    store.relay_batch(10, at, false, &[]).await.unwrap();
    let second: Vec<MessageId> = insert(&store, &["t", "t"], at).await.iter().map(|e| e.message_id).collect();
    store.relay_batch(10, at, false, &[]).await.unwrap();
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
            let page = store.delivery_unacked_page("c", UnackedKind::Pending, after, limit, 100).await.unwrap();
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

#[tokio::test]
async fn a_postgres_prune_batch_yields_to_the_replica_that_holds_the_prune_lock() {
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
    assert_eq!(store.prune_batch(later, 10).await.unwrap(), None, "another replica is pruning");
    other.rollback().await.unwrap();
    assert_eq!(store.prune_batch(later, 10).await.unwrap(), Some(Pruned::default()));
}

/// A replay selects and rewrites the same deliveries on both stores, whatever held them (on
/// PostgreSQL: the ack log, a pending batch, a row), leaves a leased one alone, and from then on
/// the replayed delivery is in one place: counted once in every figure, leased once, acked once,
/// pruned once (T20, T22).
async fn a_replayed_delivery_is_selected_written_and_counted_once_wherever_it_was<S: Store>(store: S, _db: impl Held) {
    ready(&store).await;
    let d = &store;
    let at = now();
    let c = ConsumerName::parse("name", "c").unwrap();
    create(&store, &spec("c", &["t"], StartFrom::New), at).await;
    let sent = insert(&store, &["t", "t", "t", "t", "t"], at).await;
    let ids: Vec<MessageId> = sent.iter().map(|e| e.message_id).collect();
    let until = at + chrono::Duration::seconds(30);
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 2, lease_until: until };
    assert_eq!(d.relay_batch(10, at, false, &[offer]).await.unwrap().pushed.len(), 2);
    // ids[0] acked by its stream, ids[1] still leased, ids[2] made a retry by a lease and a
    // nack, ids[3..] pending and never delivered.
    assert_eq!(d.delivery_ack_many(&c, &ids[..1], at).await.unwrap(), 1);
    let leased = d.delivery_lease_batch(&c, "s2", 1, "", until, at).await.unwrap();
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
    assert_eq!(state_of(&store, ids[2], "c").await, Some(("pending".to_owned(), 1)));

    let everything = ReplayFilter::default();
    let mut candidates: Vec<MessageId> =
        d.replay_candidates(&c, &everything, 0, 100).await.unwrap().iter().map(|r| r.message_id).collect();
    candidates.sort_by_key(|m| m.0);
    let mut want = vec![ids[0], ids[2], ids[3], ids[4]];
    want.sort_by_key(|m| m.0);
    assert_eq!(candidates, want, "every delivery but the leased one");

    let mut tx = d.begin().await.unwrap();
    assert_eq!(tx.delivery_replay("c", &ids, at).await.unwrap(), 4, "all but the leased one");
    tx.commit().await.unwrap();
    assert_eq!(state_of(&store, ids[0], "c").await, Some(("pending".to_owned(), 0)));
    assert_eq!(state_of(&store, ids[1], "c").await, Some(("leased".to_owned(), 1)), "a lease is left alone");
    assert_eq!(state_of(&store, ids[2], "c").await, Some(("pending".to_owned(), 0)), "a fresh count");
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!(
        (stats[0].backlog, stats[0].in_flight, stats[0].retrying, stats[0].acked),
        (4, 1, 0, 0),
        "each delivery in one place"
    );

    let mut again = d.delivery_lease_batch(&c, "s3", 10, "", until, at).await.unwrap();
    again.sort_by_key(|l| l.message.seq);
    let got: Vec<(MessageId, u32)> = again.iter().map(|l| (l.message.message_id, l.delivery_count)).collect();
    assert_eq!(got, [(ids[0], 1), (ids[2], 1), (ids[3], 1), (ids[4], 1)], "each once, from count 1");
    assert!(d.delivery_lease_batch(&c, "s3", 10, "", until, at).await.unwrap().is_empty(), "nothing twice");
    assert_eq!(d.delivery_ack_many(&c, &ids, at).await.unwrap(), 5);
    assert_eq!(d.delivery_ack_many(&c, &ids, at).await.unwrap(), 0);
    let stats = d.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].backlog, stats[0].in_flight, stats[0].acked), (0, 0, 5), "acked once each");
    let pruned = d.prune_batch(at + chrono::Duration::hours(1), 100).await.unwrap().unwrap();
    assert_eq!(pruned, Pruned { messages: 5, deliveries: 5 });
}

async fn consumer_insert_records_its_creator_and_count_counts<S: Store>(store: S, _db: impl Held) {
    ready(&store).await;
    let at = now();
    let mut tx = store.begin_consumer_change().await.unwrap();
    assert_eq!(tx.consumer_count().await.unwrap(), 0);
    tx.consumer_insert(&spec("owned", &["a.*"], StartFrom::New), Some("payments"), at).await.unwrap();
    tx.consumer_insert(&spec("unowned", &["a.*"], StartFrom::New), None, at).await.unwrap();
    assert_eq!(tx.consumer_count().await.unwrap(), 2, "its own inserts, inside the transaction");
    tx.commit().await.unwrap();
    assert_eq!(store.consumer_find("owned").await.unwrap().unwrap().created_by.as_deref(), Some("payments"));
    assert_eq!(store.consumer_find("unowned").await.unwrap().unwrap().created_by, None);
    let listed: Vec<_> = store.consumer_list().await.unwrap().into_iter().map(|c| c.created_by).collect();
    assert_eq!(listed, [Some("payments".to_owned()), None]);
}

async fn console_sessions_are_found_touched_and_deleted_by_their_id_hash<S: Store>(store: S, _db: impl Held) {
    ready(&store).await;
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

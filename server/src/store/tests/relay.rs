//! A relay pass on both stores: what it fans out to whom, what it pushes into offered room, and
//! (PostgreSQL) its cursor, gaps and claim, and the pass of the release before.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use chrono::{SubsecRound, Utc};

use super::*;
use crate::domain::ConsumerSpec;
use crate::testing::TestDb;

on_every_store!(
    a_relay_pass_fans_each_message_out_to_the_consumers_whose_patterns_match_its_topic,
    a_relay_pass_pushes_into_the_room_streams_offer_and_leaves_the_rest_pending,
    a_pushed_message_past_the_offered_room_in_the_pass_still_carries_its_payload,
    a_message_committed_after_the_passes_clock_is_due_and_a_delayed_one_is_not,
);

/// A pass matches each message's topic against every consumer's patterns (exact, `*`, a final
/// `>`, several at once) and gives it to those that match, and to no other.
async fn a_relay_pass_fans_each_message_out_to_the_consumers_whose_patterns_match_its_topic(store: SharedStore) {
    let now = Utc::now().trunc_subsecs(6);
    let consumers: [(&str, &[&str]); 7] = [
        ("exact", &["orders.created"]),
        ("elsewhere", &["billing.created"]),
        ("one-segment", &["orders.*"]),
        ("the-rest", &["orders.>"]),
        ("any-created", &["*.created"]),
        ("either", &["users.deleted", "orders.paid"]),
        ("none", &["orders", "users.*.x"]),
    ];
    for (name, topics) in consumers {
        store.consumer_create(&spec(name, topics, 5), now).await.unwrap();
    }
    let topics = ["orders.created", "orders.paid", "orders.paid.eu", "users.created", "users.deleted"];
    let mut ids = Vec::new();
    for t in topics {
        ids.push(store.message_insert(&msg(t), now).await.unwrap().message_id);
    }
    let out = store.relay_pass(10, now, false, &[]).await.unwrap();
    assert_eq!(out.messages, 5);
    let want: [&[&str]; 5] = [
        &["any-created", "exact", "one-segment", "the-rest"],
        &["either", "one-segment", "the-rest"],
        &["the-rest"],
        &["any-created"],
        &["either"],
    ];
    for ((id, topic), want) in ids.iter().zip(topics).zip(want) {
        let mut got: Vec<String> =
            store.delivery_list_of_message(*id).await.unwrap().into_iter().map(|d| d.consumer).collect();
        got.sort();
        assert_eq!(got, want, "the consumers of a message of {topic}");
    }
    assert_eq!(out.deliveries, 10, "every match, once");
}

/// A relay pass leases what streams offer room for (due, unkeyed, not paused) straight to them,
/// in seq order and never beyond an offer's room, and leaves the rest pending.
async fn a_relay_pass_pushes_into_the_room_streams_offer_and_leaves_the_rest_pending(store: SharedStore) {
    use crate::domain::PushOffer;
    let now = Utc::now().trunc_subsecs(6);
    let c = spec("c", &["t"], 5);
    store.consumer_create(&c, now).await.unwrap();
    store.consumer_create(&spec("paused", &["t"], 5), now).await.unwrap();
    store.consumer_set_paused(&ConsumerName::parse("n", "paused").unwrap(), true).await.unwrap();
    let mut ids = Vec::new();
    for i in 0..5 {
        let m = if i == 1 { NewMessage { ordering_key: Some("k".into()), ..msg("t") } } else { msg("t") };
        ids.push(store.message_insert(&m, now).await.unwrap().message_id);
    }
    let offer = |consumer: &str, session: &str, room| PushOffer {
        consumer: consumer.into(),
        session: session.into(),
        room,
        lease_until: now + chrono::Duration::seconds(30),
    };
    let offers = [offer("c", "s1", 2), offer("paused", "s2", 10)];
    let out = store.relay_pass(10, now, false, &offers).await.unwrap();

    assert_eq!((out.messages, out.deliveries), (5, 10));
    let pushed: Vec<_> = out.pushed.iter().map(|(c, s, d)| (c.as_str(), s.as_str(), d.message.message_id)).collect();
    assert_eq!(
        pushed,
        [("c", "s1", ids[0]), ("c", "s1", ids[2])],
        "the keyed message is not pushed, nor beyond the room"
    );
    assert!(out.pushed.iter().all(|(_, _, d)| d.delivery_count == 1 && d.message.payload == b"{}"));
    assert!(out.pushed.iter().all(|(_, _, d)| d.lease_expires_at == now + chrono::Duration::seconds(30)));
    assert_eq!(out.consumers, ["c", "paused"], "both have pending deliveries to wake for");
    let s = store.stats(None, true).await.unwrap();
    let of = |n: &str| s.consumers.iter().find(|c| c.consumer == n).unwrap().clone();
    assert_eq!((of("c").in_flight, of("c").backlog), (2, 3));
    assert_eq!((of("paused").in_flight, of("paused").backlog), (0, 5));
}

/// A pass reads payloads with its claim only as far as the offered room reaches; a message
/// pushed from further on in the pass (another consumer's topics came first) still goes out
/// with its payload.
async fn a_pushed_message_past_the_offered_room_in_the_pass_still_carries_its_payload(store: SharedStore) {
    use crate::domain::PushOffer;
    let now = Utc::now().trunc_subsecs(6);
    store.consumer_create(&spec("late", &["late"], 5), now).await.unwrap();
    store.consumer_create(&spec("early", &["early"], 5), now).await.unwrap();
    for _ in 0..3 {
        store.message_insert(&msg("early"), now).await.unwrap();
    }
    let payload = b"the late one".to_vec();
    let id =
        store.message_insert(&NewMessage { payload: payload.clone(), ..msg("late") }, now).await.unwrap().message_id;
    let offer = PushOffer {
        consumer: "late".into(),
        session: "s".into(),
        room: 1,
        lease_until: now + chrono::Duration::seconds(30),
    };
    let out = store.relay_pass(10, now, false, &[offer]).await.unwrap();
    assert_eq!(out.pushed.len(), 1, "{out:?}");
    let (consumer, _, d) = &out.pushed[0];
    assert_eq!((consumer.as_str(), d.message.message_id, &d.message.payload), ("late", id, &payload));
    assert_eq!(out.consumers, ["early"], "the other consumer's messages wait");
}

/// A message whose producer's clock read a little after the relay's (it committed just in time
/// for the pass) is due all the same: pushed, with no row of its own. A delayed one is not.
async fn a_message_committed_after_the_passes_clock_is_due_and_a_delayed_one_is_not(store: SharedStore) {
    use crate::domain::PushOffer;
    let now = Utc::now().trunc_subsecs(6);
    let c = spec("c", &["t"], 5);
    store.consumer_create(&c, now).await.unwrap();
    let later = now + chrono::Duration::milliseconds(5);
    let due = store.message_insert(&msg("t"), later).await.unwrap().message_id;
    let delayed = NewMessage { delay: Some(Duration::from_secs(60)), ..msg("t") };
    store.message_insert(&delayed, later).await.unwrap();
    let offer = PushOffer {
        consumer: "c".into(),
        session: "s1".into(),
        room: 10,
        lease_until: now + chrono::Duration::seconds(30),
    };
    let out = store.relay_pass(10, now, false, &[offer]).await.unwrap();
    let pushed: Vec<_> = out.pushed.iter().map(|(_, _, d)| d.message.message_id).collect();
    assert_eq!(pushed, [due], "due at commit, though its enqueue time is after the pass's clock");
    let s = store.stats(None, true).await.unwrap();
    let of = s.consumers.iter().find(|x| x.consumer == "c").unwrap();
    assert_eq!((of.in_flight, of.backlog), (1, 1), "the delayed one waits");
}

/// PostgreSQL only (its commits are not serial): the relay cursor delivers what is visible and
/// remembers the seq values it skipped. A transaction that holds a seq and commits late is still
/// relayed, and a later message of its ordering key waits for it meanwhile. One that rolls back
/// leaves a gap that closes once every transaction that was running has ended; a long
/// transaction elsewhere in the database delays only that closing, never a delivery.
#[tokio::test]
async fn the_relay_cursor_delivers_what_is_visible_and_waits_for_what_commits_late() {
    let db = TestDb::create().await.unwrap();
    let pg = PgStore::connect(&db.url, 8).await.unwrap();
    pg.migrate().await.unwrap();
    let store: SharedStore = Arc::new(pg.clone());
    let now = Utc::now();
    let c = spec("c", &["t"], 5);
    store.consumer_create(&c, now).await.unwrap();
    let keyed = |t: &str| NewMessage { ordering_key: Some("k".into()), type_: t.into(), ..msg("t") };
    let gaps = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox.relay_gaps").fetch_one(pg.pool()).await.unwrap()
    };
    let lease = |c: &ConsumerSpec| {
        let (store, name) = (store.clone(), c.name.clone());
        async move {
            // The database's clock wrote the late messages' times: lease as of now.
            let now = Utc::now();
            let later = crate::clock::add(now, Duration::from_secs(30));
            let leased = store
                .delivery_lease(&LeaseParams {
                    consumer: &name,
                    session: "s",
                    limit: 10,
                    keys_after: "",
                    lease_until: later,
                    now,
                })
                .await
                .unwrap();
            leased.into_iter().map(|d| d.message.message_id).collect::<Vec<_>>()
        }
    };

    // A transaction elsewhere in the database that has a transaction id and stays open.
    let mut elsewhere = pg.pool().begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()").execute(&mut *elsewhere).await.unwrap();

    // A producer takes a seq for the first message of the key and has not committed yet.
    let mut late = pg.pool().begin().await.unwrap();
    let first = postgres::message_insert(&mut *late, &keyed("first"), None).await.unwrap();
    let second = store.message_insert(&keyed("second"), now).await.unwrap();
    let third = store.message_insert(&msg("t"), now).await.unwrap();
    assert!(first.seq < second.seq && second.seq < third.seq);

    assert_eq!(store.relay_pass(10, now, false, &[]).await.unwrap().messages, 2, "what is visible goes");
    assert_eq!(gaps().await, 1, "the first message's seq is remembered");
    assert_eq!(store.stats(None, false).await.unwrap().unrelayed, 0, "nothing visible waits");

    late.commit().await.unwrap();
    assert_eq!(store.stats(None, false).await.unwrap().unrelayed, 1, "the late commit waits in the gap");
    assert_eq!(lease(&c).await, [third.message_id], "the second waits for the first of its key, unrelayed in the gap");
    let out = store.relay_pass(10, now, false, &[]).await.unwrap();
    assert_eq!((out.messages, out.last_seq), (1, Some(first.seq)), "the late commit is relayed");
    assert_eq!(gaps().await, 0);
    assert_eq!(lease(&c).await, [first.message_id]);
    store.delivery_ack_many(&c.name, &[first.message_id, third.message_id], now).await.unwrap();
    assert_eq!(lease(&c).await, [second.message_id]);
    let (m, _) = store.message_get(first.message_id).await.unwrap();
    assert!(m.relayed_at.is_some(), "GetMessage says when it was relayed");

    // A producer that rolls back: its seq is a gap until everything running then has ended.
    let mut doomed = pg.pool().begin().await.unwrap();
    let gone = postgres::message_insert(&mut *doomed, &msg("t"), None).await.unwrap();
    let after = store.message_insert(&msg("t"), now).await.unwrap();
    assert_eq!(store.relay_pass(10, now, false, &[]).await.unwrap().messages, 1);
    doomed.rollback().await.unwrap();
    assert_eq!(store.relay_pass(10, now, false, &[]).await.unwrap().messages, 0);
    assert_eq!(gaps().await, 1, "the transaction elsewhere may still be one that writes it");
    let newer = store.message_insert(&msg("t"), now).await.unwrap();
    let out = store.relay_pass(10, now, false, &[]).await.unwrap();
    assert_eq!((out.messages, out.last_seq), (1, Some(newer.seq)), "an open gap holds back no delivery");
    elsewhere.commit().await.unwrap();
    // Transaction ids are the cluster's: other databases' transactions (other tests) that were
    // running when the gap was read keep it open too, until they end.
    let closed = async {
        loop {
            store.relay_pass(10, now, false, &[]).await.unwrap();
            if gaps().await == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), closed)
        .await
        .expect("closed once everyone who was running has ended");
    assert!(gone.seq < after.seq);
    let relayed: Vec<_> = lease(&c).await;
    assert_eq!(relayed.len(), 2, "{relayed:?}");
    assert!(relayed.contains(&after.message_id) && relayed.contains(&newer.message_id));
    assert!(matches!(store.message_get(gone.message_id).await, Err(StoreError::MessageNotFound(_))));

    // A sequence set back would hand out seq values the cursor has passed: the relay refuses.
    sqlx::query("SELECT setval('outbox.messages_seq', 1)").execute(pg.pool()).await.unwrap();
    let err = store.relay_pass(10, now, false, &[]).await.unwrap_err();
    assert!(err.to_string().contains("behind the relay cursor"), "{err}");
}

/// The transaction id of `conn`'s transaction, assigned now if it has none.
async fn xid_of(conn: &mut sqlx::PgConnection) -> i64 {
    let id: String = sqlx::query_scalar("SELECT pg_current_xact_id()::text").fetch_one(conn).await.unwrap();
    id.parse().unwrap()
}

/// PostgreSQL only. A holder can take its transaction id after the latest one that completed,
/// and before the pass reads: a snapshot's xmax is then no bound on it. Here `b` takes its id,
/// then `a` takes its id and a seq, then `b` takes the next seq and commits. The pass sees `b`'s
/// message, and `a`'s seq is a gap. With `a` the oldest transaction running, the gap must stay
/// open until `a` ends, and `a`'s message must be relayed when it commits. Closing gaps at the
/// xmax of the reading snapshot lost exactly this message.
#[tokio::test]
async fn a_gap_stays_open_while_a_holder_that_took_its_id_after_the_last_completed_one_runs() {
    let db = TestDb::create().await.unwrap();
    let pg = PgStore::connect(&db.url, 8).await.unwrap();
    pg.migrate().await.unwrap();
    let store: SharedStore = Arc::new(pg.clone());
    let now = Utc::now();
    store.consumer_create(&spec("c", &["t"], 5), now).await.unwrap();
    let mut b = pg.pool().begin().await.unwrap();
    let b_xid: i64 = xid_of(&mut b).await;
    let mut a = pg.pool().begin().await.unwrap();
    let a_xid: i64 = xid_of(&mut a).await;
    assert!(a_xid > b_xid);
    let late = postgres::message_insert(&mut *a, &msg("t"), None).await.unwrap();
    let early = postgres::message_insert(&mut *b, &msg("t"), None).await.unwrap();
    assert!(late.seq < early.seq);
    b.commit().await.unwrap();

    let out = store.relay_pass(10, now, false, &[]).await.unwrap();
    assert_eq!((out.messages, out.last_seq), (1, Some(early.seq)));
    // More passes while `a` runs: none may give its seq up.
    for _ in 0..3 {
        assert_eq!(store.relay_pass(10, now, false, &[]).await.unwrap().messages, 0);
    }
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.relay_gaps WHERE seqs @> $1")
        .bind(late.seq)
        .fetch_one(pg.pool())
        .await
        .unwrap();
    assert_eq!(open, 1, "the gap stays open while its holder runs");
    a.commit().await.unwrap();
    let out = store.relay_pass(10, now, false, &[]).await.unwrap();
    assert_eq!((out.messages, out.last_seq), (1, Some(late.seq)), "the late commit is relayed");
}

/// The claim of a relay pass refuses to run inside a transaction that has written already: its
/// gap bound is the transaction id it takes after its read.
#[tokio::test]
async fn a_relay_claim_refuses_a_transaction_that_has_an_id_already() {
    let db = TestDb::create().await.unwrap();
    let pg = PgStore::connect(&db.url, 4).await.unwrap();
    pg.migrate().await.unwrap();
    let mut tx = pg.pool().begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()").execute(&mut *tx).await.unwrap();
    let err = sqlx::query("SELECT * FROM outbox.relay_claim(10, now(), 1)").execute(&mut *tx).await.unwrap_err();
    assert!(err.to_string().contains("outbox.relay_claim must run in a transaction of its own"), "{err}");
}

/// `outbox.relay_claim` on its own: it returns the committed messages after the cursor in seq
/// order, up to its batch, moves the cursor past them and logs them; a second claim returns
/// the rest; nothing is fanned out (that is the server's part).
#[tokio::test]
async fn a_relay_claim_returns_each_committed_message_once_in_seq_order_and_writes_no_delivery() {
    let db = TestDb::create().await.unwrap();
    let pg = PgStore::connect(&db.url, 4).await.unwrap();
    pg.migrate().await.unwrap();
    let store: SharedStore = Arc::new(pg.clone());
    let now = Utc::now();
    store.consumer_create(&spec("c", &["t"], 5), now).await.unwrap();
    for _ in 0..5 {
        store.message_insert(&msg("t"), now).await.unwrap();
    }
    let claim = |n: i32| {
        let pool = pg.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT seq FROM outbox.relay_claim($1, now(), 1)")
                .bind(n)
                .fetch_all(&pool)
                .await
                .unwrap()
        }
    };
    let first = claim(3).await;
    assert_eq!(first.len(), 3);
    assert!(first.windows(2).all(|w| w[0] < w[1]), "{first:?}");
    let rest = claim(10).await;
    assert_eq!(rest.len(), 2);
    assert!(rest[0] > first[2], "{first:?} then {rest:?}");
    assert!(claim(10).await.is_empty(), "each message is claimed once");
    let position: i64 =
        sqlx::query_scalar("SELECT position FROM outbox.relay_cursor").fetch_one(pg.pool()).await.unwrap();
    assert_eq!(position, rest[1]);
    let (logged, deliveries, ranges): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT sum(upper(r) - lower(r))::int8 FROM outbox.relay_log l, unnest(l.seqs) r),
                (SELECT count(*) FROM outbox.deliveries), (SELECT count(*) FROM outbox.delivery_ranges)",
    )
    .fetch_one(pg.pool())
    .await
    .unwrap();
    assert_eq!((logged, deliveries, ranges), (5, 0, 0));
}

/// A replay waits for a relay pass that is between its claim and its commit (it holds the
/// relays' turn), so that the pass's reading of the consumer's rows is never older than a
/// replay's writing of them: the replayed message ends in one place, a row.
#[tokio::test]
async fn a_replay_waits_for_a_relay_pass_between_its_claim_and_its_commit() {
    let db = TestDb::create().await.unwrap();
    let pg = PgStore::connect(&db.url, 8).await.unwrap();
    pg.migrate().await.unwrap();
    let store: SharedStore = Arc::new(pg.clone());
    let now = Utc::now();
    let c = ConsumerName::parse("n", "c").unwrap();
    store.consumer_create(&spec("c", &["t"], 5), now).await.unwrap();
    let id = store.message_insert(&msg("t"), now).await.unwrap().message_id;
    let mut pass = pg.pool().begin().await.unwrap();
    let claimed: Vec<i64> =
        sqlx::query_scalar("SELECT seq FROM outbox.relay_claim(10, now(), 1)").fetch_all(&mut *pass).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let replay = tokio::spawn({
        let store = store.clone();
        async move { store.replay_apply(&c, &[id], now).await }
    });
    // The replay waits on the turn: seen as an advisory lock not granted, within a bound.
    let mut waiting = 0_i64;
    for _ in 0..200 {
        waiting = sqlx::query_scalar(TURN_WAITERS).fetch_one(pg.pool()).await.unwrap();
        if waiting > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(waiting, 1, "the replay waits for the pass");
    assert!(!replay.is_finished());
    pass.commit().await.unwrap();
    assert_eq!(replay.await.unwrap().unwrap(), 1);
}

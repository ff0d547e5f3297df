//! Store tests, driven with a manual clock (no sleeping), each run on a fresh PostgreSQL
//! database and on a fresh SQLite file: the store half of the conformance suite (the end-to-end
//! half is in `tests/`). The background loops' tests on every store live with the loops, above
//! the store (`relay::store_tests`, `maintenance::store_tests`), on this module's harness:
//! [`on_every_store!`], [`postgres`], [`sqlite`], [`spec`] and [`msg`].
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use chrono::{SubsecRound, Utc};
use sqlx::Connection as _;

use super::*;
use crate::domain::{Attempt, DeliveryState};
use crate::domain::{Backoff, ConsumerSpec, StartFrom, TopicPattern};
use crate::testing::{TestDb, TestSqlite};

/// Keeps a test database alive.
#[allow(dead_code)]
pub(crate) enum Guard {
    Pg(TestDb),
    Sqlite(TestSqlite),
}

/// A migrated store on a fresh PostgreSQL database.
pub(crate) async fn postgres() -> (Guard, SharedStore) {
    let db = TestDb::create().await.unwrap();
    let store = connect(&db.url, 8).await.unwrap();
    store.migrate().await.unwrap();
    (Guard::Pg(db), store)
}

/// A migrated store on a fresh SQLite file.
pub(crate) async fn sqlite() -> (Guard, SharedStore) {
    let db = TestSqlite::create().unwrap();
    let store = connect(&db.url, 8).await.unwrap();
    store.migrate().await.unwrap();
    (Guard::Sqlite(db), store)
}

/// Runs each named case (an `async fn(SharedStore)` of the calling module) once per store, as
/// `on_postgres::NAME` and `on_sqlite::NAME`; after `with_db:`, each case is an
/// `async fn(Guard, SharedStore)`, for SQL of its own on the same database.
macro_rules! on_every_store {
    (with_db: $($case:ident),* $(,)?) => {
        mod on_postgres {
            $(#[tokio::test]
            async fn $case() {
                let (db, store) = $crate::store::tests::postgres().await;
                super::$case(db, store).await;
            })*
        }
        mod on_sqlite {
            $(#[tokio::test]
            async fn $case() {
                let (db, store) = $crate::store::tests::sqlite().await;
                super::$case(db, store).await;
            })*
        }
    };
    ($($case:ident),* $(,)?) => {
        mod on_postgres {
            $(#[tokio::test]
            async fn $case() {
                let (_db, store) = $crate::store::tests::postgres().await;
                super::$case(store).await;
            })*
        }
        mod on_sqlite {
            $(#[tokio::test]
            async fn $case() {
                let (_db, store) = $crate::store::tests::sqlite().await;
                super::$case(store).await;
            })*
        }
    };
}
pub(crate) use on_every_store;

on_every_store!(
    migrations_apply_to_an_empty_database_and_again_as_a_no_op,
    a_release_never_undoes_an_ack_or_another_sessions_lease,
    leases_take_every_ordering_key_in_turn_and_one_message_of_a_key_at_a_time,
    a_relay_pass_pushes_into_the_room_streams_offer_and_leaves_the_rest_pending,
    a_pushed_message_past_the_offered_room_in_the_pass_still_carries_its_payload,
    a_message_committed_after_the_passes_clock_is_due_and_a_delayed_one_is_not,
    dead_letters_group_by_last_error_and_a_group_replays_alone,
    a_search_pages_newest_first_through_bounded_windows,
    a_relay_pass_fans_each_message_out_to_the_consumers_whose_patterns_match_its_topic,
    a_tail_reads_only_its_patterns_topics_in_bounded_windows_and_payloads_of_its_matches,
    a_search_by_topic_pattern_matches_as_a_consumers_patterns_do,
    a_consumers_pending_retrying_and_in_flight_deliveries_page_in_seq_order,
);

/// A topic pattern of a test.
fn pattern(p: &str) -> TopicPattern {
    TopicPattern::parse("topic", p).unwrap()
}

/// How many sessions of this test's database wait for the relays' turn (the advisory lock
/// `(1869903970, 1)`): only this database's, as tests run side by side in databases of their own.
pub(crate) const TURN_WAITERS: &str = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND classid = 1869903970 AND objid = 1 AND objsubid = 2";

/// A consumer of `topics` with a 1 s to 10 s backoff and a 30 s ack deadline.
pub(crate) fn spec(name: &str, topics: &[&str], max_deliveries: u32) -> ConsumerSpec {
    ConsumerSpec {
        name: ConsumerName::parse("name", name).unwrap(),
        topics: topics.iter().map(|t| TopicPattern::parse("topics", t).unwrap()).collect(),
        max_deliveries,
        backoff: Backoff { base: Duration::from_secs(1), max: Duration::from_secs(10) },
        ack_deadline: Duration::from_secs(30),
        start_from: StartFrom::New,
        sink: None,
        dead_key_policy: Default::default(),
    }
}

/// An empty message of `topic`.
pub(crate) fn msg(topic: &str) -> NewMessage {
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
    let out = store.relay_batch(10, now, false, &[]).await.unwrap();
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

async fn migrations_apply_to_an_empty_database_and_again_as_a_no_op(store: SharedStore) {
    store.migrate().await.unwrap();
    let e = store.message_insert(&msg("a.b"), Utc::now()).await.unwrap();
    assert!(!e.duplicate);
}

async fn a_release_never_undoes_an_ack_or_another_sessions_lease(store: SharedStore) {
    let now = Utc::now();
    let c = spec("c", &["t"], 5);
    store.consumer_create(&c, now).await.unwrap();
    let a = store.message_insert(&msg("t"), now).await.unwrap().message_id;
    let b = store.message_insert(&msg("t"), now).await.unwrap().message_id;
    store.relay_batch(10, now, false, &[]).await.unwrap();
    let later = crate::clock::add(now, Duration::from_secs(30));
    assert_eq!(store.delivery_lease_batch(&c.name, "s1", 1, "", later, now).await.unwrap().len(), 1);
    assert_eq!(store.delivery_lease_batch(&c.name, "s2", 1, "", later, now).await.unwrap().len(), 1);
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

/// SQLite only: several replicas on one database is what PostgreSQL is for.
#[tokio::test]
async fn a_second_server_on_one_sqlite_file_is_refused() {
    let held = TestSqlite::create().unwrap();
    let _first = connect(&held.url, 2).await.unwrap();
    let err = connect(&held.url, 2).await.unwrap_err();
    assert!(matches!(err, StoreError::Locked(_)), "{err}");
    assert!(err.to_string().contains("only one server"), "{err}");
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
            let leased = store.delivery_lease_batch(&name, "s", 10, "", later, now).await.unwrap();
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

    assert_eq!(store.relay_batch(10, now, false, &[]).await.unwrap().messages, 2, "what is visible goes");
    assert_eq!(gaps().await, 1, "the first message's seq is remembered");
    assert_eq!(store.stats(None, false).await.unwrap().unrelayed, 0, "nothing visible waits");

    late.commit().await.unwrap();
    assert_eq!(store.stats(None, false).await.unwrap().unrelayed, 1, "the late commit waits in the gap");
    assert_eq!(lease(&c).await, [third.message_id], "the second waits for the first of its key, unrelayed in the gap");
    let out = store.relay_batch(10, now, false, &[]).await.unwrap();
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
    assert_eq!(store.relay_batch(10, now, false, &[]).await.unwrap().messages, 1);
    doomed.rollback().await.unwrap();
    assert_eq!(store.relay_batch(10, now, false, &[]).await.unwrap().messages, 0);
    assert_eq!(gaps().await, 1, "the transaction elsewhere may still be one that writes it");
    let newer = store.message_insert(&msg("t"), now).await.unwrap();
    let out = store.relay_batch(10, now, false, &[]).await.unwrap();
    assert_eq!((out.messages, out.last_seq), (1, Some(newer.seq)), "an open gap holds back no delivery");
    elsewhere.commit().await.unwrap();
    // Transaction ids are the cluster's: other databases' transactions (other tests) that were
    // running when the gap was read keep it open too, until they end.
    let closed = async {
        loop {
            store.relay_batch(10, now, false, &[]).await.unwrap();
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
    let err = store.relay_batch(10, now, false, &[]).await.unwrap_err();
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

    let out = store.relay_batch(10, now, false, &[]).await.unwrap();
    assert_eq!((out.messages, out.last_seq), (1, Some(early.seq)));
    // More passes while `a` runs: none may give its seq up.
    for _ in 0..3 {
        assert_eq!(store.relay_batch(10, now, false, &[]).await.unwrap().messages, 0);
    }
    let open: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.relay_gaps WHERE seqs @> $1")
        .bind(late.seq)
        .fetch_one(pg.pool())
        .await
        .unwrap();
    assert_eq!(open, 1, "the gap stays open while its holder runs");
    a.commit().await.unwrap();
    let out = store.relay_batch(10, now, false, &[]).await.unwrap();
    assert_eq!((out.messages, out.last_seq), (1, Some(late.seq)), "the late commit is relayed");
}

/// The claim of a relay pass (and the pass of the release before, which claims with it) refuses
/// to run inside a transaction that has written already: its gap bound is the transaction id it
/// takes after its read.
#[tokio::test]
async fn a_relay_claim_refuses_a_transaction_that_has_an_id_already() {
    let db = TestDb::create().await.unwrap();
    let pg = PgStore::connect(&db.url, 4).await.unwrap();
    pg.migrate().await.unwrap();
    for sql in [
        "SELECT * FROM outbox.relay_claim(10, now(), 1)",
        "SELECT * FROM outbox.relay_pass(10, 0, now(), 1, NULL, '{}', '{}', '{}', '{}')",
    ] {
        let mut tx = pg.pool().begin().await.unwrap();
        sqlx::query("SELECT pg_current_xact_id()").execute(&mut *tx).await.unwrap();
        let err = sqlx::query(sql).execute(&mut *tx).await.unwrap_err();
        assert!(err.to_string().contains("outbox.relay_claim must run in a transaction of its own"), "{sql}: {err}");
    }
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

/// The pass of the release before (`outbox.relay_pass`, one statement) still fans out as this
/// release does, for its replicas during a rolling upgrade: the offered stream's room as a
/// leased range, the rest of the unkeyed messages as a pending range, the keyed one as a row.
#[tokio::test]
async fn the_relay_pass_of_the_release_before_still_fans_out_during_a_rolling_upgrade() {
    let db = TestDb::create().await.unwrap();
    let pg = PgStore::connect(&db.url, 4).await.unwrap();
    pg.migrate().await.unwrap();
    let store: SharedStore = Arc::new(pg.clone());
    let now = Utc::now();
    store.consumer_create(&spec("c", &["t"], 5), now).await.unwrap();
    for i in 0..4 {
        let m = if i == 3 { NewMessage { ordering_key: Some("k".into()), ..msg("t") } } else { msg("t") };
        store.message_insert(&m, now).await.unwrap();
    }
    let kinds: Vec<(String, Option<i64>)> = sqlx::query_as(
        "SELECT kind, CASE WHEN kind = 'b' THEN seq END FROM outbox.relay_pass(10, 0, now(), 1, NULL,
                '{c}', '{s1}', '{2}', ARRAY[now() + interval '30 seconds']) ORDER BY kind, seq",
    )
    .fetch_all(pg.pool())
    .await
    .unwrap();
    let kinds: Vec<(&str, Option<i64>)> = kinds.iter().map(|(k, n)| (k.as_str(), *n)).collect();
    assert_eq!(
        kinds,
        [("b", Some(1)), ("d", None), ("m", None), ("m", None), ("m", None), ("m", None), ("p", None), ("p", None)]
    );
    let s = store.stats(None, true).await.unwrap();
    let c = s.consumers.iter().find(|c| c.consumer == "c").unwrap();
    assert_eq!((c.in_flight, c.backlog), (2, 2), "{c:?}");
}

/// A fresh database with the PostgreSQL migrations before `version` applied, as a release of
/// that time left it (without the SQL functions file, which later migrations do not need).
async fn postgres_migrated_below(db: &TestDb, version: i64) -> sqlx::PgPool {
    let old = sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Owned(
            super::postgres::MIGRATOR.migrations.iter().filter(|m| m.version < version).cloned().collect(),
        ),
        ..sqlx::migrate::Migrator::DEFAULT
    };
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    old.run(&pool).await.unwrap();
    pool
}

/// Consumer `consumer`'s deliveries through `outbox.inbox`: seq, state and count, in seq order.
pub(crate) async fn inbox_of(pool: &sqlx::PgPool, consumer: &str) -> Vec<(i64, String, i32)> {
    sqlx::query_as("SELECT seq, state, delivery_count FROM outbox.inbox WHERE consumer = $1 ORDER BY seq")
        .bind(consumer)
        .fetch_all(pool)
        .await
        .unwrap()
}

/// `outboxd migrate` takes a PostgreSQL database written before the relay cursor, with relayed
/// and unrelayed messages interleaved (a late commit below the highest relayed seq) and
/// deliveries in every state, to the cursor: every unrelayed message is relayed once, nothing
/// relayed before gets a second delivery row, delivery counts and states carry over, and new
/// seq values continue after the old ones.
#[tokio::test]
async fn an_old_postgres_schema_migrates_in_place_to_the_relay_cursor() {
    let db = TestDb::create().await.unwrap();
    {
        let pool = postgres_migrated_below(&db, 10).await;
        sqlx::raw_sql(
            "INSERT INTO outbox.consumers (name, topics, max_deliveries, backoff_base_ms, backoff_max_ms, ack_deadline_ms, start_from)
             VALUES ('c', ARRAY['t'], 5, 1000, 10000, 30000, 'earliest');
             INSERT INTO outbox.messages (message_id, topic, type, payload, relayed_at)
             SELECT gen_random_uuid(), 't', 'T' || g, '\\x00', CASE WHEN g IN (3, 7) THEN NULL ELSE now() END
               FROM generate_series(1, 8) g ORDER BY g;
             -- seq 1 acked, 2 dead, 4 leased, 5 pending after a retry, 6 and 8 pending; 3 and 7 unrelayed.
             INSERT INTO outbox.deliveries (message_id, consumer, seq, state, delivery_count, available_at,
                                            lease_expires_at, leased_by, created_at, updated_at)
             SELECT m.message_id, 'c', m.seq,
                    CASE m.seq WHEN 1 THEN 'acked' WHEN 2 THEN 'dead' WHEN 4 THEN 'leased' ELSE 'pending' END,
                    CASE m.seq WHEN 2 THEN 5 WHEN 4 THEN 1 WHEN 5 THEN 2 WHEN 1 THEN 1 ELSE 0 END,
                    now(), CASE WHEN m.seq = 4 THEN now() + interval '1 hour' END,
                    CASE WHEN m.seq = 4 THEN 'old-session' END, now(), now()
               FROM outbox.messages m WHERE m.relayed_at IS NOT NULL;",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    }
    let pg = PgStore::connect(&db.url, 4).await.unwrap();
    pg.migrate().await.unwrap();
    let store: SharedStore = Arc::new(pg.clone());
    let now = Utc::now();
    assert_eq!(store.stats(None, false).await.unwrap().unrelayed, 2, "the two unrelayed, one below the position");
    let out = store.relay_batch(100, now, false, &[]).await.unwrap();
    let mut relayed: Vec<i64> = out.pushed.iter().map(|(_, _, d)| d.message.seq).collect();
    relayed.extend(
        sqlx::query_scalar::<_, i64>("SELECT seq FROM outbox.inbox WHERE created_at >= $1 ORDER BY seq")
            .bind(now)
            .fetch_all(pg.pool())
            .await
            .unwrap(),
    );
    assert_eq!((out.messages, out.deliveries), (2, 2));
    assert_eq!(relayed, [3, 7], "each unrelayed message once, nothing relayed before");
    assert_eq!(store.relay_batch(100, now, false, &[]).await.unwrap().messages, 0);
    assert_eq!(store.stats(None, false).await.unwrap().unrelayed, 0);

    let rows = inbox_of(pg.pool(), "c").await;
    let expect = [
        (1, "acked", 1),
        (2, "dead", 5),
        (3, "pending", 0),
        (4, "leased", 1),
        (5, "pending", 2),
        (6, "pending", 0),
        (7, "pending", 0),
        (8, "pending", 0),
    ];
    assert_eq!(rows.iter().map(|(s, st, n)| (*s, st.as_str(), *n)).collect::<Vec<_>>(), expect);
    let next = store.message_insert(&msg("t"), now).await.unwrap();
    assert_eq!(next.seq, 9, "seq values continue after the old ones");
    let (m, _) = store
        .message_get(MessageId(
            sqlx::query_scalar("SELECT message_id FROM outbox.messages WHERE seq = 1")
                .fetch_one(pg.pool())
                .await
                .unwrap(),
        ))
        .await
        .unwrap();
    assert!(m.relayed_at.is_some(), "rows relayed before keep their time");
}

/// Migration 0022 (ADR 0065) takes a database of the release before, holding a delivery in
/// every state in every place it had (acked in the ack log, leased in a lease batch, pending in
/// pending batches, rows that decide over a batch, keyed in flight, retrying, dead), to
/// `outbox.delivery_ranges`: every delivery keeps its state and count, nothing acked is leased
/// again, what was held stays held by its holder (its stream's ack still takes), what waited is
/// leased in order, and the previous release's reads and writes of the old tables still work.
#[tokio::test]
async fn a_postgres_schema_with_every_state_in_batches_and_rows_migrates_to_delivery_ranges() {
    let db = TestDb::create().await.unwrap();
    let at = Utc::now().trunc_subsecs(3);
    {
        let pool = postgres_migrated_below(&db, 22).await;
        sqlx::query(
            "INSERT INTO outbox.consumers (name, topics, max_deliveries, backoff_base_ms, backoff_max_ms,
                                           ack_deadline_ms, start_from)
             VALUES ('c', ARRAY['t'], 5, 1000, 10000, 30000, 'earliest')",
        )
        .execute(&pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO outbox.messages (message_id, topic, type, payload, ordering_key, enqueued_at, available_at)
             SELECT gen_random_uuid(), 't', 'T' || g, '\\x00', CASE WHEN g IN (9, 10) THEN 'k' END, $1, $1
               FROM generate_series(1, 12) g ORDER BY g",
        )
        .bind(at)
        .execute(&pool)
        .await
        .unwrap();
        // Seqs 1-2 acked from a lease batch (the ack log); 3 in a lease batch but acked in the
        // consumer's transaction (its row decides); 4-5 in a lease batch; 6 and 7 in two pending
        // batches, 8 in the second but acked in the consumer's transaction; 9 keyed and leased
        // (a row), 10 keyed and waiting behind it; 11 retrying; 12 dead.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "UPDATE outbox.relay_cursor SET position = 12;
             INSERT INTO outbox.ack_log (consumer, seqs, at) VALUES ('c', '{{[1,3)}}', '{at}');
             INSERT INTO outbox.lease_batches (consumer, leased_by, seqs, lease_expires_at, created_at)
             VALUES ('c', 'old-session', '{{[3,6)}}', '{at}'::timestamptz + interval '1 hour', '{at}');
             INSERT INTO outbox.pending_batches (consumer, seqs, created_at) VALUES ('c', '{{[6,7)}}', '{at}');
             INSERT INTO outbox.pending_batches (consumer, seqs, created_at) VALUES ('c', '{{[7,9)}}', '{at}');
             INSERT INTO outbox.deliveries (message_id, consumer, seq, ordering_key, state, delivery_count,
                                            available_at, lease_expires_at, leased_by, last_error,
                                            created_at, updated_at, acked_at, dead_at)
             SELECT m.message_id, 'c', m.seq, m.ordering_key,
                    CASE m.seq WHEN 3 THEN 'acked' WHEN 8 THEN 'acked' WHEN 9 THEN 'leased' WHEN 12 THEN 'dead'
                               ELSE 'pending' END,
                    CASE m.seq WHEN 3 THEN 1 WHEN 8 THEN 0 WHEN 9 THEN 1 WHEN 10 THEN 0 WHEN 11 THEN 2 ELSE 5 END,
                    CASE m.seq WHEN 11 THEN '{at}'::timestamptz + interval '1 hour' ELSE '{at}' END,
                    CASE m.seq WHEN 9 THEN '{at}'::timestamptz + interval '1 hour' END,
                    CASE m.seq WHEN 9 THEN 'old-session' END,
                    CASE WHEN m.seq IN (11, 12) THEN 'boom' END,
                    '{at}', '{at}', CASE WHEN m.seq IN (3, 8) THEN '{at}'::timestamptz END,
                    CASE m.seq WHEN 12 THEN '{at}'::timestamptz END
               FROM outbox.messages m WHERE m.seq IN (3, 8, 9, 10, 11, 12);",
            at = at.to_rfc3339()
        )))
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    }
    let pg = PgStore::connect(&db.url, 4).await.unwrap();
    pg.migrate().await.unwrap();
    let store: SharedStore = Arc::new(pg.clone());
    let c = ConsumerName::parse("consumer", "c").unwrap();
    let ids: Vec<(i64, uuid::Uuid)> =
        sqlx::query_as("SELECT seq, message_id FROM outbox.messages ORDER BY seq").fetch_all(pg.pool()).await.unwrap();
    let id = |seq: i64| MessageId(ids[usize::try_from(seq - 1).unwrap()].1);

    // Every delivery where it was, with its state and count, through the one definition.
    let seen = inbox_of(pg.pool(), "c").await;
    let expect = [
        (1, "acked", 1),
        (2, "acked", 1),
        (3, "acked", 1),
        (4, "leased", 1),
        (5, "leased", 1),
        (6, "pending", 0),
        (7, "pending", 0),
        (8, "acked", 0),
        (9, "leased", 1),
        (10, "pending", 0),
        (11, "pending", 2),
        (12, "dead", 5),
    ];
    assert_eq!(seen.iter().map(|(s, st, n)| (*s, st.as_str(), *n)).collect::<Vec<_>>(), expect);
    let places: Vec<(String, String)> =
        sqlx::query_as("SELECT state, seqs::text FROM outbox.delivery_ranges ORDER BY id")
            .fetch_all(pg.pool())
            .await
            .unwrap();
    assert_eq!(
        places.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect::<Vec<_>>(),
        [("pending", "{[6,7)}"), ("pending", "{[7,9)}"), ("leased", "{[3,6)}"), ("acked", "{[1,3)}")],
        "the pending ranges in their order, and the tables gone"
    );
    let s = store.stats(Some(&c), true).await.unwrap().consumers.remove(0);
    assert_eq!((s.backlog, s.in_flight, s.retrying, s.dead, s.acked), (4, 3, 1, 1, 4), "{s:?}");
    let (_, timeline) = store.message_get(id(1)).await.unwrap();
    assert_eq!(timeline[0].acked_at, Some(at), "the ack log's time");
    let (_, timeline) = store.message_get(id(11)).await.unwrap();
    assert_eq!(
        (timeline[0].delivery_count, timeline[0].last_error.as_deref(), timeline[0].available_at),
        (2, Some("boom"), at + chrono::Duration::hours(1))
    );

    // What waited is leased in order; nothing acked, nothing behind its key, nothing not yet due.
    let leased = store.delivery_lease_batch(&c, "s2", 10, "", at + chrono::Duration::seconds(30), at).await.unwrap();
    assert_eq!(
        leased.iter().map(|d| (d.message.seq, d.delivery_count)).collect::<Vec<_>>(),
        [(6, 1), (7, 1)],
        "the pending ranges, lowest first"
    );
    // The old holder's acks take, once; the acked one is not acked twice.
    assert_eq!(store.delivery_ack_held(&c, &[(id(4), 4), (id(5), 5)], at).await.unwrap(), 2);
    assert_eq!(store.delivery_ack_held(&c, &[(id(3), 3)], at).await.unwrap(), 0, "acked already");
    assert_eq!(store.delivery_ack_held(&c, &[(id(9), 9)], at).await.unwrap(), 1);
    let later = at + chrono::Duration::hours(2);
    let leased =
        store.delivery_lease_batch(&c, "s3", 10, "", later + chrono::Duration::seconds(30), later).await.unwrap();
    assert_eq!(
        leased.iter().map(|d| (d.message.seq, d.delivery_count)).collect::<Vec<_>>(),
        [(10, 1), (11, 3)],
        "the key's next once its head is acked, and the retry once due; never an acked one"
    );

    // The previous release, during the roll, reads and writes the old tables' names.
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.pending_batches WHERE consumer = 'c'")
        .fetch_one(pg.pool())
        .await
        .unwrap();
    assert_eq!(n, 0, "both pending ranges were leased");
    let held: Vec<String> = sqlx::query_scalar("SELECT seqs::text FROM outbox.lease_batches WHERE leased_by = 's2'")
        .fetch_all(pg.pool())
        .await
        .unwrap();
    assert_eq!(held, ["{[6,8)}"]);
    sqlx::query("UPDATE outbox.lease_batches SET seqs = seqs - '{[6,7)}' WHERE leased_by = 's2'")
        .execute(pg.pool())
        .await
        .unwrap();
    let logged: i64 = sqlx::query_scalar("DELETE FROM outbox.ack_log WHERE consumer = 'c' AND at < $1 RETURNING 1")
        .bind(at - chrono::Duration::hours(1))
        .fetch_optional(pg.pool())
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(logged, 0);
    let left: String =
        sqlx::query_scalar("SELECT seqs::text FROM outbox.delivery_ranges WHERE state = 'leased' AND leased_by = 's2'")
            .fetch_one(pg.pool())
            .await
            .unwrap();
    assert_eq!(left, "{[7,8)}", "written through the view");
    // Its SQL functions insert through them too, until this release's replace them.
    let (id, seqs): (i64, String) = sqlx::query_as(
        "INSERT INTO outbox.lease_batches (consumer, leased_by, seqs, lease_expires_at, created_at)
         VALUES ('c', 'old', '{[20,22)}', now() + interval '1 minute', now()) RETURNING id, seqs::text",
    )
    .fetch_one(pg.pool())
    .await
    .unwrap();
    assert_eq!(seqs, "{[20,22)}");
    sqlx::raw_sql(
        "INSERT INTO outbox.pending_batches (consumer, seqs, created_at) VALUES ('c', '{[22,23)}', now());
         INSERT INTO outbox.ack_log (consumer, seqs, at) VALUES ('c', '{[23,24)}', now());",
    )
    .execute(pg.pool())
    .await
    .unwrap();
    let written: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT state, seqs::text, span::text FROM outbox.delivery_ranges WHERE lower(span) >= 20 ORDER BY lower(span)",
    )
    .fetch_all(pg.pool())
    .await
    .unwrap();
    let written: Vec<(&str, &str, &str)> =
        written.iter().map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str())).collect();
    assert_eq!(
        written,
        [("leased", "{[20,22)}", "[20,22)"), ("pending", "{[22,23)}", "[22,23)"), ("acked", "{[23,24)}", "[23,24)")]
    );
    let held: i64 =
        sqlx::query_scalar("SELECT id FROM outbox.delivery_ranges WHERE state = 'leased' AND leased_by = 'old'")
            .fetch_one(pg.pool())
            .await
            .unwrap();
    assert_eq!(held, id, "RETURNING names the range written");
}

/// A new SQLite file with the migrations below `version` applied, as an older release left it.
async fn sqlite_migrated_below(db: &TestSqlite, version: i64) -> sqlx::SqlitePool {
    let old = sqlx::migrate::Migrator {
        migrations: std::borrow::Cow::Owned(
            super::sqlite::MIGRATOR.migrations.iter().filter(|m| m.version < version).cloned().collect(),
        ),
        ..sqlx::migrate::Migrator::DEFAULT
    };
    let pool = sqlx::SqlitePool::connect(&format!("{}?mode=rwc", db.url)).await.unwrap();
    old.run(&pool).await.unwrap();
    pool
}

/// The counts each delivery of consumer `c` shows after the migration of ADR 0074, in seq order:
/// pending at `max_deliveries` (2) or above gets back its last attempt, anything else above
/// the bound is brought down to it, and a count within it stays.
async fn counts_after_the_adr_0074_migration(store: &SharedStore) {
    let mut counts = Vec::new();
    for m in store.message_list_after(0, 10).await.unwrap() {
        let (_, rows) = store.message_get(m.message_id).await.unwrap();
        let d = rows.into_iter().find(|r| r.consumer == "c").unwrap();
        counts.push((m.seq, d.state, d.delivery_count));
    }
    use DeliveryState::{Acked, Leased, Pending};
    assert_eq!(counts, [(1, Pending, 1), (2, Pending, 1), (3, Pending, 1), (4, Leased, 2), (5, Acked, 2)]);
}

/// PostgreSQL migration 0026 (ADR 0074): deliveries counted above `max_deliveries` by the clean
/// closes of earlier releases are brought within it.
#[tokio::test]
async fn a_postgres_database_counted_above_max_deliveries_migrates_within_them() {
    let db = TestDb::create().await.unwrap();
    {
        let pool = postgres_migrated_below(&db, 26).await;
        sqlx::raw_sql(
            "INSERT INTO outbox.consumers (name, topics, max_deliveries, backoff_base_ms, backoff_max_ms,
                                           ack_deadline_ms, start_from)
             VALUES ('c', ARRAY['t'], 2, 1000, 10000, 30000, 'earliest');
             INSERT INTO outbox.messages (message_id, topic, type, payload, enqueued_at, available_at)
             SELECT gen_random_uuid(), 't', 'T', '\\x00', now(), now() FROM generate_series(1, 5) g ORDER BY g;
             INSERT INTO outbox.deliveries (message_id, consumer, seq, state, delivery_count, available_at,
                                            lease_expires_at, leased_by, created_at, updated_at, acked_at)
             SELECT message_id, 'c', seq,
                    CASE seq WHEN 4 THEN 'leased' WHEN 5 THEN 'acked' ELSE 'pending' END,
                    CASE seq WHEN 1 THEN 2 WHEN 2 THEN 3 WHEN 3 THEN 1 WHEN 4 THEN 3 ELSE 4 END,
                    now(), CASE seq WHEN 4 THEN now() + interval '1 hour' END,
                    CASE seq WHEN 4 THEN 'old-session' END, now(), now(), CASE seq WHEN 5 THEN now() END
               FROM outbox.messages;",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    }
    let store = connect(&db.url, 2).await.unwrap();
    store.migrate().await.unwrap();
    counts_after_the_adr_0074_migration(&store).await;
}

/// SQLite migration 0015 (ADR 0074), as PostgreSQL's 0026.
#[tokio::test]
async fn an_sqlite_file_counted_above_max_deliveries_migrates_within_them() {
    let db = TestSqlite::create().unwrap();
    {
        let pool = sqlite_migrated_below(&db, 15).await;
        sqlx::raw_sql(
            "INSERT INTO outbox_consumers (name, topics, max_deliveries, backoff_base_ms, backoff_max_ms, ack_deadline_ms, start_from, created_at)
             VALUES ('c', '[\"t\"]', 2, 1000, 10000, 30000, 'earliest', 0);
             INSERT INTO outbox_messages (topic, type, payload, enqueued_at) VALUES
                 ('t', 'T', x'01', 1), ('t', 'T', x'02', 2), ('t', 'T', x'03', 3), ('t', 'T', x'04', 4), ('t', 'T', x'05', 5);
             INSERT INTO outbox_deliveries (message_id, consumer, seq, state, delivery_count, available_at,
                                            lease_expires_at, leased_by, created_at, updated_at, acked_at)
             SELECT message_id, 'c', seq,
                    CASE seq WHEN 4 THEN 'leased' WHEN 5 THEN 'acked' ELSE 'pending' END,
                    CASE seq WHEN 1 THEN 2 WHEN 2 THEN 3 WHEN 3 THEN 1 WHEN 4 THEN 3 ELSE 4 END,
                    1, CASE seq WHEN 4 THEN 4000000000000000 END, CASE seq WHEN 4 THEN 'old-session' END,
                    1, 1, CASE seq WHEN 5 THEN 1 END
               FROM outbox_messages;",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    }
    let store = connect(&db.url, 2).await.unwrap();
    store.migrate().await.unwrap();
    counts_after_the_adr_0074_migration(&store).await;
}

/// SQLite migration 0011 (ADR 0066) takes a file whose relay claimed messages one by one
/// (`relayed_at`) to the relay cursor: the unrelayed messages are relayed once, the relayed ones
/// get no second delivery (one relayed out of order above an unrelayed one is read again and
/// writes nothing), the old relay times stay, new ones come from the relay log, and a seq that
/// the cursor has passed is refused rather than never relayed.
#[tokio::test]
async fn an_old_sqlite_file_migrates_to_the_relay_cursor() {
    let db = TestSqlite::create().unwrap();
    {
        let pool = sqlite_migrated_below(&db, 11).await;
        sqlx::raw_sql(
            "INSERT INTO outbox_consumers (name, topics, max_deliveries, backoff_base_ms, backoff_max_ms, ack_deadline_ms, start_from, created_at)
             VALUES ('c', '[\"t\"]', 5, 1000, 10000, 30000, 'earliest', 0);
             INSERT INTO outbox_messages (topic, type, payload, enqueued_at, relayed_at) VALUES
                 ('t', 'T', x'01', 1, 1000), ('t', 'T', x'02', 2, 2000), ('t', 'T', x'03', 3, NULL),
                 ('t', 'T', x'04', 4, NULL), ('t', 'T', x'05', 5, 5000);
             INSERT INTO outbox_deliveries (message_id, consumer, seq, state, delivery_count, available_at, created_at, updated_at, acked_at)
             SELECT message_id, 'c', seq, 'acked', 1, 1, 1, 1, 1 FROM outbox_messages WHERE seq = 1;
             INSERT INTO outbox_deliveries (message_id, consumer, seq, state, delivery_count, available_at, created_at, updated_at)
             SELECT message_id, 'c', seq, 'pending', 2, 2, 2, 2 FROM outbox_messages WHERE seq IN (2, 5);",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    }
    let store = connect(&db.url, 2).await.unwrap();
    store.migrate().await.unwrap();
    assert_eq!(store.stats(None, false).await.unwrap().unrelayed, 3, "3, 4, and 5 above them");
    let now = Utc::now().trunc_subsecs(6);
    let out = store.relay_batch(100, now, false, &[]).await.unwrap();
    assert_eq!((out.messages, out.deliveries), (3, 2), "5 had its delivery: none twice");
    assert_eq!(store.relay_batch(100, now, false, &[]).await.unwrap().messages, 0, "each once");
    assert_eq!(store.stats(None, false).await.unwrap().unrelayed, 0);
    let messages = store.message_list_after(0, 10).await.unwrap();
    let relayed: Vec<Option<i64>> = messages.iter().map(|m| m.relayed_at.map(|t| t.timestamp_micros())).collect();
    let at = Some(now.timestamp_micros());
    assert_eq!(relayed, [Some(1000), Some(2000), at, at, Some(5000)], "old times kept, new ones logged");
    let (_, rows) = store.message_get(messages[4].message_id).await.unwrap();
    assert_eq!((rows.len(), rows[0].delivery_count), (1, 2), "5's delivery as it was");
    let c = ConsumerName::parse("consumer", "c").unwrap();
    let leased = store.delivery_lease_batch(&c, "s", 10, "", now + chrono::Duration::seconds(30), now).await.unwrap();
    assert_eq!(leased.iter().map(|d| d.message.seq).collect::<Vec<_>>(), [2, 3, 4, 5]);

    let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
    let err = sqlx::query("INSERT INTO outbox_messages (seq, topic, type, payload) VALUES (0, 't', 'T', x'00')")
        .execute(&pool)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("above the relay cursor"), "{err}");
    let err = sqlx::query("UPDATE outbox_messages SET seq = seq + 100 WHERE seq = 5").execute(&pool).await.unwrap_err();
    assert!(err.to_string().contains("seq cannot change"), "{err}");
    sqlx::query("INSERT INTO outbox_messages (topic, type, payload) VALUES ('t', 'T', x'06')")
        .execute(&pool)
        .await
        .unwrap();
    let out = store.relay_batch(100, now, false, &[]).await.unwrap();
    assert_eq!((out.messages, out.last_seq), (1, Some(6)));
}

/// SQLite migration 0012 (ADR 0070) adds acked ranges to a file whose deliveries are all rows,
/// in every state: nothing moves, nothing is lost, the acked rows stay acked (counted, shown, not
/// leased again), counts carry over, and from then on a stream's ack of a first delivery goes to
/// an acked range while the older rows keep deciding for themselves.
#[tokio::test]
async fn an_sqlite_file_with_every_state_in_rows_migrates_to_acked_ranges() {
    let db = TestSqlite::create().unwrap();
    {
        let pool = sqlite_migrated_below(&db, 12).await;
        sqlx::raw_sql(
            "INSERT INTO outbox_consumers (name, topics, max_deliveries, backoff_base_ms, backoff_max_ms, ack_deadline_ms, start_from, created_at)
             VALUES ('c', '[\"t\"]', 5, 1000, 10000, 30000, 'earliest', 0);
             INSERT INTO outbox_messages (topic, type, payload, ordering_key, enqueued_at) VALUES
                 ('t', 'T', x'01', NULL, 1), ('t', 'T', x'02', NULL, 2), ('t', 'T', x'03', NULL, 3),
                 ('t', 'T', x'04', NULL, 4), ('t', 'T', x'05', 'k', 5);
             UPDATE outbox_relay_cursor SET position = 5;
             INSERT INTO outbox_deliveries (message_id, consumer, seq, state, delivery_count, available_at, created_at, updated_at, acked_at)
             SELECT message_id, 'c', seq, 'acked', 1, 1, 1, 1, 7 FROM outbox_messages WHERE seq = 1;
             INSERT INTO outbox_deliveries (message_id, consumer, seq, state, delivery_count, available_at, created_at, updated_at,
                                            lease_expires_at, leased_by)
             SELECT message_id, 'c', seq, 'leased', 1, 2, 2, 2, 9000000000000000, 's' FROM outbox_messages WHERE seq = 2;
             INSERT INTO outbox_deliveries (message_id, consumer, seq, state, delivery_count, available_at, created_at, updated_at,
                                            last_error, dead_at)
             SELECT message_id, 'c', seq, 'dead', 5, 3, 3, 3, 'boom', 3 FROM outbox_messages WHERE seq = 3;
             INSERT INTO outbox_deliveries (message_id, consumer, seq, ordering_key, state, delivery_count, available_at, created_at, updated_at)
             SELECT message_id, 'c', seq, ordering_key, 'pending', 2, 4, 4, 4 FROM outbox_messages WHERE seq IN (4, 5);",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    }
    let store = connect(&db.url, 2).await.unwrap();
    store.migrate().await.unwrap();
    let c = ConsumerName::parse("consumer", "c").unwrap();
    let stats = store.stats(Some(&c), true).await.unwrap().consumers;
    assert_eq!(
        (stats[0].acked, stats[0].in_flight, stats[0].dead, stats[0].backlog, stats[0].retrying),
        (1, 1, 1, 2, 2),
        "every count carried over"
    );
    let messages = store.message_list_after(0, 10).await.unwrap();
    let ids: Vec<MessageId> = messages.iter().map(|m| m.message_id).collect();
    let (_, rows) = store.message_get(ids[0]).await.unwrap();
    assert_eq!((rows.len(), rows[0].acked_at.map(|t| t.timestamp_micros())), (1, Some(7)), "the acked row as it was");
    let now = Utc::now().trunc_subsecs(6);
    let until = now + chrono::Duration::seconds(30);
    let leased = store.delivery_lease_batch(&c, "s2", 10, "", until, now).await.unwrap();
    assert_eq!(leased.iter().map(|d| d.message.seq).collect::<Vec<_>>(), [4, 5], "nothing acked or dead again");

    // The old leased delivery was delivered once: its ack holds it in an acked range.
    assert_eq!(store.delivery_ack_many(&c, &[ids[1]], now).await.unwrap(), 1);
    let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
    let ranges: Vec<(i64, i64)> =
        sqlx::query_as("SELECT lo, hi FROM outbox_acked_ranges ORDER BY lo").fetch_all(&pool).await.unwrap();
    assert_eq!(ranges, [(2, 3)]);
    let inbox: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_inbox").fetch_one(&pool).await.unwrap();
    assert_eq!(inbox, 5, "one delivery per message, none lost");
    let stats = store.stats(Some(&c), true).await.unwrap().consumers;
    assert_eq!((stats[0].acked, stats[0].in_flight), (2, 2));
}

/// PostgreSQL only: the SQL functions come from `server/sql/functions.sql` alone (ADR 0043).
/// After migrating, every function of schema `outbox` has its body in that file; a second
/// migration with the file unchanged rewrites no function; functions recorded as a newer
/// revision stay, those of an older revision or another digest are replaced by the file's; and
/// no migration after the last one that defined functions defines one.
#[tokio::test]
async fn the_sql_functions_come_from_their_one_source_file() {
    use super::postgres::{FUNCTIONS, FUNCTIONS_REVISION, LAST_MIGRATION_WITH_FUNCTIONS, MIGRATOR};
    let db = TestDb::create().await.unwrap();
    let pg = PgStore::connect(&db.url, 4).await.unwrap();
    pg.migrate().await.unwrap();
    let bodies: Vec<(String, String)> = sqlx::query_as(
        "SELECT proname::text, prosrc FROM pg_proc WHERE pronamespace = 'outbox'::regnamespace ORDER BY 1",
    )
    .fetch_all(pg.pool())
    .await
    .unwrap();
    assert!(bodies.iter().any(|(n, _)| n == "relay_claim") && bodies.len() >= 13, "{bodies:?}");
    for (name, body) in &bodies {
        assert!(FUNCTIONS.contains(body.as_str()), "outbox.{name} is not defined as server/sql/functions.sql says");
    }

    let versions = || async {
        sqlx::query_as::<_, (String, String)>(
            "SELECT proname::text, xmin::text FROM pg_proc WHERE pronamespace = 'outbox'::regnamespace ORDER BY 1",
        )
        .fetch_all(pg.pool())
        .await
        .unwrap()
    };
    let before = versions().await;
    pg.migrate().await.unwrap();
    assert_eq!(versions().await, before, "an unchanged file rewrites no function");

    // Another body under another version: a newer revision is left alone, this revision with
    // another digest or an older revision gets the file's definitions back.
    let other_body = |revision: i32| {
        let pool = pg.pool().clone();
        async move {
            sqlx::query("UPDATE outbox.function_source SET revision = $1, digest = 'other'")
                .bind(revision)
                .execute(&pool)
                .await
                .unwrap();
            sqlx::raw_sql(
                "CREATE OR REPLACE FUNCTION outbox.topic_matches(patterns text[], topic text) RETURNS boolean
                 LANGUAGE sql IMMUTABLE AS $$ SELECT false $$",
            )
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    let file_matches = || async {
        sqlx::query_scalar::<_, bool>("SELECT outbox.topic_matches(ARRAY['orders.*'], 'orders.created')")
            .fetch_one(pg.pool())
            .await
            .unwrap()
    };
    other_body(FUNCTIONS_REVISION + 1).await;
    pg.migrate().await.unwrap();
    assert!(!file_matches().await, "a newer release's functions stay");
    for revision in [FUNCTIONS_REVISION, FUNCTIONS_REVISION - 1] {
        other_body(revision).await;
        pg.migrate().await.unwrap();
        assert!(file_matches().await, "the file's definition replaced revision {revision}'s");
        let (held, digest): (i32, String) =
            sqlx::query_as("SELECT revision, digest FROM outbox.function_source").fetch_one(pg.pool()).await.unwrap();
        assert_eq!((held, digest.len()), (FUNCTIONS_REVISION, 64), "this revision and a SHA-256 recorded: {digest}");
    }
    assert!(
        FUNCTIONS.starts_with(&format!("-- revision: {FUNCTIONS_REVISION}\n")),
        "the file's first line states FUNCTIONS_REVISION"
    );

    for m in MIGRATOR.migrations.iter().filter(|m| m.version > LAST_MIGRATION_WITH_FUNCTIONS) {
        let sql = m.sql.as_str().split_whitespace().collect::<Vec<_>>().join(" ").to_ascii_uppercase();
        // The one exception: migration 0022's trigger function for the old names' views, which
        // it needs before the file runs (the file holds the same body, checked above).
        let sql = sql.replace("CREATE FUNCTION OUTBOX.DELIVERY_RANGES_INSERT_THROUGH_VIEW()", "");
        assert!(
            !sql.contains("CREATE FUNCTION") && !sql.contains("CREATE OR REPLACE FUNCTION"),
            "migration {} defines a function: define it in server/sql/functions.sql",
            m.version
        );
    }
}

/// `outbox.topic_matches` (the release before's relay pass, during a rolling upgrade) matches
/// topics exactly as the server's `TopicPattern` and its relay (`domain::topic_matches`) do.
#[tokio::test]
async fn sql_topic_matching_agrees_with_the_servers() {
    let (_db, _store) = postgres().await;
    let Guard::Pg(db) = &_db else { unreachable!() };
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let patterns = ["orders", "orders.*", "orders.>", "*.created", "*", ">", "a.*.c", "a.>", "a-b_c.*"];
    let topics = ["orders", "orders.created", "orders.created.eu", "users.created", "a.b.c", "a.bc", "a", "a-b_c.x"];
    for p in patterns {
        for t in topics {
            let sql: bool = sqlx::query_scalar("SELECT outbox.topic_matches(ARRAY[$1], $2)")
                .bind(p)
                .bind(t)
                .fetch_one(&pool)
                .await
                .unwrap();
            assert_eq!(sql, TopicPattern::parse("p", p).unwrap().matches(t), "pattern {p:?}, topic {t:?}");
        }
    }
    // Several patterns, exact ones and wildcards together: any one matching is a match.
    for (ps, t, want) in [
        (vec!["users.created", "orders.*"], "orders.paid", true),
        (vec!["orders.created", "users.*"], "orders.created", true),
        (vec!["orders.created", "users.*"], "orders.paid", false),
        (vec!["orders", "a.>"], "orders.created", false),
        (vec!["x", "y"], "y", true),
    ] {
        let sql: bool =
            sqlx::query_scalar("SELECT outbox.topic_matches($1, $2)").bind(&ps).bind(t).fetch_one(&pool).await.unwrap();
        assert_eq!(sql, want, "patterns {ps:?}, topic {t:?}");
    }
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
    let out = store.relay_batch(10, now, false, &offers).await.unwrap();

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
    let out = store.relay_batch(10, now, false, &[offer]).await.unwrap();
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
    let out = store.relay_batch(10, now, false, &[offer]).await.unwrap();
    let pushed: Vec<_> = out.pushed.iter().map(|(_, _, d)| d.message.message_id).collect();
    assert_eq!(pushed, [due], "due at commit, though its enqueue time is after the pass's clock");
    let s = store.stats(None, true).await.unwrap();
    let of = s.consumers.iter().find(|x| x.consumer == "c").unwrap();
    assert_eq!((of.in_flight, of.backlog), (1, 1), "the delayed one waits");
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
    store.relay_batch(100, now, false, &[]).await.unwrap();
    let later = crate::clock::add(now, Duration::from_secs(30));

    let mut cursor = String::new();
    let mut served: Vec<String> = Vec::new();
    let mut next_seq: std::collections::HashMap<String, usize> = Default::default();
    for round in 0..15 {
        let leased = store.delivery_lease_batch(&c.name, "s", 2, &cursor, later, now).await.unwrap();
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
        let more = store.delivery_lease_batch(&c.name, "s", 30, "", later, now).await.unwrap();
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
    assert!(store.delivery_lease_batch(&c.name, "s", 10, &cursor, later, now).await.unwrap().is_empty());
}

/// Builds, with plain SQL, `depth` messages for each of 49 ordering keys and as many unkeyed
/// ones, all relayed to consumer `name` and pending (a consumer that was away).
async fn deep_backlog(pool: &sqlx::PgPool, name: &str, depth: i64) {
    sqlx::query(
        "INSERT INTO outbox.consumers (name, topics, max_deliveries, backoff_base_ms, backoff_max_ms, ack_deadline_ms, start_from)
         VALUES ($1, '{t}', 5, 1000, 10000, 30000, 'earliest')",
    )
    .bind(name)
    .execute(pool)
    .await
    .unwrap();
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(
        "WITH m AS (
            INSERT INTO outbox.messages (message_id, topic, type, payload, ordering_key, relayed_at)
            SELECT gen_random_uuid(), 't', 'T', '\\x00', CASE WHEN g % 2 = 0 THEN 'key-' || (g / 2 % 49) END, now()
              FROM generate_series(1, $2 * 98) g
            RETURNING message_id, seq, ordering_key)
         INSERT INTO outbox.deliveries (message_id, consumer, seq, ordering_key, state, available_at, created_at, updated_at)
         SELECT message_id, $1, seq, ordering_key, 'pending', now() - interval '1 minute', now(), now() FROM m",
    )
    .bind(name)
    .bind(depth)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

/// Shared buffers one lease of 64 touches (hits and reads, from `EXPLAIN (ANALYZE, BUFFERS)`),
/// with the plan PostgreSQL caches for a prepared statement (`generic`) or a fresh one. Rolled
/// back: the backlog stays as it is.
async fn lease_buffers(pool: &sqlx::PgPool, consumer: &str, generic: bool) -> (i64, i64) {
    let mut tx = pool.begin().await.unwrap();
    let mode = if generic { "force_generic_plan" } else { "force_custom_plan" };
    // The lease connections' other settings, as they run in production.
    let settings: String = super::postgres::LEASE_SETTINGS
        .iter()
        .filter(|(name, _)| *name != "plan_cache_mode")
        .map(|(name, value)| format!("SET LOCAL {name} = {value};"))
        .collect();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "{settings} SET LOCAL plan_cache_mode = {mode};
         PREPARE lease(text, timestamptz, bigint, timestamptz, text, text) AS {}",
        super::postgres::q::DELIVERY_LEASE
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
         EXECUTE lease('{consumer}', now(), 64, now() + interval '30 seconds', 's', '')"
    )))
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    sqlx::raw_sql("DEALLOCATE lease").execute(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
    buffers_and_rows(&plan)
}

/// Shared buffers (hits and reads) and rows of an `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`.
fn buffers_and_rows(plan: &serde_json::Value) -> (i64, i64) {
    let top = &plan[0]["Plan"];
    let buffers = top["Shared Hit Blocks"].as_i64().unwrap() + top["Shared Read Blocks"].as_i64().unwrap();
    (buffers, top["Actual Rows"].as_i64().unwrap())
}

/// A lease of 64 for consumer `deep` touches at most `bound` buffers and not much more than one
/// for consumer `shallow`, with statistics taken while the tables were empty (the migrations
/// analyse them) and again after `analyze`, with the generic plan a prepared statement caches
/// and a custom one.
async fn leases_cost_alike(pool: &sqlx::PgPool, analyze: &'static str, bound: i64) {
    for analysed in [false, true] {
        if analysed {
            sqlx::query(analyze).execute(pool).await.unwrap();
        }
        for generic in [true, false] {
            let (shallow, rows) = lease_buffers(pool, "shallow", generic).await;
            assert_eq!(rows, 64, "a full batch");
            let (deep, rows) = lease_buffers(pool, "deep", generic).await;
            assert_eq!(rows, 64, "a full batch");
            let case = format!("analysed {analysed}, generic plan {generic}: {shallow} buffers shallow, {deep} deep");
            assert!(deep <= bound, "{case}");
            assert!(deep <= shallow * 3 / 2 + 100, "does not grow with the backlog: {case}");
        }
    }
}

/// The stall: a consumer that comes back to a deep backlog, a third of it under a few ordering
/// keys, must drain it at a rate that does not depend on its depth. One lease of 64 touches about
/// the same number of buffers behind a backlog of 4,900 deliveries as behind one of 196,000,
/// with statistics taken while the tables were empty (the migrations analyse them), and again
/// with fresh statistics, with the generic plan a prepared statement caches and a custom one.
#[tokio::test]
async fn a_lease_costs_what_it_returns_not_the_backlog_behind_it() {
    let db = TestDb::create().await.unwrap();
    let store = connect(&db.url, 2).await.unwrap();
    store.migrate().await.unwrap();
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    deep_backlog(&pool, "shallow", 50).await;
    deep_backlog(&pool, "deep", 2_000).await;
    // And a relay that is behind: 20,000 keyed messages of other keys not relayed yet.
    sqlx::query(
        "INSERT INTO outbox.messages (message_id, topic, type, payload, ordering_key)
         SELECT gen_random_uuid(), 'u', 'T', '\\x00', 'other-' || (g % 500) FROM generate_series(1, 20000) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    // 64 rows leased (heap, indexes) plus one probe per key: a few thousand buffers at most.
    leases_cost_alike(&pool, "ANALYZE outbox.messages, outbox.deliveries", 3_000).await;
    // Through the store too: 64 leased, one per key at most, the unkeyed ones in seq order.
    let now = Utc::now();
    let leased = store
        .delivery_lease_batch(
            &ConsumerName::parse("c", "deep").unwrap(),
            "s",
            64,
            "",
            crate::clock::add(now, Duration::from_secs(30)),
            now,
        )
        .await
        .unwrap();
    assert_eq!(leased.len(), 64);
    let keys: Vec<_> = leased.iter().filter_map(|d| d.message.ordering_key.clone()).collect();
    assert_eq!(keys.len(), keys.iter().collect::<std::collections::HashSet<_>>().len(), "one per key");
    assert!(leased.windows(2).all(|w| w[0].message.seq < w[1].message.seq));
}

/// Poison-key quarantine (ADR 0057): every ordering key of consumer `deep` held, 2,000
/// messages waiting behind each, costs a lease of 64 about what a shallow backlog with no held
/// key does: the held keys' heads are one probe each, their backlogs never read, and the lease
/// fills with unkeyed work.
#[tokio::test]
async fn a_held_key_costs_a_lease_one_probe_whatever_waits_behind_it() {
    let db = TestDb::create().await.unwrap();
    let store = connect(&db.url, 2).await.unwrap();
    store.migrate().await.unwrap();
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    deep_backlog(&pool, "shallow", 50).await;
    deep_backlog(&pool, "deep", 2_000).await;
    let held = sqlx::query(
        "INSERT INTO outbox.held_keys (consumer, ordering_key, message_id, seq, held_at)
         SELECT DISTINCT ON (ordering_key) consumer, ordering_key, message_id, seq, now()
           FROM outbox.deliveries WHERE consumer = 'deep' AND ordering_key IS NOT NULL
          ORDER BY ordering_key, seq",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(held.rows_affected(), 49);
    leases_cost_alike(&pool, "ANALYZE outbox.messages, outbox.deliveries, outbox.held_keys", 3_000).await;
    let now = Utc::now();
    let leased = store
        .delivery_lease_batch(
            &ConsumerName::parse("c", "deep").unwrap(),
            "s",
            64,
            "",
            crate::clock::add(now, Duration::from_secs(30)),
            now,
        )
        .await
        .unwrap();
    assert_eq!(leased.len(), 64);
    assert!(leased.iter().all(|d| d.message.ordering_key.is_none()), "nothing of a held key");
}

/// A lease planned while `outbox.deliveries` was empty — the lease connections cache one plan
/// each (ADR 0016), and a quiet system's first lease plans on an empty table — still costs
/// what it returns once a deep keyed backlog has been written behind that plan without any
/// ANALYZE: the connections' settings keep the planner on the indexes whatever size it saw.
#[tokio::test]
async fn a_lease_planned_while_the_table_was_empty_costs_what_it_returns_from_a_deep_backlog() {
    let db = TestDb::create().await.unwrap();
    let store = connect(&db.url, 2).await.unwrap();
    store.migrate().await.unwrap();
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let options: sqlx::postgres::PgConnectOptions = db.url.parse().unwrap();
    let mut conn = sqlx::PgConnection::connect_with(&options.options(super::postgres::LEASE_SETTINGS.iter().copied()))
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "PREPARE lease(text, timestamptz, bigint, timestamptz, text, text) AS {}",
        super::postgres::q::DELIVERY_LEASE
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    let lease = |consumer: &str| {
        format!(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE lease('{consumer}', now(), 64, now() + interval '30 seconds', 's', '')"
        )
    };
    // Planned and cached now, on the empty table.
    let mut tx = conn.begin().await.unwrap();
    let plan: serde_json::Value =
        sqlx::query_scalar(sqlx::AssertSqlSafe(lease("nobody"))).fetch_one(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(plan[0]["Plan"]["Actual Rows"], 0);
    deep_backlog(&pool, "shallow", 50).await;
    deep_backlog(&pool, "deep", 2_000).await;
    let mut cost = Vec::new();
    for consumer in ["shallow", "deep"] {
        let mut tx = conn.begin().await.unwrap();
        let plan: serde_json::Value =
            sqlx::query_scalar(sqlx::AssertSqlSafe(lease(consumer))).fetch_one(&mut *tx).await.unwrap();
        tx.rollback().await.unwrap();
        let (buffers, rows) = buffers_and_rows(&plan);
        assert_eq!(rows, 64, "{consumer}: a full batch");
        cost.push(buffers);
    }
    let (shallow, deep) = (cost[0], cost[1]);
    assert!(deep <= 3_000, "{deep} buffers behind 196,000 deliveries ({shallow} behind 4,900)");
    assert!(deep <= shallow * 3 / 2 + 100, "does not grow with the backlog: {shallow} shallow, {deep} deep");
}

/// The same for the pending batches a relay writes while no stream is attached (ADR 0042): a
/// lease of 64 from behind 100,000 batch-held deliveries touches about as many buffers as from
/// behind 1,000, with either plan, before and after fresh statistics.
#[tokio::test]
async fn a_lease_from_pending_batches_costs_what_it_returns_not_the_backlog_behind_it() {
    let db = TestDb::create().await.unwrap();
    let store = connect(&db.url, 2).await.unwrap();
    store.migrate().await.unwrap();
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    for (name, n) in [("shallow", 1_000_i64), ("deep", 100_000)] {
        sqlx::query(
            "INSERT INTO outbox.consumers (name, topics, max_deliveries, backoff_base_ms, backoff_max_ms, ack_deadline_ms, start_from)
             VALUES ($1, '{t}', 5, 1000, 10000, 30000, 'new')",
        )
        .bind(name)
        .execute(&pool)
        .await
        .unwrap();
        // Batches of 500, as relay passes write them.
        sqlx::query(
            "WITH m AS (
                INSERT INTO outbox.messages (message_id, topic, type, payload, relayed_at)
                SELECT gen_random_uuid(), 't', 'T', '\\x00', now() FROM generate_series(1, $2) g
                RETURNING seq)
             INSERT INTO outbox.delivery_ranges (consumer, state, seqs, span, at)
             SELECT $1, 'pending', range_agg(int8range(seq, seq + 1)), int8range(min(seq), max(seq) + 1), now()
               FROM (SELECT seq, (row_number() OVER (ORDER BY seq) - 1) / 500 AS chunk FROM m) x
              GROUP BY chunk ORDER BY chunk",
        )
        .bind(name)
        .bind(n)
        .execute(&pool)
        .await
        .unwrap();
    }
    leases_cost_alike(&pool, "ANALYZE outbox.messages, outbox.delivery_ranges", 1_500).await;
    // Through the store: the 64 lowest seqs, in order, and the next lease goes on after them.
    let now = Utc::now();
    let c = ConsumerName::parse("c", "deep").unwrap();
    let until = crate::clock::add(now, Duration::from_secs(30));
    let first = store.delivery_lease_batch(&c, "s", 64, "", until, now).await.unwrap();
    let second = store.delivery_lease_batch(&c, "s", 64, "", until, now).await.unwrap();
    let seqs: Vec<i64> = first.iter().chain(&second).map(|d| d.message.seq).collect();
    assert_eq!(seqs.len(), 128);
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "consecutive seqs: {seqs:?}");
}

/// Buffers one call touches, nested statements included (`EXPLAIN (ANALYZE, BUFFERS)` of a
/// `SELECT` of the call), and its result, after `setup`, in a transaction rolled back afterwards.
async fn call_buffers(conn: &mut sqlx::PgConnection, setup: &str, call: &str) -> (i64, serde_json::Value) {
    let mut tx = conn.begin().await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("{setup}; SAVEPOINT measured"))).execute(&mut *tx).await.unwrap();
    let plan: serde_json::Value =
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {call}")))
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    // Once more for its result, on the same rows.
    sqlx::raw_sql("ROLLBACK TO SAVEPOINT measured").execute(&mut *tx).await.unwrap();
    let result: serde_json::Value =
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT to_jsonb(x) FROM ({call}) x")))
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    tx.rollback().await.unwrap();
    (buffers_and_rows(&plan).0, result)
}

/// Rows in `outbox.deliveries` are the exceptions (ADR 0041): a lease from a pending batch and a
/// stream's ack of batch-held deliveries find the few seqs with a row of their own by a range
/// scan per run of seqs, not by a look-up per delivery (ADR 0048). Both touch about as many
/// buffers for 512 deliveries as for 8, however many rows other consumers hold.
#[tokio::test]
async fn a_lease_and_an_ack_of_batch_held_deliveries_cost_per_run_not_per_delivery() {
    let db = TestDb::create().await.unwrap();
    let store = connect(&db.url, 2).await.unwrap();
    store.migrate().await.unwrap();
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    // Another consumer's 100,000 rows: a primary key deep enough that a look-up costs 3 buffers.
    deep_backlog(&pool, "other", 1_000).await;
    sqlx::query(
        "INSERT INTO outbox.consumers (name, topics, max_deliveries, backoff_base_ms, backoff_max_ms, ack_deadline_ms, start_from)
         VALUES ('c', '{t}', 5, 1000, 10000, 30000, 'new')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let first: i64 = sqlx::query_scalar(
        "INSERT INTO outbox.messages (message_id, topic, type, payload, relayed_at)
         SELECT gen_random_uuid(), 't', 'T', '\\x00', now() FROM generate_series(1, 512) RETURNING seq",
    )
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .min()
    .unwrap();
    // One of them has a row of its own (a transactional ack got there first): neither leased
    // nor acked again, whatever the batch says.
    let own = first + 100;
    sqlx::query(
        "INSERT INTO outbox.deliveries (message_id, consumer, seq, state, delivery_count, available_at, created_at, updated_at, acked_at)
         SELECT message_id, 'c', seq, 'acked', 0, now(), now(), now(), now() FROM outbox.messages WHERE seq = $1",
    )
    .bind(own)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE outbox.deliveries").execute(&pool).await.unwrap();
    // One connection, its first calls not counted: they load the functions and plan them.
    let mut conn = pool.acquire().await.unwrap();
    let mut cost = Vec::new();
    for n in [8_i64, 8, 512] {
        let range = format!("'{{[{first},{})}}'::int8multirange", first + n);
        let (lease, leased) = call_buffers(
            &mut conn,
            &format!("INSERT INTO outbox.delivery_ranges (consumer, state, seqs, span, at) VALUES ('c', 'pending', {range}, range_merge({range}), now())"),
            &format!("SELECT outbox.lease_pending_visible('c', now(), {n}::integer, now() + interval '30 seconds', 's', NULL)::text AS seqs"),
        )
        .await;
        let (ack, acked) = call_buffers(
            &mut conn,
            &format!(
                "INSERT INTO outbox.delivery_ranges (consumer, state, leased_by, seqs, span, lease_expires_at, at)
                 VALUES ('c', 'leased', 's', {range} - '{{[{own},{})}}', range_merge({range}),
                         now() + interval '30 seconds', now())",
                own + 1
            ),
            &format!("SELECT outbox.ack_seqs('c', '{{{first}}}', '{{{}}}', now()) AS changed", first + n),
        )
        .await;
        if n == 512 {
            assert_eq!(
                leased["seqs"],
                format!("{{[{first},{own}),[{},{})}}", own + 1, first + n),
                "the seq with a row of its own is not leased"
            );
            assert_eq!(acked["changed"], 511, "the seq with a row of its own is not acked again");
        } else {
            assert_eq!(leased["seqs"], format!("{{[{first},{})}}", first + n));
            assert_eq!(acked["changed"], n);
        }
        cost.push((lease, ack));
    }
    let [_, (lease_8, ack_8), (lease_512, ack_512)] = cost[..] else { unreachable!() };
    let case = format!("lease {lease_8} → {lease_512} buffers, ack {ack_8} → {ack_512} buffers for 8 → 512 deliveries");
    assert!(lease_512 <= lease_8 + 60, "{case}");
    assert!(ack_512 <= ack_8 + 60, "{case}");
}

/// A producer on the system's SQLite (Python's `sqlite3` module links it; 3.40 on Debian 12,
/// where `unixepoch('subsec')` is NULL) writes the documented INSERT (docs/sql-api.md) into a file that
/// an older outboxd schema created and this one migrated: the row gets its defaults and is
/// delivered. The migration keeps every message and delivery, and the seq counter: a pruned
/// highest seq is not handed out again.
#[tokio::test]
async fn the_documented_sqlite_insert_works_on_the_system_library_after_migrating_an_old_file() {
    let db = TestSqlite::create().unwrap();
    let path = db.url.trim_start_matches("sqlite://").to_owned();
    {
        // The schema as it was before the portable defaults.
        let old = sqlx::migrate::Migrator {
            migrations: std::borrow::Cow::Owned(
                super::sqlite::MIGRATOR.migrations.iter().filter(|m| m.version <= 2).cloned().collect(),
            ),
            ..sqlx::migrate::Migrator::DEFAULT
        };
        let pool = sqlx::SqlitePool::connect(&format!("{}?mode=rwc", db.url)).await.unwrap();
        old.run(&pool).await.unwrap();
        sqlx::raw_sql(
            "INSERT INTO outbox_consumers (name, topics, max_deliveries, backoff_base_ms, backoff_max_ms, ack_deadline_ms, start_from, created_at)
             VALUES ('c', '[\"orders.>\"]', 5, 1000, 10000, 30000, 'earliest', 0);
             INSERT INTO outbox_messages (topic, type, payload, enqueued_at, relayed_at) VALUES
                 ('orders.created', 'T', x'01', 1, 1), ('orders.created', 'T', x'02', 2, 2), ('orders.created', 'T', x'03', 3, NULL);
             INSERT INTO outbox_deliveries (message_id, consumer, seq, state, available_at, created_at, updated_at)
             SELECT message_id, 'c', seq, 'acked', 1, 1, 1 FROM outbox_messages WHERE seq = 1;
             INSERT INTO outbox_deliveries (message_id, consumer, seq, state, delivery_count, available_at, created_at, updated_at)
             SELECT message_id, 'c', seq, 'pending', 2, 2, 2, 2 FROM outbox_messages WHERE seq = 2;
             DELETE FROM outbox_messages WHERE seq = 3;",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    }
    let store = connect(&db.url, 2).await.unwrap();
    store.migrate().await.unwrap();

    let script = r#"
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=5)
print(sqlite3.sqlite_version)
with conn:
    conn.execute("INSERT INTO outbox_messages (topic, type, payload, headers, message_id, ordering_key) "
                 "VALUES ('orders.created', 'OrderCreated', x'7b226964223a34327d', '{\"tenant\":\"acme\"}', "
                 "'0193b5c2-7f00-7000-8000-000000000042', 'order-42') ON CONFLICT (message_id) DO NOTHING")
    conn.execute("INSERT INTO outbox_messages (topic, type, payload) VALUES ('orders.created', 'OrderCreated', x'7b7d')")
"#;
    let out = std::process::Command::new("python3").args(["-c", script, &path]).output().expect("python3 runs");
    assert!(out.status.success(), "the documented insert failed: {}", String::from_utf8_lossy(&out.stderr));
    eprintln!("system SQLite {}", String::from_utf8_lossy(&out.stdout).trim());

    let now = Utc::now();
    let messages = store.message_list_after(0, 10).await.unwrap();
    let seqs: Vec<i64> = messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, [1, 2, 4, 5], "rows kept; the pruned seq 3 is not reused");
    for m in &messages[2..] {
        let age = now - m.enqueued_at;
        assert!(
            age >= chrono::Duration::zero() && age < chrono::Duration::seconds(60),
            "enqueued_at {}",
            m.enqueued_at
        );
    }
    let (_, rows) = store.message_get(messages[1].message_id).await.unwrap();
    assert_eq!(rows.len(), 1, "deliveries survive the rebuild: {rows:?}");
    assert_eq!(rows[0].delivery_count, 2);

    // And they are delivered.
    let c = ConsumerName::parse("c", "c").unwrap();
    store.relay_batch(500, now, false, &[]).await.unwrap();
    let leased = store
        .delivery_lease_batch(&c, "s", 10, "", crate::clock::add(now, Duration::from_secs(30)), now)
        .await
        .unwrap();
    let leased: Vec<i64> = leased.iter().map(|d| d.message.seq).collect();
    assert_eq!(leased, [2, 4, 5]);
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
    store.relay_batch(10, now, false, &[]).await.unwrap();
    let later = crate::clock::add(now, Duration::from_secs(30));
    let leased = store.delivery_lease_batch(&c.name, "s", 10, "", later, now).await.unwrap();
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
    let relayed = store.relay_batch(10, now, false, &[]).await.unwrap();
    assert_eq!(relayed.messages, 1, "the producer's row");
    holder.await.unwrap();
}
/// Dead letters grouped by last error (largest group first, with first and last time, topics
/// and types); a group listed alone; a replay of one group (`last_error`) selects only it.
async fn dead_letters_group_by_last_error_and_a_group_replays_alone(store: SharedStore) {
    let now = Utc::now().trunc_subsecs(6);
    let c = spec("c", &["t.*"], 1);
    store.consumer_create(&c, now).await.unwrap();
    let mut ids = Vec::new();
    for (topic, type_) in [("t.a", "A"), ("t.b", "B"), ("t.a", "A"), ("t.c", "C")] {
        let m = NewMessage { type_: type_.into(), ..msg(topic) };
        ids.push(store.message_insert(&m, now).await.unwrap().message_id);
    }
    store.relay_batch(10, now, false, &[]).await.unwrap();
    let later = crate::clock::add(now, Duration::from_secs(30));
    assert_eq!(store.delivery_lease_batch(&c.name, "s", 10, "", later, now).await.unwrap().len(), 4);
    let errors = ["card declined", "card declined", "card declined", "timeout"];
    let releases: Vec<Release> = ids
        .iter()
        .zip(errors)
        .map(|(id, e)| Release {
            consumer: c.name.clone(),
            message_id: *id,
            state: DeliveryState::Dead,
            available_at: now,
            error: Some(e.into()),
            attempt: Attempt::Failed,
        })
        .collect();
    assert_eq!(store.delivery_release_many(&releases, ReleaseGuard::Session("s"), now).await.unwrap(), 4);

    let groups = store.dead_letter_groups(&c.name, 10).await.unwrap();
    assert_eq!(groups.len(), 2, "{groups:?}");
    assert_eq!((groups[0].last_error.as_deref(), groups[0].count), (Some("card declined"), 3));
    assert_eq!(groups[0].topics, vec!["t.a", "t.b"]);
    assert_eq!(groups[0].types, vec!["A", "B"]);
    assert_eq!((groups[0].first_dead_at, groups[0].last_dead_at), (Some(now), Some(now)));
    assert_eq!((groups[1].last_error.as_deref(), groups[1].count), (Some("timeout"), 1));
    assert_eq!(store.dead_letter_groups(&c.name, 1).await.unwrap().len(), 1, "bounded");

    let listed = store.dead_letter_list_with_error(&c.name, Some("timeout"), 0, 10).await.unwrap();
    assert_eq!(listed.iter().map(|d| d.message.message_id).collect::<Vec<_>>(), vec![ids[3]]);

    let filter = ReplayFilter { dead_only: true, last_error: Some("card declined".into()), ..Default::default() };
    let candidates = store.replay_candidates(&c.name, &filter, 0, 10).await.unwrap();
    assert_eq!(candidates.iter().map(|c| c.message_id).collect::<Vec<_>>(), ids[..3].to_vec());
}

/// A search reads a window of the newest messages below its cursor, matches in it, and says
/// where the next page starts, whatever the history's size.
async fn a_search_pages_newest_first_through_bounded_windows(store: SharedStore) {
    let now = Utc::now().trunc_subsecs(6);
    let mut seqs = Vec::new();
    for i in 0..30 {
        let m = NewMessage {
            type_: if i % 3 == 0 { "Wanted".into() } else { "Other".into() },
            ordering_key: (i % 2 == 0).then(|| "k".to_owned()),
            ..msg(if i < 15 { "s.old" } else { "s.new" })
        };
        seqs.push(store.message_insert(&m, now).await.unwrap().seq);
    }
    let wanted = MessageQuery { type_: Some("Wanted".into()), ..Default::default() };
    // A window of 10 (seqs 30..21) holds Wanted at i = 27, 24, 21.
    let page = store.message_search(&wanted, None, 2, 10).await.unwrap();
    assert_eq!(page.messages.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![seqs[27], seqs[24]]);
    assert_eq!(page.next_before_seq, Some(seqs[24]), "a full page: on from its last match");
    let page = store.message_search(&wanted, page.next_before_seq, 5, 10).await.unwrap();
    assert_eq!(page.messages.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![seqs[21], seqs[18], seqs[15]]);
    assert_eq!((page.scanned, page.next_before_seq), (10, Some(seqs[14])), "a full window: on below it");
    // Nothing matches in a window: it still moves on.
    let none = MessageQuery { topic: Some(pattern("s.nothing")), ..Default::default() };
    let page = store.message_search(&none, None, 5, 10).await.unwrap();
    assert!(page.messages.is_empty());
    assert_eq!(page.next_before_seq, Some(seqs[20]));
    // The end of history: no next page.
    let q = MessageQuery { topic: Some(pattern("s.old")), ordering_key: Some("k".into()), ..Default::default() };
    let page = store.message_search(&q, Some(seqs[10]), 50, 100).await.unwrap();
    assert_eq!(
        page.messages.iter().map(|m| m.seq).collect::<Vec<_>>(),
        vec![seqs[8], seqs[6], seqs[4], seqs[2], seqs[0]]
    );
    assert_eq!(page.next_before_seq, None);
    // A time range outside every message's: nothing, and nothing more.
    for q in [
        MessageQuery { before: Some(now), ..Default::default() },
        MessageQuery { after: Some(crate::clock::add(now, Duration::from_secs(1))), ..Default::default() },
    ] {
        let page = store.message_search(&q, None, 5, 10).await.unwrap();
        assert_eq!((page.messages.len(), page.next_before_seq), (0, None), "{q:?}");
    }
    // One that holds them all: the same pages as none.
    let all = MessageQuery { after: Some(now), type_: Some("Wanted".into()), ..Default::default() };
    let page = store.message_search(&all, None, 2, 10).await.unwrap();
    assert_eq!(page.messages.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![seqs[27], seqs[24]]);
}

/// A tail's read (issue 47 item 2): it looks at topics and sizes only, in windows of `scan`,
/// matches its patterns as the relay does (`*` one segment, `>` the rest), takes at most
/// `limit` matches and moves its cursor past what it looked at and no further than the first
/// match it left; payloads are read for the matches alone.
async fn a_tail_reads_only_its_patterns_topics_in_bounded_windows_and_payloads_of_its_matches(store: SharedStore) {
    let now = Utc::now().trunc_subsecs(6);
    let mut seqs = Vec::new();
    for topic in ["orders.created", "payments.card", "orders.eu.created", "orders.updated", "payments.cash", "orders.x"]
    {
        let payload = if topic.starts_with("payments") { vec![7u8; 100_000] } else { b"{}".to_vec() };
        seqs.push(store.message_insert(&NewMessage { payload, ..msg(topic) }, now).await.unwrap().seq);
    }
    let orders = [TopicPattern::parse("topics", "orders.*").unwrap()];
    let page = store.message_tail(0, &orders, 100, 2).await.unwrap();
    assert_eq!(
        page.hits.iter().map(|h| h.seq).collect::<Vec<_>>(),
        [seqs[0], seqs[3]],
        "orders.eu.created is two segments"
    );
    assert_eq!((page.next_after, page.more), (seqs[4], true), "up to the match left out, past payments.cash");
    // payload, headers (`{}`), topic and type.
    assert_eq!(page.hits[0].bytes, 2 + 2 + "orders.created".len() + 1);
    let page = store.message_tail(page.next_after, &orders, 100, 2).await.unwrap();
    assert_eq!(page.hits.iter().map(|h| h.seq).collect::<Vec<_>>(), [seqs[5]]);
    assert_eq!((page.next_after, page.more), (seqs[5], false));
    // A window of other topics moves the cursor on, and says more may follow.
    let eu = [TopicPattern::parse("topics", "orders.eu.>").unwrap()];
    let page = store.message_tail(0, &eu, 2, 8).await.unwrap();
    assert!(page.hits.is_empty());
    assert_eq!((page.next_after, page.more), (seqs[1], true));
    let page = store.message_tail(page.next_after, &eu, 2, 8).await.unwrap();
    assert_eq!(page.hits.iter().map(|h| h.seq).collect::<Vec<_>>(), [seqs[2]]);
    assert_eq!((page.next_after, page.more), (seqs[3], true));
    // `>` is everything; the payments' sizes are known before their payloads are read.
    let all = [TopicPattern::parse("topics", ">").unwrap()];
    let page = store.message_tail(0, &all, 100, 8).await.unwrap();
    assert_eq!(page.hits.len(), 6);
    assert!(page.hits[1].bytes > 100_000 && page.hits[1].bytes < 100_100, "{:?}", page.hits[1]);
    // Payloads only of the seqs asked for (one of them gone).
    let read = store.message_list_of_seqs(&[seqs[1], seqs[5], seqs[5] + 100]).await.unwrap();
    assert_eq!(read.iter().map(|m| (m.seq, m.payload.len())).collect::<Vec<_>>(), [(seqs[1], 100_000), (seqs[5], 2)]);
    assert!(store.message_list_of_seqs(&[]).await.unwrap().is_empty());
}

/// A search by topic takes a pattern as a consumer does (`*` one segment, `>` the rest), also
/// where a looser match would take more (a `*` that spans a dot, a literal after a `*` shifted
/// by one), and pages through it as through any search.
async fn a_search_by_topic_pattern_matches_as_a_consumers_patterns_do(store: SharedStore) {
    let now = Utc::now().trunc_subsecs(6);
    let topics = [
        "orders.created",
        "orders.eu.created",
        "orders.eu.x.created",
        "orders",
        "billing.created",
        "orders.x",
        "orders.a.b.x.c",
    ];
    let mut seq_of = std::collections::HashMap::new();
    for t in topics {
        seq_of.insert(t, store.message_insert(&msg(t), now).await.unwrap().seq);
    }
    let found = |p: &'static str, limit: i64| {
        let store = store.clone();
        async move {
            let q = MessageQuery { topic: Some(pattern(p)), ..Default::default() };
            let mut topics = Vec::new();
            let mut cursor = None;
            loop {
                let page = store.message_search(&q, cursor, limit, 100).await.unwrap();
                assert!(page.messages.len() as i64 <= limit, "{p}: a page of at most {limit}");
                topics.extend(page.messages.into_iter().map(|m| m.topic));
                match page.next_before_seq {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            topics.reverse();
            topics
        }
    };
    for limit in [1, 100] {
        assert_eq!(found("orders.*", limit).await, ["orders.created", "orders.x"], "one segment");
        assert_eq!(
            found("orders.>", limit).await,
            ["orders.created", "orders.eu.created", "orders.eu.x.created", "orders.x", "orders.a.b.x.c"],
            "the rest"
        );
        assert_eq!(found("*.created", limit).await, ["orders.created", "billing.created"]);
        assert_eq!(found("orders.*.created", limit).await, ["orders.eu.created"], "not orders.eu.x.created");
        assert_eq!(
            found("orders.*.x.>", limit).await,
            ["orders.eu.x.created"],
            "a literal after a `*` stays in place: not orders.a.b.x.c"
        );
        assert_eq!(found("orders.eu.>", limit).await, ["orders.eu.created", "orders.eu.x.created"]);
        assert_eq!(found("orders", limit).await, ["orders"], "a plain topic is matched exactly");
    }
    assert!(seq_of.len() == topics.len());
}

/// A consumer's unfinished deliveries, listed by kind wherever they are held (on PostgreSQL,
/// pending and leased ranges as well as rows): in flight (pushed and leased), retrying (nacked,
/// with their count and error), pending (all of those waiting, a row deciding over a range);
/// a page of any size walks the same list, and the lists agree with the stats.
async fn a_consumers_pending_retrying_and_in_flight_deliveries_page_in_seq_order(store: SharedStore) {
    let now = Utc::now().trunc_subsecs(6);
    let later = crate::clock::add(now, Duration::from_secs(30));
    let retry_at = crate::clock::add(now, Duration::from_secs(10));
    let c = spec("c", &["t"], 5);
    store.consumer_create(&c, now).await.unwrap();
    store.consumer_create(&spec("other", &["t"], 5), now).await.unwrap();
    let mut a = Vec::new();
    for _ in 0..10 {
        a.push(store.message_insert(&msg("t"), now).await.unwrap().message_id);
    }
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 3, lease_until: later };
    assert_eq!(store.relay_batch(100, now, false, &[offer]).await.unwrap().pushed.len(), 3, "a0..a2 pushed");
    let leased = store.delivery_lease_batch(&c.name, "s2", 2, "", later, now).await.unwrap();
    assert_eq!(leased.iter().map(|l| l.message.message_id).collect::<Vec<_>>(), a[3..5], "a3, a4 leased");
    let nack = |id: MessageId| Release {
        consumer: c.name.clone(),
        message_id: id,
        state: DeliveryState::Pending,
        available_at: retry_at,
        error: Some("boom".into()),
        attempt: Attempt::Failed,
    };
    assert_eq!(store.delivery_release_many(&[nack(a[1])], ReleaseGuard::Session("s1"), now).await.unwrap(), 1);
    assert_eq!(store.delivery_release_many(&[nack(a[4])], ReleaseGuard::Session("s2"), now).await.unwrap(), 1);
    assert_eq!(store.delivery_ack_many(&c.name, &[a[6]], now).await.unwrap(), 1, "acked while it waits");
    // A second pass: a keyed message (a row of its own) and three more (another range).
    let keyed = NewMessage { ordering_key: Some("k".into()), ..msg("t") };
    let k = store.message_insert(&keyed, now).await.unwrap().message_id;
    let mut b = Vec::new();
    for _ in 0..3 {
        b.push(store.message_insert(&msg("t"), now).await.unwrap().message_id);
    }
    store.relay_batch(100, now, false, &[]).await.unwrap();

    let walk = |kind: UnackedKind, limit: i64, scan: i64| {
        let store = store.clone();
        let c = c.name.clone();
        async move {
            let mut all = Vec::new();
            let mut after = 0;
            for _ in 0..100 {
                let page = store.delivery_list_unacked(&c, kind, after, limit, scan).await.unwrap();
                assert!(page.deliveries.len() as i64 <= limit, "{kind:?}: a page of at most {limit}");
                all.extend(page.deliveries);
                match page.next_after_seq {
                    Some(next) => {
                        assert!(next > after, "{kind:?}: the cursor moves on");
                        after = next;
                    }
                    None => return all,
                }
            }
            panic!("{kind:?} does not end");
        }
    };
    let ids = |v: &[UnackedDelivery]| v.iter().map(|d| d.message.message_id).collect::<Vec<_>>();
    let stats = store.consumer_stats(Some("c"), false).await.unwrap().remove(0);

    let in_flight = walk(UnackedKind::InFlight, 100, 100).await;
    assert_eq!(ids(&in_flight), [a[0], a[2], a[3]], "pushed and leased, not the nacked ones");
    assert!(in_flight.iter().all(|d| d.state == DeliveryState::Leased && d.delivery_count == 1));
    assert!(in_flight.iter().all(|d| d.lease_expires_at == Some(later)), "{in_flight:?}");
    assert_eq!(in_flight.len() as i64, stats.in_flight);

    let retrying = walk(UnackedKind::Retrying, 100, 100).await;
    assert_eq!(ids(&retrying), [a[1], a[4]]);
    for d in &retrying {
        assert_eq!((d.state, d.delivery_count, d.available_at), (DeliveryState::Pending, 1, retry_at));
        assert_eq!(d.last_error.as_deref(), Some("boom"));
    }
    assert_eq!(retrying.len() as i64, stats.retrying);

    let pending = walk(UnackedKind::Pending, 100, 100).await;
    let want = [a[1], a[4], a[5], a[7], a[8], a[9], k, b[0], b[1], b[2]];
    assert_eq!(ids(&pending), want, "waiting ones, wherever held, not the acked one");
    assert!(pending.iter().all(|d| d.state == DeliveryState::Pending && d.lease_expires_at.is_none()));
    assert!(pending.iter().filter(|d| d.delivery_count == 0).all(|d| d.available_at == now && d.last_error.is_none()));
    assert_eq!(pending[2].message.topic, "t");
    assert_eq!(pending[6].message.ordering_key.as_deref(), Some("k"));
    assert_eq!(pending.len() as i64, stats.backlog);
    let seqs: Vec<i64> = pending.iter().map(|d| d.message.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in seq order: {seqs:?}");

    // Any page size walks the same lists; a retry page reads at most `scan` pending ones and
    // moves on even when it finds none.
    for limit in [1, 2, 3] {
        assert_eq!(ids(&walk(UnackedKind::Pending, limit, 100).await), want, "pages of {limit}");
        assert_eq!(ids(&walk(UnackedKind::InFlight, limit, 100).await), [a[0], a[2], a[3]]);
        assert_eq!(ids(&walk(UnackedKind::Retrying, limit, 1).await), [a[1], a[4]], "scan 1, pages of {limit}");
    }
    let page = store.delivery_list_unacked(&c.name, UnackedKind::Retrying, 0, 10, 1).await.unwrap();
    assert_eq!(ids(&page.deliveries), [a[1]]);
    let a4 = pending[1].message.seq;
    let page = store.delivery_list_unacked(&c.name, UnackedKind::Retrying, a4, 10, 1).await.unwrap();
    assert!(page.deliveries.is_empty(), "no retry within the one pending row after a4: {page:?}");
    assert!(page.next_after_seq.is_some_and(|n| n > a4), "and on past it: {page:?}");
    let unknown = ConsumerName::parse("name", "nobody").unwrap();
    assert!(matches!(
        store.delivery_list_unacked(&unknown, UnackedKind::Pending, 0, 10, 10).await,
        Err(StoreError::ConsumerNotFound(_))
    ));
}

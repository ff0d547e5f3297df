//! PostgreSQL only: the decisions that read more than one of the places a delivery's state can
//! be in (its row, a leased range, a pending range, an acked range), interleaved on purpose with the
//! transactions that move a delivery between those places (ADR 0052).
//!
//! Each case pauses one session right after one of its own statements: a test-only statement
//! trigger on the four tables waits, in the session that asked for it, on an advisory lock the
//! test holds. While it waits, a mover runs; the test lets the paused session go on once the
//! mover has committed or is itself waiting for a lock. The interleaving is the same at every
//! run: no sleeps, no timing.
//!
//! The first case is the loss that chaos found: `outbox.ack` answered "already acked" for a
//! delivery that the sweeper had just moved from its leased range into a row, so the consumer
//! rolled its effect back, and its stream ack then acked the row: a message with no effect.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use sqlx::{Connection, PgConnection, PgPool};

use super::*;
use crate::domain::{Attempt, Backoff, ConsumerSpec, StartFrom, Topic, TopicPattern};
use crate::testing::TestDb;

/// The advisory lock a paused session waits on.
const PAUSE_LOCK: i64 = 0x6f75_7462_6f78_7e57;

/// Test-only: an AFTER … FOR EACH STATEMENT trigger on the four places, which waits on
/// [`PAUSE_LOCK`] once in a session whose `outbox_test.pause` names the table and the
/// operation (`deliveries:UPDATE`), after that statement (its snapshot taken, its rows written).
const PAUSE_TRIGGERS: &str = r#"
CREATE FUNCTION outbox.test_pause() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('outbox_test.pause', true) = TG_TABLE_NAME || ':' || TG_OP THEN
        PERFORM set_config('outbox_test.pause', 'done', false);
        PERFORM pg_advisory_xact_lock_shared({PAUSE_LOCK});
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER test_pause AFTER INSERT OR UPDATE OR DELETE ON outbox.deliveries
    FOR EACH STATEMENT EXECUTE FUNCTION outbox.test_pause();
CREATE TRIGGER test_pause AFTER INSERT OR UPDATE OR DELETE ON outbox.delivery_ranges
    FOR EACH STATEMENT EXECUTE FUNCTION outbox.test_pause();
"#;

const WAIT: Duration = Duration::from_secs(20);

fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(3)
}

/// A migrated database with one consumer `c` on topic `t` (ack deadline 15 s, backoff from
/// 250 ms), the pause triggers, and an effects table.
async fn setup() -> (TestDb, PgStore) {
    let db = TestDb::create().await.unwrap();
    let store = PgStore::connect(&db.url, 8).await.unwrap();
    store.migrate().await.unwrap();
    let triggers = PAUSE_TRIGGERS.replace("{PAUSE_LOCK}", &PAUSE_LOCK.to_string());
    sqlx::raw_sql(sqlx::AssertSqlSafe(triggers)).execute(store.pool()).await.unwrap();
    sqlx::query("CREATE TABLE app_effects (message_id uuid NOT NULL)").execute(store.pool()).await.unwrap();
    let spec = ConsumerSpec {
        name: ConsumerName::parse("name", "c").unwrap(),
        topics: vec![TopicPattern::parse("topics", "t").unwrap()],
        max_deliveries: 100,
        backoff: Backoff { base: Duration::from_millis(250), max: Duration::from_secs(1) },
        ack_deadline: Duration::from_secs(15),
        start_from: StartFrom::New,
        sink: None,
        dead_key_policy: Default::default(),
    };
    store.consumer_create(&spec, now()).await.unwrap();
    (db, store)
}

fn consumer() -> ConsumerName {
    ConsumerName::parse("name", "c").unwrap()
}

async fn enqueue(store: &PgStore, at: DateTime<Utc>) -> Enqueued {
    let msg = NewMessage {
        message_id: None,
        topic: Topic::parse("topic", "t").unwrap(),
        type_: "T".into(),
        payload: b"{}".to_vec(),
        headers: Default::default(),
        ordering_key: None,
        delay: None,
    };
    store.message_insert(&msg, at).await.unwrap()
}

/// One message, pushed by a relay pass to stream `s1` in a leased range until `until`.
async fn pushed(store: &PgStore, at: DateTime<Utc>, until: DateTime<Utc>) -> Enqueued {
    let sent = enqueue(store, at).await;
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 1, lease_until: until };
    let out = store.relay_pass(10, at, false, &[offer]).await.unwrap();
    assert_eq!(out.pushed.len(), 1, "pushed");
    assert!(held_in(store.pool(), "leased", sent.seq).await, "in a leased range");
    sent
}

/// One message, relayed with no stream to push to: waiting in a pending range.
async fn waiting(store: &PgStore, at: DateTime<Utc>) -> Enqueued {
    let sent = enqueue(store, at).await;
    let out = store.relay_pass(10, at, false, &[]).await.unwrap();
    assert_eq!((out.pushed.len(), out.deliveries), (0, 1));
    assert!(held_in(store.pool(), "pending", sent.seq).await, "in a pending range");
    sent
}

async fn held_in(pool: &PgPool, state: &str, seq: i64) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox.delivery_ranges WHERE state = $2 AND seqs @> $1)")
        .bind(seq)
        .bind(state)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The sweeper's pass at `at`: expired leased ranges become rows, then expired rows go back
/// to pending with "ack deadline expired", due after the backoff, as `maintenance::sweeper`
/// does.
async fn sweep(store: PgStore, at: DateTime<Utc>) {
    let d = &store;
    let expired = d.delivery_expired(at, 100).await.unwrap();
    let releases: Vec<Release> = expired
        .iter()
        .map(|e| Release {
            consumer: e.consumer.clone(),
            message_id: e.message_id,
            state: DeliveryState::Pending,
            available_at: at + chrono::Duration::milliseconds(250),
            error: Some("ack deadline expired".into()),
            attempt: Attempt::Failed,
        })
        .collect();
    d.delivery_release_many(&releases, ReleaseGuard::ExpiredAt(at), at).await.unwrap();
}

/// A session paused after its first statement of `point` (`table:OPERATION`).
struct Paused {
    control: PgConnection,
    pid: i32,
}

/// A connection of its own for the session to pause (the setting stays with the connection),
/// and the control connection that holds the lock it will wait on.
async fn pausable(db: &TestDb, point: &str) -> (PgConnection, Paused) {
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("SELECT set_config('outbox_test.pause', $1, false)").bind(point).execute(&mut conn).await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut conn).await.unwrap();
    let mut control = PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)").bind(PAUSE_LOCK).execute(&mut control).await.unwrap();
    (conn, Paused { control, pid })
}

impl Paused {
    /// Waits until the session is paused at its point.
    async fn reached(&mut self) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let waiting: bool = sqlx::query_scalar(
                "SELECT coalesce((SELECT wait_event = 'advisory' FROM pg_stat_activity WHERE pid = $1), false)",
            )
            .bind(self.pid)
            .fetch_one(&mut self.control)
            .await
            .unwrap();
            if waiting {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "the session never reached its pause point");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Runs `mover` while the session is paused, until it has finished or waits for a lock
    /// (one the paused session holds); then lets the session go on, and returns the mover.
    async fn while_paused<F>(mut self, mover: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.reached().await;
        let task = tokio::spawn(mover);
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if task.is_finished() {
                break;
            }
            let blocked: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                                 WHERE datname = current_database() AND pid <> $1 AND pid <> pg_backend_pid()
                                   AND wait_event_type = 'Lock')",
            )
            .bind(self.pid)
            .fetch_one(&mut self.control)
            .await
            .unwrap();
            if blocked {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "the mover neither finished nor waited");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        sqlx::query("SELECT pg_advisory_unlock($1)").bind(PAUSE_LOCK).execute(&mut self.control).await.unwrap();
        task
    }
}

/// A consumer's handler with the transactional ack, as the chaos check's consumers do: the
/// effect and `outbox.ack` in one transaction, committed when the ack says true, rolled back
/// when it says false. Runs on `conn`; returns the ack's answer.
async fn effect_with_ack(mut conn: PgConnection, id: MessageId) -> bool {
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("INSERT INTO app_effects VALUES ($1)").bind(id.0).execute(&mut *tx).await.unwrap();
    let acked: bool = sqlx::query_scalar("SELECT outbox.ack('c', $1)").bind(id.0).fetch_one(&mut *tx).await.unwrap();
    if acked {
        tx.commit().await.unwrap();
    } else {
        tx.rollback().await.unwrap();
    }
    acked
}

/// A consumer's transactional ack (see [`effect_with_ack`]) paused right after its first
/// statement while `mover` runs; returns its answer once both are done.
async fn ack_overtaken_by<F>(db: &TestDb, id: MessageId, mover: F) -> bool
where
    F: Future<Output = ()> + Send + 'static,
{
    let (conn, paused) = pausable(db, "deliveries:UPDATE").await;
    let consumer_task = tokio::spawn(effect_with_ack(conn, id));
    let mover = paused.while_paused(mover).await;
    let acked = tokio::time::timeout(WAIT, consumer_task).await.unwrap().unwrap();
    mover.await.unwrap();
    acked
}

async fn effects(pool: &PgPool, id: MessageId) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM app_effects WHERE message_id = $1")
        .bind(id.0)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn row_state(pool: &PgPool, id: MessageId) -> Option<String> {
    sqlx::query_scalar("SELECT state FROM outbox.deliveries WHERE consumer = 'c' AND message_id = $1")
        .bind(id.0)
        .fetch_optional(pool)
        .await
        .unwrap()
}

/// What every case ends with: the delivery is acked, its effect was made exactly once, and no
/// lease, however late, hands it out again.
async fn acked_once_and_never_again(store: &PgStore, id: MessageId, late: DateTime<Utc>) {
    assert_eq!(effects(store.pool(), id).await, 1, "exactly one effect");
    let until = late + chrono::Duration::seconds(30);
    let again = store
        .delivery_lease(&LeaseParams {
            consumer: &consumer(),
            session: "s9",
            limit: 10,
            keys_after: "",
            lease_until: until,
            now: late,
        })
        .await
        .unwrap();
    assert!(again.is_empty(), "delivered again after its ack: {again:?}");
    let stats = store.consumer_stats(Some("c"), true).await.unwrap();
    assert_eq!((stats[0].backlog, stats[0].in_flight, stats[0].acked), (0, 0, 1), "{stats:?}");
}

/// The loss chaos found. A pushed delivery's lease expires; the consumer's transactional ack
/// runs its first statement (no row yet: the delivery is in a leased range); the sweeper turns
/// the range-held seq into a row and commits; the ack goes on. It must ack the row (true), not
/// answer "already acked" for a delivery that is pending.
#[tokio::test]
async fn a_transactional_ack_overtaken_by_the_sweeper_acks_the_row_it_moved_to() {
    let (db, store) = setup().await;
    let at = now();
    let until = at + chrono::Duration::seconds(15);
    let sent = pushed(&store, at, until).await;
    let late = until + chrono::Duration::seconds(1);
    let acked = ack_overtaken_by(&db, sent.message_id, sweep(store.clone(), late)).await;
    assert!(acked, "outbox.ack said \"already acked\" for a delivery the sweeper had made pending");
    // The consumer acks on its stream either way, as the chaos check's consumers do.
    store.delivery_ack_held(&consumer(), &[(sent.message_id, sent.seq)], late).await.unwrap();
    assert_eq!(row_state(store.pool(), sent.message_id).await.as_deref(), Some("acked"));
    acked_once_and_never_again(&store, sent.message_id, late + chrono::Duration::seconds(5)).await;
}

/// The same with the stream's hand-back (a stream that closes releases what it holds): the
/// release moves the range-held seq into a row between the ack's statements.
#[tokio::test]
async fn a_transactional_ack_overtaken_by_a_streams_release_acks_the_row() {
    let (db, store) = setup().await;
    let at = now();
    let until = at + chrono::Duration::seconds(15);
    let sent = pushed(&store, at, until).await;
    let release = Release {
        consumer: consumer(),
        message_id: sent.message_id,
        state: DeliveryState::Pending,
        available_at: at,
        error: None,
        attempt: Attempt::Failed,
    };
    let mover_store = store.clone();
    let acked = ack_overtaken_by(&db, sent.message_id, async move {
        mover_store.delivery_release_many(&[release], ReleaseGuard::Session("s1"), at).await.unwrap();
    })
    .await;
    assert!(acked, "outbox.ack said \"already acked\" for a delivery the release had made pending");
    store.delivery_ack_held(&consumer(), &[(sent.message_id, sent.seq)], at).await.unwrap();
    acked_once_and_never_again(&store, sent.message_id, at + chrono::Duration::seconds(5)).await;
}

/// A transactional ack of a delivery waiting in a pending range, overtaken by a lease that
/// moves it into a leased range: acked (true), and the lease's delivery then finds it acked.
#[tokio::test]
async fn a_transactional_ack_overtaken_by_a_lease_from_a_pending_range_acks_once() {
    let (db, store) = setup().await;
    let at = now();
    let sent = waiting(&store, at).await;
    let mover_store = store.clone();
    let until = at + chrono::Duration::seconds(15);
    let (leased_tx, leased_rx) = tokio::sync::oneshot::channel();
    let acked = ack_overtaken_by(&db, sent.message_id, async move {
        let got = mover_store
            .delivery_lease(&LeaseParams {
                consumer: &consumer(),
                session: "s2",
                limit: 10,
                keys_after: "",
                lease_until: until,
                now: at,
            })
            .await
            .unwrap();
        let _ = leased_tx.send(got.len());
    })
    .await;
    assert!(acked, "the first transactional ack of a waiting delivery");
    assert_eq!(leased_rx.await.unwrap(), 1, "the lease took it before the ack committed");
    // The leased delivery's handler: the inbox says already acked, no second effect.
    let conn = PgConnection::connect(&db.url).await.unwrap();
    assert!(!effect_with_ack(conn, sent.message_id).await, "the second delivery is told it was acked");
    store.delivery_ack_held(&consumer(), &[(sent.message_id, sent.seq)], at).await.unwrap();
    acked_once_and_never_again(&store, sent.message_id, until + chrono::Duration::seconds(5)).await;
}

/// A stream's ack of a pushed delivery, overtaken by the sweeper between its statements: the
/// ack must still take, so that the delivery is never handed out again after it was acked.
#[tokio::test]
async fn a_stream_ack_overtaken_by_the_sweeper_still_acks() {
    let (db, store) = setup().await;
    let at = now();
    let until = at + chrono::Duration::seconds(15);
    let sent = pushed(&store, at, until).await;
    // The handler's effect, without a transactional ack (an at-least-once consumer).
    sqlx::query("INSERT INTO app_effects VALUES ($1)").bind(sent.message_id.0).execute(store.pool()).await.unwrap();
    let (mut conn, paused) = pausable(&db, "deliveries:UPDATE").await;
    let late = until + chrono::Duration::seconds(1);
    let seq = sent.seq;
    let stream_ack = tokio::spawn(async move {
        let n: i64 = sqlx::query_scalar("SELECT outbox.ack_seqs('c', ARRAY[$1::bigint], ARRAY[$1::bigint + 1], $2)")
            .bind(seq)
            .bind(late)
            .fetch_one(&mut conn)
            .await
            .unwrap();
        n
    });
    let mover = paused.while_paused(sweep(store.clone(), late)).await;
    let changed = tokio::time::timeout(WAIT, stream_ack).await.unwrap().unwrap();
    mover.await.unwrap();
    assert_eq!(changed, 1, "the stream's ack changed its delivery");
    assert_eq!(row_state(store.pool(), sent.message_id).await.as_deref().unwrap_or("acked"), "acked");
    acked_once_and_never_again(&store, sent.message_id, late + chrono::Duration::seconds(5)).await;
}

/// A transactional ack that finds the delivery dead, overtaken by an admin's replay of it: the
/// replayed delivery is pending, so the ack acks it (true) instead of answering "dead".
#[tokio::test]
async fn a_transactional_ack_overtaken_by_a_replay_acks_the_replayed_delivery() {
    let (db, store) = setup().await;
    let at = now();
    let until = at + chrono::Duration::seconds(15);
    let sent = pushed(&store, at, until).await;
    let d = &store;
    d.delivery_expired(until, 10).await.unwrap();
    let dead = Release {
        consumer: consumer(),
        message_id: sent.message_id,
        state: DeliveryState::Dead,
        available_at: until,
        error: Some("gave up".into()),
        attempt: Attempt::Failed,
    };
    assert_eq!(d.delivery_release_many(&[dead], ReleaseGuard::ExpiredAt(until), until).await.unwrap(), 1);
    assert_eq!(row_state(store.pool(), sent.message_id).await.as_deref(), Some("dead"));
    let mover_store = store.clone();
    let acked = ack_overtaken_by(&db, sent.message_id, async move {
        let d = &mover_store;
        let mut tx = d.begin().await.unwrap();
        assert_eq!(tx.delivery_replay("c", &[sent.message_id], until).await.unwrap(), 1);
        tx.commit().await.unwrap();
    })
    .await;
    assert!(acked, "the replayed delivery is pending: the ack takes it");
    acked_once_and_never_again(&store, sent.message_id, until + chrono::Duration::seconds(5)).await;
}

/// `outbox.ack`'s answers, one per place a delivery can be in (no race): true once for a
/// leased row, a leased range and a pending range; false for an acked row, a seq acked out of a
/// leased range, a dead row, a message not relayed yet (then true for its delivery), a message the
/// consumer does not take, an unknown message or consumer.
#[tokio::test]
async fn the_transactional_ack_answers_exactly_from_every_place() {
    let (_db, store) = setup().await;
    let pool = store.pool().clone();
    let ack = |id: uuid::Uuid, consumer: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>("SELECT outbox.ack($1, $2)")
                .bind(consumer)
                .bind(id)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let at = now();
    let until = at + chrono::Duration::seconds(15);
    let d = &store;

    let in_leased_range = pushed(&store, at, until).await;
    assert!(ack(in_leased_range.message_id.0, "c").await, "held in a leased range");
    assert!(!ack(in_leased_range.message_id.0, "c").await, "then acked");

    let in_pending_range = waiting(&store, at).await;
    assert!(ack(in_pending_range.message_id.0, "c").await, "waiting in a pending range");
    assert!(!ack(in_pending_range.message_id.0, "c").await);

    let logged = pushed(&store, at, until).await;
    d.delivery_ack_held(&consumer(), &[(logged.message_id, logged.seq)], at).await.unwrap();
    assert!(!ack(logged.message_id.0, "c").await, "acked out of its leased range by the stream");

    let as_row = pushed(&store, at, until).await;
    d.delivery_expired(until, 10).await.unwrap();
    assert_eq!(row_state(&pool, as_row.message_id).await.as_deref(), Some("leased"));
    assert!(ack(as_row.message_id.0, "c").await, "a leased row");
    assert!(!ack(as_row.message_id.0, "c").await);

    let unrelayed = enqueue(&store, at).await;
    assert!(!ack(unrelayed.message_id.0, "c").await, "not relayed yet: no delivery to ack");
    let out = d.relay_pass(10, at, false, &[]).await.unwrap();
    assert_eq!(out.messages, 1);
    let leased = d
        .delivery_lease(&LeaseParams {
            consumer: &consumer(),
            session: "s3",
            limit: 10,
            keys_after: "",
            lease_until: until,
            now: at,
        })
        .await
        .unwrap();
    assert_eq!(leased.len(), 1, "delivered after all");
    assert!(ack(unrelayed.message_id.0, "c").await, "and its delivery's ack takes");

    let dead = pushed(&store, at, until).await;
    d.delivery_expired(until, 10).await.unwrap();
    let release = Release {
        consumer: consumer(),
        message_id: dead.message_id,
        state: DeliveryState::Dead,
        available_at: until,
        error: Some("gave up".into()),
        attempt: Attempt::Failed,
    };
    d.delivery_release_many(&[release], ReleaseGuard::ExpiredAt(until), until).await.unwrap();
    assert!(!ack(dead.message_id.0, "c").await, "dead: only a replay delivers it again");

    let msg = NewMessage {
        message_id: None,
        topic: Topic::parse("topic", "other").unwrap(),
        type_: "T".into(),
        payload: b"{}".to_vec(),
        headers: Default::default(),
        ordering_key: None,
        delay: None,
    };
    let elsewhere = d.message_insert(&msg, at).await.unwrap();
    assert!(!ack(elsewhere.message_id.0, "c").await, "a topic the consumer does not take, before the relay");
    d.relay_pass(10, at, false, &[]).await.unwrap();
    assert!(!ack(elsewhere.message_id.0, "c").await, "and after");
    assert!(!ack(uuid::Uuid::new_v4(), "c").await, "an unknown message");
    assert!(!ack(in_leased_range.message_id.0, "nobody").await, "an unknown consumer");
}

/// A lease from pending ranges, overtaken between its snapshot and its read of ranges by a relay
/// pass that writes a new pending range: the lease must return every delivery it puts in its
/// leased range. Before the fix, the function took the new range's seqs (its own statements see
/// the relay's commit) while the statement read their messages with its older snapshot, which
/// cannot see them: the seqs were leased and never sent, stuck until the lease expired (a 30 s
/// stall seen with three replicas).
#[tokio::test]
async fn a_lease_from_pending_ranges_takes_only_what_it_can_send() {
    let (db, store) = setup().await;
    let at = now();
    let first = waiting(&store, at).await;
    let until = at + chrono::Duration::seconds(15);
    // Paused right after it took the first range (its DELETE), its snapshot already taken.
    let (mut conn, paused) = pausable(&db, "delivery_ranges:DELETE").await;
    let lease = tokio::spawn(async move {
        let rows = sqlx::query(postgres::q::DELIVERY_LEASE)
            .bind("c")
            .bind(at)
            .bind(10_i64)
            .bind(until)
            .bind("s1")
            .bind("")
            .fetch_all(&mut conn)
            .await
            .unwrap();
        rows.iter().map(|r| sqlx::Row::try_get::<i64, _>(r, "seq").unwrap()).collect::<Vec<i64>>()
    });
    let mover_store = store.clone();
    let (second_tx, second_rx) = tokio::sync::oneshot::channel();
    let mover = paused
        .while_paused(async move {
            let _ = second_tx.send(waiting(&mover_store, at).await);
        })
        .await;
    mover.await.unwrap();
    let second = second_rx.await.unwrap();
    let returned = lease.await.unwrap();
    assert!(returned.contains(&first.seq), "the first range's delivery is leased: {returned:?}");
    let held: Vec<i64> = sqlx::query_scalar(
        "SELECT s FROM outbox.delivery_ranges b, unnest(b.seqs) r, generate_series(lower(r), upper(r) - 1) s
          WHERE b.state = 'leased' AND b.leased_by = 's1' ORDER BY s",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(held, returned, "leased and not returned: never sent until the lease expires");
    // What it did not take waits for the next lease.
    let next = store
        .delivery_lease(&LeaseParams {
            consumer: &consumer(),
            session: "s2",
            limit: 10,
            keys_after: "",
            lease_until: until,
            now: at,
        })
        .await
        .unwrap();
    let seqs: Vec<i64> = next.iter().map(|d| d.message.seq).collect();
    assert!(returned.contains(&second.seq) || seqs == [second.seq], "the second: {returned:?} then {seqs:?}");
}

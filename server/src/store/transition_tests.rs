//! The delivery state machine (`docs/delivery-states.md`), transition by transition, on a fresh
//! PostgreSQL database and a fresh SQLite file: `tNN_…` is the document's transition TNN. Each
//! case makes its transition the way its cause does (the statement a relay pass, a stream, the
//! sweeper, an operator or a consumer's own transaction runs) and checks what the document says
//! it leaves: the state, the delivery count, the times and the error that `GetMessage` shows, and
//! what a lease then takes. They go through [`Store`] and the SQL entry points only, so they hold
//! whatever represents a delivery underneath: they are the contract a change of the model keeps.
//!
//! What a cause decides before the store moves a delivery (dead or pending, the retry time, the
//! error) is the failure rule's, `domain::Failure`, tested with it: its unit tests, the
//! sweeper's `run_once` in `maintenance::store_tests`, a stream's end in the end-to-end
//! `delivery` tests. Here each case passes the decision its cause makes and checks that the store
//! makes exactly that transition, and no other.
#![allow(clippy::unwrap_used)]

use std::str::FromStr as _;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};
use sqlx::Connection as _;

use super::tests::{Guard, msg, spec};
use super::*;
use crate::domain::{Attempt, ConsumerSpec, DeadKeyPolicy, DeliveryState, Failure, PushOffer, StartFrom, Transition};

/// Runs each case once per store, as `on_every_store!` does, and then checks what holds after
/// every transition whatever it was (see [`invariants_hold`]).
macro_rules! transitions {
    ($($case:ident),* $(,)?) => {
        /// The cases, each run on both stores.
        const CASES: &[&str] = &[$(stringify!($case)),*];

        mod on_postgres {
            $(#[tokio::test]
            async fn $case() {
                let (db, store) = $crate::store::tests::postgres().await;
                super::$case(&db, store.clone()).await;
                super::invariants_hold(&store).await;
            })*
        }
        mod on_sqlite {
            $(#[tokio::test]
            async fn $case() {
                let (db, store) = $crate::store::tests::sqlite().await;
                super::$case(&db, store.clone()).await;
                super::invariants_hold(&store).await;
            })*
        }
    };
}

transitions!(
    t01_a_relay_pass_pushes_a_due_unkeyed_message_to_a_stream_leased_with_count_one,
    t02_a_relay_pass_leaves_what_it_cannot_push_pending_with_count_zero,
    t03_keyed_and_delayed_messages_are_pending_whatever_the_room,
    t04_an_earliest_consumer_starts_with_every_retained_message_pending,
    t05_a_replay_creates_a_delivery_the_consumer_never_had,
    t06_a_lease_takes_a_pending_delivery_and_counts_it,
    t07_an_extend_moves_only_the_named_deliveries_deadline,
    t08_a_stream_ack_acks_a_leased_delivery_once,
    t09_a_transactional_ack_acks_a_leased_delivery_once,
    t10_a_transactional_ack_acks_a_pending_delivery_never_sent,
    t11_a_late_stream_ack_acks_a_delivery_released_meanwhile,
    t12_a_nack_makes_a_delivery_pending_again_after_its_retry_time,
    t13_a_nack_at_max_deliveries_makes_a_dead_letter,
    t14_an_expired_lease_is_pending_again_after_the_backoff,
    t15_an_expired_lease_at_max_deliveries_is_dead,
    t16_a_closed_stream_releases_what_it_held_due_now_without_counting_it,
    t17_a_broken_stream_at_max_deliveries_leaves_a_dead_letter,
    t18_a_push_never_handed_over_is_pending_again_uncounted_keeping_its_error,
    t19_a_pending_delivery_becomes_leasable_when_due_its_key_free_and_resumed,
    t20_a_replay_makes_an_acked_delivery_pending_with_a_fresh_count,
    t21_a_replay_makes_a_dead_letter_pending_with_a_fresh_count,
    t22_a_replay_makes_a_retrying_delivery_due_now_with_a_fresh_count,
    t23_prune_removes_acked_deliveries_with_their_messages,
    t24_deleting_a_consumer_removes_its_deliveries_in_every_state,
    t25_a_dead_keyed_message_of_a_holding_consumer_holds_its_key,
    t26_releasing_a_key_with_skip_dead_lets_the_waiting_go_and_leaves_the_dead_one,
    t27_releasing_a_key_without_skip_dead_delivers_the_dead_message_first,
);

/// Each transition of [`Transition::ALL`] has one case, `tNN_…`, and each case is one's.
#[test]
fn every_transition_has_its_case_on_both_stores() {
    let number = |case: &str| case.strip_prefix('t').and_then(|c| c.get(..2)).and_then(|n| n.parse::<u8>().ok());
    let cases: Vec<Option<u8>> = CASES.iter().map(|c| number(c)).collect();
    let expected: Vec<Option<u8>> = Transition::ALL.iter().map(|t| Some(t.number())).collect();
    assert_eq!(cases, expected, "the cases of transitions!, in order: {CASES:?}");
}

const LEASE: chrono::Duration = chrono::Duration::seconds(30);

fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(3)
}

fn secs(n: i64) -> chrono::Duration {
    chrono::Duration::seconds(n)
}

fn name(n: &str) -> ConsumerName {
    ConsumerName::parse("consumer", n).unwrap()
}

fn offer(consumer: &str, session: &str, room: usize, now: DateTime<Utc>) -> PushOffer {
    PushOffer { consumer: consumer.into(), session: session.into(), room, lease_until: now + LEASE }
}

/// Creates consumer `c` of topic `t` with `max_deliveries`.
async fn consumer(store: &SharedStore, max_deliveries: u32, at: DateTime<Utc>) -> ConsumerName {
    store.consumer_create(&spec("c", &["t"], max_deliveries), at).await.unwrap();
    name("c")
}

async fn enqueue(store: &SharedStore, m: NewMessage, at: DateTime<Utc>) -> MessageId {
    store.message_insert(&m, at).await.unwrap().message_id
}

/// Consumer `c` of topic `t` with `max_deliveries`, and one message the relay pushes to stream
/// `s1`: its id and seq.
async fn pushed_one(store: &SharedStore, max_deliveries: u32, at: DateTime<Utc>) -> (ConsumerName, MessageId, i64) {
    let c = consumer(store, max_deliveries, at).await;
    let id = enqueue(store, msg("t"), at).await;
    let out = relay(store, at, &[offer("c", "s1", 10, at)]).await;
    assert_eq!(out.pushed.len(), 1, "pushed to s1");
    (c, id, out.pushed[0].2.message.seq)
}

fn keyed(key: &str) -> NewMessage {
    NewMessage { ordering_key: Some(key.into()), ..msg("t") }
}

/// One relay pass of up to 100 messages at `at`.
async fn relay(store: &SharedStore, at: DateTime<Utc>, offers: &[PushOffer]) -> RelayOutcome {
    let out = store.relay_pass(100, at, false, offers).await.unwrap();
    // A push is a lease too.
    invariants_hold(store).await;
    out
}

/// A lease of up to `n` for `session` at `at`, the ids in the order leased, with their counts.
async fn lease(
    store: &SharedStore,
    c: &ConsumerName,
    session: &str,
    n: i64,
    at: DateTime<Utc>,
) -> Vec<(MessageId, u32)> {
    let leased = store
        .delivery_lease(&LeaseParams {
            consumer: c,
            session,
            limit: n,
            keys_after: "",
            lease_until: at + LEASE,
            now: at,
        })
        .await
        .unwrap();
    // A lease is where a count grows: the invariant is checked after each, not only at the end.
    invariants_hold(store).await;
    leased.iter().map(|d| (d.message.message_id, d.delivery_count)).collect()
}

/// The consumer's delivery of `id` as `GetMessage` shows it.
async fn delivery(store: &SharedStore, id: MessageId, c: &str) -> Option<DeliveryRow> {
    let (_, rows) = store.message_get(id).await.unwrap();
    rows.into_iter().find(|r| r.consumer == c)
}

async fn state(store: &SharedStore, id: MessageId, c: &str) -> (DeliveryState, u32) {
    let d = delivery(store, id, c).await.unwrap_or_else(|| panic!("no delivery of {id} to {c}"));
    (d.state, d.delivery_count)
}

async fn stats(store: &SharedStore, c: &ConsumerName) -> ConsumerStats {
    store.stats(Some(c), true).await.unwrap().consumers.remove(0)
}

/// A release of a failed attempt (a nack, an expiry, a broken stream): the count stays.
fn release(c: &ConsumerName, id: MessageId, state: DeliveryState, at: DateTime<Utc>, error: Option<&str>) -> Release {
    Release {
        consumer: c.clone(),
        message_id: id,
        state,
        available_at: at,
        error: error.map(str::to_owned),
        attempt: Attempt::Failed,
    }
}

/// A release that was no attempt (a clean close, a shutdown, a delivery never sent): pending,
/// due at `at`, the count its lease added taken back.
fn withdraw(c: &ConsumerName, id: MessageId, at: DateTime<Utc>, error: Option<&str>) -> Release {
    Release { attempt: Attempt::Withdrawn, ..release(c, id, DeliveryState::Pending, at, error) }
}

/// What holds after every transition, whatever it was: no delivery has had more attempts than
/// its consumer's `max_deliveries`. The last attempt's failure makes a delivery dead, so no
/// lease takes it further; a release that was no attempt gives back the count its lease added.
/// Read through the seam (every message, every consumer's delivery of it as `GetMessage` shows
/// it), so it holds for rows and ranges alike.
async fn invariants_hold(store: &SharedStore) {
    let max: std::collections::HashMap<String, u32> = store
        .consumer_list()
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.spec.name.as_str().to_owned(), c.spec.max_deliveries))
        .collect();
    let page = store
        .message_search(&SearchParams {
            query: &MessageQuery::default(),
            before_seq: None,
            limit: 10_000,
            scan: 10_000,
        })
        .await
        .unwrap();
    assert_eq!(page.next_before_seq, None, "every message read");
    for m in page.messages {
        let (_, rows) = store.message_get(m.message_id).await.unwrap();
        for d in rows {
            let Some(max) = max.get(&d.consumer) else { continue };
            assert!(
                d.delivery_count <= *max,
                "the delivery of {} to {} ({:?}) counts {} attempts, above max_deliveries {max}",
                m.message_id,
                d.consumer,
                d.state,
                d.delivery_count,
            );
        }
    }
}

/// The consumer's transactional ack in a transaction of its own, with the client contract's
/// statements (PostgreSQL `outbox.ack`, SQLite the documented `UPDATE`): whether this call acked it.
async fn ack_in_transaction(db: &Guard, consumer: &str, id: MessageId, at: DateTime<Utc>) -> bool {
    match db {
        Guard::Pg(db) => {
            let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            let acked: bool = sqlx::query_scalar(include_str!("../../../contract/sql/postgres-ack.sql"))
                .bind(consumer)
                .bind(id.0)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            acked
        }
        Guard::Sqlite(db) => {
            let options =
                sqlx::sqlite::SqliteConnectOptions::from_str(&db.url).unwrap().busy_timeout(Duration::from_secs(10));
            let mut conn = sqlx::SqliteConnection::connect_with(&options).await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            let n = sqlx::query(include_str!("../../../contract/sql/sqlite-ack.sql"))
                .bind(consumer)
                .bind(id.0.to_string())
                .bind(at.timestamp_micros())
                .execute(&mut *tx)
                .await
                .unwrap()
                .rows_affected();
            tx.commit().await.unwrap();
            n == 1
        }
    }
}

async fn t01_a_relay_pass_pushes_a_due_unkeyed_message_to_a_stream_leased_with_count_one(
    _db: &Guard,
    store: SharedStore,
) {
    let at = now();
    let c = consumer(&store, 5, at).await;
    let id = enqueue(&store, msg("t"), at).await;
    let out = relay(&store, at, &[offer("c", "s1", 10, at)]).await;
    let pushed: Vec<_> = out.pushed.iter().map(|(c, s, d)| (c.as_str(), s.as_str(), d.message.message_id)).collect();
    assert_eq!(pushed, [("c", "s1", id)]);
    assert_eq!(out.pushed[0].2.delivery_count, 1);
    let d = delivery(&store, id, "c").await.unwrap();
    assert_eq!((d.state, d.delivery_count, d.lease_expires_at), (DeliveryState::Leased, 1, Some(at + LEASE)));
    let s = stats(&store, &c).await;
    assert_eq!((s.in_flight, s.backlog), (1, 0));
    assert!(lease(&store, &c, "s2", 10, at).await.is_empty(), "held by s1");
}

async fn t02_a_relay_pass_leaves_what_it_cannot_push_pending_with_count_zero(_db: &Guard, store: SharedStore) {
    let at = now();
    let c = consumer(&store, 5, at).await;
    store.consumer_create(&spec("paused", &["t"], 5), at).await.unwrap();
    store.consumer_set_paused(&name("paused"), true).await.unwrap();
    let ids = [enqueue(&store, msg("t"), at).await, enqueue(&store, msg("t"), at).await];
    // One slot for c (the second message waits), and a paused consumer is never pushed to.
    let out = relay(&store, at, &[offer("c", "s1", 1, at), offer("paused", "s2", 10, at)]).await;
    assert_eq!(out.pushed.len(), 1);
    assert_eq!(state(&store, ids[1], "c").await, (DeliveryState::Pending, 0));
    for id in ids {
        let d = delivery(&store, id, "paused").await.unwrap();
        assert_eq!((d.state, d.delivery_count, d.lease_expires_at), (DeliveryState::Pending, 0, None));
        assert!(d.available_at <= at, "due");
    }
    assert_eq!((stats(&store, &c).await.backlog, stats(&store, &name("paused")).await.backlog), (1, 2));
    assert_eq!(lease(&store, &c, "s1", 10, at).await, [(ids[1], 1)]);
}

async fn t03_keyed_and_delayed_messages_are_pending_whatever_the_room(_db: &Guard, store: SharedStore) {
    let at = now();
    let c = consumer(&store, 5, at).await;
    let key = enqueue(&store, keyed("k"), at).await;
    let delayed = enqueue(&store, NewMessage { delay: Some(Duration::from_secs(60)), ..msg("t") }, at).await;
    let out = relay(&store, at, &[offer("c", "s1", 10, at)]).await;
    assert!(out.pushed.is_empty(), "neither is pushed");
    assert_eq!(state(&store, key, "c").await, (DeliveryState::Pending, 0));
    let d = delivery(&store, delayed, "c").await.unwrap();
    assert_eq!((d.state, d.delivery_count, d.available_at), (DeliveryState::Pending, 0, at + secs(60)));
    assert_eq!(lease(&store, &c, "s1", 10, at).await, [(key, 1)], "the delayed one is not due");
    assert_eq!(lease(&store, &c, "s1", 10, at + secs(61)).await, [(delayed, 1)]);
}

async fn t04_an_earliest_consumer_starts_with_every_retained_message_pending(_db: &Guard, store: SharedStore) {
    let at = now();
    let relayed = enqueue(&store, msg("t"), at).await;
    relay(&store, at, &[]).await;
    let unrelayed = enqueue(&store, msg("t"), at).await;
    store
        .consumer_create(&ConsumerSpec { start_from: StartFrom::Earliest, ..spec("early", &["t"], 5) }, at)
        .await
        .unwrap();
    store.consumer_create(&spec("fresh", &["t"], 5), at).await.unwrap();
    for id in [relayed, unrelayed] {
        assert_eq!(state(&store, id, "early").await, (DeliveryState::Pending, 0));
        assert!(delivery(&store, id, "fresh").await.is_none(), "a NEW consumer starts after them");
    }
    // The relay pass that reads the second message adds nothing: the backfill made its delivery.
    let out = relay(&store, at, &[offer("early", "s1", 10, at)]).await;
    assert!(out.pushed.is_empty() && out.deliveries == 0, "a row decides: {out:?}");
    let got = lease(&store, &name("early"), "s1", 10, at).await;
    assert_eq!(got.len(), 2, "each once: {got:?}");
    assert!(lease(&store, &name("fresh"), "s2", 10, at).await.is_empty());
}

async fn t05_a_replay_creates_a_delivery_the_consumer_never_had(_db: &Guard, store: SharedStore) {
    let at = now();
    let before = enqueue(&store, msg("t"), at).await;
    relay(&store, at, &[]).await;
    let c = consumer(&store, 5, at).await;
    assert!(delivery(&store, before, "c").await.is_none(), "from before a NEW consumer");
    assert_eq!(store.replay_apply(&c, &[before], at + secs(1)).await.unwrap(), 1);
    let d = delivery(&store, before, "c").await.unwrap();
    assert_eq!((d.state, d.delivery_count, d.available_at), (DeliveryState::Pending, 0, at + secs(1)));
    assert_eq!(lease(&store, &c, "s1", 10, at + secs(1)).await, [(before, 1)]);
}

async fn t06_a_lease_takes_a_pending_delivery_and_counts_it(_db: &Guard, store: SharedStore) {
    let at = now();
    let c = consumer(&store, 5, at).await;
    let ids = [enqueue(&store, msg("t"), at).await, enqueue(&store, msg("t"), at).await];
    relay(&store, at, &[]).await;
    assert_eq!(lease(&store, &c, "s1", 10, at).await, [(ids[0], 1), (ids[1], 1)], "in seq order");
    let d = delivery(&store, ids[0], "c").await.unwrap();
    assert_eq!((d.state, d.delivery_count, d.lease_expires_at), (DeliveryState::Leased, 1, Some(at + LEASE)));
    assert_eq!(stats(&store, &c).await.in_flight, 2);
    let back = release(&c, ids[0], DeliveryState::Pending, at, Some("boom"));
    assert_eq!(store.delivery_release_many(&[back], ReleaseGuard::Session("s1"), at).await.unwrap(), 1);
    assert_eq!(lease(&store, &c, "s2", 10, at).await, [(ids[0], 2)], "every lease counts");
}

async fn t07_an_extend_moves_only_the_named_deliveries_deadline(_db: &Guard, store: SharedStore) {
    let at = now();
    let c = consumer(&store, 5, at).await;
    let ids = [enqueue(&store, msg("t"), at).await, enqueue(&store, msg("t"), at).await];
    assert_eq!(relay(&store, at, &[offer("c", "s1", 10, at)]).await.pushed.len(), 2);
    let later = at + secs(300);
    assert_eq!(
        store
            .delivery_extend_many(&ExtendParams {
                consumer: &c,
                session: "other",
                ids: &[ids[0]],
                until: later,
                now: at
            })
            .await
            .unwrap(),
        0,
        "not its lease"
    );
    assert_eq!(
        store
            .delivery_extend_many(&ExtendParams { consumer: &c, session: "s1", ids: &[ids[0]], until: later, now: at })
            .await
            .unwrap(),
        1
    );
    let d = delivery(&store, ids[0], "c").await.unwrap();
    assert_eq!((d.state, d.delivery_count, d.lease_expires_at), (DeliveryState::Leased, 1, Some(later)));
    assert_eq!(delivery(&store, ids[1], "c").await.unwrap().lease_expires_at, Some(at + LEASE));
    let expired = store.delivery_expired(at + LEASE, 10).await.unwrap();
    assert_eq!(expired.iter().map(|e| e.message_id).collect::<Vec<_>>(), [ids[1]], "only the other one expires");
}

async fn t08_a_stream_ack_acks_a_leased_delivery_once(_db: &Guard, store: SharedStore) {
    let at = now();
    let (c, id, seq) = pushed_one(&store, 5, at).await;
    assert_eq!(store.delivery_ack_held(&c, &[(id, seq)], at + secs(1)).await.unwrap(), 1);
    let d = delivery(&store, id, "c").await.unwrap();
    assert_eq!((d.state, d.delivery_count, d.lease_expires_at), (DeliveryState::Acked, 1, None));
    assert_eq!(d.acked_at, Some(at + secs(1)));
    assert_eq!(store.delivery_ack_held(&c, &[(id, seq)], at + secs(2)).await.unwrap(), 0, "once");
    assert_eq!(store.delivery_ack_many(&c, &[id], at + secs(2)).await.unwrap(), 0);
    let s = stats(&store, &c).await;
    assert_eq!((s.in_flight, s.backlog, s.acked), (0, 0, 1));
    assert!(lease(&store, &c, "s2", 10, at + secs(60)).await.is_empty());
}

async fn t09_a_transactional_ack_acks_a_leased_delivery_once(db: &Guard, store: SharedStore) {
    let at = now();
    let (c, id, seq) = pushed_one(&store, 5, at).await;
    assert!(ack_in_transaction(db, "c", id, at).await);
    assert!(!ack_in_transaction(db, "c", id, at).await, "acked already");
    assert_eq!(state(&store, id, "c").await, (DeliveryState::Acked, 1));
    // The stream's own ack of it, after the effect's transaction: nothing more to do.
    assert_eq!(store.delivery_ack_held(&c, &[(id, seq)], at).await.unwrap(), 0);
    let s = stats(&store, &c).await;
    assert_eq!((s.in_flight, s.acked), (0, 1), "counted once");
    // Nor does its lease expire into a redelivery.
    let expired = store.delivery_expired(at + LEASE, 10).await.unwrap();
    let back: Vec<Release> =
        expired.iter().map(|e| release(&c, e.message_id, DeliveryState::Pending, at + LEASE, Some("x"))).collect();
    store.delivery_release_many(&back, ReleaseGuard::ExpiredAt(at + LEASE), at + LEASE).await.unwrap();
    assert_eq!(state(&store, id, "c").await, (DeliveryState::Acked, 1));
    assert!(lease(&store, &c, "s2", 10, at + secs(60)).await.is_empty());
}

async fn t10_a_transactional_ack_acks_a_pending_delivery_never_sent(db: &Guard, store: SharedStore) {
    let at = now();
    let c = consumer(&store, 5, at).await;
    let id = enqueue(&store, msg("t"), at).await;
    let other = enqueue(&store, msg("t"), at + secs(1)).await;
    relay(&store, at, &[]).await;
    assert!(ack_in_transaction(db, "c", id, at).await);
    assert_eq!(state(&store, id, "c").await, (DeliveryState::Acked, 0), "never delivered");
    assert!(!ack_in_transaction(db, "c", id, at).await);
    let s = stats(&store, &c).await;
    assert_eq!((s.backlog, s.acked), (1, 1), "the second message waits");
    assert_eq!(lease(&store, &c, "s1", 10, at + secs(1)).await, [(other, 1)], "the acked one is not leased");
}

async fn t11_a_late_stream_ack_acks_a_delivery_released_meanwhile(_db: &Guard, store: SharedStore) {
    let at = now();
    let (c, id, seq) = pushed_one(&store, 5, at).await;
    let back = release(&c, id, DeliveryState::Pending, at + LEASE, Some("ack deadline expired"));
    assert_eq!(store.delivery_release_many(&[back], ReleaseGuard::ExpiredAt(at + LEASE), at + LEASE).await.unwrap(), 1);
    assert_eq!(state(&store, id, "c").await, (DeliveryState::Pending, 1));
    // The handler finished after all: its ack still counts.
    assert_eq!(store.delivery_ack_held(&c, &[(id, seq)], at + LEASE).await.unwrap(), 1);
    assert_eq!(state(&store, id, "c").await, (DeliveryState::Acked, 1));
    assert!(lease(&store, &c, "s2", 10, at + secs(600)).await.is_empty());
}

async fn t12_a_nack_makes_a_delivery_pending_again_after_its_retry_time(_db: &Guard, store: SharedStore) {
    let at = now();
    let (c, id, _) = pushed_one(&store, 5, at).await;
    let back = release(&c, id, DeliveryState::Pending, at + secs(5), Some("boom"));
    assert_eq!(
        store.delivery_release_many(std::slice::from_ref(&back), ReleaseGuard::Session("s2"), at).await.unwrap(),
        0
    );
    assert_eq!(store.delivery_release_many(&[back], ReleaseGuard::Session("s1"), at).await.unwrap(), 1);
    let d = delivery(&store, id, "c").await.unwrap();
    assert_eq!((d.state, d.delivery_count, d.available_at), (DeliveryState::Pending, 1, at + secs(5)));
    assert_eq!((d.lease_expires_at, d.last_error.as_deref()), (None, Some("boom")));
    assert_eq!(stats(&store, &c).await.retrying, 1);
    assert!(lease(&store, &c, "s1", 10, at + secs(4)).await.is_empty(), "not before its retry time");
    assert_eq!(lease(&store, &c, "s1", 10, at + secs(5)).await, [(id, 2)]);
}

async fn t13_a_nack_at_max_deliveries_makes_a_dead_letter(_db: &Guard, store: SharedStore) {
    let at = now();
    let (c, id, _) = pushed_one(&store, 1, at).await;
    let dead = release(&c, id, DeliveryState::Dead, at, Some("poison"));
    assert_eq!(store.delivery_release_many(&[dead], ReleaseGuard::Session("s1"), at).await.unwrap(), 1);
    let d = delivery(&store, id, "c").await.unwrap();
    assert_eq!((d.state, d.delivery_count, d.last_error.as_deref()), (DeliveryState::Dead, 1, Some("poison")));
    assert_eq!((d.dead_at, d.lease_expires_at), (Some(at), None));
    let letters = store.dead_letter_list(&c, 0, 10).await.unwrap();
    assert_eq!(letters.iter().map(|l| l.message.message_id).collect::<Vec<_>>(), [id]);
    let s = stats(&store, &c).await;
    assert_eq!((s.dead, s.in_flight, s.backlog), (1, 0, 0));
    assert!(lease(&store, &c, "s1", 10, at + secs(3600)).await.is_empty(), "never again without a replay");
}

/// A sweep as `LeaseSweeper::run_once` makes it at `at`: every expired lease released by the
/// failure rule ([`Failure::Expired`]).
async fn sweep(store: &SharedStore, at: DateTime<Utc>) -> usize {
    let expired = store.delivery_expired(at, 100).await.unwrap();
    let releases: Vec<Release> = expired
        .iter()
        .map(|e| Failure::Expired.release(e.consumer.clone(), e.message_id, e.delivery_count, &e.retry, at))
        .collect();
    store.delivery_release_many(&releases, ReleaseGuard::ExpiredAt(at), at).await.unwrap();
    expired.len()
}

async fn t14_an_expired_lease_is_pending_again_after_the_backoff(_db: &Guard, store: SharedStore) {
    let at = now();
    let (c, id, _) = pushed_one(&store, 5, at).await;
    assert_eq!(sweep(&store, at + LEASE - secs(1)).await, 0, "not before its deadline");
    assert_eq!(sweep(&store, at + LEASE).await, 1);
    let d = delivery(&store, id, "c").await.unwrap();
    // spec(): backoff from 1 s.
    assert_eq!((d.state, d.delivery_count, d.available_at), (DeliveryState::Pending, 1, at + LEASE + secs(1)));
    assert_eq!(d.last_error.as_deref(), Some("ack deadline expired"));
    assert_eq!(lease(&store, &c, "s2", 10, at + LEASE + secs(1)).await, [(id, 2)]);
}

async fn t15_an_expired_lease_at_max_deliveries_is_dead(_db: &Guard, store: SharedStore) {
    let at = now();
    let c = consumer(&store, 1, at).await;
    let id = enqueue(&store, msg("t"), at).await;
    relay(&store, at, &[]).await;
    assert_eq!(lease(&store, &c, "s1", 10, at).await, [(id, 1)]);
    assert_eq!(sweep(&store, at + LEASE).await, 1);
    let d = delivery(&store, id, "c").await.unwrap();
    assert_eq!((d.state, d.delivery_count, d.dead_at), (DeliveryState::Dead, 1, Some(at + LEASE)));
    assert_eq!(stats(&store, &c).await.dead, 1);
}

async fn t16_a_closed_stream_releases_what_it_held_due_now_without_counting_it(_db: &Guard, store: SharedStore) {
    let at = now();
    // At max_deliveries 1 each lease is the last attempt: a close that kept its count would
    // have the next lease count past it, and nothing would ever make the delivery dead.
    let c = consumer(&store, 1, at).await;
    let pushed = enqueue(&store, msg("t"), at).await;
    relay(&store, at, &[offer("c", "s1", 10, at)]).await;
    let leased = enqueue(&store, msg("t"), at).await;
    relay(&store, at, &[]).await;
    assert_eq!(lease(&store, &c, "s1", 10, at).await, [(leased, 1)]);
    let close: Vec<Release> =
        [pushed, leased].iter().map(|id| withdraw(&c, *id, at + secs(2), Some("stream closed before ack"))).collect();
    assert_eq!(store.delivery_release_many(&close, ReleaseGuard::Session("s1"), at + secs(2)).await.unwrap(), 2);
    for id in [pushed, leased] {
        let d = delivery(&store, id, "c").await.unwrap();
        assert_eq!((d.state, d.delivery_count, d.available_at), (DeliveryState::Pending, 0, at + secs(2)));
        assert_eq!(d.last_error.as_deref(), Some("stream closed before ack"));
    }
    let s = stats(&store, &c).await;
    assert_eq!((s.backlog, s.retrying, s.in_flight), (2, 0, 0), "no attempt failed");
    assert_eq!(lease(&store, &c, "s2", 10, at + secs(2)).await, [(pushed, 1), (leased, 1)], "the same first attempt");
}

async fn t17_a_broken_stream_at_max_deliveries_leaves_a_dead_letter(_db: &Guard, store: SharedStore) {
    let at = now();
    let (c, id, _) = pushed_one(&store, 1, at).await;
    let broke = release(&c, id, DeliveryState::Dead, at, Some("stream broke before ack"));
    assert_eq!(store.delivery_release_many(&[broke], ReleaseGuard::Session("s1"), at).await.unwrap(), 1);
    let d = delivery(&store, id, "c").await.unwrap();
    assert_eq!((d.state, d.last_error.as_deref()), (DeliveryState::Dead, Some("stream broke before ack")));
}

async fn t18_a_push_never_handed_over_is_pending_again_uncounted_keeping_its_error(_db: &Guard, store: SharedStore) {
    let at = now();
    let c = consumer(&store, 5, at).await;
    let fresh = enqueue(&store, msg("t"), at).await;
    let retried = enqueue(&store, keyed("k"), at).await;
    relay(&store, at, &[offer("c", "s1", 10, at)]).await;
    // A retried delivery with an error, leased again to the same stream.
    assert_eq!(lease(&store, &c, "s1", 10, at).await, [(retried, 1)]);
    let nack = release(&c, retried, DeliveryState::Pending, at, Some("boom"));
    store.delivery_release_many(&[nack], ReleaseGuard::Session("s1"), at).await.unwrap();
    assert_eq!(lease(&store, &c, "s1", 10, at).await, [(retried, 2)]);
    // The relay (or the session, for what reached it after its end) gives back what the stream
    // never saw: no error of its own, due now.
    let unsent: Vec<Release> = [fresh, retried].iter().map(|id| withdraw(&c, *id, at + secs(1), None)).collect();
    assert_eq!(store.delivery_release_many(&unsent, ReleaseGuard::Session("s1"), at + secs(1)).await.unwrap(), 2);
    let d = delivery(&store, fresh, "c").await.unwrap();
    assert_eq!((d.state, d.delivery_count, d.available_at), (DeliveryState::Pending, 0, at + secs(1)));
    assert_eq!(d.last_error, None);
    // The attempt that failed before stays counted; the one never sent does not.
    let d = delivery(&store, retried, "c").await.unwrap();
    assert_eq!((d.state, d.delivery_count, d.last_error.as_deref()), (DeliveryState::Pending, 1, Some("boom")));
    assert_eq!(stats(&store, &c).await.retrying, 1, "the retried one only");
}

async fn t19_a_pending_delivery_becomes_leasable_when_due_its_key_free_and_resumed(_db: &Guard, store: SharedStore) {
    let at = now();
    let c = consumer(&store, 5, at).await;
    let first = enqueue(&store, keyed("k"), at).await;
    let second = enqueue(&store, keyed("k"), at).await;
    relay(&store, at, &[]).await;
    assert_eq!(lease(&store, &c, "s1", 10, at).await, [(first, 1)], "one of a key at a time");
    assert!(lease(&store, &c, "s2", 10, at).await.is_empty());
    assert_eq!(store.delivery_ack_many(&c, &[first], at).await.unwrap(), 1);
    store.consumer_set_paused(&c, true).await.unwrap();
    assert!(lease(&store, &c, "s2", 10, at).await.is_empty(), "paused");
    assert_eq!(store.delivery_next_due(&c).await.unwrap(), Some(at), "due, though paused");
    store.consumer_set_paused(&c, false).await.unwrap();
    assert_eq!(lease(&store, &c, "s2", 10, at).await, [(second, 1)], "its key is free and the consumer resumed");
}

async fn t20_a_replay_makes_an_acked_delivery_pending_with_a_fresh_count(_db: &Guard, store: SharedStore) {
    let at = now();
    let (c, id, seq) = pushed_one(&store, 5, at).await;
    store.delivery_ack_held(&c, &[(id, seq)], at).await.unwrap();
    assert_eq!(store.replay_apply(&c, &[id], at + secs(1)).await.unwrap(), 1);
    let d = delivery(&store, id, "c").await.unwrap();
    assert_eq!(
        (d.state, d.delivery_count, d.available_at, d.acked_at),
        (DeliveryState::Pending, 0, at + secs(1), None)
    );
    let s = stats(&store, &c).await;
    assert_eq!((s.backlog, s.acked), (1, 0), "counted once, as pending");
    assert_eq!(lease(&store, &c, "s1", 10, at + secs(1)).await, [(id, 1)]);
}

async fn t21_a_replay_makes_a_dead_letter_pending_with_a_fresh_count(_db: &Guard, store: SharedStore) {
    let at = now();
    let (c, id, _) = pushed_one(&store, 1, at).await;
    let dead = release(&c, id, DeliveryState::Dead, at, Some("poison"));
    store.delivery_release_many(&[dead], ReleaseGuard::Session("s1"), at).await.unwrap();
    assert_eq!(store.replay_apply(&c, &[id], at + secs(1)).await.unwrap(), 1);
    let d = delivery(&store, id, "c").await.unwrap();
    assert_eq!((d.state, d.delivery_count, d.available_at), (DeliveryState::Pending, 0, at + secs(1)));
    assert_eq!((d.dead_at, d.last_error), (None, None));
    assert_eq!(stats(&store, &c).await.dead, 0);
    assert_eq!(lease(&store, &c, "s1", 10, at + secs(1)).await, [(id, 1)]);
}

async fn t22_a_replay_makes_a_retrying_delivery_due_now_with_a_fresh_count(_db: &Guard, store: SharedStore) {
    let at = now();
    let c = consumer(&store, 5, at).await;
    let retrying = enqueue(&store, msg("t"), at).await;
    let waiting = enqueue(&store, msg("t"), at).await;
    relay(&store, at, &[offer("c", "s1", 1, at)]).await;
    let nack = release(&c, retrying, DeliveryState::Pending, at + secs(600), Some("later"));
    store.delivery_release_many(&[nack], ReleaseGuard::Session("s1"), at).await.unwrap();
    assert_eq!(store.replay_apply(&c, &[retrying, waiting], at + secs(1)).await.unwrap(), 2);
    for id in [retrying, waiting] {
        let d = delivery(&store, id, "c").await.unwrap();
        assert_eq!((d.state, d.delivery_count, d.available_at), (DeliveryState::Pending, 0, at + secs(1)));
        assert_eq!(d.last_error, None);
    }
    assert_eq!(stats(&store, &c).await.backlog, 2, "each counted once");
    assert_eq!(lease(&store, &c, "s1", 10, at + secs(1)).await, [(retrying, 1), (waiting, 1)]);
}

async fn t23_prune_removes_acked_deliveries_with_their_messages(_db: &Guard, store: SharedStore) {
    let at = now();
    let c = consumer(&store, 5, at).await;
    let acked = enqueue(&store, msg("t"), at).await;
    let pending = enqueue(&store, msg("t"), at).await;
    let out = relay(&store, at, &[offer("c", "s1", 1, at)]).await;
    store.delivery_ack_held(&c, &[(acked, out.pushed[0].2.message.seq)], at).await.unwrap();
    let pruned = store.prune(at + secs(1), 100).await.unwrap();
    assert_eq!((pruned.messages, pruned.deliveries), (1, 1));
    assert!(matches!(store.message_get(acked).await, Err(StoreError::MessageNotFound(_))));
    assert_eq!(state(&store, pending, "c").await, (DeliveryState::Pending, 0), "an unfinished one stays");
    assert_eq!(store.prune(at + secs(1), 100).await.unwrap(), Pruned::default());
}

async fn t24_deleting_a_consumer_removes_its_deliveries_in_every_state(_db: &Guard, store: SharedStore) {
    let at = now();
    let c = consumer(&store, 1, at).await;
    let mut ids = Vec::new();
    for m in [msg("t"), msg("t"), msg("t"), msg("t"), keyed("k")] {
        ids.push(enqueue(&store, m, at).await);
    }
    let out = relay(&store, at, &[offer("c", "s1", 3, at)]).await;
    store.delivery_ack_held(&c, &[(ids[0], out.pushed[0].2.message.seq)], at).await.unwrap();
    store
        .delivery_release_many(
            &[release(&c, ids[1], DeliveryState::Dead, at, Some("x"))],
            ReleaseGuard::Session("s1"),
            at,
        )
        .await
        .unwrap();
    let mut states = Vec::new();
    for id in &ids {
        states.push(state(&store, *id, "c").await.0);
    }
    use DeliveryState::*;
    assert_eq!(states, [Acked, Dead, Leased, Pending, Pending]);
    store.consumer_delete(&c).await.unwrap();
    for id in ids {
        assert!(delivery(&store, id, "c").await.is_none());
    }
    // A consumer of the same name starts afresh.
    consumer(&store, 1, at).await;
    assert!(lease(&store, &c, "s2", 10, at).await.is_empty());
    let s = stats(&store, &c).await;
    assert_eq!((s.backlog, s.in_flight, s.dead, s.acked), (0, 0, 0, 0));
}

/// A consumer `c` whose dead keyed messages hold their keys, with one attempt each; `k` has
/// three messages, `other` one. Leases `k`'s first and `other`'s, and nacks `k`'s first dead.
async fn held(store: &SharedStore, at: DateTime<Utc>) -> (ConsumerName, [MessageId; 4]) {
    let hold = ConsumerSpec { dead_key_policy: DeadKeyPolicy::Hold, ..spec("c", &["t"], 1) };
    store.consumer_create(&hold, at).await.unwrap();
    let c = name("c");
    let ids = [
        enqueue(store, keyed("k"), at).await,
        enqueue(store, keyed("k"), at).await,
        enqueue(store, keyed("k"), at).await,
        enqueue(store, keyed("other"), at).await,
    ];
    relay(store, at, &[]).await;
    assert_eq!(lease(store, &c, "s1", 10, at).await, [(ids[0], 1), (ids[3], 1)]);
    let dead = release(&c, ids[0], DeliveryState::Dead, at, Some("poison"));
    store.delivery_release_many(&[dead], ReleaseGuard::Session("s1"), at).await.unwrap();
    (c, ids)
}

async fn t25_a_dead_keyed_message_of_a_holding_consumer_holds_its_key(_db: &Guard, store: SharedStore) {
    let at = now();
    let (c, ids) = held(&store, at).await;
    assert_eq!(state(&store, ids[0], "c").await, (DeliveryState::Dead, 1));
    let keys = store.held_key_list(&c, 10).await.unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!((keys[0].ordering_key.as_str(), keys[0].message_id, keys[0].waiting), ("k", ids[0], 2));
    assert_eq!(keys[0].last_error.as_deref(), Some("poison"));
    assert_eq!(stats(&store, &c).await.held_keys, 1);
    // Every other key flows; the held key's later messages wait, uncounted.
    store.delivery_ack_many(&c, &[ids[3]], at).await.unwrap();
    assert!(lease(&store, &c, "s1", 10, at + secs(3600)).await.is_empty());
    assert_eq!(state(&store, ids[1], "c").await, (DeliveryState::Pending, 0));
}

async fn t26_releasing_a_key_with_skip_dead_lets_the_waiting_go_and_leaves_the_dead_one(
    _db: &Guard,
    store: SharedStore,
) {
    let at = now();
    let (c, ids) = held(&store, at).await;
    let released = store
        .held_key_release(&KeyReleaseParams { consumer: &c, ordering_key: "k", skip_dead: true, now: at })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(released.message_id, ids[0]);
    assert!(store.held_key_list(&c, 10).await.unwrap().is_empty());
    assert_eq!(state(&store, ids[0], "c").await, (DeliveryState::Dead, 1), "still a dead letter");
    assert_eq!(lease(&store, &c, "s1", 10, at).await, [(ids[1], 1)], "the key goes on without it");
    assert_eq!(
        store
            .held_key_release(&KeyReleaseParams { consumer: &c, ordering_key: "k", skip_dead: true, now: at })
            .await
            .unwrap(),
        None,
        "no longer held"
    );
}

async fn t27_releasing_a_key_without_skip_dead_delivers_the_dead_message_first(_db: &Guard, store: SharedStore) {
    let at = now();
    let (c, ids) = held(&store, at).await;
    store
        .held_key_release(&KeyReleaseParams { consumer: &c, ordering_key: "k", skip_dead: false, now: at + secs(1) })
        .await
        .unwrap()
        .unwrap();
    let d = delivery(&store, ids[0], "c").await.unwrap();
    assert_eq!((d.state, d.delivery_count, d.available_at), (DeliveryState::Pending, 0, at + secs(1)));
    assert_eq!(lease(&store, &c, "s1", 10, at + secs(1)).await, [(ids[0], 1)], "the dead one first");
    assert!(lease(&store, &c, "s2", 10, at + secs(1)).await.is_empty(), "then the others wait for its ack");
    store.delivery_ack_many(&c, &[ids[0]], at + secs(1)).await.unwrap();
    assert_eq!(lease(&store, &c, "s2", 10, at + secs(1)).await, [(ids[1], 1)]);
}

//! Poison-key quarantine (ADR 0057), through [`Store`] on a fresh PostgreSQL database and a
//! fresh SQLite file: each transition of a held key (held by a dead letter, by a nack or by an
//! expired lease; released by a replay, by `ReleaseKey` with and without `skip_dead`; gone with
//! its consumer) and what it must never do (deliver a later message of the key, count an
//! attempt on it, or hold a key for a consumer that skips). The sweeper's path to a held key is
//! tested with the sweeper (`maintenance::store_tests`).
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};

use super::*;
use crate::domain::{Backoff, ConsumerSpec, DeadKeyPolicy, DeliveryState, Failure, StartFrom, Topic, TopicPattern};
use crate::testing::{TestDb, TestSqlite};

#[allow(dead_code)]
enum Guard {
    Pg(TestDb),
    Sqlite(TestSqlite),
}

macro_rules! on_every_store {
    ($($case:ident),* $(,)?) => {
        mod on_postgres {
            $(#[tokio::test]
            async fn $case() {
                let db = crate::testing::TestDb::create().await.unwrap();
                let store = super::connect(&db.url, 8).await.unwrap();
                store.migrate().await.unwrap();
                super::$case(store, super::Guard::Pg(db)).await;
            })*
        }
        mod on_sqlite {
            $(#[tokio::test]
            async fn $case() {
                let db = crate::testing::TestSqlite::create().unwrap();
                let store = super::connect(&db.url, 8).await.unwrap();
                store.migrate().await.unwrap();
                super::$case(store, super::Guard::Sqlite(db)).await;
            })*
        }
    };
}

on_every_store!(
    a_dead_keyed_message_holds_its_key_and_every_other_key_flows,
    a_consumer_that_skips_delivers_the_next_message_of_a_dead_key,
    replaying_the_dead_message_resumes_its_key_in_order,
    releasing_with_skip_dead_lets_the_waiting_go_and_leaves_the_dead_one_dead,
    releasing_without_skip_dead_delivers_the_dead_message_first,
    a_held_keys_waiting_messages_are_counted_only_up_to_the_cap,
);

fn spec(name: &str, policy: DeadKeyPolicy) -> ConsumerSpec {
    ConsumerSpec {
        name: ConsumerName::parse("name", name).unwrap(),
        topics: vec![TopicPattern::parse("topics", "t").unwrap()],
        max_deliveries: 1,
        backoff: Backoff { base: Duration::from_secs(1), max: Duration::from_secs(10) },
        ack_deadline: Duration::from_secs(30),
        start_from: StartFrom::New,
        sink: None,
        dead_key_policy: policy,
    }
}

fn keyed(key: Option<&str>) -> NewMessage {
    NewMessage {
        message_id: None,
        topic: Topic::parse("topic", "t").unwrap(),
        type_: "T".into(),
        payload: b"{}".to_vec(),
        headers: Default::default(),
        ordering_key: key.map(str::to_owned),
        delay: None,
    }
}

/// Keys `a` (3 messages), `b` (2) and one unkeyed message, relayed; returns their ids by name
/// (`a1`, `a2`, `a3`, `b1`, `b2`, `u`).
async fn backlog(store: &SharedStore, now: DateTime<Utc>) -> std::collections::HashMap<&'static str, MessageId> {
    let mut ids = std::collections::HashMap::new();
    for (name, key) in
        [("a1", Some("a")), ("b1", Some("b")), ("u", None), ("a2", Some("a")), ("b2", Some("b")), ("a3", Some("a"))]
    {
        ids.insert(name, store.message_insert(&keyed(key), now).await.unwrap().message_id);
    }
    store.relay_pass(100, now, false, &[]).await.unwrap();
    ids
}

async fn lease(store: &SharedStore, c: &ConsumerSpec, now: DateTime<Utc>) -> Vec<MessageId> {
    let until = crate::clock::add(now, c.ack_deadline);
    let mut leased = store
        .delivery_lease(&LeaseParams {
            consumer: &c.name,
            session: "s",
            limit: 10,
            keys_after: "",
            lease_until: until,
            now,
        })
        .await
        .unwrap();
    leased.sort_by_key(|d| d.message.seq);
    leased.iter().map(|d| d.message.message_id).collect()
}

/// A nack of a delivery that has had its `max_deliveries` (1): it dies, as a stream's nack does.
async fn nack(store: &SharedStore, c: &ConsumerSpec, id: MessageId, now: DateTime<Utc>) {
    let failure = Failure::Nacked { error: "cannot apply".into(), retry_after: None };
    let release = failure.release(c.name.clone(), id, 1, &c.retry(), now);
    assert_eq!(release.state, DeliveryState::Dead, "the last attempt");
    assert_eq!(store.delivery_release_many(&[release], ReleaseGuard::Session("s"), now).await.unwrap(), 1);
}

/// A consumer that holds, the backlog leased once, `a1` nacked to death (`a` held), `b1` and
/// `u` acked.
async fn a_held(
    store: &SharedStore,
    now: DateTime<Utc>,
) -> (ConsumerSpec, std::collections::HashMap<&'static str, MessageId>) {
    let c = spec("c", DeadKeyPolicy::Hold);
    store.consumer_create(&c, now).await.unwrap();
    let m = backlog(store, now).await;
    assert_eq!(lease(store, &c, now).await, vec![m["a1"], m["b1"], m["u"]]);
    nack(store, &c, m["a1"], now).await;
    store.delivery_ack_many(&c.name, &[m["b1"], m["u"]], now).await.unwrap();
    (c, m)
}

async fn state(store: &SharedStore, c: &ConsumerSpec, id: MessageId) -> (DeliveryState, u32) {
    let (_, rows) = store.message_get(id).await.unwrap();
    let row = rows.iter().find(|r| r.consumer == c.name.as_str()).unwrap();
    (row.state, row.delivery_count)
}

/// `a1` dies: `a` is held (listed with its dead message, error and two waiting), `a2` is never
/// leased nor counted, while `b` and the unkeyed message flow to the end.
async fn a_dead_keyed_message_holds_its_key_and_every_other_key_flows(store: SharedStore, _db: Guard) {
    let now = Utc::now().trunc_subsecs(6);
    let c = spec("ledger", DeadKeyPolicy::Hold);
    store.consumer_create(&c, now).await.unwrap();
    let m = backlog(&store, now).await;
    let first = lease(&store, &c, now).await;
    assert_eq!(first, vec![m["a1"], m["b1"], m["u"]]);
    nack(&store, &c, m["a1"], now).await;
    store.delivery_ack_many(&c.name, &[m["b1"], m["u"]], now).await.unwrap();

    assert_eq!(lease(&store, &c, now).await, vec![m["b2"]], "b flows, a waits");
    store.delivery_ack_many(&c.name, &[m["b2"]], now).await.unwrap();
    assert!(lease(&store, &c, now).await.is_empty(), "nothing of a while it is held");
    assert_eq!(state(&store, &c, m["a2"]).await, (DeliveryState::Pending, 0), "not an attempt");
    assert_eq!(state(&store, &c, m["a1"]).await, (DeliveryState::Dead, 1));

    let held = store.held_key_list(&c.name, 10).await.unwrap();
    assert_eq!(held.len(), 1, "{held:?}");
    assert_eq!(
        (held[0].ordering_key.as_str(), held[0].message_id, held[0].last_error.as_deref(), held[0].waiting),
        ("a", m["a1"], Some("cannot apply"), 2)
    );
    assert_eq!(held[0].held_at, now);
    let stats = store.stats(Some(&c.name), true).await.unwrap();
    assert_eq!((stats.consumers[0].held_keys, stats.consumers[0].dead, stats.consumers[0].backlog), (1, 1, 2));
    // The dead letter is listed as any other.
    let dead = store.dead_letter_list(&c.name, 0, 10).await.unwrap();
    assert_eq!(dead.iter().map(|d| d.message.message_id).collect::<Vec<_>>(), vec![m["a1"]]);

    // Its consumer gone, its holds go with it.
    store.consumer_delete(&c.name).await.unwrap();
    store.consumer_create(&c, now).await.unwrap();
    assert!(store.held_key_list(&c.name, 10).await.unwrap().is_empty());
}

/// The default policy: a dead letter leaves its key, and the key's next message goes.
async fn a_consumer_that_skips_delivers_the_next_message_of_a_dead_key(store: SharedStore, _db: Guard) {
    let now = Utc::now().trunc_subsecs(6);
    let c = spec("c", DeadKeyPolicy::Skip);
    store.consumer_create(&c, now).await.unwrap();
    let m = backlog(&store, now).await;
    assert_eq!(lease(&store, &c, now).await, vec![m["a1"], m["b1"], m["u"]]);
    nack(&store, &c, m["a1"], now).await;
    assert_eq!(lease(&store, &c, now).await, vec![m["a2"]]);
    assert!(store.held_key_list(&c.name, 10).await.unwrap().is_empty());
    assert_eq!(store.stats(Some(&c.name), true).await.unwrap().consumers[0].held_keys, 0);
}

/// Replaying the dead message lifts the hold: it is delivered first (a fresh count), and the
/// key's next message only once it is acked.
async fn replaying_the_dead_message_resumes_its_key_in_order(store: SharedStore, _db: Guard) {
    let now = Utc::now().trunc_subsecs(6);
    let (c, m) = a_held(&store, now).await;
    assert_eq!(store.replay_apply(&c.name, &[m["a1"]], now).await.unwrap(), 1);
    assert!(store.held_key_list(&c.name, 10).await.unwrap().is_empty(), "the replay lifts the hold");
    assert_eq!(lease(&store, &c, now).await, vec![m["a1"], m["b2"]], "a1 again, not a2");
    assert_eq!(state(&store, &c, m["a1"]).await, (DeliveryState::Leased, 1));
    store.delivery_ack_many(&c.name, &[m["a1"], m["b2"]], now).await.unwrap();
    assert_eq!(lease(&store, &c, now).await, vec![m["a2"]]);
    store.delivery_ack_many(&c.name, &[m["a2"]], now).await.unwrap();
    assert_eq!(lease(&store, &c, now).await, vec![m["a3"]]);
}

/// `ReleaseKey` with `skip_dead`: the waiting messages go in order, the dead one stays dead, and
/// a second release finds nothing held.
async fn releasing_with_skip_dead_lets_the_waiting_go_and_leaves_the_dead_one_dead(store: SharedStore, _db: Guard) {
    let now = Utc::now().trunc_subsecs(6);
    let (c, m) = a_held(&store, now).await;
    assert!(
        store
            .held_key_release(&KeyReleaseParams { consumer: &c.name, ordering_key: "b", skip_dead: true, now })
            .await
            .unwrap()
            .is_none(),
        "b is not held"
    );
    let released = store
        .held_key_release(&KeyReleaseParams { consumer: &c.name, ordering_key: "a", skip_dead: true, now })
        .await
        .unwrap()
        .unwrap();
    assert_eq!((released.ordering_key.as_str(), released.message_id, released.waiting), ("a", m["a1"], 2));
    assert!(
        store
            .held_key_release(&KeyReleaseParams { consumer: &c.name, ordering_key: "a", skip_dead: true, now })
            .await
            .unwrap()
            .is_none(),
        "released already"
    );
    assert_eq!(lease(&store, &c, now).await, vec![m["a2"], m["b2"]]);
    assert_eq!(state(&store, &c, m["a1"]).await, (DeliveryState::Dead, 1), "still a dead letter");
    store.delivery_ack_many(&c.name, &[m["a2"]], now).await.unwrap();
    assert_eq!(lease(&store, &c, now).await, vec![m["a3"]]);
    let missing = ConsumerName::parse("c", "nobody").unwrap();
    assert!(matches!(
        store.held_key_release(&KeyReleaseParams { consumer: &missing, ordering_key: "a", skip_dead: true, now }).await,
        Err(StoreError::ConsumerNotFound(_))
    ));
}

/// `ReleaseKey` without `skip_dead`: the dead message is due again at once (count from 1) and
/// goes before the waiting ones.
async fn releasing_without_skip_dead_delivers_the_dead_message_first(store: SharedStore, _db: Guard) {
    let now = Utc::now().trunc_subsecs(6);
    let (c, m) = a_held(&store, now).await;
    let released = store
        .held_key_release(&KeyReleaseParams { consumer: &c.name, ordering_key: "a", skip_dead: false, now })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(released.message_id, m["a1"]);
    assert_eq!(state(&store, &c, m["a1"]).await, (DeliveryState::Pending, 0));
    assert_eq!(lease(&store, &c, now).await, vec![m["a1"], m["b2"]]);
    // It dies again: the key is held again, behind the same message.
    nack(&store, &c, m["a1"], now).await;
    let held = store.held_key_list(&c.name, 10).await.unwrap();
    assert_eq!((held.len(), held[0].message_id), (1, m["a1"]));
    assert!(!lease(&store, &c, now).await.contains(&m["a2"]));
}

/// Listing held keys costs at most the cap per key, however deep a key's backlog (issue 47
/// item 7): `a`, held with more than the cap waiting behind it, is listed as the cap.
async fn a_held_keys_waiting_messages_are_counted_only_up_to_the_cap(store: SharedStore, _db: Guard) {
    let now = Utc::now().trunc_subsecs(6);
    let (c, _) = a_held(&store, now).await;
    let more: Vec<NewMessage> = (0..1_010).map(|_| keyed(Some("a"))).collect();
    store.message_insert_many(&more, now).await.unwrap();
    while store.relay_pass(1000, now, false, &[]).await.unwrap().messages > 0 {}
    let held = store.held_key_list(&c.name, 10).await.unwrap();
    assert_eq!(held.len(), 1, "{held:?}");
    // 1,012 wait (a2, a3 and these); the cap docs/grpc-api.md and admin.proto state is 1,000.
    assert_eq!(held[0].waiting, 1_000, "counted up to the cap, not the whole backlog");
}

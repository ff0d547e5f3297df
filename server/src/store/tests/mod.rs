//! The store's tests, each run on a fresh PostgreSQL database and on a fresh SQLite file,
//! driven with a manual clock (no sleeping): the store half of the conformance suite (the
//! end-to-end half is in `tests/`). One file per subject; in each, the cases listed in
//! [`on_every_store!`] run on both stores, and those named `a_postgres_…` or `…sqlite…` on one.
//! Some call one backend's statement (a required method of [`Store`] or of [`StoreTx`]) on its
//! own, as River's per-method suite does, some the operations built on them. The background
//! loops' tests on every store live with the loops, above the store (`relay::store_tests`,
//! `maintenance::store_tests`), on this module's harness: [`on_every_store!`], [`postgres`],
//! [`sqlite`], [`spec`] and [`msg`].
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use chrono::{DateTime, SubsecRound, Utc};

use super::*;
use crate::domain::{Backoff, ConsumerSpec, StartFrom, TopicPattern};
use crate::testing::{TestDb, TestSqlite};

mod acks;
mod consumers;
mod deliveries;
mod lease_cost;
mod lists;
mod messages;
mod migrations;
mod prune;
mod ranges;
mod relay;
mod replay;
mod sqlite_file;

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

/// A fresh database with the PostgreSQL migrations before `version` applied, as a release of
/// that time left it (without the SQL functions file, which later migrations do not need).
pub(super) async fn postgres_migrated_below(db: &TestDb, version: i64) -> sqlx::PgPool {
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

/// A new SQLite file with the migrations below `version` applied, as an older release left it.
pub(super) async fn sqlite_migrated_below(db: &TestSqlite, version: i64) -> sqlx::SqlitePool {
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

pub(super) fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(3)
}

/// A consumer of `topics` starting from `start_from`, with a retry policy unlike the default
/// one (4 deliveries, 250 ms to 90 s, a 15 s ack deadline), so that reading it back proves
/// every field is stored.
pub(super) fn spec_from(name: &str, topics: &[&str], start_from: StartFrom) -> ConsumerSpec {
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

/// Enqueues one message of each topic at `at`.
pub(super) async fn insert(store: &dyn Store, topics: &[&str], at: DateTime<Utc>) -> Vec<Enqueued> {
    let mut out = Vec::new();
    for t in topics {
        out.push(store.message_insert(&msg(t), at).await.unwrap());
    }
    out
}

/// Creates a consumer with its statement alone (no EARLIEST backfill).
pub(super) async fn create(store: &dyn Store, spec: &ConsumerSpec, at: DateTime<Utc>) {
    let mut tx = store.begin_consumer_change().await.unwrap();
    tx.consumer_insert(spec, None, at).await.unwrap();
    tx.commit().await.unwrap();
}

/// The state and count of the consumer's delivery of one message, wherever it is held.
pub(super) async fn state_of(store: &dyn Store, id: MessageId, consumer: &str) -> Option<(String, i64)> {
    let rows = store.delivery_list_of_message(id).await.unwrap();
    rows.into_iter().find(|r| r.consumer == consumer).map(|r| (r.state, r.delivery_count))
}

/// Migrates a store that a case opened itself.
pub(super) async fn ready(store: &dyn Store) {
    store.migrate().await.unwrap();
}

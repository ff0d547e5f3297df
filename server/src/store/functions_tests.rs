//! PostgreSQL only: each PL/pgSQL function of the delivery path on its own, called as the server
//! calls it, on ranges and rows written by hand, so that a change of one function is checked
//! without the statements around it (`outbox.relay_claim`, `outbox.relay_pass` and `outbox.ack`
//! have theirs in `tests/relay.rs`, `race_tests.rs` and `limits_tests.rs`); and the functions'
//! one source file, and `outbox.topic_matches` against the server's matching.
use std::sync::Arc;

use chrono::Utc;
use sqlx::PgPool;

use super::postgres::{PgStore, multirange};
use super::tests::{Guard, inbox_of, msg, postgres, spec};
use super::{Enqueued, SharedStore, Store};
use crate::domain::TopicPattern;
use crate::testing::TestDb;

/// A migrated database with consumer `c` (topic `t`) and `n` messages, none relayed.
async fn setup(n: usize) -> (TestDb, PgPool, SharedStore, Vec<Enqueued>) {
    let db = TestDb::create().await.unwrap();
    let pg = PgStore::connect(&db.url, 4).await.unwrap();
    pg.migrate().await.unwrap();
    let pool = pg.pool().clone();
    let store: SharedStore = Arc::new(pg);
    store.consumer_create(&spec("c", &["t"], 5), Utc::now()).await.unwrap();
    let mut messages = Vec::new();
    for _ in 0..n {
        messages.push(store.message_insert(&msg("t"), Utc::now()).await.unwrap());
    }
    (db, pool, store, messages)
}

/// Writes a range of consumer `c` and returns its id.
async fn range(pool: &PgPool, state: &str, seqs: &[i64], session: Option<&str>) -> i64 {
    let literal = multirange(seqs);
    sqlx::query_scalar(
        "INSERT INTO outbox.delivery_ranges (consumer, state, seqs, span, leased_by, lease_expires_at, at)
         VALUES ('c', $1, $2::int8multirange, range_merge($2::int8multirange), $3,
                 CASE WHEN $3 IS NULL THEN NULL ELSE now() + interval '30 seconds' END, now())
         RETURNING id",
    )
    .bind(state)
    .bind(literal)
    .bind(session)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The ranges of `c` in `state`, as text, lowest first.
async fn ranges(pool: &PgPool, state: &str) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT seqs::text FROM outbox.delivery_ranges WHERE consumer = 'c' AND state = $1 ORDER BY lower(span)",
    )
    .bind(state)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn multirange_slice_takes_the_seqs_ranked_after_skip_range_by_range() {
    let db = TestDb::create().await.unwrap();
    let pg = PgStore::connect(&db.url, 2).await.unwrap();
    pg.migrate().await.unwrap();
    for (skip, take, want) in [
        (0_i64, Some(2_i64), "{[1,3)}"),
        (2, Some(3), "{[3,4),[10,12)}"),
        (1, None, "{[2,4),[10,12)}"),
        (5, Some(1), "{}"),
        (0, Some(0), "{}"),
    ] {
        let got: String = sqlx::query_scalar("SELECT outbox.multirange_slice('{[1,4),[10,12)}', $1, $2)::text")
            .bind(skip)
            .bind(take)
            .fetch_one(pg.pool())
            .await
            .unwrap();
        assert_eq!(got, want, "skip {skip}, take {take:?}");
    }
}

/// A lease takes the lowest seqs of the visible pending ranges, oldest range first, into one
/// leased range; a seq with a row of its own leaves its range unleased (the row decides); a
/// range the caller cannot see, or a paused consumer, gives nothing.
#[tokio::test]
async fn lease_pending_visible_leases_the_lowest_visible_seqs_into_one_range_and_skips_rows() {
    let (_db, pool, store, m) = setup(6).await;
    let s: Vec<i64> = m.iter().map(|e| e.seq).collect();
    let first = range(&pool, "pending", &s[0..2], None).await;
    let second = range(&pool, "pending", &s[2..5], None).await;
    let unseen = range(&pool, "pending", &s[5..6], None).await;
    // A transactional ack of a pending, range-held delivery: a row that decides over the range.
    let acked: bool =
        sqlx::query_scalar("SELECT outbox.ack('c', $1)").bind(m[1].message_id.0).fetch_one(&pool).await.unwrap();
    assert!(acked);
    let lease = |limit: i32, visible: Vec<i64>| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT outbox.lease_pending_visible('c', now(), $1, now() + interval '30 seconds', 'sess', $2)::text",
            )
            .bind(limit)
            .bind(visible)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let got = lease(3, vec![first, second]).await;
    assert_eq!(got, multirange(&[s[0], s[2]]), "three taken, the one with a row not leased");
    assert_eq!(ranges(&pool, "leased").await, [got]);
    assert_eq!(ranges(&pool, "pending").await, [multirange(&s[3..5]), multirange(&s[5..6])]);
    assert_eq!(lease(10, vec![unseen + 1]).await, "{}", "no range it can see");

    store.consumer_set_paused(&crate::domain::ConsumerName::parse("n", "c").unwrap(), true).await.unwrap();
    assert_eq!(lease(10, vec![second, unseen]).await, "{}", "paused");
    let states: Vec<(i64, String, i32)> = inbox_of(&pool, "c").await;
    assert_eq!(
        states,
        [
            (s[0], "leased".into(), 1),
            (s[1], "acked".into(), 0),
            (s[2], "leased".into(), 1),
            (s[3], "pending".into(), 0),
            (s[4], "pending".into(), 0),
            (s[5], "pending".into(), 0),
        ]
    );
}

/// A stream's acks by seq runs: leased range seqs go to one acked range, a pending range's seq
/// becomes an acked row (count 0), a leased row becomes acked; a seq with a row of its own
/// leaves its range uncounted; a second call changes nothing.
#[tokio::test]
async fn ack_seqs_acks_each_place_once_and_counts_what_changed() {
    let (_db, pool, _store, m) = setup(5).await;
    let s: Vec<i64> = m.iter().map(|e| e.seq).collect();
    range(&pool, "leased", &s[0..3], Some("sess")).await;
    range(&pool, "pending", &s[3..4], None).await;
    // s[4]: a leased row (out of its range), and s[2] acked in the consumer's transaction already.
    range(&pool, "leased", &s[4..5], Some("sess")).await;
    let rows: i64 = sqlx::query_scalar("SELECT outbox.unbatch(ARRAY['c'], ARRAY[$1::uuid], 'sess', NULL)")
        .bind(m[4].message_id.0)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    let acked: bool =
        sqlx::query_scalar("SELECT outbox.ack('c', $1)").bind(m[2].message_id.0).fetch_one(&pool).await.unwrap();
    assert!(acked);

    let ack = || {
        let pool = pool.clone();
        let (lo, hi) = (vec![s[0]], vec![s[4] + 1]);
        async move {
            sqlx::query_scalar::<_, i64>("SELECT outbox.ack_seqs('c', $1, $2, now())")
                .bind(lo)
                .bind(hi)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(ack().await, 4, "two from the leased range, the pending one, the leased row");
    assert_eq!(ranges(&pool, "acked").await, [multirange(&s[0..2])], "the seq with a row is not logged");
    assert!(ranges(&pool, "leased").await.is_empty() && ranges(&pool, "pending").await.is_empty());
    let states: Vec<(String, i32)> = inbox_of(&pool, "c").await.into_iter().map(|(_, st, n)| (st, n)).collect();
    assert_eq!(
        states,
        [("acked".into(), 1), ("acked".into(), 1), ("acked".into(), 1), ("acked".into(), 0), ("acked".into(), 1),]
    );
    assert_eq!(ack().await, 0, "acked once");
}

/// `outbox.unbatch` turns range-held seqs into `leased` rows with the range's holder, deadline
/// and count 1: the named ones of one session's ranges, or every seq of the ranges expired by a
/// time; others' ranges and unexpired ones stay; a seq with a row of its own keeps its row.
#[tokio::test]
async fn ranges_to_rows_turns_the_named_or_expired_seqs_into_leased_rows_of_their_holder() {
    let (_db, pool, _store, m) = setup(4).await;
    let s: Vec<i64> = m.iter().map(|e| e.seq).collect();
    range(&pool, "leased", &s[0..2], Some("a")).await;
    range(&pool, "leased", &s[2..4], Some("b")).await;
    let to_rows = |session: Option<&'static str>, ids: Option<Vec<uuid::Uuid>>, expired: bool| {
        let pool = pool.clone();
        async move {
            let consumers = ids.as_ref().map(|i| vec!["c"; i.len()]);
            sqlx::query_scalar::<_, i64>(
                "SELECT outbox.unbatch($1, $2, $3, CASE WHEN $4 THEN now() + interval '1 minute' END)",
            )
            .bind(consumers)
            .bind(ids)
            .bind(session)
            .bind(expired)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    // Another session's range is not touched.
    assert_eq!(to_rows(Some("b"), Some(vec![m[0].message_id.0]), false).await, 0);
    assert_eq!(to_rows(Some("a"), Some(vec![m[0].message_id.0]), false).await, 1);
    assert_eq!(ranges(&pool, "leased").await, [multirange(&s[1..2]), multirange(&s[2..4])]);
    let holder: (String, String, i32) = sqlx::query_as(
        "SELECT state, leased_by, delivery_count FROM outbox.deliveries WHERE consumer = 'c' AND seq = $1",
    )
    .bind(s[0])
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(holder, ("leased".into(), "a".into(), 1));
    // A transactional ack first: its row stays acked when the sweeper turns ranges to rows.
    let acked: bool =
        sqlx::query_scalar("SELECT outbox.ack('c', $1)").bind(m[3].message_id.0).fetch_one(&pool).await.unwrap();
    assert!(acked);
    assert_eq!(to_rows(None, None, true).await, 2, "every expired seq but the acked one");
    assert!(ranges(&pool, "leased").await.is_empty());
    let states: Vec<(String, i32)> = inbox_of(&pool, "c").await.into_iter().map(|(_, st, n)| (st, n)).collect();
    assert_eq!(states, [("leased".into(), 1), ("leased".into(), 1), ("leased".into(), 1), ("acked".into(), 1)]);
}

/// The consumers a relay pass may fan out to, by name, from `outbox.relay_consumers_since`'s JSON.
fn listed(json: &serde_json::Value) -> std::collections::BTreeMap<String, serde_json::Value> {
    json.as_array().unwrap().iter().map(|c| (c[0].as_str().unwrap().to_owned(), c.clone())).collect()
}

/// What `outbox.relay_consumers_since` answers for the version `known` and the first seq 1.
async fn consumers_since(pool: &sqlx::PgPool, known: Option<&str>) -> serde_json::Value {
    sqlx::query_scalar("SELECT outbox.relay_consumers_since($1::uuid, 1)").bind(known).fetch_one(pool).await.unwrap()
}

/// A relay keeps the consumers between passes (ADR 0078): `relay_consumers_since` sends them
/// only when the version it is given is not the current one, and a new random version comes
/// with every consumer created or deleted, and every change of what a pass keeps (name, topics,
/// paused, start), whoever writes it. A backfill (a replay's, an `EARLIEST` consumer's) moves
/// no version: the backfills that reach the pass come with every answer.
#[tokio::test]
async fn relay_consumers_since_sends_every_consumer_only_when_the_version_moved() {
    let (_db, pool, store, _) = setup(0).await;
    let first = consumers_since(&pool, None).await;
    let mut at = first["version"].as_str().unwrap().to_owned();
    assert_eq!(listed(&first["consumers"]).keys().collect::<Vec<_>>(), ["c"]);
    let same = consumers_since(&pool, Some(&at)).await;
    assert_eq!(same["version"], first["version"]);
    assert!(same["consumers"].is_null(), "unchanged: no list: {same}");

    fn moved(at: &mut String, label: &str, json: serde_json::Value) -> serde_json::Value {
        let now = json["version"].as_str().unwrap().to_owned();
        assert_ne!(&now, at, "{label} moves the version: {json}");
        assert!(json["consumers"].is_array(), "{label}: the list comes with the new version");
        *at = now;
        json
    }
    let name = |n: &str| crate::domain::ConsumerName::parse("consumer", n).unwrap();
    store.consumer_create(&spec("w", &["orders.*"], 5), Utc::now()).await.unwrap();
    let json = consumers_since(&pool, Some(&at)).await;
    let json = moved(&mut at, "a create", json);
    assert_eq!(listed(&json["consumers"]).keys().collect::<Vec<_>>(), ["c", "w"], "every consumer, wildcard or not");
    assert_eq!(listed(&json["consumers"])["w"], serde_json::json!(["w", false, 0, ["orders.*"]]));
    store.consumer_set_paused(&name("w"), true).await.unwrap();
    let json = consumers_since(&pool, Some(&at)).await;
    let json = moved(&mut at, "a pause", json);
    assert_eq!(listed(&json["consumers"])["w"][1], serde_json::json!(true));
    sqlx::query("UPDATE outbox.consumers SET topics = ARRAY['orders.>'] WHERE name = 'w'")
        .execute(&pool)
        .await
        .unwrap();
    let json = consumers_since(&pool, Some(&at)).await;
    let json = moved(&mut at, "new topics by raw SQL", json);
    assert_eq!(listed(&json["consumers"])["w"][3], serde_json::json!(["orders.>"]));

    // A replay's backfill: no new version, and the backfill comes with the answer.
    sqlx::query("UPDATE outbox.consumers SET backfill_seq = 7 WHERE name = 'c'").execute(&pool).await.unwrap();
    sqlx::query("UPDATE outbox.consumers SET paused = paused").execute(&pool).await.unwrap();
    let json = consumers_since(&pool, Some(&at)).await;
    assert!(json["consumers"].is_null(), "a backfill or an update that changes nothing keeps the version: {json}");
    assert_eq!(json["backfill"], serde_json::json!([["c", 7]]));
    let later: serde_json::Value = sqlx::query_scalar("SELECT outbox.relay_consumers_since($1::uuid, 8)")
        .bind(&at)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(later["backfill"], serde_json::json!([]), "a backfill below the pass's first seq is left out");

    store.consumer_delete(&name("w")).await.unwrap();
    let json = consumers_since(&pool, Some(&at)).await;
    let json = moved(&mut at, "a delete", json);
    assert_eq!(listed(&json["consumers"]).keys().collect::<Vec<_>>(), ["c"]);
    // Writes that skip ordinary triggers (logical replication's apply, a restore in replica
    // mode) still move it.
    let mut conn = pool.acquire().await.unwrap();
    sqlx::raw_sql("SET session_replication_role = replica; DELETE FROM outbox.consumers WHERE name = 'c'")
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);
    let json = consumers_since(&pool, Some(&at)).await;
    let json = moved(&mut at, "a delete in replica mode", json);
    assert_eq!(listed(&json["consumers"]).len(), 0);
}

/// A replay raises a consumer's `backfill_seq` under the relays' turn. A pass whose claim waited
/// for that turn reads the consumers after it, so it sees the replay's value: read with the
/// claim statement's own snapshot, taken before the wait, it would not, and the pass would put
/// the seq in a range beside the replay's row. The relay holds the consumers at their version
/// already: the backfill comes with the claim all the same (a backfill moves no version).
#[tokio::test]
async fn the_claims_consumers_are_read_after_the_turn_it_waited_for() {
    let (_db, pool, _store, messages) = setup(1).await;
    let seq = messages[0].seq;
    let held = consumers_since(&pool, None).await["version"].as_str().unwrap().to_owned();
    let mut replay = pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(1869903970, 1)").execute(&mut *replay).await.unwrap();
    sqlx::query("UPDATE outbox.consumers SET backfill_seq = $1 WHERE name = 'c'")
        .bind(seq)
        .execute(&mut *replay)
        .await
        .unwrap();
    let relay = {
        let pool = pool.clone();
        tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            let rows = sqlx::query(super::postgres::q::RELAY_CLAIM)
                .bind(500_i32)
                .bind(Utc::now())
                .bind(super::postgres::CONSUMERS_LOCK)
                .bind(500_i64)
                .bind(Some(held.clone()))
                .fetch_all(&mut *tx)
                .await
                .unwrap();
            use sqlx::Row;
            let consumers: serde_json::Value = rows[0].try_get("consumers").unwrap();
            tx.rollback().await.unwrap();
            (rows.len(), consumers)
        })
    };
    // The claim has started, and waits for the turn.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(super::tests::TURN_WAITERS).fetch_one(&pool).await.unwrap();
        if waiting > 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the claim never waited for the turn");
        tokio::task::yield_now().await;
    }
    replay.commit().await.unwrap();
    let (claimed, consumers) = relay.await.unwrap();
    assert_eq!(claimed, 1);
    assert_eq!(
        consumers["backfill"],
        serde_json::json!([["c", seq]]),
        "the replay's backfill_seq, committed during the wait"
    );
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

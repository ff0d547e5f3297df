//! PostgreSQL only: what a lease (and a stream's ack) costs, in buffers, behind deep backlogs,
//! held keys and ranges, with either plan.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use chrono::Utc;
use sqlx::Connection as _;

use super::*;
use crate::testing::TestDb;

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
        .delivery_lease(&LeaseParams {
            consumer: &ConsumerName::parse("c", "deep").unwrap(),
            session: "s",
            limit: 64,
            keys_after: "",
            lease_until: crate::clock::add(now, Duration::from_secs(30)),
            now,
        })
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
        .delivery_lease(&LeaseParams {
            consumer: &ConsumerName::parse("c", "deep").unwrap(),
            session: "s",
            limit: 64,
            keys_after: "",
            lease_until: crate::clock::add(now, Duration::from_secs(30)),
            now,
        })
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

/// The same for the pending ranges a relay writes while no stream is attached (ADR 0042): a
/// lease of 64 from behind 100,000 range-held deliveries touches about as many buffers as from
/// behind 1,000, with either plan, before and after fresh statistics.
#[tokio::test]
async fn a_lease_from_pending_ranges_costs_what_it_returns_not_the_backlog_behind_it() {
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
        // Ranges of 500, as relay passes write them.
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
    let first = store
        .delivery_lease(&LeaseParams { consumer: &c, session: "s", limit: 64, keys_after: "", lease_until: until, now })
        .await
        .unwrap();
    let second = store
        .delivery_lease(&LeaseParams { consumer: &c, session: "s", limit: 64, keys_after: "", lease_until: until, now })
        .await
        .unwrap();
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

/// Rows in `outbox.deliveries` are the exceptions (ADR 0041): a lease from a pending range and a
/// stream's ack of range-held deliveries find the few seqs with a row of their own by a range
/// scan per run of seqs, not by a look-up per delivery (ADR 0048). Both touch about as many
/// buffers for 512 deliveries as for 8, however many rows other consumers hold.
#[tokio::test]
async fn a_lease_and_an_ack_of_range_held_deliveries_cost_per_run_not_per_delivery() {
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
    // nor acked again, whatever the range says.
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

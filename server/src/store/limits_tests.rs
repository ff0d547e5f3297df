//! The database's half of least privilege and of the message limits (ADRs 0022, 0023): the
//! roles `outbox_producer` and `outbox_consumer` on a real PostgreSQL, proved from both sides
//! by logging in as an application role; and the limits that hold for writers that bypass
//! gRPC: `outbox.enqueue` and the tables on PostgreSQL, the tables on SQLite.
#![allow(clippy::unwrap_used)]

use std::str::FromStr;
use std::time::Duration;

use chrono::Utc;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::sqlite::SqlitePool;
use sqlx::{Connection as _, PgConnection};

use super::*;
use crate::domain::{Backoff, ConsumerName, ConsumerSpec, StartFrom, Topic, TopicPattern};
use crate::testing::{TestDb, TestSqlite};

/// SQLSTATE insufficient_privilege.
const DENIED: &str = "42501";
/// SQLSTATE check_violation.
const CHECK: &str = "23514";

async fn migrated_pg() -> (TestDb, SharedStore, PgPool) {
    let db = TestDb::create().await.unwrap();
    let store = connect(&db.url, 4).await.unwrap();
    store.migrate().await.unwrap();
    let owner = PgPool::connect(&db.url).await.unwrap();
    (db, store, owner)
}

/// A login role made for one test, dropped (with its grants) by [`AppRole::drop_in`].
struct AppRole {
    name: String,
    password: String,
}

impl AppRole {
    /// Creates `name` as a login role, member of `member_of`.
    async fn create(owner: &PgPool, prefix: &str, member_of: &str) -> Self {
        let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
        let password = uuid::Uuid::new_v4().simple().to_string();
        let sql = format!("CREATE ROLE {name} LOGIN PASSWORD '{password}' IN ROLE {member_of}");
        sqlx::query(sqlx::AssertSqlSafe(sql)).execute(owner).await.unwrap();
        Self { name, password }
    }

    /// A pool logged in as this role on the test database.
    async fn pool(&self, db: &TestDb) -> PgPool {
        let opts = PgConnectOptions::from_str(&db.url).unwrap().username(&self.name).password(&self.password);
        PgPoolOptions::new().max_connections(2).connect_with(opts).await.unwrap()
    }

    async fn drop_in(self, owner: &PgPool) {
        for sql in [format!("DROP OWNED BY {}", self.name), format!("DROP ROLE {}", self.name)] {
            sqlx::query(sqlx::AssertSqlSafe(sql)).execute(owner).await.unwrap();
        }
    }
}

fn sqlstate(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()).unwrap_or_default(),
        other => format!("not a database error: {other}"),
    }
}

async fn denied(pool: &PgPool, sql: &str) {
    let e = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned())).execute(pool).await.expect_err(sql);
    assert_eq!(sqlstate(&e), DENIED, "{sql}: {e}");
}

async fn message_count(owner: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox.messages").fetch_one(owner).await.unwrap()
}

#[tokio::test]
async fn the_roles_are_nologin_and_the_functions_run_as_their_owner_with_a_pinned_search_path() {
    let (_db, _store, owner) = migrated_pg().await;
    let roles: Vec<(String, bool)> = sqlx::query_as(
        "SELECT rolname::text, rolcanlogin FROM pg_roles WHERE rolname IN ('outbox_producer', 'outbox_consumer') ORDER BY 1",
    )
    .fetch_all(&owner)
    .await
    .unwrap();
    assert_eq!(roles, [("outbox_consumer".to_owned(), false), ("outbox_producer".to_owned(), false)]);
    let fns: Vec<(String, bool, Vec<String>)> = sqlx::query_as(
        "SELECT proname::text, prosecdef, proconfig FROM pg_proc
          WHERE pronamespace = 'outbox'::regnamespace AND proname IN ('enqueue', 'ack') ORDER BY 1",
    )
    .fetch_all(&owner)
    .await
    .unwrap();
    let pinned = vec!["search_path=pg_catalog, pg_temp".to_owned()];
    assert_eq!(fns, [("ack".to_owned(), true, pinned.clone()), ("enqueue".to_owned(), true, pinned)]);
    // PUBLIC may execute no function of the schema but the INSERT default `next_seq`; the two
    // roles only their entry point.
    let callable: Vec<(String, String)> = sqlx::query_as(
        "SELECT r.rolname::text, p.proname::text FROM pg_proc p, pg_roles r
          WHERE p.pronamespace = 'outbox'::regnamespace AND r.rolname IN ('outbox_producer', 'outbox_consumer')
            AND has_function_privilege(r.oid, p.oid, 'EXECUTE')
          ORDER BY 1, 2",
    )
    .fetch_all(&owner)
    .await
    .unwrap();
    let want = [
        ("outbox_consumer", "ack"),
        ("outbox_consumer", "next_seq"),
        ("outbox_producer", "enqueue"),
        ("outbox_producer", "next_seq"),
    ];
    assert_eq!(callable, want.map(|(r, f)| (r.to_owned(), f.to_owned())), "who may execute what");
    let public: Vec<String> = sqlx::query_scalar(
        "SELECT p.proname::text FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
          WHERE p.pronamespace = 'outbox'::regnamespace AND a.grantee = 0 AND a.privilege_type = 'EXECUTE'
          ORDER BY 1",
    )
    .fetch_all(&owner)
    .await
    .unwrap();
    assert_eq!(public, ["next_seq"], "PUBLIC executes only the INSERT default");
}

#[tokio::test]
async fn a_producer_role_enqueues_in_its_own_transaction_and_can_read_or_change_nothing_of_outboxd() {
    let (db, store, owner) = migrated_pg().await;
    // The application's own table, which it may write.
    sqlx::query("CREATE TABLE public.orders (id int PRIMARY KEY)").execute(&owner).await.unwrap();
    let app = AppRole::create(&owner, "outbox_test_orders_app", "outbox_producer").await;
    sqlx::query(sqlx::AssertSqlSafe(format!("GRANT INSERT ON public.orders TO {}", app.name)))
        .execute(&owner)
        .await
        .unwrap();
    // Another service's message, which it must not see.
    store
        .message_insert(
            &NewMessage {
                message_id: None,
                topic: Topic::parse("topic", "billing.secret").unwrap(),
                type_: "Secret".into(),
                payload: b"card".to_vec(),
                headers: Default::default(),
                ordering_key: None,
                delay: None,
            },
            Utc::now(),
        )
        .await
        .unwrap();
    let pool = app.pool(&db).await;

    // Allowed: the order and its event commit together, or neither does.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await.unwrap();
    let id: uuid::Uuid = sqlx::query_scalar(
        "SELECT outbox.enqueue('orders.created', 'OrderCreated', '\\x7b7d'::bytea, '{\"tenant\":\"acme\"}', NULL, 'order-42')",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let (topic, key): (String, Option<String>) =
        sqlx::query_as("SELECT topic, ordering_key FROM outbox.messages WHERE message_id = $1")
            .bind(id)
            .fetch_one(&owner)
            .await
            .unwrap();
    assert_eq!((topic.as_str(), key.as_deref()), ("orders.created", Some("order-42")));
    let before = message_count(&owner).await;
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders (id) VALUES (43)").execute(&mut *tx).await.unwrap();
    sqlx::query("SELECT outbox.enqueue('orders.created', 'OrderCreated', '\\x7b7d'::bytea)")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(message_count(&owner).await, before, "a rolled back enqueue left a message");
    // The same message again is the documented idempotent success, not an error.
    let again: uuid::Uuid =
        sqlx::query_scalar("SELECT outbox.enqueue('orders.created', 'OrderCreated', '\\x7b7d'::bytea, '{}', $1)")
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(again, id);
    // The limits hold for it too.
    let e = sqlx::query("SELECT outbox.enqueue('orders.created', 'T', '\\x'::bytea, jsonb_build_object('', 'v'))")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "22023", "{e}");
    assert!(e.to_string().contains("header key"), "{e}");

    // Denied: reading anyone's payloads, the other tables, writing them, and every other function.
    for sql in [
        "SELECT payload FROM outbox.messages",
        "SELECT count(*) FROM outbox.messages",
        "SELECT * FROM outbox.deliveries",
        "SELECT * FROM outbox.consumers",
        "INSERT INTO outbox.messages (message_id, topic, type, payload) VALUES (gen_random_uuid(), 'a', 'b', '\\x')",
        "UPDATE outbox.messages SET relayed_at = now()",
        "DELETE FROM outbox.messages",
        "TRUNCATE outbox.messages",
        "DELETE FROM outbox.deliveries",
        "INSERT INTO outbox.consumers (name, topics, max_deliveries, backoff_base_ms, backoff_max_ms, ack_deadline_ms, start_from) VALUES ('x', '{a}', 1, 0, 0, 1, 'new')",
        "DROP TABLE outbox.messages",
        "ALTER TABLE outbox.messages DROP CONSTRAINT messages_type_length",
        "CREATE TABLE outbox.mine (id int)",
        "SELECT * FROM outbox.enqueue_message('orders.created', 'T', '\\x'::bytea)",
        "SELECT outbox.ack('billing', gen_random_uuid())",
        "SELECT * FROM outbox.relay_claim(10, now(), 1)",
        "CREATE OR REPLACE FUNCTION outbox.enqueue(topic text, type text, payload bytea, headers jsonb DEFAULT '{}', message_id uuid DEFAULT NULL, ordering_key text DEFAULT NULL) RETURNS uuid LANGUAGE sql AS 'SELECT NULL::uuid'",
    ] {
        denied(&pool, sql).await;
    }
    pool.close().await;
    app.drop_in(&owner).await;
}

#[tokio::test]
async fn a_consumer_role_acks_in_its_own_transaction_and_can_do_nothing_else() {
    let (db, store, owner) = migrated_pg().await;
    let spec = ConsumerSpec {
        name: ConsumerName::parse("name", "billing").unwrap(),
        topics: vec![TopicPattern::parse("topics", "orders.>").unwrap()],
        max_deliveries: 5,
        backoff: Backoff { base: Duration::from_secs(1), max: Duration::from_secs(10) },
        ack_deadline: Duration::from_secs(30),
        start_from: StartFrom::New,
        sink: None,
        dead_key_policy: Default::default(),
    };
    store.consumer_create(&spec, Utc::now()).await.unwrap();
    let id: uuid::Uuid = sqlx::query_scalar("SELECT outbox.enqueue('orders.created', 'OrderCreated', '\\x'::bytea)")
        .fetch_one(&owner)
        .await
        .unwrap();
    store.relay_pass(500, Utc::now(), false, &[]).await.unwrap();
    let app = AppRole::create(&owner, "outbox_test_billing_app", "outbox_consumer").await;
    let pool = app.pool(&db).await;

    // Not bound to any consumer yet: refused, saying nothing of the message.
    for (consumer, message) in [("billing", id), ("billing", uuid::Uuid::new_v4())] {
        let e = sqlx::query("SELECT outbox.ack($1, $2)").bind(consumer).bind(message).execute(&pool).await.unwrap_err();
        assert_eq!(sqlstate(&e), "42501", "{e}");
        assert!(e.to_string().contains("may not ack for consumer 'billing'"), "{e}");
    }
    sqlx::query("INSERT INTO outbox.consumer_logins (login, consumer) VALUES ($1, 'bill*')")
        .bind(&app.name)
        .execute(&owner)
        .await
        .unwrap();
    // Bound to bill*: not to payments, whose deliveries it cannot touch.
    let e = sqlx::query("SELECT outbox.ack('payments', $1)").bind(id).execute(&pool).await.unwrap_err();
    assert_eq!(sqlstate(&e), "42501", "{e}");
    let e = sqlx::query("SELECT outbox.ack('billXng', $1)").bind(id).execute(&pool).await;
    assert!(e.is_ok(), "bill* takes billXng: {e:?}");

    let mut tx = pool.begin().await.unwrap();
    let acked: bool =
        sqlx::query_scalar("SELECT outbox.ack('billing', $1)").bind(id).fetch_one(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    assert!(acked);
    let state: String = sqlx::query_scalar("SELECT state FROM outbox.deliveries WHERE message_id = $1")
        .bind(id)
        .fetch_one(&owner)
        .await
        .unwrap();
    assert_eq!(state, "acked");
    let twice: bool = sqlx::query_scalar("SELECT outbox.ack('billing', $1)").bind(id).fetch_one(&pool).await.unwrap();
    assert!(!twice, "a second ack reports that the delivery was acked already");

    for sql in [
        "SELECT payload FROM outbox.messages",
        "SELECT * FROM outbox.deliveries",
        "UPDATE outbox.deliveries SET state = 'pending'",
        "SELECT outbox.enqueue('orders.created', 'T', '\\x'::bytea)",
    ] {
        denied(&pool, sql).await;
    }
    pool.close().await;
    app.drop_in(&owner).await;
}

#[tokio::test]
async fn the_owner_keeps_both_enqueue_paths_and_outbox_enqueue_holds_the_limits_naming_them() {
    let (_db, _store, owner) = migrated_pg().await;
    let headers = |n: usize, value_len: usize| {
        serde_json::Value::Object((0..n).map(|i| (format!("h{i:02}"), "v".repeat(value_len).into())).collect())
    };
    let enqueue = |type_: String, headers: serde_json::Value, key: Option<String>| {
        let owner = owner.clone();
        async move {
            sqlx::query("SELECT outbox.enqueue('orders.created', $1, '\\x'::bytea, $2, NULL, $3)")
                .bind(type_)
                .bind(sqlx::types::Json(headers))
                .bind(key)
                .execute(&owner)
                .await
        }
    };
    // The Rust client's statement (ADR 0014), as outboxd's own login.
    let insert = |type_: String, key: Option<String>| {
        let owner = owner.clone();
        async move {
            sqlx::query(
                "INSERT INTO outbox.messages (message_id, topic, type, payload, headers, ordering_key)
                 VALUES (gen_random_uuid(), 'orders.created', $1, '\\x', '{\"tenant\": \"acme\"}', $2)
                 ON CONFLICT (message_id) DO UPDATE SET type = outbox.messages.type",
            )
            .bind(type_)
            .bind(key)
            .execute(&owner)
            .await
        }
    };
    let ok = |r: Result<_, sqlx::Error>, what: &str| assert!(r.is_ok(), "{what}: {r:?}");
    let refused = |r: Result<_, sqlx::Error>, code: &str, words: &[&str]| {
        let e = r.expect_err(words[0]);
        assert_eq!(sqlstate(&e), code, "{e}");
        for w in words {
            assert!(e.to_string().contains(w), "{e} lacks {w:?}");
        }
    };
    const INVALID: &str = "22023";
    let none = || serde_json::json!({});

    ok(enqueue("T".repeat(255), headers(64, 253), Some("k".repeat(255))).await, "everything at its limit");
    // 255 bytes of two-byte characters is 127 of them: lengths are bytes, not characters.
    ok(enqueue("é".repeat(127), none(), None).await, "127 two-byte characters");
    refused(enqueue("é".repeat(128), none(), None).await, INVALID, &["type is 256 bytes", "255"]);
    refused(enqueue("T".into(), none(), Some("k".repeat(256))).await, INVALID, &["ordering_key is 256 bytes"]);
    refused(enqueue("T".into(), headers(65, 1), None).await, INVALID, &["65 headers", "64 entries"]);
    // 64 keys of 3 bytes and values of 253: exactly 16 KiB; one byte more is refused.
    let mut over = headers(64, 253);
    over["h00"] = "v".repeat(254).into();
    refused(enqueue("T".into(), over, None).await, INVALID, &["16385 bytes", "16384"]);
    refused(enqueue("T".into(), serde_json::json!({"": "v"}), None).await, INVALID, &["header key", "0 bytes"]);
    ok(enqueue("T".into(), serde_json::json!({"k".repeat(256): "v"}), None).await, "a 256-byte key");
    refused(enqueue("T".into(), serde_json::json!({"k".repeat(257): "v"}), None).await, INVALID, &["257 bytes"]);
    refused(enqueue("T".into(), serde_json::json!({"n": 1}), None).await, INVALID, &["a JSON number"]);

    // The plain INSERT works for the owner, and the table holds the length limits for it too.
    ok(insert("T".repeat(255), Some("k".repeat(255))).await, "the client's INSERT at the limits");
    refused(insert("é".repeat(128), None).await, CHECK, &["messages_type_length"]);
    refused(insert("T".into(), Some("k".repeat(256))).await, CHECK, &["messages_ordering_key_length"]);
}

#[tokio::test]
async fn sqlite_holds_the_same_limits_for_every_writer() {
    let db = TestSqlite::create().unwrap();
    let store = connect(&db.url, 4).await.unwrap();
    store.migrate().await.unwrap();
    let pool = SqlitePool::connect(&db.url).await.unwrap();
    let run = |type_: String, headers: serde_json::Value, key: Option<String>| {
        let pool = pool.clone();
        async move {
            sqlx::query(
                "INSERT INTO outbox_messages (topic, type, payload, headers, ordering_key)
                 VALUES ('orders.created', ?1, x'', ?2, ?3)",
            )
            .bind(type_)
            .bind(headers.to_string())
            .bind(key)
            .execute(&pool)
            .await
        }
    };
    let headers = |n: usize, value_len: usize| {
        serde_json::Value::Object((0..n).map(|i| (format!("h{i:02}"), "v".repeat(value_len).into())).collect())
    };
    let ok = |r: Result<_, sqlx::Error>, what: &str| assert!(r.is_ok(), "{what}: {r:?}");
    let refused = |r: Result<_, sqlx::Error>, limit: &str| {
        let e = r.expect_err(limit);
        assert!(e.to_string().contains(limit), "{limit}: {e}");
    };
    ok(run("T".repeat(255), headers(64, 200), Some("k".repeat(255))).await, "everything at its limit");
    ok(run("é".repeat(127), serde_json::json!({}), None).await, "127 two-byte characters");
    refused(run("é".repeat(128), serde_json::json!({}), None).await, "type is longer than 255 bytes");
    refused(run("T".into(), serde_json::json!({}), Some("k".repeat(256))).await, "ordering_key is longer");
    refused(run("T".into(), headers(65, 1), None).await, "headers exceed their limits");
    ok(run("T".into(), headers(64, 253), None).await, "16 KiB of headers");
    let mut over = headers(64, 253);
    over["h00"] = "v".repeat(254).into();
    refused(run("T".into(), over, None).await, "headers exceed their limits");
    refused(run("T".into(), serde_json::json!({"": "v"}), None).await, "headers exceed their limits");
    ok(run("T".into(), serde_json::json!({"k".repeat(256): "v"}), None).await, "a 256-byte key");
    refused(run("T".into(), serde_json::json!({"k".repeat(257): "v"}), None).await, "headers exceed their limits");
    refused(run("T".into(), serde_json::json!({"n": 1}), None).await, "header values must be JSON strings");
    refused(run("".into(), serde_json::json!({}), None).await, "type must not be empty");
    // Every refusal of the documented insert is a sentence naming the column, never a CHECK's text.
    for (sql, says) in [
        ("INSERT INTO outbox_messages (topic, type, payload) VALUES ('orders..x', 'T', x'')", "topic must be"),
        ("INSERT INTO outbox_messages (topic, type, payload) VALUES ('orders.x', 'T', NULL)", "payload is required"),
        (
            "INSERT INTO outbox_messages (topic, type, payload, headers) VALUES ('orders.x', 'T', x'', '[1]')",
            "headers must be a JSON object",
        ),
        (
            "INSERT INTO outbox_messages (topic, type, payload, message_id) VALUES ('orders.x', 'T', x'', 'ABC')",
            "message_id must be a UUID",
        ),
    ] {
        let e = sqlx::query(sql).execute(&pool).await.expect_err(says).to_string();
        assert!(e.contains(says) && !e.contains("CHECK constraint"), "{says}: {e}");
    }
    // The store's own path and a duplicate of an accepted row still work.
    let (id, type_): (String, String) =
        sqlx::query_as("SELECT message_id, type FROM outbox_messages LIMIT 1").fetch_one(&pool).await.unwrap();
    let dup = sqlx::query(
        "INSERT INTO outbox_messages (message_id, topic, type, payload) VALUES (?1, 'orders.created', ?2, x'')
         ON CONFLICT (message_id) DO UPDATE SET message_id = excluded.message_id",
    )
    .bind(&id)
    .bind(&type_)
    .execute(&pool)
    .await;
    ok(dup, "a duplicate enqueue");
    let other = sqlx::query(
        "INSERT INTO outbox_messages (message_id, topic, type, payload) VALUES (?1, 'a.b', ?2, x'')
         ON CONFLICT (message_id) DO NOTHING",
    )
    .bind(&id)
    .bind(&type_)
    .execute(&pool)
    .await;
    refused(other, "message_id exists already with a different topic, type or payload");
    pool.close().await;
}

#[tokio::test]
async fn databases_on_one_cluster_migrate_at_once_whatever_roles_exist() {
    let (a, b) = tokio::join!(TestDb::create(), TestDb::create());
    let (a, b) = (a.unwrap(), b.unwrap());
    let (sa, sb) = tokio::join!(connect(&a.url, 2), connect(&b.url, 2));
    let (sa, sb) = (sa.unwrap(), sb.unwrap());
    let (ra, rb) = tokio::join!(sa.migrate(), sb.migrate());
    ra.unwrap();
    rb.unwrap();
}

/// The migration's role creation, run by two transactions that race: the second waits on the
/// first's uncommitted role, then loses the race, and must succeed all the same. Run with role
/// names of its own, so that the cluster's real roles stay untouched.
#[tokio::test]
async fn creating_the_roles_survives_a_concurrent_creation_of_the_same_roles() {
    let db = TestDb::create().await.unwrap();
    let migration = include_str!("../../migrations/0009_roles_and_limits.sql");
    let start = migration.find("DO $$").unwrap();
    let end = start + migration[start..].find("$$;").unwrap() + 3;
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let (producer, consumer) = (format!("outbox_test_p_{suffix}"), format!("outbox_test_c_{suffix}"));
    let block = migration[start..end]
        .replace("'outbox_producer'", &format!("'{producer}'"))
        .replace("'outbox_consumer'", &format!("'{consumer}'"));
    assert!(block.contains(&producer) && block.contains(&consumer));

    let mut first = PgConnection::connect(&db.url).await.unwrap();
    let mut second = PgConnection::connect(&db.url).await.unwrap();
    let second_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut second).await.unwrap();
    sqlx::query("BEGIN").execute(&mut first).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(block.clone())).execute(&mut first).await.unwrap();
    let racing = tokio::spawn(async move {
        sqlx::query("BEGIN").execute(&mut second).await?;
        sqlx::query(sqlx::AssertSqlSafe(block)).execute(&mut second).await?;
        sqlx::query("COMMIT").execute(&mut second).await?;
        Ok::<_, sqlx::Error>(())
    });
    // The second creation is blocked on the first's uncommitted row in pg_authid.
    let observer = PgPool::connect(&db.url).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let waiting: Option<String> = sqlx::query_scalar("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1")
            .bind(second_pid)
            .fetch_optional(&observer)
            .await
            .unwrap()
            .flatten();
        if waiting.as_deref() == Some("Lock") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the second creation never waited on the first");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sqlx::query("COMMIT").execute(&mut first).await.unwrap();
    racing.await.unwrap().unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_roles WHERE rolname IN ($1, $2) AND NOT rolcanlogin")
        .bind(&producer)
        .bind(&consumer)
        .fetch_one(&observer)
        .await
        .unwrap();
    assert_eq!(n, 2);
    for r in [&producer, &consumer] {
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP ROLE {r}"))).execute(&observer).await.unwrap();
    }
}

/// The payload limit of the Enqueue RPC (`--max-payload-bytes`, written by outboxd at
/// start-up) holds for `outbox.enqueue` and for SQLite's documented insert: a producer that
/// writes through SQL cannot store a message that every stream would then refuse to carry.
#[tokio::test]
async fn the_payload_limit_holds_for_sql_producers_on_both_stores() {
    let (_db, store, owner) = migrated_pg().await;
    store.settings_write(16).await.unwrap();
    let enqueue = |n: usize| {
        let owner = owner.clone();
        async move {
            sqlx::query("SELECT outbox.enqueue('orders.created', 'T', $1)").bind(vec![b'x'; n]).execute(&owner).await
        }
    };
    enqueue(16).await.unwrap();
    let e = enqueue(17).await.unwrap_err();
    assert_eq!(sqlstate(&e), "22023");
    assert!(e.to_string().contains("payload is 17 bytes; the limit is 16 bytes"), "{e}");
    store.settings_write(1024 * 1024).await.unwrap();
    enqueue(17).await.unwrap();

    let db = TestSqlite::create().unwrap();
    let sqlite = connect(&db.url, 4).await.unwrap();
    sqlite.migrate().await.unwrap();
    sqlite.settings_write(16).await.unwrap();
    let pool = SqlitePool::connect(&db.url).await.unwrap();
    let insert = |n: usize| {
        let pool = pool.clone();
        async move {
            sqlx::query("INSERT INTO outbox_messages (topic, type, payload) VALUES ('orders.created', 'T', ?1)")
                .bind(vec![b'x'; n])
                .execute(&pool)
                .await
        }
    };
    insert(16).await.unwrap();
    let e = insert(17).await.unwrap_err();
    assert!(e.to_string().contains("--max-payload-bytes"), "{e}");
}

//! Migrations: an empty database and again, and databases and files that earlier releases
//! wrote, taken to the current schema with every delivery kept.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use chrono::{SubsecRound, Utc};

use super::*;
use crate::domain::DeliveryState;
use crate::testing::{TestDb, TestSqlite};

on_every_store!(migrations_apply_to_an_empty_database_and_again_as_a_no_op,);

async fn migrations_apply_to_an_empty_database_and_again_as_a_no_op(store: SharedStore) {
    store.migrate().await.unwrap();
    let e = store.message_insert(&msg("a.b"), Utc::now()).await.unwrap();
    assert!(!e.duplicate);
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
    let out = store.relay_pass(100, now, false, &[]).await.unwrap();
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
    assert_eq!(store.relay_pass(100, now, false, &[]).await.unwrap().messages, 0);
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
/// every state in every place it had (acked in `outbox.ack_log`, leased in
/// `outbox.lease_batches`, pending in `outbox.pending_batches`, rows that decide over those,
/// keyed in flight, retrying, dead), to
/// `outbox.delivery_ranges`: every delivery keeps its state and count, nothing acked is leased
/// again, what was held stays held by its holder (its stream's ack still takes), what waited is
/// leased in order, and the previous release's reads and writes of the old tables still work.
#[tokio::test]
async fn a_postgres_schema_with_every_state_in_the_tables_before_ranges_migrates_to_delivery_ranges() {
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
        // Seqs 1-2 acked out of `outbox.lease_batches` (into `outbox.ack_log`); 3 in
        // `outbox.lease_batches` but acked in the consumer's transaction (its row decides); 4-5
        // in `outbox.lease_batches`; 6 and 7 in two rows of `outbox.pending_batches`, 8 in the
        // second but acked in the consumer's transaction; 9 keyed and leased
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
    assert_eq!(timeline[0].acked_at, Some(at), "the time `outbox.ack_log` recorded");
    let (_, timeline) = store.message_get(id(11)).await.unwrap();
    assert_eq!(
        (timeline[0].delivery_count, timeline[0].last_error.as_deref(), timeline[0].available_at),
        (2, Some("boom"), at + chrono::Duration::hours(1))
    );

    // What waited is leased in order; nothing acked, nothing behind its key, nothing not yet due.
    let leased = store
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s2",
            limit: 10,
            keys_after: "",
            lease_until: at + chrono::Duration::seconds(30),
            now: at,
        })
        .await
        .unwrap();
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
    let leased = store
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s3",
            limit: 10,
            keys_after: "",
            lease_until: later + chrono::Duration::seconds(30),
            now: later,
        })
        .await
        .unwrap();
    assert_eq!(
        leased.iter().map(|d| (d.message.seq, d.delivery_count)).collect::<Vec<_>>(),
        [(10, 1), (11, 3)],
        "the key's next once its head is acked, and the retry once due; never an acked one"
    );

    // The views of the old tables' names, kept for the release before during its roll, went
    // with what only older releases called (migration 0030, ADR 0087).
    let gone: (bool, bool, bool, bool, bool, bool) = sqlx::query_as(
        "SELECT to_regclass('outbox.pending_batches') IS NULL, to_regclass('outbox.lease_batches') IS NULL,
                to_regclass('outbox.ack_log') IS NULL,
                to_regprocedure('outbox.delivery_ranges_insert_through_view()') IS NULL,
                to_regprocedure('outbox.relay_pass(integer, bigint, timestamptz, bigint, text, text[], text[],
                                                   integer[], timestamptz[])') IS NULL,
                to_regprocedure('outbox.relay_consumers(text[])') IS NULL",
    )
    .fetch_one(pg.pool())
    .await
    .unwrap();
    assert_eq!(gone, (true, true, true, true, true, true));
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
    let out = store.relay_pass(100, now, false, &[]).await.unwrap();
    assert_eq!((out.messages, out.deliveries), (3, 2), "5 had its delivery: none twice");
    assert_eq!(store.relay_pass(100, now, false, &[]).await.unwrap().messages, 0, "each once");
    assert_eq!(store.stats(None, false).await.unwrap().unrelayed, 0);
    let messages = store.message_list_after(0, 10).await.unwrap();
    let relayed: Vec<Option<i64>> = messages.iter().map(|m| m.relayed_at.map(|t| t.timestamp_micros())).collect();
    let at = Some(now.timestamp_micros());
    assert_eq!(relayed, [Some(1000), Some(2000), at, at, Some(5000)], "old times kept, new ones logged");
    let (_, rows) = store.message_get(messages[4].message_id).await.unwrap();
    assert_eq!((rows.len(), rows[0].delivery_count), (1, 2), "5's delivery as it was");
    let c = ConsumerName::parse("consumer", "c").unwrap();
    let leased = store
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s",
            limit: 10,
            keys_after: "",
            lease_until: now + chrono::Duration::seconds(30),
            now,
        })
        .await
        .unwrap();
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
    let out = store.relay_pass(100, now, false, &[]).await.unwrap();
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
    let leased = store
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s2",
            limit: 10,
            keys_after: "",
            lease_until: until,
            now,
        })
        .await
        .unwrap();
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
    store.relay_pass(500, now, false, &[]).await.unwrap();
    let leased = store
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s",
            limit: 10,
            keys_after: "",
            lease_until: crate::clock::add(now, Duration::from_secs(30)),
            now,
        })
        .await
        .unwrap();
    let leased: Vec<i64> = leased.iter().map(|d| d.message.seq).collect();
    assert_eq!(leased, [2, 4, 5]);
}

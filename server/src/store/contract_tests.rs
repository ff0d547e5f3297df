//! The client contract (`contract/`, ADR 0084) against the stores' own SQL: PostgreSQL's
//! `outbox.enqueue` (through the contract's statement) and `outbox.topic_matches`, and SQLite's
//! documented insert, take exactly the topics and patterns the grammar's vectors say, as the
//! server's parsers and every client's validation do.
#![allow(clippy::unwrap_used)]

use sqlx::postgres::PgPool;
use sqlx::sqlite::SqlitePool;

use super::connect;
use crate::testing::{TestDb, TestSqlite};

/// The contract's topic vectors: (topic, valid), with the longest topic and one past it.
fn topics() -> Vec<(String, bool)> {
    let grammar = grammar();
    let max = usize::try_from(grammar["max_length"].as_u64().unwrap()).unwrap();
    let list = |kind: &str, valid: bool| -> Vec<(String, bool)> {
        let cases = grammar["topics"][kind].as_array().unwrap();
        cases.iter().map(|t| (t.as_str().unwrap().to_owned(), valid)).collect()
    };
    let mut all = list("valid", true);
    all.extend(list("invalid", false));
    all.extend([("a".repeat(max), true), ("a".repeat(max + 1), false)]);
    all
}

fn grammar() -> serde_json::Value {
    serde_json::from_str(include_str!("../../../contract/topics.json")).unwrap()
}

#[tokio::test]
async fn postgres_takes_the_topics_and_matches_the_patterns_of_the_contract() {
    let db = TestDb::create().await.unwrap();
    connect(&db.url, 2).await.unwrap().migrate().await.unwrap();
    let pool = PgPool::connect(&db.url).await.unwrap();
    let enqueue = include_str!("../../../contract/sql/postgres-enqueue.sql");
    for (topic, valid) in topics() {
        let mut tx = pool.begin().await.unwrap();
        let got = sqlx::query_scalar::<_, uuid::Uuid>(enqueue)
            .bind(&topic)
            .bind("T")
            .bind(Vec::<u8>::new())
            .bind(serde_json::json!({}))
            .bind(None::<uuid::Uuid>)
            .bind(None::<String>)
            .fetch_one(&mut *tx)
            .await;
        tx.rollback().await.unwrap();
        match got {
            Ok(_) => assert!(valid, "outbox.enqueue took {topic:?}"),
            // PostgreSQL's text holds no NUL: refused before outbox.enqueue sees it.
            Err(e) if topic.contains('\0') => assert!(!valid, "{topic:?}: {e}"),
            Err(e) => assert!(!valid && e.to_string().contains("invalid topic"), "{topic:?}: {e}"),
        }
    }
    for case in grammar()["matches"].as_array().unwrap() {
        let (pattern, topic, want) = (case[0].as_str().unwrap(), case[1].as_str().unwrap(), case[2].as_bool().unwrap());
        let got: bool = sqlx::query_scalar("SELECT outbox.topic_matches(ARRAY[$1], $2)")
            .bind(pattern)
            .bind(topic)
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(got, want, "outbox.topic_matches({pattern:?}, {topic:?})");
    }
    pool.close().await;
}

#[tokio::test]
async fn sqlites_documented_insert_takes_the_topics_of_the_contract() {
    let db = TestSqlite::create().unwrap();
    connect(&db.url, 2).await.unwrap().migrate().await.unwrap();
    let pool = SqlitePool::connect(&db.url).await.unwrap();
    let insert = include_str!("../../../contract/sql/sqlite-enqueue.sql");
    for (topic, valid) in topics() {
        let got = sqlx::query(insert)
            .bind(&topic)
            .bind("T")
            .bind(Vec::<u8>::new())
            .bind("{}")
            .bind(uuid::Uuid::now_v7().to_string())
            .bind(None::<String>)
            .execute(&pool)
            .await;
        match got {
            Ok(_) => assert!(valid, "the documented insert took {topic:?}"),
            Err(e) => assert!(!valid && e.to_string().contains("topic must be"), "{topic:?}: {e}"),
        }
    }
    pool.close().await;
}

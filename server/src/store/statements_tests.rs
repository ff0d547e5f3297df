//! The named statements of both stores (ADR 0061): each is prepared against a freshly migrated
//! database, so that a misspelt column, a table a migration renamed or a parameter of the wrong
//! type fails here, under the statement's name, and not at its first call in production; and no
//! statement is written inline in a store's Rust.
use sqlx::Executor;

use super::Store;
use super::postgres::{self, PgStore};
use super::sqlite::{self, SqliteStore};
use crate::testing::{TestDb, TestSqlite};

#[tokio::test]
async fn every_postgres_statement_prepares_on_a_migrated_database() {
    let db = TestDb::create().await.unwrap();
    let store = PgStore::connect(&db.url, 2).await.unwrap();
    store.migrate().await.unwrap();
    let mut conn = store.pool().acquire().await.unwrap();
    let mut failed = Vec::new();
    for (name, sql) in postgres::q::ALL {
        if let Err(e) = (&mut *conn).prepare(sqlx::SqlSafeStr::into_sql_str(*sql)).await {
            failed.push(format!("{name}: {e}"));
        }
    }
    assert!(failed.is_empty(), "statements that do not prepare:\n{}", failed.join("\n"));
    assert!(postgres::q::ALL.len() > 50, "{} statements", postgres::q::ALL.len());
}

#[tokio::test]
async fn every_sqlite_statement_prepares_on_a_migrated_file() {
    let db = TestSqlite::create().unwrap();
    let store = SqliteStore::open(&db.url).await.unwrap();
    store.migrate().await.unwrap();
    let mut conn = store.pool().acquire().await.unwrap();
    let mut failed = Vec::new();
    for (name, sql) in sqlite::q::ALL {
        if let Err(e) = (&mut *conn).prepare(sqlx::SqlSafeStr::into_sql_str(*sql)).await {
            failed.push(format!("{name}: {e}"));
        }
    }
    assert!(failed.is_empty(), "statements that do not prepare:\n{}", failed.join("\n"));
    assert!(sqlite::q::ALL.len() > 50, "{} statements", sqlite::q::ALL.len());
}

/// The places in `source` where a statement is written in Rust: a string literal or a
/// `format!` given to `sqlx::query*` or `sqlx::raw_sql`.
fn inline_statements(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (n, line) in source.lines().enumerate() {
        for call in ["sqlx::query", "sqlx::raw_sql"] {
            let mut rest = line;
            while let Some(at) = rest.find(call) {
                let after = &rest[at + call.len()..];
                let args = after.find('(').map_or("", |p| &after[p + 1..]).trim_start();
                if args.starts_with('"') || args.starts_with("r#\"") || args.starts_with("sqlx::AssertSqlSafe") {
                    found.push(format!("line {}: {}", n + 1, line.trim()));
                }
                rest = after;
            }
        }
    }
    found
}

#[test]
fn the_stores_write_no_statement_inline() {
    // The one exception: VACUUM names each of outboxd's tables, read from the catalog.
    let vacuum = "match sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut *conn).await {";
    for (store, source) in [("postgres", include_str!("postgres/mod.rs")), ("sqlite", include_str!("sqlite/mod.rs"))] {
        let inline: Vec<_> = inline_statements(source).into_iter().filter(|l| !l.ends_with(vacuum)).collect();
        assert!(
            inline.is_empty(),
            "{store} writes statements inline instead of in queries/*.sql:\n{}",
            inline.join("\n")
        );
    }
    // The check itself finds what it looks for.
    assert_eq!(inline_statements("let n = sqlx::query_scalar::<_, i64>(\"SELECT 1\")").len(), 1);
    assert_eq!(inline_statements("sqlx::query(\n").len(), 0);
    assert_eq!(inline_statements("sqlx::query(sqlx::AssertSqlSafe(format!(\"{x}\")))").len(), 1);
}

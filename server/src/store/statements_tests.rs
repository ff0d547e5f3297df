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
/// `format!` given to `sqlx::query*` or `sqlx::raw_sql`, also when it starts on a later line or
/// after a comment.
fn inline_statements(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    for call in ["sqlx::query", "sqlx::raw_sql"] {
        let mut from = 0;
        while let Some(at) = source[from..].find(call).map(|at| from + at) {
            from = at + call.len();
            let after = &source[from..];
            // The call's parenthesis: past its name and types (`sqlx::query_as::<_, (i64,)>(`).
            let mut types = 0;
            let Some(open) = after.find(|c: char| {
                types += i32::from(c == '<') - i32::from(c == '>');
                c == '(' && types == 0
            }) else {
                break;
            };
            if after[..open].contains([';', '{', '\n']) {
                continue;
            }
            if first_argument(&after[open + 1..]).is_some_and(|a| {
                a.starts_with('"')
                    || a.starts_with("r#\"")
                    || a.starts_with("r\"")
                    || a.starts_with("sqlx::AssertSqlSafe")
            }) {
                let line = source[..at].matches('\n').count() + 1;
                let start = source[..at].rfind('\n').map_or(0, |n| n + 1);
                let text = source[start..].lines().next().unwrap_or_default();
                found.push(format!("line {line}: {}", text.trim()));
            }
        }
    }
    found.sort();
    found
}

/// The text of a call's first argument, past white space and comments (`None`: none left).
fn first_argument(mut rest: &str) -> Option<&str> {
    loop {
        rest = rest.trim_start();
        if let Some(comment) = rest.strip_prefix("//") {
            rest = comment.split_once('\n')?.1;
        } else if let Some(comment) = rest.strip_prefix("/*") {
            rest = comment.split_once("*/")?.1;
        } else {
            return Some(rest);
        }
    }
}

#[test]
fn the_stores_write_no_statement_inline() {
    // The one exception: VACUUM names each of outboxd's tables, read from the catalog.
    let vacuum = "match sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut *conn).await {";
    // Every file of the stores but the listener, whose tests speak SQL to the database.
    let sources = [
        ("postgres/mod.rs", include_str!("postgres/mod.rs")),
        ("postgres/connect.rs", include_str!("postgres/connect.rs")),
        ("postgres/maintenance.rs", include_str!("postgres/maintenance.rs")),
        ("postgres/relay.rs", include_str!("postgres/relay.rs")),
        ("postgres/rows.rs", include_str!("postgres/rows.rs")),
        ("postgres/seqs.rs", include_str!("postgres/seqs.rs")),
        ("postgres/tx.rs", include_str!("postgres/tx.rs")),
        ("sqlite/mod.rs", include_str!("sqlite/mod.rs")),
        ("sqlite/key_heads.rs", include_str!("sqlite/key_heads.rs")),
        ("sqlite/open.rs", include_str!("sqlite/open.rs")),
        ("sqlite/relay.rs", include_str!("sqlite/relay.rs")),
        ("sqlite/rows.rs", include_str!("sqlite/rows.rs")),
        ("sqlite/tx.rs", include_str!("sqlite/tx.rs")),
        ("sqlite/watch.rs", include_str!("sqlite/watch.rs")),
        ("sqlite/writer.rs", include_str!("sqlite/writer.rs")),
    ];
    for (file, source) in sources {
        let inline: Vec<_> = inline_statements(source).into_iter().filter(|l| !l.ends_with(vacuum)).collect();
        assert!(
            inline.is_empty(),
            "{file} writes statements inline instead of in queries/*.sql:\n{}",
            inline.join("\n")
        );
    }
    // The check itself finds what it looks for, on one line or several, past comments.
    assert_eq!(inline_statements("let n = sqlx::query_scalar::<_, i64>(\"SELECT 1\")").len(), 1);
    assert_eq!(inline_statements("sqlx::query(\n").len(), 0);
    assert_eq!(inline_statements("sqlx::query(sqlx::AssertSqlSafe(format!(\"{x}\")))").len(), 1);
    assert_eq!(inline_statements("sqlx::query(\n    // why\n    \"SELECT 1\",\n)").len(), 1);
    assert_eq!(inline_statements("sqlx::query_as::<_, (i64,)>(\n  /* a */ r#\"SELECT 1\"#)").len(), 1);
    assert_eq!(inline_statements("sqlx::query(q::CONSUMER_STATS)\n    .bind(\"x\")").len(), 0);
    assert_eq!(inline_statements("sqlx::query(sql).bind(1); f(\"SELECT 1\")").len(), 0);
}

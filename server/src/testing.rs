//! Test support (feature `testing`): a fresh PostgreSQL database per test.
use std::str::FromStr;

use sqlx::ConnectOptions;
use sqlx::postgres::PgConnectOptions;

/// The server every test database is created on. `OUTBOX_TEST_DATABASE_URL` overrides it.
pub fn base_url() -> String {
    std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// `url` with its database (path) replaced by `name`.
pub fn with_database(url: &str, name: &str) -> String {
    let (head, query) = url.split_once('?').map_or((url, None), |(h, q)| (h, Some(q)));
    let (scheme, rest) = head.split_once("://").unwrap_or(("postgres", head));
    let authority = rest.split_once('/').map_or(rest, |(a, _)| a);
    match query {
        Some(q) => format!("{scheme}://{authority}/{name}?{q}"),
        None => format!("{scheme}://{authority}/{name}"),
    }
}

/// A database that exists for one test and is dropped (forcibly) when this value is dropped.
#[derive(Debug)]
pub struct TestDb {
    pub url: String,
    name: String,
}

impl TestDb {
    /// Creates an empty database with a unique name (no migrations applied).
    pub async fn create() -> Result<Self, sqlx::Error> {
        let base = base_url();
        let name = format!("outboxd_test_{}", uuid::Uuid::new_v4().simple());
        let mut conn = PgConnectOptions::from_str(&base)?.connect().await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).execute(&mut conn).await?;
        let url = with_database(&base, &name);
        Ok(Self { url, name })
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs inside the test's runtime; a separate thread with its own runtime may block.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            rt.block_on(async move {
                if let Ok(opts) = PgConnectOptions::from_str(&base_url())
                    && let Ok(mut conn) = opts.connect().await
                {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")))
                        .execute(&mut conn)
                        .await;
                }
            });
        })
        .join();
    }
}

/// A SQLite file in its own temporary directory, removed when this value is dropped.
#[derive(Debug)]
pub struct TestSqlite {
    pub url: String,
    dir: std::path::PathBuf,
}

impl TestSqlite {
    pub fn create() -> std::io::Result<Self> {
        let dir = std::env::temp_dir().join(format!("outboxd_test_{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir)?;
        let url = format!("sqlite://{}", dir.join("outbox.db").display());
        Ok(Self { url, dir })
    }
}

impl Drop for TestSqlite {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

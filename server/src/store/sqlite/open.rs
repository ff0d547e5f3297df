//! Opening the file: its connection options, the read pool and the one writer, and the
//! one-server lock; and the migrations that bring its schema up to date.
use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous};

use super::SqliteStore;
use crate::store::{Result, StoreError};

pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations-sqlite");

impl SqliteStore {
    /// Opens (creating if missing) the file a `sqlite://PATH` URL names, and takes the
    /// one-server lock on it.
    pub async fn open(url: &str) -> Result<Self> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(5))
            .foreign_keys(true);
        let path = options.get_filename().to_path_buf();
        let lock = if path.as_os_str().is_empty() || path.to_string_lossy().contains(":memory:") {
            None
        } else {
            Some(Arc::new(take_lock(&path)?))
        };
        let pool = SqlitePoolOptions::new().max_connections(4).connect_with(options.clone()).await?;
        // Waits for the write lock in `retry_busy`, not in SQLite's busy handler.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone().busy_timeout(Duration::ZERO))
            .await?;
        Ok(Self { pool, writer, options, _lock: lock })
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

/// The exclusive lock that makes one server per file: held until the process ends (the OS
/// releases it on a crash too).
fn take_lock(db: &std::path::Path) -> Result<File> {
    let mut name = db.as_os_str().to_owned();
    name.push(".lock");
    let path = PathBuf::from(name);
    let io = |source| StoreError::Io { path: path.display().to_string(), source };
    let file = OpenOptions::new().create(true).truncate(false).write(true).open(&path).map_err(io)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::Locked(format!(
            "another outboxd is already serving {}: only one server may use a SQLite file \
             (use PostgreSQL for several replicas)",
            db.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(io(e)),
    }
}

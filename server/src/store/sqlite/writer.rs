//! The one writer: write transactions on this process's writer connection, and the wait for
//! the write lock while other processes (producers) hold it.
use std::time::Duration;

use sqlx::Sqlite;
use sqlx::sqlite::SqliteConnection;

use super::{SqliteStore, q};
use crate::store::Result;

/// How long a write of this process keeps trying for the write lock while other processes
/// (producers) hold it, trying every millisecond. SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20, 25 … ms between tries,
/// so that a write which met two or three producer commits in a row waited tens of
/// milliseconds for a lock held a fraction of one.
const WRITE_LOCK_WAIT: Duration = Duration::from_secs(5);
const WRITE_LOCK_RETRY: Duration = Duration::from_millis(1);

impl SqliteStore {
    /// A write transaction, on this process's one writer connection. Its commit is durable
    /// (`synchronous = FULL`, the WAL flushed); only relay passes commit without the flush.
    pub(super) async fn begin_write(&self) -> Result<sqlx::Transaction<'static, Sqlite>> {
        retry_busy(|| self.writer.begin_with("BEGIN IMMEDIATE")).await
    }
}

/// `BEGIN IMMEDIATE` on `conn`, trying again as [`retry_busy`] does.
pub(super) async fn begin_immediate(conn: &mut SqliteConnection) -> Result<()> {
    let start = std::time::Instant::now();
    loop {
        match sqlx::query(q::BEGIN_IMMEDIATE).execute(&mut *conn).await {
            Err(e) if is_busy(&e) && start.elapsed() < WRITE_LOCK_WAIT => tokio::time::sleep(WRITE_LOCK_RETRY).await,
            other => return other.map(|_| ()).map_err(Into::into),
        }
    }
}

fn is_busy(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().and_then(|c| c.parse::<i32>().ok()).is_some_and(|c| c & 0xff == 5))
}

/// Runs a write, trying again while another process holds the write lock (`SQLITE_BUSY`), up
/// to `WRITE_LOCK_WAIT`.
pub(super) async fn retry_busy<T, F, Fut>(mut write: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, sqlx::Error>>,
{
    let start = std::time::Instant::now();
    loop {
        match write().await {
            Err(e) if is_busy(&e) && start.elapsed() < WRITE_LOCK_WAIT => tokio::time::sleep(WRITE_LOCK_RETRY).await,
            other => return Ok(other?),
        }
    }
}

//! The watcher: commits of other processes to the file, noticed through
//! `PRAGMA data_version`, become [`WorkHint::Enqueued`].
use std::time::Duration;

use sqlx::Connection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use tokio_util::sync::CancellationToken;

use super::q;
use crate::store::{HintSender, WorkHint};

/// How often the watcher looks for commits made by other processes: every `WATCH_HOT` for
/// `WATCH_HOT_FOR` after it last saw one (traffic tends to go on), else every `WATCH_IDLE`.
/// A look is one in-process `PRAGMA data_version`, a few microseconds.
const WATCH_HOT: Duration = Duration::from_millis(1);
const WATCH_HOT_FOR: Duration = Duration::from_secs(1);
const WATCH_IDLE: Duration = Duration::from_millis(5);

/// Watches the file that `options` open until `cancel`, passing a hint on at every commit.
pub(super) async fn watch(options: &SqliteConnectOptions, hints: HintSender, cancel: CancellationToken) {
    let mut conn = loop {
        match SqliteConnection::connect_with(options).await {
            Ok(c) => break c,
            Err(e) => {
                tracing::warn!(error = %e, "cannot open the SQLite watcher connection; retrying");
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    };
    let mut last: Option<i64> = None;
    let mut last_change = std::time::Instant::now();
    loop {
        match sqlx::query_scalar::<_, i64>(q::DATA_VERSION).fetch_one(&mut conn).await {
            Ok(v) => {
                if last.is_some_and(|l| l != v) {
                    // The receiver is gone only at shutdown.
                    let _ = hints.send(WorkHint::Enqueued);
                    last_change = std::time::Instant::now();
                }
                last = Some(v);
            }
            Err(e) => tracing::warn!(error = %e, "PRAGMA data_version failed"),
        }
        let wait = if last_change.elapsed() < WATCH_HOT_FOR { WATCH_HOT } else { WATCH_IDLE };
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

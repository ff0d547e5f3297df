//! The vacuumer: keeps outboxd's own tables clean where the database's autovacuum does not
//! (turned off, or behind): every message and delivery leaves dead row versions behind, and
//! the index scans that find pending work step over their entries until a vacuum removes them.
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::{SharedStore, StoreError};

/// A table is vacuumed once it has more dead rows than this…
pub const MIN_DEAD_ROWS: i64 = 5_000;
/// …and more than this share of its live rows.
pub const DEAD_RATIO: f64 = 0.1;

#[derive(Debug, Clone)]
pub struct Vacuumer {
    store: SharedStore,
    pub interval: Duration,
    pub min_dead_rows: i64,
    pub dead_ratio: f64,
}

impl Vacuumer {
    pub fn new(store: SharedStore, interval: Duration) -> Self {
        Self { store, interval, min_dead_rows: MIN_DEAD_ROWS, dead_ratio: DEAD_RATIO }
    }

    /// One round: the tables past both thresholds, vacuumed; returns them.
    pub async fn run_once(&self) -> Result<Vec<String>, StoreError> {
        let started = std::time::Instant::now();
        let due: Vec<String> = self
            .store
            .table_health()
            .await?
            .into_iter()
            .filter(|t| t.dead_rows > self.min_dead_rows && t.dead_rows as f64 > self.dead_ratio * t.live_rows as f64)
            .map(|t| t.table)
            .collect();
        let done = self.store.vacuum_tables(&due).await?;
        if !done.is_empty() {
            tracing::info!(tables = ?done, took = ?started.elapsed(), "vacuumed");
        }
        Ok(done)
    }

    pub async fn run(self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
            if let Err(e) = self.run_once().await {
                tracing::warn!(error = %e, "vacuum failed; retrying at the next interval");
            }
        }
    }
}

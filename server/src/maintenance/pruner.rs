//! The pruner: deletes relayed, fully acked messages and their deliveries once they are older
//! than the retention. The retention is also the dedup horizon: a message id enqueued again
//! after its first copy was pruned is a new message.
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::store::{Pruned, SharedStore, StoreError};

#[derive(Debug, Clone)]
pub struct Pruner {
    store: SharedStore,
    clock: SharedClock,
    pub retention: Duration,
    pub interval: Duration,
    pub batch_size: i64,
}

impl Pruner {
    pub fn new(store: SharedStore, clock: SharedClock, retention: Duration, interval: Duration) -> Self {
        Self { store, clock, retention, interval, batch_size: 5000 }
    }

    /// Prunes everything older than `older_than` (the retention when `None`).
    pub async fn run_once_with(&self, older_than: Option<Duration>) -> Result<Pruned, StoreError> {
        let age = chrono::Duration::from_std(older_than.unwrap_or(self.retention)).unwrap_or(chrono::Duration::MAX);
        let cutoff = self.clock.now().checked_sub_signed(age).unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
        let pruned = self.store.prune(cutoff, self.batch_size).await?;
        if pruned.messages > 0 {
            tracing::info!(messages = pruned.messages, deliveries = pruned.deliveries, "pruned");
        }
        Ok(pruned)
    }

    pub async fn run_once(&self) -> Result<Pruned, StoreError> {
        self.run_once_with(None).await
    }

    pub async fn run(self, cancel: CancellationToken) {
        loop {
            if let Err(e) = self.run_once().await {
                tracing::warn!(error = %e, "prune failed; retrying at the next interval");
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }
}

//! The lease sweeper: deliveries whose ack deadline passed go back to pending after their
//! backoff, or to dead once `max_deliveries` is reached ([`Failure::Expired`]). It covers streams that vanished
//! without a goodbye, including every stream of a killed `outboxd`.
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::domain::{DeliveryState, Failure, Release, ReleaseGuard};
use crate::hub::Hub;
use crate::metrics;
use crate::store::{SharedStore, StoreError};
use crate::waking::Waking;

#[derive(Debug, Clone)]
pub struct LeaseSweeper {
    store: SharedStore,
    clock: SharedClock,
    hub: Hub,
    pub interval: Duration,
    pub batch_size: i64,
}

impl LeaseSweeper {
    pub fn new(store: SharedStore, clock: SharedClock, hub: Hub, interval: Duration) -> Self {
        Self { store, clock, hub, interval, batch_size: 1000 }
    }

    /// Releases one batch of expired leases; returns how many were released.
    pub async fn run_once(&self) -> Result<u64, StoreError> {
        let now = self.clock.now();
        let expired = self.store.delivery_expired(now, self.batch_size).await?;
        if expired.is_empty() {
            return Ok(0);
        }
        let releases: Vec<Release> = expired
            .iter()
            .map(|e| Failure::Expired.release(e.consumer.clone(), e.message_id, e.delivery_count, &e.retry, now))
            .collect();
        let n = Waking::new(&self.store, &self.hub).release(&releases, ReleaseGuard::ExpiredAt(now), now).await?;
        // Counted per lease found expired; one acked meanwhile was not released (n says how many were).
        for r in &releases {
            metrics::expired(r.consumer.as_str(), r.state == DeliveryState::Dead);
        }
        if n > 0 {
            tracing::info!(released = n, "released expired leases");
        }
        Ok(n)
    }

    /// How long to sleep before the next sweep: until the earliest lease deadline, but never
    /// longer than `interval` (leases that other replicas make meanwhile are found then), and
    /// not at all while leases are due.
    pub async fn next_wait(&self) -> Duration {
        match self.store.delivery_next_expiry().await {
            Ok(Some(t)) => (t - self.clock.now()).to_std().unwrap_or(Duration::ZERO).min(self.interval),
            Ok(None) => self.interval,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the next lease deadline; retrying");
                self.interval
            }
        }
    }

    /// Sweeps when a lease is due; idle, it costs one probe per `interval`.
    pub async fn run(self, cancel: CancellationToken) {
        loop {
            let mut wait = self.next_wait().await;
            if wait.is_zero() {
                wait = match self.run_once().await {
                    // Released what was due: look again at once.
                    Ok(n) if n > 0 => Duration::ZERO,
                    // Due but not released (acked meanwhile, or another replica swept it):
                    // the next probe says what is left.
                    Ok(_) => Duration::from_millis(10),
                    Err(e) => {
                        tracing::warn!(error = %e, "lease sweep failed; retrying");
                        self.interval
                    }
                };
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

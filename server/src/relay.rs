//! The relay: moves committed messages from the outbox into every matching consumer's inbox.
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::hub::Hub;
use crate::store::{RelayOutcome, SharedStore, StoreError};

/// How the relay waits for work. Producers writing through their own transactions cannot signal
/// this process (a NOTIFY on their commit path would serialise their commits), so the relay
/// polls: again at once after a pass that found work, then after `poll_min`, doubling up to
/// `poll_max` while nothing comes. Messages enqueued through this process's `Enqueue` RPC (and,
/// on SQLite, commits noticed by the store's watcher) wake it at once.
#[derive(Debug, Clone, Copy)]
pub struct RelayConfig {
    pub batch_size: i64,
    pub poll_min: Duration,
    pub poll_max: Duration,
    /// Announce new deliveries to other replicas with one NOTIFY per batch.
    pub notify: bool,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self { batch_size: 500, poll_min: Duration::from_millis(1), poll_max: Duration::from_millis(500), notify: true }
    }
}

#[derive(Debug, Clone)]
pub struct Relay {
    store: SharedStore,
    clock: SharedClock,
    hub: Hub,
    config: RelayConfig,
}

impl Relay {
    pub fn new(store: SharedStore, clock: SharedClock, hub: Hub, config: RelayConfig) -> Self {
        Self { store, clock, hub, config }
    }

    /// One pass: claim a batch, fan it out, commit, wake the consumers that got deliveries.
    pub async fn run_once(&self) -> Result<RelayOutcome, StoreError> {
        let started = std::time::Instant::now();
        let out = self.store.relay_batch(self.config.batch_size, self.clock.now(), self.config.notify).await?;
        if out.messages > 0 {
            crate::metrics::relayed(out.messages, started.elapsed());
        }
        for c in &out.consumers {
            self.hub.notify_consumer(c);
        }
        // One span per traced message, continuing its producer's trace; it ends here, once the
        // message's deliveries are committed.
        for (message_id, traceparent) in &out.traced {
            let span = tracing::info_span!("outboxd.relay", message_id = %message_id, batch = out.messages);
            crate::telemetry::continue_trace(&span, traceparent, None);
        }
        if out.messages > 0 {
            tracing::debug!(messages = out.messages, deliveries = out.deliveries, "relayed");
        }
        Ok(out)
    }

    /// Runs passes until cancelled; a failed pass is logged and retried after `poll_max`.
    pub async fn run(self, cancel: CancellationToken) {
        let mut enqueued = self.hub.enqueued().subscribe();
        let mut wait = self.config.poll_min;
        loop {
            match self.run_once().await {
                // Found work: more may have committed meanwhile, so look again at once. Busy
                // means no polling delay.
                Ok(out) if out.messages > 0 => {
                    wait = self.config.poll_min;
                    if cancel.is_cancelled() {
                        return;
                    }
                    continue;
                }
                Ok(_) => wait = (wait * 2).min(self.config.poll_max),
                Err(e) => {
                    tracing::warn!(error = %e, "relay pass failed; retrying");
                    wait = self.config.poll_max;
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = enqueued.changed() => wait = self.config.poll_min,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

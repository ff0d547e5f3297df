//! The per-consumer, per-table and pool gauges, refreshed from one stats query (and the
//! tables' health) every `--metrics-interval`, so that scraping never touches the database.
use std::time::Duration;

use metrics::gauge;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::hub::Hub;
use crate::metrics::{
    CONSUMER_BACKLOG, CONSUMER_DEAD, CONSUMER_HELD_KEYS, CONSUMER_IN_FLIGHT, CONSUMER_OLDEST_UNACKED_AGE,
    CONSUMER_PAUSED, CONSUMER_RETRYING, CONSUMER_STREAMS, DB_POOL_CONNECTIONS, DB_POOL_IDLE_CONNECTIONS,
    OLDEST_UNRELAYED_AGE, TABLE_BYTES, TABLE_DEAD_ROWS, TABLE_LIVE_ROWS, UNRELAYED_MESSAGES, VACUUM_HORIZON_AGE,
    VACUUM_HORIZON_XMIN_AGE, age,
};
use crate::store::{SharedStore, StoreError};

/// Refreshes the per-consumer gauges from the store every `interval`.
#[derive(Debug, Clone)]
pub struct GaugeCollector {
    pub store: SharedStore,
    pub clock: SharedClock,
    pub hub: Hub,
    pub interval: Duration,
}

impl GaugeCollector {
    pub async fn run_once(&self) -> Result<(), StoreError> {
        let stats = self.store.stats(None, false).await?;
        let now = self.clock.now();
        gauge!(UNRELAYED_MESSAGES).set(stats.unrelayed as f64);
        gauge!(OLDEST_UNRELAYED_AGE).set(stats.oldest_unrelayed_at.map_or(0.0, |t| age(now, t)));
        for c in stats.consumers {
            let label = c.consumer;
            gauge!(CONSUMER_BACKLOG, "consumer" => label.clone()).set(c.backlog as f64);
            gauge!(CONSUMER_IN_FLIGHT, "consumer" => label.clone()).set(c.in_flight as f64);
            gauge!(CONSUMER_RETRYING, "consumer" => label.clone()).set(c.retrying as f64);
            gauge!(CONSUMER_DEAD, "consumer" => label.clone()).set(c.dead as f64);
            gauge!(CONSUMER_HELD_KEYS, "consumer" => label.clone()).set(c.held_keys as f64);
            gauge!(CONSUMER_OLDEST_UNACKED_AGE, "consumer" => label.clone())
                .set(c.oldest_unacked_at.map_or(0.0, |t| age(now, t)));
            gauge!(CONSUMER_PAUSED, "consumer" => label.clone()).set(if c.paused { 1.0 } else { 0.0 });
            gauge!(CONSUMER_STREAMS, "consumer" => label.clone()).set(f64::from(self.hub.streams(&label)));
        }
        let (size, idle) = self.store.pool_status();
        for t in self.store.table_health().await? {
            gauge!(TABLE_DEAD_ROWS, "table" => t.table.clone()).set(t.dead_rows as f64);
            gauge!(TABLE_LIVE_ROWS, "table" => t.table.clone()).set(t.live_rows as f64);
            gauge!(TABLE_BYTES, "table" => t.table).set(t.bytes as f64);
        }
        let horizon = self.store.vacuum_horizon().await?;
        gauge!(VACUUM_HORIZON_AGE).set(horizon.as_ref().and_then(|h| h.longest).map_or(0.0, |t| age(now, t)));
        gauge!(VACUUM_HORIZON_XMIN_AGE).set(horizon.map_or(0.0, |h| h.xmin_age as f64));
        gauge!(DB_POOL_CONNECTIONS).set(f64::from(size));
        gauge!(DB_POOL_IDLE_CONNECTIONS).set(idle as f64);
        Ok(())
    }

    pub async fn run(self, cancel: CancellationToken) {
        loop {
            if let Err(e) = self.run_once().await {
                tracing::warn!(error = %e, "could not refresh metrics gauges");
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }
}

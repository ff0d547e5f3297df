//! Wake-ups across replicas: listens on `outbox_work`, where every relay announces the
//! consumers it just fanned out to, and wakes this process's streams of those consumers.
//! Notifications are hints: one lost while the connection was down is covered by waking every
//! stream after a reconnect, and by the streams' fallback poll.
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::hub::Hub;
use crate::store::PgStore;

#[derive(Debug, Clone)]
pub struct WorkListener {
    store: PgStore,
    hub: Hub,
}

impl WorkListener {
    pub fn new(store: PgStore, hub: Hub) -> Self {
        Self { store, hub }
    }

    fn dispatch(&self, payload: &str) {
        if payload.is_empty() {
            self.hub.notify_all();
        } else {
            for consumer in payload.split(',') {
                self.hub.notify_consumer(consumer);
            }
        }
    }

    pub async fn run(self, cancel: CancellationToken) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let mut listener = tokio::select! {
                _ = cancel.cancelled() => return,
                l = self.store.work_listener() => match l {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in = ?backoff, "cannot listen for relay notifications");
                        tokio::select! {
                            _ = cancel.cancelled() => return,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                        continue;
                    }
                },
            };
            backoff = Duration::from_millis(100);
            // Anything announced while we were not listening: wake everyone once.
            self.hub.notify_all();
            loop {
                let next = tokio::select! {
                    _ = cancel.cancelled() => return,
                    n = listener.try_recv() => n,
                };
                match next {
                    Ok(Some(n)) => self.dispatch(n.payload()),
                    // The connection dropped; the next try_recv reconnects.
                    Ok(None) => self.hub.notify_all(),
                    Err(e) => {
                        tracing::warn!(error = %e, "relay notification listener failed; reconnecting");
                        break;
                    }
                }
            }
        }
    }
}

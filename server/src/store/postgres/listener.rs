//! Work announced by other processes: listens on `outbox_work`, where every relay announces the
//! consumers it just fanned out to, and on `outbox_enqueued`, where producers' statements wake a
//! relay that backed off (ADR 0051), and passes each on as a [`WorkHint`]. Notifications are
//! hints: one lost while the connection was down is covered by a [`WorkHint::All`] and a
//! [`WorkHint::Enqueued`] after a reconnect, and by the streams' and the relay's fallback polls.
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{ENQUEUED_CHANNEL, PgStore};
use crate::store::{HintSender, WorkHint};

#[derive(Debug, Clone)]
pub struct WorkListener {
    store: PgStore,
    hints: HintSender,
}

impl WorkListener {
    pub fn new(store: PgStore, hints: HintSender) -> Self {
        Self { store, hints }
    }

    fn dispatch(&self, channel: &str, payload: &str) {
        if channel == ENQUEUED_CHANNEL {
            self.hint(WorkHint::Enqueued);
        } else if payload.is_empty() {
            self.hint(WorkHint::All);
        } else {
            self.hint(WorkHint::Consumers(payload.split(',').map(str::to_owned).collect()));
        }
    }

    fn hint(&self, hint: WorkHint) {
        // The receiver is gone only at shutdown.
        let _ = self.hints.send(hint);
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
            self.hint(WorkHint::All);
            self.hint(WorkHint::Enqueued);
            loop {
                let next = tokio::select! {
                    _ = cancel.cancelled() => return,
                    n = listener.try_recv() => n,
                };
                match next {
                    Ok(Some(n)) => self.dispatch(n.channel(), n.payload()),
                    // The connection dropped; the next try_recv reconnects.
                    Ok(None) => {
                        self.hint(WorkHint::All);
                        self.hint(WorkHint::Enqueued);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "relay notification listener failed; reconnecting");
                        break;
                    }
                }
            }
        }
    }
}

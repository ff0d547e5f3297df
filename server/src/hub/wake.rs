//! Wake-ups. A wake-up is a counter in a `watch` channel, so a waiter that was busy when it
//! was signalled still sees the change: no wake-up is lost. Whom a write wakes is decided by the
//! layer that writes (`crate::waking`, ADR 0085); the hub only carries the signal.
use std::sync::Arc;

use tokio::sync::watch;

use super::Hub;
use crate::store::WorkHint;

/// A wake-up source.
#[derive(Debug, Clone)]
pub struct Signal(Arc<watch::Sender<u64>>);

impl Default for Signal {
    fn default() -> Self {
        Self(Arc::new(watch::channel(0).0))
    }
}

impl Signal {
    pub fn notify(&self) {
        self.0.send_modify(|v| *v = v.wrapping_add(1));
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }
}

impl Hub {
    /// Signalled when a message was enqueued through this process; wakes the relay.
    pub fn enqueued(&self) -> &Signal {
        &self.0.enqueued
    }

    /// Signalled when this process created or deleted a consumer: the sink supervisor looks
    /// again.
    pub fn consumers_changed(&self) -> &Signal {
        &self.0.consumers_changed
    }

    /// Signalled when a relay pass claimed a full batch: there is a backlog to share.
    pub fn relay_backlog(&self) -> &Signal {
        &self.0.relay_backlog
    }

    /// Signalled when a relay pass of this process read messages: the vacuum rounds, which
    /// back off while outboxd's tables stand still, return to their interval.
    pub fn relayed(&self) -> &Signal {
        &self.0.relayed
    }

    /// Wakes the streams of one consumer: it may have something new to deliver.
    pub fn notify_consumer(&self, consumer: &str) {
        let map = self.0.consumers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = map.get(consumer) {
            e.signal.notify();
        }
    }

    /// Wakes the streams of every consumer.
    pub fn notify_all(&self) {
        let map = self.0.consumers.lock().unwrap_or_else(|e| e.into_inner());
        for e in map.values() {
            e.signal.notify();
        }
    }

    /// Wakes whom a hint names: the relay for [`WorkHint::Enqueued`], the streams of the
    /// consumers named, or of every consumer.
    pub fn wake(&self, hint: &WorkHint) {
        match hint {
            WorkHint::Enqueued => self.enqueued().notify(),
            WorkHint::Consumers(names) => names.iter().for_each(|c| self.notify_consumer(c)),
            WorkHint::All => self.notify_all(),
        }
    }
}

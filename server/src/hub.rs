//! In-process wake-ups and stream bookkeeping shared by the relay, the lease sweeper and the
//! delivery sessions. A wake-up is a counter in a `watch` channel, so a waiter that was busy
//! when it was signalled still sees the change: no wake-up is lost.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

#[derive(Debug, Clone, Default)]
pub struct Hub(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    enqueued: Signal,
    consumers: Mutex<HashMap<String, Entry>>,
}

#[derive(Debug, Default)]
struct Entry {
    signal: Signal,
    streams: u32,
}

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

    fn with_entry<T>(&self, consumer: &str, f: impl FnOnce(&mut Entry) -> T) -> T {
        let mut map = self.0.consumers.lock().unwrap_or_else(|e| e.into_inner());
        f(map.entry(consumer.to_owned()).or_default())
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

    /// Registers a stream of `consumer`; the returned guard unregisters it when dropped.
    pub fn attach(&self, consumer: &str) -> (watch::Receiver<u64>, StreamGuard) {
        let rx = self.with_entry(consumer, |e| {
            e.streams += 1;
            e.signal.subscribe()
        });
        (rx, StreamGuard { hub: self.clone(), consumer: consumer.to_owned() })
    }

    /// Streams attached to `consumer` in this process.
    pub fn streams(&self, consumer: &str) -> u32 {
        let map = self.0.consumers.lock().unwrap_or_else(|e| e.into_inner());
        map.get(consumer).map_or(0, |e| e.streams)
    }
}

#[derive(Debug)]
pub struct StreamGuard {
    hub: Hub,
    consumer: String,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut map = self.hub.0.consumers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = map.get_mut(&self.consumer) {
            e.streams = e.streams.saturating_sub(1);
            if e.streams == 0 {
                map.remove(&self.consumer);
            }
        }
    }
}

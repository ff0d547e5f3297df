//! In-process coordination between the relay, the lease sweeper and the delivery sessions,
//! one protocol a file:
//!
//! - `wake`: wake-ups ([`Signal`]): the relay's, the sink supervisor's and each consumer's
//!   streams'. Whom a write wakes is the business of the layer that writes (`crate::waking`);
//! - `turn`: the streams of a consumer lease its pending work one at a time ([`LeaseTurn`]);
//! - `lend`: the room a stream lends the relay, and the one message ([`Handed`]) in which a
//!   pass hands it what it leased to it;
//! - `slots`: the streams that lend room ([`PushSlot`]), what one pass offers and hands over.
//!
//! [`Hub`] is the registry they share: per consumer, its wake-up, its streams, its push slots
//! and its lease turn.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

mod lend;
mod slots;
mod turn;
mod wake;

pub use lend::{Handed, InFlightBytes, Lend};
pub use slots::{Offered, PushSlot, PushSlots};
pub use turn::{LeaseTurn, TurnGuard};
pub use wake::Signal;

#[derive(Debug, Clone, Default)]
pub struct Hub(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    enqueued: Signal,
    relay_backlog: Signal,
    relayed: Signal,
    consumers_changed: Signal,
    consumers: Mutex<HashMap<String, Entry>>,
}

#[derive(Debug, Default)]
struct Entry {
    signal: Signal,
    streams: u32,
    /// Streams that take deliveries straight from the relay.
    slots: Vec<PushSlot>,
    turn: Arc<LeaseTurn>,
}

impl Hub {
    fn with_entry<T>(&self, consumer: &str, f: impl FnOnce(&mut Entry) -> T) -> T {
        let mut map = self.0.consumers.lock().unwrap_or_else(|e| e.into_inner());
        f(map.entry(consumer.to_owned()).or_default())
    }

    /// Registers a stream of `consumer`: its wake-ups, the consumer's [`LeaseTurn`] in this
    /// process, and a guard that unregisters the stream when dropped.
    pub fn attach(&self, consumer: &str) -> (watch::Receiver<u64>, Arc<LeaseTurn>, StreamGuard) {
        let (rx, turn) = self.with_entry(consumer, |e| {
            e.streams += 1;
            (e.signal.subscribe(), e.turn.clone())
        });
        (rx, turn, StreamGuard { hub: self.clone(), consumer: consumer.to_owned() })
    }

    /// Lets the relay lease new deliveries of `consumer` straight to this stream; the returned
    /// guard withdraws the slot when dropped.
    pub fn offer(&self, consumer: &str, slot: PushSlot) -> PushGuard {
        let session = slot.session.clone();
        self.with_entry(consumer, |e| e.slots.push(slot));
        PushGuard { hub: self.clone(), consumer: consumer.to_owned(), session }
    }

    /// Every push slot now, for one relay pass.
    pub fn push_slots(&self) -> PushSlots {
        let map = self.0.consumers.lock().unwrap_or_else(|e| e.into_inner());
        PushSlots {
            slots: map.iter().filter(|(_, e)| !e.slots.is_empty()).map(|(c, e)| (c.clone(), e.slots.clone())).collect(),
        }
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

#[derive(Debug)]
pub struct PushGuard {
    hub: Hub,
    consumer: String,
    session: String,
}

impl Drop for PushGuard {
    fn drop(&mut self) {
        let mut map = self.hub.0.consumers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = map.get_mut(&self.consumer) {
            e.slots.retain(|s| s.session != self.session);
        }
    }
}

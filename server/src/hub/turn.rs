//! Lease turns: the streams of a consumer in this process lease its pending work one at a
//! time, and a stream skips a lease that one started after its wake-up already made.
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use super::Signal;

/// Whose turn it is to lease pending work of one consumer in this process, and what the last
/// lease that drained it saw.
///
/// A wake-up reaches every stream of the consumer. Were they all to lease at once, each would
/// hold its room out of the relay's pushes while it waits on the others' leases (they queue on
/// the same pending ranges), so the relay would park the next messages as pending work too,
/// whose wake-up starts it all again: a cycle that, under steady load, cost more than the
/// relay itself. So the streams of a consumer lease one at a time, and a stream whose wake-up
/// came before the start of a lease that drained everything due skips its own: that lease
/// already saw the work the wake-up announced.
#[derive(Debug, Default)]
pub struct LeaseTurn {
    busy: AtomicBool,
    /// Counts the turns given back, so that a stream that found the turn taken wakes when
    /// it is free again, without waiting for it (it keeps serving its stream meanwhile).
    released: Signal,
    /// One more than the wake-up count read before the latest lease that found less than it
    /// asked for (0: none yet).
    drained: AtomicU64,
    /// When that lease's consumer has its next delivery due, as read after it.
    next_due: Mutex<Option<DateTime<Utc>>>,
}

impl LeaseTurn {
    /// This process's turn to lease for the consumer, if no other stream of it has it; the
    /// turn passes on when the guard is dropped.
    pub fn try_take(&self) -> Option<TurnGuard<'_>> {
        self.busy.compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire).ok().map(|_| TurnGuard(self))
    }

    /// Changes each time a turn is given back.
    pub fn released(&self) -> watch::Receiver<u64> {
        self.released.subscribe()
    }

    /// Whether a lease that started after wake-up `woken` found everything that was due.
    pub fn drained_since(&self, woken: u64) -> bool {
        woken < self.drained.load(Ordering::Acquire)
    }

    /// A lease that started when the wake-up count was `seen` found less than it asked for.
    pub fn drained(&self, seen: u64) {
        self.drained.fetch_max(seen.saturating_add(1), Ordering::AcqRel);
    }

    pub fn set_next_due(&self, due: Option<DateTime<Utc>>) {
        *self.next_due.lock().unwrap_or_else(|e| e.into_inner()) = due;
    }

    pub fn next_due(&self) -> Option<DateTime<Utc>> {
        *self.next_due.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A consumer's lease turn, held; given back (and the waiting streams woken) when dropped.
#[derive(Debug)]
pub struct TurnGuard<'a>(&'a LeaseTurn);

impl Drop for TurnGuard<'_> {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
        self.0.released.notify();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::Hub;

    #[tokio::test]
    async fn streams_of_a_consumer_share_one_lease_turn_that_remembers_the_last_drain() {
        let hub = Hub::default();
        let (_rx_a, turn_a, _a) = hub.attach("c");
        let (_rx_b, turn_b, _b) = hub.attach("c");
        let (_rx_o, turn_o, _o) = hub.attach("other");
        assert!(Arc::ptr_eq(&turn_a, &turn_b));
        assert!(!Arc::ptr_eq(&turn_a, &turn_o));
        let released = turn_b.released();
        let held = turn_a.try_take().expect("free");
        assert!(turn_b.try_take().is_none(), "one lease at a time per consumer");
        assert!(turn_o.try_take().is_some(), "other consumers lease meanwhile");
        assert!(!released.has_changed().unwrap_or(true));
        drop(held);
        assert!(released.has_changed().unwrap_or(false), "a stream that found it taken is woken");
        assert!(turn_b.try_take().is_some());
        assert!(!turn_a.drained_since(0), "no drain yet, not even of wake-up 0");
        turn_a.drained(3);
        assert!(turn_b.drained_since(0));
        assert!(turn_b.drained_since(3), "a wake-up read before the draining lease started");
        assert!(!turn_b.drained_since(4), "a later wake-up may announce work that lease never saw");
        turn_a.drained(1);
        assert!(turn_b.drained_since(3), "an older drain never moves it back");
        assert!(!turn_o.drained_since(0));
    }
}

//! A principal's byte budget: the bytes of deliveries its streams may hold at once.
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// The bytes of deliveries one principal's streams may hold at once: leased to them and not
/// yet acked, nacked or expired (`--max-in-flight-bytes-per-principal`). Shared by all of the
/// principal's streams, so that a tenant's slow readers cannot make outboxd hold more of its
/// payloads than this, whatever their `max_in_flight`.
///
/// Room is taken before the deliveries are read, so each slot taken reserves a delivery's
/// largest size (the unit); a delivery that arrives gives back what it did not need, and its
/// ack (nack, expiry, the stream's end) gives back the rest.
#[derive(Debug)]
pub struct ByteBudget {
    free: AtomicUsize,
    limit: usize,
    /// A take fell short since the last give that announced bytes coming back.
    refused: AtomicBool,
    /// Counts gives that followed a refusal: a stream refused its room waits for this instead
    /// of a fallback poll.
    returned: tokio::sync::watch::Sender<u64>,
}

impl ByteBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            free: AtomicUsize::new(limit),
            limit,
            refused: AtomicBool::new(false),
            returned: tokio::sync::watch::channel(0).0,
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes free now.
    pub fn available(&self) -> usize {
        self.free.load(Ordering::SeqCst)
    }

    /// Takes `unit` bytes up to `want` times, as many times as there are bytes for. A take
    /// that falls short makes the next give announce itself ([`ByteBudget::returned`]).
    pub fn take_units(&self, want: usize, unit: usize) -> usize {
        let unit = unit.max(1);
        let mut taken = 0;
        let _ = self.free.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |free| {
            taken = (free / unit).min(want);
            Some(free - taken * unit)
        });
        if taken < want {
            self.refused.store(true, Ordering::SeqCst);
            // A give between the take and the flag saw no refusal and announced nothing:
            // announce it here, so that the refused caller, who waits for the next
            // announcement, does not wait for a give that has come already.
            if self.free.load(Ordering::SeqCst) >= unit {
                self.announce();
            }
        }
        taken
    }

    /// Gives back `bytes` taken.
    pub fn give(&self, bytes: usize) {
        if bytes > 0 {
            self.free.fetch_add(bytes, Ordering::SeqCst);
            if self.refused.swap(false, Ordering::SeqCst) {
                self.announce();
            }
        }
    }

    /// Changes whenever bytes come back after a take fell short.
    pub fn returned(&self) -> tokio::sync::watch::Receiver<u64> {
        self.returned.subscribe()
    }

    fn announce(&self) {
        self.returned.send_modify(|v| *v = v.wrapping_add(1));
    }
}

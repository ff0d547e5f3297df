//! When a session leases: whether pending work may wait for it, what made it think so, whose
//! turn it waits for, when the store's next delivery and its own next retry fall due, how long
//! a busy stream lets a batch of room fill up, and how long it backs off after a failed lease.
//!
//! Plain data: no I/O, no clock of its own. The session tells it what happened (a wake-up, a
//! lease that found less than it asked for, a nack's retry) and asks it what to do next; tests
//! drive it with explicit times.
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;

/// How long a busy stream may wait for a batch of free slots before it leases anyway.
pub const FILL_DELAY: Duration = Duration::from_millis(2);

/// Backoff after a failed lease: doubles from the first to the last.
const ERROR_BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// What the session should do about leasing now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing to lease, or no room: a wake-up, a timer or a freed slot comes first.
    Idle,
    /// Busy, with less room than a batch: wait this long for more to free up.
    Fill(Duration),
    /// Lease now.
    Lease,
}

/// The session's leasing state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pace {
    /// Whether pending deliveries may wait for this stream: set by a wake-up or a timer,
    /// cleared by a lease that found less than it asked for. Acks alone do not make work
    /// pending (except with an ordering key, whose ack wakes the consumer), so handling them
    /// costs no lease query.
    maybe_pending: bool,
    /// What set `maybe_pending`: the consumer's wake-up count when only wake-ups did (a lease
    /// by another stream that started after it and drained everything makes this one's
    /// unnecessary), `None` when a timer or this stream's own state did (it leases whatever).
    pending_since: Option<u64>,
    /// Another stream of the consumer was leasing when this one wanted to: it leases when
    /// that turn is given back.
    awaits_turn: bool,
    /// When the consumer's next pending delivery falls due, as last read from the store.
    store_due: Option<DateTime<Utc>>,
    /// When a retry this session scheduled falls due.
    retry_due: Option<DateTime<Utc>>,
    /// When this stream last leased.
    last_fill: Option<Instant>,
    error_backoff: Duration,
}

impl Default for Pace {
    fn default() -> Self {
        Self::new()
    }
}

/// The time left until `t`, zero if it has passed.
pub fn until(t: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (t - now).to_std().unwrap_or(Duration::ZERO)
}

impl Pace {
    /// A new stream: whatever is pending may wait for it.
    pub fn new() -> Self {
        Self {
            maybe_pending: true,
            pending_since: None,
            awaits_turn: false,
            store_due: None,
            retry_due: None,
            last_fill: None,
            error_backoff: Duration::ZERO,
        }
    }

    /// Pending work may wait: announced by wake-up `woken`, or (`None`) found by a timer.
    pub fn pending(&mut self, woken: Option<u64>) {
        self.pending_since = match (self.maybe_pending, self.pending_since, woken) {
            (false, _, w) => w,
            // Already pending for a reason no drain answers: stays so.
            (true, None, _) | (true, _, None) => None,
            (true, Some(a), Some(b)) => Some(a.max(b)),
        };
        self.maybe_pending = true;
    }

    /// Whether pending work may wait for this stream.
    pub fn maybe_pending(&self) -> bool {
        self.maybe_pending
    }

    /// The wake-up count that alone made work pending, if only wake-ups did.
    pub fn pending_since(&self) -> Option<u64> {
        self.pending_since
    }

    /// Whether the stream waits for another stream of its consumer to give the turn back.
    pub fn awaits_turn(&self) -> bool {
        self.awaits_turn
    }

    /// The timers at `now`: a store due time or a retry that has come makes work pending;
    /// returns how long until the next of them.
    pub fn tick(&mut self, now: DateTime<Utc>) -> Duration {
        let mut next = Duration::MAX;
        let mut came = false;
        for due in [&mut self.store_due, &mut self.retry_due] {
            match *due {
                Some(t) if t > now => next = next.min(until(t, now)),
                Some(_) => {
                    *due = None;
                    came = true;
                }
                None => {}
            }
        }
        if came {
            self.pending(None);
        }
        next
    }

    /// Whether to lease now, with `room` free slots of a window that leases `batch` at a time.
    pub fn next(&self, room: usize, batch: usize, window_empty: bool, at: Instant) -> Next {
        if !self.maybe_pending || room == 0 {
            return Next::Idle;
        }
        let waited = self.last_fill.map_or(Duration::MAX, |t| at.saturating_duration_since(t));
        // While the stream is busy, lease in batches rather than one row per ack, waiting at
        // most FILL_DELAY for the batch to fill up; an idle stream leases at once.
        if room < batch && !window_empty && waited < FILL_DELAY {
            return Next::Fill(FILL_DELAY - waited);
        }
        Next::Lease
    }

    /// Another stream's lease, started after this one's wake-up, took everything due; the
    /// consumer's next due time is `next_due`. Returns how long nothing is due.
    pub fn drained_by_another(&mut self, next_due: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Duration {
        self.awaits_turn = false;
        self.maybe_pending = false;
        self.store_due = next_due.filter(|due| *due > now);
        self.store_due.map_or(Duration::MAX, |due| until(due, now))
    }

    /// Another stream of the consumer is leasing: this one leases when it gives the turn back.
    pub fn turn_taken(&mut self) {
        self.awaits_turn = true;
    }

    /// This stream leases now, at `at`.
    pub fn leasing(&mut self, at: Instant) {
        self.awaits_turn = false;
        self.last_fill = Some(at);
    }

    /// The lease found less than it asked for: nothing more is due now. The store says the
    /// consumer's next pending delivery is due at `next_due`; returns how long until then
    /// (`MAX` when it is due already but blocked by an ordering key or a pause, whose end
    /// wakes the consumer, or when nothing is pending).
    pub fn drained(&mut self, next_due: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Duration {
        self.error_backoff = Duration::ZERO;
        self.maybe_pending = false;
        match next_due {
            Some(due) if due > now => {
                self.store_due = Some(due);
                until(due, now)
            }
            _ => Duration::MAX,
        }
    }

    /// A lease failed: how long to wait before the next try (doubling, within bounds).
    pub fn lease_failed(&mut self) -> Duration {
        self.error_backoff = (self.error_backoff * 2).clamp(ERROR_BACKOFF.0, ERROR_BACKOFF.1);
        self.error_backoff
    }

    /// A nack this stream wrote makes its delivery due again at `due`.
    pub fn retry_at(&mut self, due: DateTime<Utc>) {
        self.retry_due = Some(self.retry_due.map_or(due, |d| d.min(due)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::add;

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000, 0).unwrap()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_new_stream_leases_at_once() {
        let pace = Pace::new();
        assert!(pace.maybe_pending());
        assert_eq!(pace.next(10, 4, true, Instant::now()), Next::Lease);
    }

    #[test]
    fn a_stream_without_room_or_pending_work_leases_nothing() {
        let mut pace = Pace::new();
        assert_eq!(pace.next(0, 4, false, Instant::now()), Next::Idle);
        pace.drained(None, t0());
        assert_eq!(pace.next(10, 4, true, Instant::now()), Next::Idle);
    }

    #[test]
    fn a_busy_stream_waits_briefly_for_a_batch_of_room() {
        let mut pace = Pace::new();
        let at = Instant::now();
        pace.leasing(at);
        // One slot free, a batch is 4, the window holds some: wait for the rest of FILL_DELAY.
        assert_eq!(pace.next(1, 4, false, at + ms(1)), Next::Fill(FILL_DELAY - ms(1)));
        // Past FILL_DELAY it leases what room there is.
        assert_eq!(pace.next(1, 4, false, at + FILL_DELAY), Next::Lease);
        // An empty window or a full batch of room does not wait.
        assert_eq!(pace.next(1, 4, true, at + ms(1)), Next::Lease);
        assert_eq!(pace.next(4, 4, false, at + ms(1)), Next::Lease);
    }

    #[test]
    fn a_drained_lease_waits_for_a_wake_up_or_the_next_due_time() {
        let mut pace = Pace::new();
        let now = t0();
        assert_eq!(pace.drained(Some(add(now, ms(300))), now), ms(300));
        assert!(!pace.maybe_pending());
        assert_eq!(pace.tick(add(now, ms(100))), ms(200));
        assert!(!pace.maybe_pending(), "nothing is due before the store's time");
        // The store's time comes: work may be pending, the stream leases.
        assert_eq!(pace.tick(add(now, ms(300))), Duration::MAX);
        assert!(pace.maybe_pending());
        assert_eq!(pace.pending_since(), None, "a timer's pending work is leased whatever");
        assert_eq!(pace.next(4, 4, true, Instant::now()), Next::Lease);
    }

    #[test]
    fn due_already_but_blocked_waits_for_a_wake_up_only() {
        let mut pace = Pace::new();
        let now = t0();
        // Due now yet not leased: an ordering key's head or a pause holds it; their end wakes.
        assert_eq!(pace.drained(Some(now), now), Duration::MAX);
        assert_eq!(pace.tick(add(now, ms(1000))), Duration::MAX);
        assert!(!pace.maybe_pending());
        pace.pending(Some(7));
        assert!(pace.maybe_pending());
        assert_eq!(pace.pending_since(), Some(7));
    }

    #[test]
    fn wake_ups_merge_but_a_timer_makes_pending_unconditional() {
        let mut pace = Pace::new();
        pace.drained(None, t0());
        pace.pending(Some(3));
        pace.pending(Some(5));
        assert_eq!(pace.pending_since(), Some(5), "the latest wake-up is what a drain must follow");
        pace.pending(None);
        assert_eq!(pace.pending_since(), None);
        pace.pending(Some(9));
        assert_eq!(pace.pending_since(), None, "a timer's reason stays until a lease drains");
    }

    #[test]
    fn another_streams_drain_ends_the_wait_for_the_turn() {
        let mut pace = Pace::new();
        let now = t0();
        pace.drained(None, now);
        pace.pending(Some(1));
        pace.turn_taken();
        assert!(pace.awaits_turn());
        assert_eq!(pace.drained_by_another(Some(add(now, ms(50))), now), ms(50));
        assert!(!pace.awaits_turn());
        assert!(!pace.maybe_pending());
        assert_eq!(pace.tick(add(now, ms(50))), Duration::MAX);
        assert!(pace.maybe_pending(), "the next due time it learnt from the other stream came");
        // A next due time already past is not a timer.
        let mut pace = Pace::new();
        assert_eq!(pace.drained_by_another(Some(now), now), Duration::MAX);
        assert_eq!(pace.tick(add(now, ms(10))), Duration::MAX);
        assert!(!pace.maybe_pending());
    }

    #[test]
    fn a_retry_makes_work_pending_when_it_falls_due() {
        let mut pace = Pace::new();
        let now = t0();
        pace.drained(None, now);
        pace.retry_at(add(now, ms(500)));
        pace.retry_at(add(now, ms(200)));
        pace.retry_at(add(now, ms(900)));
        assert_eq!(pace.tick(now), ms(200), "the earliest retry is the one waited for");
        assert!(!pace.maybe_pending());
        assert_eq!(pace.tick(add(now, ms(200))), Duration::MAX);
        assert!(pace.maybe_pending());
    }

    #[test]
    fn failed_leases_back_off_doubling_within_bounds() {
        let mut pace = Pace::new();
        let waits: Vec<Duration> = (0..8).map(|_| pace.lease_failed()).collect();
        assert_eq!(waits[..4], [ms(100), ms(200), ms(400), ms(800)]);
        assert_eq!(*waits.last().unwrap(), Duration::from_secs(5));
        // A lease that works resets it.
        pace.drained(None, t0());
        assert_eq!(pace.lease_failed(), ms(100));
    }
}

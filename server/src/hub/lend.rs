//! Room a stream lends the relay, and the one message in which a pass hands it what it leased
//! to it.
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::domain::LeasedDelivery;
use crate::limits::ByteBudget;

/// A stream's share of a [`ByteBudget`]: the budget, and the bytes one slot reserves.
#[derive(Debug, Clone)]
pub struct InFlightBytes {
    pub budget: Arc<ByteBudget>,
    /// The largest a delivery can be.
    pub unit: usize,
}

impl InFlightBytes {
    /// Takes a unit for each of up to `want` slots, as many as the budget has; a shortfall is
    /// counted as a refusal of `max_in_flight_bytes_per_principal`.
    pub fn take_units(&self, want: usize) -> usize {
        let got = self.budget.take_units(want, self.unit);
        if got < want {
            crate::limits::refused("max_in_flight_bytes_per_principal");
        }
        got
    }
}

/// Room a stream lends the relay, so that a pass can lease new deliveries straight to it.
///
/// The stream alone decides how much: it sets the lend, and takes it back, while no pass holds
/// it ([`Lend::adjust`]). A pass takes the whole lend for its length ([`Lend::take`]) and ends
/// with one step ([`Lend::hand_over`]) that sends the stream what the pass leased to it and
/// keeps the rest lent. So at every moment outside that step what the stream counts as lent is
/// the room here plus the deliveries on their way to it, and the stream can reconcile its room
/// and its order itself: nothing it counts is changed behind its back.
///
/// The lend is a count of slots. A stream whose principal has a byte budget takes the budget's
/// units only for what a pass holds, when it takes the lend: room lent and unused holds no
/// bytes, so it never keeps the stream's own leases, or the principal's other streams, from
/// the budget. Each delivery handed over carries its unit to the stream (see [`Handed`]).
#[derive(Debug, Default)]
pub struct Lend {
    state: Mutex<LendState>,
    bytes: Option<InFlightBytes>,
}

#[derive(Debug, Default)]
struct LendState {
    room: usize,
    /// A pass holds the lend, with this many units of the byte budget.
    taken: Option<usize>,
    /// Passes that have held the lend and ended.
    passes: u64,
    /// The stream wants word when the pass that holds the lend ends, even with nothing for it.
    wake: bool,
}

/// What a relay pass hands a stream as it ends, in one message: the deliveries it leased to
/// the stream, and its number among the passes that held the stream's lend. Each delivery
/// holds a unit of its principal's byte budget until the stream holds it
/// ([`Handed::take_deliveries`]); a message dropped unread gives those units back.
#[derive(Debug)]
pub struct Handed {
    deliveries: Vec<LeasedDelivery>,
    pub pass: u64,
    bytes: Option<InFlightBytes>,
}

impl Handed {
    /// The deliveries, whose units of the byte budget are the taker's from now on (the window
    /// that holds one settles its unit to its size).
    pub fn take_deliveries(&mut self) -> Vec<LeasedDelivery> {
        std::mem::take(&mut self.deliveries)
    }

    /// The deliveries, their units given back (they will not be held).
    fn take_deliveries_giving_back(&mut self) -> Vec<LeasedDelivery> {
        let deliveries = self.take_deliveries();
        if let Some(b) = &self.bytes {
            b.budget.give(deliveries.len() * b.unit);
        }
        deliveries
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        if let Some(b) = &self.bytes {
            b.budget.give(self.deliveries.len() * b.unit);
        }
    }
}

impl Lend {
    /// A lend whose passes take units of a principal's byte budget (none without one).
    pub fn bounded(bytes: Option<InFlightBytes>) -> Self {
        Self { state: Mutex::default(), bytes }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, LendState> {
        // Plain numbers: a panic elsewhere cannot leave them half-written.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The stream's side: while no pass holds the lend, `set` gets the room lent now and returns
    /// the room to lend from now on; `false` (and `set` is not called) while a pass holds it.
    pub fn adjust(&self, set: impl FnOnce(usize) -> usize) -> bool {
        let mut s = self.state();
        if s.taken.is_some() {
            return false;
        }
        s.room = set(s.room);
        true
    }

    /// The number the pass that holds the lend will carry in its [`Handed`], which it sends
    /// even if it leases nothing; `None` while no pass holds it.
    pub fn wake_when_handed(&self) -> Option<u64> {
        let mut s = self.state();
        s.taken.is_some().then(|| {
            s.wake = true;
            s.passes + 1
        })
    }

    /// The relay's side: the lend for one pass, at most `max` of it and as much as the byte
    /// budget has units for; `None` when there is nothing to lend or another pass holds it.
    pub fn take(&self, max: usize) -> Option<usize> {
        let mut s = self.state();
        if s.taken.is_some() || s.room == 0 || max == 0 {
            return None;
        }
        let want = s.room.min(max);
        let got = self.bytes.as_ref().map_or(want, |b| b.take_units(want));
        if got == 0 {
            return None;
        }
        s.taken = Some(got);
        Some(got)
    }

    /// Ends a pass's hold: sends what it leased to the stream (if anything, or if the stream
    /// asked for word) and lends the rest on, in one step; the units the pass did not use go
    /// back to the budget. The deliveries come back, their units given back too, when the
    /// stream has gone.
    pub fn hand_over(
        &self,
        deliveries: Vec<LeasedDelivery>,
        tx: &mpsc::UnboundedSender<Handed>,
    ) -> Result<(), Vec<LeasedDelivery>> {
        let mut s = self.state();
        let units = s.taken.take().unwrap_or(0);
        if let Some(b) = &self.bytes {
            b.budget.give(units.saturating_sub(deliveries.len()) * b.unit);
        }
        s.passes += 1;
        s.room = s.room.saturating_sub(deliveries.len());
        if deliveries.is_empty() && !std::mem::take(&mut s.wake) {
            return Ok(());
        }
        s.wake = false;
        let handed = Handed { deliveries, pass: s.passes, bytes: self.bytes.clone() };
        // Dropping the unsent message gives the deliveries' units back.
        tx.send(handed).map_err(|mut unsent| unsent.0.take_deliveries_giving_back())
    }
}

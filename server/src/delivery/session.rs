//! A delivery session: one `Subscribe` stream of one consumer.
//!
//! The session leases due deliveries up to its `max_in_flight`, sends them, and applies the
//! stream's [`Command`]s (acks, nacks, extends; parsed at the edge, or made by a sink's runner).
//! What it holds and how much room it has is its [`Window`]; it lends the relay part of that
//! room ([`Lend`]), and a relay pass hands it what it pushed there in one message, so that the
//! session alone counts its room; what it leased while a pass held the lend waits for that
//! pass's hand-over ([`Order`]), so each stream sends in seq order. It sleeps until something can
//! change: a command from the stream, a wake-up for its consumer (the relay fanned out, a lease
//! was released), deliveries the relay pushed to it, the next retry falling due, or a slow
//! fallback poll (work fanned out by another replica).
//!
//! Ending: when the stream ends, what it still holds is released at once. If the connection
//! broke (reset, transport error), a delivery at its last attempt is dead, so a message that
//! crashes its consumer still dies; a clean half-close (a consumer stopping on purpose) counts
//! against nothing. A late ack of a lease that expired while this stream held it is still
//! applied; an ack for an id the stream never held is ignored. When the server shuts down, the
//! session stops leasing, waits up to the drain timeout for outstanding acks, releases the rest
//! as pending, and ends the stream with [`StreamError::ShuttingDown`] (`UNAVAILABLE` at the edge).
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Command;
use super::order::Order;
use super::pace::{Next, Pace, until};
use super::window::{Held, Window};
use crate::clock::{self, SharedClock};
use crate::domain::{
    Consumer, ConsumerName, DeliveryState, Failure, LeasedDelivery, MessageId, Release, ReleaseGuard, Withdrawal,
};
use crate::hub::{Handed, Hub, InFlightBytes, LeaseTurn, Lend, PushGuard, PushSlot, TurnGuard};
use crate::store::{ExtendParams, LeaseParams, SharedStore, StoreError, next_key_cursor};
use crate::waking::Waking;
use crate::{metrics, telemetry};

/// Commands taken from a stream in one pass before they are applied.
const MAX_COMMANDS_PER_PASS: usize = 512;

/// What every session of this process shares.
#[derive(Debug, Clone)]
pub struct SessionContext {
    pub store: SharedStore,
    pub clock: SharedClock,
    pub hub: Hub,
    /// Cancelled when the server shuts down.
    pub shutdown: CancellationToken,
    /// Every task that serves a stream (sessions, tails, replays): shutdown waits for them.
    pub tasks: TaskTracker,
    pub drain_timeout: Duration,
    /// Fallback poll for work fanned out by other replicas.
    pub poll_interval: Duration,
}

impl SessionContext {
    /// The store's writes that wake whom they make work for: the only way to write them.
    pub fn waking(&self) -> Waking<'_> {
        Waking::new(&self.store, &self.hub)
    }
}

/// The validated `start` of a stream.
#[derive(Debug, Clone)]
pub struct SessionStart {
    pub consumer: Consumer,
    pub max_in_flight: u32,
    pub ack_deadline: Duration,
    /// The byte budget its principal's streams share, if any.
    pub bytes: Option<InFlightBytes>,
}

/// What the client sent: a command, or word that its transport failed.
pub type Incoming = Result<Command, Broken>;

/// The client's transport failed (reset, the client vanished), as the edge describes it: what
/// the stream held counts against it, as it would for a consumer that crashed on it. A stream
/// the edge refuses (a request that means nothing, a revoked permission) is not broken: its
/// commands end as if the client had closed it, and the edge gives the client its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken(pub String);

/// Why the session ends its stream with an error; the edge turns each into its status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// The server is shutting down: the client should reconnect.
    #[error("outboxd is shutting down; reconnect")]
    ShuttingDown,
    /// The consumer was deleted while the stream served it.
    #[error("consumer {0:?} was deleted")]
    ConsumerDeleted(String),
}

/// Where a session sends what it leased: a `Subscribe` stream (the edge turns each delivery
/// into its wire form) or a sink's publisher. An `Err` ends the stream with that error.
pub type Outbound = mpsc::Sender<Result<LeasedDelivery, StreamError>>;

#[derive(Debug)]
pub struct Session {
    id: String,
    ctx: SessionContext,
    start: SessionStart,
    window: Window,
    /// This stream's slot in the hub while it takes pushes.
    push: Option<PushGuard>,
    /// The room this stream lends the relay (the window counts it).
    lend: Arc<Lend>,
    /// What relay passes hand this stream as they end.
    pushed: mpsc::UnboundedReceiver<Handed>,
    push_tx: mpsc::UnboundedSender<Handed>,
    /// What it leased while a relay pass held the lend, until that pass hands over.
    order: Order,
    /// The ordering key the next lease starts after, so that every key gets its turn.
    key_cursor: String,
    /// Acks whose write failed; retried on the next pass.
    unwritten_acks: Vec<(MessageId, Held)>,
    /// A client's stream (not a sink's): a cancelled call is a break, see [`Session::run`].
    cancel_is_break: bool,
    /// When it leases: pending work, turns, timers, batching, backoff.
    pace: Pace,
    /// Announces bytes coming back to the principal's budget (see [`crate::limits::ByteBudget`]).
    bytes_returned: Option<watch::Receiver<u64>>,
    /// The last lease found room but no bytes for it: the stream leases again when the
    /// budget announces bytes coming back.
    awaits_bytes: bool,
    /// Set once the server shuts down: no more leases, acks until then.
    drain_until: Option<Instant>,
}

enum End {
    /// The client half-closed the stream cleanly: a consumer stopping on purpose.
    Closed,
    /// The connection broke (reset, transport error, the client vanished): maybe a consumer
    /// crashing on what it held.
    Broken,
    /// The server is shutting down.
    Shutdown,
    /// The session cannot go on; the stream ends with this error.
    Failed(StreamError),
}

/// What a lease attempt leaves the loop to do.
enum Leased {
    /// It got all it asked for: there may be more, lease again.
    Again,
    /// Nothing more to lease before this long (or a wake-up).
    Wait(Duration),
    End(End),
}

/// What woke the loop.
enum Event {
    Shutdown,
    DrainOver,
    Commands(Vec<Command>, Option<End>),
    Pushed(Handed),
    /// The consumer's wake-up signal, at this count: something may be pending.
    Signalled(u64),
    /// A timer, or room given back: lease whatever is due.
    Woken,
    /// Another stream of the consumer gave back the lease turn this one waits for.
    TurnFree,
    Ended(End),
}

/// The span of one delivery of a traced message: a child of the producer's span, and the
/// parent the consumer's handler continues (its context replaces the delivery's `traceparent`).
/// Messages without a trace context get a disabled span, which costs nothing.
fn deliver_span(consumer: &str, d: &mut LeasedDelivery) -> tracing::Span {
    let Some(traceparent) = d.message.headers.get(telemetry::TRACEPARENT) else {
        return tracing::Span::none();
    };
    let span = tracing::info_span!(
        "outboxd.deliver", otel.kind = "producer", consumer, message_id = %d.message.message_id,
        delivery_count = d.delivery_count,
    );
    telemetry::continue_trace(&span, traceparent, d.message.headers.get("tracestate").map(String::as_str));
    telemetry::inject(&span, &mut d.message.headers);
    span
}

impl Session {
    /// A client's stream over gRPC: a call the client cancels ends it as a break (see
    /// [`Session::run`]); a sink ends its own sessions, cleanly.
    pub fn of_client(mut self) -> Self {
        self.cancel_is_break = true;
        self
    }

    pub fn new(ctx: SessionContext, start: SessionStart) -> Self {
        let (push_tx, pushed) = mpsc::unbounded_channel();
        let bytes_returned = start.bytes.as_ref().map(|b| b.budget.returned());
        Self {
            bytes_returned,
            id: uuid::Uuid::new_v4().to_string(),
            window: Window::bounded(start.max_in_flight as usize, start.bytes.clone()),
            push: None,
            lend: Arc::new(Lend::bounded(start.bytes.clone())),
            pushed,
            push_tx,
            order: Order::default(),
            ctx,
            start,
            key_cursor: String::new(),
            unwritten_acks: Vec::new(),
            cancel_is_break: false,
            pace: Pace::new(),
            awaits_bytes: false,
            drain_until: None,
        }
    }

    fn consumer(&self) -> &ConsumerName {
        &self.start.consumer.spec.name
    }

    /// Runs the session until the stream ends; everything still held is released.
    pub async fn run<S>(mut self, mut inbound: S, out: Outbound)
    where
        S: Stream<Item = Incoming> + Unpin,
    {
        let (mut wake, turn, _guard) = self.ctx.hub.attach(self.consumer().as_str());
        let slot = PushSlot {
            session: self.id.clone(),
            ack_deadline: self.start.ack_deadline,
            lend: self.lend.clone(),
            tx: self.push_tx.clone(),
        };
        self.push = Some(self.ctx.hub.offer(self.consumer().as_str(), slot));
        tracing::info!(consumer = %self.consumer(), session = %self.id, max_in_flight = self.start.max_in_flight, "stream attached");
        let end = match self.serve(&mut inbound, &out, &mut wake, &turn).await {
            // tonic ends the requests of a call the client cancelled (HTTP/2 `RST_STREAM`) as it
            // ends those of a half-closed one. A client that half-closed still reads the stream's
            // end; one that cancelled does not, and the response side goes with the call at
            // once. A cancel is how some clients fail (a handler's error, a deadline): counted
            // like a break, so that a message a handler keeps cancelling on becomes a dead letter.
            End::Closed if self.cancel_is_break && cancelled(&out).await => End::Broken,
            end => end,
        };
        // Acks the client sent that could not be written yet (the database busy or away): the
        // client acked them, so they are written before anything is released, while their
        // leases may still hold; a late ack counts too (ADR 0006).
        let settle_until = tokio::time::Instant::now() + self.start.ack_deadline;
        let mut backoff = SETTLE_BACKOFF;
        while !self.unwritten_acks.is_empty() && tokio::time::Instant::now() < settle_until {
            let retry = std::mem::take(&mut self.unwritten_acks);
            self.write_acks(retry).await;
            if !self.unwritten_acks.is_empty() {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(SETTLE_BACKOFF_MAX);
            }
        }
        // Leased and never sent: the consumer never saw them, so they count against nothing.
        let unsent: Vec<MessageId> = self.order.unsent().into_iter().map(|d| d.message.message_id).collect();
        let unsent: Vec<(MessageId, Held)> =
            unsent.into_iter().filter_map(|id| self.window.nack(&id).map(|h| (id, h))).collect();
        if let Err(e) = self.release(unsent, false).await {
            tracing::warn!(consumer = %self.consumer(), error = %e, "could not release leases; the sweeper will");
        }
        // A lease it sent whose deadline passed while the stream ended is the sweeper's, and
        // counts as an expiry (T14): the close must not withdraw it.
        self.window.expire(self.ctx.clock.now());
        // Only a broken stream counts against what it held, and only what it sent; a clean
        // close or a shutdown does not.
        let counts_as_failure = matches!(end, End::Broken);
        if let Err(e) = self.release_all(counts_as_failure).await {
            tracing::warn!(consumer = %self.consumer(), error = %e, "could not release leases; the sweeper will");
        }
        // No more pushes. What arrived and was never sent is released uncounted: the consumer
        // never saw it.
        self.push = None;
        self.pushed.close();
        while let Ok(handed) = self.pushed.try_recv() {
            self.hold_handed(handed);
        }
        if let Err(e) = self.release_all(false).await {
            tracing::warn!(consumer = %self.consumer(), error = %e, "could not release leases; the sweeper will");
        }
        match end {
            End::Closed | End::Broken => {}
            End::Shutdown => {
                let _ = out.send(Err(StreamError::ShuttingDown)).await;
            }
            End::Failed(e) => {
                let _ = out.send(Err(e)).await;
            }
        }
        tracing::info!(consumer = %self.consumer(), session = %self.id, "stream detached");
    }

    async fn serve<S>(
        &mut self,
        inbound: &mut S,
        out: &Outbound,
        wake: &mut watch::Receiver<u64>,
        turn: &LeaseTurn,
    ) -> End
    where
        S: Stream<Item = Incoming> + Unpin,
    {
        let mut turn_released = turn.released();
        loop {
            let now = self.ctx.clock.now();
            self.window.expire(now);
            if !self.unwritten_acks.is_empty() {
                let retry = std::mem::take(&mut self.unwritten_acks);
                self.write_acks(retry).await;
            }
            let mut sleep_for = self.ctx.poll_interval.min(self.pace.tick(now));
            self.lend_room();
            let woken = *wake.borrow();
            // Seen before trying: a turn given back, or bytes coming back, from now on wake
            // the loop.
            turn_released.borrow_and_update();
            if let Some(returned) = &mut self.bytes_returned {
                returned.borrow_and_update();
            }
            match self.lease(now, out, turn, woken).await {
                Leased::Again => continue,
                Leased::Wait(d) => sleep_for = sleep_for.min(d),
                Leased::End(end) => return end,
            }
            if let Some(deadline) = self.window.next_deadline() {
                sleep_for = sleep_for.min(until(deadline, now));
            }
            if self.drain_until.is_some() && self.window.is_empty() {
                return End::Shutdown;
            }
            let drain_deadline = self.drain_until.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            self.lend_room();

            let event = tokio::select! {
                biased;
                _ = self.ctx.shutdown.cancelled(), if self.drain_until.is_none() => Event::Shutdown,
                _ = tokio::time::sleep_until(drain_deadline), if self.drain_until.is_some() => Event::DrainOver,
                first = inbound.next() => take_ready(first, inbound),
                Some(handed) = self.pushed.recv() => Event::Pushed(handed),
                _ = wake.changed() => Event::Signalled(*wake.borrow_and_update()),
                _ = turn_released.changed(), if self.pace.awaits_turn() => Event::TurnFree,
                _ = changed(&mut self.bytes_returned), if self.awaits_bytes => Event::Woken,
                _ = out.closed() => Event::Ended(End::Broken),
                _ = tokio::time::sleep(sleep_for) => Event::Woken,
            };
            if let Some(end) = self.on(event, now, out).await {
                return end;
            }
        }
    }

    /// Applies what woke the loop; `Some` when the stream ends.
    async fn on(&mut self, event: Event, now: DateTime<Utc>, out: &Outbound) -> Option<End> {
        match event {
            Event::Shutdown => {
                self.drain_until = Some(Instant::now() + self.ctx.drain_timeout);
                // Draining: the relay sends nothing new here.
                self.push = None;
                None
            }
            Event::DrainOver => Some(End::Shutdown),
            Event::Commands(commands, end) => {
                self.apply(commands).await;
                end
            }
            Event::Pushed(handed) => (!self.on_handed(handed, now, out).await).then_some(End::Broken),
            Event::Signalled(count) => {
                self.pace.pending(Some(count));
                None
            }
            Event::Woken => {
                self.pace.pending(None);
                None
            }
            // `maybe_pending` is still set: the loop tries again.
            Event::TurnFree => None,
            Event::Ended(end) => Some(end),
        }
    }

    /// Lends the relay its share of the room (see [`Window::lend`]): with pending work to
    /// lease, the smaller half; none once draining. A pass that holds the lend keeps it as it
    /// is until it hands over.
    fn lend_room(&mut self) {
        if self.drain_until.is_some() {
            self.window.withdraw(&self.lend);
        } else {
            self.window.lend(&self.lend, self.pace.maybe_pending());
        }
    }

    /// Holds what a relay pass handed this stream (each delivery's unit of the byte budget is
    /// the window's from now on).
    fn hold_handed(&mut self, mut handed: Handed) -> Vec<LeasedDelivery> {
        let deliveries = handed.take_deliveries();
        for d in &deliveries {
            self.window.hold_pushed(d);
        }
        deliveries
    }

    /// Holds and sends what a relay pass handed this stream, with what was staged until its
    /// hand-over (see [`Order`]). False when the client is gone.
    async fn on_handed(&mut self, handed: Handed, now: DateTime<Utc>, out: &Outbound) -> bool {
        let pass = handed.pass;
        let deliveries = self.hold_handed(handed);
        let send = self.order.handed(pass, deliveries);
        self.send_all(send, now, out).await
    }

    /// Leases what the window has room for, when pending work may wait for it; `woken` is the
    /// consumer's wake-up count now. The consumer's streams in this process take turns.
    async fn lease(&mut self, now: DateTime<Utc>, out: &Outbound, turn: &LeaseTurn, woken: u64) -> Leased {
        if self.drain_until.is_some() || self.ctx.shutdown.is_cancelled() {
            return Leased::Wait(Duration::MAX);
        }
        self.awaits_bytes = false;
        let room =
            if self.pace.maybe_pending() { self.window.room_for_pending(&self.lend) } else { self.window.room() };
        // A quarter of the window, at most 64, while the stream is busy.
        let batch = (self.window.max() / 4).clamp(1, 64);
        match self.pace.next(room, batch, self.window.is_empty(), Instant::now()) {
            Next::Idle => return Leased::Wait(Duration::MAX),
            Next::Fill(d) => return Leased::Wait(d),
            Next::Lease => {}
        }
        if self.pace.pending_since().is_some_and(|w| turn.drained_since(w)) {
            // Another stream's lease, started after this one's wake-up, took everything due.
            return Leased::Wait(self.pace.drained_by_another(turn.next_due(), now));
        }
        let Some(my_turn) = turn.try_take() else {
            // Another stream of the consumer is leasing; what it leaves, this one leases next.
            self.pace.turn_taken();
            return Leased::Wait(Duration::MAX);
        };
        self.pace.leasing(Instant::now());
        match self.fill(room, now, out, my_turn).await {
            // Room, but the principal's byte budget had no bytes for it: lease again when
            // bytes come back (an ack, a pass's hand-over, another stream's end).
            Ok(Some((0, _))) => {
                self.awaits_bytes = self.bytes_returned.is_some();
                Leased::Wait(Duration::MAX)
            }
            // As much as asked: there may be more.
            Ok(Some((taken, sent))) if sent == taken => Leased::Again,
            // Less than asked: nothing more is due now. Find out when the next is (a retry's
            // backoff, a delay); new work comes with a wake-up.
            Ok(Some(_)) => {
                turn.drained(woken);
                let next = self.ctx.store.delivery_next_due(self.consumer()).await;
                turn.set_next_due(next.as_ref().ok().copied().flatten());
                match next {
                    // Due already but not leasable: blocked by an ordering key (its ack wakes
                    // us) or a paused consumer (resume does).
                    Ok(due) => Leased::Wait(self.pace.drained(due, now)),
                    Err(StoreError::ConsumerNotFound(name)) => {
                        Leased::End(End::Failed(StreamError::ConsumerDeleted(name)))
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "could not read next due time");
                        Leased::Wait(self.pace.drained(None, now))
                    }
                }
            }
            Ok(None) => Leased::End(End::Broken),
            Err(e) => {
                let retry_in = self.pace.lease_failed();
                tracing::warn!(consumer = %self.consumer(), error = %e, ?retry_in, "lease failed");
                Leased::Wait(retry_in)
            }
        }
    }

    /// Leases up to `room` deliveries (as much of it as is still free) and sends them: `(room
    /// taken, deliveries leased)`, or `None` when the client is gone.
    async fn fill(
        &mut self,
        room: usize,
        now: DateTime<Utc>,
        out: &Outbound,
        turn: TurnGuard<'_>,
    ) -> Result<Option<(usize, usize)>, StoreError> {
        let lease_until = clock::add(now, self.start.ack_deadline);
        let room = self.window.reserve(room);
        if room == 0 {
            return Ok(Some((0, 0)));
        }
        let leased = self
            .ctx
            .store
            .delivery_lease(&LeaseParams {
                consumer: self.consumer(),
                session: &self.id,
                limit: room as i64,
                keys_after: &self.key_cursor,
                lease_until,
                now,
            })
            .await;
        // The next stream's turn; sending may wait on a slow client.
        drop(turn);
        let n = leased.as_ref().map_or(0, Vec::len);
        self.window.unreserve(room - n);
        let leased = leased?;
        self.key_cursor = next_key_cursor(&self.key_cursor, &leased);
        // Held before anything is sent, so that whatever happens next releases all of them.
        for d in &leased {
            self.window.hold(d);
        }
        // A relay pass that committed before this lease may have pushed lower seqs to this
        // stream. One that still holds the lend sends them with its hand-over: what was leased
        // waits for it, staged, while the stream goes on serving. Those of passes that ended
        // are in the channel already (a pass sends as it ends its hold, looked at first).
        let holder = self.lend.wake_when_handed();
        while let Ok(handed) = self.pushed.try_recv() {
            // That pass may have handed over since it was asked for word: `Order` then does
            // not wait for it.
            let pass = handed.pass;
            let pushed = self.hold_handed(handed);
            self.order.drained(pass, pushed);
        }
        let send = self.order.leased(leased, holder);
        Ok(self.send_all(send, now, out).await.then_some((room, n)))
    }

    /// Sends held deliveries; false when the client is gone.
    async fn send_all(&mut self, leased: Vec<LeasedDelivery>, now: DateTime<Utc>, out: &Outbound) -> bool {
        // A lease whose deadline passed while it was staged, or during the round trip that
        // brought the hand-over, is the sweeper's now: expired first, then left out.
        self.window.expire(self.ctx.clock.now());
        for mut d in self.window.still_held(leased) {
            metrics::delivered(self.consumer().as_str(), now, d.message.enqueued_at);
            let id = d.message.message_id;
            // Open until the delivery is handed to the stream.
            let _span = deliver_span(self.consumer().as_str(), &mut d);
            tokio::select! {
                sent = out.send(Ok(d)) => match sent {
                    Ok(()) => self.window.sent(&id),
                    Err(_) => return false,
                },
                // A client that stopped reading must not hold up a shutdown.
                _ = self.ctx.shutdown.cancelled() => return true,
            }
        }
        true
    }

    /// Applies commands in order; the acks among them are written in one statement at the end
    /// (an ack removes the id from the window at once, so a later nack or extend of it is
    /// ignored, as it would be after a written ack).
    async fn apply(&mut self, commands: Vec<Command>) {
        let mut acks = Vec::new();
        for command in commands {
            match command {
                Command::Ack(ids) => acks.extend(self.window.ack(&ids)),
                Command::Nack { id, error, retry_after } => self.nack(id, error, retry_after).await,
                Command::Extend { ids, deadline } => self.extend(&ids, deadline).await,
                Command::Nothing => {}
            }
        }
        if !acks.is_empty() {
            self.write_acks(acks).await;
        }
    }

    /// Writes acks in one statement; on failure they are kept and retried on the next pass.
    async fn write_acks(&mut self, acks: Vec<(MessageId, Held)>) {
        let now = self.ctx.clock.now();
        let held: Vec<(MessageId, i64)> = acks.iter().map(|(id, h)| (*id, h.seq)).collect();
        // An ack that frees an ordering key wakes the consumer's streams: the key's next message
        // may be due now, for any of them.
        let keyed = acks.iter().any(|(_, h)| h.has_ordering_key);
        match self.ctx.waking().ack(self.consumer(), &held, keyed, now).await {
            Ok(_) => {
                metrics::acked(self.consumer().as_str(), now, acks.iter().map(|(_, h)| h.enqueued_at));
            }
            Err(e) => {
                tracing::warn!(consumer = %self.consumer(), error = %e, acks = held.len(), "ack write failed; retrying");
                self.unwritten_acks.extend(acks);
            }
        }
    }

    async fn nack(&mut self, id: MessageId, error: String, retry_after: Option<Duration>) {
        let Some(held) = self.window.nack(&id) else {
            tracing::debug!(consumer = %self.consumer(), message_id = %id, "nack for a delivery this stream does not hold; ignored");
            return;
        };
        let now = self.ctx.clock.now();
        let spec = &self.start.consumer.spec;
        let failure = Failure::Nacked { error, retry_after };
        let release = failure.release(spec.name.clone(), id, held.delivery_count, &spec.retry(), now);
        let (dead, due) = (release.state == DeliveryState::Dead, release.available_at);
        match self.ctx.waking().release(&[release], ReleaseGuard::Session(&self.id), now).await {
            Ok(0) => {}
            Ok(_) if dead => {
                metrics::nacked(spec.name.as_str(), true);
                tracing::warn!(consumer = %spec.name, message_id = %id, deliveries = held.delivery_count, "dead-lettered");
            }
            Ok(_) => {
                metrics::nacked(spec.name.as_str(), false);
                self.pace.retry_at(due);
            }
            Err(e) => tracing::warn!(consumer = %spec.name, error = %e, "nack failed; the lease will expire instead"),
        }
    }

    async fn extend(&mut self, ids: &[MessageId], deadline: Duration) {
        let now = self.ctx.clock.now();
        let ids = self.window.holding(ids);
        if ids.is_empty() {
            return;
        }
        let until = clock::add(now, deadline);
        match self
            .ctx
            .store
            .delivery_extend_many(&ExtendParams { consumer: self.consumer(), session: &self.id, ids: &ids, until, now })
            .await
        {
            Ok(_) => self.window.extend(&ids, until),
            Err(e) => tracing::warn!(consumer = %self.consumer(), error = %e, "extend failed"),
        }
    }

    async fn release_all(&mut self, counts_as_failure: bool) -> Result<(), StoreError> {
        let held = self.window.drain();
        self.release(held, counts_as_failure).await
    }

    async fn release(&mut self, held: Vec<(MessageId, Held)>, counts_as_failure: bool) -> Result<(), StoreError> {
        if held.is_empty() {
            return Ok(());
        }
        let now = self.ctx.clock.now();
        let spec = &self.start.consumer.spec;
        let retry = spec.retry();
        let releases: Vec<Release> = held
            .into_iter()
            .map(|(id, h)| {
                // A stream that breaks with a delivery at its last attempt may be a consumer
                // crashing on it: that counts. A clean close or a server shutdown does not,
                // nor does anything the stream was never sent: the release takes back the
                // attempt its lease counted (ADR 0074).
                let failure =
                    if counts_as_failure && h.sent { Failure::Broke } else { Failure::Withdrawn(Withdrawal::Closed) };
                failure.release(spec.name.clone(), id, h.delivery_count, &retry, now)
            })
            .collect();
        // A release that fails, or skips rows another transaction holds locked (PostgreSQL's
        // release takes only what it can lock at once), is tried again while the leases hold:
        // left to expire, a withdrawn delivery would be counted as failed by the sweeper. The
        // guard (this session's lease, still leased) makes a repeat touch nothing twice.
        let until = tokio::time::Instant::now() + self.start.ack_deadline;
        let mut backoff = SETTLE_BACKOFF;
        let mut released = 0;
        let mut partial_tries = 0;
        loop {
            let tried = self.ctx.waking().release(&releases, ReleaseGuard::Session(&self.id), now).await;
            match tried {
                Ok(n) => {
                    released += n;
                    partial_tries += 1;
                    if released >= releases.len() as u64 || partial_tries >= SETTLE_PARTIAL_TRIES {
                        break;
                    }
                }
                Err(e) if tokio::time::Instant::now() + backoff < until => {
                    tracing::warn!(consumer = %self.consumer(), error = %e, "release failed; retrying while the leases hold");
                }
                Err(e) => return Err(e),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(SETTLE_BACKOFF_MAX);
        }
        tracing::debug!(consumer = %self.consumer(), released, "released held deliveries");
        Ok(())
    }
}

/// The first wait before an ack or a release at a stream's end is tried again, doubling up to
/// [`SETTLE_BACKOFF_MAX`], for as long as the stream's ack deadline.
const SETTLE_BACKOFF: Duration = Duration::from_millis(50);
const SETTLE_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Tries of a release that did not take all its deliveries: rows locked by another transaction
/// for a moment, or deliveries acked or expired meanwhile (then the tries find nothing more).
const SETTLE_PARTIAL_TRIES: u32 = 5;

/// How long after its requests end a call's response side may take to go with it, when the
/// client cancelled the call rather than half-closing it.
const CANCEL_GRACE: Duration = Duration::from_millis(100);

/// Whether the client that ended its requests cancelled the call (see [`Session::run`]).
async fn cancelled(out: &Outbound) -> bool {
    tokio::time::timeout(CANCEL_GRACE, out.closed()).await.is_ok()
}

/// Resolves when the budget announces bytes coming back; never without a budget.
async fn changed(returned: &mut Option<watch::Receiver<u64>>) {
    if let Some(rx) = returned
        && rx.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// The first command and whatever else the client has already sent, so that a burst of acks
/// becomes one statement instead of one per message; with how the stream ended, if it did.
fn take_ready<S>(first: Option<Incoming>, inbound: &mut S) -> Event
where
    S: Stream<Item = Incoming> + Unpin,
{
    let ended = |Broken(why): Broken| {
        tracing::debug!(status = %why, "stream error from client");
        End::Broken
    };
    let first = match first {
        None => return Event::Ended(End::Closed),
        Some(Err(r)) => return Event::Ended(ended(r)),
        Some(Ok(c)) => c,
    };
    let mut commands = vec![first];
    while commands.len() < MAX_COMMANDS_PER_PASS {
        match inbound.next().now_or_never() {
            Some(Some(Ok(c))) => commands.push(c),
            // The commands before it still apply.
            Some(Some(Err(r))) => return Event::Commands(commands, Some(ended(r))),
            Some(None) => return Event::Commands(commands, Some(End::Closed)),
            None => break,
        }
    }
    Event::Commands(commands, None)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::clock::SystemClock;
    use crate::store::tests::{msg, on_every_store, spec};

    on_every_store!(a_broken_stream_counts_only_what_it_handed_to_the_client);

    /// T16 and T17 of a broken stream, as the session decides them: of three deliveries leased
    /// at `max_deliveries` 1, the client takes one and goes. That one was sent, so the break
    /// counts it and it is dead; the other two never left the session (the stream's queue had
    /// room for one), so they are pending again with their count given back.
    async fn a_broken_stream_counts_only_what_it_handed_to_the_client(store: SharedStore) {
        let now = Utc::now();
        store.consumer_create(&spec("c", &["t"], 1), now).await.unwrap();
        let ids: Vec<MessageId> = store
            .message_insert_many(&[msg("t"), msg("t"), msg("t")], now)
            .await
            .unwrap()
            .iter()
            .map(|e| e.message_id)
            .collect();
        store.relay_pass(100, now, false, &[]).await.unwrap();
        let ctx = SessionContext {
            store: store.clone(),
            clock: Arc::new(SystemClock),
            hub: Hub::default(),
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            drain_timeout: Duration::from_secs(1),
            poll_interval: Duration::from_secs(5),
        };
        let consumer = store.consumer_list().await.unwrap().remove(0);
        let start = SessionStart { consumer, max_in_flight: 4, ack_deadline: Duration::from_secs(30), bytes: None };
        let (out, mut client) = mpsc::channel(1);
        let session = tokio::spawn(Session::new(ctx, start).run(futures::stream::pending::<Incoming>(), out));
        let taken = client.recv().await.unwrap().unwrap().message.message_id;
        // Gone before the session could send the next: the current-thread runtime runs nothing
        // else between the receive and the drop.
        drop(client);
        session.await.unwrap();
        for id in ids {
            let (_, rows) = store.message_get(id).await.unwrap();
            let d = rows.into_iter().find(|r| r.consumer == "c").unwrap();
            if id == taken {
                assert_eq!((d.state, d.delivery_count), (DeliveryState::Dead, 1));
                assert_eq!(d.last_error.as_deref(), Some("stream broke before ack"));
            } else {
                assert_eq!((d.state, d.delivery_count), (DeliveryState::Pending, 0), "never sent: not an attempt");
                assert_eq!(d.last_error.as_deref(), Some("stream closed before ack"));
            }
        }
    }
}

//! A delivery session: one `Subscribe` stream of one consumer.
//!
//! The session leases due deliveries up to its `max_in_flight`, sends them, and applies the
//! stream's acks, nacks and extends. It sleeps until something can change: a request from the
//! stream, a wake-up for its consumer (the relay fanned out, a lease was released), the next
//! retry falling due, or a slow fallback poll (work fanned out by another replica).
//!
//! Ending: when the stream ends, what it still holds is released at once. If the connection
//! broke (reset, transport error), a delivery at its last attempt is dead, so a message that
//! crashes its consumer still dies; a clean half-close (a consumer stopping on purpose) counts
//! against nothing. A late ack of a lease that expired while this stream held it is still
//! applied; an ack for an id the stream never held is ignored. When the server shuts down, the session stops leasing, waits up to the drain timeout for
//! outstanding acks, releases the rest as pending, and ends the stream with `UNAVAILABLE`.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::{FutureExt, Stream, StreamExt};
use outbox_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::clock::{self, SharedClock};
use crate::domain::{Consumer, DeliveryState, MessageId};
use crate::hub::{Credits, Hub, PushGuard, PushSlot};
use crate::store::{LeasedDelivery, Release, ReleaseGuard, SharedStore, StoreError, next_key_cursor};
use crate::{metrics, telemetry};

/// Expired leases a session remembers for late acks.
const MAX_REMEMBERED_EXPIRED: usize = 10_000;
/// The longest `retry_after` a nack may ask for.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);
/// Stored `last_error` texts are cut to this many bytes.
const MAX_ERROR_BYTES: usize = 4096;

/// How long a busy stream may wait for a batch of free slots before it leases anyway.
const FILL_DELAY: Duration = Duration::from_millis(2);

/// Requests taken from a stream in one pass before they are applied.
const MAX_REQUESTS_PER_PASS: usize = 512;

/// The longest ack deadline or extension a stream may ask for.
pub const MAX_ACK_DEADLINE: Duration = Duration::from_secs(12 * 3600);

/// What every session of this process shares.
#[derive(Debug, Clone)]
pub struct SessionContext {
    pub store: SharedStore,
    pub clock: SharedClock,
    pub hub: Hub,
    /// Cancelled when the server shuts down.
    pub shutdown: CancellationToken,
    pub drain_timeout: Duration,
    /// Fallback poll for work fanned out by other replicas.
    pub poll_interval: Duration,
}

/// The validated `start` of a stream.
#[derive(Debug, Clone)]
pub struct SessionStart {
    pub consumer: Consumer,
    pub max_in_flight: u32,
    pub ack_deadline: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    delivery_count: u32,
    deadline: DateTime<Utc>,
    enqueued_at: DateTime<Utc>,
    /// Its ack may make the next message with the same key due.
    has_ordering_key: bool,
}

pub type Outbound = mpsc::Sender<Result<pb::SubscribeResponse, Status>>;

#[derive(Debug)]
pub struct Session {
    id: String,
    ctx: SessionContext,
    start: SessionStart,
    held: HashMap<MessageId, Held>,
    /// Room for more deliveries, shared with the relay, which leases new ones straight to
    /// this stream (`pushed`) while there is room.
    credits: Arc<Credits>,
    /// This stream's slot in the hub while it takes pushes.
    push: Option<PushGuard>,
    pushed: mpsc::UnboundedReceiver<Vec<LeasedDelivery>>,
    push_tx: mpsc::UnboundedSender<Vec<LeasedDelivery>>,
    /// When a retry this session scheduled falls due.
    next_due: Option<DateTime<Utc>>,
    /// The ordering key the next lease starts after, so that every key gets its turn.
    key_cursor: String,
    /// Leases that expired while this stream held them: a late ack of one is still applied.
    expired: HashMap<MessageId, Held>,
    /// Acks whose write failed; retried on the next pass.
    unwritten_acks: Vec<(MessageId, Held)>,
}

enum End {
    /// The client half-closed the stream cleanly: a consumer stopping on purpose.
    Closed,
    /// The connection broke (reset, transport error, the client vanished): maybe a consumer
    /// crashing on what it held.
    Broken,
    /// The server is shutting down.
    Shutdown,
    /// The session cannot go on; the stream ends with this status.
    Failed(Status),
}

pub fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: t.timestamp(), nanos: t.timestamp_subsec_nanos() as i32 }
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

fn to_delivery(d: LeasedDelivery) -> pb::Delivery {
    let m = d.message;
    pb::Delivery {
        message_id: m.message_id.to_string(),
        seq: m.seq,
        topic: m.topic,
        r#type: m.type_,
        payload: m.payload,
        headers: m.headers.into_iter().collect(),
        ordering_key: m.ordering_key.unwrap_or_default(),
        enqueued_at: Some(timestamp(m.enqueued_at)),
        delivery_count: d.delivery_count,
        ack_deadline: Some(timestamp(d.lease_expires_at)),
    }
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

fn parse_ids(ids: &[String]) -> Vec<MessageId> {
    ids.iter()
        .filter_map(|s| match MessageId::parse("message_ids", s) {
            Ok(id) => Some(id),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring malformed message id from stream");
                None
            }
        })
        .collect()
}

fn std_duration(d: &prost_types::Duration) -> Option<Duration> {
    if d.seconds < 0 || d.nanos < 0 {
        return None;
    }
    Some(Duration::new(d.seconds as u64, d.nanos as u32))
}

impl Session {
    pub fn new(ctx: SessionContext, start: SessionStart) -> Self {
        let (push_tx, pushed) = mpsc::unbounded_channel();
        Self {
            id: uuid::Uuid::new_v4().to_string(),
            credits: Arc::new(Credits::new(start.max_in_flight as usize)),
            push: None,
            pushed,
            push_tx,
            ctx,
            start,
            held: HashMap::new(),
            next_due: None,
            key_cursor: String::new(),
            expired: HashMap::new(),
            unwritten_acks: Vec::new(),
        }
    }

    fn consumer(&self) -> &crate::domain::ConsumerName {
        &self.start.consumer.spec.name
    }

    /// Runs the session until the stream ends; everything still held is released.
    pub async fn run<S>(mut self, mut inbound: S, out: Outbound)
    where
        S: Stream<Item = Result<pb::SubscribeRequest, Status>> + Unpin,
    {
        let (mut wake, _guard) = self.ctx.hub.attach(self.consumer().as_str());
        let slot = PushSlot {
            session: self.id.clone(),
            ack_deadline: self.start.ack_deadline,
            credits: self.credits.clone(),
            tx: self.push_tx.clone(),
        };
        self.push = Some(self.ctx.hub.offer(self.consumer().as_str(), slot));
        tracing::info!(consumer = %self.consumer(), session = %self.id, max_in_flight = self.start.max_in_flight, "stream attached");
        let end = self.serve(&mut inbound, &out, &mut wake).await;
        // Only a broken stream counts against what it held; a clean close or a shutdown does not.
        let counts_as_failure = matches!(end, End::Broken);
        if let Err(e) = self.release_all(counts_as_failure).await {
            tracing::warn!(consumer = %self.consumer(), error = %e, "could not release leases; the sweeper will");
        }
        // No more pushes. What arrived and was never sent is released uncounted: the consumer
        // never saw it.
        self.push = None;
        self.pushed.close();
        while let Ok(batch) = self.pushed.try_recv() {
            for d in &batch {
                self.hold(d);
            }
        }
        if let Err(e) = self.release_all(false).await {
            tracing::warn!(consumer = %self.consumer(), error = %e, "could not release leases; the sweeper will");
        }
        match end {
            End::Closed | End::Broken => {}
            End::Shutdown => {
                let _ = out.send(Err(Status::unavailable("outboxd is shutting down; reconnect"))).await;
            }
            End::Failed(status) => {
                let _ = out.send(Err(status)).await;
            }
        }
        tracing::info!(consumer = %self.consumer(), session = %self.id, "stream detached");
    }

    async fn serve<S>(&mut self, inbound: &mut S, out: &Outbound, wake: &mut tokio::sync::watch::Receiver<u64>) -> End
    where
        S: Stream<Item = Result<pb::SubscribeRequest, Status>> + Unpin,
    {
        let mut drain_until: Option<tokio::time::Instant> = None;
        let mut last_fill = std::time::Instant::now();
        // Whether pending deliveries may wait for this stream: set by a wake-up or a timer,
        // cleared by a lease that found less than it asked for. Acks alone do not make work
        // pending (except with an ordering key, whose ack wakes the consumer), so handling
        // them costs no lease query.
        let mut maybe_pending = true;
        // When the consumer's next pending delivery falls due, as last read.
        let mut store_due: Option<DateTime<Utc>> = None;
        let mut error_backoff = Duration::ZERO;
        loop {
            let now = self.ctx.clock.now();
            // A lease past its deadline belongs to the sweeper now and frees a slot here; a late
            // ack of it still counts (the handler did the work), so it is remembered a while.
            let expired: Vec<(MessageId, Held)> =
                self.held.iter().filter(|(_, h)| h.deadline <= now).map(|(id, h)| (*id, *h)).collect();
            for (id, h) in expired {
                self.held.remove(&id);
                self.credits.give(1);
                self.expired.insert(id, h);
            }
            if self.expired.len() > MAX_REMEMBERED_EXPIRED {
                self.expired.clear();
            }
            if !self.unwritten_acks.is_empty() {
                let retry = std::mem::take(&mut self.unwritten_acks);
                self.write_acks(retry).await;
            }
            let mut sleep_for = self.ctx.poll_interval;
            if let Some(due) = store_due {
                match (due - now).to_std() {
                    Ok(d) if !d.is_zero() => sleep_for = sleep_for.min(d),
                    _ => {
                        store_due = None;
                        maybe_pending = true;
                    }
                }
            }

            if drain_until.is_none() && !self.ctx.shutdown.is_cancelled() {
                let max = self.start.max_in_flight as usize;
                let room = self.credits.available();
                // While the stream is busy, lease in batches (a quarter of the window, at most
                // 64) rather than one row per ack, waiting at most FILL_DELAY for the batch to
                // fill up; an idle stream leases at once.
                let batch = (max / 4).clamp(1, 64);
                let waited = last_fill.elapsed();
                if !maybe_pending || room == 0 {
                    // Nothing to lease, or no room: a wake-up, a timer or a freed slot comes first.
                } else if room < batch && !self.held.is_empty() && waited < FILL_DELAY {
                    sleep_for = sleep_for.min(FILL_DELAY - waited);
                } else {
                    last_fill = std::time::Instant::now();
                    match self.fill(room, now, out).await {
                        // The relay took the room meanwhile: try again once it is back.
                        Ok(Some((0, _))) => {}
                        // As much as asked: there may be more.
                        Ok(Some((taken, sent))) if sent == taken => continue,
                        // Less than asked: nothing more is due now. Find out when the next is
                        // (a retry's backoff, a delay); new work comes with a wake-up.
                        Ok(Some(_)) => {
                            error_backoff = Duration::ZERO;
                            maybe_pending = false;
                            match self.ctx.store.delivery_next_due(self.consumer()).await {
                                Ok(Some(due)) => {
                                    let until_due = (due - now).to_std().unwrap_or(Duration::ZERO);
                                    // Due already but not leasable: blocked by an ordering key
                                    // (its ack wakes us) or a paused consumer (resume does).
                                    if !until_due.is_zero() {
                                        store_due = Some(due);
                                        sleep_for = sleep_for.min(until_due);
                                    }
                                }
                                Ok(None) => {}
                                Err(StoreError::ConsumerNotFound(name)) => {
                                    return End::Failed(Status::not_found(format!("consumer {name:?} was deleted")));
                                }
                                Err(e) => tracing::warn!(error = %e, "could not read next due time"),
                            }
                        }
                        Ok(None) => return End::Broken,
                        Err(e) => {
                            error_backoff =
                                (error_backoff * 2).clamp(Duration::from_millis(100), Duration::from_secs(5));
                            tracing::warn!(consumer = %self.consumer(), error = %e, retry_in = ?error_backoff, "lease failed");
                            sleep_for = error_backoff;
                        }
                    }
                }
            }
            if let Some(due) = self.next_due {
                match (due - now).to_std() {
                    Ok(d) if !d.is_zero() => sleep_for = sleep_for.min(d),
                    _ => {
                        self.next_due = None;
                        maybe_pending = true;
                        sleep_for = Duration::ZERO;
                    }
                }
            }
            if let Some(earliest) = self.held.values().map(|h| h.deadline).min() {
                sleep_for = sleep_for.min((earliest - now).to_std().unwrap_or(Duration::ZERO));
            }
            if drain_until.is_some() && self.held.is_empty() {
                return End::Shutdown;
            }
            let drain_deadline = drain_until.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            // With pending work to lease, the relay leaves this stream's room alone, and says so
            // when it gives back room it had taken.
            let waits_for_room = maybe_pending && drain_until.is_none();
            self.credits.set_wants_pending(waits_for_room);
            let credits = self.credits.clone();

            tokio::select! {
                biased;
                _ = self.ctx.shutdown.cancelled(), if drain_until.is_none() => {
                    drain_until = Some(tokio::time::Instant::now() + self.ctx.drain_timeout);
                    // Draining: the relay sends nothing new here.
                    self.push = None;
                }
                _ = tokio::time::sleep_until(drain_deadline), if drain_until.is_some() => return End::Shutdown,
                req = inbound.next() => match req {
                    Some(Ok(req)) => {
                        // Take whatever else the client has already sent, so that a burst of
                        // acks becomes one statement instead of one per message.
                        let mut batch = vec![req];
                        let mut closed = None;
                        while batch.len() < MAX_REQUESTS_PER_PASS {
                            match inbound.next().now_or_never() {
                                Some(Some(Ok(r))) => batch.push(r),
                                Some(Some(Err(_))) => {
                                    closed = Some(End::Broken);
                                    break;
                                }
                                Some(None) => {
                                    closed = Some(End::Closed);
                                    break;
                                }
                                None => break,
                            }
                        }
                        if let Err(status) = self.handle_batch(batch).await {
                            return End::Failed(status);
                        }
                        if let Some(end) = closed {
                            return end;
                        }
                    }
                    Some(Err(status)) => {
                        tracing::debug!(consumer = %self.consumer(), %status, "stream error from client");
                        return End::Broken;
                    }
                    None => return End::Closed,
                },
                Some(batch) = self.pushed.recv() => {
                    for d in &batch {
                        self.hold(d);
                    }
                    if !self.send_all(batch, now, out).await {
                        return End::Broken;
                    }
                }
                _ = wake.changed() => maybe_pending = true,
                _ = credits.returned(), if waits_for_room => {}
                _ = out.closed() => return End::Broken,
                _ = tokio::time::sleep(sleep_for) => maybe_pending = true,
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
    ) -> Result<Option<(usize, usize)>, StoreError> {
        let until = clock::add(now, self.start.ack_deadline);
        let room = self.credits.take(room);
        if room == 0 {
            return Ok(Some((0, 0)));
        }
        let leased = self
            .ctx
            .store
            .delivery_lease_batch(self.consumer(), &self.id, room as i64, &self.key_cursor, until, now)
            .await;
        let n = leased.as_ref().map_or(0, Vec::len);
        self.credits.give(room - n);
        let leased = leased?;
        self.key_cursor = next_key_cursor(&self.key_cursor, &leased);
        // Held before anything is sent, so that whatever happens next releases all of them.
        for d in &leased {
            self.hold(d);
        }
        Ok(self.send_all(leased, now, out).await.then_some((room, n)))
    }

    /// Holds a delivery leased to this stream (its room is already taken).
    fn hold(&mut self, d: &LeasedDelivery) {
        let held = Held {
            delivery_count: d.delivery_count,
            deadline: d.lease_expires_at,
            enqueued_at: d.message.enqueued_at,
            has_ordering_key: d.message.ordering_key.is_some(),
        };
        self.held.insert(d.message.message_id, held);
    }

    /// Sends held deliveries; false when the client is gone.
    async fn send_all(&self, leased: Vec<LeasedDelivery>, now: DateTime<Utc>, out: &Outbound) -> bool {
        for mut d in leased {
            metrics::delivered(self.consumer().as_str(), now, d.message.enqueued_at);
            // Open until the delivery is handed to the stream.
            let _span = deliver_span(self.consumer().as_str(), &mut d);
            let msg =
                pb::SubscribeResponse { response: Some(pb::subscribe_response::Response::Delivery(to_delivery(d))) };
            tokio::select! {
                sent = out.send(Ok(msg)) => if sent.is_err() { return false },
                // A client that stopped reading must not hold up a shutdown.
                _ = self.ctx.shutdown.cancelled() => return true,
            }
        }
        true
    }

    /// Applies requests in order; the acks among them are written in one statement at the end
    /// (an ack removes the id from `held` at once, so a later nack or extend of it is ignored,
    /// as it would be after a written ack).
    async fn handle_batch(&mut self, batch: Vec<pb::SubscribeRequest>) -> Result<(), Status> {
        let mut acks = Vec::new();
        for req in batch {
            match req.request {
                Some(pb::subscribe_request::Request::Ack(ack)) => {
                    acks.extend(self.take_held(&parse_ids(&ack.message_ids)))
                }
                other => self.handle(other).await?,
            }
        }
        if !acks.is_empty() {
            self.write_acks(acks).await;
        }
        Ok(())
    }

    /// Writes acks in one statement; on failure they are kept and retried on the next pass.
    async fn write_acks(&mut self, acks: Vec<(MessageId, Held)>) {
        let now = self.ctx.clock.now();
        let ids: Vec<MessageId> = acks.iter().map(|(id, _)| *id).collect();
        match self.ctx.store.delivery_ack_many(self.consumer(), &ids, now).await {
            Ok(_) => {
                metrics::acked(self.consumer().as_str(), now, acks.iter().map(|(_, h)| h.enqueued_at));
                // The next message with the same ordering key may be due now, for any stream.
                if acks.iter().any(|(_, h)| h.has_ordering_key) {
                    self.ctx.hub.notify_consumer(self.consumer().as_str());
                }
            }
            Err(e) => {
                tracing::warn!(consumer = %self.consumer(), error = %e, acks = ids.len(), "ack write failed; retrying");
                self.unwritten_acks.extend(acks);
            }
        }
    }

    async fn handle(&mut self, req: Option<pb::subscribe_request::Request>) -> Result<(), Status> {
        use pb::subscribe_request::Request;
        let now = self.ctx.clock.now();
        match req {
            Some(Request::Start(_)) => {
                Err(Status::failed_precondition("start: the stream has already started; send start only once"))
            }
            Some(Request::Ack(_)) => Ok(()), // handled by handle_batch
            Some(Request::Nack(nack)) => {
                let Some(id) = parse_ids(std::slice::from_ref(&nack.message_id)).pop() else { return Ok(()) };
                let Some(held) = self.held.remove(&id) else {
                    tracing::debug!(consumer = %self.consumer(), message_id = %id, "nack for a delivery this stream does not hold; ignored");
                    return Ok(());
                };
                self.credits.give(1);
                let spec = &self.start.consumer.spec;
                let dead = held.delivery_count >= spec.max_deliveries;
                let wait = nack
                    .retry_after
                    .as_ref()
                    .and_then(std_duration)
                    .map_or_else(|| spec.backoff.delay(held.delivery_count), |d| d.min(MAX_RETRY_AFTER));
                let due = clock::add(now, wait);
                let error =
                    if nack.error.is_empty() { "nacked".to_owned() } else { truncate(nack.error, MAX_ERROR_BYTES) };
                let release = Release {
                    consumer: spec.name.clone(),
                    message_id: id,
                    state: if dead { DeliveryState::Dead } else { DeliveryState::Pending },
                    available_at: if dead { now } else { due },
                    error: Some(error),
                };
                match self.ctx.store.delivery_release_many(&[release], ReleaseGuard::Session(&self.id), now).await {
                    Ok(0) => {}
                    Ok(_) if dead => {
                        metrics::nacked(spec.name.as_str(), true);
                        tracing::warn!(consumer = %spec.name, message_id = %id, deliveries = held.delivery_count, "dead-lettered");
                        self.ctx.hub.notify_consumer(spec.name.as_str());
                    }
                    Ok(_) => {
                        metrics::nacked(spec.name.as_str(), false);
                        self.next_due = Some(self.next_due.map_or(due, |d| d.min(due)));
                    }
                    Err(e) => {
                        tracing::warn!(consumer = %spec.name, error = %e, "nack failed; the lease will expire instead")
                    }
                }
                Ok(())
            }
            Some(Request::Extend(ext)) => {
                let Some(deadline) = ext.deadline.as_ref().and_then(std_duration).filter(|d| !d.is_zero()) else {
                    return Err(Status::invalid_argument("extend.deadline: a positive duration is required"));
                };
                if deadline > MAX_ACK_DEADLINE {
                    return Err(Status::invalid_argument("extend.deadline: at most 12 hours"));
                }
                let until = clock::add(now, deadline);
                let ids: Vec<MessageId> =
                    parse_ids(&ext.message_ids).into_iter().filter(|id| self.held.contains_key(id)).collect();
                if ids.is_empty() {
                    return Ok(());
                }
                match self.ctx.store.delivery_extend_many(self.consumer(), &self.id, &ids, until, now).await {
                    Ok(_) => {
                        for id in &ids {
                            if let Some(h) = self.held.get_mut(id) {
                                h.deadline = until;
                            }
                        }
                    }
                    Err(e) => tracing::warn!(consumer = %self.consumer(), error = %e, "extend failed"),
                }
                Ok(())
            }
            None => Err(Status::invalid_argument("request: one of start, ack, nack, extend is required")),
        }
    }

    /// Removes the ids this stream holds from `held`, and returns them; others are logged.
    fn take_held(&mut self, ids: &[MessageId]) -> Vec<(MessageId, Held)> {
        ids.iter()
            .filter_map(|id| {
                let held = match self.held.remove(id) {
                    Some(h) => {
                        self.credits.give(1);
                        Some(h)
                    }
                    None => self.expired.remove(id),
                };
                if held.is_none() {
                    tracing::debug!(consumer = %self.consumer(), message_id = %id, "ack for a delivery this stream does not hold; ignored");
                }
                held.map(|h| (*id, h))
            })
            .collect()
    }

    async fn release_all(&mut self, counts_as_failure: bool) -> Result<(), StoreError> {
        if self.held.is_empty() {
            return Ok(());
        }
        let now = self.ctx.clock.now();
        let max = self.start.consumer.spec.max_deliveries;
        let releases: Vec<Release> = self
            .held
            .drain()
            .map(|(id, h)| {
                // A stream that breaks with a delivery at its last attempt may be a consumer
                // crashing on it: that counts. A clean close or a server shutdown does not.
                let dead = counts_as_failure && h.delivery_count >= max;
                Release {
                    consumer: self.start.consumer.spec.name.clone(),
                    message_id: id,
                    state: if dead { DeliveryState::Dead } else { DeliveryState::Pending },
                    available_at: now,
                    error: Some(
                        if counts_as_failure { "stream broke before ack" } else { "stream closed before ack" }
                            .to_owned(),
                    ),
                }
            })
            .collect();
        let n = self.ctx.store.delivery_release_many(&releases, ReleaseGuard::Session(&self.id), now).await?;
        self.ctx.hub.notify_consumer(self.consumer().as_str());
        tracing::debug!(consumer = %self.consumer(), released = n, "released held deliveries");
        Ok(())
    }
}

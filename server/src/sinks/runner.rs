//! One sink consumer, delivered by this process.
//!
//! A sink is served by a delivery [`Session`] exactly like a `Subscribe` stream: the session
//! leases, takes pushes from the relay, keeps ordering keys one at a time, and applies acks and
//! nacks. Here the "client" is in-process: each delivery the session sends is published to the
//! [`Target`], concurrently up to the sink's `max_in_flight` (the session's window bounds it),
//! and each [`Outcome`] goes back to the session as the command a client would send: an ack
//! once the target confirmed it, a nack with the target's error when it refused it.
//!
//! When the target becomes unreachable, the runner waits for the publishes still in flight
//! (each confirms or fails on its own), then ends the session cleanly, which releases what it
//! still holds without counting against those messages; it reconnects with backoff and only
//! then leases again. So a broker outage costs no delivery attempts and loses nothing.
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::{Outcome, Publish, Target};
use crate::delivery::Command;
use crate::delivery::session::{Incoming, Session, SessionContext, SessionStart};
use crate::domain::{Consumer, LeasedDelivery};
use crate::metrics::SinkMetrics;

/// Reconnect backoff: doubles from the first to the last.
const RECONNECT_FIRST: Duration = Duration::from_millis(200);
const RECONNECT_MAX: Duration = Duration::from_secs(30);

/// Why one session of the runner ended.
enum Ended {
    /// The target became unreachable: reconnect, then serve again.
    Unavailable(String),
    /// Stop asked, the server shuts down, or the consumer is gone.
    Stopped,
}

/// Drives one sink consumer until it is stopped or deleted.
pub struct SinkRunner {
    ctx: SessionContext,
    consumer: Consumer,
    target: Arc<dyn Target>,
    metrics: SinkMetrics,
}

impl SinkRunner {
    pub fn new(ctx: SessionContext, consumer: Consumer, target: Arc<dyn Target>) -> Self {
        let metrics = SinkMetrics::new(consumer.spec.name.as_str(), target.kind().as_str());
        Self { ctx, consumer, target, metrics }
    }

    fn max_in_flight(&self) -> u32 {
        self.consumer.spec.sink.as_ref().map_or(crate::domain::Sink::DEFAULT_MAX_IN_FLIGHT, |s| s.max_in_flight)
    }

    /// Connects, serves, reconnects after an outage; returns once `stop` is cancelled, the
    /// server shuts down, or the consumer was deleted.
    pub async fn run(self, stop: CancellationToken) {
        let name = self.consumer.spec.name.clone();
        let shown = self.consumer.spec.sink.as_ref().map(|s| s.target.shown_url()).unwrap_or_default();
        tracing::info!(consumer = %name, sink = %self.target.kind(), target = %shown, "sink starting");
        let mut backoff = RECONNECT_FIRST;
        loop {
            if stop.is_cancelled() || self.ctx.shutdown.is_cancelled() {
                break;
            }
            let connected = tokio::select! {
                r = self.target.connect() => r,
                _ = stop.cancelled() => break,
                _ = self.ctx.shutdown.cancelled() => break,
            };
            if let Err(e) = connected {
                self.metrics.connected(false);
                tracing::warn!(consumer = %name, sink = %self.target.kind(), error = %e, retry_in = ?backoff, "sink cannot reach its target");
                if !self.pause(backoff, &stop).await {
                    break;
                }
                backoff = (backoff * 2).min(RECONNECT_MAX);
                continue;
            }
            self.metrics.connected(true);
            backoff = RECONNECT_FIRST;
            match self.serve(&stop).await {
                Ended::Stopped => break,
                Ended::Unavailable(error) => {
                    self.metrics.connected(false);
                    tracing::warn!(consumer = %name, sink = %self.target.kind(), %error, "sink lost its target; what it held is released, reconnecting");
                    if !self.pause(backoff, &stop).await {
                        break;
                    }
                    backoff = (backoff * 2).min(RECONNECT_MAX);
                }
            }
        }
        self.metrics.connected(false);
        self.target.close().await;
        tracing::info!(consumer = %name, "sink stopped");
    }

    /// Waits `d`; false when told to stop meanwhile.
    async fn pause(&self, d: Duration, stop: &CancellationToken) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(d) => true,
            _ = stop.cancelled() => false,
            _ = self.ctx.shutdown.cancelled() => false,
        }
    }

    /// One session: publishes what it leases until the target is lost or the runner stops.
    async fn serve(&self, stop: &CancellationToken) -> Ended {
        let max_in_flight = self.max_in_flight();
        let start = SessionStart {
            consumer: self.consumer.clone(),
            max_in_flight,
            ack_deadline: self.consumer.spec.ack_deadline,
            // outboxd's own sessions: what they hold is bounded by max_in_flight.
            bytes: None,
        };
        // Commands never wait on the session for long: it takes them every pass.
        let (commands, inbound) = mpsc::channel::<Incoming>(max_in_flight as usize + 16);
        let (out, mut leased) = mpsc::channel(max_in_flight as usize + 1);
        let session = Session::new(self.ctx.clone(), start);
        self.ctx.tasks.spawn(session.run(ReceiverStream::new(inbound), out));

        let mut commands = Some(commands);
        let mut in_flight = FuturesUnordered::new();
        let mut lost: Option<String> = None;
        let mut stopping = false;
        loop {
            tokio::select! {
                next = leased.recv() => match next {
                    Some(Ok(d)) if commands.is_some() => {
                        self.metrics.published();
                        in_flight.push(self.publish(d));
                    }
                    // Closing: the session releases it when it ends.
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        // The consumer was deleted, or the server is shutting down.
                        tracing::info!(consumer = %self.consumer.spec.name, status = %e, "sink session ended");
                        stopping = true;
                    }
                    // The session is over: everything it held is acked or released.
                    None => break,
                },
                Some(first) = in_flight.next() => {
                    // Every outcome that is ready now goes back in one pass: the acks as one
                    // command, so the session writes them in one statement.
                    let mut acks = Vec::new();
                    let mut nacks = Vec::new();
                    let mut next = Some(first);
                    while let Some((id, outcome, took)) = next.take() {
                        match outcome {
                            Outcome::Confirmed => {
                                self.metrics.confirmed(took);
                                acks.push(id);
                            }
                            Outcome::Failed { reason, error, retry_after } => {
                                self.metrics.failed(reason);
                                tracing::debug!(consumer = %self.consumer.spec.name, message_id = %id, reason, %error, "sink publish failed");
                                nacks.push(Command::Nack { id, error, retry_after });
                            }
                            Outcome::Unavailable { error } => {
                                self.metrics.unavailable();
                                lost.get_or_insert(error);
                            }
                        }
                        next = in_flight.next().now_or_never().flatten();
                    }
                    if let Some(tx) = &commands {
                        let commands = (!acks.is_empty()).then_some(Command::Ack(acks)).into_iter().chain(nacks);
                        for command in commands {
                            // Fails only when the session has ended, which then releases the lease.
                            let _ = tx.send(Ok(command)).await;
                        }
                    }
                },
                _ = stop.cancelled(), if !stopping => stopping = true,
            }
            // Once the target is lost or the runner stops, and nothing is in flight any more,
            // end the stream: the session releases the rest, uncounted.
            if (lost.is_some() || stopping) && in_flight.is_empty() {
                commands = None;
            }
        }
        match lost {
            Some(error) if !stop.is_cancelled() && !self.ctx.shutdown.is_cancelled() => Ended::Unavailable(error),
            _ => Ended::Stopped,
        }
    }

    /// Publishes one delivery; resolves to its id, the target's answer and how long it took.
    fn publish(
        &self,
        d: LeasedDelivery,
    ) -> impl std::future::Future<Output = (crate::domain::MessageId, Outcome, Duration)> + '_ {
        let id = d.message.message_id;
        let publish = Publish::from(d);
        let started = Instant::now();
        let target = &self.target;
        async move {
            let outcome = target.publish(publish).await;
            (id, outcome, started.elapsed())
        }
    }
}

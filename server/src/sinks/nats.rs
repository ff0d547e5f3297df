//! The NATS JetStream target (ADR 0032): a JetStream publish per delivery with `Nats-Msg-Id` =
//! the outbox message id, so that the stream drops a repeat within its duplicate window, and a
//! wait for the PubAck. Publishes are pipelined: each concurrent [`Target::publish`] sends and
//! then waits for its own PubAck.
//!
//! async-nats reconnects by itself in the background; this target does not let it: the first
//! `Disconnected` event retires the client, every publish waiting on it answers
//! [`Outcome::Unavailable`] at once (instead of after the ack timeout), and the next
//! [`Target::connect`] opens a new client, so a connect fails for as long as the server is away.
use std::str::FromStr as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::header::{HeaderMap, HeaderName, HeaderValue, NATS_MESSAGE_ID};
use async_nats::jetstream::context::{Context, PublishErrorKind};
use futures::FutureExt as _;
use futures::future::BoxFuture;
use tokio::sync::watch;

use super::destination::Destinations;
use super::{ConnectError, Current, Link, Outcome, Publish, Scrubber, Target};
use crate::domain::{SinkKind, Template};

/// How long opening a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a PubAck may take once the message is sent; past it the publish is Unavailable
/// (JetStream is not answering: a stream without a leader, a server under load).
const ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// Message headers with this prefix are JetStream's own controls (`Nats-Rollup`,
/// `Nats-Expected-Stream`, `Nats-TTL`, …): a producer's header must not steer the stream, so
/// they are not carried.
const RESERVED_PREFIX: &str = "nats-";

/// A subject that a JetStream stream captures, as a sink's target.
pub struct Nats {
    destinations: Destinations,
    url: String,
    subject: Template,
    scrub: Scrubber,
    live: Current<Live>,
    duplicates: AtomicU64,
}

struct Live {
    client: async_nats::Client,
    jetstream: Context,
    /// Turns true at the first disconnect: this client is done.
    lost: watch::Receiver<bool>,
}

impl Link for Live {
    fn is_up(&self) -> bool {
        !*self.lost.borrow() && self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Flushes what is buffered if the connection is up, then drains the client, which ends
    /// its background connection task (and its reconnect attempts).
    fn shut(&self) -> BoxFuture<'_, ()> {
        async move {
            if self.is_up() {
                let _ = tokio::time::timeout(Duration::from_secs(5), self.client.flush()).await;
            }
            let _ = tokio::time::timeout(Duration::from_secs(2), self.client.drain()).await;
        }
        .boxed()
    }
}

impl Nats {
    pub fn new(url: &str, subject: &Template, destinations: Destinations) -> Self {
        Self {
            destinations,
            url: url.to_owned(),
            subject: subject.clone(),
            scrub: Scrubber::for_url(url),
            live: Current::new(),
            duplicates: AtomicU64::new(0),
        }
    }

    /// Publishes that JetStream acknowledged as duplicates (it had the message id already):
    /// repeats that the stream absorbed.
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::Relaxed)
    }

    async fn connect_now(&self) -> Result<(), ConnectError> {
        self.live.ensure(self.open()).await
    }

    async fn open(&self) -> Result<Live, ConnectError> {
        self.destinations.check_url(&self.url).await.map_err(ConnectError)?;
        let (lost_tx, lost) = watch::channel(false);
        let options = async_nats::ConnectOptions::new()
            .name("outboxd")
            .connection_timeout(CONNECT_TIMEOUT)
            // Reconnecting is this target's job (see the module's comment): one try at most
            // in the background, and the client is retired at the first disconnect anyway.
            .max_reconnects(1)
            // Only the URL's server, never one the server advertises: a sink's creator may run
            // that server, and its INFO could name an internal address the check never saw.
            .ignore_discovered_servers()
            .event_callback(move |event| {
                if matches!(event, async_nats::Event::Disconnected | async_nats::Event::Closed) {
                    lost_tx.send_replace(true);
                }
                async {}
            });
        let connect = options.connect(self.url.as_str());
        let client = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                return Err(ConnectError(self.scrub.clean(&format!("connecting to {}: {e}", self.scrub.shown_url()))));
            }
            Err(_) => {
                return Err(ConnectError(format!(
                    "connecting to {}: no answer in {CONNECT_TIMEOUT:?}",
                    self.scrub.shown_url()
                )));
            }
        };
        let jetstream = async_nats::jetstream::context::ContextBuilder::new()
            .timeout(ACK_TIMEOUT)
            .max_ack_inflight(usize::try_from(crate::domain::Sink::MAX_IN_FLIGHT).unwrap_or(usize::MAX))
            .backpressure_on_inflight(true)
            .build(client.clone());
        Ok(Live { client, jetstream, lost })
    }

    async fn publish_now(&self, m: Publish) -> Outcome {
        let Some(live) = self.live.up() else {
            return Outcome::Unavailable { error: "not connected to NATS".into() };
        };
        let subject = self.subject.render(&m.topic, &m.type_, m.ordering_key.as_deref());
        if subject.is_empty() || subject.contains(|c: char| c.is_whitespace() || c.is_control()) {
            return Outcome::Failed {
                reason: "invalid_subject",
                error: format!("the subject {subject:?} from {:?} is not a NATS subject", self.subject.as_str()),
                retry_after: None,
            };
        }
        let headers = match headers(&m) {
            Ok(h) => h,
            Err(error) => return Outcome::Failed { reason: "invalid_header", error, retry_after: None },
        };
        let mut lost = live.lost.clone();
        let publish = async {
            let ack = live.jetstream.publish_with_headers(subject, headers, m.payload.into()).await?;
            ack.await
        };
        let result = tokio::select! {
            r = publish => r,
            _ = lost.wait_for(|lost| *lost) => {
                return Outcome::Unavailable { error: "the connection to NATS was lost before the PubAck".into() };
            }
        };
        match result {
            Ok(ack) => {
                if ack.duplicate {
                    self.duplicates.fetch_add(1, Ordering::Relaxed);
                }
                Outcome::Confirmed
            }
            Err(e) => match e.kind() {
                PublishErrorKind::StreamNotFound => Outcome::Failed {
                    reason: "no_stream",
                    error: format!("no JetStream stream captures this subject (503 no responders): {e}"),
                    retry_after: None,
                },
                PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => {
                    Outcome::Unavailable { error: self.scrub.clean(&format!("waiting for the PubAck: {e}")) }
                }
                PublishErrorKind::MaxPayloadExceeded => {
                    Outcome::Failed { reason: "too_large", error: self.scrub.clean(&e.to_string()), retry_after: None }
                }
                _ => Outcome::Failed { reason: "rejected", error: self.scrub.clean(&e.to_string()), retry_after: None },
            },
        }
    }
}

/// The message's headers as NATS headers, JetStream's own left out, and `Nats-Msg-Id`.
fn headers(m: &Publish) -> Result<HeaderMap, String> {
    let mut out = HeaderMap::new();
    for (k, v) in &m.headers {
        if k.len() >= RESERVED_PREFIX.len() && k[..RESERVED_PREFIX.len()].eq_ignore_ascii_case(RESERVED_PREFIX) {
            continue;
        }
        let name = HeaderName::from_str(k).map_err(|e| format!("header {k:?} is not a NATS header name: {e}"))?;
        let value = HeaderValue::from_str(v).map_err(|e| format!("header {k:?} has a value NATS cannot carry: {e}"))?;
        out.append(name, value);
    }
    out.insert(NATS_MESSAGE_ID, m.message_id.to_string().as_str());
    Ok(out)
}

impl Target for Nats {
    fn kind(&self) -> SinkKind {
        SinkKind::Nats
    }

    fn connect(&self) -> BoxFuture<'_, Result<(), ConnectError>> {
        self.connect_now().boxed()
    }

    fn publish(&self, message: Publish) -> BoxFuture<'_, Outcome> {
        self.publish_now(message).boxed()
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        self.live.close().boxed()
    }
}

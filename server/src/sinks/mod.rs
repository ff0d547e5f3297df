//! Sinks: consumers that outboxd delivers itself, to a broker or a webhook.
//!
//! A sink consumer is served by the same delivery core as a `Subscribe` stream (leases, the
//! in-flight window, pushes from the relay, ordering keys, retries, dead letters); where a
//! stream sends each delivery to a client, a sink hands it to its [`Target`], which publishes
//! it and answers with an [`Outcome`] once the target has confirmed it (or refused it). The
//! outcome becomes the ack or the nack.
//!
//! One more target is one more file: a module here with a type that implements [`Target`],
//! and one arm in [`connect`].
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;

use crate::domain::{MessageId, SinkKind, SinkTarget, redact_url};

pub mod destination;
pub mod nats;
pub mod rabbitmq;
pub mod round;
pub mod runner;
pub mod sealed;
pub mod supervisor;
pub mod webhook;

/// The target of `target`: builds its client, without touching the network
/// ([`Target::connect`] does that), reaching only what `destinations` allows.
pub fn connect(target: &SinkTarget, destinations: destination::Destinations) -> Box<dyn Target> {
    match target {
        SinkTarget::RabbitMq { url, exchange, routing_key } => {
            Box::new(rabbitmq::RabbitMq::new(url, exchange, routing_key, destinations))
        }
        SinkTarget::Nats { url, subject } => Box::new(nats::Nats::new(url, subject, destinations)),
        SinkTarget::Webhook { url, secret, timeout } => {
            Box::new(webhook::Webhook::new(url, secret, *timeout, destinations))
        }
    }
}

/// One delivery, as a target publishes it.
#[derive(Debug, Clone)]
pub struct Publish {
    pub message_id: MessageId,
    pub seq: i64,
    pub topic: String,
    pub type_: String,
    pub payload: Vec<u8>,
    /// The message's headers, with this delivery's `traceparent` when the message is traced.
    pub headers: BTreeMap<String, String>,
    pub ordering_key: Option<String>,
    pub enqueued_at: DateTime<Utc>,
    /// 1 on the first delivery.
    pub delivery_count: u32,
}

impl From<crate::domain::LeasedDelivery> for Publish {
    fn from(d: crate::domain::LeasedDelivery) -> Self {
        let m = d.message;
        Publish {
            message_id: m.message_id,
            seq: m.seq,
            topic: m.topic,
            type_: m.type_,
            payload: m.payload,
            headers: m.headers,
            ordering_key: m.ordering_key,
            enqueued_at: m.enqueued_at,
            delivery_count: d.delivery_count,
        }
    }
}

/// What a target answers for one publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The target has it durably (a publisher confirm, a PubAck, a 2xx): ack.
    Confirmed,
    /// The target refused this message, or failed it: a failed attempt (nack; the consumer's
    /// backoff or `retry_after`, then dead at `max_deliveries`). `reason` is a short,
    /// low-cardinality label for metrics (`unroutable`, `nacked`, `no_stream`, `http_4xx`,
    /// `http_5xx`, `timeout`, …); `error` is what the dead letter shows.
    Failed { reason: &'static str, error: String, retry_after: Option<Duration> },
    /// The target cannot be reached (connection or channel lost): the delivery is released
    /// without counting as a failure of the message, and the sink reconnects with backoff
    /// before it leases again.
    Unavailable { error: String },
}

/// Why a target could not connect.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConnectError(pub String);

/// One target: a connection (or client) to a broker or a webhook endpoint.
///
/// `publish` is called concurrently, up to the sink's `max_in_flight` at once: a target
/// pipelines them (publishes without waiting, then waits for each confirmation).
pub trait Target: Send + Sync + 'static {
    fn kind(&self) -> SinkKind;

    /// Connects, or checks that the connection is up; called before the sink leases anything
    /// and again, with backoff, after an [`Outcome::Unavailable`].
    fn connect(&self) -> BoxFuture<'_, Result<(), ConnectError>>;

    /// Publishes one delivery and waits for the target's confirmation.
    fn publish(&self, message: Publish) -> BoxFuture<'_, Outcome>;

    /// Closes the connection (on shutdown, or when the sink consumer is deleted).
    fn close(&self) -> BoxFuture<'_, ()>;

    /// Publishes sent whose confirmation was lost with the connection (answered
    /// [`Outcome::Unavailable`]) so far: each is published again, and may reach the target
    /// twice. Targets that drop repeats themselves (JetStream's `Nats-Msg-Id`) count none.
    fn unconfirmed_lost(&self) -> u64 {
        0
    }
}

/// A connection (with its channel or client) that a [`Current`] holds.
pub(crate) trait Link: Send + Sync + 'static {
    fn is_up(&self) -> bool;
    /// Closes it, bounded in time; called once it is replaced or the target closes.
    fn shut(&self) -> BoxFuture<'_, ()>;
}

/// A target's current connection: replaced whole by `connect` (one at a time), shared by the
/// publishes in flight, which keep the one they started on.
pub(crate) struct Current<T> {
    slot: std::sync::Mutex<Option<std::sync::Arc<T>>>,
    /// Held by `connect` and `close`.
    connecting: tokio::sync::Mutex<()>,
}

impl<T> Current<T> {
    pub(crate) fn new() -> Self {
        Self { slot: std::sync::Mutex::new(None), connecting: tokio::sync::Mutex::new(()) }
    }

    pub(crate) fn get(&self) -> Option<std::sync::Arc<T>> {
        self.slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Puts `next` in place and returns what was there.
    fn replace(&self, next: Option<T>) -> Option<std::sync::Arc<T>> {
        let next = next.map(std::sync::Arc::new);
        std::mem::replace(&mut *self.slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner), next)
    }
}

impl<T: Link> Current<T> {
    /// The connection, if it is up.
    pub(crate) fn up(&self) -> Option<std::sync::Arc<T>> {
        self.get().filter(|l| l.is_up())
    }

    /// Keeps a connection that is up; else shuts the old one and puts what `open` makes in
    /// its place.
    pub(crate) async fn ensure<F>(&self, open: F) -> Result<(), ConnectError>
    where
        F: Future<Output = Result<T, ConnectError>>,
    {
        let _one = self.connecting.lock().await;
        if self.up().is_some() {
            return Ok(());
        }
        if let Some(old) = self.replace(None) {
            old.shut().await;
        }
        self.replace(Some(open.await?));
        Ok(())
    }

    /// Shuts the connection; a later [`Current::ensure`] opens a new one.
    pub(crate) async fn close(&self) {
        let _one = self.connecting.lock().await;
        if let Some(old) = self.replace(None) {
            old.shut().await;
        }
    }
}

/// Keeps a target's secrets (a URL's password, a webhook secret) out of the text of its
/// errors, whatever a client library put in them.
#[derive(Debug, Clone)]
pub(crate) struct Scrubber {
    url: String,
    shown_url: String,
    secrets: Vec<String>,
}

impl Scrubber {
    pub(crate) fn for_url(url: &str) -> Self {
        let mut secrets = Vec::new();
        if let Ok(parsed) = url::Url::parse(url)
            && let Some(password) = parsed.password()
        {
            secrets.push(password.to_owned());
            let decoded = percent_encoding::percent_decode_str(password).decode_utf8_lossy().into_owned();
            secrets.push(decoded);
        }
        Self { url: url.to_owned(), shown_url: redact_url(url), secrets }
    }

    pub(crate) fn with_secret(mut self, secret: &str) -> Self {
        secrets_of(secret).for_each(|s| self.secrets.push(s));
        self
    }

    /// The URL as logs and errors show it.
    pub(crate) fn shown_url(&self) -> &str {
        &self.shown_url
    }

    /// `text` with the URL shown redacted and every secret replaced by `***`.
    pub(crate) fn clean(&self, text: &str) -> String {
        let mut out = text.replace(&self.url, &self.shown_url);
        for secret in &self.secrets {
            // A one-character password would blank out the text; such a password is shown as
            // little as the rest (the URL, redacted).
            if secret.len() >= 3 {
                out = out.replace(secret.as_str(), crate::domain::REDACTED);
            }
        }
        out
    }
}

/// A webhook secret as written and without its prefix.
fn secrets_of(secret: &str) -> impl Iterator<Item = String> + '_ {
    [Some(secret), secret.strip_prefix(crate::domain::WebhookSecret::PREFIX)].into_iter().flatten().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scrubber_removes_a_urls_password_raw_and_decoded_and_a_webhook_secret() {
        let url = "amqp://app:p%40ss-w0rd@rabbit.internal:5672/%2f";
        let scrub = Scrubber::for_url(url).with_secret("whsec_c2VjcmV0LWtleS1ieXRlcw==");
        let text = format!(
            "connecting to {url}: auth failed for p@ss-w0rd (p%40ss-w0rd); key whsec_c2VjcmV0LWtleS1ieXRlcw== \
             or c2VjcmV0LWtleS1ieXRlcw=="
        );
        let clean = scrub.clean(&text);
        for secret in ["p@ss-w0rd", "p%40ss-w0rd", "c2VjcmV0LWtleS1ieXRlcw=="] {
            assert!(!clean.contains(secret), "{clean}");
        }
        assert!(clean.starts_with("connecting to amqp://app:***@rabbit.internal:5672/%2f"), "{clean}");
        assert_eq!(scrub.shown_url(), "amqp://app:***@rabbit.internal:5672/%2f");
        // Nothing to scrub: the text stays.
        assert_eq!(Scrubber::for_url("nats://127.0.0.1:4222").clean("no responders"), "no responders");
    }
}

//! The RabbitMQ target (ADR 0031): one AMQP connection with one channel in confirm mode;
//! every message persistent and `mandatory`, so that the broker either confirms that a queue
//! has it or hands it back.
//!
//! Publishes are pipelined: each concurrent [`Target::publish`] sends its message on the shared
//! channel and waits for its own confirm. A lost connection (or channel) resolves every
//! unconfirmed publish as [`Outcome::Unavailable`]; the next [`Target::connect`] opens a new
//! connection. A publish whose frames were sent but whose confirm was lost may have reached
//! the broker, and is published again: those are counted in [`Target::unconfirmed_lost`].
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind};

use super::destination::Destinations;
use super::{ConnectError, Current, Link, Outcome, Publish, Scrubber, Target};
use crate::domain::{SinkKind, Template};

/// How long opening the connection, the channel and confirm mode may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// AMQP's persistent delivery mode.
const PERSISTENT: u8 = 2;

/// A RabbitMQ exchange (or the default exchange) as a sink's target.
pub struct RabbitMq {
    destinations: Destinations,
    url: String,
    exchange: String,
    routing_key: Template,
    scrub: Scrubber,
    live: Current<Live>,
    unconfirmed_lost: AtomicU64,
}

struct Live {
    connection: Connection,
    channel: Channel,
}

impl Link for Live {
    fn is_up(&self) -> bool {
        self.connection.status().connected() && self.channel.status().connected()
    }

    fn shut(&self) -> BoxFuture<'_, ()> {
        async move {
            if self.connection.status().connected() {
                let bye = self.connection.close(200, "outboxd closes the sink".into());
                let _ = tokio::time::timeout(Duration::from_secs(2), bye).await;
            }
        }
        .boxed()
    }
}

impl RabbitMq {
    pub fn new(url: &str, exchange: &str, routing_key: &Template, destinations: Destinations) -> Self {
        Self {
            destinations,
            url: url.to_owned(),
            exchange: exchange.to_owned(),
            routing_key: routing_key.clone(),
            scrub: Scrubber::for_url(url),
            live: Current::new(),
            unconfirmed_lost: AtomicU64::new(0),
        }
    }

    async fn open(&self) -> Result<Live, ConnectError> {
        self.destinations.check_url(&self.url).await.map_err(ConnectError)?;
        let fail = |what: &str, e: lapin::Error| ConnectError(self.scrub.clean(&format!("{what}: {e}")));
        let props = ConnectionProperties::default().with_connection_name("outboxd".into());
        let connection = Connection::connect(&self.url, props)
            .await
            .map_err(|e| fail(&format!("connecting to {}", self.scrub.shown_url()), e))?;
        let channel = connection.create_channel().await.map_err(|e| fail("opening a channel", e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| fail("turning on publisher confirms", e))?;
        if !self.exchange.is_empty() {
            // Passive: the exchange must exist (outboxd does not declare topology). A missing
            // one is a connect error, so that the sink waits instead of failing every message.
            let name = ShortString::try_new(self.exchange.as_str()).map_err(|e| ConnectError(e.to_string()))?;
            let passive = ExchangeDeclareOptions { passive: true, ..ExchangeDeclareOptions::default() };
            channel
                .exchange_declare(name, ExchangeKind::Direct, passive, FieldTable::default())
                .await
                .map_err(|e| fail(&format!("checking that exchange {:?} exists", self.exchange), e))?;
        }
        Ok(Live { connection, channel })
    }

    async fn connect_now(&self) -> Result<(), ConnectError> {
        let open = async {
            tokio::time::timeout(CONNECT_TIMEOUT, self.open()).await.map_err(|_| {
                ConnectError(format!("connecting to {}: no answer in {CONNECT_TIMEOUT:?}", self.scrub.shown_url()))
            })?
        };
        self.live.ensure(open).await
    }

    async fn publish_now(&self, m: Publish) -> Outcome {
        let Some(live) = self.live.up() else {
            return Outcome::Unavailable { error: "not connected to RabbitMQ".into() };
        };
        let (routing_key, properties) = match message(&self.routing_key, &m) {
            Ok(built) => built,
            Err(failed) => return failed,
        };
        let exchange = ShortString::try_new(self.exchange.as_str()).unwrap_or_default();
        let mandatory = BasicPublishOptions { mandatory: true, ..BasicPublishOptions::default() };
        let confirm = match live.channel.basic_publish(exchange, routing_key, mandatory, &m.payload, properties).await {
            Ok(confirm) => confirm,
            // Refused before it was sent: no duplicate possible.
            Err(e) => return Outcome::Unavailable { error: self.scrub.clean(&format!("publishing: {e}")) },
        };
        match confirm.await {
            Ok(Confirmation::Ack(None)) => Outcome::Confirmed,
            Ok(Confirmation::Ack(Some(returned))) => Outcome::Failed {
                reason: "unroutable",
                error: format!(
                    "returned by the broker: {} {} (exchange {:?}, routing key {:?})",
                    returned.reply_code,
                    returned.reply_text,
                    returned.delivery.exchange.as_str(),
                    returned.delivery.routing_key.as_str(),
                ),
                retry_after: None,
            },
            Ok(Confirmation::Nack(returned)) => Outcome::Failed {
                reason: "nacked",
                error: match returned {
                    Some(r) => format!("nacked by the broker: {} {}", r.reply_code, r.reply_text),
                    None => "nacked by the broker (it could not take the message)".into(),
                },
                retry_after: None,
            },
            Ok(Confirmation::NotRequested) => {
                // The channel lost confirm mode: only a new channel gets it back.
                Outcome::Unavailable { error: "the channel is not in confirm mode".into() }
            }
            Err(e) => {
                // Sent, never confirmed: the broker may have it; published again after the
                // reconnect, this one may arrive twice.
                self.unconfirmed_lost.fetch_add(1, Ordering::Relaxed);
                Outcome::Unavailable { error: self.scrub.clean(&format!("waiting for the publisher confirm: {e}")) }
            }
        }
    }
}

/// The routing key and the properties of one message, or the failure that says why it cannot
/// be written in AMQP.
fn message(template: &Template, m: &Publish) -> Result<(ShortString, BasicProperties), Outcome> {
    let invalid = |reason: &'static str, error: String| Outcome::Failed { reason, error, retry_after: None };
    let key = template.render(&m.topic, &m.type_, m.ordering_key.as_deref());
    let routing_key = ShortString::try_new(key).map_err(|e| {
        invalid("invalid_routing_key", format!("the routing key from {:?} is too long: {e}", template.as_str()))
    })?;
    let mut headers = FieldTable::default();
    let mut content_type = None;
    for (k, v) in &m.headers {
        if k.eq_ignore_ascii_case("content-type") {
            content_type = Some(v.as_str());
        }
        let name = ShortString::try_new(k.as_str())
            .map_err(|e| invalid("invalid_header", format!("header name is too long for AMQP: {e}")))?;
        headers.insert(name, AMQPValue::LongString(LongString::from(v.as_str())));
    }
    let mut properties = BasicProperties::default()
        .with_delivery_mode(PERSISTENT)
        .with_message_id(ShortString::try_new(m.message_id.to_string()).unwrap_or_default())
        .with_timestamp(u64::try_from(m.enqueued_at.timestamp()).unwrap_or(0))
        .with_app_id("outboxd".into())
        .with_headers(headers);
    if !m.type_.is_empty() {
        let kind = ShortString::try_new(m.type_.as_str())
            .map_err(|e| invalid("invalid_type", format!("the message type is too long for AMQP: {e}")))?;
        properties = properties.with_type(kind);
    }
    if let Some(ct) = content_type {
        let ct = ShortString::try_new(ct)
            .map_err(|e| invalid("invalid_header", format!("the content-type header is too long for AMQP: {e}")))?;
        properties = properties.with_content_type(ct);
    }
    Ok((routing_key, properties))
}

impl Target for RabbitMq {
    fn kind(&self) -> SinkKind {
        SinkKind::RabbitMq
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

    fn unconfirmed_lost(&self) -> u64 {
        self.unconfirmed_lost.load(Ordering::Relaxed)
    }
}

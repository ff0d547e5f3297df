//! Wire ↔ domain conversion. Requests are parsed here, once, into domain types; every
//! rejection names the offending field.
use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_proto::v1 as pb;

use crate::domain::StoredMessage;
use crate::domain::{
    Backoff, Consumer, ConsumerName, ConsumerSpec, DeadKeyPolicy, InvalidField, MessageId, Sink, SinkTarget, StartFrom,
    Topic, TopicPattern,
};
use crate::limits;
use crate::store::{DeliveryRow, NewMessage};

/// Limits applied to producer input.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_payload_bytes: usize,
    pub max_batch: usize,
}

pub fn duration(field: &str, d: &prost_types::Duration) -> Result<Duration, InvalidField> {
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        return Err(InvalidField::new(field, "must be a non-negative duration"));
    }
    Ok(Duration::new(d.seconds as u64, d.nanos as u32))
}

pub fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: t.timestamp(), nanos: t.timestamp_subsec_nanos() as i32 }
}

pub fn pb_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

/// Protobuf's own range for a Timestamp (years 1 to 9999), which both stores can hold: a time
/// outside it is the client's error, named here, not a database's "out of range".
const MIN_SECONDS: i64 = -62_135_596_800;
const MAX_SECONDS: i64 = 253_402_300_799;

pub fn time(field: &str, t: &prost_types::Timestamp) -> Result<DateTime<Utc>, InvalidField> {
    if !(MIN_SECONDS..=MAX_SECONDS).contains(&t.seconds) {
        return Err(InvalidField::new(field, "is outside the years 0001 to 9999"));
    }
    DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).unwrap_or(u32::MAX))
        .ok_or_else(|| InvalidField::new(field, "is not a valid timestamp"))
}

pub fn age(now: DateTime<Utc>, since: Option<DateTime<Utc>>) -> Option<prost_types::Duration> {
    since.map(|t| pb_duration((now - t).to_std().unwrap_or(Duration::ZERO)))
}

const MAX_DELAY: Duration = Duration::from_secs(366 * 24 * 3600);

pub fn new_message(field: &str, req: pb::EnqueueRequest, limits: &Limits) -> Result<NewMessage, InvalidField> {
    let f = |name: &str| if field.is_empty() { name.to_owned() } else { format!("{field}.{name}") };
    let topic = Topic::parse(&f("topic"), &req.topic)?;
    if req.r#type.trim().is_empty() {
        return Err(InvalidField::new(f("type"), "type must not be empty"));
    }
    if req.r#type.len() > limits::MAX_TYPE_BYTES {
        return Err(InvalidField::new(
            f("type"),
            format!("type is {} bytes; the limit is {} bytes", req.r#type.len(), limits::MAX_TYPE_BYTES),
        ));
    }
    if let Some(k) = &req.ordering_key
        && k.len() > limits::MAX_ORDERING_KEY_BYTES
    {
        return Err(InvalidField::new(
            f("ordering_key"),
            format!("ordering_key is {} bytes; the limit is {} bytes", k.len(), limits::MAX_ORDERING_KEY_BYTES),
        ));
    }
    headers(&f("headers"), &req.headers)?;
    if req.payload.len() > limits.max_payload_bytes {
        return Err(InvalidField::new(
            f("payload"),
            format!(
                "payload is {} bytes; the limit is {} bytes (outboxd's --max-payload-bytes)",
                req.payload.len(),
                limits.max_payload_bytes
            ),
        ));
    }
    let message_id = match req.message_id.as_deref() {
        None | Some("") => None,
        Some(s) => Some(MessageId::parse(&f("message_id"), s)?),
    };
    let delay = match &req.delay {
        Some(d) => {
            let d = duration(&f("delay"), d)?;
            if d > MAX_DELAY {
                return Err(InvalidField::new(f("delay"), "delay is longer than 366 days"));
            }
            Some(d)
        }
        None => None,
    };
    Ok(NewMessage {
        message_id,
        topic,
        type_: req.r#type,
        payload: req.payload,
        headers: req.headers.into_iter().collect::<BTreeMap<_, _>>(),
        ordering_key: req.ordering_key.filter(|k| !k.is_empty()),
        delay,
    })
}

/// The header limits (ADR 0023): entries, total bytes of keys and values, and each key's size.
pub fn headers<'a, I>(field: &str, headers: I) -> Result<(), InvalidField>
where
    I: IntoIterator<Item = (&'a String, &'a String)>,
    I::IntoIter: ExactSizeIterator,
{
    let headers = headers.into_iter();
    if headers.len() > limits::MAX_HEADERS {
        return Err(InvalidField::new(
            field,
            format!("{} headers; the limit is {} entries", headers.len(), limits::MAX_HEADERS),
        ));
    }
    let mut total = 0usize;
    for (k, v) in headers {
        if k.is_empty() {
            return Err(InvalidField::new(field, "a header key is empty; keys must not be empty"));
        }
        if k.len() > limits::MAX_HEADER_KEY_BYTES {
            let shown: String = k.chars().take(32).collect();
            return Err(InvalidField::new(
                field,
                format!(
                    "header key {shown:?}… is {} bytes; the limit is {} bytes per key",
                    k.len(),
                    limits::MAX_HEADER_KEY_BYTES
                ),
            ));
        }
        total += k.len() + v.len();
    }
    if total > limits::MAX_HEADERS_BYTES {
        return Err(InvalidField::new(
            field,
            format!("headers are {total} bytes (keys and values); the limit is {} bytes", limits::MAX_HEADERS_BYTES),
        ));
    }
    Ok(())
}

/// The parts of a stream's `start` that need no database: the consumer to look up, the room
/// to hold, and the ack deadline it asks for (`None`: the consumer's own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartRequest {
    pub consumer: ConsumerName,
    pub max_in_flight: u32,
    pub ack_deadline: Option<Duration>,
}

/// Streams that ask for no `max_in_flight` get this many.
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 16;
/// The most a stream may hold unacked.
pub const MAX_MAX_IN_FLIGHT: u32 = 10_000;
/// The shortest ack deadline a stream or consumer may ask for.
pub const MIN_ACK_DEADLINE: Duration = Duration::from_millis(100);
/// The longest ack deadline or extension a stream or consumer may ask for.
pub const MAX_ACK_DEADLINE: Duration = Duration::from_secs(24 * 3600);

pub fn start_request(start: &pb::Start) -> Result<StartRequest, InvalidField> {
    let consumer = ConsumerName::parse("start.consumer", &start.consumer)?;
    let max_in_flight = match start.max_in_flight {
        0 => DEFAULT_MAX_IN_FLIGHT,
        n if n > MAX_MAX_IN_FLIGHT => {
            return Err(InvalidField::new(
                "start.max_in_flight",
                format!("max_in_flight is {n}; the limit is {MAX_MAX_IN_FLIGHT}"),
            ));
        }
        n => n,
    };
    let ack_deadline = match &start.ack_deadline {
        Some(d) => {
            let d = duration("start.ack_deadline", d)?;
            if d > MAX_ACK_DEADLINE {
                return Err(InvalidField::new("start.ack_deadline", too_long("ack_deadline", d, MAX_ACK_DEADLINE)));
            }
            if !d.is_zero() && d < MIN_ACK_DEADLINE {
                return Err(InvalidField::new("start.ack_deadline", "at least 100 ms"));
            }
            Some(d).filter(|d| !d.is_zero())
        }
        None => None,
    };
    Ok(StartRequest { consumer, max_in_flight, ack_deadline })
}

fn too_long(what: &str, d: Duration, limit: Duration) -> String {
    format!("{what} is {}; the limit is {}", short(d), short(limit))
}

/// Whole hours as hours, else whole seconds, else milliseconds: "24h", "90s", "1500ms".
fn short(d: Duration) -> String {
    match (d.as_secs(), d.subsec_nanos()) {
        (s, 0) if s % 3600 == 0 && s > 0 => format!("{}h", s / 3600),
        (s, 0) => format!("{s}s"),
        _ => format!("{}ms", d.as_millis()),
    }
}

pub fn consumer_spec(c: pb::Consumer) -> Result<ConsumerSpec, InvalidField> {
    let name = ConsumerName::parse("consumer.name", &c.name)?;
    if c.topics.is_empty() {
        return Err(InvalidField::new("consumer.topics", "at least one topic or pattern is required"));
    }
    if c.topics.len() > limits::MAX_CONSUMER_TOPICS {
        return Err(InvalidField::new(
            "consumer.topics",
            format!("{} topics; the limit is {} per consumer", c.topics.len(), limits::MAX_CONSUMER_TOPICS),
        ));
    }
    let topics = c
        .topics
        .iter()
        .enumerate()
        .map(|(i, t)| TopicPattern::parse(&format!("consumer.topics[{i}]"), t))
        .collect::<Result<Vec<_>, _>>()?;
    let max_deliveries = if c.max_deliveries == 0 { ConsumerSpec::DEFAULT_MAX_DELIVERIES } else { c.max_deliveries };
    if max_deliveries > 1_000_000 {
        return Err(InvalidField::new("consumer.max_deliveries", "at most 1000000"));
    }
    let opt = |field: &str, d: &Option<prost_types::Duration>, default: Duration| -> Result<Duration, InvalidField> {
        match d {
            Some(d) => duration(field, d).map(|v| if v.is_zero() { default } else { v }),
            None => Ok(default),
        }
    };
    let base = opt("consumer.backoff_base", &c.backoff_base, ConsumerSpec::DEFAULT_BACKOFF_BASE)?;
    if base > limits::MAX_BACKOFF {
        return Err(InvalidField::new("consumer.backoff_base", too_long("backoff_base", base, limits::MAX_BACKOFF)));
    }
    let max = opt("consumer.backoff_max", &c.backoff_max, ConsumerSpec::DEFAULT_BACKOFF_MAX.max(base))?;
    if max > limits::MAX_BACKOFF {
        return Err(InvalidField::new("consumer.backoff_max", too_long("backoff_max", max, limits::MAX_BACKOFF)));
    }
    if max < base {
        return Err(InvalidField::new("consumer.backoff_max", "must not be less than backoff_base"));
    }
    let ack_deadline = opt("consumer.ack_deadline", &c.ack_deadline, ConsumerSpec::DEFAULT_ACK_DEADLINE)?;
    if ack_deadline > MAX_ACK_DEADLINE {
        return Err(InvalidField::new(
            "consumer.ack_deadline",
            too_long("ack_deadline", ack_deadline, MAX_ACK_DEADLINE),
        ));
    }
    if ack_deadline < MIN_ACK_DEADLINE {
        return Err(InvalidField::new("consumer.ack_deadline", "at least 100 ms"));
    }
    let start_from = match pb::consumer::StartFrom::try_from(c.start_from) {
        Ok(pb::consumer::StartFrom::New) => StartFrom::New,
        Ok(pb::consumer::StartFrom::Earliest) => StartFrom::Earliest,
        Err(_) => return Err(InvalidField::new("consumer.start_from", "must be NEW or EARLIEST")),
    };
    let dead_key_policy = match pb::DeadKeyPolicy::try_from(c.dead_key_policy) {
        Ok(pb::DeadKeyPolicy::Unspecified | pb::DeadKeyPolicy::Skip) => DeadKeyPolicy::Skip,
        Ok(pb::DeadKeyPolicy::Hold) => DeadKeyPolicy::Hold,
        Err(_) => {
            return Err(InvalidField::new(
                "consumer.dead_key_policy",
                format!("{} is not DEAD_KEY_POLICY_SKIP (1) or DEAD_KEY_POLICY_HOLD (2)", c.dead_key_policy),
            ));
        }
    };
    let sink = c.sink.as_ref().map(sink).transpose()?;
    Ok(ConsumerSpec {
        name,
        topics,
        max_deliveries,
        backoff: Backoff { base, max },
        ack_deadline,
        start_from,
        sink,
        dead_key_policy,
    })
}

/// A consumer's sink: exactly one target, each checked for what it speaks.
pub fn sink(s: &pb::Sink) -> Result<Sink, InvalidField> {
    use pb::sink::Target;
    let target = match &s.target {
        None => {
            return Err(InvalidField::new("consumer.sink.target", "a sink needs one of rabbitmq, nats or webhook"));
        }
        Some(Target::Rabbitmq(r)) => {
            SinkTarget::rabbitmq("consumer.sink.rabbitmq", &r.url, &r.exchange, &r.routing_key)?
        }
        Some(Target::Nats(n)) => SinkTarget::nats("consumer.sink.nats", &n.url, &n.subject)?,
        Some(Target::Webhook(w)) => {
            let timeout = w.timeout.as_ref().map(|d| duration("consumer.sink.webhook.timeout", d)).transpose()?;
            SinkTarget::webhook("consumer.sink.webhook", &w.url, &w.secret, timeout)?
        }
    };
    let max_in_flight = match s.max_in_flight {
        0 => Sink::DEFAULT_MAX_IN_FLIGHT,
        n if n > Sink::MAX_IN_FLIGHT => {
            return Err(InvalidField::new(
                "consumer.sink.max_in_flight",
                format!("{n} is more than the limit of {}", Sink::MAX_IN_FLIGHT),
            ));
        }
        n => n,
    };
    Ok(Sink { target, max_in_flight, created_by: None })
}

/// Takes the secrets out of a sink as it came over the wire (for logs), whether or not it parses.
pub fn redact_pb_sink(s: &mut pb::Sink) {
    use crate::domain::sink::{REDACTED, redact_url};
    use pb::sink::Target;
    match &mut s.target {
        Some(Target::Rabbitmq(r)) => r.url = redact_url(&r.url),
        Some(Target::Nats(n)) => n.url = redact_url(&n.url),
        Some(Target::Webhook(w)) => {
            w.url = redact_url(&w.url);
            w.secret = REDACTED.to_owned();
        }
        None => {}
    }
}

/// A sink as answered: its secrets shown as `***`.
pub fn pb_sink(s: &Sink) -> pb::Sink {
    use pb::sink::Target;
    let target = match s.target.redacted() {
        SinkTarget::RabbitMq { url, exchange, routing_key } => {
            Target::Rabbitmq(pb::RabbitMqSink { url, exchange, routing_key: routing_key.into() })
        }
        SinkTarget::Nats { url, subject } => Target::Nats(pb::NatsSink { url, subject: subject.into() }),
        SinkTarget::Webhook { url, secret, timeout } => Target::Webhook(pb::WebhookSink {
            url,
            secret: secret.expose().to_owned(),
            timeout: Some(pb_duration(timeout)),
        }),
    };
    pb::Sink { target: Some(target), max_in_flight: s.max_in_flight }
}

pub fn pb_consumer(c: &Consumer) -> pb::Consumer {
    pb::Consumer {
        name: c.spec.name.to_string(),
        topics: c.spec.topics.iter().map(|t| t.as_str().to_owned()).collect(),
        max_deliveries: c.spec.max_deliveries,
        backoff_base: Some(pb_duration(c.spec.backoff.base)),
        backoff_max: Some(pb_duration(c.spec.backoff.max)),
        ack_deadline: Some(pb_duration(c.spec.ack_deadline)),
        paused: c.paused,
        start_from: match c.spec.start_from {
            StartFrom::New => pb::consumer::StartFrom::New as i32,
            StartFrom::Earliest => pb::consumer::StartFrom::Earliest as i32,
        },
        created_at: Some(timestamp(c.created_at)),
        sink: c.spec.sink.as_ref().map(pb_sink),
        dead_key_policy: match c.spec.dead_key_policy {
            DeadKeyPolicy::Skip => pb::DeadKeyPolicy::Skip as i32,
            DeadKeyPolicy::Hold => pb::DeadKeyPolicy::Hold as i32,
        },
    }
}

pub fn pb_message(m: StoredMessage) -> pb::Message {
    pb::Message {
        message_id: m.message_id.to_string(),
        seq: m.seq,
        topic: m.topic,
        r#type: m.type_,
        payload: m.payload,
        headers: m.headers.into_iter().collect(),
        ordering_key: m.ordering_key.unwrap_or_default(),
        enqueued_at: Some(timestamp(m.enqueued_at)),
        available_at: Some(timestamp(m.available_at)),
        relayed_at: m.relayed_at.map(timestamp),
    }
}

pub fn pb_delivery_state(d: DeliveryRow) -> pb::DeliveryState {
    use crate::domain::DeliveryState as S;
    use pb::delivery_state::State;
    pb::DeliveryState {
        consumer: d.consumer,
        state: match d.state {
            S::Pending => State::Pending,
            S::Leased => State::Leased,
            S::Acked => State::Acked,
            S::Dead => State::Dead,
        } as i32,
        delivery_count: d.delivery_count,
        available_at: Some(timestamp(d.available_at)),
        lease_expires_at: d.lease_expires_at.map(timestamp),
        last_error: d.last_error.unwrap_or_default(),
        created_at: Some(timestamp(d.created_at)),
        updated_at: Some(timestamp(d.updated_at)),
        acked_at: d.acked_at.map(timestamp),
        dead_at: d.dead_at.map(timestamp),
    }
}

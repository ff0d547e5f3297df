//! Wire ↔ domain conversion. Requests are parsed here, once, into domain types; every
//! rejection names the offending field.
use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_proto::v1 as pb;

use crate::domain::{
    Backoff, Consumer, ConsumerName, ConsumerSpec, InvalidField, MessageId, StartFrom, Topic, TopicPattern,
};
use crate::store::{DeliveryRow, NewMessage, StoredMessage};

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

pub fn time(field: &str, t: &prost_types::Timestamp) -> Result<DateTime<Utc>, InvalidField> {
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
    if req.payload.len() > limits.max_payload_bytes {
        return Err(InvalidField::new(
            f("payload"),
            format!("payload is {} bytes; the maximum is {}", req.payload.len(), limits.max_payload_bytes),
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

pub fn consumer_spec(c: pb::Consumer) -> Result<ConsumerSpec, InvalidField> {
    let name = ConsumerName::parse("consumer.name", &c.name)?;
    if c.topics.is_empty() {
        return Err(InvalidField::new("consumer.topics", "at least one topic or pattern is required"));
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
    let max = opt("consumer.backoff_max", &c.backoff_max, ConsumerSpec::DEFAULT_BACKOFF_MAX.max(base))?;
    if max < base {
        return Err(InvalidField::new("consumer.backoff_max", "must not be less than backoff_base"));
    }
    let ack_deadline = opt("consumer.ack_deadline", &c.ack_deadline, ConsumerSpec::DEFAULT_ACK_DEADLINE)?;
    if ack_deadline > super::stream::MAX_ACK_DEADLINE {
        return Err(InvalidField::new("consumer.ack_deadline", "at most 12 hours"));
    }
    if ack_deadline < crate::grpc::outbox::MIN_ACK_DEADLINE {
        return Err(InvalidField::new("consumer.ack_deadline", "at least 100 ms"));
    }
    let start_from = match pb::consumer::StartFrom::try_from(c.start_from) {
        Ok(pb::consumer::StartFrom::New) => StartFrom::New,
        Ok(pb::consumer::StartFrom::Earliest) => StartFrom::Earliest,
        Err(_) => return Err(InvalidField::new("consumer.start_from", "must be NEW or EARLIEST")),
    };
    Ok(ConsumerSpec { name, topics, max_deliveries, backoff: Backoff { base, max }, ack_deadline, start_from })
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

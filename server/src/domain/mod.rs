//! Domain types that are parsed once at the edge ("parse, don't validate"): message ids,
//! consumer names, topics and topic patterns, the retry policy and the failure rule ([`Failure`]),
//! and the delivery state machine.
use std::fmt;
use std::time::Duration;

use uuid::Uuid;

mod delivery;
mod failure;
pub mod fanout;
pub mod sink;
mod transition;
pub use delivery::{Attempt, LeasedDelivery, PushOffer, RelayOutcome, Release, ReleaseGuard, StoredMessage};
pub use failure::{Backoff, Failure, RetryPolicy, Withdrawal};
pub use sink::{REDACTED, Sink, SinkKind, SinkTarget, Template, WebhookSecret, redact_url};
pub use transition::{Stage, Transition};

/// A value at the edge that does not parse; `field` names the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidField {
    pub field: String,
    pub reason: String,
}

impl InvalidField {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { field: field.into(), reason: reason.into() }
    }
}

/// A message's identity: a UUID, chosen by the producer or generated (v7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(pub Uuid);

impl MessageId {
    pub fn generate() -> Self {
        Self(Uuid::now_v7())
    }

    pub fn parse(field: &str, s: &str) -> Result<Self, InvalidField> {
        Uuid::parse_str(s.trim()).map(Self).map_err(|_| InvalidField::new(field, format!("{s:?} is not a UUID")))
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A consumer's name: 1 to 200 characters of `[A-Za-z0-9_.-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConsumerName(String);

impl ConsumerName {
    pub const MAX_LEN: usize = 200;

    pub fn parse(field: &str, s: &str) -> Result<Self, InvalidField> {
        if s.is_empty() {
            return Err(InvalidField::new(field, "consumer name must not be empty"));
        }
        if s.len() > Self::MAX_LEN {
            return Err(InvalidField::new(field, format!("consumer name is longer than {} characters", Self::MAX_LEN)));
        }
        if !s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) {
            return Err(InvalidField::new(field, format!("consumer name {s:?} may only contain [A-Za-z0-9_.-]")));
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ConsumerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn valid_segment(seg: &str) -> bool {
    !seg.is_empty() && seg.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
}

/// A concrete topic: dot-separated segments of `[A-Za-z0-9_-]`, at most 255 characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Topic(String);

impl Topic {
    pub const MAX_LEN: usize = 255;

    pub fn parse(field: &str, s: &str) -> Result<Self, InvalidField> {
        if s.is_empty() {
            return Err(InvalidField::new(field, "topic must not be empty"));
        }
        if s.len() > Self::MAX_LEN {
            return Err(InvalidField::new(field, format!("topic is longer than {} characters", Self::MAX_LEN)));
        }
        if !s.split('.').all(valid_segment) {
            return Err(InvalidField::new(
                field,
                format!("topic {s:?} must be dot-separated non-empty segments of [A-Za-z0-9_-] (no wildcards)"),
            ));
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether a concrete topic matches a pattern as stored: a `*` segment matches exactly one
/// segment, a final `>` one or more, any other segment itself. The rule of [`TopicPattern`],
/// for patterns read back from a store (and of `outbox.topic_matches` in SQL).
pub fn topic_matches(pattern: &str, topic: &str) -> bool {
    let mut pat = pattern.split('.');
    let mut top = topic.split('.');
    loop {
        match (pat.next(), top.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(p), Some(t)) if p == t => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// A consumer's topic filter: an exact topic, or a pattern where a `*` segment matches exactly
/// one segment and a final `>` segment matches one or more (NATS-style).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TopicPattern(String);

impl TopicPattern {
    pub fn parse(field: &str, s: &str) -> Result<Self, InvalidField> {
        if s.is_empty() {
            return Err(InvalidField::new(field, "topic pattern must not be empty"));
        }
        if s.len() > Topic::MAX_LEN {
            return Err(InvalidField::new(
                field,
                format!("topic pattern is longer than {} characters", Topic::MAX_LEN),
            ));
        }
        let segments: Vec<&str> = s.split('.').collect();
        for (i, seg) in segments.iter().enumerate() {
            let ok = match *seg {
                "*" => true,
                ">" => i == segments.len() - 1,
                other => valid_segment(other),
            };
            if !ok {
                return Err(InvalidField::new(
                    field,
                    format!("topic pattern {s:?}: segment {seg:?} must be [A-Za-z0-9_-]+, `*`, or a final `>`"),
                ));
            }
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether a concrete topic matches this pattern.
    pub fn matches(&self, topic: &str) -> bool {
        topic_matches(&self.0, topic)
    }

    /// Whether every topic that `other` matches is matched by this pattern too (so a
    /// permission for this pattern allows whatever `other` asks for).
    pub fn covers(&self, other: &TopicPattern) -> bool {
        let mut mine = self.0.split('.');
        let mut theirs = other.0.split('.');
        loop {
            match (mine.next(), theirs.next()) {
                // `>` is one or more segments, whatever they are (a `>` or `*` of theirs too).
                (Some(">"), Some(_)) => return true,
                // `*` is exactly one segment: theirs must be one too (not a `>`).
                (Some("*"), Some(t)) if t != ">" => {}
                (Some(m), Some(t)) if m == t => {}
                (None, None) => return true,
                _ => return false,
            }
        }
    }
}

/// Where a new consumer starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    /// Only messages enqueued after the consumer was created.
    New,
    /// Every retained message, then new ones.
    Earliest,
}

impl StartFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            StartFrom::New => "new",
            StartFrom::Earliest => "earliest",
        }
    }
}

/// A stored value that no variant of its enum spells: a database written by a newer outboxd,
/// or changed by hand. Decoding fails rather than guess.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?} in the database")]
pub struct UnknownValue {
    pub what: &'static str,
    pub value: String,
}

impl TryFrom<&str> for StartFrom {
    type Error = UnknownValue;

    fn try_from(s: &str) -> Result<Self, UnknownValue> {
        match s {
            "new" => Ok(StartFrom::New),
            "earliest" => Ok(StartFrom::Earliest),
            _ => Err(UnknownValue { what: "start_from", value: s.to_owned() }),
        }
    }
}

/// What a consumer does with an ordering key when a message of it dead-letters (ADR 0057).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeadKeyPolicy {
    /// The key's next message is delivered: the dead one is left behind (the default).
    #[default]
    Skip,
    /// The key is held: its later messages wait, not delivered and not counted as attempts,
    /// until the dead message is replayed and acked or the key is released.
    Hold,
}

impl DeadKeyPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadKeyPolicy::Skip => "skip",
            DeadKeyPolicy::Hold => "hold",
        }
    }
}

impl TryFrom<&str> for DeadKeyPolicy {
    type Error = UnknownValue;

    fn try_from(s: &str) -> Result<Self, UnknownValue> {
        match s {
            "skip" => Ok(DeadKeyPolicy::Skip),
            "hold" => Ok(DeadKeyPolicy::Hold),
            _ => Err(UnknownValue { what: "dead_key_policy", value: s.to_owned() }),
        }
    }
}

/// A durable consumer's definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerSpec {
    pub name: ConsumerName,
    pub topics: Vec<TopicPattern>,
    pub max_deliveries: u32,
    pub backoff: Backoff,
    pub ack_deadline: Duration,
    pub start_from: StartFrom,
    /// Set: outboxd delivers this consumer itself, to the sink's target.
    pub sink: Option<Sink>,
    pub dead_key_policy: DeadKeyPolicy,
}

impl ConsumerSpec {
    /// The first field in which `other` differs from this definition (`None`: the same), as
    /// the wire names it: what an ALREADY_EXISTS tells a client to look at.
    pub fn first_difference(&self, other: &ConsumerSpec) -> Option<&'static str> {
        // Who created a sink is not part of the definition: the same one asked again by
        // another principal is the same consumer.
        let definition = |c: &ConsumerSpec| ConsumerSpec { sink: c.sink.as_ref().map(Sink::definition), ..c.clone() };
        let (this, other) = (&definition(self), &definition(other));
        this.first_difference_of_definitions(other)
    }

    fn first_difference_of_definitions(&self, other: &ConsumerSpec) -> Option<&'static str> {
        if self.topics != other.topics {
            Some("topics")
        } else if self.max_deliveries != other.max_deliveries {
            Some("max_deliveries")
        } else if self.backoff.base != other.backoff.base {
            Some("backoff_base")
        } else if self.backoff.max != other.backoff.max {
            Some("backoff_max")
        } else if self.ack_deadline != other.ack_deadline {
            Some("ack_deadline")
        } else if self.start_from != other.start_from {
            Some("start_from")
        } else if self.sink != other.sink {
            Some("sink")
        } else if self.dead_key_policy != other.dead_key_policy {
            Some("dead_key_policy")
        } else if self != other {
            Some("definition")
        } else {
            None
        }
    }

    pub const DEFAULT_MAX_DELIVERIES: u32 = 10;
    pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(1);
    pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(300);
    pub const DEFAULT_ACK_DEADLINE: Duration = Duration::from_secs(30);

    pub fn matches(&self, topic: &str) -> bool {
        self.topics.iter().any(|p| p.matches(topic))
    }

    /// The policy [`Failure::release`] applies to this consumer's deliveries.
    pub fn retry(&self) -> RetryPolicy {
        RetryPolicy { max_deliveries: self.max_deliveries, backoff: self.backoff }
    }
}

/// A consumer as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumer {
    pub spec: ConsumerSpec,
    pub paused: bool,
    pub start_seq: i64,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// The principal that created it (ADR 0072); `None` when created without an auth file.
    pub created_by: Option<String>,
}

/// The delivery state machine; the schema's CHECK lists the same four states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    /// Due at `available_at`. Moved out by a delivery session's lease (→ leased), by a
    /// transactional ack or a late ack of a released lease (→ acked), or by deleting the
    /// consumer.
    Pending,
    /// Sent to a stream. Moved out by an ack (→ acked), a nack, an expired deadline (the lease
    /// sweeper) or the stream closing (→ pending, or → dead once `max_deliveries` is reached).
    Leased,
    /// Done: never delivered again, except by an admin replay (→ pending).
    Acked,
    /// Gave up after `max_deliveries`. Moved out only by an admin replay (→ pending).
    Dead,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Leased => "leased",
            DeliveryState::Acked => "acked",
            DeliveryState::Dead => "dead",
        }
    }
}

impl TryFrom<&str> for DeliveryState {
    type Error = UnknownValue;

    fn try_from(s: &str) -> Result<Self, UnknownValue> {
        match s {
            "pending" => Ok(DeliveryState::Pending),
            "leased" => Ok(DeliveryState::Leased),
            "acked" => Ok(DeliveryState::Acked),
            "dead" => Ok(DeliveryState::Dead),
            _ => Err(UnknownValue { what: "delivery state", value: s.to_owned() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_enums_round_trip_and_reject_what_they_do_not_know() {
        for st in [DeliveryState::Pending, DeliveryState::Leased, DeliveryState::Acked, DeliveryState::Dead] {
            assert_eq!(DeliveryState::try_from(st.as_str()), Ok(st));
        }
        for sf in [StartFrom::New, StartFrom::Earliest] {
            assert_eq!(StartFrom::try_from(sf.as_str()), Ok(sf));
        }
        let e = DeliveryState::try_from("retrying").unwrap_err();
        assert_eq!(e.to_string(), "unknown delivery state \"retrying\" in the database");
        assert!(DeliveryState::try_from("").is_err());
        assert!(StartFrom::try_from("latest").is_err());
    }

    fn pat(s: &str) -> TopicPattern {
        TopicPattern::parse("p", s).expect("valid pattern")
    }

    #[test]
    fn who_created_a_sink_is_not_part_of_its_definition() {
        let sink = |by: Option<&str>, routing: &str| Sink {
            target: SinkTarget::nats("s", "nats://127.0.0.1:4222", routing).expect("valid sink"),
            max_in_flight: 1,
            created_by: by.map(str::to_owned),
        };
        let spec = |s: Sink| ConsumerSpec {
            name: ConsumerName::parse("n", "to-nats").expect("valid name"),
            topics: vec![pat("orders.*")],
            max_deliveries: 10,
            backoff: Backoff { base: Duration::from_secs(1), max: Duration::from_secs(60) },
            ack_deadline: Duration::from_secs(30),
            start_from: StartFrom::New,
            sink: Some(s),
            dead_key_policy: DeadKeyPolicy::Skip,
        };
        let alice = spec(sink(Some("alice"), ""));
        assert_eq!(alice.first_difference(&spec(sink(Some("bob"), ""))), None);
        assert_eq!(alice.first_difference(&spec(sink(None, ""))), None);
        assert_eq!(alice.first_difference(&spec(sink(Some("alice"), "x.{topic}"))), Some("sink"));
        let holding = ConsumerSpec { dead_key_policy: DeadKeyPolicy::Hold, ..alice.clone() };
        assert_eq!(alice.first_difference(&holding), Some("dead_key_policy"));
    }

    /// The topic grammar of the client contract (contract/topics.json, ADR 0084): the vectors
    /// that outbox-client, the Python and TypeScript clients and the stores' SQL run too.
    #[test]
    fn topics_and_patterns_follow_the_client_contract() {
        let grammar: serde_json::Value =
            serde_json::from_str(include_str!("../../../contract/topics.json")).expect("contract/topics.json parses");
        assert_eq!(Some(Topic::MAX_LEN as u64), grammar["max_length"].as_u64());
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array().expect("a list").iter().map(|s| s.as_str().expect("a string").to_owned()).collect()
        };
        let (longest, too_long) = ("a".repeat(Topic::MAX_LEN), "a".repeat(Topic::MAX_LEN + 1));
        for t in strings(&grammar["topics"]["valid"]).into_iter().chain([longest.clone()]) {
            assert!(Topic::parse("topic", &t).is_ok(), "{t:?} is a topic");
            assert!(TopicPattern::parse("topics", &t).is_ok(), "a topic {t:?} is a pattern too");
        }
        for t in strings(&grammar["topics"]["invalid"]).into_iter().chain([too_long.clone()]) {
            assert_eq!(Topic::parse("topic", &t).map_err(|e| e.field), Err("topic".to_owned()), "{t:?}");
        }
        for p in strings(&grammar["patterns"]["valid"]).into_iter().chain([longest]) {
            assert!(TopicPattern::parse("topics", &p).is_ok(), "{p:?} is a pattern");
        }
        for p in strings(&grammar["patterns"]["invalid"]).into_iter().chain([too_long]) {
            assert!(TopicPattern::parse("topics", &p).is_err(), "{p:?} is no pattern");
        }
        for case in grammar["matches"].as_array().expect("matches") {
            let (p, t, want) =
                (case[0].as_str().expect("a pattern"), case[1].as_str().expect("a topic"), case[2].as_bool());
            assert_eq!(Some(pat(p).matches(t)), want, "{p:?} against {t:?}");
        }
    }

    #[test]
    fn bad_patterns_and_topics_name_the_field() {
        assert_eq!(TopicPattern::parse("topics[0]", "a.>.b").unwrap_err().field, "topics[0]");
        assert!(TopicPattern::parse("t", "a..b").is_err());
        assert!(TopicPattern::parse("t", "a.b c").is_err());
        assert!(Topic::parse("topic", "orders.*").is_err());
        assert!(Topic::parse("topic", "").is_err());
        assert!(Topic::parse("topic", "orders.created-v2").is_ok());
        assert!(ConsumerName::parse("consumer", "billing service").is_err());
        assert!(MessageId::parse("message_id", "nope").is_err());
    }
}

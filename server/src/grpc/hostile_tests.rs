//! Hostile input: arbitrary requests through every conversion from the wire into domain values
//! (`convert`, the replay plan, the domain parsers). None may panic; each result is checked
//! against an oracle written from the documented rules, so an accepted request keeps every
//! limit, a refused one breaks some rule, and the refusal names a field that really is at fault.
//! `server/fuzz` feeds the same entry points with raw protobuf bytes.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::time::Duration;

use outbox_proto::v1 as pb;
use proptest::prelude::*;
use tonic_types::StatusExt as _;

use super::admin::replay_plan;
use super::convert::{self, Limits, MAX_ACK_DEADLINE, MAX_MAX_IN_FLIGHT, MIN_ACK_DEADLINE};
use crate::domain::{ConsumerName, MessageId, Topic, TopicPattern};
use crate::limits::*;

const CASES: u32 = 192;
const LIMITS: Limits = Limits { max_payload_bytes: 64, max_batch: 1000 };

/// Strings near the rules: topic-like, around the length limits, and anything at all.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z0-9_-]{1,8}(\\.[a-z0-9_*>-]{0,8}){0,3}",
        "[ -~]{0,12}",
        any::<String>(),
        (250usize..=260).prop_map(|n| "a".repeat(n)),
        (120usize..=135).prop_map(|n| "é".repeat(n)),
    ]
}

/// Mostly valid values, so that a request often breaks one rule only and each rule is reached.
fn mostly<T: std::fmt::Debug + Clone + 'static>(
    valid: impl Strategy<Value = T> + 'static,
    any: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<T> {
    prop_oneof![4 => valid, 1 => any].boxed()
}

fn topic() -> BoxedStrategy<String> {
    mostly("[a-z0-9_-]{1,8}(\\.[a-z0-9_-]{1,8}){0,2}", text())
}

fn headers() -> impl Strategy<Value = HashMap<String, String>> {
    prop_oneof![
        3 => prop::collection::hash_map("[a-z-]{1,12}", "[ -~]{0,24}", 0..5),
        1 => prop::collection::hash_map(text(), text(), 0..4),
        // Many small entries: around the count limit.
        1 => (60usize..70).prop_map(|n| (0..n).map(|i| (format!("h{i}"), "v".into())).collect()),
        // Few large ones: around the byte limits.
        1 => (0usize..5, 250usize..260, 4000usize..4200).prop_map(|(n, k, v)| {
            (0..n).map(|i| (format!("{i}{}", "k".repeat(k)), "v".repeat(v))).collect()
        }),
    ]
}

fn pb_duration() -> BoxedStrategy<prost_types::Duration> {
    prop_oneof![
        3 => (0i64..200_000, 0i32..1_000_000_000).prop_map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }),
        1 => (any::<i64>(), any::<i32>()).prop_map(|(seconds, nanos)| prost_types::Duration { seconds, nanos }),
        1 => (0u64..4).prop_map(|h| prost_types::Duration { seconds: (h * 12 * 3600) as i64, nanos: 0 }),
    ]
    .boxed()
}

fn timestamp() -> impl Strategy<Value = prost_types::Timestamp> {
    (any::<i64>(), any::<i32>()).prop_map(|(seconds, nanos)| prost_types::Timestamp { seconds, nanos })
}

fn message_id() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        3 => Just(None),
        1 => text().prop_map(Some),
        1 => any::<u128>().prop_map(|n| Some(uuid::Uuid::from_u128(n).to_string())),
    ]
}

prop_compose! {
    fn enqueue_request()(
        topic in topic(), type_ in mostly("[A-Za-z.]{1,30}", text()), payload_len in 0usize..72,
        headers in headers(), message_id in message_id(),
        ordering_key in mostly(prop::option::of("[a-z0-9-]{0,20}"), prop::option::of(text())),
        delay in mostly(Just(None), prop::option::of(pb_duration())),
    ) -> pb::EnqueueRequest {
        pb::EnqueueRequest {
            topic, r#type: type_, payload: vec![0; payload_len], headers, message_id, ordering_key, delay,
        }
    }
}

fn duration_ok(d: &prost_types::Duration) -> bool {
    d.seconds >= 0 && (0..1_000_000_000).contains(&d.nanos)
}

fn dur(d: &prost_types::Duration) -> Duration {
    Duration::new(d.seconds as u64, d.nanos as u32)
}

/// The fields of an enqueue request that break a documented rule.
fn enqueue_faults(r: &pb::EnqueueRequest) -> Vec<&'static str> {
    let mut bad = Vec::new();
    if Topic::parse("topic", &r.topic).is_err() {
        bad.push("topic");
    }
    if r.r#type.trim().is_empty() || r.r#type.len() > MAX_TYPE_BYTES {
        bad.push("type");
    }
    if r.ordering_key.as_ref().is_some_and(|k| k.len() > MAX_ORDERING_KEY_BYTES) {
        bad.push("ordering_key");
    }
    let bytes: usize = r.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    if r.headers.len() > MAX_HEADERS
        || bytes > MAX_HEADERS_BYTES
        || r.headers.keys().any(|k| k.is_empty() || k.len() > MAX_HEADER_KEY_BYTES)
    {
        bad.push("headers");
    }
    if r.payload.len() > LIMITS.max_payload_bytes {
        bad.push("payload");
    }
    if r.message_id.as_deref().is_some_and(|s| !s.is_empty() && uuid::Uuid::parse_str(s.trim()).is_err()) {
        bad.push("message_id");
    }
    if r.delay.as_ref().is_some_and(|d| !duration_ok(d) || dur(d) > Duration::from_secs(366 * 24 * 3600)) {
        bad.push("delay");
    }
    bad
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn enqueue_requests_are_accepted_exactly_when_every_rule_holds(req in enqueue_request()) {
        let faults = enqueue_faults(&req);
        match convert::new_message("", req.clone(), &LIMITS) {
            Ok(m) => {
                prop_assert!(faults.is_empty(), "accepted although {faults:?} break the rules");
                prop_assert_eq!(m.topic.as_str(), req.topic.as_str());
                prop_assert_eq!(m.headers.len(), req.headers.len());
                prop_assert!(m.ordering_key.as_ref().is_none_or(|k| !k.is_empty()));
            }
            Err(e) => prop_assert!(faults.contains(&e.field.as_str()), "refused naming {:?} ({}), faults {faults:?}", e.field, e.reason),
        }
    }

    #[test]
    fn a_refused_message_of_a_batch_is_named_by_its_index(reqs in prop::collection::vec(enqueue_request(), 1..4)) {
        for (i, req) in reqs.into_iter().enumerate() {
            let faults = enqueue_faults(&req);
            let prefix = format!("messages[{i}]");
            if let Err(e) = convert::new_message(&prefix, req, &LIMITS) {
                let field = e.field.strip_prefix(&format!("{prefix}.")).unwrap_or("");
                prop_assert!(faults.contains(&field), "{:?} is not a fault of {faults:?}", e.field);
            }
        }
    }

    #[test]
    fn consumers_are_accepted_exactly_when_every_rule_holds(
        name in mostly("[a-z0-9_.-]{1,20}", text()),
        topics in prop_oneof![
            3 => prop::collection::vec("[a-z]{1,5}(\\.([a-z]{1,5}|\\*)){0,2}(\\.>)?", 1..4),
            1 => prop::collection::vec(text(), 0..4),
            1 => (95usize..110).prop_map(|n| (0..n).map(|i| format!("t{i}")).collect()),
        ],
        max_deliveries in mostly(0u32..20, any::<u32>()),
        backoff_base in mostly(prop::option::of((0u64..5_000).prop_map(|ms| prost_types::Duration { seconds: 0, nanos: (ms * 100_000) as i32 })), prop::option::of(pb_duration())),
        backoff_max in mostly(Just(None), prop::option::of(pb_duration())),
        ack_deadline in mostly(Just(None), prop::option::of(pb_duration())),
        start_from in mostly(0i32..2, any::<i32>()),
    ) {
        let c = pb::Consumer {
            name: name.clone(), topics: topics.clone(), max_deliveries, backoff_base, backoff_max, ack_deadline,
            start_from, ..Default::default()
        };
        match convert::consumer_spec(c) {
            Ok(spec) => {
                prop_assert!(ConsumerName::parse("n", &name).is_ok());
                prop_assert!(!spec.topics.is_empty() && spec.topics.len() <= MAX_CONSUMER_TOPICS);
                prop_assert!(topics.iter().all(|t| TopicPattern::parse("t", t).is_ok()));
                prop_assert!((1..=1_000_000).contains(&spec.max_deliveries));
                prop_assert!(spec.backoff.base <= spec.backoff.max && spec.backoff.max <= MAX_BACKOFF);
                prop_assert!((MIN_ACK_DEADLINE..=MAX_ACK_DEADLINE).contains(&spec.ack_deadline));
                prop_assert!((0..=1).contains(&start_from));
            }
            Err(e) => {
                let known = ["name", "topics", "max_deliveries", "backoff_base", "backoff_max", "ack_deadline", "start_from"];
                let field = e.field.strip_prefix("consumer.").unwrap_or("");
                let field = field.split('[').next().unwrap_or("");
                prop_assert!(known.contains(&field), "unknown field {:?}", e.field);
                // The named field is at fault, in the case this test can decide alone.
                if field == "name" { prop_assert!(ConsumerName::parse("n", &name).is_err()); }
                if field == "start_from" { prop_assert!(!(0..=1).contains(&start_from)); }
                if field == "topics" {
                    prop_assert!(topics.is_empty() || topics.len() > MAX_CONSUMER_TOPICS
                        || topics.iter().any(|t| TopicPattern::parse("t", t).is_err()));
                }
            }
        }
    }

    #[test]
    fn stream_starts_keep_their_bounds_or_name_the_field(
        consumer in mostly("[a-z0-9_.-]{1,20}", text()),
        max_in_flight in prop_oneof![0u32..20, 9_990u32..10_010, any::<u32>()],
        ack_deadline in mostly(Just(None), prop::option::of(pb_duration())),
    ) {
        let start = pb::Start { consumer: consumer.clone(), max_in_flight, ack_deadline };
        match convert::start_request(&start) {
            Ok(s) => {
                prop_assert_eq!(s.consumer.as_str(), consumer.as_str());
                prop_assert!((1..=MAX_MAX_IN_FLIGHT).contains(&s.max_in_flight));
                prop_assert!(s.ack_deadline.is_none_or(|d| (MIN_ACK_DEADLINE..=MAX_ACK_DEADLINE).contains(&d)));
            }
            Err(e) => prop_assert!(
                ["start.consumer", "start.max_in_flight", "start.ack_deadline"].contains(&e.field.as_str()),
                "unknown field {:?}", e.field
            ),
        }
    }

    #[test]
    fn replay_requests_become_a_plan_or_invalid_argument_naming_a_field(
        consumer in mostly("[a-z0-9_.-]{1,20}", text()),
        message_ids in prop::collection::vec(mostly(any::<u128>().prop_map(|n| uuid::Uuid::from_u128(n).to_string()), text()), 0..3),
        dead_letters in any::<bool>(),
        enqueued_after in prop::option::of(timestamp()),
        enqueued_before in prop::option::of(timestamp()),
        types in prop::collection::vec(mostly("[A-Za-z]{1,10}", text()), 0..3),
        topics in prop::collection::vec(mostly("[a-z]{1,5}(\\.[a-z*]{1,5})?", text()), 0..3),
        dry_run in any::<bool>(),
        max_per_second in any::<u32>(),
        last_error in mostly("[a-z ]{0,10}", text()),
    ) {
        let req = pb::ReplayRequest {
            consumer, message_ids: message_ids.clone(), dead_letters, enqueued_after, enqueued_before, types, topics,
            dry_run, allow_beyond_retention: false, max_per_second, last_error: last_error.clone(),
        };
        match replay_plan(req) {
            Ok(plan) => {
                prop_assert_eq!(plan.filter.message_ids.len(), message_ids.len());
                prop_assert!(!plan.filter.message_ids.is_empty() || plan.filter.dead_only
                    || plan.filter.enqueued_after.is_some() || plan.filter.enqueued_before.is_some());
                prop_assert!(plan.filter.last_error.is_none() || plan.filter.dead_only, "last_error without dead_letters");
            }
            Err(s) => {
                prop_assert_eq!(s.code(), tonic::Code::InvalidArgument);
                let bad = s.get_details_bad_request().expect("a BadRequest detail");
                prop_assert_eq!(bad.field_violations.len(), 1);
                let field = bad.field_violations[0].field.split('[').next().unwrap_or("").to_owned();
                let known = ["consumer", "selector", "message_ids", "enqueued_after", "enqueued_before", "types", "topics", "last_error"];
                prop_assert!(known.contains(&field.as_str()), "unknown field {:?}", bad.field_violations[0].field);
                prop_assert!(s.message().starts_with(&bad.field_violations[0].field));
            }
        }
    }

    #[test]
    fn domain_parsers_take_any_string(s in text(), topic in text()) {
        if let Ok(t) = Topic::parse("topic", &s) {
            prop_assert!(t.as_str().len() <= Topic::MAX_LEN && !t.as_str().contains(['*', '>']));
        }
        if let Ok(p) = TopicPattern::parse("topics[0]", &s) {
            // Matching never panics, and a pattern without wildcards matches exactly itself.
            let _ = p.matches(&topic);
            if !s.contains(['*', '>']) {
                prop_assert!(p.matches(&s));
                prop_assert_eq!(p.matches(&topic), topic == s);
            }
        }
        if let Ok(n) = ConsumerName::parse("consumer", &s) {
            prop_assert!(!n.as_str().is_empty() && n.as_str().len() <= ConsumerName::MAX_LEN);
        }
        for field in ["topic", "consumer", "message_id"] {
            let e = match field {
                "topic" => Topic::parse(field, &s).err(),
                "consumer" => ConsumerName::parse(field, &s).err(),
                _ => MessageId::parse(field, &s).err(),
            };
            if let Some(e) = e { prop_assert_eq!(e.field.as_str(), field); }
        }
        let _ = convert::duration("d", &prost_types::Duration { seconds: s.len() as i64, nanos: -1 });
    }

    #[test]
    fn durations_and_timestamps_from_the_wire_never_panic(d in pb_duration(), t in timestamp()) {
        match convert::duration("d", &d) {
            Ok(v) => prop_assert_eq!(convert::pb_duration(v), d),
            Err(e) => prop_assert_eq!(e.field.as_str(), "d"),
        }
        if let Err(e) = convert::time("t", &t) { prop_assert_eq!(e.field.as_str(), "t"); }
    }
}

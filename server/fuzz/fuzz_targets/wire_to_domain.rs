//! Raw protobuf bytes, as a client could send them, through every conversion of a request into
//! domain values. The first byte picks the request type; the rest is decoded as that message
//! (bytes that do not decode are what tonic refuses before any handler runs). A conversion may
//! accept or refuse, never panic; a refusal names a field, and an accepted value keeps the limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use outbox_proto::v1 as pb;
use outbox_server::domain::TopicPattern;
use outbox_server::grpc::admin::replay_plan;
use outbox_server::grpc::convert::{self, Limits};
use outbox_server::limits;
use prost::Message as _;
use tonic_types::StatusExt as _;

const LIMITS: Limits = Limits { max_payload_bytes: 1024 * 1024, max_batch: 1000 };

fn enqueue(prefix: &str, req: pb::EnqueueRequest) {
    match convert::new_message(prefix, req, &LIMITS) {
        Ok(m) => {
            assert!(!m.type_.trim().is_empty() && m.type_.len() <= limits::MAX_TYPE_BYTES);
            assert!(m.ordering_key.as_ref().is_none_or(|k| !k.is_empty() && k.len() <= limits::MAX_ORDERING_KEY_BYTES));
            assert!(m.headers.len() <= limits::MAX_HEADERS);
            assert!(m.headers.keys().all(|k| !k.is_empty() && k.len() <= limits::MAX_HEADER_KEY_BYTES));
            assert!(m.headers.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() <= limits::MAX_HEADERS_BYTES);
            assert!(m.payload.len() <= LIMITS.max_payload_bytes);
        }
        Err(e) => assert!(e.field.starts_with(prefix) && e.field.len() > prefix.len(), "{e:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else { return };
    match which % 6 {
        0 => {
            if let Ok(req) = pb::EnqueueRequest::decode(bytes) {
                enqueue("", req);
            }
        }
        1 => {
            if let Ok(req) = pb::EnqueueBatchRequest::decode(bytes) {
                for (i, m) in req.messages.into_iter().enumerate() {
                    enqueue(&format!("messages[{i}]"), m);
                }
            }
        }
        2 => {
            if let Ok(pb::CreateConsumerRequest { consumer: Some(c) }) = pb::CreateConsumerRequest::decode(bytes) {
                match convert::consumer_spec(c) {
                    Ok(spec) => {
                        assert!(!spec.topics.is_empty() && spec.topics.len() <= limits::MAX_CONSUMER_TOPICS);
                        assert!(spec.backoff.base <= spec.backoff.max && spec.backoff.max <= limits::MAX_BACKOFF);
                    }
                    Err(e) => assert!(e.field.starts_with("consumer."), "{e:?}"),
                }
            }
        }
        3 => {
            if let Ok(pb::SubscribeRequest { request: Some(pb::subscribe_request::Request::Start(s)) }) =
                pb::SubscribeRequest::decode(bytes)
            {
                match convert::start_request(&s) {
                    Ok(s) => assert!((1..=convert::MAX_MAX_IN_FLIGHT).contains(&s.max_in_flight)),
                    Err(e) => assert!(e.field.starts_with("start."), "{e:?}"),
                }
            }
        }
        4 => {
            if let Ok(req) = pb::ReplayRequest::decode(bytes)
                && let Err(s) = replay_plan(req)
            {
                assert_eq!(s.code(), tonic::Code::InvalidArgument);
                let bad = s.get_details_bad_request().expect("a BadRequest detail");
                assert!(bad.field_violations.iter().all(|v| !v.field.is_empty()));
            }
        }
        _ => {
            if let Ok(req) = pb::TailRequest::decode(bytes) {
                for (i, t) in req.topics.iter().enumerate() {
                    let field = format!("topics[{i}]");
                    if let Err(e) = TopicPattern::parse(&field, t) {
                        assert_eq!(e.field, field);
                    }
                }
            }
        }
    }
});

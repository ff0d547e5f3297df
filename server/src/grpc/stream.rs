//! The `Subscribe` stream at the edge: each `SubscribeRequest` after `start` becomes a
//! validated [`Command`], and each leased delivery becomes its wire form. The session loop
//! ([`crate::delivery::session`]) sees only commands, never `pb`.
use std::time::Duration;

use outbox_proto::v1 as pb;
use tonic::Status;

use super::convert::{duration, timestamp};
use super::invalid;
use crate::delivery::session::Rejected;
use crate::domain::{InvalidField, LeasedDelivery, MessageId};

/// The most message ids one `ack` or `extend` may carry.
pub const MAX_IDS_PER_REQUEST: usize = 10_000;
/// The longest `retry_after` a nack may ask for.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);
/// The longest ack deadline or extension a stream may ask for.
pub const MAX_ACK_DEADLINE: Duration = Duration::from_secs(24 * 3600);
/// Stored `last_error` texts are cut to this many bytes.
pub const MAX_ERROR_BYTES: usize = 4096;

/// What a client asks of its stream once it has started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// The handler finished these: never deliver them to this consumer again.
    Ack(Vec<MessageId>),
    /// The handler failed: retry after `retry_after`, or the consumer's backoff when `None`.
    Nack { id: MessageId, error: String, retry_after: Option<Duration> },
    /// Still working on these: hold the leases for `deadline` from now.
    Extend { ids: Vec<MessageId>, deadline: Duration },
    /// Nothing to do (a request whose ids were all malformed, for example).
    Nothing,
}

/// Turns one request into a command. A malformed id in an ack, nack or extend is logged and
/// skipped (the rest of the request still counts: an ack must not be lost for a neighbour's
/// typo); a request that cannot mean anything is `INVALID_ARGUMENT` naming the field.
pub fn parse(req: pb::SubscribeRequest) -> Result<Command, Status> {
    use pb::subscribe_request::Request;
    match req.request {
        Some(Request::Start(_)) => {
            Err(invalid(InvalidField::new("start", "the stream has already started; send start only once")))
        }
        Some(Request::Ack(ack)) => {
            let ids = ids("ack.message_ids", &ack.message_ids)?;
            Ok(if ids.is_empty() { Command::Nothing } else { Command::Ack(ids) })
        }
        Some(Request::Nack(nack)) => {
            let Some(id) = ids("nack.message_id", std::slice::from_ref(&nack.message_id))?.pop() else {
                return Ok(Command::Nothing);
            };
            let retry_after = match &nack.retry_after {
                None => None,
                Some(d) => Some(duration("nack.retry_after", d).map_err(invalid)?.min(MAX_RETRY_AFTER)),
            };
            let error = if nack.error.is_empty() { "nacked".to_owned() } else { truncate(nack.error, MAX_ERROR_BYTES) };
            Ok(Command::Nack { id, error, retry_after })
        }
        Some(Request::Extend(ext)) => {
            let deadline = match &ext.deadline {
                Some(d) => duration("extend.deadline", d).map_err(invalid)?,
                None => Duration::ZERO,
            };
            if deadline.is_zero() {
                return Err(invalid(InvalidField::new("extend.deadline", "a positive duration is required")));
            }
            if deadline > MAX_ACK_DEADLINE {
                return Err(invalid(InvalidField::new(
                    "extend.deadline",
                    format!("at most 24 hours ({}s), got {}s", MAX_ACK_DEADLINE.as_secs(), deadline.as_secs()),
                )));
            }
            let ids = ids("extend.message_ids", &ext.message_ids)?;
            Ok(if ids.is_empty() { Command::Nothing } else { Command::Extend { ids, deadline } })
        }
        None => Err(invalid(InvalidField::new("request", "one of start, ack, nack, extend is required"))),
    }
}

fn ids(field: &str, raw: &[String]) -> Result<Vec<MessageId>, Status> {
    if raw.len() > MAX_IDS_PER_REQUEST {
        return Err(invalid(InvalidField::new(
            field,
            format!("at most {MAX_IDS_PER_REQUEST} ids per request, got {}", raw.len()),
        )));
    }
    Ok(raw
        .iter()
        .filter_map(|s| match MessageId::parse(field, s) {
            Ok(id) => Some(id),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring malformed message id from stream");
                None
            }
        })
        .collect())
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

/// A leased delivery as the stream sends it.
pub fn delivery(d: LeasedDelivery) -> pb::SubscribeResponse {
    let m = d.message;
    let delivery = pb::Delivery {
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
    };
    pb::SubscribeResponse { response: Some(pb::subscribe_response::Response::Delivery(delivery)) }
}

/// A stream's commands, ended by `revoked`: once it resolves (its caller's credential or
/// permission was revoked), the session gets `Rejected::Invalid` with that status, which ends
/// the stream with it and releases what it held, and then no more commands. Until then the
/// commands pass through as they come, their end included.
pub fn until_revoked<S>(
    commands: S,
    revoked: impl std::future::Future<Output = Status> + Send + 'static,
) -> UntilRevoked<S> {
    UntilRevoked { commands, revoked: Some(Box::pin(revoked)) }
}

pub struct UntilRevoked<S> {
    commands: S,
    /// `None` once it has resolved: the stream has ended.
    revoked: Option<std::pin::Pin<Box<dyn std::future::Future<Output = Status> + Send>>>,
}

impl<S> futures::Stream for UntilRevoked<S>
where
    S: futures::Stream<Item = Result<Command, Rejected>> + Unpin,
{
    type Item = Result<Command, Rejected>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let Some(revoked) = self.revoked.as_mut() else { return std::task::Poll::Ready(None) };
        if let std::task::Poll::Ready(status) = revoked.as_mut().poll(cx) {
            self.revoked = None;
            return std::task::Poll::Ready(Some(Err(Rejected::Invalid(status))));
        }
        std::pin::Pin::new(&mut self.commands).poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::subscribe_request::Request;

    fn req(r: Request) -> pb::SubscribeRequest {
        pb::SubscribeRequest { request: Some(r) }
    }

    fn message(status: &Status) -> &str {
        status.message()
    }

    #[test]
    fn a_second_start_is_invalid_argument() {
        let s = parse(req(Request::Start(pb::Start::default()))).unwrap_err();
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert!(message(&s).starts_with("start:"), "{}", message(&s));
    }

    #[test]
    fn an_empty_request_names_the_field() {
        let s = parse(pb::SubscribeRequest { request: None }).unwrap_err();
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert!(message(&s).starts_with("request:"));
    }

    #[test]
    fn acks_keep_their_good_ids_and_skip_malformed_ones() {
        let a = MessageId(uuid::Uuid::new_v4());
        let cmd = parse(req(Request::Ack(pb::Ack { message_ids: vec!["nope".into(), a.to_string()] })));
        assert_eq!(cmd.unwrap(), Command::Ack(vec![a]));
        let cmd = parse(req(Request::Ack(pb::Ack { message_ids: vec!["nope".into()] })));
        assert_eq!(cmd.unwrap(), Command::Nothing);
    }

    #[test]
    fn too_many_ids_name_the_limit_and_the_count() {
        let ids = vec![MessageId(uuid::Uuid::new_v4()).to_string(); MAX_IDS_PER_REQUEST + 1];
        let s = parse(req(Request::Ack(pb::Ack { message_ids: ids.clone() }))).unwrap_err();
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert!(
            message(&s).contains("ack.message_ids") && message(&s).contains("10000") && message(&s).contains("10001")
        );
        let ext = pb::Extend { message_ids: ids, deadline: Some(prost_types::Duration { seconds: 5, nanos: 0 }) };
        let s = parse(req(Request::Extend(ext))).unwrap_err();
        assert!(message(&s).contains("extend.message_ids"), "{}", message(&s));
        let ok = vec![MessageId(uuid::Uuid::new_v4()).to_string(); MAX_IDS_PER_REQUEST];
        assert!(
            matches!(parse(req(Request::Ack(pb::Ack { message_ids: ok }))), Ok(Command::Ack(v)) if v.len() == MAX_IDS_PER_REQUEST)
        );
    }

    #[test]
    fn nacks_cap_retry_after_cut_long_errors_and_reject_negative_waits() {
        let id = MessageId(uuid::Uuid::new_v4());
        let nack = |retry_after, error: String| {
            parse(req(Request::Nack(pb::Nack { message_id: id.to_string(), error, retry_after })))
        };
        let day2 = prost_types::Duration { seconds: 2 * 86_400, nanos: 0 };
        match nack(Some(day2), "é".repeat(3000)).unwrap() {
            Command::Nack { id: got, error, retry_after } => {
                assert_eq!(got, id);
                assert_eq!(retry_after, Some(MAX_RETRY_AFTER));
                assert!(error.len() <= MAX_ERROR_BYTES && error.len() >= MAX_ERROR_BYTES - 1);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(nack(None, String::new()).unwrap(), Command::Nack { id, error: "nacked".into(), retry_after: None });
        let s = nack(Some(prost_types::Duration { seconds: -1, nanos: 0 }), String::new()).unwrap_err();
        assert!(message(&s).starts_with("nack.retry_after:"), "{}", message(&s));
    }

    #[test]
    fn extends_need_a_positive_deadline_of_at_most_24_hours() {
        let id = MessageId(uuid::Uuid::new_v4());
        let ext = |seconds| {
            parse(req(Request::Extend(pb::Extend {
                message_ids: vec![id.to_string()],
                deadline: Some(prost_types::Duration { seconds, nanos: 0 }),
            })))
        };
        assert_eq!(ext(30).unwrap(), Command::Extend { ids: vec![id], deadline: Duration::from_secs(30) });
        for bad in [0, -5, 24 * 3600 + 1] {
            let s = ext(bad).unwrap_err();
            assert!(message(&s).starts_with("extend.deadline:"), "{bad}: {}", message(&s));
        }
    }

    mod hostile {
        use proptest::prelude::*;

        use super::*;

        fn id() -> impl Strategy<Value = String> {
            prop_oneof![
                Just(String::new()),
                "[ -~]{0,40}",
                any::<u128>().prop_map(|n| uuid::Uuid::from_u128(n).to_string()),
            ]
        }

        fn duration() -> impl Strategy<Value = Option<prost_types::Duration>> {
            proptest::option::of(
                (any::<i64>(), any::<i32>())
                    .prop_map(|(seconds, nanos)| prost_types::Duration { seconds: seconds % (3 * 24 * 3600), nanos }),
            )
        }

        fn request() -> impl Strategy<Value = pb::SubscribeRequest> {
            let ids = || proptest::collection::vec(id(), 0..20);
            prop_oneof![
                Just(None),
                Just(Some(Request::Start(pb::Start::default()))),
                ids().prop_map(|message_ids| Some(Request::Ack(pb::Ack { message_ids }))),
                (id(), any::<String>(), duration()).prop_map(|(message_id, error, retry_after)| Some(Request::Nack(
                    pb::Nack { message_id, error, retry_after }
                ))),
                (ids(), duration())
                    .prop_map(|(message_ids, deadline)| Some(Request::Extend(pb::Extend { message_ids, deadline }))),
            ]
            .prop_map(|request| pb::SubscribeRequest { request })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// No request panics; a refusal is INVALID_ARGUMENT naming the part at fault; an
            /// accepted one keeps every bound: only well-formed ids, a capped retry, a positive
            /// deadline within 24 hours, an error text within its size.
            #[test]
            fn every_stream_request_is_a_command_or_names_its_fault(req in request()) {
                let kind = req.request.as_ref().map(|r| match r {
                    Request::Start(_) => "start",
                    Request::Ack(_) => "ack.message_ids",
                    Request::Nack(_) => "nack.",
                    Request::Extend(_) => "extend.",
                });
                match parse(req.clone()) {
                    Err(status) => {
                        prop_assert_eq!(status.code(), tonic::Code::InvalidArgument);
                        prop_assert!(status.message().starts_with(kind.unwrap_or("request")), "{}", status.message());
                    }
                    Ok(Command::Ack(ids)) => prop_assert!(!ids.is_empty() && ids.len() <= MAX_IDS_PER_REQUEST),
                    Ok(Command::Nack { error, retry_after, .. }) => {
                        prop_assert!(!error.is_empty() && error.len() <= MAX_ERROR_BYTES);
                        prop_assert!(retry_after.is_none_or(|d| d <= MAX_RETRY_AFTER));
                    }
                    Ok(Command::Extend { ids, deadline }) => {
                        prop_assert!(!ids.is_empty());
                        prop_assert!(!deadline.is_zero() && deadline <= MAX_ACK_DEADLINE);
                    }
                    Ok(Command::Nothing) => prop_assert!(matches!(
                        req.request,
                        Some(Request::Ack(_) | Request::Nack(_) | Request::Extend(_))
                    )),
                }
            }
        }
    }
}

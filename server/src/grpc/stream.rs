//! The `Subscribe` stream at the edge: each `SubscribeRequest` after `start` becomes a
//! validated [`Command`], each leased delivery its wire form, and each way the session ends a
//! stream its status. The session loop ([`crate::delivery::session`]) sees only commands, never
//! `pb` or a status; a stream the edge refuses is ended here ([`commands`]).
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use outbox_proto::v1 as pb;
use tonic::Status;

use super::convert::{MAX_ACK_DEADLINE, duration, timestamp};
use super::invalid;
use crate::delivery::Command;
use crate::delivery::session::{Broken, Incoming, StreamError};
use crate::domain::{InvalidField, LeasedDelivery, MessageId};

/// The most message ids one `ack` or `extend` may carry.
pub const MAX_IDS_PER_REQUEST: usize = 10_000;
/// The longest `retry_after` a nack may ask for.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);
/// Stored `last_error` texts are cut to this many bytes.
pub const MAX_ERROR_BYTES: usize = 4096;

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

/// How the session's end of a stream reaches the client.
pub fn status(e: StreamError) -> Status {
    match e {
        StreamError::ShuttingDown => Status::unavailable(e.to_string()),
        StreamError::ConsumerDeleted(_) => Status::not_found(e.to_string()),
    }
}

/// A stream's requests as its session's commands: each one parsed ([`parse`]), a transport
/// error passed on as [`Broken`]. The first request that means nothing, or `revoked` resolving
/// (its caller's credential or permission was revoked), ends the commands there: the session
/// ends as for a clean close (it releases what it holds, counting it against nothing), and the
/// [`Refusal`] then ends the client's stream with that status, after what the session sent.
pub fn commands<S>(requests: S, revoked: impl Future<Output = Status> + Send + 'static) -> (Commands<S>, Refusal)
where
    S: Stream<Item = Result<pb::SubscribeRequest, Status>> + Unpin,
{
    let refusal = Refusal::default();
    (Commands { requests, revoked: Some(Box::pin(revoked)), refusal: refusal.clone() }, refusal)
}

/// See [`commands`].
pub struct Commands<S> {
    requests: S,
    /// `None` once the commands have ended.
    revoked: Option<Pin<Box<dyn Future<Output = Status> + Send>>>,
    refusal: Refusal,
}

impl<S> Commands<S> {
    /// Ends the commands; the client's stream ends with `status`.
    fn refuse(&mut self, status: Status) -> Option<Incoming> {
        self.revoked = None;
        *self.refusal.slot() = Some(status);
        None
    }
}

impl<S> Stream for Commands<S>
where
    S: Stream<Item = Result<pb::SubscribeRequest, Status>> + Unpin,
{
    type Item = Incoming;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Incoming>> {
        let this = self.get_mut();
        let Some(revoked) = this.revoked.as_mut() else { return Poll::Ready(None) };
        if let Poll::Ready(status) = revoked.as_mut().poll(cx) {
            return Poll::Ready(this.refuse(status));
        }
        Poll::Ready(match ready!(Pin::new(&mut this.requests).poll_next(cx)) {
            Some(Ok(req)) => match parse(req) {
                Ok(command) => Some(Ok(command)),
                Err(status) => this.refuse(status),
            },
            Some(Err(status)) => Some(Err(Broken(status.to_string()))),
            None => {
                this.revoked = None;
                None
            }
        })
    }
}

/// The status that ends a client's stream whose commands were refused (see [`commands`]).
#[derive(Debug, Clone, Default)]
pub struct Refusal(Arc<Mutex<Option<Status>>>);

impl Refusal {
    fn slot(&self) -> MutexGuard<'_, Option<Status>> {
        // One value, written whole: a panic elsewhere cannot leave it half-written.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What follows the session's last response: the refusal's status, if there was one. Read
    /// once the session has ended, which is after it saw its commands end.
    pub fn ending(self) -> impl Stream<Item = Result<pb::SubscribeResponse, Status>> {
        futures::stream::once(async move { self.slot().take() })
            .filter_map(|refused| std::future::ready(refused.map(Err)))
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

    mod refusals {
        use super::*;

        fn ack(id: MessageId) -> Result<pb::SubscribeRequest, Status> {
            Ok(req(Request::Ack(pb::Ack { message_ids: vec![id.to_string()] })))
        }

        #[tokio::test]
        async fn a_request_that_means_nothing_ends_the_commands_then_the_clients_stream_with_its_status() {
            let id = MessageId(uuid::Uuid::new_v4());
            let requests = futures::stream::iter(vec![ack(id), Ok(req(Request::Start(pb::Start::default()))), ack(id)]);
            let (cmds, refusal) = commands(requests, std::future::pending::<Status>());
            let got: Vec<Incoming> = cmds.collect().await;
            assert_eq!(got, vec![Ok(Command::Ack(vec![id]))], "the commands before it apply, none after it");
            let ending: Vec<_> = refusal.ending().collect().await;
            match &ending[..] {
                [Err(s)] => {
                    assert_eq!(s.code(), tonic::Code::InvalidArgument);
                    assert!(message(s).starts_with("start:"), "{}", message(s));
                }
                other => panic!("{other:?}"),
            }
        }

        #[tokio::test]
        async fn a_revoked_permission_ends_the_commands_and_the_clients_stream_with_its_status() {
            let requests = futures::stream::pending::<Result<pb::SubscribeRequest, Status>>();
            let (cmds, refusal) = commands(requests, std::future::ready(Status::permission_denied("revoked")));
            assert!(cmds.collect::<Vec<_>>().await.is_empty());
            let ending: Vec<_> = refusal.ending().collect().await;
            assert!(matches!(&ending[..], [Err(s)] if s.code() == tonic::Code::PermissionDenied), "{ending:?}");
        }

        #[tokio::test]
        async fn a_transport_error_is_a_broken_stream_not_a_refusal() {
            let requests = futures::stream::iter(vec![Err(Status::unknown("connection reset"))]);
            let (cmds, refusal) = commands(requests, std::future::pending::<Status>());
            let got: Vec<Incoming> = cmds.collect().await;
            assert!(matches!(&got[..], [Err(Broken(why))] if why.contains("connection reset")), "{got:?}");
            assert!(refusal.ending().collect::<Vec<_>>().await.is_empty(), "the session ends it, not the edge");
        }

        #[test]
        fn the_sessions_errors_reach_the_client_as_before() {
            let s = status(StreamError::ShuttingDown);
            assert_eq!((s.code(), s.message()), (tonic::Code::Unavailable, "outboxd is shutting down; reconnect"));
            let s = status(StreamError::ConsumerDeleted("c".into()));
            assert_eq!((s.code(), s.message()), (tonic::Code::NotFound, "consumer \"c\" was deleted"));
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

//! `service Outbox`: Enqueue, EnqueueBatch and Subscribe.

use futures::StreamExt;
use outbox_proto::v1 as pb;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::auth::{self, Need};
use super::convert::{self, Limits};
use super::stream;
use super::{invalid, store_status};
use crate::delivery::session::{Session, SessionContext, SessionStart};
use crate::domain::InvalidField;
use crate::limits::QuotaKey;

pub use super::convert::{DEFAULT_MAX_IN_FLIGHT, MAX_MAX_IN_FLIGHT, MIN_ACK_DEADLINE};

#[derive(Debug, Clone)]
pub struct OutboxService {
    pub ctx: SessionContext,
    pub limits: Limits,
    pub streams: crate::limits::StreamLimiter,
}

#[tonic::async_trait]
impl pb::outbox_server::Outbox for OutboxService {
    async fn enqueue(&self, request: Request<pb::EnqueueRequest>) -> Result<Response<pb::EnqueueResponse>, Status> {
        let caller = auth::caller(&request)?;
        let msg = convert::new_message("", request.into_inner(), &self.limits).map_err(invalid)?;
        caller.check(Need::Produce(msg.topic.as_str()))?;
        let out = self.ctx.waking().enqueue(&msg, self.ctx.clock.now()).await.map_err(store_status)?;
        Ok(Response::new(pb::EnqueueResponse {
            message_id: out.message_id.to_string(),
            seq: out.seq,
            duplicate: out.duplicate,
        }))
    }

    async fn enqueue_batch(
        &self,
        request: Request<pb::EnqueueBatchRequest>,
    ) -> Result<Response<pb::EnqueueBatchResponse>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.into_inner();
        if req.messages.is_empty() {
            return Err(invalid(InvalidField::new("messages", "at least one message is required")));
        }
        if req.messages.len() > self.limits.max_batch {
            return Err(invalid(InvalidField::new(
                "messages",
                format!("{} messages; at most {} per batch", req.messages.len(), self.limits.max_batch),
            )));
        }
        let msgs = req
            .messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| convert::new_message(&format!("messages[{i}]"), m, &self.limits))
            .collect::<Result<Vec<_>, _>>()
            .map_err(invalid)?;
        // Each distinct topic once: a batch is allowed whole or refused whole.
        let mut topics: Vec<&str> = msgs.iter().map(|m| m.topic.as_str()).collect();
        topics.sort_unstable();
        topics.dedup();
        for t in topics {
            caller.check(Need::Produce(t))?;
        }
        let out = self.ctx.waking().enqueue_batch(&msgs, self.ctx.clock.now()).await.map_err(store_status)?;
        Ok(Response::new(pb::EnqueueBatchResponse {
            results: out
                .into_iter()
                .map(|e| pb::EnqueueResponse {
                    message_id: e.message_id.to_string(),
                    seq: e.seq,
                    duplicate: e.duplicate,
                })
                .collect(),
        }))
    }

    type SubscribeStream = futures::stream::BoxStream<'static, Result<pb::SubscribeResponse, Status>>;

    /// Validates the `start` before answering, so a client whose call returned knows its
    /// stream is attached (or got NOT_FOUND / INVALID_ARGUMENT).
    async fn subscribe(
        &self,
        request: Request<Streaming<pb::SubscribeRequest>>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        if self.ctx.shutdown.is_cancelled() {
            return Err(Status::unavailable("outboxd is shutting down; reconnect"));
        }
        let caller = auth::caller(&request)?;
        // Counted against its principal from the first byte: a stream waiting for its start
        // holds a place of its own tenant's quota, never one of the process's.
        let mine = self.streams.acquire_principal(request.extensions().get::<QuotaKey>())?;
        let peer = request.remote_addr();
        let mut inbound = request.into_inner();
        let start_timeout = self.streams.limits().request_body_timeout;
        let first = match tokio::time::timeout(start_timeout, inbound.next()).await {
            Err(_) => {
                return Err(invalid(InvalidField::new(
                    "start",
                    format!("no start request within {start_timeout:?} (--request-body-timeout)"),
                )));
            }
            Ok(Some(Ok(req))) => req,
            Ok(Some(Err(status))) => return Err(status),
            Ok(None) => return Err(invalid(InvalidField::new("start", "the stream closed before start"))),
        };
        let Some(pb::subscribe_request::Request::Start(start)) = first.request else {
            return Err(invalid(InvalidField::new("start", "the first request on a stream must be start")));
        };
        let start = convert::start_request(&start).map_err(invalid)?;
        // Before the lookup: a caller without the permission learns nothing of the consumer.
        caller.check(Need::Consume(start.consumer.as_str()))?;
        // A place of the process and of the connection only once the start is authorised.
        let permit = self.streams.acquire(peer)?;
        let consumer = self.ctx.store.consumer_get(&start.consumer).await.map_err(store_status)?;
        caller.check_creator(&consumer)?;
        if let Some(sink) = &consumer.spec.sink {
            return Err(Status::failed_precondition(format!(
                "consumer {:?} is a {} sink: outboxd delivers it itself, so it takes no Subscribe streams",
                consumer.spec.name.as_str(),
                sink.kind()
            )));
        }
        let max_in_flight = start.max_in_flight;
        let ack_deadline = start.ack_deadline.unwrap_or(consumer.spec.ack_deadline);
        let ack_deadline = ack_deadline.max(MIN_ACK_DEADLINE);
        let (tx, rx) = tokio::sync::mpsc::channel(max_in_flight as usize + 1);
        let watched = consumer.clone();
        let bytes = mine.in_flight_bytes().map(|budget| crate::hub::InFlightBytes {
            budget,
            unit: crate::limits::delivery_unit(self.limits.max_payload_bytes),
        });
        let session =
            Session::new(self.ctx.clone(), SessionStart { consumer, max_in_flight, ack_deadline, bytes }).of_client();
        // The session sees commands, never the wire; a request that means nothing, or a
        // reloaded auth file that takes the caller's permission away, ends the stream.
        let revoked = async move { caller.revoked_consuming(&watched).await };
        let (commands, refusal) = stream::commands(inbound, revoked);
        self.ctx.tasks.spawn(async move {
            let _permits = (permit, mine);
            session.run(commands, tx).await
        });
        let sent = ReceiverStream::new(rx).map(|d| d.map(stream::delivery).map_err(stream::status));
        Ok(Response::new(sent.chain(refusal.ending()).boxed()))
    }
}

//! Connecting to outboxd over gRPC.
use std::collections::BTreeMap;
use std::time::Duration;

use outbox_proto::v1 as pb;
use tonic::transport::{Channel, Endpoint};
use tracing::Instrument as _;

use crate::{ClientError, Enqueued, Message};

pub type AdminClient = pb::outbox_admin_client::OutboxAdminClient<Channel>;
pub type OutboxClient = pb::outbox_client::OutboxClient<Channel>;

/// Deliveries may carry payloads up to the server's limit (64 MiB at most).
pub const MAX_MESSAGE_BYTES: usize = 80 * 1024 * 1024;

/// Connects a channel to `endpoint` (`http://host:port`, or `host:port`).
pub async fn connect(endpoint: &str) -> Result<Channel, ClientError> {
    let uri = if endpoint.contains("://") { endpoint.to_owned() } else { format!("http://{endpoint}") };
    Endpoint::from_shared(uri.clone())
        .map_err(|_| ClientError::Endpoint(endpoint.to_owned()))?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true)
        .connect()
        .await
        .map_err(|source| ClientError::Connect { endpoint: uri, source })
}

/// The admin client (consumers, stats, dead letters, replay).
pub async fn admin(endpoint: &str) -> Result<AdminClient, ClientError> {
    Ok(AdminClient::new(connect(endpoint).await?).max_decoding_message_size(MAX_MESSAGE_BYTES))
}

/// The producer/consumer client.
pub async fn outbox(endpoint: &str) -> Result<OutboxClient, ClientError> {
    Ok(OutboxClient::new(connect(endpoint).await?).max_decoding_message_size(MAX_MESSAGE_BYTES))
}

/// Enqueues over gRPC, for producers without access to the database. Not transactional with
/// anything of the caller's: prefer [`crate::enqueue`] where the database is shared.
///
/// Like [`crate::enqueue`], runs in an `outbox.enqueue` span whose trace context the message
/// carries in its `traceparent` header.
pub async fn enqueue_rpc(client: &mut OutboxClient, msg: &Message) -> Result<Enqueued, ClientError> {
    let span = tracing::info_span!("outbox.enqueue", otel.kind = "producer", topic = %msg.topic, r#type = %msg.type_);
    let mut request = to_request(msg);
    let mut headers: BTreeMap<String, String> = std::mem::take(&mut request.headers).into_iter().collect();
    crate::trace::inject(&span, &mut headers);
    request.headers = headers.into_iter().collect();
    let resp = client.enqueue(request).instrument(span).await?.into_inner();
    Ok(Enqueued {
        message_id: resp
            .message_id
            .parse()
            .map_err(|_| ClientError::Endpoint("server returned a malformed message_id".into()))?,
        seq: resp.seq,
        duplicate: resp.duplicate,
    })
}

pub fn to_request(msg: &Message) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        topic: msg.topic.clone(),
        r#type: msg.type_.clone(),
        payload: msg.payload.clone(),
        headers: msg.headers.clone().into_iter().collect(),
        message_id: msg.message_id.map(|u| u.to_string()),
        ordering_key: msg.ordering_key.clone(),
        delay: msg.delay.map(|d| prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }),
    }
}

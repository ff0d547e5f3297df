//! The subscriber runtime: one `Subscribe` stream, a handler per delivery.
//!
//! Returning `Ok` from the handler acks the delivery; an error nacks it with the error's text
//! (retried after the consumer's backoff, dead after `max_deliveries`). A handler that runs
//! longer than the ack deadline keeps its lease: the subscriber extends it every half lease. Handlers run
//! concurrently, at most `concurrency` at once. Lost connections are re-established with
//! exponential backoff; errors that retrying cannot fix (an unknown consumer, a bad request)
//! end [`Subscriber::run`].
//!
//! Stopping: cancel the token. No new handler starts; running handlers finish and their acks
//! are sent; then the stream is closed, and outboxd releases anything it had sent that was not
//! handled, so it is redelivered at once.
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_proto::v1 as pb;
use sqlx::Executor;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::{ClientError, grpc, store};

/// What a handler returns on failure; its text becomes the nack's `error`.
pub type HandlerError = Box<dyn std::error::Error + Send + Sync>;

/// One delivery handed to a handler.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub consumer: String,
    pub message_id: Uuid,
    pub seq: i64,
    pub topic: String,
    pub type_: String,
    pub payload: Vec<u8>,
    pub headers: HashMap<String, String>,
    pub ordering_key: Option<String>,
    pub enqueued_at: Option<DateTime<Utc>>,
    /// 1 on the first delivery to this consumer.
    pub delivery_count: u32,
    pub ack_deadline: Option<DateTime<Utc>>,
}

impl Delivery {
    /// Transactional ack (see [`store::ack_in_tx`]): call it on the transaction that performs
    /// the effect, in outboxd's database, and propagate its error with `?`.
    pub async fn ack_in<'e, DB, E>(&'e self, exec: E) -> Result<(), ClientError>
    where
        DB: store::OutboxDatabase,
        E: Executor<'e, Database = DB> + 'e,
    {
        store::ack_in_tx(exec, &self.consumer, self.message_id).await
    }

    fn from_pb(consumer: &str, d: pb::Delivery) -> Option<Self> {
        let ts = |t: Option<prost_types::Timestamp>| {
            t.and_then(|t| DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).unwrap_or(0)))
        };
        Some(Self {
            consumer: consumer.to_owned(),
            message_id: d.message_id.parse().ok()?,
            seq: d.seq,
            topic: d.topic,
            type_: d.r#type,
            payload: d.payload,
            headers: d.headers,
            ordering_key: Some(d.ordering_key).filter(|k| !k.is_empty()),
            enqueued_at: ts(d.enqueued_at),
            delivery_count: d.delivery_count,
            ack_deadline: ts(d.ack_deadline),
        })
    }
}

/// How a [`Subscriber`] connects and consumes.
#[derive(Debug, Clone)]
pub struct SubscriberConfig {
    /// `http://host:port` (or `https://host:port`) of an outboxd.
    pub endpoint: String,
    pub consumer: String,
    /// Unacked deliveries the server may send ahead; 0 lets the server choose.
    pub max_in_flight: u32,
    /// Handlers running at once.
    pub concurrency: usize,
    /// Overrides the consumer's ack deadline for this stream.
    pub ack_deadline: Option<Duration>,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    /// Token and TLS files (an `https://` endpoint is TLS); none by default.
    pub credentials: grpc::Credentials,
}

impl SubscriberConfig {
    pub fn new(endpoint: impl Into<String>, consumer: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            consumer: consumer.into(),
            max_in_flight: 16,
            concurrency: 16,
            ack_deadline: None,
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(10),
            credentials: grpc::Credentials::default(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Subscriber {
    config: SubscriberConfig,
}

enum End {
    Shutdown,
    /// The server ended the stream (for example, it is shutting down): reconnect.
    ServerClosed,
}

/// Errors that reconnecting cannot fix.
fn permanent(e: &ClientError) -> bool {
    match e {
        ClientError::Status(s) => matches!(
            s.code(),
            Code::NotFound
                | Code::InvalidArgument
                | Code::PermissionDenied
                | Code::Unauthenticated
                | Code::FailedPrecondition
        ),
        ClientError::Endpoint(_) | ClientError::Credentials(_) => true,
        _ => false,
    }
}

impl Subscriber {
    pub fn new(config: SubscriberConfig) -> Self {
        Self { config }
    }

    /// Consumes until `shutdown` is cancelled (then returns `Ok`) or a permanent error.
    pub async fn run<H, Fut>(self, handler: H, shutdown: CancellationToken) -> Result<(), ClientError>
    where
        H: Fn(Delivery) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let mut backoff = self.config.reconnect_min;
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            match self.session(&handler, &shutdown, &mut backoff).await {
                Ok(End::Shutdown) => return Ok(()),
                Ok(End::ServerClosed) => {
                    tracing::info!(consumer = %self.config.consumer, "stream ended by the server; reconnecting")
                }
                Err(e) if permanent(&e) => return Err(e),
                Err(e) => {
                    tracing::warn!(consumer = %self.config.consumer, error = %e, retry_in = ?backoff, "subscription lost; reconnecting")
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(self.config.reconnect_max);
        }
    }

    async fn session<H, Fut>(
        &self,
        handler: &Arc<H>,
        shutdown: &CancellationToken,
        backoff: &mut Duration,
    ) -> Result<End, ClientError>
    where
        H: Fn(Delivery) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        let c = &self.config;
        let mut client = grpc::outbox_with(&c.endpoint, &c.credentials).await?;
        let (req_tx, req_rx) = mpsc::channel::<pb::SubscribeRequest>(1024);
        let start = pb::Start {
            consumer: c.consumer.clone(),
            max_in_flight: c.max_in_flight,
            ack_deadline: c
                .ack_deadline
                .map(|d| prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }),
        };
        let _ = req_tx.send(pb::SubscribeRequest { request: Some(pb::subscribe_request::Request::Start(start)) }).await;
        let mut inbound = client.subscribe(ReceiverStream::new(req_rx)).await?.into_inner();
        *backoff = c.reconnect_min;
        tracing::info!(consumer = %c.consumer, endpoint = %c.endpoint, "subscribed");

        let permits = Arc::new(Semaphore::new(c.concurrency.max(1)));
        let mut tasks = JoinSet::new();
        let end = loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break Ok(End::Shutdown),
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                msg = inbound.message() => match msg {
                    Ok(Some(pb::SubscribeResponse { response: Some(pb::subscribe_response::Response::Delivery(d)) })) => {
                        let Some(delivery) = Delivery::from_pb(&c.consumer, d) else {
                            tracing::warn!("ignoring a delivery with a malformed message_id");
                            continue;
                        };
                        let permit = tokio::select! {
                            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break Ok(End::Shutdown) },
                            _ = shutdown.cancelled() => break Ok(End::Shutdown),
                        };
                        let handler = handler.clone();
                        let req_tx = req_tx.clone();
                        // The lease granted: what is left of it as the delivery arrives.
                        let lease = delivery
                            .ack_deadline
                            .and_then(|t| (t - chrono::Utc::now()).to_std().ok())
                            .filter(|d| !d.is_zero());
                        // The handler runs in a span continuing the producer's trace.
                        let span = tracing::info_span!(
                            "outbox.handle", otel.kind = "consumer", consumer = %delivery.consumer,
                            message_id = %delivery.message_id, topic = %delivery.topic,
                            delivery_count = delivery.delivery_count,
                        );
                        crate::trace::continue_from(&span, &delivery.headers);
                        tasks.spawn(async move {
                            let id = delivery.message_id;
                            let work = handler(delivery).instrument(span);
                            tokio::pin!(work);
                            // A handler slower than the ack deadline keeps its lease: extend it
                            // by the same length every half lease while the handler runs.
                            let outcome = match lease {
                                Some(lease) => {
                                    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + lease / 2, lease / 2);
                                    loop {
                                        tokio::select! {
                                            out = &mut work => break out,
                                            _ = ticker.tick() => {
                                                let extend = pb::Extend {
                                                    message_ids: vec![id.to_string()],
                                                    deadline: Some(prost_types::Duration {
                                                        seconds: lease.as_secs() as i64,
                                                        nanos: lease.subsec_nanos() as i32,
                                                    }),
                                                };
                                                let req = pb::SubscribeRequest { request: Some(pb::subscribe_request::Request::Extend(extend)) };
                                                let _ = req_tx.send(req).await;
                                            }
                                        }
                                    }
                                }
                                None => work.await,
                            };
                            drop(permit);
                            let request = match outcome {
                                Ok(()) => pb::subscribe_request::Request::Ack(pb::Ack { message_ids: vec![id.to_string()] }),
                                Err(e) if matches!(e.downcast_ref::<ClientError>(), Some(ClientError::AlreadyAcked { .. })) => {
                                    tracing::debug!(message_id = %id, "already acked elsewhere; effect rolled back");
                                    pb::subscribe_request::Request::Ack(pb::Ack { message_ids: vec![id.to_string()] })
                                }
                                Err(e) => {
                                    tracing::debug!(message_id = %id, error = %e, "handler failed; nacking");
                                    pb::subscribe_request::Request::Nack(pb::Nack { message_id: id.to_string(), error: e.to_string(), retry_after: None })
                                }
                            };
                            let _ = req_tx.send(pb::SubscribeRequest { request: Some(request) }).await;
                        });
                    }
                    Ok(Some(_)) => {}
                    Ok(None) => break Ok(End::ServerClosed),
                    Err(status) if status.code() == Code::Unavailable => break Ok(End::ServerClosed),
                    Err(status) => break Err(ClientError::Status(status)),
                },
            }
        };
        // Let running handlers finish and send their acks, then close our half of the stream;
        // the server applies everything sent before the close, then releases what is left.
        while tasks.join_next().await.is_some() {}
        drop(req_tx);
        let _ =
            tokio::time::timeout(Duration::from_secs(5), async { while let Ok(Some(_)) = inbound.message().await {} })
                .await;
        end
    }
}

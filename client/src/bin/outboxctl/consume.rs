//! `outboxctl consume`: a Subscribe stream that prints each delivery and acks or nacks it.
use std::io::Write as _;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use outbox_client::grpc::{self};
use outbox_proto::v1 as pb;
use serde_json::json;

use crate::Output;
use crate::failure::{Failure, status_failure};
use crate::format::payload_text;

#[derive(Debug, Args)]
pub(crate) struct ConsumeArgs {
    /// The consumer to take deliveries of (create it first: `outboxctl consumers create`).
    consumer: String,
    /// Ack each delivery once printed (the default).
    #[arg(long, conflicts_with = "nack")]
    ack: bool,
    /// Nack each delivery once printed: it is retried after the consumer's backoff, and dead
    /// after max_deliveries.
    #[arg(long)]
    nack: bool,
    /// Stop after this many deliveries (default: until interrupted).
    #[arg(long)]
    max: Option<u64>,
    /// Deliveries in flight at once.
    #[arg(long, default_value_t = 10)]
    max_in_flight: u32,
    /// Stop when no delivery comes for this long (default: wait until interrupted).
    #[arg(long, value_parser = humantime::parse_duration)]
    idle: Option<Duration>,
}

/// `outboxctl consume`: a Subscribe stream that prints each delivery and acks (or nacks) it.
pub(crate) async fn consume(mut client: grpc::OutboxClient, out: Output, a: ConsumeArgs) -> Result<(), Failure> {
    use pb::subscribe_request::Request;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let start = pb::Start { consumer: a.consumer.clone(), max_in_flight: a.max_in_flight, ack_deadline: None };
    let _ = tx.send(pb::SubscribeRequest { request: Some(Request::Start(start)) }).await;
    let mut stream = client
        .subscribe(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|s| status_failure(&s))?
        .into_inner();
    let mut taken = 0u64;
    while a.max.is_none_or(|max| taken < max) {
        let next = tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tokio::time::sleep(a.idle.unwrap_or(Duration::MAX)), if a.idle.is_some() => break,
            m = stream.message() => m.map_err(|s| status_failure(&s))?,
        };
        let Some(pb::SubscribeResponse { response: Some(pb::subscribe_response::Response::Delivery(d)) }) = next else {
            break;
        };
        taken += 1;
        if out == Output::Json {
            println!(
                "{}",
                json!({
                    "message_id": d.message_id, "seq": d.seq, "topic": d.topic, "type": d.r#type,
                    "payload": payload_text(&d.payload), "headers": d.headers, "ordering_key": d.ordering_key,
                    "delivery_count": d.delivery_count, "acked": !a.nack,
                })
            );
        } else {
            println!(
                "#{}  {}  {}  {}  (delivery {})  {}",
                d.seq,
                d.topic,
                d.r#type,
                d.message_id,
                d.delivery_count,
                payload_text(&d.payload)
            );
        }
        let _ = std::io::stdout().flush();
        let answer = if a.nack {
            Request::Nack(pb::Nack {
                message_id: d.message_id,
                error: "nacked by outboxctl consume".into(),
                retry_after: None,
            })
        } else {
            Request::Ack(pb::Ack { message_ids: vec![d.message_id] })
        };
        let _ = tx.send(pb::SubscribeRequest { request: Some(answer) }).await;
    }
    // Closing the request side lets outboxd apply the last acks and release what it sent but
    // was not printed, then end the stream.
    drop(tx);
    let drained =
        tokio::time::timeout(Duration::from_secs(5), async { while let Ok(Some(_)) = stream.message().await {} });
    let _ = drained.await;
    Ok(())
}

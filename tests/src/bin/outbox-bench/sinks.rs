//! The sink phase (`--sinks`): each broker's own publish-with-confirm rate, measured with a
//! plain client publishing directly, pipelined as a sink target publishes (the same window,
//! persistent messages, one confirm awaited per message). It is the ceiling that outboxd's
//! committed → confirmed rate through a sink is compared with.
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use futures::StreamExt as _;
use serde::Serialize;

/// What the sink phase measured.
#[derive(Debug, Serialize)]
pub struct SinkReport {
    /// Messages per phase and broker.
    pub sink_messages: u64,
    /// Concurrent unconfirmed publishes (a sink's default `max_in_flight`).
    pub sink_window: usize,
    pub sink_payload_bytes: usize,
    /// RabbitMQ: lapin, one channel in confirm mode, persistent messages to a durable queue.
    pub sink_rabbitmq_direct_per_s: f64,
    /// NATS JetStream: async-nats, publish + PubAck with `Nats-Msg-Id`, to a file stream.
    pub sink_nats_direct_per_s: f64,
}

pub async fn run(amqp_url: &str, nats_url: &str, messages: u64, window: usize, payload: &[u8]) -> Result<SinkReport> {
    tracing::info!(messages, window, "sink phase: RabbitMQ publish with confirms, directly");
    let rabbitmq = rabbitmq_direct(amqp_url, messages, window, payload).await?;
    tracing::info!(per_s = rabbitmq, "sink phase: RabbitMQ done; JetStream publish with PubAck, directly");
    let nats = nats_direct(nats_url, messages, window, payload).await?;
    tracing::info!(per_s = nats, "sink phase: JetStream done");
    Ok(SinkReport {
        sink_messages: messages,
        sink_window: window,
        sink_payload_bytes: payload.len(),
        sink_rabbitmq_direct_per_s: super::round(rabbitmq, 1),
        sink_nats_direct_per_s: super::round(nats, 1),
    })
}

fn per_second(count: u64, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// RabbitMQ's own rate: `messages` persistent, mandatory publishes on one confirm channel to a
/// durable queue of the run's own, `window` unconfirmed at a time, each confirm awaited.
pub async fn rabbitmq_direct(url: &str, messages: u64, window: usize, payload: &[u8]) -> Result<f64> {
    use lapin::Confirmation;
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions};
    use lapin::types::FieldTable;
    use lapin::{BasicProperties, Connection, ConnectionProperties};

    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .with_context(|| format!("connecting to RabbitMQ at {}", outbox_server::domain::redact_url(url)))?;
    let channel = conn.create_channel().await?;
    channel.confirm_select(ConfirmSelectOptions::default()).await?;
    let queue = format!("outbox-bench-{}", uuid::Uuid::new_v4().simple());
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions { durable: true, ..Default::default() },
            FieldTable::default(),
        )
        .await?;
    let started = Instant::now();
    let confirmed = futures::stream::iter(0..messages)
        .map(|_| {
            let (channel, queue) = (&channel, &queue);
            async move {
                let props = BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_message_id(uuid::Uuid::now_v7().to_string().into());
                let options = BasicPublishOptions { mandatory: true, ..Default::default() };
                let confirm = channel.basic_publish("".into(), queue.as_str().into(), options, payload, props).await?;
                anyhow::Ok(matches!(confirm.await?, Confirmation::Ack(None)))
            }
        })
        .buffer_unordered(window)
        .fold(Ok(0u64), |n, ok| async move {
            match (n, ok) {
                (Ok(n), Ok(true)) => Ok(n + 1),
                (Ok(n), Ok(false)) => Ok(n),
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        })
        .await?;
    let elapsed = started.elapsed();
    ensure!(confirmed == messages, "RabbitMQ confirmed {confirmed} of {messages}");
    channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await?;
    let _ = conn.close(200, "bench done".into()).await;
    Ok(per_second(messages, elapsed))
}

/// JetStream's own rate: `messages` publishes with `Nats-Msg-Id` to a file stream of the run's
/// own, `window` PubAcks outstanding at a time, each awaited.
pub async fn nats_direct(url: &str, messages: u64, window: usize, payload: &[u8]) -> Result<f64> {
    use async_nats::jetstream::{self, stream};

    let client = async_nats::connect(url).await.with_context(|| format!("connecting to NATS at {url}"))?;
    let js = jetstream::new(client.clone());
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (name, subject) = (format!("OUTBOX_BENCH_{id}"), format!("outbox-bench.{id}"));
    js.create_stream(stream::Config { name: name.clone(), subjects: vec![subject.clone()], ..Default::default() })
        .await
        .context("creating the bench's JetStream stream")?;
    let started = Instant::now();
    let acked = futures::stream::iter(0..messages)
        .map(|_| {
            // A copy per message, as a sink target makes one from its delivery.
            let (js, subject, body) = (&js, &subject, payload.to_vec());
            async move {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(async_nats::header::NATS_MESSAGE_ID, uuid::Uuid::now_v7().to_string().as_str());
                let ack = js.publish_with_headers(subject.clone(), headers, body.into()).await?;
                ack.await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(window)
        .fold(Ok(0u64), |n, r| async move { n.and_then(|n| r.map(|()| n + 1)) })
        .await?;
    let elapsed = started.elapsed();
    ensure!(acked == messages, "JetStream acked {acked} of {messages}");
    js.delete_stream(&name).await?;
    Ok(per_second(messages, elapsed))
}

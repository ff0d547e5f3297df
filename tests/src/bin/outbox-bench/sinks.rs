//! The sink phase (`--sinks`): each broker's own publish-with-confirm rate, measured with a
//! plain client publishing directly, pipelined as a sink target publishes (the same window,
//! persistent messages, one confirm awaited per message), and next to it outboxd's committed →
//! confirmed rate through a sink consumer to the same broker, in the same run: a backlog
//! committed in one transaction, timed until the sink has acked all of it (every ack follows the
//! broker's confirm).
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
    /// Committed → confirmed through a RabbitMQ sink (default exchange, a durable queue).
    pub sink_rabbitmq_per_s: f64,
    pub sink_rabbitmq_ratio_to_direct: f64,
    /// Committed → confirmed through a NATS JetStream sink (a file stream).
    pub sink_nats_per_s: f64,
    pub sink_nats_ratio_to_direct: f64,
}

/// Where the through-outboxd half runs.
pub struct Through<'a> {
    pub outboxd: &'a std::path::Path,
    pub database_url: &'a str,
}

pub async fn run(
    through: Through<'_>,
    amqp_url: &str,
    nats_url: &str,
    messages: u64,
    window: usize,
    payload: &[u8],
) -> Result<SinkReport> {
    tracing::info!(messages, window, "sink phase: RabbitMQ publish with confirms, directly");
    let rabbitmq = rabbitmq_direct(amqp_url, messages, window, payload).await?;
    tracing::info!(per_s = rabbitmq, "sink phase: JetStream publish with PubAck, directly");
    let nats = nats_direct(nats_url, messages, window, payload).await?;
    tracing::info!(per_s = nats, "sink phase: through outboxd to RabbitMQ");
    crate::database::recreate_database(through.database_url).await?;
    let db = crate::database::pool(through.database_url, 2).await?;
    let outboxd =
        outbox_tests::Outboxd::start_binary(through.outboxd, through.database_url, crate::OUTBOXD_FLAGS).await?;
    let mut admin = outboxd.admin().await?;
    let rabbitmq_through = rabbitmq_through(&db, &mut admin, amqp_url, messages, payload).await?;
    tracing::info!(per_s = rabbitmq_through, "sink phase: through outboxd to JetStream");
    let nats_through = nats_through(&db, &mut admin, nats_url, messages, payload).await?;
    tracing::info!(per_s = nats_through, "sink phase: done");
    Ok(SinkReport {
        sink_messages: messages,
        sink_window: window,
        sink_payload_bytes: payload.len(),
        sink_rabbitmq_direct_per_s: crate::report::round(rabbitmq, 1),
        sink_nats_direct_per_s: crate::report::round(nats, 1),
        sink_rabbitmq_per_s: crate::report::round(rabbitmq_through, 1),
        sink_rabbitmq_ratio_to_direct: crate::report::round(rabbitmq_through / rabbitmq.max(1e-9), 3),
        sink_nats_per_s: crate::report::round(nats_through, 1),
        sink_nats_ratio_to_direct: crate::report::round(nats_through / nats.max(1e-9), 3),
    })
}

type Admin = outbox_client::grpc::AdminClient;

/// Commits `messages` on `topic` at once, then times them until `consumer` has acked all.
async fn time_through(
    db: &sqlx::PgPool,
    admin: &mut Admin,
    consumer: &str,
    topic: &str,
    messages: u64,
    payload: &[u8],
) -> Result<f64> {
    crate::database::insert_committed(db, topic, messages, 0, payload).await?;
    let started = Instant::now();
    let within = crate::budget(messages);
    loop {
        let stats =
            admin.get_stats(outbox_proto::v1::GetStatsRequest { consumer: consumer.to_owned() }).await?.into_inner();
        let s = stats.consumers.first().context("the sink consumer is in the stats")?;
        ensure!(s.dead == 0, "{consumer}: {} dead letters in the sink phase", s.dead);
        if u64::try_from(s.acked)? >= messages {
            return Ok(per_second(messages, started.elapsed()));
        }
        ensure!(started.elapsed() < within, "{consumer}: {} of {messages} confirmed within {within:?}", s.acked);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn sink_consumer(
    name: &str,
    topic: &str,
    target: outbox_proto::v1::sink::Target,
) -> outbox_proto::v1::CreateConsumerRequest {
    let mut c = outbox_tests::consumer(name, &[topic]);
    c.sink = Some(outbox_proto::v1::Sink { target: Some(target), max_in_flight: 0 });
    outbox_proto::v1::CreateConsumerRequest { consumer: Some(c) }
}

/// Through a RabbitMQ sink: the default exchange to a durable queue of the run's own.
async fn rabbitmq_through(
    db: &sqlx::PgPool,
    admin: &mut Admin,
    url: &str,
    messages: u64,
    payload: &[u8],
) -> Result<f64> {
    use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
    use lapin::types::FieldTable;
    use lapin::{Connection, ConnectionProperties};

    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let channel = conn.create_channel().await?;
    let queue = format!("outbox-bench-{}", uuid::Uuid::new_v4().simple());
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions { durable: true, ..Default::default() },
            FieldTable::default(),
        )
        .await?;
    let target = outbox_proto::v1::sink::Target::Rabbitmq(outbox_proto::v1::RabbitMqSink {
        url: url.to_owned(),
        exchange: String::new(),
        routing_key: queue.clone(),
    });
    admin.create_consumer(sink_consumer("bench-rabbitmq", "bench.sink.rabbitmq", target)).await?;
    let per_s = time_through(db, admin, "bench-rabbitmq", "bench.sink.rabbitmq", messages, payload).await?;
    admin.delete_consumer(outbox_proto::v1::DeleteConsumerRequest { consumer: "bench-rabbitmq".into() }).await?;
    channel.queue_delete(queue.as_str().into(), QueueDeleteOptions::default()).await?;
    let _ = conn.close(200, "bench done".into()).await;
    Ok(per_s)
}

/// Through a JetStream sink: a file stream of the run's own.
async fn nats_through(db: &sqlx::PgPool, admin: &mut Admin, url: &str, messages: u64, payload: &[u8]) -> Result<f64> {
    use async_nats::jetstream::{self, stream};

    let js = jetstream::new(async_nats::connect(url).await?);
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (name, subject) = (format!("OUTBOX_BENCH_SINK_{id}"), format!("outbox-bench-sink.{id}"));
    js.create_stream(stream::Config { name: name.clone(), subjects: vec![subject.clone()], ..Default::default() })
        .await
        .context("creating the bench's JetStream stream")?;
    let target = outbox_proto::v1::sink::Target::Nats(outbox_proto::v1::NatsSink { url: url.to_owned(), subject });
    admin.create_consumer(sink_consumer("bench-nats", "bench.sink.nats", target)).await?;
    let per_s = time_through(db, admin, "bench-nats", "bench.sink.nats", messages, payload).await?;
    admin.delete_consumer(outbox_proto::v1::DeleteConsumerRequest { consumer: "bench-nats".into() }).await?;
    js.delete_stream(&name).await?;
    Ok(per_s)
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

//! The JetStream reference phase: the drain and the fan-out rounds of the PostgreSQL run, done
//! again against the machine's NATS JetStream in the same run (after outboxd has stopped, so
//! the two never share the CPU), so that every ratio of outboxd to JetStream comes from one run
//! on one machine at one time.
//!
//! Each round publishes the same number of messages of the same payload to a file-backed stream
//! of its own (`OUTBOX_BENCH_DRAIN`, `OUTBOX_BENCH_FANOUT_C16`, ...), with `PUBLISH_WINDOW`
//! PubAcks outstanding; the durable pull consumers (`AckPolicy::Explicit`, `max_ack_pending` of
//! `max_in_flight` per fetch loop, as outboxd's streams have) exist before the backlog is
//! published, as outboxd's consumers exist before the backlog is committed. The clock starts
//! when the fetch loops start pulling and stops at the last ack of the last message; every
//! message is acked one by one, and counted when its `ack()` returns (outboxd's streams are
//! counted when their ack request is sent, too). After the clock stops, each consumer's info
//! must show nothing pending and nothing unacked. The stream is deleted before the round (a run
//! that was interrupted leaves one behind) and after it, with its consumers.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, ensure};
use async_nats::jetstream::consumer::{AckPolicy, PullConsumer, pull};
use async_nats::jetstream::{self, stream};
use futures::{StreamExt as _, TryStreamExt as _};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::consumers::Progress;

/// PubAcks outstanding while a backlog is published: below async-nats's own bound of 5,000
/// pending acks per context, so that bound never makes a publish wait.
const PUBLISH_WINDOW: usize = 4096;

/// What to do when NATS is not there.
const HOW_TO_SKIP: &str = "the JetStream reference phase needs a NATS server with JetStream (`nats-server -js`): \
     point --nats-url (or OUTBOX_BENCH_NATS_URL) at one, or skip the phase with --no-jetstream";

/// A NATS server with JetStream, reached before the run starts so that a missing one fails at
/// once rather than after the PostgreSQL phases.
pub struct Reference {
    url: String,
    /// Publishes the backlogs and manages the streams; each consumer has a connection of its own.
    js: jetstream::Context,
}

/// One round: `messages` published, then delivered to every consumer and acked.
#[derive(Debug, Clone, Copy)]
pub struct Round {
    /// Messages times consumers.
    pub deliveries: u64,
    /// From the fetch loops starting to the last ack.
    pub elapsed: Duration,
    /// Acked redeliveries (JetStream's delivery count above one), not counted in `deliveries`.
    pub redelivered: u64,
}

impl Round {
    pub fn deliveries_per_s(&self) -> f64 {
        crate::per_second(self.deliveries, self.elapsed)
    }
}

/// What the phase measured.
#[derive(Debug)]
pub struct Figures {
    /// One consumer, as outboxd's drain.
    pub drain: Round,
    /// By consumer count, as outboxd's fan-out.
    pub fanout: Vec<(u32, Round)>,
}

/// The shape of the phase: the outboxd phases' own parameters.
#[derive(Debug, Clone, Copy)]
pub struct Shape<'a> {
    pub drain_messages: u64,
    /// Fetch loops of the drain's one consumer (outboxd's drain: streams of its one consumer).
    pub drain_loops: u32,
    pub fanout_messages: u64,
    pub fanout_consumers: &'a [u32],
    pub fanout_loops_per_consumer: u32,
    /// Unacked messages per fetch loop (outboxd's streams: `max_in_flight`); also each pull's
    /// batch size.
    pub max_in_flight: u32,
    pub payload: &'a [u8],
}

impl Reference {
    /// Connects, and asks for the account's JetStream information (`$JS.API.INFO`), which a
    /// server without JetStream does not answer or answers with an error. Read as plain JSON:
    /// the typed answer of the client crate expects fields that older servers do not send.
    pub async fn connect(url: &str) -> Result<Self> {
        let client = connect(url).await?;
        let no_jetstream = || format!("NATS at {url} did not answer as JetStream; {HOW_TO_SKIP}");
        let reply = client.request("$JS.API.INFO", "".into()).await.with_context(no_jetstream)?;
        let info: serde_json::Value = serde_json::from_slice(&reply.payload).with_context(no_jetstream)?;
        if let Some(error) = info.get("error") {
            anyhow::bail!("{}: {error}", no_jetstream());
        }
        let js = jetstream::new(client);
        Ok(Self { url: url.to_owned(), js })
    }

    /// The drain, then the fan-out rounds.
    pub async fn run(&self, shape: Shape<'_>) -> Result<Figures> {
        let drain = self
            .round("OUTBOX_BENCH_DRAIN", 1, shape.drain_loops, shape.drain_messages, shape.max_in_flight, shape.payload)
            .await?;
        tracing::info!(per_s = drain.deliveries_per_s(), "JetStream drain done");
        let mut fanout = Vec::new();
        for &k in shape.fanout_consumers {
            let r = self
                .round(
                    &format!("OUTBOX_BENCH_FANOUT_C{k}"),
                    k,
                    shape.fanout_loops_per_consumer,
                    shape.fanout_messages,
                    shape.max_in_flight,
                    shape.payload,
                )
                .await?;
            tracing::info!(consumers = k, deliveries_per_s = r.deliveries_per_s(), "JetStream fanout round done");
            fanout.push((k, r));
        }
        Ok(Figures { drain, fanout })
    }

    /// One round on a stream of its own, deleted before and after (also when the round fails).
    async fn round(
        &self,
        name: &str,
        consumers: u32,
        loops: u32,
        messages: u64,
        max_in_flight: u32,
        payload: &[u8],
    ) -> Result<Round> {
        self.delete_stream(name, true).await?;
        let subject = format!("outbox-bench.reference.{}", name.to_lowercase());
        self.js
            .create_stream(stream::Config {
                name: name.to_owned(),
                subjects: vec![subject.clone()],
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .with_context(|| format!("creating JetStream stream {name}"))?;
        let result = self.round_on(name, &subject, consumers, loops, messages, max_in_flight, payload).await;
        let deleted = self.delete_stream(name, false).await;
        let round = result.with_context(|| format!("JetStream round {name}"))?;
        deleted?;
        if round.redelivered > 0 {
            tracing::warn!(stream = name, redelivered = round.redelivered, "JetStream redelivered messages");
        }
        Ok(round)
    }

    #[allow(clippy::too_many_arguments)]
    async fn round_on(
        &self,
        name: &str,
        subject: &str,
        consumers: u32,
        loops: u32,
        messages: u64,
        max_in_flight: u32,
        payload: &[u8],
    ) -> Result<Round> {
        // Each consumer on a connection of its own, as a consumer process has; its fetch loops
        // share it.
        let mut members: Vec<(async_nats::Client, PullConsumer)> = Vec::new();
        for i in 1..=consumers {
            let client = connect(&self.url).await?;
            let consumer: PullConsumer = jetstream::new(client.clone())
                .create_consumer_on_stream(
                    pull::Config {
                        durable_name: Some(format!("{name}_{i}")),
                        ack_policy: AckPolicy::Explicit,
                        max_ack_pending: i64::from(loops * max_in_flight),
                        ..Default::default()
                    },
                    name,
                )
                .await
                .with_context(|| format!("creating durable consumer {name}_{i}"))?;
            members.push((client, consumer));
        }
        tracing::info!(stream = name, messages, "publishing the JetStream backlog");
        self.publish(subject, messages, payload).await?;

        let deliveries = messages * u64::from(consumers);
        let within = crate::budget(deliveries);
        let progress = Arc::new(Progress::new());
        let stop = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let start = Instant::now();
        for (_, consumer) in &members {
            // Set when this consumer has acked every message: its loops end.
            let done = stop.child_token();
            let acked = Arc::new(AtomicU64::new(0));
            for _ in 0..loops {
                let pulls = consumer
                    .stream()
                    .max_messages_per_batch(max_in_flight as usize)
                    .messages()
                    .await
                    .context("starting a fetch loop")?;
                tasks.spawn(fetch_loop(pulls, messages, done.clone(), acked.clone(), progress.clone()));
            }
        }
        let deadline = start + within;
        while progress.acked() < deliveries {
            // A loop ends without an error only once its consumer has everything.
            if let Some(joined) = tasks.try_join_next() {
                joined.context("a fetch loop panicked")??;
            }
            ensure!(
                Instant::now() < deadline,
                "timed out after {within:?}: {} of {deliveries} deliveries acked",
                progress.acked()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let elapsed = progress.last_ack().saturating_duration_since(start);
        stop.cancel();
        let stopped_by = Instant::now() + Duration::from_secs(10);
        while let Some(joined) = tokio::time::timeout_at(stopped_by, tasks.join_next())
            .await
            .context("fetch loops did not stop within 10 s")?
        {
            joined.context("a fetch loop panicked")??;
        }

        // Outside the clock: every ack reached the server (a flush answers after everything sent
        // before it), and the server counts every message acked by every consumer.
        for (client, _) in &members {
            client.flush().await.context("flushing a consumer's acks")?;
        }
        let settled_by = Instant::now() + Duration::from_secs(10);
        for (_, consumer) in &members {
            loop {
                let info = consumer.get_info().await.context("reading a consumer's info")?;
                if info.num_pending == 0 && info.num_ack_pending == 0 && info.ack_floor.stream_sequence >= messages {
                    break;
                }
                ensure!(
                    Instant::now() < settled_by,
                    "consumer {}: {} pending, {} unacked and the ack floor at {} of {messages} 10 s after the round",
                    info.name,
                    info.num_pending,
                    info.num_ack_pending,
                    info.ack_floor.stream_sequence
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(Round { deliveries, elapsed, redelivered: progress.redelivered() })
    }

    /// Publishes `n` messages, `PUBLISH_WINDOW` PubAcks outstanding, every one awaited.
    async fn publish(&self, subject: &str, n: u64, payload: &[u8]) -> Result<()> {
        let js = &self.js;
        let published = futures::stream::iter(0..n)
            .map(|_| async move {
                js.publish(subject.to_owned(), payload.to_vec().into()).await?.await?;
                anyhow::Ok(())
            })
            .buffer_unordered(PUBLISH_WINDOW)
            .try_fold(0u64, |count, ()| async move { Ok(count + 1) })
            .await
            .context("publishing the JetStream backlog")?;
        ensure!(published == n, "JetStream acked {published} of {n} publishes");
        Ok(())
    }

    /// Deletes a stream (and its consumers); `missing_ok`: a stream that is not there is fine.
    async fn delete_stream(&self, name: &str, missing_ok: bool) -> Result<()> {
        match self.js.delete_stream(name).await {
            Ok(_) => Ok(()),
            Err(e)
                if missing_ok
                    && matches!(
                        e.kind(),
                        jetstream::context::DeleteStreamErrorKind::JetStream(ref j)
                            if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
                    ) =>
            {
                Ok(())
            }
            Err(e) => Err(e).with_context(|| format!("deleting JetStream stream {name}")),
        }
    }
}

async fn connect(url: &str) -> Result<async_nats::Client> {
    async_nats::connect(url).await.with_context(|| format!("NATS at {url} is not reachable; {HOW_TO_SKIP}"))
}

/// Pulls (the stream keeps pull requests of `max_in_flight` messages going) and acks each
/// message, counting its first delivery once the ack returns; until `done`, which the loop
/// that acks the consumer's `messages`-th message sets.
async fn fetch_loop(
    mut pulls: pull::Stream,
    messages: u64,
    done: CancellationToken,
    acked: Arc<AtomicU64>,
    progress: Arc<Progress>,
) -> Result<()> {
    loop {
        let next = tokio::select! {
            () = done.cancelled() => return Ok(()),
            next = pulls.next() => next,
        };
        let message = next.context("a pull stream ended")?.context("pulling from JetStream")?;
        // As outboxd's `delivery_count`: a redelivery is not counted as a message.
        let first = message.info().map_err(|e| anyhow!("reading a message's delivery info: {e}"))?.delivered <= 1;
        message.ack().await.map_err(|e| anyhow!("acking a JetStream message: {e}"))?;
        progress.count(u64::from(first), u64::from(!first), Instant::now());
        if first && acked.fetch_add(1, Ordering::SeqCst) + 1 >= messages {
            done.cancel();
        }
    }
}

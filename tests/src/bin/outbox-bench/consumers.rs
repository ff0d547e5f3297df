//! Consumers: `Subscribe` streams that receive and ack, and the progress they record.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::ACK_BATCH;
use anyhow::{Context as _, Result, bail, ensure};
use outbox_proto::v1 as pb;
use outbox_tests::RawStream;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What the streams of one phase have acked, shared with their tasks.
#[derive(Debug)]
pub(crate) struct Progress {
    pub(crate) origin: Instant,
    /// Acked first deliveries: each is one message.
    pub(crate) first: AtomicU64,
    /// Acked redeliveries (a lease expired, or a stream closed before its ack landed).
    pub(crate) again: AtomicU64,
    /// When the latest ack was sent, in nanoseconds after `origin`.
    pub(crate) last_ack_ns: AtomicU64,
    /// When the earliest ack was sent, in nanoseconds after `origin` (`u64::MAX` before any).
    pub(crate) first_ack_ns: AtomicU64,
    /// While set, each first delivery's enqueue → receipt time (wall clock, milliseconds) is
    /// kept in `latencies` (the soak samples them).
    pub(crate) sample_latency: std::sync::atomic::AtomicBool,
    pub(crate) latencies: std::sync::Mutex<Vec<f32>>,
}

impl Progress {
    pub(crate) fn new() -> Self {
        Self {
            origin: Instant::now(),
            first: AtomicU64::new(0),
            again: AtomicU64::new(0),
            last_ack_ns: AtomicU64::new(0),
            first_ack_ns: AtomicU64::new(u64::MAX),
            sample_latency: std::sync::atomic::AtomicBool::new(false),
            latencies: std::sync::Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn record(&self, batch: &[(pb::Delivery, Instant)], acked: Instant) {
        let first = batch.iter().filter(|(d, _)| d.delivery_count <= 1).count() as u64;
        if self.sample_latency.load(Ordering::Relaxed) {
            let now = chrono::Utc::now();
            let mut l = self.latencies.lock().unwrap_or_else(|e| e.into_inner());
            for (d, _) in batch.iter().filter(|(d, _)| d.delivery_count <= 1) {
                if let Some(t) = d.enqueued_at.as_ref()
                    && let Some(at) = chrono::DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).unwrap_or(0))
                {
                    l.push((now - at).num_microseconds().unwrap_or(0) as f32 / 1000.0);
                }
            }
        }
        self.count(first, batch.len() as u64 - first, acked);
    }

    /// Counts `first` first deliveries and `again` redeliveries acked at `acked`.
    pub(crate) fn count(&self, first: u64, again: u64, acked: Instant) {
        let ns = u64::try_from(acked.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX);
        // The instant first, so that whoever sees the count sees an instant at least this late.
        self.last_ack_ns.fetch_max(ns, Ordering::SeqCst);
        self.first_ack_ns.fetch_min(ns, Ordering::SeqCst);
        self.again.fetch_add(again, Ordering::SeqCst);
        self.first.fetch_add(first, Ordering::SeqCst);
    }

    pub(crate) fn acked(&self) -> u64 {
        self.first.load(Ordering::SeqCst)
    }

    pub(crate) fn redelivered(&self) -> u64 {
        self.again.load(Ordering::SeqCst)
    }

    pub(crate) fn last_ack(&self) -> Instant {
        self.origin + Duration::from_nanos(self.last_ack_ns.load(Ordering::SeqCst))
    }

    /// From the first ack to the last (zero before two acks).
    pub(crate) fn acking(&self) -> Duration {
        let first = self.first_ack_ns.load(Ordering::SeqCst);
        Duration::from_nanos(self.last_ack_ns.load(Ordering::SeqCst).saturating_sub(first))
    }
}

/// One first delivery as a stream saw it, for the latency phase.
#[derive(Debug)]
pub(crate) struct Receipt {
    pub(crate) message_id: String,
    pub(crate) delivered: Instant,
    pub(crate) acked: Instant,
}

/// Receives on one stream and acks, in one request, whatever has arrived; until `stop`.
pub(crate) async fn consume(
    mut stream: RawStream,
    stop: CancellationToken,
    progress: Arc<Progress>,
    record: bool,
) -> Result<Vec<Receipt>> {
    let mut receipts = Vec::new();
    let mut batch: Vec<(pb::Delivery, Instant)> = Vec::with_capacity(ACK_BATCH);
    while !stop.is_cancelled() {
        // A short wait, so that an idle stream notices `stop` promptly.
        let Some(first) = stream.next(Duration::from_millis(100)).await.context("subscribe stream")? else {
            continue;
        };
        batch.push((first, Instant::now()));
        // What is already buffered goes into the same ack.
        while batch.len() < ACK_BATCH {
            match stream.next(Duration::ZERO).await.context("subscribe stream")? {
                Some(d) => batch.push((d, Instant::now())),
                None => break,
            }
        }
        let ids: Vec<&str> = batch.iter().map(|(d, _)| d.message_id.as_str()).collect();
        stream.ack(&ids).await;
        let acked = Instant::now();
        progress.record(&batch, acked);
        if record {
            receipts.extend(batch.drain(..).filter(|(d, _)| d.delivery_count <= 1).map(|(d, delivered)| Receipt {
                message_id: d.message_id,
                delivered,
                acked,
            }));
        }
        batch.clear();
    }
    stream.close();
    Ok(receipts)
}

/// The streams of one phase, each in its own task.
pub(crate) struct Streams {
    pub(crate) stop: CancellationToken,
    pub(crate) progress: Arc<Progress>,
    pub(crate) tasks: JoinSet<Result<Vec<Receipt>>>,
}

impl Streams {
    pub(crate) async fn attach(
        endpoint: &str,
        consumers: &[String],
        per_consumer: u32,
        max_in_flight: u32,
        record: bool,
    ) -> Result<Self> {
        let stop = CancellationToken::new();
        let progress = Arc::new(Progress::new());
        let mut tasks = JoinSet::new();
        for name in consumers {
            for _ in 0..per_consumer {
                let stream = RawStream::open(endpoint, name, max_in_flight)
                    .await
                    .with_context(|| format!("opening a stream of consumer {name}"))?;
                tasks.spawn(consume(stream, stop.clone(), progress.clone(), record));
            }
        }
        Ok(Self { stop, progress, tasks })
    }

    /// Waits until `target` messages have been acked; fails after `within`, or at once if a
    /// stream fails.
    pub(crate) async fn wait_acked(&mut self, target: u64, within: Duration, what: &str) -> Result<()> {
        let deadline = Instant::now() + within;
        while self.progress.acked() < target {
            if let Some(joined) = self.tasks.try_join_next() {
                joined.context("a stream task panicked")??;
                bail!("a stream ended while waiting for {what}");
            }
            ensure!(
                Instant::now() < deadline,
                "timed out after {within:?} waiting for {what}: {} of {target} acked",
                self.progress.acked()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// Closes every stream (the server releases what they still hold) and returns the receipts.
    pub(crate) async fn stop(mut self) -> Result<Vec<Receipt>> {
        self.stop.cancel();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut receipts = Vec::new();
        while let Some(joined) = tokio::time::timeout_at(deadline, self.tasks.join_next())
            .await
            .context("streams did not stop within 10 s")?
        {
            receipts.extend(joined.context("a stream task panicked")??);
        }
        Ok(receipts)
    }
}

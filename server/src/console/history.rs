//! The figures the console shows: the stats outboxd keeps (one `stats` read, never a count
//! over history, shared by every open tab for [`FRESH_FOR`]), and an hour of per-consumer
//! samples, one a minute, for the lag charts and the rate sparklines.
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::domain::ConsumerName;
use crate::hub::Hub;
use crate::store::{DeadGroup, SharedStore, Stats, StoreError, VacuumHorizon};

/// How long a consumer's groups of dead letters serve every tab: the grouping reads every dead
/// letter's index entry, and a consumer may have many.
pub const GROUPS_FRESH_FOR: Duration = Duration::from_secs(10);
/// Consumers whose groups are kept at once.
const GROUPS_KEPT: usize = 1000;

/// How long one read of the stats serves every tab.
pub const FRESH_FOR: Duration = Duration::from_secs(2);
/// One sample a minute, for an hour.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(60);
pub const SAMPLES_KEPT: usize = 60;

/// The stats at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub at: DateTime<Utc>,
    pub stats: Stats,
    pub horizon: Option<VacuumHorizon>,
    /// Streams attached to this process, per consumer.
    pub streams: HashMap<String, u32>,
    /// The kind of each sink consumer ("rabbitmq", "nats", "webhook").
    pub sinks: HashMap<String, &'static str>,
    /// The highest seq committed.
    pub last_seq: i64,
}

/// One consumer at one minute.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub at: DateTime<Utc>,
    pub backlog: i64,
    pub dead: i64,
    /// Seconds.
    pub oldest_unacked: f64,
    /// Acks and dead letters this process counted since it started.
    pub acked_total: u64,
    pub dead_lettered_total: u64,
}

#[derive(Debug)]
pub struct History {
    store: SharedStore,
    clock: SharedClock,
    hub: Hub,
    last: tokio::sync::Mutex<Option<(Instant, Arc<Snapshot>)>>,
    samples: Mutex<HashMap<String, VecDeque<Sample>>>,
    groups: tokio::sync::Mutex<HashMap<String, Cached<Vec<DeadGroup>>>>,
}

/// A value read at an instant, shared by every tab until it is too old.
type Cached<T> = (Instant, Arc<T>);

impl History {
    pub fn new(store: SharedStore, clock: SharedClock, hub: Hub) -> Self {
        Self {
            store,
            clock,
            hub,
            last: tokio::sync::Mutex::new(None),
            samples: Mutex::new(HashMap::new()),
            groups: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// A consumer's dead letters grouped by last error, read at most once per
    /// [`GROUPS_FRESH_FOR`] however many tabs ask.
    pub async fn dead_groups(&self, consumer: &ConsumerName, limit: i64) -> Result<Arc<Vec<DeadGroup>>, StoreError> {
        let mut groups = self.groups.lock().await;
        if let Some((when, g)) = groups.get(consumer.as_str())
            && when.elapsed() < GROUPS_FRESH_FOR
        {
            return Ok(g.clone());
        }
        let g = Arc::new(self.store.dead_letter_groups(consumer, limit).await?);
        if groups.len() >= GROUPS_KEPT {
            groups.retain(|_, (when, _)| when.elapsed() < GROUPS_FRESH_FOR);
        }
        groups.insert(consumer.to_string(), (Instant::now(), g.clone()));
        Ok(g)
    }

    /// The stats, read at most once per [`FRESH_FOR`] however many tabs ask (one waits for
    /// the read another started).
    pub async fn snapshot(&self) -> Result<Arc<Snapshot>, StoreError> {
        let mut last = self.last.lock().await;
        if let Some((when, s)) = last.as_ref()
            && when.elapsed() < FRESH_FOR
        {
            return Ok(s.clone());
        }
        let s = Arc::new(self.read().await?);
        *last = Some((Instant::now(), s.clone()));
        Ok(s)
    }

    /// Forgets the shared snapshot: after a change made from the console, its next page shows
    /// the change.
    pub async fn invalidate(&self) {
        *self.last.lock().await = None;
        self.groups.lock().await.clear();
    }

    async fn read(&self) -> Result<Snapshot, StoreError> {
        let stats = self.store.stats(None, false).await?;
        let horizon = self.store.vacuum_horizon().await?;
        let sinks = self
            .store
            .consumer_list()
            .await?
            .into_iter()
            .filter_map(|c| c.spec.sink.map(|s| (c.spec.name.to_string(), s.kind().as_str())))
            .collect();
        let last_seq = self.store.message_last_seq().await?;
        let streams = stats.consumers.iter().map(|c| (c.consumer.clone(), self.hub.streams(&c.consumer))).collect();
        Ok(Snapshot { at: self.clock.now(), stats, horizon, streams, sinks, last_seq })
    }

    /// A consumer's samples, oldest first.
    pub fn samples(&self, consumer: &str) -> Vec<Sample> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.get(consumer).map(|v| v.iter().copied().collect()).unwrap_or_default()
    }

    fn record(&self, s: &Snapshot) {
        let tallies = crate::metrics::tallies();
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.retain(|name, _| s.stats.consumers.iter().any(|c| &c.consumer == name));
        for c in &s.stats.consumers {
            let t = tallies.get(&c.consumer).copied().unwrap_or_default();
            let v = samples.entry(c.consumer.clone()).or_default();
            v.push_back(Sample {
                at: s.at,
                backlog: c.backlog,
                dead: c.dead,
                oldest_unacked: c.oldest_unacked_at.map_or(0.0, |t| crate::metrics::age(s.at, t)),
                acked_total: t.acked,
                dead_lettered_total: t.dead_lettered,
            });
            while v.len() > SAMPLES_KEPT {
                v.pop_front();
            }
        }
    }

    /// Takes a sample now and every [`SAMPLE_EVERY`] until `cancel`.
    pub async fn run(&self, cancel: CancellationToken) {
        let mut every = tokio::time::interval(SAMPLE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = every.tick() => {}
            }
            // Its own read: a sample taken at start-up must not serve pages as if fresh.
            match self.read().await {
                Ok(s) => self.record(&s),
                Err(e) => tracing::debug!(error = %e, "console sample failed"),
            }
        }
    }
}

/// How much a running total grew over the samples kept (an hour) up to `now`: from the oldest
/// sample, or from the start of this process (when the total was 0) before the first.
pub fn since_oldest(samples: &[Sample], now: u64, total: impl Fn(&Sample) -> u64) -> u64 {
    now.saturating_sub(samples.first().map_or(0, total))
}

/// Per-minute increases of a running total (the first sample has none).
pub fn rates(samples: &[Sample], total: impl Fn(&Sample) -> u64) -> Vec<u64> {
    samples.windows(2).map(|w| total(&w[1]).saturating_sub(total(&w[0]))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(acked: u64) -> Sample {
        Sample { at: Utc::now(), backlog: 0, dead: 0, oldest_unacked: 0.0, acked_total: acked, dead_lettered_total: 0 }
    }

    #[test]
    fn rates_are_the_increases_between_samples_and_a_restart_counts_as_none() {
        let s = [sample(0), sample(5), sample(12), sample(3)];
        assert_eq!(rates(&s, |s| s.acked_total), vec![5, 7, 0]);
        assert!(rates(&s[..1], |s| s.acked_total).is_empty());
    }

    #[test]
    fn the_acks_of_the_hour_count_from_the_oldest_sample_or_from_the_start() {
        let s = [sample(7), sample(12), sample(20)];
        assert_eq!(since_oldest(&s, 25, |s| s.acked_total), 18, "25 now, 7 an hour ago");
        assert_eq!(since_oldest(&[], 4, |s| s.acked_total), 4, "no sample yet: all this process counted");
        assert_eq!(since_oldest(&s, 3, |s| s.acked_total), 0, "never below zero");
    }
}

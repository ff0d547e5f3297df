//! Replay as a managed operation: select by filters, count first, refuse what is beyond the
//! dedup horizon, then make deliveries due again in rate-limited batches, reporting progress
//! and writing one audit line per replay.
//!
//! A replay is applied batch by batch, each batch in its own transaction, so a long replay
//! never holds locks for long and live traffic keeps flowing between batches. An interrupted
//! replay (the caller went away, the server stopped) keeps the batches already done.
use std::net::SocketAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::domain::{ConsumerName, ConsumerSpec, MessageId, TopicPattern};
use crate::hub::Hub;
use crate::store::{ReplayCandidate, ReplayCandidatesParams, ReplayFilter, SharedStore, StoreError};
use crate::waking::Waking;

/// Candidates read per query while counting.
const COUNT_PAGE: i64 = 5_000;
/// The largest batch made due in one transaction.
const MAX_BATCH: u32 = 500;

/// What to replay and how.
#[derive(Debug, Clone)]
pub struct ReplayPlan {
    pub consumer: ConsumerName,
    pub filter: ReplayFilter,
    /// Only messages whose topic matches one of these (none: any). Selections other than by
    /// id are also limited to the consumer's own topics.
    pub topics: Vec<TopicPattern>,
    pub dry_run: bool,
    pub allow_beyond_retention: bool,
    /// Deliveries made due per second; 0 means the server's default.
    pub max_per_second: u32,
}

/// Where a replay stands. `selected` is the count made before anything changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayProgress {
    pub selected: u64,
    pub replayed: u64,
    pub beyond_retention: u64,
    pub done: bool,
}

/// Runs replays for the admin API.
#[derive(Debug, Clone)]
pub struct Replayer {
    store: SharedStore,
    clock: SharedClock,
    hub: Hub,
    retention: Duration,
    default_rate: u32,
    /// Cancelled at server shutdown: a running replay stops after its current batch.
    shutdown: CancellationToken,
    jobs: ReplayJobs,
}

/// How many finished replays [`ReplayJobs`] keeps.
const KEPT_JOBS: usize = 100;
/// Replays one principal may have running at once through [`Replayer::start`].
pub const MAX_RUNNING_PER_PRINCIPAL: usize = 4;

/// The replays (not the dry runs) this process ran or runs, newest first: who started each,
/// what it selected and where it stands. The audit log keeps them all; this is for watching.
#[derive(Debug, Clone, Default)]
pub struct ReplayJobs {
    inner: std::sync::Arc<std::sync::Mutex<(u64, std::collections::VecDeque<ReplayJob>)>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayJob {
    pub id: u64,
    pub consumer: String,
    pub principal: String,
    /// What it selected, in words (its last error apart: see `last_error`).
    pub selection: String,
    /// The last error of the dead letters it selected, when it selected by one: the text as
    /// the consumer gave it, for a page to show as it shows every error text.
    pub last_error: Option<String>,
    pub rate: u32,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub progress: ReplayProgress,
    pub outcome: JobOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    Running,
    Done,
    /// Stopped before its end (the caller went away, the server stopped).
    Stopped,
    Failed(String),
}

impl JobOutcome {
    pub fn as_str(&self) -> &str {
        match self {
            JobOutcome::Running => "running",
            JobOutcome::Done => "done",
            JobOutcome::Stopped => "stopped",
            JobOutcome::Failed(_) => "failed",
        }
    }
}

impl ReplayJobs {
    fn start(&self, plan: &ReplayPlan, origin: &Origin, rate: u32, now: DateTime<Utc>) -> u64 {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.0 += 1;
        let id = inner.0;
        inner.1.push_front(ReplayJob {
            id,
            consumer: plan.consumer.to_string(),
            principal: origin.principal.clone(),
            selection: describe(plan),
            last_error: plan.filter.last_error.clone(),
            rate,
            started_at: now,
            finished_at: None,
            progress: ReplayProgress::default(),
            outcome: JobOutcome::Running,
        });
        // Finished ones go first when the list is full; running ones stay.
        while inner.1.len() > KEPT_JOBS {
            match inner.1.iter().rposition(|j| j.outcome != JobOutcome::Running) {
                Some(i) => {
                    inner.1.remove(i);
                }
                None => break,
            }
        }
        id
    }

    fn update(&self, id: u64, f: impl FnOnce(&mut ReplayJob)) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(j) = inner.1.iter_mut().find(|j| j.id == id) {
            f(j);
        }
    }

    /// Newest first.
    pub fn list(&self) -> Vec<ReplayJob> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).1.iter().cloned().collect()
    }

    pub fn get(&self, id: u64) -> Option<ReplayJob> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).1.iter().find(|j| j.id == id).cloned()
    }
}

/// A replay's selection in words, for people, but for its last error: a text of the
/// consumer's, which a page shows as it is (quoting it here would escape its quotes).
fn describe(plan: &ReplayPlan) -> String {
    let f = &plan.filter;
    let mut parts = Vec::new();
    if !f.message_ids.is_empty() {
        parts.push(format!("{} message ids", f.message_ids.len()));
    }
    if f.dead_only {
        parts.push("dead letters".to_owned());
    }
    if let Some(t) = f.enqueued_after {
        parts.push(format!("enqueued from {}", t.to_rfc3339()));
    }
    if let Some(t) = f.enqueued_before {
        parts.push(format!("enqueued before {}", t.to_rfc3339()));
    }
    if !f.types.is_empty() {
        parts.push(format!("types {}", f.types.join(", ")));
    }
    if !plan.topics.is_empty() {
        parts.push(format!("topics {}", plan.topics.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(", ")));
    }
    parts.join("; ")
}

/// Who asked for a replay, for its audit line.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    pub principal: String,
    pub peer: Option<SocketAddr>,
}

impl Replayer {
    pub fn new(store: SharedStore, clock: SharedClock, hub: Hub, retention: Duration, default_rate: u32) -> Self {
        Self {
            store,
            clock,
            hub,
            retention,
            default_rate: default_rate.max(1),
            shutdown: CancellationToken::new(),
            jobs: ReplayJobs::default(),
        }
    }

    /// The replays of this process.
    pub fn jobs(&self) -> &ReplayJobs {
        &self.jobs
    }

    /// Runs `plan` in its own task on `tasks`, and returns its job's id at once: for callers
    /// that watch [`Replayer::jobs`] instead of holding a stream (the console). The replay
    /// stops after its current batch once `stop` resolves (its principal may no longer replay).
    /// `None`: the principal already runs [`MAX_RUNNING_PER_PRINCIPAL`] replays.
    pub fn start(
        &self,
        plan: ReplayPlan,
        origin: Origin,
        tasks: &tokio_util::task::TaskTracker,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Option<u64> {
        let running = self
            .jobs
            .list()
            .iter()
            .filter(|j| j.principal == origin.principal && j.outcome == JobOutcome::Running)
            .count();
        if running >= MAX_RUNNING_PER_PRINCIPAL {
            return None;
        }
        let rate = if plan.max_per_second == 0 { self.default_rate } else { plan.max_per_second };
        let id = self.jobs.start(&plan, &origin, rate, self.clock.now());
        let this = self.clone();
        tasks.spawn(async move {
            let stopped = CancellationToken::new();
            let run = this.run_as(&plan, &origin, None, Some(id), Some(stopped.clone()));
            let mut run = std::pin::pin!(run);
            tokio::select! {
                _ = run.as_mut() => {}
                () = stop => {
                    stopped.cancel();
                    let _ = run.await;
                }
            }
        });
        Some(id)
    }

    /// Stops running replays after their current batch once `shutdown` is cancelled (what is
    /// done stays done; the audit line says it did not complete).
    pub fn with_shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// Runs `plan` to its end, sending progress after the count and after every batch; stops
    /// early (keeping what is done) once `progress` is closed. Every run is audited.
    pub async fn run(
        &self,
        plan: &ReplayPlan,
        origin: &Origin,
        progress: Option<mpsc::Sender<ReplayProgress>>,
    ) -> Result<ReplayProgress, StoreError> {
        let job = (!plan.dry_run).then(|| {
            let rate = if plan.max_per_second == 0 { self.default_rate } else { plan.max_per_second };
            self.jobs.start(plan, origin, rate, self.clock.now())
        });
        self.run_as(plan, origin, progress, job, None).await
    }

    async fn run_as(
        &self,
        plan: &ReplayPlan,
        origin: &Origin,
        progress: Option<mpsc::Sender<ReplayProgress>>,
        job: Option<u64>,
        stopped: Option<CancellationToken>,
    ) -> Result<ReplayProgress, StoreError> {
        let (principal, peer) = (origin.principal.as_str(), origin.peer);
        let rate = if plan.max_per_second == 0 { self.default_rate } else { plan.max_per_second };
        let result = self.execute(plan, rate, progress, job, stopped.unwrap_or_default()).await;
        if let Some(id) = job {
            let now = self.clock.now();
            self.jobs.update(id, |j| {
                j.finished_at = Some(now);
                match &result {
                    Ok(p) => {
                        j.progress = *p;
                        j.outcome = if p.done { JobOutcome::Done } else { JobOutcome::Stopped };
                    }
                    Err(e) => j.outcome = JobOutcome::Failed(e.to_string()),
                }
            });
        }
        let (consumer, filter, topics) = (plan.consumer.as_str(), &plan.filter, &plan.topics);
        match &result {
            Ok(p) => tracing::info!(
                target: "outboxd::audit", consumer, ?filter, ?topics, dry_run = plan.dry_run,
                allow_beyond_retention = plan.allow_beyond_retention, rate, selected = p.selected,
                replayed = p.replayed, beyond_retention = p.beyond_retention, completed = p.done, principal, ?peer,
                action = "replay", outcome = "ok", "replay"
            ),
            Err(e) => tracing::warn!(
                target: "outboxd::audit", consumer, ?filter, ?topics, dry_run = plan.dry_run, error = %e, principal,
                ?peer, action = "replay", outcome = "refused", "replay refused"
            ),
        }
        result
    }

    async fn execute(
        &self,
        plan: &ReplayPlan,
        rate: u32,
        progress: Option<mpsc::Sender<ReplayProgress>>,
        job: Option<u64>,
        stopped: CancellationToken,
    ) -> Result<ReplayProgress, StoreError> {
        let report = async |p: ReplayProgress| {
            if let Some(id) = job {
                self.jobs.update(id, |j| j.progress = p);
            }
            report(&progress, p).await
        };
        let cutoff = self.retention_cutoff();
        let spec = self.store.consumer_get(&plan.consumer).await?.spec;
        let mut state = ReplayProgress::default();
        // Count everything first: nothing changes before the retention check has passed.
        let mut after = 0;
        loop {
            let page = self.page(plan, &spec, after, COUNT_PAGE).await?;
            state.selected += page.ids.len() as u64;
            state.beyond_retention += page.candidates.iter().filter(|c| c.enqueued_at < cutoff).count() as u64;
            match page.next {
                Some(next) => after = next,
                None => break,
            }
        }
        if state.beyond_retention > 0 && !plan.allow_beyond_retention {
            return Err(StoreError::BeyondRetention(state.beyond_retention));
        }
        if plan.dry_run || state.selected == 0 {
            state.done = true;
            report(state).await;
            return Ok(state);
        }
        if !report(state).await {
            return Ok(state);
        }
        let batch = rate.min(MAX_BATCH);
        let mut pace = tokio::time::interval(per_batch(batch, rate));
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut after = 0;
        loop {
            let page = self.page(plan, &spec, after, i64::from(batch)).await?;
            if !page.ids.is_empty() {
                pace.tick().await;
                let waking = Waking::new(&self.store, &self.hub);
                state.replayed += waking.replay(&plan.consumer, &page.ids, self.clock.now()).await?;
            }
            let Some(next) = page.next else { break };
            after = next;
            if self.shutdown.is_cancelled() || stopped.is_cancelled() || !report(state).await {
                return Ok(state);
            }
        }
        state.done = true;
        report(state).await;
        Ok(state)
    }

    /// One page of candidates after `after`, with the topic rules applied.
    async fn page(&self, plan: &ReplayPlan, spec: &ConsumerSpec, after: i64, limit: i64) -> Result<Page, StoreError> {
        let mut candidates = self
            .store
            .replay_candidates(
                &plan.consumer,
                &ReplayCandidatesParams { filter: &plan.filter, after_seq: after, limit },
            )
            .await?;
        let next = if (candidates.len() as i64) < limit { None } else { candidates.last().map(|c| c.seq) };
        // Only the consumer's own topics, also for ids named one by one: a replay must not
        // hand a consumer (and whoever may replay into it) messages it never takes, and a dry
        // run says nothing of ids outside them.
        candidates.retain(|c| {
            spec.matches(&c.topic) && (plan.topics.is_empty() || plan.topics.iter().any(|p| p.matches(&c.topic)))
        });
        let ids = candidates.iter().map(|c| c.message_id).collect();
        Ok(Page { candidates, ids, next })
    }

    fn retention_cutoff(&self) -> DateTime<Utc> {
        let age = chrono::Duration::from_std(self.retention).unwrap_or(chrono::Duration::MAX);
        self.clock.now().checked_sub_signed(age).unwrap_or(DateTime::<Utc>::MIN_UTC)
    }
}

struct Page {
    candidates: Vec<ReplayCandidate>,
    ids: Vec<MessageId>,
    /// Where the next page starts; `None` after the last.
    next: Option<i64>,
}

/// Sends `p`; false once nobody listens (a caller without a channel always "listens").
async fn report(progress: &Option<mpsc::Sender<ReplayProgress>>, p: ReplayProgress) -> bool {
    match progress {
        Some(tx) => tx.send(p).await.is_ok(),
        None => true,
    }
}

/// The time one batch of `batch` deliveries takes at `rate` per second.
fn per_batch(batch: u32, rate: u32) -> Duration {
    Duration::from_secs_f64(f64::from(batch) / f64::from(rate.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_paced_to_the_rate() {
        assert_eq!(per_batch(500, 1000), Duration::from_millis(500));
        assert_eq!(per_batch(10, 10), Duration::from_secs(1));
        assert_eq!(per_batch(500, 50_000), Duration::from_millis(10));
        assert_eq!(per_batch(1, 0), Duration::from_secs(1), "a zero rate is treated as one per second");
    }
}

//! The relay: moves committed messages from the outbox into every matching consumer's inbox.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::SharedClock;
use crate::domain::{ConsumerName, LeasedDelivery, RelayOutcome, Release, ReleaseGuard, Withdrawal};
use crate::hub::Hub;
use crate::store::{SharedStore, StoreError};
use crate::waking::Waking;

#[cfg(test)]
mod store_tests;

/// How the relay waits for work. It polls: again at once after a pass that found work; every
/// `poll_min` for `hot_for` after the last work it found (traffic is likely to go on, and each
/// empty poll is one cheap indexed probe); then doubling up to `poll_max` while nothing comes.
/// Messages enqueued through this process's `Enqueue` RPC wake it at once, and so do, whenever
/// it is about to sleep (`wake_on_commit`), producers' commits in other processes: on
/// PostgreSQL a NOTIFY from the statement of the first producer that commits while the relay
/// sleeps, asked for by the probe before the sleep and withdrawn by the next pass that finds
/// work, so that a relay kept busy asks for none (a NOTIFY on every commit would serialise
/// producers' commits; ADR 0051, 0063); on SQLite the store's watcher.
#[derive(Debug, Clone, Copy)]
pub struct RelayConfig {
    pub pass_size: i64,
    pub poll_min: Duration,
    pub poll_max: Duration,
    pub hot_for: Duration,
    /// Announce new deliveries to other replicas with one NOTIFY per batch.
    pub notify: bool,
    /// While backed off, ask producers' commits to wake this relay
    /// ([`crate::store::Store::message_unrelayed_exists_asking_wakeup`]); needs the store's
    /// watcher to listen.
    pub wake_on_commit: bool,
    /// After a pass that found work but less than a batch, wait this long before the next
    /// (zero: at once). On SQLite, where every pass takes the one write lock that producers
    /// need too, a short gap lets a busy flow gather into fewer, larger passes.
    pub gather: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            pass_size: 500,
            poll_min: Duration::from_millis(1),
            poll_max: Duration::from_millis(500),
            hot_for: Duration::from_secs(1),
            notify: true,
            wake_on_commit: true,
            gather: Duration::ZERO,
        }
    }
}

/// The wait before the next poll, `idle` after the last pass that found work, `previous` the
/// last wait.
fn next_wait(config: &RelayConfig, idle: Duration, previous: Duration) -> Duration {
    if idle < config.hot_for { config.poll_min } else { (previous * 2).clamp(config.poll_min, config.poll_max) }
}

/// How long to wait before the next pass after one that found `found` messages (at least
/// one): `gather` when the pass did not fill a batch, so that a busy flow gathers into fewer,
/// larger passes; none after a full batch, so that a backlog goes on at once.
fn gather_after(config: &RelayConfig, found: u64) -> Option<Duration> {
    let short = i64::try_from(found).unwrap_or(i64::MAX) < config.pass_size;
    (short && !config.gather.is_zero()).then_some(config.gather)
}

/// How long a backed-off relay's request to be woken holds: several of its longest polls, so
/// that the probe that renews it comes well before it lapses, and at least a few seconds. A relay
/// that died stops renewing it, and producers' commits stop notifying within this long.
fn wakeup_lease(config: &RelayConfig) -> Duration {
    (config.poll_max * 4).max(Duration::from_secs(4))
}

/// Below this rate of messages a relay that caught up asks producers' commits to wake it before
/// it sleeps; at or above it, it polls every `poll_min` as before. Each wake-up costs the
/// producer that commits first a NOTIFY, and notifying commits are serialised (PERF-NOTES): at
/// low rates that costs nothing and saves the poll's wait, at high rates the next message comes
/// within a poll anyway and the notifications would cost producers throughput (measured: about
/// 5 % of end to end when asking at every rate; ADR 0063).
const ASK_BELOW_PER_S: u64 = 2_000;

/// The span over which [`Arrivals`] measures the rate.
const RATE_SPAN: Duration = Duration::from_millis(100);

/// How fast messages are committed, as this process's passes see it, to tell a trickle from a
/// flow. Several replicas split the passes, so what one replica's passes find says little of the
/// flow: the log's seq, which every pass that finds work sees the latest of, says it for all of
/// them (and counts rolled-back seqs too, which is close enough for a rate).
#[derive(Debug, Default)]
struct Arrivals {
    /// The passes of the last [`RATE_SPAN`] that found work: when, how many, the highest seq.
    passes: std::collections::VecDeque<(std::time::Instant, u64, i64)>,
}

impl Arrivals {
    /// A pass at `at` found `n` messages, up to seq `last_seq`.
    fn found(&mut self, at: std::time::Instant, n: u64, last_seq: i64) {
        self.forget(at);
        self.passes.push_back((at, n, last_seq));
    }

    /// Messages per second over the last [`RATE_SPAN`] at `at`: how far the log's seq moved
    /// between the first and the last pass in the span that found work, or what this process's
    /// passes found, whichever is more.
    fn rate(&mut self, at: std::time::Instant) -> u64 {
        self.forget(at);
        let found: u64 = self.passes.iter().map(|p| p.1).sum();
        let moved = match (self.passes.front(), self.passes.back()) {
            (Some(first), Some(last)) => u64::try_from(last.2 - first.2).unwrap_or(0) + first.1,
            _ => 0,
        };
        found.max(moved) * 1000 / RATE_SPAN.as_millis() as u64
    }

    fn forget(&mut self, at: std::time::Instant) {
        while self.passes.front().is_some_and(|p| at.saturating_duration_since(p.0) >= RATE_SPAN) {
            self.passes.pop_front();
        }
    }
}

#[derive(Debug, Clone)]
pub struct Relay {
    store: SharedStore,
    clock: SharedClock,
    hub: Hub,
    config: RelayConfig,
    /// What this process's passes (the main loop's and the helper's) found lately.
    arrivals: Arc<Mutex<Arrivals>>,
    /// Until when this process's request to be woken by producers' commits holds, if it asked
    /// since a pass last found work (that pass cleared the request in the database).
    wakeup_asked_until: Arc<Mutex<Option<std::time::Instant>>>,
}

impl Relay {
    pub fn new(store: SharedStore, clock: SharedClock, hub: Hub, config: RelayConfig) -> Self {
        Self { store, clock, hub, config, arrivals: Arc::default(), wakeup_asked_until: Arc::default() }
    }

    fn arrivals(&self) -> std::sync::MutexGuard<'_, Arrivals> {
        self.arrivals.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether messages flow at [`ASK_BELOW_PER_S`] or more: a relay that caught up then polls
    /// instead of asking producers' commits to wake it.
    fn flowing(&self) -> bool {
        self.arrivals().rate(std::time::Instant::now()) >= ASK_BELOW_PER_S
    }

    fn asked_until(&self) -> std::sync::MutexGuard<'_, Option<std::time::Instant>> {
        self.wakeup_asked_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A probe for unrelayed messages. Unless a request to be woken by producers' commits
    /// holds (a pass that finds work withdraws it), the same statement makes one, and renews it
    /// when half of it has run out (ADR 0051): hot or backed off, the relay sleeps only with a
    /// request in place, so the first commit wakes it instead of its next poll (ADR 0063).
    /// While messages flow faster than [`ASK_BELOW_PER_S`] (`flowing`) it does not ask.
    async fn probe(&self, flowing: bool) -> Result<bool, StoreError> {
        let lease = wakeup_lease(&self.config);
        let now = std::time::Instant::now();
        let ask = self.config.wake_on_commit
            && !flowing
            && self.asked_until().is_none_or(|until| until.saturating_duration_since(now) < lease / 2);
        if !ask {
            return self.store.message_unrelayed_exists().await;
        }
        let found = self.store.message_unrelayed_exists_asking_wakeup(lease).await?;
        *self.asked_until() = Some(now + lease);
        Ok(found)
    }

    /// One pass: claim a batch, fan it out, commit, wake the consumers that got deliveries.
    pub async fn run_once(&self) -> Result<RelayOutcome, StoreError> {
        let started = std::time::Instant::now();
        let slots = self.hub.push_slots();
        let (batch, now, notify) = (self.config.pass_size, self.clock.now(), self.config.notify);
        // The lends of this process's streams; the guard ends the pass's hold on them whatever
        // happens to the pass.
        let offered = slots.offer(usize::try_from(batch).unwrap_or(0), now);
        let (mut out, owed) =
            Waking::new(&self.store, &self.hub).run_pass(batch, now, notify, offered.offers()).await?;
        let unsent = offered.hand_over(std::mem::take(&mut out.pushed));
        self.release_unsent(unsent).await;
        // The pass wakes whom it made work for once it has handed its pushed deliveries over.
        drop(owed);
        if out.messages > 0 {
            *self.asked_until() = None;
            if let Some(last) = out.last_seq {
                self.arrivals().found(std::time::Instant::now(), out.messages, last);
            }
            crate::metrics::relayed(out.messages, started.elapsed());
        }
        // One span per traced message, continuing its producer's trace; it ends here, once the
        // message's deliveries are committed.
        for (message_id, traceparent) in &out.traced {
            let span = tracing::info_span!("outboxd.relay", message_id = %message_id, batch = out.messages);
            crate::telemetry::continue_trace(&span, traceparent, None);
        }
        if out.messages > 0 {
            tracing::debug!(messages = out.messages, deliveries = out.deliveries, "relayed");
        }
        Ok(out)
    }

    /// Releases deliveries leased at fan-out to streams that ended before the hand-over, at
    /// once, for any stream to take. No consumer saw them: the count their push added is
    /// taken back, so the next delivery counts the same attempt.
    async fn release_unsent(&self, unsent: Vec<(String, String, Vec<LeasedDelivery>)>) {
        for (consumer, session, deliveries) in unsent {
            let Ok(name) = ConsumerName::parse("consumer", &consumer) else { continue };
            let now = self.clock.now();
            let releases: Vec<Release> = deliveries
                .iter()
                .map(|d| Withdrawal::Unsent.release(name.clone(), d.message.message_id, now))
                .collect();
            let released = Waking::new(&self.store, &self.hub).release(&releases, ReleaseGuard::Session(&session), now);
            if let Err(e) = released.await {
                tracing::warn!(consumer, error = %e, "could not release deliveries of a stream that ended; the sweeper will");
            }
        }
    }

    /// A second relay loop for backlogs: idle until a pass somewhere in this process claims a
    /// full batch, then runs passes back to back while they come back full. One loop alone
    /// keeps up with steady traffic; two overlap their round trips when there is a backlog.
    pub async fn run_helper(self, cancel: CancellationToken) {
        let mut backlog = self.hub.relay_backlog().subscribe();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = backlog.changed() => if changed.is_err() { return },
            }
            loop {
                match self.run_once().await {
                    Ok(out) if out.messages as i64 >= self.config.pass_size && !cancel.is_cancelled() => {}
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "relay pass failed");
                        break;
                    }
                }
            }
        }
    }

    /// Runs passes until cancelled; a failed pass is logged and retried after `poll_max`.
    pub async fn run(self, cancel: CancellationToken) {
        let mut enqueued = self.hub.enqueued().subscribe();
        let mut wait = self.config.poll_min;
        // None until a pass finds work: a process that starts on a quiet outbox backs off at
        // once instead of probing every `poll_min` for its first `hot_for`.
        let mut last_work: Option<std::time::Instant> = None;
        let mut probe = false;
        loop {
            // After an empty pass, a one-statement probe decides whether a pass is worth it.
            let found = if probe { self.probe(self.flowing()).await } else { Ok(true) };
            let pass = match found {
                Ok(true) => self.run_once().await.map(|out| out.messages),
                Ok(false) => Ok(0),
                Err(e) => Err(e),
            };
            match pass {
                // Found work: more may have committed meanwhile, so look again at once. Busy
                // means no polling delay.
                Ok(n) if n > 0 => {
                    wait = self.config.poll_min;
                    last_work = Some(std::time::Instant::now());
                    probe = false;
                    if cancel.is_cancelled() {
                        return;
                    }
                    if let Some(gather) = gather_after(&self.config, n) {
                        tokio::select! {
                            _ = cancel.cancelled() => return,
                            _ = tokio::time::sleep(gather) => {}
                        }
                    }
                    continue;
                }
                Ok(_) => {
                    let idle = last_work.map_or(Duration::MAX, |at| at.elapsed());
                    wait = next_wait(&self.config, idle, wait);
                    probe = true;
                    // Not asked yet, and no flow that the next poll would find anyway: the probe
                    // that asks comes before any sleep, so that the first commit while the relay
                    // sleeps wakes it, not its next poll.
                    if self.config.wake_on_commit && self.asked_until().is_none() && !self.flowing() {
                        continue;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "relay pass failed; retrying");
                    wait = self.config.poll_max;
                    probe = false;
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = enqueued.changed() => { wait = self.config.poll_min; probe = false; }
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_how_far_the_log_moved_over_the_last_span() {
        let mut a = Arrivals::default();
        let t0 = std::time::Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(a.rate(t0), 0);
        a.found(t0, 50, 1_050);
        a.found(t0 + ms(40), 100, 1_150);
        assert_eq!(a.rate(t0 + ms(50)), 1_500, "150 in the last 100 ms");
        assert!(a.rate(t0 + ms(50)) < ASK_BELOW_PER_S, "a trickle: ask to be woken");
        a.found(t0 + ms(60), 100, 1_250);
        assert!(a.rate(t0 + ms(60)) >= ASK_BELOW_PER_S, "a flow: poll");
        assert_eq!(a.rate(t0 + ms(120)), 2_000, "the first pass has left the span");
        assert_eq!(a.rate(t0 + Duration::from_secs(1)), 0, "and then all of them");
        // Another replica relayed most of the flow: this one's passes found 2 messages each,
        // but the log moved by 400 between them.
        let mut b = Arrivals::default();
        b.found(t0, 2, 5_000);
        b.found(t0 + ms(50), 2, 5_400);
        assert_eq!(b.rate(t0 + ms(60)), 4_020, "the flow of every replica");
    }

    #[test]
    fn a_pass_short_of_a_batch_waits_to_gather_and_a_full_one_goes_on() {
        let ms = Duration::from_millis;
        let c = RelayConfig { pass_size: 100, gather: ms(1), ..RelayConfig::default() };
        assert_eq!(gather_after(&c, 1), Some(ms(1)), "a flow gathers into the next pass");
        assert_eq!(gather_after(&c, 99), Some(ms(1)));
        assert_eq!(gather_after(&c, 100), None, "a full batch: a backlog, on at once");
        assert_eq!(gather_after(&RelayConfig { gather: Duration::ZERO, ..c }, 50), None, "no gather set (PostgreSQL)");
    }

    #[test]
    fn polls_fast_while_traffic_is_recent_then_backs_off() {
        let c = RelayConfig::default();
        let ms = Duration::from_millis;
        assert_eq!(next_wait(&c, ms(10), ms(1)), ms(1), "hot: every poll_min");
        assert_eq!(next_wait(&c, ms(999), ms(1)), ms(1));
        assert_eq!(next_wait(&c, ms(1000), ms(1)), ms(2), "then doubling");
        assert_eq!(next_wait(&c, ms(5000), ms(300)), ms(500), "up to poll_max");
        assert_eq!(next_wait(&c, ms(5000), ms(500)), ms(500));
    }
}

//! The vacuumer: keeps outboxd's own tables clean where the database's autovacuum does not
//! (turned off, or behind): every message and delivery leaves dead row versions behind, and
//! the index scans that find pending work step over their entries until a vacuum removes them.
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::store::{SharedStore, StoreError};

/// A table is vacuumed once it has more dead rows than this…
pub const MIN_DEAD_ROWS: i64 = 5_000;
/// …and more than this share of its live rows.
pub const DEAD_RATIO: f64 = 0.1;

/// A table whose live rows grew by more than this share since the last round (and by more than
/// `min_dead_rows`) is vacuumed too, with its statistics: a backlog written into an empty table
/// leaves no dead rows, and plans made while it was empty may scan it whole until an ANALYZE
/// tells the planner its size. Shrinking is left to the dead-row rule: a plan made for a large
/// table stays fine on a small one, and counts that drop with a TRUNCATE (whose statistics land
/// up to 10 s late) would otherwise vacuum an idle outboxd's tables round after round.
pub const GROWTH_RATIO: f64 = 0.5;

/// While the tables' row counts stand still (nothing written since the last round), each round
/// waits twice as long as the one before, up to this; work that this process relays meanwhile
/// brings the next round back to the interval at once.
pub const QUIET_MAX: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct Vacuumer {
    store: SharedStore,
    pub interval: Duration,
    pub min_dead_rows: i64,
    pub dead_ratio: f64,
    /// Changes when this process's relay reads messages (`Hub::relayed`).
    activity: Option<watch::Receiver<u64>>,
}

/// The live and dead row counts of each table, as a round read them.
type Counts = Vec<(String, i64, i64)>;

/// The wait before the next round: `interval` after a round that found the counts changed,
/// twice the last wait (up to [`QUIET_MAX`], never below `interval`) after one that found them
/// as they were.
fn next_wait(interval: Duration, last: Duration, changed: bool) -> Duration {
    if changed { interval } else { (last * 2).clamp(interval, QUIET_MAX.max(interval)) }
}

/// The tables past both dead-row thresholds (`min_dead_rows`, and `dead_ratio` of their live
/// rows), and those whose live rows grew by more than [`GROWTH_RATIO`] (and `min_dead_rows`)
/// since `last`.
fn due(counts: &Counts, last: Option<&Counts>, min_dead_rows: i64, dead_ratio: f64) -> Vec<String> {
    let before = |table: &str| last.and_then(|l| l.iter().find(|(t, _, _)| t == table)).map(|(_, live, _)| *live);
    counts
        .iter()
        .filter(|(table, live, dead)| {
            let dirty = *dead > min_dead_rows && *dead as f64 > dead_ratio * *live as f64;
            let moved = before(table).is_some_and(|was| {
                let growth = live - was;
                growth > min_dead_rows && growth as f64 > GROWTH_RATIO * was as f64
            });
            dirty || moved
        })
        .map(|(table, _, _)| table.clone())
        .collect()
}

/// Sleeps `wait`, but no longer than `interval` from the moment `activity` changes. Returns false
/// when cancelled.
async fn rest(
    wait: Duration,
    interval: Duration,
    activity: Option<&mut watch::Receiver<u64>>,
    cancel: &CancellationToken,
) -> bool {
    let sleep = tokio::time::sleep(wait);
    tokio::pin!(sleep);
    let Some(activity) = activity else {
        return tokio::select! {
            _ = cancel.cancelled() => false,
            _ = &mut sleep => true,
        };
    };
    let mut cut = wait <= interval;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return false,
            _ = &mut sleep => return true,
            Ok(()) = activity.changed(), if !cut => {
                cut = true;
                let by = tokio::time::Instant::now() + interval;
                if by < sleep.deadline() {
                    sleep.as_mut().reset(by);
                }
            }
        }
    }
}

impl Vacuumer {
    pub fn new(store: SharedStore, interval: Duration) -> Self {
        Self { store, interval, min_dead_rows: MIN_DEAD_ROWS, dead_ratio: DEAD_RATIO, activity: None }
    }

    /// Rounds that back off while the tables stand still come back to the interval as soon as
    /// `activity` changes.
    pub fn with_activity(mut self, activity: watch::Receiver<u64>) -> Self {
        self.activity = Some(activity);
        self
    }

    /// One round: the tables past both thresholds, vacuumed; returns them.
    pub async fn run_once(&self) -> Result<Vec<String>, StoreError> {
        Ok(self.round(None).await?.0)
    }

    async fn round(&self, last: Option<&Counts>) -> Result<(Vec<String>, Counts), StoreError> {
        let started = std::time::Instant::now();
        let health = self.store.table_health().await?;
        let counts: Counts = health.into_iter().map(|t| (t.table, t.live_rows, t.dead_rows)).collect();
        let due = due(&counts, last, self.min_dead_rows, self.dead_ratio);
        let done = self.store.vacuum_tables(&due).await?;
        if !done.is_empty() {
            tracing::info!(tables = ?done, took = ?started.elapsed(), "vacuumed");
        }
        Ok((done, counts))
    }

    /// Runs rounds until cancelled: every `interval` while outboxd's tables change, less and
    /// less often while they stand still (an idle outboxd reads their statistics about once a
    /// minute), and again every `interval` from the moment the relay has work. A round that
    /// vacuumed counts as a change.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut wait = self.interval;
        let mut last: Option<Counts> = None;
        let mut activity = self.activity.take();
        if let Some(a) = activity.as_mut() {
            a.mark_unchanged();
        }
        loop {
            if !rest(wait, self.interval, activity.as_mut(), &cancel).await {
                return;
            }
            match self.round(last.as_ref()).await {
                Ok((done, counts)) => {
                    let changed = !done.is_empty() || last.as_ref() != Some(&counts);
                    wait = next_wait(self.interval, wait, changed);
                    last = Some(counts);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "vacuum failed; retrying at the next interval");
                    wait = self.interval;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round that waits a minute for quiet tables comes within the interval of the relay's
    /// next work (bounded: the interval here is 50 ms, the quiet wait 60 s).
    #[tokio::test]
    async fn relayed_work_cuts_a_quiet_wait_short_to_the_interval() {
        let (tx, mut rx) = watch::channel(0u64);
        let cancel = CancellationToken::new();
        let started = std::time::Instant::now();
        let waiting = rest(QUIET_MAX, Duration::from_millis(50), Some(&mut rx), &cancel);
        let poke = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            tx.send_modify(|v| *v += 1);
        };
        let (rested, ()) = tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(waiting, poke) })
            .await
            .expect("the wait ended within 10 s of a change, not after QUIET_MAX");
        assert!(rested, "not cancelled");
        assert!(started.elapsed() >= Duration::from_millis(70), "the interval counts from the change");

        let cancelled = CancellationToken::new();
        cancelled.cancel();
        assert!(!rest(QUIET_MAX, Duration::from_millis(50), Some(&mut rx), &cancelled).await);
    }

    #[test]
    fn tables_with_many_dead_rows_or_that_grew_a_lot_are_due() {
        let due = |c: &Counts, l: Option<&Counts>| due(c, l, MIN_DEAD_ROWS, DEAD_RATIO);
        let counts =
            |rows: &[(&str, i64, i64)]| -> Counts { rows.iter().map(|(t, l, d)| ((*t).to_owned(), *l, *d)).collect() };
        let now = counts(&[("dirty", 10_000, 6_000), ("grown", 100_000, 0), ("steady", 100_000, 0), ("new", 9_000, 0)]);
        assert_eq!(due(&now, None), ["dirty"], "no earlier round: dead rows alone");
        let before = counts(&[("dirty", 10_000, 0), ("grown", 0, 0), ("steady", 90_000, 0)]);
        assert_eq!(due(&now, Some(&before)), ["dirty", "grown"], "grown from empty; a 10 % change is not enough");
        let shrunk = counts(&[("grown", 0, 0)]);
        assert!(due(&shrunk, Some(&now)).is_empty(), "emptied (a TRUNCATE, a drain): no dead rows, not due");
        let small = counts(&[("grown", 4_000, 0)]);
        assert!(due(&small, Some(&counts(&[("grown", 0, 0)]))).is_empty(), "fewer rows than min_dead_rows: left alone");
    }

    #[test]
    fn rounds_back_off_while_the_counts_stand_still_and_return_to_the_interval_on_a_change() {
        let s = Duration::from_secs;
        assert_eq!(next_wait(s(5), s(5), false), s(10));
        assert_eq!(next_wait(s(5), s(40), false), s(60), "at most a minute");
        assert_eq!(next_wait(s(5), s(60), false), s(60));
        assert_eq!(next_wait(s(5), s(60), true), s(5), "a change: back to the interval");
        assert_eq!(next_wait(s(90), s(90), false), s(90), "never below the interval");
    }
}

//! `outboxd relay --once`: one relay pass and one round of due sink deliveries, then exit; for
//! teams that turn the background relay off and run it from their own scheduler (cron, a
//! Kubernetes CronJob, a job runner). Safe beside serving replicas on PostgreSQL: the relay
//! takes its turn on the cursor like theirs, and sink leases are skipped by their sessions.
use std::time::Duration;

use serde::Serialize;

use crate::clock::SharedClock;
use crate::hub::Hub;
use crate::relay::{Relay, RelayConfig};
use crate::sinks::round::{self, RoundReport};
use crate::store::{SharedStore, StoreError};

/// Exit code when the pass found nothing to relay and no sink had anything due.
pub const EXIT_NOTHING_TO_DO: i32 = 3;
/// Exit code when the database could not be reached.
pub const EXIT_DATABASE_UNREACHABLE: i32 = 4;

/// Passes of one run at most: a backlog larger than this many batches is left for the next run.
const MAX_PASSES: u32 = 1000;

/// What one run moved (the `--output json` object).
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct OnceReport {
    /// Committed messages fanned out to consumers.
    pub relayed_messages: u64,
    /// Deliveries those made.
    pub relayed_deliveries: u64,
    /// Relay passes run.
    pub passes: u32,
    /// True when a backlog was left for the next run (more than the passes allowed).
    pub more: bool,
    /// One entry per sink consumer.
    pub sinks: Vec<RoundReport>,
}

impl OnceReport {
    pub fn nothing_to_do(&self) -> bool {
        self.relayed_messages == 0 && self.sinks.iter().all(|s| s.published == 0)
    }

    pub fn text(&self) -> String {
        let mut out = format!(
            "relayed {} message(s) into {} deliveries in {} pass(es){}",
            self.relayed_messages,
            self.relayed_deliveries,
            self.passes,
            if self.more { "; more are waiting" } else { "" }
        );
        for s in &self.sinks {
            out.push_str(&format!(
                "\nsink {} ({}): published {}, confirmed {}, failed {} ({} dead), unreachable {}",
                s.consumer, s.sink, s.published, s.confirmed, s.failed, s.dead, s.unavailable
            ));
            if let Some(e) = &s.error {
                out.push_str(&format!(" — {e}"));
            }
        }
        out
    }
}

/// One relay pass (batches until the log is caught up, at most [`MAX_PASSES`]) and one round
/// of each sink consumer's due deliveries.
pub async fn run(
    store: &SharedStore,
    clock: &SharedClock,
    batch: i64,
    sinks: bool,
    destinations: crate::sinks::destination::Destinations,
    owners: Option<&dyn crate::sinks::supervisor::SinkOwners>,
    key: Option<&crate::sinks::sealed::SinkKey>,
) -> Result<OnceReport, StoreError> {
    let config = RelayConfig { pass_size: batch, notify: true, gather: Duration::ZERO, ..RelayConfig::default() };
    // No stream runs in this process: the wake-ups of its writes reach no one.
    let hub = Hub::default();
    let relay = Relay::new(store.clone(), clock.clone(), hub.clone(), config);
    let mut report = OnceReport::default();
    loop {
        let pass = relay.run_once().await?;
        report.passes += 1;
        report.relayed_messages += pass.messages;
        report.relayed_deliveries += pass.deliveries;
        if pass.messages == 0 {
            break;
        }
        if report.passes >= MAX_PASSES {
            report.more = true;
            break;
        }
    }
    if sinks {
        for consumer in store.consumer_list().await? {
            let Some(sink) = &consumer.spec.sink else { continue };
            if let Some(why) = crate::sinks::supervisor::refused(owners, &consumer) {
                tracing::warn!(consumer = %consumer.spec.name, reason = %why, "sink skipped: its creator may no longer run it");
                continue;
            }
            let sink = match crate::sinks::sealed::open(key, sink) {
                Ok(sink) => sink,
                Err(e) => {
                    tracing::warn!(consumer = %consumer.spec.name, reason = %e, "sink skipped: it may not run");
                    continue;
                }
            };
            let target = crate::sinks::connect(&sink.target, destinations.clone());
            report.sinks.push(round::run(store, &hub, clock, &consumer, target.as_ref()).await?);
        }
    }
    Ok(report)
}

/// The exit code for a run's result.
pub fn exit_code(result: &Result<OnceReport, StoreError>) -> i32 {
    match result {
        Ok(r) if r.nothing_to_do() => EXIT_NOTHING_TO_DO,
        Ok(_) => 0,
        Err(e) if e.is_unreachable() => EXIT_DATABASE_UNREACHABLE,
        Err(_) => 1,
    }
}

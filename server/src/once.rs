//! `outboxd relay --once`: one relay pass and one round of due sink deliveries, then exit; for
//! teams that turn the background relay off and run it from their own scheduler (cron, a
//! Kubernetes CronJob, a job runner). Safe beside serving replicas on PostgreSQL: the relay
//! takes its turn on the cursor like theirs, and sink leases are skipped by their sessions.
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::clock::SharedClock;
use crate::config::DatabaseArgs;
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

#[derive(Debug, Clone, Args)]
pub struct RelayArgs {
    /// Run one pass and exit (the only mode: `outboxd serve` relays continuously).
    #[arg(long, required = true)]
    pub once: bool,
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// What to print: a line of text, or one JSON object.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Messages per relay batch.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub batch: i64,
    /// Fan out only; deliver no sinks.
    #[arg(long)]
    pub no_sinks: bool,
    /// Let sinks reach loopback, private and link-local addresses (as `serve`'s flag).
    #[arg(long, env = "OUTBOXD_SINK_ALLOW_PRIVATE")]
    pub sink_allow_private: bool,
    /// An internal network that sinks may reach all the same (as `serve`'s flag).
    #[arg(long, env = "OUTBOXD_SINK_ALLOW", value_delimiter = ',', value_name = "NETWORK", value_parser = crate::config::parse_net)]
    pub sink_allow: Vec<ipnet::IpNet>,
    /// Do not apply migrations first.
    #[arg(long)]
    pub no_migrate: bool,
    /// The auth file `serve` runs with: a sink then runs only while its creator may still
    /// create it and read its topics, as under `serve`. Without it every sink runs.
    #[arg(long, env = "OUTBOXD_AUTH_FILE", value_name = "PATH")]
    pub auth_file: Option<std::path::PathBuf>,
    /// The key `serve` seals sinks' secrets with (`--sink-key-file`), to open them.
    #[arg(long, env = "OUTBOXD_SINK_KEY_FILE", value_name = "PATH")]
    pub sink_key_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// What one run moved (the `--output json` object).
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct OnceReport {
    /// Committed messages fanned out to consumers' inboxes.
    pub relayed_messages: u64,
    /// Inbox rows (deliveries) those made.
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
    let config = RelayConfig { batch_size: batch, notify: true, gather: Duration::ZERO, ..RelayConfig::default() };
    let relay = Relay::new(store.clone(), clock.clone(), Hub::default(), config);
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
            report.sinks.push(round::run(store, clock, &consumer, target.as_ref()).await?);
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

//! `outboxctl replay`: make a consumer's deliveries due again.
use std::io::IsTerminal as _;

use anyhow::Result;
use chrono::{DateTime, Utc};
use clap::Args;
use outbox_client::grpc::AdminClient;
use outbox_proto::v1 as pb;
use serde_json::json;

use crate::Output;
use crate::failure::{Failure, confirm, status_failure};
use crate::format::{deliveries, timestamp};

#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    consumer: String,
    /// These message ids.
    #[arg(long = "id", conflicts_with_all = ["dead_letters", "after", "before"])]
    ids: Vec<String>,
    /// The consumer's dead letters (with --after/--before: those enqueued in that range).
    #[arg(long)]
    dead_letters: bool,
    /// Messages enqueued at or after this RFC 3339 time.
    #[arg(long)]
    after: Option<DateTime<Utc>>,
    /// Messages enqueued before this RFC 3339 time.
    #[arg(long)]
    before: Option<DateTime<Utc>>,
    /// Only messages of this type (repeatable).
    #[arg(long = "type", value_name = "TYPE")]
    types: Vec<String>,
    /// Only messages whose topic matches this name or pattern (repeatable).
    #[arg(long = "topic", value_name = "PATTERN")]
    topics: Vec<String>,
    /// Only dead letters whose last error is exactly this (with --dead-letters): one group, as
    /// the console shows them.
    #[arg(long, value_name = "ERROR", requires = "dead_letters")]
    last_error: Option<String>,
    /// Deliveries made due per second (default: the server's --replay-rate).
    #[arg(long, value_name = "PER_SECOND")]
    rate: Option<u32>,
    /// Only count what would be replayed.
    #[arg(long)]
    dry_run: bool,
    /// Replay messages older than the retention too (their dedup is gone: they may take effect twice).
    #[arg(long)]
    allow_beyond_retention: bool,
    /// Ask for confirmation when more than this many deliveries would be replayed.
    #[arg(long, default_value_t = 100, value_name = "N")]
    confirm_above: i64,
    /// Do not ask for confirmation.
    #[arg(long, short)]
    yes: bool,
}

pub(crate) async fn replay(admin: &mut AdminClient, out: Output, a: ReplayArgs) -> Result<(), Failure> {
    let mut what = if !a.ids.is_empty() {
        format!("{} message(s)", a.ids.len())
    } else if a.dead_letters || a.after.is_some() || a.before.is_some() {
        let mut w = if a.dead_letters { "dead letters".to_owned() } else { "messages".to_owned() };
        if a.after.is_some() || a.before.is_some() {
            w += &format!(
                " enqueued from {} to {}",
                a.after.map_or("the beginning".to_owned(), |t| t.to_rfc3339()),
                a.before.map_or("now".to_owned(), |t| t.to_rfc3339())
            );
        }
        w
    } else {
        return Err(Failure { code: 2, message: "replay needs --id, --dead-letters, or --after/--before".to_owned() });
    };
    if !a.types.is_empty() {
        what += &format!(" of type {}", a.types.join(" or "));
    }
    if !a.topics.is_empty() {
        what += &format!(" on {}", a.topics.join(" or "));
    }
    if let Some(e) = &a.last_error {
        what += &format!(" whose last error is {e:?}");
    }
    let req = pb::ReplayRequest {
        consumer: a.consumer.clone(),
        message_ids: a.ids,
        dead_letters: a.dead_letters,
        enqueued_after: a.after.map(timestamp),
        enqueued_before: a.before.map(timestamp),
        dry_run: true,
        allow_beyond_retention: a.allow_beyond_retention,
        types: a.types,
        topics: a.topics,
        max_per_second: a.rate.unwrap_or(0),
        last_error: a.last_error.clone().unwrap_or_default(),
    };
    // Always count first: the dry run also surfaces a refusal (beyond retention) before anything changes.
    let counted = admin.replay(req.clone()).await.map_err(|s| status_failure(&s))?.into_inner();
    let report = |replayed: i64, dry_run: bool, beyond: i64| {
        if out == Output::Json {
            println!(
                "{}",
                json!({ "consumer": a.consumer, "replayed": replayed, "dry_run": dry_run, "beyond_retention": beyond })
            );
        } else if dry_run {
            println!("would replay {} of {what} to {}", deliveries(replayed), a.consumer);
        } else {
            println!("replayed {} to {}", deliveries(replayed), a.consumer);
        }
    };
    if a.dry_run || counted.replayed == 0 {
        report(counted.replayed, true, counted.beyond_retention);
        return Ok(());
    }
    if counted.replayed > a.confirm_above {
        confirm(
            &format!(
                "Replay {} deliveries ({what}) to consumer {:?}? They are delivered again even if acked.",
                counted.replayed, a.consumer
            ),
            a.yes,
        )?;
    }
    let mut stream = admin
        .replay_stream(pb::ReplayRequest { dry_run: false, ..req })
        .await
        .map_err(|s| status_failure(&s))?
        .into_inner();
    // A progress bar on a terminal; scripts get the final line only.
    let bar = (out == Output::Table && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(u64::try_from(counted.replayed).unwrap_or(0));
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} deliveries  {per_sec}  eta {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let mut last = None;
    while let Some(p) = stream.message().await.map_err(|s| status_failure(&s))? {
        if let Some(bar) = &bar {
            bar.set_length(u64::try_from(p.selected).unwrap_or(0));
            bar.set_position(u64::try_from(p.replayed).unwrap_or(0));
        }
        last = Some(p);
    }
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    match last {
        Some(p) if p.done => {
            report(p.replayed, false, p.beyond_retention);
            Ok(())
        }
        p => Err(Failure {
            code: 1,
            message: format!(
                "the replay stopped before its end after {} deliveries; run it again to finish",
                p.map_or(0, |p| p.replayed)
            ),
        }),
    }
}

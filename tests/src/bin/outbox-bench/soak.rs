//! `--soak`: a long run at a steady rate, sampled as it goes.
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::consumers::Streams;
use crate::database::{pool, recreate_database, server_settings};
use crate::latency::Quantiles;
use crate::outboxd::{Secure, find_outboxd, rss_kib, start_outboxd};
use crate::producers::{Producers, Work};
use crate::report::round;
use crate::{Args, Bench, FLOW_MAX_IN_FLIGHT, Params, STREAMS, budget, payload, per_second};
use anyhow::Result;
use outbox_proto::v1 as pb;
use outbox_tests::{consumer, create_consumer};
use serde::Serialize;
use tokio::time::Instant;

/// One soak sample: the interval since the previous one.
#[derive(Debug, Serialize)]
pub(crate) struct SoakSample {
    pub(crate) at_s: u64,
    pub(crate) rss_mib: f64,
    /// Unrelayed messages plus the consumer's pending and in-flight deliveries.
    pub(crate) backlog: i64,
    pub(crate) acked_per_s: f64,
    /// Commit → delivery (enqueue time to receipt), 99th percentile over the interval.
    pub(crate) p99_ms: f64,
    /// Dead rows of outboxd's tables not yet vacuumed (PostgreSQL's statistics).
    pub(crate) dead_rows: i64,
    /// How long the oldest holder of the vacuum horizon has held it (GetStats), 0 if none.
    pub(crate) vacuum_held_s: f64,
}

/// What a soak run saw.
#[derive(Debug, Serialize)]
pub(crate) struct Soak {
    pub(crate) seconds: u64,
    pub(crate) offered_per_s: f64,
    pub(crate) producers: u32,
    pub(crate) acked: u64,
    pub(crate) autovacuum: String,
    pub(crate) synchronous_commit: String,
    pub(crate) samples: Vec<SoakSample>,
    /// A transaction held a snapshot open for the whole run (`--soak-hold-transaction`).
    pub(crate) held_transaction: bool,
    /// The backlog did not grow: at the end it is at most twice the median sample's, or one
    /// second of the offered rate.
    pub(crate) kept_up: bool,
    /// `(seconds since start, RSS KiB)`, as before.
    pub(crate) outboxd_rss_kib: Vec<(u64, u64)>,
}

/// `--soak`: one consumer, four streams, producers paced to `rate` for `seconds`; sampled every
/// tenth of the run, and at least once a minute.
pub(crate) async fn soak(args: &Args, seconds: u64) -> Result<Soak> {
    const TOPIC: &str = "bench.soak";
    let bin = find_outboxd(args.outboxd.clone())?;
    let url = args.database_url.clone();
    recreate_database(&url).await?;
    let db = pool(&url, 4).await?;
    let settings = server_settings(&db).await?;
    let (autovacuum, synchronous_commit) = (settings.1.clone(), settings.2.clone());
    let mut params = Params::new(args, settings);
    params.seconds = seconds;
    let producers = pool(&url, params.producers).await?;
    let b = Bench { params, db, producers, payload: payload() };
    let secure = args.secure.then(Secure::new).transpose()?;
    let outboxd = start_outboxd(&bin, &url, secure.as_ref()).await?;
    let mut admin = outboxd.admin().await?;
    let endpoint = outboxd.endpoint.clone();
    let pid = outboxd.pid();
    let name = TOPIC.replace('.', "-");
    create_consumer(&mut admin, consumer(&name, &[TOPIC])).await?;
    let mut streams =
        Streams::attach(&endpoint, std::slice::from_ref(&name), STREAMS, FLOW_MAX_IN_FLIGHT, false).await?;
    streams.progress.sample_latency.store(true, Ordering::Relaxed);
    // The snapshot every dead row of the run stays visible to, until the end.
    let mut holder = match args.soak_hold_transaction {
        true => {
            let mut conn = b.db.acquire().await?;
            sqlx::query("SET application_name = 'outbox-bench-holder'").execute(&mut *conn).await?;
            sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ").execute(&mut *conn).await?;
            sqlx::query("SELECT count(*) FROM outbox.consumers").execute(&mut *conn).await?;
            Some(conn)
        }
        false => None,
    };
    let run = Producers::start(
        &b.producers,
        b.params.producers,
        Work::Enqueue { topic: TOPIC },
        b.params.window(),
        Some(args.soak_rate),
        false,
        &b.payload,
    )
    .await?;
    let started = Instant::now();
    let n = (seconds / 60).max(10);
    let mut samples = Vec::new();
    let mut rss = vec![(0, rss_kib(pid)?)];
    let (mut last_acked, mut last_at) = (0u64, started);
    for i in 1..=n {
        tokio::time::sleep_until(started + Duration::from_secs(seconds * i / n)).await;
        let at = Instant::now();
        let acked = streams.progress.acked();
        let lat = std::mem::take(&mut *streams.progress.latencies.lock().unwrap_or_else(|e| e.into_inner()));
        let p99_ms =
            Quantiles::of(lat.iter().map(|ms| Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1000.0)).collect())
                .map_or(0.0, |q| q.p99);
        let st = admin.get_stats(pb::GetStatsRequest { consumer: name.clone() }).await?.into_inner();
        let c = st.consumers.first().cloned().unwrap_or_default();
        let rss_now = rss_kib(pid)?;
        let sample = SoakSample {
            at_s: seconds * i / n,
            rss_mib: round(rss_now as f64 / 1024.0, 2),
            backlog: st.unrelayed + c.backlog + c.in_flight,
            acked_per_s: round(per_second(acked - last_acked, at - last_at), 1),
            p99_ms,
            dead_rows: st.tables.iter().map(|t| t.dead_rows).sum(),
            vacuum_held_s: round(
                st.vacuum_horizon
                    .as_ref()
                    .and_then(|h| h.age)
                    .map_or(0.0, |d| d.seconds as f64 + f64::from(d.nanos) / 1e9),
                1,
            ),
        };
        tracing::info!(
            at_s = sample.at_s,
            rss_mib = sample.rss_mib,
            backlog = sample.backlog,
            acked_per_s = sample.acked_per_s,
            p99_ms = sample.p99_ms,
            dead_rows = sample.dead_rows,
            vacuum_held_s = sample.vacuum_held_s,
            "soak"
        );
        rss.push((sample.at_s, rss_now));
        samples.push(sample);
        (last_acked, last_at) = (acked, at);
    }
    let produced = run.finish().await?;
    if let Some(conn) = holder.as_mut() {
        sqlx::query("COMMIT").execute(&mut **conn).await?;
    }
    drop(holder);
    streams.wait_acked(produced.total, budget(produced.total), "the soak's messages").await?;
    streams.stop().await?;
    if !outboxd.terminate(Duration::from_secs(20)).await? {
        tracing::warn!("outboxd exited with an error status");
    }
    let mut backlogs: Vec<i64> = samples.iter().map(|s| s.backlog).collect();
    backlogs.sort_unstable();
    let median = backlogs.get(backlogs.len() / 2).copied().unwrap_or(0);
    let last = samples.last().map_or(0, |s| s.backlog);
    let kept_up = last <= (2 * median).max(args.soak_rate as i64);
    Ok(Soak {
        seconds,
        offered_per_s: args.soak_rate,
        producers: b.params.producers,
        acked: produced.total,
        autovacuum,
        synchronous_commit,
        samples,
        held_transaction: args.soak_hold_transaction,
        kept_up,
        outboxd_rss_kib: rss,
    })
}

//! `--console-cost`: what the web console costs on a big database. A PostgreSQL database with
//! `--console-messages` retained messages (1M by default) and a tenth of them dead letters of
//! one consumer (in five groups of last error), the rest acked; outboxd with `--console-listen`;
//! then each page timed (the median and the slowest of a few requests, the stats cache
//! expired before each), and the database's transactions per second while the console is open
//! and idle: none open, one tab, three tabs (each refreshing its live part every 10 s, as the
//! page's script does while visible).
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use serde::Serialize;
use tokio::time::Instant;

use crate::database::{pool, recreate_database};
use crate::outboxd::find_outboxd;
use crate::report::round;
use crate::{Args, create_consumer};
use outbox_tests::{Outboxd, consumer};

const CONSUMER: &str = "console-bench";
/// Requests per page; the stats cache (2 s) is let expire before each.
const SAMPLES: usize = 5;
const IDLE_WINDOW: Duration = Duration::from_secs(60);
const TAB_REFRESH: Duration = Duration::from_secs(10);

#[derive(Debug, Serialize)]
pub struct PageTime {
    pub path: String,
    pub median_ms: f64,
    pub max_ms: f64,
}

#[derive(Debug, Serialize)]
pub struct ConsoleCost {
    pub messages: i64,
    pub dead_letters: i64,
    pub pages: Vec<PageTime>,
    /// Transactions per second of the database with no console page open (outboxd's own loops).
    pub idle_tx_per_s: f64,
    /// The same with one tab open, and with three.
    pub one_tab_tx_per_s: f64,
    pub three_tabs_tx_per_s: f64,
    /// One tab's added transactions per second (each a statement or a few).
    pub per_tab_tx_per_s: f64,
}

async fn transactions(db: &sqlx::PgPool) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(db)
    .await?)
}

/// Transactions per second over `IDLE_WINDOW` while `tabs` tabs refresh the overview.
async fn idle(db: &sqlx::PgPool, http: &reqwest::Client, base: &str, cookie: &str, tabs: usize) -> Result<f64> {
    let stop = tokio_util::sync::CancellationToken::new();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..tabs {
        let (http, url, cookie, stop) =
            (http.clone(), format!("{base}/fragments/overview"), cookie.to_owned(), stop.clone());
        set.spawn(async move {
            // Tabs opened a moment apart, as people do.
            tokio::time::sleep(TAB_REFRESH * i as u32 / 3).await;
            let mut every = tokio::time::interval(TAB_REFRESH);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = every.tick() => {}
                }
                let _ = http.get(&url).header("cookie", &cookie).send().await;
            }
        });
    }
    // Pg's counters are flushed by each backend at the end of a transaction, at most once per
    // 1 s when idle: read, wait the window, read again, with a margin either side.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = transactions(db).await?;
    let start = Instant::now();
    tokio::time::sleep(IDLE_WINDOW).await;
    let after = transactions(db).await?;
    let elapsed = start.elapsed().as_secs_f64();
    stop.cancel();
    while set.join_next().await.is_some() {}
    // The two reads of the counter are transactions of their own.
    Ok(((after - before - 1) as f64 / elapsed).max(0.0))
}

pub async fn run(args: &Args) -> Result<ConsoleCost> {
    let url = args.database_url.clone();
    let messages = args.console_messages as i64;
    recreate_database(&url).await?;
    let db = pool(&url, 4).await?;
    let bin = find_outboxd(args.outboxd.clone())?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let console = format!("127.0.0.1:{port}");
    let outboxd = Outboxd::start_binary(&bin, &url, &["--drain-timeout", "2s", "--console-listen", &console]).await?;
    let mut admin = outboxd.admin().await?;

    tracing::info!(messages, "console: seeding the messages");
    // Topics no consumer takes: the relay reads them and fans out to nobody.
    let chunk = 100_000;
    let mut from = 0;
    while from < messages {
        let n = chunk.min(messages - from);
        sqlx::query(
            "INSERT INTO outbox.messages (message_id, topic, type, payload, headers, ordering_key)
             SELECT gen_random_uuid(), 'bench.seed.' || (g % 7), 'Type' || (g % 13),
                    convert_to('{\"n\":' || g || '}', 'UTF8'), '{}', CASE WHEN g % 3 = 0 THEN 'k' || (g % 1000) END
               FROM generate_series($1::bigint, $2::bigint) g",
        )
        .bind(from + 1)
        .bind(from + n)
        .execute(&db)
        .await?;
        from += n;
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let s = admin.get_stats(outbox_proto::v1::GetStatsRequest::default()).await?.into_inner();
        if s.unrelayed == 0 {
            break;
        }
        ensure!(Instant::now() < deadline, "the relay did not read the seeded messages in 10 minutes");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The consumer, created after the relay has passed them (NEW: no backfill); its history
    // written directly: a tenth dead in five groups of error, the rest acked.
    create_consumer(&mut admin, consumer(CONSUMER, &["bench.seed.>"])).await?;
    tracing::info!("console: seeding the consumer's history");
    sqlx::query(
        "INSERT INTO outbox.deliveries (message_id, consumer, seq, ordering_key, state, delivery_count, available_at,
                                        created_at, updated_at, acked_at, dead_at, last_error)
         SELECT m.message_id, $1, m.seq, m.ordering_key, CASE WHEN m.seq % 10 = 0 THEN 'dead' ELSE 'acked' END, 1,
                m.enqueued_at, m.enqueued_at, now(),
                CASE WHEN m.seq % 10 = 0 THEN NULL ELSE now() END, CASE WHEN m.seq % 10 = 0 THEN now() END,
                CASE WHEN m.seq % 10 = 0 THEN 'payment declined: code ' || (m.seq / 10 % 5) END
           FROM outbox.messages m",
    )
    .bind(CONSUMER)
    .execute(&db)
    .await?;
    sqlx::query("ANALYZE outbox.messages, outbox.deliveries").execute(&db).await?;
    let dead_letters: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox.deliveries WHERE state = 'dead'").fetch_one(&db).await?;
    let some_id: String = sqlx::query_scalar("SELECT message_id::text FROM outbox.messages ORDER BY seq DESC LIMIT 1")
        .fetch_one(&db)
        .await?;

    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build()?;
    let base = format!("http://{console}");
    // Without an auth file (loopback): the first visit gets a session cookie.
    let first = http.get(format!("{base}/")).send().await?;
    let cookie = first
        .headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("outboxd_console="))
        .and_then(|v| v.split(';').next())
        .context("no session cookie")?
        .to_owned();
    let page = http.get(format!("{base}/consumers/{CONSUMER}")).header("cookie", &cookie).send().await?.text().await?;
    let at =
        page.find(r#"name="csrf-token" content=""#).context("no csrf meta")? + r#"name="csrf-token" content=""#.len();
    let csrf = page[at..].split('"').next().context("csrf")?.to_owned();

    let gets = [
        "/".to_owned(),
        format!("/consumers/{CONSUMER}"),
        format!("/consumers/{CONSUMER}/dead?error=payment%20declined%3A%20code%203"),
        format!("/messages/{some_id}"),
        "/search?type=Type5".to_owned(),
        "/search?topic=bench.seed.3&ordering_key=nobody".to_owned(),
        "/search?topic=bench.*.3&ordering_key=nobody".to_owned(),
        format!("/consumers/{CONSUMER}/deliveries?kind=pending"),
        format!("/consumers/{CONSUMER}/deliveries?kind=retrying"),
        format!("/consumers/{CONSUMER}/deliveries?kind=in-flight"),
        "/replays".to_owned(),
    ];
    let mut pages = Vec::new();
    for path in gets.iter().map(|p| (p.clone(), None)).chain([(
        format!("/consumers/{CONSUMER}/replay (dry run of 20,000)"),
        Some(format!("/consumers/{CONSUMER}/replay")),
    )]) {
        let (name, post) = path;
        let mut times = Vec::new();
        for _ in 0..SAMPLES {
            // Past the stats cache: each request pays for its reads.
            tokio::time::sleep(Duration::from_millis(2_100)).await;
            let started = Instant::now();
            let r = match &post {
                None => http.get(format!("{base}{name}")).header("cookie", &cookie).send().await?,
                Some(p) => {
                    http.post(format!("{base}{p}"))
                        .header("cookie", &cookie)
                        .form(&[
                            ("csrf", csrf.as_str()),
                            ("last_error", "payment declined: code 3"),
                            ("dry_run", "true"),
                        ])
                        .send()
                        .await?
                }
            };
            ensure!(r.status().is_success(), "{name}: {}", r.status());
            r.bytes().await?;
            times.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(f64::total_cmp);
        let p = PageTime {
            path: name,
            median_ms: round(times[times.len() / 2], 1),
            max_ms: round(times[times.len() - 1], 1),
        };
        tracing::info!(path = %p.path, median_ms = p.median_ms, max_ms = p.max_ms, "console page");
        pages.push(p);
    }

    tracing::info!("console: idle cost, {} s each with 0, 1 and 3 tabs", IDLE_WINDOW.as_secs());
    let idle_tx_per_s = idle(&db, &http, &base, &cookie, 0).await?;
    let one_tab_tx_per_s = idle(&db, &http, &base, &cookie, 1).await?;
    let three_tabs_tx_per_s = idle(&db, &http, &base, &cookie, 3).await?;
    outboxd.terminate(Duration::from_secs(10)).await?;
    Ok(ConsoleCost {
        messages,
        dead_letters,
        pages,
        idle_tx_per_s: round(idle_tx_per_s, 2),
        one_tab_tx_per_s: round(one_tab_tx_per_s, 2),
        three_tabs_tx_per_s: round(three_tabs_tx_per_s, 2),
        per_tab_tx_per_s: round(one_tab_tx_per_s - idle_tx_per_s, 2),
    })
}

//! The idle phase: what outboxd costs the database while nothing happens.
use std::time::Duration;

use crate::consumers::Streams;
use crate::database::{autovacuum_running, connect, transactions};
use crate::{IDLE_MAX_IN_FLIGHT, per_second};
use anyhow::Result;
use outbox_client::grpc::AdminClient;
use outbox_tests::{consumer, create_consumer};
use sqlx::Connection as _;
use tokio::time::Instant;

/// Phase 7: transactions per second in the database while outboxd has one idle stream and
/// nothing to do. Runs right after outboxd starts, before any load, so that the delayed
/// statistics of busy connections cannot land in the window.
pub(crate) async fn idle(url: &str, admin: &mut AdminClient, endpoint: &str, len: Duration) -> Result<f64> {
    create_consumer(admin, consumer("bench-idle", &["bench.idle"])).await?;
    let streams = Streams::attach(endpoint, &["bench-idle".to_owned()], 1, IDLE_MAX_IN_FLIGHT, false).await?;
    let mut conn = connect(url).await?;
    // Autovacuum cleaning up after the drain would count as well: let it finish (bounded).
    let quiet_by = Instant::now() + Duration::from_secs(60);
    while autovacuum_running(&mut conn).await? && Instant::now() < quiet_by {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Flushes this connection's statistics now rather than inside the window.
    sqlx::query("SELECT pg_stat_force_next_flush()").execute(&mut conn).await?;
    // PostgreSQL flushes an idle backend's counters up to 10 s late: wait that out, so that
    // earlier work (the ceiling's producers, outboxd's migrations) does not land in the window.
    // It is also long enough for the relay to back off to its longest poll.
    tokio::time::sleep(Duration::from_millis(11_000)).await;
    let before = transactions(&mut conn).await?;
    let start = Instant::now();
    tokio::time::sleep(len).await;
    let after = transactions(&mut conn).await?;
    let elapsed = start.elapsed();
    if autovacuum_running(&mut conn).await? {
        tracing::warn!("autovacuum ran during the idle window; idle_queries_per_s includes it");
    }
    streams.stop().await?;
    conn.close().await?;
    // The first reading's own transaction commits inside the window; the second's after it.
    let outboxd = (after - before - 1).max(0);
    Ok(per_second(outboxd as u64, elapsed))
}

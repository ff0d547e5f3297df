//! `--subscriber`: one `outbox_client::Subscriber` with a handler that does nothing.
use std::time::Duration;

use crate::database::{pool, recreate_database};
use crate::{OUTBOXD_FLAGS, budget, payload, per_second};
use anyhow::{Result, ensure};
use outbox_client::grpc::AdminClient;
use outbox_tests::Outboxd;
use tokio::time::Instant;

/// One `outbox_client::Subscriber` with a handler that does nothing: acked per second, from
/// `run()` to outboxd counting every message acked.
pub(crate) async fn subscriber_throughput(
    bin: &std::path::Path,
    url: &str,
    messages: u64,
    concurrency: u32,
) -> Result<f64> {
    recreate_database(url).await?;
    let db = pool(url, 2).await?;
    let outboxd = Outboxd::start_binary(bin, url, OUTBOXD_FLAGS).await?;
    let mut admin = outboxd.admin().await?;
    admin
        .create_consumer(outbox_proto::v1::CreateConsumerRequest {
            consumer: Some(outbox_tests::consumer("bench-subscriber", &["bench.subscriber"])),
        })
        .await?;
    sqlx::query("SELECT count(outbox.enqueue('bench.subscriber', 'Tick', $1)) FROM generate_series(1, $2::bigint)")
        .bind(&payload()[..])
        .bind(i64::try_from(messages)?)
        .execute(&db)
        .await?;
    let within = budget(messages);
    // Polls the consumer's stats until `done` holds, for at most `within`.
    async fn until(
        admin: &mut AdminClient,
        within: Duration,
        what: &str,
        done: impl Fn(&outbox_proto::v1::ConsumerStats) -> bool,
    ) -> Result<()> {
        let started = Instant::now();
        loop {
            let s = admin.get_stats(outbox_proto::v1::GetStatsRequest { consumer: "bench-subscriber".into() }).await?;
            if s.into_inner().consumers.first().is_some_and(&done) {
                return Ok(());
            }
            ensure!(started.elapsed() < within, "{what} within {within:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let all = |n: i64| u64::try_from(n).unwrap_or(0) >= messages;
    until(&mut admin, within, "the relay did not fan out every message", |c| all(c.backlog)).await?;
    let mut config = outbox_client::SubscriberConfig::new(outboxd.endpoint.clone(), "bench-subscriber");
    config.concurrency = usize::try_from(concurrency)?;
    config.max_in_flight = concurrency;
    let stop = tokio_util::sync::CancellationToken::new();
    let started = Instant::now();
    let run = tokio::spawn(
        outbox_client::Subscriber::new(config)
            .run(|_d| async { Ok::<(), outbox_client::HandlerError>(()) }, stop.clone()),
    );
    until(&mut admin, within, "the Subscriber did not ack every message", |c| all(c.acked)).await?;
    let elapsed = started.elapsed();
    stop.cancel();
    run.await??;
    Ok(per_second(messages, elapsed))
}

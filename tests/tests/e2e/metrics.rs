//! Prometheus metrics: scraped from a real outboxd while messages flow.
use std::time::Duration;

use anyhow::{Context as _, Result};
use outbox_tests::{Backend, RawStream, consumer, create_consumer, eventually};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::{WAIT, conformance, setup};

conformance!(metrics_show_backlog_flow_and_latency_per_consumer);

pub(crate) async fn scrape(addr: &str) -> Result<String> {
    let mut conn = tokio::net::TcpStream::connect(addr).await.context("connecting to the metrics listener")?;
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").await?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_to_string(&mut body)).await??;
    Ok(body)
}

/// The value of the sample whose line starts with `series` (name and labels).
pub(crate) fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
}

async fn metrics_show_backlog_flow_and_latency_per_consumer(backend: Backend) -> Result<()> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let addr = format!("127.0.0.1:{port}");
    let (_store, srv, db) = setup(backend, &["--metrics-listen", &addr, "--metrics-interval", "50ms"]).await?;
    let mut c = consumer("billing", &["orders.*"]);
    c.max_deliveries = 1;
    create_consumer(&mut srv.admin().await?, c).await?;
    for i in 0..3u8 {
        db.sql_enqueue("orders.created", "OrderCreated", &[i]).await?;
    }
    let backlog = r#"outboxd_consumer_backlog{consumer="billing"}"#;
    eventually("a backlog of 3", WAIT, || async {
        Ok((sample(&scrape(&addr).await?, backlog) == Some(3.0)).then_some(()))
    })
    .await?;

    let mut s = RawStream::open(&srv.endpoint, "billing", 10).await?;
    let got = s.take(3, WAIT).await?;
    s.ack(&[&got[0].message_id, &got[1].message_id]).await;
    s.nack(&got[2].message_id, "boom").await;
    let text = eventually("acks, a nack and a dead letter counted", WAIT, || async {
        let text = scrape(&addr).await?;
        let done = sample(&text, r#"outboxd_acks_total{consumer="billing"}"#) == Some(2.0)
            && sample(&text, r#"outboxd_dead_lettered_total{consumer="billing"}"#) == Some(1.0)
            && sample(&text, r#"outboxd_consumer_dead{consumer="billing"}"#) == Some(1.0);
        Ok(done.then_some(text))
    })
    .await?;
    assert_eq!(sample(&text, r#"outboxd_deliveries_total{consumer="billing"}"#), Some(3.0));
    assert_eq!(sample(&text, r#"outboxd_nacks_total{consumer="billing"}"#), Some(1.0));
    assert_eq!(sample(&text, r#"outboxd_commit_to_delivery_seconds_count{consumer="billing"}"#), Some(3.0));
    assert_eq!(sample(&text, r#"outboxd_commit_to_ack_seconds_count{consumer="billing"}"#), Some(2.0));
    assert!(sample(&text, "outboxd_relayed_messages_total").is_some_and(|v| v >= 3.0), "{text}");
    assert!(text.contains("outboxd_relay_batch_duration_seconds_bucket"), "{text}");
    assert!(text.contains("# HELP outboxd_consumer_oldest_unacked_age_seconds"), "{text}");
    assert_eq!(sample(&text, r#"outboxd_consumer_streams{consumer="billing"}"#), Some(1.0));
    assert!(sample(&text, "outboxd_db_pool_connections").is_some_and(|v| v >= 1.0), "{text}");
    Ok(())
}

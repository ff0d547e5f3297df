//! End-to-end tests: each starts real `outboxd` processes on its own fresh database.
#![allow(clippy::unwrap_used)]

mod admin;
mod delivery;
mod failure_matrix;
mod python;

use std::time::Duration;

use anyhow::Result;
use outbox_tests::{FAST, Outboxd, TestDb};
use sqlx::PgPool;

pub const WAIT: Duration = Duration::from_secs(15);

/// A fresh database, an outboxd serving it (migrations applied), and a pool for producers.
pub async fn setup(extra: &[&str]) -> Result<(TestDb, Outboxd, PgPool)> {
    let db = TestDb::create().await?;
    let args: Vec<&str> = FAST.iter().chain(extra).copied().collect();
    let srv = Outboxd::start(&db.url, &args).await?;
    let pool = PgPool::connect(&db.url).await?;
    Ok((db, srv, pool))
}

pub async fn stats(srv: &Outboxd, consumer: &str) -> Result<outbox_proto::v1::ConsumerStats> {
    let mut admin = srv.admin().await?;
    let s = admin.get_stats(outbox_proto::v1::GetStatsRequest { consumer: consumer.into() }).await?.into_inner();
    Ok(s.consumers.into_iter().next().unwrap())
}

//! End-to-end tests: each starts real `outboxd` processes on its own fresh database.
//!
//! Most cases are the conformance suite: the `conformance!` macro runs each one against the
//! PostgreSQL store (`…::on_postgres::…`) and the SQLite store (`…::on_sqlite::…`). Cases that
//! only one store can pass are plain tests whose comment says why.
#![allow(clippy::unwrap_used)]

mod admin;
mod chaos;
mod console;
mod console_http;
mod delivery;
mod failure_matrix;
mod healthcheck;
mod hostile;
mod limits;
mod lockout;
mod memory;
mod metrics;
mod otlp;
mod outboxctl;
mod pg_tls;
mod python;
mod security;
mod sink_targets;
mod sinks;

use std::time::Duration;

use anyhow::Result;
use outbox_tests::{Backend, Db, FAST, Outboxd, TestDb, TestStore};
use sqlx::PgPool;

pub const WAIT: Duration = Duration::from_secs(15);

/// Runs each named `async fn case(Backend) -> Result<()>` on every store.
macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod on_postgres {
            $(#[tokio::test]
            async fn $case() -> anyhow::Result<()> {
                super::$case(outbox_tests::Backend::Postgres).await
            })*
        }
        mod on_sqlite {
            $(#[tokio::test]
            async fn $case() -> anyhow::Result<()> {
                super::$case(outbox_tests::Backend::Sqlite).await
            })*
        }
    };
}
pub(crate) use conformance;

/// A fresh store, an outboxd serving it (migrations applied), and a producer connection.
pub async fn setup(backend: Backend, extra: &[&str]) -> Result<(TestStore, Outboxd, Db)> {
    let store = TestStore::create(backend).await?;
    let args: Vec<&str> = FAST.iter().chain(extra).copied().collect();
    let srv = Outboxd::start(store.url(), &args).await?;
    let db = Db::connect(store.url()).await?;
    Ok((store, srv, db))
}

/// PostgreSQL only, for cases that need it (they say why).
pub async fn setup_pg(extra: &[&str]) -> Result<(TestDb, Outboxd, PgPool)> {
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

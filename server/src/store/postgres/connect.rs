//! Opening the database: creating it if missing, the three pools and their settings, and
//! bringing the schema up to date (migrations, then the SQL functions' source, ADR 0043).
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Postgres;
use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::{PgStore, conninfo, q};
use crate::store::{Result, StoreError};

/// How long opening the database at start-up waits for an answer, as the pools' acquire timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `f`, a connection of its own with no timeout, given [`CONNECT_TIMEOUT`]: a host that takes
/// the connection and never answers (or drops the packets) would hold start-up for ever.
async fn answered<T>(f: impl Future<Output = T>) -> Result<T> {
    tokio::time::timeout(CONNECT_TIMEOUT, f).await.map_err(|_| StoreError::ConnectTimeout(CONNECT_TIMEOUT))
}

/// How long a relay pass's transaction may sit idle between its statements before PostgreSQL
/// ends it (and with it the relays' turn it holds). A pass's statements follow each other
/// within milliseconds.
const RELAY_IDLE_IN_TRANSACTION: &str = "10s";

/// Connections of the relay's own pool (a relay loop and its helper).
const RELAY_CONNECTIONS: u32 = 2;

/// Connections of the lease pool (see `PgStore::lease_pool`).
const LEASE_CONNECTIONS: u32 = 4;
/// Settings of the lease pool's connections (see `PgStore::lease_pool`).
pub(crate) const LEASE_SETTINGS: &[(&str, &str)] =
    &[("plan_cache_mode", "force_generic_plan"), ("enable_seqscan", "off")];

pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Every SQL function of schema `outbox`, as it is now (ADR 0043): applied after the migrations
/// when the database holds an older revision, or this revision with another digest.
pub(crate) const FUNCTIONS: &str = include_str!("../../../sql/functions.sql");

/// The revision of [`FUNCTIONS`], which its first line states too: one more with every release
/// that changes the file, so that an older release never replaces a newer one's functions.
pub(crate) const FUNCTIONS_REVISION: i32 = 12;

/// The last migration that defined SQL functions; later ones leave that to [`FUNCTIONS`].
#[cfg(test)]
pub(crate) const LAST_MIGRATION_WITH_FUNCTIONS: i64 = 14;

/// Applies [`FUNCTIONS`] unless the database holds this version of it or a later revision.
/// Returns whether it applied. Replicas starting together take turns on the table's lock; the
/// one that comes second finds the version current and writes nothing.
pub(super) async fn apply_functions(pool: &PgPool) -> Result<bool> {
    let mut tx = pool.begin().await?;
    sqlx::query(q::FUNCTION_SOURCE_LOCK).execute(&mut *tx).await?;
    let held: Option<(i32, bool)> =
        sqlx::query_as(q::FUNCTION_SOURCE_HELD).bind(FUNCTIONS).fetch_optional(&mut *tx).await?;
    match held {
        Some((revision, _)) if revision > FUNCTIONS_REVISION => {
            tracing::warn!(
                held = revision,
                ours = FUNCTIONS_REVISION,
                "the database holds the SQL functions of a newer release; leaving them"
            );
            tx.commit().await?;
            return Ok(false);
        }
        Some((revision, true)) if revision == FUNCTIONS_REVISION => {
            tx.commit().await?;
            return Ok(false);
        }
        _ => {}
    }
    sqlx::raw_sql(FUNCTIONS).execute(&mut *tx).await?;
    sqlx::query(q::FUNCTION_SOURCE_RECORD).bind(FUNCTIONS).bind(FUNCTIONS_REVISION).execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(true)
}

impl PgStore {
    /// Connects, creating the database first if it does not exist. Every connection, the
    /// maintenance one that checks for the database included, takes the URL's TLS parameters
    /// as [`conninfo::prepare`] left them.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self> {
        let url = &*conninfo::prepare(url)?;
        if !answered(Postgres::database_exists(url)).await?? {
            // Another replica may create it at the same moment; only a still-missing database is an error.
            if let Err(e) = answered(Postgres::create_database(url)).await?
                && !answered(Postgres::database_exists(url)).await??
            {
                return Err(e.into());
            }
            tracing::info!("created database");
        }
        // JIT compiles a plan on every execution once its estimated cost passes a threshold; for
        // outboxd's short statements that costs 100 ms or more per call and never pays back (a
        // relay pass went from 13 to 130 ms with it).
        let options = PgConnectOptions::from_str(url)?.application_name("outboxd").options([("jit", "off")]);
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.clone())
            .await?;
        let relay_pool = PgPoolOptions::new()
            .max_connections(RELAY_CONNECTIONS)
            .acquire_timeout(Duration::from_secs(10))
            // A pass holds the relays' turn and the consumers lock across its round trips
            // (ADR 0067): a relay whose process froze or whose network went mid-pass must not
            // hold every replica's relaying, and consumer changes, for the kernel's keepalive.
            .connect_lazy_with(options.clone().options([
                ("synchronous_commit", "off"),
                ("idle_in_transaction_session_timeout", RELAY_IDLE_IN_TRANSACTION),
            ]));
        // Connected now, not at the first lease: a stream's first lease must not wait for a
        // connection to open while the relay pushes later messages to it.
        let lease_pool = PgPoolOptions::new()
            .max_connections(LEASE_CONNECTIONS.min(max_connections.max(1)))
            .min_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options.options(LEASE_SETTINGS.iter().copied()))
            .await?;
        // Whether the connections are encrypted, which `sslmode=prefer` (the default) leaves
        // to the server: said once, so that an operator need not guess. Behind a connection
        // pooler this is the pooler's session with PostgreSQL.
        match sqlx::query_scalar::<_, Option<String>>(q::CONNECTION_TLS).fetch_optional(&pool).await {
            Ok(tls) => {
                tracing::info!(database_tls = tls.flatten().as_deref().unwrap_or("off"), "connected to PostgreSQL")
            }
            Err(e) => tracing::warn!(error = %e, "connected to PostgreSQL; cannot read whether the session uses TLS"),
        }
        Ok(Self { pool, relay_pool, lease_pool, relay_consumers: Arc::default() })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

//! The database: created for the run, filled with committed messages, watched (what is left to
//! relay, WAL positions, transactions, autovacuum).
use std::str::FromStr as _;
use std::time::Duration;

use crate::{EVENT_TYPE, INSERT_CHUNK};
use anyhow::{Context as _, Result, ensure};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions as _, Connection as _, PgConnection};
use tokio::time::Instant;

/// Runs `statements` from database "postgres" on the database `url` names, written `{db}` in
/// them; refuses a name without "bench", since the bench drops the databases it uses.
pub(crate) async fn on_bench_database(url: &str, statements: &[&str]) -> Result<()> {
    let options = PgConnectOptions::from_str(url).context("parsing a database URL")?;
    let name = options.get_database().context("the database URL names no database")?.to_owned();
    ensure!(
        name.contains("bench"),
        "refusing to use database {name:?}: the bench drops and recreates it, so its name must contain \"bench\""
    );
    let quoted = format!("\"{}\"", name.replace('"', "\"\""));
    let mut conn = options.database("postgres").connect().await.context("connecting to database \"postgres\"")?;
    for sql in statements {
        sqlx::query(sqlx::AssertSqlSafe(sql.replace("{db}", &quoted))).execute(&mut conn).await?;
    }
    conn.close().await?;
    Ok(())
}

/// Drops and recreates the benchmark database, so that every run starts from empty tables.
pub(crate) async fn recreate_database(url: &str) -> Result<()> {
    on_bench_database(url, &["DROP DATABASE IF EXISTS {db} WITH (FORCE)", "CREATE DATABASE {db}"]).await
}

/// Drops a database that [`recreate_database`] made.
pub(crate) async fn drop_database(url: &str) -> Result<()> {
    on_bench_database(url, &["DROP DATABASE IF EXISTS {db} WITH (FORCE)"]).await
}

/// The server's version, `autovacuum` and `synchronous_commit`: the figures depend on them.
pub(crate) async fn server_settings(db: &PgPool) -> Result<(String, String, String)> {
    let show = |name: &'static str| async move {
        anyhow::Ok(sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!("SHOW {name}"))).fetch_one(db).await?)
    };
    Ok((show("server_version").await?, show("autovacuum").await?, show("synchronous_commit").await?))
}

pub(crate) async fn connect(url: &str) -> Result<PgConnection> {
    Ok(PgConnectOptions::from_str(url)?.application_name("outbox-bench").connect().await?)
}

/// A pool whose connections stay open for the whole run: producers keep theirs from one phase
/// to the next, and reconnecting would show up in the figures.
pub(crate) async fn pool(url: &str, size: u32) -> Result<PgPool> {
    let options = PgConnectOptions::from_str(url)?.application_name("outbox-bench");
    Ok(PgPoolOptions::new()
        .max_connections(size)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await?)
}

/// Commits `n` messages on `topic` in one transaction, as fast as SQL can write them.
///
/// One transaction, with `ANALYZE` inside it, so that the relay sees nothing until everything is
/// there, with planner statistics that know the backlog (a claim planned for an empty table is
/// slow on a large one): the whole fan-out then happens after the streams attach, inside the
/// timed drain.
///
/// The messages are spread round-robin over `keys` ordering keys (0: none).
pub(crate) async fn insert_committed(db: &PgPool, topic: &str, n: u64, keys: u64, payload: &[u8]) -> Result<()> {
    let mut tx = db.begin().await?;
    let mut left = n;
    while left > 0 {
        let chunk = left.min(INSERT_CHUNK);
        sqlx::query(
            "INSERT INTO outbox.messages (message_id, topic, type, payload, ordering_key)
             SELECT outbox.uuid_v7(), $1, $2, $3, CASE WHEN $5 > 0 THEN 'key-' || (g % $5) END
               FROM generate_series(1, $4::bigint) g",
        )
        .bind(topic)
        .bind(EVENT_TYPE)
        .bind(payload)
        .bind(i64::try_from(chunk)?)
        .bind(i64::try_from(keys)?)
        .execute(&mut *tx)
        .await
        .with_context(|| format!("inserting the {topic} backlog"))?;
        left -= chunk;
    }
    sqlx::query("ANALYZE outbox.messages").execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(())
}

pub(crate) async fn unrelayed(db: &PgPool) -> Result<i64> {
    // The relay cursor's own view of what it has not read (ADR 0027).
    Ok(sqlx::query_scalar("SELECT count(*) FROM outbox.unrelayed_messages").fetch_one(db).await?)
}

/// How long after `since` the relay had nothing left to fan out, to 100 ms; polls while a drain
/// runs.
pub(crate) async fn time_until_relayed(db: &PgPool, since: Instant, within: Duration) -> Result<Duration> {
    loop {
        // The relay's own access path (the cursor, then the primary key), so that the check
        // stays cheap beside it.
        let left: Option<i64> =
            sqlx::query_scalar("SELECT seq FROM outbox.unrelayed_messages LIMIT 1").fetch_optional(db).await?;
        if left.is_none() {
            return Ok(since.elapsed());
        }
        ensure!(since.elapsed() < within, "the relay did not fan out the backlog within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) async fn wait_relayed(db: &PgPool, within: Duration) -> Result<()> {
    time_until_relayed(db, Instant::now(), within).await.map(|_| ())
}

/// The server's current WAL write position (`pg_lsn`, as text).
pub(crate) async fn wal_lsn(db: &PgPool) -> Result<String> {
    Ok(sqlx::query_scalar("SELECT pg_current_wal_lsn()::text").fetch_one(db).await?)
}

/// WAL bytes the whole server wrote since `lsn` (every database, outboxd's vacuum rounds and
/// checkpoints' full-page images included).
pub(crate) async fn wal_bytes_since(db: &PgPool, lsn: &str) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint")
        .bind(lsn)
        .fetch_one(db)
        .await?)
}

/// `xact_commit + xact_rollback` of the current database. PostgreSQL counts every autocommit
/// statement as a transaction, so this counts outboxd's queries (and this reading's own).
pub(crate) async fn transactions(conn: &mut PgConnection) -> Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(conn)
    .await?)
}

pub(crate) async fn autovacuum_running(conn: &mut PgConnection) -> Result<bool> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                         WHERE datname = current_database() AND backend_type = 'autovacuum worker')",
    )
    .fetch_one(conn)
    .await?)
}

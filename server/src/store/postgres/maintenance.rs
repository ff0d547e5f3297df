//! Upkeep of the database: what holds back vacuum, the tables' health, the vacuum round
//! itself, and the prune of messages past their retention.
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgPool;

use super::{PRUNE_LOCK, q};
use crate::store::{Pruned, Result, TableHealth, VacuumHorizon};

/// The session advisory lock of the vacuum round (one replica at a time).
const VACUUM_LOCK: i64 = 0x6f75_7462_6f78_0003;

/// From `pg_stat_user_tables` (the statistics collector's counts, no scan) and the
/// relations' sizes with their indexes and TOAST.
/// The oldest snapshot that keeps vacuum from removing dead rows of outboxd's tables: a
/// session of this database (or a walsender) with a `backend_xmin` or a transaction id, a replication slot's
/// `xmin` (a standby's feedback; a logical slot's `catalog_xmin` holds back only the
/// catalogs), a prepared transaction. Sessions of other roles show their `backend_xmin`
/// but not their details unless outboxd's login has `pg_read_all_stats`.
pub(super) async fn vacuum_horizon(pool: &PgPool) -> Result<Option<VacuumHorizon>> {
    let row = sqlx::query(q::VACUUM_HORIZON).fetch_optional(pool).await?;
    row.map(|r| {
        Ok(VacuumHorizon {
            kind: r.try_get("kind")?,
            since: r.try_get("since")?,
            xmin_age: r.try_get("xmin_age")?,
            pid: r.try_get("pid")?,
            application_name: r.try_get("application_name")?,
            state: r.try_get("state")?,
            name: r.try_get("name")?,
            longest: r.try_get("longest")?,
        })
    })
    .transpose()
}

pub(super) async fn table_health(pool: &PgPool) -> Result<Vec<TableHealth>> {
    let rows = sqlx::query(q::TABLE_HEALTH).fetch_all(pool).await?;
    rows.iter()
        .map(|r| {
            Ok(TableHealth {
                table: r.try_get("table_name")?,
                live_rows: r.try_get("live")?,
                dead_rows: r.try_get("dead")?,
                bytes: r.try_get("bytes")?,
                last_vacuum: r.try_get("last_vacuum")?,
            })
        })
        .collect()
}

/// `VACUUM (ANALYZE)` (not FULL: it takes no lock that blocks reads or writes; ANALYZE,
/// so that cached plans are made again for the table's new size) of each table, on one
/// connection holding a session advisory lock, so that of several replicas one vacuums at a
/// time and the others skip the round.
pub(super) async fn vacuum_tables(pool: &PgPool, tables: &[String]) -> Result<Vec<String>> {
    if tables.is_empty() {
        return Ok(Vec::new());
    }
    let mut conn = pool.acquire().await?;
    let locked: bool = sqlx::query_scalar(q::VACUUM_LOCK_TRY).bind(VACUUM_LOCK).fetch_one(&mut *conn).await?;
    if !locked {
        return Ok(Vec::new());
    }
    let mut done = Vec::new();
    let mut failed = None;
    for table in tables {
        // Names from the catalog of our own schema, quoted.
        let sql = format!("VACUUM (ANALYZE) outbox.\"{}\"", table.replace('"', "\"\""));
        match sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut *conn).await {
            Ok(_) => done.push(table.clone()),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let unlocked = sqlx::query(q::VACUUM_UNLOCK).bind(VACUUM_LOCK).execute(&mut *conn).await;
    if unlocked.is_err() {
        conn.close_on_drop();
    }
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(done),
    }
}

/// Under [`PRUNE_LOCK`] (per transaction): messages locked by another pruner are skipped.
pub(super) async fn prune_before(pool: &PgPool, cutoff: DateTime<Utc>, limit: i64) -> Result<Option<Pruned>> {
    let mut tx = pool.begin().await?;
    let mine: bool = sqlx::query_scalar(q::PRUNE_LOCK_TRY).bind(PRUNE_LOCK).fetch_one(&mut *tx).await?;
    if !mine {
        tx.rollback().await?;
        return Ok(None);
    }
    // Folds the acked rows that transactional acks wrote for messages still waiting in a
    // pending range into the ranges (ADR 0042): those seqs leave their range, so that
    // nothing holds their messages back from the prune below.
    let folded = sqlx::query(q::PRUNE_FOLD_ACKED_ROWS).execute(&mut *tx).await?;
    if folded.rows_affected() > 0 {
        sqlx::query(q::PRUNE_EMPTY_RANGES).execute(&mut *tx).await?;
    }
    let row = sqlx::query(q::PRUNE_MESSAGES).bind(cutoff).bind(limit).fetch_one(&mut *tx).await?;
    let messages: i64 = row.try_get("messages")?;
    if messages > 0 {
        // The relay log's rows that name only pruned messages.
        sqlx::query(q::PRUNE_RELAY_LOG).execute(&mut *tx).await?;
        // Ack times older than the retention that name no message any more.
        sqlx::query(q::PRUNE_ACKED_RANGES).bind(cutoff).execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(Some(Pruned { messages, deliveries: row.try_get("deliveries")? }))
}

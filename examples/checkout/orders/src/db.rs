//! Every SQL statement of Orders, on its own schema `orders` (see `schema.sql`).
use sqlx::{PgConnection, PgPool, Row};
use uuid::Uuid;

use crate::saga::{OrderLine, Outcome, SagaState, Style};

const SCHEMA: &str = include_str!("schema.sql");

/// Creates the schema if it is missing; replicas starting together take turns.
pub async fn apply_schema(pool: &PgPool) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('checkout.orders.schema'))").execute(&mut *tx).await?;
    sqlx::raw_sql(SCHEMA).execute(&mut *tx).await?;
    tx.commit().await
}

#[derive(Debug, Clone)]
pub struct Order {
    pub id: Uuid,
    pub line: OrderLine,
    pub status: String,
    pub reason: Option<String>,
    pub style: Option<Style>,
}

fn order(row: &sqlx::postgres::PgRow) -> sqlx::Result<Order> {
    Ok(Order {
        id: row.try_get("id")?,
        line: OrderLine {
            sku: row.try_get("sku")?,
            quantity: row.try_get("quantity")?,
            amount: row.try_get("amount")?,
        },
        status: row.try_get("status")?,
        reason: row.try_get("reason")?,
        style: Style::parse(row.try_get("style")?),
    })
}

/// Inserts a new order; `false` when its idempotency key exists already (a concurrent insert
/// with the same key waits for the other transaction and then sees it).
pub async fn insert_order(
    conn: &mut PgConnection,
    id: Uuid,
    style: Style,
    key: Option<&str>,
    line: &OrderLine,
) -> sqlx::Result<bool> {
    let done = sqlx::query(
        "INSERT INTO orders.orders (id, sku, quantity, amount, style, idempotency_key)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (idempotency_key) DO NOTHING",
    )
    .bind(id)
    .bind(&line.sku)
    .bind(line.quantity)
    .bind(line.amount)
    .bind(style.as_str())
    .bind(key)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

pub async fn order_by_key(conn: &mut PgConnection, key: &str) -> sqlx::Result<Option<Order>> {
    let row =
        sqlx::query("SELECT * FROM orders.orders WHERE idempotency_key = $1").bind(key).fetch_optional(conn).await?;
    row.as_ref().map(order).transpose()
}

pub async fn get_order(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<Order>> {
    let row = sqlx::query("SELECT * FROM orders.orders WHERE id = $1").bind(id).fetch_optional(pool).await?;
    row.as_ref().map(order).transpose()
}

/// The order, locked for the rest of the transaction.
pub async fn lock_order(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<Option<Order>> {
    let row = sqlx::query("SELECT * FROM orders.orders WHERE id = $1 FOR UPDATE").bind(id).fetch_optional(conn).await?;
    row.as_ref().map(order).transpose()
}

pub async fn insert_saga(conn: &mut PgConnection, id: Uuid, state: SagaState) -> sqlx::Result<()> {
    sqlx::query("INSERT INTO orders.sagas (order_id, state) VALUES ($1, $2)")
        .bind(id)
        .bind(state.as_str())
        .execute(conn)
        .await?;
    Ok(())
}

/// The orchestrator's state of an order and the reason it keeps.
pub async fn saga(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<Option<(SagaState, Option<String>)>> {
    let row =
        sqlx::query("SELECT state, reason FROM orders.sagas WHERE order_id = $1").bind(id).fetch_optional(conn).await?;
    let Some(row) = row else { return Ok(None) };
    let state: String = row.try_get("state")?;
    Ok(SagaState::parse(&state).map(|s| (s, row.try_get("reason").ok().flatten())))
}

pub async fn set_saga(conn: &mut PgConnection, id: Uuid, state: SagaState, reason: Option<&str>) -> sqlx::Result<()> {
    sqlx::query(
        "UPDATE orders.sagas SET state = $2, reason = coalesce($3, reason), updated_at = now() WHERE order_id = $1",
    )
    .bind(id)
    .bind(state.as_str())
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(())
}

/// Gives a pending order its final status; `false` if it had one already.
pub async fn settle(conn: &mut PgConnection, id: Uuid, outcome: &Outcome) -> sqlx::Result<bool> {
    let (status, reason) = match outcome {
        Outcome::Confirmed => ("CONFIRMED", None),
        Outcome::Cancelled(r) => ("CANCELLED", Some(r.as_str())),
    };
    let done = sqlx::query(
        "UPDATE orders.orders SET status = $2, reason = $3, updated_at = now() WHERE id = $1 AND status = 'PENDING'",
    )
    .bind(id)
    .bind(status)
    .bind(reason)
    .execute(conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

//! What Orders does: place an order (its row and the saga's first message in one
//! transaction) and handle the saga's messages (the transactional ack, the state change and
//! the next message in one transaction).
use outbox_client::{ClientError, Delivery, HandlerError, Message};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::db;
use crate::pause::Pause;
use crate::saga::{self, Incoming, OrderLine, Outgoing, SagaState, Style};

#[derive(Debug)]
pub struct App {
    pub pool: PgPool,
    pub style: Style,
    pub pause: Option<Pause>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    #[error("Idempotency-Key {0:?} was used for a different order")]
    KeyReused(String),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Outbox(#[from] ClientError),
    #[error("test pause: {0}")]
    Pause(#[from] std::io::Error),
}

/// A placed order: new, or the one an earlier request with the same key placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub id: Uuid,
    pub replayed: bool,
}

async fn send(conn: &mut PgConnection, order_id: Uuid, out: &Outgoing) -> Result<(), ClientError> {
    let msg = Message::new(out.topic, out.type_, out.payload.to_string().into_bytes())
        .header("content-type", "application/json")
        .ordering_key(order_id.to_string());
    outbox_client::enqueue(&mut *conn, &msg).await?;
    Ok(())
}

impl App {
    pub async fn place(&self, key: Option<&str>, line: &OrderLine) -> Result<Placed, PlaceError> {
        let id = Uuid::now_v7();
        let mut tx = self.pool.begin().await?;
        if !db::insert_order(&mut tx, id, self.style, key, line).await? {
            let key = key.unwrap_or_default();
            let existing = db::order_by_key(&mut tx, key).await?.ok_or_else(|| PlaceError::KeyReused(key.into()))?;
            if existing.line != *line {
                return Err(PlaceError::KeyReused(key.into()));
            }
            return Ok(Placed { id: existing.id, replayed: true });
        }
        if self.style == Style::Orchestration {
            db::insert_saga(&mut tx, id, SagaState::ReservingStock).await?;
        }
        send(&mut tx, id, &saga::first_message(self.style, id, line)).await?;
        Pause::before_commit(self.pause.as_ref(), "place", id).await?;
        tx.commit().await?;
        Pause::after_commit(self.pause.as_ref(), "place", id).await?;
        tracing::info!(order_id = %id, style = self.style.as_str(), sku = %line.sku, "order placed");
        Ok(Placed { id, replayed: false })
    }

    /// Handles one saga message. A malformed payload is an error (nacked, dead after the
    /// consumer's `max_deliveries`, visible to operators); a message about an unknown order or
    /// of the other style is acked and logged.
    pub async fn handle(&self, d: Delivery) -> Result<(), HandlerError> {
        let msg: Incoming = serde_json::from_slice(&d.payload)
            .map_err(|e| format!("{} {} has a malformed payload: {e}", d.topic, d.type_))?;
        let mut tx = self.pool.begin().await?;
        match outbox_client::ack_in_tx(&mut *tx, &d.consumer, d.message_id).await {
            Ok(()) => {}
            // Another delivery of this message did it: roll this one back, it is done.
            Err(ClientError::AlreadyAcked { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let Some(order) = db::lock_order(&mut tx, msg.order_id).await? else {
            tracing::warn!(order_id = %msg.order_id, r#type = %d.type_, "a message about an unknown order; ignored");
            tx.commit().await?;
            return Ok(());
        };
        let step = match (d.topic.as_str(), order.style) {
            (saga::ORDERS_REPLIES, Some(Style::Orchestration)) => match db::saga(&mut tx, order.id).await? {
                Some((state, reason)) => saga::orchestrate(state, reason.as_deref(), &d.type_, &msg, &order.line),
                None => None,
            },
            (saga::INVENTORY_EVENTS | saga::PAYMENTS_EVENTS, Some(Style::Choreography)) => saga::react(&d.type_, &msg),
            _ => {
                tracing::warn!(order_id = %order.id, topic = %d.topic, r#type = %d.type_, "a message of the other saga style; ignored");
                None
            }
        };
        if let Some(step) = step {
            if let Some((state, reason)) = &step.saga {
                db::set_saga(&mut tx, order.id, *state, reason.as_deref()).await?;
            }
            if let Some(outcome) = &step.outcome {
                db::settle(&mut tx, order.id, outcome).await?;
                tracing::info!(order_id = %order.id, ?outcome, "order settled");
            }
            for out in &step.send {
                send(&mut tx, order.id, out).await?;
            }
            Pause::before_commit(self.pause.as_ref(), "handle", order.id).await?;
            tx.commit().await?;
            Pause::after_commit(self.pause.as_ref(), "handle", order.id).await?;
        } else {
            tracing::debug!(order_id = %order.id, r#type = %d.type_, "nothing to do");
            tx.commit().await?;
        }
        Ok(())
    }
}

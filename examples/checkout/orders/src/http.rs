//! The HTTP API: `POST /orders`, `GET /orders/{id}`, `GET /health`.
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;
use uuid::Uuid;

use crate::app::{App, PlaceError};
use crate::saga::OrderLine;

/// Bounds of an order, checked before anything is written.
pub const MAX_SKU_CHARS: usize = 64;
pub const MAX_QUANTITY: i64 = 10_000;
pub const MAX_AMOUNT: i64 = 1_000_000_000;
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 255;
const MAX_BODY_BYTES: usize = 16 * 1024;

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/orders", post(place))
        .route("/orders/{id}", get(order))
        .route("/health", get(health))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(app)
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({"error": message.into()}))).into_response()
}

fn unavailable(e: &dyn std::fmt::Display) -> Response {
    tracing::error!(error = %e, "request failed");
    error(StatusCode::SERVICE_UNAVAILABLE, "the order store is unavailable; retry with the same Idempotency-Key")
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlaceOrder {
    sku: String,
    quantity: i64,
    amount: i64,
}

/// Checks an order's fields, naming the field and the limit it broke.
fn validate(req: PlaceOrder) -> Result<OrderLine, String> {
    let sku_ok = |s: &str| s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if req.sku.is_empty() || req.sku.chars().count() > MAX_SKU_CHARS || !sku_ok(&req.sku) {
        return Err(format!("sku must be 1 to {MAX_SKU_CHARS} characters of [A-Za-z0-9_-], got {:?}", req.sku));
    }
    if !(1..=MAX_QUANTITY).contains(&req.quantity) {
        return Err(format!("quantity must be between 1 and {MAX_QUANTITY}, got {}", req.quantity));
    }
    if !(1..=MAX_AMOUNT).contains(&req.amount) {
        return Err(format!("amount must be between 1 and {MAX_AMOUNT}, got {}", req.amount));
    }
    let quantity = i32::try_from(req.quantity).map_err(|_| "quantity out of range".to_owned())?;
    Ok(OrderLine { sku: req.sku, quantity, amount: req.amount })
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, String> {
    let Some(v) = headers.get("idempotency-key") else { return Ok(None) };
    let key = v.to_str().map_err(|_| "Idempotency-Key must be visible ASCII".to_owned())?.trim();
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_BYTES {
        return Err(format!("Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_BYTES} bytes, got {}", key.len()));
    }
    Ok(Some(key.to_owned()))
}

async fn place(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let key = match idempotency_key(&headers) {
        Ok(k) => k,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let req: PlaceOrder = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the body must be {{\"sku\": string, \"quantity\": integer, \"amount\": integer}}: {e}"),
            );
        }
    };
    let line = match validate(req) {
        Ok(l) => l,
        Err(e) => return error(StatusCode::UNPROCESSABLE_ENTITY, e),
    };
    match app.place(key.as_deref(), &line).await {
        Ok(placed) => {
            let mut resp = (StatusCode::ACCEPTED, axum::Json(json!({"id": placed.id.to_string()}))).into_response();
            if let Ok(loc) = HeaderValue::from_str(&format!("/orders/{}", placed.id)) {
                resp.headers_mut().insert(header::LOCATION, loc);
            }
            if placed.replayed {
                resp.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
            }
            resp
        }
        Err(e @ PlaceError::KeyReused(_)) => error(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
        Err(e) => unavailable(&e),
    }
}

async fn order(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    let Ok(id) = id.parse::<Uuid>() else {
        return error(StatusCode::BAD_REQUEST, format!("an order id is a UUID, got {id:?}"));
    };
    match crate::db::get_order(&app.pool, id).await {
        Ok(Some(o)) => axum::Json(json!({
            "id": o.id.to_string(), "status": o.status, "reason": o.reason,
            "sku": o.line.sku, "quantity": o.line.quantity, "amount": o.line.amount,
        }))
        .into_response(),
        Ok(None) => error(StatusCode::NOT_FOUND, format!("no order {id}")),
        Err(e) => unavailable(&e),
    }
}

async fn health(State(app): State<Arc<App>>) -> Response {
    match sqlx::query("SELECT 1").execute(&app.pool).await {
        Ok(_) => axum::Json(json!({"status": "ok"})).into_response(),
        Err(e) => unavailable(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(sku: &str, quantity: i64, amount: i64) -> PlaceOrder {
        PlaceOrder { sku: sku.into(), quantity, amount }
    }

    #[test]
    fn bad_orders_name_the_field_and_the_limit() {
        assert!(validate(req("SKU-1", 2, 100)).is_ok());
        let err = |r| validate(r).unwrap_err();
        assert!(err(req("", 1, 1)).contains("sku must be 1 to 64"));
        assert!(err(req("SKU 1", 1, 1)).contains("sku"));
        assert!(err(req(&"S".repeat(65), 1, 1)).contains("sku"));
        assert!(err(req("SKU-1", 0, 1)).contains("quantity must be between 1 and 10000, got 0"));
        assert!(err(req("SKU-1", 10_001, 1)).contains("quantity"));
        assert!(err(req("SKU-1", 1, 0)).contains("amount must be between 1 and 1000000000, got 0"));
        assert!(err(req("SKU-1", 1, -5)).contains("amount"));
    }

    #[test]
    fn the_idempotency_key_is_bounded() {
        let mut h = HeaderMap::new();
        assert_eq!(idempotency_key(&h), Ok(None));
        h.insert("idempotency-key", HeaderValue::from_static("abc"));
        assert_eq!(idempotency_key(&h), Ok(Some("abc".into())));
        h.insert("idempotency-key", HeaderValue::from_str(&"k".repeat(256)).unwrap());
        assert!(idempotency_key(&h).unwrap_err().contains("1 to 255 bytes, got 256"));
    }
}

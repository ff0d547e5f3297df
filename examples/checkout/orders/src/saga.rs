//! The checkout saga as Orders sees it: the topics, the messages, and the two styles.
//!
//! Every message of one order carries the order id as its ordering key, so each consumer sees
//! an order's messages one at a time and in order. Payloads are JSON objects; `type` names the
//! message. The topics and shapes are documented in `docs/adr/0037-…` and the example's README.
use serde::Deserialize;
use uuid::Uuid;

/// Orders' own events: `OrderPlaced` (choreography only), `OrderConfirmed`, `OrderCancelled`.
pub const ORDERS_EVENTS: &str = "checkout.orders.events";
/// Inventory's events in the choreography: `StockReserved`, `OutOfStock`, `StockReleased`.
pub const INVENTORY_EVENTS: &str = "checkout.inventory.events";
/// Payments' events in the choreography: `PaymentCharged`, `PaymentFailed`.
pub const PAYMENTS_EVENTS: &str = "checkout.payments.events";
/// Commands of the orchestrator to Inventory: `ReserveStock`, `ReleaseStock`.
pub const INVENTORY_COMMANDS: &str = "checkout.inventory.commands";
/// Commands of the orchestrator to Payments: `ChargePayment`.
pub const PAYMENTS_COMMANDS: &str = "checkout.payments.commands";
/// Inventory's and Payments' answers to commands, addressed to the orchestrator.
pub const ORDERS_REPLIES: &str = "checkout.orders.replies";

/// How an order's saga runs; chosen by `--style` when the order is placed and kept with it,
/// so that orders placed before a restart in the other style still finish in theirs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Style {
    /// A state machine in Orders sends commands and waits for the answers.
    Orchestration,
    /// Each service reacts to the others' events; no one holds the saga's state.
    Choreography,
}

impl Style {
    pub fn as_str(self) -> &'static str {
        match self {
            Style::Orchestration => "orchestration",
            Style::Choreography => "choreography",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "orchestration" => Some(Style::Orchestration),
            "choreography" => Some(Style::Choreography),
            _ => None,
        }
    }
}

/// What an order is, as placed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderLine {
    pub sku: String,
    pub quantity: i32,
    pub amount: i64,
}

/// A message Orders sends: its topic, its type and its JSON payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    pub topic: &'static str,
    pub type_: &'static str,
    pub payload: serde_json::Value,
}

impl Outgoing {
    fn new(topic: &'static str, type_: &'static str, payload: serde_json::Value) -> Self {
        Self { topic, type_, payload }
    }
}

/// The first message of a new order's saga.
pub fn first_message(style: Style, order_id: Uuid, line: &OrderLine) -> Outgoing {
    match style {
        Style::Orchestration => Outgoing::new(
            INVENTORY_COMMANDS,
            "ReserveStock",
            serde_json::json!({"order_id": order_id.to_string(), "sku": line.sku, "quantity": line.quantity}),
        ),
        Style::Choreography => Outgoing::new(
            ORDERS_EVENTS,
            "OrderPlaced",
            serde_json::json!({
                "order_id": order_id.to_string(), "sku": line.sku, "quantity": line.quantity, "amount": line.amount,
            }),
        ),
    }
}

/// The orchestrator's states (`orders.sagas.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SagaState {
    ReservingStock,
    ChargingPayment,
    ReleasingStock,
    Done,
}

impl SagaState {
    pub fn as_str(self) -> &'static str {
        match self {
            SagaState::ReservingStock => "RESERVING_STOCK",
            SagaState::ChargingPayment => "CHARGING_PAYMENT",
            SagaState::ReleasingStock => "RELEASING_STOCK",
            SagaState::Done => "DONE",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "RESERVING_STOCK" => SagaState::ReservingStock,
            "CHARGING_PAYMENT" => SagaState::ChargingPayment,
            "RELEASING_STOCK" => SagaState::ReleasingStock,
            "DONE" => SagaState::Done,
            _ => return None,
        })
    }
}

/// An order's final status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Confirmed,
    Cancelled(String),
}

/// What Orders does on a message about an order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Step {
    /// The orchestrator's next state and the reason it keeps (orchestration only).
    pub saga: Option<(SagaState, Option<String>)>,
    /// The order's final status, if this message settles it.
    pub outcome: Option<Outcome>,
    pub send: Vec<Outgoing>,
}

/// The fields of an incoming message that Orders reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Incoming {
    #[serde(deserialize_with = "uuid_str")]
    pub order_id: Uuid,
    #[serde(default)]
    pub reason: Option<String>,
}

fn uuid_str<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Uuid, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(|_| serde::de::Error::custom(format!("order_id must be a UUID, got {s:?}")))
}

fn settle(order_id: Uuid, outcome: Outcome) -> (Outcome, Outgoing) {
    let event = match &outcome {
        Outcome::Confirmed => {
            Outgoing::new(ORDERS_EVENTS, "OrderConfirmed", serde_json::json!({"order_id": order_id.to_string()}))
        }
        Outcome::Cancelled(reason) => Outgoing::new(
            ORDERS_EVENTS,
            "OrderCancelled",
            serde_json::json!({"order_id": order_id.to_string(), "reason": reason}),
        ),
    };
    (outcome, event)
}

fn reason_of(msg: &Incoming, fallback: &str) -> String {
    msg.reason.clone().filter(|r| !r.is_empty()).unwrap_or_else(|| fallback.to_owned())
}

/// The orchestrator: the state an order's saga is in and an answer to one of its commands
/// give the next state and the next command (or the final event). `None`: the answer does not
/// belong to this state (a stray or late message); it is acked and changes nothing.
pub fn orchestrate(
    state: SagaState,
    kept_reason: Option<&str>,
    type_: &str,
    msg: &Incoming,
    line: &OrderLine,
) -> Option<Step> {
    let id = msg.order_id;
    let finish = |outcome| {
        let (outcome, event) = settle(id, outcome);
        Some(Step { saga: Some((SagaState::Done, None)), outcome: Some(outcome), send: vec![event] })
    };
    match (state, type_) {
        (SagaState::ReservingStock, "StockReserved") => Some(Step {
            saga: Some((SagaState::ChargingPayment, None)),
            outcome: None,
            send: vec![Outgoing::new(
                PAYMENTS_COMMANDS,
                "ChargePayment",
                serde_json::json!({"order_id": id.to_string(), "amount": line.amount}),
            )],
        }),
        (SagaState::ReservingStock, "OutOfStock") => finish(Outcome::Cancelled(reason_of(msg, "out of stock"))),
        (SagaState::ChargingPayment, "PaymentCharged") => finish(Outcome::Confirmed),
        (SagaState::ChargingPayment, "PaymentFailed") => {
            let reason = reason_of(msg, "payment failed");
            Some(Step {
                send: vec![Outgoing::new(
                    INVENTORY_COMMANDS,
                    "ReleaseStock",
                    serde_json::json!({"order_id": id.to_string(), "reason": reason}),
                )],
                saga: Some((SagaState::ReleasingStock, Some(reason))),
                outcome: None,
            })
        }
        (SagaState::ReleasingStock, "StockReleased") => {
            finish(Outcome::Cancelled(kept_reason.map_or_else(|| reason_of(msg, "stock released"), str::to_owned)))
        }
        _ => None,
    }
}

/// The choreography, from Orders' side: the events that settle an order. Every other event
/// (`StockReserved`, `PaymentFailed`) is another service's cue; Orders waits.
pub fn react(type_: &str, msg: &Incoming) -> Option<Step> {
    let outcome = match type_ {
        "OutOfStock" => Outcome::Cancelled(reason_of(msg, "out of stock")),
        "PaymentCharged" => Outcome::Confirmed,
        // Inventory releases the stock when a payment fails and passes the reason on.
        "StockReleased" => Outcome::Cancelled(reason_of(msg, "payment failed")),
        _ => return None,
    };
    let (outcome, event) = settle(msg.order_id, outcome);
    Some(Step { saga: None, outcome: Some(outcome), send: vec![event] })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line() -> OrderLine {
        OrderLine { sku: "SKU-1".into(), quantity: 2, amount: 100 }
    }

    fn msg(reason: Option<&str>) -> Incoming {
        Incoming { order_id: Uuid::nil(), reason: reason.map(str::to_owned) }
    }

    #[test]
    fn the_orchestrator_walks_the_happy_path() {
        let s = orchestrate(SagaState::ReservingStock, None, "StockReserved", &msg(None), &line()).unwrap();
        assert_eq!(s.saga, Some((SagaState::ChargingPayment, None)));
        assert_eq!(s.outcome, None);
        assert_eq!((s.send[0].topic, s.send[0].type_), (PAYMENTS_COMMANDS, "ChargePayment"));
        assert_eq!(s.send[0].payload["amount"], 100);
        let s = orchestrate(SagaState::ChargingPayment, None, "PaymentCharged", &msg(None), &line()).unwrap();
        assert_eq!(s.saga, Some((SagaState::Done, None)));
        assert_eq!(s.outcome, Some(Outcome::Confirmed));
        assert_eq!((s.send[0].topic, s.send[0].type_), (ORDERS_EVENTS, "OrderConfirmed"));
    }

    #[test]
    fn a_failed_payment_releases_the_stock_before_the_order_is_cancelled() {
        let declined = msg(Some("payment declined"));
        let s = orchestrate(SagaState::ChargingPayment, None, "PaymentFailed", &declined, &line()).unwrap();
        assert_eq!(s.saga, Some((SagaState::ReleasingStock, Some("payment declined".into()))));
        assert_eq!(s.outcome, None, "not cancelled before the stock is back");
        assert_eq!((s.send[0].topic, s.send[0].type_), (INVENTORY_COMMANDS, "ReleaseStock"));
        let s = orchestrate(SagaState::ReleasingStock, Some("payment declined"), "StockReleased", &msg(None), &line())
            .unwrap();
        assert_eq!(s.outcome, Some(Outcome::Cancelled("payment declined".into())));
        assert_eq!(s.send[0].type_, "OrderCancelled");
        assert_eq!(s.send[0].payload["reason"], "payment declined");
    }

    #[test]
    fn out_of_stock_cancels_with_inventorys_reason() {
        let m = msg(Some("out of stock: SKU-1 has 1 available, 2 requested"));
        let s = orchestrate(SagaState::ReservingStock, None, "OutOfStock", &m, &line()).unwrap();
        assert_eq!(s.outcome, Some(Outcome::Cancelled("out of stock: SKU-1 has 1 available, 2 requested".into())));
        assert_eq!(react("OutOfStock", &m).unwrap().outcome, s.outcome, "both styles reach the same outcome");
    }

    #[test]
    fn answers_that_do_not_fit_the_state_change_nothing() {
        for (state, type_) in [
            (SagaState::ChargingPayment, "StockReserved"),
            (SagaState::ReservingStock, "PaymentCharged"),
            (SagaState::Done, "PaymentCharged"),
            (SagaState::Done, "StockReleased"),
            (SagaState::ReleasingStock, "PaymentFailed"),
        ] {
            assert_eq!(orchestrate(state, None, type_, &msg(None), &line()), None, "{state:?} {type_}");
        }
    }

    #[test]
    fn the_choreography_settles_only_on_final_events() {
        assert_eq!(react("StockReserved", &msg(None)), None);
        assert_eq!(react("PaymentFailed", &msg(Some("declined"))), None);
        assert_eq!(react("PaymentCharged", &msg(None)).unwrap().outcome, Some(Outcome::Confirmed));
        let s = react("StockReleased", &msg(Some("payment declined"))).unwrap();
        assert_eq!(s.outcome, Some(Outcome::Cancelled("payment declined".into())));
        assert_eq!(s.saga, None);
    }

    #[test]
    fn the_first_message_depends_on_the_style() {
        let id = Uuid::now_v7();
        let o = first_message(Style::Orchestration, id, &line());
        assert_eq!((o.topic, o.type_), (INVENTORY_COMMANDS, "ReserveStock"));
        let c = first_message(Style::Choreography, id, &line());
        assert_eq!((c.topic, c.type_), (ORDERS_EVENTS, "OrderPlaced"));
        assert_eq!(c.payload["amount"], 100);
        assert_eq!(c.payload["order_id"], id.to_string());
    }
}

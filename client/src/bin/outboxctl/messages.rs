//! One message and its delivery state per consumer, as `outboxctl message get` and
//! `outboxctl tail` print it.

use comfy_table::Table;
use outbox_proto::v1 as pb;
use serde_json::{Value, json};

use crate::Output;
use crate::format::{fmt_time, payload_text, time_json};

pub(crate) fn message_json(m: &pb::Message) -> Value {
    json!({
        "message_id": m.message_id,
        "seq": m.seq,
        "topic": m.topic,
        "type": m.r#type,
        "payload": payload_text(&m.payload),
        "headers": m.headers,
        "ordering_key": m.ordering_key,
        "enqueued_at": time_json(m.enqueued_at.as_ref()),
        "available_at": time_json(m.available_at.as_ref()),
        "relayed_at": time_json(m.relayed_at.as_ref()),
    })
}

pub(crate) fn state_name(s: i32) -> &'static str {
    match pb::delivery_state::State::try_from(s) {
        Ok(pb::delivery_state::State::Pending) => "PENDING",
        Ok(pb::delivery_state::State::Leased) => "LEASED",
        Ok(pb::delivery_state::State::Acked) => "ACKED",
        Ok(pb::delivery_state::State::Dead) => "DEAD",
        Err(_) => "UNKNOWN",
    }
}

pub(crate) fn delivery_json(d: &pb::DeliveryState) -> Value {
    json!({
        "consumer": d.consumer,
        "state": state_name(d.state),
        "delivery_count": d.delivery_count,
        "last_error": d.last_error,
        "created_at": time_json(d.created_at.as_ref()),
        "available_at": time_json(d.available_at.as_ref()),
        "lease_expires_at": time_json(d.lease_expires_at.as_ref()),
        "acked_at": time_json(d.acked_at.as_ref()),
        "dead_at": time_json(d.dead_at.as_ref()),
        "updated_at": time_json(d.updated_at.as_ref()),
    })
}

/// A message and its delivery timeline, for every consumer or just `only`.
pub(crate) fn print_message(out: Output, m: &pb::GetMessageResponse, only: Option<&str>) {
    let deliveries: Vec<&pb::DeliveryState> =
        m.deliveries.iter().filter(|d| only.is_none_or(|c| c == d.consumer)).collect();
    if out == Output::Json {
        println!(
            "{}",
            json!({
                "message": m.message.as_ref().map(message_json),
                "deliveries": deliveries.iter().map(|d| delivery_json(d)).collect::<Vec<_>>(),
            })
        );
        return;
    }
    if let Some(msg) = &m.message {
        println!("message_id:   {}", msg.message_id);
        println!("seq:          {}", msg.seq);
        println!("topic:        {}", msg.topic);
        println!("type:         {}", msg.r#type);
        println!("ordering_key: {}", if msg.ordering_key.is_empty() { "-" } else { &msg.ordering_key });
        println!("enqueued_at:  {}", fmt_time(msg.enqueued_at.as_ref()));
        println!("relayed_at:   {}", fmt_time(msg.relayed_at.as_ref()));
        for (k, v) in &msg.headers {
            println!("header:       {k}: {v}");
        }
        println!("payload:      {}", payload_text(&msg.payload));
    }
    let mut t = Table::new();
    t.load_style(comfy_table::presets::NOTHING);
    t.set_header(["CONSUMER", "STATE", "DELIVERIES", "CREATED", "UPDATED", "ACKED", "DEAD", "LAST ERROR"]);
    for d in deliveries {
        t.add_row([
            d.consumer.clone(),
            state_name(d.state).to_owned(),
            d.delivery_count.to_string(),
            fmt_time(d.created_at.as_ref()),
            fmt_time(d.updated_at.as_ref()),
            fmt_time(d.acked_at.as_ref()),
            fmt_time(d.dead_at.as_ref()),
            d.last_error.clone(),
        ]);
    }
    println!("\n{t}");
}

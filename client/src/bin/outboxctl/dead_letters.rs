//! `outboxctl dead-letters`: list, and replay or purge, a consumer's dead letters.

use anyhow::Result;
use clap::Subcommand;
use comfy_table::Table;
use outbox_client::grpc::AdminClient;
use outbox_proto::v1 as pb;
use serde_json::{Value, json};

use crate::Output;
use crate::failure::{Failure, status_failure};
use crate::format::{fmt_time, time_json};
use crate::messages::{message_json, print_message};

#[derive(Debug, Subcommand)]
pub(crate) enum DeadLettersCmd {
    /// A consumer's dead letters with their last error.
    List {
        consumer: String,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// One dead letter: the message, its payload and its delivery timeline.
    Show { consumer: String, message_id: String },
}

pub(crate) async fn dead_letters(admin: &mut AdminClient, out: Output, cmd: DeadLettersCmd) -> Result<(), Failure> {
    let st = |s: tonic::Status| status_failure(&s);
    match cmd {
        DeadLettersCmd::List { consumer, limit } => {
            let mut all = Vec::new();
            let mut token = String::new();
            while all.len() < limit {
                let page_size = (limit - all.len()).min(1000) as u32;
                let page = admin
                    .list_dead_letters(pb::ListDeadLettersRequest {
                        consumer: consumer.clone(),
                        page_size,
                        page_token: token,
                    })
                    .await
                    .map_err(st)?
                    .into_inner();
                all.extend(page.dead_letters);
                if page.next_page_token.is_empty() {
                    break;
                }
                token = page.next_page_token;
            }
            if out == Output::Json {
                let rows: Vec<Value> = all
                    .iter()
                    .map(|d| {
                        json!({
                            "message": d.message.as_ref().map(message_json),
                            "consumer": d.consumer,
                            "delivery_count": d.delivery_count,
                            "last_error": d.last_error,
                            "dead_at": time_json(d.dead_at.as_ref()),
                        })
                    })
                    .collect();
                println!("{}", Value::Array(rows));
                return Ok(());
            }
            let mut t = Table::new();
            t.load_style(comfy_table::presets::NOTHING);
            t.set_header(["MESSAGE ID", "TOPIC", "TYPE", "DELIVERIES", "DEAD AT", "LAST ERROR"]);
            for d in &all {
                let m = d.message.clone().unwrap_or_default();
                t.add_row([
                    m.message_id,
                    m.topic,
                    m.r#type,
                    d.delivery_count.to_string(),
                    fmt_time(d.dead_at.as_ref()),
                    d.last_error.clone(),
                ]);
            }
            println!("{t}");
            Ok(())
        }
        DeadLettersCmd::Show { consumer, message_id } => {
            let m = admin.get_message(pb::GetMessageRequest { message_id }).await.map_err(st)?.into_inner();
            if !m.deliveries.iter().any(|d| d.consumer == consumer) {
                return Err(Failure {
                    code: 3,
                    message: format!("consumer {consumer:?} has no delivery of this message"),
                });
            }
            print_message(out, &m, Some(&consumer));
            Ok(())
        }
    }
}

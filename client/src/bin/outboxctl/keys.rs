//! `outboxctl keys`: the ordering keys a consumer holds after a dead letter, and their release.

use anyhow::Result;
use clap::Subcommand;
use comfy_table::Table;
use outbox_client::grpc::AdminClient;
use outbox_proto::v1 as pb;
use serde_json::{Value, json};

use crate::Output;
use crate::failure::{Failure, status_failure};
use crate::format::{fmt_time, time_json};

#[derive(Debug, Subcommand)]
pub(crate) enum KeysCmd {
    /// The held keys, oldest first: the dead message that holds each, its error, and how
    /// many messages wait behind it.
    List { consumer: String },
    /// Let a held key flow again: its dead message is delivered again first, then the waiting
    /// ones in order (with --skip-dead: the dead message stays dead and the waiting ones go).
    Release {
        consumer: String,
        key: String,
        /// Leave the dead message dead; deliver the waiting ones without it.
        #[arg(long)]
        skip_dead: bool,
    },
}

pub(crate) fn held_key_json(k: &pb::HeldKey) -> Value {
    json!({
        "ordering_key": k.ordering_key,
        "message_id": k.message_id,
        "last_error": k.last_error,
        "waiting": k.waiting,
        "held_at": time_json(k.held_at.as_ref()),
    })
}

pub(crate) async fn keys(admin: &mut AdminClient, out: Output, cmd: KeysCmd) -> Result<(), Failure> {
    let st = |s: tonic::Status| status_failure(&s);
    match cmd {
        KeysCmd::List { consumer } => {
            let r = admin.list_held_keys(pb::ListHeldKeysRequest { consumer }).await.map_err(st)?.into_inner();
            if out == Output::Json {
                println!(
                    "{}",
                    json!({ "keys": r.keys.iter().map(held_key_json).collect::<Vec<_>>(), "truncated": r.truncated })
                );
                return Ok(());
            }
            let mut t = Table::new();
            t.load_style(comfy_table::presets::NOTHING);
            t.set_header(["KEY", "DEAD MESSAGE", "WAITING", "HELD SINCE", "LAST ERROR"]);
            for k in &r.keys {
                t.add_row([
                    k.ordering_key.clone(),
                    k.message_id.clone(),
                    k.waiting.to_string(),
                    fmt_time(k.held_at.as_ref()),
                    k.last_error.clone(),
                ]);
            }
            println!("{t}");
            if r.truncated {
                eprintln!("(the first {} held keys; more are held)", r.keys.len());
            }
        }
        KeysCmd::Release { consumer, key, skip_dead } => {
            let r = admin
                .release_key(pb::ReleaseKeyRequest { consumer: consumer.clone(), ordering_key: key.clone(), skip_dead })
                .await
                .map_err(st)?
                .into_inner();
            let k = r.key.unwrap_or_default();
            if out == Output::Json {
                println!("{}", json!({ "released": held_key_json(&k), "skip_dead": skip_dead }));
            } else if skip_dead {
                println!(
                    "released key {key:?} of {consumer}: {} waiting go on without dead message {}",
                    k.waiting, k.message_id
                );
            } else {
                println!(
                    "released key {key:?} of {consumer}: dead message {} is delivered again first, then {} waiting",
                    k.message_id, k.waiting
                );
            }
        }
    }
    Ok(())
}

//! `outboxctl publish`: one message, enqueued by outboxd.

use anyhow::Result;
use clap::Args;
use outbox_client::grpc::{self};
use outbox_proto::v1 as pb;
use serde_json::json;

use crate::Output;
use crate::failure::{Failure, status_failure};

#[derive(Debug, Args)]
pub(crate) struct PublishArgs {
    /// The message's topic (dot-separated segments: `orders.created`).
    topic: String,
    /// The message's type (`OrderCreated`).
    #[arg(name = "TYPE")]
    type_: String,
    /// The payload: text as it is, `@FILE` for a file's bytes, `-` for standard input.
    #[arg(long, default_value = "")]
    payload: String,
    /// A header `key=value`; repeat for several.
    #[arg(long = "header", value_name = "KEY=VALUE")]
    headers: Vec<String>,
    /// The ordering key: messages that share one are delivered one at a time, in order.
    #[arg(long)]
    key: Option<String>,
    /// The message id (a UUID); the same message again is an idempotent duplicate.
    #[arg(long)]
    id: Option<String>,
}

/// `outboxctl publish`: one Enqueue.
pub(crate) async fn publish(mut client: grpc::OutboxClient, out: Output, a: PublishArgs) -> Result<(), Failure> {
    let invalid = |message: String| Failure { code: 4, message };
    let payload = match a.payload.as_str() {
        "-" => {
            let mut buf = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)
                .map_err(|e| invalid(format!("--payload -: reading standard input: {e}")))?;
            buf
        }
        p if p.starts_with('@') => {
            std::fs::read(&p[1..]).map_err(|e| invalid(format!("--payload {p}: cannot read the file: {e}")))?
        }
        p => p.as_bytes().to_vec(),
    };
    let mut headers = std::collections::HashMap::new();
    for h in &a.headers {
        let (k, v) = h.split_once('=').ok_or_else(|| invalid(format!("--header {h:?}: expected KEY=VALUE")))?;
        headers.insert(k.to_owned(), v.to_owned());
    }
    let req = pb::EnqueueRequest {
        topic: a.topic,
        r#type: a.type_,
        payload,
        headers,
        message_id: a.id,
        ordering_key: a.key,
        ..Default::default()
    };
    let done = client.enqueue(req).await.map_err(|s| status_failure(&s))?.into_inner();
    if out == Output::Json {
        println!("{}", json!({ "message_id": done.message_id, "seq": done.seq, "duplicate": done.duplicate }));
    } else if done.duplicate {
        println!("{} (seq {}) already existed: nothing was enqueued", done.message_id, done.seq);
    } else {
        println!("{} (seq {})", done.message_id, done.seq);
    }
    Ok(())
}

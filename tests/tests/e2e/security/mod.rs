//! TLS, mTLS, tokens, permissions, reloads and the protected mode, against real outboxd
//! processes. Certificates are made here (rcgen). Authentication does not depend on the store,
//! so these run on SQLite only.
//!
//! One file per subject; the principals, auth files and calls they share are here.
mod clients;
mod permissions;
mod reload;
mod tls;
mod unauthenticated;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use futures::StreamExt as _;
use outbox_client::Credentials;
use outbox_client::grpc::{AdminClient, OutboxClient, admin_with, outbox_with};
use outbox_proto::v1 as pb;
use outbox_tests::pki::write_atomically;
use outbox_tests::{FAST, Outboxd, TestStore, consumer};
use sha2::Digest as _;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

pub(crate) fn hash(token: &str) -> String {
    let d = sha2::Sha256::digest(token.as_bytes());
    format!("sha256:{}", d.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// Principals, one per permission (and one without any), each with the token `tok-<name>`.
const PRINCIPALS: &[(&str, &[&str])] = &[
    ("none", &[]),
    ("producer", &["produce:orders.>"]),
    ("billing", &["consume:billing"]),
    ("tailer", &["tail:orders.>"]),
    ("reader", &["admin:read"]),
    // A consumer takes only topics its creator may read, and is deleted by its creator or `*`
    // (ADR 0072): what the writer's calls below create and delete.
    ("writer", &["admin:write", "tail:x.y", "consume:doomed-*"]),
    ("replayer", &["replay:bill*"]),
    ("root", &["*"]),
];

pub(crate) fn auth_file(principals: &[(&str, &[&str])]) -> String {
    let mut s = String::new();
    for (name, perms) in principals {
        let perms: Vec<String> = perms.iter().map(|p| format!("{p:?}")).collect();
        s += &format!(
            "[[principal]]\nname = {name:?}\ntokens = [{:?}]\npermissions = [{}]\n\n",
            hash(&format!("tok-{name}")),
            perms.join(", ")
        );
    }
    s
}

pub(crate) fn tok(name: &str) -> Credentials {
    Credentials::token(format!("tok-{name}"))
}

/// A scratch directory for auth files, removed when dropped.
pub(crate) struct Scratch(PathBuf);

impl Scratch {
    pub(crate) fn new() -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("outboxd-auth-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }

    pub(crate) fn write(&self, name: &str, text: &str) -> Result<PathBuf> {
        let p = self.0.join(name);
        write_atomically(&p, text.as_bytes())?;
        Ok(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) async fn start(store: &TestStore, extra: &[&str]) -> Result<Outboxd> {
    let args: Vec<&str> = FAST.iter().chain(extra).copied().collect();
    Outboxd::start(store.url(), &args).await
}

pub(crate) fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn code<T>(r: Result<T, tonic::Status>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

/// Calls `method` (every method of both services) as `creds`, with a request that succeeds
/// when allowed. The `Err` is the call's status.
async fn call(method: &str, endpoint: &str, creds: &Credentials, msg_id: &str) -> Result<(), tonic::Status> {
    let unavailable = |e: outbox_client::ClientError| tonic::Status::unavailable(e.to_string());
    let mut admin: AdminClient = admin_with(endpoint, creds).await.map_err(unavailable)?;
    let mut client: OutboxClient = outbox_with(endpoint, creds).await.map_err(unavailable)?;
    let enqueue = |topic: &str| pb::EnqueueRequest { topic: topic.into(), r#type: "T".into(), ..Default::default() };
    let replay = pb::ReplayRequest {
        consumer: "billing".into(),
        message_ids: vec![msg_id.into()],
        dry_run: true,
        ..Default::default()
    };
    match method {
        "Enqueue" => client.enqueue(enqueue("orders.created")).await.map(drop),
        "EnqueueBatch" => client
            .enqueue_batch(pb::EnqueueBatchRequest { messages: vec![enqueue("orders.a"), enqueue("orders.b")] })
            .await
            .map(drop),
        "Subscribe" => {
            let (tx, rx) = mpsc::channel(4);
            let start = pb::Start { consumer: "billing".into(), max_in_flight: 1, ack_deadline: None };
            tx.send(pb::SubscribeRequest { request: Some(pb::subscribe_request::Request::Start(start)) })
                .await
                .unwrap();
            let r = client.subscribe(ReceiverStream::new(rx)).await.map(drop);
            drop(tx);
            r
        }
        "Tail" => admin.tail(pb::TailRequest { topics: vec!["orders.*".into()] }).await.map(drop),
        "GetStats" => admin.get_stats(pb::GetStatsRequest::default()).await.map(drop),
        "GetConsumer" => admin.get_consumer(pb::GetConsumerRequest { consumer: "billing".into() }).await.map(drop),
        "ListConsumers" => admin.list_consumers(pb::ListConsumersRequest {}).await.map(drop),
        "ListDeadLetters" => admin
            .list_dead_letters(pb::ListDeadLettersRequest { consumer: "billing".into(), ..Default::default() })
            .await
            .map(drop),
        "GetMessage" => admin.get_message(pb::GetMessageRequest { message_id: msg_id.into() }).await.map(drop),
        "CreateConsumer" => {
            let name = format!("made-{}", uuid::Uuid::new_v4().simple());
            admin
                .create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer(&name, &["x.y"])) })
                .await
                .map(drop)
        }
        "DeleteConsumer" => {
            let name = format!("doomed-{}", uuid::Uuid::new_v4().simple());
            // Created by the writer: deleted by its creator or `*` alone (ADR 0072).
            let mut as_writer = admin_with(endpoint, &tok("writer")).await.map_err(unavailable)?;
            as_writer.create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer(&name, &["x.y"])) }).await?;
            admin.delete_consumer(pb::DeleteConsumerRequest { consumer: name }).await.map(drop)
        }
        "PauseConsumer" => admin.pause_consumer(pb::PauseConsumerRequest { consumer: "idle".into() }).await.map(drop),
        "ResumeConsumer" => {
            admin.resume_consumer(pb::ResumeConsumerRequest { consumer: "idle".into() }).await.map(drop)
        }
        "Prune" => admin.prune(pb::PruneRequest::default()).await.map(drop),
        "Replay" => admin.replay(replay).await.map(drop),
        "ReplayStream" => {
            let mut s = admin.replay_stream(replay).await?.into_inner();
            while let Some(p) = s.next().await {
                p?;
            }
            Ok(())
        }
        "ListHeldKeys" => admin.list_held_keys(pb::ListHeldKeysRequest { consumer: "billing".into() }).await.map(drop),
        // No key is held: past the permission check, the answer is NOT_FOUND.
        "ReleaseKey" => match admin
            .release_key(pb::ReleaseKeyRequest {
                consumer: "billing".into(),
                ordering_key: "k".into(),
                skip_dead: true,
            })
            .await
        {
            Err(s) if s.code() == Code::NotFound => Ok(()),
            other => other.map(drop),
        },
        other => panic!("no test call for {other}: add one"),
    }
}

/// Which principal of [`PRINCIPALS`] each method needs.
fn allowed_for(method: &str) -> &'static str {
    match method {
        "Enqueue" | "EnqueueBatch" => "producer",
        "Subscribe" => "billing",
        "Tail" => "tailer",
        "GetStats" | "GetConsumer" | "ListConsumers" | "ListDeadLetters" | "GetMessage" | "ListHeldKeys" => "reader",
        "CreateConsumer" | "DeleteConsumer" | "PauseConsumer" | "ResumeConsumer" | "Prune" => "writer",
        "Replay" | "ReplayStream" | "ReleaseKey" => "replayer",
        other => panic!("no principal for {other}: add one"),
    }
}

/// Every method of `outbox.v1`, from the descriptor set the server serves.
fn all_methods() -> Vec<String> {
    use prost::Message as _;
    let fds = prost_types::FileDescriptorSet::decode(outbox_proto::FILE_DESCRIPTOR_SET).unwrap();
    fds.file.iter().flat_map(|f| f.service.iter()).flat_map(|s| s.method.iter()).map(|m| m.name().to_owned()).collect()
}

async fn scrape(addr: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").await?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_to_string(&mut body)).await??;
    Ok(body)
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

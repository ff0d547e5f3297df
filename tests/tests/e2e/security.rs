//! TLS, mTLS, tokens, permissions, reloads and the protected mode, against real outboxd
//! processes. Certificates are made here (rcgen). Authentication does not depend on the store,
//! so these run on SQLite only.
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use futures::StreamExt as _;
use outbox_client::Credentials;
use outbox_client::grpc::{AdminClient, OutboxClient, admin_with, outbox_with};
use outbox_proto::v1 as pb;
use outbox_tests::pki::{Pki, write_atomically};
use outbox_tests::{Backend, FAST, Outboxd, TestStore, consumer, eventually, outboxd_path};
use sha2::Digest as _;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::WAIT;

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

#[tokio::test]
async fn every_method_is_denied_without_its_permission_and_allowed_with_it() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let file = scratch.write("auth.toml", &auth_file(PRINCIPALS))?;
    let metrics = format!("127.0.0.1:{}", free_port()?);
    let srv = start(&store, &["--auth-file", s(&file), "--metrics-listen", &metrics]).await?;
    let root = tok("root");
    let mut admin = admin_with(&srv.endpoint, &root).await?;
    for name in ["billing", "idle"] {
        admin.create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer(name, &["orders.*"])) }).await?;
    }
    let mut client = outbox_with(&srv.endpoint, &root).await?;
    let msg_id = client
        .enqueue(pb::EnqueueRequest { topic: "orders.created".into(), r#type: "T".into(), ..Default::default() })
        .await?
        .into_inner()
        .message_id;

    let methods = all_methods();
    assert_eq!(methods.len(), 18, "{methods:?}");
    for m in &methods {
        let need = allowed_for(m);
        // Nobody else but root may.
        for (other, _) in PRINCIPALS.iter().filter(|(p, _)| *p != need && *p != "root") {
            let err = call(m, &srv.endpoint, &tok(other), &msg_id).await.expect_err(&format!("{other} may {m}"));
            assert_eq!(err.code(), Code::PermissionDenied, "{other} calling {m}: {err:?}");
            assert!(err.message().contains(&format!("principal \"{other}\" lacks the permission")), "{m}: {err:?}");
            assert!(!err.message().contains("tok-"), "a denial shows no token: {err:?}");
        }
        call(m, &srv.endpoint, &tok(need), &msg_id).await.with_context(|| format!("{need} calling {m}"))?;
        call(m, &srv.endpoint, &root, &msg_id).await.with_context(|| format!("root calling {m}"))?;
        // No credential, an unknown token.
        for creds in [Credentials::default(), Credentials::token("tok-nobody")] {
            let err = call(m, &srv.endpoint, &creds, &msg_id).await.expect_err(m);
            assert_eq!(err.code(), Code::Unauthenticated, "{m} with {creds:?}: {err:?}");
        }
    }

    // The permission is named: of the method's kind for a caller that holds none of it
    // (refused from its headers), with the resource for one that holds others (below).
    let err = call("Enqueue", &srv.endpoint, &tok("none"), &msg_id).await.unwrap_err();
    assert!(err.message().contains("produce:PATTERN"), "{err:?}");
    let err = call("PauseConsumer", &srv.endpoint, &tok("reader"), &msg_id).await.unwrap_err();
    assert!(err.message().contains("admin:write"), "{err:?}");

    let metrics_text = eventually("decisions counted", WAIT, || async {
        let t = scrape(&metrics).await?;
        let found = ["allowed", "denied"].iter().all(|o| {
            t.lines().any(|l| {
                l.starts_with("outboxd_auth_decisions_total")
                    && l.contains("principal=\"reader\"")
                    && l.contains(&format!("outcome=\"{o}\""))
            })
        }) && t
            .lines()
            .any(|l| l.starts_with("outboxd_auth_decisions_total") && l.contains("outcome=\"unauthenticated\""));
        Ok(found.then_some(t))
    })
    .await?;
    assert!(!metrics_text.contains("tok-"), "metrics show no token");
    Ok(())
}

#[tokio::test]
async fn resources_are_checked_topic_by_topic_and_consumer_by_consumer() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let file = scratch.write("auth.toml", &auth_file(PRINCIPALS))?;
    let srv = start(&store, &["--auth-file", s(&file)]).await?;
    let root = tok("root");
    let mut admin = admin_with(&srv.endpoint, &root).await?;
    for name in ["billing", "billing-2"] {
        admin.create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer(name, &["orders.*"])) }).await?;
    }
    let e = |topic: &str| pb::EnqueueRequest { topic: topic.into(), r#type: "T".into(), ..Default::default() };

    // produce:orders.> — not payments, and a batch with one foreign topic is refused whole.
    let mut producer = outbox_with(&srv.endpoint, &tok("producer")).await?;
    producer.enqueue(e("orders.eu.created")).await?;
    let err = producer.enqueue(e("payments.created")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("produce:payments.created"), "{err:?}");
    let before = admin.get_stats(pb::GetStatsRequest::default()).await?.into_inner().unrelayed;
    let err = producer
        .enqueue_batch(pb::EnqueueBatchRequest { messages: vec![e("orders.a"), e("payments.b")] })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let after = admin.get_stats(pb::GetStatsRequest::default()).await?.into_inner().unrelayed;
    assert!(after <= before, "nothing of a refused batch is enqueued");
    // Validation first: a bad request says what is wrong with it.
    assert_eq!(producer.enqueue(e("")).await.unwrap_err().code(), Code::InvalidArgument);

    // consume:billing — not billing-2 (whose existence it does not learn either).
    let open = |consumer: &str, creds: Credentials| {
        let endpoint = srv.endpoint.clone();
        let consumer = consumer.to_owned();
        async move {
            let mut c = outbox_with(&endpoint, &creds).await.unwrap();
            let (tx, rx) = mpsc::channel(4);
            let start = pb::Start { consumer, max_in_flight: 1, ack_deadline: None };
            tx.send(pb::SubscribeRequest { request: Some(pb::subscribe_request::Request::Start(start)) })
                .await
                .unwrap();
            c.subscribe(ReceiverStream::new(rx)).await.map(|r| (r, tx))
        }
    };
    assert!(open("billing", tok("billing")).await.is_ok());
    let err = open("billing-2", tok("billing")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("consume:billing-2") && err.message().contains("consumer \"billing-2\""), "{err:?}");
    assert_eq!(open("no-such", tok("billing")).await.unwrap_err().code(), Code::PermissionDenied);
    assert_eq!(open("no-such", tok("root")).await.unwrap_err().code(), Code::NotFound);

    // tail:orders.> — patterns inside it, not every topic, not others.
    let mut tailer = admin_with(&srv.endpoint, &tok("tailer")).await?;
    for ok in [vec!["orders.*"], vec!["orders.>"], vec!["orders.eu.created", "orders.us.*"]] {
        let topics = ok.iter().map(|t| t.to_string()).collect();
        tailer.tail(pb::TailRequest { topics }).await.with_context(|| format!("tail {ok:?}"))?;
    }
    for denied in [vec![], vec!["orders"], vec!["orders.*", "payments.*"], vec!["*.created"]] {
        let topics = denied.iter().map(|t| t.to_string()).collect();
        let err = tailer.tail(pb::TailRequest { topics }).await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "tail {denied:?}");
    }
    let err = tailer.tail(pb::TailRequest { topics: vec![] }).await.unwrap_err();
    assert!(err.message().contains("tail:>"), "{err:?}");

    // replay:bill* — billing and billing-2, not idle.
    let mut replayer = admin_with(&srv.endpoint, &tok("replayer")).await?;
    let replay =
        |c: &str| pb::ReplayRequest { consumer: c.into(), dead_letters: true, dry_run: true, ..Default::default() };
    replayer.replay(replay("billing-2")).await?;
    let err = replayer.replay(replay("orders")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("replay:orders"), "{err:?}");

    // A malformed header is refused as unauthenticated.
    let channel = outbox_client::grpc::connect(&srv.endpoint).await?;
    let mut raw = pb::outbox_admin_client::OutboxAdminClient::new(channel);
    for header in ["Basic dG9rLXJvb3Q=", "Bearer", "tok-root"] {
        let mut req = tonic::Request::new(pb::ListConsumersRequest {});
        req.metadata_mut().insert("authorization", header.parse()?);
        let err = raw.list_consumers(req).await.unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{header}: {err:?}");
    }
    Ok(())
}

#[tokio::test]
async fn health_stays_open_and_reflection_v1_and_v1alpha_need_a_credential() -> Result<()> {
    use tonic_reflection::pb::{v1, v1alpha};
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let file = scratch.write("auth.toml", &auth_file(PRINCIPALS))?;
    let srv = start(&store, &["--auth-file", s(&file)]).await?;
    let channel = outbox_client::grpc::connect(&srv.endpoint).await?;

    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let h = health.check(tonic_health::pb::HealthCheckRequest { service: "outbox.v1.Outbox".into() }).await?;
    assert_eq!(h.into_inner().status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);

    let bearer: tonic::metadata::MetadataValue<_> = "Bearer tok-none".parse()?;
    // v1alpha, as grpcurl 1.8.6 speaks it.
    let list = |token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>| {
        let channel = channel.clone();
        async move {
            let mut c = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
            let req = v1alpha::ServerReflectionRequest {
                host: String::new(),
                message_request: Some(v1alpha::server_reflection_request::MessageRequest::ListServices(String::new())),
            };
            let mut r = tonic::Request::new(futures::stream::iter([req]));
            if let Some(t) = token {
                r.metadata_mut().insert("authorization", t);
            }
            let mut inbound = c.server_reflection_info(r).await?.into_inner();
            let first = inbound.message().await?.context("no reflection answer")?;
            let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(l)) =
                first.message_response
            else {
                bail!("not a service list: {first:?}")
            };
            Ok::<_, anyhow::Error>(l.service.into_iter().map(|s| s.name).collect::<Vec<_>>())
        }
    };
    let err = list(None).await.unwrap_err();
    assert_eq!(err.downcast_ref::<tonic::Status>().map(|s| s.code()), Some(Code::Unauthenticated), "{err:?}");
    let services = list(Some(bearer.clone())).await?;
    for svc in ["outbox.v1.Outbox", "outbox.v1.OutboxAdmin", "grpc.health.v1.Health"] {
        assert!(services.iter().any(|s| s == svc), "{svc} in {services:?}");
    }

    // v1 too.
    let mut c = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let req = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::FileContainingSymbol(
            "outbox.v1.Outbox".into(),
        )),
    };
    let mut r = tonic::Request::new(futures::stream::iter([req.clone()]));
    r.metadata_mut().insert("authorization", bearer);
    let first = c.server_reflection_info(r).await?.into_inner().message().await?.context("no answer")?;
    assert!(
        matches!(
            first.message_response,
            Some(v1::server_reflection_response::MessageResponse::FileDescriptorResponse(_))
        ),
        "{first:?}"
    );
    let err = c.server_reflection_info(futures::stream::iter([req])).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    Ok(())
}

/// The reflection service without any auth file: v1alpha answers (the issue's grpcurl 1.8.6).
#[tokio::test]
async fn reflection_v1alpha_answers_without_an_auth_file() -> Result<()> {
    use tonic_reflection::pb::v1alpha;
    let store = TestStore::create(Backend::Sqlite).await?;
    let srv = start(&store, &[]).await?;
    let mut c = v1alpha::server_reflection_client::ServerReflectionClient::new(
        outbox_client::grpc::connect(&srv.endpoint).await?,
    );
    let req = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1alpha::server_reflection_request::MessageRequest::FileContainingSymbol(
            "outbox.v1.OutboxAdmin".into(),
        )),
    };
    let first = c.server_reflection_info(futures::stream::iter([req])).await?.into_inner().message().await?;
    let Some(v1alpha::server_reflection_response::MessageResponse::FileDescriptorResponse(f)) =
        first.context("no answer")?.message_response
    else {
        bail!("no file descriptor");
    };
    assert!(!f.file_descriptor_proto.is_empty());
    Ok(())
}

#[tokio::test]
async fn tls_serves_clients_that_trust_its_ca_and_refuses_plain_ones() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let pki = Pki::new("ca")?;
    let server = pki.server("server")?;
    let mut srv = start(&store, &["--tls-cert", s(&server.cert), "--tls-key", s(&server.key)]).await?;
    srv.endpoint = format!("https://127.0.0.1:{}", srv.addr.port());
    let trusted = Credentials { tls_ca: Some(pki.ca.clone()), ..Default::default() };
    let mut admin = admin_with(&srv.endpoint, &trusted).await?;
    admin.list_consumers(pb::ListConsumersRequest {}).await?;
    // By name as well as by address.
    let by_name = format!("https://localhost:{}", srv.addr.port());
    admin_with(&by_name, &trusted).await?.list_consumers(pb::ListConsumersRequest {}).await?;

    // A client that trusts another CA, and a plain one, get nowhere.
    let other = pki.sibling("other")?;
    let untrusting = Credentials { tls_ca: Some(other.ca.clone()), ..Default::default() };
    let r = async {
        admin_with(&srv.endpoint, &untrusting)
            .await?
            .list_consumers(pb::ListConsumersRequest {})
            .await
            .map_err(anyhow::Error::from)
    };
    assert!(r.await.is_err(), "a client that does not trust the server's CA is refused");
    let plain = format!("http://127.0.0.1:{}", srv.addr.port());
    let r = async {
        outbox_client::grpc::admin(&plain)
            .await?
            .list_consumers(pb::ListConsumersRequest {})
            .await
            .map_err(anyhow::Error::from)
    };
    assert!(r.await.is_err(), "plain HTTP/2 to a TLS port fails");
    // TLS files with an http:// address are a mistake the client names.
    let e = admin_with(&plain, &trusted).await.unwrap_err();
    assert!(e.to_string().contains("https://"), "{e}");
    Ok(())
}

#[tokio::test]
async fn mtls_refuses_clients_without_a_certificate_and_names_principals_by_subject() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let pki = Pki::new("ca")?;
    let server = pki.server("server")?;
    let scratch = Scratch::new()?;
    let file = scratch.write(
        "auth.toml",
        r#"
[[principal]]
name = "inventory"
subjects = ["CN=inventory"]
permissions = ["consume:inventory-*", "admin:read"]

[[principal]]
name = "billing"
subjects = ["spiffe://example.org/billing"]
permissions = ["admin:write", "tail:a.b"]
"#,
    )?;
    let mut srv = start(
        &store,
        &[
            "--tls-cert",
            s(&server.cert),
            "--tls-key",
            s(&server.key),
            "--tls-client-ca",
            s(&pki.ca),
            "--auth-file",
            s(&file),
        ],
    )
    .await?;
    srv.endpoint = format!("https://127.0.0.1:{}", srv.addr.port());
    let with_cert = |c: &outbox_tests::pki::CertFiles| Credentials {
        tls_ca: Some(pki.ca.clone()),
        tls_cert: Some(c.cert.clone()),
        tls_key: Some(c.key.clone()),
        ..Default::default()
    };
    let list = |creds: Credentials| {
        let endpoint = srv.endpoint.clone();
        async move {
            admin_with(&endpoint, &creds)
                .await?
                .list_consumers(pb::ListConsumersRequest {})
                .await
                .map_err(anyhow::Error::from)
        }
    };

    // No certificate: the handshake is refused.
    let no_cert = Credentials { tls_ca: Some(pki.ca.clone()), ..Default::default() };
    assert!(list(no_cert).await.is_err(), "a client without a certificate is refused");
    // A certificate from another CA: refused too.
    let foreign = pki.sibling("foreign")?.client("foreign", "inventory", &[])?;
    assert!(list(with_cert(&foreign)).await.is_err(), "a certificate of another CA is refused");

    // CN=inventory is the principal "inventory": it may read, not write.
    let inventory = with_cert(&pki.client("inventory", "inventory", &[])?);
    list(inventory.clone()).await?;
    let err = admin_with(&srv.endpoint, &inventory)
        .await?
        .create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer("x", &["a.b"])) })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("\"inventory\""), "{err:?}");

    // A SAN URI names "billing", which may write (whatever its CN).
    let billing = with_cert(&pki.client("billing", "someone", &["spiffe://example.org/billing"])?);
    admin_with(&srv.endpoint, &billing)
        .await?
        .create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer("inventory-eu", &["a.b"])) })
        .await?;
    // The audit line names it and where it came from.
    eventually("an audit line naming billing", WAIT, || async {
        Ok((!srv.log_lines(&["outboxd::audit", "billing", "create_consumer", "127.0.0.1"]).is_empty()).then_some(()))
    })
    .await?;

    // A valid certificate that the file does not name: unauthenticated.
    let stranger = with_cert(&pki.client("stranger", "stranger", &[])?);
    let err = list(stranger).await.unwrap_err();
    assert_eq!(err.downcast_ref::<tonic::Status>().map(|s| s.code()), Some(Code::Unauthenticated), "{err:?}");

    // The subject's permission applies to its streams: inventory-eu, yes.
    let mut c = outbox_with(&srv.endpoint, &inventory).await?;
    let (tx, rx) = mpsc::channel(4);
    let start = pb::Start { consumer: "inventory-eu".into(), max_in_flight: 1, ack_deadline: None };
    tx.send(pb::SubscribeRequest { request: Some(pb::subscribe_request::Request::Start(start)) }).await?;
    c.subscribe(ReceiverStream::new(rx)).await?;
    Ok(())
}

/// mTLS alone (no auth file): every client with a certificate of the CA may do everything,
/// and outboxd serves on a non-loopback address without --allow-unauthenticated.
#[tokio::test]
async fn mtls_without_an_auth_file_authenticates_by_certificate_alone() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let pki = Pki::new("ca")?;
    let server = pki.server("server")?;
    let client = pki.client("client", "anyone", &[])?;
    let mut srv = start(
        &store,
        &[
            "--listen",
            "0.0.0.0:0",
            "--tls-cert",
            s(&server.cert),
            "--tls-key",
            s(&server.key),
            "--tls-client-ca",
            s(&pki.ca),
        ],
    )
    .await?;
    srv.endpoint = format!("https://127.0.0.1:{}", srv.addr.port());
    let creds = Credentials {
        tls_ca: Some(pki.ca.clone()),
        tls_cert: Some(client.cert.clone()),
        tls_key: Some(client.key.clone()),
        ..Default::default()
    };
    admin_with(&srv.endpoint, &creds)
        .await?
        .create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer("c", &["a.b"])) })
        .await?;
    eventually("an audit line naming the certificate", WAIT, || async {
        Ok((!srv.log_lines(&["outboxd::audit", "CN=anyone", "create_consumer"]).is_empty()).then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_rotated_certificate_serves_new_connections_and_drops_no_open_stream() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let old_ca = Pki::new("old")?;
    let new_ca = old_ca.sibling("new")?;
    let server = old_ca.server("server")?;
    let mut srv =
        start(&store, &["--tls-cert", s(&server.cert), "--tls-key", s(&server.key), "--reload-interval", "100ms"])
            .await?;
    srv.endpoint = format!("https://127.0.0.1:{}", srv.addr.port());
    let trusts = |pki: &Pki| Credentials { tls_ca: Some(pki.ca.clone()), ..Default::default() };
    let mut admin = admin_with(&srv.endpoint, &trusts(&old_ca)).await?;
    admin.create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer("billing", &["orders.*"])) }).await?;

    // A stream opened under the old certificate, with a delivery in hand.
    let mut client = outbox_with(&srv.endpoint, &trusts(&old_ca)).await?;
    let (tx, rx) = mpsc::channel(16);
    let start = pb::Start { consumer: "billing".into(), max_in_flight: 10, ack_deadline: None };
    tx.send(pb::SubscribeRequest { request: Some(pb::subscribe_request::Request::Start(start)) }).await?;
    let mut inbound = client.subscribe(ReceiverStream::new(rx)).await?.into_inner();
    let enqueue = |n: u8| pb::EnqueueRequest {
        topic: "orders.created".into(),
        r#type: "T".into(),
        payload: vec![n],
        ..Default::default()
    };
    client.enqueue(enqueue(1)).await?;
    let next = async |inbound: &mut tonic::Streaming<pb::SubscribeResponse>| -> Result<pb::Delivery> {
        loop {
            let m =
                tokio::time::timeout(WAIT, inbound.message()).await.context("no delivery")??.context("stream ended")?;
            if let Some(pb::subscribe_response::Response::Delivery(d)) = m.response {
                return Ok(d);
            }
        }
    };
    let first = next(&mut inbound).await?;

    // Rotate to a certificate of another CA (files replaced by rename, as a secret volume does).
    let rotated = new_ca.server("rotated")?;
    write_atomically(&server.key, &std::fs::read(&rotated.key)?)?;
    write_atomically(&server.cert, &std::fs::read(&rotated.cert)?)?;
    eventually("new connections get the new certificate", WAIT, || async {
        let ok = async {
            admin_with(&srv.endpoint, &trusts(&new_ca)).await?.list_consumers(pb::ListConsumersRequest {}).await?;
            Ok::<_, anyhow::Error>(())
        };
        Ok(ok.await.ok())
    })
    .await?;
    let r = async {
        admin_with(&srv.endpoint, &trusts(&old_ca))
            .await?
            .list_consumers(pb::ListConsumersRequest {})
            .await
            .map_err(anyhow::Error::from)
    };
    assert!(r.await.is_err(), "the old certificate is no longer served");

    // The old stream goes on: it acks, and gets what is enqueued after the rotation.
    tx.send(pb::SubscribeRequest {
        request: Some(pb::subscribe_request::Request::Ack(pb::Ack { message_ids: vec![first.message_id.clone()] })),
    })
    .await?;
    client.enqueue(enqueue(2)).await?;
    let second = next(&mut inbound).await?;
    assert_eq!(second.payload, vec![2]);
    assert_eq!(second.delivery_count, 1);

    // A file that does not load keeps the certificate in force.
    std::fs::write(&server.cert, b"not a certificate")?;
    eventually("the failed reload logged", WAIT, || async {
        Ok((!srv.log_lines(&["TLS files do not load"]).is_empty()).then_some(()))
    })
    .await?;
    admin_with(&srv.endpoint, &trusts(&new_ca)).await?.list_consumers(pb::ListConsumersRequest {}).await?;
    Ok(())
}

#[tokio::test]
async fn the_auth_file_is_reloaded_on_change_and_a_bad_one_keeps_the_previous() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let file = scratch.write("auth.toml", &auth_file(&[("alpha", &["admin:read"])]))?;
    let srv = start(&store, &["--auth-file", s(&file), "--reload-interval", "100ms"]).await?;
    let list = |name: &'static str| {
        let endpoint = srv.endpoint.clone();
        async move {
            code(admin_with(&endpoint, &tok(name)).await.unwrap().list_consumers(pb::ListConsumersRequest {}).await)
        }
    };
    assert_eq!(list("alpha").await, Code::Ok);
    assert_eq!(list("beta").await, Code::Unauthenticated);

    // alpha leaves, beta comes.
    scratch.write("auth.toml", &auth_file(&[("beta", &["admin:read"])]))?;
    eventually("beta known, alpha gone", WAIT, || async {
        Ok((list("beta").await == Code::Ok && list("alpha").await == Code::Unauthenticated).then_some(()))
    })
    .await?;

    // A file that does not parse: logged, and beta still gets in.
    scratch.write("auth.toml", "[[principal]]\nname = \"gamma\"\ntokens = [\"not-a-hash\"]\n")?;
    eventually("the bad file logged", WAIT, || async {
        Ok((!srv.log_lines(&["auth file does not parse", "tokens[0]"]).is_empty()).then_some(()))
    })
    .await?;
    assert_eq!(list("beta").await, Code::Ok);
    assert!(srv.log_lines(&["not-a-hash"]).is_empty(), "the log repeats no token entry");

    // Permissions change with the file too.
    scratch.write("auth.toml", &auth_file(&[("beta", &["admin:write"])]))?;
    eventually("beta may no longer read", WAIT, || async {
        Ok((list("beta").await == Code::PermissionDenied).then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn sighup_rereads_the_auth_file() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let file = scratch.write("auth.toml", &auth_file(&[("alpha", &["admin:read"])]))?;
    // No timely poll: only the signal makes it look.
    let srv = start(&store, &["--auth-file", s(&file), "--reload-interval", "1h"]).await?;
    scratch.write("auth.toml", &auth_file(&[("beta", &["admin:read"])]))?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let list = |name: &'static str| {
        let endpoint = srv.endpoint.clone();
        async move {
            code(admin_with(&endpoint, &tok(name)).await.unwrap().list_consumers(pb::ListConsumersRequest {}).await)
        }
    };
    assert_eq!(list("beta").await, Code::Unauthenticated, "not re-read without a signal");
    let ok = std::process::Command::new("kill").args(["-HUP", &srv.pid().to_string()]).status()?;
    assert!(ok.success());
    eventually("beta known after SIGHUP", WAIT, || async { Ok((list("beta").await == Code::Ok).then_some(())) })
        .await?;
    Ok(())
}

/// Runs `outboxd serve` to its exit; returns whether it succeeded and its log.
async fn run_to_exit(store: &TestStore, extra: &[&str]) -> Result<(bool, String)> {
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(outboxd_path())
            .args(["serve", "--database-url", store.url()])
            .args(extra)
            .env("RUST_LOG", "info")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("outboxd did not exit")??;
    Ok((out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned()))
}

#[tokio::test]
async fn without_authentication_outboxd_refuses_non_loopback_addresses_unless_allowed() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let (ok, log) = run_to_exit(&store, &["--listen", "0.0.0.0:0"]).await?;
    assert!(!ok, "outboxd must refuse: {log}");
    for fix in ["--auth-file", "--tls-client-ca", "127.0.0.1", "--allow-unauthenticated", "0.0.0.0:0"] {
        assert!(log.contains(fix), "the refusal names {fix}: {log}");
    }
    let (ok, log) = run_to_exit(&store, &["--listen", "[::]:0"]).await?;
    assert!(!ok, "{log}");

    // Loopback is served as it always was (the README's first command), and so is any address
    // with --allow-unauthenticated or an auth file.
    let srv = start(&store, &["--listen", "127.0.0.1:0"]).await?;
    srv.kill().await?; // and waited for: the SQLite file is free again
    let srv = start(&store, &["--listen", "0.0.0.0:0", "--allow-unauthenticated"]).await?;
    let local = format!("http://127.0.0.1:{}", srv.addr.port());
    outbox_client::grpc::admin(&local).await?.list_consumers(pb::ListConsumersRequest {}).await?;
    srv.kill().await?; // and waited for: the SQLite file is free again
    let scratch = Scratch::new()?;
    let file = scratch.write("auth.toml", &auth_file(PRINCIPALS))?;
    let srv = start(&store, &["--listen", "0.0.0.0:0", "--auth-file", s(&file)]).await?;
    let local = format!("http://127.0.0.1:{}", srv.addr.port());
    admin_with(&local, &tok("reader")).await?.list_consumers(pb::ListConsumersRequest {}).await?;
    srv.kill().await?; // and waited for: the SQLite file is free again

    // An auth file that does not parse stops start-up, naming the problem.
    let bad =
        scratch.write("bad.toml", "[[principal]]\nname = \"x\"\nsubjects = [\"CN=x\"]\npermissions = [\"root\"]\n")?;
    let (ok, log) = run_to_exit(&store, &["--auth-file", s(&bad)]).await?;
    assert!(!ok && log.contains("permissions[0]") && log.contains("unknown permission"), "{log}");
    Ok(())
}

#[tokio::test]
async fn outboxctl_makes_tokens_and_uses_them_over_tls() -> Result<()> {
    let ctl = outboxd_path().with_file_name("outboxctl-e2e");
    let out = tokio::process::Command::new(&ctl).args(["auth", "new-token", "-o", "json"]).output().await?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let token = v["token"].as_str().context("token")?.to_owned();
    assert_eq!(token.len(), 64);
    assert_eq!(v["sha256"].as_str(), Some(hash(&token).as_str()));

    let store = TestStore::create(Backend::Sqlite).await?;
    let pki = Pki::new("ca")?;
    let server = pki.server("server")?;
    let scratch = Scratch::new()?;
    let file = scratch.write(
        "auth.toml",
        &format!(
            "[[principal]]\nname = \"ops\"\ntokens = [{:?}]\npermissions = [\"admin:read\", \"admin:write\", \"tail:orders.>\"]\n",
            hash(&token)
        ),
    )?;
    let token_file = scratch.write("token", &format!("{token}\n"))?;
    let srv =
        start(&store, &["--tls-cert", s(&server.cert), "--tls-key", s(&server.key), "--auth-file", s(&file)]).await?;
    let https = format!("https://localhost:{}", srv.addr.port());
    let ctl_run = |args: Vec<String>, env: Vec<(&'static str, String)>| {
        let ctl = ctl.clone();
        async move {
            let out = tokio::process::Command::new(&ctl).args(args).envs(env).output().await?;
            Ok::<_, anyhow::Error>((
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ))
        }
    };
    let base = |extra: &[&str]| {
        let mut v: Vec<String> = vec!["--server".into(), https.clone(), "--tls-ca".into(), s(&pki.ca).into()];
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let (code, _, err) =
        ctl_run(base(&["--token", &token, "consumers", "create", "billing", "--topic", "orders.*"]), vec![]).await?;
    assert_eq!(code, Some(0), "{err}");
    let (code, out, err) =
        ctl_run(base(&["--token-file", s(&token_file), "consumers", "list", "-o", "json"]), vec![]).await?;
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("billing"), "{out}");
    let (code, _, err) = ctl_run(base(&["stats"]), vec![("OUTBOXD_TOKEN", token.clone())]).await?;
    assert_eq!(code, Some(0), "{err}");
    // Without a token, or with a wrong one: exit code 7, and it says why.
    let (code, _, err) = ctl_run(base(&["consumers", "list"]), vec![]).await?;
    assert_eq!(code, Some(7), "{err}");
    assert!(err.contains("Unauthenticated"), "{err}");
    let (code, _, _) = ctl_run(base(&["--token", "wrong", "consumers", "list"]), vec![]).await?;
    assert_eq!(code, Some(7));
    Ok(())
}

/// The Rust subscriber with a token over TLS: it consumes; with a principal that may not,
/// it stops with PERMISSION_DENIED instead of retrying forever.
#[tokio::test]
async fn the_subscriber_takes_a_token_and_tls_and_stops_when_denied() -> Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let store = TestStore::create(Backend::Sqlite).await?;
    let pki = Pki::new("ca")?;
    let server = pki.server("server")?;
    let scratch = Scratch::new()?;
    let file = scratch.write("auth.toml", &auth_file(PRINCIPALS))?;
    let srv =
        start(&store, &["--tls-cert", s(&server.cert), "--tls-key", s(&server.key), "--auth-file", s(&file)]).await?;
    let https = format!("https://localhost:{}", srv.addr.port());
    let with = |name: &str| Credentials { tls_ca: Some(pki.ca.clone()), ..tok(name) };
    admin_with(&https, &with("root"))
        .await?
        .create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer("billing", &["orders.*"])) })
        .await?;
    outbox_with(&https, &with("producer"))
        .await?
        .enqueue(pb::EnqueueRequest { topic: "orders.created".into(), r#type: "T".into(), ..Default::default() })
        .await?;

    let handled = Arc::new(AtomicUsize::new(0));
    let mut config = outbox_client::SubscriberConfig::new(https.clone(), "billing");
    config.credentials = with("billing");
    let stop = tokio_util::sync::CancellationToken::new();
    let h = handled.clone();
    let run = tokio::spawn(outbox_client::Subscriber::new(config).run(
        move |_| {
            let h = h.clone();
            async move {
                h.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        },
        stop.clone(),
    ));
    eventually("the delivery handled", WAIT, || async { Ok((handled.load(Ordering::SeqCst) == 1).then_some(())) })
        .await?;
    stop.cancel();
    run.await??;

    let mut config = outbox_client::SubscriberConfig::new(https, "billing");
    config.credentials = with("producer");
    let r = tokio::time::timeout(
        WAIT,
        outbox_client::Subscriber::new(config).run(|_| async { Ok(()) }, Default::default()),
    )
    .await
    .context("a denied subscriber kept retrying")?;
    match r {
        Err(outbox_client::ClientError::Status(s)) => assert_eq!(s.code(), Code::PermissionDenied, "{s:?}"),
        other => bail!("expected PERMISSION_DENIED, got {other:?}"),
    }
    Ok(())
}

/// `--health-listen` serves gRPC health, and nothing else, in plaintext beside a TLS port: what
/// the kubelet's native gRPC probe needs. It answers SERVING while outboxd serves, and the
/// services are not reachable through it.
#[tokio::test]
async fn a_plaintext_health_listener_serves_health_only_beside_tls() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let pki = Pki::new("ca")?;
    let server = pki.server("server")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let health_addr = format!("127.0.0.1:{port}");
    let srv =
        start(&store, &["--tls-cert", s(&server.cert), "--tls-key", s(&server.key), "--health-listen", &health_addr])
            .await?;
    let plain = format!("http://{health_addr}");
    let channel = eventually("the health listener accepts", WAIT, || async {
        Ok(tonic::transport::Endpoint::from_shared(plain.clone())?.connect().await.ok())
    })
    .await?;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    for service in ["", "outbox.v1.Outbox", "outbox.v1.OutboxAdmin"] {
        let status =
            health.check(tonic_health::pb::HealthCheckRequest { service: service.into() }).await?.into_inner().status;
        assert_eq!(status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32, "{service:?}");
    }
    // Nothing but health there, with or without credentials.
    let err = pb::outbox_admin_client::OutboxAdminClient::new(channel.clone())
        .list_consumers(pb::ListConsumersRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
    let err = pb::outbox_client::OutboxClient::new(channel)
        .enqueue(pb::EnqueueRequest { topic: "t".into(), r#type: "T".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err:?}");
    // The main port still speaks only TLS.
    let main_plain = format!("http://127.0.0.1:{}", srv.addr.port());
    let r = async {
        outbox_client::grpc::admin(&main_plain).await?.list_consumers(pb::ListConsumersRequest {}).await?;
        anyhow::Ok(())
    };
    assert!(r.await.is_err(), "plaintext is refused on the TLS port");
    Ok(())
}

crate::conformance!(concurrent_creates_do_not_exceed_max_consumers);

/// Issue 47 item 3: `admin:write` reads no topic through a consumer of its own, and does not
/// redirect another principal's stream. A consumer takes only topics its creator may read
/// (`tail:`); it is deleted only by its creator or `*` (ADR 0072).
#[tokio::test]
async fn admin_write_neither_reads_nor_redirects_other_tenants_topics_through_consumers() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let file = scratch.write(
        "auth.toml",
        &auth_file(&[
            ("root", &["*"]),
            // The payments tenant: it creates and consumes `billing`.
            ("payments", &["admin:write", "tail:payments.>", "consume:billing"]),
            ("team", &["admin:write", "consume:team-*"]),
            ("ops", &["admin:write"]),
            ("orders", &["admin:write", "tail:orders.>"]),
        ]),
    )?;
    let srv = start(&store, &["--auth-file", s(&file)]).await?;
    let admin = |who: &'static str| {
        let endpoint = srv.endpoint.clone();
        async move { admin_with(&endpoint, &tok(who)).await }
    };
    let create = |name: &str, topics: &[&str]| {
        let mut c = consumer(name, topics);
        c.start_from = pb::consumer::StartFrom::Earliest as i32;
        pb::CreateConsumerRequest { consumer: Some(c) }
    };
    admin("payments").await?.create_consumer(create("billing", &["payments.>"])).await?;
    outbox_with(&srv.endpoint, &tok("root"))
        .await?
        .enqueue(pb::EnqueueRequest {
            topic: "payments.card".into(),
            r#type: "CardCharged".into(),
            payload: br#"{"pan":"4111111111111111"}"#.to_vec(),
            ..Default::default()
        })
        .await?;

    // admin:write and consume:team-*: no consumer of its own on payments.>, from EARLIEST.
    let err = admin("team").await?.create_consumer(create("team-x", &["payments.>"])).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("lacks the permission tail:payments.>"), "{err:?}");
    // admin:write alone: neither deletes the tenant's consumer nor creates one on its topics.
    let mut ops = admin("ops").await?;
    let err = ops.delete_consumer(pb::DeleteConsumerRequest { consumer: "billing".into() }).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("created by principal \"payments\""), "it names the creator: {err:?}");
    let err = ops.create_consumer(create("billing-2", &["payments.>"])).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("tail:payments.>"), "{err:?}");
    // Nor may a principal that may read other topics put them under the tenant's name.
    let err = admin("orders")
        .await?
        .delete_consumer(pb::DeleteConsumerRequest { consumer: "billing".into() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    // Nor a principal whose consume: pattern covers the name (the review of issue 47): it would
    // delete the tenant's consumer and create it again on its own topics.
    admin("payments").await?.create_consumer(create("team-pay", &["payments.>"])).await?;
    let err = admin("team")
        .await?
        .delete_consumer(pb::DeleteConsumerRequest { consumer: "team-pay".into() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    admin("payments").await?.delete_consumer(pb::DeleteConsumerRequest { consumer: "team-pay".into() }).await?;
    let mut root = admin("root").await?;
    let names = |list: pb::ListConsumersResponse| list.consumers.into_iter().map(|c| c.name).collect::<Vec<_>>();
    let listed = names(root.list_consumers(pb::ListConsumersRequest {}).await?.into_inner());
    assert_eq!(listed, ["billing"], "nothing was created or deleted");
    let billing = root.get_consumer(pb::GetConsumerRequest { consumer: "billing".into() }).await?.into_inner();
    assert_eq!(billing.consumer.context("billing")?.topics, ["payments.>"]);

    // A principal with the right tail: creates, and deletes what it created; pausing stays
    // admin:write's (the operator's brake); the creator and `*` delete.
    let mut orders = admin("orders").await?;
    orders.create_consumer(create("orders-audit", &["orders.*", "orders.eu.>"])).await?;
    orders.delete_consumer(pb::DeleteConsumerRequest { consumer: "orders-audit".into() }).await?;
    ops.pause_consumer(pb::PauseConsumerRequest { consumer: "billing".into() }).await?;
    ops.resume_consumer(pb::ResumeConsumerRequest { consumer: "billing".into() }).await?;
    admin("payments").await?.delete_consumer(pb::DeleteConsumerRequest { consumer: "billing".into() }).await?;
    root.create_consumer(create("team-y", &["payments.>"])).await?;
    root.delete_consumer(pb::DeleteConsumerRequest { consumer: "team-y".into() }).await?;
    assert!(names(root.list_consumers(pb::ListConsumersRequest {}).await?.into_inner()).is_empty());
    Ok(())
}

/// Issue 47 item 7: `--max-consumers` is counted where consumers are created (under the
/// consumer-change lock), so concurrent creates cannot all pass it.
async fn concurrent_creates_do_not_exceed_max_consumers(backend: Backend) -> Result<()> {
    let store = TestStore::create(backend).await?;
    let srv = start(&store, &["--max-consumers", "3"]).await?;
    let creates = (0..24).map(|i| {
        let endpoint = srv.endpoint.clone();
        async move {
            let mut admin = admin_with(&endpoint, &Credentials::default()).await?;
            let c = consumer(&format!("racer-{i}"), &["orders.*"]);
            Ok::<_, anyhow::Error>(admin.create_consumer(pb::CreateConsumerRequest { consumer: Some(c) }).await)
        }
    });
    let results = futures::future::join_all(creates).await.into_iter().collect::<Result<Vec<_>>>()?;
    let created = results.iter().filter(|r| r.is_ok()).count();
    for err in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
        assert!(err.message().contains("the limit is 3 (--max-consumers)"), "{err:?}");
    }
    let mut admin = admin_with(&srv.endpoint, &Credentials::default()).await?;
    let listed = admin.list_consumers(pb::ListConsumersRequest {}).await?.into_inner().consumers.len();
    assert_eq!((created, listed), (3, 3), "created and listed under --max-consumers 3");
    Ok(())
}

/// A consumer reads on its creator's authority (ADR 0072), as a sink runs on it: a `tail:`
/// taken away from its creator is not kept through a consumer made while it held. The open
/// stream ends within a reload, a new one is refused naming what the creator lacks, and
/// streams come back when the permission does.
#[tokio::test]
async fn a_consumer_reads_only_while_its_creator_may_read_its_topics() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let with_tail: &[(&str, &[&str])] =
        &[("root", &["*"]), ("contractor", &["admin:write", "consume:team-*", "tail:payments.>"])];
    let without_tail: &[(&str, &[&str])] = &[("root", &["*"]), ("contractor", &["admin:write", "consume:team-*"])];
    let file = scratch.write("auth.toml", &auth_file(with_tail))?;
    let srv = start(&store, &["--auth-file", s(&file), "--reload-interval", "100ms"]).await?;
    let mut c = consumer("team-debug", &["payments.>"]);
    c.start_from = pb::consumer::StartFrom::Earliest as i32;
    admin_with(&srv.endpoint, &tok("contractor"))
        .await?
        .create_consumer(pb::CreateConsumerRequest { consumer: Some(c) })
        .await?;
    let mut root = outbox_with(&srv.endpoint, &tok("root")).await?;
    let card = |n: u8| pb::EnqueueRequest {
        topic: "payments.card".into(),
        r#type: "CardCharged".into(),
        payload: vec![n],
        ..Default::default()
    };
    root.enqueue(card(1)).await?;
    let open = || {
        let endpoint = srv.endpoint.clone();
        async move {
            let mut c = outbox_with(&endpoint, &tok("contractor")).await.unwrap();
            let (tx, rx) = mpsc::channel(4);
            let start = pb::Start { consumer: "team-debug".into(), max_in_flight: 10, ack_deadline: None };
            tx.send(pb::SubscribeRequest { request: Some(pb::subscribe_request::Request::Start(start)) })
                .await
                .unwrap();
            c.subscribe(ReceiverStream::new(rx)).await.map(|r| (r.into_inner(), tx))
        }
    };
    let (mut stream, _tx) = open().await?;
    let first = tokio::time::timeout(WAIT, stream.message()).await.context("the first delivery")??;
    assert!(matches!(first.and_then(|m| m.response), Some(pb::subscribe_response::Response::Delivery(_))));

    // The creator loses tail:payments.>: the open stream ends, a new one is refused.
    scratch.write("auth.toml", &auth_file(without_tail))?;
    let ended = tokio::time::timeout(WAIT, async {
        loop {
            match stream.message().await {
                Err(status) => return status,
                Ok(Some(_)) => continue,
                Ok(None) => return tonic::Status::ok("ended without a status"),
            }
        }
    })
    .await
    .context("the open stream did not end")?;
    assert_eq!(ended.code(), Code::PermissionDenied, "{ended:?}");
    assert!(ended.message().contains("no longer holds tail:payments.>"), "{ended:?}");
    root.enqueue(card(2)).await?;
    let err = open().await.map(drop).unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message().contains("its creator, principal \"contractor\", no longer holds tail:payments.>"),
        "{err:?}"
    );

    // The permission comes back: so do the streams.
    scratch.write("auth.toml", &auth_file(with_tail))?;
    let (mut stream, _tx) = eventually("a stream again", WAIT, || async { Ok(open().await.ok()) }).await?;
    let again = tokio::time::timeout(WAIT, stream.message()).await.context("a delivery again")??;
    assert!(matches!(again.and_then(|m| m.response), Some(pb::subscribe_response::Response::Delivery(_))));
    Ok(())
}

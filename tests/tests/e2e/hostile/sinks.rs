//! Sinks in hostile hands: their own permission, no internal addresses, no secrets shown or
//! stored in clear, and a sink stopped when its creator loses the permission.
use std::time::Duration;

use anyhow::Result;
use outbox_client::grpc::{admin_with, outbox_with};
use outbox_proto::v1 as pb;
use outbox_tests::{Backend, Outboxd, TestStore, consumer};
use tonic::Code;

use super::{serve, serve_as};
use crate::security::{Scratch, auth_file, s, tok};
use crate::sinks::webhook_sink;

/// Finding 3: `admin:write` alone cannot create a sink; `sink:` may, on topics its holder may
/// read (`tail:`) only.
#[tokio::test]
async fn a_sink_needs_its_own_permission_and_only_topics_its_creator_may_read() -> Result<()> {
    let (_store, _scratch, srv) = serve(&[]).await?;
    let secret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3";
    let sink = |name: &str, topics: &[&str]| pb::CreateConsumerRequest {
        consumer: Some(pb::Consumer {
            sink: Some(webhook_sink("https://partner.example/hook", secret)),
            ..consumer(name, topics)
        }),
    };
    let mut writer = admin_with(&srv.endpoint, &tok("writer")).await?;
    let err = writer.create_consumer(sink("to-exfil", &[">"])).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("sink:to-exfil"), "{err:?}");
    // A consumer without a sink takes only readable topics too (ADR 0072).
    let err = writer
        .create_consumer(pb::CreateConsumerRequest { consumer: Some(consumer("plain", &[">"])) })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("tail:>"), "{err:?}");

    let mut sinker = admin_with(&srv.endpoint, &tok("sinker")).await?;
    for topics in [&[">"][..], &["payments.*"], &["orders.*", "secrets.>"]] {
        let err = sinker.create_consumer(sink("to-partner", topics)).await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{topics:?}: {err:?}");
        assert!(err.message().contains("tail:"), "{err:?}");
    }
    let err = sinker.create_consumer(sink("exfil", &["orders.*"])).await.unwrap_err();
    assert!(err.message().contains("sink:exfil"), "the name must match its sink: permission: {err:?}");
    sinker.create_consumer(sink("to-partner", &["orders.*", "orders.eu.>"])).await?;
    let list = admin_with(&srv.endpoint, &tok("root")).await?.list_consumers(pb::ListConsumersRequest {}).await?;
    let names: Vec<String> = list.into_inner().consumers.into_iter().map(|c| c.name).collect();
    assert_eq!(names, ["to-partner"]);
    Ok(())
}

/// Finding 12: a sink's secrets never come back: a NATS token in the URL's user part and a
/// webhook's query values are shown as `***` by GetConsumer and ListConsumers, and logged so.
#[tokio::test]
async fn sink_urls_are_shown_without_tokens_or_query_values() -> Result<()> {
    let (_store, _scratch, srv) = serve(&[]).await?;
    let mut root = admin_with(&srv.endpoint, &tok("root")).await?;
    let nats = pb::Sink {
        target: Some(pb::sink::Target::Nats(pb::NatsSink {
            url: "nats://s3cr3t-token@127.0.0.1:1".into(),
            subject: "events.{topic}".into(),
        })),
        max_in_flight: 0,
    };
    let hook =
        webhook_sink("https://partner.example/hook?token=s3cr3t-query", "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3");
    for (name, sink) in [("to-nats", nats), ("to-hook", hook)] {
        let c = pb::Consumer { sink: Some(sink), ..consumer(name, &["orders.*"]) };
        root.create_consumer(pb::CreateConsumerRequest { consumer: Some(c) }).await?;
    }
    let listed = format!("{:?}", root.list_consumers(pb::ListConsumersRequest {}).await?.into_inner());
    let got =
        format!("{:?}", root.get_consumer(pb::GetConsumerRequest { consumer: "to-hook".into() }).await?.into_inner());
    for shown in [&listed, &got] {
        assert!(!shown.contains("s3cr3t"), "{shown}");
    }
    assert!(listed.contains("nats://***@127.0.0.1:1"), "{listed}");
    assert!(got.contains("token=***"), "{got}");
    assert!(srv.log_lines(&["s3cr3t"]).is_empty(), "a secret in the log: {:?}", srv.log_lines(&["s3cr3t"]));
    Ok(())
}

/// Finding 5: a sink may not reach outboxd's own network unless the operator allows it. A
/// webhook sink pointed at a loopback port (in several spellings) never connects there: the
/// listener accepts nothing, and the sink says why.
#[tokio::test]
async fn a_sink_cannot_reach_internal_addresses_unless_allowed() -> Result<()> {
    let (_store, _scratch, srv) = serve(&["--sink-poll", "100ms"]).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    let accepting = tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let mut root = admin_with(&srv.endpoint, &tok("root")).await?;
    let secret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3";
    for (i, host) in ["127.0.0.1", "2130706433", "0x7f.1", "localhost"].iter().enumerate() {
        let url = format!("http://{host}:{port}/exfil");
        let c = pb::Consumer { sink: Some(webhook_sink(&url, secret)), ..consumer(&format!("to-{i}"), &["orders.*"]) };
        root.create_consumer(pb::CreateConsumerRequest { consumer: Some(c) }).await?;
    }
    let mut producer = outbox_with(&srv.endpoint, &tok("root")).await?;
    let req = pb::EnqueueRequest { topic: "orders.created".into(), r#type: "T".into(), ..Default::default() };
    producer.enqueue(req).await?;
    for i in 0..4 {
        let name = format!("consumer=to-{i} ");
        outbox_tests::eventually("the sink to say why it cannot connect", Duration::from_secs(15), || {
            let found = !srv.log_lines(&[&name, "sink cannot reach its target", "--sink-allow-private"]).is_empty();
            async move { Ok(found.then_some(())) }
        })
        .await?;
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 0, "the internal listener was reached");
    drop(srv);

    // The operator allows that one network: the sink reaches it.
    let (_store2, _scratch2, allowed) = serve(&["--sink-poll", "100ms", "--sink-allow", "127.0.0.1/32"]).await?;
    let mut root = admin_with(&allowed.endpoint, &tok("root")).await?;
    let url = format!("http://127.0.0.1:{port}/partner");
    let c = pb::Consumer { sink: Some(webhook_sink(&url, secret)), ..consumer("to-partner", &["orders.*"]) };
    root.create_consumer(pb::CreateConsumerRequest { consumer: Some(c) }).await?;
    outbox_tests::eventually("the allowed network reached", Duration::from_secs(15), || {
        let n = accepted.load(std::sync::atomic::Ordering::SeqCst);
        async move { Ok((n > 0).then_some(())) }
    })
    .await?;
    accepting.abort();
    Ok(())
}

/// A sink runs on its creator's authority: once a reloaded auth file takes `sink:` away from
/// the principal that created it, the sink delivers nothing more (a sink created by another
/// principal on the same topic goes on), and it resumes when the permission comes back.
#[tokio::test]
async fn a_sink_stops_when_its_creator_loses_the_permission() -> Result<()> {
    let sinker: (&str, &[&str]) = ("sinker", &["admin:write", "sink:to-*", "tail:orders.>"]);
    let demoted: (&str, &[&str]) = ("sinker", &["admin:write", "tail:orders.>"]);
    let root: (&str, &[&str]) = ("root", &["*"]);
    let flags = ["--sink-poll", "100ms", "--sink-allow", "127.0.0.1/32", "--reload-interval", "200ms"];
    let (_store, scratch, srv) = serve_as(&[sinker, root], &flags).await?;
    let (revoked, control) =
        (outbox_tests::brokers::WebhookPartner::start().await?, outbox_tests::brokers::WebhookPartner::start().await?);
    let secret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3";
    let sink = |name: &str, url: &str| pb::CreateConsumerRequest {
        consumer: Some(pb::Consumer { sink: Some(webhook_sink(url, secret)), ..consumer(name, &["orders.*"]) }),
    };
    admin_with(&srv.endpoint, &tok("sinker")).await?.create_consumer(sink("to-partner", &revoked.url)).await?;
    admin_with(&srv.endpoint, &tok("root")).await?.create_consumer(sink("to-control", &control.url)).await?;
    let mut producer = outbox_with(&srv.endpoint, &tok("root")).await?;
    let req = || pb::EnqueueRequest { topic: "orders.created".into(), r#type: "T".into(), ..Default::default() };
    producer.enqueue(req()).await?;
    received(&revoked, 1, "the creator's sink delivers").await?;
    received(&control, 1, "the other sink delivers").await?;

    let _ = scratch.write("auth.toml", &auth_file(&[demoted, root]))?;
    outbox_tests::eventually("the sink to stop", Duration::from_secs(10), || {
        let found =
            !srv.log_lines(&["consumer=to-partner", "sink stopped", "no longer holds sink:to-partner"]).is_empty();
        async move { Ok(found.then_some(())) }
    })
    .await?;
    producer.enqueue(req()).await?;
    received(&control, 2, "the other sink goes on").await?;
    assert_eq!(revoked.received().len(), 1, "a sink whose creator lost sink: delivered");
    let mut admin = admin_with(&srv.endpoint, &tok("root")).await?;
    let stats = admin.get_stats(pb::GetStatsRequest { consumer: "to-partner".into() }).await?.into_inner();
    assert_eq!(stats.consumers.first().map(|c| (c.backlog, c.in_flight)), Some((1, 0)), "{stats:?}");

    let _ = scratch.write("auth.toml", &auth_file(&[sinker, root]))?;
    received(&revoked, 2, "the sink resumes with the permission").await?;
    Ok(())
}

/// Until `partner` has received `n` requests (within 15 s).
async fn received(partner: &outbox_tests::brokers::WebhookPartner, n: usize, what: &str) -> Result<()> {
    outbox_tests::eventually(what, Duration::from_secs(15), || {
        let got = partner.received().len();
        async move { Ok((got >= n).then_some(())) }
    })
    .await
}

/// Finding 16 (sink secrets at rest): with --sink-key-file, a sink's URL (its token, its query
/// values) and a webhook's signing secret are sealed in `outbox.consumers`: the table holds
/// none of them, answers show them redacted as before, and the sink still delivers, signed
/// with its secret. An outboxd without the key does not run the sink, and says why.
#[tokio::test]
async fn sink_secrets_are_sealed_at_rest_with_the_operators_key() -> Result<()> {
    use base64::Engine as _;
    let store = TestStore::create(Backend::Postgres).await?;
    let scratch = Scratch::new()?;
    let key = base64::engine::general_purpose::STANDARD.encode([42u8; 64]);
    let key_file = scratch.write("sink.key", &format!("{key}\n"))?;
    let flags = ["--sink-poll", "100ms", "--sink-allow", "127.0.0.1/32", "--sink-key-file", s(&key_file)];
    let srv = Outboxd::start(store.url(), &flags).await?;
    let partner = outbox_tests::brokers::WebhookPartner::start().await?;
    let secret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3";
    let c = pb::Consumer { sink: Some(webhook_sink(&partner.url, secret)), ..consumer("to-partner", &["orders.*"]) };
    let mut admin = srv.admin().await?;
    admin.create_consumer(pb::CreateConsumerRequest { consumer: Some(c.clone()) }).await?;
    // The same definition again is the same consumer (sealing is deterministic).
    admin.create_consumer(pb::CreateConsumerRequest { consumer: Some(c) }).await?;

    let db = sqlx::PgPool::connect(store.url()).await?;
    let stored: String =
        sqlx::query_scalar("SELECT sink::text FROM outbox.consumers WHERE name = 'to-partner'").fetch_one(&db).await?;
    assert!(!stored.contains("q-s3cr3t") && !stored.contains("whsec_") && !stored.contains("127.0.0.1"), "{stored}");
    assert!(stored.contains("sealed:v1:"), "{stored}");
    let shown = admin.get_consumer(pb::GetConsumerRequest { consumer: "to-partner".into() }).await?.into_inner();
    let shown = format!("{shown:?}");
    assert!(shown.contains("127.0.0.1") && shown.contains("token=***") && !shown.contains("sealed:"), "{shown}");

    let mut producer = srv.client().await?;
    let req = pb::EnqueueRequest { topic: "orders.created".into(), r#type: "T".into(), ..Default::default() };
    producer.enqueue(req).await?;
    received(&partner, 1, "the sealed sink delivers").await?;
    let first = &partner.received()[0];
    assert!(first.headers.iter().any(|(k, _)| k == "webhook-signature"), "{:?}", first.headers);
    drop(srv);

    // Without the key, the sink cannot run: it says so, and nothing is sent.
    let keyless = Outboxd::start(store.url(), &["--sink-poll", "100ms", "--sink-allow", "127.0.0.1/32"]).await?;
    outbox_tests::eventually("the keyless outboxd to say why", Duration::from_secs(10), || {
        let found = !keyless.log_lines(&["consumer=to-partner", "--sink-key-file"]).is_empty();
        async move { Ok(found.then_some(())) }
    })
    .await?;
    let shown = keyless.admin().await?.get_consumer(pb::GetConsumerRequest { consumer: "to-partner".into() }).await?;
    assert!(!format!("{shown:?}").contains("sealed:"), "{shown:?}");
    Ok(())
}

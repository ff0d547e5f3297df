//! Permissions: every method denied without its permission and allowed with it, resources
//! checked one by one, health open and reflection behind a credential, and consumers that read
//! only on their creator's authority.

use anyhow::{Context as _, Result, bail};
use outbox_client::Credentials;
use outbox_client::grpc::{admin_with, outbox_with};
use outbox_proto::v1 as pb;
use outbox_tests::{Backend, TestStore, consumer, eventually};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use super::{PRINCIPALS, Scratch, all_methods, allowed_for, auth_file, call, free_port, s, scrape, start, tok};
use crate::WAIT;

crate::conformance!(concurrent_creates_do_not_exceed_max_consumers);

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

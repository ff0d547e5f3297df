//! TLS and mutual TLS: who is served, principals named by certificate, certificates rotated
//! without dropping streams, and a plaintext health listener beside TLS.

use anyhow::{Context as _, Result};
use outbox_client::Credentials;
use outbox_client::grpc::{admin_with, outbox_with};
use outbox_proto::v1 as pb;
use outbox_tests::pki::{Pki, write_atomically};
use outbox_tests::{Backend, TestStore, consumer, eventually};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use super::{Scratch, s, start};
use crate::WAIT;

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
    // Nothing but health there, with or without credentials: UNAVAILABLE, and the connection
    // closed (ADR 0079).
    let err = pb::outbox_admin_client::OutboxAdminClient::new(channel.clone())
        .list_consumers(pb::ListConsumersRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    let err = pb::outbox_client::OutboxClient::new(channel)
        .enqueue(pb::EnqueueRequest { topic: "t".into(), r#type: "T".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    // The main port still speaks only TLS.
    let main_plain = format!("http://127.0.0.1:{}", srv.addr.port());
    let r = async {
        outbox_client::grpc::admin(&main_plain).await?.list_consumers(pb::ListConsumersRequest {}).await?;
        anyhow::Ok(())
    };
    assert!(r.await.is_err(), "plaintext is refused on the TLS port");
    Ok(())
}

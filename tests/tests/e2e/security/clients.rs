//! The clients with credentials: `outboxctl` makes tokens and uses them over TLS; the Rust
//! subscriber takes a token and stops when denied.

use anyhow::{Context as _, Result, bail};
use outbox_client::Credentials;
use outbox_client::grpc::{admin_with, outbox_with};
use outbox_proto::v1 as pb;
use outbox_tests::pki::Pki;
use outbox_tests::{Backend, TestStore, consumer, eventually, outboxd_path};
use tonic::Code;

use super::{PRINCIPALS, Scratch, auth_file, hash, s, start, tok};
use crate::WAIT;

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

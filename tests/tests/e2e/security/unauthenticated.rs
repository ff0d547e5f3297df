//! The protected mode: without authentication outboxd serves only loopback addresses.
use std::time::Duration;

use anyhow::{Context as _, Result};
use outbox_client::grpc::admin_with;
use outbox_proto::v1 as pb;
use outbox_tests::{Backend, TestStore, outboxd_path};

use super::{PRINCIPALS, Scratch, auth_file, s, start, tok};

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

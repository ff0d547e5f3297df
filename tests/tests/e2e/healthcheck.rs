//! `outboxd healthcheck`, the container health check of an image without a shell, against a
//! real outboxd. SQLite only: the check asks the gRPC health service, which does not depend on
//! the store.
use std::process::Output;

use anyhow::{Context as _, Result};
use outbox_tests::{Backend, FAST, Outboxd, TestStore};

async fn healthcheck(args: &[&str]) -> Result<Output> {
    tokio::process::Command::new(outbox_tests::outboxd_path())
        .arg("healthcheck")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("running outboxd healthcheck")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[tokio::test]
async fn healthcheck_passes_for_a_serving_outboxd_and_fails_naming_what_is_wrong() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let srv = Outboxd::start(store.url(), FAST).await?;
    let addr = srv.addr.to_string();

    for args in [vec!["--addr", addr.as_str()], vec!["--addr", srv.endpoint.as_str(), "--service", "outbox.v1.Outbox"]]
    {
        let out = healthcheck(&args).await?;
        assert!(out.status.success(), "healthcheck {args:?} failed: {}", text(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "SERVING");
    }

    // A service the server does not serve is not healthy.
    let out = healthcheck(&["--addr", &addr, "--service", "no.such.Service"]).await?;
    assert!(!out.status.success(), "an unknown service passed: {}", text(&out));
    assert!(text(&out).contains("no.such.Service") && text(&out).contains("NotFound"), "{}", text(&out));

    // TLS is refused by name, before any connection.
    let out = healthcheck(&["--addr", &format!("https://{addr}")]).await?;
    assert!(!out.status.success());
    assert!(text(&out).contains("TLS"), "{}", text(&out));

    // Once outboxd is gone, the check fails and names the address it tried.
    srv.kill().await?;
    let out = healthcheck(&["--addr", &addr, "--timeout", "2s"]).await?;
    assert!(!out.status.success(), "healthcheck passed with outboxd killed: {}", text(&out));
    assert!(text(&out).contains(&addr), "{}", text(&out));
    Ok(())
}

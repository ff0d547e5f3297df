//! A client in another language: Python with grpcio, code generated from `proto/` at test
//! time. It enqueues through the SQL function in its own transaction, subscribes, nacks, acks,
//! over TLS with a bearer token.
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use outbox_tests::{consumer, create_consumer};

use crate::setup_pg;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// A virtualenv with grpcio, grpcio-tools and psycopg, made once under `target/`.
fn python() -> Result<PathBuf> {
    outbox_tests::python_venv("py-venv", "tests/python/requirements.txt")
}

/// PostgreSQL: the Python producer calls the SQL function `outbox.enqueue`.
#[tokio::test]
async fn a_python_client_generated_from_proto_enqueues_in_sql_subscribes_nacks_and_acks() -> Result<()> {
    let py = tokio::task::spawn_blocking(python).await??;
    // Over TLS, with a token whose principal may consume "py" and read the admin API.
    let pki = outbox_tests::pki::Pki::new("ca")?;
    let server = pki.server("server")?;
    let auth = pki.dir.join("auth.toml");
    std::fs::write(
        &auth,
        format!(
            "[[principal]]\nname = \"python\"\ntokens = [{:?}]\npermissions = [\"consume:py\", \"admin:read\"]\n\n\
             [[principal]]\nname = \"setup\"\ntokens = [{:?}]\npermissions = [\"*\"]\n",
            outbox_server::grpc::auth::token_hash_line("py-token"),
            outbox_server::grpc::auth::token_hash_line("setup-token"),
        ),
    )?;
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    let (cert, key, auth_arg) = (path(&server.cert), path(&server.key), path(&auth));
    let (db, srv, _pool) = setup_pg(&["--tls-cert", &cert, "--tls-key", &key, "--auth-file", &auth_arg]).await?;
    let creds =
        outbox_client::Credentials { tls_ca: Some(pki.ca.clone()), ..outbox_client::Credentials::token("setup-token") };
    let mut admin = outbox_client::grpc::admin_with(&format!("https://localhost:{}", srv.addr.port()), &creds).await?;
    let mut c = consumer("py", &["orders.*"]);
    c.max_deliveries = 5;
    create_consumer(&mut admin, c).await?;
    let run = tokio::process::Command::new(py)
        .arg(repo().join("tests/python/client_test.py"))
        .env("OUTBOXD_ADDR", format!("localhost:{}", srv.addr.port()))
        .env("OUTBOXD_TLS_CA", &pki.ca)
        .env("OUTBOXD_TOKEN", "py-token")
        .env("DATABASE_URL", &db.url)
        .env("PROTO_DIR", repo().join("proto"))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .context("the Python client did not finish in 120 s")??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the Python client failed");
    assert!(stdout.contains("PYTHON CLIENT OK"), "the script did not finish");
    Ok(())
}

//! TLS between outboxd and PostgreSQL (`sslmode` in the database URL), against a cluster of
//! the test's own that takes TLS connections only, with a server certificate naming
//! `localhost` alone ([`outbox_tests::pgtls`]). PostgreSQL only: SQLite has no connection.
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use outbox_client::Message;
use outbox_tests::pgtls::{CERT_USER, TlsPostgres};
use outbox_tests::pki::Pki;
use outbox_tests::{FAST, Outboxd, RawStream, consumer, create_consumer, outboxd_path};
use tokio::io::{AsyncBufReadExt as _, BufReader};

use crate::WAIT;

/// Runs `outboxd serve` on `url`, which must stop before serving; returns what it printed.
async fn refused(url: &str) -> Result<String> {
    let mut child = tokio::process::Command::new(outboxd_path())
        .args(["serve", "--database-url", url, "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info,sqlx=warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = BufReader::new(child.stderr.take().context("no stderr")?).lines();
    let mut printed = String::new();
    let read = async {
        while let Some(line) = lines.next_line().await? {
            let served = line.contains("outboxd serving");
            printed.push_str(&line);
            printed.push('\n');
            if served {
                bail!("outboxd on {url} should have been refused, and serves:\n{printed}");
            }
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .with_context(|| format!("outboxd on {url} neither served nor stopped within 60 s"))??;
    let status = child.wait().await?;
    assert!(!status.success(), "outboxd on {url} exited 0:\n{printed}");
    Ok(printed)
}

/// `verify-full` with the cluster's CA and its certificate's name: outboxd starts, says its
/// connection is encrypted, and delivers what the Rust client enqueued over a TLS pool of its
/// own; `require` (encrypted, nothing checked) starts a second replica on the same database.
/// A parameter outboxd does not use is named in its log and its value is not.
#[tokio::test]
async fn outboxd_checks_postgresqls_certificate_and_delivers_over_tls() -> Result<()> {
    let Some(pg) = TlsPostgres::start().await? else { return Ok(()) };
    let url = pg.url("postgres", "localhost", "outboxd_tls", &pg.root_cert_query("verify-full"));
    let srv = Outboxd::start(&url, FAST).await?;
    let said = srv.log_lines(&["connected to PostgreSQL", "database_tls"]);
    assert!(!said.is_empty() && said.iter().all(|l| l.contains("TLSv1.")), "{said:?}");

    let mut admin = srv.admin().await?;
    create_consumer(&mut admin, consumer("tls", &["orders.*"])).await?;
    // The producer's own pool, through the same URL: sqlx and outbox-client over TLS.
    let pool = sqlx::PgPool::connect(&url).await?;
    let sent = outbox_client::enqueue(&pool, &Message::new("orders.created", "OrderCreated", b"{}".to_vec())).await?;
    let mut stream = RawStream::open(&srv.endpoint, "tls", 10).await?;
    let got = stream.take(1, WAIT).await?;
    assert_eq!(got[0].message_id, sent.message_id.to_string());
    stream.ack(&[&got[0].message_id]).await;

    // The replica's URL carries a misspelt password, which no connection reads: named in the
    // log, its value never.
    let replica_url = pg.url("postgres", "127.0.0.1", "outboxd_tls", "sslmode=require&passwd=s3cr3t");
    let replica = Outboxd::start(&replica_url, FAST).await?;
    let said = replica.log_lines(&["connected to PostgreSQL", "TLSv1."]);
    assert!(!said.is_empty(), "the replica did not say its connection is encrypted");
    assert!(!replica.log_lines(&["does not use these parameters", "passwd"]).is_empty());
    assert_eq!(replica.log_lines(&["s3cr3t"]), Vec::<String>::new());
    pool.close().await;
    Ok(())
}

/// Without TLS the server's pg_hba.conf refuses outboxd; with TLS, outboxd refuses a server
/// whose certificate the URL's CA did not sign, or that does not name the host it dialled.
#[tokio::test]
async fn outboxd_is_refused_without_tls_and_refuses_a_certificate_it_cannot_verify() -> Result<()> {
    let Some(pg) = TlsPostgres::start().await? else { return Ok(()) };
    let other = Pki::new("other")?;
    let wrong_ca = format!("sslrootcert={}", other.ca.display());
    let cases = [
        // Plain text: PostgreSQL's own refusal, as outboxd reports it.
        (pg.url("postgres", "localhost", "postgres", "sslmode=disable"), "no encryption"),
        // A CA that did not sign the server's certificate.
        (
            pg.url("postgres", "localhost", "postgres", &format!("sslmode=verify-ca&{wrong_ca}")),
            "invalid peer certificate: UnknownIssuer",
        ),
        // No CA file: the system's CAs, which did not sign it either.
        (pg.url("postgres", "localhost", "postgres", "sslmode=verify-full"), "invalid peer certificate: UnknownIssuer"),
        // The right CA, but the certificate names localhost and outboxd dialled 127.0.0.1.
        (
            pg.url("postgres", "127.0.0.1", "postgres", &pg.root_cert_query("verify-full")),
            "not valid for name \"127.0.0.1\"",
        ),
        // With a CA file, `require` checks the chain as libpq does (sqlx alone would not).
        (
            pg.url("postgres", "localhost", "postgres", &format!("sslmode=require&{wrong_ca}")),
            "invalid peer certificate: UnknownIssuer",
        ),
    ];
    for (url, why) in &cases {
        let printed = refused(url).await?;
        assert!(printed.contains(why), "outboxd on {url} was refused, but not for {why:?}:\n{printed}");
    }
    Ok(())
}

/// A role that PostgreSQL asks for a client certificate logs in with `sslcert` and `sslkey`,
/// and not without them.
#[tokio::test]
async fn a_client_certificate_in_the_url_logs_in_where_postgresql_asks_for_one() -> Result<()> {
    let Some(pg) = TlsPostgres::start().await? else { return Ok(()) };
    let setup = sqlx::PgPool::connect(&pg.url("postgres", "localhost", "postgres", "sslmode=require")).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE ROLE {CERT_USER} LOGIN SUPERUSER"))).execute(&setup).await?;
    setup.close().await;
    let client = pg.pki.client("certuser", CERT_USER, &[])?;

    let without = pg.url(CERT_USER, "localhost", "outboxd_cert", &pg.root_cert_query("verify-full"));
    let printed = refused(&without).await?;
    assert!(printed.contains("connection requires a valid client certificate"), "{printed}");

    let with = format!("{without}&sslcert={}&sslkey={}", client.cert.display(), client.key.display());
    let srv = Outboxd::start(&with, FAST).await?;
    let mut admin = srv.admin().await?;
    create_consumer(&mut admin, consumer("cert", &["x"])).await?;
    Ok(())
}

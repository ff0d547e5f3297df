//! Start-up failures: outboxd started with each bad setting exits non-zero within a bound and
//! says, in one line on stderr, what failed, where (host and port, file, flag) and what to check:
//! with `RUST_BACKTRACE=1` and the default log level, no backtrace, no PostgreSQL source position
//! (`at line 768`), no cause said twice, no password. outboxctl too: an outboxd that is not
//! there, and a consumer that does not exist (which says how to create it, over gRPC as well).
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use outbox_tests::pki::Pki;
use outbox_tests::{Backend, FAST, Outboxd, RawStream, TestStore};

use crate::security::{Scratch, s};

/// A password that must never show.
const PASSWORD: &str = "s3cret-Pa55word";

/// Longest a failing start may take: the database's answer is awaited 10 s at most.
const BOUND: Duration = Duration::from_secs(25);

/// Runs `program` with `args` to its exit, with `RUST_BACKTRACE=1` and no `RUST_LOG`; checks
/// that it failed within [`BOUND`] and wrote one line to stderr, which it returns with the exit
/// code.
async fn one_line_failure(program: &Path, args: &[&str]) -> Result<(String, i32)> {
    let started = Instant::now();
    let out = tokio::time::timeout(
        BOUND,
        tokio::process::Command::new(program)
            .args(args)
            .env("RUST_BACKTRACE", "1")
            .env_remove("RUST_LOG")
            .env_remove("DATABASE_URL")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .with_context(|| format!("{} {args:?} did not exit within {BOUND:?}", program.display()))??;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(!out.status.success(), "{args:?} succeeded: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    ensure!(
        lines.len() == 1,
        "{args:?}: stderr is not one line ({:?} after {:?}):\n{stderr}",
        lines.len(),
        started.elapsed()
    );
    let line = lines[0].to_owned();
    for never in ["backtrace", "Backtrace", "at line", "Caused by", "panicked", "Error:", PASSWORD] {
        ensure!(!line.contains(never), "{args:?}: the line holds {never:?}: {line}");
    }
    Ok((line, out.status.code().unwrap_or(-1)))
}

/// `outboxd serve` with `args`: its one line, which starts with `outboxd: `.
async fn serve_fails(args: &[&str]) -> Result<String> {
    let all: Vec<&str> = ["serve"].into_iter().chain(args.iter().copied()).collect();
    let (line, _) = one_line_failure(&outbox_tests::outboxd_path(), &all).await?;
    ensure!(line.starts_with("outboxd: "), "{line}");
    Ok(line)
}

/// Fails unless `line` holds every one of `needles`.
fn names(line: &str, needles: &[&str]) -> Result<()> {
    for n in needles {
        ensure!(line.contains(n), "the line does not name {n:?}: {line}");
    }
    Ok(())
}

/// A loopback port nothing listens on.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The PostgreSQL server of the tests with another user, password and database, and its
/// `host:port` as the URL says it.
fn pg_url(user: &str, database: &str) -> Result<(String, String)> {
    let mut url = url::Url::parse(&outbox_server::testing::base_url())?;
    url.set_username(user).ok().context("username")?;
    url.set_password(Some(PASSWORD)).ok().context("password")?;
    url.set_path(&format!("/{database}"));
    let host_port = format!("{}:{}", url.host_str().context("host")?, url.port().unwrap_or(5432));
    Ok((url.to_string(), host_port))
}

#[tokio::test]
async fn an_unreachable_postgresql_is_named_by_host_and_port_without_its_password() -> Result<()> {
    let port = free_port()?;
    let url = format!("postgres://outboxd:{PASSWORD}@127.0.0.1:{port}/outbox");
    let line = serve_fails(&["--listen", "127.0.0.1:0", "--database-url", &url]).await?;
    names(
        &line,
        &[&format!("PostgreSQL at 127.0.0.1:{port}"), "connection refused", "--database-url", "DATABASE_URL"],
    )?;
    // Said once, not once per layer.
    ensure!(line.matches("connection refused").count() == 1, "{line}");

    // One that takes the connection and never answers is given up on, and said so.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = silent.local_addr()?.port();
    let url = format!("postgres://outboxd:{PASSWORD}@127.0.0.1:{port}/outbox");
    let line = serve_fails(&["--listen", "127.0.0.1:0", "--database-url", &url]).await?;
    names(&line, &[&format!("127.0.0.1:{port}"), "no answer", "--database-url"])?;
    drop(silent);

    // A URL that does not parse names the flag; `migrate` says the same as `serve`.
    let url = format!("postgres://outboxd:{PASSWORD}@127.0.0.1:notaport/outbox");
    let line = serve_fails(&["--listen", "127.0.0.1:0", "--database-url", &url]).await?;
    names(&line, &["invalid database URL", "invalid port number", "--database-url"])?;
    let (line, _) = one_line_failure(
        &outbox_tests::outboxd_path(),
        &["migrate", "--database-url", &format!("postgres://outboxd:{PASSWORD}@127.0.0.1:{}/x", free_port()?)],
    )
    .await?;
    names(&line, &["outboxd: cannot connect to PostgreSQL at 127.0.0.1:", "connection refused"])?;
    Ok(())
}

#[tokio::test]
async fn postgresql_refusing_the_user_or_the_database_says_which_without_its_source_position() -> Result<()> {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    // No such role: PostgreSQL's error carries its own source line, which must not show.
    let (url, at) = pg_url(&format!("nosuch_{suffix}"), "outbox")?;
    let line = serve_fails(&["--listen", "127.0.0.1:0", "--database-url", &url]).await?;
    names(&line, &["cannot sign in", &at, &format!("nosuch_{suffix}"), "does not exist", "--database-url"])?;

    // A CA file of the URL that is not there: the URL's file, not the server, is what to check.
    let (url, at) = pg_url("postgres", &format!("nosuch_{suffix}"))?;
    let url = format!("{url}?sslmode=verify-full&sslrootcert=/nonexistent/{suffix}.pem");
    let line = serve_fails(&["--listen", "127.0.0.1:0", "--database-url", &url]).await?;
    names(&line, &[&at, "cannot read a file of the URL", "sslrootcert", "--database-url"])?;

    // A database that does not exist, for a user who may not create it.
    let role = format!("outboxd_nocreate_{suffix}");
    let admin = sqlx::PgPool::connect(&outbox_server::testing::base_url()).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'"))).execute(&admin).await?;
    let database = format!("nosuch_{suffix}");
    let checked = async {
        let (url, at) = pg_url(&role, &database)?;
        let line = serve_fails(&["--listen", "127.0.0.1:0", "--database-url", &url]).await?;
        names(&line, &["cannot create database", &database, &at, "permission denied", "--database-url"])
    }
    .await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP ROLE {role}"))).execute(&admin).await?;
    checked
}

#[tokio::test]
async fn a_sqlite_file_that_cannot_be_created_names_its_path() -> Result<()> {
    let scratch = Scratch::new()?;
    let file = scratch.write("a-file", "")?;
    for path in [file.with_file_name("no-such-dir").join("outbox.db"), file.join("outbox.db")] {
        let url = format!("sqlite://{}", path.display());
        let line = serve_fails(&["--listen", "127.0.0.1:0", "--database-url", &url]).await?;
        names(&line, &["cannot open the SQLite database at", s(&path), "--database-url"])?;
    }
    Ok(())
}

#[tokio::test]
async fn a_port_in_use_names_the_listener_its_address_and_flag() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = taken.local_addr()?.to_string();
    for (flag, what) in [
        ("--listen", "the gRPC API"),
        ("--metrics-listen", "metrics"),
        ("--console-listen", "the console"),
        ("--health-listen", "health checks"),
    ] {
        let mut args = vec!["--database-url", store.url(), flag, &addr];
        if flag != "--listen" {
            args.extend(["--listen", "127.0.0.1:0"]);
        }
        let line = serve_fails(&args).await?;
        names(&line, &[what, &addr, "address already in use", flag])?;
    }
    // An address that does not parse is refused by the command line, in one line too.
    let (line, code) = one_line_failure(
        &outbox_tests::outboxd_path(),
        &["serve", "--database-url", store.url(), "--listen", "localhost:50051"],
    )
    .await?;
    names(&line, &["outboxd: ", "localhost:50051", "--listen", "127.0.0.1:50051"])?;
    ensure!(code == 2, "a command-line mistake exits 2, not {code}");
    Ok(())
}

#[tokio::test]
async fn tls_files_that_do_not_load_are_named_with_their_flag() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let pki = Pki::new("ca")?;
    let server = pki.server("server")?;
    let other = pki.server("other")?;
    let missing = pki.dir.join("missing.pem");
    let db = ["--listen", "127.0.0.1:0", "--database-url", store.url()];
    let cases: [(Vec<&str>, &[&str]); 5] = [
        (vec!["--tls-cert", s(&missing), "--tls-key", s(&server.key)], &["TLS certificate", s(&missing), "--tls-cert"]),
        (vec!["--tls-cert", s(&server.cert), "--tls-key", s(&missing)], &["TLS private key", s(&missing), "--tls-key"]),
        (
            vec!["--tls-cert", s(&server.cert), "--tls-key", s(&other.key)],
            &["does not go with the certificate", s(&server.cert), s(&other.key), "--tls-key"],
        ),
        (
            vec!["--tls-cert", s(&server.key), "--tls-key", s(&server.key)],
            &["invalid TLS certificate", s(&server.key), "--tls-cert"],
        ),
        (
            vec!["--tls-cert", s(&server.cert), "--tls-key", s(&server.key), "--tls-client-ca", s(&missing)],
            &["TLS client CA", s(&missing), "--tls-client-ca"],
        ),
    ];
    for (flags, needles) in cases {
        let args: Vec<&str> = db.iter().copied().chain(flags).collect();
        names(&serve_fails(&args).await?, needles)?;
    }
    Ok(())
}

#[tokio::test]
async fn an_auth_file_that_does_not_load_is_named_and_says_what_is_wrong() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let malformed = scratch.write("malformed.toml", "[[principal]\nname = \"ops\"\n")?;
    let bad_hash = scratch.write(
        "bad-hash.toml",
        "[[principal]]\nname = \"ops\"\ntokens = [\"sha256:abc\"]\npermissions = [\"admin:read\"]\n",
    )?;
    let missing = malformed.with_file_name("missing.toml");
    for (file, needles) in [
        (&missing, &["cannot read the auth file", "no such file"][..]),
        (&malformed, &["invalid auth file", "not valid TOML", "line 1"][..]),
        (&bad_hash, &["invalid auth file", "tokens[0]", "outboxctl auth new-token"][..]),
    ] {
        let line =
            serve_fails(&["--listen", "127.0.0.1:0", "--database-url", store.url(), "--auth-file", s(file)]).await?;
        names(&line, needles)?;
        names(&line, &[s(file), "--auth-file"])?;
    }
    Ok(())
}

#[tokio::test]
async fn a_sink_key_that_does_not_load_is_named_with_its_flag() -> Result<()> {
    let store = TestStore::create(Backend::Sqlite).await?;
    let scratch = Scratch::new()?;
    let not_base64 = scratch.write("not-base64.key", "this is no key\n")?;
    let short = scratch.write("short.key", "c2hvcnQ=\n")?;
    let missing = short.with_file_name("missing.key");
    for (file, why) in [(&missing, "cannot read the sink key"), (&not_base64, "not base64"), (&short, "holds 5 bytes")]
    {
        let line = serve_fails(&["--listen", "127.0.0.1:0", "--database-url", store.url(), "--sink-key-file", s(file)])
            .await?;
        names(&line, &[why, s(file), "--sink-key-file"])?;
    }
    Ok(())
}

#[tokio::test]
async fn outboxctl_names_an_outboxd_that_is_not_there_and_says_how_to_create_a_missing_consumer() -> Result<()> {
    let ctl = outbox_tests::outboxd_path().with_file_name("outboxctl-e2e");
    let gone = format!("http://127.0.0.1:{}", free_port()?);
    let (line, code) = one_line_failure(&ctl, &["--server", &gone, "stats"]).await?;
    names(&line, &["outboxctl: cannot reach outboxd at", &gone, "connection refused", "--server"])?;
    ensure!(code == 5, "exit code {code}");

    let store = TestStore::create(Backend::Sqlite).await?;
    let srv = Outboxd::start(store.url(), FAST).await?;
    let create = "outboxctl consumers create nosuch --topic";
    for args in [&["consume", "nosuch", "--max", "1"][..], &["stats", "--consumer", "nosuch"][..]] {
        let all: Vec<&str> = ["--server", srv.endpoint.as_str()].into_iter().chain(args.iter().copied()).collect();
        let (line, code) = one_line_failure(&ctl, &all).await?;
        names(&line, &["\"nosuch\" not found", create])?;
        ensure!(code == 3, "{args:?}: exit code {code}");
    }
    // The same over gRPC, with its status code.
    let status = RawStream::open(&srv.endpoint, "nosuch", 1).await.err().context("Subscribe to no consumer opened")?;
    ensure!(status.code() == tonic::Code::NotFound, "{status:?}");
    names(status.message(), &[create])?;
    Ok(())
}

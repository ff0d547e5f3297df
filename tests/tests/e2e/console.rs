//! The web console in a real browser: `tests/console/browser_test.py` drives Debian's Chromium
//! with Selenium against an outboxd on PostgreSQL that serves the console (`--console-listen`)
//! with an auth file of three principals: one with every permission, one with `admin:read` only,
//! one with `admin:read` and `replay:*` but no `tail:`. The script signs in, watches a consumer's
//! backlog grow and shrink, lists its deliveries, makes messages fail, dry-runs and replays their
//! group, skips a held key, replays one message from its page, follows a deep link through the
//! sign-in, checks what each principal may see and do and that a POST without the CSRF token is
//! refused (with a way back), and writes a screenshot of each screen to `docs/console/`
//! (docs/console.md shows them).
//!
//! It needs `/usr/bin/chromium` and `/usr/bin/chromedriver` (Debian's `chromium` and
//! `chromium-driver`, which `.ci/run` installs). Without Chromium it is skipped, saying so,
//! unless `CI` is set: in CI a missing browser fails it.
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use outbox_tests::{Outboxd, eventually, repo_root};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

use crate::setup_pg;

const CHROMIUM: &str = "/usr/bin/chromium";
const ADMIN_TOKEN: &str = "console-admin-token";
const READER_TOKEN: &str = "console-reader-token";
const NOTAIL_TOKEN: &str = "console-notail-token";
/// The whole script's bound; each of its waits is bounded too (30 s), so this is a backstop.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(300);

/// A virtualenv with Selenium, requests and the Python client's dependencies and build backend
/// (`tests/console/requirements.txt`, made once under `target/`), then the repository's Python
/// client (`clients/python`) installed into it as the tree has it now, at every run, as
/// `clients/python/test.sh` does: without dependencies and without build isolation, so that
/// nothing but the pinned requirements is ever fetched.
fn python() -> Result<PathBuf> {
    let py = outbox_tests::python_venv("console-venv", "tests/console/requirements.txt")?;
    let ok = std::process::Command::new(&py)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .args(["--force-reinstall", "--no-deps", "--no-build-isolation"])
        .arg(repo_root().join("clients/python"))
        .status()
        .context("running pip in the console test's virtualenv")?;
    if !ok.success() {
        bail!("pip install of clients/python into the console test's virtualenv failed");
    }
    Ok(py)
}

/// The console's address, from the line outboxd logs when the console listens (`console served
/// addr=127.0.0.1:PORT`): a field named `addr` (or `…_addr`) on a line that names the console.
fn console_addr(srv: &Outboxd) -> Option<SocketAddr> {
    srv.log_lines(&["console"]).iter().find_map(|line| {
        line.split_whitespace().find_map(|word| {
            let (key, value) = word.split_once('=')?;
            if key != "addr" && !key.ends_with("_addr") {
                return None;
            }
            value.trim_matches('"').parse::<SocketAddr>().ok().filter(|addr| *addr != srv.addr)
        })
    })
}

/// Echoes a pipe of the script line by line as it comes (so a hung run still shows how far it
/// got), and returns all of it at the end.
fn echo(pipe: Option<impl AsyncRead + Unpin + Send + 'static>) -> tokio::task::JoinHandle<String> {
    tokio::spawn(async move {
        let mut all = String::new();
        if let Some(pipe) = pipe {
            let mut lines = BufReader::new(pipe).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("[browser] {line}");
                all.push_str(&line);
                all.push('\n');
            }
        }
        all
    })
}

/// PostgreSQL: the issue asks for the console tested against a real outboxd on PostgreSQL.
#[tokio::test]
async fn the_console_in_chromium_shows_backlog_replays_a_dead_group_and_enforces_permissions_and_csrf() -> Result<()> {
    if !Path::new(CHROMIUM).exists() {
        if std::env::var_os("CI").is_some() {
            bail!(
                "{CHROMIUM} is missing and CI is set: the console's browser test must run in CI \
                 (.ci/run installs Debian's chromium and chromium-driver)"
            );
        }
        eprintln!(
            "SKIPPED: the console's browser test needs {CHROMIUM} and /usr/bin/chromedriver \
             (apt-get install chromium chromium-driver); CI runs it"
        );
        return Ok(());
    }
    let py = tokio::task::spawn_blocking(python).await??;

    let scratch = std::env::temp_dir().join(format!("outboxd-console-test-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&scratch)?;
    let auth = scratch.join("auth.toml");
    std::fs::write(
        &auth,
        format!(
            "[[principal]]\nname = \"admin\"\ntokens = [{:?}]\npermissions = [\"*\"]\n\n\
             [[principal]]\nname = \"reader\"\ntokens = [{:?}]\npermissions = [\"admin:read\"]\n\n\
             [[principal]]\nname = \"notail\"\ntokens = [{:?}]\npermissions = [\"admin:read\", \"replay:*\"]\n",
            outbox_server::grpc::auth::token_hash_line(ADMIN_TOKEN),
            outbox_server::grpc::auth::token_hash_line(READER_TOKEN),
            outbox_server::grpc::auth::token_hash_line(NOTAIL_TOKEN),
        ),
    )?;
    let auth_arg = auth.to_str().context("the temporary directory's path is not UTF-8")?.to_owned();
    let (_db, srv, _pool) = setup_pg(&["--auth-file", &auth_arg, "--console-listen", "127.0.0.1:0"]).await?;
    let console = eventually("outboxd to log the console's address (console served addr=…)", crate::WAIT, || async {
        Ok(console_addr(&srv))
    })
    .await?;

    let mut child = tokio::process::Command::new(&py)
        .arg("-u")
        .arg(repo_root().join("tests/console/browser_test.py"))
        .env("CONSOLE_URL", format!("http://{console}"))
        .env("OUTBOXD_ADDR", srv.addr.to_string())
        .env("ADMIN_TOKEN", ADMIN_TOKEN)
        .env("ADMIN_PRINCIPAL", "admin")
        .env("READER_TOKEN", READER_TOKEN)
        .env("NOTAIL_TOKEN", NOTAIL_TOKEN)
        .env("SCREENSHOT_DIR", repo_root().join("docs/console"))
        .env("FAILURE_DIR", repo_root().join("target/console-failures"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting tests/console/browser_test.py")?;
    let stdout = echo(child.stdout.take());
    let stderr = echo(child.stderr.take());
    let status = match tokio::time::timeout(SCRIPT_TIMEOUT, child.wait()).await {
        Ok(status) => status?,
        Err(_) => {
            // SIGTERM first: the script quits its browsers on the way out; then SIGKILL.
            if let Some(pid) = child.id() {
                let _ = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
            }
            if tokio::time::timeout(Duration::from_secs(15), child.wait()).await.is_err() {
                child.kill().await?;
            }
            bail!("the browser test did not finish in {SCRIPT_TIMEOUT:?} (its output is above)");
        }
    };
    let out = stdout.await?;
    stderr.await?;
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(status.success(), "the browser test failed ({status}); its output is above, prefixed [browser]");
    assert!(out.contains("CONSOLE BROWSER TEST OK"), "the browser test exited 0 without finishing");
    Ok(())
}

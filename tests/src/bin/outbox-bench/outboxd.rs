//! The `outboxd` under test: found, started (with TLS and a token with `--secure`), measured.
use std::path::PathBuf;

use crate::OUTBOXD_FLAGS;
use anyhow::{Context as _, Result, bail, ensure};
use outbox_tests::Outboxd;

/// The files and flags of a `--secure` run; removed when dropped.
pub(crate) struct Secure {
    pub(crate) _pki: outbox_tests::pki::Pki,
    pub(crate) flags: Vec<String>,
}

impl Secure {
    /// A CA, a server certificate, an auth file with one principal allowed everything, and the
    /// harness set to connect with TLS and its token.
    pub(crate) fn new() -> Result<Self> {
        let pki = outbox_tests::pki::Pki::new("bench")?;
        let server = pki.server("server")?;
        let token = "bench-token";
        let auth = pki.dir.join("auth.toml");
        std::fs::write(
            &auth,
            format!(
                "[[principal]]\nname = \"bench\"\ntokens = [{:?}]\npermissions = [\"*\"]\n",
                outbox_server::grpc::auth::token_hash_line(token)
            ),
        )?;
        outbox_tests::use_credentials(outbox_client::Credentials {
            tls_ca: Some(pki.ca.clone()),
            ..outbox_client::Credentials::token(token)
        });
        let path = |p: &std::path::Path| p.display().to_string();
        let flags = vec![
            "--tls-cert".into(),
            path(&server.cert),
            "--tls-key".into(),
            path(&server.key),
            "--auth-file".into(),
            path(&auth),
        ];
        Ok(Self { _pki: pki, flags })
    }
}

/// Starts outboxd with the bench's flags, and with TLS and the auth file in a `--secure` run.
pub(crate) async fn start_outboxd(bin: &std::path::Path, url: &str, secure: Option<&Secure>) -> Result<Outboxd> {
    let mut flags: Vec<&str> = OUTBOXD_FLAGS.to_vec();
    if let Some(s) = secure {
        flags.extend(s.flags.iter().map(String::as_str));
    }
    let mut outboxd = Outboxd::start_binary(bin, url, &flags).await?;
    if secure.is_some() {
        outboxd.endpoint = format!("https://localhost:{}", outboxd.addr.port());
    }
    Ok(outboxd)
}

/// Resident memory of a process, from `/proc/PID/status`.
pub(crate) fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading the status of outboxd (pid {pid})"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS line")?;
    line.split_whitespace().nth(1).context("empty VmRSS line")?.parse().context("VmRSS is not a number")
}

/// `outboxd` (the server crate's build), else `outboxd-e2e` (this crate's copy), next to this
/// executable.
pub(crate) fn find_outboxd(explicit: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(path) = explicit {
        ensure!(path.is_file(), "--outboxd {}: no such file", path.display());
        return Ok(path);
    }
    let exe = std::env::current_exe().context("locating this executable")?;
    let dir = exe.parent().context("this executable has no directory")?;
    for name in ["outboxd", "outboxd-e2e"] {
        let path = dir.join(name);
        if path.is_file() {
            return Ok(path);
        }
    }
    bail!(
        "no outboxd or outboxd-e2e next to {}: run `cargo build --release -p outbox-server -p outbox-tests --bins` \
         first, or pass --outboxd PATH",
        exe.display()
    )
}

//! A throwaway PostgreSQL cluster that accepts TLS connections only, for the tests of
//! `sslmode`: `initdb` into a temporary directory, a server certificate for `localhost` alone
//! from a CA of its own, `ssl = on`, and a `pg_hba.conf` that rejects every connection without
//! TLS and asks the role `certuser` for a client certificate. The shared server on 5432 is
//! left as it is. The cluster is stopped and its directory removed when the value is dropped,
//! a failed test's included.
//!
//! PostgreSQL refuses to run as root: as root, the cluster's files belong to the `postgres`
//! user and its commands run through `runuser -u postgres`; as anyone else, they run as that
//! user. The binaries are `initdb` and `pg_ctl` from `OUTBOX_TEST_PG_BINDIR`, else from the
//! newest `/usr/lib/postgresql/*/bin` (Debian's layout), else from `PATH`.
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Output};

use anyhow::{Context as _, Result, bail};

use crate::pki::Pki;

/// The role that must log in with a client certificate (`CN=certuser`).
pub const CERT_USER: &str = "certuser";

/// A running cluster on 127.0.0.1, TLS only.
pub struct TlsPostgres {
    pub port: u16,
    /// The CA that signed the server's certificate (and that the server trusts for client
    /// certificates): what `sslrootcert` names.
    pub pki: Pki,
    dir: PathBuf,
    bin: PathBuf,
    as_postgres: bool,
}

impl std::fmt::Debug for TlsPostgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsPostgres").field("port", &self.port).field("dir", &self.dir).finish()
    }
}

/// Where `initdb` and `pg_ctl` are, if anywhere.
fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("OUTBOX_TEST_PG_BINDIR") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin): &(u32, PathBuf)| bin.join("initdb").exists())
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path).find(|dir| dir.join("initdb").exists() && dir.join("pg_ctl").exists())
    })
}

fn is_root() -> Result<bool> {
    let out = Command::new("id").arg("-u").output().context("running id -u")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim() == "0")
}

fn check(what: &str, out: Output) -> Result<Output> {
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

impl TlsPostgres {
    /// Starts a cluster; `None` (saying why) when no PostgreSQL binaries are installed, unless
    /// `CI` is set: there, missing binaries fail the test.
    pub async fn start() -> Result<Option<Self>> {
        let Some(bin) = bin_dir() else {
            if std::env::var_os("CI").is_some() {
                bail!("initdb and pg_ctl are missing and CI is set: the PostgreSQL TLS tests must run in CI");
            }
            eprintln!("SKIPPED: the PostgreSQL TLS tests need initdb and pg_ctl (set OUTBOX_TEST_PG_BINDIR)");
            return Ok(None);
        };
        tokio::task::spawn_blocking(move || Self::start_blocking(bin).map(Some)).await?
    }

    fn start_blocking(bin: PathBuf) -> Result<Self> {
        let as_postgres = is_root()?;
        let pki = Pki::new("pg")?;
        let server = pki.server_named("pg-server", &["localhost"])?;
        let dir = std::env::temp_dir().join(format!("outboxd-pgtls-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir)?;
        // The value exists from here on, so that a failure below still removes the directory.
        let mut cluster = Self { port: 0, pki, dir, bin, as_postgres };
        let dir = cluster.dir.clone();
        std::fs::copy(&server.cert, dir.join("server.pem"))?;
        std::fs::copy(&server.key, dir.join("server.key"))?;
        std::fs::copy(&cluster.pki.ca, dir.join("ca.pem"))?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            // PostgreSQL refuses a key that others may read.
            std::fs::set_permissions(dir.join("server.key"), std::fs::Permissions::from_mode(0o600))?;
        }
        if as_postgres {
            check("chown", Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).output()?)?;
        }
        let data = dir.join("data");
        check(
            "initdb",
            cluster
                .command("initdb")
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"])
                .output()?,
        )?;
        std::fs::write(
            data.join("pg_hba.conf"),
            format!(
                "local all all trust\n\
                 hostssl all {CERT_USER} 127.0.0.1/32 cert\n\
                 hostssl all all 127.0.0.1/32 trust\n\
                 hostnossl all all 0.0.0.0/0 reject\n"
            ),
        )?;
        // A port that was free a moment ago may be taken by the time the server binds it: a
        // few tries, each on a fresh one.
        let mut last = None;
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let conf = format!(
                "port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{dir}'\n\
                 ssl = on\nssl_cert_file = '{dir}/server.pem'\nssl_key_file = '{dir}/server.key'\n\
                 ssl_ca_file = '{dir}/ca.pem'\nfsync = off\nsynchronous_commit = off\nfull_page_writes = off\n",
                dir = dir.display()
            );
            std::fs::write(data.join("postgresql.auto.conf"), conf)?;
            let out = cluster
                .command("pg_ctl")
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(dir.join("server.log"))
                .args(["-w", "-t", "60", "start"])
                .output()?;
            if out.status.success() {
                cluster.port = port;
                return Ok(cluster);
            }
            last = Some(format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stderr),
                std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
            ));
        }
        bail!("the TLS PostgreSQL did not start: {}", last.unwrap_or_default())
    }

    /// `bin/<program>`, run as `postgres` when this process is root, in the cluster's directory
    /// (PostgreSQL's programs stop when they cannot read the current directory).
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        let mut cmd = if self.as_postgres {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(path);
            cmd
        } else {
            Command::new(path)
        };
        cmd.current_dir(&self.dir);
        cmd
    }

    /// `postgres://USER@HOST:PORT/DB?QUERY`, QUERY given as it goes into the URL.
    pub fn url(&self, user: &str, host: &str, db: &str, query: &str) -> String {
        format!("postgres://{user}@{host}:{}/{db}?{query}", self.port)
    }

    /// `sslrootcert=CA&…`: the query of a URL that checks the server against this cluster's CA.
    pub fn root_cert_query(&self, mode: &str) -> String {
        format!("sslmode={mode}&sslrootcert={}", self.pki.ca.display())
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        if self.port != 0 {
            let _ = self.command("pg_ctl").arg("-D").arg(&data).args(["-m", "immediate", "-w", "stop"]).output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

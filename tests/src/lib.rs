//! The end-to-end harness: real `outboxd` processes on fresh PostgreSQL databases, real gRPC
//! streams, a TCP proxy that can take the database away, and bounded polling helpers.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use outbox_client::grpc::{AdminClient, OutboxClient};
use outbox_proto::v1 as pb;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

pub use outbox_server::testing::TestDb;

pub mod brokers;
pub mod pgtls;
pub mod pki;
pub mod proxy;

pub use proxy::TcpProxy;

/// Where the test binary of outboxd lives; set by cargo for this crate's integration tests.
pub fn outboxd_path() -> PathBuf {
    if let Ok(p) = std::env::var("OUTBOXD_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test> -> target/<profile>/outboxd-e2e
    let dir = exe.parent().and_then(Path::parent).unwrap();
    dir.join("outboxd-e2e")
}

/// The repository's root directory.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// A Python virtualenv under `target/<name>` with the packages of `requirements` (a path in
/// the repository), made once; returns its interpreter.
pub fn python_venv(name: &str, requirements: &str) -> Result<PathBuf> {
    let venv = repo_root().join("target").join(name);
    let py = venv.join("bin").join("python");
    let ready = venv.join(".ready");
    if !ready.exists() {
        let ok = std::process::Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .context("python3 is required for this test")?;
        if !ok.success() {
            bail!("python3 -m venv failed");
        }
        let ok = std::process::Command::new(&py)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r"])
            .arg(repo_root().join(requirements))
            .status()?;
        if !ok.success() {
            bail!("pip install of {requirements} failed");
        }
        std::fs::write(&ready, b"")?;
    }
    Ok(py)
}

/// Credentials every connection of this harness uses (streams, admin and outbox clients): none
/// unless a caller set them once (the benchmark's `--secure` run).
static CREDENTIALS: std::sync::OnceLock<outbox_client::Credentials> = std::sync::OnceLock::new();

/// Makes every connection of this process's harness use `creds`; only the first call counts.
pub fn use_credentials(creds: outbox_client::Credentials) {
    let _ = CREDENTIALS.set(creds);
}

fn credentials() -> outbox_client::Credentials {
    CREDENTIALS.get().cloned().unwrap_or_default()
}

/// Fast loops for tests: short polls so that waiting on conditions stays quick.
pub const FAST: &[&str] =
    &["--sweep-interval", "50ms", "--stream-poll", "100ms", "--relay-poll-max", "50ms", "--drain-timeout", "2s"];

/// A running `outboxd` process. Killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct Outboxd {
    child: Child,
    pub addr: SocketAddr,
    pub endpoint: String,
    /// The last lines of its log (stderr), for tests that check what it logged.
    logs: Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
}

/// How many of a process's last log lines [`Outboxd::log_lines`] can see.
const KEPT_LOG_LINES: usize = 10_000;

impl Outboxd {
    /// Starts `outboxd serve` on `database_url` with `extra` flags (on port 0 unless they
    /// name `--listen`); returns once it is serving.
    pub async fn start(database_url: &str, extra: &[&str]) -> Result<Self> {
        Self::start_binary(&outboxd_path(), database_url, extra).await
    }

    /// [`Outboxd::start`] with the binary at `bin`, for callers that choose it themselves (a
    /// benchmark picks a release build; changing `OUTBOXD_BIN` in-process would need `unsafe`).
    pub async fn start_binary(bin: &Path, database_url: &str, extra: &[&str]) -> Result<Self> {
        Self::start_with_env(bin, database_url, extra, &[]).await
    }

    /// [`Outboxd::start_binary`] with extra environment variables (`OTEL_*`, for instance).
    pub async fn start_with_env(bin: &Path, database_url: &str, extra: &[&str], env: &[(&str, &str)]) -> Result<Self> {
        let mut child = Command::new(bin)
            .arg("serve")
            .args(["--database-url", database_url])
            .args(if extra.contains(&"--listen") { &[][..] } else { &["--listen", "127.0.0.1:0"][..] })
            .args(extra)
            .env("RUST_LOG", std::env::var("OUTBOXD_TEST_LOG").unwrap_or_else(|_| "info,sqlx=warn".into()))
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        let stderr = child.stderr.take().context("no stderr")?;
        let (tx, mut rx) = mpsc::channel::<SocketAddr>(1);
        let logs = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
        let kept = logs.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("[outboxd] {line}");
                {
                    let mut kept = kept.lock().unwrap();
                    if kept.len() == KEPT_LOG_LINES {
                        kept.pop_front();
                    }
                    kept.push_back(line.clone());
                }
                if line.contains("outboxd serving")
                    && let Some(addr) = line.split("local_addr=").nth(1).and_then(|s| s.split_whitespace().next())
                    && let Ok(addr) = addr.parse()
                {
                    let _ = tx.send(addr).await;
                }
            }
        });
        let addr = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .context("outboxd did not start serving within 60 s")?
            .context("outboxd exited before serving")?;
        Ok(Self { child, addr, endpoint: format!("http://{addr}"), logs })
    }

    /// Log lines so far that contain every one of `needles`.
    pub fn log_lines(&self, needles: &[&str]) -> Vec<String> {
        self.logs.lock().unwrap().iter().filter(|l| needles.iter().all(|n| l.contains(n))).cloned().collect()
    }

    pub fn pid(&self) -> u32 {
        self.child.id().unwrap_or(0)
    }

    /// SIGKILL: no graceful anything.
    pub async fn kill(mut self) -> Result<()> {
        self.child.kill().await?;
        Ok(())
    }

    /// SIGTERM, then wait (bounded) for the process to exit; returns whether it exited 0.
    pub async fn terminate(mut self, within: Duration) -> Result<bool> {
        let status = std::process::Command::new("kill").args(["-TERM", &self.pid().to_string()]).status()?;
        if !status.success() {
            bail!("kill -TERM failed");
        }
        let exit =
            tokio::time::timeout(within, self.child.wait()).await.context("outboxd did not exit after SIGTERM")??;
        Ok(exit.success())
    }

    pub async fn admin(&self) -> Result<AdminClient> {
        Ok(outbox_client::grpc::admin_with(&self.endpoint, &credentials()).await?)
    }

    pub async fn client(&self) -> Result<OutboxClient> {
        Ok(outbox_client::grpc::outbox_with(&self.endpoint, &credentials()).await?)
    }
}

/// A consumer definition for tests: fast retries, short deadline.
pub fn consumer(name: &str, topics: &[&str]) -> pb::Consumer {
    pb::Consumer {
        name: name.into(),
        topics: topics.iter().map(|s| s.to_string()).collect(),
        max_deliveries: 5,
        backoff_base: Some(dur(Duration::from_millis(20))),
        backoff_max: Some(dur(Duration::from_millis(200))),
        ack_deadline: Some(dur(Duration::from_secs(30))),
        ..Default::default()
    }
}

pub fn dur(d: Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

pub async fn create_consumer(admin: &mut AdminClient, c: pb::Consumer) -> Result<pb::Consumer> {
    admin
        .create_consumer(pb::CreateConsumerRequest { consumer: Some(c) })
        .await?
        .into_inner()
        .consumer
        .context("no consumer in response")
}

/// Polls `check` until it returns `Some`, at most `within`; fails naming `what` otherwise.
pub async fn eventually<T, F, Fut>(what: &str, within: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {within:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A raw `Subscribe` stream that the test drives by hand.
#[derive(Debug)]
pub struct RawStream {
    tx: Option<mpsc::Sender<pb::SubscribeRequest>>,
    inbound: tonic::Streaming<pb::SubscribeResponse>,
}

impl RawStream {
    pub async fn open(endpoint: &str, consumer: &str, max_in_flight: u32) -> Result<Self, tonic::Status> {
        Self::open_with(endpoint, pb::Start { consumer: consumer.into(), max_in_flight, ack_deadline: None }).await
    }

    pub async fn open_with(endpoint: &str, start: pb::Start) -> Result<Self, tonic::Status> {
        let mut client = outbox_client::grpc::outbox_with(endpoint, &credentials())
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let (tx, rx) = mpsc::channel(256);
        tx.send(pb::SubscribeRequest { request: Some(pb::subscribe_request::Request::Start(start)) }).await.unwrap();
        let inbound = client.subscribe(ReceiverStream::new(rx)).await?.into_inner();
        Ok(Self { tx: Some(tx), inbound })
    }

    /// The next delivery, or `None` if none arrives within `within`.
    pub async fn next(&mut self, within: Duration) -> Result<Option<pb::Delivery>, tonic::Status> {
        match tokio::time::timeout(within, self.inbound.message()).await {
            Err(_) => Ok(None),
            Ok(Ok(Some(pb::SubscribeResponse { response: Some(pb::subscribe_response::Response::Delivery(d)) }))) => {
                Ok(Some(d))
            }
            Ok(Ok(_)) => Err(tonic::Status::cancelled("stream ended")),
            Ok(Err(s)) => Err(s),
        }
    }

    /// Exactly `n` deliveries, each within `within` of the previous.
    pub async fn take(&mut self, n: usize, within: Duration) -> Result<Vec<pb::Delivery>> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            match self.next(within).await? {
                Some(d) => out.push(d),
                None => bail!("got {} of {n} deliveries", out.len()),
            }
        }
        Ok(out)
    }

    /// The status the server ends the stream with (waits at most `within`).
    pub async fn end_status(&mut self, within: Duration) -> Result<Option<tonic::Status>> {
        loop {
            match tokio::time::timeout(within, self.inbound.message()).await.context("stream did not end")? {
                Ok(Some(_)) => continue,
                Ok(None) => return Ok(None),
                Err(s) => return Ok(Some(s)),
            }
        }
    }

    pub async fn send(&self, r: pb::subscribe_request::Request) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(pb::SubscribeRequest { request: Some(r) }).await;
        }
    }

    pub async fn ack(&self, ids: &[&str]) {
        self.send(pb::subscribe_request::Request::Ack(pb::Ack {
            message_ids: ids.iter().map(|s| s.to_string()).collect(),
        }))
        .await;
    }

    pub async fn nack(&self, id: &str, error: &str) {
        self.send(pb::subscribe_request::Request::Nack(pb::Nack {
            message_id: id.into(),
            error: error.into(),
            retry_after: None,
        }))
        .await;
    }

    /// A sender of requests on this stream that other tasks can hold (handlers that ack while
    /// the stream's owner reads the next delivery); `None` once closed.
    pub fn requests(&self) -> Option<mpsc::Sender<pb::SubscribeRequest>> {
        self.tx.clone()
    }

    /// Half-closes the request stream, as a client that goes away cleanly does.
    pub fn close(&mut self) {
        self.tx = None;
    }
}

/// Enqueues through the SQL function, as a producer in any language would.
pub async fn sql_enqueue(pool: &sqlx::PgPool, topic: &str, type_: &str, payload: &[u8]) -> Result<uuid::Uuid> {
    Ok(sqlx::query_scalar("SELECT outbox.enqueue($1, $2, $3)")
        .bind(topic)
        .bind(type_)
        .bind(payload)
        .fetch_one(pool)
        .await?)
}

/// The address of the PostgreSQL server the tests use (from `OUTBOX_TEST_DATABASE_URL`).
pub async fn db_addr() -> Result<SocketAddr> {
    let url = outbox_server::testing::base_url();
    let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or(rest);
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host_port = if host_port.contains(':') { host_port.to_owned() } else { format!("{host_port}:5432") };
    tokio::net::lookup_host(&host_port).await?.next().with_context(|| format!("cannot resolve {host_port}"))
}

/// A TCP proxy in front of PostgreSQL that a test can take down and bring back: the database
/// disappears for outboxd (connections cut, new ones refused) while other tests go on.
#[derive(Debug, Clone)]
pub struct DbProxy {
    pub port: u16,
    up: watch::Sender<bool>,
    accepting: Arc<AtomicBool>,
}

impl DbProxy {
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (up, _) = watch::channel(true);
        let accepting = Arc::new(AtomicBool::new(true));
        let (up2, acc2) = (up.clone(), accepting.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if !acc2.load(Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let mut down = up2.subscribe();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(upstream).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = down.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        Ok(Self { port, up, accepting })
    }

    pub fn set_up(&self, up: bool) {
        self.accepting.store(up, Ordering::SeqCst);
        self.up.send_replace(up);
    }

    /// `url` with its host and port replaced by this proxy's.
    pub fn url_for(&self, url: &str) -> String {
        let (scheme, rest) = url.split_once("://").unwrap();
        let (auth_host, path) = rest.split_once('/').unwrap_or((rest, ""));
        let auth = auth_host.rsplit_once('@').map(|(a, _)| format!("{a}@")).unwrap_or_default();
        format!("{scheme}://{auth}127.0.0.1:{}/{path}", self.port)
    }
}

/// The stores every conformance case runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

/// A fresh database of either kind, removed when dropped.
#[derive(Debug)]
pub enum TestStore {
    Postgres(TestDb),
    Sqlite(outbox_server::testing::TestSqlite),
}

impl TestStore {
    pub async fn create(backend: Backend) -> Result<Self> {
        Ok(match backend {
            Backend::Postgres => TestStore::Postgres(TestDb::create().await?),
            Backend::Sqlite => TestStore::Sqlite(outbox_server::testing::TestSqlite::create()?),
        })
    }

    pub fn url(&self) -> &str {
        match self {
            TestStore::Postgres(db) => &db.url,
            TestStore::Sqlite(db) => &db.url,
        }
    }
}

/// A producer's connection to the store's database (for SQLite: the same file, as another
/// process would open it). Every write here is what an application would do.
#[derive(Debug, Clone)]
pub enum Db {
    Postgres(sqlx::PgPool),
    Sqlite(sqlx::SqlitePool),
}

impl Db {
    pub async fn connect(url: &str) -> Result<Self> {
        if url.starts_with("sqlite:") {
            use std::str::FromStr as _;
            let opts = sqlx::sqlite::SqliteConnectOptions::from_str(url)?
                .busy_timeout(Duration::from_secs(10))
                .foreign_keys(true);
            Ok(Db::Sqlite(sqlx::sqlite::SqlitePoolOptions::new().max_connections(4).connect_with(opts).await?))
        } else {
            Ok(Db::Postgres(sqlx::PgPool::connect(url).await?))
        }
    }

    /// Enqueues in a transaction of its own that commits.
    pub async fn enqueue(&self, msg: &outbox_client::Message) -> Result<outbox_client::Enqueued> {
        self.enqueue_all(std::slice::from_ref(msg)).await.map(|mut v| v.remove(0))
    }

    /// Enqueues all of `msgs` in one committed transaction.
    pub async fn enqueue_all(&self, msgs: &[outbox_client::Message]) -> Result<Vec<outbox_client::Enqueued>> {
        let mut out = Vec::new();
        match self {
            Db::Postgres(p) => {
                let mut tx = p.begin().await?;
                for m in msgs {
                    out.push(outbox_client::enqueue(&mut *tx, m).await?);
                }
                tx.commit().await?;
            }
            Db::Sqlite(p) => {
                let mut tx = p.begin().await?;
                for m in msgs {
                    out.push(outbox_client::enqueue(&mut *tx, m).await?);
                }
                tx.commit().await?;
            }
        }
        Ok(out)
    }

    /// Enqueues in a transaction that rolls back.
    pub async fn enqueue_rolled_back(&self, msg: &outbox_client::Message) -> Result<()> {
        match self {
            Db::Postgres(p) => {
                let mut tx = p.begin().await?;
                outbox_client::enqueue(&mut *tx, msg).await?;
                tx.rollback().await?;
            }
            Db::Sqlite(p) => {
                let mut tx = p.begin().await?;
                outbox_client::enqueue(&mut *tx, msg).await?;
                tx.rollback().await?;
            }
        }
        Ok(())
    }

    /// Enqueues in a transaction whose COMMIT fails (a deferred constraint); returns whether
    /// the commit failed.
    pub async fn enqueue_with_failing_commit(&self, msg: &outbox_client::Message) -> Result<bool> {
        match self {
            Db::Postgres(p) => {
                sqlx::query("CREATE TABLE IF NOT EXISTS app_orders (id int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED)")
                    .execute(p)
                    .await?;
                let mut tx = p.begin().await?;
                sqlx::query("INSERT INTO app_orders VALUES (1), (1)").execute(&mut *tx).await?;
                outbox_client::enqueue(&mut *tx, msg).await?;
                Ok(tx.commit().await.is_err())
            }
            Db::Sqlite(p) => {
                sqlx::query("CREATE TABLE IF NOT EXISTS app_customers (id INTEGER PRIMARY KEY)").execute(p).await?;
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS app_orders (id INTEGER PRIMARY KEY,
                         customer INTEGER REFERENCES app_customers (id) DEFERRABLE INITIALLY DEFERRED)",
                )
                .execute(p)
                .await?;
                let mut tx = p.begin().await?;
                sqlx::query("INSERT INTO app_orders VALUES (1, 42)").execute(&mut *tx).await?;
                outbox_client::enqueue(&mut *tx, msg).await?;
                Ok(tx.commit().await.is_err())
            }
        }
    }

    /// Enqueues the way a producer in any language does: the SQL function `outbox.enqueue` on
    /// PostgreSQL, the documented INSERT on SQLite.
    pub async fn sql_enqueue(&self, topic: &str, type_: &str, payload: &[u8]) -> Result<uuid::Uuid> {
        match self {
            Db::Postgres(p) => sql_enqueue(p, topic, type_, payload).await,
            Db::Sqlite(p) => {
                let id: String = sqlx::query_scalar(
                    "INSERT INTO outbox_messages (topic, type, payload) VALUES (?1, ?2, ?3) RETURNING message_id",
                )
                .bind(topic)
                .bind(type_)
                .bind(payload)
                .fetch_one(p)
                .await?;
                Ok(id.parse()?)
            }
        }
    }

    /// Rows in the messages table.
    pub async fn message_count(&self) -> Result<i64> {
        Ok(match self {
            Db::Postgres(p) => sqlx::query_scalar("SELECT count(*) FROM outbox.messages").fetch_one(p).await?,
            Db::Sqlite(p) => sqlx::query_scalar("SELECT count(*) FROM outbox_messages").fetch_one(p).await?,
        })
    }

    /// Deliveries in the inbox, wherever each is held (a row or an acked range).
    pub async fn delivery_count(&self) -> Result<i64> {
        Ok(match self {
            Db::Postgres(p) => sqlx::query_scalar("SELECT count(*) FROM outbox.inbox").fetch_one(p).await?,
            Db::Sqlite(p) => sqlx::query_scalar("SELECT count(*) FROM outbox_inbox").fetch_one(p).await?,
        })
    }

    /// Creates the `app_effects` table that [`Db::effect_with_transactional_ack`] writes.
    pub async fn create_effects_table(&self) -> Result<()> {
        let sql = "CREATE TABLE app_effects (message_id TEXT)";
        match self {
            Db::Postgres(p) => sqlx::query(sql).execute(p).await.map(|_| ())?,
            Db::Sqlite(p) => sqlx::query(sql).execute(p).await.map(|_| ())?,
        }
        Ok(())
    }

    /// A consumer sharing the database: writes its effect (a row in `app_effects`) and acks in
    /// the same transaction. `Ok(true)`: committed; `Ok(false)`: the delivery was already
    /// acked, the effect was rolled back.
    pub async fn effect_with_transactional_ack(&self, consumer: &str, id: uuid::Uuid) -> Result<bool> {
        use outbox_client::ClientError;
        macro_rules! run {
            ($pool:expr) => {{
                let mut tx = $pool.begin().await?;
                sqlx::query("INSERT INTO app_effects VALUES ($1)").bind(id.to_string()).execute(&mut *tx).await?;
                match outbox_client::ack_in_tx(&mut *tx, consumer, id).await {
                    Ok(()) => {
                        tx.commit().await?;
                        Ok(true)
                    }
                    Err(ClientError::AlreadyAcked { .. }) => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }};
        }
        match self {
            Db::Postgres(p) => run!(p),
            Db::Sqlite(p) => run!(p),
        }
    }

    /// Effects written by [`Db::effect_with_transactional_ack`].
    pub async fn effect_count(&self) -> Result<i64> {
        Ok(match self {
            Db::Postgres(p) => sqlx::query_scalar("SELECT count(*) FROM app_effects").fetch_one(p).await?,
            Db::Sqlite(p) => sqlx::query_scalar("SELECT count(*) FROM app_effects").fetch_one(p).await?,
        })
    }
}

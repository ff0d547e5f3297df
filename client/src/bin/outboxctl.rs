//! `outboxctl`: operate outboxd through its public gRPC admin API.
//!
//! Exit codes scripts can rely on: 0 success, 1 any other failure, 2 bad command line,
//! 3 not found, 4 invalid argument or already exists, 5 server unreachable or unavailable,
//! 6 a confirmation was refused, 7 not authenticated or not permitted.
use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand, ValueEnum};
use comfy_table::Table;
use outbox_client::grpc::{self, AdminClient};
use outbox_proto::v1 as pb;
use serde_json::{Value, json};
use tonic::Code;

#[derive(Debug, Parser)]
#[command(name = "outboxctl", version, about = "Operate outboxd: consumers, stats, dead letters, replay")]
struct Cli {
    /// outboxd's gRPC address.
    #[arg(long, global = true, env = "OUTBOXD_SERVER", default_value = "http://127.0.0.1:50051")]
    server: String,
    /// Output format.
    #[arg(long, short, global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
    #[command(flatten)]
    credentials: CredentialArgs,
    #[command(subcommand)]
    command: Command,
}

/// How outboxctl proves who it is (outboxd's --auth-file, --tls-client-ca) and checks the
/// server (an https:// --server is TLS).
#[derive(Debug, Args)]
struct CredentialArgs {
    /// Bearer token of a principal in outboxd's auth file (wins over --token-file).
    #[arg(long, global = true, env = "OUTBOXD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// A file holding the bearer token.
    #[arg(long, global = true, env = "OUTBOXD_TOKEN_FILE", value_name = "PATH")]
    token_file: Option<std::path::PathBuf>,
    /// CA certificates (PEM) to check the server's certificate with (default: the system's).
    #[arg(long, global = true, env = "OUTBOXD_TLS_CA", value_name = "PATH")]
    tls_ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for mutual TLS; needs --tls-key.
    #[arg(long, global = true, env = "OUTBOXD_CLIENT_CERT", value_name = "PATH", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, global = true, env = "OUTBOXD_CLIENT_KEY", value_name = "PATH", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
}

impl From<CredentialArgs> for outbox_client::Credentials {
    fn from(a: CredentialArgs) -> Self {
        Self { token: a.token, token_file: a.token_file, tls_ca: a.tls_ca, tls_cert: a.tls_cert, tls_key: a.tls_key }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Durable consumers.
    #[command(subcommand)]
    Consumers(ConsumersCmd),
    /// Backlog, in flight, retrying, dead and lag per consumer.
    Stats {
        /// Only this consumer.
        #[arg(long)]
        consumer: Option<String>,
        /// Refresh until interrupted.
        #[arg(long)]
        watch: bool,
        /// Refresh interval with --watch.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        interval: Duration,
    },
    /// Messages that gave up after max_deliveries.
    #[command(subcommand, name = "dead-letters")]
    DeadLetters(DeadLettersCmd),
    /// Make deliveries due again for one consumer (bypasses the inbox on purpose).
    Replay(ReplayArgs),
    /// Ordering keys a consumer holds after a dead letter (--dead-key-policy hold).
    #[command(subcommand)]
    Keys(KeysCmd),
    /// One message.
    #[command(subcommand)]
    Message(MessageCmd),
    /// Watch messages go by as they are committed, without consuming them for anyone.
    Tail {
        /// Topics or patterns (`orders.*`, `orders.>`); all when none.
        topics: Vec<String>,
    },
    /// Credentials for outboxd's --auth-file (works offline).
    #[command(subcommand)]
    Auth(AuthCmd),
    /// Enqueue one message (outboxd commits it in its own transaction: not atomic with anything
    /// of yours; producers with a database enqueue in their own transaction).
    Publish(PublishArgs),
    /// Take a consumer's deliveries and print them, acking (or nacking) each: a Subscribe stream
    /// like any consumer's, sharing the consumer's messages with its other streams.
    Consume(ConsumeArgs),
}

#[derive(Debug, Subcommand)]
enum AuthCmd {
    /// Print a fresh random token, and the `sha256:` line that the auth file holds for it.
    NewToken,
}

#[derive(Debug, Subcommand)]
enum ConsumersCmd {
    /// Every consumer with its topics, retry policy and state.
    List,
    /// One consumer's definition.
    Get { name: String },
    /// A durable consumer (a sink with --sink): it takes every message of its topics from now on
    /// (or the earliest retained, --start-from earliest).
    Create(Box<CreateArgs>),
    /// A consumer and its deliveries (acked, pending and dead).
    Delete {
        name: String,
        /// Do not ask for confirmation.
        #[arg(long, short)]
        yes: bool,
    },
    /// Stop leasing to a consumer's streams (deliveries wait; acks still count).
    Pause { name: String },
    /// Lease to a paused consumer's streams again.
    Resume { name: String },
}

#[derive(Debug, Args)]
struct PublishArgs {
    /// The message's topic (dot-separated segments: `orders.created`).
    topic: String,
    /// The message's type (`OrderCreated`).
    #[arg(name = "TYPE")]
    type_: String,
    /// The payload: text as it is, `@FILE` for a file's bytes, `-` for standard input.
    #[arg(long, default_value = "")]
    payload: String,
    /// A header `key=value`; repeat for several.
    #[arg(long = "header", value_name = "KEY=VALUE")]
    headers: Vec<String>,
    /// The ordering key: messages that share one are delivered one at a time, in order.
    #[arg(long)]
    key: Option<String>,
    /// The message id (a UUID); the same message again is an idempotent duplicate.
    #[arg(long)]
    id: Option<String>,
}

#[derive(Debug, Args)]
struct ConsumeArgs {
    /// The consumer to take deliveries of (create it first: `outboxctl consumers create`).
    consumer: String,
    /// Ack each delivery once printed (the default).
    #[arg(long, conflicts_with = "nack")]
    ack: bool,
    /// Nack each delivery once printed: it is retried after the consumer's backoff, and dead
    /// after max_deliveries.
    #[arg(long)]
    nack: bool,
    /// Stop after this many deliveries (default: until interrupted).
    #[arg(long)]
    max: Option<u64>,
    /// Deliveries in flight at once.
    #[arg(long, default_value_t = 10)]
    max_in_flight: u32,
    /// Stop when no delivery comes for this long (default: wait until interrupted).
    #[arg(long, value_parser = humantime::parse_duration)]
    idle: Option<Duration>,
}

#[derive(Debug, Args)]
struct CreateArgs {
    name: String,
    /// Topic or pattern (`orders.*` one segment, `orders.>` the rest); repeat for several.
    #[arg(long = "topic", required = true)]
    topics: Vec<String>,
    #[arg(long, default_value_t = 10)]
    max_deliveries: u32,
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    backoff_base: Duration,
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    backoff_max: Duration,
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    ack_deadline: Duration,
    #[arg(long, value_enum, default_value_t = StartFrom::New)]
    start_from: StartFrom,
    /// When a message with an ordering key dead-letters: skip it and deliver the key's next
    /// message, or hold the key (its later messages wait) until the dead one is replayed or
    /// the key released (`outboxctl keys`).
    #[arg(long, value_enum, default_value_t = DeadKeyPolicy::Skip)]
    dead_key_policy: DeadKeyPolicy,
    #[command(flatten)]
    sink: SinkArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum DeadKeyPolicy {
    Skip,
    Hold,
}

fn dead_key_policy_text(p: i32) -> &'static str {
    if p == pb::DeadKeyPolicy::Hold as i32 { "HOLD" } else { "SKIP" }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StartFrom {
    New,
    Earliest,
}

/// A sink: outboxd delivers the consumer itself, to a broker or a webhook.
#[derive(Debug, Args)]
struct SinkArgs {
    /// Make this consumer a sink to this target (outboxd publishes, acks on the target's
    /// confirmation; it takes no Subscribe streams).
    #[arg(long, value_enum, requires = "url")]
    sink: Option<SinkKind>,
    /// The target: amqp:// or amqps:// (rabbitmq), nats:// (nats), https:// (webhook; http://
    /// only to loopback). A password in it is never shown again.
    #[arg(long, requires = "sink")]
    url: Option<String>,
    /// RabbitMQ exchange ("" = the default exchange).
    #[arg(long, requires = "sink")]
    exchange: Option<String>,
    /// RabbitMQ routing key template: {topic} {type} {ordering_key} (default "{topic}").
    #[arg(long, requires = "sink")]
    routing_key: Option<String>,
    /// NATS subject template: {topic} {type} {ordering_key} (default "{topic}"); a JetStream
    /// stream must capture it.
    #[arg(long, requires = "sink")]
    subject: Option<String>,
    /// Webhook signing secret, "whsec_" + base64 (Standard Webhooks). Prefer --secret-file or
    /// the environment: a command line is visible to other users of the host.
    #[arg(long, env = "OUTBOXD_SINK_SECRET", hide_env_values = true, conflicts_with = "secret_file")]
    secret: Option<String>,
    /// A file holding the webhook signing secret.
    #[arg(long)]
    secret_file: Option<std::path::PathBuf>,
    /// Webhook request timeout (default 10s).
    #[arg(long, value_parser = humantime::parse_duration, requires = "sink")]
    timeout: Option<Duration>,
    /// Concurrent unconfirmed publishes (default 64).
    #[arg(long, requires = "sink")]
    max_in_flight: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SinkKind {
    Rabbitmq,
    Nats,
    Webhook,
}

impl SinkArgs {
    /// The sink on the wire, or a usage error naming the flag that does not fit.
    fn to_pb(&self) -> Result<Option<pb::Sink>, Failure> {
        let usage = |m: String| Failure { code: 2, message: m };
        let Some(kind) = self.sink else {
            return Ok(None);
        };
        let only = |flag: &str, set: bool, for_kind: SinkKind| {
            if set && kind != for_kind {
                Err(usage(format!("{flag} is for --sink {}", for_kind.name())))
            } else {
                Ok(())
            }
        };
        only("--exchange", self.exchange.is_some(), SinkKind::Rabbitmq)?;
        only("--routing-key", self.routing_key.is_some(), SinkKind::Rabbitmq)?;
        only("--subject", self.subject.is_some(), SinkKind::Nats)?;
        // --secret may come from the environment, so it is only read for a webhook.
        only("--secret-file", self.secret_file.is_some(), SinkKind::Webhook)?;
        only("--timeout", self.timeout.is_some(), SinkKind::Webhook)?;
        let url = self.url.clone().unwrap_or_default();
        use pb::sink::Target;
        let target = match kind {
            SinkKind::Rabbitmq => Target::Rabbitmq(pb::RabbitMqSink {
                url,
                exchange: self.exchange.clone().unwrap_or_default(),
                routing_key: self.routing_key.clone().unwrap_or_default(),
            }),
            SinkKind::Nats => Target::Nats(pb::NatsSink { url, subject: self.subject.clone().unwrap_or_default() }),
            SinkKind::Webhook => {
                let secret = match (&self.secret, &self.secret_file) {
                    (Some(s), _) => s.clone(),
                    (None, Some(path)) => std::fs::read_to_string(path)
                        .map_err(|e| usage(format!("--secret-file {}: {e}", path.display())))?
                        .trim()
                        .to_owned(),
                    (None, None) => {
                        return Err(usage(
                            "--sink webhook needs --secret, --secret-file or OUTBOXD_SINK_SECRET".into(),
                        ));
                    }
                };
                Target::Webhook(pb::WebhookSink { url, secret, timeout: self.timeout.map(pb_duration) })
            }
        };
        Ok(Some(pb::Sink { target: Some(target), max_in_flight: self.max_in_flight.unwrap_or(0) }))
    }
}

impl SinkKind {
    fn name(self) -> &'static str {
        match self {
            SinkKind::Rabbitmq => "rabbitmq",
            SinkKind::Nats => "nats",
            SinkKind::Webhook => "webhook",
        }
    }
}

/// The sink as the server answered it (secrets already `***`).
fn sink_json(s: &pb::Sink) -> Value {
    use pb::sink::Target;
    let mut v = match &s.target {
        Some(Target::Rabbitmq(r)) => {
            json!({ "kind": "rabbitmq", "url": r.url, "exchange": r.exchange, "routing_key": r.routing_key })
        }
        Some(Target::Nats(n)) => json!({ "kind": "nats", "url": n.url, "subject": n.subject }),
        Some(Target::Webhook(w)) => {
            json!({ "kind": "webhook", "url": w.url, "secret": w.secret, "timeout_s": secs(w.timeout.as_ref()) })
        }
        None => json!({ "kind": "" }),
    };
    v["max_in_flight"] = json!(s.max_in_flight);
    v
}

/// One short line: the kind, where, and how it routes.
fn sink_text(s: Option<&pb::Sink>) -> String {
    use pb::sink::Target;
    match s.and_then(|s| s.target.as_ref()) {
        None => String::new(),
        Some(Target::Rabbitmq(r)) => {
            let exchange = if r.exchange.is_empty() { "(default)" } else { r.exchange.as_str() };
            format!("rabbitmq {} exchange={exchange} key={}", r.url, r.routing_key)
        }
        Some(Target::Nats(n)) => format!("nats {} subject={}", n.url, n.subject),
        Some(Target::Webhook(w)) => format!("webhook {}", w.url),
    }
}

#[derive(Debug, Subcommand)]
enum KeysCmd {
    /// The held keys, oldest first: the dead message that holds each, its error, and how
    /// many messages wait behind it.
    List { consumer: String },
    /// Let a held key flow again: its dead message is delivered again first, then the waiting
    /// ones in order (with --skip-dead: the dead message stays dead and the waiting ones go).
    Release {
        consumer: String,
        key: String,
        /// Leave the dead message dead; deliver the waiting ones without it.
        #[arg(long)]
        skip_dead: bool,
    },
}

#[derive(Debug, Subcommand)]
enum DeadLettersCmd {
    /// A consumer's dead letters with their last error.
    List {
        consumer: String,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// One dead letter: the message, its payload and its delivery timeline.
    Show { consumer: String, message_id: String },
}

#[derive(Debug, Args)]
struct ReplayArgs {
    consumer: String,
    /// These message ids.
    #[arg(long = "id", conflicts_with_all = ["dead_letters", "after", "before"])]
    ids: Vec<String>,
    /// The consumer's dead letters (with --after/--before: those enqueued in that range).
    #[arg(long)]
    dead_letters: bool,
    /// Messages enqueued at or after this RFC 3339 time.
    #[arg(long)]
    after: Option<DateTime<Utc>>,
    /// Messages enqueued before this RFC 3339 time.
    #[arg(long)]
    before: Option<DateTime<Utc>>,
    /// Only messages of this type (repeatable).
    #[arg(long = "type", value_name = "TYPE")]
    types: Vec<String>,
    /// Only messages whose topic matches this name or pattern (repeatable).
    #[arg(long = "topic", value_name = "PATTERN")]
    topics: Vec<String>,
    /// Only dead letters whose last error is exactly this (with --dead-letters): one group, as
    /// the console shows them.
    #[arg(long, value_name = "ERROR", requires = "dead_letters")]
    last_error: Option<String>,
    /// Deliveries made due per second (default: the server's --replay-rate).
    #[arg(long, value_name = "PER_SECOND")]
    rate: Option<u32>,
    /// Only count what would be replayed.
    #[arg(long)]
    dry_run: bool,
    /// Replay messages older than the retention too (their dedup is gone: they may take effect twice).
    #[arg(long)]
    allow_beyond_retention: bool,
    /// Ask for confirmation when more than this many deliveries would be replayed.
    #[arg(long, default_value_t = 100, value_name = "N")]
    confirm_above: i64,
    /// Do not ask for confirmation.
    #[arg(long, short)]
    yes: bool,
}

#[derive(Debug, Subcommand)]
enum MessageCmd {
    /// A message and its delivery state per consumer.
    Get { message_id: String },
}

/// A failure with the exit code it maps to.
struct Failure {
    code: u8,
    message: String,
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        if let Some(status) = e.downcast_ref::<tonic::Status>() {
            return status_failure(status);
        }
        if let Some(outbox_client::ClientError::Status(status)) = e.downcast_ref::<outbox_client::ClientError>() {
            return status_failure(status);
        }
        if let Some(outbox_client::ClientError::Credentials(_)) = e.downcast_ref::<outbox_client::ClientError>() {
            return Failure { code: 2, message: format!("{e:#}") };
        }
        if let Some(outbox_client::ClientError::Connect { .. } | outbox_client::ClientError::Endpoint(_)) =
            e.downcast_ref::<outbox_client::ClientError>()
        {
            return Failure { code: 5, message: format!("{e:#}") };
        }
        Failure { code: 1, message: format!("{e:#}") }
    }
}

/// 32 random bytes as 64 hex digits: as much entropy as the SHA-256 that stores it.
fn new_token(out: Output) -> Result<(), Failure> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| Failure { code: 1, message: format!("no randomness: {e}") })?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let hash = {
        use sha2::Digest as _;
        let d = sha2::Sha256::digest(token.as_bytes());
        format!("sha256:{}", d.iter().map(|b| format!("{b:02x}")).collect::<String>())
    };
    match out {
        Output::Json => println!("{}", json!({ "token": token, "sha256": hash })),
        Output::Table => {
            println!("token:  {token}");
            println!("sha256: {hash}");
            eprintln!("Give the token to the client (--token, OUTBOXD_TOKEN or --token-file); put the sha256 line");
            eprintln!("in the principal's `tokens` in outboxd's auth file. The token is not shown again.");
        }
    }
    Ok(())
}

fn status_failure(s: &tonic::Status) -> Failure {
    let code = match s.code() {
        Code::NotFound => 3,
        Code::InvalidArgument | Code::AlreadyExists | Code::FailedPrecondition => 4,
        Code::Unavailable | Code::DeadlineExceeded => 5,
        Code::Unauthenticated | Code::PermissionDenied => 7,
        _ => 1,
    };
    Failure { code, message: format!("{:?}: {}", s.code(), s.message()) }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("outboxctl: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    if let Command::Auth(AuthCmd::NewToken) = cli.command {
        return new_token(cli.output);
    }
    let creds = outbox_client::Credentials::from(cli.credentials);
    let server = cli.server.clone();
    let unreachable = |e: outbox_client::ClientError| Failure {
        code: 5,
        message: format!(
            "cannot reach outboxd at {server} ({}): is it running? check --server or OUTBOXD_SERVER",
            root_cause(&e)
        ),
    };
    let out = cli.output;
    match cli.command {
        Command::Publish(args) => {
            let client = grpc::outbox_with(&cli.server, &creds).await.map_err(unreachable)?;
            return publish(client, out, args).await;
        }
        Command::Consume(args) => {
            let client = grpc::outbox_with(&cli.server, &creds).await.map_err(unreachable)?;
            return consume(client, out, args).await;
        }
        _ => {}
    }
    let mut admin = grpc::admin_with(&cli.server, &creds).await.map_err(unreachable)?;
    match cli.command {
        Command::Publish(_) | Command::Consume(_) => Ok(()),
        Command::Consumers(cmd) => consumers(&mut admin, out, cmd).await,
        Command::Stats { consumer, watch, interval } => loop {
            let stats = admin.get_stats(pb::GetStatsRequest { consumer: consumer.clone().unwrap_or_default() }).await;
            let stats = stats.map_err(|s| status_failure(&s))?.into_inner();
            if watch && out == Output::Table && std::io::stdout().is_terminal() {
                print!("\x1b[2J\x1b[H");
            }
            print_stats(out, &stats);
            if !watch {
                return Ok(());
            }
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return Ok(()),
                _ = tokio::time::sleep(interval) => {}
            }
        },
        Command::DeadLetters(cmd) => dead_letters(&mut admin, out, cmd).await,
        Command::Replay(args) => replay(&mut admin, out, args).await,
        Command::Keys(cmd) => keys(&mut admin, out, cmd).await,
        Command::Auth(AuthCmd::NewToken) => new_token(out),
        Command::Tail { topics } => {
            let mut stream = admin.tail(pb::TailRequest { topics }).await.map_err(|s| status_failure(&s))?.into_inner();
            loop {
                let next = tokio::select! {
                    _ = tokio::signal::ctrl_c() => return Ok(()),
                    m = stream.message() => m.map_err(|s| status_failure(&s))?,
                };
                let Some(m) = next else { return Ok(()) };
                if out == Output::Json {
                    println!("{}", message_json(&m));
                } else {
                    println!(
                        "{}  #{}  {}  {}  {}  {}",
                        fmt_time(m.enqueued_at.as_ref()),
                        m.seq,
                        m.topic,
                        m.r#type,
                        m.message_id,
                        payload_text(&m.payload)
                    );
                }
                let _ = std::io::stdout().flush();
            }
        }
        Command::Message(MessageCmd::Get { message_id }) => {
            let m = admin.get_message(pb::GetMessageRequest { message_id }).await.map_err(|s| status_failure(&s))?;
            print_message(out, &m.into_inner(), None);
            Ok(())
        }
    }
}

fn pb_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: t.timestamp(), nanos: t.timestamp_subsec_nanos() as i32 }
}

fn fmt_duration(d: Option<&prost_types::Duration>) -> String {
    match d {
        Some(d) if d.seconds > 0 || d.nanos > 0 => {
            let ms = d.seconds as u64 * 1000 + (d.nanos as u64) / 1_000_000;
            humantime::format_duration(Duration::from_millis(ms)).to_string()
        }
        _ => "-".to_owned(),
    }
}

fn secs(d: Option<&prost_types::Duration>) -> Value {
    d.map_or(Value::Null, |d| json!(d.seconds as f64 + f64::from(d.nanos) / 1e9))
}

fn fmt_time(t: Option<&prost_types::Timestamp>) -> String {
    t.and_then(|t| DateTime::from_timestamp(t.seconds, t.nanos as u32))
        .map_or_else(|| "-".to_owned(), |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

fn time_json(t: Option<&prost_types::Timestamp>) -> Value {
    match t {
        Some(_) => json!(fmt_time(t)),
        None => Value::Null,
    }
}

/// `n deliveries`, or `1 delivery`.
fn deliveries(n: i64) -> String {
    if n == 1 { "1 delivery".to_owned() } else { format!("{n} deliveries") }
}

/// The innermost cause of an error, once (transport errors repeat their own text in layers),
/// as a cause in a sentence: `connection refused`, without the `(os error 111)`.
fn root_cause(e: &dyn std::error::Error) -> String {
    let mut last = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        last = s.to_string();
        source = s.source();
    }
    if let Some(i) = last.rfind(" (os error ")
        && last.ends_with(')')
    {
        last.truncate(i);
    }
    let mut chars = last.chars();
    match (chars.next(), chars.next()) {
        (Some(first), Some(second)) if first.is_uppercase() && second.is_lowercase() => {
            first.to_lowercase().chain(last[first.len_utf8()..].chars()).collect()
        }
        _ => last,
    }
}

/// `outboxctl publish`: one Enqueue.
async fn publish(mut client: grpc::OutboxClient, out: Output, a: PublishArgs) -> Result<(), Failure> {
    let invalid = |message: String| Failure { code: 4, message };
    let payload = match a.payload.as_str() {
        "-" => {
            let mut buf = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut buf)
                .map_err(|e| invalid(format!("--payload -: reading standard input: {e}")))?;
            buf
        }
        p if p.starts_with('@') => {
            std::fs::read(&p[1..]).map_err(|e| invalid(format!("--payload {p}: cannot read the file: {e}")))?
        }
        p => p.as_bytes().to_vec(),
    };
    let mut headers = std::collections::HashMap::new();
    for h in &a.headers {
        let (k, v) = h.split_once('=').ok_or_else(|| invalid(format!("--header {h:?}: expected KEY=VALUE")))?;
        headers.insert(k.to_owned(), v.to_owned());
    }
    let req = pb::EnqueueRequest {
        topic: a.topic,
        r#type: a.type_,
        payload,
        headers,
        message_id: a.id,
        ordering_key: a.key,
        ..Default::default()
    };
    let done = client.enqueue(req).await.map_err(|s| status_failure(&s))?.into_inner();
    if out == Output::Json {
        println!("{}", json!({ "message_id": done.message_id, "seq": done.seq, "duplicate": done.duplicate }));
    } else if done.duplicate {
        println!("{} (seq {}) already existed: nothing was enqueued", done.message_id, done.seq);
    } else {
        println!("{} (seq {})", done.message_id, done.seq);
    }
    Ok(())
}

/// `outboxctl consume`: a Subscribe stream that prints each delivery and acks (or nacks) it.
async fn consume(mut client: grpc::OutboxClient, out: Output, a: ConsumeArgs) -> Result<(), Failure> {
    use pb::subscribe_request::Request;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let start = pb::Start { consumer: a.consumer.clone(), max_in_flight: a.max_in_flight, ack_deadline: None };
    let _ = tx.send(pb::SubscribeRequest { request: Some(Request::Start(start)) }).await;
    let mut stream = client
        .subscribe(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|s| status_failure(&s))?
        .into_inner();
    let mut taken = 0u64;
    while a.max.is_none_or(|max| taken < max) {
        let next = tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tokio::time::sleep(a.idle.unwrap_or(Duration::MAX)), if a.idle.is_some() => break,
            m = stream.message() => m.map_err(|s| status_failure(&s))?,
        };
        let Some(pb::SubscribeResponse { response: Some(pb::subscribe_response::Response::Delivery(d)) }) = next else {
            break;
        };
        taken += 1;
        if out == Output::Json {
            println!(
                "{}",
                json!({
                    "message_id": d.message_id, "seq": d.seq, "topic": d.topic, "type": d.r#type,
                    "payload": payload_text(&d.payload), "headers": d.headers, "ordering_key": d.ordering_key,
                    "delivery_count": d.delivery_count, "acked": !a.nack,
                })
            );
        } else {
            println!(
                "#{}  {}  {}  {}  (delivery {})  {}",
                d.seq,
                d.topic,
                d.r#type,
                d.message_id,
                d.delivery_count,
                payload_text(&d.payload)
            );
        }
        let _ = std::io::stdout().flush();
        let answer = if a.nack {
            Request::Nack(pb::Nack {
                message_id: d.message_id,
                error: "nacked by outboxctl consume".into(),
                retry_after: None,
            })
        } else {
            Request::Ack(pb::Ack { message_ids: vec![d.message_id] })
        };
        let _ = tx.send(pb::SubscribeRequest { request: Some(answer) }).await;
    }
    // Closing the request side lets outboxd apply the last acks and release what it sent but
    // was not printed, then end the stream.
    drop(tx);
    let drained =
        tokio::time::timeout(Duration::from_secs(5), async { while let Ok(Some(_)) = stream.message().await {} });
    let _ = drained.await;
    Ok(())
}

fn payload_text(p: &[u8]) -> String {
    match std::str::from_utf8(p) {
        Ok(s) => s.to_owned(),
        Err(_) => format!("<{} bytes of binary>", p.len()),
    }
}

fn confirm(question: &str, yes: bool) -> Result<(), Failure> {
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(Failure { code: 6, message: format!("{question} Refusing without a terminal; pass --yes") });
    }
    print!("{question} [y/N] ");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    if matches!(line.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err(Failure { code: 6, message: "not confirmed".to_owned() })
    }
}

fn consumer_json(c: &pb::Consumer) -> Value {
    json!({
        "name": c.name,
        "topics": c.topics,
        "max_deliveries": c.max_deliveries,
        "backoff_base_s": secs(c.backoff_base.as_ref()),
        "backoff_max_s": secs(c.backoff_max.as_ref()),
        "ack_deadline_s": secs(c.ack_deadline.as_ref()),
        "paused": c.paused,
        "start_from": if c.start_from == pb::consumer::StartFrom::Earliest as i32 { "EARLIEST" } else { "NEW" },
        "created_at": time_json(c.created_at.as_ref()),
        "sink": c.sink.as_ref().map(sink_json),
        "dead_key_policy": dead_key_policy_text(c.dead_key_policy),
    })
}

fn print_consumers(out: Output, cs: &[pb::Consumer]) {
    if out == Output::Json {
        println!("{}", Value::Array(cs.iter().map(consumer_json).collect()));
        return;
    }
    let mut t = Table::new();
    t.load_style(comfy_table::presets::NOTHING);
    t.set_header([
        "NAME",
        "TOPICS",
        "MAX DELIVERIES",
        "BACKOFF",
        "ACK DEADLINE",
        "PAUSED",
        "START",
        "DEAD KEY",
        "SINK",
    ]);
    for c in cs {
        t.add_row([
            c.name.clone(),
            c.topics.join(","),
            c.max_deliveries.to_string(),
            format!("{}..{}", fmt_duration(c.backoff_base.as_ref()), fmt_duration(c.backoff_max.as_ref())),
            fmt_duration(c.ack_deadline.as_ref()),
            c.paused.to_string(),
            if c.start_from == pb::consumer::StartFrom::Earliest as i32 { "EARLIEST" } else { "NEW" }.to_owned(),
            dead_key_policy_text(c.dead_key_policy).to_owned(),
            sink_text(c.sink.as_ref()),
        ]);
    }
    println!("{t}");
}

async fn consumers(admin: &mut AdminClient, out: Output, cmd: ConsumersCmd) -> Result<(), Failure> {
    let st = |s: tonic::Status| status_failure(&s);
    let one = match cmd {
        ConsumersCmd::List => {
            let list = admin.list_consumers(pb::ListConsumersRequest {}).await.map_err(st)?.into_inner();
            print_consumers(out, &list.consumers);
            return Ok(());
        }
        ConsumersCmd::Get { name } => {
            admin.get_consumer(pb::GetConsumerRequest { consumer: name }).await.map_err(st)?.into_inner().consumer
        }
        ConsumersCmd::Create(a) => {
            let sink = a.sink.to_pb()?;
            let c = pb::Consumer {
                name: a.name,
                topics: a.topics,
                max_deliveries: a.max_deliveries,
                backoff_base: Some(pb_duration(a.backoff_base)),
                backoff_max: Some(pb_duration(a.backoff_max)),
                ack_deadline: Some(pb_duration(a.ack_deadline)),
                start_from: match a.start_from {
                    StartFrom::New => pb::consumer::StartFrom::New as i32,
                    StartFrom::Earliest => pb::consumer::StartFrom::Earliest as i32,
                },
                sink,
                dead_key_policy: match a.dead_key_policy {
                    DeadKeyPolicy::Skip => pb::DeadKeyPolicy::Skip as i32,
                    DeadKeyPolicy::Hold => pb::DeadKeyPolicy::Hold as i32,
                },
                ..Default::default()
            };
            admin
                .create_consumer(pb::CreateConsumerRequest { consumer: Some(c) })
                .await
                .map_err(st)?
                .into_inner()
                .consumer
        }
        ConsumersCmd::Delete { name, yes } => {
            confirm(&format!("Delete consumer {name:?} and its inbox (including dead letters)?"), yes)?;
            admin.delete_consumer(pb::DeleteConsumerRequest { consumer: name.clone() }).await.map_err(st)?;
            if out == Output::Json {
                println!("{}", json!({ "deleted": name }));
            } else {
                println!("deleted {name}");
            }
            return Ok(());
        }
        ConsumersCmd::Pause { name } => {
            admin.pause_consumer(pb::PauseConsumerRequest { consumer: name }).await.map_err(st)?.into_inner().consumer
        }
        ConsumersCmd::Resume { name } => {
            admin.resume_consumer(pb::ResumeConsumerRequest { consumer: name }).await.map_err(st)?.into_inner().consumer
        }
    };
    print_consumers(out, one.as_slice());
    Ok(())
}

fn held_key_json(k: &pb::HeldKey) -> Value {
    json!({
        "ordering_key": k.ordering_key,
        "message_id": k.message_id,
        "last_error": k.last_error,
        "waiting": k.waiting,
        "held_at": time_json(k.held_at.as_ref()),
    })
}

async fn keys(admin: &mut AdminClient, out: Output, cmd: KeysCmd) -> Result<(), Failure> {
    let st = |s: tonic::Status| status_failure(&s);
    match cmd {
        KeysCmd::List { consumer } => {
            let r = admin.list_held_keys(pb::ListHeldKeysRequest { consumer }).await.map_err(st)?.into_inner();
            if out == Output::Json {
                println!(
                    "{}",
                    json!({ "keys": r.keys.iter().map(held_key_json).collect::<Vec<_>>(), "truncated": r.truncated })
                );
                return Ok(());
            }
            let mut t = Table::new();
            t.load_style(comfy_table::presets::NOTHING);
            t.set_header(["KEY", "DEAD MESSAGE", "WAITING", "HELD SINCE", "LAST ERROR"]);
            for k in &r.keys {
                t.add_row([
                    k.ordering_key.clone(),
                    k.message_id.clone(),
                    k.waiting.to_string(),
                    fmt_time(k.held_at.as_ref()),
                    k.last_error.clone(),
                ]);
            }
            println!("{t}");
            if r.truncated {
                eprintln!("(the first {} held keys; more are held)", r.keys.len());
            }
        }
        KeysCmd::Release { consumer, key, skip_dead } => {
            let r = admin
                .release_key(pb::ReleaseKeyRequest { consumer: consumer.clone(), ordering_key: key.clone(), skip_dead })
                .await
                .map_err(st)?
                .into_inner();
            let k = r.key.unwrap_or_default();
            if out == Output::Json {
                println!("{}", json!({ "released": held_key_json(&k), "skip_dead": skip_dead }));
            } else if skip_dead {
                println!(
                    "released key {key:?} of {consumer}: {} waiting go on without dead message {}",
                    k.waiting, k.message_id
                );
            } else {
                println!(
                    "released key {key:?} of {consumer}: dead message {} is delivered again first, then {} waiting",
                    k.message_id, k.waiting
                );
            }
        }
    }
    Ok(())
}

fn print_stats(out: Output, s: &pb::GetStatsResponse) {
    if out == Output::Json {
        let consumers: Vec<Value> = s
            .consumers
            .iter()
            .map(|c| {
                json!({
                    "consumer": c.consumer,
                    "backlog": c.backlog,
                    "in_flight": c.in_flight,
                    "retrying": c.retrying,
                    "dead": c.dead,
                    "acked": c.acked,
                    "oldest_unacked_age_s": secs(c.oldest_unacked_age.as_ref()),
                    "paused": c.paused,
                    "streams": c.streams,
                    "sink": c.sink,
                    "held_keys": c.held_keys,
                })
            })
            .collect();
        println!(
            "{}",
            json!({
                "unrelayed": s.unrelayed,
                "oldest_unrelayed_age_s": secs(s.oldest_unrelayed_age.as_ref()),
                "consumers": consumers,
                "tables": s.tables.iter().map(|t| json!({
                    "table": t.table,
                    "live_rows": t.live_rows,
                    "dead_rows": t.dead_rows,
                    "bytes": t.bytes,
                    "last_vacuum": time_json(t.last_vacuum.as_ref()),
                })).collect::<Vec<_>>(),
                "vacuum_horizon": s.vacuum_horizon.as_ref().map(|h| json!({
                    "kind": h.kind,
                    "age_s": secs(h.age.as_ref()),
                    "xmin_age": h.xmin_age,
                    "pid": h.pid,
                    "application_name": h.application_name,
                    "state": h.state,
                    "name": h.name,
                })),
            })
        );
        return;
    }
    println!("unrelayed: {}   oldest unrelayed: {}", s.unrelayed, fmt_duration(s.oldest_unrelayed_age.as_ref()));
    let mut t = Table::new();
    t.load_style(comfy_table::presets::NOTHING);
    t.set_header([
        "CONSUMER",
        "BACKLOG",
        "IN FLIGHT",
        "RETRYING",
        "DEAD",
        "OLDEST UNACKED",
        "ACKED",
        "STREAMS",
        "PAUSED",
        "HELD KEYS",
        "SINK",
    ]);
    for c in &s.consumers {
        t.add_row([
            c.consumer.clone(),
            c.backlog.to_string(),
            c.in_flight.to_string(),
            c.retrying.to_string(),
            c.dead.to_string(),
            fmt_duration(c.oldest_unacked_age.as_ref()),
            c.acked.to_string(),
            c.streams.to_string(),
            c.paused.to_string(),
            c.held_keys.to_string(),
            c.sink.clone(),
        ]);
    }
    println!("{t}");
    if !s.tables.is_empty() {
        let mut t = Table::new();
        t.load_style(comfy_table::presets::NOTHING);
        t.set_header(["TABLE", "LIVE ROWS", "DEAD ROWS", "SIZE", "LAST VACUUM"]);
        for x in &s.tables {
            t.add_row([
                x.table.clone(),
                x.live_rows.to_string(),
                x.dead_rows.to_string(),
                format!("{:.1} MiB", x.bytes as f64 / (1024.0 * 1024.0)),
                fmt_time(x.last_vacuum.as_ref()),
            ]);
        }
        println!();
        println!("{t}");
    }
    if let Some(h) = &s.vacuum_horizon {
        println!();
        println!("vacuum held back by: {}", horizon_line(h));
    }
}

/// Who holds back vacuum, in one line: what it is, for how long, how far behind.
fn horizon_line(h: &pb::VacuumHorizon) -> String {
    let who = match h.kind.as_str() {
        "transaction" if h.application_name.is_empty() => format!("transaction of pid {}", h.pid),
        "transaction" => format!("transaction of pid {} ({})", h.pid, h.application_name),
        "replication_slot" => format!("replication slot {:?}", h.name),
        "prepared_transaction" => format!("prepared transaction {:?}", h.name),
        other => other.to_owned(),
    };
    let state = if h.state.is_empty() { String::new() } else { format!(", {}", h.state) };
    let held = if h.age.is_some() { format!(" for {}", fmt_duration(h.age.as_ref())) } else { String::new() };
    format!("{who}{state}{held}, {} transactions behind", h.xmin_age)
}

fn message_json(m: &pb::Message) -> Value {
    json!({
        "message_id": m.message_id,
        "seq": m.seq,
        "topic": m.topic,
        "type": m.r#type,
        "payload": payload_text(&m.payload),
        "headers": m.headers,
        "ordering_key": m.ordering_key,
        "enqueued_at": time_json(m.enqueued_at.as_ref()),
        "available_at": time_json(m.available_at.as_ref()),
        "relayed_at": time_json(m.relayed_at.as_ref()),
    })
}

fn state_name(s: i32) -> &'static str {
    match pb::delivery_state::State::try_from(s) {
        Ok(pb::delivery_state::State::Pending) => "PENDING",
        Ok(pb::delivery_state::State::Leased) => "LEASED",
        Ok(pb::delivery_state::State::Acked) => "ACKED",
        Ok(pb::delivery_state::State::Dead) => "DEAD",
        Err(_) => "UNKNOWN",
    }
}

fn delivery_json(d: &pb::DeliveryState) -> Value {
    json!({
        "consumer": d.consumer,
        "state": state_name(d.state),
        "delivery_count": d.delivery_count,
        "last_error": d.last_error,
        "created_at": time_json(d.created_at.as_ref()),
        "available_at": time_json(d.available_at.as_ref()),
        "lease_expires_at": time_json(d.lease_expires_at.as_ref()),
        "acked_at": time_json(d.acked_at.as_ref()),
        "dead_at": time_json(d.dead_at.as_ref()),
        "updated_at": time_json(d.updated_at.as_ref()),
    })
}

/// A message and its delivery timeline, for every consumer or just `only`.
fn print_message(out: Output, m: &pb::GetMessageResponse, only: Option<&str>) {
    let deliveries: Vec<&pb::DeliveryState> =
        m.deliveries.iter().filter(|d| only.is_none_or(|c| c == d.consumer)).collect();
    if out == Output::Json {
        println!(
            "{}",
            json!({
                "message": m.message.as_ref().map(message_json),
                "deliveries": deliveries.iter().map(|d| delivery_json(d)).collect::<Vec<_>>(),
            })
        );
        return;
    }
    if let Some(msg) = &m.message {
        println!("message_id:   {}", msg.message_id);
        println!("seq:          {}", msg.seq);
        println!("topic:        {}", msg.topic);
        println!("type:         {}", msg.r#type);
        println!("ordering_key: {}", if msg.ordering_key.is_empty() { "-" } else { &msg.ordering_key });
        println!("enqueued_at:  {}", fmt_time(msg.enqueued_at.as_ref()));
        println!("relayed_at:   {}", fmt_time(msg.relayed_at.as_ref()));
        for (k, v) in &msg.headers {
            println!("header:       {k}: {v}");
        }
        println!("payload:      {}", payload_text(&msg.payload));
    }
    let mut t = Table::new();
    t.load_style(comfy_table::presets::NOTHING);
    t.set_header(["CONSUMER", "STATE", "DELIVERIES", "CREATED", "UPDATED", "ACKED", "DEAD", "LAST ERROR"]);
    for d in deliveries {
        t.add_row([
            d.consumer.clone(),
            state_name(d.state).to_owned(),
            d.delivery_count.to_string(),
            fmt_time(d.created_at.as_ref()),
            fmt_time(d.updated_at.as_ref()),
            fmt_time(d.acked_at.as_ref()),
            fmt_time(d.dead_at.as_ref()),
            d.last_error.clone(),
        ]);
    }
    println!("\n{t}");
}

async fn dead_letters(admin: &mut AdminClient, out: Output, cmd: DeadLettersCmd) -> Result<(), Failure> {
    let st = |s: tonic::Status| status_failure(&s);
    match cmd {
        DeadLettersCmd::List { consumer, limit } => {
            let mut all = Vec::new();
            let mut token = String::new();
            while all.len() < limit {
                let page_size = (limit - all.len()).min(1000) as u32;
                let page = admin
                    .list_dead_letters(pb::ListDeadLettersRequest {
                        consumer: consumer.clone(),
                        page_size,
                        page_token: token,
                    })
                    .await
                    .map_err(st)?
                    .into_inner();
                all.extend(page.dead_letters);
                if page.next_page_token.is_empty() {
                    break;
                }
                token = page.next_page_token;
            }
            if out == Output::Json {
                let rows: Vec<Value> = all
                    .iter()
                    .map(|d| {
                        json!({
                            "message": d.message.as_ref().map(message_json),
                            "consumer": d.consumer,
                            "delivery_count": d.delivery_count,
                            "last_error": d.last_error,
                            "dead_at": time_json(d.dead_at.as_ref()),
                        })
                    })
                    .collect();
                println!("{}", Value::Array(rows));
                return Ok(());
            }
            let mut t = Table::new();
            t.load_style(comfy_table::presets::NOTHING);
            t.set_header(["MESSAGE ID", "TOPIC", "TYPE", "DELIVERIES", "DEAD AT", "LAST ERROR"]);
            for d in &all {
                let m = d.message.clone().unwrap_or_default();
                t.add_row([
                    m.message_id,
                    m.topic,
                    m.r#type,
                    d.delivery_count.to_string(),
                    fmt_time(d.dead_at.as_ref()),
                    d.last_error.clone(),
                ]);
            }
            println!("{t}");
            Ok(())
        }
        DeadLettersCmd::Show { consumer, message_id } => {
            let m = admin.get_message(pb::GetMessageRequest { message_id }).await.map_err(st)?.into_inner();
            if !m.deliveries.iter().any(|d| d.consumer == consumer) {
                return Err(Failure {
                    code: 3,
                    message: format!("consumer {consumer:?} has no delivery of this message"),
                });
            }
            print_message(out, &m, Some(&consumer));
            Ok(())
        }
    }
}

async fn replay(admin: &mut AdminClient, out: Output, a: ReplayArgs) -> Result<(), Failure> {
    let mut what = if !a.ids.is_empty() {
        format!("{} message(s)", a.ids.len())
    } else if a.dead_letters || a.after.is_some() || a.before.is_some() {
        let mut w = if a.dead_letters { "dead letters".to_owned() } else { "messages".to_owned() };
        if a.after.is_some() || a.before.is_some() {
            w += &format!(
                " enqueued from {} to {}",
                a.after.map_or("the beginning".to_owned(), |t| t.to_rfc3339()),
                a.before.map_or("now".to_owned(), |t| t.to_rfc3339())
            );
        }
        w
    } else {
        return Err(Failure { code: 2, message: "replay needs --id, --dead-letters, or --after/--before".to_owned() });
    };
    if !a.types.is_empty() {
        what += &format!(" of type {}", a.types.join(" or "));
    }
    if !a.topics.is_empty() {
        what += &format!(" on {}", a.topics.join(" or "));
    }
    if let Some(e) = &a.last_error {
        what += &format!(" whose last error is {e:?}");
    }
    let req = pb::ReplayRequest {
        consumer: a.consumer.clone(),
        message_ids: a.ids,
        dead_letters: a.dead_letters,
        enqueued_after: a.after.map(timestamp),
        enqueued_before: a.before.map(timestamp),
        dry_run: true,
        allow_beyond_retention: a.allow_beyond_retention,
        types: a.types,
        topics: a.topics,
        max_per_second: a.rate.unwrap_or(0),
        last_error: a.last_error.clone().unwrap_or_default(),
    };
    // Always count first: the dry run also surfaces a refusal (beyond retention) before anything changes.
    let counted = admin.replay(req.clone()).await.map_err(|s| status_failure(&s))?.into_inner();
    let report = |replayed: i64, dry_run: bool, beyond: i64| {
        if out == Output::Json {
            println!(
                "{}",
                json!({ "consumer": a.consumer, "replayed": replayed, "dry_run": dry_run, "beyond_retention": beyond })
            );
        } else if dry_run {
            println!("would replay {} of {what} to {}", deliveries(replayed), a.consumer);
        } else {
            println!("replayed {} to {}", deliveries(replayed), a.consumer);
        }
    };
    if a.dry_run || counted.replayed == 0 {
        report(counted.replayed, true, counted.beyond_retention);
        return Ok(());
    }
    if counted.replayed > a.confirm_above {
        confirm(
            &format!(
                "Replay {} deliveries ({what}) to consumer {:?}? They are delivered again even if acked.",
                counted.replayed, a.consumer
            ),
            a.yes,
        )?;
    }
    let mut stream = admin
        .replay_stream(pb::ReplayRequest { dry_run: false, ..req })
        .await
        .map_err(|s| status_failure(&s))?
        .into_inner();
    // A progress bar on a terminal; scripts get the final line only.
    let bar = (out == Output::Table && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(u64::try_from(counted.replayed).unwrap_or(0));
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} deliveries  {per_sec}  eta {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let mut last = None;
    while let Some(p) = stream.message().await.map_err(|s| status_failure(&s))? {
        if let Some(bar) = &bar {
            bar.set_length(u64::try_from(p.selected).unwrap_or(0));
            bar.set_position(u64::try_from(p.replayed).unwrap_or(0));
        }
        last = Some(p);
    }
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    match last {
        Some(p) if p.done => {
            report(p.replayed, false, p.beyond_retention);
            Ok(())
        }
        p => Err(Failure {
            code: 1,
            message: format!(
                "the replay stopped before its end after {} deliveries; run it again to finish",
                p.map_or(0, |p| p.replayed)
            ),
        }),
    }
}

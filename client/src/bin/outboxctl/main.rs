//! `outboxctl`: operate outboxd through its public gRPC admin API.
//!
//! Exit codes scripts can rely on: 0 success, 1 any other failure, 2 bad command line,
//! 3 not found, 4 invalid argument or already exists, 5 server unreachable or unavailable,
//! 6 a confirmation was refused, 7 not authenticated or not permitted.
mod auth;
mod consume;
mod consumers;
mod dead_letters;
mod failure;
mod format;
mod keys;
mod messages;
mod publish;
mod replay;
mod stats;

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand, ValueEnum};
use outbox_client::grpc::{self};
use outbox_proto::v1 as pb;

use crate::auth::new_token;
use crate::consume::{ConsumeArgs, consume};
use crate::consumers::{ConsumersCmd, consumers};
use crate::dead_letters::{DeadLettersCmd, dead_letters};
use crate::failure::{Failure, root_cause, status_failure};
use crate::format::{fmt_time, payload_text};
use crate::keys::{KeysCmd, keys};
use crate::messages::{message_json, print_message};
use crate::publish::{PublishArgs, publish};
use crate::replay::{ReplayArgs, replay};
use crate::stats::print_stats;

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
enum MessageCmd {
    /// A message and its delivery state per consumer.
    Get { message_id: String },
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

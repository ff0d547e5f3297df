use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser as _;
use outbox_server::app::App;
use outbox_server::clock::SystemClock;
use outbox_server::config::{Cli, Command, RelayArgs, RelayOutput, ServeConfig};
use outbox_server::startup::{Stage, StartupError, one_line};
use outbox_server::{once, store, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = parse_cli();
    if let Command::Healthcheck(args) = &cli.command {
        // No telemetry: a container runtime runs this every few seconds, and only the exit code
        // and one line matter.
        match outbox_server::healthcheck::check(args).await {
            Ok(()) => println!("SERVING"),
            Err(e) => {
                eprintln!("{}", outbox_server::healthcheck::report(&e));
                return ExitCode::FAILURE;
            }
        }
        return ExitCode::SUCCESS;
    }
    // Every failure is one line on stderr, printed here: a configuration mistake is no bug, so
    // it gets no backtrace (ADR 0080). Panics keep theirs.
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(line) => {
            eprintln!("outboxd: {line}");
            ExitCode::FAILURE
        }
    }
}

/// The command line; a mistake in it is one line too when clap says it in one (a value that
/// does not parse), or clap's own usage text when it needs more (a missing argument).
fn parse_cli() -> Cli {
    match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let text = e.render().to_string();
            let lines: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
                .collect();
            match lines.as_slice() {
                [line] => {
                    eprintln!("outboxd: {}", line.strip_prefix("error: ").unwrap_or(line));
                    std::process::exit(e.exit_code())
                }
                _ => e.exit(),
            }
        }
    }
}

/// Runs the command; an error is the line to print.
async fn run(cli: Cli) -> Result<(), String> {
    let mut telemetry =
        telemetry::init(cli.log_format).map_err(|e| format!("cannot set up logs and traces ({})", one_line(&e)))?;
    match cli.command {
        Command::Serve(args) => {
            let config = ServeConfig::try_from(args).map_err(|e| e.to_string())?;
            let mut app = App::build(config, Arc::new(SystemClock)).await.map_err(|e| e.to_string())?;
            tokio::select! {
                r = app.stopped() => r.map_err(|e| format!("the gRPC server stopped ({})", one_line(&e)))?,
                r = shutdown_signal() => {
                    r.map_err(|e| format!("cannot listen for signals ({})", one_line(&e)))?;
                    tracing::info!("shutdown requested; draining streams");
                    app.shutdown().await;
                }
            }
        }
        Command::Healthcheck(_) => {} // answered above, before telemetry
        Command::Migrate(args) => {
            let url = &args.database_url;
            let failed = |stage| move |source| StartupError::Database { url: url.clone(), stage, source }.to_string();
            let store = store::connect(url, 2).await.map_err(failed(Stage::Open))?;
            store.migrate().await.map_err(failed(Stage::Migrate))?;
            tracing::info!("migrations applied");
        }
        Command::Relay(args) => {
            let code = relay_once(&args).await;
            telemetry.shutdown();
            std::process::exit(code);
        }
    }
    telemetry.shutdown();
    Ok(())
}

/// `outboxd relay --once`: prints what moved (stdout) or what failed (stderr), returns the exit code.
async fn relay_once(args: &RelayArgs) -> i32 {
    let clock: outbox_server::clock::SharedClock = Arc::new(SystemClock);
    let auth = match args.auth_file.as_deref().map(outbox_server::grpc::auth::Authenticator::from_file).transpose() {
        Ok(auth) => auth,
        Err(e) => {
            eprintln!("outboxd relay --once: {}", StartupError::from(e));
            return 1;
        }
    };
    let key = match args.sink_key_file.as_deref().map(outbox_server::sinks::sealed::SinkKey::from_file).transpose() {
        Ok(key) => key,
        Err(e) => {
            eprintln!("outboxd relay --once: {}", StartupError::from(e));
            return 1;
        }
    };
    // What failed, when the database did not open or migrate; the pass's own errors say it.
    let mut stage = Some(Stage::Open);
    let url = &args.database.database_url;
    let result = async {
        let store = store::connect(url, 4).await?;
        if !args.no_migrate {
            stage = Some(Stage::Migrate);
            store.migrate().await?;
        }
        stage = None;
        let destinations = outbox_server::sinks::destination::Destinations {
            allow_private: args.sink_allow_private,
            allowed: args.sink_allow.clone().into(),
        };
        let owners = auth.as_ref().map(|a| a as &dyn outbox_server::sinks::supervisor::SinkOwners);
        let report = once::run(&store, &clock, args.batch, !args.no_sinks, destinations, owners, key.as_ref()).await;
        store.close().await;
        report
    }
    .await;
    let error_line = |e: &store::StoreError| match stage {
        Some(stage) => outbox_server::startup::database(url, stage, e),
        None => e.to_string(),
    };
    let code = once::exit_code(&result);
    match (&result, args.output) {
        (Ok(report), RelayOutput::Json) => {
            println!("{}", serde_json::to_string(report).unwrap_or_else(|_| "{}".to_owned()))
        }
        (Ok(report), RelayOutput::Text) => println!("{}", report.text()),
        (Err(e), RelayOutput::Json) => {
            let kind = if e.is_unreachable() { "database_unreachable" } else { "error" };
            println!("{}", serde_json::json!({ "error": error_line(e), "kind": kind }));
        }
        (Err(e), RelayOutput::Text) => eprintln!("outboxd relay --once: {}", error_line(e)),
    }
    code
}

async fn shutdown_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}

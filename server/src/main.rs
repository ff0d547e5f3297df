use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser as _;
use outbox_server::app::App;
use outbox_server::clock::SystemClock;
use outbox_server::config::{Cli, Command, RelayArgs, RelayOutput, ServeConfig};
use outbox_server::{once, store, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Command::Healthcheck(args) = &cli.command {
        // No telemetry: a container runtime runs this every few seconds, and only the exit code
        // and one line matter.
        match outbox_server::healthcheck::check(args).await {
            Ok(()) => println!("SERVING"),
            Err(e) => {
                eprintln!("{}", outbox_server::healthcheck::report(&e));
                std::process::exit(1);
            }
        }
        return Ok(());
    }
    let mut telemetry = telemetry::init(cli.log_format).context("setting up logs and traces")?;
    match cli.command {
        Command::Serve(args) => {
            let config = ServeConfig::try_from(args)?;
            let (store, location) = describe(&config.database_url);
            let sec = &config.security;
            tracing::info!(
                store, location = %location, listen = %config.listen, tls = sec.tls.is_some(),
                mtls = sec.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
                auth_file = ?sec.auth_file, "starting outboxd on {store}"
            );
            let mut app = App::build(config, Arc::new(SystemClock)).await.context("starting outboxd")?;
            tokio::select! {
                r = app.stopped() => { r.context("gRPC server stopped")?; }
                r = shutdown_signal() => {
                    r.context("listening for signals")?;
                    tracing::info!("shutdown requested; draining streams");
                    app.shutdown().await;
                }
            }
        }
        Command::Healthcheck(_) => {} // answered above, before telemetry
        Command::Migrate(args) => {
            let store = store::connect(&args.database_url, 2).await.context("opening the database")?;
            store.migrate().await.context("applying migrations")?;
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
            eprintln!("outboxd relay --once: --auth-file: {e}");
            return 1;
        }
    };
    let key = match args.sink_key_file.as_deref().map(outbox_server::sinks::sealed::SinkKey::from_file).transpose() {
        Ok(key) => key,
        Err(e) => {
            eprintln!("outboxd relay --once: {e}");
            return 1;
        }
    };
    let result = async {
        let store = store::connect(&args.database.database_url, 4).await?;
        if !args.no_migrate {
            store.migrate().await?;
        }
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
    let code = once::exit_code(&result);
    match (&result, args.output) {
        (Ok(report), RelayOutput::Json) => {
            println!("{}", serde_json::to_string(report).unwrap_or_else(|_| "{}".to_owned()))
        }
        (Ok(report), RelayOutput::Text) => println!("{}", report.text()),
        (Err(e), RelayOutput::Json) => {
            let kind = if e.is_unreachable() { "database_unreachable" } else { "error" };
            println!("{}", serde_json::json!({ "error": e.to_string(), "kind": kind }));
        }
        (Err(e), RelayOutput::Text) => eprintln!("outboxd relay --once: {e}"),
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

/// The store kind and where it is, for the first log line; no credentials.
fn describe(url: &str) -> (&'static str, String) {
    if let Some(path) = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")) {
        ("sqlite", path.to_owned())
    } else {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let host_db = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
        ("postgres", host_db.split('?').next().unwrap_or(host_db).to_owned())
    }
}

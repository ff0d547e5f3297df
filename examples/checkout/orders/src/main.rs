//! Orders, the checkout saga's first service: takes orders over HTTP and runs their saga, as an
//! orchestrator (`--style orchestration`) or as one dancer of a choreography
//! (`--style choreography`). Its tables are in schema `orders`; it talks to nothing but its
//! database and outboxd: it enqueues in its own transactions and acks in them.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use outbox_client::{Credentials, Subscriber, SubscriberConfig};
use tokio_util::sync::CancellationToken;

mod app;
mod db;
mod http;
mod pause;
mod saga;

#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// The PostgreSQL database shared with outboxd (Orders' tables are in schema `orders`).
    #[arg(long, env = "DATABASE_URL")]
    database_url: String,
    /// outboxd's gRPC address: `http://host:port`, or `https://host:port` for TLS.
    #[arg(long, env = "OUTBOXD_SERVER", default_value = "http://127.0.0.1:50051")]
    outboxd: String,
    /// A bearer token for outboxd.
    #[arg(long, env = "OUTBOXD_TOKEN", hide_env_values = true)]
    outboxd_token: Option<String>,
    /// CA certificates (PEM) outboxd's certificate must chain to.
    #[arg(long, env = "OUTBOXD_TLS_CA")]
    outboxd_tls_ca: Option<PathBuf>,
    /// Where the HTTP API listens.
    #[arg(long, env = "ORDERS_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The saga style of new orders; orders keep the style they were placed in.
    #[arg(long, env = "CHECKOUT_STYLE", value_enum, default_value_t = saga::Style::Orchestration)]
    style: saga::Style,
    /// The outboxd consumer Orders subscribes as (created beforehand, see run.sh).
    #[arg(long, env = "ORDERS_CONSUMER", default_value = "orders")]
    consumer: String,
    /// Saga messages handled at once.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    concurrency: u16,
}

async fn shutdown_signal(stop: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    tracing::info!("stopping");
    stop.cancel();
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,sqlx=warn".into()),
        )
        .init();
    let args = Args::parse();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(u32::from(args.concurrency) + 4)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&args.database_url)
        .await
        .context("cannot connect to DATABASE_URL")?;
    db::apply_schema(&pool).await.context("cannot create the orders schema")?;
    let pause = pause::Pause::from_env();
    if let Some(p) = &pause {
        tracing::warn!(
            step = p.step(),
            phase = p.phase(),
            "CHECKOUT_TEST_PAUSE is set: a test hook holds that step in flight"
        );
    }
    let app = Arc::new(app::App { pool, style: args.style, pause });

    let stop = CancellationToken::new();
    tokio::spawn(shutdown_signal(stop.clone()));

    let mut config = SubscriberConfig::new(args.outboxd.clone(), args.consumer.clone());
    config.concurrency = usize::from(args.concurrency);
    config.max_in_flight = u32::from(args.concurrency) * 2;
    config.credentials =
        Credentials { token: args.outboxd_token, tls_ca: args.outboxd_tls_ca, ..Credentials::default() };
    let handler_app = app.clone();
    let subscriber = Subscriber::new(config).run(
        move |d| {
            let app = handler_app.clone();
            async move { app.handle(d).await }
        },
        stop.clone(),
    );

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    tracing::info!(listen = %args.listen, style = args.style.as_str(), outboxd = %args.outboxd, "orders serving");
    let server_stop = stop.clone();
    let server =
        axum::serve(listener, http::router(app)).with_graceful_shutdown(async move { server_stop.cancelled().await });

    let (served, subscribed) = tokio::join!(
        async {
            let r = server.await;
            stop.cancel();
            r
        },
        async {
            let r = subscriber.await;
            stop.cancel();
            r
        }
    );
    subscribed.context("the subscription to outboxd ended")?;
    served.context("the HTTP server failed")?;
    Ok(())
}

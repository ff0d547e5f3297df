//! Builds and runs the whole server: store, gRPC services, background loops, shutdown.
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use outbox_proto::v1::outbox_admin_server::OutboxAdminServer;
use outbox_proto::v1::outbox_server::OutboxServer;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::service::Routes;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::server::HealthReporter;

use crate::clock::SharedClock;
use crate::config::ServeConfig;
use crate::delivery::session::SessionContext;
use crate::grpc::admin::AdminService;
use crate::grpc::auth::{AuthLayer, Authenticator};
use crate::grpc::convert::Limits;
use crate::grpc::outbox::OutboxService;
use crate::hub::Hub;
use crate::listen::{ConnectionLimit, ListenerLimits};
use crate::maintenance::pruner::Pruner;
use crate::maintenance::replay::Replayer;
use crate::maintenance::sweeper::LeaseSweeper;
use crate::relay::{Relay, RelayConfig};
use crate::sinks::supervisor::SinkSupervisor;
use crate::startup::{Listener, Place, Stage, StartupError};
use crate::store::{self, SharedStore};
use crate::tls::TlsState;

/// A running server. Dropping it does not stop it: call [`App::shutdown`].
#[derive(Debug)]
pub struct App {
    local_addr: SocketAddr,
    store: SharedStore,
    shutdown: CancellationToken,
    loops: CancellationToken,
    /// Sessions, tails and replays: drained before the loops stop.
    stream_tasks: TaskTracker,
    drain_timeout: Duration,
    health: HealthReporter,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    tasks: JoinSet<()>,
}

/// How long after the drain timeout shutdown still waits for stream tasks to finish.
const STREAM_TASK_GRACE: Duration = Duration::from_secs(5);

const SERVICES: [&str; 3] = ["", "outbox.v1.Outbox", "outbox.v1.OutboxAdmin"];

/// The largest health request or answer (a service name and a status): anything larger is
/// refused before it is buffered, since health answers anyone.
const HEALTH_MAX_DECODE: usize = 1024;
/// Streams on one connection of `--health-listen` (health checks and watches only).
const HEALTH_MAX_STREAMS: u32 = 16;
/// The largest admin answer (a dead-letter page is cut at 4 MiB of payloads, plus one message of
/// at most --max-payload-bytes).
const ADMIN_MAX_ENCODE: usize = 64 * 1024 * 1024;
/// The largest reflection request (a file or symbol name).
const REFLECTION_MAX_DECODE: usize = 64 * 1024;
/// HTTP/2 headers of one request, together (a token and gRPC's own are well under 8 KiB).
const MAX_HEADER_LIST_BYTES: u32 = 64 * 1024;
/// Connections the main port takes beyond --max-client-connections, served health checks only:
/// a prober is answered while an attack holds every general place (ADR 0075).
const HEALTH_RESERVED_CONNECTIONS: usize = 16;

/// Serves health checks, and nothing else, on `incoming` until `stop`: the plaintext health
/// listener, and the main port's connections that found only a place kept for health.
async fn serve_health_only<T, I, IO>(
    health: tonic_health::pb::health_server::HealthServer<T>,
    incoming: I,
    limit: ConnectionLimit,
    body_timeout: Duration,
    stop: CancellationToken,
) where
    T: tonic_health::pb::health_server::Health,
    I: tokio_stream::Stream<Item = std::io::Result<IO>>,
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + tonic::transport::server::Connected + Unpin + Send + 'static,
{
    let served = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .max_concurrent_streams(HEALTH_MAX_STREAMS)
        .http2_max_header_list_size(Some(MAX_HEADER_LIST_BYTES))
        .layer(limit.health_only_layer())
        .layer(crate::limits::BodyDeadlineLayer { timeout: body_timeout })
        .add_service(health)
        .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
        .await;
    if let Err(e) = served {
        tracing::warn!(error = %e, "health server failed");
    }
}

/// Warns when the process may open fewer files than its listeners may hold connections: a
/// connection is a file descriptor, and a process out of them refuses everyone (the database
/// and the auth file's reloads included), not only new clients. Linux reports the limit in
/// /proc/self/limits; elsewhere nothing is said.
fn warn_if_few_descriptors(config: &ServeConfig) {
    let Ok(limits) = std::fs::read_to_string("/proc/self/limits") else { return };
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<usize>().ok());
    let listeners = 1 + usize::from(config.health_listen.is_some());
    let wanted = (config.limits.max_client_connections + HEALTH_RESERVED_CONNECTIONS) * listeners
        + crate::console::MAX_CONNECTIONS.min(config.limits.max_client_connections)
        + 256;
    if let Some(soft) = soft
        && soft < wanted
    {
        tracing::warn!(
            open_files = soft,
            wanted,
            "the process may open {soft} files, fewer than its listeners may hold connections: raise its \
             limit (ulimit -n, LimitNOFILE=, the container's nofile) or lower --max-client-connections"
        );
    }
}

/// A credential, certificate or key file that does not load stops start-up before anything
/// else is done: a typo is found at once.
struct Credentials {
    auth: Authenticator,
    tls: Option<TlsState>,
    sink_key: Option<Arc<crate::sinks::sealed::SinkKey>>,
}

impl Credentials {
    fn load(config: &ServeConfig) -> Result<Self, StartupError> {
        let auth = match &config.security.auth_file {
            Some(path) => Authenticator::from_file(path)?,
            None => Authenticator::open(),
        };
        let tls = config.security.tls.clone().map(TlsState::load).transpose()?;
        let sink_key =
            config.sink_key_file.as_deref().map(crate::sinks::sealed::SinkKey::from_file).transpose()?.map(Arc::new);
        if auth.enabled() && tls.is_none() && !crate::listen::is_loopback(config.listen.ip()) {
            tracing::warn!(listen = %config.listen, "bearer tokens travel in clear text: give --tls-cert and --tls-key unless a proxy in front terminates TLS");
        }
        Ok(Self { auth, tls, sink_key })
    }
}

/// Connects (creating the database if needed), migrates unless told not to, and writes the
/// payload limit for producers that write through SQL.
async fn open_store(config: &ServeConfig) -> Result<SharedStore, StartupError> {
    let database = |stage| {
        let url = config.database_url.clone();
        move |source| StartupError::Database { url, stage, source }
    };
    let store = store::connect(&config.database_url, config.max_connections).await.map_err(database(Stage::Open))?;
    if config.migrate {
        store.migrate().await.map_err(database(Stage::Migrate))?;
    }
    // The payload limit holds for producers that write through SQL too.
    if let Err(e) = store.settings_write(config.max_payload_bytes).await {
        tracing::warn!(error = %e, "cannot write the payload limit for SQL producers (run the migrations)");
    }
    Ok(store)
}

fn bind_error(listener: Listener, addr: SocketAddr) -> impl FnOnce(std::io::Error) -> StartupError {
    move |source| StartupError::Bind { listener, addr, source }
}

/// What the steps of [`App::build`] start: the token that stops serving (streams drain), the
/// one that stops the background loops after that, and the tasks that run until then.
struct Running {
    shutdown: CancellationToken,
    loops: CancellationToken,
    tasks: JoinSet<()>,
}

/// The background loops and what they share with the services.
struct Background {
    store: SharedStore,
    clock: SharedClock,
    hub: Hub,
    relay: Relay,
    sweeper: LeaseSweeper,
    pruner: Pruner,
    sinks: Option<SinkSupervisor>,
}

impl Background {
    fn new(config: &ServeConfig, ctx: &SessionContext) -> Self {
        let (store, clock, hub) = (ctx.store.clone(), ctx.clock.clone(), ctx.hub.clone());
        let relay_defaults = store.relay_defaults();
        let relay = Relay::new(
            store.clone(),
            clock.clone(),
            hub.clone(),
            RelayConfig {
                pass_size: config.relay_pass_size.unwrap_or(relay_defaults.pass_size),
                poll_min: config.relay_poll_min,
                poll_max: config.relay_poll_max,
                hot_for: RelayConfig::default().hot_for,
                notify: config.listen_notify,
                wake_on_commit: config.listen_notify,
                gather: relay_defaults.gather,
            },
        );
        let sweeper = LeaseSweeper::new(store.clone(), clock.clone(), hub.clone(), config.sweep_interval);
        let pruner = Pruner::new(store.clone(), clock.clone(), config.retention, config.prune_interval);
        Self { store, clock, hub, relay, sweeper, pruner, sinks: None }
    }
}

/// Health, serving every service from now on. It is open to anyone: its requests (a service
/// name) are decoded with a tiny limit, so that a declared large message is refused before any
/// of it is buffered.
async fn health() -> (HealthReporter, HealthServer<impl Health>) {
    let (health, health_service) = tonic_health::server::health_reporter();
    let health_service =
        health_service.max_decoding_message_size(HEALTH_MAX_DECODE).max_encoding_message_size(HEALTH_MAX_DECODE);
    for s in SERVICES {
        health.set_service_status(s, ServingStatus::Serving).await;
    }
    (health, health_service)
}

/// The services of the main port, health included, and the sink supervisor, which shares
/// their session context; the console needs the admin service.
fn services<T: Health>(
    config: &ServeConfig,
    ctx: SessionContext,
    health_service: HealthServer<T>,
    credentials: &Credentials,
    background: &mut Background,
) -> Result<(Routes, AdminService), StartupError> {
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(outbox_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| StartupError::Other(format!("cannot set up gRPC reflection ({e})")))?
        .max_decoding_message_size(REFLECTION_MAX_DECODE);
    // Tools that speak only the older protocol (grpcurl before 1.8.7, some IDEs).
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(outbox_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(|e| StartupError::Other(format!("cannot set up gRPC reflection ({e})")))?
        .max_decoding_message_size(REFLECTION_MAX_DECODE);
    let limits = Limits { max_payload_bytes: config.max_payload_bytes, max_batch: config.max_batch };
    // A batch may carry many payloads; each one is still checked against the limit.
    let max_decode = (config.max_payload_bytes + 64 * 1024).saturating_mul(16);
    let streams = crate::limits::StreamLimiter::new(config.limits);
    let outbox = OutboxServer::new(OutboxService { ctx: ctx.clone(), limits, streams: streams.clone() })
        .max_decoding_message_size(max_decode);
    let replayer = Replayer::new(
        background.store.clone(),
        background.clock.clone(),
        background.hub.clone(),
        config.retention,
        config.replay_rate,
    )
    .with_shutdown(ctx.shutdown.clone());
    background.sinks = config.sinks.then(|| {
        SinkSupervisor::new(ctx.clone(), config.sink_poll, config.sink_destinations.clone())
            .with_owners(Arc::new(credentials.auth.clone()))
            .with_key(credentials.sink_key.clone())
    });
    let sink_key = credentials.sink_key.clone();
    let admin_service = AdminService { ctx, pruner: background.pruner.clone(), replayer, streams, sink_key };
    // Admin answers are bounded in bytes where they carry payloads (dead-letter pages); this
    // limit is the backstop for any other: an answer over it is refused, not sent.
    let admin = OutboxAdminServer::new(admin_service.clone()).max_encoding_message_size(ADMIN_MAX_ENCODE);
    let routes = Routes::new(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(outbox)
        .add_service(admin);
    Ok((routes, admin_service))
}

/// The console and its bound listener, when `--console-listen` asks for one.
async fn bind_console(
    config: &ServeConfig,
    admin_service: AdminService,
    credentials: &Credentials,
) -> Result<Option<(crate::console::Console, TcpListener, SocketAddr)>, StartupError> {
    let Some(addr) = config.console_listen else { return Ok(None) };
    let trace_url = config.console_trace_url.clone();
    let sessions = crate::console::SessionTimes { idle: config.console_session_idle, max: config.console_session_max };
    let console = crate::console::Console::new(
        admin_service,
        credentials.auth.clone(),
        credentials.tls.is_some(),
        trace_url,
        addr,
        sessions,
    )
    .map_err(|e| StartupError::Other(format!("no randomness for the console's CSRF key ({e})")))?;
    let listener = TcpListener::bind(addr).await.map_err(bind_error(Listener::Console, addr))?;
    Ok(Some((console, listener, addr)))
}

/// Serves `routes` on the main port until `shutdown`: every request authenticated first, then
/// the limits; a connection that found only a place kept for health is served health alone.
fn serve_grpc<T: Health>(
    config: &ServeConfig,
    listener: TcpListener,
    credentials: &Credentials,
    routes: Routes,
    health_service: HealthServer<T>,
    run: &mut Running,
) -> JoinHandle<Result<(), tonic::transport::Error>> {
    let stop_accepting = run.shutdown.clone();
    let connections = ConnectionLimit::new(ListenerLimits {
        max: config.limits.max_client_connections,
        per_peer: config.limits.max_connections_per_peer,
        health_reserve: HEALTH_RESERVED_CONNECTIONS,
        preface_timeout: config.limits.http2_preface_timeout,
        first_stream_timeout: Some(config.limits.http2_first_stream_timeout),
        http2: true,
    });
    let router = tonic::transport::Server::builder()
        // Half-open connections (a consumer host that vanished) are noticed and their
        // streams released instead of leasing into the void.
        .http2_keepalive_interval(Some(Duration::from_secs(20)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .tcp_keepalive(Some(Duration::from_secs(60)))
        .max_concurrent_streams(config.limits.http2_max_concurrent_streams())
        .http2_max_header_list_size(Some(MAX_HEADER_LIST_BYTES))
        // Outermost first. Every request is authenticated, and refused if its caller holds
        // no permission of the method's kind, from its headers alone, before it takes a
        // place of any limit or a byte of its body is read (health excepted) (ADR 0053).
        .layer(AuthLayer { auth: credentials.auth.clone() })
        .layer(connections.stream_layer())
        .layer(crate::limits::ServiceStreamsLayer::default())
        .layer(crate::limits::UnaryLimitLayer::new(
            config.limits.max_concurrent_requests,
            config.limits.max_requests_per_principal,
        ))
        .layer(crate::limits::BodyDeadlineLayer { timeout: config.limits.request_body_timeout })
        .add_routes(routes);
    let stopped = async move { stop_accepting.cancelled().await };
    let body_timeout = config.limits.request_body_timeout;
    let shutdown = run.shutdown.clone();
    match &credentials.tls {
        Some(tls) => {
            let incoming = tls.clone().incoming(listener, connections.clone(), shutdown.clone());
            let (general, health_only) = crate::listen::split(incoming, shutdown.clone());
            let reserved = serve_health_only(health_service, health_only, connections, body_timeout, shutdown);
            run.tasks.spawn(reserved);
            tokio::spawn(router.serve_with_incoming_shutdown(general, stopped))
        }
        None => {
            let incoming = connections.clone().incoming(listener);
            let (general, health_only) = crate::listen::split(incoming, shutdown.clone());
            let reserved = serve_health_only(health_service, health_only, connections, body_timeout, shutdown);
            run.tasks.spawn(reserved);
            tokio::spawn(router.serve_with_incoming_shutdown(general, stopped))
        }
    }
}

/// Health only, in plaintext, on `--health-listen`, for probes that cannot speak TLS: it shows
/// only whether outboxd serves, which the main port tells anyone anyway. Up until the very end,
/// so that probes see NOT_SERVING while streams drain.
async fn serve_health_listener<T: Health>(
    config: &ServeConfig,
    health_service: HealthServer<T>,
    run: &mut Running,
) -> Result<(), StartupError> {
    let Some(addr) = config.health_listen else { return Ok(()) };
    let listener = TcpListener::bind(addr).await.map_err(bind_error(Listener::Health, addr))?;
    let bound = listener.local_addr().map_err(bind_error(Listener::Health, addr))?;
    let probes = ConnectionLimit::new(ListenerLimits {
        max: config.limits.max_client_connections,
        per_peer: config.limits.max_connections_per_peer,
        health_reserve: 0,
        preface_timeout: config.limits.http2_preface_timeout,
        first_stream_timeout: Some(config.limits.http2_first_stream_timeout),
        http2: true,
    });
    let incoming = probes.clone().incoming(listener);
    let body_timeout = config.limits.request_body_timeout;
    run.tasks.spawn(serve_health_only(health_service, incoming, probes, body_timeout, run.loops.clone()));
    tracing::info!(addr = %bound, "gRPC health (plaintext) served");
    Ok(())
}

/// Serves the console on its own listener, with connection limits of its own.
fn serve_console(
    config: &ServeConfig,
    (console, listener, console_addr): (crate::console::Console, TcpListener, SocketAddr),
    credentials: &Credentials,
    run: &mut Running,
) -> Result<(), StartupError> {
    let bound = listener.local_addr().map_err(bind_error(Listener::Console, console_addr))?;
    let limit = ConnectionLimit::new(ListenerLimits {
        max: config.limits.max_client_connections.min(crate::console::MAX_CONNECTIONS),
        per_peer: config.limits.max_connections_per_peer.min(crate::console::MAX_CONNECTIONS_PER_PEER),
        health_reserve: 0,
        preface_timeout: config.limits.http2_preface_timeout,
        // HTTP/1.1: each request's headers have their own deadline.
        first_stream_timeout: None,
        http2: false,
    });
    if credentials.auth.enabled() && credentials.tls.is_none() && !crate::listen::is_loopback(bound.ip()) {
        tracing::warn!(addr = %bound, "the console's tokens and cookies travel in clear text: give --tls-cert and --tls-key unless a proxy in front terminates TLS");
    }
    run.tasks.spawn(console.clone().sample(run.loops.clone()));
    let tls = credentials.tls.as_ref().map(TlsState::for_http1);
    run.tasks.spawn(console.serve(listener, tls, limit, run.shutdown.clone()));
    tracing::info!(addr = %bound, "console served");
    Ok(())
}

/// Starts the background loops: metrics, the relay, reloads of the TLS and auth files, the
/// sweeper, sinks, the pruner, the vacuum, and the wake-ups of other processes' work.
fn spawn_loops(
    config: &ServeConfig,
    background: Background,
    credentials: Credentials,
    run: &mut Running,
) -> Result<(), StartupError> {
    let Background { store, clock, hub, relay, sweeper, pruner, sinks } = background;
    let (tasks, loops) = (&mut run.tasks, &run.loops);
    if let Some(addr) = config.metrics_listen {
        crate::metrics::install(addr).map_err(|e| StartupError::metrics(addr, e))?;
        let collector = crate::maintenance::gauges::GaugeCollector {
            store: store.clone(),
            clock: clock.clone(),
            hub: hub.clone(),
            interval: config.metrics_interval,
        };
        tasks.spawn(collector.run(loops.clone()));
        tracing::info!(%addr, "metrics at /metrics");
    }
    if config.relay {
        // With a backlog, a second loop overlaps its passes with the first one's round
        // trips; claims skip each other's rows, as those of other replicas.
        tasks.spawn(relay.clone().run(loops.clone()));
        tasks.spawn(relay.clone().run_helper(loops.clone()));
    }
    if let Some(tls) = credentials.tls {
        tasks.spawn(tls.watch(config.security.reload_interval, loops.clone()));
    }
    tasks.spawn(credentials.auth.watch(config.security.reload_interval, loops.clone()));
    tasks.spawn(sweeper.run(loops.clone()));
    if let Some(sinks) = sinks {
        // Each sink drains like a stream when the server shuts down; the supervisor stops
        // with the background loops, after that.
        tasks.spawn(sinks.run(loops.clone()));
    }
    tasks.spawn(pruner.run(loops.clone()));
    if !config.vacuum_interval.is_zero() {
        tasks.spawn(
            crate::maintenance::vacuum::Vacuumer::new(store.clone(), config.vacuum_interval)
                .with_activity(hub.relayed().subscribe())
                .run(loops.clone()),
        );
    }
    if config.listen_notify {
        // The store reports work from other processes; the waking layer wakes whom it names.
        let (hints, hinted) = tokio::sync::mpsc::unbounded_channel();
        let (store, cancel) = (store.clone(), loops.clone());
        tasks.spawn(async move { store.watch(hints, cancel).await });
        tasks.spawn(crate::waking::follow(hub.clone(), hinted));
    }
    Ok(())
}

impl App {
    /// Connects (creating the database if needed), migrates unless told not to, binds the
    /// listener (port 0 picks a free one) and starts serving and the background loops: each
    /// step is a function of its own, in the order they run.
    pub async fn build(config: ServeConfig, clock: SharedClock) -> Result<Self, StartupError> {
        config.validate()?;
        // Credentials and certificates load before anything else: a typo stops start-up here.
        let credentials = Credentials::load(&config)?;
        let store = open_store(&config).await?;
        let listener = TcpListener::bind(config.listen).await.map_err(bind_error(Listener::Grpc, config.listen))?;
        let local_addr = listener.local_addr().map_err(bind_error(Listener::Grpc, config.listen))?;

        let mut run =
            Running { shutdown: CancellationToken::new(), loops: CancellationToken::new(), tasks: JoinSet::new() };
        let stream_tasks = TaskTracker::new();
        let ctx = SessionContext {
            store: store.clone(),
            clock: clock.clone(),
            hub: Hub::default(),
            shutdown: run.shutdown.clone(),
            tasks: stream_tasks.clone(),
            drain_timeout: config.drain_timeout,
            poll_interval: config.stream_poll,
        };
        let mut background = Background::new(&config, &ctx);
        let (health, health_service) = health().await;
        let (routes, admin_service) = services(&config, ctx, health_service.clone(), &credentials, &mut background)?;
        let console = bind_console(&config, admin_service, &credentials).await?;
        let server = serve_grpc(&config, listener, &credentials, routes, health_service.clone(), &mut run);
        serve_health_listener(&config, health_service, &mut run).await?;
        if let Some(console) = console {
            serve_console(&config, console, &credentials, &mut run)?;
        }
        spawn_loops(&config, background, credentials, &mut run)?;
        warn_if_few_descriptors(&config);
        let (store_kind, location) = Place::of(&config.database_url).describe();
        let sec = &config.security;
        tracing::info!(
            %local_addr, store = store_kind, %location, tls = sec.tls.is_some(),
            mtls = sec.tls.as_ref().is_some_and(|t| t.client_ca.is_some()), auth_file = ?sec.auth_file,
            "outboxd serving"
        );
        let Running { shutdown, loops, tasks } = run;
        Ok(Self {
            local_addr,
            store,
            shutdown,
            loops,
            stream_tasks,
            drain_timeout: config.drain_timeout,
            health,
            server,
            tasks,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn store(&self) -> &SharedStore {
        &self.store
    }

    /// Resolves if the gRPC server stops on its own (an error), so `main` can exit.
    pub async fn stopped(&mut self) -> Result<(), tonic::transport::Error> {
        match (&mut self.server).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "gRPC server task failed");
                Ok(())
            }
        }
    }

    /// Graceful shutdown: health turns NOT_SERVING, new connections and streams are refused,
    /// open streams stop receiving new deliveries and get the drain timeout to ack what they
    /// hold, then their remaining leases are released (due at once) and they end with
    /// UNAVAILABLE; last, the relay, sweeper and pruner stop and the pool closes.
    pub async fn shutdown(self) {
        for s in SERVICES {
            self.health.set_service_status(s, ServingStatus::NotServing).await;
        }
        self.shutdown.cancel();
        if !self.server.is_finished() {
            match self.server.await {
                Ok(Err(e)) => tracing::warn!(error = %e, "gRPC server ended with an error"),
                Err(e) => tracing::warn!(error = %e, "gRPC server task failed"),
                Ok(Ok(())) => {}
            }
        }
        // Every stream task has seen the shutdown: sessions release what they hold, tails end,
        // a replay stops after its current batch. One that still runs after the drain timeout
        // (a replay batch stuck on the database) is left behind, not waited for.
        self.stream_tasks.close();
        if tokio::time::timeout(self.drain_timeout + STREAM_TASK_GRACE, self.stream_tasks.wait()).await.is_err() {
            tracing::warn!(running = self.stream_tasks.len(), "stream tasks still running after the drain timeout");
        }
        self.loops.cancel();
        let mut tasks = self.tasks;
        while tasks.join_next().await.is_some() {}
        self.store.close().await;
        tracing::info!("outboxd stopped");
    }
}

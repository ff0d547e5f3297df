//! `outboxd`: the transactional outbox as a service.
//!
//! Producers write messages into `outbox.messages` inside their own database transactions (the
//! `outbox-client` crate, the SQL function `outbox.enqueue`, or the `Enqueue` RPC). This server
//! relays them into per-consumer inbox rows and delivers them over gRPC streams with ack/nack,
//! retries with backoff, dead letters and replay.
//!
//! # Layout
//!
//! Data flows edge → domain → store: the gRPC edge turns requests into domain values, the
//! delivery core and the background loops work on those, and only the store writes SQL.
//!
//! - [`config`]: command line and environment, validated before anything binds.
//! - [`app`]: builds the server ([`app::App::build`]), wires wake-ups, shuts down gracefully.
//! - [`console`]: the web console (`--console-listen`), an edge beside [`grpc`]: pages that read
//!   and act through the admin service as the signed-in principal.
//! - [`grpc`]: the edge. The `Outbox` and `OutboxAdmin` services, wire conversion, error →
//!   status, [`grpc::stream`], which turns each `SubscribeRequest` into a validated command and
//!   each delivery into its wire form, and authentication and permissions ([`grpc::auth`]).
//! - [`domain`]: ids, names, topics and patterns, the retry policy, the delivery states.
//! - [`delivery`]: one `Subscribe` stream: the [`delivery::session`] loop and its in-flight
//!   [`delivery::window`] (held leases, room, expiry, late acks).
//! - [`relay`]: fans committed messages out to matching consumers' inboxes, in batches.
//! - [`once`]: `outboxd relay --once`, one relay pass and one round of sink deliveries for a
//!   scheduler.
//! - [`maintenance`]: the lease sweeper, the pruner (its retention is the dedup horizon),
//!   managed replay, and the vacuum of outboxd's own tables.
//! - [`sinks`]: consumers that outboxd delivers itself: the [`sinks::Target`] seam, one file
//!   per target (RabbitMQ, NATS JetStream, webhooks).
//! - [`hub`]: in-process wake-ups and push slots between the relay, the sweeper and the sessions.
//! - [`store`]: every SQL statement. The [`store::Store`] seam the rest of the server calls;
//!   [`store::driver::Driver`], the narrow entity-first statements each backend implements
//!   (`store::postgres`, with its LISTEN for other replicas' work, and the embedded
//!   `store::sqlite`, each with its migrations); [`store::composite::DriverStore`], `Store`
//!   written once over any driver; [`store::records`], rows decoded into the domain. The store
//!   returns data and [`store::WorkHint`]s; it wakes nobody itself.
//! - [`metrics`]: Prometheus counters, histograms and per-consumer gauges.
//! - [`limits`]: bounds on message and consumer shapes, stream counts (per process, connection
//!   and principal), unary load shedding and per-principal quotas, request-body deadlines.
//! - [`listen`]: accepting connections: a bounded number per listener, each closed unless it
//!   sends HTTP/2's preface in time.
//! - [`tls`]: TLS and mTLS on the gRPC listener, certificates rotated without restarts.
//! - [`reload`]: re-reading the TLS and auth files on a timer and on SIGHUP.
//! - [`telemetry`]: logs, OTLP trace export, the `traceparent` that messages carry.
//! - [`clock`]: system and manual clocks, so tests drive loops without sleeping.
//! - [`healthcheck`]: `outboxd healthcheck`, a gRPC health client for images without a shell.
#![forbid(unsafe_code)]

pub mod app;
pub mod clock;
pub mod config;
pub mod console;
pub mod delivery;
pub mod domain;
pub mod grpc;
pub mod healthcheck;
pub mod hub;
pub mod limits;
pub mod listen;
pub mod maintenance;
pub mod metrics;
pub mod once;
pub mod relay;
pub mod reload;
pub mod sinks;
pub mod store;
pub mod telemetry;
pub mod tls;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

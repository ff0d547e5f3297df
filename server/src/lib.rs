//! `outboxd`: the transactional outbox as a service.
//!
//! Producers write messages into `outbox.messages` inside their own database transactions (the
//! `outbox-client` crate, the SQL function `outbox.enqueue`, or the `Enqueue` RPC). This server
//! relays them into deliveries, one per consumer, and delivers them over gRPC streams with ack/nack,
//! retries with backoff, dead letters and replay.
//!
//! # Layout
//!
//! Data flows edge → domain → store: the gRPC edge turns requests into domain values, the
//! delivery core and the background loops work on those, and only the store writes SQL.
//!
//! The modules are layers, listed from the lowest: each may use the modules listed before it and
//! none listed after it (ADR 0058). This list is the one statement of that order, and
//! `server/tests/architecture.rs` reads it and fails on any `crate::` path, tests included,
//! that reaches from a module to one listed after it.
//!
//! - [`clock`]: system and manual clocks, so tests drive loops without sleeping.
//! - [`domain`]: ids, names, topics and patterns, the retry policy and the one failure rule
//!   ([`domain::Failure`]: retried when, or dead, and why), the delivery states and their
//!   transitions ([`domain::Transition`], T1 to T27, which `docs/delivery-states.md`'s table is
//!   rendered from), and the vocabulary of deliveries that the layers above share: a message as
//!   stored, a leased delivery, a release and which leases it may touch, a stream's push offer, a
//!   relay pass's outcome; and the relay's policy, once for both stores ([`domain::fanout`]: who
//!   gets which message, pushed to a stream or pending, as a range or a row).
//! - `testing`: fresh PostgreSQL databases and SQLite files for tests (built for this crate's
//!   tests and with the `testing` feature).
//! - [`telemetry`]: logs and their format, OTLP trace export, the `traceparent` that messages
//!   carry.
//! - [`metrics`]: the name and description of every metric, the Prometheus exporter, and the
//!   helpers that record counters and histograms; any layer above may record.
//! - [`limits`]: bounds on message and consumer shapes, stream counts (per process, connection
//!   and principal), the byte budget of a principal's deliveries in flight, unary load shedding
//!   and per-principal quotas, request-body deadlines.
//! - [`store`]: every SQL statement. One seam, [`store::Store`]: each backend
//!   (`store::postgres`, with its LISTEN for other replicas' work and the libpq meaning of its
//!   URL's TLS parameters, and the embedded `store::sqlite`, each with its migrations)
//!   implements its narrow entity-first statements; the operations of several statements are
//!   its provided methods, written once over the backend's transaction ([`store::StoreTx`]),
//!   the relay pass among them, over the statements each backend gives for it
//!   ([`store::RelayTx`], ADR 0087);
//!   [`store::records`], rows decoded into the domain. The store returns data and
//!   [`store::WorkHint`]s; it wakes nobody itself.
//! - [`hub`]: in-process coordination between the relay, the sweeper and the sessions, one
//!   protocol a file: wake-ups, lease turns, the room each stream lends the relay and the one
//!   message a pass hands it over in, the push slots a pass offers. It carries wake-ups; it
//!   decides none.
//! - [`waking`]: the store's writes that make work for someone (an enqueue, a relay pass, a
//!   release, an ack that frees an ordering key, a replay, a key released, a consumer resumed,
//!   created or deleted), each waking whom it made work for, as what it wrote and what the
//!   store returned say (ADR 0085); and the store watcher's hints. The layers above write
//!   these through it and never wake anyone themselves; its tests fail on a write that
//!   bypasses it and on one that does not wake.
//! - [`delivery`]: one `Subscribe` stream: the [`delivery::session`] loop, its in-flight
//!   [`delivery::window`] (held leases, room and its lend, expiry, late acks), its
//!   [`delivery::pace`], and the
//!   [`delivery::Command`]s a client gives it.
//! - [`relay`]: the loop that runs relay passes (the store's pass, written once: the store
//!   claims and writes, [`domain::fanout`] decides) and hands pushed deliveries to streams.
//! - [`maintenance`]: the lease sweeper, the pruner (its retention is the dedup horizon),
//!   managed replay, the vacuum of outboxd's own tables, and the gauges read from the store.
//! - [`sinks`]: consumers that outboxd delivers itself: the [`sinks::Target`] seam, one file
//!   per target (RabbitMQ, NATS JetStream, webhooks).
//! - [`reload`]: re-reading the TLS and auth files on a timer and on SIGHUP.
//! - [`listen`]: accepting connections: a bounded number per listener and per client address,
//!   each closed unless it sends HTTP/2's preface and opens a stream in time, or when it floods
//!   PING or SETTINGS frames; places kept for health checks on the gRPC port.
//! - [`tls`]: TLS and mTLS on the gRPC listener, certificates rotated without restarts.
//! - [`grpc`]: the edge. The `Outbox` and `OutboxAdmin` services, wire conversion, error →
//!   status, [`grpc::stream`], which turns each `SubscribeRequest` into a validated command,
//!   each delivery into its wire form and each end of a stream into its status, and
//!   authentication and permissions ([`grpc::auth`]).
//! - [`console`]: the web console (`--console-listen`), an edge beside [`grpc`]: pages that read
//!   and act through the admin service as the signed-in principal, on a listener of their own,
//!   whose request places for signed-in principals are apart from everyone else's.
//! - [`healthcheck`]: `outboxd healthcheck`, a gRPC health client for images without a shell.
//! - [`config`]: command line and environment, validated before anything binds.
//! - [`startup`]: why outboxd did not start, in one line: what failed, where, why, and what to
//!   check; no backtrace, no cause said twice, no password (ADR 0080).
//! - [`once`]: `outboxd relay --once`, one relay pass and one round of sink deliveries for a
//!   scheduler.
//! - [`app`]: builds the server ([`app::App::build`]), starts its loops, shuts down gracefully.
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
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod waking;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

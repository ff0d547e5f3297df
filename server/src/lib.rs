//! `outboxd`: the transactional outbox as a service.
//!
//! Producers write messages into `outbox.messages` inside their own database transactions (the
//! `outbox-client` crate, the SQL function `outbox.enqueue`, or the `Enqueue` RPC). This server
//! relays them into per-consumer inbox rows and delivers them over gRPC streams with ack/nack,
//! retries with backoff, dead letters and replay.
//!
//! # Layout
//!
//! - [`config`]: command line and environment, validated before anything binds.
//! - [`app`]: builds the server ([`app::App::build`]) and shuts it down gracefully.
//! - [`domain`]: ids, names, topics and patterns, the retry policy, the delivery states.
//! - [`store`]: every SQL statement: the [`store::Store`] seam, the PostgreSQL store and the
//!   embedded SQLite store, each with its migrations.
//! - [`relay`]: fans committed messages out to matching consumers' inboxes, in batches.
//! - [`replay`]: managed replay: filters, count first, retention check, rate-limited batches.
//! - [`session`]: one `Subscribe` stream: leases, sends, applies acks, nacks and extends.
//! - [`sweeper`]: returns expired leases to pending (with backoff) or to dead.
//! - [`pruner`]: deletes old, fully acked messages; its retention is the dedup horizon.
//! - [`vacuum`]: vacuums outboxd's own tables once their dead rows pile up.
//! - [`hub`]: in-process wake-ups between the relay, the sweeper and the sessions.
//! - [`listener`]: wake-ups across replicas (`LISTEN outbox_work`).
//! - [`metrics`]: Prometheus counters, histograms and per-consumer gauges.
//! - [`grpc`]: the `Outbox` and `OutboxAdmin` services, wire conversion, error → status, and
//!   authentication and permissions ([`grpc::auth`]).
//! - [`tls`]: TLS and mTLS on the gRPC listener, certificates rotated without restarts.
//! - [`telemetry`]: logs, OTLP trace export, the `traceparent` that messages carry.
//! - [`clock`]: system and manual clocks, so tests drive loops without sleeping.
#![forbid(unsafe_code)]

pub mod app;
pub mod clock;
pub mod config;
pub mod domain;
pub mod grpc;
pub mod hub;
pub mod listener;
pub mod metrics;
pub mod pruner;
pub mod relay;
pub mod replay;
pub mod session;
pub mod store;
pub mod sweeper;
pub mod telemetry;
pub mod tls;
pub mod vacuum;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

//! Command line and environment configuration, validated before anything binds.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::telemetry::LogFormat;

/// The embedded store, used when no database URL is given.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://outbox.db";

#[derive(Debug, Parser)]
#[command(name = "outboxd", version, about = "Transactional outbox relay and delivery server")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log format.
    #[arg(long, global = true, env = "OUTBOXD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

// Parsed once at start-up: the size of the serve arguments costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the gRPC API and run the relay, the lease sweeper and the pruner.
    Serve(ServeArgs),
    /// Apply database migrations and exit.
    Migrate(DatabaseArgs),
    /// Run one relay pass (fan-out of committed messages) and one round of due sink
    /// deliveries, print what moved, and exit: for running the relay from a scheduler. Exit
    /// codes: 0 something moved, 3 nothing to do, 4 the database is unreachable, 1 any other
    /// error.
    Relay(RelayArgs),
    /// Ask a running outboxd whether it is serving (gRPC health); exit 0 only if it is.
    Healthcheck(crate::healthcheck::HealthcheckArgs),
}

#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// The store: postgres://user@host:5432/db (created if missing), or sqlite://PATH (the
    /// embedded default, a file created if missing).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, default_value = DEFAULT_DATABASE_URL)]
    pub database_url: String,
    /// Largest number of database connections this process opens.
    #[arg(long, env = "OUTBOXD_MAX_CONNECTIONS", default_value_t = 16)]
    pub max_connections: u32,
}

// The arguments of `outboxd relay --once`, which `once::run` carries out.
#[derive(Debug, Clone, Args)]
pub struct RelayArgs {
    /// Run one pass and exit (the only mode: `outboxd serve` relays continuously).
    #[arg(long, required = true)]
    pub once: bool,
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// What to print: a line of text, or one JSON object.
    #[arg(long, value_enum, default_value_t = RelayOutput::Text)]
    pub output: RelayOutput,
    /// Messages per relay pass.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub batch: i64,
    /// Fan out only; deliver no sinks.
    #[arg(long)]
    pub no_sinks: bool,
    /// Let sinks reach loopback, private and link-local addresses (as `serve`'s flag).
    #[arg(long, env = "OUTBOXD_SINK_ALLOW_PRIVATE")]
    pub sink_allow_private: bool,
    /// An internal network that sinks may reach all the same (as `serve`'s flag).
    #[arg(long, env = "OUTBOXD_SINK_ALLOW", value_delimiter = ',', value_name = "NETWORK", value_parser = parse_net)]
    pub sink_allow: Vec<ipnet::IpNet>,
    /// Do not apply migrations first.
    #[arg(long)]
    pub no_migrate: bool,
    /// The auth file `serve` runs with: a sink then runs only while its creator may still
    /// create it and read its topics, as under `serve`. Without it every sink runs.
    #[arg(long, env = "OUTBOXD_AUTH_FILE", value_name = "PATH")]
    pub auth_file: Option<std::path::PathBuf>,
    /// The key `serve` seals sinks' secrets with (`--sink-key-file`), to open them.
    #[arg(long, env = "OUTBOXD_SINK_KEY_FILE", value_name = "PATH")]
    pub sink_key_file: Option<std::path::PathBuf>,
}

/// What `outboxd relay --once` prints (`--output`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RelayOutput {
    Text,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Address for the gRPC API (port 0 picks a free port).
    #[arg(long, env = "OUTBOXD_LISTEN", default_value = "127.0.0.1:50051", value_parser = parse_addr)]
    pub listen: SocketAddr,
    /// Do not apply migrations at start-up (run `outboxd migrate` separately).
    #[arg(long)]
    pub no_migrate: bool,
    /// Largest accepted payload in bytes.
    #[arg(long, env = "OUTBOXD_MAX_PAYLOAD_BYTES", default_value_t = 1024 * 1024)]
    pub max_payload_bytes: usize,
    /// How long streams may take to ack what they hold at shutdown before it is released.
    #[arg(long, env = "OUTBOXD_DRAIN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
    /// Relayed, acked messages and their deliveries are pruned after this long; it is also
    /// the dedup horizon.
    #[arg(long, env = "OUTBOXD_RETENTION", default_value = "7d", value_parser = humantime::parse_duration)]
    pub retention: Duration,
    /// Default pace of a replay, in deliveries made due per second (a request may set its own).
    #[arg(long, env = "OUTBOXD_REPLAY_RATE", default_value_t = 1000)]
    pub replay_rate: u32,
    /// Longest wait between relay polls when idle (the relay polls every millisecond or so
    /// while messages flow, and backs off to this when none come). On PostgreSQL a relay that
    /// backed off is woken by producers' inserts (unless --no-listen), so this bounds only the
    /// rare commit that raced its request.
    #[arg(long, env = "OUTBOXD_RELAY_POLL_MAX", default_value = "1s", value_parser = humantime::parse_duration)]
    pub relay_poll_max: Duration,
    /// Longest sleep of the lease sweeper. It wakes at the earliest lease deadline it knows of;
    /// leases made since by other replicas are found at least this often.
    #[arg(long, env = "OUTBOXD_SWEEP_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub sweep_interval: Duration,
    /// Fallback poll of idle streams, for work fanned out by other replicas when a
    /// notification was missed, and for retries that another replica's sweeper scheduled
    /// (with --no-listen, lower it: it is then the only way to hear of other replicas' work).
    #[arg(long, env = "OUTBOXD_STREAM_POLL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub stream_poll: Duration,
    /// Poll only: no LISTEN/NOTIFY between replicas (for transaction-mode connection poolers,
    /// which do not carry notifications). Lower --stream-poll to keep latency down.
    #[arg(long, env = "OUTBOXD_NO_LISTEN")]
    pub no_listen: bool,
    /// Run no relay in this process: it only serves streams and the admin API (the relay runs
    /// in other replicas).
    #[arg(long, env = "OUTBOXD_NO_RELAY")]
    pub no_relay: bool,
    /// Deliver no sink consumers from this process (other replicas do, or `outboxd relay
    /// --once` from a scheduler).
    #[arg(long, env = "OUTBOXD_NO_SINKS")]
    pub no_sinks: bool,
    /// How often this process looks for sink consumers created or deleted on other replicas
    /// (its own changes take effect at once).
    #[arg(long, env = "OUTBOXD_SINK_POLL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub sink_poll: Duration,
    /// Let sinks reach loopback, private, link-local and other internal addresses (refused by
    /// default: a sink's creator chooses where it connects).
    #[arg(long, env = "OUTBOXD_SINK_ALLOW_PRIVATE")]
    pub sink_allow_private: bool,
    /// An internal network (CIDR, or one address) that sinks may reach all the same: a broker
    /// inside your network, without --sink-allow-private's every address; repeat for several.
    #[arg(long, env = "OUTBOXD_SINK_ALLOW", value_delimiter = ',', value_name = "NETWORK", value_parser = parse_net)]
    pub sink_allow: Vec<ipnet::IpNet>,
    /// Seal sinks' URLs and webhook secrets in the database with this key (base64 of 64
    /// random bytes: `openssl rand -base64 64`); every replica and `relay --once` needs the
    /// same file. Sinks created without it stay as they were stored.
    #[arg(long, env = "OUTBOXD_SINK_KEY_FILE", value_name = "PATH")]
    pub sink_key_file: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (off when not given).
    #[arg(long, env = "OUTBOXD_METRICS_LISTEN", value_parser = parse_addr)]
    pub metrics_listen: Option<SocketAddr>,
    /// Also serve gRPC health checking, and nothing else, in plaintext on ADDR: for probes that
    /// cannot speak TLS, such as the kubelet's native gRPC probe (off when not given).
    #[arg(long, env = "OUTBOXD_HEALTH_LISTEN", value_parser = parse_addr)]
    pub health_listen: Option<SocketAddr>,
    /// Serve the web console on ADDR (over TLS with --tls-cert, like the gRPC API): principals
    /// sign in with their tokens, or their client certificates. Off when not given; without
    /// authentication only on a loopback address, as the gRPC API.
    #[arg(long, env = "OUTBOXD_CONSOLE_LISTEN", value_parser = parse_addr)]
    pub console_listen: Option<SocketAddr>,
    /// Link a message's trace in the console to this URL, `{trace_id}` replaced by the trace id
    /// of its `traceparent` (`https://jaeger.example/trace/{trace_id}`).
    #[arg(long, env = "OUTBOXD_CONSOLE_TRACE_URL", value_name = "TEMPLATE", value_parser = parse_trace_url)]
    pub console_trace_url: Option<String>,
    /// A console sign-in ends after this long without a request.
    #[arg(long, env = "OUTBOXD_CONSOLE_SESSION_IDLE", default_value = "1h", value_parser = humantime::parse_duration)]
    pub console_session_idle: Duration,
    /// A console sign-in ends this long after it began, however active.
    #[arg(long, env = "OUTBOXD_CONSOLE_SESSION_MAX", default_value = "12h", value_parser = humantime::parse_duration)]
    pub console_session_max: Duration,
    /// How often the per-consumer gauges are refreshed from the database.
    #[arg(long, env = "OUTBOXD_METRICS_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub metrics_interval: Duration,
    /// How often outboxd checks its own tables' dead rows and vacuums those that have many
    /// (PostgreSQL; "0s" turns it off and leaves the tables to autovacuum).
    #[arg(long, env = "OUTBOXD_VACUUM_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub vacuum_interval: Duration,
    #[command(flatten)]
    pub limits: crate::limits::Limits,
    #[command(flatten)]
    pub security: SecurityArgs,
}

/// TLS, authentication and the protected mode (see `outboxd serve --help`).
#[derive(Debug, Clone, Default, Args)]
pub struct SecurityArgs {
    /// Serve gRPC over TLS with this certificate chain (PEM); re-read when it changes.
    #[arg(long, env = "OUTBOXD_TLS_CERT", requires = "tls_key", value_name = "PATH")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "OUTBOXD_TLS_KEY", requires = "tls_cert", value_name = "PATH")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by these CAs (PEM): mutual TLS. Needs --tls-cert.
    #[arg(long, env = "OUTBOXD_TLS_CLIENT_CA", requires = "tls_cert", value_name = "PATH")]
    pub tls_client_ca: Option<PathBuf>,
    /// Principals, their tokens or certificate subjects, and their permissions (TOML); every
    /// request must then authenticate, and is denied what its principal may not do. Re-read
    /// when it changes and on SIGHUP.
    #[arg(long, env = "OUTBOXD_AUTH_FILE", value_name = "PATH")]
    pub auth_file: Option<PathBuf>,
    /// Serve without authentication on a non-loopback address (without an auth file or client
    /// certificates, outboxd refuses to).
    #[arg(long, env = "OUTBOXD_ALLOW_UNAUTHENTICATED")]
    pub allow_unauthenticated: bool,
    /// How often the auth file and the TLS files are checked for changes.
    #[arg(long, env = "OUTBOXD_RELOAD_INTERVAL", default_value = "2s", value_parser = humantime::parse_duration)]
    pub reload_interval: Duration,
}

/// A validated server configuration.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub database_url: String,
    pub max_connections: u32,
    pub listen: SocketAddr,
    pub migrate: bool,
    pub max_payload_bytes: usize,
    pub max_batch: usize,
    pub drain_timeout: Duration,
    pub retention: Duration,
    pub prune_interval: Duration,
    /// Zero: no vacuum of outboxd's own.
    pub vacuum_interval: Duration,
    pub replay_rate: u32,
    pub relay_poll_min: Duration,
    pub relay_poll_max: Duration,
    /// The most messages a relay pass claims; `None`: the backend's default.
    pub relay_pass_size: Option<i64>,
    pub sweep_interval: Duration,
    pub stream_poll: Duration,
    pub listen_notify: bool,
    pub relay: bool,
    pub sinks: bool,
    pub sink_poll: Duration,
    /// Where sinks may connect (internal addresses refused unless allowed).
    pub sink_destinations: crate::sinks::destination::Destinations,
    pub sink_key_file: Option<PathBuf>,
    pub metrics_listen: Option<SocketAddr>,
    pub health_listen: Option<SocketAddr>,
    pub console_listen: Option<SocketAddr>,
    pub console_trace_url: Option<String>,
    /// `--console-session-idle`, `--console-session-max`.
    pub console_session_idle: Duration,
    pub console_session_max: Duration,
    pub metrics_interval: Duration,
    pub limits: crate::limits::Limits,
    pub security: Security,
}

/// TLS and authentication, validated.
#[derive(Debug, Clone)]
pub struct Security {
    pub tls: Option<crate::tls::TlsFiles>,
    pub auth_file: Option<PathBuf>,
    pub allow_unauthenticated: bool,
    pub reload_interval: Duration,
}

impl Default for Security {
    fn default() -> Self {
        Self { tls: None, auth_file: None, allow_unauthenticated: false, reload_interval: Duration::from_secs(2) }
    }
}

impl Security {
    /// Whether callers prove who they are: an auth file, or client certificates.
    pub fn authenticates(&self) -> bool {
        self.auth_file.is_some() || self.tls.as_ref().is_some_and(|t| t.client_ca.is_some())
    }
}

/// A configuration value that cannot work.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl ServeConfig {
    /// Defaults for a database URL, as `outboxd serve` would use them.
    pub fn new(database_url: impl Into<String>) -> Self {
        Self {
            database_url: database_url.into(),
            max_connections: 16,
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            migrate: true,
            max_payload_bytes: 1024 * 1024,
            max_batch: 1000,
            drain_timeout: Duration::from_secs(10),
            retention: Duration::from_secs(7 * 24 * 3600),
            prune_interval: Duration::from_secs(600),
            vacuum_interval: Duration::from_secs(5),
            replay_rate: 1000,
            relay_poll_min: Duration::from_millis(1),
            relay_poll_max: Duration::from_millis(500),
            relay_pass_size: None,
            sweep_interval: Duration::from_secs(1),
            stream_poll: Duration::from_secs(2),
            listen_notify: true,
            relay: true,
            sinks: true,
            sink_poll: Duration::from_secs(30),
            sink_destinations: Default::default(),
            sink_key_file: None,
            metrics_listen: None,
            console_listen: None,
            console_trace_url: None,
            console_session_idle: Duration::from_secs(3600),
            console_session_max: Duration::from_secs(12 * 3600),
            health_listen: None,
            metrics_interval: Duration::from_secs(10),
            limits: crate::limits::Limits::DEFAULT,
            security: Security::default(),
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if !["postgres://", "postgresql://", "sqlite:"].iter().any(|p| self.database_url.starts_with(p)) {
            return Err(ConfigError("--database-url must be a postgres://… or sqlite://… URL".into()));
        }
        if self.max_connections < 2 {
            return Err(ConfigError("--max-connections must be at least 2".into()));
        }
        if self.replay_rate == 0 {
            return Err(ConfigError("--replay-rate must be at least 1".into()));
        }
        if self.max_payload_bytes == 0 || self.max_payload_bytes > 64 * 1024 * 1024 {
            return Err(ConfigError("--max-payload-bytes must be between 1 and 67108864".into()));
        }
        self.limits.validate().map_err(ConfigError)?;
        let unit = crate::limits::delivery_unit(self.max_payload_bytes);
        if self.limits.max_in_flight_bytes_per_principal < unit {
            return Err(ConfigError(format!(
                "--max-in-flight-bytes-per-principal is {}, less than the largest delivery ({unit} bytes: \
                 --max-payload-bytes {} plus headers and names); raise it or lower --max-payload-bytes",
                self.limits.max_in_flight_bytes_per_principal, self.max_payload_bytes
            )));
        }
        for (name, d) in [
            ("--relay-poll-max", self.relay_poll_max),
            ("--sweep-interval", self.sweep_interval),
            ("--stream-poll", self.stream_poll),
            ("--sink-poll", self.sink_poll),
            ("--retention", self.retention),
            ("--metrics-interval", self.metrics_interval),
            ("--reload-interval", self.security.reload_interval),
            ("--console-session-idle", self.console_session_idle),
            ("--console-session-max", self.console_session_max),
        ] {
            if d.is_zero() {
                return Err(ConfigError(format!("{name} must be positive")));
            }
        }
        if self.security.reload_interval > Duration::from_secs(24 * 3600) {
            return Err(ConfigError("--reload-interval must be at most 24h (SIGHUP re-reads at any time)".into()));
        }
        self.check_protected_mode()
    }

    /// Without authentication, serve only on loopback addresses unless told otherwise
    /// (ADR 0020). The metrics address is not held to it: it serves counts, no payloads.
    pub fn check_protected_mode(&self) -> Result<(), ConfigError> {
        let s = &self.security;
        if let Some(console) = self.console_listen
            && !(s.authenticates() || s.allow_unauthenticated || crate::listen::is_loopback(console.ip()))
        {
            return Err(ConfigError(format!(
                "refusing to serve the console without authentication on {console}, which is not a loopback \
                 address: anyone who can reach it could read and replay every consumer's messages. Give \
                 --auth-file PATH or --tls-client-ca PATH, serve it on 127.0.0.1, or pass \
                 --allow-unauthenticated if something in front of outboxd authenticates"
            )));
        }
        if s.authenticates() || s.allow_unauthenticated || crate::listen::is_loopback(self.listen.ip()) {
            return Ok(());
        }
        Err(ConfigError(format!(
            "refusing to serve without authentication on {}, which is not a loopback address: anyone who can \
             reach it could read every payload and replay, pause or delete any consumer. Give --auth-file PATH \
             (principals and their permissions) or --tls-client-ca PATH (client certificates), listen on \
             127.0.0.1, or pass --allow-unauthenticated if something in front of outboxd authenticates",
            self.listen
        )))
    }
}

/// `--console-trace-url`: an http(s) URL with `{trace_id}` in it.
pub(crate) fn parse_trace_url(s: &str) -> Result<String, String> {
    let valid = s.contains("{trace_id}")
        && url::Url::parse(&s.replace("{trace_id}", "0")).is_ok_and(|u| matches!(u.scheme(), "http" | "https"));
    if valid {
        Ok(s.to_owned())
    } else {
        Err(format!("{s:?}: give an http:// or https:// URL with {{trace_id}} in it"))
    }
}

/// A listen address: an IP address and a port, said so when it is not one.
pub(crate) fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| {
        "not an IP address and port: give one such as 127.0.0.1:50051 or [::]:50051 (a host name such as \
         localhost is not looked up; the port is 0 to 65535)"
            .to_owned()
    })
}

/// `--sink-allow`: a network in CIDR notation, or one address.
pub(crate) fn parse_net(s: &str) -> Result<ipnet::IpNet, String> {
    s.parse::<ipnet::IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{s:?} is neither a network (10.1.0.0/16, fd00::/8) nor an address"))
}

impl TryFrom<ServeArgs> for ServeConfig {
    type Error = ConfigError;

    fn try_from(a: ServeArgs) -> Result<Self, ConfigError> {
        let mut c = ServeConfig::new(a.database.database_url);
        c.max_connections = a.database.max_connections;
        c.listen = a.listen;
        c.migrate = !a.no_migrate;
        c.max_payload_bytes = a.max_payload_bytes;
        c.drain_timeout = a.drain_timeout;
        c.retention = a.retention;
        c.replay_rate = a.replay_rate;
        c.relay_poll_max = a.relay_poll_max;
        c.sweep_interval = a.sweep_interval;
        c.stream_poll = a.stream_poll;
        c.listen_notify = !a.no_listen;
        c.relay = !a.no_relay;
        c.sinks = !a.no_sinks;
        c.sink_poll = a.sink_poll;
        c.sink_key_file = a.sink_key_file.clone();
        c.sink_destinations = crate::sinks::destination::Destinations {
            allow_private: a.sink_allow_private,
            allowed: a.sink_allow.clone().into(),
        };
        c.metrics_listen = a.metrics_listen;
        c.health_listen = a.health_listen;
        c.console_listen = a.console_listen;
        c.console_trace_url = a.console_trace_url.clone();
        c.console_session_idle = a.console_session_idle;
        c.console_session_max = a.console_session_max;
        c.metrics_interval = a.metrics_interval;
        c.vacuum_interval = a.vacuum_interval;
        c.limits = a.limits;
        let sec = a.security;
        c.security = Security {
            tls: match (sec.tls_cert, sec.tls_key) {
                (Some(cert), Some(key)) => Some(crate::tls::TlsFiles { cert, key, client_ca: sec.tls_client_ca }),
                _ => None,
            },
            auth_file: sec.auth_file,
            allow_unauthenticated: sec.allow_unauthenticated,
            reload_interval: sec.reload_interval,
        };
        c.validate()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(listen: &str) -> ServeConfig {
        let mut c = ServeConfig::new("sqlite://x.db");
        c.listen = listen.parse().unwrap();
        c
    }

    #[test]
    fn without_authentication_only_loopback_addresses_are_served() {
        for ok in ["127.0.0.1:50051", "127.1.2.3:1", "[::1]:50051", "[::ffff:127.0.0.1]:50051"] {
            assert!(on(ok).check_protected_mode().is_ok(), "{ok}");
        }
        for refused in ["0.0.0.0:50051", "[::]:50051", "10.0.0.5:50051", "[::ffff:10.0.0.5]:1"] {
            let err = on(refused).check_protected_mode().unwrap_err().to_string();
            assert!(err.contains("--auth-file") && err.contains("--allow-unauthenticated"), "{err}");
        }
        let mut c = on("0.0.0.0:50051");
        c.security.allow_unauthenticated = true;
        assert!(c.check_protected_mode().is_ok());
        let mut c = on("0.0.0.0:50051");
        c.security.auth_file = Some("auth.toml".into());
        assert!(c.check_protected_mode().is_ok());
        let mut c = on("0.0.0.0:50051");
        c.security.tls = Some(crate::tls::TlsFiles { cert: "c".into(), key: "k".into(), client_ca: None });
        assert!(c.check_protected_mode().is_err(), "TLS without client certificates authenticates nobody");
        c.security.tls = Some(crate::tls::TlsFiles { cert: "c".into(), key: "k".into(), client_ca: Some("ca".into()) });
        assert!(c.check_protected_mode().is_ok());
    }

    #[test]
    fn a_console_trace_url_is_http_with_a_trace_id_placeholder() {
        assert!(parse_trace_url("https://jaeger.example/trace/{trace_id}").is_ok());
        for bad in
            ["https://jaeger.example/trace/", "javascript:alert(1)//{trace_id}", "ftp://x/{trace_id}", "{trace_id}"]
        {
            let e = parse_trace_url(bad).unwrap_err();
            assert!(e.contains("{trace_id}"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_console_is_held_to_the_protected_mode_on_its_own_address() {
        let mut c = on("127.0.0.1:50051");
        c.console_listen = Some("127.0.0.1:8080".parse().unwrap());
        assert!(c.check_protected_mode().is_ok());
        c.console_listen = Some("0.0.0.0:8080".parse().unwrap());
        let err = c.check_protected_mode().unwrap_err().to_string();
        assert!(err.contains("console") && err.contains("0.0.0.0:8080") && err.contains("--auth-file"), "{err}");
        c.security.auth_file = Some("auth.toml".into());
        assert!(c.check_protected_mode().is_ok());
    }
}

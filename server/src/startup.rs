//! Start-up failures, each said in one line: what failed, where, why, and what to check.
//!
//! `outboxd: cannot connect to PostgreSQL at 127.0.0.1:5999 (connection refused): is it
//! running? check --database-url or DATABASE_URL`. `main` prints [`StartupError`]'s line and
//! exits 1 (ADR 0080): a configuration mistake gets no backtrace, whatever `RUST_BACKTRACE`
//! says; a cause is said once, not once per layer that wrapped it; PostgreSQL's position in
//! its own source (`at line 768`) is left out; and the database URL's password never appears:
//! the line names the host and port, the user, the database.
use std::io;
use std::net::SocketAddr;
use std::str::FromStr as _;

use crate::config::ConfigError;
use crate::grpc::auth::AuthFileError;
use crate::sinks::sealed::SealError;
use crate::store::StoreError;
use crate::tls::{TlsError, TlsFile};

/// Where the database URL comes from, for the lines that ask to check it.
const DATABASE_FLAG: &str = "--database-url or DATABASE_URL";

/// The listeners outboxd binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    Grpc,
    Console,
    Health,
    Metrics,
}

impl Listener {
    fn noun(self) -> &'static str {
        match self {
            Listener::Grpc => "the gRPC API",
            Listener::Console => "the console",
            Listener::Health => "gRPC health checks",
            Listener::Metrics => "metrics",
        }
    }

    /// The flag and the environment variable that set its address.
    fn flag(self) -> (&'static str, &'static str) {
        match self {
            Listener::Grpc => ("--listen", "OUTBOXD_LISTEN"),
            Listener::Console => ("--console-listen", "OUTBOXD_CONSOLE_LISTEN"),
            Listener::Health => ("--health-listen", "OUTBOXD_HEALTH_LISTEN"),
            Listener::Metrics => ("--metrics-listen", "OUTBOXD_METRICS_LISTEN"),
        }
    }
}

/// What outboxd was doing with its database when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Connecting, and creating the database if it is missing.
    Open,
    /// Applying migrations.
    Migrate,
}

/// Why outboxd did not start. Its text is the one line `main` prints; the error it wraps stays
/// its [`source`](std::error::Error::source) for callers that look deeper.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{}", database(.url, *.stage, .source))]
    Database { url: String, stage: Stage, source: StoreError },
    #[error("{}", bind(*.listener, *.addr, .source))]
    Bind { listener: Listener, addr: SocketAddr, source: io::Error },
    #[error("{}", tls(.0))]
    Tls(#[from] TlsError),
    #[error("{}", auth_file(.0))]
    AuthFile(#[from] AuthFileError),
    #[error("{}", sink_key(.0))]
    SinkKey(#[from] SealError),
    /// Anything else that stops start-up (more a bug than a setting), in its own words.
    #[error("{0}")]
    Other(String),
}

impl StartupError {
    /// The metrics exporter binds its own listener and reports only the text of the error.
    pub fn metrics(addr: SocketAddr, e: metrics_exporter_prometheus::BuildError) -> Self {
        match e {
            metrics_exporter_prometheus::BuildError::FailedToCreateHTTPListener(text) => {
                StartupError::Bind { listener: Listener::Metrics, addr, source: io_error_from_text(&text) }
            }
            e => StartupError::Other(format!("cannot set up metrics at {addr} ({e})")),
        }
    }
}

/// An error and its sources in one line, each text said once: a layer whose text already holds
/// the next one's (sqlx's, anyhow's contexts) is not followed by it again.
pub fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(e) = next {
        let text = match e.downcast_ref::<sqlx::Error>() {
            Some(e) => sqlx_cause(e),
            None => e.to_string(),
        };
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        // sqlx's own causes are in `sqlx_cause` already.
        next = if e.is::<sqlx::Error>() { None } else { e.source() };
    }
    parts.join(": ")
}

/// An I/O error's description without the `(os error N)` that follows it, as a cause in a
/// sentence: `connection refused`.
pub fn io_cause(e: &io::Error) -> String {
    let text = e.to_string();
    let text = match text.rfind(" (os error ") {
        Some(i) if text.ends_with(')') => &text[..i],
        _ => &text,
    };
    lowercase_first(text)
}

/// `Connection refused` → `connection refused`, but `TLS …` stays.
fn lowercase_first(text: &str) -> String {
    let mut chars = text.chars();
    match (chars.next(), chars.next()) {
        (Some(first), Some(second)) if first.is_uppercase() && second.is_lowercase() => {
            first.to_lowercase().chain(text[first.len_utf8()..].chars()).collect()
        }
        _ => text.to_owned(),
    }
}

/// The I/O error whose text is `text` (`Address already in use (os error 98)`), its kind
/// recovered from the number.
fn io_error_from_text(text: &str) -> io::Error {
    let code =
        text.rsplit_once("(os error ").and_then(|(_, rest)| rest.strip_suffix(')')).and_then(|n| n.parse::<i32>().ok());
    match code {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::other(text.to_owned()),
    }
}

/// An sqlx error's cause, once: its own layers repeat their source in their text, and a
/// PostgreSQL error's text ends with the line of PostgreSQL's source that raised it.
pub fn sqlx_cause(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => db.message().to_owned(),
        sqlx::Error::Io(e) => io_cause(e),
        sqlx::Error::Tls(e) | sqlx::Error::Configuration(e) => one_line(e.as_ref()),
        sqlx::Error::PoolTimedOut => "no connection within the pool's timeout".to_owned(),
        e => e.to_string(),
    }
}

/// The store a database URL names, and where it is, without credentials.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// `host:port` (or the socket directory), the user and the database.
    Postgres {
        at: String,
        user: String,
        database: String,
    },
    Sqlite {
        path: String,
    },
    /// The URL does not parse: why.
    Invalid(String),
}

impl Place {
    pub fn of(url: &str) -> Self {
        if url.starts_with("sqlite:") {
            return match sqlx::sqlite::SqliteConnectOptions::from_str(url) {
                Ok(o) => Place::Sqlite { path: o.get_filename().display().to_string() },
                Err(e) => Place::Invalid(sqlx_cause(&e)),
            };
        }
        if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
            return Place::Invalid("neither postgres:// nor sqlite:".to_owned());
        }
        // Only the parameters that say where: sqlx logs the value of a parameter it does not
        // know, and the store already said which ones it drops (ADR 0081).
        let mut parsed = match url::Url::parse(url) {
            Ok(u) => u,
            Err(e) => return Place::Invalid(e.to_string()),
        };
        let whereabouts: Vec<(String, String)> = parsed
            .query_pairs()
            .filter(|(k, _)| ["host", "hostaddr", "port", "dbname", "user"].contains(&k.as_ref()))
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        parsed.set_query(None);
        if !whereabouts.is_empty() {
            parsed.query_pairs_mut().extend_pairs(whereabouts);
        }
        match sqlx::postgres::PgConnectOptions::from_str(parsed.as_str()) {
            Ok(o) => {
                let at = match o.get_socket() {
                    Some(dir) => format!("{} (port {})", dir.display(), o.get_port()),
                    None if o.get_host().contains(':') && !o.get_host().starts_with('[') => {
                        format!("[{}]:{}", o.get_host(), o.get_port())
                    }
                    None => format!("{}:{}", o.get_host(), o.get_port()),
                };
                let user = o.get_username().to_owned();
                let database = o.get_database().unwrap_or(&user).to_owned();
                Place::Postgres { at, user, database }
            }
            Err(e) => Place::Invalid(sqlx_cause(&e)),
        }
    }

    /// The store's kind and where it is, for the log.
    pub fn describe(&self) -> (&'static str, String) {
        match self {
            Place::Postgres { at, database, .. } => ("postgres", format!("{at}/{database}")),
            Place::Sqlite { path } => ("sqlite", path.clone()),
            Place::Invalid(_) => ("unknown", String::new()),
        }
    }
}

/// The line for a database that did not open or migrate.
pub fn database(url: &str, stage: Stage, e: &StoreError) -> String {
    let line = match Place::of(url) {
        Place::Postgres { at, user, database } => postgres(&at, &user, &database, stage, e),
        Place::Sqlite { path } => sqlite(&path, stage, e),
        Place::Invalid(cause) => invalid_url(&cause),
    };
    redact_password(url, line)
}

fn invalid_url(cause: &str) -> String {
    format!(
        "invalid database URL in {DATABASE_FLAG} ({cause}): give postgres://USER:PASSWORD@HOST:PORT/DATABASE \
         or sqlite://PATH"
    )
}

fn postgres(at: &str, user: &str, database: &str, stage: Stage, e: &StoreError) -> String {
    let sqlx_error = match e {
        StoreError::Database(e) => Some(e),
        StoreError::Migrate(sqlx::migrate::MigrateError::Execute(e))
        | StoreError::Migrate(sqlx::migrate::MigrateError::ExecuteMigration(e, _)) => Some(e),
        _ => None,
    };
    let connect = format!("cannot connect to PostgreSQL at {at}");
    if let StoreError::ConnectTimeout(_) = e {
        return format!(
            "{connect} ({e}): is PostgreSQL listening there, and reachable from here? check {DATABASE_FLAG}"
        );
    }
    if let (Stage::Open, StoreError::InvalidValue(why)) = (stage, e) {
        // A parameter of the URL that outboxd refuses (it says why and what to do), or a value
        // PostgreSQL refused at sign-in (`options`).
        return format!("invalid database URL in {DATABASE_FLAG}: {why}");
    }
    if stage == Stage::Migrate {
        let cause = migrate_cause(e);
        let check = match sqlx_error.and_then(db_code).as_deref() {
            Some("42501") => format!(
                "let {user} create tables in it, or apply them as a user who may (outboxd migrate) and serve \
                 with --no-migrate"
            ),
            _ => match e {
                StoreError::Migrate(
                    sqlx::migrate::MigrateError::VersionMissing(_) | sqlx::migrate::MigrateError::VersionMismatch(_),
                ) => "the database was migrated by another version of outboxd: run that version or a newer one"
                    .to_owned(),
                _ => "see the PostgreSQL log; `outboxd migrate` applies them alone".to_owned(),
            },
        };
        return format!("cannot apply migrations to database {database} on PostgreSQL at {at} ({cause}): {check}");
    }
    let Some(sqlx_error) = sqlx_error else {
        return format!("{connect} ({e}): check {DATABASE_FLAG}");
    };
    let cause = sqlx_cause(sqlx_error);
    match sqlx_error {
        sqlx::Error::Configuration(_) => invalid_url(&cause),
        // Over TCP, a file that is not there is one the URL names (sslrootcert, sslcert, sslkey).
        sqlx::Error::Io(io)
            if !at.starts_with('/')
                && matches!(io.kind(), io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied) =>
        {
            format!(
                "{connect} (cannot read a file of the URL: {cause}): check sslrootcert, sslcert and sslkey in \
                 {DATABASE_FLAG}"
            )
        }
        sqlx::Error::Io(io) => {
            let check = if io.kind() == io::ErrorKind::ConnectionRefused {
                format!("is it running? check {DATABASE_FLAG}")
            } else if cause.contains("lookup address") {
                format!("check the host name in {DATABASE_FLAG}")
            } else {
                format!("is it running, and reachable from here? check {DATABASE_FLAG}")
            };
            format!("{connect} ({cause}): {check}")
        }
        sqlx::Error::Tls(_) => {
            format!("{connect} over TLS ({cause}): check sslmode and the certificates in {DATABASE_FLAG}")
        }
        sqlx::Error::PoolTimedOut => {
            format!(
                "{connect} ({cause}): is PostgreSQL listening there, and reachable from here? check {DATABASE_FLAG}"
            )
        }
        sqlx::Error::Database(_) => match db_code(sqlx_error).as_deref() {
            // invalid_password, invalid_authorization_specification (no such role, pg_hba.conf)
            Some("28P01" | "28000") => format!(
                "cannot sign in to PostgreSQL at {at} as {user} ({cause}): check the user and password in \
                 {DATABASE_FLAG}, and the server's pg_hba.conf"
            ),
            Some("42501") if cause.contains("create database") => format!(
                "cannot create database {database} on PostgreSQL at {at} ({cause}): check the database name in \
                 {DATABASE_FLAG}, or create it first, or let {user} create databases (ALTER ROLE … CREATEDB)"
            ),
            Some("3D000") => {
                format!("{connect} as {user} ({cause}): check the database name in {DATABASE_FLAG}")
            }
            Some("53300") => {
                format!("{connect} ({cause}): lower --max-connections, or raise the server's max_connections")
            }
            _ => format!("{connect} as {user} ({cause}): check {DATABASE_FLAG}"),
        },
        _ => format!("{connect} ({cause}): check {DATABASE_FLAG}"),
    }
}

/// The error code of the database (PostgreSQL's SQLSTATE, SQLite's result code).
fn db_code(e: &sqlx::Error) -> Option<String> {
    match e {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    }
}

fn migrate_cause(e: &StoreError) -> String {
    match e {
        StoreError::Migrate(sqlx::migrate::MigrateError::Execute(e)) => sqlx_cause(e),
        StoreError::Migrate(sqlx::migrate::MigrateError::ExecuteMigration(e, v)) => {
            format!("migration {v}: {}", sqlx_cause(e))
        }
        StoreError::Database(e) => sqlx_cause(e),
        e => one_line(e),
    }
}

fn sqlite(path: &str, stage: Stage, e: &StoreError) -> String {
    let what = match stage {
        Stage::Open => format!("cannot open the SQLite database at {path}"),
        Stage::Migrate => format!("cannot apply migrations to the SQLite database at {path}"),
    };
    let writable = format!("does its directory exist, and may this user write there? check {DATABASE_FLAG}");
    match e {
        StoreError::Locked(_) => format!(
            "{what} (another outboxd serves it): only one server may use a SQLite file; stop the other one, \
             or use PostgreSQL for several replicas"
        ),
        StoreError::Io { path: file, source } => {
            let check = match source.kind() {
                io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
                    writable
                }
                io::ErrorKind::NotADirectory => {
                    format!("a part of the path is a file, not a directory: check {DATABASE_FLAG}")
                }
                _ => format!("check {DATABASE_FLAG}"),
            };
            format!("{what} ({}: {file}): {check}", io_cause(source))
        }
        StoreError::Database(e) => {
            // SQLITE_CANTOPEN, SQLITE_READONLY, SQLITE_PERM
            let check = match db_code(e).as_deref() {
                Some("14" | "8" | "3") => writable,
                _ => format!("check {DATABASE_FLAG}"),
            };
            format!("{what} ({}): {check}", sqlx_cause(e))
        }
        e => format!("{what} ({}): check {DATABASE_FLAG}", migrate_cause(e)),
    }
}

/// The URL's password, were it anywhere in `line`, as `***`: no line above quotes the URL, but
/// a driver's text might one day.
fn redact_password(url: &str, line: String) -> String {
    let Some(password) = url::Url::parse(url).ok().and_then(|u| u.password().map(str::to_owned)) else {
        return line;
    };
    let decoded = percent_encoding::percent_decode_str(&password).decode_utf8_lossy().into_owned();
    // A very short password would turn every word that holds its letters into stars.
    [password, decoded].iter().filter(|p| p.len() >= 4).fold(line, |line, p| line.replace(p.as_str(), "***"))
}

fn bind(listener: Listener, addr: SocketAddr, e: &io::Error) -> String {
    let (flag, env) = listener.flag();
    let check = match e.kind() {
        io::ErrorKind::AddrInUse => {
            format!("another process (another outboxd?) has that port: stop it, or choose another with {flag} or {env}")
        }
        io::ErrorKind::AddrNotAvailable => {
            format!("{} is not an address of this host: check {flag} or {env}", addr.ip())
        }
        io::ErrorKind::PermissionDenied if addr.port() < 1024 => {
            format!("ports below 1024 need privileges: choose another with {flag} or {env}")
        }
        _ => format!("check {flag} or {env}"),
    };
    format!("cannot listen for {} at {addr} ({}): {check}", listener.noun(), io_cause(e))
}

fn tls(e: &TlsError) -> String {
    match e {
        TlsError::Read { file, path, source } => {
            let (flag, env) = file.flag();
            format!(
                "cannot read the {} at {} ({}): check {flag} or {env}",
                file.noun(),
                path.display(),
                io_cause(source)
            )
        }
        TlsError::Invalid { file, path, cause } => {
            let (flag, env) = file.flag();
            let give = match file {
                TlsFile::Cert => "the server's PEM certificate chain",
                TlsFile::Key => "the PEM private key of the certificate",
                TlsFile::ClientCa => "the PEM certificates of the CAs that sign client certificates",
            };
            format!("invalid {} at {} ({cause}): give {give} with {flag} or {env}", file.noun(), path.display())
        }
        TlsError::Mismatch { cert, key, cause } => format!(
            "TLS private key at {} does not go with the certificate at {} ({cause}): give --tls-key (OUTBOXD_TLS_KEY) \
             the private key of the certificate in --tls-cert",
            key.display(),
            cert.display()
        ),
        TlsError::Other(cause) => format!("cannot set up TLS ({cause})"),
    }
}

fn auth_file(e: &AuthFileError) -> String {
    match e {
        AuthFileError::Read { path, source } => format!(
            "cannot read the auth file at {} ({}): check --auth-file or OUTBOXD_AUTH_FILE",
            path.display(),
            io_cause(source)
        ),
        AuthFileError::Invalid { path, cause } => format!(
            "invalid auth file at {} ({cause}): correct the file, or check --auth-file or OUTBOXD_AUTH_FILE",
            path.display()
        ),
    }
}

fn sink_key(e: &SealError) -> String {
    match e {
        SealError::KeyRead { path, source } => format!(
            "cannot read the sink key at {} ({}): check --sink-key-file or OUTBOXD_SINK_KEY_FILE",
            path.display(),
            io_cause(source)
        ),
        SealError::KeyInvalid { path, cause } => format!(
            "invalid sink key at {} (the file {cause}): give --sink-key-file or OUTBOXD_SINK_KEY_FILE the key the \
             sinks were sealed with (a new one: `openssl rand -base64 64`)",
            path.display()
        ),
        e => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_that_each_layer_repeats_is_said_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("database: {0}")]
        struct Outer(#[source] StoreError);
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        let e = Outer(StoreError::Database(sqlx::Error::Io(refused)));
        let line = one_line(&e);
        assert_eq!(line.matches("connection refused").count(), 1, "{line}");
        assert!(line.starts_with("database: database error: "), "{line}");
    }

    #[test]
    fn an_io_cause_drops_its_os_error_number() {
        assert_eq!(io_cause(&io::Error::from_raw_os_error(111)), "connection refused");
        assert_eq!(io_error_from_text("Address already in use (os error 98)").kind(), io::ErrorKind::AddrInUse);
        assert_eq!(lowercase_first("TLS handshake"), "TLS handshake");
    }

    /// What was logged while `f` ran, at every level.
    fn logged(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl io::Write for Captured {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned()
    }

    #[test]
    fn naming_where_a_database_is_logs_none_of_its_urls_values() {
        let log = logged(|| {
            let _ = Place::of("postgres://app:pw-in-url@db/orders?passwd=s3cr3t-value&sslmode=require");
        });
        assert!(!log.contains("s3cr3t-value") && !log.contains("pw-in-url"), "{log}");
    }

    #[test]
    fn the_place_of_a_database_holds_no_password() {
        let url = "postgres://app:hunter2-long@db.internal:6432/orders";
        let place = Place::of(url);
        assert_eq!(
            place,
            Place::Postgres { at: "db.internal:6432".into(), user: "app".into(), database: "orders".into() }
        );
        assert_eq!(place.describe(), ("postgres", "db.internal:6432/orders".to_owned()));
        let v6 = Place::of("postgres://app@[::1]:5432/x");
        assert!(matches!(&v6, Place::Postgres { at, .. } if at == "[::1]:5432"), "{v6:?}");
        assert_eq!(Place::of("sqlite://data/outbox.db"), Place::Sqlite { path: "data/outbox.db".into() });
        assert!(matches!(Place::of("postgres://app@host:port/x"), Place::Invalid(_)));
        // The parameters that say where count; the others are not read (sqlx would log them).
        assert_eq!(
            Place::of("postgres://app@db/orders?sslmode=require&port=7000&passwd=x"),
            Place::Postgres { at: "db:7000".into(), user: "app".into(), database: "orders".into() }
        );
        // Whatever the driver said, the password is starred out of the line.
        assert_eq!(redact_password(url, "x hunter2-long y".to_owned()), "x *** y");
        assert_eq!(redact_password("postgres://a:p%40ss@h/d", "p@ss and p%40ss".to_owned()), "*** and ***");
        let e = StoreError::Database(sqlx::Error::Io(io::ErrorKind::ConnectionRefused.into()));
        let line = database(url, Stage::Open, &e);
        assert!(line.contains("db.internal:6432") && !line.contains("hunter2"), "{line}");
    }
}

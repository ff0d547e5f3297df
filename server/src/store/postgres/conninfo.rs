//! The database URL as outboxd hands it to sqlx (ADR 0081).
//!
//! sqlx reads libpq's URL parameters, but two of `sslmode`'s meanings are weaker in sqlx than in
//! libpq, and a parameter sqlx does not know is skipped with a warning that logs its value. A
//! URL written for libpq therefore keeps libpq's meaning here where sqlx's would check less
//! (`sslmode=require` with a CA file checks the chain, `allow` may still encrypt,
//! `sslrootcert=system` asks for `verify-full`), is refused where it asks for a check that sqlx
//! cannot make, and loses every other parameter sqlx does not read, logged by name only: a query
//! value may be a secret.
use std::borrow::Cow;

use crate::store::StoreError;

/// The parameters sqlx reads (`PgConnectOptions::parse_from_url` of sqlx-postgres 0.9), besides
/// `options[NAME]`.
const READ_BY_SQLX: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

const MODE: &[&str] = &["sslmode", "ssl-mode"];
const ROOT_CERT: &[&str] = &["sslrootcert", "ssl-root-cert", "ssl-ca"];

/// libpq parameters, with the value that matters (`None`: any), that ask for a check sqlx does
/// not make: connecting without the check would be weaker than the URL says.
const UNSUPPORTED: &[(&str, Option<&str>, &str)] = &[
    ("sslpassword", None, "a client key encrypted with a password"),
    ("sslcrl", None, "certificate revocation lists"),
    ("sslcrldir", None, "certificate revocation lists"),
    ("requirepeer", None, "a check of the Unix socket's peer"),
    ("channel_binding", Some("require"), "SCRAM channel binding"),
    ("gssencmode", Some("require"), "GSSAPI encryption"),
    ("sslcertmode", Some("require"), "a client certificate the server asked for"),
    ("ssl_min_protocol_version", Some("tlsv1.3"), "TLS 1.3 at least"),
];

/// `url` as sqlx should read it: borrowed unchanged when nothing needs changing (a SQLite URL,
/// a URL without parameters, or one that sqlx reads as libpq does). Errors name a parameter,
/// never a value.
pub fn prepare(url: &str) -> Result<Cow<'_, str>, StoreError> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Ok(Cow::Borrowed(url));
    }
    let mut parsed =
        url::Url::parse(url).map_err(|e| StoreError::InvalidValue(format!("the database URL is not a URL: {e}")))?;
    if parsed.query().is_none() {
        return Ok(Cow::Borrowed(url));
    }
    let pairs: Vec<(String, String)> = parsed.query_pairs().into_owned().collect();
    for (key, value) in &pairs {
        if let Some((_, _, what)) =
            UNSUPPORTED.iter().find(|(k, v, _)| k == key && v.is_none_or(|v| v.eq_ignore_ascii_case(value)))
        {
            return Err(StoreError::InvalidValue(format!(
                "the database URL's parameter {key} asks for {what}, which outboxd cannot check; \
                 remove it (docs/deploying.md, TLS to PostgreSQL)"
            )));
        }
    }
    // sqlx takes the last of a repeated parameter.
    let last = |keys: &[&str]| pairs.iter().rev().find(|(k, _)| keys.contains(&k.as_str())).map(|(_, v)| v.as_str());
    let given = last(MODE).map(str::to_ascii_lowercase);
    let root_cert = last(ROOT_CERT);
    let system_roots = root_cert == Some("system");
    let mode = match (given.as_deref(), system_roots) {
        // libpq 16: the system's CAs mean verify-full, and nothing weaker. sqlx trusts the
        // system's CAs in every verifying mode, so the parameter itself is dropped.
        (None, true) => Some("verify-full"),
        (Some("verify-full"), true) => Some("verify-full"),
        (Some(_), true) => {
            return Err(StoreError::InvalidValue(
                "the database URL's sslrootcert=system needs sslmode=verify-full (or no sslmode), as in libpq".into(),
            ));
        }
        // libpq checks the chain under `require` when it has a CA file; sqlx never does.
        (Some("require"), false) if root_cert.is_some() => Some("verify-ca"),
        // sqlx reads `allow` as `disable`; libpq's `allow` encrypts when the server insists.
        // `prefer` accepts what `allow` accepts, trying TLS first.
        (Some("allow"), false) => Some("prefer"),
        (other, false) => other,
    };
    let mut ignored = Vec::new();
    let mut kept = Vec::with_capacity(pairs.len());
    for (key, value) in &pairs {
        if MODE.contains(&key.as_str()) || (system_roots && ROOT_CERT.contains(&key.as_str())) {
            continue;
        }
        if READ_BY_SQLX.contains(&key.as_str()) || key.starts_with("options[") {
            kept.push((key.as_str(), value.as_str()));
        } else {
            ignored.push(key.as_str());
        }
    }
    if mode == given.as_deref() && !system_roots && ignored.is_empty() {
        return Ok(Cow::Borrowed(url));
    }
    if !ignored.is_empty() {
        tracing::warn!(
            parameters = %ignored.join(", "),
            "outboxd does not use these parameters of the database URL; their values are not logged"
        );
    }
    if let Some(mode) = mode {
        kept.push(("sslmode", mode));
    }
    if kept.is_empty() {
        parsed.set_query(None);
    } else {
        parsed.query_pairs_mut().clear().extend_pairs(kept);
    }
    Ok(Cow::Owned(parsed.into()))
}

#[cfg(test)]
mod tests {
    use std::str::FromStr as _;

    use sqlx::ConnectOptions as _;
    use sqlx::postgres::PgConnectOptions;

    use super::prepare;

    /// The `sslmode` sqlx connects with, given `url`.
    fn mode(url: &str) -> String {
        format!("{:?}", PgConnectOptions::from_str(&prepare(url).unwrap()).unwrap().get_ssl_mode())
    }

    #[test]
    fn a_url_that_sqlx_reads_as_libpq_does_is_passed_unchanged() {
        for url in [
            "sqlite://outbox.db?mode=rwc",
            "postgres://u:p%40ss@db:5432/app",
            "postgres://u@db/app?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
            "postgresql://u@db/app?sslmode=require&application_name=x&options[search_path]=a",
            "postgres://u@db/app?sslmode=verify-ca&sslrootcert=ca.pem&sslcert=c.pem&sslkey=c.key",
        ] {
            assert!(matches!(prepare(url).unwrap(), std::borrow::Cow::Borrowed(u) if u == url), "{url}");
        }
    }

    #[test]
    fn sslmode_keeps_its_libpq_meaning_where_sqlx_would_check_less() {
        // A CA file makes `require` check the chain.
        assert_eq!(mode("postgres://u@db/app?sslmode=require&sslrootcert=ca.pem"), "VerifyCa");
        assert_eq!(mode("postgres://u@db/app?sslrootcert=ca.pem&ssl-mode=REQUIRE"), "VerifyCa");
        assert_eq!(mode("postgres://u@db/app?sslmode=require"), "Require");
        // `allow` may encrypt; sqlx's would not.
        assert_eq!(mode("postgres://u@db/app?sslmode=allow"), "Prefer");
        // The system's CAs: verify-full, the parameter gone (it is no file).
        let url = prepare("postgres://u:pw@db:6432/app?sslrootcert=system").unwrap().into_owned();
        assert_eq!(url, "postgres://u:pw@db:6432/app?sslmode=verify-full");
        assert_eq!(mode("postgres://u@db/app?sslmode=verify-full&sslrootcert=system"), "VerifyFull");
        let e = prepare("postgres://u@db/app?sslmode=verify-ca&sslrootcert=system").unwrap_err().to_string();
        assert!(e.contains("sslrootcert=system needs sslmode=verify-full"), "{e}");
        // The last of a repeated sslmode counts, as in sqlx.
        assert_eq!(mode("postgres://u@db/app?sslmode=verify-full&sslmode=disable"), "Disable");
    }

    #[test]
    fn a_check_sqlx_cannot_make_is_refused_naming_the_parameter_and_never_its_value() {
        for (url, key) in [
            ("postgres://u@db/app?sslmode=verify-full&sslpassword=hunter2", "sslpassword"),
            ("postgres://u@db/app?sslcrl=hunter2.pem", "sslcrl"),
            ("postgres://u@db/app?channel_binding=require", "channel_binding"),
            ("postgres://u@db/app?ssl_min_protocol_version=TLSv1.3", "ssl_min_protocol_version"),
        ] {
            let e = prepare(url).unwrap_err().to_string();
            assert!(e.contains(key) && !e.contains("hunter2"), "{e}");
        }
        // The same parameters with values that ask for nothing more pass, dropped.
        assert_eq!(
            prepare("postgres://u@db/app?channel_binding=prefer&gssencmode=disable").unwrap(),
            "postgres://u@db/app"
        );
    }

    #[test]
    fn parameters_sqlx_does_not_read_are_dropped_and_the_rest_kept() {
        let url = "postgres://u:p%40ss@db:5432/app?connect_timeout=10&sslmode=verify-full&\
                   sslrootcert=%2Fetc%2Fssl%2Fca%20x.pem&target_session_attrs=read-write&password=s%26cret";
        let prepared = prepare(url).unwrap().into_owned();
        assert!(!prepared.contains("connect_timeout") && !prepared.contains("target_session_attrs"), "{prepared}");
        let opts = PgConnectOptions::from_str(&prepared).unwrap();
        assert_eq!(format!("{:?}", opts.get_ssl_mode()), "VerifyFull");
        assert_eq!((opts.get_host(), opts.get_port(), opts.get_database()), ("db", 5432, Some("app")));
        // The CA file's path and the password survive the round trip through the query string.
        let again = PgConnectOptions::from_str(&prepared).unwrap().to_url_lossy();
        let original = PgConnectOptions::from_str(url).unwrap().to_url_lossy();
        assert_eq!(again, original);
    }
}

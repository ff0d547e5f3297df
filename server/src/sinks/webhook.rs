//! The webhook target (ADR 0033): one `POST` per delivery, signed as the Standard Webhooks
//! specification says (<https://www.standardwebhooks.com/>), so that a partner verifies it with
//! any of that specification's libraries.
//!
//! What the partner receives:
//! - the payload as the body, with `content-type` from the message's `content-type` header
//!   (else `application/octet-stream`);
//! - `webhook-id` (the outbox message id: the partner's dedup key), `webhook-timestamp` (unix
//!   seconds of this attempt) and `webhook-signature` (`v1,` + base64 of HMAC-SHA256 over
//!   `id.timestamp.body`, keyed with the secret's decoded bytes);
//! - each message header as `outbox-header-<name>`, the name lowercased and every byte that an
//!   HTTP header name cannot hold (and `%`) percent-encoded, so no header is renamed onto
//!   another; a header whose *value* HTTP cannot carry (a control character such as a line
//!   break) is left out;
//! - `traceparent` and `tracestate` also as themselves, for the partner's HTTP tracing.
//!
//! What the answer means: 2xx confirms; 429 and 5xx are failed attempts that honour
//! `Retry-After`; a timeout is a failed attempt; a redirect is not followed (a failed attempt
//! naming the `Location`); another 4xx is a failed attempt with the status only: a partner's
//! answer is read (bounded) and dropped, never stored or shown. Internal addresses are refused
//! unless allowed ([`super::destination`]). A partner that cannot be reached at all (connection refused, no route, DNS, TLS
//! handshake) is [`Outcome::Unavailable`]: the delivery is released, not counted against the
//! message, and the sink waits for [`Target::connect`] to reach the partner again.
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use futures::FutureExt as _;
use futures::future::BoxFuture;
use hmac::{Hmac, Mac as _};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use sha2::Sha256;

use super::destination::{Destinations, GuardedResolver};
use super::{ConnectError, Outcome, Publish, Scrubber, Target};
use crate::domain::{SinkKind, WebhookSecret};

/// The longest `Retry-After` honoured; a partner asking for more is retried after this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);
/// How much of an answer's body is read (and dropped) so that the connection can be reused.
pub const BODY_EXCERPT_BYTES: usize = 512;
/// The prefix of the message's headers in the request.
pub const HEADER_PREFIX: &str = "outbox-header-";
/// How long reaching the partner (TCP, TLS) may take, at most (less when the sink's timeout is).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A partner's HTTP endpoint as a sink's target.
pub struct Webhook {
    destinations: Destinations,
    /// Why the URL's host, a literal address, may not be reached (decided once: the client's
    /// resolver sees only names).
    literal_refused: Option<String>,
    url: String,
    key: Vec<u8>,
    timeout: Duration,
    scrub: Scrubber,
    client: Result<reqwest::Client, String>,
}

impl Webhook {
    pub fn new(url: &str, secret: &WebhookSecret, timeout: Duration, destinations: Destinations) -> Self {
        let scrub = Scrubber::for_url(url).with_secret(secret.expose());
        let client = client(timeout, destinations.clone()).map_err(|e| scrub.clean(&e));
        let literal_refused = literal_refusal(url, &destinations);
        Self { destinations, literal_refused, url: url.to_owned(), key: secret.key(), timeout, scrub, client }
    }

    /// Reaching the partner at all: a TCP connection to its host and port (no request), at
    /// an address sinks may reach.
    async fn probe(&self) -> Result<(), ConnectError> {
        self.client.as_ref().map_err(|e| ConnectError(e.clone()))?;
        self.destinations.check_url(&self.url).await.map_err(ConnectError)?;
        let url = url::Url::parse(&self.url).map_err(|e| ConnectError(format!("the webhook URL: {e}")))?;
        let port = url.port_or_known_default().unwrap_or(443);
        let host = match url.host() {
            Some(url::Host::Domain(d)) => d.to_owned(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err(ConnectError("the webhook URL has no host".into())),
        };
        let wait = self.timeout.min(CONNECT_TIMEOUT);
        match tokio::time::timeout(wait, tokio::net::TcpStream::connect((host.as_str(), port))).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(ConnectError(format!("reaching {host}:{port}: {e}"))),
            Err(_) => Err(ConnectError(format!("reaching {host}:{port}: no answer in {wait:?}"))),
        }
    }

    async fn post(&self, m: Publish) -> Outcome {
        let client = match &self.client {
            Ok(c) => c,
            Err(e) => return Outcome::Unavailable { error: e.clone() },
        };
        // A literal address is never resolved, so the client's resolver does not see it.
        if let Some(error) = &self.literal_refused {
            return Outcome::Unavailable { error: error.clone() };
        }
        let timestamp = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let id = m.message_id.to_string();
        let headers = request_headers(&m, &id, timestamp, &sign(&self.key, &id, timestamp, &m.payload));
        let sent = client.post(&self.url).headers(headers).body(m.payload).send().await;
        let mut response = match sent {
            Ok(r) => r,
            Err(e) => return self.unsent(e),
        };
        let status = response.status();
        if status.is_success() {
            // Read the (bounded) rest so that the connection goes back to the pool.
            let _ = excerpt(&mut response).await;
            return Outcome::Confirmed;
        }
        let retry_after =
            response.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| retry_after(v, SystemTime::now()));
        if status.is_redirection() {
            // Where it points is the partner's answer: not kept either.
            return Outcome::Failed {
                reason: "http_3xx",
                error: format!("the partner answered {status}: redirects are not followed"),
                retry_after: None,
            };
        }
        // Drained for the connection's sake, never kept: a partner's answer (or an internal
        // service's, reached by mistake) must not become a dead letter's text that admin:read
        // shows. The status and a fixed reason only.
        let _ = excerpt(&mut response).await;
        let error = format!("the partner answered {status}");
        match status.as_u16() {
            429 => Outcome::Failed { reason: "http_429", error, retry_after },
            500..=599 => Outcome::Failed { reason: "http_5xx", error, retry_after },
            400..=499 => Outcome::Failed { reason: "http_4xx", error, retry_after: None },
            _ => Outcome::Failed { reason: "http_other", error, retry_after: None },
        }
    }

    /// A request that got no answer.
    fn unsent(&self, e: reqwest::Error) -> Outcome {
        // The error's URL could hold a token in its query: never shown.
        let (connect, timeout) = (e.is_connect(), e.is_timeout());
        let error = self.scrub.clean(&chain(&e.without_url()));
        if connect {
            Outcome::Unavailable { error: format!("cannot reach the webhook: {error}") }
        } else if timeout {
            Outcome::Failed {
                reason: "timeout",
                error: format!("no answer within {:?}: {error}", self.timeout),
                retry_after: None,
            }
        } else {
            Outcome::Failed { reason: "http_error", error, retry_after: None }
        }
    }
}

/// An error with its sources, one after the other (reqwest's own text is only the outermost).
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

/// Why a URL whose host is a literal address may not be reached, if it may not.
fn literal_refusal(url: &str, destinations: &Destinations) -> Option<String> {
    let Ok(url) = url::Url::parse(url) else { return Some("the webhook URL does not parse".into()) };
    let ip = match url.host() {
        Some(url::Host::Ipv4(ip)) => std::net::IpAddr::V4(ip),
        Some(url::Host::Ipv6(ip)) => std::net::IpAddr::V6(ip),
        _ => return None,
    };
    destinations.refusal(ip).map(super::destination::refused)
}

fn client(timeout: Duration, destinations: Destinations) -> Result<reqwest::Client, String> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(native.certs);
    let tls =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS set-up: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
    tracing::debug!(roots = added, "webhook client: system root certificates loaded");
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .user_agent(concat!("outboxd/", env!("CARGO_PKG_VERSION")))
        .redirect(reqwest::redirect::Policy::none())
        // Every name resolved at connect time, without the addresses sinks may not reach.
        .dns_resolver(std::sync::Arc::new(GuardedResolver(destinations)))
        // Only the URL decides where a delivery goes: no HTTP(S)_PROXY from the environment.
        .no_proxy()
        .timeout(timeout)
        .connect_timeout(timeout.min(CONNECT_TIMEOUT))
        .build()
        .map_err(|e| format!("building the HTTP client: {}", chain(&e)))
}

/// The Standard Webhooks signature header's value: `v1,` + base64(HMAC-SHA256(key, `id.ts.body`)).
pub fn sign(key: &[u8], id: &str, timestamp: u64, body: &[u8]) -> String {
    // HMAC takes keys of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()))
}

fn request_headers(m: &Publish, id: &str, timestamp: u64, signature: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    let mut content_type = None;
    for (k, v) in &m.headers {
        let Ok(value) = HeaderValue::from_str(v) else { continue };
        if k.eq_ignore_ascii_case("content-type") {
            content_type = Some(value.clone());
        }
        let lower = k.to_ascii_lowercase();
        if (lower == "traceparent" || lower == "tracestate")
            && let Ok(name) = HeaderName::from_bytes(lower.as_bytes())
        {
            h.insert(name, value.clone());
        }
        if let Ok(name) = HeaderName::from_bytes(header_name(k).as_bytes()) {
            h.append(name, value);
        }
    }
    h.insert(
        reqwest::header::CONTENT_TYPE,
        content_type.unwrap_or_else(|| HeaderValue::from_static("application/octet-stream")),
    );
    // Set last: a message header cannot stand in for these.
    for (name, value) in [
        ("webhook-id", id.to_owned()),
        ("webhook-timestamp", timestamp.to_string()),
        ("webhook-signature", signature.to_owned()),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            h.insert(HeaderName::from_static(name), value);
        }
    }
    h
}

/// `outbox-header-` + the name, lowercased, with every byte that is not an HTTP token
/// character (RFC 9110 `tchar`), and `%`, written as `%XX`.
pub fn header_name(key: &str) -> String {
    let mut out = String::with_capacity(HEADER_PREFIX.len() + key.len());
    out.push_str(HEADER_PREFIX);
    for b in key.bytes() {
        let token = b.is_ascii_alphanumeric() || b"!#$&'*+-.^_`|~".contains(&b);
        if token {
            out.push(char::from(b.to_ascii_lowercase()));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `Retry-After` as seconds or as an HTTP date, capped at [`MAX_RETRY_AFTER`].
pub fn retry_after(value: &HeaderValue, now: SystemTime) -> Option<Duration> {
    let text = value.to_str().ok()?.trim();
    let wait = match text.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => httpdate::parse_http_date(text).ok()?.duration_since(now).unwrap_or(Duration::ZERO),
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// The start of the body, as text on one line, at most [`BODY_EXCERPT_BYTES`] read (drained,
/// so that the connection goes back to the pool).
async fn excerpt(response: &mut reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < BODY_EXCERPT_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk[..chunk.len().min(BODY_EXCERPT_BYTES - body.len())]),
            Ok(None) | Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&body);
    let mut line: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if body.len() >= BODY_EXCERPT_BYTES {
        line.push('…');
    }
    line.trim().to_owned()
}

impl Target for Webhook {
    fn kind(&self) -> SinkKind {
        SinkKind::Webhook
    }

    fn connect(&self) -> BoxFuture<'_, Result<(), ConnectError>> {
        self.probe().boxed()
    }

    fn publish(&self, message: Publish) -> BoxFuture<'_, Outcome> {
        self.post(message).boxed()
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        async {}.boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_are_lowercased_and_encoded_without_collisions() {
        assert_eq!(header_name("Tenant-Id"), "outbox-header-tenant-id");
        assert_eq!(header_name("a b"), "outbox-header-a%20b");
        assert_eq!(header_name("a%20b"), "outbox-header-a%2520b");
        assert_eq!(header_name("é"), "outbox-header-%C3%A9");
        assert!(HeaderName::from_bytes(header_name("x:y\r\n").as_bytes()).is_ok());
    }

    #[test]
    fn retry_after_takes_seconds_or_a_date_and_is_capped() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(retry_after(&v("7"), now), Some(Duration::from_secs(7)));
        assert_eq!(retry_after(&v("999999"), now), Some(MAX_RETRY_AFTER));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(120));
        assert_eq!(retry_after(&HeaderValue::from_str(&later).unwrap(), now), Some(Duration::from_secs(120)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(120));
        assert_eq!(retry_after(&HeaderValue::from_str(&earlier).unwrap(), now), Some(Duration::ZERO));
        assert_eq!(retry_after(&v("soon"), now), None);
    }

    #[test]
    fn the_signature_is_the_standard_webhooks_one() {
        // The example of the Standard Webhooks specification's reference libraries.
        let key = base64::engine::general_purpose::STANDARD.decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let sig = sign(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, br#"{"test": 2432232314}"#);
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }
}

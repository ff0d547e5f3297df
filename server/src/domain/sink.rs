//! Sinks: consumers that outboxd delivers itself, to a broker or a webhook.
//!
//! A sink is parsed once at the edge like every other consumer field: URLs have the scheme
//! their target speaks, templates use only the known placeholders, a webhook secret decodes.
//! What a sink holds that is secret (a password in a URL, a webhook's signing secret) is
//! write-only: [`Sink::redacted`] is what every answer, log line and `outboxctl` shows.
use std::fmt;
use std::time::Duration;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::InvalidField;

/// What a secret is shown as, anywhere outside the store.
pub const REDACTED: &str = "***";

/// How a value sealed with the operator's sink key is stored (`--sink-key-file`).
pub const SEALED_PREFIX: &str = "sealed:v1:";

/// A sink consumer's target and its pipelining.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sink {
    pub target: SinkTarget,
    /// Concurrent unconfirmed publishes.
    pub max_in_flight: u32,
    /// The principal that created it (with an auth file): the sink runs only while that
    /// principal may still create it and read its topics. `None`: created without an auth file
    /// (or before outboxd recorded it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
}

impl Sink {
    pub const DEFAULT_MAX_IN_FLIGHT: u32 = 64;
    /// Bounded like a stream's `max_in_flight`.
    pub const MAX_IN_FLIGHT: u32 = 10_000;

    pub fn kind(&self) -> SinkKind {
        self.target.kind()
    }

    /// The same sink with its secrets replaced by `***`.
    pub fn redacted(&self) -> Sink {
        Sink { target: self.target.redacted(), max_in_flight: self.max_in_flight, created_by: self.created_by.clone() }
    }

    /// The same sink as a definition: who created it is not part of what it is.
    pub fn definition(&self) -> Sink {
        Sink { created_by: None, ..self.clone() }
    }
}

/// Never prints a secret.
impl fmt::Debug for Sink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = self.redacted();
        f.debug_struct("Sink")
            .field("target", &shown.target)
            .field("max_in_flight", &shown.max_in_flight)
            .field("created_by", &shown.created_by)
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SinkKind {
    RabbitMq,
    Nats,
    Webhook,
}

impl SinkKind {
    /// The name in stats, metrics labels and `outboxctl --sink`.
    pub fn as_str(self) -> &'static str {
        match self {
            SinkKind::RabbitMq => "rabbitmq",
            SinkKind::Nats => "nats",
            SinkKind::Webhook => "webhook",
        }
    }
}

impl fmt::Display for SinkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SinkTarget {
    #[serde(rename = "rabbitmq")]
    RabbitMq {
        url: String,
        /// "" is the default exchange.
        exchange: String,
        routing_key: Template,
    },
    Nats {
        url: String,
        subject: Template,
    },
    Webhook {
        url: String,
        secret: WebhookSecret,
        #[serde(with = "millis")]
        timeout: Duration,
    },
}

impl fmt::Debug for SinkTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.redacted() {
            SinkTarget::RabbitMq { url, exchange, routing_key } => f
                .debug_struct("RabbitMq")
                .field("url", &url)
                .field("exchange", &exchange)
                .field("routing_key", &routing_key.as_str())
                .finish(),
            SinkTarget::Nats { url, subject } => {
                f.debug_struct("Nats").field("url", &url).field("subject", &subject.as_str()).finish()
            }
            SinkTarget::Webhook { url, timeout, .. } => f
                .debug_struct("Webhook")
                .field("url", &url)
                .field("secret", &REDACTED)
                .field("timeout", &timeout)
                .finish(),
        }
    }
}

impl SinkTarget {
    pub const DEFAULT_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);
    /// A webhook that takes longer than this is a broken partner, not a slow one.
    pub const MAX_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(300);
    pub const MAX_URL_LEN: usize = 2048;

    pub fn kind(&self) -> SinkKind {
        match self {
            SinkTarget::RabbitMq { .. } => SinkKind::RabbitMq,
            SinkTarget::Nats { .. } => SinkKind::Nats,
            SinkTarget::Webhook { .. } => SinkKind::Webhook,
        }
    }

    /// The RabbitMQ target, checked: `amqp://` or `amqps://`; an exchange name of at most 255
    /// bytes; a routing-key template ("" = `{topic}`).
    pub fn rabbitmq(field: &str, url: &str, exchange: &str, routing_key: &str) -> Result<Self, InvalidField> {
        check_url(&format!("{field}.url"), url, &["amqp", "amqps"])?;
        if exchange.len() > 255 {
            return Err(InvalidField::new(
                format!("{field}.exchange"),
                format!("exchange name is {} bytes, longer than the 255 AMQP allows", exchange.len()),
            ));
        }
        let routing_key = Template::parse(&format!("{field}.routing_key"), routing_key)?;
        Ok(SinkTarget::RabbitMq { url: url.to_owned(), exchange: exchange.to_owned(), routing_key })
    }

    /// The NATS JetStream target, checked: `nats://` (or `tls://`); a subject template.
    pub fn nats(field: &str, url: &str, subject: &str) -> Result<Self, InvalidField> {
        check_url(&format!("{field}.url"), url, &["nats", "tls"])?;
        let subject = Template::parse(&format!("{field}.subject"), subject)?;
        if subject.as_str().contains(char::is_whitespace) {
            return Err(InvalidField::new(format!("{field}.subject"), "a NATS subject must not contain whitespace"));
        }
        Ok(SinkTarget::Nats { url: url.to_owned(), subject })
    }

    /// The webhook target, checked: `https://`, or `http://` to a loopback host only; a
    /// `whsec_` secret; a timeout (`None` = 10 s) of at most 5 minutes.
    pub fn webhook(field: &str, url: &str, secret: &str, timeout: Option<Duration>) -> Result<Self, InvalidField> {
        let parsed = check_url(&format!("{field}.url"), url, &["https", "http"])?;
        if parsed.scheme() == "http" && !is_loopback(&parsed) {
            return Err(InvalidField::new(
                format!("{field}.url"),
                // Shown redacted: the refusal goes back to the caller and into the audit log.
                format!("{:?}: plain http:// is allowed only to a loopback host; use https://", redact_url(url)),
            ));
        }
        let secret = WebhookSecret::parse(&format!("{field}.secret"), secret)?;
        let timeout = match timeout {
            None => Self::DEFAULT_WEBHOOK_TIMEOUT,
            Some(t) if t.is_zero() => Self::DEFAULT_WEBHOOK_TIMEOUT,
            Some(t) if t > Self::MAX_WEBHOOK_TIMEOUT => {
                return Err(InvalidField::new(
                    format!("{field}.timeout"),
                    format!("{t:?} is longer than the limit of {:?}", Self::MAX_WEBHOOK_TIMEOUT),
                ));
            }
            Some(t) => t,
        };
        Ok(SinkTarget::Webhook { url: url.to_owned(), secret, timeout })
    }

    /// Secrets replaced by `***`: a URL's password, a webhook's secret.
    pub fn redacted(&self) -> SinkTarget {
        match self {
            SinkTarget::RabbitMq { url, exchange, routing_key } => SinkTarget::RabbitMq {
                url: redact_url(url),
                exchange: exchange.clone(),
                routing_key: routing_key.clone(),
            },
            SinkTarget::Nats { url, subject } => SinkTarget::Nats { url: redact_url(url), subject: subject.clone() },
            SinkTarget::Webhook { url, timeout, .. } => {
                SinkTarget::Webhook { url: redact_url(url), secret: WebhookSecret::redacted(), timeout: *timeout }
            }
        }
    }

    /// The target's URL with its password (if any) shown as `***`: for logs.
    pub fn shown_url(&self) -> String {
        match self {
            SinkTarget::RabbitMq { url, .. } | SinkTarget::Nats { url, .. } | SinkTarget::Webhook { url, .. } => {
                redact_url(url)
            }
        }
    }
}

fn check_url(field: &str, url: &str, schemes: &[&str]) -> Result<url::Url, InvalidField> {
    if url.len() > SinkTarget::MAX_URL_LEN {
        return Err(InvalidField::new(
            field,
            format!("URL is {} bytes, longer than the limit of {}", url.len(), SinkTarget::MAX_URL_LEN),
        ));
    }
    let parsed = url::Url::parse(url).map_err(|e| InvalidField::new(field, format!("not a URL ({e})")))?;
    if !schemes.contains(&parsed.scheme()) {
        let wanted: Vec<String> = schemes.iter().map(|s| format!("{s}://")).collect();
        return Err(InvalidField::new(
            field,
            format!("scheme {}:// is not one of {}", parsed.scheme(), wanted.join(", ")),
        ));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(InvalidField::new(field, "URL has no host"));
    }
    Ok(parsed)
}

fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// The URL with every part that may hold a secret replaced by `***`: the password (a user name
/// beside a password stays: it says who, not how), a user part alone (a NATS token is written
/// `nats://TOKEN@host`), every query value (a webhook's `?token=`), the fragment.
pub fn redact_url(url: &str) -> String {
    if url.starts_with(SEALED_PREFIX) {
        return REDACTED.to_owned();
    }
    let Ok(mut parsed) = url::Url::parse(url) else {
        // Not stored unless it parsed; never print what might be a secret.
        return REDACTED.to_owned();
    };
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some(REDACTED));
    } else if !parsed.username().is_empty() {
        let _ = parsed.set_username(REDACTED);
    }
    if parsed.query().is_some() {
        let keys: Vec<String> = parsed.query_pairs().map(|(k, _)| k.into_owned()).collect();
        let mut query = parsed.query_pairs_mut();
        query.clear();
        for k in keys {
            query.append_pair(&k, REDACTED);
        }
        drop(query);
    }
    if parsed.fragment().is_some() {
        parsed.set_fragment(Some(REDACTED));
    }
    parsed.to_string()
}

/// A routing-key or subject template: literal text with `{topic}`, `{type}` and
/// `{ordering_key}` placeholders. Empty means `{topic}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Template(String);

/// The placeholders a template may use.
pub const PLACEHOLDERS: [&str; 3] = ["topic", "type", "ordering_key"];

impl Template {
    pub const MAX_LEN: usize = 255;

    pub fn parse(field: &str, s: &str) -> Result<Self, InvalidField> {
        let s = if s.is_empty() { "{topic}" } else { s };
        if s.len() > Self::MAX_LEN {
            return Err(InvalidField::new(
                field,
                format!("template is {} bytes, longer than the limit of {}", s.len(), Self::MAX_LEN),
            ));
        }
        let mut rest = s;
        while let Some(open) = rest.find(['{', '}']) {
            if rest.as_bytes()[open] == b'}' {
                return Err(InvalidField::new(field, format!("{s:?} has a '}}' without its '{{'")));
            }
            let after = &rest[open + 1..];
            let Some(close) = after.find('}') else {
                return Err(InvalidField::new(field, format!("{s:?} has a '{{' without its '}}'")));
            };
            let name = &after[..close];
            if !PLACEHOLDERS.contains(&name) {
                return Err(InvalidField::new(
                    field,
                    format!("unknown placeholder {{{name}}} in {s:?}; known: {{topic}}, {{type}}, {{ordering_key}}"),
                ));
            }
            rest = &after[close + 1..];
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The template with its placeholders filled in (a missing ordering key is "").
    pub fn render(&self, topic: &str, type_: &str, ordering_key: Option<&str>) -> String {
        let mut out = String::with_capacity(self.0.len() + topic.len());
        let mut rest = self.0.as_str();
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let after = &rest[open + 1..];
            // Parsed templates always close their braces.
            let close = after.find('}').unwrap_or(after.len());
            match &after[..close] {
                "topic" => out.push_str(topic),
                "type" => out.push_str(type_),
                "ordering_key" => out.push_str(ordering_key.unwrap_or("")),
                other => out.push_str(other),
            }
            rest = after.get(close + 1..).unwrap_or("");
        }
        out.push_str(rest);
        out
    }
}

impl TryFrom<String> for Template {
    type Error = InvalidField;
    fn try_from(s: String) -> Result<Self, InvalidField> {
        Template::parse("template", &s)
    }
}

impl From<Template> for String {
    fn from(t: Template) -> String {
        t.0
    }
}

/// A Standard Webhooks signing secret: `whsec_` + base64 of the key bytes.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WebhookSecret(String);

impl WebhookSecret {
    pub const PREFIX: &'static str = "whsec_";

    pub fn parse(field: &str, s: &str) -> Result<Self, InvalidField> {
        let Some(b64) = s.strip_prefix(Self::PREFIX) else {
            return Err(InvalidField::new(field, "a webhook secret starts with \"whsec_\" followed by base64"));
        };
        let key = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| InvalidField::new(field, format!("the part after \"whsec_\" is not base64 ({e})")))?;
        if !(24..=64).contains(&key.len()) {
            return Err(InvalidField::new(
                field,
                format!("the key is {} bytes; a webhook secret holds 24 to 64", key.len()),
            ));
        }
        Ok(Self(s.to_owned()))
    }

    fn redacted() -> Self {
        Self(REDACTED.to_owned())
    }

    /// The HMAC key: the decoded bytes after `whsec_`.
    pub fn key(&self) -> Vec<u8> {
        self.0
            .strip_prefix(Self::PREFIX)
            .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
            .unwrap_or_default()
    }

    /// The secret as written (only for the store).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// A secret as the store holds it (sealed, or as written), unchecked.
    pub fn stored(s: String) -> Self {
        Self(s)
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis().try_into().unwrap_or(u64::MAX))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_any_part_that_may_be_a_secret() {
        assert_eq!(redact_url("amqp://app:pw@h:5672/%2f"), "amqp://app:***@h:5672/%2f");
        assert_eq!(redact_url("nats://s3cr3t-token@h:4222"), "nats://***@h:4222");
        assert_eq!(
            redact_url("https://partner.example/hook?token=abc&v=1"),
            "https://partner.example/hook?token=***&v=***"
        );
        assert_eq!(redact_url("https://partner.example/hook#k"), "https://partner.example/hook#***");
        assert_eq!(redact_url("https://partner.example/hook"), "https://partner.example/hook");
        assert_eq!(redact_url("not a url with pw"), "***");
    }

    #[test]
    fn templates_render_their_placeholders_and_refuse_unknown_ones() {
        let t = Template::parse("f", "events.{topic}.{type}.{ordering_key}").unwrap();
        assert_eq!(t.render("orders", "OrderPlaced", Some("o-1")), "events.orders.OrderPlaced.o-1");
        assert_eq!(t.render("orders", "OrderPlaced", None), "events.orders.OrderPlaced.");
        assert_eq!(Template::parse("f", "").unwrap().render("a.b", "T", None), "a.b");
        assert_eq!(Template::parse("f", "fixed").unwrap().render("a", "T", None), "fixed");
        let e = Template::parse("sink.subject", "x.{tenant}").unwrap_err();
        assert_eq!(e.field, "sink.subject");
        assert!(e.reason.contains("{tenant}"), "{e}");
        assert!(Template::parse("f", "x.{topic").is_err());
        assert!(Template::parse("f", "x.topic}").is_err());
        assert!(Template::parse("f", &"x".repeat(256)).is_err());
    }

    #[test]
    fn urls_are_checked_for_their_target() {
        assert!(SinkTarget::rabbitmq("s", "amqp://guest:guest@127.0.0.1:5672/%2f", "", "").is_ok());
        let e = SinkTarget::rabbitmq("sink.rabbitmq", "nats://x", "", "").unwrap_err();
        assert_eq!(e.field, "sink.rabbitmq.url");
        assert!(e.reason.contains("amqp://"), "{e}");
        assert!(SinkTarget::nats("s", "nats://127.0.0.1:4222", "").is_ok());
        assert!(SinkTarget::nats("s", "nats://127.0.0.1:4222", "a b").is_err());
        let secret = format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode([7u8; 32]));
        assert!(SinkTarget::webhook("s", "https://partner.example/hook", &secret, None).is_ok());
        assert!(SinkTarget::webhook("s", "http://127.0.0.1:9/hook", &secret, None).is_ok());
        assert!(SinkTarget::webhook("s", "http://localhost:9/hook", &secret, None).is_ok());
        let e = SinkTarget::webhook("s", "http://partner.example/hook", &secret, None).unwrap_err();
        assert!(e.reason.contains("loopback"), "{e}");
        // The refusal goes back to the caller and into the audit log: the URL is shown redacted.
        let e = SinkTarget::webhook("s", "http://u:PASSWORD@10.0.0.1/x?token=t0k", &secret, None).unwrap_err();
        assert!(e.reason.contains("http://u:***@10.0.0.1/x?token=***"), "{e}");
        assert!(!e.to_string().contains("PASSWORD") && !e.to_string().contains("t0k"), "{e}");
        let e = SinkTarget::webhook("s", "https://p.example/", "hunter2", None).unwrap_err();
        assert_eq!(e.field, "s.secret");
        let e = SinkTarget::webhook("s", "https://p.example/", &secret, Some(Duration::from_secs(301))).unwrap_err();
        assert_eq!(e.field, "s.timeout");
    }

    #[test]
    fn secrets_never_show() {
        let secret = format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode([7u8; 32]));
        let hook = Sink {
            target: SinkTarget::webhook("s", "https://p.example/", &secret, None).unwrap(),
            max_in_flight: 1,
            created_by: None,
        };
        let rabbit = Sink {
            target: SinkTarget::rabbitmq("s", "amqp://app:s3cr3t@127.0.0.1:5672/%2f", "x", "").unwrap(),
            max_in_flight: 1,
            created_by: None,
        };
        for sink in [&hook, &rabbit] {
            let debug = format!("{sink:?}");
            assert!(!debug.contains("s3cr3t") && !debug.contains(&secret[6..]), "{debug}");
            let json = serde_json::to_string(&sink.redacted()).unwrap();
            assert!(!json.contains("s3cr3t") && !json.contains(&secret[6..]), "{json}");
        }
        assert_eq!(rabbit.target.shown_url(), "amqp://app:***@127.0.0.1:5672/%2f");
        // The store keeps what it needs to connect.
        let stored: Sink = serde_json::from_str(&serde_json::to_string(&hook).unwrap()).unwrap();
        assert_eq!(stored, hook);
        assert_eq!(stored.target.clone(), hook.target);
        if let SinkTarget::Webhook { secret, .. } = &stored.target {
            assert_eq!(secret.key(), vec![7u8; 32]);
        }
    }
}

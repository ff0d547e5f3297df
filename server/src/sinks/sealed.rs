//! Sink secrets sealed at rest with the operator's key (`--sink-key-file`).
//!
//! A sink's URL (which may carry a password, a token or query values) and a webhook's signing
//! secret are stored as `sealed:v1:` + base64 of AES-256-SIV over the value, with the field's
//! name as associated data. SIV is deterministic: the same value seals to the same text, so a
//! repeated `CreateConsumer` is still recognised as the same definition; what is revealed is
//! equality (across sinks too) and each value's length, never a byte of it (docs/security.md
//! says so). Whoever reads `outbox.consumers` without the key sees no secret.
use std::path::{Path, PathBuf};

use aes_siv::KeyInit as _;
use aes_siv::siv::Aes256Siv;
use base64::Engine as _;

use crate::domain::sink::SEALED_PREFIX;
use crate::domain::{Sink, SinkTarget, WebhookSecret};

/// The key: 64 bytes (AES-256-SIV's two halves), read once at start.
pub struct SinkKey {
    key: [u8; 64],
}

/// Never shows the key.
impl std::fmt::Debug for SinkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SinkKey(***)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("--sink-key-file: cannot read {}: {source}", path.display())]
    KeyRead { path: PathBuf, source: std::io::Error },
    /// The file's text is no key; the error never shows it.
    #[error("--sink-key-file: {} {cause} (make one with `openssl rand -base64 64`)", path.display())]
    KeyInvalid { path: PathBuf, cause: String },
    #[error(
        "its {0} is sealed and this outboxd has no --sink-key-file (or another key): give it the key it was created with"
    )]
    CannotOpen(&'static str),
}

impl SinkKey {
    /// Reads a key file: base64 of 64 random bytes (`openssl rand -base64 64`), whitespace
    /// ignored. The error never shows the file's text.
    pub fn from_file(path: &Path) -> Result<Self, SealError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| SealError::KeyRead { path: path.to_owned(), source })?;
        let invalid = |cause: String| SealError::KeyInvalid { path: path.to_owned(), cause };
        let compact: String = text.split_whitespace().collect();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(compact)
            .map_err(|_| invalid("is not base64".to_owned()))?;
        let key: [u8; 64] =
            bytes.try_into().map_err(|b: Vec<u8>| invalid(format!("holds {} bytes; the key is 64", b.len())))?;
        Ok(Self { key })
    }

    pub fn from_bytes(key: [u8; 64]) -> Self {
        Self { key }
    }

    fn cipher(&self) -> Aes256Siv {
        Aes256Siv::new(&self.key.into())
    }

    fn seal_value(&self, field: &'static str, value: &str) -> String {
        if value.starts_with(SEALED_PREFIX) {
            return value.to_owned();
        }
        match self.cipher().encrypt([field.as_bytes()], value.as_bytes()) {
            Ok(sealed) => format!("{SEALED_PREFIX}{}", base64::engine::general_purpose::STANDARD.encode(sealed)),
            // AES-SIV fails only on more associated data than it takes; one item never does.
            Err(_) => value.to_owned(),
        }
    }

    fn open_value(&self, field: &'static str, value: &str) -> Result<String, SealError> {
        let Some(b64) = value.strip_prefix(SEALED_PREFIX) else { return Ok(value.to_owned()) };
        let sealed = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| SealError::CannotOpen(field))?;
        let plain = self.cipher().decrypt([field.as_bytes()], &sealed).map_err(|_| SealError::CannotOpen(field))?;
        String::from_utf8(plain).map_err(|_| SealError::CannotOpen(field))
    }

    /// The sink with its URL and secret sealed, as the store keeps it.
    pub fn seal(&self, sink: &Sink) -> Sink {
        let target = match &sink.target {
            SinkTarget::RabbitMq { url, exchange, routing_key } => SinkTarget::RabbitMq {
                url: self.seal_value("url", url),
                exchange: exchange.clone(),
                routing_key: routing_key.clone(),
            },
            SinkTarget::Nats { url, subject } => {
                SinkTarget::Nats { url: self.seal_value("url", url), subject: subject.clone() }
            }
            SinkTarget::Webhook { url, secret, timeout } => SinkTarget::Webhook {
                url: self.seal_value("url", url),
                secret: WebhookSecret::stored(self.seal_value("secret", secret.expose())),
                timeout: *timeout,
            },
        };
        Sink { target, ..sink.clone() }
    }

    fn open_sink(&self, sink: &Sink) -> Result<Sink, SealError> {
        let target = match &sink.target {
            SinkTarget::RabbitMq { url, exchange, routing_key } => SinkTarget::RabbitMq {
                url: self.open_value("url", url)?,
                exchange: exchange.clone(),
                routing_key: routing_key.clone(),
            },
            SinkTarget::Nats { url, subject } => {
                SinkTarget::Nats { url: self.open_value("url", url)?, subject: subject.clone() }
            }
            SinkTarget::Webhook { url, secret, timeout } => SinkTarget::Webhook {
                url: self.open_value("url", url)?,
                secret: WebhookSecret::stored(self.open_value("secret", secret.expose())?),
                timeout: *timeout,
            },
        };
        Ok(Sink { target, ..sink.clone() })
    }
}

/// The sink as it was given, for connecting to its target: sealed values opened with `key`;
/// values stored plain (created without a key) pass as they are.
pub fn open(key: Option<&SinkKey>, sink: &Sink) -> Result<Sink, SealError> {
    match key {
        Some(k) => k.open_sink(sink),
        None => {
            let sealed = match &sink.target {
                SinkTarget::RabbitMq { url, .. } | SinkTarget::Nats { url, .. } => url.starts_with(SEALED_PREFIX),
                SinkTarget::Webhook { url, secret, .. } => {
                    url.starts_with(SEALED_PREFIX) || secret.expose().starts_with(SEALED_PREFIX)
                }
            };
            if sealed { Err(SealError::CannotOpen("url")) } else { Ok(sink.clone()) }
        }
    }
}

/// The sink to show (then redacted): opened where the key opens it; a value that cannot be
/// opened shows as `***` like every secret.
pub fn shown(key: Option<&SinkKey>, sink: &Sink) -> Sink {
    open(key, sink).unwrap_or_else(|_| sink.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn webhook() -> Sink {
        let secret = format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode([7u8; 32]));
        Sink {
            target: SinkTarget::webhook("s", "https://partner.example/hook?token=s3cr3t", &secret, None).unwrap(),
            max_in_flight: 4,
            created_by: Some("alice".into()),
        }
    }

    #[test]
    fn sealed_sinks_hold_no_secret_and_open_to_what_was_given() {
        let key = SinkKey::from_bytes([9; 64]);
        let sink = webhook();
        let sealed = key.seal(&sink);
        let stored = serde_json::to_string(&sealed).unwrap();
        assert!(!stored.contains("s3cr3t") && !stored.contains("whsec_"), "{stored}");
        assert!(stored.contains(SEALED_PREFIX));
        assert_eq!(key.seal(&sink), sealed, "sealing is deterministic: a repeated create is the same definition");
        assert_eq!(key.seal(&sealed), sealed, "sealed values are not sealed twice");
        assert_eq!(open(Some(&key), &sealed).unwrap(), sink);
        // Plain values (created before the key) pass; a sealed one needs the same key.
        assert_eq!(open(Some(&key), &sink).unwrap(), sink);
        let err = open(None, &sealed).unwrap_err();
        assert!(err.to_string().contains("--sink-key-file"), "{err}");
        assert!(open(Some(&SinkKey::from_bytes([1; 64])), &sealed).is_err());
        // What is shown without the key is redacted, never the ciphertext.
        let shown = format!("{:?}", shown(None, &sealed));
        assert!(!shown.contains(SEALED_PREFIX) && shown.contains("***"), "{shown}");
    }

    #[test]
    fn a_value_sealed_for_one_field_does_not_open_as_another() {
        let key = SinkKey::from_bytes([9; 64]);
        let sealed_url = key.seal_value("url", "https://p.example/");
        assert!(key.open_value("secret", &sealed_url).is_err());
        assert_eq!(key.open_value("url", &sealed_url).unwrap(), "https://p.example/");
    }
}

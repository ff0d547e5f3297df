//! Connecting to outboxd over gRPC: plain or TLS (`https://`), with a bearer token and/or a
//! client certificate.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use outbox_proto::v1 as pb;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tracing::Instrument as _;

use crate::{ClientError, Enqueued, Message};

pub type AdminClient = pb::outbox_admin_client::OutboxAdminClient<InterceptedService<Channel, BearerToken>>;
pub type OutboxClient = pb::outbox_client::OutboxClient<InterceptedService<Channel, BearerToken>>;

/// Deliveries may carry payloads up to the server's limit (64 MiB at most).
pub const MAX_MESSAGE_BYTES: usize = 80 * 1024 * 1024;

/// How a client proves who it is and checks whom it talks to. The default is none of it: a
/// plain connection to an outboxd without `--auth-file`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// Sent as `authorization: Bearer <token>` on every call.
    pub token: Option<String>,
    /// A file holding the token (surrounding whitespace ignored), read at every (re)connect,
    /// so a rotated token is picked up. Ignored when `token` is set.
    pub token_file: Option<PathBuf>,
    /// CA certificates (PEM) that the server's certificate must chain to; without it, the
    /// system's roots. Setting it (or a client certificate) means TLS.
    pub tls_ca: Option<PathBuf>,
    /// A client certificate (PEM) and its key, for outboxd's `--tls-client-ca` (mTLS).
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
}

impl Credentials {
    /// A bearer token and nothing else.
    pub fn token(token: impl Into<String>) -> Self {
        Self { token: Some(token.into()), ..Self::default() }
    }

    fn wants_tls(&self) -> bool {
        self.tls_ca.is_some() || self.tls_cert.is_some() || self.tls_key.is_some()
    }

    /// The token to send, from `token` or `token_file`.
    fn resolve_token(&self) -> Result<Option<MetadataValue<Ascii>>, ClientError> {
        let token = match (&self.token, &self.token_file) {
            (Some(t), _) => t.trim().to_owned(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|e| ClientError::Credentials(format!("cannot read the token file {}: {e}", path.display())))?
                .trim()
                .to_owned(),
            (None, None) => return Ok(None),
        };
        if token.is_empty() {
            return Err(ClientError::Credentials("the token is empty".into()));
        }
        MetadataValue::try_from(format!("Bearer {token}"))
            .map(Some)
            .map_err(|_| ClientError::Credentials("the token has characters a header cannot carry".into()))
    }

    fn tls_config(&self) -> Result<ClientTlsConfig, ClientError> {
        let read = |what: &str, p: &PathBuf| {
            std::fs::read(p).map_err(|e| ClientError::Credentials(format!("cannot read {what} {}: {e}", p.display())))
        };
        let mut tls = ClientTlsConfig::new();
        tls = match &self.tls_ca {
            Some(ca) => tls.ca_certificate(Certificate::from_pem(read("the CA file", ca)?)),
            None => tls.with_native_roots(),
        };
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                tls = tls.identity(Identity::from_pem(read("the certificate", cert)?, read("the key", key)?));
            }
            (None, None) => {}
            _ => return Err(ClientError::Credentials("a client certificate needs both tls_cert and tls_key".into())),
        }
        Ok(tls)
    }
}

/// Adds `authorization: Bearer <token>` to every call (nothing without a token).
#[derive(Debug, Clone, Default)]
pub struct BearerToken(Option<MetadataValue<Ascii>>);

impl Interceptor for BearerToken {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

/// Connects a channel to `endpoint` (`http://host:port`, or `host:port`) without credentials.
pub async fn connect(endpoint: &str) -> Result<Channel, ClientError> {
    connect_with(endpoint, &Credentials::default()).await
}

/// Connects a channel: `https://host:port` is TLS, checked against `creds.tls_ca` (or the
/// system's roots) and presenting `creds`' client certificate if any; `host:port` alone is TLS
/// when `creds` names any TLS file, plain otherwise.
pub async fn connect_with(endpoint: &str, creds: &Credentials) -> Result<Channel, ClientError> {
    let uri = if endpoint.contains("://") {
        endpoint.to_owned()
    } else if creds.wants_tls() {
        format!("https://{endpoint}")
    } else {
        format!("http://{endpoint}")
    };
    let mut ep = Endpoint::from_shared(uri.clone())
        .map_err(|_| ClientError::Endpoint(endpoint.to_owned()))?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true);
    if uri.starts_with("https://") {
        ep = ep
            .tls_config(creds.tls_config()?)
            .map_err(|source| ClientError::Connect { endpoint: uri.clone(), source })?;
    } else if creds.wants_tls() {
        return Err(ClientError::Credentials(format!("TLS files were given but {uri} is not an https:// address")));
    }
    ep.connect().await.map_err(|source| ClientError::Connect { endpoint: uri, source })
}

/// The admin client (consumers, stats, dead letters, replay), without credentials.
pub async fn admin(endpoint: &str) -> Result<AdminClient, ClientError> {
    admin_with(endpoint, &Credentials::default()).await
}

/// The admin client with credentials.
pub async fn admin_with(endpoint: &str, creds: &Credentials) -> Result<AdminClient, ClientError> {
    let token = BearerToken(creds.resolve_token()?);
    let channel = connect_with(endpoint, creds).await?;
    Ok(pb::outbox_admin_client::OutboxAdminClient::with_interceptor(channel, token)
        .max_decoding_message_size(MAX_MESSAGE_BYTES))
}

/// The producer/consumer client, without credentials.
pub async fn outbox(endpoint: &str) -> Result<OutboxClient, ClientError> {
    outbox_with(endpoint, &Credentials::default()).await
}

/// The producer/consumer client with credentials.
pub async fn outbox_with(endpoint: &str, creds: &Credentials) -> Result<OutboxClient, ClientError> {
    let token = BearerToken(creds.resolve_token()?);
    let channel = connect_with(endpoint, creds).await?;
    Ok(pb::outbox_client::OutboxClient::with_interceptor(channel, token).max_decoding_message_size(MAX_MESSAGE_BYTES))
}

/// Enqueues over gRPC, for producers without access to the database. Not transactional with
/// anything of the caller's: prefer [`crate::enqueue`] where the database is shared.
///
/// Like [`crate::enqueue`], runs in an `outbox.enqueue` span whose trace context the message
/// carries in its `traceparent` header.
pub async fn enqueue_rpc(client: &mut OutboxClient, msg: &Message) -> Result<Enqueued, ClientError> {
    let span = tracing::info_span!("outbox.enqueue", otel.kind = "producer", topic = %msg.topic, r#type = %msg.type_);
    let mut request = to_request(msg);
    let mut headers: BTreeMap<String, String> = std::mem::take(&mut request.headers).into_iter().collect();
    crate::trace::inject(&span, &mut headers);
    request.headers = headers.into_iter().collect();
    let resp = client.enqueue(request).instrument(span).await?.into_inner();
    Ok(Enqueued {
        message_id: resp
            .message_id
            .parse()
            .map_err(|_| ClientError::Endpoint("server returned a malformed message_id".into()))?,
        seq: resp.seq,
        duplicate: resp.duplicate,
    })
}

pub fn to_request(msg: &Message) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        topic: msg.topic.clone(),
        r#type: msg.type_.clone(),
        payload: msg.payload.clone(),
        headers: msg.headers.clone().into_iter().collect(),
        message_id: msg.message_id.map(|u| u.to_string()),
        ordering_key: msg.ordering_key.clone(),
        delay: msg.delay.map(|d| prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }),
    }
}

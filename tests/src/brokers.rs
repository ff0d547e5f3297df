//! The brokers and the webhook partner that sink tests publish to: the machine's RabbitMQ
//! (127.0.0.1:5672, guest/guest, or `OUTBOX_TEST_AMQP_URL`) and NATS with JetStream
//! (127.0.0.1:4222, or `OUTBOX_TEST_NATS_URL`), with throwaway exchanges, queues and streams; and
//! an HTTP server on loopback that records what it receives. A broker that is not running fails
//! the test: it is part of the test environment, like PostgreSQL.
#![allow(clippy::unwrap_used)]
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result};
use async_nats::jetstream::{self, stream};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

pub fn amqp_url() -> String {
    std::env::var("OUTBOX_TEST_AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

pub fn nats_url() -> String {
    std::env::var("OUTBOX_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

pub async fn addr_of(url: &str) -> Result<std::net::SocketAddr> {
    let parsed = url::Url::parse(url)?;
    let host = parsed.host_str().context("no host")?.to_owned();
    let port = parsed.port_or_known_default().unwrap_or(match parsed.scheme() {
        "nats" => 4222,
        _ => 5672,
    });
    tokio::net::lookup_host((host.as_str(), port)).await?.next().context("cannot resolve the broker")
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// A direct exchange and a durable queue bound to it with `binding` (none: unroutable).
pub struct RabbitTopology {
    _conn: Connection,
    pub channel: Channel,
    pub exchange: String,
    pub queue: String,
}

impl RabbitTopology {
    pub async fn new(binding: Option<&str>) -> Result<Self> {
        let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .context("RabbitMQ is part of the test environment: 127.0.0.1:5672 or OUTBOX_TEST_AMQP_URL")?;
        let channel = conn.create_channel().await?;
        let (exchange, queue) = (unique("outbox-test-x"), unique("outbox-test-q"));
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions { durable: true, ..Default::default() },
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions { durable: true, ..Default::default() },
                FieldTable::default(),
            )
            .await?;
        if let Some(key) = binding {
            channel
                .queue_bind(
                    queue.as_str().into(),
                    exchange.as_str().into(),
                    key.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        }
        Ok(Self { _conn: conn, channel, exchange, queue })
    }

    /// Everything in the queue, acked.
    pub async fn drain(&self) -> Result<Vec<lapin::message::BasicGetMessage>> {
        let mut out = Vec::new();
        while let Some(m) = self.channel.basic_get(self.queue.as_str().into(), BasicGetOptions { no_ack: true }).await?
        {
            out.push(m);
        }
        Ok(out)
    }

    /// Binds the queue to the exchange with `key` (a topology made unroutable becomes routable).
    pub async fn bind(&self, key: &str) -> Result<()> {
        self.channel
            .queue_bind(
                self.queue.as_str().into(),
                self.exchange.as_str().into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(())
    }

    pub async fn remove(self) -> Result<()> {
        self.channel.queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default()).await?;
        self.channel.exchange_delete(self.exchange.as_str().into(), ExchangeDeleteOptions::default()).await?;
        Ok(())
    }
}

pub async fn jetstream_with_stream(subjects: &str) -> Result<(jetstream::Context, stream::Stream, String)> {
    let client = async_nats::connect(nats_url())
        .await
        .context("NATS with JetStream is part of the test environment: 127.0.0.1:4222 or OUTBOX_TEST_NATS_URL")?;
    let js = jetstream::new(client);
    let name = unique("OUTBOX_TEST");
    let s = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subjects.to_owned()],
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await?;
    Ok((js, s, name))
}

/// One request as the partner received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// What the partner answers.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
    pub delay: Duration,
}

pub fn answer(status: u16) -> Answer {
    Answer { status, headers: Vec::new(), body: String::new(), delay: Duration::ZERO }
}

/// A partner's HTTP server on loopback that records requests and gives one answer.
pub struct WebhookPartner {
    pub url: String,
    received: Arc<Mutex<Vec<Received>>>,
    answer: Arc<Mutex<Answer>>,
}

impl WebhookPartner {
    pub async fn start() -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/hooks/outbox?token=q-s3cr3t", listener.local_addr()?);
        let received = Arc::new(Mutex::new(Vec::new()));
        let answer = Arc::new(Mutex::new(answer(200)));
        let (rec, ans) = (received.clone(), answer.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (rec, ans) = (rec.clone(), ans.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                        let (rec, ans) = (rec.clone(), ans.clone());
                        async move {
                            let headers = req
                                .headers()
                                .iter()
                                .map(|(k, v)| {
                                    (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned())
                                })
                                .collect();
                            let body =
                                req.into_body().collect().await.map(|b| b.to_bytes().to_vec()).unwrap_or_default();
                            rec.lock().unwrap().push(Received { headers, body });
                            let a = ans.lock().unwrap().clone();
                            tokio::time::sleep(a.delay).await;
                            let mut resp = Response::builder().status(a.status);
                            for (k, v) in &a.headers {
                                resp = resp.header(*k, v);
                            }
                            Ok::<_, Infallible>(resp.body(Full::new(Bytes::from(a.body))).unwrap())
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { url, received, answer })
    }

    pub fn answer(&self, a: Answer) {
        *self.answer.lock().unwrap() = a;
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }
}

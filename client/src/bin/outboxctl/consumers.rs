//! `outboxctl consumers`: list, get, create (a sink too), delete, pause, resume.
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Subcommand, ValueEnum};
use comfy_table::Table;
use outbox_client::grpc::AdminClient;
use outbox_proto::v1 as pb;
use serde_json::{Value, json};

use crate::Output;
use crate::failure::{Failure, confirm, status_failure};
use crate::format::{fmt_duration, pb_duration, secs, time_json};

#[derive(Debug, Subcommand)]
pub(crate) enum ConsumersCmd {
    /// Every consumer with its topics, retry policy and state.
    List,
    /// One consumer's definition.
    Get { name: String },
    /// A durable consumer (a sink with --sink): it takes every message of its topics from now on
    /// (or the earliest retained, --start-from earliest).
    Create(Box<CreateArgs>),
    /// A consumer and its deliveries (acked, pending and dead).
    Delete {
        name: String,
        /// Do not ask for confirmation.
        #[arg(long, short)]
        yes: bool,
    },
    /// Stop leasing to a consumer's streams (deliveries wait; acks still count).
    Pause { name: String },
    /// Lease to a paused consumer's streams again.
    Resume { name: String },
}

#[derive(Debug, Args)]
pub(crate) struct CreateArgs {
    name: String,
    /// Topic or pattern (`orders.*` one segment, `orders.>` the rest); repeat for several.
    #[arg(long = "topic", required = true)]
    topics: Vec<String>,
    #[arg(long, default_value_t = 10)]
    max_deliveries: u32,
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    backoff_base: Duration,
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    backoff_max: Duration,
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    ack_deadline: Duration,
    #[arg(long, value_enum, default_value_t = StartFrom::New)]
    start_from: StartFrom,
    /// When a message with an ordering key dead-letters: skip it and deliver the key's next
    /// message, or hold the key (its later messages wait) until the dead one is replayed or
    /// the key released (`outboxctl keys`).
    #[arg(long, value_enum, default_value_t = DeadKeyPolicy::Skip)]
    dead_key_policy: DeadKeyPolicy,
    #[command(flatten)]
    sink: SinkArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum DeadKeyPolicy {
    Skip,
    Hold,
}

pub(crate) fn dead_key_policy_text(p: i32) -> &'static str {
    if p == pb::DeadKeyPolicy::Hold as i32 { "HOLD" } else { "SKIP" }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum StartFrom {
    New,
    Earliest,
}

/// A sink: outboxd delivers the consumer itself, to a broker or a webhook.
#[derive(Debug, Args)]
pub(crate) struct SinkArgs {
    /// Make this consumer a sink to this target (outboxd publishes, acks on the target's
    /// confirmation; it takes no Subscribe streams).
    #[arg(long, value_enum, requires = "url")]
    sink: Option<SinkKind>,
    /// The target: amqp:// or amqps:// (rabbitmq), nats:// (nats), https:// (webhook; http://
    /// only to loopback). A password in it is never shown again.
    #[arg(long, requires = "sink")]
    url: Option<String>,
    /// RabbitMQ exchange ("" = the default exchange).
    #[arg(long, requires = "sink")]
    exchange: Option<String>,
    /// RabbitMQ routing key template: {topic} {type} {ordering_key} (default "{topic}").
    #[arg(long, requires = "sink")]
    routing_key: Option<String>,
    /// NATS subject template: {topic} {type} {ordering_key} (default "{topic}"); a JetStream
    /// stream must capture it.
    #[arg(long, requires = "sink")]
    subject: Option<String>,
    /// Webhook signing secret, "whsec_" + base64 (Standard Webhooks). Prefer --secret-file or
    /// the environment: a command line is visible to other users of the host.
    #[arg(long, env = "OUTBOXD_SINK_SECRET", hide_env_values = true, conflicts_with = "secret_file")]
    secret: Option<String>,
    /// A file holding the webhook signing secret.
    #[arg(long)]
    secret_file: Option<std::path::PathBuf>,
    /// Webhook request timeout (default 10s).
    #[arg(long, value_parser = humantime::parse_duration, requires = "sink")]
    timeout: Option<Duration>,
    /// Concurrent unconfirmed publishes (default 64).
    #[arg(long, requires = "sink")]
    max_in_flight: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SinkKind {
    Rabbitmq,
    Nats,
    Webhook,
}

impl SinkArgs {
    /// The sink on the wire, or a usage error naming the flag that does not fit.
    fn to_pb(&self) -> Result<Option<pb::Sink>, Failure> {
        let usage = |m: String| Failure { code: 2, message: m };
        let Some(kind) = self.sink else {
            return Ok(None);
        };
        let only = |flag: &str, set: bool, for_kind: SinkKind| {
            if set && kind != for_kind {
                Err(usage(format!("{flag} is for --sink {}", for_kind.name())))
            } else {
                Ok(())
            }
        };
        only("--exchange", self.exchange.is_some(), SinkKind::Rabbitmq)?;
        only("--routing-key", self.routing_key.is_some(), SinkKind::Rabbitmq)?;
        only("--subject", self.subject.is_some(), SinkKind::Nats)?;
        // --secret may come from the environment, so it is only read for a webhook.
        only("--secret-file", self.secret_file.is_some(), SinkKind::Webhook)?;
        only("--timeout", self.timeout.is_some(), SinkKind::Webhook)?;
        let url = self.url.clone().unwrap_or_default();
        use pb::sink::Target;
        let target = match kind {
            SinkKind::Rabbitmq => Target::Rabbitmq(pb::RabbitMqSink {
                url,
                exchange: self.exchange.clone().unwrap_or_default(),
                routing_key: self.routing_key.clone().unwrap_or_default(),
            }),
            SinkKind::Nats => Target::Nats(pb::NatsSink { url, subject: self.subject.clone().unwrap_or_default() }),
            SinkKind::Webhook => {
                let secret = match (&self.secret, &self.secret_file) {
                    (Some(s), _) => s.clone(),
                    (None, Some(path)) => std::fs::read_to_string(path)
                        .map_err(|e| usage(format!("--secret-file {}: {e}", path.display())))?
                        .trim()
                        .to_owned(),
                    (None, None) => {
                        return Err(usage(
                            "--sink webhook needs --secret, --secret-file or OUTBOXD_SINK_SECRET".into(),
                        ));
                    }
                };
                Target::Webhook(pb::WebhookSink { url, secret, timeout: self.timeout.map(pb_duration) })
            }
        };
        Ok(Some(pb::Sink { target: Some(target), max_in_flight: self.max_in_flight.unwrap_or(0) }))
    }
}

impl SinkKind {
    fn name(self) -> &'static str {
        match self {
            SinkKind::Rabbitmq => "rabbitmq",
            SinkKind::Nats => "nats",
            SinkKind::Webhook => "webhook",
        }
    }
}

/// The sink as the server answered it (secrets already `***`).
pub(crate) fn sink_json(s: &pb::Sink) -> Value {
    use pb::sink::Target;
    let mut v = match &s.target {
        Some(Target::Rabbitmq(r)) => {
            json!({ "kind": "rabbitmq", "url": r.url, "exchange": r.exchange, "routing_key": r.routing_key })
        }
        Some(Target::Nats(n)) => json!({ "kind": "nats", "url": n.url, "subject": n.subject }),
        Some(Target::Webhook(w)) => {
            json!({ "kind": "webhook", "url": w.url, "secret": w.secret, "timeout_s": secs(w.timeout.as_ref()) })
        }
        None => json!({ "kind": "" }),
    };
    v["max_in_flight"] = json!(s.max_in_flight);
    v
}

/// One short line: the kind, where, and how it routes.
pub(crate) fn sink_text(s: Option<&pb::Sink>) -> String {
    use pb::sink::Target;
    match s.and_then(|s| s.target.as_ref()) {
        None => String::new(),
        Some(Target::Rabbitmq(r)) => {
            let exchange = if r.exchange.is_empty() { "(default)" } else { r.exchange.as_str() };
            format!("rabbitmq {} exchange={exchange} key={}", r.url, r.routing_key)
        }
        Some(Target::Nats(n)) => format!("nats {} subject={}", n.url, n.subject),
        Some(Target::Webhook(w)) => format!("webhook {}", w.url),
    }
}

pub(crate) fn consumer_json(c: &pb::Consumer) -> Value {
    json!({
        "name": c.name,
        "topics": c.topics,
        "max_deliveries": c.max_deliveries,
        "backoff_base_s": secs(c.backoff_base.as_ref()),
        "backoff_max_s": secs(c.backoff_max.as_ref()),
        "ack_deadline_s": secs(c.ack_deadline.as_ref()),
        "paused": c.paused,
        "start_from": if c.start_from == pb::consumer::StartFrom::Earliest as i32 { "EARLIEST" } else { "NEW" },
        "created_at": time_json(c.created_at.as_ref()),
        "sink": c.sink.as_ref().map(sink_json),
        "dead_key_policy": dead_key_policy_text(c.dead_key_policy),
    })
}

pub(crate) fn print_consumers(out: Output, cs: &[pb::Consumer]) {
    if out == Output::Json {
        println!("{}", Value::Array(cs.iter().map(consumer_json).collect()));
        return;
    }
    let mut t = Table::new();
    t.load_style(comfy_table::presets::NOTHING);
    t.set_header([
        "NAME",
        "TOPICS",
        "MAX DELIVERIES",
        "BACKOFF",
        "ACK DEADLINE",
        "PAUSED",
        "START",
        "DEAD KEY",
        "SINK",
    ]);
    for c in cs {
        t.add_row([
            c.name.clone(),
            c.topics.join(","),
            c.max_deliveries.to_string(),
            format!("{}..{}", fmt_duration(c.backoff_base.as_ref()), fmt_duration(c.backoff_max.as_ref())),
            fmt_duration(c.ack_deadline.as_ref()),
            c.paused.to_string(),
            if c.start_from == pb::consumer::StartFrom::Earliest as i32 { "EARLIEST" } else { "NEW" }.to_owned(),
            dead_key_policy_text(c.dead_key_policy).to_owned(),
            sink_text(c.sink.as_ref()),
        ]);
    }
    println!("{t}");
}

pub(crate) async fn consumers(admin: &mut AdminClient, out: Output, cmd: ConsumersCmd) -> Result<(), Failure> {
    let st = |s: tonic::Status| status_failure(&s);
    let one = match cmd {
        ConsumersCmd::List => {
            let list = admin.list_consumers(pb::ListConsumersRequest {}).await.map_err(st)?.into_inner();
            print_consumers(out, &list.consumers);
            return Ok(());
        }
        ConsumersCmd::Get { name } => {
            admin.get_consumer(pb::GetConsumerRequest { consumer: name }).await.map_err(st)?.into_inner().consumer
        }
        ConsumersCmd::Create(a) => {
            let sink = a.sink.to_pb()?;
            let c = pb::Consumer {
                name: a.name,
                topics: a.topics,
                max_deliveries: a.max_deliveries,
                backoff_base: Some(pb_duration(a.backoff_base)),
                backoff_max: Some(pb_duration(a.backoff_max)),
                ack_deadline: Some(pb_duration(a.ack_deadline)),
                start_from: match a.start_from {
                    StartFrom::New => pb::consumer::StartFrom::New as i32,
                    StartFrom::Earliest => pb::consumer::StartFrom::Earliest as i32,
                },
                sink,
                dead_key_policy: match a.dead_key_policy {
                    DeadKeyPolicy::Skip => pb::DeadKeyPolicy::Skip as i32,
                    DeadKeyPolicy::Hold => pb::DeadKeyPolicy::Hold as i32,
                },
                ..Default::default()
            };
            admin
                .create_consumer(pb::CreateConsumerRequest { consumer: Some(c) })
                .await
                .map_err(st)?
                .into_inner()
                .consumer
        }
        ConsumersCmd::Delete { name, yes } => {
            confirm(&format!("Delete consumer {name:?} and its inbox (including dead letters)?"), yes)?;
            admin.delete_consumer(pb::DeleteConsumerRequest { consumer: name.clone() }).await.map_err(st)?;
            if out == Output::Json {
                println!("{}", json!({ "deleted": name }));
            } else {
                println!("deleted {name}");
            }
            return Ok(());
        }
        ConsumersCmd::Pause { name } => {
            admin.pause_consumer(pb::PauseConsumerRequest { consumer: name }).await.map_err(st)?.into_inner().consumer
        }
        ConsumersCmd::Resume { name } => {
            admin.resume_consumer(pb::ResumeConsumerRequest { consumer: name }).await.map_err(st)?.into_inner().consumer
        }
    };
    print_consumers(out, one.as_slice());
    Ok(())
}

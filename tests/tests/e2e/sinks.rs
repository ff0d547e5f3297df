//! Sinks: consumers that outboxd delivers itself; and `outboxd relay --once`.
use std::time::Duration;

use anyhow::{Context as _, Result};
use outbox_proto::v1 as pb;
use outbox_tests::{Backend, Outboxd, RawStream, TestDb, consumer, create_consumer, outboxd_path};
use tonic::Code;

use crate::{conformance, setup};

conformance!(sink_consumers_show_no_secrets_refuse_streams_and_are_marked_in_stats);

const PASSWORD: &str = "s3cr3t-pw";
/// `whsec_` + base64 of 32 bytes.
const WEBHOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

pub fn rabbitmq_sink(url: &str, exchange: &str, routing_key: &str) -> pb::Sink {
    pb::Sink {
        target: Some(pb::sink::Target::Rabbitmq(pb::RabbitMqSink {
            url: url.into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
        })),
        max_in_flight: 0,
    }
}

pub fn webhook_sink(url: &str, secret: &str) -> pb::Sink {
    pb::Sink {
        target: Some(pb::sink::Target::Webhook(pb::WebhookSink {
            url: url.into(),
            secret: secret.into(),
            timeout: None,
        })),
        max_in_flight: 0,
    }
}

async fn sink_consumers_show_no_secrets_refuse_streams_and_are_marked_in_stats(backend: Backend) -> Result<()> {
    let (_store, srv, _db) = setup(backend, &[]).await?;
    let mut admin = srv.admin().await?;
    // Nothing listens there: the sink keeps trying to connect, which is what this test wants
    // (nothing is delivered, the configuration is what is checked).
    let rabbit_url = format!("amqp://app:{PASSWORD}@127.0.0.1:1/%2f");
    let c = create_consumer(
        &mut admin,
        pb::Consumer {
            sink: Some(rabbitmq_sink(&rabbit_url, "events", "{topic}.{type}")),
            ..consumer("to-rabbit", &["t"])
        },
    )
    .await?;
    let shown = |c: &pb::Consumer| format!("{:?}", c.sink);
    assert!(!shown(&c).contains(PASSWORD), "{}", shown(&c));
    assert!(shown(&c).contains("amqp://app:***@127.0.0.1:1"), "{}", shown(&c));
    let hook = create_consumer(
        &mut admin,
        pb::Consumer {
            sink: Some(webhook_sink("http://127.0.0.1:1/hook", WEBHOOK_SECRET)),
            ..consumer("to-hook", &["t"])
        },
    )
    .await?;
    let Some(pb::sink::Target::Webhook(w)) = hook.sink.as_ref().and_then(|s| s.target.clone()) else {
        panic!("webhook sink expected: {hook:?}");
    };
    assert_eq!(w.secret, "***");
    assert_eq!(hook.sink.as_ref().map(|s| s.max_in_flight), Some(64), "0 means 64");
    assert_eq!(w.timeout.map(|t| t.seconds), Some(10), "0 means 10 s");

    // Creating the same sink again (with the real secret) is the idempotent success.
    create_consumer(
        &mut admin,
        pb::Consumer {
            sink: Some(webhook_sink("http://127.0.0.1:1/hook", WEBHOOK_SECRET)),
            ..consumer("to-hook", &["t"])
        },
    )
    .await?;

    for c in admin.list_consumers(pb::ListConsumersRequest {}).await?.into_inner().consumers {
        assert!(!shown(&c).contains(PASSWORD) && !shown(&c).contains(&WEBHOOK_SECRET[6..]), "{}", shown(&c));
    }
    let got = admin.get_consumer(pb::GetConsumerRequest { consumer: "to-rabbit".into() }).await?.into_inner();
    assert!(!shown(got.consumer.as_ref().context("consumer")?).contains(PASSWORD));

    // A sink takes no streams.
    let err = RawStream::open(&srv.endpoint, "to-rabbit", 10).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("sink"), "{}", err.message());

    // Bad sinks are refused naming the field.
    for (sink, field) in [
        (rabbitmq_sink("http://127.0.0.1:5672", "", ""), "consumer.sink.rabbitmq.url"),
        (rabbitmq_sink("amqp://127.0.0.1:5672", "", "{tenant}"), "consumer.sink.rabbitmq.routing_key"),
        (webhook_sink("http://partner.example/hook", WEBHOOK_SECRET), "consumer.sink.webhook.url"),
        (webhook_sink("https://partner.example/hook", "not-a-secret"), "consumer.sink.webhook.secret"),
        (pb::Sink { target: None, max_in_flight: 0 }, "consumer.sink.target"),
    ] {
        let err = admin
            .create_consumer(pb::CreateConsumerRequest {
                consumer: Some(pb::Consumer { sink: Some(sink), ..consumer("bad", &["t"]) }),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(field), "{field}: {}", err.message());
    }

    let stats = admin.get_stats(pb::GetStatsRequest { consumer: String::new() }).await?.into_inner();
    let kind = |name: &str| stats.consumers.iter().find(|c| c.consumer == name).map(|c| c.sink.clone());
    assert_eq!(kind("to-rabbit").as_deref(), Some("rabbitmq"));
    assert_eq!(kind("to-hook").as_deref(), Some("webhook"));

    // Neither the audit log nor any other line shows a secret.
    assert!(!srv.log_lines(&["create_consumer"]).is_empty(), "create_consumer is audited");
    assert!(srv.log_lines(&[PASSWORD]).is_empty(), "{:?}", srv.log_lines(&[PASSWORD]));
    assert!(srv.log_lines(&[&WEBHOOK_SECRET[6..]]).is_empty());
    Ok(())
}

/// Runs `outboxd relay --once --output json`: the exit code and the JSON it printed.
pub async fn relay_once(database_url: &str, extra: &[&str]) -> Result<(i32, serde_json::Value)> {
    let out = tokio::process::Command::new(outboxd_path())
        .args(["relay", "--once", "--output", "json", "--database-url", database_url])
        .args(extra)
        .env("RUST_LOG", "warn")
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value =
        serde_json::from_str(stdout.trim()).with_context(|| format!("not one JSON object: {stdout:?}"))?;
    Ok((out.status.code().unwrap_or(-1), json))
}

/// With no server running: `relay --once` fans out what is committed, says so, and says when
/// there is nothing to do or the database is unreachable, by exit code. PostgreSQL: the
/// embedded store allows one process per file, so no scheduler runs beside a server there.
#[tokio::test]
async fn relay_once_fans_out_with_no_server_running_and_reports_by_exit_code() -> Result<()> {
    let db = TestDb::create().await?;
    {
        let srv = Outboxd::start(&db.url, &["--no-relay"]).await?;
        let mut admin = srv.admin().await?;
        create_consumer(&mut admin, consumer("a", &["t"])).await?;
        create_consumer(&mut admin, consumer("b", &["t"])).await?;
        assert!(srv.terminate(Duration::from_secs(15)).await?, "outboxd exits 0 on SIGTERM");
    }
    let pool = sqlx::PgPool::connect(&db.url).await?;
    for i in 0..7 {
        outbox_tests::sql_enqueue(&pool, "t", "T", format!("{i}").as_bytes()).await?;
    }
    let (code, json) = relay_once(&db.url, &[]).await?;
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["relayed_messages"], 7, "{json}");
    assert_eq!(json["relayed_deliveries"], 14, "{json}");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.deliveries").fetch_one(&pool).await?;
    assert_eq!(rows, 14);

    let (code, json) = relay_once(&db.url, &[]).await?;
    assert_eq!(code, 3, "nothing to do: {json}");
    assert_eq!(json["relayed_messages"], 0);

    // Nothing listens on port 1.
    let (code, json) = relay_once("postgres://postgres@127.0.0.1:1/none", &[]).await?;
    assert_eq!(code, 4, "database unreachable: {json}");
    assert_eq!(json["kind"], "database_unreachable", "{json}");

    // The deliveries it made are served as usual.
    let srv = Outboxd::start(&db.url, &["--no-relay"]).await?;
    let mut s = RawStream::open(&srv.endpoint, "a", 10).await?;
    assert_eq!(s.take(7, crate::WAIT).await?.len(), 7);
    Ok(())
}

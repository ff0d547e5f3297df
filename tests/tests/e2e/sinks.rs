//! Sinks: consumers that outboxd delivers itself; and `outboxd relay --once`.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use outbox_client::Message;
use outbox_proto::v1 as pb;
use outbox_tests::brokers::{
    RabbitTopology, WebhookPartner, amqp_url, answer, jetstream_with_stream, nats_url, unique,
};
use outbox_tests::{
    Backend, Db, Outboxd, RawStream, TcpProxy, TestDb, consumer, create_consumer, eventually, outboxd_path,
};
use tonic::Code;

use crate::{WAIT, conformance, setup, setup_pg, stats};

conformance!(
    sink_consumers_show_no_secrets_refuse_streams_and_are_marked_in_stats,
    a_rabbitmq_sink_publishes_each_message_with_its_id_in_key_order_and_acks_on_confirm,
);

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

pub fn nats_sink(url: &str, subject: &str) -> pb::Sink {
    pb::Sink {
        target: Some(pb::sink::Target::Nats(pb::NatsSink { url: url.into(), subject: subject.into() })),
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
    let (_store, srv, _db) = setup(backend, &["--sink-allow-private"]).await?;
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
        .args(["relay", "--once", "--sink-allow-private", "--output", "json", "--database-url", database_url])
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
        let srv = Outboxd::start(&db.url, &["--no-relay", "--sink-allow-private"]).await?;
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
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.inbox").fetch_one(&pool).await?;
    assert_eq!(rows, 14);

    let (code, json) = relay_once(&db.url, &[]).await?;
    assert_eq!(code, 3, "nothing to do: {json}");
    assert_eq!(json["relayed_messages"], 0);

    // Nothing listens on port 1.
    let (code, json) = relay_once("postgres://postgres@127.0.0.1:1/none", &[]).await?;
    assert_eq!(code, 4, "database unreachable: {json}");
    assert_eq!(json["kind"], "database_unreachable", "{json}");

    // The deliveries it made are served as usual.
    let srv = Outboxd::start(&db.url, &["--no-relay", "--sink-allow-private"]).await?;
    let mut s = RawStream::open(&srv.endpoint, "a", 10).await?;
    assert_eq!(s.take(7, crate::WAIT).await?.len(), 7);
    Ok(())
}

/// A sink consumer of `topics` with fast retries and at most `max_deliveries`.
fn sink_consumer(name: &str, topics: &[&str], sink: pb::Sink, max_deliveries: u32) -> pb::Consumer {
    pb::Consumer { sink: Some(sink), max_deliveries, ..consumer(name, topics) }
}

/// `n` messages of type `OrderPlaced` on `topic`, each with a trace context and a content type;
/// those with `key(i)` share an ordering key. The payload is the index.
async fn enqueue(
    db: &Db,
    topic: &str,
    range: std::ops::Range<usize>,
    key: impl Fn(usize) -> Option<String>,
) -> Result<Vec<String>> {
    let msgs: Vec<Message> = range
        .map(|i| {
            let m = Message::new(topic, "OrderPlaced", i.to_string().into_bytes())
                .header("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
                .header("content-type", "text/plain");
            match key(i) {
                Some(k) => m.ordering_key(k),
                None => m,
            }
        })
        .collect();
    Ok(db.enqueue_all(&msgs).await?.into_iter().map(|e| e.message_id.to_string()).collect())
}

async fn until_acked(srv: &Outboxd, name: &str, n: i64) -> Result<pb::ConsumerStats> {
    eventually(&format!("{name}: {n} acked"), WAIT, || async {
        let s = stats(srv, name).await?;
        Ok((s.acked == n && s.backlog == 0 && s.in_flight == 0).then_some(s))
    })
    .await
}

fn amqp_id(m: &lapin::message::BasicGetMessage) -> String {
    m.delivery.properties.message_id().as_ref().map(|s| s.as_str().to_owned()).unwrap_or_default()
}

/// Waits (bounded) until the queue has given `n` distinct messages; returns every message taken.
async fn take_from_queue(topo: &RabbitTopology, n: usize) -> Result<Vec<lapin::message::BasicGetMessage>> {
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut all = Vec::new();
    loop {
        all.extend(topo.drain().await?);
        let distinct: HashSet<String> = all.iter().map(amqp_id).collect();
        if distinct.len() >= n {
            return Ok(all);
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{} of {n} distinct messages in the queue after {WAIT:?}",
            distinct.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_rabbitmq_sink_publishes_each_message_with_its_id_in_key_order_and_acks_on_confirm(
    backend: Backend,
) -> Result<()> {
    let (_store, srv, db) = setup(backend, &["--sink-allow-private", "--console-listen", "127.0.0.1:0"]).await?;
    let topic = unique("orders");
    let topo = RabbitTopology::new(Some(&format!("{topic}.OrderPlaced"))).await?;
    let mut admin = srv.admin().await?;
    let sink = rabbitmq_sink(&amqp_url(), &topo.exchange, "{topic}.{type}");
    create_consumer(&mut admin, sink_consumer("to-rabbit", &[&topic], sink, 5)).await?;
    // Half of them share one ordering key: those go one at a time, in order.
    let ids = enqueue(&db, &topic, 0..40, |i| i.is_multiple_of(2).then(|| "order-7".to_owned())).await?;
    until_acked(&srv, "to-rabbit", 40).await?;
    let got = take_from_queue(&topo, 40).await?;
    assert_eq!(got.len(), 40, "each message once: nothing was lost on the way");
    let sent: HashSet<&String> = ids.iter().collect();
    let mut keyed = Vec::new();
    for m in &got {
        let p = &m.delivery.properties;
        assert!(sent.contains(&amqp_id(m)), "a message id that was not enqueued: {}", amqp_id(m));
        assert_eq!(p.delivery_mode(), &Some(2), "persistent");
        assert_eq!(p.kind().as_ref().map(|k| k.as_str()), Some("OrderPlaced"));
        assert_eq!(p.content_type().as_ref().map(|k| k.as_str()), Some("text/plain"));
        assert_eq!(m.delivery.routing_key.as_str(), format!("{topic}.OrderPlaced"));
        let headers = p.headers().as_ref().context("no headers")?.inner();
        assert!(headers.contains_key("traceparent"), "{headers:?}");
        let i: usize = String::from_utf8_lossy(&m.delivery.data).parse()?;
        if i.is_multiple_of(2) {
            keyed.push(i);
        }
    }
    let mut in_order = keyed.clone();
    in_order.sort_unstable();
    assert_eq!(keyed, in_order, "one ordering key, published in order");
    // The console shows the sink's target and that it is connected from this process.
    let base = crate::console_http::console_url(&srv)?;
    let http = crate::console_http::client()?;
    let first = http.get(format!("{base}/")).send().await?;
    let cookie = crate::console_http::set_cookie(&first).context("a console session")?;
    let cookie = cookie.split(';').next().unwrap_or_default().to_owned();
    let overview =
        http.get(format!("{base}/fragments/overview")).header("cookie", &cookie).send().await?.text().await?;
    assert!(
        overview.contains(r#"<td class="sink">rabbitmq · <span class="sink-state connected">connected</span></td>"#),
        "{overview}"
    );

    // Paused, nothing goes; resumed, it does.
    admin.pause_consumer(pb::PauseConsumerRequest { consumer: "to-rabbit".into() }).await?;
    enqueue(&db, &topic, 40..41, |_| None).await?;
    eventually("relayed while paused", WAIT, || async {
        Ok((stats(&srv, "to-rabbit").await?.backlog == 1).then_some(()))
    })
    .await?;
    assert!(topo.drain().await?.is_empty(), "a paused sink publishes nothing");
    admin.resume_consumer(pb::ResumeConsumerRequest { consumer: "to-rabbit".into() }).await?;
    until_acked(&srv, "to-rabbit", 41).await?;
    assert_eq!(take_from_queue(&topo, 1).await?.len(), 1);
    topo.remove().await
}

/// PostgreSQL: the outage is the broker's, the store does not matter (the SQLite run of the
/// case above covers the sink core there).
#[tokio::test]
async fn a_rabbitmq_outage_loses_nothing_costs_no_attempts_and_drains_by_itself() -> Result<()> {
    let (db, srv, _pool) = setup_pg(&["--sink-allow-private"]).await?;
    let producer = Db::connect(&db.url).await?;
    let topic = unique("orders");
    let topo = RabbitTopology::new(Some(&topic)).await?;
    let proxy = TcpProxy::start(outbox_tests::brokers::addr_of(&amqp_url()).await?).await?;
    let mut admin = srv.admin().await?;
    // Two deliveries at most: an outage that counted as attempts would kill messages.
    let sink = rabbitmq_sink(&proxy.url_for(&amqp_url()), &topo.exchange, "");
    create_consumer(&mut admin, sink_consumer("to-rabbit", &[&topic], sink, 2)).await?;
    let mut ids = enqueue(&producer, &topic, 0..10, |_| None).await?;
    until_acked(&srv, "to-rabbit", 10).await?;

    proxy.cut().await?;
    ids.extend(enqueue(&producer, &topic, 10..50, |i| Some(format!("k{}", i % 4))).await?);
    // The backlog is visible, and nothing is held while the broker is away.
    eventually("a visible backlog, nothing in flight", WAIT, || async {
        let s = stats(&srv, "to-rabbit").await?;
        Ok((s.backlog == 40 && s.in_flight == 0).then_some(()))
    })
    .await?;
    proxy.restore().await?;
    let s = until_acked(&srv, "to-rabbit", 50).await?;
    assert_eq!(s.dead, 0, "an outage kills nothing");
    let got = take_from_queue(&topo, 50).await?;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for m in &got {
        *seen.entry(amqp_id(m)).or_default() += 1;
    }
    for id in &ids {
        assert!(seen.contains_key(id), "message {id} was lost");
    }
    // A repeat is possible only for a publish whose confirm the cut took away: at most the
    // sink's window.
    let repeats = got.len() - seen.len();
    assert!(repeats <= 64, "{repeats} repeats");
    assert!(seen.values().all(|n| *n <= 2));
    topo.remove().await
}

#[tokio::test]
async fn an_unroutable_message_ends_dead_with_the_brokers_reason_and_replay_sends_it_again() -> Result<()> {
    let (db, srv, _pool) = setup_pg(&["--sink-allow-private"]).await?;
    let producer = Db::connect(&db.url).await?;
    let topic = unique("orders");
    // An exchange that routes nowhere yet.
    let topo = RabbitTopology::new(None).await?;
    let mut admin = srv.admin().await?;
    let sink = rabbitmq_sink(&amqp_url(), &topo.exchange, "{topic}");
    create_consumer(&mut admin, sink_consumer("to-rabbit", &[&topic], sink, 2)).await?;
    let id = enqueue(&producer, &topic, 0..1, |_| None).await?.remove(0);
    eventually("dead after two refusals", WAIT, || async {
        Ok((stats(&srv, "to-rabbit").await?.dead == 1).then_some(()))
    })
    .await?;
    let dead = admin
        .list_dead_letters(pb::ListDeadLettersRequest { consumer: "to-rabbit".into(), ..Default::default() })
        .await?
        .into_inner()
        .dead_letters;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].delivery_count, 2);
    assert!(dead[0].last_error.contains("NO_ROUTE"), "{}", dead[0].last_error);

    topo.bind(&topic).await?;
    let replayed = admin
        .replay(pb::ReplayRequest { consumer: "to-rabbit".into(), dead_letters: true, ..Default::default() })
        .await?
        .into_inner();
    assert_eq!(replayed.replayed, 1);
    until_acked(&srv, "to-rabbit", 1).await?;
    let got = take_from_queue(&topo, 1).await?;
    assert_eq!(amqp_id(&got[0]), id);
    topo.remove().await
}

#[tokio::test]
async fn a_nats_sink_puts_each_message_into_jetstream_exactly_once_through_an_outage() -> Result<()> {
    let (db, srv, _pool) = setup_pg(&["--sink-allow-private"]).await?;
    let producer = Db::connect(&db.url).await?;
    let base = unique("outbox-test");
    let (js, mut stream, name) = jetstream_with_stream(&format!("{base}.>")).await?;
    let proxy = TcpProxy::start(outbox_tests::brokers::addr_of(&nats_url()).await?).await?;
    let mut admin = srv.admin().await?;
    let sink = nats_sink(&proxy.url_for(&nats_url()), &format!("{base}.{{topic}}"));
    create_consumer(&mut admin, sink_consumer("to-nats", &["orders.*"], sink, 2)).await?;
    let mut ids = enqueue(&producer, "orders.placed", 0..10, |_| None).await?;
    until_acked(&srv, "to-nats", 10).await?;
    proxy.cut().await?;
    ids.extend(enqueue(&producer, "orders.placed", 10..40, |i| Some(format!("k{}", i % 3))).await?);
    eventually("a visible backlog, nothing in flight", WAIT, || async {
        let s = stats(&srv, "to-nats").await?;
        Ok((s.backlog == 30 && s.in_flight == 0).then_some(()))
    })
    .await?;
    proxy.restore().await?;
    let s = until_acked(&srv, "to-nats", 40).await?;
    assert_eq!(s.dead, 0);
    // Exactly once: JetStream dropped any repeat by its Nats-Msg-Id.
    assert_eq!(stream.info().await?.state.messages, 40);
    let mut stored = HashSet::new();
    for seq in 1..=40 {
        let m = stream.get_raw_message(seq).await?;
        assert_eq!(m.subject.as_str(), format!("{base}.orders.placed"));
        stored.insert(m.headers.get("Nats-Msg-Id").map(|v| v.as_str().to_owned()).unwrap_or_default());
    }
    assert_eq!(stored, ids.iter().cloned().collect::<HashSet<_>>());
    js.delete_stream(&name).await?;
    Ok(())
}

#[tokio::test]
async fn a_nats_sink_without_a_stream_dead_letters_with_that_error() -> Result<()> {
    let (db, srv, _pool) = setup_pg(&["--sink-allow-private"]).await?;
    let producer = Db::connect(&db.url).await?;
    let mut admin = srv.admin().await?;
    let sink = nats_sink(&nats_url(), &format!("{}.{{topic}}", unique("outbox-test-nostream")));
    create_consumer(&mut admin, sink_consumer("to-nats", &["t"], sink, 2)).await?;
    enqueue(&producer, "t", 0..1, |_| None).await?;
    eventually("dead", WAIT, || async { Ok((stats(&srv, "to-nats").await?.dead == 1).then_some(())) }).await?;
    let dead = admin
        .list_dead_letters(pb::ListDeadLettersRequest { consumer: "to-nats".into(), ..Default::default() })
        .await?
        .into_inner()
        .dead_letters;
    assert!(dead[0].last_error.contains("no responders"), "{}", dead[0].last_error);
    Ok(())
}

#[tokio::test]
async fn a_webhook_sink_waits_for_retry_after_and_dead_letters_a_4xx_without_its_body() -> Result<()> {
    let (db, srv, _pool) = setup_pg(&["--sink-allow-private"]).await?;
    let producer = Db::connect(&db.url).await?;
    let partner = WebhookPartner::start().await?;
    let mut admin = srv.admin().await?;
    create_consumer(&mut admin, sink_consumer("to-hook", &["t"], webhook_sink(&partner.url, WEBHOOK_SECRET), 2))
        .await?;
    let mut busy = answer(503);
    busy.headers.push(("retry-after", "1".into()));
    partner.answer(busy);
    let id = enqueue(&producer, "t", 0..1, |_| None).await?.remove(0);
    eventually("the first attempt", WAIT, || async { Ok((!partner.received().is_empty()).then_some(())) }).await?;
    let first = std::time::Instant::now();
    partner.answer(answer(204));
    until_acked(&srv, "to-hook", 1).await?;
    // The consumer's backoff is 20 ms: the second attempt waited for Retry-After instead.
    assert!(first.elapsed() >= Duration::from_millis(900), "retried after {:?}", first.elapsed());
    let got = partner.received();
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|r| r.header("webhook-id") == Some(id.as_str())), "the same webhook-id on each attempt");
    let timeline = admin.get_message(pb::GetMessageRequest { message_id: id }).await?.into_inner();
    assert_eq!(timeline.deliveries[0].delivery_count, 2);

    let mut refused = answer(422);
    refused.body = "customer 42 is unknown".into();
    partner.answer(refused);
    enqueue(&producer, "t", 1..2, |_| None).await?;
    eventually("dead after two 422s", WAIT, || async { Ok((stats(&srv, "to-hook").await?.dead == 1).then_some(())) })
        .await?;
    let dead = admin
        .list_dead_letters(pb::ListDeadLettersRequest { consumer: "to-hook".into(), ..Default::default() })
        .await?
        .into_inner()
        .dead_letters;
    // The status only: a partner's answer is never stored or shown (finding 5).
    assert!(
        dead[0].last_error.contains("422") && !dead[0].last_error.contains("customer 42"),
        "{}",
        dead[0].last_error
    );
    Ok(())
}

/// PostgreSQL: replicas need a shared database.
#[tokio::test]
async fn sinks_on_two_replicas_share_the_work_and_keep_each_ordering_key_in_order() -> Result<()> {
    let db = TestDb::create().await?;
    let args: Vec<&str> =
        outbox_tests::FAST.iter().copied().chain(["--sink-poll", "100ms", "--sink-allow-private"]).collect();
    let (a, b) = (Outboxd::start(&db.url, &args).await?, Outboxd::start(&db.url, &args).await?);
    let producer = Db::connect(&db.url).await?;
    let topic = unique("orders");
    let topo = RabbitTopology::new(Some(&topic)).await?;
    let mut admin = a.admin().await?;
    let mut sink = rabbitmq_sink(&amqp_url(), &topo.exchange, "");
    sink.max_in_flight = 8;
    create_consumer(&mut admin, sink_consumer("to-rabbit", &[&topic], sink, 5)).await?;
    // Created on one replica, the other starts it within its --sink-poll.
    for srv in [&a, &b] {
        eventually("the sink runs on each replica", WAIT, || async {
            Ok((!srv.log_lines(&["sink starting", "to-rabbit"]).is_empty()).then_some(()))
        })
        .await?;
    }
    let ids = enqueue(&producer, &topic, 0..200, |i| Some(format!("k{}", i % 5))).await?;
    until_acked(&a, "to-rabbit", 200).await?;
    let got = take_from_queue(&topo, 200).await?;
    assert_eq!(got.len(), 200, "each once");
    let mut per_key: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for m in &got {
        let i: usize = String::from_utf8_lossy(&m.delivery.data).parse()?;
        per_key.entry(i % 5).or_default().push(i);
    }
    for (k, seen) in &per_key {
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        ensure!(*seen == sorted, "ordering key k{k} out of order: {seen:?}");
    }
    assert_eq!(got.iter().map(amqp_id).collect::<HashSet<_>>(), ids.into_iter().collect());
    topo.remove().await
}

/// With no server running, `relay --once` also delivers what is due to sinks.
#[tokio::test]
async fn relay_once_publishes_due_sink_deliveries_with_no_server_running() -> Result<()> {
    let db = TestDb::create().await?;
    let topic = unique("orders");
    let topo = RabbitTopology::new(Some(&topic)).await?;
    {
        let srv = Outboxd::start(&db.url, &["--no-relay", "--no-sinks"]).await?;
        let mut admin = srv.admin().await?;
        let sink = rabbitmq_sink(&amqp_url(), &topo.exchange, "");
        create_consumer(&mut admin, sink_consumer("to-rabbit", &[&topic], sink, 5)).await?;
        assert!(srv.terminate(Duration::from_secs(15)).await?);
    }
    let producer = Db::connect(&db.url).await?;
    let ids = enqueue(&producer, &topic, 0..5, |_| None).await?;
    let (code, json) = relay_once(&db.url, &[]).await?;
    assert_eq!(code, 0, "{json}");
    assert_eq!(json["relayed_messages"], 5, "{json}");
    let sink = &json["sinks"][0];
    assert_eq!(sink["consumer"], "to-rabbit", "{json}");
    assert_eq!(sink["sink"], "rabbitmq");
    assert_eq!(sink["published"], 5);
    assert_eq!(sink["confirmed"], 5);
    let got = take_from_queue(&topo, 5).await?;
    assert_eq!(got.iter().map(amqp_id).collect::<HashSet<_>>(), ids.into_iter().collect());
    let (code, json) = relay_once(&db.url, &[]).await?;
    assert_eq!(code, 3, "nothing to do: {json}");
    topo.remove().await
}

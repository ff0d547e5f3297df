//! Each sink target against the real thing: the RabbitMQ and the NATS JetStream server of the
//! machine (RabbitMQ on 127.0.0.1:5672 as guest/guest, NATS with JetStream on 127.0.0.1:4222,
//! or `OUTBOX_TEST_AMQP_URL` / `OUTBOX_TEST_NATS_URL`), and an HTTP server of the test's own
//! for webhooks, whose signatures the Standard Webhooks reference library checks (Python).
//!
//! These drive a [`Target`] directly, as the sink runner does: publishes in parallel, the
//! broker cut mid-run with a [`TcpProxy`], reconnects. A broker that is not running fails the
//! test (it is part of the test environment, like PostgreSQL).
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result, bail, ensure};
use base64::Engine as _;
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use outbox_server::domain::{MessageId, SinkTarget};
use outbox_server::sinks::{self, Outcome, Publish, Target};
use outbox_tests::brokers::{addr_of, amqp_url, nats_url, unique};
use outbox_tests::{TcpProxy, eventually};

use crate::WAIT;

/// The brokers and partners of these tests listen on loopback, which sinks may reach only when
/// the operator allows it.
fn local() -> sinks::destination::Destinations {
    sinks::destination::Destinations::anywhere()
}

fn message(topic: &str, n: usize) -> Publish {
    let mut headers = BTreeMap::new();
    headers.insert("traceparent".to_owned(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned());
    headers.insert("content-type".to_owned(), "application/json".to_owned());
    headers.insert("tenant".to_owned(), format!("t-{}", n % 3));
    Publish {
        message_id: MessageId::generate(),
        seq: i64::try_from(n).unwrap() + 1,
        topic: topic.to_owned(),
        type_: "OrderPlaced".to_owned(),
        payload: format!("{{\"order\":{n}}}").into_bytes(),
        headers,
        ordering_key: Some(format!("order-{n}")),
        enqueued_at: chrono::Utc::now(),
        delivery_count: 1,
    }
}

/// Publishes all of `messages` at once (pipelined, as a sink's window does) and returns each
/// id with its outcome.
async fn publish_all(target: &dyn Target, messages: Vec<Publish>) -> Vec<(MessageId, Outcome)> {
    messages
        .into_iter()
        .map(|m| {
            let id = m.message_id;
            async move { (id, target.publish(m).await) }
        })
        .collect::<FuturesUnordered<_>>()
        .collect()
        .await
}

fn assert_all_confirmed(outcomes: &[(MessageId, Outcome)]) {
    for (id, o) in outcomes {
        assert_eq!(o, &Outcome::Confirmed, "message {id}");
    }
}

/// Runs `window` publishing workers, cuts the proxy once `before_cut` publishes are confirmed,
/// and returns every outcome when each worker has met the cut (its last outcome Unavailable):
/// the test sees what was in flight when the broker went away.
async fn publish_through_a_cut(
    target: Arc<dyn Target>,
    proxy: &TcpProxy,
    topic: &str,
    window: usize,
    before_cut: usize,
) -> Result<Vec<(MessageId, Outcome)>> {
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let confirmed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..window {
        let (target, outcomes, confirmed) = (target.clone(), outcomes.clone(), confirmed.clone());
        let topic = topic.to_owned();
        workers.push(tokio::spawn(async move {
            let mut n = w;
            loop {
                let m = message(&topic, n);
                let id = m.message_id;
                let o = target.publish(m).await;
                if o == Outcome::Confirmed {
                    confirmed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                let unavailable = matches!(o, Outcome::Unavailable { .. });
                outcomes.lock().unwrap().push((id, o));
                if unavailable {
                    break;
                }
                n += window;
            }
        }));
    }
    eventually("publishes confirmed before the cut", WAIT, || {
        let c = confirmed.load(std::sync::atomic::Ordering::SeqCst);
        async move { Ok((c >= before_cut).then_some(())) }
    })
    .await?;
    proxy.cut().await?;
    for w in workers {
        tokio::time::timeout(WAIT, w).await.context("a publish did not end after the cut")??;
    }
    let out = std::mem::take(&mut *outcomes.lock().unwrap());
    Ok(out)
}

/// Every outcome is Confirmed or Unavailable, and every worker ended on an Unavailable.
fn split_cut_outcomes(outcomes: &[(MessageId, Outcome)], window: usize) -> Result<(Vec<MessageId>, Vec<MessageId>)> {
    let (mut confirmed, mut unavailable) = (Vec::new(), Vec::new());
    for (id, o) in outcomes {
        match o {
            Outcome::Confirmed => confirmed.push(*id),
            Outcome::Unavailable { .. } => unavailable.push(*id),
            other => bail!("message {id}: {other:?} when the broker went away"),
        }
    }
    ensure!(
        unavailable.len() == window,
        "{} publishes unavailable, expected one per worker ({window})",
        unavailable.len()
    );
    Ok((confirmed, unavailable))
}

mod rabbitmq {
    use lapin::options::{QueueDeclareOptions, QueueDeleteOptions};
    use lapin::types::{AMQPValue, FieldTable};
    use outbox_tests::brokers::RabbitTopology as Topology;

    use super::*;

    fn target(url: &str, exchange: &str, routing_key: &str) -> Box<dyn Target> {
        sinks::connect(&SinkTarget::rabbitmq("sink.rabbitmq", url, exchange, routing_key).unwrap(), local())
    }

    fn message_id(m: &lapin::message::BasicGetMessage) -> String {
        m.delivery.properties.message_id().as_ref().map(|s| s.as_str().to_owned()).unwrap_or_default()
    }

    #[tokio::test]
    async fn rabbitmq_confirms_persistent_messages_with_the_outbox_id_as_message_id() -> Result<()> {
        let topo = Topology::new(Some("orders.OrderPlaced")).await?;
        let t = target(&amqp_url(), &topo.exchange, "{topic}.{type}");
        t.connect().await?;
        let sent: Vec<Publish> = (0..50).map(|n| message("orders", n)).collect();
        let by_id: HashMap<String, Publish> = sent.iter().map(|m| (m.message_id.to_string(), m.clone())).collect();
        assert_all_confirmed(&publish_all(t.as_ref(), sent).await);
        // Confirmed means queued: all 50 are there at once, each once.
        let got = topo.drain().await?;
        assert_eq!(got.len(), 50);
        let ids: HashSet<String> = got.iter().map(message_id).collect();
        assert_eq!(ids.len(), 50);
        for m in &got {
            let p = &m.delivery.properties;
            let sent = by_id.get(&message_id(m)).context("a message id that was not sent")?;
            assert_eq!(p.delivery_mode(), &Some(2), "persistent");
            assert_eq!(p.kind().as_ref().map(|k| k.as_str()), Some("OrderPlaced"));
            assert_eq!(p.content_type().as_ref().map(|k| k.as_str()), Some("application/json"));
            assert_eq!(p.timestamp(), &Some(u64::try_from(sent.enqueued_at.timestamp())?));
            assert_eq!(m.delivery.routing_key.as_str(), "orders.OrderPlaced");
            assert_eq!(m.delivery.data, sent.payload);
            let headers = p.headers().as_ref().context("no headers")?.inner();
            let header = |k: &str| match headers.get(k) {
                Some(AMQPValue::LongString(s)) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
                _ => None,
            };
            assert_eq!(header("traceparent").as_ref(), sent.headers.get("traceparent"));
            assert_eq!(header("tenant").as_ref(), sent.headers.get("tenant"));
        }
        assert_eq!(t.unconfirmed_lost(), 0);
        t.close().await;
        topo.remove().await
    }

    #[tokio::test]
    async fn rabbitmq_unroutable_is_failed_with_the_brokers_reply_and_a_missing_exchange_fails_connect() -> Result<()> {
        let topo = Topology::new(None).await?;
        let t = target(&amqp_url(), &topo.exchange, "");
        t.connect().await?;
        let outcomes = publish_all(t.as_ref(), (0..3).map(|n| message("orders", n)).collect()).await;
        for (_, o) in &outcomes {
            let Outcome::Failed { reason, error, .. } = o else { bail!("{o:?}") };
            assert_eq!(*reason, "unroutable");
            assert!(error.contains("312") && error.contains("NO_ROUTE"), "{error}");
        }
        // The channel is still good: a routable message after them is confirmed.
        t.close().await;
        let ok = target(&amqp_url(), "", &topo.queue);
        ok.connect().await?;
        assert_all_confirmed(&publish_all(ok.as_ref(), vec![message("orders", 9)]).await);
        assert_eq!(topo.drain().await?.len(), 1);
        ok.close().await;

        let missing = unique("outbox-test-missing");
        let e = target(&amqp_url(), &missing, "").connect().await.unwrap_err().to_string();
        assert!(e.contains(&missing) && e.contains("NOT_FOUND"), "{e}");
        topo.remove().await
    }

    #[tokio::test]
    async fn rabbitmq_a_broker_nack_is_failed_nacked() -> Result<()> {
        // A queue that holds one message and refuses the rest with a nack.
        let topo = Topology::new(None).await?;
        let full = unique("outbox-test-full");
        let mut args = FieldTable::default();
        args.insert("x-max-length".into(), AMQPValue::LongLongInt(1));
        args.insert("x-overflow".into(), AMQPValue::LongString("reject-publish".into()));
        topo.channel
            .queue_declare(full.as_str().into(), QueueDeclareOptions { durable: true, ..Default::default() }, args)
            .await?;
        let t = target(&amqp_url(), "", &full);
        t.connect().await?;
        assert_eq!(t.publish(message("orders", 1)).await, Outcome::Confirmed);
        let o = t.publish(message("orders", 2)).await;
        assert!(matches!(&o, Outcome::Failed { reason: "nacked", .. }), "{o:?}");
        // The channel stays usable after a nack.
        assert!(matches!(t.publish(message("orders", 3)).await, Outcome::Failed { reason: "nacked", .. }));
        t.close().await;
        topo.channel.queue_delete(full.as_str().into(), QueueDeleteOptions::default()).await?;
        topo.remove().await
    }

    #[tokio::test]
    async fn rabbitmq_errors_never_show_the_password() -> Result<()> {
        let base = url::Url::parse(&amqp_url())?;
        let mut wrong = base.clone();
        wrong.set_password(Some("n0t-the-Pa55word")).unwrap();
        let e = target(wrong.as_str(), "", "").connect().await.unwrap_err().to_string();
        assert!(!e.contains("n0t-the-Pa55word"), "{e}");
        assert!(e.contains("***") || !e.contains(wrong.as_str()), "{e}");
        Ok(())
    }

    #[tokio::test]
    async fn rabbitmq_cut_mid_run_leaves_unconfirmed_unavailable_and_reconnects_when_it_is_back() -> Result<()> {
        let topo = Topology::new(Some("orders")).await?;
        let proxy = TcpProxy::start(addr_of(&amqp_url()).await?).await?;
        let t: Arc<dyn Target> = Arc::from(target(&proxy.url_for(&amqp_url()), &topo.exchange, ""));
        t.connect().await?;
        let window = 32;
        let outcomes = publish_through_a_cut(t.clone(), &proxy, "orders", window, 200).await?;
        let (confirmed, unavailable) = split_cut_outcomes(&outcomes, window)?;
        // While cut: no connection, every publish unavailable at once.
        let e = t.connect().await.unwrap_err().to_string();
        assert!(!e.contains("guest:guest"), "{e}");
        let o = t.publish(message("orders", 0)).await;
        assert!(matches!(o, Outcome::Unavailable { .. }), "{o:?}");
        proxy.restore().await?;
        eventually("the target reconnects", WAIT, || async { Ok(t.connect().await.ok()) }).await?;
        // The runner publishes the unconfirmed again: the queue then has every message, and
        // only those whose confirm was lost can be there twice.
        let again: Vec<Publish> =
            unavailable.iter().map(|id| Publish { message_id: *id, ..message("orders", 0) }).collect();
        assert_all_confirmed(&publish_all(t.as_ref(), again).await);
        let mut seen: HashMap<String, usize> = HashMap::new();
        for m in topo.drain().await? {
            *seen.entry(message_id(&m)).or_default() += 1;
        }
        let lost: HashSet<String> = unavailable.iter().map(ToString::to_string).collect();
        for id in confirmed.iter().chain(&unavailable) {
            assert!(seen.contains_key(&id.to_string()), "message {id} is not in the queue");
        }
        let twice: Vec<&String> = seen.iter().filter(|(_, n)| **n > 1).map(|(id, _)| id).collect();
        for id in &twice {
            assert!(lost.contains(*id), "message {id} is in the queue twice but was confirmed the first time");
            assert_eq!(seen[*id], 2);
        }
        let counted = usize::try_from(t.unconfirmed_lost())?;
        assert!(twice.len() <= counted && counted <= unavailable.len(), "{} twice, {counted} counted", twice.len());
        assert_eq!(seen.len(), confirmed.len() + unavailable.len());
        t.close().await;
        topo.remove().await
    }
}

mod nats {
    use async_nats::jetstream::stream;
    use outbox_tests::brokers::jetstream_with_stream;

    use super::*;

    fn target(url: &str, subject: &str) -> sinks::nats::Nats {
        let SinkTarget::Nats { url, subject } = SinkTarget::nats("sink.nats", url, subject).unwrap() else {
            unreachable!()
        };
        sinks::nats::Nats::new(&url, &subject, local())
    }

    async fn count(s: &mut stream::Stream) -> Result<u64> {
        Ok(s.info().await?.state.messages)
    }

    #[tokio::test]
    async fn jetstream_keeps_one_message_per_id_with_its_headers() -> Result<()> {
        let base = unique("outbox-test");
        let (js, mut s, name) = jetstream_with_stream(&format!("{base}.>")).await?;
        let t = target(&nats_url(), &format!("{base}.{{topic}}.{{type}}"));
        t.connect().await?;
        let mut m = message("orders", 1);
        m.headers.insert("Nats-Rollup".into(), "all".into());
        let outcomes = publish_all(&t, vec![m.clone(), m.clone()]).await;
        assert_all_confirmed(&outcomes);
        assert_all_confirmed(&publish_all(&t, (2..20).map(|n| message("orders", n)).collect()).await);
        assert_eq!(count(&mut s).await?, 19, "the repeated id is stored once");
        assert_eq!(t.duplicates(), 1);
        let first = s.get_raw_message(1).await?;
        assert_eq!(first.subject.as_str(), format!("{base}.orders.OrderPlaced"));
        let id = m.message_id.to_string();
        assert_eq!(first.headers.get("Nats-Msg-Id").map(|v| v.as_str()), Some(id.as_str()));
        assert_eq!(
            first.headers.get("traceparent").map(|v| v.as_str()),
            m.headers.get("traceparent").map(String::as_str)
        );
        assert_eq!(first.headers.get("tenant").map(|v| v.as_str()), Some("t-1"));
        assert!(first.headers.get("Nats-Rollup").is_none(), "a producer's header does not steer the stream");
        assert_eq!(first.payload.as_ref(), m.payload.as_slice());
        t.close().await;
        js.delete_stream(&name).await?;
        Ok(())
    }

    #[tokio::test]
    async fn jetstream_without_a_stream_for_the_subject_is_failed_no_stream() -> Result<()> {
        let t = target(&nats_url(), &format!("{}.{{topic}}", unique("outbox-test-nostream")));
        t.connect().await.context("NATS is part of the test environment")?;
        let (_, o) = publish_all(&t, vec![message("orders", 1)]).await.remove(0);
        let Outcome::Failed { reason, error, .. } = o else { bail!("{o:?}") };
        assert_eq!(reason, "no_stream");
        assert!(error.contains("no responders"), "{error}");
        t.close().await;
        Ok(())
    }

    #[tokio::test]
    async fn jetstream_cut_mid_run_is_unavailable_then_exactly_once_after_the_reconnect() -> Result<()> {
        let base = unique("outbox-test");
        let (js, mut s, name) = jetstream_with_stream(&format!("{base}.>")).await?;
        let proxy = TcpProxy::start(addr_of(&nats_url()).await?).await?;
        let nats = Arc::new(target(&proxy.url_for(&nats_url()), &format!("{base}.{{topic}}")));
        let t: Arc<dyn Target> = nats.clone();
        t.connect().await?;
        let window = 32;
        let outcomes = publish_through_a_cut(t.clone(), &proxy, "orders", window, 200).await?;
        let (confirmed, unavailable) = split_cut_outcomes(&outcomes, window)?;
        assert!(t.connect().await.is_err(), "connect succeeded while the server was cut away");
        let o = t.publish(message("orders", 0)).await;
        assert!(matches!(o, Outcome::Unavailable { .. }), "{o:?}");
        proxy.restore().await?;
        eventually("the target reconnects", WAIT, || async { Ok(t.connect().await.ok()) }).await?;
        // Everything again, the confirmed too: the stream keeps each id once.
        let again: Vec<Publish> = confirmed
            .iter()
            .chain(&unavailable)
            .map(|id| Publish { message_id: *id, ..message("orders", 0) })
            .collect();
        assert_all_confirmed(&publish_all(t.as_ref(), again).await);
        assert_eq!(count(&mut s).await?, u64::try_from(confirmed.len() + unavailable.len())?);
        assert!(nats.duplicates() >= u64::try_from(confirmed.len())?);
        t.close().await;
        js.delete_stream(&name).await?;
        Ok(())
    }
}

mod webhook {
    use outbox_tests::brokers::{Received, WebhookPartner as Partner, answer};

    use super::*;

    fn secret() -> String {
        format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode(*b"outbox-test-signing-key-32bytes!"))
    }

    fn target(url: &str, timeout: Option<Duration>) -> Box<dyn Target> {
        sinks::connect(&SinkTarget::webhook("sink.webhook", url, &secret(), timeout).unwrap(), local())
    }

    fn repo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
    }

    /// A virtualenv with the Standard Webhooks reference library, made once under `target/`.
    fn python() -> Result<PathBuf> {
        outbox_tests::python_venv("py-webhooks-venv", "tests/python/webhook-requirements.txt")
    }

    /// The reference library verifies every request (and refuses each with its body changed).
    async fn verify_with_standardwebhooks(requests: &[Received]) -> Result<()> {
        let py = tokio::task::spawn_blocking(python).await??;
        let job = serde_json::json!({
            "secret": secret(),
            "requests": requests.iter().map(|r| serde_json::json!({
                "headers": r.headers.iter().cloned().collect::<HashMap<_, _>>(),
                "body_b64": base64::engine::general_purpose::STANDARD.encode(&r.body),
            })).collect::<Vec<_>>(),
        });
        let mut child = tokio::process::Command::new(py)
            .arg(repo().join("tests/python/verify_webhook.py"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let mut stdin = child.stdin.take().unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut stdin, job.to_string().as_bytes()).await?;
        drop(stdin);
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await??;
        let stdout = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success() && stdout.trim() == format!("verified {}", requests.len()),
            "standardwebhooks: {stdout} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_webhook_is_posted_signed_as_standard_webhooks_and_2xx_confirms() -> Result<()> {
        let partner = Partner::start().await?;
        let t = target(&partner.url, None);
        t.connect().await?;
        let mut plain = message("orders", 1);
        plain.headers.remove("content-type");
        plain.headers.insert("Odd Name:é".into(), "kept".into());
        plain.headers.insert("multi-line".into(), "a\r\nb".into());
        // Not JSON, not ASCII (the reference library verifies text bodies only).
        plain.payload = "é ✓\nline two".as_bytes().to_vec();
        let sent = vec![message("orders", 0), plain.clone()];
        let before = chrono::Utc::now().timestamp();
        assert_all_confirmed(&publish_all(t.as_ref(), sent.clone()).await);
        let got = partner.received();
        assert_eq!(got.len(), 2);
        for r in &got {
            let id = r.header("webhook-id").context("no webhook-id")?;
            let m = sent.iter().find(|m| m.message_id.to_string() == id).context("webhook-id is not a sent id")?;
            assert_eq!(r.body, m.payload);
            let ts: i64 = r.header("webhook-timestamp").context("no webhook-timestamp")?.parse()?;
            assert!((before - 1..=chrono::Utc::now().timestamp() + 1).contains(&ts), "{ts}");
            assert!(r.header("webhook-signature").is_some_and(|s| s.starts_with("v1,")));
            assert_eq!(r.header("outbox-header-traceparent"), m.headers.get("traceparent").map(String::as_str));
            assert_eq!(r.header("traceparent"), m.headers.get("traceparent").map(String::as_str));
            assert_eq!(r.header("outbox-header-tenant"), m.headers.get("tenant").map(String::as_str));
            let want = if m.message_id == plain.message_id { "application/octet-stream" } else { "application/json" };
            assert_eq!(r.header("content-type"), Some(want));
        }
        let odd = got.iter().find(|r| r.body == plain.payload).unwrap();
        assert_eq!(odd.header("outbox-header-odd%20name%3a%c3%a9"), Some("kept"), "{:?}", odd.headers);
        assert!(odd.header("outbox-header-multi-line").is_none(), "a value HTTP cannot carry is left out");
        verify_with_standardwebhooks(&got).await
    }

    #[tokio::test]
    async fn webhook_answers_become_failed_attempts_with_their_reasons() -> Result<()> {
        let partner = Partner::start().await?;
        let t = target(&partner.url, Some(Duration::from_millis(500)));
        async fn one(t: &dyn Target) -> Outcome {
            t.publish(message("orders", 1)).await
        }

        let mut a = answer(429);
        a.headers.push(("retry-after", "7".into()));
        partner.answer(a);
        let o = one(t.as_ref()).await;
        assert!(
            matches!(&o, Outcome::Failed { reason: "http_429", retry_after: Some(d), .. } if *d == Duration::from_secs(7)),
            "{o:?}"
        );

        let mut a = answer(503);
        a.headers
            .push(("retry-after", httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(30))));
        partner.answer(a);
        let o = one(t.as_ref()).await;
        let Outcome::Failed { reason: "http_5xx", retry_after: Some(d), .. } = &o else { bail!("{o:?}") };
        assert!((Duration::from_secs(28)..=Duration::from_secs(30)).contains(d), "{d:?}");

        partner.answer(answer(500));
        let o = one(t.as_ref()).await;
        assert!(
            matches!(&o, Outcome::Failed { reason: "http_5xx", retry_after: None, error } if error.contains("500")),
            "{o:?}"
        );

        let mut a = answer(400);
        a.body = format!("{{\"error\":\"unknown field\"}}{}", "x".repeat(10_000));
        partner.answer(a);
        let o = one(t.as_ref()).await;
        let Outcome::Failed { reason: "http_4xx", error, retry_after: None } = &o else { bail!("{o:?}") };
        assert_eq!(error, "the partner answered 400 Bad Request", "the status only, never the body");

        let mut a = answer(200);
        a.delay = Duration::from_secs(3);
        partner.answer(a);
        let o = one(t.as_ref()).await;
        assert!(matches!(&o, Outcome::Failed { reason: "timeout", .. }), "{o:?}");

        let before = partner.received().len();
        let mut a = answer(302);
        a.headers.push(("location", "https://elsewhere.example/hook".into()));
        partner.answer(a);
        let o = one(t.as_ref()).await;
        let Outcome::Failed { reason: "http_3xx", error, .. } = &o else { bail!("{o:?}") };
        assert!(error.contains("302") && !error.contains("elsewhere.example"), "the status only: {error}");
        assert_eq!(partner.received().len(), before + 1, "the redirect is not followed");

        let text = format!("{o:?}");
        assert!(!text.contains("q-s3cr3t") && !text.contains(&secret()[6..]), "{text}");
        Ok(())
    }

    #[tokio::test]
    async fn a_webhook_partner_that_is_down_is_unavailable_and_connect_fails_until_it_is_up() -> Result<()> {
        let partner = Partner::start().await?;
        let addr = url::Url::parse(&partner.url)?;
        let upstream = addr_of_http(&addr).await?;
        let proxy = TcpProxy::start(upstream).await?;
        let t = target(&proxy.url_for(&partner.url), Some(Duration::from_secs(2)));
        t.connect().await?;
        assert_all_confirmed(&publish_all(t.as_ref(), vec![message("orders", 1)]).await);
        proxy.cut().await?;
        let e = t.connect().await.unwrap_err().to_string();
        assert!(e.contains("refused"), "{e}");
        let o = t.publish(message("orders", 2)).await;
        let Outcome::Unavailable { error } = &o else { bail!("{o:?}") };
        assert!(!error.contains("q-s3cr3t"), "the URL's query is not shown: {error}");
        proxy.restore().await?;
        t.connect().await?;
        assert_all_confirmed(&publish_all(t.as_ref(), vec![message("orders", 3)]).await);
        assert_eq!(partner.received().len(), 2);
        Ok(())
    }

    async fn addr_of_http(url: &url::Url) -> Result<std::net::SocketAddr> {
        let host = url.host_str().context("no host")?;
        let port = url.port_or_known_default().context("no port")?;
        tokio::net::lookup_host((host, port)).await?.next().context("cannot resolve")
    }
}

//! `outboxctl` as an operator uses it: a real binary against a real outboxd.
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use outbox_tests::{Backend, RawStream, eventually};
use serde_json::Value;

use crate::{WAIT, conformance, setup, stats};

conformance!(
    an_operator_finds_a_dead_letter_and_replays_it_with_outboxctl,
    outboxctl_tail_shows_matching_messages_as_they_commit,
    an_operator_creates_sinks_with_outboxctl_and_never_sees_their_secrets
);

fn outboxctl_path() -> PathBuf {
    outbox_tests::outboxd_path().with_file_name("outboxctl-e2e")
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn outboxctl(server: &str, args: &[&str]) -> Result<Run> {
    let out = tokio::process::Command::new(outboxctl_path())
        .args(["--server", server])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("running outboxctl")?;
    Ok(Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

async fn json(server: &str, args: &[&str]) -> Result<Value> {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    let run = outboxctl(server, &all).await?;
    anyhow::ensure!(run.code == 0, "outboxctl {args:?} exited {}: {}", run.code, run.stderr);
    Ok(serde_json::from_str(&run.stdout)?)
}

async fn an_operator_finds_a_dead_letter_and_replays_it_with_outboxctl(backend: Backend) -> Result<()> {
    let (_store, srv, db) = setup(backend, &[]).await?;
    let server = srv.endpoint.as_str();

    let created = json(
        server,
        &["consumers", "create", "billing", "--topic", "orders.*", "--max-deliveries", "2", "--backoff-base", "10ms"],
    )
    .await?;
    assert_eq!(created[0]["name"], "billing");
    assert_eq!(created[0]["max_deliveries"], 2);
    let list = json(server, &["consumers", "list"]).await?;
    assert_eq!(list.as_array().map(Vec::len), Some(1));

    // Exit codes scripts rely on, with the server's message rather than a debug dump.
    let missing = outboxctl(server, &["consumers", "get", "nobody"]).await?;
    assert_eq!(missing.code, 3, "{}", missing.stderr);
    assert!(missing.stderr.contains("nobody"), "{}", missing.stderr);
    let bad = outboxctl(server, &["consumers", "create", "bad", "--topic", "a..b"]).await?;
    assert_eq!(bad.code, 4, "{}", bad.stderr);
    assert!(bad.stderr.contains("consumer.topics[0]"), "{}", bad.stderr);
    let down = outboxctl("http://127.0.0.1:1", &["stats"]).await?;
    assert_eq!(down.code, 5, "{}", down.stderr);

    // A poison message dies after two deliveries.
    let id = db.sql_enqueue("orders.created", "OrderCreated", b"{\"id\":7}").await?.to_string();
    let mut s = RawStream::open(server, "billing", 10).await?;
    for _ in 0..2 {
        let d = s.take(1, WAIT).await?.remove(0);
        s.nack(&d.message_id, "cannot charge card").await;
    }
    eventually("dead", WAIT, || async { Ok((stats(&srv, "billing").await?.dead == 1).then_some(())) }).await?;

    let st = json(server, &["stats"]).await?;
    assert_eq!(st["consumers"][0]["dead"], 1);
    let table = outboxctl(server, &["stats"]).await?;
    assert!(table.stdout.contains("billing") && table.stdout.contains("DEAD"), "{}", table.stdout);

    let dead = json(server, &["dead-letters", "list", "billing"]).await?;
    assert_eq!(dead[0]["message"]["message_id"], id.as_str());
    assert_eq!(dead[0]["last_error"], "cannot charge card");
    assert_eq!(dead[0]["delivery_count"], 2);
    let shown = outboxctl(server, &["dead-letters", "show", "billing", &id]).await?;
    assert_eq!(shown.code, 0, "{}", shown.stderr);
    assert!(shown.stdout.contains("cannot charge card") && shown.stdout.contains("{\"id\":7}"), "{}", shown.stdout);

    // A dry run counts and changes nothing; replay asks first, and without a terminal it
    // refuses unless told --yes.
    let dry = json(server, &["replay", "billing", "--dead-letters", "--dry-run"]).await?;
    assert_eq!((dry["replayed"].as_i64(), dry["dry_run"].as_bool()), (Some(1), Some(true)));
    let by_type = json(server, &["replay", "billing", "--dead-letters", "--type", "OrderCreated", "--dry-run"]).await?;
    assert_eq!(by_type["replayed"], 1);
    let other = json(server, &["replay", "billing", "--dead-letters", "--type", "Refund", "--dry-run"]).await?;
    assert_eq!(other["replayed"], 0, "the type filter excludes it");
    let off_topic =
        json(server, &["replay", "billing", "--dead-letters", "--topic", "orders.paid", "--dry-run"]).await?;
    assert_eq!(off_topic["replayed"], 0, "the topic filter excludes it");
    // Large replays ask first (here: more than 0), and without a terminal that is a refusal.
    let refused = outboxctl(server, &["replay", "billing", "--dead-letters", "--confirm-above", "0"]).await?;
    assert_eq!(refused.code, 6, "{}", refused.stderr);
    assert_eq!(stats(&srv, "billing").await?.dead, 1, "nothing replayed");
    let replayed =
        json(server, &["replay", "billing", "--dead-letters", "--rate", "50", "--confirm-above", "0", "--yes"]).await?;
    assert_eq!(replayed["replayed"], 1);
    let d = s.take(1, WAIT).await?.remove(0);
    assert_eq!((d.message_id.as_str(), d.delivery_count), (id.as_str(), 1));
    s.ack(&[&d.message_id]).await;

    let msg = json(server, &["message", "get", &id]).await?;
    eventually("acked", WAIT, || async { Ok((stats(&srv, "billing").await?.acked == 1).then_some(())) }).await?;
    assert_eq!(msg["message"]["topic"], "orders.created");
    assert_eq!(msg["deliveries"][0]["consumer"], "billing");
    Ok(())
}

async fn outboxctl_tail_shows_matching_messages_as_they_commit(backend: Backend) -> Result<()> {
    use tokio::io::AsyncBufReadExt as _;
    let (_store, srv, db) = setup(backend, &[]).await?;
    db.sql_enqueue("orders.created", "Before", b"old").await?; // committed before the tail: not shown
    let mut child = tokio::process::Command::new(outboxctl_path())
        .args(["--server", &srv.endpoint, "--output", "json", "tail", "orders.*"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().context("no stdout")?).lines();
    // The tail starts after the newest message it sees when it starts; enqueue until one shows
    // (bounded), since the process may still be connecting.
    let deadline = tokio::time::Instant::now() + WAIT;
    let line = loop {
        db.sql_enqueue("users.created", "OtherTopic", b"").await?;
        db.sql_enqueue("orders.created", "Shown", b"new").await?;
        if let Ok(line) = tokio::time::timeout(std::time::Duration::from_millis(500), lines.next_line()).await {
            break line?.context("tail ended")?;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "the tail showed nothing");
    };
    let v: Value = serde_json::from_str(&line)?;
    assert_eq!(v["type"], "Shown", "{line}");
    assert_eq!(v["topic"], "orders.created");
    assert_eq!(v["payload"], "new");
    Ok(())
}

/// Sinks as an operator creates them: each target's flags, secrets shown as `***` by every
/// command, and `stats` marking which consumers are sinks.
async fn an_operator_creates_sinks_with_outboxctl_and_never_sees_their_secrets(backend: Backend) -> Result<()> {
    let (_store, srv, _db) = setup(backend, &[]).await?;
    let server = srv.endpoint.as_str();
    let (password, secret) = ("s3cr3t-pw", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");

    let rabbit_url = format!("amqp://guest:{password}@127.0.0.1:5672/%2f");
    let rabbit = json(
        server,
        &[
            "consumers",
            "create",
            "to-rabbit",
            "--topic",
            "orders.*",
            "--sink",
            "rabbitmq",
            "--url",
            &rabbit_url,
            "--exchange",
            "orders",
            "--routing-key",
            "{topic}.{type}",
            "--max-in-flight",
            "16",
        ],
    )
    .await?;
    let sink = &rabbit[0]["sink"];
    assert_eq!(sink["kind"], "rabbitmq");
    assert_eq!(sink["url"], "amqp://guest:***@127.0.0.1:5672/%2f");
    assert_eq!((sink["exchange"].as_str(), sink["routing_key"].as_str()), (Some("orders"), Some("{topic}.{type}")));
    assert_eq!(sink["max_in_flight"], 16);

    let nats = json(
        server,
        &[
            "consumers",
            "create",
            "to-nats",
            "--topic",
            "orders.*",
            "--sink",
            "nats",
            "--url",
            "nats://127.0.0.1:4222",
            "--subject",
            "events.{topic}",
        ],
    )
    .await?;
    assert_eq!(
        (nats[0]["sink"]["kind"].as_str(), nats[0]["sink"]["subject"].as_str()),
        (Some("nats"), Some("events.{topic}"))
    );

    let hook = json(
        server,
        &[
            "consumers",
            "create",
            "to-partner",
            "--topic",
            "orders.*",
            "--sink",
            "webhook",
            "--url",
            "http://127.0.0.1:9/hook",
            "--secret",
            secret,
            "--timeout",
            "3s",
        ],
    )
    .await?;
    assert_eq!(hook[0]["sink"]["secret"], "***");
    assert_eq!(hook[0]["sink"]["timeout_s"], 3.0);

    // Wrong or missing flags are usage errors (2), before anything is sent; the server's own
    // check names the field (4).
    let wrong = outboxctl(
        server,
        &["consumers", "create", "w", "--topic", "t", "--sink", "nats", "--url", "nats://x", "--exchange", "e"],
    )
    .await?;
    assert_eq!(wrong.code, 2, "{}", wrong.stderr);
    assert!(wrong.stderr.contains("--exchange") && wrong.stderr.contains("rabbitmq"), "{}", wrong.stderr);
    let no_secret = outboxctl(
        server,
        &["consumers", "create", "w", "--topic", "t", "--sink", "webhook", "--url", "https://p.example/"],
    )
    .await?;
    assert_eq!(no_secret.code, 2, "{}", no_secret.stderr);
    let plain_http = outboxctl(
        server,
        &[
            "consumers",
            "create",
            "w",
            "--topic",
            "t",
            "--sink",
            "webhook",
            "--url",
            "http://partner.example/",
            "--secret",
            secret,
        ],
    )
    .await?;
    assert_eq!(plain_http.code, 4, "{}", plain_http.stderr);
    assert!(plain_http.stderr.contains("loopback"), "{}", plain_http.stderr);

    // Every way of looking shows no secret, and the table names each sink.
    for args in [&["consumers", "list"][..], &["consumers", "get", "to-rabbit"], &["consumers", "get", "to-partner"]] {
        for output in ["json", "table"] {
            let run = outboxctl(server, &[args, &["--output", output]].concat()).await?;
            assert_eq!(run.code, 0, "{}", run.stderr);
            assert!(!run.stdout.contains(password) && !run.stdout.contains(&secret[6..]), "{}", run.stdout);
        }
    }
    let table = outboxctl(server, &["consumers", "list"]).await?;
    assert!(table.stdout.contains("SINK") && table.stdout.contains("rabbitmq amqp://guest:***@"), "{}", table.stdout);
    let leaked: Vec<String> = [srv.log_lines(&[password]), srv.log_lines(&[&secret[6..]])].concat();
    assert!(leaked.is_empty(), "a secret in the log: {leaked:?}");

    // Stats mark the sinks; an ordinary consumer has none.
    json(server, &["consumers", "create", "plain", "--topic", "orders.*"]).await?;
    let st = json(server, &["stats"]).await?;
    let kinds: std::collections::BTreeMap<String, Value> = st["consumers"]
        .as_array()
        .context("no consumers")?
        .iter()
        .map(|c| (c["consumer"].as_str().unwrap_or_default().to_owned(), c["sink"].clone()))
        .collect();
    assert_eq!(kinds["to-rabbit"], "rabbitmq");
    assert_eq!(kinds["to-nats"], "nats");
    assert_eq!(kinds["to-partner"], "webhook");
    assert_eq!(kinds["plain"], Value::Null);
    let table = outboxctl(server, &["stats"]).await?;
    assert!(table.stdout.contains("SINK") && table.stdout.contains("webhook"), "{}", table.stdout);
    Ok(())
}

//! `outboxctl` as an operator uses it: a real binary against a real outboxd.
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use outbox_tests::{Backend, RawStream, eventually};
use serde_json::Value;

use crate::{WAIT, conformance, setup, stats};

conformance!(
    an_operator_finds_a_dead_letter_and_replays_it_with_outboxctl,
    outboxctl_tail_shows_matching_messages_as_they_commit,
    outboxctl_creates_sinks_shows_them_without_secrets_and_marks_them_in_stats,
    outboxctl_publishes_and_consumes_with_acks_and_nacks,
    a_poison_key_waits_until_an_operator_releases_it_or_replays_its_dead_message,
    consume_max_one_leaves_what_it_did_not_take_uncounted_for_the_next_consume,
);

/// Issue 47, as a new user met it: on a consumer of `--max-deliveries 1`, `consume --max 1`
/// takes one of three messages and stops cleanly; what its stream held beyond that one is not
/// retrying, and the next `consume` gets it as delivery 1, not as a delivery 2 above
/// `max_deliveries` that could never be dead-lettered.
async fn consume_max_one_leaves_what_it_did_not_take_uncounted_for_the_next_consume(backend: Backend) -> Result<()> {
    let (_store, srv, _db) = setup(backend, &[]).await?;
    let server = srv.endpoint.as_str();
    json(server, &["consumers", "create", "probe", "--topic", "t", "--max-deliveries", "1"]).await?;
    for i in 0..3 {
        json(server, &["publish", "t", "Probe", "--payload", &format!("p{i}")]).await?;
    }
    let run = outboxctl(server, &["consume", "probe", "--max", "1"]).await?;
    anyhow::ensure!(run.code == 0, "consume exited {}: {}", run.code, run.stderr);
    assert!(run.stdout.contains("(delivery 1)"), "{}", run.stdout);
    let st = eventually("the stream's end released what it held", WAIT, || async {
        let st = json(server, &["stats", "--consumer", "probe"]).await?;
        let c = st["consumers"][0].clone();
        Ok((c["in_flight"] == 0 && c["streams"] == 0).then_some(c))
    })
    .await?;
    assert_eq!(
        (&st["backlog"], &st["retrying"], &st["acked"]),
        (&Value::from(2), &Value::from(0), &Value::from(1)),
        "{st}"
    );

    let run = outboxctl(server, &["consume", "probe", "--max", "2"]).await?;
    anyhow::ensure!(run.code == 0, "consume exited {}: {}", run.code, run.stderr);
    assert_eq!(run.stdout.matches("(delivery 1)").count(), 2, "{}", run.stdout);
    assert!(!run.stdout.contains("(delivery 2)"), "{}", run.stdout);
    Ok(())
}

/// The tour with nothing but outboxctl: publish messages, consume them (acking), nack one until
/// it is dead, and a refused connection names the flag that fixes it.
async fn outboxctl_publishes_and_consumes_with_acks_and_nacks(backend: Backend) -> Result<()> {
    let (_store, srv, _db) = setup(backend, &[]).await?;
    let server = srv.endpoint.as_str();
    json(server, &["consumers", "create", "billing", "--topic", "orders.*", "--max-deliveries", "1"]).await?;
    let first = json(
        server,
        &[
            "publish",
            "orders.created",
            "OrderCreated",
            "--payload",
            "{\"id\":42}",
            "--header",
            "tenant=acme",
            "--key",
            "o-42",
        ],
    )
    .await?;
    let id = first["message_id"].as_str().context("a message id")?.to_owned();
    assert_eq!(first["duplicate"], false);
    let again =
        json(server, &["publish", "orders.created", "OrderCreated", "--payload", "{\"id\":42}", "--id", &id]).await?;
    assert_eq!(again["duplicate"], true, "the same message again");
    let other =
        outboxctl(server, &["publish", "orders.created", "OrderCreated", "--payload", "other", "--id", &id]).await?;
    assert_eq!(other.code, 4, "another message under the id: {}", other.stderr);
    assert!(other.stderr.contains("different topic, type or payload"), "{}", other.stderr);
    let payload_file = std::env::temp_dir().join(format!("outboxctl-{}.bin", uuid::Uuid::new_v4()));
    std::fs::write(&payload_file, b"from a file")?;
    let file_arg = format!("@{}", payload_file.display());
    json(server, &["publish", "orders.updated", "OrderUpdated", "--payload", &file_arg]).await?;
    let _ = std::fs::remove_file(&payload_file);

    let run = outboxctl(server, &["consume", "billing", "--max", "2", "--output", "json"]).await?;
    anyhow::ensure!(run.code == 0, "consume exited {}: {}", run.code, run.stderr);
    let got: Vec<Value> = run.stdout.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    assert_eq!(got.len(), 2, "{}", run.stdout);
    assert_eq!(got[0]["message_id"], id.as_str());
    assert_eq!((got[0]["payload"].as_str(), got[0]["headers"]["tenant"].as_str()), (Some("{\"id\":42}"), Some("acme")));
    assert_eq!(got[1]["payload"], "from a file");
    eventually("both acked", WAIT, || async { Ok((stats(&srv, "billing").await?.acked == 2).then_some(())) }).await?;

    json(server, &["publish", "orders.created", "Poison"]).await?;
    let run = outboxctl(server, &["consume", "billing", "--nack", "--max", "1"]).await?;
    anyhow::ensure!(run.code == 0, "consume --nack exited {}: {}", run.code, run.stderr);
    assert!(run.stdout.contains("Poison"), "{}", run.stdout);
    eventually("dead after its one delivery", WAIT, || async {
        Ok((stats(&srv, "billing").await?.dead == 1).then_some(()))
    })
    .await?;

    let run = outboxctl("http://127.0.0.1:1", &["stats"]).await?;
    assert_eq!(run.code, 5, "{}", run.stderr);
    assert!(run.stderr.contains("--server") && run.stderr.contains("OUTBOXD_SERVER"), "{}", run.stderr);
    assert!(!run.stderr.contains("transport error: transport error"), "{}", run.stderr);
    Ok(())
}

/// Poison-key quarantine end to end (ADR 0057): a consumer created with `--dead-key-policy
/// hold` holds key `k1` when its first message dies; the key's next messages wait (not
/// delivered, not counted) while another key's message, committed later, is delivered;
/// `keys list` names the key, the dead message and what waits; `keys release --skip-dead` lets
/// the waiting ones go in order and leaves the dead one dead; and on another held key, a replay
/// of the dead message delivers it first and the key's next message only after its ack.
async fn a_poison_key_waits_until_an_operator_releases_it_or_replays_its_dead_message(backend: Backend) -> Result<()> {
    let (_store, srv, _db) = setup(backend, &[]).await?;
    let server = srv.endpoint.as_str();
    let created = json(
        server,
        &["consumers", "create", "ledger", "--topic", "acct.*", "--max-deliveries", "1", "--dead-key-policy", "hold"],
    )
    .await?;
    assert_eq!(created[0]["dead_key_policy"], "HOLD");
    let publish = |key: &'static str, type_: &'static str| async move {
        let v = json(server, &["publish", "acct.posted", type_, "--key", key]).await?;
        v["message_id"].as_str().map(str::to_owned).context("a message id")
    };
    let a1 = publish("k1", "A1").await?;
    let a2 = publish("k1", "A2").await?;
    publish("k1", "A3").await?;

    let mut s = RawStream::open(server, "ledger", 10).await?;
    let d = s.take(1, WAIT).await?.remove(0);
    assert_eq!(d.message_id, a1, "A1 first: A2 waits behind it");
    s.nack(&d.message_id, "balance would go negative").await;
    eventually("held", WAIT, || async { Ok((stats(&srv, "ledger").await?.held_keys == 1).then_some(())) }).await?;
    publish("k2", "B1").await?;
    let d = s.take(1, WAIT).await?.remove(0);
    assert_eq!(d.r#type, "B1", "another key flows while k1 is held (A2 was committed before B1)");
    s.ack(&[&d.message_id]).await;
    let a2_rows = json(server, &["message", "get", &a2]).await?;
    assert_eq!(a2_rows["deliveries"][0]["delivery_count"], 0, "waiting is not an attempt: {a2_rows}");

    let held = json(server, &["keys", "list", "ledger"]).await?;
    assert_eq!(held["keys"].as_array().map(Vec::len), Some(1), "{held}");
    assert_eq!(
        (&held["keys"][0]["ordering_key"], &held["keys"][0]["message_id"], &held["keys"][0]["waiting"]),
        (&Value::from("k1"), &Value::from(a1.as_str()), &Value::from(2))
    );
    assert_eq!(held["keys"][0]["last_error"], "balance would go negative");
    let table = outboxctl(server, &["keys", "list", "ledger"]).await?;
    assert!(table.stdout.contains("k1") && table.stdout.contains(&a1), "{}", table.stdout);
    let st = json(server, &["stats"]).await?;
    assert_eq!(st["consumers"][0]["held_keys"], 1);

    let missing = outboxctl(server, &["keys", "release", "ledger", "k2"]).await?;
    assert_eq!(missing.code, 3, "{}", missing.stderr);
    assert!(missing.stderr.contains("holds no ordering key"), "{}", missing.stderr);
    let released = json(server, &["keys", "release", "ledger", "k1", "--skip-dead"]).await?;
    assert_eq!(released["released"]["message_id"], a1.as_str());
    let got = s.take(1, WAIT).await?;
    assert_eq!(got[0].r#type, "A2");
    s.ack(&[&got[0].message_id]).await;
    let got = s.take(1, WAIT).await?;
    assert_eq!(got[0].r#type, "A3", "in order, one at a time");
    s.ack(&[&got[0].message_id]).await;
    let dead = json(server, &["dead-letters", "list", "ledger"]).await?;
    assert_eq!(dead[0]["message"]["message_id"], a1.as_str(), "A1 stays a dead letter");

    // Another poison key, resumed by replaying its dead message.
    let c1 = publish("k3", "C1").await?;
    let d = s.take(1, WAIT).await?.remove(0);
    assert_eq!(d.message_id, c1);
    s.nack(&d.message_id, "unknown account").await;
    eventually("held", WAIT, || async { Ok((stats(&srv, "ledger").await?.held_keys == 1).then_some(())) }).await?;
    publish("k3", "C2").await?;
    json(server, &["replay", "ledger", "--id", &c1, "--yes"]).await?;
    let d = s.take(1, WAIT).await?.remove(0);
    assert_eq!((d.message_id.as_str(), d.delivery_count), (c1.as_str(), 1), "the dead message first");
    s.ack(&[&d.message_id]).await;
    let d = s.take(1, WAIT).await?.remove(0);
    assert_eq!(d.r#type, "C2", "then the next, once it is acked");
    s.ack(&[&d.message_id]).await;
    assert_eq!(stats(&srv, "ledger").await?.held_keys, 0);
    Ok(())
}

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

async fn outboxctl_creates_sinks_shows_them_without_secrets_and_marks_them_in_stats(backend: Backend) -> Result<()> {
    let (_store, srv, _db) = setup(backend, &[]).await?;
    let server = srv.endpoint.as_str();
    // Nothing listens on port 1: the sinks keep reconnecting, which does not matter here.
    let created = json(
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
            "amqp://app:pa55word@127.0.0.1:1/%2f",
            "--exchange",
            "events",
            "--routing-key",
            "{topic}.{type}",
            "--max-in-flight",
            "16",
        ],
    )
    .await?;
    let sink = &created[0]["sink"];
    assert_eq!(sink["kind"], "rabbitmq", "{created}");
    assert_eq!(sink["url"], "amqp://app:***@127.0.0.1:1/%2f");
    assert_eq!(sink["exchange"], "events");
    assert_eq!(sink["routing_key"], "{topic}.{type}");
    assert_eq!(sink["max_in_flight"], 16);

    let secret_file = tempfile_with("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n")?;
    let hook = json(
        server,
        &[
            "consumers",
            "create",
            "to-hook",
            "--topic",
            "orders.*",
            "--sink",
            "webhook",
            "--url",
            "http://127.0.0.1:1/hook",
            "--secret-file",
            secret_file.to_str().unwrap_or_default(),
            "--timeout",
            "3s",
        ],
    )
    .await?;
    std::fs::remove_file(&secret_file)?;
    assert_eq!(hook[0]["sink"]["secret"], "***", "{hook}");
    assert_eq!(hook[0]["sink"]["timeout_s"], 3.0);
    json(server, &["consumers", "create", "to-nats", "--topic", "t", "--sink", "nats", "--url", "nats://127.0.0.1:1"])
        .await?;

    // The table shows where each sink goes, never the password.
    let list = outboxctl(server, &["consumers", "list"]).await?;
    assert_eq!(list.code, 0, "{}", list.stderr);
    assert!(list.stdout.contains("rabbitmq amqp://app:***@127.0.0.1:1/%2f exchange=events"), "{}", list.stdout);
    assert!(list.stdout.contains("nats nats://127.0.0.1:1 subject={topic}"), "{}", list.stdout);
    assert!(!list.stdout.contains("pa55word") && !list.stdout.contains("MfKQ9r8"), "{}", list.stdout);

    let stats = json(server, &["stats"]).await?;
    let kind = |name: &str| {
        stats["consumers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["consumer"] == name))
            .map(|c| c["sink"].clone())
    };
    assert_eq!(kind("to-rabbit"), Some(Value::from("rabbitmq")), "{stats}");
    assert_eq!(kind("to-hook"), Some(Value::from("webhook")));
    let table = outboxctl(server, &["stats"]).await?;
    assert!(table.stdout.contains("SINK") && table.stdout.contains("webhook"), "{}", table.stdout);

    // Flags that do not fit the sink are usage errors naming the flag; nothing is created.
    let bad = outboxctl(
        server,
        &["consumers", "create", "x", "--topic", "t", "--sink", "nats", "--url", "nats://h:4222", "--exchange", "e"],
    )
    .await?;
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("--exchange is for --sink rabbitmq"), "{}", bad.stderr);
    let no_secret = outboxctl(
        server,
        &["consumers", "create", "x", "--topic", "t", "--sink", "webhook", "--url", "https://p.example/"],
    )
    .await?;
    assert_eq!(no_secret.code, 2, "{}", no_secret.stderr);
    // The server's refusal names the field.
    let refused = outboxctl(
        server,
        &["consumers", "create", "x", "--topic", "t", "--sink", "rabbitmq", "--url", "http://127.0.0.1:5672"],
    )
    .await?;
    assert_eq!(refused.code, 4, "{}", refused.stderr);
    assert!(refused.stderr.contains("consumer.sink.rabbitmq.url"), "{}", refused.stderr);
    let names: Vec<String> = json(server, &["consumers", "list"])
        .await?
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(names, ["to-hook", "to-nats", "to-rabbit"]);
    Ok(())
}

/// A file with `contents` that lives as long as the test process.
fn tempfile_with(contents: &str) -> Result<PathBuf> {
    let path = std::env::temp_dir().join(format!("outboxctl-secret-{}", uuid::Uuid::new_v4()));
    std::fs::write(&path, contents)?;
    Ok(path)
}

/// PostgreSQL only (SQLite keeps no snapshots for others): a session of another application
/// that sits `idle in transaction` with a snapshot holds back vacuum of outboxd's tables;
/// `outboxctl stats` names it (pid, application, state, how long), in text and JSON, and GetStats
/// stops naming it once it commits.
#[tokio::test]
async fn stats_name_the_transaction_that_holds_back_vacuum() -> Result<()> {
    let (_db, srv, pool) = crate::setup_pg(&[]).await?;
    let mut holder = pool.acquire().await?;
    sqlx::query("SET application_name = 'billing-report'").execute(&mut *holder).await?;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut *holder).await?;
    sqlx::query("BEGIN ISOLATION LEVEL REPEATABLE READ").execute(&mut *holder).await?;
    sqlx::query("SELECT count(*) FROM outbox.messages").execute(&mut *holder).await?;
    // Transactions committed after its snapshot: it is that many behind.
    for _ in 0..3 {
        sqlx::query("SELECT outbox.enqueue('orders.created', 'T', '\\x7b7d'::bytea)").execute(&pool).await?;
    }

    let s = json(&srv.endpoint, &["stats"]).await?;
    let h = &s["vacuum_horizon"];
    assert_eq!(h["kind"], "transaction", "{s}");
    assert_eq!(h["pid"], pid, "{s}");
    assert_eq!(h["application_name"], "billing-report", "{s}");
    assert_eq!(h["state"], "idle in transaction", "{s}");
    assert!(h["xmin_age"].as_i64().is_some_and(|n| n >= 3), "{s}");
    assert!(h["age_s"].as_f64().is_some_and(|a| a >= 0.0), "{s}");
    let text = outboxctl(&srv.endpoint, &["stats"]).await?;
    let line = format!("vacuum held back by: transaction of pid {pid} (billing-report), idle in transaction for ");
    assert!(text.stdout.contains(&line), "{}", text.stdout);

    sqlx::query("COMMIT").execute(&mut *holder).await?;
    let mut admin = srv.admin().await?;
    let after = admin.get_stats(outbox_proto::v1::GetStatsRequest::default()).await?.into_inner();
    assert!(
        after.vacuum_horizon.as_ref().is_none_or(|h| h.pid != pid),
        "a committed transaction still named: {:?}",
        after.vacuum_horizon
    );
    Ok(())
}

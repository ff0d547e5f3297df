//! What keeps every write that makes work waking whom it made work for:
//!
//! - every method of the store seam is classified here: a write that goes through [`Waking`]
//!   (and which of its methods), the store's own, or one that makes no work for anyone (and
//!   why); a method added to the seam and not classified fails;
//! - no code outside the store, the hub and this module calls a write that goes through here,
//!   or signals the hub, itself (test code is left out: it sets up stores as it likes);
//! - every method of [`Waking`] is driven on both stores, and each call is checked against the
//!   wake-ups it must give and those it must not; a method not driven, or driven without ever
//!   waking anyone, fails.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{SubsecRound, Utc};
use tokio::sync::watch;

use super::*;
use crate::domain::{Attempt, DeadKeyPolicy, StartFrom};
use crate::hub::StreamGuard;
use crate::store::LeaseParams;
use crate::store::tests::{msg, on_every_store, spec};

/// The store's writes that make work for someone, and the method of [`Waking`] that makes each.
const THROUGH_THE_LAYER: &[(&str, &str)] = &[
    ("message_insert", "enqueue"),
    ("message_insert_many", "enqueue_batch"),
    ("relay_pass", "run_pass"),
    ("delivery_ack_held", "ack"),
    ("delivery_ack_many", "ack_ids"),
    ("delivery_release_many", "release"),
    ("consumer_set_paused", "set_paused"),
    ("consumer_create", "create_consumer"),
    ("consumer_create_by", "create_consumer"),
    ("consumer_delete", "delete_consumer"),
    ("replay_apply", "replay"),
    ("held_key_release", "release_key"),
];

/// The store's own: a transaction may write anything, so only the store's operations open one.
const STORE_ONLY: &[&str] = &["begin", "begin_consumer_change", "begin_relay"];

/// The methods that make no work for a stream, the relay or the sink supervisor, and why.
const MAKES_NO_WORK: &[(&str, &str)] = &[
    ("backend", "reads"),
    ("relay_defaults", "reads"),
    ("migrate", "the schema, before anything runs"),
    ("settings_write", "limits that the database's entry points enforce"),
    ("close", "shutdown"),
    ("pool_status", "reads"),
    ("watch", "reports what other processes made; its hints are woken by `follow`"),
    ("message_find", "reads"),
    ("message_list_after", "reads"),
    ("message_tail_window", "reads"),
    ("message_list_of_seqs", "reads"),
    ("message_unrelayed_exists", "reads"),
    ("message_unrelayed_exists_asking_wakeup", "reads, and asks producers' commits to wake the relay"),
    ("message_last_seq", "reads"),
    ("message_unrelayed_summary", "reads"),
    ("message_search", "reads"),
    ("message_tail", "reads"),
    ("message_get", "reads"),
    ("consumer_find", "reads"),
    ("consumer_list", "reads"),
    ("consumer_stats", "reads"),
    ("consumer_get", "reads"),
    ("stats", "reads"),
    ("console_session_insert", "console sign-ins, no deliveries"),
    ("console_session_find", "reads"),
    ("console_session_touch", "console sign-ins, no deliveries"),
    ("console_session_delete", "console sign-ins, no deliveries"),
    ("console_session_delete_expired", "console sign-ins, no deliveries"),
    ("console_session_delete_oldest", "console sign-ins, no deliveries"),
    ("delivery_lease", "takes work; makes none"),
    ("delivery_expired", "reads"),
    ("delivery_next_expiry", "reads"),
    ("delivery_extend_many", "keeps a lease: nothing becomes leasable"),
    ("delivery_next_due", "reads"),
    ("delivery_list_of_message", "reads"),
    ("delivery_unacked_page", "reads"),
    ("delivery_list_unacked", "reads"),
    ("dead_letter_page", "reads"),
    ("dead_letter_group_page", "reads"),
    ("dead_letter_list", "reads"),
    ("dead_letter_list_with_error", "reads"),
    ("dead_letter_groups", "reads"),
    ("replay_candidates", "reads"),
    ("held_key_page", "reads"),
    ("held_key_list", "reads"),
    ("table_health", "reads"),
    ("vacuum_horizon", "reads"),
    ("vacuum_tables", "upkeep of outboxd's tables"),
    ("prune_before", "deletes acked messages: nothing becomes leasable"),
    ("prune", "deletes acked messages: nothing becomes leasable"),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The names of the methods that `block` (a trait or an impl) declares at its first level.
fn methods(text: &str, opens: &str, closes_before: Option<&str>, prefix: &str) -> Vec<String> {
    let start = text.find(opens).unwrap_or_else(|| panic!("{opens:?} not found"));
    let body = &text[start..];
    let body = closes_before.and_then(|c| body.find(c)).map_or(body, |end| &body[..end]);
    let mut out = Vec::new();
    for line in body.lines() {
        for head in [format!("    {prefix}async fn "), format!("    {prefix}fn ")] {
            if let Some(rest) = line.strip_prefix(&head) {
                let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                out.push(name);
            }
        }
        // The end of a top-level item: an impl ends at its first closing brace in column 0.
        if closes_before.is_none() && line == "}" {
            break;
        }
    }
    out
}

fn store_methods() -> Vec<String> {
    let seam = std::fs::read_to_string(src().join("store/seam.rs")).unwrap();
    methods(&seam, "pub trait Store:", Some("pub trait StoreTx"), "")
}

fn layer_methods() -> BTreeSet<String> {
    let text = std::fs::read_to_string(src().join("waking/mod.rs")).unwrap();
    methods(&text, "impl<'a> Waking<'a> {", None, "pub ").into_iter().filter(|m| m != "new").collect()
}

#[test]
fn every_method_of_the_store_seam_is_classified_by_the_work_it_makes() {
    let seam = store_methods();
    assert!(seam.len() > 40, "the seam's methods were not found: {seam:?}");
    let mut classified: BTreeMap<&str, &str> = BTreeMap::new();
    for (m, _) in THROUGH_THE_LAYER {
        classified.insert(m, "goes through the layer");
    }
    for m in STORE_ONLY {
        assert!(classified.insert(m, "the store's own").is_none(), "{m} classified twice");
    }
    for (m, _) in MAKES_NO_WORK {
        assert!(classified.insert(m, "makes no work").is_none(), "{m} classified twice");
    }
    let missing: Vec<&String> = seam.iter().filter(|m| !classified.contains_key(m.as_str())).collect();
    assert!(
        missing.is_empty(),
        "store methods that no one has said what work they make: {missing:?}. A write that makes deliveries \
         leasable or messages relayable goes through `waking::Waking` (THROUGH_THE_LAYER), anything else is \
         listed in MAKES_NO_WORK with why"
    );
    let stale: Vec<&&str> = classified.keys().filter(|m| !seam.iter().any(|s| s == *m)).collect();
    assert!(stale.is_empty(), "classified but not in the seam any more: {stale:?}");
    let wrapped: BTreeSet<String> = THROUGH_THE_LAYER.iter().map(|(_, l)| (*l).to_owned()).collect();
    assert_eq!(wrapped, layer_methods(), "the layer's methods and the writes it makes disagree");
}

/// `text` without its comments, and without its test module (`#[cfg(test)]` before an inline
/// `mod … {`, at the end of a file).
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let next = lines.get(i + 1).map_or("", |l| l.trim());
        if line.trim() == "#[cfg(test)]" && next.starts_with("mod ") && next.ends_with('{') {
            break;
        }
        let code = line.find("//").map_or(*line, |at| &line[..at]);
        out.push_str(code);
        out.push('\n');
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_code_outside_the_store_and_the_layer_writes_around_it_or_wakes_anyone() {
    let root = src();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut forbidden: Vec<String> = THROUGH_THE_LAYER.iter().map(|(m, _)| format!(".{m}(")).collect();
    forbidden.extend(STORE_ONLY.iter().map(|m| format!(".{m}(")));
    // The hub's wake-ups: signalled by the layer alone.
    forbidden.extend([".notify_consumer(", ".notify_all(", ".notify()", ".wake("].map(str::to_owned));
    let mut found = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
        let own = ["store/", "hub/", "waking/", "testing.rs"].iter().any(|p| rel.starts_with(p));
        if own || rel.ends_with("tests.rs") {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(path).unwrap());
        for (n, line) in code.lines().enumerate() {
            for f in &forbidden {
                if line.contains(f.as_str()) {
                    found.push(format!("{rel}:{}: {f}", n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "writes that bypass `waking::Waking`, or wake-ups given by hand (the layer that writes wakes): {found:#?}"
    );
}

/// Listens to every wake-up of a hub: the streams of some consumers, and the hub's signals.
struct Ears {
    heard: Vec<(String, watch::Receiver<u64>)>,
    _streams: Vec<StreamGuard>,
}

impl Ears {
    fn new(hub: &Hub, consumers: &[&str]) -> Self {
        let mut heard = vec![
            ("relay".to_owned(), hub.enqueued().subscribe()),
            ("backlog".to_owned(), hub.relay_backlog().subscribe()),
            ("relayed".to_owned(), hub.relayed().subscribe()),
            ("consumers_changed".to_owned(), hub.consumers_changed().subscribe()),
        ];
        let mut streams = Vec::new();
        for c in consumers {
            let (rx, _, guard) = hub.attach(c);
            heard.push(((*c).to_owned(), rx));
            streams.push(guard);
        }
        Self { heard, _streams: streams }
    }

    /// Who was woken since the last call, in name order.
    fn heard(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for (name, rx) in &mut self.heard {
            if rx.has_changed().unwrap() {
                rx.borrow_and_update();
                out.push(name.clone());
            }
        }
        out.sort();
        out
    }
}

/// Which methods of the layer a test drove, and whether each woke someone at least once.
#[derive(Default)]
struct Driven(BTreeMap<&'static str, bool>);

impl Driven {
    /// The call of `method` just made woke exactly `want`.
    fn woke(&mut self, method: &'static str, ears: &mut Ears, want: &[&str]) {
        let mut want: Vec<String> = want.iter().map(|w| (*w).to_owned()).collect();
        want.sort();
        assert_eq!(ears.heard(), want, "{method} must wake exactly whom it made work for");
        *self.0.entry(method).or_default() |= !want.is_empty();
    }

    fn all_of_the_layer(&self) {
        let driven: BTreeSet<String> = self.0.keys().map(|m| (*m).to_owned()).collect();
        assert_eq!(driven, layer_methods(), "every method of the layer is driven here");
        let silent: Vec<&&str> = self.0.iter().filter(|(_, woke)| !**woke).map(|(m, _)| m).collect();
        assert!(silent.is_empty(), "methods that never woke anyone here: {silent:?}");
    }
}

on_every_store!(every_write_wakes_whom_it_made_work_for_and_no_one_else);

async fn every_write_wakes_whom_it_made_work_for_and_no_one_else(store: SharedStore) {
    let now = Utc::now().trunc_subsecs(6);
    let later = now + chrono::Duration::seconds(10);
    let lease_until = now + chrono::Duration::seconds(30);
    let hub = Hub::default();
    let waking = Waking::new(&store, &hub);
    let mut ears = Ears::new(&hub, &["a", "b", "k", "other"]);
    let mut d = Driven::default();
    let (a, b) = (spec("a", &["t"], 5), spec("b", &["t"], 5));
    let k = ConsumerSpec { dead_key_policy: DeadKeyPolicy::Hold, ..spec("k", &["keyed"], 1) };
    let other = ConsumerSpec { start_from: StartFrom::Earliest, ..spec("other", &["elsewhere"], 5) };

    // Consumers: the sink supervisor looks again, and the consumer's streams look for what a
    // backfill made.
    for c in [&a, &b, &k] {
        waking.create_consumer(c, None, usize::MAX, now).await.unwrap();
        d.woke("create_consumer", &mut ears, &[c.name.as_str(), "consumers_changed"]);
    }

    // Enqueues wake the relay, unless nothing was written.
    let with_id = |topic: &str, key: Option<&str>| NewMessage {
        message_id: Some(MessageId(uuid::Uuid::new_v4())),
        ordering_key: key.map(str::to_owned),
        ..msg(topic)
    };
    let m1 = with_id("t", None);
    let e1 = waking.enqueue(&m1, now).await.unwrap();
    d.woke("enqueue", &mut ears, &["relay"]);
    assert!(waking.enqueue(&m1, now).await.unwrap().duplicate);
    d.woke("enqueue", &mut ears, &[]);
    let batch = [with_id("t", None), with_id("keyed", Some("x")), with_id("keyed", Some("x"))];
    let e = waking.enqueue_batch(&batch, now).await.unwrap();
    let (e2, e3, e4) = (e[0], e[1], e[2]);
    d.woke("enqueue_batch", &mut ears, &["relay"]);
    waking.enqueue_batch(&batch, now).await.unwrap();
    d.woke("enqueue_batch", &mut ears, &[]);

    // A relay pass wakes the consumers it gave pending deliveries, once the relay lets it, and
    // the vacuum rounds; a full batch wakes the relay's helper too.
    let (out, owed) = waking.run_pass(100, now, false, &[]).await.unwrap();
    assert_eq!(out.messages, 4);
    assert_eq!(ears.heard(), Vec::<String>::new(), "a pass's wake-ups wait for the relay to give them");
    drop(owed);
    d.woke("run_pass", &mut ears, &["a", "b", "k", "relayed"]);
    let e5 = waking.enqueue(&with_id("t", None), now).await.unwrap();
    d.woke("enqueue", &mut ears, &["relay"]);
    let (out, owed) = waking.run_pass(1, now, false, &[]).await.unwrap();
    drop(owed);
    assert_eq!(out.messages, 1);
    d.woke("run_pass", &mut ears, &["a", "b", "backlog", "relayed"]);
    let (out, owed) = waking.run_pass(100, now, false, &[]).await.unwrap();
    drop(owed);
    assert_eq!(out.messages, 0);
    d.woke("run_pass", &mut ears, &[]);

    // Acks: only one that frees an ordering key makes work.
    let leased = store
        .delivery_lease(&LeaseParams { consumer: &a.name, session: "s1", limit: 10, keys_after: "", lease_until, now })
        .await
        .unwrap();
    assert_eq!(leased.iter().map(|l| l.message.seq).collect::<Vec<_>>(), [e1.seq, e2.seq, e5.seq]);
    assert_eq!(waking.ack(&a.name, &[(e1.message_id, e1.seq)], false, now).await.unwrap(), 1);
    d.woke("ack", &mut ears, &[]);
    assert_eq!(waking.ack(&a.name, &[(e2.message_id, e2.seq)], true, now).await.unwrap(), 1);
    d.woke("ack", &mut ears, &["a"]);
    assert_eq!(waking.ack(&a.name, &[(e2.message_id, e2.seq)], true, now).await.unwrap(), 0);
    d.woke("ack", &mut ears, &[]);

    // Releases: due now, dead, or for later by the sweeper wake the consumer; a stream's own
    // retry for later does not (the stream schedules it), nor does a release that moved nothing.
    let release = |c: &ConsumerSpec, id: MessageId, state: DeliveryState, available_at| Release {
        consumer: c.name.clone(),
        message_id: id,
        state,
        available_at,
        error: Some("failed".to_owned()),
        attempt: Attempt::Failed,
    };
    let retry = [release(&a, e5.message_id, DeliveryState::Pending, later)];
    assert_eq!(waking.release(&retry, ReleaseGuard::Session("s1"), now).await.unwrap(), 1);
    d.woke("release", &mut ears, &[]);
    let leased = store
        .delivery_lease(&LeaseParams { consumer: &b.name, session: "s2", limit: 10, keys_after: "", lease_until, now })
        .await
        .unwrap();
    assert_eq!(leased.len(), 3);
    let due_now = [release(&b, e1.message_id, DeliveryState::Pending, now)];
    assert_eq!(waking.release(&due_now, ReleaseGuard::Session("s2"), now).await.unwrap(), 1);
    d.woke("release", &mut ears, &["b"]);
    assert_eq!(waking.release(&due_now, ReleaseGuard::Session("s2"), now).await.unwrap(), 0);
    d.woke("release", &mut ears, &[]);
    let dead = [release(&b, e2.message_id, DeliveryState::Dead, now)];
    assert_eq!(waking.release(&dead, ReleaseGuard::Session("s2"), now).await.unwrap(), 1);
    d.woke("release", &mut ears, &["b"]);
    let swept_at = lease_until + chrono::Duration::seconds(1);
    let swept = [release(&b, e5.message_id, DeliveryState::Pending, swept_at + chrono::Duration::seconds(10))];
    assert_eq!(waking.release(&swept, ReleaseGuard::ExpiredAt(swept_at), swept_at).await.unwrap(), 1);
    d.woke("release", &mut ears, &["b"]);

    // An ack that cannot tell keys wakes when it acked anything; a key held by its dead message
    // and released wakes the consumer.
    let leased = store
        .delivery_lease(&LeaseParams { consumer: &k.name, session: "s3", limit: 10, keys_after: "", lease_until, now })
        .await
        .unwrap();
    assert_eq!(leased.iter().map(|l| l.message.seq).collect::<Vec<_>>(), [e3.seq], "one message of a key at a time");
    assert_eq!(waking.ack_ids(&k.name, &[e3.message_id], now).await.unwrap(), 1);
    d.woke("ack_ids", &mut ears, &["k"]);
    assert_eq!(waking.ack_ids(&k.name, &[e3.message_id], now).await.unwrap(), 0);
    d.woke("ack_ids", &mut ears, &[]);
    let leased = store
        .delivery_lease(&LeaseParams { consumer: &k.name, session: "s3", limit: 10, keys_after: "", lease_until, now })
        .await
        .unwrap();
    assert_eq!(leased.iter().map(|l| l.message.seq).collect::<Vec<_>>(), [e4.seq]);
    let dead = [release(&k, e4.message_id, DeliveryState::Dead, now)];
    assert_eq!(waking.release(&dead, ReleaseGuard::Session("s3"), now).await.unwrap(), 1);
    d.woke("release", &mut ears, &["k"]);
    assert!(waking.release_key(&k.name, "x", false, now).await.unwrap().is_some(), "the dead message held its key");
    d.woke("release_key", &mut ears, &["k"]);
    assert!(waking.release_key(&k.name, "x", false, now).await.unwrap().is_none());
    d.woke("release_key", &mut ears, &[]);

    // A replay that made anything due wakes the consumer.
    assert_eq!(waking.replay(&a.name, &[e1.message_id], now).await.unwrap(), 1, "an acked delivery made due");
    d.woke("replay", &mut ears, &["a"]);
    assert_eq!(waking.replay(&a.name, &[], now).await.unwrap(), 0);
    d.woke("replay", &mut ears, &[]);

    // Pausing makes no work; resuming does.
    waking.set_paused(&a.name, true).await.unwrap();
    d.woke("set_paused", &mut ears, &[]);
    waking.set_paused(&a.name, false).await.unwrap();
    d.woke("set_paused", &mut ears, &["a"]);

    // A deleted consumer's streams wake to find it gone.
    waking.delete_consumer(&b.name).await.unwrap();
    d.woke("delete_consumer", &mut ears, &["b", "consumers_changed"]);

    // A consumer created from the earliest message wakes its streams for its backfill.
    waking.create_consumer(&other, None, usize::MAX, now).await.unwrap();
    d.woke("create_consumer", &mut ears, &["other", "consumers_changed"]);

    d.all_of_the_layer();
}

#[tokio::test]
async fn the_store_watchers_hints_wake_whom_they_name() {
    let hub = Hub::default();
    let mut ears = Ears::new(&hub, &["a", "b"]);
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(WorkHint::Consumers(vec!["a".to_owned()])).unwrap();
    tx.send(WorkHint::Enqueued).unwrap();
    drop(tx);
    follow(hub.clone(), rx).await;
    assert_eq!(ears.heard(), ["a", "relay"]);
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(WorkHint::All).unwrap();
    drop(tx);
    follow(hub, rx).await;
    assert_eq!(ears.heard(), ["a", "b"], "every consumer's streams");
}

#[test]
fn a_release_wakes_the_consumers_it_made_work_for_each_once() {
    // For later by its own stream: no one (the stream schedules it); otherwise its consumers.
    let now = Utc::now();
    let r = |c: &str, state, at| Release {
        consumer: ConsumerName::parse("c", c).unwrap(),
        message_id: MessageId(uuid::Uuid::new_v4()),
        state,
        available_at: at,
        error: None,
        attempt: Attempt::Withdrawn,
    };
    let later = now + chrono::Duration::from_std(Duration::from_secs(5)).unwrap();
    let rs = [
        r("x", DeliveryState::Pending, later),
        r("y", DeliveryState::Pending, now),
        r("y", DeliveryState::Dead, later),
    ];
    assert_eq!(released_for(&rs, ReleaseGuard::Session("s"), now), ["y"]);
    assert_eq!(released_for(&rs, ReleaseGuard::ExpiredAt(now), now), ["x", "y"]);
    assert!(released_for(&rs[..1], ReleaseGuard::Session("s"), now).is_empty());
}

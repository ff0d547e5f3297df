//! What the admin service and the console read: dead letters and their groups, searches,
//! tails, and the pages of a consumer's unfinished deliveries.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use chrono::{SubsecRound, Utc};

use super::*;
use crate::domain::{Attempt, DeliveryState, TopicPattern};

on_every_store!(
    dead_letters_group_by_last_error_and_a_group_replays_alone,
    a_search_pages_newest_first_through_bounded_windows,
    a_tail_reads_only_its_patterns_topics_in_bounded_windows_and_payloads_of_its_matches,
    a_search_by_topic_pattern_matches_as_a_consumers_patterns_do,
    a_consumers_pending_retrying_and_in_flight_deliveries_page_in_seq_order,
);

/// A topic pattern of a test.
fn pattern(p: &str) -> TopicPattern {
    TopicPattern::parse("topic", p).unwrap()
}

/// Dead letters grouped by last error (largest group first, with first and last time, topics
/// and types); a group listed alone; a replay of one group (`last_error`) selects only it.
async fn dead_letters_group_by_last_error_and_a_group_replays_alone(store: SharedStore) {
    let now = Utc::now().trunc_subsecs(6);
    let c = spec("c", &["t.*"], 1);
    store.consumer_create(&c, now).await.unwrap();
    let mut ids = Vec::new();
    for (topic, type_) in [("t.a", "A"), ("t.b", "B"), ("t.a", "A"), ("t.c", "C")] {
        let m = NewMessage { type_: type_.into(), ..msg(topic) };
        ids.push(store.message_insert(&m, now).await.unwrap().message_id);
    }
    store.relay_pass(10, now, false, &[]).await.unwrap();
    let later = crate::clock::add(now, Duration::from_secs(30));
    assert_eq!(
        store
            .delivery_lease(&LeaseParams {
                consumer: &c.name,
                session: "s",
                limit: 10,
                keys_after: "",
                lease_until: later,
                now
            })
            .await
            .unwrap()
            .len(),
        4
    );
    let errors = ["card declined", "card declined", "card declined", "timeout"];
    let releases: Vec<Release> = ids
        .iter()
        .zip(errors)
        .map(|(id, e)| Release {
            consumer: c.name.clone(),
            message_id: *id,
            state: DeliveryState::Dead,
            available_at: now,
            error: Some(e.into()),
            attempt: Attempt::Failed,
        })
        .collect();
    assert_eq!(store.delivery_release_many(&releases, ReleaseGuard::Session("s"), now).await.unwrap(), 4);

    let groups = store.dead_letter_groups(&c.name, 10).await.unwrap();
    assert_eq!(groups.len(), 2, "{groups:?}");
    assert_eq!((groups[0].last_error.as_deref(), groups[0].count), (Some("card declined"), 3));
    assert_eq!(groups[0].topics, vec!["t.a", "t.b"]);
    assert_eq!(groups[0].types, vec!["A", "B"]);
    assert_eq!((groups[0].first_dead_at, groups[0].last_dead_at), (Some(now), Some(now)));
    assert_eq!((groups[1].last_error.as_deref(), groups[1].count), (Some("timeout"), 1));
    assert_eq!(store.dead_letter_groups(&c.name, 1).await.unwrap().len(), 1, "bounded");

    let listed = store
        .dead_letter_list_with_error(
            &c.name,
            &DeadLetterPageParams { last_error: Some("timeout"), after_seq: 0, limit: 10, with_payloads: false },
        )
        .await
        .unwrap();
    assert_eq!(listed.iter().map(|d| d.message.message_id).collect::<Vec<_>>(), vec![ids[3]]);

    let filter = ReplayFilter { dead_only: true, last_error: Some("card declined".into()), ..Default::default() };
    let candidates = store
        .replay_candidates(&c.name, &ReplayCandidatesParams { filter: &filter, after_seq: 0, limit: 10 })
        .await
        .unwrap();
    assert_eq!(candidates.iter().map(|c| c.message_id).collect::<Vec<_>>(), ids[..3].to_vec());
}

/// A search reads a window of the newest messages below its cursor, matches in it, and says
/// where the next page starts, whatever the history's size.
async fn a_search_pages_newest_first_through_bounded_windows(store: SharedStore) {
    let now = Utc::now().trunc_subsecs(6);
    let mut seqs = Vec::new();
    for i in 0..30 {
        let m = NewMessage {
            type_: if i % 3 == 0 { "Wanted".into() } else { "Other".into() },
            ordering_key: (i % 2 == 0).then(|| "k".to_owned()),
            ..msg(if i < 15 { "s.old" } else { "s.new" })
        };
        seqs.push(store.message_insert(&m, now).await.unwrap().seq);
    }
    let wanted = MessageQuery { type_: Some("Wanted".into()), ..Default::default() };
    // A window of 10 (seqs 30..21) holds Wanted at i = 27, 24, 21.
    let page =
        store.message_search(&SearchParams { query: &wanted, before_seq: None, limit: 2, scan: 10 }).await.unwrap();
    assert_eq!(page.messages.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![seqs[27], seqs[24]]);
    assert_eq!(page.next_before_seq, Some(seqs[24]), "a full page: on from its last match");
    let page = store
        .message_search(&SearchParams { query: &wanted, before_seq: page.next_before_seq, limit: 5, scan: 10 })
        .await
        .unwrap();
    assert_eq!(page.messages.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![seqs[21], seqs[18], seqs[15]]);
    assert_eq!((page.scanned, page.next_before_seq), (10, Some(seqs[14])), "a full window: on below it");
    // Nothing matches in a window: it still moves on.
    let none = MessageQuery { topic: Some(pattern("s.nothing")), ..Default::default() };
    let page =
        store.message_search(&SearchParams { query: &none, before_seq: None, limit: 5, scan: 10 }).await.unwrap();
    assert!(page.messages.is_empty());
    assert_eq!(page.next_before_seq, Some(seqs[20]));
    // The end of history: no next page.
    let q = MessageQuery { topic: Some(pattern("s.old")), ordering_key: Some("k".into()), ..Default::default() };
    let page = store
        .message_search(&SearchParams { query: &q, before_seq: Some(seqs[10]), limit: 50, scan: 100 })
        .await
        .unwrap();
    assert_eq!(
        page.messages.iter().map(|m| m.seq).collect::<Vec<_>>(),
        vec![seqs[8], seqs[6], seqs[4], seqs[2], seqs[0]]
    );
    assert_eq!(page.next_before_seq, None);
    // A time range outside every message's: nothing, and nothing more.
    for q in [
        MessageQuery { before: Some(now), ..Default::default() },
        MessageQuery { after: Some(crate::clock::add(now, Duration::from_secs(1))), ..Default::default() },
    ] {
        let page =
            store.message_search(&SearchParams { query: &q, before_seq: None, limit: 5, scan: 10 }).await.unwrap();
        assert_eq!((page.messages.len(), page.next_before_seq), (0, None), "{q:?}");
    }
    // One that holds them all: the same pages as none.
    let all = MessageQuery { after: Some(now), type_: Some("Wanted".into()), ..Default::default() };
    let page = store.message_search(&SearchParams { query: &all, before_seq: None, limit: 2, scan: 10 }).await.unwrap();
    assert_eq!(page.messages.iter().map(|m| m.seq).collect::<Vec<_>>(), vec![seqs[27], seqs[24]]);
}

/// A tail's read (issue 47 item 2): it looks at topics and sizes only, in windows of `scan`,
/// matches its patterns as the relay does (`*` one segment, `>` the rest), takes at most
/// `limit` matches and moves its cursor past what it looked at and no further than the first
/// match it left; payloads are read for the matches alone.
async fn a_tail_reads_only_its_patterns_topics_in_bounded_windows_and_payloads_of_its_matches(store: SharedStore) {
    let now = Utc::now().trunc_subsecs(6);
    let mut seqs = Vec::new();
    for topic in ["orders.created", "payments.card", "orders.eu.created", "orders.updated", "payments.cash", "orders.x"]
    {
        let payload = if topic.starts_with("payments") { vec![7u8; 100_000] } else { b"{}".to_vec() };
        seqs.push(store.message_insert(&NewMessage { payload, ..msg(topic) }, now).await.unwrap().seq);
    }
    let orders = [TopicPattern::parse("topics", "orders.*").unwrap()];
    let page = store.message_tail(&TailParams { after: 0, patterns: &orders, scan: 100, limit: 2 }).await.unwrap();
    assert_eq!(
        page.hits.iter().map(|h| h.seq).collect::<Vec<_>>(),
        [seqs[0], seqs[3]],
        "orders.eu.created is two segments"
    );
    assert_eq!((page.next_after, page.more), (seqs[4], true), "up to the match left out, past payments.cash");
    // payload, headers (`{}`), topic and type.
    assert_eq!(page.hits[0].bytes, 2 + 2 + "orders.created".len() + 1);
    let page = store
        .message_tail(&TailParams { after: page.next_after, patterns: &orders, scan: 100, limit: 2 })
        .await
        .unwrap();
    assert_eq!(page.hits.iter().map(|h| h.seq).collect::<Vec<_>>(), [seqs[5]]);
    assert_eq!((page.next_after, page.more), (seqs[5], false));
    // A window of other topics moves the cursor on, and says more may follow.
    let eu = [TopicPattern::parse("topics", "orders.eu.>").unwrap()];
    let page = store.message_tail(&TailParams { after: 0, patterns: &eu, scan: 2, limit: 8 }).await.unwrap();
    assert!(page.hits.is_empty());
    assert_eq!((page.next_after, page.more), (seqs[1], true));
    let page =
        store.message_tail(&TailParams { after: page.next_after, patterns: &eu, scan: 2, limit: 8 }).await.unwrap();
    assert_eq!(page.hits.iter().map(|h| h.seq).collect::<Vec<_>>(), [seqs[2]]);
    assert_eq!((page.next_after, page.more), (seqs[3], true));
    // `>` is everything; the payments' sizes are known before their payloads are read.
    let all = [TopicPattern::parse("topics", ">").unwrap()];
    let page = store.message_tail(&TailParams { after: 0, patterns: &all, scan: 100, limit: 8 }).await.unwrap();
    assert_eq!(page.hits.len(), 6);
    assert!(page.hits[1].bytes > 100_000 && page.hits[1].bytes < 100_100, "{:?}", page.hits[1]);
    // Payloads only of the seqs asked for (one of them gone).
    let read = store.message_list_of_seqs(&[seqs[1], seqs[5], seqs[5] + 100]).await.unwrap();
    assert_eq!(read.iter().map(|m| (m.seq, m.payload.len())).collect::<Vec<_>>(), [(seqs[1], 100_000), (seqs[5], 2)]);
    assert!(store.message_list_of_seqs(&[]).await.unwrap().is_empty());
}

/// A search by topic takes a pattern as a consumer does (`*` one segment, `>` the rest), also
/// where a looser match would take more (a `*` that spans a dot, a literal after a `*` shifted
/// by one), and pages through it as through any search.
async fn a_search_by_topic_pattern_matches_as_a_consumers_patterns_do(store: SharedStore) {
    let now = Utc::now().trunc_subsecs(6);
    let topics = [
        "orders.created",
        "orders.eu.created",
        "orders.eu.x.created",
        "orders",
        "billing.created",
        "orders.x",
        "orders.a.b.x.c",
    ];
    let mut seq_of = std::collections::HashMap::new();
    for t in topics {
        seq_of.insert(t, store.message_insert(&msg(t), now).await.unwrap().seq);
    }
    let found = |p: &'static str, limit: i64| {
        let store = store.clone();
        async move {
            let q = MessageQuery { topic: Some(pattern(p)), ..Default::default() };
            let mut topics = Vec::new();
            let mut cursor = None;
            loop {
                let page = store
                    .message_search(&SearchParams { query: &q, before_seq: cursor, limit, scan: 100 })
                    .await
                    .unwrap();
                assert!(page.messages.len() as i64 <= limit, "{p}: a page of at most {limit}");
                topics.extend(page.messages.into_iter().map(|m| m.topic));
                match page.next_before_seq {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
            topics.reverse();
            topics
        }
    };
    for limit in [1, 100] {
        assert_eq!(found("orders.*", limit).await, ["orders.created", "orders.x"], "one segment");
        assert_eq!(
            found("orders.>", limit).await,
            ["orders.created", "orders.eu.created", "orders.eu.x.created", "orders.x", "orders.a.b.x.c"],
            "the rest"
        );
        assert_eq!(found("*.created", limit).await, ["orders.created", "billing.created"]);
        assert_eq!(found("orders.*.created", limit).await, ["orders.eu.created"], "not orders.eu.x.created");
        assert_eq!(
            found("orders.*.x.>", limit).await,
            ["orders.eu.x.created"],
            "a literal after a `*` stays in place: not orders.a.b.x.c"
        );
        assert_eq!(found("orders.eu.>", limit).await, ["orders.eu.created", "orders.eu.x.created"]);
        assert_eq!(found("orders", limit).await, ["orders"], "a plain topic is matched exactly");
    }
    assert!(seq_of.len() == topics.len());
}

/// A consumer's unfinished deliveries, listed by kind wherever they are held (on PostgreSQL,
/// pending and leased ranges as well as rows): in flight (pushed and leased), retrying (nacked,
/// with their count and error), pending (all of those waiting, a row deciding over a range);
/// a page of any size walks the same list, and the lists agree with the stats.
async fn a_consumers_pending_retrying_and_in_flight_deliveries_page_in_seq_order(store: SharedStore) {
    let now = Utc::now().trunc_subsecs(6);
    let later = crate::clock::add(now, Duration::from_secs(30));
    let retry_at = crate::clock::add(now, Duration::from_secs(10));
    let c = spec("c", &["t"], 5);
    store.consumer_create(&c, now).await.unwrap();
    store.consumer_create(&spec("other", &["t"], 5), now).await.unwrap();
    let mut a = Vec::new();
    for _ in 0..10 {
        a.push(store.message_insert(&msg("t"), now).await.unwrap().message_id);
    }
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 3, lease_until: later };
    assert_eq!(store.relay_pass(100, now, false, &[offer]).await.unwrap().pushed.len(), 3, "a0..a2 pushed");
    let leased = store
        .delivery_lease(&LeaseParams {
            consumer: &c.name,
            session: "s2",
            limit: 2,
            keys_after: "",
            lease_until: later,
            now,
        })
        .await
        .unwrap();
    assert_eq!(leased.iter().map(|l| l.message.message_id).collect::<Vec<_>>(), a[3..5], "a3, a4 leased");
    let nack = |id: MessageId| Release {
        consumer: c.name.clone(),
        message_id: id,
        state: DeliveryState::Pending,
        available_at: retry_at,
        error: Some("boom".into()),
        attempt: Attempt::Failed,
    };
    assert_eq!(store.delivery_release_many(&[nack(a[1])], ReleaseGuard::Session("s1"), now).await.unwrap(), 1);
    assert_eq!(store.delivery_release_many(&[nack(a[4])], ReleaseGuard::Session("s2"), now).await.unwrap(), 1);
    assert_eq!(store.delivery_ack_many(&c.name, &[a[6]], now).await.unwrap(), 1, "acked while it waits");
    // A second pass: a keyed message (a row of its own) and three more (another range).
    let keyed = NewMessage { ordering_key: Some("k".into()), ..msg("t") };
    let k = store.message_insert(&keyed, now).await.unwrap().message_id;
    let mut b = Vec::new();
    for _ in 0..3 {
        b.push(store.message_insert(&msg("t"), now).await.unwrap().message_id);
    }
    store.relay_pass(100, now, false, &[]).await.unwrap();

    let walk = |kind: UnackedKind, limit: i64, scan: i64| {
        let store = store.clone();
        let c = c.name.clone();
        async move {
            let mut all = Vec::new();
            let mut after = 0;
            for _ in 0..100 {
                let page = store
                    .delivery_list_unacked(&c, &UnackedPageParams { kind, after_seq: after, limit, scan })
                    .await
                    .unwrap();
                assert!(page.deliveries.len() as i64 <= limit, "{kind:?}: a page of at most {limit}");
                all.extend(page.deliveries);
                match page.next_after_seq {
                    Some(next) => {
                        assert!(next > after, "{kind:?}: the cursor moves on");
                        after = next;
                    }
                    None => return all,
                }
            }
            panic!("{kind:?} does not end");
        }
    };
    let ids = |v: &[UnackedDelivery]| v.iter().map(|d| d.message.message_id).collect::<Vec<_>>();
    let stats = store.consumer_stats(Some("c"), false).await.unwrap().remove(0);

    let in_flight = walk(UnackedKind::InFlight, 100, 100).await;
    assert_eq!(ids(&in_flight), [a[0], a[2], a[3]], "pushed and leased, not the nacked ones");
    assert!(in_flight.iter().all(|d| d.state == DeliveryState::Leased && d.delivery_count == 1));
    assert!(in_flight.iter().all(|d| d.lease_expires_at == Some(later)), "{in_flight:?}");
    assert_eq!(in_flight.len() as i64, stats.in_flight);

    let retrying = walk(UnackedKind::Retrying, 100, 100).await;
    assert_eq!(ids(&retrying), [a[1], a[4]]);
    for d in &retrying {
        assert_eq!((d.state, d.delivery_count, d.available_at), (DeliveryState::Pending, 1, retry_at));
        assert_eq!(d.last_error.as_deref(), Some("boom"));
    }
    assert_eq!(retrying.len() as i64, stats.retrying);

    let pending = walk(UnackedKind::Pending, 100, 100).await;
    let want = [a[1], a[4], a[5], a[7], a[8], a[9], k, b[0], b[1], b[2]];
    assert_eq!(ids(&pending), want, "waiting ones, wherever held, not the acked one");
    assert!(pending.iter().all(|d| d.state == DeliveryState::Pending && d.lease_expires_at.is_none()));
    assert!(pending.iter().filter(|d| d.delivery_count == 0).all(|d| d.available_at == now && d.last_error.is_none()));
    assert_eq!(pending[2].message.topic, "t");
    assert_eq!(pending[6].message.ordering_key.as_deref(), Some("k"));
    assert_eq!(pending.len() as i64, stats.backlog);
    let seqs: Vec<i64> = pending.iter().map(|d| d.message.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in seq order: {seqs:?}");

    // Any page size walks the same lists; a retry page reads at most `scan` pending ones and
    // moves on even when it finds none.
    for limit in [1, 2, 3] {
        assert_eq!(ids(&walk(UnackedKind::Pending, limit, 100).await), want, "pages of {limit}");
        assert_eq!(ids(&walk(UnackedKind::InFlight, limit, 100).await), [a[0], a[2], a[3]]);
        assert_eq!(ids(&walk(UnackedKind::Retrying, limit, 1).await), [a[1], a[4]], "scan 1, pages of {limit}");
    }
    let page = store
        .delivery_list_unacked(
            &c.name,
            &UnackedPageParams { kind: UnackedKind::Retrying, after_seq: 0, limit: 10, scan: 1 },
        )
        .await
        .unwrap();
    assert_eq!(ids(&page.deliveries), [a[1]]);
    let a4 = pending[1].message.seq;
    let page = store
        .delivery_list_unacked(
            &c.name,
            &UnackedPageParams { kind: UnackedKind::Retrying, after_seq: a4, limit: 10, scan: 1 },
        )
        .await
        .unwrap();
    assert!(page.deliveries.is_empty(), "no retry within the one pending row after a4: {page:?}");
    assert!(page.next_after_seq.is_some_and(|n| n > a4), "and on past it: {page:?}");
    let unknown = ConsumerName::parse("name", "nobody").unwrap();
    assert!(matches!(
        store
            .delivery_list_unacked(
                &unknown,
                &UnackedPageParams { kind: UnackedKind::Pending, after_seq: 0, limit: 10, scan: 10 }
            )
            .await,
        Err(StoreError::ConsumerNotFound(_))
    ));
}

//! Messages, statement by statement: written once per id, found, and paged in seq order.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use super::*;
use crate::store::records::MessageRef;

on_every_store!(message_insert_writes_once_per_id_and_message_find_reads_it, message_page_walks_the_log_in_seq_order,);

async fn message_insert_writes_once_per_id_and_message_find_reads_it(store: SharedStore) {
    let d = &store;
    let at = now();
    let id = MessageId::generate();
    let mut m = msg("orders.created");
    m.message_id = Some(id);
    m.headers.insert("h".into(), "v".into());
    m.ordering_key = Some("k".into());

    let mut tx = d.begin().await.unwrap();
    let first = tx.message_insert(&m, at).await.unwrap();
    let again = tx.message_insert(&m, at).await.unwrap();
    tx.commit().await.unwrap();
    assert!(!first.duplicate);
    assert!(again.duplicate);
    assert_eq!((again.message_id, again.seq), (id, first.seq));
    assert!(d.message_insert(&m, at).await.unwrap().duplicate);
    assert_eq!(d.message_last_seq().await.unwrap(), first.seq, "the duplicates wrote nothing");

    let found = d.message_find(id).await.unwrap().unwrap();
    assert_eq!((found.topic.as_str(), found.type_.as_str()), ("orders.created", "T"));
    assert_eq!((found.payload.as_slice(), found.ordering_key.as_deref()), (&b"{}"[..], Some("k")));
    assert_eq!(found.headers.get("h").map(String::as_str), Some("v"));
    assert_eq!((found.enqueued_at, found.available_at), (at, at));
    assert!(d.message_find(MessageId::generate()).await.unwrap().is_none());
}

async fn message_page_walks_the_log_in_seq_order(store: SharedStore) {
    let d = &store;
    let at = now();
    let sent = insert(&*store, &["a", "b", "c", "d", "e"], at).await;
    let mut delayed = msg("f");
    delayed.delay = Some(Duration::from_secs(60));
    let late = d.message_insert(&delayed, at).await.unwrap();

    let mut conn = d.begin().await.unwrap();
    let mut seen: Vec<MessageRef> = Vec::new();
    let mut after = 0;
    loop {
        let page = conn.message_page(after, 2).await.unwrap();
        assert!(page.len() <= 2);
        let Some(last) = page.last() else { break };
        after = last.seq;
        seen.extend(page);
    }
    let topics: Vec<&str> = seen.iter().map(|m| m.topic.as_str()).collect();
    assert_eq!(topics, ["a", "b", "c", "d", "e", "f"]);
    assert!(seen.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(seen[0].message_id, sent[0].message_id);
    assert_eq!(seen[0].available_at, at, "due at once without a delay");
    assert_eq!(seen[5].message_id, late.message_id);
    assert_eq!(seen[5].available_at, at + chrono::Duration::seconds(60));
}

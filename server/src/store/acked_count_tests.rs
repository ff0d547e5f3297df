//! The `acked` count of the stats (ADR 0083): the consumer's acked deliveries of the messages
//! still kept. The same cases on a fresh PostgreSQL database and a fresh SQLite file, through
//! [`Store`] only, so they hold whatever holds an acked delivery underneath (a row, or a seq in
//! an acked range): a prune that removes part of a range's messages takes their deliveries out
//! of the count, as it does those of rows.
#![allow(clippy::unwrap_used)]

use chrono::{DateTime, SubsecRound, Utc};

use super::tests::{Guard, msg, spec};
use super::*;
use crate::domain::PushOffer;

macro_rules! on_every_store {
    ($($case:ident),* $(,)?) => {
        mod on_postgres {
            $(#[tokio::test]
            async fn $case() {
                let (db, store) = $crate::store::tests::postgres().await;
                super::$case(&db, store).await;
            })*
        }
        mod on_sqlite {
            $(#[tokio::test]
            async fn $case() {
                let (db, store) = $crate::store::tests::sqlite().await;
                super::$case(&db, store).await;
            })*
        }
    };
}

on_every_store!(
    a_prune_takes_the_deliveries_of_the_messages_it_removes_out_of_the_acked_count,
    a_delivery_replayed_and_acked_again_after_a_prune_is_counted_once,
);

fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(3)
}

fn mins(n: i64) -> chrono::Duration {
    chrono::Duration::minutes(n)
}

async fn acked(store: &SharedStore, c: &ConsumerName) -> (i64, i64) {
    let stats = store.stats(Some(c), true).await.unwrap();
    let listed = store.consumer_stats(Some(c.as_str()), true).await.unwrap();
    (stats.consumers[0].acked, listed[0].acked)
}

/// Consumer `c` of topic `t`; two messages enqueued two hours before `at`, three an hour before,
/// pushed to a stream and acked by it (first deliveries: what both stores hold in acked ranges),
/// the first alone and the other four at once. Their ids, in seq order.
async fn five_acked_by_a_stream(store: &SharedStore, at: DateTime<Utc>) -> (ConsumerName, Vec<MessageId>) {
    store.consumer_create(&spec("c", &["t"], 5), at - mins(180)).await.unwrap();
    let c = ConsumerName::parse("consumer", "c").unwrap();
    for enqueued in [mins(120), mins(120), mins(60), mins(60), mins(60)] {
        store.message_insert(&msg("t"), at - enqueued).await.unwrap();
    }
    let offer = PushOffer { consumer: "c".into(), session: "s1".into(), room: 10, lease_until: at + mins(1) };
    let out = store.relay_pass(100, at, false, &[offer]).await.unwrap();
    let held: Vec<(MessageId, i64)> =
        out.pushed.iter().map(|(_, _, d)| (d.message.message_id, d.message.seq)).collect();
    assert_eq!(held.len(), 5, "all five pushed to s1");
    assert_eq!(store.delivery_ack_held(&c, &held[..1], at).await.unwrap(), 1);
    assert_eq!(store.delivery_ack_held(&c, &held[1..], at).await.unwrap(), 4);
    (c, held.iter().map(|(id, _)| *id).collect())
}

async fn a_prune_takes_the_deliveries_of_the_messages_it_removes_out_of_the_acked_count(
    _db: &Guard,
    store: SharedStore,
) {
    let at = now();
    let (c, ids) = five_acked_by_a_stream(&store, at).await;
    assert_eq!(acked(&store, &c).await, (5, 5));
    // The two older messages go: one is all of the first ack's range, one is part of the second's.
    let pruned = store.prune(at - mins(90), 100).await.unwrap();
    assert_eq!((pruned.messages, pruned.deliveries), (2, 2));
    assert_eq!(acked(&store, &c).await, (3, 3), "the acked deliveries of the three messages kept");
    for (id, kept) in ids.iter().zip([false, false, true, true, true]) {
        assert_eq!(store.message_get(*id).await.is_ok(), kept, "{id}");
    }
    // The rest go too; nothing is counted twice or left behind.
    let pruned = store.prune(at, 100).await.unwrap();
    assert_eq!((pruned.messages, pruned.deliveries), (3, 3));
    assert_eq!(acked(&store, &c).await, (0, 0));
}

async fn a_delivery_replayed_and_acked_again_after_a_prune_is_counted_once(_db: &Guard, store: SharedStore) {
    let at = now();
    let (c, ids) = five_acked_by_a_stream(&store, at).await;
    store.prune(at - mins(90), 100).await.unwrap();
    // A replay of a kept message of the pruned range, leased and acked again: it is one
    // delivery, wherever the store keeps it now.
    assert_eq!(store.replay_apply(&c, &[ids[2]], at + mins(1)).await.unwrap(), 1);
    assert_eq!(acked(&store, &c).await, (2, 2), "pending again");
    let leased = store
        .delivery_lease(&LeaseParams {
            consumer: &c,
            session: "s2",
            limit: 10,
            keys_after: "",
            lease_until: at + mins(2),
            now: at + mins(1),
        })
        .await
        .unwrap();
    assert_eq!(leased.iter().map(|d| d.message.message_id).collect::<Vec<_>>(), [ids[2]]);
    assert_eq!(store.delivery_ack_many(&c, &[ids[2]], at + mins(1)).await.unwrap(), 1);
    assert_eq!(acked(&store, &c).await, (3, 3));
    let pruned = store.prune(at + mins(2), 100).await.unwrap();
    assert_eq!((pruned.messages, pruned.deliveries), (3, 3));
    assert_eq!(acked(&store, &c).await, (0, 0));
}

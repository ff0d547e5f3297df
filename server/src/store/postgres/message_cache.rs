//! Recently leased messages, by seq, so that a message read once serves every consumer that
//! leases it (ADR 0049).
//!
//! A message never changes once committed, and its seq is never reused (the relay refuses a
//! sequence set back), so an entry is never stale: it can only be evicted. The cache is bounded
//! by the bytes its messages hold; the least recently used go first.
use std::sync::{Arc, Mutex};

use hashlink::LruCache;

use crate::store::StoredMessage;

/// The bound of the cache outboxd's PostgreSQL store keeps.
pub(crate) const MESSAGE_CACHE_BYTES: usize = 16 * 1024 * 1024;

/// Bytes counted for a message besides its fields' contents: the entry, the key, the struct.
const ENTRY_OVERHEAD: usize = 160;

#[derive(Debug)]
pub(crate) struct MessageCache {
    inner: Mutex<Inner>,
    capacity_bytes: usize,
}

#[derive(Debug)]
struct Inner {
    entries: LruCache<i64, Arc<StoredMessage>>,
    bytes: usize,
}

/// What a look-up found: the messages by position in the request, and the seqs it did not hold.
pub(crate) struct Found {
    pub(crate) messages: Vec<Option<Arc<StoredMessage>>>,
    pub(crate) missing: Vec<i64>,
}

fn size_of(m: &StoredMessage) -> usize {
    ENTRY_OVERHEAD
        + m.topic.len()
        + m.type_.len()
        + m.payload.len()
        + m.ordering_key.as_ref().map_or(0, String::len)
        + m.headers.iter().map(|(k, v)| k.len() + v.len() + 48).sum::<usize>()
}

impl MessageCache {
    pub(crate) fn new(capacity_bytes: usize) -> Self {
        Self { inner: Mutex::new(Inner { entries: LruCache::new_unbounded(), bytes: 0 }), capacity_bytes }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves at worst a wrong byte count; the entries
        // themselves are whole.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The cached messages of `seqs`, in their order, and the seqs not cached.
    pub(crate) fn get_many(&self, seqs: &[i64]) -> Found {
        let mut inner = self.lock();
        let messages: Vec<Option<Arc<StoredMessage>>> =
            seqs.iter().map(|seq| inner.entries.get(seq).cloned()).collect();
        let missing = seqs.iter().zip(&messages).filter(|(_, m)| m.is_none()).map(|(seq, _)| *seq).collect();
        Found { messages, missing }
    }

    /// Adds messages, evicting the least recently used beyond the bound. A message larger than
    /// the whole bound is not kept.
    pub(crate) fn insert_many(&self, messages: impl IntoIterator<Item = Arc<StoredMessage>>) {
        let mut inner = self.lock();
        for m in messages {
            let size = size_of(&m);
            if size > self.capacity_bytes {
                continue;
            }
            if let Some(old) = inner.entries.insert(m.seq, m) {
                inner.bytes -= size_of(&old);
            }
            inner.bytes += size;
            while inner.bytes > self.capacity_bytes {
                let Some((_, old)) = inner.entries.remove_lru() else { break };
                inner.bytes -= size_of(&old);
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::Utc;

    use super::*;
    use crate::domain::MessageId;

    fn message(seq: i64, payload: usize) -> Arc<StoredMessage> {
        Arc::new(StoredMessage {
            message_id: MessageId(uuid::Uuid::now_v7()),
            seq,
            topic: "orders.created".into(),
            type_: "OrderCreated".into(),
            payload: vec![7; payload],
            headers: BTreeMap::new(),
            ordering_key: None,
            enqueued_at: Utc::now(),
            available_at: Utc::now(),
            relayed_at: None,
        })
    }

    #[test]
    fn finds_what_it_holds_in_request_order_and_names_the_rest() {
        let cache = MessageCache::new(1 << 20);
        cache.insert_many([message(3, 10), message(1, 10)]);
        let found = cache.get_many(&[1, 2, 3, 4]);
        let seqs: Vec<Option<i64>> = found.messages.iter().map(|m| m.as_ref().map(|m| m.seq)).collect();
        assert_eq!(seqs, vec![Some(1), None, Some(3), None]);
        assert_eq!(found.missing, vec![2, 4]);
    }

    #[test]
    fn stays_within_its_bytes_evicting_the_least_recently_used() {
        let one = size_of(&message(0, 1000));
        let cache = MessageCache::new(one * 3);
        cache.insert_many([message(1, 1000), message(2, 1000), message(3, 1000)]);
        // Seq 1 is used again, so 2 is the least recently used when 4 comes.
        assert!(cache.get_many(&[1]).missing.is_empty());
        cache.insert_many([message(4, 1000)]);
        assert_eq!(cache.get_many(&[1, 2, 3, 4]).missing, vec![2]);
        assert_eq!(cache.len(), 3);
        assert!(cache.lock().bytes <= one * 3);
    }

    #[test]
    fn a_message_larger_than_the_bound_is_not_kept_and_evicts_nothing() {
        let cache = MessageCache::new(size_of(&message(0, 100)) * 2);
        cache.insert_many([message(1, 100), message(2, 10_000)]);
        assert_eq!(cache.get_many(&[1, 2]).missing, vec![2]);
    }

    #[test]
    fn inserting_a_seq_again_counts_its_bytes_once() {
        let cache = MessageCache::new(1 << 20);
        cache.insert_many([message(1, 500), message(1, 500)]);
        assert_eq!(cache.lock().bytes, size_of(&message(1, 500)));
    }
}

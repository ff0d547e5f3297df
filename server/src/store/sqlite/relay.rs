//! A relay pass's statements on SQLite (ADR 0087): the claim after the cursor under the write
//! lock (ADR 0066), and the writes of the plan as a row per delivery, which the documented
//! transactional ack needs (ADR 0064). The pass itself is `store::relay_pass`, the same for
//! both stores.
use std::collections::{BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;
use sqlx::{Row, Sqlite};

use serde_json::json;
use sqlx::sqlite::SqliteConnection;

use super::rows::{message_from_row, time, us};
use super::writer::begin_immediate;
use super::{SqliteStore, consumers_on, q};
use crate::domain::fanout::{Plan, Subscriber};
use crate::domain::{PushOffer, StoredMessage};
use crate::store::{RelayClaim, RelayTx, RelayWritten, Result};

/// One relay pass's transaction, on the writer connection. It commits derived state without
/// flushing the WAL (`synchronous = NORMAL`, set outside the transaction, where SQLite allows the
/// change, and back to FULL after it): a crash of outboxd keeps it; only the operating system's
/// crash can lose it, and then the next pass redoes it (its messages are unrelayed again). Any
/// later durable commit, such as the ack of one of its deliveries, flushes it first: the WAL is
/// one sequence. ADR 0017.
pub(super) struct SqliteRelayTx {
    conn: PoolConnection<Sqlite>,
    /// Whether the transaction ended and the connection is back to `synchronous = FULL`.
    /// Dropped otherwise (an error, or the pass's future dropped), the connection is closed:
    /// closing rolls back what is open, and a connection that commits without the flush is
    /// never handed to durable writes.
    clean: bool,
}

impl Drop for SqliteRelayTx {
    fn drop(&mut self) {
        if !self.clean {
            self.conn.close_on_drop();
        }
    }
}

impl SqliteStore {
    pub(super) async fn relay_tx(&self) -> Result<SqliteRelayTx> {
        let mut tx = SqliteRelayTx { conn: self.writer.acquire().await?, clean: false };
        sqlx::query(q::SYNCHRONOUS_NORMAL).execute(&mut *tx.conn).await?;
        begin_immediate(&mut tx.conn).await?;
        Ok(tx)
    }
}

impl SqliteRelayTx {
    /// Back to durable commits after the transaction ended.
    async fn durable_again(mut self: Box<Self>) {
        self.clean = sqlx::query(q::SYNCHRONOUS_FULL).execute(&mut *self.conn).await.is_ok();
    }
}

#[async_trait::async_trait]
impl RelayTx for SqliteRelayTx {
    /// After the cursor, in seq order: under the write lock, no seq below the highest committed
    /// one can commit later (one writer at a time; ADR 0066). Every payload comes with it.
    async fn relay_claim(&mut self, limit: i64, now: DateTime<Utc>, _room: usize) -> Result<RelayClaim> {
        let conn = &mut *self.conn;
        let claimed = sqlx::query(q::RELAY_READ).bind(limit).fetch_all(&mut *conn).await?;
        let (Some(first), Some(last)) = (claimed.first(), claimed.last()) else {
            return Ok(RelayClaim::default());
        };
        let (lo, hi): (i64, i64) = (first.try_get("seq")?, last.try_get("seq")?);
        sqlx::query(q::RELAY_ADVANCE).bind(hi).execute(&mut *conn).await?;
        sqlx::query(q::RELAY_LOG).bind(hi).bind(lo).bind(us(now)).execute(&mut *conn).await?;
        let consumers = consumers_on(conn).await?;
        let messages = claimed
            .iter()
            .map(|row| Ok(StoredMessage { relayed_at: Some(now), ..message_from_row(row)? }))
            .collect::<Result<Vec<_>>>()?;
        let topics: BTreeSet<&str> = messages.iter().map(|m| m.topic.as_str()).collect();
        // No probe for rows already there: the insert leaves them alone and says what it
        // created. In name order, as the consumers are listed.
        let subscribers = consumers
            .iter()
            .filter_map(|c| {
                let topics: HashSet<String> =
                    topics.iter().filter(|t| c.spec.matches(t)).map(|t| (*t).to_owned()).collect();
                (!topics.is_empty()).then(|| Subscriber {
                    name: c.spec.name.as_str().to_owned(),
                    paused: c.paused,
                    start_seq: c.start_seq,
                    topics,
                    has_row: HashSet::new(),
                })
            })
            .collect();
        Ok(RelayClaim { messages, without_payload: HashSet::new(), subscribers })
    }

    /// A row per delivery, leased ones with their session and deadline, in one insert that
    /// leaves a row already there alone (a backfill's): what it did not create is neither
    /// pushed nor counted.
    async fn relay_write(
        &mut self,
        messages: &[StoredMessage],
        plan: &Plan,
        offers: &[PushOffer],
        now: DateTime<Utc>,
    ) -> Result<RelayWritten> {
        let by_seq: HashMap<i64, &StoredMessage> = messages.iter().map(|m| (m.seq, m)).collect();
        let mut rows = Vec::with_capacity(plan.deliveries());
        for (i, seqs) in &plan.leased {
            for m in seqs.iter().filter_map(|seq| by_seq.get(seq)) {
                let mut d = new_delivery(m, &offers[*i].consumer);
                d["l"] = serde_json::json!(offers[*i].session);
                d["u"] = serde_json::json!(us(offers[*i].lease_until));
                rows.push(d);
            }
        }
        let unleased = plan.pending.iter().flat_map(|(c, seqs)| seqs.iter().map(move |s| (c, *s)));
        for (consumer, seq) in unleased.chain(plan.rows.iter().map(|(c, s)| (c, *s))) {
            if let Some(m) = by_seq.get(&seq) {
                rows.push(new_delivery(m, consumer));
            }
        }
        let created = delivery_insert_many_returning(&mut self.conn, &rows, now).await?;
        let seq_of: HashMap<String, i64> = messages.iter().map(|m| (m.message_id.to_string(), m.seq)).collect();
        let mut written = RelayWritten { deliveries: created.len() as u64, ..RelayWritten::default() };
        for (message_id, consumer, session) in created {
            match session {
                Some((session, _)) => {
                    let offer = offers.iter().position(|o| o.consumer == consumer && o.session == session);
                    if let (Some(i), Some(seq)) = (offer, seq_of.get(&message_id)) {
                        written.pushed.push((i, *seq));
                    }
                }
                None => written.waiting.push(consumer),
            }
        }
        Ok(written)
    }

    /// The claim brings every payload: nothing is missing.
    async fn relay_payloads(&mut self, _seqs: &[i64]) -> Result<HashMap<i64, Vec<u8>>> {
        Ok(HashMap::new())
    }

    async fn commit(mut self: Box<Self>) -> Result<()> {
        sqlx::query(q::COMMIT).execute(&mut *self.conn).await?;
        self.durable_again().await;
        Ok(())
    }

    async fn rollback(mut self: Box<Self>) {
        // Whatever the error left open; an error here only means there was none.
        let _ = sqlx::query(q::ROLLBACK).execute(&mut *self.conn).await;
        self.durable_again().await;
    }
}

/// A delivery to create, as JSON for `json_each`.
fn new_delivery(m: &StoredMessage, consumer: &str) -> serde_json::Value {
    json!({
        "m": m.message_id.to_string(),
        "c": consumer,
        "s": m.seq,
        "k": m.ordering_key,
        "a": us(m.available_at),
    })
}

/// The relay's fan-out insert: rows with `"l"` (session) and `"u"` (lease deadline) are created
/// leased to that session, with a delivery count of 1. An existing `(message_id, consumer)` row
/// is left alone. Returns what was created: `(message_id, consumer, Some((session, deadline)))`
/// for the leased ones.
async fn delivery_insert_many_returning(
    conn: &mut SqliteConnection,
    rows: &[serde_json::Value],
    now: DateTime<Utc>,
) -> Result<Vec<(String, String, Option<(String, DateTime<Utc>)>)>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let created = sqlx::query(q::DELIVERY_INSERT_MANY)
        .bind(serde_json::Value::Array(rows.to_vec()).to_string())
        .bind(us(now))
        .fetch_all(&mut *conn)
        .await?;
    created
        .iter()
        .map(|r| {
            let session: Option<String> = r.try_get("leased_by")?;
            let until: Option<i64> = r.try_get("lease_expires_at")?;
            Ok((r.try_get("message_id")?, r.try_get("consumer")?, session.zip(until.map(time))))
        })
        .collect()
}

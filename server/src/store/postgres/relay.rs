//! A relay pass's statements on PostgreSQL (ADR 0087): the claim, with the consumers kept
//! between passes at their version (ADR 0078) and the rows a backfill wrote first; the writes
//! of the plan as leased and pending ranges and rows (ADR 0041, 0065); the announcement to
//! other replicas. The pass itself is `store::relay_pass`, the same for both stores.
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, Postgres, Row, Transaction};
use uuid::Uuid;

use super::rows::message_from_row;
use super::seqs::multirange;
use super::{CONSUMERS_LOCK, PgStore, q};
use crate::domain::fanout::{Plan, Subscriber};
use crate::domain::{PushOffer, StoredMessage};
use crate::store::{RelayClaim, RelayTx, RelayWritten, Result, StoreError};

/// The consumers a relay pass matches, at the version of `outbox.consumers_version` they were
/// read at (`None`: never read).
#[derive(Debug, Default)]
pub(super) struct RelayConsumers {
    version: Option<String>,
    list: Arc<ConsumerIndex>,
}

/// The consumers kept between passes, indexed by the topics they name exactly, so that a pass
/// matches only those that name one of its topics and those with a wildcard pattern.
#[derive(Debug, Default)]
struct ConsumerIndex {
    rows: Vec<ConsumerRow>,
    exact: std::collections::HashMap<String, Vec<usize>>,
    wildcard: Vec<usize>,
}

impl ConsumerIndex {
    fn new(rows: Vec<ConsumerRow>) -> Self {
        let mut exact: std::collections::HashMap<String, Vec<usize>> = std::collections::HashMap::new();
        let mut wildcard = Vec::new();
        for (i, (_, _, _, patterns)) in rows.iter().enumerate() {
            if patterns.iter().any(|p| p.contains(['*', '>'])) {
                wildcard.push(i);
            }
            for p in patterns.iter().filter(|p| !p.contains(['*', '>'])) {
                let at = exact.entry(p.clone()).or_default();
                if at.last() != Some(&i) {
                    at.push(i);
                }
            }
        }
        Self { rows, exact, wildcard }
    }

    /// The consumers that may take one of `topics`, each once.
    fn candidates(&self, topics: &std::collections::BTreeSet<&str>) -> Vec<&ConsumerRow> {
        let mut at: Vec<usize> = self.wildcard.clone();
        at.extend(topics.iter().filter_map(|t| self.exact.get(*t)).flatten());
        at.sort_unstable();
        at.dedup();
        at.into_iter().map(|i| &self.rows[i]).collect()
    }
}

/// What `outbox.relay_consumers_since` answers: the consumers only when their version is not
/// the one the relay holds them at; the backfills that reach the pass's first seq every time.
#[derive(Debug, serde::Deserialize)]
struct ConsumersSince {
    /// A UUID, compared as it is written.
    version: String,
    consumers: Option<Vec<ConsumerRow>>,
    backfill: Vec<(String, i64)>,
}

/// A consumer as the claim lists it (`relay_claim`): name, paused, start seq, topic patterns.
type ConsumerRow = (String, bool, i64, Vec<String>);

/// The consumers that subscribe to the topics of a pass whose first seq is `first`, matched
/// here against the consumers kept at the claim's version (ADR 0078), each with the rows it
/// has already for the pass's messages (only a consumer whose backfill, listed by the claim,
/// reached `first` can have any: the pass asks for those alone).
async fn relay_subscribers(
    tx: &mut PgConnection,
    messages: &[StoredMessage],
    first: i64,
    consumers: &ConsumerIndex,
    backfill: &[(String, i64)],
) -> Result<Vec<Subscriber>> {
    let topics: std::collections::BTreeSet<&str> = messages.iter().map(|m| m.topic.as_str()).collect();
    let backfill: std::collections::HashMap<&str, i64> = backfill.iter().map(|(n, s)| (n.as_str(), *s)).collect();
    let mut subscribers: Vec<Subscriber> = Vec::new();
    let mut probed: Vec<(String, i64)> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (name, paused, start_seq, patterns) in consumers.candidates(&topics) {
        let (paused, start_seq) = (*paused, *start_seq);
        // Listed only where it reaches `first`; below it, no row can exist for the pass.
        let backfill_seq = backfill.get(name.as_str()).copied().unwrap_or(0);
        let matched: std::collections::HashSet<String> = topics
            .iter()
            .filter(|t| patterns.iter().any(|p| crate::domain::topic_matches(p, t)))
            .map(|t| (*t).to_owned())
            .collect();
        if matched.is_empty() {
            continue;
        }
        if backfill_seq >= first {
            probed.push((name.clone(), backfill_seq));
        }
        index.insert(name.clone(), subscribers.len());
        subscribers.push(Subscriber {
            name: name.clone(),
            paused,
            start_seq,
            topics: matched,
            ..Subscriber::default()
        });
    }
    if !probed.is_empty() {
        let (mut names, mut ids) = (Vec::new(), Vec::new());
        for (name, backfill_seq) in &probed {
            let s = &subscribers[index[name]];
            for m in messages.iter().filter(|m| m.seq <= *backfill_seq && s.topics.contains(&m.topic)) {
                names.push(name.as_str());
                ids.push(m.message_id.0);
            }
        }
        let seq_of: std::collections::HashMap<Uuid, i64> = messages.iter().map(|m| (m.message_id.0, m.seq)).collect();
        let there = sqlx::query(q::RELAY_ROWS_OF).bind(&names).bind(&ids).fetch_all(&mut *tx).await?;
        for row in &there {
            let name: String = row.try_get("consumer")?;
            let id: Uuid = row.try_get("message_id")?;
            if let (Some(i), Some(seq)) = (index.get(&name), seq_of.get(&id)) {
                subscribers[*i].has_row.insert(*seq);
            }
        }
    }
    // In name order: the fan-out writes in this order.
    subscribers.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(subscribers)
}

/// One relay pass's transaction, on the relay's pool, which commits without waiting for the WAL
/// flush: a pass lost in a database crash is derived state that the next pass redoes (its
/// messages are unrelayed again, as the claim is lost with it), and any later durable commit,
/// such as an ack of one of its deliveries, flushes it first. Producers' commits stay durable;
/// so do acks and every admin change.
pub(super) struct PgRelayTx {
    tx: Transaction<'static, Postgres>,
    store: PgStore,
}

impl PgStore {
    pub(super) async fn relay_tx(&self) -> Result<PgRelayTx> {
        Ok(PgRelayTx { tx: self.relay_pool.begin().await?, store: self.clone() })
    }

    /// The consumers at the version a claim read (ADR 0078): those it brought, kept for the
    /// passes after it, or those kept when it brought none because the version is the same.
    fn relay_consumers_at(&self, since: ConsumersSince) -> Result<Arc<ConsumerIndex>> {
        let mut kept = self.relay_consumers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match since.consumers {
            Some(list) => {
                *kept = RelayConsumers { version: Some(since.version), list: Arc::new(ConsumerIndex::new(list)) };
                Ok(kept.list.clone())
            }
            // Claims take turns and each reads after the one before committed, so the version
            // this process holds is the one a claim that brought nothing answered; anything
            // else is an error, never a pass with another list.
            None if kept.version.as_deref() == Some(since.version.as_str()) => Ok(kept.list.clone()),
            None => Err(StoreError::InvalidValue(format!(
                "a relay claim at consumers version {} came without the consumers (this process holds {:?})",
                since.version, kept.version
            ))),
        }
    }
}

#[async_trait::async_trait]
impl RelayTx for PgRelayTx {
    /// `outbox.relay_claim` claims after the cursor and in open gaps; payloads come with it for
    /// as many messages as the offers have room (in a steady flow every pushed one; past that, a
    /// backlog, only what is pushed is read, by `relay_payloads`).
    async fn relay_claim(&mut self, limit: i64, now: DateTime<Utc>, room: usize) -> Result<RelayClaim> {
        let known = self.store.relay_consumers.lock().map(|c| c.version.clone()).unwrap_or(None);
        let claimed = sqlx::query(q::RELAY_CLAIM)
            .bind(i32::try_from(limit).unwrap_or(i32::MAX))
            .bind(now)
            .bind(CONSUMERS_LOCK)
            .bind(i64::try_from(room).unwrap_or(i64::MAX))
            .bind(known)
            .fetch_all(&mut *self.tx)
            .await?;
        let messages = claimed.iter().map(message_from_row).collect::<Result<Vec<_>>>()?;
        let Some(first) = messages.first().map(|m| m.seq) else {
            return Ok(RelayClaim::default());
        };
        let mut without_payload = HashSet::new();
        for (m, r) in messages.iter().zip(&claimed) {
            if !r.try_get::<bool, _>("with_payload")? {
                without_payload.insert(m.seq);
            }
        }
        // The first row carries the consumers' version, and the consumers when it is not the
        // one this process holds them at; a claim without them would fan out to no one.
        let since = claimed.first().map(|r| r.try_get::<Option<Json<ConsumersSince>>, _>("consumers")).transpose()?;
        let Some(Json(mut since)) = since.flatten() else {
            return Err(StoreError::InvalidValue("a relay claim came without its consumers".into()));
        };
        let backfill = std::mem::take(&mut since.backfill);
        let consumers = self.store.relay_consumers_at(since)?;
        let subscribers = relay_subscribers(&mut self.tx, &messages, first, &consumers, &backfill).await?;
        Ok(RelayClaim { messages, without_payload, subscribers })
    }

    /// Leased ranges, one per offer pushed to, and pending ranges, one per consumer
    /// (`relay_insert_ranges`); rows for what a range cannot hold (`relay_insert_rows`).
    async fn relay_write(
        &mut self,
        _messages: &[StoredMessage],
        plan: &Plan,
        offers: &[PushOffer],
        now: DateTime<Utc>,
    ) -> Result<RelayWritten> {
        let mut ranges: (Vec<&str>, Vec<Option<&str>>, Vec<Option<DateTime<Utc>>>, Vec<String>) = Default::default();
        let mut pushed = Vec::new();
        for (i, seqs) in &plan.leased {
            let o = &offers[*i];
            ranges.0.push(&o.consumer);
            ranges.1.push(Some(&o.session));
            ranges.2.push(Some(o.lease_until));
            ranges.3.push(multirange(seqs));
            pushed.extend(seqs.iter().map(|s| (*i, *s)));
        }
        for (consumer, seqs) in &plan.pending {
            ranges.0.push(consumer);
            ranges.1.push(None);
            ranges.2.push(None);
            ranges.3.push(multirange(seqs));
        }
        if !ranges.0.is_empty() {
            sqlx::query(q::RELAY_INSERT_RANGES)
                .bind(&ranges.0)
                .bind(&ranges.1)
                .bind(&ranges.2)
                .bind(&ranges.3)
                .bind(now)
                .execute(&mut *self.tx)
                .await?;
        }
        let mut waiting: Vec<String> = plan.pending.iter().map(|(c, _)| c.clone()).collect();
        let mut created_rows = 0;
        if !plan.rows.is_empty() {
            let created: Vec<String> = sqlx::query_scalar(q::RELAY_INSERT_ROWS)
                .bind(plan.rows.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>())
                .bind(plan.rows.iter().map(|(_, s)| *s).collect::<Vec<_>>())
                .bind(now)
                .fetch_all(&mut *self.tx)
                .await?;
            created_rows = created.len() as u64;
            waiting.extend(created);
        }
        let deliveries = (plan.deliveries() - plan.rows.len()) as u64 + created_rows;
        Ok(RelayWritten { pushed, waiting, deliveries })
    }

    async fn relay_payloads(&mut self, seqs: &[i64]) -> Result<HashMap<i64, Vec<u8>>> {
        let rows = sqlx::query(q::RELAY_PAYLOADS).bind(seqs).fetch_all(&mut *self.tx).await?;
        rows.iter().map(|r| Ok((r.try_get("seq")?, r.try_get("payload")?))).collect()
    }

    /// One `NOTIFY outbox_work_KEY` naming the consumers, so that the streams of other
    /// replicas wake at once. It costs this transaction, never a producer's.
    async fn relay_announce(&mut self, consumers: &[String]) -> Result<()> {
        let names = consumers.join(",");
        // Too long a list for a notification: empty means "every consumer".
        let names = if names.len() > 7900 { String::new() } else { names };
        sqlx::query(q::RELAY_NOTIFY).bind(names).execute(&mut *self.tx).await?;
        Ok(())
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        Ok(self.tx.commit().await?)
    }
}

//! The relay pass, written once for every backend (ADR 0087): claim the messages the relay has
//! not read with the consumers that may take them, let [`fanout::plan`] decide who gets what,
//! write the plan, announce it, commit. Each backend gives the few statements of
//! [`RelayTx`] in the transaction it opens for a pass ([`super::Store::begin_relay`]); where a
//! delivery's state lives (PostgreSQL's ranges and rows, SQLite's rows) is the backend's
//! business, who gets which message is this file's and `fanout`'s.
use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use super::Result;
use crate::domain::fanout::{self, PassMessage, Plan, Subscriber};
use crate::domain::{LeasedDelivery, PushOffer, RelayOutcome, StoredMessage};

/// What a pass's claim read: the messages, in seq order, marked read by the relay in the
/// pass's transaction; and the consumers whose topics match one of them.
#[derive(Debug, Default)]
pub struct RelayClaim {
    pub messages: Vec<StoredMessage>,
    /// The seqs whose payload the claim left empty (a backend may read payloads only for as
    /// many messages as the offers have room: a backlog's are read for what is pushed alone,
    /// by [`RelayTx::relay_payloads`]).
    pub without_payload: HashSet<i64>,
    /// In name order: the pass writes in this order.
    pub subscribers: Vec<Subscriber>,
}

/// What [`RelayTx::relay_write`] created of a plan.
#[derive(Debug, Default)]
pub struct RelayWritten {
    /// `(offer index, seq)` of each delivery created leased to an offered stream. A backend
    /// that found a delivery there already (a backfill wrote its row first) leaves it out.
    pub pushed: Vec<(usize, i64)>,
    /// The consumers that got deliveries waiting for a lease (pending), to wake their streams.
    pub waiting: Vec<String>,
    /// Every delivery created.
    pub deliveries: u64,
}

/// The statements of one relay pass, in the transaction the backend opened for it. Dropped
/// without [`RelayTx::commit`], the pass is undone (its messages stay unread by the relay).
#[async_trait::async_trait]
pub trait RelayTx: Send {
    /// Claims up to `limit` committed messages the relay has not read, in seq order, and marks
    /// them read; with them the consumers whose topics match one, each with the seqs of the
    /// pass it has a delivery for already ([`Subscriber::has_row`]). Payloads come at least for
    /// the first `room` messages.
    async fn relay_claim(&mut self, limit: i64, now: DateTime<Utc>, room: usize) -> Result<RelayClaim>;
    /// Writes `plan` over the claimed `messages`: the deliveries leased to `offers`, the
    /// pending ones, the rows.
    async fn relay_write(
        &mut self,
        messages: &[StoredMessage],
        plan: &Plan,
        offers: &[PushOffer],
        now: DateTime<Utc>,
    ) -> Result<RelayWritten>;
    /// The payloads of the messages of `seqs`.
    async fn relay_payloads(&mut self, seqs: &[i64]) -> Result<HashMap<i64, Vec<u8>>>;
    /// Tells other processes' streams, at commit, that `consumers` (sorted, each once) got
    /// deliveries waiting. A backend whose other processes notice by themselves does nothing.
    async fn relay_announce(&mut self, consumers: &[String]) -> Result<()> {
        let _ = consumers;
        Ok(())
    }
    async fn commit(self: Box<Self>) -> Result<()>;
    /// Undoes the pass now (after an error), instead of when it is dropped.
    async fn rollback(self: Box<Self>) {}
}

/// One pass of at most `limit` messages at `now`; `announce` to other replicas; `offers` are
/// the room this process's streams lend (the caller keeps the count of it).
pub(super) async fn run(
    mut tx: Box<dyn RelayTx>,
    limit: i64,
    now: DateTime<Utc>,
    announce: bool,
    offers: &[PushOffer],
) -> Result<RelayOutcome> {
    match pass(&mut *tx, limit, now, announce, offers).await {
        Ok(out) => {
            tx.commit().await?;
            Ok(out)
        }
        Err(e) => {
            tx.rollback().await;
            Err(e)
        }
    }
}

async fn pass(
    tx: &mut dyn RelayTx,
    limit: i64,
    now: DateTime<Utc>,
    announce: bool,
    offers: &[PushOffer],
) -> Result<RelayOutcome> {
    let room: usize = offers.iter().map(|o| o.room).sum();
    let RelayClaim { mut messages, without_payload, subscribers } = tx.relay_claim(limit, now, room).await?;
    if messages.is_empty() {
        // The claim may still have written (PostgreSQL closes gaps): the caller commits.
        return Ok(RelayOutcome::default());
    }
    let pass: Vec<PassMessage> = messages.iter().map(PassMessage::from).collect();
    let plan = fanout::plan(&pass, &subscribers, offers, now);
    let mut written = tx.relay_write(&messages, &plan, offers, now).await?;
    written.waiting.sort_unstable();
    written.waiting.dedup();
    if announce && !written.waiting.is_empty() {
        tx.relay_announce(&written.waiting).await?;
    }
    // The payloads of pushed messages that the claim did not bring.
    let pushed: HashSet<i64> = written.pushed.iter().map(|(_, seq)| *seq).collect();
    let missing: Vec<i64> =
        messages.iter().map(|m| m.seq).filter(|s| without_payload.contains(s) && pushed.contains(s)).collect();
    if !missing.is_empty() {
        let mut payloads = tx.relay_payloads(&missing).await?;
        for m in messages.iter_mut() {
            if let Some(p) = payloads.remove(&m.seq) {
                m.payload = p;
            }
        }
    }
    Ok(outcome(&messages, written, offers))
}

/// What the pass did, for the relay: counts, the consumers to wake, the trace contexts, and the
/// pushed deliveries in seq order.
fn outcome(messages: &[StoredMessage], written: RelayWritten, offers: &[PushOffer]) -> RelayOutcome {
    let mut out = RelayOutcome {
        messages: messages.len() as u64,
        last_seq: messages.last().map(|m| m.seq),
        deliveries: written.deliveries,
        consumers: written.waiting,
        ..RelayOutcome::default()
    };
    for m in messages {
        if let Some(tp) = m.headers.get(crate::telemetry::TRACEPARENT) {
            out.traced.push((m.message_id.to_string(), tp.clone()));
        }
    }
    let by_seq: HashMap<i64, &StoredMessage> = messages.iter().map(|m| (m.seq, m)).collect();
    for (i, seq) in written.pushed {
        if let (Some(o), Some(m)) = (offers.get(i), by_seq.get(&seq)) {
            let d = LeasedDelivery { message: (*m).clone(), delivery_count: 1, lease_expires_at: o.lease_until };
            out.pushed.push((o.consumer.clone(), o.session.clone(), d));
        }
    }
    out.pushed.sort_by_key(|(_, _, d)| d.message.seq);
    out
}

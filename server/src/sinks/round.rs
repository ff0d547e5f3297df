//! One round of a sink's due deliveries, without a session: for `outboxd relay --once`.
//!
//! Leases what is due (up to the sink's `max_in_flight`), publishes it all concurrently, then
//! acks what the target confirmed, applies the failure rule ([`Failure`]) to what it refused,
//! and releases (uncounted) what it could not reach. Leases are held under a session id of their own, so
//! serving replicas that run the same sink skip them, and a crash mid-round leaves leases that
//! expire like any other.
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde::Serialize;

use super::{Outcome, Publish, Target};
use crate::clock::{self, SharedClock};
use crate::domain::{Consumer, DeliveryState, Failure, MessageId, Release, ReleaseGuard, Withdrawal};
use crate::hub::Hub;
use crate::store::{LeaseParams, SharedStore, StoreError};
use crate::waking::Waking;

/// How long a round waits for its target to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What one round did for one sink (the `--output json` shape).
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct RoundReport {
    pub consumer: String,
    pub sink: String,
    /// Leased and published.
    pub published: u64,
    /// Confirmed by the target, and acked.
    pub confirmed: u64,
    /// Refused by the target: due again after the backoff, or dead.
    pub failed: u64,
    /// Of those, dead now.
    pub dead: u64,
    /// Left unconfirmed because the target was unreachable: released, due again.
    pub unavailable: u64,
    /// Why the round could not publish (the target did not connect), if so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Runs one round for `consumer` (a sink) against `target`; its acks and releases wake the
/// streams of `hub`'s process.
pub async fn run(
    store: &SharedStore,
    hub: &Hub,
    clock: &SharedClock,
    consumer: &Consumer,
    target: &dyn Target,
) -> Result<RoundReport, StoreError> {
    let Some(sink) = &consumer.spec.sink else {
        return Ok(RoundReport::default());
    };
    let mut report = RoundReport {
        consumer: consumer.spec.name.to_string(),
        sink: sink.kind().as_str().to_owned(),
        ..RoundReport::default()
    };
    if consumer.paused {
        return Ok(report);
    }
    match tokio::time::timeout(CONNECT_TIMEOUT, target.connect()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            report.error = Some(e.to_string());
            return Ok(report);
        }
        Err(_) => {
            report.error = Some(format!("no connection within {CONNECT_TIMEOUT:?}"));
            return Ok(report);
        }
    }
    let session = format!("relay-once-{}", uuid::Uuid::new_v4());
    let now = clock.now();
    let lease_until = clock::add(now, consumer.spec.ack_deadline);
    let spec = &consumer.spec;
    let retry = spec.retry();
    let leased = store
        .delivery_lease(&LeaseParams {
            consumer: &spec.name,
            session: &session,
            limit: i64::from(sink.max_in_flight),
            keys_after: "",
            lease_until,
            now,
        })
        .await?;
    report.published = leased.len() as u64;
    let mut in_flight: FuturesUnordered<_> = leased
        .into_iter()
        .map(|d| {
            let (id, count) = (d.message.message_id, d.delivery_count);
            async move { (id, count, target.publish(Publish::from(d)).await) }
        })
        .collect();
    let mut acks: Vec<MessageId> = Vec::new();
    let mut releases: Vec<Release> = Vec::new();
    while let Some((id, count, outcome)) = in_flight.next().await {
        let now = clock.now();
        match outcome {
            Outcome::Confirmed => acks.push(id),
            Outcome::Failed { error, retry_after, .. } => {
                let release = Failure::Nacked { error, retry_after }.release(spec.name.clone(), id, count, &retry, now);
                report.failed += 1;
                report.dead += u64::from(release.state == DeliveryState::Dead);
                releases.push(release);
            }
            Outcome::Unavailable { error } => {
                report.unavailable += 1;
                report.error.get_or_insert(error);
                releases.push(Withdrawal::Unreachable.release(spec.name.clone(), id, now));
            }
        }
    }
    let now = clock.now();
    let waking = Waking::new(store, hub);
    if !acks.is_empty() {
        report.confirmed = waking.ack_ids(&spec.name, &acks, now).await?;
    }
    if !releases.is_empty() {
        waking.release(&releases, ReleaseGuard::Session(&session), now).await?;
    }
    target.close().await;
    Ok(report)
}

//! The failure rule, once: what becomes of a leased delivery that goes back without an ack.
//!
//! Every path that releases a delivery unacked names *why* with a [`Failure`] and gets its
//! [`Release`] from [`Failure::release`]: a nack and a sink's refused publish, an expired lease
//! (the sweeper), a stream that broke after sending it, a stream that closed or shut down, a
//! sink whose target went away, a delivery leased for a stream that ended before it was sent.
//! This is the only code that decides whether a delivery is retried and when (the consumer's
//! [`Backoff`], or the wait a nack asked for), or is dead (at `max_deliveries`), whether its
//! lease counted as an attempt, and what its `last_error` says. The store applies the release
//! as given; no SQL statement decides any of it (ADR 0084).
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Attempt, ConsumerName, DeliveryState, MessageId, Release};

/// The wait between failed attempts: retry n (n ≥ 1) waits `base · 2^(n−1)`, capped at `max`.
/// No jitter: a delivery's retries are spread by their own failure times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    /// The wait before the next delivery after the `failed_deliveries`-th failed one.
    pub fn delay(&self, failed_deliveries: u32) -> Duration {
        let exp = failed_deliveries.saturating_sub(1).min(62);
        let factor = 1u64 << exp;
        let ms = (self.base.as_millis() as u64).saturating_mul(factor);
        Duration::from_millis(ms).min(self.max)
    }
}

/// A consumer's retry policy: how many attempts a delivery gets, and the wait between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub max_deliveries: u32,
    pub backoff: Backoff,
}

/// Why a leased delivery goes back without an ack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The consumer's handler failed it (a nack), or a sink's target refused the publish: due
    /// again after `retry_after` when given, else after the backoff; dead at `max_deliveries`.
    Nacked { error: String, retry_after: Option<Duration> },
    /// The lease passed its ack deadline (the sweeper): due again after the backoff; dead at
    /// `max_deliveries`.
    Expired,
    /// The stream broke (or its client cancelled the call) after it was sent the delivery: a
    /// consumer may be crashing on it, so the attempt counts, but the stream, not the message,
    /// failed: due again at once, no backoff; dead at `max_deliveries`.
    Broke,
    /// No attempt: the lease is given back without counting (ADR 0074).
    Withdrawn(Withdrawal),
}

/// A release that is no attempt: the consumer never saw the delivery, or saw it and left
/// cleanly. Due again at once, never dead; the count its lease added is taken back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawal {
    /// The stream closed cleanly or the server shut down, holding it (sent or not), or a
    /// stream that broke had not sent it yet.
    Closed,
    /// A sink's target became unreachable before it confirmed the publish.
    Unreachable,
    /// Leased at fan-out to a stream that ended before the relay handed it over. The
    /// delivery's `last_error` is left as it was.
    Unsent,
}

impl Withdrawal {
    fn last_error(self) -> Option<String> {
        match self {
            Withdrawal::Closed => Some("stream closed before ack".to_owned()),
            Withdrawal::Unreachable => Some("sink target unreachable before its confirmation".to_owned()),
            Withdrawal::Unsent => None,
        }
    }

    /// The release of `message_id` to `consumer`: pending, due `now`, uncounted. A withdrawal
    /// needs no policy, so a caller that holds none (the relay) can make one.
    pub fn release(self, consumer: ConsumerName, message_id: MessageId, now: DateTime<Utc>) -> Release {
        Release {
            consumer,
            message_id,
            state: DeliveryState::Pending,
            available_at: now,
            error: self.last_error(),
            attempt: Attempt::Withdrawn,
        }
    }
}

impl Failure {
    /// The release of `message_id` to `consumer`, whose lease made it the `delivery_count`-th
    /// delivery, under the consumer's `retry` policy, at `now`.
    pub fn release(
        self,
        consumer: ConsumerName,
        message_id: MessageId,
        delivery_count: u32,
        retry: &RetryPolicy,
        now: DateTime<Utc>,
    ) -> Release {
        let (error, wait) = match self {
            Failure::Withdrawn(w) => return w.release(consumer, message_id, now),
            Failure::Nacked { error, retry_after } => {
                (error, retry_after.unwrap_or_else(|| retry.backoff.delay(delivery_count)))
            }
            Failure::Expired => ("ack deadline expired".to_owned(), retry.backoff.delay(delivery_count)),
            Failure::Broke => ("stream broke before ack".to_owned(), Duration::ZERO),
        };
        // The attempt that failed was the last one the policy allows: give up. A dead letter
        // is dated now; only a replay moves it out.
        let dead = delivery_count >= retry.max_deliveries;
        Release {
            consumer,
            message_id,
            state: if dead { DeliveryState::Dead } else { DeliveryState::Pending },
            available_at: if dead { now } else { crate::clock::add(now, wait) },
            error: Some(error),
            attempt: Attempt::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn retry(max_deliveries: u32) -> RetryPolicy {
        RetryPolicy { max_deliveries, backoff: Backoff { base: Duration::from_secs(1), max: Duration::from_secs(10) } }
    }

    fn decide(f: Failure, count: u32, max: u32) -> (DeliveryState, i64, Option<String>, Attempt) {
        let now = DateTime::<Utc>::from_timestamp(1_000_000, 0).unwrap();
        let c = ConsumerName::parse("c", "c").unwrap();
        let r = f.release(c, MessageId::generate(), count, &retry(max), now);
        (r.state, (r.available_at - now).num_milliseconds(), r.error, r.attempt)
    }

    fn nack(retry_after: Option<Duration>) -> Failure {
        Failure::Nacked { error: "boom".into(), retry_after }
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Backoff { base: Duration::from_millis(100), max: Duration::from_secs(1) };
        assert_eq!(b.delay(1), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(200));
        assert_eq!(b.delay(4), Duration::from_millis(800));
        assert_eq!(b.delay(5), Duration::from_secs(1));
        assert_eq!(b.delay(1000), Duration::from_secs(1));
        assert_eq!(b.delay(0), Duration::from_millis(100));
    }

    #[test]
    fn a_nack_waits_for_its_retry_after_or_the_backoff_and_dies_at_the_last_attempt() {
        let failed = |state, ms, e: &str| (state, ms, Some(e.to_owned()), Attempt::Failed);
        assert_eq!(decide(nack(None), 1, 3), failed(DeliveryState::Pending, 1_000, "boom"));
        assert_eq!(decide(nack(None), 2, 3), failed(DeliveryState::Pending, 2_000, "boom"));
        assert_eq!(decide(nack(None), 3, 5), failed(DeliveryState::Pending, 4_000, "boom"));
        assert_eq!(decide(nack(None), 5, 9), failed(DeliveryState::Pending, 10_000, "boom"), "capped");
        assert_eq!(decide(nack(Some(Duration::from_millis(1))), 2, 3), failed(DeliveryState::Pending, 1, "boom"));
        assert_eq!(decide(nack(Some(Duration::ZERO)), 3, 3), failed(DeliveryState::Dead, 0, "boom"));
        assert_eq!(decide(nack(None), 4, 3), failed(DeliveryState::Dead, 0, "boom"), "past the last attempt too");
    }

    #[test]
    fn an_expired_lease_backs_off_and_a_broken_stream_retries_at_once() {
        let failed = |state, ms, e: &str| (state, ms, Some(e.to_owned()), Attempt::Failed);
        assert_eq!(decide(Failure::Expired, 1, 2), failed(DeliveryState::Pending, 1_000, "ack deadline expired"));
        assert_eq!(decide(Failure::Expired, 2, 2), failed(DeliveryState::Dead, 0, "ack deadline expired"));
        assert_eq!(decide(Failure::Broke, 1, 2), failed(DeliveryState::Pending, 0, "stream broke before ack"));
        assert_eq!(decide(Failure::Broke, 1, 1), failed(DeliveryState::Dead, 0, "stream broke before ack"));
    }

    #[test]
    fn a_withdrawal_is_due_now_never_dead_and_counts_nothing() {
        let withdrawn = |e: Option<&str>| (DeliveryState::Pending, 0, e.map(str::to_owned), Attempt::Withdrawn);
        let at_last = |w| decide(Failure::Withdrawn(w), 1, 1);
        assert_eq!(at_last(Withdrawal::Closed), withdrawn(Some("stream closed before ack")));
        assert_eq!(
            at_last(Withdrawal::Unreachable),
            withdrawn(Some("sink target unreachable before its confirmation"))
        );
        assert_eq!(at_last(Withdrawal::Unsent), withdrawn(None));
    }
}

//! The storage layer: every SQL statement of the server lives below this module.
//!
//! One seam, [`Store`] (in `seam`): each backend (`postgres`, `sqlite`) implements its narrow,
//! entity-first statements, decoded through plain [`records`]; the operations of several
//! statements are its provided methods, written once over the backend's transaction
//! ([`StoreTx`]). Writes that a producer joins take the caller's executor.
use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::domain::{ConsumerName, ConsumerSpec, DeliveryState, MessageId, Topic, TopicPattern};

#[cfg(test)]
mod acked_count_tests;
#[cfg(test)]
mod contract_tests;
#[cfg(test)]
mod functions_tests;
#[cfg(test)]
mod limits_tests;
pub mod postgres;
#[cfg(test)]
mod quarantine_tests;
#[cfg(test)]
mod race_tests;
pub mod records;
mod relay_pass;
mod seam;
pub mod sqlite;
#[cfg(test)]
mod statements_tests;
#[cfg(test)]
pub(crate) mod tests;
#[cfg(test)]
mod transition_tests;

use std::sync::Arc;

use crate::domain::{LeasedDelivery, Release, ReleaseGuard, StoredMessage};

/// What a relay pass takes and returns, named where the seam is.
pub use crate::domain::{PushOffer, RelayOutcome};
pub use postgres::PgStore;
pub use relay_pass::{RelayClaim, RelayTx, RelayWritten};
pub use seam::{Store, StoreTx};
pub use sqlite::SqliteStore;

/// How the relay best runs on a database, where the configuration leaves it open: each backend
/// says so itself, so that the code above the store never asks which backend it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayDefaults {
    /// The most messages a pass claims.
    pub pass_size: i64,
    /// After a pass that found fewer than `pass_size`, how long to wait before the next (see
    /// `relay::RelayConfig::gather`).
    pub gather: Duration,
}

/// Work that appeared outside this process, as [`Store::watch`] notices it. Hints only: one
/// that is lost is covered by the streams' and the relay's fallback polls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkHint {
    /// Another process committed messages: the relay has work.
    Enqueued,
    /// Another replica fanned out deliveries to these consumers.
    Consumers(Vec<String>),
    /// Announcements may have been missed (a reconnect): anyone may have work.
    All,
}

/// Where [`Store::watch`] sends its hints.
pub type HintSender = tokio::sync::mpsc::UnboundedSender<WorkHint>;

/// The store the server runs on.
pub type SharedStore = Arc<dyn Store>;

/// Opens the store a URL names: `postgres://…` / `postgresql://…`, or `sqlite://PATH`.
pub async fn connect(url: &str, max_connections: u32) -> Result<SharedStore> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open(url).await?))
    } else {
        Ok(Arc::new(PgStore::connect(url, max_connections).await?))
    }
}

/// A signed-in console session (ADR 0073), found by the SHA-256 of the cookie's random id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSession {
    pub id_hash: [u8; 32],
    /// The principal that signed in.
    pub principal: String,
    /// The SHA-256 of the token it signed in with, looked up again at every request.
    pub token_hash: [u8; 32],
    pub created_at: DateTime<Utc>,
    /// Its last request (idle expiry), written at most once a minute.
    pub seen_at: DateTime<Utc>,
    /// Its absolute expiry.
    pub expires_at: DateTime<Utc>,
}

/// Errors of the storage layer, carrying the ids involved.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("consumer {0:?} not found")]
    ConsumerNotFound(String),
    #[error(
        "consumer {name:?} already exists with a different {field}: creating it again takes the same definition \
         (delete it first to change it)"
    )]
    ConsumerConflict { name: String, field: &'static str },
    #[error("{count} consumers exist, the limit is {max} (--max-consumers); delete some first")]
    ConsumerLimit { count: usize, max: usize },
    #[error("message {0} not found")]
    MessageNotFound(MessageId),
    /// An enqueue under an existing message_id of another message (SQLSTATE 23505 from
    /// `outbox.same_message`, or SQLite's trigger); the text names no field that differs.
    #[error("{0}")]
    MessageConflict(String),
    #[error(
        "{0} selected message(s) are older than the retention, the dedup horizon: consumers may apply \
         them twice; set allow_beyond_retention to replay them anyway"
    )]
    BeyondRetention(u64),
    /// The database rejected a value (SQLSTATE class 22, or a CHECK constraint).
    #[error("invalid value: {0}")]
    InvalidValue(String),
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// Another process serves this SQLite file already.
    #[error("{0}")]
    Locked(String),
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// The database did not answer a new connection in time (start-up only: pools time out
    /// with `PoolTimedOut`).
    #[error("no answer from the database within {}", humantime::format_duration(*.0))]
    ConnectTimeout(std::time::Duration),
}

impl From<crate::domain::UnknownValue> for StoreError {
    fn from(e: crate::domain::UnknownValue) -> Self {
        StoreError::InvalidValue(e.to_string())
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &e {
            if db.message().contains("message_id") && db.message().contains("exists already with a different") {
                return StoreError::MessageConflict(db.message().to_owned());
            }
            let code = db.code().unwrap_or_default();
            // A CHECK constraint, or PostgreSQL's data_exception class (22xxx): the caller's
            // value is wrong.
            if matches!(db.kind(), sqlx::error::ErrorKind::CheckViolation)
                || (db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>().is_some() && code.starts_with("22"))
            {
                return StoreError::InvalidValue(db.message().to_owned());
            }
        }
        StoreError::Database(e)
    }
}

impl StoreError {
    /// The database could not be reached (refused, timed out, restarting), as opposed to a
    /// statement that failed.
    pub fn is_unreachable(&self) -> bool {
        match self {
            StoreError::ConnectTimeout(_) => true,
            StoreError::Database(e) | StoreError::Migrate(sqlx::migrate::MigrateError::Execute(e)) => match e {
                sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
                // connection_exception (08xxx), cannot_connect_now (57P03), admin shutdown.
                sqlx::Error::Database(db) => {
                    let code = db.code().unwrap_or_default();
                    code.starts_with("08") || code == "57P03" || code == "57P01"
                }
                _ => false,
            },
            _ => false,
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A message to enqueue, already validated.
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub message_id: Option<MessageId>,
    pub topic: Topic,
    pub type_: String,
    pub payload: Vec<u8>,
    pub headers: BTreeMap<String, String>,
    pub ordering_key: Option<String>,
    pub delay: Option<Duration>,
}

/// The outcome of an enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    pub message_id: MessageId,
    pub seq: i64,
    /// A message with this id existed already; nothing was written.
    pub duplicate: bool,
}

/// One consumer's delivery of a message.
#[derive(Debug, Clone)]
pub struct DeliveryRow {
    pub consumer: String,
    pub state: DeliveryState,
    pub delivery_count: u32,
    pub available_at: DateTime<Utc>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub acked_at: Option<DateTime<Utc>>,
    pub dead_at: Option<DateTime<Utc>>,
}

/// A lease past its deadline, with the policy needed to decide its next state.
#[derive(Debug, Clone)]
pub struct ExpiredLease {
    pub consumer: ConsumerName,
    pub message_id: MessageId,
    pub delivery_count: u32,
    /// Its consumer's retry policy, for [`crate::domain::Failure::Expired`].
    pub retry: crate::domain::RetryPolicy,
}

#[derive(Debug, Clone, Default)]
pub struct ConsumerStats {
    pub consumer: String,
    pub paused: bool,
    pub backlog: i64,
    pub in_flight: i64,
    pub retrying: i64,
    pub dead: i64,
    pub acked: i64,
    pub oldest_unacked_at: Option<DateTime<Utc>>,
    /// Ordering keys held after a dead letter (`DeadKeyPolicy::Hold`).
    pub held_keys: i64,
}

#[derive(Debug, Clone, Default)]
pub struct TableHealth {
    pub table: String,
    pub live_rows: i64,
    pub dead_rows: i64,
    pub bytes: i64,
    pub last_vacuum: Option<DateTime<Utc>>,
}

/// What holds back vacuum of outboxd's tables (PostgreSQL): the oldest of the sessions'
/// snapshots, replication slots and prepared transactions in this database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VacuumHorizon {
    /// `transaction`, `replication_slot` or `prepared_transaction`.
    pub kind: String,
    /// Since when it holds the horizon (a transaction's start, a prepare); `None` for a slot.
    pub since: Option<DateTime<Utc>>,
    /// Transactions since its snapshot.
    pub xmin_age: i64,
    pub pid: i32,
    pub application_name: String,
    pub state: String,
    /// A slot's name or a prepared transaction's gid.
    pub name: String,
    /// The longest any holder (of any kind, not only this one) has held the horizon.
    pub longest: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub unrelayed: i64,
    pub oldest_unrelayed_at: Option<DateTime<Utc>>,
    pub consumers: Vec<ConsumerStats>,
}

#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub message: StoredMessage,
    pub consumer: String,
    pub delivery_count: u32,
    pub last_error: Option<String>,
    pub dead_at: Option<DateTime<Utc>>,
}

/// A consumer's dead letters that share one last error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadGroup {
    pub last_error: Option<String>,
    pub count: i64,
    pub first_dead_at: Option<DateTime<Utc>>,
    pub last_dead_at: Option<DateTime<Utc>>,
    /// Up to [`DeadGroup::NAMES_SHOWN`] of the distinct topics and types of its first
    /// [`DeadGroup::SAMPLED`] dead letters, in byte order.
    pub topics: Vec<String>,
    pub types: Vec<String>,
}

impl DeadGroup {
    pub const NAMES_SHOWN: usize = 5;
    /// The topics and types of a group are those of its first (oldest) this many dead letters:
    /// a group may hold a million.
    pub const SAMPLED: i64 = 100;
}

/// What a message search looks for; every criterion given must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageQuery {
    /// A topic, or a pattern that matches as a consumer's does (`orders.*` one segment,
    /// `orders.>` one or more).
    pub topic: Option<TopicPattern>,
    pub type_: Option<String>,
    pub ordering_key: Option<String>,
    /// `enqueued_at` at or after this.
    pub after: Option<DateTime<Utc>>,
    /// `enqueued_at` before this.
    pub before: Option<DateTime<Utc>>,
}

/// A message without its payload and headers: a search result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageSummary {
    pub message_id: MessageId,
    pub seq: i64,
    pub topic: String,
    pub type_: String,
    pub ordering_key: Option<String>,
    pub enqueued_at: DateTime<Utc>,
}

/// The topic of a search as the stores filter by it: `(exact, pattern)`, one of them given. A
/// topic without a wildcard is matched exactly, by equality; a pattern's segments (`*` one,
/// `>` the rest) only ever hold `[A-Za-z0-9_-]` besides, so no character of them needs
/// escaping but the dots.
pub(crate) fn search_topic(topic: Option<&TopicPattern>) -> (Option<&str>, Option<&TopicPattern>) {
    match topic {
        Some(p) if p.as_str().split('.').any(|s| s == "*" || s == ">") => (None, Some(p)),
        Some(p) => (Some(p.as_str()), None),
        None => (None, None),
    }
}

/// Which of a consumer's unfinished deliveries a list shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnackedKind {
    /// Waiting for a delivery, first or again: the backlog.
    Pending,
    /// Waiting for a delivery again after one failed (nacked, or its lease expired).
    Retrying,
    /// Leased to a stream or a sink and not acked yet.
    InFlight,
}

impl UnackedKind {
    pub fn as_str(self) -> &'static str {
        match self {
            UnackedKind::Pending => "pending",
            UnackedKind::Retrying => "retrying",
            UnackedKind::InFlight => "in-flight",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [UnackedKind::Pending, UnackedKind::Retrying, UnackedKind::InFlight].into_iter().find(|k| k.as_str() == s)
    }
}

/// A consumer's delivery that is not finished (pending or leased), with its message's summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnackedDelivery {
    pub message: MessageSummary,
    pub state: DeliveryState,
    pub delivery_count: u32,
    /// When it is due (pending), or was (leased).
    pub available_at: DateTime<Utc>,
    /// Until when its stream holds it (leased).
    pub lease_expires_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
}

/// One page of a consumer's unfinished deliveries in `seq` order, and the seq the next page
/// starts after (`None`: nothing is left after this page).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnackedPage {
    pub deliveries: Vec<UnackedDelivery>,
    pub next_after_seq: Option<i64>,
}

/// The page a list of unfinished deliveries makes: the next page starts after the last one
/// when the page is full, else after `reached` (how far its reads went, when they stopped
/// before the end: never below the page's last), else nowhere.
pub(crate) fn unacked_page(deliveries: Vec<UnackedDelivery>, limit: i64, reached: Option<i64>) -> UnackedPage {
    let next_after_seq =
        if deliveries.len() as i64 >= limit { deliveries.last().map(|d| d.message.seq) } else { reached };
    UnackedPage { deliveries, next_after_seq }
}

/// One page of a search, newest first: the matches among the `scanned` messages below the
/// cursor, and where the next page starts (`None`: no older message is left).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SearchPage {
    pub messages: Vec<MessageSummary>,
    pub scanned: i64,
    pub next_before_seq: Option<i64>,
}

/// The page a search window makes: the next page starts below the last match when the page is
/// full, else below the window when the window was full (older messages are left), else nowhere.
pub(crate) fn search_page(
    messages: Vec<MessageSummary>,
    scanned: i64,
    lowest: Option<i64>,
    limit: i64,
    scan: i64,
) -> SearchPage {
    let next_before_seq = if messages.len() as i64 >= limit {
        messages.last().map(|m| m.seq)
    } else if scanned >= scan {
        lowest
    } else {
        None
    };
    SearchPage { messages, scanned, next_before_seq }
}

/// A message as a tail looks at it before it reads its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TailEntry {
    pub seq: i64,
    pub topic: String,
    /// Its payload, headers, topic, type and ordering key, in bytes: what reading it will hold.
    pub bytes: usize,
}

/// What a tail reads next ([`Store::message_tail`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TailPage {
    /// The messages whose topic matches, in seq order.
    pub hits: Vec<TailEntry>,
    /// Where the next read starts: after every message looked at, up to the first match left out.
    pub next_after: i64,
    /// Whether more may be there at once: the window was full, or matches were left out.
    pub more: bool,
}

/// An ordering key a consumer holds because a message of it dead-lettered
/// ([`crate::domain::DeadKeyPolicy::Hold`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldKey {
    pub ordering_key: String,
    /// The dead message that holds the key.
    pub message_id: MessageId,
    pub last_error: Option<String>,
    /// Messages of the key waiting behind it, counted up to [`HeldKey::WAITING_COUNTED`].
    pub waiting: i64,
    pub held_at: DateTime<Utc>,
}

impl HeldKey {
    /// How far the waiting messages of one key are counted: a key's backlog may be deep, and a
    /// listing must not cost what the backlog does. With ListHeldKeys' 100 keys an answer looks
    /// at no more than 100,000 index entries (issue 47: 1,000 keys of 100,000 each made one call
    /// cost what the whole backlog does).
    pub const WAITING_COUNTED: i64 = 1_000;
}

/// The criteria of a replay that the store applies; every one given must hold. Topic patterns
/// are matched by the caller ([`crate::maintenance::replay`]), on the candidates' topics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayFilter {
    /// Only these messages (none: any).
    pub message_ids: Vec<MessageId>,
    /// Only the consumer's dead letters.
    pub dead_only: bool,
    /// `enqueued_at` at or after this.
    pub enqueued_after: Option<DateTime<Utc>>,
    /// `enqueued_at` before this.
    pub enqueued_before: Option<DateTime<Utc>>,
    /// Only these message types (none: any).
    pub types: Vec<String>,
    /// Only dead letters whose last error is exactly this (with `dead_only`).
    pub last_error: Option<String>,
}

/// A message a replay may make due again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayCandidate {
    pub message_id: MessageId,
    pub seq: i64,
    pub topic: String,
    pub enqueued_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub messages: i64,
    pub deliveries: i64,
}

/// What [`Store::delivery_lease`] leases, and for whom.
#[derive(Debug, Clone, Copy)]
pub struct LeaseParams<'a> {
    pub consumer: &'a ConsumerName,
    /// The session the leases are for (`leased_by`).
    pub session: &'a str,
    /// The most deliveries to lease.
    pub limit: i64,
    /// The key cursor: ordering keys are visited from the first after it, wrapping around (""
    /// = from the first); see [`next_key_cursor`].
    pub keys_after: &'a str,
    /// The deadline of the new leases.
    pub lease_until: DateTime<Utc>,
    pub now: DateTime<Utc>,
}

/// Which leases [`Store::delivery_extend_many`] pushes out, and until when.
#[derive(Debug, Clone, Copy)]
pub struct ExtendParams<'a> {
    pub consumer: &'a ConsumerName,
    /// The session that holds them: the leases of any other are left alone.
    pub session: &'a str,
    pub ids: &'a [MessageId],
    /// Their new deadline.
    pub until: DateTime<Utc>,
    pub now: DateTime<Utc>,
}

/// Which page of a consumer's unfinished deliveries a list reads
/// ([`Store::delivery_unacked_page`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnackedPageParams {
    pub kind: UnackedKind,
    /// The page starts after this seq.
    pub after_seq: i64,
    /// The most deliveries on the page.
    pub limit: i64,
    /// The most pending rows looked at for retrying ones.
    pub scan: i64,
}

/// Which page of a consumer's dead letters a list reads ([`Store::dead_letter_page`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeadLetterPageParams<'a> {
    /// Only those whose last error is exactly this (`None`: any).
    pub last_error: Option<&'a str>,
    /// The page starts after this seq.
    pub after_seq: i64,
    /// The most dead letters on the page.
    pub limit: i64,
    /// With payloads and headers; else those are left empty.
    pub with_payloads: bool,
}

/// Which replay candidates [`Store::replay_candidates`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayCandidatesParams<'a> {
    pub filter: &'a ReplayFilter,
    /// The page starts after this seq.
    pub after_seq: i64,
    /// The most candidates on the page; fewer means there are no more.
    pub limit: i64,
}

/// One page of a message search ([`Store::message_search`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SearchParams<'a> {
    pub query: &'a MessageQuery,
    /// The page looks below this seq (`None`: from the newest).
    pub before_seq: Option<i64>,
    /// The most matches on the page.
    pub limit: i64,
    /// The most messages the page looks at.
    pub scan: i64,
}

/// What a tail reads next ([`Store::message_tail`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TailParams<'a> {
    /// The read starts after this seq.
    pub after: i64,
    /// The topics it takes, matched as the relay matches them.
    pub patterns: &'a [TopicPattern],
    /// The most messages it looks at.
    pub scan: i64,
    /// The most matches it takes.
    pub limit: usize,
}

/// A consumer to create ([`Store::consumer_create_by`]), on whose behalf and within what limit.
#[derive(Debug, Clone, Copy)]
pub struct ConsumerCreateParams<'a> {
    pub spec: &'a ConsumerSpec,
    /// The principal that creates it (ADR 0072).
    pub created_by: Option<&'a str>,
    /// The most consumers that may exist: refused with [`StoreError::ConsumerLimit`] at it.
    pub max: usize,
    pub now: DateTime<Utc>,
}

/// A held key to let flow again ([`Store::held_key_release`]).
#[derive(Debug, Clone, Copy)]
pub struct KeyReleaseParams<'a> {
    pub consumer: &'a ConsumerName,
    pub ordering_key: &'a str,
    /// Leave the dead message that holds the key dead; else it is made due again first.
    pub skip_dead: bool,
    pub now: DateTime<Utc>,
}

/// Where the next lease of a session should start visiting ordering keys: after the last key
/// this lease took, in the lease's visiting order (keys after `keys_after` first, then the
/// wrapped-around ones). Unchanged when the lease took no keyed delivery.
pub fn next_key_cursor(keys_after: &str, leased: &[LeasedDelivery]) -> String {
    let keys = leased.iter().filter_map(|d| d.message.ordering_key.as_deref());
    let wrapped = keys.clone().filter(|k| *k <= keys_after).max();
    wrapped.or_else(|| keys.max()).unwrap_or(keys_after).to_owned()
}

//! `service OutboxAdmin`: consumers, stats, dead letters, message inspection, replay, prune.
use outbox_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::auth::{self, Caller, ConsumerChange, Need};
use super::convert::{self, age, pb_consumer};
use super::{invalid, store_status};
use crate::delivery::session::SessionContext;
use crate::domain::{ConsumerName, InvalidField, MessageId, TopicPattern};
use crate::limits::QuotaKey;
use crate::maintenance::pruner::Pruner;
use crate::maintenance::replay::{Origin, ReplayPlan, ReplayProgress, Replayer};
use crate::store::{ReplayFilter, StoreError, TailParams};

#[derive(Debug, Clone)]
pub struct AdminService {
    pub ctx: SessionContext,
    pub pruner: Pruner,
    pub replayer: Replayer,
    pub streams: crate::limits::StreamLimiter,
    /// Seals sinks' secrets before they are stored (`--sink-key-file`).
    pub sink_key: Option<std::sync::Arc<crate::sinks::sealed::SinkKey>>,
}

impl AdminService {
    /// A consumer as answers show it: a sealed sink opened, then redacted like every sink.
    /// Refuses `caller` the deletion of consumer `n` unless [`Caller::check_consumer`] allows
    /// it (NOT_FOUND for a consumer that does not exist).
    async fn may_delete(&self, caller: &Caller, n: &ConsumerName) -> Result<(), Status> {
        let c = self.ctx.store.consumer_get(n).await.map_err(delete_status)?;
        caller.check_consumer(ConsumerChange::Delete(&c))
    }

    fn shown(&self, c: &crate::domain::Consumer) -> pb::Consumer {
        let mut c = c.clone();
        c.spec.sink = c.spec.sink.map(|s| crate::sinks::sealed::shown(self.sink_key.as_deref(), &s));
        pb_consumer(&c)
    }
}

/// [`store_status`], but a consumer to delete that does not exist needs no advice on creating it.
fn delete_status(e: StoreError) -> Status {
    match e {
        StoreError::ConsumerNotFound(_) => Status::not_found(e.to_string()),
        e => store_status(e),
    }
}

fn name(field: &str, s: &str) -> Result<ConsumerName, Status> {
    ConsumerName::parse(field, s).map_err(invalid)
}

/// Parses every item of a repeated field; an error names the item (`field[i]`).
fn parse_each<T>(
    field: &str,
    items: &[String],
    parse: impl Fn(&str, &str) -> Result<T, InvalidField>,
) -> Result<Vec<T>, Status> {
    items.iter().enumerate().map(|(i, s)| parse(&format!("{field}[{i}]"), s)).collect::<Result<_, _>>().map_err(invalid)
}

/// One audit line per admin write, on target `outboxd::audit`: who, from where, what was asked
/// and what came of it. Replays write theirs in the replayer (with what they did).
struct Audit {
    action: &'static str,
    caller: Caller,
    peer: Option<std::net::SocketAddr>,
    request: String,
}

impl Audit {
    fn of<T: std::fmt::Debug>(action: &'static str, request: &Request<T>) -> Result<Self, Status> {
        Self::showing(action, request, format!("{:?}", request.get_ref()))
    }

    /// With the request as `shown` (secrets already taken out).
    fn showing<T>(action: &'static str, request: &Request<T>, shown: String) -> Result<Self, Status> {
        Ok(Self { action, caller: auth::caller(request)?, peer: request.remote_addr(), request: shown })
    }

    /// A permission that depends on the request; a refusal is audited too.
    fn check(&self, need: Need<'_>) -> Result<(), Status> {
        self.caller.check(need).inspect_err(|s| self.log(Err(s)))
    }

    fn origin(&self) -> Origin {
        Origin { principal: self.caller.name.to_string(), peer: self.peer }
    }

    fn done<T>(self, result: Result<T, Status>) -> Result<T, Status> {
        self.log(result.as_ref().map(|_| ()));
        result
    }

    fn log(&self, outcome: Result<(), &Status>) {
        let (principal, peer, action, request) = (&*self.caller.name, self.peer, self.action, &self.request);
        match outcome {
            Ok(()) => {
                tracing::info!(target: "outboxd::audit", principal, ?peer, action, request, outcome = "ok", "{action}")
            }
            Err(s) => tracing::warn!(
                target: "outboxd::audit", principal, ?peer, action, request, outcome = ?s.code(), error = s.message(),
                "{action} refused"
            ),
        }
    }
}

/// `message` as `caller` may see it: with its payload only if it may read the message's topic
/// (`tail:` covering it). `admin:read` shows a message's metadata, states and errors; the
/// payload is a tenant's data, readable only where the same principal could tail it.
fn readable_by(caller: &Caller, mut message: pb::Message) -> pb::Message {
    let may_read = TopicPattern::parse("topic", &message.topic).is_ok_and(|t| caller.allows(Need::Tail(&t)));
    if !may_read {
        message.payload = Vec::new();
    }
    message
}

/// Held keys one ListHeldKeys answers with at most: each costs up to
/// [`crate::store::HeldKey::WAITING_COUNTED`] index entries to count its waiting messages.
const MAX_HELD_KEYS: u32 = 100;

fn pb_held_key(k: crate::store::HeldKey) -> pb::HeldKey {
    pb::HeldKey {
        ordering_key: k.ordering_key,
        message_id: k.message_id.to_string(),
        last_error: k.last_error.unwrap_or_default(),
        waiting: k.waiting,
        held_at: Some(convert::timestamp(k.held_at)),
    }
}

const DEFAULT_PAGE: u32 = 100;
/// The payload and header bytes one page of dead letters carries at most (at least one
/// message, however large): the page ends there and its token leads on.
const MAX_PAGE_BYTES: usize = 4 * 1024 * 1024;
/// Dead letters read from the store at a time while a page fills.
const PAGE_CHUNK: usize = 16;
const MAX_PAGE: u32 = 1000;

/// Messages a tail holds ahead of its reader; it reads no more than there is room for here.
const TAIL_BUFFER: usize = 8;
/// Messages a tail looks at per read, by topic and size only (no payloads): a tail of a quiet
/// topic passes over other topics' traffic in steps of this many.
const TAIL_SCAN: i64 = 512;

/// How often a tail looks for new messages when not woken.
const TAIL_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// A message's bytes counted against its principal's in-flight budget from the moment a tail
/// reads it until the transport has taken it; given back when dropped.
#[derive(Debug)]
struct Held {
    budget: Option<std::sync::Arc<crate::limits::ByteBudget>>,
    bytes: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.give(self.bytes);
        }
    }
}

/// A tail's answer stream: each message counts against the budget until the transport asks for
/// the one after it (it has taken that one into its own buffer by then).
pub struct TailMessages {
    rx: tokio::sync::mpsc::Receiver<Result<(pb::Message, Held), Status>>,
    handed: Option<Held>,
}

impl futures::Stream for TailMessages {
    type Item = Result<pb::Message, Status>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.handed = None;
        self.rx.poll_recv(cx).map(|item| {
            item.map(|r| {
                r.map(|(message, held)| {
                    self.handed = Some(held);
                    message
                })
            })
        })
    }
}

#[tonic::async_trait]
impl pb::outbox_admin_server::OutboxAdmin for AdminService {
    type TailStream = TailMessages;

    async fn tail(&self, request: Request<pb::TailRequest>) -> Result<Response<Self::TailStream>, Status> {
        let caller = auth::caller(&request)?;
        let mine = self.streams.acquire_principal(request.extensions().get::<QuotaKey>())?;
        let peer = request.remote_addr();
        let topics = request.into_inner().topics;
        // A tail keeps its patterns and matches every message against each for as long as it
        // runs: as many as a consumer may have, each once.
        if topics.len() > crate::limits::MAX_CONSUMER_TOPICS {
            return Err(invalid(InvalidField::new(
                "topics",
                format!("{} topics; the limit is {} per tail", topics.len(), crate::limits::MAX_CONSUMER_TOPICS),
            )));
        }
        let mut patterns = parse_each("topics", &topics, TopicPattern::parse)?;
        patterns.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        patterns.dedup_by(|a, b| a.as_str() == b.as_str());
        // No topics is every topic: `tail:>`.
        let everything = [TopicPattern::parse("topics", ">").map_err(invalid)?];
        for p in if patterns.is_empty() { &everything[..] } else { &patterns[..] } {
            caller.check(Need::Tail(p))?;
        }
        let budget = mine.in_flight_bytes();
        let permit = (self.streams.acquire(peer)?, mine);
        let cursor = self.ctx.store.message_last_seq().await.map_err(store_status)?;
        let (tx, rx) = tokio::sync::mpsc::channel(TAIL_BUFFER);
        let ctx = self.ctx.clone();
        let wanted: Vec<TopicPattern> = if patterns.is_empty() { everything.to_vec() } else { patterns };
        let matched = wanted.clone();
        // A reloaded auth file that takes the caller's permission away ends the tail.
        let revoked = async move { caller.revoked(move |p| wanted.iter().all(|t| p.allows(&Need::Tail(t)))).await };
        ctx.tasks.clone().spawn(async move {
            let _permit = permit;
            tail_loop(ctx, matched, cursor, budget, tx, revoked).await;
        });
        Ok(Response::new(TailMessages { rx, handed: None }))
    }

    async fn create_consumer(
        &self,
        request: Request<pb::CreateConsumerRequest>,
    ) -> Result<Response<pb::CreateConsumerResponse>, Status> {
        // A sink's passwords and secrets are write-only: not in the audit log either.
        let mut shown = request.get_ref().clone();
        if let Some(sink) = shown.consumer.as_mut().and_then(|c| c.sink.as_mut()) {
            convert::redact_pb_sink(sink);
        }
        let audit = Audit::showing("create_consumer", &request, format!("{shown:?}"))?;
        let result = async {
            let Some(c) = request.into_inner().consumer else {
                return Err(invalid(InvalidField::new("consumer", "required")));
            };
            let mut spec = convert::consumer_spec(c).map_err(invalid)?;
            if let Some(sink) = spec.sink.as_mut() {
                // It runs on its creator's authority: revoking that ends it (SinkOwners).
                sink.created_by = audit.caller.principal_name().map(str::to_owned);
                if let Some(key) = &self.sink_key {
                    *sink = key.seal(sink);
                }
            }
            audit.caller.check_consumer(ConsumerChange::Create(&spec))?;
            // The limit is counted under the store's consumer-change lock: concurrent creates
            // cannot both pass it.
            let max = self.streams.limits().max_consumers;
            let owner = audit.caller.principal_name();
            let now = self.ctx.clock.now();
            let consumer = self.ctx.waking().create_consumer(&spec, owner, max, now).await.map_err(store_status)?;
            Ok(Response::new(pb::CreateConsumerResponse { consumer: Some(self.shown(&consumer)) }))
        }
        .await;
        audit.done(result)
    }

    async fn get_consumer(
        &self,
        request: Request<pb::GetConsumerRequest>,
    ) -> Result<Response<pb::GetConsumerResponse>, Status> {
        let n = name("consumer", &request.into_inner().consumer)?;
        let c = self.ctx.store.consumer_get(&n).await.map_err(store_status)?;
        Ok(Response::new(pb::GetConsumerResponse { consumer: Some(self.shown(&c)) }))
    }

    async fn list_consumers(
        &self,
        _request: Request<pb::ListConsumersRequest>,
    ) -> Result<Response<pb::ListConsumersResponse>, Status> {
        let cs = self.ctx.store.consumer_list().await.map_err(store_status)?;
        Ok(Response::new(pb::ListConsumersResponse { consumers: cs.iter().map(|c| self.shown(c)).collect() }))
    }

    async fn delete_consumer(
        &self,
        request: Request<pb::DeleteConsumerRequest>,
    ) -> Result<Response<pb::DeleteConsumerResponse>, Status> {
        let audit = Audit::of("delete_consumer", &request)?;
        let result = async {
            let n = name("consumer", &request.into_inner().consumer)?;
            self.may_delete(&audit.caller, &n).await?;
            self.ctx.waking().delete_consumer(&n).await.map_err(delete_status)?;
            Ok(Response::new(pb::DeleteConsumerResponse {}))
        }
        .await;
        audit.done(result)
    }

    async fn pause_consumer(
        &self,
        request: Request<pb::PauseConsumerRequest>,
    ) -> Result<Response<pb::PauseConsumerResponse>, Status> {
        let audit = Audit::of("pause_consumer", &request)?;
        let result = async {
            let n = name("consumer", &request.into_inner().consumer)?;
            let c = self.ctx.waking().set_paused(&n, true).await.map_err(store_status)?;
            Ok(Response::new(pb::PauseConsumerResponse { consumer: Some(self.shown(&c)) }))
        }
        .await;
        audit.done(result)
    }

    async fn resume_consumer(
        &self,
        request: Request<pb::ResumeConsumerRequest>,
    ) -> Result<Response<pb::ResumeConsumerResponse>, Status> {
        let audit = Audit::of("resume_consumer", &request)?;
        let result = async {
            let n = name("consumer", &request.into_inner().consumer)?;
            let c = self.ctx.waking().set_paused(&n, false).await.map_err(store_status)?;
            Ok(Response::new(pb::ResumeConsumerResponse { consumer: Some(self.shown(&c)) }))
        }
        .await;
        audit.done(result)
    }

    async fn get_stats(&self, request: Request<pb::GetStatsRequest>) -> Result<Response<pb::GetStatsResponse>, Status> {
        let req = request.into_inner();
        let only = if req.consumer.is_empty() { None } else { Some(name("consumer", &req.consumer)?) };
        let stats = self.ctx.store.stats(only.as_ref(), true).await.map_err(store_status)?;
        let tables = self.ctx.store.table_health().await.map_err(store_status)?;
        let horizon = self.ctx.store.vacuum_horizon().await.map_err(store_status)?;
        // Which consumers are sinks, and of what kind.
        let sinks: std::collections::HashMap<String, &'static str> = self
            .ctx
            .store
            .consumer_list()
            .await
            .map_err(store_status)?
            .into_iter()
            .filter_map(|c| c.spec.sink.map(|s| (c.spec.name.to_string(), s.kind().as_str())))
            .collect();
        let now = self.ctx.clock.now();
        Ok(Response::new(pb::GetStatsResponse {
            vacuum_horizon: horizon.map(|h| pb::VacuumHorizon {
                age: h.since.and_then(|t| age(now, Some(t))),
                kind: h.kind,
                xmin_age: h.xmin_age,
                pid: h.pid,
                application_name: h.application_name,
                state: h.state,
                name: h.name,
            }),
            tables: tables
                .into_iter()
                .map(|t| pb::TableStats {
                    table: t.table,
                    live_rows: t.live_rows,
                    dead_rows: t.dead_rows,
                    bytes: t.bytes,
                    last_vacuum: t.last_vacuum.map(convert::timestamp),
                })
                .collect(),
            unrelayed: stats.unrelayed,
            oldest_unrelayed_age: age(now, stats.oldest_unrelayed_at),
            consumers: stats
                .consumers
                .into_iter()
                .map(|c| pb::ConsumerStats {
                    streams: self.ctx.hub.streams(&c.consumer),
                    sink: sinks.get(&c.consumer).copied().unwrap_or_default().to_owned(),
                    consumer: c.consumer,
                    backlog: c.backlog,
                    in_flight: c.in_flight,
                    retrying: c.retrying,
                    dead: c.dead,
                    oldest_unacked_age: age(now, c.oldest_unacked_at),
                    acked: c.acked,
                    paused: c.paused,
                    held_keys: c.held_keys,
                })
                .collect(),
        }))
    }

    async fn list_dead_letters(
        &self,
        request: Request<pb::ListDeadLettersRequest>,
    ) -> Result<Response<pb::ListDeadLettersResponse>, Status> {
        let caller = auth::caller(&request)?;
        let req = request.into_inner();
        let n = name("consumer", &req.consumer)?;
        let size = match req.page_size {
            0 => DEFAULT_PAGE,
            s if s > MAX_PAGE => return Err(invalid(InvalidField::new("page_size", format!("at most {MAX_PAGE}")))),
            s => s,
        };
        let after = if req.page_token.is_empty() {
            0
        } else {
            req.page_token
                .parse::<i64>()
                .map_err(|_| invalid(InvalidField::new("page_token", "not a token from a previous page")))?
        };
        // Read in small chunks and cut at MAX_PAGE_BYTES of payloads and headers: a page of
        // large messages is held in memory once, and only up to that budget, whatever the
        // page_size (the rest comes with the next page token).
        let mut page = Vec::new();
        let (mut bytes, mut cursor, mut more) = (0usize, after, true);
        while more && page.len() < size as usize && bytes < MAX_PAGE_BYTES {
            let want = (size as usize - page.len()).min(PAGE_CHUNK);
            let chunk = self.ctx.store.dead_letter_list(&n, cursor, want as i64).await.map_err(store_status)?;
            more = chunk.len() == want;
            for d in chunk {
                cursor = d.message.seq;
                bytes +=
                    d.message.payload.len() + d.message.headers.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
                page.push(d);
                if bytes >= MAX_PAGE_BYTES {
                    more = true;
                    break;
                }
            }
        }
        let next_page_token = if more && !page.is_empty() {
            page.last().map(|d| d.message.seq.to_string()).unwrap_or_default()
        } else {
            String::new()
        };
        Ok(Response::new(pb::ListDeadLettersResponse {
            dead_letters: page
                .into_iter()
                .map(|d| pb::DeadLetter {
                    message: Some(readable_by(&caller, convert::pb_message(d.message))),
                    consumer: d.consumer,
                    delivery_count: d.delivery_count,
                    last_error: d.last_error.unwrap_or_default(),
                    dead_at: d.dead_at.map(convert::timestamp),
                })
                .collect(),
            next_page_token,
        }))
    }

    async fn get_message(
        &self,
        request: Request<pb::GetMessageRequest>,
    ) -> Result<Response<pb::GetMessageResponse>, Status> {
        let caller = auth::caller(&request)?;
        let id = MessageId::parse("message_id", &request.into_inner().message_id).map_err(invalid)?;
        let (message, deliveries) = self.ctx.store.message_get(id).await.map_err(store_status)?;
        Ok(Response::new(pb::GetMessageResponse {
            message: Some(readable_by(&caller, convert::pb_message(message))),
            deliveries: deliveries.into_iter().map(convert::pb_delivery_state).collect(),
        }))
    }

    async fn list_held_keys(
        &self,
        request: Request<pb::ListHeldKeysRequest>,
    ) -> Result<Response<pb::ListHeldKeysResponse>, Status> {
        let n = name("consumer", &request.into_inner().consumer)?;
        let mut keys = self.ctx.store.held_key_list(&n, i64::from(MAX_HELD_KEYS) + 1).await.map_err(store_status)?;
        let truncated = keys.len() > MAX_HELD_KEYS as usize;
        keys.truncate(MAX_HELD_KEYS as usize);
        Ok(Response::new(pb::ListHeldKeysResponse { keys: keys.into_iter().map(pb_held_key).collect(), truncated }))
    }

    /// Needs `replay:CONSUMER`: it delivers the dead message again, or lets the messages behind
    /// it go without it. Audited like a replay.
    async fn release_key(
        &self,
        request: Request<pb::ReleaseKeyRequest>,
    ) -> Result<Response<pb::ReleaseKeyResponse>, Status> {
        let audit = Audit::of("release_key", &request)?;
        let req = request.get_ref();
        let n = name("consumer", &req.consumer).inspect_err(|s| audit.log(Err(s)))?;
        audit.check(Need::Replay(n.as_str()))?;
        let result = async {
            if req.ordering_key.is_empty() {
                return Err(invalid(InvalidField::new("ordering_key", "required: the key to release")));
            }
            if req.ordering_key.len() > crate::limits::MAX_ORDERING_KEY_BYTES {
                return Err(invalid(InvalidField::new(
                    "ordering_key",
                    format!(
                        "{} bytes; an ordering key is at most {} bytes",
                        req.ordering_key.len(),
                        crate::limits::MAX_ORDERING_KEY_BYTES
                    ),
                )));
            }
            let now = self.ctx.clock.now();
            match self.ctx.waking().release_key(&n, &req.ordering_key, req.skip_dead, now).await {
                Ok(Some(held)) => Ok(Response::new(pb::ReleaseKeyResponse { key: Some(pb_held_key(held)) })),
                Ok(None) => Err(Status::not_found(format!(
                    "consumer {n} holds no ordering key {:?} (ListHeldKeys lists the held ones)",
                    req.ordering_key
                ))),
                Err(e) => Err(store_status(e)),
            }
        }
        .await;
        audit.done(result)
    }

    async fn replay(&self, request: Request<pb::ReplayRequest>) -> Result<Response<pb::ReplayResponse>, Status> {
        let audit = Audit::of("replay", &request)?;
        let plan = replay_plan(request.into_inner()).inspect_err(|s| audit.log(Err(s)))?;
        audit.check(Need::Replay(plan.consumer.as_str()))?;
        let origin = audit.origin();
        // Its own task: a caller that gives up (a deadline) does not cut the replay short
        // between two batches, and the audit line is written.
        let replayer = self.replayer.clone();
        let task_plan = plan.clone();
        let out = self
            .ctx
            .tasks
            .spawn(async move { replayer.run(&task_plan, &origin, None).await })
            .await
            .map_err(|e| Status::internal(format!("replay task: {e}")))?
            .map_err(store_status)?;
        Ok(Response::new(pb::ReplayResponse {
            replayed: (if plan.dry_run { out.selected } else { out.replayed }) as i64,
            dry_run: plan.dry_run,
            beyond_retention: out.beyond_retention as i64,
            selected: out.selected as i64,
        }))
    }

    type ReplayStreamStream = tokio_stream::wrappers::ReceiverStream<Result<pb::ReplayProgress, Status>>;

    async fn replay_stream(
        &self,
        request: Request<pb::ReplayRequest>,
    ) -> Result<Response<Self::ReplayStreamStream>, Status> {
        let peer = request.remote_addr();
        let audit = Audit::of("replay_stream", &request)?;
        let mine = self.streams.acquire_principal(request.extensions().get::<QuotaKey>())?;
        let plan = replay_plan(request.into_inner()).inspect_err(|s| audit.log(Err(s)))?;
        audit.check(Need::Replay(plan.consumer.as_str()))?;
        let permit = (self.streams.acquire(peer)?, mine);
        let origin = audit.origin();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let (progress_tx, mut progress_rx) = tokio::sync::mpsc::channel::<ReplayProgress>(1);
        let replayer = self.replayer.clone();
        let dry_run = plan.dry_run;
        let to_pb = move |p: ReplayProgress| pb::ReplayProgress {
            selected: p.selected as i64,
            replayed: (if dry_run { p.selected } else { p.replayed }) as i64,
            beyond_retention: p.beyond_retention as i64,
            dry_run,
            done: p.done,
        };
        let forward_tx = tx.clone();
        // A reloaded auth file that takes the caller's credential or `replay:` away ends the
        // stream with that status, and the replay with it.
        let caller = audit.caller.clone();
        let consumer = plan.consumer.clone();
        let revoked = async move { caller.revoked(move |p| p.allows(&Need::Replay(consumer.as_str()))).await };
        // Forwards progress; once the caller is gone (or revoked) it drops the progress
        // channel, which stops the replay after its current batch.
        let forward = async move {
            let mut revoked = std::pin::pin!(revoked);
            loop {
                tokio::select! {
                    status = revoked.as_mut() => {
                        let _ = forward_tx.send(Err(status)).await;
                        return;
                    }
                    p = progress_rx.recv() => {
                        let Some(p) = p else { return };
                        if forward_tx.send(Ok(to_pb(p))).await.is_err() {
                            return;
                        }
                    }
                }
            }
        };
        self.ctx.tasks.spawn(async move {
            let _permit = permit;
            let (result, ()) = tokio::join!(replayer.run(&plan, &origin, Some(progress_tx)), forward);
            if let Err(e) = result {
                let _ = tx.send(Err(store_status(e))).await;
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn prune(&self, request: Request<pb::PruneRequest>) -> Result<Response<pb::PruneResponse>, Status> {
        let audit = Audit::of("prune", &request)?;
        let result = async {
            let older_than = match request.into_inner().older_than {
                Some(d) => Some(convert::duration("older_than", &d).map_err(invalid)?).filter(|d| !d.is_zero()),
                None => None,
            };
            let pruned = self.pruner.run_once_with(older_than).await.map_err(store_status)?;
            Ok(Response::new(pb::PruneResponse {
                messages_deleted: pruned.messages,
                deliveries_deleted: pruned.deliveries,
            }))
        }
        .await;
        audit.done(result)
    }
}

/// Feeds a tail: it reads only when its reader has room, only messages of its patterns, and
/// only what its principal's byte budget has room for; each message read counts against that
/// budget until the transport takes it ([`TailMessages`]). A slow or stalled reader therefore
/// holds at most [`TAIL_BUFFER`] messages here, and all of a principal's tails and Subscribe
/// streams together at most `--max-in-flight-bytes-per-principal`.
async fn tail_loop(
    ctx: SessionContext,
    patterns: Vec<TopicPattern>,
    mut cursor: i64,
    budget: Option<std::sync::Arc<crate::limits::ByteBudget>>,
    tx: tokio::sync::mpsc::Sender<Result<(pb::Message, Held), Status>>,
    revoked: impl std::future::Future<Output = Status>,
) {
    let mut enqueued = ctx.hub.enqueued().subscribe();
    let mut returned = budget.as_ref().map(|b| b.returned());
    let mut revoked = std::pin::pin!(revoked);
    loop {
        // Room in the reader's buffer first: nothing is read ahead of it.
        let room = tokio::select! {
            biased;
            status = revoked.as_mut() => {
                let _ = tx.send(Err(status)).await;
                return;
            }
            _ = ctx.shutdown.cancelled() => return,
            room = tx.reserve() => match room {
                Ok(room) => room,
                Err(_) => return,
            },
        };
        let fits = 1 + tx.capacity();
        if let Some(r) = returned.as_mut() {
            r.borrow_and_update();
        }
        let (read, short) = match tail_read(&ctx, &patterns, &mut cursor, fits, budget.as_ref()).await {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!(error = %e, "tail read failed; retrying");
                (Vec::new(), false)
            }
        };
        let more = !read.is_empty() && !short;
        let mut read = read.into_iter();
        if let Some(first) = read.next() {
            room.send(Ok(first));
            for m in read {
                // Fits: `fits` counted the free places, and this task alone sends.
                if tx.try_send(Ok(m)).is_err() {
                    return;
                }
            }
        } else {
            drop(room);
        }
        if more {
            continue;
        }
        let budget_back = async {
            match (short, returned.as_mut()) {
                (true, Some(r)) => {
                    let _ = r.changed().await;
                }
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            status = revoked.as_mut() => {
                let _ = tx.send(Err(status)).await;
                return;
            }
            _ = tx.closed() => return,
            _ = ctx.shutdown.cancelled() => return,
            _ = budget_back => {}
            _ = enqueued.changed(), if !short => {}
            _ = tokio::time::sleep(TAIL_POLL), if !short => {}
        }
    }
}

/// One read of a tail: up to `fits` messages of `patterns` after `cursor`, each with its bytes
/// taken from `budget`, and the cursor moved past what was looked at. `short` when the budget
/// had no room for the next match (the cursor stays before it).
async fn tail_read(
    ctx: &SessionContext,
    patterns: &[TopicPattern],
    cursor: &mut i64,
    fits: usize,
    budget: Option<&std::sync::Arc<crate::limits::ByteBudget>>,
) -> Result<(Vec<(pb::Message, Held)>, bool), crate::store::StoreError> {
    loop {
        let page =
            ctx.store.message_tail(&TailParams { after: *cursor, patterns, scan: TAIL_SCAN, limit: fits }).await?;
        let mut taken = Vec::new();
        let mut short = false;
        for hit in &page.hits {
            // A message never needs more than the whole budget (the flag holds at least one).
            let bytes = budget.map_or(0, |b| hit.bytes.min(b.limit()));
            match budget {
                Some(b) if b.take_units(1, bytes) == 0 => {
                    crate::limits::refused("max_in_flight_bytes_per_principal");
                    short = true;
                    break;
                }
                _ => taken.push((hit.seq, bytes)),
            }
        }
        *cursor = match (short, page.hits.get(taken.len())) {
            // Up to the first match it could not take: that one is read again.
            (true, Some(next)) => next.seq - 1,
            _ => page.next_after,
        };
        if taken.is_empty() {
            if short || !page.more {
                return Ok((Vec::new(), short));
            }
            // A window of other topics: look further at once.
            continue;
        }
        let seqs: Vec<i64> = taken.iter().map(|(seq, _)| *seq).collect();
        // The bytes come back when what holds them is dropped, an error included.
        let mut holds: std::collections::HashMap<i64, Held> =
            taken.iter().map(|&(seq, bytes)| (seq, Held { budget: budget.cloned(), bytes })).collect();
        let messages = ctx.store.message_list_of_seqs(&seqs).await?;
        let read = messages
            .into_iter()
            .filter_map(|m| holds.remove(&m.seq).map(|hold| (convert::pb_message(m), hold)))
            .collect();
        return Ok((read, short));
    }
}

/// Validates a replay request into a plan; names the field at fault.
#[allow(clippy::result_large_err)] // a Status is what the handlers return
pub fn replay_plan(req: pb::ReplayRequest) -> Result<ReplayPlan, Status> {
    let consumer = name("consumer", &req.consumer)?;
    let by_ids = !req.message_ids.is_empty();
    let by_range = req.enqueued_after.is_some() || req.enqueued_before.is_some();
    if !(by_ids || req.dead_letters || by_range) {
        return Err(invalid(InvalidField::new(
            "selector",
            "one of message_ids, dead_letters, or enqueued_after/enqueued_before is required",
        )));
    }
    if by_ids && (req.dead_letters || by_range) {
        return Err(invalid(InvalidField::new(
            "message_ids",
            "cannot be combined with dead_letters or enqueued_after/enqueued_before",
        )));
    }
    let message_ids = parse_each("message_ids", &req.message_ids, MessageId::parse)?;
    let enqueued_after =
        req.enqueued_after.as_ref().map(|t| convert::time("enqueued_after", t)).transpose().map_err(invalid)?;
    let enqueued_before =
        req.enqueued_before.as_ref().map(|t| convert::time("enqueued_before", t)).transpose().map_err(invalid)?;
    if let (Some(a), Some(b)) = (enqueued_after, enqueued_before)
        && b <= a
    {
        return Err(invalid(InvalidField::new("enqueued_before", "must be later than enqueued_after")));
    }
    for (i, t) in req.types.iter().enumerate() {
        if t.trim().is_empty() {
            return Err(invalid(InvalidField::new(format!("types[{i}]"), "must not be empty")));
        }
    }
    let topics = parse_each("topics", &req.topics, TopicPattern::parse)?;
    if !req.last_error.is_empty() && !req.dead_letters {
        return Err(invalid(InvalidField::new("last_error", "selects dead letters: give dead_letters too")));
    }
    Ok(ReplayPlan {
        consumer,
        filter: ReplayFilter {
            message_ids,
            dead_only: req.dead_letters,
            enqueued_after,
            enqueued_before,
            types: req.types,
            last_error: (!req.last_error.is_empty()).then_some(req.last_error),
        },
        topics,
        dry_run: req.dry_run,
        allow_beyond_retention: req.allow_beyond_retention,
        max_per_second: req.max_per_second,
    })
}

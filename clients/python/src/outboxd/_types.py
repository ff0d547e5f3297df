"""The admin API's answers as typed, frozen dataclasses with a readable `repr`, converted from
the protobuf messages at the boundary: durations are `timedelta`s, instants timezone-aware UTC
`datetime`s (None when unset), repeated fields tuples, enums `IntEnum`s (equal to the wire's
numbers, so `c.start_from == pb.admin.Consumer.EARLIEST` holds too). Each answer keeps the
message it came from in `raw` (not in its `repr`, not compared), for whatever the proto has
that these do not show."""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from google.protobuf import duration_pb2

from outboxd._convert import duration, from_timestamp
from outboxd._proto.outbox.v1 import admin_pb2 as pb

SinkKind = Literal["rabbitmq", "nats", "webhook"]


class StartFrom(enum.IntEnum):
    """Where a new consumer starts: NEW (messages enqueued from its creation on) or EARLIEST
    (every message retained)."""

    NEW = 0
    EARLIEST = 1

    def __repr__(self) -> str:
        return f"StartFrom.{self.name}"


class DeadKeyPolicy(enum.IntEnum):
    """What a consumer does with an ordering key when one of its messages dead-letters: SKIP
    (UNSPECIFIED, the default, means the same) delivers the key's next message and leaves the
    dead one behind; HOLD holds the key, its later messages waiting until the dead one is
    replayed and acked or the key is released (`release_key`)."""

    UNSPECIFIED = 0
    SKIP = 1
    HOLD = 2

    def __repr__(self) -> str:
        return f"DeadKeyPolicy.{self.name}"


class DeliveryStatus(enum.IntEnum):
    """The state of a message's delivery to one consumer."""

    PENDING = 0
    LEASED = 1
    ACKED = 2
    DEAD = 3

    def __repr__(self) -> str:
        return f"DeliveryStatus.{self.name}"


_E = TypeVar("_E", bound=enum.IntEnum)


def _enum(cls: type[_E], value: int) -> _E | int:
    try:
        return cls(value)
    except ValueError:  # a value newer than this client: kept as the number
        return value


def _duration(d: duration_pb2.Duration, present: bool) -> dt.timedelta | None:
    if not present:
        return None
    return dt.timedelta(seconds=d.seconds, microseconds=d.nanos // 1000)


@dataclass(frozen=True)
class Sink:
    """Where outboxd delivers a consumer itself instead of to Subscribe streams: `kind` is
    "rabbitmq" (`url`, `exchange`, `routing_key`), "nats" (`url`, `subject`) or "webhook"
    (`url`, `secret`, `timeout`); `max_in_flight` bounds the deliveries under way (0: the
    server's default). outboxd answers with a webhook's secret as "***"."""

    kind: SinkKind
    url: str
    exchange: str = ""
    routing_key: str = ""
    subject: str = ""
    secret: str = ""
    timeout: dt.timedelta | None = None
    max_in_flight: int = 0

    def to_pb(self) -> pb.Sink:
        s = pb.Sink(max_in_flight=self.max_in_flight)
        if self.kind == "rabbitmq":
            s.rabbitmq.CopyFrom(pb.RabbitMqSink(url=self.url, exchange=self.exchange, routing_key=self.routing_key))
        elif self.kind == "nats":
            s.nats.CopyFrom(pb.NatsSink(url=self.url, subject=self.subject))
        elif self.kind == "webhook":
            s.webhook.CopyFrom(pb.WebhookSink(url=self.url, secret=self.secret))
            if self.timeout is not None:
                s.webhook.timeout.CopyFrom(duration(self.timeout, "sink.timeout"))
        else:
            raise ValueError(f"sink.kind must be 'rabbitmq', 'nats' or 'webhook', got {self.kind!r}")
        return s

    @classmethod
    def from_pb(cls, s: pb.Sink) -> Sink | None:
        which = s.WhichOneof("target")
        if which == "rabbitmq":
            r = s.rabbitmq
            return cls("rabbitmq", r.url, exchange=r.exchange, routing_key=r.routing_key, max_in_flight=s.max_in_flight)
        if which == "nats":
            return cls("nats", s.nats.url, subject=s.nats.subject, max_in_flight=s.max_in_flight)
        if which == "webhook":
            w = s.webhook
            return cls("webhook", w.url, secret=w.secret, timeout=_duration(w.timeout, w.HasField("timeout")),
                       max_in_flight=s.max_in_flight)
        return None


@dataclass(frozen=True)
class Consumer:
    """A durable consumer: its topics (names or patterns), retry policy and ack deadline, and
    what happens to an ordering key when one of its messages dead-letters (`dead_key_policy`)."""

    name: str
    topics: tuple[str, ...]
    max_deliveries: int
    backoff_base: dt.timedelta | None
    backoff_max: dt.timedelta | None
    ack_deadline: dt.timedelta | None
    paused: bool
    start_from: StartFrom | int
    created_at: dt.datetime | None
    sink: Sink | None
    dead_key_policy: DeadKeyPolicy | int
    raw: pb.Consumer = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, c: pb.Consumer) -> Consumer:
        return cls(
            name=c.name, topics=tuple(c.topics), max_deliveries=c.max_deliveries,
            backoff_base=_duration(c.backoff_base, c.HasField("backoff_base")),
            backoff_max=_duration(c.backoff_max, c.HasField("backoff_max")),
            ack_deadline=_duration(c.ack_deadline, c.HasField("ack_deadline")),
            paused=c.paused, start_from=_enum(StartFrom, c.start_from),
            created_at=from_timestamp(c.created_at, c.HasField("created_at")),
            sink=Sink.from_pb(c.sink) if c.HasField("sink") else None,
            dead_key_policy=_enum(DeadKeyPolicy, c.dead_key_policy), raw=c,
        )


@dataclass(frozen=True)
class ConsumerStats:
    """One consumer's counts: `backlog` (due, not yet delivered), `in_flight` (leased),
    `retrying` (nacked, waiting for their backoff), `dead`, `acked`; the age of its oldest
    unacked message, whether it is paused, its open streams, its sink's kind ("" if none), and
    the ordering keys it holds after a dead letter (`held_keys`, DeadKeyPolicy.HOLD)."""

    consumer: str
    backlog: int
    in_flight: int
    retrying: int
    dead: int
    oldest_unacked_age: dt.timedelta | None
    acked: int
    paused: bool
    streams: int
    sink: str
    held_keys: int
    raw: pb.ConsumerStats = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, c: pb.ConsumerStats) -> ConsumerStats:
        return cls(
            consumer=c.consumer, backlog=c.backlog, in_flight=c.in_flight, retrying=c.retrying, dead=c.dead,
            oldest_unacked_age=_duration(c.oldest_unacked_age, c.HasField("oldest_unacked_age")),
            acked=c.acked, paused=c.paused, streams=c.streams, sink=c.sink, held_keys=c.held_keys, raw=c,
        )


@dataclass(frozen=True)
class TableStats:
    """One of outboxd's tables: live and dead rows, bytes, and its last vacuum (PostgreSQL)."""

    table: str
    live_rows: int
    dead_rows: int
    bytes: int
    last_vacuum: dt.datetime | None
    raw: pb.TableStats = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, t: pb.TableStats) -> TableStats:
        return cls(table=t.table, live_rows=t.live_rows, dead_rows=t.dead_rows, bytes=t.bytes,
                   last_vacuum=from_timestamp(t.last_vacuum, t.HasField("last_vacuum")), raw=t)


@dataclass(frozen=True)
class VacuumHorizon:
    """What holds back PostgreSQL's vacuum of outboxd's tables: `kind` is "transaction" (a
    session's snapshot), "replication_slot" or "prepared_transaction"; `age` how long it has
    held the horizon (None for a slot), `xmin_age` the transactions committed since its
    snapshot; the session's `pid`, `application_name` and `state`, or the slot's or prepared
    transaction's `name`."""

    kind: str
    age: dt.timedelta | None
    xmin_age: int
    pid: int
    application_name: str
    state: str
    name: str
    raw: pb.VacuumHorizon = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, v: pb.VacuumHorizon) -> VacuumHorizon:
        return cls(kind=v.kind, age=_duration(v.age, v.HasField("age")), xmin_age=v.xmin_age, pid=v.pid,
                   application_name=v.application_name, state=v.state, name=v.name, raw=v)


@dataclass(frozen=True)
class Stats:
    """`get_stats`: messages not yet relayed and the age of the oldest, each consumer's counts
    (one consumer's when asked for one), outboxd's tables, and what holds back their vacuum
    (`vacuum_horizon`; None when nothing does, and on SQLite)."""

    unrelayed: int
    oldest_unrelayed_age: dt.timedelta | None
    consumers: tuple[ConsumerStats, ...]
    tables: tuple[TableStats, ...]
    vacuum_horizon: VacuumHorizon | None
    raw: pb.GetStatsResponse = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, s: pb.GetStatsResponse) -> Stats:
        return cls(
            unrelayed=s.unrelayed,
            oldest_unrelayed_age=_duration(s.oldest_unrelayed_age, s.HasField("oldest_unrelayed_age")),
            consumers=tuple(ConsumerStats.from_pb(c) for c in s.consumers),
            tables=tuple(TableStats.from_pb(t) for t in s.tables),
            vacuum_horizon=VacuumHorizon.from_pb(s.vacuum_horizon) if s.HasField("vacuum_horizon") else None,
            raw=s,
        )


@dataclass(frozen=True)
class Message:
    """A message as outboxd stores it; `relayed_at` is None until the relay has taken it. Its
    `repr` shows at most the first 64 bytes of the payload."""

    message_id: str
    seq: int
    topic: str
    type: str
    payload: bytes
    headers: dict[str, str]
    ordering_key: str | None
    enqueued_at: dt.datetime | None
    available_at: dt.datetime | None
    relayed_at: dt.datetime | None
    raw: pb.Message = field(repr=False, compare=False)

    def text(self) -> str:
        """The payload as UTF-8 text."""
        return self.payload.decode("utf-8")

    def __repr__(self) -> str:
        payload = repr(self.payload[:64]) + ("…" if len(self.payload) > 64 else "")
        return (f"Message(message_id={self.message_id!r}, seq={self.seq}, topic={self.topic!r}, type={self.type!r}, "
                f"payload={payload} ({len(self.payload)} bytes), headers={self.headers!r}, "
                f"ordering_key={self.ordering_key!r}, enqueued_at={self.enqueued_at!r}, "
                f"available_at={self.available_at!r}, relayed_at={self.relayed_at!r})")

    @classmethod
    def from_pb(cls, m: pb.Message) -> Message:
        return cls(
            message_id=m.message_id, seq=m.seq, topic=m.topic, type=m.type, payload=m.payload,
            headers=dict(m.headers), ordering_key=m.ordering_key or None,
            enqueued_at=from_timestamp(m.enqueued_at, m.HasField("enqueued_at")),
            available_at=from_timestamp(m.available_at, m.HasField("available_at")),
            relayed_at=from_timestamp(m.relayed_at, m.HasField("relayed_at")), raw=m,
        )


@dataclass(frozen=True)
class DeadLetter:
    """A message that exhausted its deliveries to `consumer`, with the last error."""

    message: Message
    consumer: str
    delivery_count: int
    last_error: str
    dead_at: dt.datetime | None
    raw: pb.DeadLetter = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, d: pb.DeadLetter) -> DeadLetter:
        return cls(message=Message.from_pb(d.message), consumer=d.consumer, delivery_count=d.delivery_count,
                   last_error=d.last_error, dead_at=from_timestamp(d.dead_at, d.HasField("dead_at")), raw=d)


@dataclass(frozen=True)
class DeadLetterPage:
    """One page of `list_dead_letters`; `next_page_token` is "" on the last."""

    dead_letters: tuple[DeadLetter, ...]
    next_page_token: str
    raw: pb.ListDeadLettersResponse = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, p: pb.ListDeadLettersResponse) -> DeadLetterPage:
        return cls(dead_letters=tuple(DeadLetter.from_pb(d) for d in p.dead_letters),
                   next_page_token=p.next_page_token, raw=p)


@dataclass(frozen=True)
class HeldKey:
    """An ordering key a consumer with DeadKeyPolicy.HOLD holds: the dead message that holds it
    (`message_id`) and its last error, the key's messages `waiting` behind it (counted up to
    100,000), and when it was held."""

    ordering_key: str
    message_id: str
    last_error: str
    waiting: int
    held_at: dt.datetime | None
    raw: pb.HeldKey = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, k: pb.HeldKey) -> HeldKey:
        return cls(ordering_key=k.ordering_key, message_id=k.message_id, last_error=k.last_error,
                   waiting=k.waiting, held_at=from_timestamp(k.held_at, k.HasField("held_at")), raw=k)


@dataclass(frozen=True)
class HeldKeys:
    """`list_held_keys`: the held keys, oldest first, at most 1000; `truncated` when more are
    held."""

    keys: tuple[HeldKey, ...]
    truncated: bool
    raw: pb.ListHeldKeysResponse = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, r: pb.ListHeldKeysResponse) -> HeldKeys:
        return cls(keys=tuple(HeldKey.from_pb(k) for k in r.keys), truncated=r.truncated, raw=r)


@dataclass(frozen=True)
class DeliveryState:
    """A message's delivery to one consumer: its `state`, attempts, and when it changed."""

    consumer: str
    state: DeliveryStatus | int
    delivery_count: int
    available_at: dt.datetime | None
    lease_expires_at: dt.datetime | None
    last_error: str
    created_at: dt.datetime | None
    updated_at: dt.datetime | None
    acked_at: dt.datetime | None
    dead_at: dt.datetime | None
    raw: pb.DeliveryState = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, d: pb.DeliveryState) -> DeliveryState:
        return cls(
            consumer=d.consumer, state=_enum(DeliveryStatus, d.state), delivery_count=d.delivery_count,
            available_at=from_timestamp(d.available_at, d.HasField("available_at")),
            lease_expires_at=from_timestamp(d.lease_expires_at, d.HasField("lease_expires_at")),
            last_error=d.last_error,
            created_at=from_timestamp(d.created_at, d.HasField("created_at")),
            updated_at=from_timestamp(d.updated_at, d.HasField("updated_at")),
            acked_at=from_timestamp(d.acked_at, d.HasField("acked_at")),
            dead_at=from_timestamp(d.dead_at, d.HasField("dead_at")), raw=d,
        )


@dataclass(frozen=True)
class MessageInfo:
    """`get_message`: the message and its delivery to each consumer."""

    message: Message
    deliveries: tuple[DeliveryState, ...]
    raw: pb.GetMessageResponse = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, r: pb.GetMessageResponse) -> MessageInfo:
        return cls(message=Message.from_pb(r.message),
                   deliveries=tuple(DeliveryState.from_pb(d) for d in r.deliveries), raw=r)


@dataclass(frozen=True)
class ReplayResult:
    """`replay`: how many deliveries were selected and made due again (`replayed`), how many
    of them were past the dedup horizon, and whether it was a dry run."""

    replayed: int
    dry_run: bool
    beyond_retention: int
    selected: int
    raw: pb.ReplayResponse = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, r: pb.ReplayResponse) -> ReplayResult:
        return cls(replayed=r.replayed, dry_run=r.dry_run, beyond_retention=r.beyond_retention,
                   selected=r.selected, raw=r)


@dataclass(frozen=True)
class ReplayProgress:
    """One step of `replay_stream`; the last has `done=True`."""

    selected: int
    replayed: int
    beyond_retention: int
    dry_run: bool
    done: bool
    raw: pb.ReplayProgress = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, p: pb.ReplayProgress) -> ReplayProgress:
        return cls(selected=p.selected, replayed=p.replayed, beyond_retention=p.beyond_retention,
                   dry_run=p.dry_run, done=p.done, raw=p)


@dataclass(frozen=True)
class PruneResult:
    """`prune`: the messages and delivery rows deleted."""

    messages_deleted: int
    deliveries_deleted: int
    raw: pb.PruneResponse = field(repr=False, compare=False)

    @classmethod
    def from_pb(cls, p: pb.PruneResponse) -> PruneResult:
        return cls(messages_deleted=p.messages_deleted, deliveries_deleted=p.deliveries_deleted, raw=p)

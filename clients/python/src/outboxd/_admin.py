"""The admin API (`outbox.v1.OutboxAdmin`), one method per RPC, for asyncio code and for plain
synchronous code alike. Answers are the typed dataclasses of `_types`, converted here."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypedDict, TypeVar, Unpack

import grpc.aio

from outboxd._connection import StrPath, TLSOption, Token, open_channel, parse_target
from outboxd._convert import Seconds, duration, timestamp
from outboxd._proto.outbox.v1 import admin_pb2 as pb
from outboxd._proto.outbox.v1 import admin_pb2_grpc as pb_grpc
from outboxd._types import (
    Consumer,
    DeadKeyPolicy as DeadKeyPolicyEnum,
    DeadLetter,
    DeadLetterPage,
    HeldKey,
    HeldKeys,
    Message,
    MessageInfo,
    PruneResult,
    ReplayProgress,
    ReplayResult,
    Sink,
    StartFrom as StartFromEnum,
    Stats,
)

StartFrom = Literal["new", "earliest"]
DeadKeyPolicy = Literal["skip", "hold"]


class ReplaySelection(TypedDict, total=False):
    """What `replay` and `replay_stream` select: `message_ids` (alone), or `dead_letters`
    and/or `enqueued_after` (inclusive) .. `enqueued_before` (exclusive); `types` and `topics`
    (names or patterns) narrow it. `dry_run` counts without changing anything;
    `allow_beyond_retention` replays messages past the dedup horizon (they may take effect
    twice); `max_per_second` paces it (0: the server's `--replay-rate`)."""

    message_ids: Iterable[str]
    dead_letters: bool
    enqueued_after: dt.datetime
    enqueued_before: dt.datetime
    types: Iterable[str]
    topics: Iterable[str]
    dry_run: bool
    allow_beyond_retention: bool
    max_per_second: int

_START_FROM = {"new": pb.Consumer.NEW, "earliest": pb.Consumer.EARLIEST}
_DEAD_KEY_POLICY = {"skip": pb.DEAD_KEY_POLICY_SKIP, "hold": pb.DEAD_KEY_POLICY_HOLD}

_F = TypeVar("_F", bound=Callable[..., Coroutine[Any, Any, Any]])

if TYPE_CHECKING:
    # Type checkers see the asyncio signatures; synchronous callers get the awaited value.
    def _either(fn: _F) -> _F: ...
else:

    def _either(fn):
        """In a running event loop, the coroutine (await it); with none (plain synchronous code),
        the result: the call runs on the client's own event-loop thread, and waits for it."""

        @functools.wraps(fn)
        def call(self, *args, **kwargs):
            coro = fn(self, *args, **kwargs)
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return self._run_sync(coro)
            return coro

        return call


class AdminClient:
    """Consumers, stats, dead letters, held keys, messages, replay, prune and tail, over gRPC.

    `server`, `tls`, `token` and `token_file` are as for `Subscriber`. In asyncio code every
    method is a coroutine (await it), and the streaming RPCs (`tail`, `replay_stream`,
    `dead_letters`) are async iterators. From plain synchronous code (no running event loop) the
    unary methods return their result directly: they run on the client's own event-loop thread.
    A client is used in one of the two ways, not both. Failures raise `grpc.aio.AioRpcError`
    with outboxd's status. Unary calls give up after `timeout` seconds (None: never), except
    `replay`, which takes as long as the replay does. The channel opens at the first call;
    `close()` it, or use `async with` (or `with`, from synchronous code).
    """

    def __init__(
        self,
        server: str,
        token: str | None = None,
        tls: TLSOption = None,
        *,
        token_file: StrPath | None = None,
        timeout: float | None = 30.0,
    ) -> None:
        self._target = parse_target(server, tls)
        self._token = Token(token, token_file)
        self._token.metadata()
        self._timeout = timeout
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.OutboxAdminAsyncStub | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def _rpc(self) -> tuple[pb_grpc.OutboxAdminAsyncStub, tuple[tuple[str, str], ...]]:
        if self._stub is None:
            self._channel = open_channel(self._target)
            self._stub = pb_grpc.OutboxAdminStub(self._channel)
        assert self._stub is not None
        return self._stub, self._token.metadata()

    @_either
    async def close(self) -> None:
        await self._close()

    async def _close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = None
        self._stub = None

    def _run_sync(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Runs `coro` on this client's event-loop thread (started at the first synchronous call)
        and returns its result: the channel then lives on that loop."""
        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="outboxd-admin", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
        try:
            return asyncio.run_coroutine_threadsafe(coro, self._loop).result()
        finally:
            if self._channel is None and self._loop is not None:
                # Closed: the thread is not needed any more.
                self._loop.call_soon_threadsafe(self._loop.stop)
                if self._thread is not None:
                    self._thread.join()
                self._loop.close()
                self._loop, self._thread = None, None

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        self._run_sync(self._close())

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None,
    ) -> None:
        await self._close()

    # Consumers

    @_either
    async def create_consumer(
        self,
        name: str,
        topics: Iterable[str],
        *,
        max_deliveries: int = 0,
        backoff_base: Seconds | None = None,
        backoff_max: Seconds | None = None,
        ack_deadline: Seconds | None = None,
        start_from: StartFrom | StartFromEnum = "new",
        paused: bool = False,
        sink: Sink | pb.Sink | None = None,
        dead_key_policy: DeadKeyPolicy | DeadKeyPolicyEnum = "skip",
    ) -> Consumer:
        """Creates a durable consumer; creating it again with the same definition returns it,
        a different definition is ALREADY_EXISTS. Zero and None mean the server's defaults
        (10 deliveries, backoff 1 s to 5 min, ack deadline 30 s). `sink` makes outboxd deliver
        the consumer itself (an `outboxd.Sink`, or a `pb.admin.Sink`; see the proto).
        `dead_key_policy="hold"` holds an ordering key when a message of it dead-letters: the
        key's later messages wait until the dead one is replayed and acked, or the key is
        released (`list_held_keys`, `release_key`); "skip", the default, delivers them."""
        if isinstance(start_from, StartFromEnum):
            start_from = "earliest" if start_from == StartFromEnum.EARLIEST else "new"
        if start_from not in _START_FROM:
            raise ValueError(f"start_from must be 'new' or 'earliest', got {start_from!r}")
        if isinstance(dead_key_policy, DeadKeyPolicyEnum):
            dead_key_policy = "hold" if dead_key_policy == DeadKeyPolicyEnum.HOLD else "skip"
        if dead_key_policy not in _DEAD_KEY_POLICY:
            raise ValueError(f"dead_key_policy must be 'skip' or 'hold', got {dead_key_policy!r}")
        if isinstance(topics, str):
            raise TypeError("topics must be a list of topics or patterns, not one string")
        c = pb.Consumer(name=name, topics=list(topics), max_deliveries=max_deliveries, paused=paused,
                        start_from=_START_FROM[start_from], dead_key_policy=_DEAD_KEY_POLICY[dead_key_policy])
        if backoff_base is not None:
            c.backoff_base.CopyFrom(duration(backoff_base, "backoff_base"))
        if backoff_max is not None:
            c.backoff_max.CopyFrom(duration(backoff_max, "backoff_max"))
        if ack_deadline is not None:
            c.ack_deadline.CopyFrom(duration(ack_deadline, "ack_deadline"))
        if sink is not None:
            c.sink.CopyFrom(sink.to_pb() if isinstance(sink, Sink) else sink)
        stub, md = self._rpc()
        resp = await stub.CreateConsumer(pb.CreateConsumerRequest(consumer=c), metadata=md, timeout=self._timeout)
        return Consumer.from_pb(resp.consumer)

    @_either
    async def get_consumer(self, name: str) -> Consumer:
        stub, md = self._rpc()
        resp = await stub.GetConsumer(pb.GetConsumerRequest(consumer=_name(name)), metadata=md, timeout=self._timeout)
        return Consumer.from_pb(resp.consumer)

    @_either
    async def list_consumers(self) -> list[Consumer]:
        stub, md = self._rpc()
        resp = await stub.ListConsumers(pb.ListConsumersRequest(), metadata=md, timeout=self._timeout)
        return [Consumer.from_pb(c) for c in resp.consumers]

    @_either
    async def delete_consumer(self, name: str) -> None:
        """Deletes a consumer and its deliveries."""
        stub, md = self._rpc()
        await stub.DeleteConsumer(pb.DeleteConsumerRequest(consumer=_name(name)), metadata=md, timeout=self._timeout)

    @_either
    async def pause_consumer(self, name: str) -> Consumer:
        stub, md = self._rpc()
        resp = await stub.PauseConsumer(pb.PauseConsumerRequest(consumer=_name(name)), metadata=md,
                                        timeout=self._timeout)
        return Consumer.from_pb(resp.consumer)

    @_either
    async def resume_consumer(self, name: str) -> Consumer:
        stub, md = self._rpc()
        resp = await stub.ResumeConsumer(pb.ResumeConsumerRequest(consumer=_name(name)), metadata=md,
                                         timeout=self._timeout)
        return Consumer.from_pb(resp.consumer)

    # Watching

    @_either
    async def get_stats(self, consumer: str | None = None) -> Stats:
        """Unrelayed messages and per consumer backlog, in flight, retrying, dead, acked; only
        `consumer`'s when given."""
        if consumer is not None and not isinstance(consumer, str):
            raise TypeError(f"consumer: expected a consumer name (str) or None, got {type(consumer).__name__}")
        stub, md = self._rpc()
        resp = await stub.GetStats(pb.GetStatsRequest(consumer=consumer or ""), metadata=md, timeout=self._timeout)
        return Stats.from_pb(resp)

    @_either
    async def list_dead_letters(
        self, consumer: str, *, page_size: int = 0, page_token: str = "",
    ) -> DeadLetterPage:
        """One page (`page_size` at most 1000; 0 means 100); `next_page_token` is empty on the
        last. `dead_letters()` walks every page."""
        stub, md = self._rpc()
        req = pb.ListDeadLettersRequest(consumer=_name(consumer), page_size=page_size, page_token=page_token)
        return DeadLetterPage.from_pb(await stub.ListDeadLetters(req, metadata=md, timeout=self._timeout))

    async def dead_letters(self, consumer: str, *, page_size: int = 0) -> AsyncIterator[DeadLetter]:
        """Every dead letter of `consumer`, page by page."""
        token = ""
        while True:
            page = await self.list_dead_letters(consumer, page_size=page_size, page_token=token)
            for d in page.dead_letters:
                yield d
            token = page.next_page_token
            if not token:
                return

    @_either
    async def get_message(self, message_id: str) -> MessageInfo:
        """A message with its delivery row per consumer."""
        stub, md = self._rpc()
        resp = await stub.GetMessage(pb.GetMessageRequest(message_id=str(message_id)), metadata=md,
                                     timeout=self._timeout)
        return MessageInfo.from_pb(resp)

    async def tail(self, topics: Iterable[str] | None = None) -> AsyncIterator[Message]:
        """Messages as they commit (best effort, consuming nothing), until the caller stops
        iterating."""
        stub, md = self._rpc()
        call = stub.Tail(pb.TailRequest(topics=list(topics or [])), metadata=md)
        try:
            async for m in call:
                yield Message.from_pb(m)
        finally:
            call.cancel()

    # Held keys

    @_either
    async def list_held_keys(self, consumer: str) -> HeldKeys:
        """The ordering keys `consumer` (DeadKeyPolicy.HOLD) holds because a message of the key
        dead-lettered, oldest first, at most 1000 (`truncated` when more are held): the dead
        message, its last error and how many of the key's messages wait behind it."""
        stub, md = self._rpc()
        resp = await stub.ListHeldKeys(pb.ListHeldKeysRequest(consumer=_name(consumer)), metadata=md,
                                       timeout=self._timeout)
        return HeldKeys.from_pb(resp)

    @_either
    async def release_key(self, consumer: str, ordering_key: str, *, skip_dead: bool = False) -> HeldKey:
        """Lets a held key flow again and returns it as it was held; NOT_FOUND when `consumer`
        does not hold it. The dead message is delivered again first (as a replay of it would)
        and the waiting ones in order once it is acked; with `skip_dead` it stays a dead letter
        and the waiting ones go. Needs replay:CONSUMER."""
        if not isinstance(ordering_key, str):
            raise TypeError(f"ordering_key: expected a str, got {type(ordering_key).__name__}")
        stub, md = self._rpc()
        req = pb.ReleaseKeyRequest(consumer=_name(consumer), ordering_key=ordering_key, skip_dead=skip_dead)
        resp = await stub.ReleaseKey(req, metadata=md, timeout=self._timeout)
        return HeldKey.from_pb(resp.key)

    # Replay and prune

    @_either
    async def replay(
        self, consumer: str, *, timeout: float | None = None, **selection: Unpack[ReplaySelection],
    ) -> ReplayResult:
        """Makes deliveries due again for `consumer`, bypassing its inbox: by `message_ids`
        (alone), or by `dead_letters` and/or the enqueue-time range, narrowed by `types` and
        `topics` (see `ReplaySelection`). Returns when done, with how many were replayed."""
        stub, md = self._rpc()
        return ReplayResult.from_pb(await stub.Replay(_replay_request(consumer, selection), metadata=md,
                                                      timeout=timeout))

    async def replay_stream(
        self, consumer: str, **selection: Unpack[ReplaySelection],
    ) -> AsyncIterator[ReplayProgress]:
        """`replay` with progress after the count and after each batch, the last with
        `done=True`. Leaving the iteration early stops the replay after the current batch."""
        stub, md = self._rpc()
        call = stub.ReplayStream(_replay_request(consumer, selection), metadata=md)
        try:
            async for p in call:
                yield ReplayProgress.from_pb(p)
        finally:
            call.cancel()

    @_either
    async def prune(self, older_than: Seconds | None = None) -> PruneResult:
        """Deletes relayed, fully acked messages older than `older_than` (default: the server's
        retention, 7 days unless configured)."""
        req = pb.PruneRequest()
        if older_than is not None:
            req.older_than.CopyFrom(duration(older_than, "older_than"))
        stub, md = self._rpc()
        return PruneResult.from_pb(await stub.Prune(req, metadata=md, timeout=self._timeout))


def _name(name: str) -> str:
    """A consumer's name, refused before the call when it is not a string (a dict or a list
    would otherwise reach protobuf, or the server, as something else)."""
    if not isinstance(name, str):
        raise TypeError(f"expected a consumer name (str), got {type(name).__name__}")
    return name


def _replay_request(consumer: str, sel: ReplaySelection) -> pb.ReplayRequest:
    req = pb.ReplayRequest(
        consumer=consumer, message_ids=[str(i) for i in sel.get("message_ids", [])],
        dead_letters=sel.get("dead_letters", False), dry_run=sel.get("dry_run", False),
        allow_beyond_retention=sel.get("allow_beyond_retention", False), types=list(sel.get("types", [])),
        topics=list(sel.get("topics", [])), max_per_second=sel.get("max_per_second", 0),
    )
    if (after := sel.get("enqueued_after")) is not None:
        req.enqueued_after.CopyFrom(timestamp(after, "enqueued_after"))
    if (before := sel.get("enqueued_before")) is not None:
        req.enqueued_before.CopyFrom(timestamp(before, "enqueued_before"))
    return req

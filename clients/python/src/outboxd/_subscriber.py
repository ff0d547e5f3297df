"""The asyncio Subscriber: one `Subscribe` stream, a handler per delivery.

A handler that returns acks its delivery; one that raises nacks it with the error's text (the
delivery is retried after the consumer's backoff, dead after `max_deliveries`). At most
`concurrency` handlers run at once, and the stream asks the server for no more than that
(`max_in_flight`). A handler that outlasts its lease has it extended, by the lease's length,
every half lease. Acks are batched: sent when `ack_batch_size` ids are waiting or `ack_interval`
after the first of them, whichever comes first. A lost stream is re-opened with exponential
backoff and jitter; errors that retrying cannot fix end `run()`.

Stopping (`stop()`, or cancelling the task that awaits `run()`): no new handler starts; running
handlers finish and their acks are sent; then the client half-closes the stream, and outboxd
releases what it had sent but the client never started, for immediate redelivery, without
counting it as a failed attempt.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import grpc
import grpc.aio

from outboxd import _trace
from outboxd._connection import StrPath, TLSOption, Token, open_channel, parse_target
from outboxd._convert import Seconds, duration, from_timestamp, seconds
from outboxd._proto.outbox.v1 import outbox_pb2 as pb
from outboxd._proto.outbox.v1 import outbox_pb2_grpc as pb_grpc

log = logging.getLogger("outboxd.subscriber")

# The server's limits (docs/configuration.md, "Message limits" and "Resource limits"): max_in_flight per stream, ids per request, error text.
MAX_IN_FLIGHT = 10_000
MAX_IDS_PER_REQUEST = 10_000
MAX_ERROR_BYTES = 4096
MIN_ACK_DEADLINE = 0.1
MAX_ACK_DEADLINE = 24 * 3600.0
# When a delivery's deadline is already past by the local clock (a clock behind the server's),
# extend often: every half second, by a second.
FALLBACK_LEASE = 1.0

PERMANENT = frozenset({
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
})
"""Status codes that end `run()`: an unknown consumer, missing rights, a bad request, a sink
consumer. Everything else (UNAVAILABLE, a broken stream, RESOURCE_EXHAUSTED, ...) is retried."""


@dataclass(frozen=True)
class Delivery:
    """One delivery handed to a handler."""

    consumer: str
    message_id: str
    """The message's UUID, lowercase and hyphenated as on the wire."""
    seq: int
    topic: str
    type: str
    payload: bytes
    headers: Mapping[str, str]
    ordering_key: str | None
    enqueued_at: dt.datetime | None
    delivery_count: int
    """1 on the first delivery to this consumer."""
    ack_deadline: dt.datetime | None
    """Acked (or extended, which the Subscriber does) before this instant, or delivered again."""

    def text(self) -> str:
        """The payload as UTF-8 text."""
        return self.payload.decode("utf-8")

    @classmethod
    def _from_pb(cls, consumer: str, d: pb.Delivery) -> Delivery:
        return cls(
            consumer=consumer,
            message_id=d.message_id,
            seq=d.seq,
            topic=d.topic,
            type=d.type,
            payload=d.payload,
            headers=dict(d.headers),
            ordering_key=d.ordering_key or None,
            enqueued_at=from_timestamp(d.enqueued_at, d.HasField("enqueued_at")),
            delivery_count=d.delivery_count,
            ack_deadline=from_timestamp(d.ack_deadline, d.HasField("ack_deadline")),
        )


Handler = Callable[[Delivery], Awaitable[Any]]


def error_text(exc: BaseException) -> str:
    """The nack's error: the exception's text (its class name when that is empty), cut to what
    the server keeps, at a character boundary."""
    text = str(exc) or type(exc).__name__
    raw = text.encode("utf-8")
    if len(raw) <= MAX_ERROR_BYTES:
        return text
    return raw[:MAX_ERROR_BYTES].decode("utf-8", "ignore")


class _End(Enum):
    STOPPED = "stopped"
    SERVER_CLOSED = "server closed"


def _req(**kw: Any) -> pb.SubscribeRequest:
    return pb.SubscribeRequest(**kw)


class _Requests:
    """The one writer of a stream (a gRPC stream takes one write at a time): nacks and extends
    as they come, acks in batches."""

    def __init__(self, call: grpc.aio.StreamStreamCall[pb.SubscribeRequest, pb.SubscribeResponse],
                 batch: int, interval: float) -> None:
        self._call = call
        self._batch = batch
        self._interval = interval
        self._acks: list[str] = []
        self._first_ack_at = 0.0
        self._others: deque[pb.SubscribeRequest] = deque()
        self._wake = asyncio.Event()
        self._closing = False
        self.broken = False
        self._task = asyncio.create_task(self._run(), name="outboxd-subscriber-writer")

    def ack(self, message_id: str) -> None:
        self._acks.append(message_id)
        if len(self._acks) == 1:
            self._first_ack_at = asyncio.get_running_loop().time()
            self._wake.set()
        elif len(self._acks) >= self._batch:
            self._wake.set()

    def nack(self, message_id: str, error: str) -> None:
        self._others.append(_req(nack=pb.Nack(message_id=message_id, error=error)))
        self._wake.set()

    def extend(self, message_id: str, lease: float) -> None:
        self._others.append(_req(extend=pb.Extend(message_ids=[message_id], deadline=duration(lease, "lease"))))
        self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not self._acks and not self._others:
                    if self._closing:
                        return
                    await self._wake.wait()
                    self._wake.clear()
                    continue
                while self._others:
                    await self._call.write(self._others.popleft())
                if not self._acks:
                    continue
                wait = self._first_ack_at + self._interval - loop.time()
                if len(self._acks) < self._batch and not self._closing and wait > 0:
                    try:
                        await asyncio.wait_for(self._wake.wait(), wait)
                    except TimeoutError:
                        pass
                    self._wake.clear()
                    continue
                ids, self._acks = self._acks[:MAX_IDS_PER_REQUEST], self._acks[MAX_IDS_PER_REQUEST:]
                self._first_ack_at = loop.time()
                await self._call.write(_req(ack=pb.Ack(message_ids=ids)))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError) as e:
            # The stream is gone; what was not sent is redelivered (the reader reports why).
            self.broken = True
            log.debug("subscriber: write failed, %d acks and %d requests dropped: %s",
                      len(self._acks), len(self._others), e)

    async def close(self) -> None:
        """Sends everything queued, then half-closes the stream."""
        self._closing = True
        self._wake.set()
        await self._task
        if not self.broken:
            try:
                await self._call.done_writing()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                self.broken = True


class Subscriber:
    """Consumes `consumer` from the outboxd at `server` with `handler`, until `stop()`.

    `server` is `host:port` or `http://host:port` (plaintext) or `https://host:port` (TLS);
    `tls` is True (the system's roots), a `TLSConfig` or a dict with `ca`, `cert`, `key`
    (PEM file paths) and `server_name`; `token` (or `token_file`, re-read at every reconnect)
    is sent as `authorization: Bearer ...`.

    `concurrency` bounds the handlers running at once; `max_in_flight` (default: the same)
    bounds what the server sends ahead. `ack_deadline` overrides the consumer's for this stream.
    """

    def __init__(
        self,
        server: str,
        consumer: str,
        handler: Handler,
        *,
        concurrency: int = 16,
        token: str | None = None,
        token_file: StrPath | None = None,
        tls: TLSOption = None,
        max_in_flight: int | None = None,
        ack_deadline: Seconds | None = None,
        ack_batch_size: int | None = None,
        ack_interval: Seconds = 0.005,
        reconnect_min: Seconds = 0.1,
        reconnect_max: Seconds = 10.0,
    ) -> None:
        if not isinstance(consumer, str) or not consumer:
            raise ValueError("consumer must be a non-empty string")
        if not callable(handler):
            raise TypeError("handler must be an async function taking a Delivery")
        if not isinstance(concurrency, int) or not 1 <= concurrency <= MAX_IN_FLIGHT:
            raise ValueError(f"concurrency must be from 1 to {MAX_IN_FLIGHT}, got {concurrency!r}")
        in_flight = concurrency if max_in_flight is None else max_in_flight
        if not isinstance(in_flight, int) or not 1 <= in_flight <= MAX_IN_FLIGHT:
            raise ValueError(f"max_in_flight must be from 1 to {MAX_IN_FLIGHT}, got {max_in_flight!r}")
        if ack_deadline is not None and not MIN_ACK_DEADLINE <= seconds(ack_deadline, "ack_deadline") <= MAX_ACK_DEADLINE:
            raise ValueError(f"ack_deadline must be from {MIN_ACK_DEADLINE} s to 24 h, got {ack_deadline!r}")
        # Half the window: the server refills one half while the other is being handled.
        batch = ack_batch_size if ack_batch_size is not None else max(1, in_flight // 2)
        if not isinstance(batch, int) or not 1 <= batch <= MAX_IDS_PER_REQUEST:
            raise ValueError(f"ack_batch_size must be from 1 to {MAX_IDS_PER_REQUEST}, got {ack_batch_size!r}")
        self._target = parse_target(server, tls)
        self._token = Token(token, token_file)
        self._token.metadata()  # a bad token fails here, not at the first connect
        self._server = server
        self.consumer = consumer
        self._handler = handler
        self.concurrency = concurrency
        self.max_in_flight = in_flight
        self._ack_deadline = None if ack_deadline is None else seconds(ack_deadline, "ack_deadline")
        self._batch = batch
        self._interval = seconds(ack_interval, "ack_interval")
        self._reconnect_min = max(0.001, seconds(reconnect_min, "reconnect_min"))
        self._reconnect_max = max(self._reconnect_min, seconds(reconnect_max, "reconnect_max"))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stop_requested = False
        self._started = False

    def stop(self) -> None:
        """Stops gracefully: `run()` returns once running handlers have finished and their acks
        are sent. Safe to call from any thread, and before `run()` (which then returns at once)."""
        self._stop_requested = True
        loop, event = self._loop, self._stop
        if loop is None or event is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            event.set()
        else:
            loop.call_soon_threadsafe(event.set)

    async def run(self) -> None:
        """Consumes until `stop()` (then returns) or an error that retrying cannot fix (then
        raises `grpc.aio.AioRpcError`, or `ConfigError` for unreadable TLS or token files).
        Cancelling the task that awaits it stops the same way, then re-raises the cancellation."""
        if self._started:
            raise RuntimeError("a Subscriber runs once; create another")
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self._stop_requested:
            return
        permits = asyncio.Semaphore(self.concurrency)
        backoff = self._reconnect_min

        def established() -> None:
            nonlocal backoff
            backoff = self._reconnect_min

        while True:
            try:
                end = await self._session(permits, established)
                if end is _End.STOPPED:
                    return
                log.info("outboxd subscriber %s: the server ended the stream; reconnecting", self.consumer)
            except grpc.aio.AioRpcError as e:
                if e.code() in PERMANENT:
                    raise
                log.warning("outboxd subscriber %s: stream lost (%s: %s); reconnecting",
                            self.consumer, e.code().name, e.details())
            # Equal jitter: between half and all of the backoff, so that many clients of a
            # restarted server do not come back in step.
            delay = random.uniform(backoff / 2, backoff)
            try:
                await asyncio.wait_for(self._stop.wait(), delay)
                return
            except TimeoutError:
                pass
            backoff = min(backoff * 2, self._reconnect_max)

    async def _session(self, permits: asyncio.Semaphore, established: Callable[[], None]) -> _End:
        assert self._stop is not None
        channel = open_channel(self._target)
        handlers: set[asyncio.Task[None]] = set()
        call: grpc.aio.StreamStreamCall[pb.SubscribeRequest, pb.SubscribeResponse] | None = None
        requests: _Requests | None = None
        reader: asyncio.Task[_End] | None = None
        waits: list[asyncio.Future[Any]] = []
        try:
            stub = pb_grpc.OutboxStub(channel)
            call = stub.Subscribe(metadata=self._token.metadata())
            start = pb.Start(consumer=self.consumer, max_in_flight=self.max_in_flight)
            if self._ack_deadline is not None:
                start.ack_deadline.CopyFrom(duration(self._ack_deadline, "ack_deadline"))
            await call.write(_req(start=start))
            requests = _Requests(call, self._batch, self._interval)
            reader = asyncio.create_task(self._read(call, requests, permits, handlers, established))
            stop = asyncio.ensure_future(self._stop.wait())
            waits.append(stop)
            # The reader is never cancelled while the stream lives: cancelling a read cancels
            # the whole call, and the acks of running handlers still have to go out on it.
            await asyncio.wait({reader, stop}, return_when=asyncio.FIRST_COMPLETED)
            if stop.done():
                self._stop_requested = True
                return _End.STOPPED
            return reader.result()  # raises AioRpcError when the stream failed
        except asyncio.CancelledError:
            self._stop_requested = True
            log.info("outboxd subscriber %s: cancelled; stopping", self.consumer)
            raise
        finally:
            for w in waits:
                w.cancel()
            await self._finish(call, requests, reader, handlers)
            await channel.close()

    async def _read(
        self,
        call: grpc.aio.StreamStreamCall[pb.SubscribeRequest, pb.SubscribeResponse],
        requests: _Requests,
        permits: asyncio.Semaphore,
        handlers: set[asyncio.Task[None]],
        established: Callable[[], None],
    ) -> _End:
        """Reads deliveries and starts a handler for each, a permit each; once stopping, reads
        on until the server ends the stream, starting nothing (the server releases those)."""
        try:
            await call.initial_metadata()
        except grpc.aio.AioRpcError:
            pass  # read() below raises it with the status
        else:
            if not call.done():
                established()
                log.info("outboxd subscriber %s: subscribed to %s", self.consumer, self._server)
        while True:
            msg = await call.read()
            if not isinstance(msg, pb.SubscribeResponse):  # grpc.aio.EOF
                return _End.SERVER_CLOSED
            if self._stop_requested or not msg.HasField("delivery"):
                continue
            delivery = Delivery._from_pb(self.consumer, msg.delivery)
            await permits.acquire()
            if self._stop_requested:
                permits.release()
                continue
            task = asyncio.create_task(self._handle(delivery, requests, permits))
            handlers.add(task)
            task.add_done_callback(handlers.discard)

    async def _finish(
        self,
        call: grpc.aio.StreamStreamCall[pb.SubscribeRequest, pb.SubscribeResponse] | None,
        requests: _Requests | None,
        reader: asyncio.Task[_End] | None,
        handlers: set[asyncio.Task[None]],
    ) -> None:
        """Running handlers finish and their acks go out; then the half-close, and the server's
        end of the stream is awaited (bounded) so that it has applied everything sent."""
        while handlers:
            await asyncio.gather(*list(handlers), return_exceptions=True)
        if requests is not None:
            await requests.close()
        try:
            if reader is not None and requests is not None and not requests.broken:
                await asyncio.wait_for(asyncio.shield(reader), 5.0)
        except (TimeoutError, grpc.aio.AioRpcError, asyncio.InvalidStateError, asyncio.CancelledError):
            pass
        finally:
            if reader is not None and not reader.done():
                reader.cancel()
            if reader is not None and reader.done() and not reader.cancelled():
                reader.exception()  # retrieved: a broken stream was reported by the caller
            if call is not None:
                call.cancel()

    async def _handle(self, d: Delivery, requests: _Requests, permits: asyncio.Semaphore) -> None:
        keeper = _LeaseKeeper(d.message_id, self._lease_for(d), requests)
        try:
            attrs: dict[str, str | int] = {
                "messaging.message.id": d.message_id, "messaging.destination.name": d.topic,
                "outboxd.delivery_count": d.delivery_count,
            }
            with _trace.handling(self.consumer, attrs, d.headers):
                await self._handler(d)
        except Exception as e:
            log.warning("outboxd subscriber %s: the handler failed on %s (delivery %d); nacking",
                        self.consumer, d.message_id, d.delivery_count, exc_info=e)
            requests.nack(d.message_id, error_text(e))
        except asyncio.CancelledError as e:
            # The handler's own cancellation (a timeout of its own, say): a failed attempt.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            requests.nack(d.message_id, error_text(e) if str(e) else "handler cancelled")
        else:
            requests.ack(d.message_id)
        finally:
            keeper.cancel()
            permits.release()

    def _lease_for(self, d: Delivery) -> float:
        """The lease to keep: the stream's `ack_deadline` when given, else what is left of the
        delivery's by the local clock (so set `ack_deadline` where the clocks of client and
        server may disagree)."""
        lease = self._ack_deadline
        if lease is None:
            left = d.ack_deadline.timestamp() - time.time() if d.ack_deadline else 0.0
            lease = left if left >= MIN_ACK_DEADLINE else FALLBACK_LEASE
        return min(max(lease, MIN_ACK_DEADLINE), MAX_ACK_DEADLINE)


class _LeaseKeeper:
    """Extends one delivery's lease by `lease` every half lease until cancelled (a timer, not a
    task: most handlers end long before the first tick)."""

    def __init__(self, message_id: str, lease: float, requests: _Requests) -> None:
        self._id, self._lease, self._requests = message_id, lease, requests
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = self._loop.call_later(lease / 2, self._tick)

    def _tick(self) -> None:
        self._requests.extend(self._id, self._lease)
        self._timer = self._loop.call_later(self._lease / 2, self._tick)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


__all__ = ["Delivery", "Handler", "Subscriber", "PERMANENT", "error_text"]

"""Enqueue in the caller's own transaction, and the transactional ack.

PostgreSQL (psycopg 3, sync or async): the SQL functions `outbox.enqueue` and `outbox.ack` that
outboxd's migrations install, which a login with only the `outbox_producer` /
`outbox_consumer` role may call. SQLite (the standard `sqlite3` module): the documented
`INSERT INTO outbox_messages` and `UPDATE outbox_deliveries` on outboxd's file. Nothing here
commits: the statement joins whatever transaction the connection is in.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, Union, overload

from outboxd import _contract, _trace
from outboxd._errors import InvalidMessage

if TYPE_CHECKING:
    import psycopg

    SyncConn = Union[psycopg.Connection[Any], psycopg.Cursor[Any], sqlite3.Connection, sqlite3.Cursor]
    AsyncConn = Union[psycopg.AsyncConnection[Any], psycopg.AsyncCursor[Any]]

# The limits outboxd holds every enqueue path to (docs/configuration.md, "Message limits").
MAX_TOPIC_LEN = _contract.TOPIC_MAX_LEN
MAX_TYPE_BYTES = 255
MAX_ORDERING_KEY_BYTES = 255
MAX_HEADERS = 64
MAX_HEADER_KEY_BYTES = 256
MAX_HEADERS_BYTES = 16 * 1024
# outboxd's default --max-payload-bytes. The server's flag is not readable by a producer's login:
# where it is raised, set OUTBOXD_MAX_PAYLOAD_BYTES to the same value for the clients.
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024

T = TypeVar("T")

_TOPIC = re.compile(_contract.TOPIC_REGEX)

JSON_CONTENT_TYPE = "application/json"

Payload = Union[bytes, bytearray, memoryview, str, Mapping[str, Any], Sequence[Any]]
"""bytes as they are; str as UTF-8; a dict or list as JSON (UTF-8), with a `content-type:
application/json` header unless the headers name a content type."""

# The statements and the topic grammar every outboxd client shares (contract/, generated into
# _contract.py): PostgreSQL's functions, and on SQLite the documented statements of
# docs/sql-api.md (the enqueue without RETURNING, which needs SQLite 3.35: the id is always the
# one given here, a duplicate's included; the ack, the same transition as outbox.ack).
_PG_ENQUEUE = _contract.PG_ENQUEUE
_PG_ACK = _contract.PG_ACK
_SQLITE_ENQUEUE = _contract.SQLITE_ENQUEUE
_SQLITE_ACK = _contract.SQLITE_ACK


def uuid7() -> uuid.UUID:
    """A time-ordered UUID (RFC 9562 version 7), as outboxd generates them: ids sort by time."""
    ms = time.time_ns() // 1_000_000
    value = (ms & (2**48 - 1)) << 80 | int.from_bytes(os.urandom(10), "big")
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
    return uuid.UUID(int=value)


def max_payload_bytes() -> int:
    """The payload limit this client checks before any SQL runs: OUTBOXD_MAX_PAYLOAD_BYTES when
    set (the same value as the server's --max-payload-bytes), else the server's default, 1 MiB."""
    raw = os.environ.get("OUTBOXD_MAX_PAYLOAD_BYTES", "")
    if not raw:
        return DEFAULT_MAX_PAYLOAD_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise InvalidMessage(f"OUTBOXD_MAX_PAYLOAD_BYTES is {raw!r}, not a number of bytes") from None
    if value <= 0:
        raise InvalidMessage(f"OUTBOXD_MAX_PAYLOAD_BYTES is {value}; it must be positive")
    return value


def _utf8_len(s: str) -> int:
    return len(s.encode("utf-8"))


def _message_id(message_id: uuid.UUID | str | None) -> uuid.UUID | None:
    if message_id is None or isinstance(message_id, uuid.UUID):
        return message_id
    try:
        return uuid.UUID(str(message_id))
    except ValueError:
        raise InvalidMessage(f"message_id {message_id!r} is not a UUID") from None


def _prepare(
    topic: str, type: str, payload: Payload, headers: Mapping[str, str] | None, ordering_key: str | None,
) -> tuple[bytes, dict[str, str]]:
    """Checks everything outboxd would refuse, so that a bad message raises before any SQL runs
    (on PostgreSQL a failed statement would abort the caller's transaction)."""
    if not isinstance(topic, str) or len(topic) > MAX_TOPIC_LEN or not _TOPIC.fullmatch(topic):
        raise InvalidMessage(
            f"invalid topic {topic!r}: dot-separated segments of [A-Za-z0-9_-], "
            f"at most {MAX_TOPIC_LEN} characters, required"
        )
    if not isinstance(type, str) or not type:
        raise InvalidMessage("type must be a non-empty string")
    if _utf8_len(type) > MAX_TYPE_BYTES:
        raise InvalidMessage(f"type is {_utf8_len(type)} bytes; the limit is {MAX_TYPE_BYTES}")
    if ordering_key is not None:
        if not isinstance(ordering_key, str):
            raise InvalidMessage(f"ordering_key must be a string, got {ordering_key.__class__.__name__}")
        if _utf8_len(ordering_key) > MAX_ORDERING_KEY_BYTES:
            raise InvalidMessage(
                f"ordering_key is {_utf8_len(ordering_key)} bytes; the limit is {MAX_ORDERING_KEY_BYTES}"
            )
    hdrs: dict[str, str] = {}
    for k, v in (headers or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidMessage(f"headers: keys and values must be strings, got {k!r}: {v!r}")
        hdrs[k] = v
    body: bytes
    if isinstance(payload, (bytes, bytearray, memoryview)):
        body = bytes(payload)
    elif isinstance(payload, str):
        body = payload.encode("utf-8")
    elif isinstance(payload, (Mapping, list, tuple)):
        try:
            body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise InvalidMessage(f"payload: not JSON-serialisable: {e}") from e
        if not any(k.lower() == "content-type" for k in hdrs):
            hdrs["content-type"] = JSON_CONTENT_TYPE
    else:
        raise InvalidMessage(f"payload: expected bytes, str, dict or list, got {payload.__class__.__name__}")
    limit = max_payload_bytes()
    if len(body) > limit:
        raise InvalidMessage(
            f"payload is {len(body)} bytes; the limit is {limit} bytes (outboxd's --max-payload-bytes; "
            "set OUTBOXD_MAX_PAYLOAD_BYTES to the server's value where it is raised)"
        )
    _trace.inject(hdrs)
    if len(hdrs) > MAX_HEADERS:
        raise InvalidMessage(f"headers: {len(hdrs)} entries; the limit is {MAX_HEADERS}")
    for k in hdrs:
        if not k:
            raise InvalidMessage("headers: a key is empty; keys must not be empty")
        if _utf8_len(k) > MAX_HEADER_KEY_BYTES:
            raise InvalidMessage(f"headers: a key is {_utf8_len(k)} bytes; the limit is {MAX_HEADER_KEY_BYTES}")
    total = sum(_utf8_len(k) + _utf8_len(v) for k, v in hdrs.items())
    if total > MAX_HEADERS_BYTES:
        raise InvalidMessage(f"headers: {total} bytes of keys and values; the limit is {MAX_HEADERS_BYTES}")
    return body, hdrs


def _kind(conn: object) -> str:
    if isinstance(conn, (sqlite3.Connection, sqlite3.Cursor)):
        return "sqlite"
    module = type(conn).__module__
    if module == "psycopg" or module.startswith("psycopg."):
        name = type(conn).__name__
        if name.startswith("Async"):
            return "pg-async"
        return "pg"
    raise TypeError(
        "expected a psycopg (3) connection or cursor, or a sqlite3 connection, "
        f"got {type(conn).__module__}.{type(conn).__name__}"
    )


@overload
def enqueue(
    conn: AsyncConn, topic: str, type: str, payload: Payload, headers: Mapping[str, str] | None = ...,
    message_id: uuid.UUID | str | None = ..., ordering_key: str | None = ...,
) -> Awaitable[uuid.UUID]: ...
@overload
def enqueue(
    conn: SyncConn, topic: str, type: str, payload: Payload, headers: Mapping[str, str] | None = ...,
    message_id: uuid.UUID | str | None = ..., ordering_key: str | None = ...,
) -> uuid.UUID: ...
def enqueue(
    conn: SyncConn | AsyncConn,
    topic: str,
    type: str,
    payload: Payload,
    headers: Mapping[str, str] | None = None,
    message_id: uuid.UUID | str | None = None,
    ordering_key: str | None = None,
) -> uuid.UUID | Awaitable[uuid.UUID]:
    """Enqueues a message inside the transaction `conn` is in, and returns its id: the message
    exists if and only if that transaction commits. Enqueueing an existing `message_id` is an
    idempotent success that returns the same id and does not abort the transaction.

    `conn` is a psycopg 3 connection or cursor (PostgreSQL, `SELECT outbox.enqueue(...)`), or a
    `sqlite3` connection on outboxd's SQLite file (the documented insert). With a psycopg
    `AsyncConnection`, await the result. Raises `InvalidMessage`, before any SQL runs, for a
    message that outboxd would refuse. With OpenTelemetry installed, the current span's context
    goes into the `traceparent` header (unless the headers carry one).
    """
    kind = _kind(conn)
    body, hdrs = _prepare(topic, type, payload, headers, ordering_key)
    mid = _message_id(message_id)
    if kind == "sqlite":
        assert isinstance(conn, (sqlite3.Connection, sqlite3.Cursor))
        mid = mid or uuid7()
        conn.execute(_SQLITE_ENQUEUE, (topic, type, body, json.dumps(hdrs), str(mid), ordering_key))
        return mid
    params = (topic, type, body, json.dumps(hdrs), None if mid is None else str(mid), ordering_key)
    if kind == "pg-async":
        return _pg_async_scalar(conn, _PG_ENQUEUE, params, _as_uuid)
    return _as_uuid(_pg_scalar(conn, _PG_ENQUEUE, params))


@overload
def ack_in(conn: AsyncConn, consumer: str, message_id: uuid.UUID | str) -> Awaitable[bool]: ...
@overload
def ack_in(conn: SyncConn, consumer: str, message_id: uuid.UUID | str) -> bool: ...
def ack_in(conn: SyncConn | AsyncConn, consumer: str, message_id: uuid.UUID | str) -> bool | Awaitable[bool]:
    """The transactional ack: acks `consumer`'s delivery of `message_id` inside the transaction
    `conn` is in, so that the effect written in that transaction and the ack commit together or
    not at all. Returns True when this call acked it; False when there is nothing for it to ack:
    the delivery was already acked (another delivery of the same message got there first), is
    dead (only a replay delivers it again), or there is no delivery of the message to this
    consumer (unknown, not its topics, or not relayed yet: that delivery comes later). Roll the
    effect back then, and return from the handler normally (its ack is then a no-op): False never
    leaves a delivery that can still be delivered without its effect (docs/sql-api.md).

    With a psycopg `AsyncConnection`, await the result.
    """
    kind = _kind(conn)
    mid = _message_id(message_id)
    if mid is None:
        raise InvalidMessage("message_id is required")
    if not isinstance(consumer, str) or not consumer:
        raise InvalidMessage("consumer must be a non-empty string")
    if kind == "sqlite":
        assert isinstance(conn, (sqlite3.Connection, sqlite3.Cursor))
        now_us = time.time_ns() // 1000
        cur = conn.execute(_SQLITE_ACK, (consumer, str(mid), now_us))
        return cur.rowcount == 1
    if kind == "pg-async":
        return _pg_async_scalar(conn, _PG_ACK, (consumer, str(mid)), bool)
    return bool(_pg_scalar(conn, _PG_ACK, (consumer, str(mid))))


def _as_uuid(v: object) -> uuid.UUID:
    return v if isinstance(v, uuid.UUID) else uuid.UUID(str(v))


def _first(sql: str, row: object) -> object:
    """The one column of `row`, whatever row factory the caller's connection uses."""
    if row is None:  # pragma: no cover - a function call always returns a row
        raise RuntimeError(f"{sql} returned no row")
    if isinstance(row, Mapping):
        return next(iter(row.values()))
    if isinstance(row, Sequence):
        return row[0]
    raise TypeError(f"unsupported row type {type(row).__name__}: use a tuple, namedtuple or dict row factory")


def _pg_scalar(conn: Any, sql: str, params: tuple[Any, ...]) -> object:
    return _first(sql, conn.execute(sql, params).fetchone())


async def _pg_async_scalar(conn: Any, sql: str, params: tuple[Any, ...], convert: Callable[[object], T]) -> T:
    cur = await conn.execute(sql, params)
    return convert(_first(sql, await cur.fetchone()))

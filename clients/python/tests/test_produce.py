"""enqueue and ack_in in the caller's own transaction, on PostgreSQL (psycopg, sync and async)
and SQLite (the standard sqlite3 module)."""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

import outboxd
from support import Outboxd, acked, eventually, running, topic_for, unique


async def message_exists(admin: outboxd.AdminClient, message_id: str) -> bool:
    try:
        await admin.get_message(message_id)
        return True
    except grpc.aio.AioRpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e
        return False


async def delivery_state(admin: outboxd.AdminClient, message_id: str, consumer: str) -> Any:
    for d in (await admin.get_message(message_id)).deliveries:
        if d.consumer == consumer:
            return d
    return None


async def test_enqueue_exists_if_and_only_if_the_transaction_commits(
    admin: outboxd.AdminClient, pg: psycopg.Connection[Any],
) -> None:
    pg.execute("CREATE TABLE IF NOT EXISTS py_orders (id uuid PRIMARY KEY)")
    pg.commit()
    topic = topic_for(unique("orders"))
    with pg.transaction():
        order = uuid.uuid4()
        pg.execute("INSERT INTO py_orders VALUES (%s)", (order,))
        committed = outboxd.enqueue(pg, topic, "OrderPlaced", b'{"id":1}', headers={"tenant": "acme"},
                                    ordering_key="order-1")
    with pytest.raises(RuntimeError):
        with pg.transaction():
            rolled_back = outboxd.enqueue(pg, topic, "OrderPlaced", b"{}")
            raise RuntimeError("the business write failed")
    assert isinstance(committed, uuid.UUID) and committed.version == 7
    msg = (await admin.get_message(str(committed))).message
    assert (msg.topic, msg.type, msg.payload) == (topic, "OrderPlaced", b'{"id":1}')
    assert msg.headers["tenant"] == "acme" and msg.ordering_key == "order-1"
    assert not await message_exists(admin, str(rolled_back))


async def test_a_duplicate_id_returns_the_same_id_and_keeps_the_transaction(
    admin: outboxd.AdminClient, pg: psycopg.Connection[Any],
) -> None:
    topic = topic_for(unique("dup"))
    mid = uuid.uuid4()
    with pg.transaction():
        assert outboxd.enqueue(pg, topic, "T", b"1", message_id=mid) == mid
        assert outboxd.enqueue(pg, topic, "T", b"1", message_id=str(mid)) == mid
        # The transaction is still usable.
        assert pg.execute("SELECT 1").fetchone() == (1,)
    # Another message under the same id is refused: an id names one message.
    with pytest.raises(psycopg.errors.UniqueViolation, match="different topic, type or payload"):
        with pg.transaction():
            outboxd.enqueue(pg, topic, "T", b"2", message_id=mid)
    assert (await admin.get_message(str(mid))).message.payload == b"1"


async def test_str_and_json_payloads(admin: outboxd.AdminClient, pg: psycopg.Connection[Any]) -> None:
    topic = topic_for(unique("json"))
    with pg.transaction():
        as_text = outboxd.enqueue(pg, topic, "T", "héllo")
        as_json = outboxd.enqueue(pg, topic, "T", {"sku": "SKU-1", "quantity": 2})
        own_type = outboxd.enqueue(pg, topic, "T", [1, 2], headers={"Content-Type": "application/x-list"})
    assert (await admin.get_message(str(as_text))).message.payload == "héllo".encode()
    m = (await admin.get_message(str(as_json))).message
    assert json.loads(m.payload) == {"sku": "SKU-1", "quantity": 2}
    assert m.headers["content-type"] == "application/json"
    m = (await admin.get_message(str(own_type))).message
    assert dict(m.headers) == {"Content-Type": "application/x-list"}


def test_bad_messages_raise_before_any_sql_and_leave_the_transaction_usable(pg: psycopg.Connection[Any]) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"topic": "orders..created"}, "invalid topic"),
        ({"topic": "orders.*"}, "invalid topic"),
        ({"topic": "a" * 256}, "at most 255 characters"),
        ({"type": ""}, "type must be a non-empty string"),
        ({"type": "é" * 128}, "type is 256 bytes; the limit is 255"),
        ({"ordering_key": "k" * 256}, "ordering_key is 256 bytes; the limit is 255"),
        ({"headers": {f"h{i}": "v" for i in range(65)}}, "headers: 65 entries; the limit is 64"),
        ({"headers": {"": "v"}}, "a key is empty"),
        ({"headers": {"k" * 257: "v"}}, "a key is 257 bytes; the limit is 256"),
        ({"headers": {"k": "v" * 16384}}, "16385 bytes of keys and values; the limit is 16384"),
        ({"headers": {"k": 1}}, "keys and values must be strings"),
        ({"message_id": "not-a-uuid"}, "message_id 'not-a-uuid' is not a UUID"),
        ({"payload": 42}, "payload: expected bytes, str, dict or list, got int"),
        # Past the server's default --max-payload-bytes: refused here, not by the database
        # (which would abort the transaction).
        ({"payload": b"x" * (5 * 1024 * 1024)}, "payload is 5242880 bytes; the limit is 1048576 bytes"),
        ({"payload": "é" * 524289}, "payload is 1048578 bytes; the limit is 1048576 bytes"),
    ]
    with pg.transaction():
        for change, error in cases:
            args: dict[str, Any] = {"topic": "orders.created", "type": "T", "payload": b"", **change}
            with pytest.raises(outboxd.InvalidMessage, match=error.replace("*", r"\*")):
                outboxd.enqueue(pg, **args)
        assert pg.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(TypeError, match="psycopg"):
        outboxd.enqueue(object(), "t", "T", b"")  # type: ignore[call-overload]


async def test_ack_in_acks_once_and_only_when_its_transaction_commits(
    admin: outboxd.AdminClient, pg: psycopg.Connection[Any],
) -> None:
    consumer = unique("ack-in")
    topic = topic_for(consumer)
    await admin.create_consumer(consumer, [topic])
    with pg.transaction():
        mid = outboxd.enqueue(pg, topic, "T", b"x")
    await eventually("the delivery row", lambda: delivery_state(admin, str(mid), consumer))
    with pytest.raises(RuntimeError):
        with pg.transaction():
            assert outboxd.ack_in(pg, consumer, mid) is True
            raise RuntimeError("the effect failed")
    assert (await delivery_state(admin, str(mid), consumer)).state == outboxd.pb.admin.DeliveryState.PENDING
    with pg.transaction():
        assert outboxd.ack_in(pg, consumer, str(mid)) is True
    with pg.transaction():
        assert outboxd.ack_in(pg, consumer, mid) is False
    assert outboxd.ack_in(pg, "no-such-consumer", mid) is False
    pg.rollback()
    assert (await delivery_state(admin, str(mid), consumer)).state == outboxd.pb.admin.DeliveryState.ACKED


async def test_async_psycopg(admin: outboxd.AdminClient, database_url: str) -> None:
    consumer = unique("async")
    topic = topic_for(consumer)
    await admin.create_consumer(consumer, [topic])
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        async with conn.transaction():
            mid = await outboxd.enqueue(conn, topic, "T", b"a")
        await eventually("the delivery row", lambda: delivery_state(admin, str(mid), consumer))
        async with conn.transaction():
            assert await outboxd.ack_in(conn, consumer, mid) is True
        async with conn.transaction():
            assert await outboxd.ack_in(conn, consumer, mid) is False
    # A cursor, and a connection whose rows are dicts, work too.
    async with await psycopg.AsyncConnection.connect(database_url, row_factory=psycopg.rows.dict_row) as conn:
        async with conn.transaction(), conn.cursor() as cur:
            other = await outboxd.enqueue(cur, topic, "T", b"b")
    assert (await admin.get_message(str(other))).message.payload == b"b"


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Any:
    s = Outboxd(f"sqlite://{tmp_path / 'outbox.db'}").start()
    yield s, tmp_path / "outbox.db"
    s.stop()


async def test_sqlite_enqueue_in_a_transaction_delivers_what_committed_and_acks_in(sqlite_server: Any) -> None:
    srv, path = sqlite_server
    consumer = unique("sq")
    topic = topic_for(consumer)
    async with outboxd.AdminClient(srv.endpoint) as admin:
        await admin.create_consumer(consumer, [topic], backoff_base=0.05, backoff_max=0.1)
        conn = sqlite3.connect(path, timeout=5)
        with conn:
            first = outboxd.enqueue(conn, topic, "T", b"first", headers={"k": "v"}, ordering_key="o")
        with pytest.raises(RuntimeError):
            with conn:
                never = outboxd.enqueue(conn, topic, "T", b"never")
                raise RuntimeError("roll back")
        with conn:
            last = outboxd.enqueue(conn, topic, "T", {"n": 3})
            assert outboxd.enqueue(conn, topic, "T", {"n": 3}, message_id=last) == last
        with pytest.raises(sqlite3.DatabaseError, match="different topic, type or payload"):
            with conn:
                outboxd.enqueue(conn, topic, "T", b"dup", message_id=last)
        seen: list[outboxd.Delivery] = []

        async def handler(d: outboxd.Delivery) -> None:
            seen.append(d)

        async with running(outboxd.Subscriber(srv.endpoint, consumer, handler)):
            await eventually("both committed messages handled", lambda: acked(admin, consumer, 2))
        assert [d.message_id for d in seen] == [str(first), str(last)]
        assert seen[0].payload == b"first" and seen[0].headers == {"k": "v"} and seen[0].ordering_key == "o"
        assert json.loads(seen[1].payload) == {"n": 3} and seen[1].headers["content-type"] == "application/json"
        assert not await message_exists(admin, str(never))

        # The transactional ack on SQLite, for a consumer without a stream.
        quiet = unique("sq-ack")
        await admin.create_consumer(quiet, [topic_for(quiet)])
        with conn:
            mid = outboxd.enqueue(conn, topic_for(quiet), "T", b"")
        await eventually("the delivery row", lambda: delivery_state(admin, str(mid), quiet))
        with conn:
            assert outboxd.ack_in(conn, quiet, mid) is True
        with conn:
            assert outboxd.ack_in(conn, quiet, mid) is False
        assert (await delivery_state(admin, str(mid), quiet)).state == outboxd.pb.admin.DeliveryState.ACKED

        # Prune on this server alone: everything acked above is older than a millisecond.
        pruned = await admin.prune(older_than=0.001)
        assert pruned.messages_deleted >= 3, pruned
        assert not await message_exists(admin, str(first))
        conn.close()

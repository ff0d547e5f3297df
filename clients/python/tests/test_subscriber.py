"""The Subscriber against a real outboxd on PostgreSQL: ack on return, nack on raise, the
concurrency bound, lease extension, reconnect, graceful stop, trace context."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import grpc
import psycopg
import psycopg_pool
import pytest
from opentelemetry import trace

import outboxd
from tracing import PROVIDER, SPANS
from support import Outboxd, acked, commit_enqueue, eventually, running, topic_for, unique

STATE = outboxd.pb.admin.DeliveryState


async def stats(admin: outboxd.AdminClient, consumer: str) -> outboxd.ConsumerStats:
    return (await admin.get_stats(consumer)).consumers[0]


async def test_return_acks_and_the_delivery_carries_the_message(
    admin: outboxd.AdminClient, server: Outboxd, database_url: str,
) -> None:
    consumer = unique("acks")
    topic = topic_for(consumer)
    await admin.create_consumer(consumer, [topic])
    ids = commit_enqueue(database_url, topic, 5, type="OrderPlaced", headers={"tenant": "acme"})
    seen: list[outboxd.Delivery] = []

    async def handler(d: outboxd.Delivery) -> None:
        seen.append(d)

    async with running(outboxd.Subscriber(server.endpoint, consumer, handler)) as task:
        await eventually("5 acked", lambda: acked(admin, consumer, 5))
        assert not task.done()
    assert sorted(d.message_id for d in seen) == sorted(ids)
    d = seen[0]
    assert (d.consumer, d.topic, d.type, d.delivery_count) == (consumer, topic, "OrderPlaced", 1)
    assert d.headers["tenant"] == "acme" and d.enqueued_at is not None and d.ack_deadline is not None
    for mid in ids:
        state = (await admin.get_message(mid)).deliveries[0]
        assert (state.state, state.delivery_count) == (STATE.ACKED, 1)


async def test_raise_nacks_with_the_error_redelivers_then_dead_letters(
    admin: outboxd.AdminClient, server: Outboxd, database_url: str,
) -> None:
    consumer = unique("nacks")
    topic = topic_for(consumer)
    await admin.create_consumer(consumer, [topic], max_deliveries=2, backoff_base=0.05, backoff_max=0.1)
    [flaky] = commit_enqueue(database_url, topic, 1, type="Flaky")
    [poison] = commit_enqueue(database_url, topic, 1, type="Poison")
    attempts: dict[str, list[int]] = collections.defaultdict(list)

    async def handler(d: outboxd.Delivery) -> None:
        attempts[d.message_id].append(d.delivery_count)
        if d.type == "Poison" or d.delivery_count == 1:
            raise ValueError(f"cannot handle {d.type} " + "x" * 5000)

    async with running(outboxd.Subscriber(server.endpoint, consumer, handler)):
        await eventually("one acked, one dead", lambda: acked(admin, consumer, 1, dead=1))
    assert attempts[flaky] == [1, 2] and attempts[poison] == [1, 2]
    flaky_state = (await admin.get_message(flaky)).deliveries[0]
    assert (flaky_state.state, flaky_state.delivery_count) == (STATE.ACKED, 2)
    [dead] = (await admin.list_dead_letters(consumer)).dead_letters
    assert dead.message.message_id == poison and dead.delivery_count == 2
    # The error text, cut to the server's 4096 bytes.
    assert dead.last_error.startswith("cannot handle Poison xxx") and len(dead.last_error.encode()) == 4096


async def test_at_most_concurrency_handlers_run_and_the_server_sends_no_more(
    admin: outboxd.AdminClient, server: Outboxd, database_url: str,
) -> None:
    consumer = unique("bound")
    topic = topic_for(consumer)
    await admin.create_consumer(consumer, [topic])
    commit_enqueue(database_url, topic, 40)
    now = peak = done = 0
    in_flight_seen: list[int] = []

    async def handler(d: outboxd.Delivery) -> None:
        nonlocal now, peak, done
        now += 1
        peak = max(peak, now)
        await asyncio.sleep(0.03)
        now -= 1
        done += 1

    sub = outboxd.Subscriber(server.endpoint, consumer, handler, concurrency=4)
    assert sub.max_in_flight == 4
    async with running(sub):
        async def all_acked() -> bool:
            in_flight_seen.append((await stats(admin, consumer)).in_flight)
            return await acked(admin, consumer, 40)
        await eventually("40 acked", all_acked)
    assert done == 40
    assert peak == 4, f"peak concurrency {peak}, want exactly the bound 4"
    assert max(in_flight_seen) <= 4, in_flight_seen


async def test_a_handler_slower_than_the_ack_deadline_keeps_its_lease(
    admin: outboxd.AdminClient, server: Outboxd, database_url: str,
) -> None:
    consumer = unique("lease")
    topic = topic_for(consumer)
    await admin.create_consumer(consumer, [topic], ack_deadline=0.6)
    calls: list[tuple[str, int]] = []

    def slow(who: str) -> outboxd.Handler:
        async def handler(d: outboxd.Delivery) -> None:
            calls.append((who, d.delivery_count))
            await asyncio.sleep(2.5)  # four ack deadlines
        return handler

    # Two streams compete for the consumer: an expired lease would go to the other one.
    async with running(outboxd.Subscriber(server.endpoint, consumer, slow("a"))), \
            running(outboxd.Subscriber(server.endpoint, consumer, slow("b"))):
        [mid] = commit_enqueue(database_url, topic, 1)
        await eventually("acked", lambda: acked(admin, consumer, 1))
    assert len(calls) == 1 and calls[0][1] == 1, calls
    state = (await admin.get_message(mid)).deliveries[0]
    assert (state.state, state.delivery_count) == (STATE.ACKED, 1)


async def test_reconnects_after_outboxd_is_killed_and_restarted_on_the_same_port(
    admin: outboxd.AdminClient, database_url: str,
) -> None:
    own = Outboxd(database_url).start()
    try:
        consumer = unique("reconnect")
        topic = topic_for(consumer)
        await admin.create_consumer(consumer, [topic])
        seen: list[str] = []

        async def handler(d: outboxd.Delivery) -> None:
            seen.append(d.message_id)

        sub = outboxd.Subscriber(own.endpoint, consumer, handler, reconnect_min=0.05, reconnect_max=0.5)
        async with running(sub) as task:
            [before] = commit_enqueue(database_url, topic, 1)
            await eventually("the first message acked", lambda: acked(admin, consumer, 1))
            assert seen == [before]
            port = own.port
            own.kill()
            [during] = commit_enqueue(database_url, topic, 1)
            own.start()
            assert own.port == port
            await eventually("the message enqueued while outboxd was down", lambda: _async(during in seen), 30)
            assert not task.done(), "run() must not end on UNAVAILABLE"
            await eventually("both acked", lambda: acked(admin, consumer, 2), 30)
    finally:
        own.stop()


async def _async(v: bool) -> bool:
    return v


@pytest.mark.parametrize("how", ["stop", "cancel"])
async def test_stop_lets_running_handlers_finish_acks_them_and_releases_the_rest(
    admin: outboxd.AdminClient, server: Outboxd, database_url: str, how: str,
) -> None:
    consumer = unique(f"stop-{how}")
    topic = topic_for(consumer)
    # One delivery is the last allowed: if releasing counted as a failure, the rest would die.
    await admin.create_consumer(consumer, [topic], max_deliveries=1)
    ids = commit_enqueue(database_url, topic, 4)
    started, release = asyncio.Event(), asyncio.Event()
    handled: list[str] = []

    async def handler(d: outboxd.Delivery) -> None:
        started.set()
        await release.wait()
        handled.append(d.message_id)

    # The server may send four ahead; only one handler runs.
    sub = outboxd.Subscriber(server.endpoint, consumer, handler, concurrency=1, max_in_flight=4)
    task = asyncio.create_task(sub.run())
    await asyncio.wait_for(started.wait(), 20)
    await eventually("all four sent to the stream", lambda: _in_flight(admin, consumer, 4))
    if how == "stop":
        sub.stop()
    else:
        task.cancel()
    # run() waits for the running handler.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(task), 0.3)
    release.set()
    if how == "stop":
        await asyncio.wait_for(task, 10)
    else:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
    assert len(handled) == 1
    state = (await admin.get_message(handled[0])).deliveries[0]
    assert (state.state, state.delivery_count) == (STATE.ACKED, 1)
    c = await stats(admin, consumer)
    assert (c.acked, c.in_flight, c.dead, c.backlog) == (1, 0, 0, 3), c
    # The released three go to the next stream at once.
    rest: list[str] = []

    async def quick(d: outboxd.Delivery) -> None:
        rest.append(d.message_id)

    async with running(outboxd.Subscriber(server.endpoint, consumer, quick)):
        await eventually("the other three acked", lambda: acked(admin, consumer, 4))
    assert sorted(rest + handled) == sorted(ids)


async def _in_flight(admin: outboxd.AdminClient, consumer: str, n: int) -> bool:
    return (await stats(admin, consumer)).in_flight == n


async def test_stop_before_run_returns_at_once(server: Outboxd) -> None:
    async def handler(d: outboxd.Delivery) -> None:
        raise AssertionError("never called")

    sub = outboxd.Subscriber(server.endpoint, "anything", handler)
    sub.stop()
    await asyncio.wait_for(sub.run(), 5)
    with pytest.raises(RuntimeError, match="runs once"):
        await sub.run()


async def test_errors_that_retrying_cannot_fix_end_run(server: Outboxd, admin: outboxd.AdminClient) -> None:
    async def handler(d: outboxd.Delivery) -> None:
        pass

    with pytest.raises(grpc.aio.AioRpcError) as e:
        await asyncio.wait_for(outboxd.Subscriber(server.endpoint, unique("missing"), handler).run(), 10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


async def test_the_handler_span_continues_the_producers_trace(
    admin: outboxd.AdminClient, server: Outboxd, database_url: str,
) -> None:
    consumer = unique("trace")
    topic = topic_for(consumer)
    await admin.create_consumer(consumer, [topic])
    tracer = PROVIDER.get_tracer("test")
    with tracer.start_as_current_span("checkout") as producer:
        [mid] = commit_enqueue(database_url, topic, 1)
    seen: list[tuple[int, str]] = []

    async def handler(d: outboxd.Delivery) -> None:
        ctx = trace.get_current_span().get_span_context()
        seen.append((ctx.trace_id, d.headers.get("traceparent", "")))

    async with running(outboxd.Subscriber(server.endpoint, consumer, handler)):
        await eventually("acked", lambda: acked(admin, consumer, 1))
    want = producer.get_span_context().trace_id
    assert seen and seen[0][0] == want, (seen, want)
    assert f"{want:032x}" in seen[0][1]
    [span] = [s for s in SPANS.get_finished_spans()
              if s.name == "outbox.handle" and s.attributes and s.attributes.get("messaging.message.id") == mid]
    assert span.kind == trace.SpanKind.CONSUMER and span.attributes is not None
    assert span.attributes["messaging.message.id"] == mid



async def test_effect_and_ack_commit_together_so_the_effect_happens_once(
    admin: outboxd.AdminClient, server: Outboxd, database_url: str,
) -> None:
    """The README's consumer: the effect and ack_in in one transaction, from a pool."""
    consumer = unique("once")
    topic = topic_for(consumer)
    await admin.create_consumer(consumer, [topic], backoff_base=0.05, backoff_max=0.1)
    async with psycopg_pool.AsyncConnectionPool(database_url, min_size=2, open=False) as pool:
        async with pool.connection() as conn:
            await conn.execute("CREATE TABLE IF NOT EXISTS py_effects (message_id uuid, consumer text)")
        [mid] = commit_enqueue(database_url, topic, 1)
        attempts = refused = 0

        async def effect(conn: psycopg.AsyncConnection[Any], d: outboxd.Delivery) -> None:
            await conn.execute("INSERT INTO py_effects VALUES (%s, %s)", (d.message_id, consumer))

        async def handler(d: outboxd.Delivery) -> None:
            nonlocal attempts, refused
            attempts += 1
            async with pool.connection() as conn, conn.transaction():
                await effect(conn, d)
                assert await outboxd.ack_in(conn, consumer, d.message_id)
                if attempts == 1:
                    raise RuntimeError("crashed before commit")  # effect and ack roll back together
            # The same message once more after the commit (as a redelivery whose ack was lost
            # would be): ack_in refuses and the effect rolls back.
            async with pool.connection() as conn, conn.transaction():
                await effect(conn, d)
                if not await outboxd.ack_in(conn, consumer, d.message_id):
                    refused += 1
                    raise psycopg.Rollback()

        async with running(outboxd.Subscriber(server.endpoint, consumer, handler)):
            await eventually("acked", lambda: acked(admin, consumer, 1))
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM py_effects WHERE consumer = %s", (consumer,))
            assert await cur.fetchone() == (1,)
    assert (attempts, refused) == (2, 1)
    state = (await admin.get_message(mid)).deliveries[0]
    assert (state.state, state.delivery_count) == (STATE.ACKED, 2)

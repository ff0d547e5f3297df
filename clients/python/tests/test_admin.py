"""Every AdminClient method against a real outboxd (prune is in test_produce, on a server of its
own, since it deletes what other tests' messages would be)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt

from typing import Any

import grpc
import psycopg
import pytest

import outboxd
from support import Outboxd, acked, commit_enqueue, eventually, running, topic_for, unique

pb = outboxd.pb.admin


async def test_consumers_create_get_list_pause_resume_delete(admin: outboxd.AdminClient) -> None:
    name = unique("admin")
    topics = [topic_for(name), "py.admin.*"]
    c = await admin.create_consumer(name, topics, max_deliveries=3, backoff_base=dt.timedelta(milliseconds=200),
                                    backoff_max=2, ack_deadline=5.5, start_from="earliest")
    assert (c.name, list(c.topics), c.max_deliveries, c.start_from) == (name, topics, 3, pb.Consumer.EARLIEST)
    assert c.start_from is outboxd.StartFrom.EARLIEST
    # Skip is the default: the server answers with DEAD_KEY_POLICY_SKIP.
    assert c.dead_key_policy is outboxd.DeadKeyPolicy.SKIP
    assert (c.backoff_base, c.backoff_max, c.ack_deadline) == (
        dt.timedelta(milliseconds=200), dt.timedelta(seconds=2), dt.timedelta(seconds=5.5))
    assert c.created_at is not None and c.created_at.tzinfo is not None and not c.paused
    # The protobuf message it came from, for what the dataclass does not show.
    assert c.raw.backoff_base.ToMilliseconds() == 200 and c.raw.HasField("created_at")
    # The same definition again is fine (safe at every start); another one is refused.
    assert (await admin.create_consumer(name, topics, max_deliveries=3, backoff_base=0.2, backoff_max=2,
                                        ack_deadline=5.5, start_from="earliest")).name == name
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await admin.create_consumer(name, ["other.topic"])
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert (await admin.get_consumer(name)).topics == tuple(topics)
    assert name in [x.name for x in await admin.list_consumers()]
    assert (await admin.pause_consumer(name)).paused
    assert (await admin.get_stats(name)).consumers[0].paused
    assert not (await admin.resume_consumer(name)).paused
    await admin.delete_consumer(name)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await admin.get_consumer(name)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await admin.create_consumer("bad name!", ["t"])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "name" in (e.value.details() or "")
    # A sink consumer: outboxd delivers it itself; the secret is write-only.
    hooked = unique("hooked")
    sink = pb.Sink(webhook=pb.WebhookSink(url="http://127.0.0.1:9/hook", secret="whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"))
    got = await admin.create_consumer(hooked, [topic_for(hooked)], sink=sink)
    assert got.sink is not None
    assert (got.sink.kind, got.sink.url, got.sink.secret) == ("webhook", "http://127.0.0.1:9/hook", "***")
    assert (await admin.get_stats(hooked)).consumers[0].sink == "webhook"
    # The same definition as an outboxd.Sink.
    typed = outboxd.Sink("webhook", "http://127.0.0.1:9/hook", secret="whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY")
    assert (await admin.create_consumer(hooked, [topic_for(hooked)], sink=typed)).sink == got.sink
    await admin.delete_consumer(hooked)
    with pytest.raises(ValueError, match="start_from"):
        await admin.create_consumer(name, ["t"], start_from="latest")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dead_key_policy"):
        await admin.create_consumer(name, ["t"], dead_key_policy="drop")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="list of topics"):
        await admin.create_consumer(name, "t")


async def test_stats_dead_letters_message_and_replay(
    admin: outboxd.AdminClient, server: Outboxd, database_url: str,
) -> None:
    name = unique("dead")
    topic = topic_for(name)
    await admin.create_consumer(name, [topic], max_deliveries=1)
    ids = commit_enqueue(database_url, topic, 3, type="Poison")
    fail = True

    async def handler(d: outboxd.Delivery) -> None:
        if fail:
            raise RuntimeError("poison")

    async with running(outboxd.Subscriber(server.endpoint, name, handler)):
        await eventually("three dead", lambda: _dead(admin, name, 3))
    stats = await admin.get_stats(name)
    assert len(stats.consumers) == 1 and stats.consumers[0].consumer == name and stats.unrelayed >= 0
    assert name in [c.consumer for c in (await admin.get_stats()).consumers]

    page = await admin.list_dead_letters(name, page_size=2)
    assert len(page.dead_letters) == 2 and page.next_page_token
    every = [d async for d in admin.dead_letters(name, page_size=2)]
    assert sorted(d.message.message_id for d in every) == sorted(ids)
    assert all(d.last_error == "poison" and d.delivery_count == 1 and d.consumer == name for d in every)

    got = await admin.get_message(ids[0])
    assert got.message.type == "Poison" and got.deliveries[0].state == pb.DeliveryState.DEAD

    dry = await admin.replay(name, dead_letters=True, dry_run=True)
    assert (dry.dry_run, dry.replayed, dry.selected) == (True, 3, 3)
    one = await admin.replay(name, message_ids=[ids[0]])
    assert one.replayed == 1
    progress = [p async for p in admin.replay_stream(name, dead_letters=True, types=["Poison"], topics=[topic],
                                                      enqueued_after=dt.datetime.now(dt.timezone.utc)
                                                      - dt.timedelta(hours=1))]
    assert progress[-1].done and progress[-1].replayed == 2 and progress[0].selected == 2
    fail = False
    async with running(outboxd.Subscriber(server.endpoint, name, handler)):
        await eventually("replayed ones acked", lambda: acked(admin, name, 3))
    assert (await admin.get_message(ids[0])).deliveries[0].delivery_count == 1
    with pytest.raises(ValueError, match="time zone"):
        await admin.replay(name, enqueued_after=dt.datetime(2026, 1, 1))


async def test_a_hold_consumer_holds_a_dead_key_until_it_is_released(
    admin: outboxd.AdminClient, server: Outboxd, database_url: str,
) -> None:
    """DeadKeyPolicy.HOLD: the first message of key k1 dies, so k1's next ones wait (another
    key's still flow); list_held_keys names the key, the dead message and what waits;
    release_key(skip_dead=True) lets them go in order and leaves the dead one dead."""
    name = unique("held")
    topic = topic_for(name)
    c = await admin.create_consumer(name, [topic], max_deliveries=1, dead_key_policy="hold")
    assert c.dead_key_policy is outboxd.DeadKeyPolicy.HOLD and c.raw.dead_key_policy == pb.DEAD_KEY_POLICY_HOLD
    assert "dead_key_policy=DeadKeyPolicy.HOLD" in repr(c)
    # The same definition, with the enum, is the same consumer; "skip" is another definition.
    assert await admin.create_consumer(name, [topic], max_deliveries=1,
                                       dead_key_policy=outboxd.DeadKeyPolicy.HOLD) == c
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await admin.create_consumer(name, [topic], max_deliveries=1, dead_key_policy="skip")
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert (await admin.list_held_keys(name)).keys == ()

    dead_id, *waiting = commit_enqueue(database_url, topic, 3, type="Posted", ordering_key="k1")
    got: dict[str, list[str]] = {"k1": [], "k2": []}

    async def handler(d: outboxd.Delivery) -> None:
        if d.message_id == dead_id:
            raise RuntimeError("balance would go negative")
        got[d.ordering_key or ""].append(d.message_id)

    async with running(outboxd.Subscriber(server.endpoint, name, handler)):
        async def held() -> outboxd.HeldKeys | None:
            h = await admin.list_held_keys(name)
            return h if h.keys and h.keys[0].waiting == 2 else None

        keys = await eventually("k1 held, 2 waiting", held)
        assert isinstance(keys, outboxd.HeldKeys) and not keys.truncated
        [k] = keys.keys
        assert isinstance(k, outboxd.HeldKey)
        assert (k.ordering_key, k.message_id, k.waiting) == ("k1", dead_id, 2)
        assert k.last_error == "balance would go negative"
        assert k.held_at is not None and k.held_at.tzinfo is not None
        assert k.raw.ordering_key == "k1" and "raw" not in repr(k)
        assert (await admin.get_stats(name)).consumers[0].held_keys == 1
        # Another key flows while k1 is held.
        [other] = commit_enqueue(database_url, topic, 1, type="Posted", ordering_key="k2")
        await eventually("k2 delivered", lambda: _true(got["k2"] == [other]))
        assert got["k1"] == [], "k1's messages wait behind the dead one"

        released = await admin.release_key(name, "k1", skip_dead=True)
        assert isinstance(released, outboxd.HeldKey) and (released.ordering_key, released.message_id) == ("k1", dead_id)
        await eventually("k1's waiting messages delivered", lambda: _true(got["k1"] == waiting))
        await eventually("acked", lambda: acked(admin, name, 3, dead=1))
    assert (await admin.get_stats(name)).consumers[0].held_keys == 0
    assert (await admin.list_held_keys(name)).keys == ()
    [dead] = (await admin.list_dead_letters(name)).dead_letters
    assert dead.message.message_id == dead_id, "skip_dead leaves the dead message dead"
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await admin.release_key(name, "k1")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(TypeError, match="consumer name"):
        await admin.list_held_keys({"consumer": name})  # type: ignore[arg-type]
    await admin.delete_consumer(name)


async def _true(cond: bool) -> bool:
    return cond


async def test_stats_name_the_transaction_that_holds_back_vacuum(
    admin: outboxd.AdminClient, database_url: str,
) -> None:
    """A session sitting idle in transaction with a snapshot holds back vacuum of outboxd's
    tables: Stats.vacuum_horizon names it until it commits."""
    topic = topic_for(unique("horizon"))
    with psycopg.connect(database_url, application_name="py-report") as holder:
        holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        holder.execute("SELECT count(*) FROM outbox.messages").fetchone()
        pid = holder.info.backend_pid
        for _ in range(3):  # transactions committed after its snapshot: it is that many behind
            commit_enqueue(database_url, topic, 1)

        async def named() -> outboxd.VacuumHorizon | None:
            h = (await admin.get_stats()).vacuum_horizon
            return h if h is not None and h.pid == pid else None

        h = await eventually("the holder named", named)
        assert isinstance(h, outboxd.VacuumHorizon)
        assert (h.kind, h.application_name, h.state, h.name) == ("transaction", "py-report", "idle in transaction", "")
        assert h.xmin_age >= 3 and h.age is not None and h.age >= dt.timedelta(0)
        assert h.raw.pid == pid and "raw" not in repr(h)
        holder.commit()
        after = (await admin.get_stats()).vacuum_horizon
        assert after is None or after.pid != pid, f"a committed transaction still named: {after!r}"


async def _dead(admin: outboxd.AdminClient, name: str, n: int) -> bool:
    c = (await admin.get_stats(name)).consumers[0]
    return c.dead == n and c.in_flight == 0


async def test_tail_shows_messages_as_they_commit(admin: outboxd.AdminClient, database_url: str) -> None:
    topic = topic_for(unique("tail"))
    got: asyncio.Queue[outboxd.Message] = asyncio.Queue()

    async def watch() -> None:
        async for m in admin.tail([topic]):
            await got.put(m)

    watcher = asyncio.create_task(watch())
    try:
        # Tail starts at the newest message: enqueue until one shows (the stream may not be
        # open yet when the first commits).
        async def shown() -> outboxd.Message | None:
            commit_enqueue(database_url, topic, 1, type="Tailed")
            try:
                return await asyncio.wait_for(got.get(), 0.5)
            except TimeoutError:
                return None
        m = await eventually("a tailed message", shown)
        assert m.topic == topic and m.type == "Tailed"
        commit_enqueue(database_url, "py.other.topic", 1)
        [last] = commit_enqueue(database_url, topic, 1, type="Last")
        while (m := await asyncio.wait_for(got.get(), 10)).message_id != last:
            assert m.topic == topic, "only the tailed topic"
    finally:
        watcher.cancel()


def test_the_admin_client_works_from_synchronous_code(server: Outboxd) -> None:
    """No event loop: each method returns its result, as a script or a REPL expects."""
    name = unique("sync")
    with outboxd.AdminClient(server.endpoint) as client:
        # Type checkers see the asyncio signatures; here each call returns its result.
        admin: Any = client
        created = admin.create_consumer(name=name, topics=["sync.t"], max_deliveries=3)
        assert created.name == name and created.max_deliveries == 3
        assert name in [c.name for c in admin.list_consumers()]
        assert admin.pause_consumer(name).paused
        stats = admin.get_stats(name)
        assert stats.consumers[0].consumer == name and stats.consumers[0].paused
        assert list(admin.list_dead_letters(name).dead_letters) == []
        assert admin.list_held_keys(name).keys == ()
        admin.delete_consumer(name)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            admin.get_consumer(name)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


async def test_answers_are_frozen_dataclasses_with_a_readable_repr(
    admin: outboxd.AdminClient, server: Outboxd, database_url: str,
) -> None:
    name = unique("typed")
    topic = topic_for(name)
    c = await admin.create_consumer(name, [topic], max_deliveries=1, ack_deadline=dt.timedelta(seconds=30),
                                    start_from=outboxd.StartFrom.EARLIEST)
    assert isinstance(c, outboxd.Consumer) and c.start_from is outboxd.StartFrom.EARLIEST
    assert repr(c).startswith(f"Consumer(name='{name}', topics=('{topic}',), max_deliveries=1, ")
    assert "ack_deadline=datetime.timedelta(seconds=30)" in repr(c) and "start_from=StartFrom.EARLIEST" in repr(c)
    assert "raw" not in repr(c)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.name = "other"  # type: ignore[misc]
    assert c == await admin.get_consumer(name) and c in await admin.list_consumers()

    [mid] = commit_enqueue(database_url, topic, 1, type="Typed")
    info = await admin.get_message(mid)
    assert isinstance(info, outboxd.MessageInfo) and isinstance(info.message, outboxd.Message)
    assert (info.message.message_id, info.message.type, info.message.seq > 0) == (mid, "Typed", True)
    assert isinstance(info.message.payload, bytes) and info.message.enqueued_at is not None
    assert repr(info.message).startswith(f"Message(message_id='{mid}', seq=")

    async def nack(d: outboxd.Delivery) -> None:
        raise RuntimeError("typed poison")

    async with running(outboxd.Subscriber(server.endpoint, name, nack)):
        await eventually("dead", lambda: _dead(admin, name, 1))
    state = (await admin.get_message(mid)).deliveries[0]
    assert isinstance(state, outboxd.DeliveryState) and state.state is outboxd.DeliveryStatus.DEAD
    assert int(state.state) == pb.DeliveryState.DEAD and state.dead_at is not None
    assert "state=DeliveryStatus.DEAD" in repr(state) and "last_error='typed poison'" in repr(state)
    stats = await admin.get_stats(name)
    assert isinstance(stats, outboxd.Stats) and isinstance(stats.consumers, tuple)
    [cs] = stats.consumers
    assert isinstance(cs, outboxd.ConsumerStats) and (cs.consumer, cs.dead, cs.backlog) == (name, 1, 0)
    assert all(isinstance(t, outboxd.TableStats) for t in stats.tables)
    assert repr(cs).startswith(f"ConsumerStats(consumer='{name}', backlog=0, in_flight=0, retrying=0, dead=1, ")
    page = await admin.list_dead_letters(name)
    assert isinstance(page, outboxd.DeadLetterPage) and page.next_page_token == ""
    [dead] = page.dead_letters
    assert isinstance(dead, outboxd.DeadLetter) and dead.message.message_id == mid and dead.last_error == "typed poison"
    replayed = await admin.replay(name, dead_letters=True, dry_run=True)
    assert isinstance(replayed, outboxd.ReplayResult) and (replayed.selected, replayed.dry_run) == (1, True)
    with pytest.raises(TypeError, match="consumer name"):
        await admin.get_stats({"consumer": name})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="consumer name"):
        await admin.get_consumer({"name": name})  # type: ignore[arg-type]
    await admin.delete_consumer(name)

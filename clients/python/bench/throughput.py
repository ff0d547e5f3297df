"""The Subscriber's throughput: messages acked per second by one `outboxd.Subscriber` whose handler
does nothing, against one outboxd on PostgreSQL.

    python clients/python/bench/throughput.py [--messages 20000] [--concurrency 64] [--runs 3] [--max-in-flight N]

Creates a database (dropped at the end), starts outboxd on it (OUTBOXD_BIN, default
target/release/outboxd if built, else target/debug/outboxd), commits the messages before the
Subscriber starts (so that producers do not share the two cores with it), and times from
`run()` to the moment outboxd's stats count every message acked. Also prints the CPU time this
process (the Subscriber, and the stats polls) spent per message. Needs the test extra
(`pip install './clients/python[test]'`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import secrets
import statistics
import sys
import time
from pathlib import Path

import psycopg

import outboxd

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent / "tests"))
from support import ADMIN_URL, Outboxd  # noqa: E402  (the tests' process helper)


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def one_run(
    server: Outboxd, database_url: str, n: int, concurrency: int, max_in_flight: int | None, batch: int | None,
    run: int,
) -> tuple[float, float]:
    """Acked per second, and this process's CPU microseconds per message."""
    consumer, topic = f"bench-{run}", f"bench.run{run}"
    async with outboxd.AdminClient(server.endpoint) as admin:
        await admin.create_consumer(consumer, [topic])
        with psycopg.connect(database_url) as c:
            c.execute("SELECT count(outbox.enqueue(%s, 'Tick', '\\x00'::bytea)) FROM generate_series(1, %s)",
                      (topic, n))
        while (await admin.get_stats(consumer)).consumers[0].backlog < n:
            await asyncio.sleep(0.05)
        handled = 0

        async def handler(d: outboxd.Delivery) -> None:
            nonlocal handled
            handled += 1

        sub = outboxd.Subscriber(server.endpoint, consumer, handler, concurrency=concurrency, max_in_flight=max_in_flight,
                                 ack_batch_size=batch)
        started, cpu = time.perf_counter(), cpu_s()
        task = asyncio.create_task(sub.run())
        while (await admin.get_stats(consumer)).consumers[0].acked < n:
            if task.done():
                task.result()
                raise RuntimeError("the Subscriber stopped")
            await asyncio.sleep(0.01)
        elapsed, cpu = time.perf_counter() - started, cpu_s() - cpu
        sub.stop()
        await task
        assert handled >= n, handled
        return n / elapsed, cpu / n * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-in-flight", type=int, default=None, help="default: the concurrency")
    parser.add_argument("--ack-batch-size", type=int, default=None, help="default: half of max-in-flight")
    opts = parser.parse_args()
    if "OUTBOXD_BIN" not in os.environ and (REPO / "target/release/outboxd").exists():
        os.environ["OUTBOXD_BIN"] = str(REPO / "target/release/outboxd")
    name = f"outboxd_test_pybench_{secrets.token_hex(4)}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    server = Outboxd(url).start()
    try:
        runs = [await one_run(server, url, opts.messages, opts.concurrency, opts.max_in_flight, opts.ack_batch_size, i) for i in range(opts.runs)]
    finally:
        server.stop()
        with psycopg.connect(ADMIN_URL, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(json.dumps({
        "outboxd": os.environ.get("OUTBOXD_BIN", "target/debug/outboxd"),
        "messages": opts.messages, "concurrency": opts.concurrency, "max_in_flight": opts.max_in_flight or opts.concurrency,
        "acked_per_s": [round(r) for r, _ in runs], "median_acked_per_s": round(statistics.median(r for r, _ in runs)),
        "client_cpu_us_per_message": [round(c) for _, c in runs],
    }))


if __name__ == "__main__":
    asyncio.run(main())

"""What the tests share: real outboxd processes on a real PostgreSQL or a SQLite file (the
binary is OUTBOXD_BIN, default target/debug/outboxd at the repository root, built with cargo if
missing), and polling with a bound. The fixtures are in
conftest.py; this module is imported once, as `support`."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import re
import subprocess
import threading
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg

import outboxd

REPO = Path(__file__).resolve().parents[3]
ADMIN_URL = os.environ.get("OUTBOX_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
# Short idle polls, so that the first message after a quiet spell does not wait a second.
FAST = ["--relay-poll-max", "50ms", "--stream-poll", "500ms", "--sweep-interval", "500ms"]
T = TypeVar("T")



def outboxd_bin() -> Path:
    env = os.environ.get("OUTBOXD_BIN")
    if env:
        return Path(env)
    path = REPO / "target" / "debug" / "outboxd"
    if not path.exists():
        subprocess.run(["cargo", "build", "-q", "-p", "outbox-server", "--bin", "outboxd"], cwd=REPO, check=True)
    return path


class Outboxd:
    """One `outboxd serve` process; `endpoint` is host:port."""

    def __init__(self, database_url: str, extra: list[str] | None = None) -> None:
        self.database_url = database_url
        self.extra = list(extra or [])
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None
        self.log: collections.deque[str] = collections.deque(maxlen=5000)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Outboxd:
        args = [str(outboxd_bin()), "serve", "--database-url", self.database_url,
                "--listen", f"127.0.0.1:{self.port}", *FAST, *self.extra]
        env = {**os.environ, "RUST_LOG": os.environ.get("OUTBOXD_TEST_LOG", "info,sqlx=warn")}
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=env)
        serving = threading.Event()
        proc = self.proc

        def read() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                self.log.append(line.rstrip())
                if "outboxd serving" in line and not serving.is_set():
                    m = re.search(r"local_addr=\S*:(\d+)", line)
                    if m:
                        self.port = int(m.group(1))
                        serving.set()
            serving.set()

        threading.Thread(target=read, daemon=True).start()
        if not serving.wait(60) or self.port == 0 or proc.poll() is not None:
            tail = "\n".join(list(self.log)[-20:])
            self.stop()
            raise RuntimeError(f"outboxd did not start serving within 60 s:\n{tail}")
        return self

    def kill(self) -> None:
        """SIGKILL: nothing graceful."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(30)
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
            self.proc = None


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def topic_for(name: str) -> str:
    return f"py.{name}"


async def eventually(what: str, check: Callable[[], Awaitable[T | None]], within: float = 20.0) -> T:
    """Polls `check` until it returns something other than None/False, for at most `within` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: object = None
    while True:
        try:
            got = await check()
        except AssertionError as e:
            last = e
        else:
            if got is not None and got is not False:
                return got
            last = got
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not within {within} s (last: {last!r})")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def running(sub: outboxd.Subscriber) -> AsyncIterator[asyncio.Task[None]]:
    """Runs `sub` in a task; stops it (bounded) on the way out."""
    task = asyncio.create_task(sub.run())
    try:
        yield task
    finally:
        sub.stop()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(task, 30)


async def acked(admin: outboxd.AdminClient, consumer: str, n: int, dead: int = 0) -> bool:
    """Whether `consumer` has `n` acked and `dead` dead deliveries, and nothing else open."""
    c = (await admin.get_stats(consumer)).consumers[0]
    return c.acked == n and c.dead == dead and c.in_flight == 0 and c.backlog == 0


def commit_enqueue(url: str, topic: str, n: int = 1, type: str = "T", **kw: Any) -> list[str]:
    """Enqueues `n` messages in one committed transaction; returns their ids."""
    with psycopg.connect(url) as c:
        ids = [str(outboxd.enqueue(c, topic, type, f"{i}".encode(), **kw)) for i in range(n)]
    return ids


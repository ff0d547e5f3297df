"""The checkout demo's end-to-end harness: a fresh PostgreSQL database per saga style, a real
outboxd, the consumers created by consumers.sh, and the three services as real processes that
a test can SIGKILL and restart (ADR 0038). Nothing sleeps to let things happen: every wait
polls a condition with a bound.

The binaries come from the environment that test.sh sets: OUTBOXD_BIN, OUTBOXCTL_BIN,
ORDERS_BIN, PAYMENTS_JS; Inventory runs on this interpreter (the demo's virtualenv).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
import pytest

HERE = pathlib.Path(__file__).resolve().parent
CHECKOUT = HERE.parent
ADMIN_URL = os.environ.get("OUTBOX_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
# Short loops in outboxd, as the Rust end-to-end harness uses them.
FAST = ["--sweep-interval", "50ms", "--stream-poll", "100ms", "--relay-poll-max", "50ms", "--drain-timeout", "2s"]
LIMIT = 1000
SEEDED = 100

T = TypeVar("T")


def poll(what: str, probe: Callable[[], T | None], bound: float = 30.0) -> T:
    """Calls `probe` until it returns something other than None (or False), for `bound` s."""
    deadline = time.monotonic() + bound
    last: Any = None
    while True:
        try:
            last = probe()
            if last is not None and last is not False:
                return last
        except (OSError, psycopg.OperationalError) as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {bound} s (last: {last!r})")
        time.sleep(0.02)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None,
         timeout: float = 10.0) -> tuple[int, dict[str, str], Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json",
                                                                        **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, json.loads(e.read() or b"null")


class Process:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: pathlib.Path) -> None:
        self.name = name
        self.log = log
        with open(log, "ab") as out:
            out.write(f"==== {' '.join(argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no handler finishes, nothing is released by the process itself."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class Checkout:
    """outboxd and the three services on one fresh database, in one saga style."""

    def __init__(self, style: str, workdir: pathlib.Path) -> None:
        self.style = style
        self.workdir = workdir
        self.pause_dir = workdir / "pause"
        self.pause_dir.mkdir()
        self.dbname = f"outboxd_test_checkout_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(ADMIN_URL, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{self.dbname}"')
        base = ADMIN_URL.rsplit("/", 1)[0]
        self.database_url = f"{base}/{self.dbname}"
        self.db = psycopg.connect(self.database_url, autocommit=True)
        self.grpc_port = free_port()
        self.ports = {"orders": free_port(), "inventory": free_port(), "payments": free_port()}
        self.procs: dict[str, Process] = {}
        self.env = {**os.environ, "DATABASE_URL": self.database_url,
                    "OUTBOXD_SERVER": f"http://127.0.0.1:{self.grpc_port}"}
        for k in ("CHECKOUT_TEST_PAUSE", "CHECKOUT_TEST_PAUSE_DIR", "CHECKOUT_TEST_PAUSE_AT"):
            self.env.pop(k, None)

        self.procs["outboxd"] = Process(
            "outboxd", [os.environ["OUTBOXD_BIN"], "serve", "--database-url", self.database_url,
                        "--listen", f"127.0.0.1:{self.grpc_port}", *FAST], self.env, workdir / "outboxd.log")
        poll("outboxd serving", lambda: subprocess.run(
            [os.environ["OUTBOXD_BIN"], "healthcheck", "--addr", f"127.0.0.1:{self.grpc_port}"],
            capture_output=True).returncode == 0)
        subprocess.run(["bash", str(CHECKOUT / "consumers.sh")], check=True, capture_output=True,
                       env={**self.env, "OUTBOXCTL": os.environ["OUTBOXCTL_BIN"]})
        for name in self.ports:
            self.start(name)

    def url(self, name: str, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}{path}"

    def argv(self, name: str) -> list[str]:
        listen = ["--listen", f"127.0.0.1:{self.ports[name]}"]
        if name == "orders":
            return [os.environ["ORDERS_BIN"], "--style", self.style, *listen]
        if name == "inventory":
            return [sys.executable, str(CHECKOUT / "inventory" / "inventory.py"), *listen]
        return ["node", os.environ["PAYMENTS_JS"], *listen, "--limit", str(LIMIT)]

    def start(self, name: str, pause: str | None = None, phase: str = "before-commit") -> None:
        """Starts a service (with the test pause at step `pause`, before or after its commit)
        and waits until it serves."""
        env = dict(self.env)
        if pause:
            env.update(CHECKOUT_TEST_PAUSE=pause, CHECKOUT_TEST_PAUSE_DIR=str(self.pause_dir),
                       CHECKOUT_TEST_PAUSE_AT=phase)
        proc = Process(name, self.argv(name), env, self.workdir / f"{name}.log")
        self.procs[name] = proc

        def up() -> bool:
            if not proc.alive():
                raise AssertionError(f"{name} exited at start:\n{proc.tail()}")
            return http("GET", self.url(name, "/health"), timeout=2)[0] == 200

        poll(f"{name} serving", up)

    def kill(self, name: str) -> None:
        self.procs[name].kill()

    def restart(self, name: str, pause: str | None = None, phase: str = "before-commit") -> None:
        self.procs[name].stop()
        self.start(name, pause, phase)

    def close(self) -> None:
        for p in reversed(list(self.procs.values())):
            p.stop()
        self.db.close()
        with psycopg.connect(ADMIN_URL, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{p.tail()}" for n, p in self.procs.items())

    # The HTTP APIs.
    def place(self, sku: str, quantity: int, amount: int, key: str | None = None,
              timeout: float = 10.0) -> tuple[int, dict[str, str], Any]:
        headers = {"Idempotency-Key": key} if key else {}
        return http("POST", self.url("orders", "/orders"), {"sku": sku, "quantity": quantity, "amount": amount},
                    headers, timeout=timeout)

    def order(self, order_id: str) -> dict[str, Any]:
        status, _, body = http("GET", self.url("orders", f"/orders/{order_id}"))
        assert status == 200, body
        return dict(body)

    def settled(self, order_id: str, bound: float = 30.0) -> dict[str, Any]:
        def final() -> dict[str, Any] | None:
            o = self.order(order_id)
            return o if o["status"] != "PENDING" else None
        try:
            return poll(f"order {order_id} settled", final, bound)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.logs()}") from None

    def stock(self, sku: str) -> dict[str, Any]:
        status, _, body = http("GET", self.url("inventory", f"/stock/{sku}"))
        assert status == 200, body
        return dict(body)

    def payment(self, order_id: str) -> tuple[int, Any]:
        status, _, body = http("GET", self.url("payments", f"/payments/{order_id}"))
        return status, body

    def quiet(self, bound: float = 30.0) -> None:
        """Waits until every consumer has acked everything: nothing pending, leased or
        retrying; and asserts that nothing died."""
        def done() -> bool:
            rows = self.db.execute(
                "SELECT consumer, state, count(*) FROM outbox.inbox WHERE state <> 'acked' GROUP BY 1, 2"
            ).fetchall()
            dead = [r for r in rows if r[1] == "dead"]
            assert not dead, f"dead letters: {dead}\n{self.logs()}"
            unrelayed = self.db.execute("SELECT count(*) FROM outbox.unrelayed_messages").fetchone()
            return not rows and unrelayed is not None and unrelayed[0] == 0
        poll("every delivery acked", done, bound)

    def messages(self, order_id: str) -> dict[str, int]:
        """How many messages of each type the saga of `order_id` wrote (its ordering key)."""
        rows = self.db.execute(
            "SELECT type, count(*) FROM outbox.messages WHERE ordering_key = %s GROUP BY type", (order_id,)
        ).fetchall()
        return {t: n for t, n in rows}


@pytest.fixture(scope="module", params=["orchestration", "choreography"])
def checkout(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Checkout]:
    c = Checkout(request.param, tmp_path_factory.mktemp(request.param))
    try:
        yield c
    finally:
        c.close()

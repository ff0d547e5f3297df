"""Inventory, the checkout saga's second service: reserves and releases stock.

It serves both saga styles at once (ADR 0037): it obeys the commands addressed to it on
`checkout.inventory.commands` and answers the orchestrator on `checkout.orders.replies`, and it
reacts to the choreography's events (`OrderPlaced`, `PaymentFailed`) with events of its own on
`checkout.inventory.events`. Each message is handled in one transaction on its own schema
`inventory`: the transactional ack, the stock change and the outgoing message commit together,
so a redelivery never reserves twice.

HTTP: `GET /stock/{sku}` -> {"sku", "available", "reserved"}, `GET /health`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import pathlib
import signal
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import outboxd
import psycopg
import psycopg_pool
from aiohttp import web

log = logging.getLogger("inventory")

ORDERS_EVENTS = "checkout.orders.events"
PAYMENTS_EVENTS = "checkout.payments.events"
INVENTORY_EVENTS = "checkout.inventory.events"
INVENTORY_COMMANDS = "checkout.inventory.commands"
ORDERS_REPLIES = "checkout.orders.replies"

# (topic, type) -> (what to do, where the answer goes): a command is answered to the
# orchestrator, an event is followed by an event of Inventory's own.
ROUTES = {
    (INVENTORY_COMMANDS, "ReserveStock"): ("reserve", ORDERS_REPLIES),
    (ORDERS_EVENTS, "OrderPlaced"): ("reserve", INVENTORY_EVENTS),
    (INVENTORY_COMMANDS, "ReleaseStock"): ("release", ORDERS_REPLIES),
    (PAYMENTS_EVENTS, "PaymentFailed"): ("release", INVENTORY_EVENTS),
}

SEED_SKUS = [f"SKU-{i}" for i in range(1, 6)]
SEED_UNITS = 100

SCHEMA = """
CREATE SCHEMA IF NOT EXISTS inventory;
CREATE TABLE IF NOT EXISTS inventory.stock (
    sku       text    PRIMARY KEY,
    available integer NOT NULL CHECK (available >= 0),
    reserved  integer NOT NULL CHECK (reserved >= 0)
);
-- One row per order Inventory was asked about: what it reserved, released or refused.
CREATE TABLE IF NOT EXISTS inventory.reservations (
    order_id   uuid        PRIMARY KEY,
    sku        text        NOT NULL,
    quantity   integer     NOT NULL CHECK (quantity > 0),
    status     text        NOT NULL CHECK (status IN ('reserved', 'released', 'rejected')),
    reason     text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
"""


class BadMessage(ValueError):
    """A payload without the fields its type needs: nacked, dead after max_deliveries."""


class Pause:
    """The test hook of ADR 0038: with CHECKOUT_TEST_PAUSE_DIR and CHECKOUT_TEST_PAUSE set,
    the named step (`reserve` or `release`) creates `<dir>/<step>.<order id>` once it has
    written everything, and waits before committing until `<dir>/<step>.<order id>.go` exists;
    with CHECKOUT_TEST_PAUSE_AT=after-commit, just after committing instead."""

    def __init__(self) -> None:
        directory = os.environ.get("CHECKOUT_TEST_PAUSE_DIR")
        step = os.environ.get("CHECKOUT_TEST_PAUSE")
        self.dir = pathlib.Path(directory) if directory and step else None
        self.step = step if directory and step else None
        self.phase = "after-commit" if os.environ.get("CHECKOUT_TEST_PAUSE_AT") == "after-commit" else "before-commit"

    async def at(self, phase: str, step: str, order_id: str) -> None:
        if self.dir is None or step != self.step or phase != self.phase:
            return
        (self.dir / f"{step}.{order_id}").touch()
        go = self.dir / f"{step}.{order_id}.go"
        log.warning("test pause: holding %s of %s (%s) until %s exists", step, order_id, phase, go)
        while not go.exists():
            await asyncio.sleep(0.01)


def _order_id(msg: dict[str, Any]) -> str:
    try:
        return str(uuid.UUID(str(msg["order_id"])))
    except (KeyError, ValueError):
        raise BadMessage(f"order_id must be a UUID, got {msg.get('order_id')!r}") from None


def _positive_int(msg: dict[str, Any], field: str) -> int:
    value = msg.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise BadMessage(f"{field} must be a positive integer, got {value!r}")
    return value


class Inventory:
    def __init__(self, pool: psycopg_pool.AsyncConnectionPool, pause: Pause) -> None:
        self.pool = pool
        self.pause = pause

    async def setup(self) -> None:
        """Creates the schema and, on the first start, the stock of SKU-1 ... SKU-5."""
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('checkout.inventory.schema'))")
            await conn.execute(SCHEMA)
            for sku in SEED_SKUS:
                await conn.execute(
                    "INSERT INTO inventory.stock (sku, available, reserved) VALUES (%s, %s, 0) "
                    "ON CONFLICT (sku) DO NOTHING",
                    (sku, SEED_UNITS),
                )

    async def handle(self, d: outboxd.Delivery) -> None:
        route = ROUTES.get((d.topic, d.type))
        try:
            msg = json.loads(d.payload)
        except ValueError as e:
            raise BadMessage(f"{d.topic} {d.type}: the payload is not JSON: {e}") from None
        if not isinstance(msg, dict):
            raise BadMessage(f"{d.topic} {d.type}: the payload is not a JSON object")
        order_id = _order_id(msg)
        async with self.pool.connection() as conn:
            async with conn.transaction():
                if not await outboxd.ack_in(conn, d.consumer, d.message_id):
                    return  # another delivery of this message did it
                if route is None:
                    return  # another service's cue
                action, reply_to = route
                if action == "reserve":
                    await self._reserve(conn, order_id, msg, reply_to)
                else:
                    await self._release(conn, order_id, msg, reply_to)
                await self.pause.at("before-commit", action, order_id)
            await self.pause.at("after-commit", action, order_id)

    async def _reserve(self, conn: psycopg.AsyncConnection[Any], order_id: str, msg: dict[str, Any],
                       reply_to: str) -> None:
        sku = msg.get("sku")
        if not isinstance(sku, str) or not sku:
            raise BadMessage(f"sku must be a non-empty string, got {sku!r}")
        quantity = _positive_int(msg, "quantity")
        cur = await conn.execute("SELECT available FROM inventory.stock WHERE sku = %s FOR UPDATE", (sku,))
        row = await cur.fetchone()
        reason = None
        if row is None:
            reason = f"unknown SKU {sku!r}"
        elif row[0] < quantity:
            reason = f"out of stock: {sku} has {row[0]} available, {quantity} requested"
        answer: dict[str, Any] = {"order_id": order_id, "sku": sku, "quantity": quantity}
        if reason is None:
            await conn.execute(
                "UPDATE inventory.stock SET available = available - %s, reserved = reserved + %s WHERE sku = %s",
                (quantity, quantity, sku),
            )
            await conn.execute(
                "INSERT INTO inventory.reservations (order_id, sku, quantity, status) VALUES (%s, %s, %s, 'reserved')",
                (order_id, sku, quantity),
            )
            # The choreography passes the amount on to Payments.
            if "amount" in msg:
                answer["amount"] = msg["amount"]
            await outboxd.enqueue(conn, reply_to, "StockReserved", answer, ordering_key=order_id)
            log.info("reserved %d of %s for order %s", quantity, sku, order_id)
        else:
            await conn.execute(
                "INSERT INTO inventory.reservations (order_id, sku, quantity, status, reason) "
                "VALUES (%s, %s, %s, 'rejected', %s)",
                (order_id, sku, quantity, reason),
            )
            await outboxd.enqueue(conn, reply_to, "OutOfStock", {**answer, "reason": reason}, ordering_key=order_id)
            log.info("refused order %s: %s", order_id, reason)

    async def _release(self, conn: psycopg.AsyncConnection[Any], order_id: str, msg: dict[str, Any],
                       reply_to: str) -> None:
        """A compensation always answers: what the order held is given back, or it held nothing."""
        reason = msg.get("reason") if isinstance(msg.get("reason"), str) else None
        cur = await conn.execute(
            "SELECT sku, quantity, status FROM inventory.reservations WHERE order_id = %s FOR UPDATE", (order_id,)
        )
        row = await cur.fetchone()
        answer: dict[str, Any] = {"order_id": order_id, "reason": reason}
        if row is not None and row[2] == "reserved":
            sku, quantity = row[0], row[1]
            await conn.execute(
                "UPDATE inventory.stock SET available = available + %s, reserved = reserved - %s WHERE sku = %s",
                (quantity, quantity, sku),
            )
            await conn.execute(
                "UPDATE inventory.reservations SET status = 'released', reason = %s, updated_at = now() "
                "WHERE order_id = %s",
                (reason, order_id),
            )
            answer.update(sku=sku, quantity=quantity)
            log.info("released %d of %s for order %s", quantity, sku, order_id)
        else:
            answer.update(quantity=0)
            log.warning("release for order %s, which holds no stock", order_id)
        await outboxd.enqueue(conn, reply_to, "StockReleased", answer, ordering_key=order_id)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def http_app(inventory: Inventory) -> web.Application:
    async def stock(request: web.Request) -> web.Response:
        sku = request.match_info["sku"]
        async with inventory.pool.connection() as conn:
            cur = await conn.execute("SELECT available, reserved FROM inventory.stock WHERE sku = %s", (sku,))
            row = await cur.fetchone()
        if row is None:
            return _error(404, f"no SKU {sku!r}")
        return web.json_response({"sku": sku, "available": row[0], "reserved": row[1]})

    async def health(_: web.Request) -> web.Response:
        async with inventory.pool.connection() as conn:
            await conn.execute("SELECT 1")
        return web.json_response({"status": "ok"})

    @web.middleware
    async def store_errors(request: web.Request,
                           handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        try:
            return await handler(request)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as e:
            log.error("request failed: %s", e)
            return _error(503, "the stock store is unavailable")

    app = web.Application(middlewares=[store_errors], client_max_size=16 * 1024)
    app.router.add_get("/stock/{sku}", stock)
    app.router.add_get("/health", health)
    return app


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected host:port, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", default=os.environ.get("DATABASE_URL"),
                   help="the PostgreSQL database shared with outboxd (env DATABASE_URL)")
    p.add_argument("--outboxd", default=os.environ.get("OUTBOXD_SERVER", "127.0.0.1:50051"),
                   help="outboxd's address: host:port, http://host:port or https://host:port (env OUTBOXD_SERVER)")
    p.add_argument("--listen", type=_host_port, default=os.environ.get("INVENTORY_LISTEN", "127.0.0.1:8081"),
                   help="where the HTTP API listens (env INVENTORY_LISTEN, default 127.0.0.1:8081)")
    p.add_argument("--consumer", default=os.environ.get("INVENTORY_CONSUMER", "inventory"))
    p.add_argument("--concurrency", type=int, default=8, choices=range(1, 257), metavar="1..256")
    args = p.parse_args()
    if not args.database_url:
        p.error("--database-url (or DATABASE_URL) is required")
    if isinstance(args.listen, str):
        args.listen = _host_port(args.listen)
    return args


async def main() -> None:
    args = parse_args()
    pause = Pause()
    if pause.step:
        log.warning("CHECKOUT_TEST_PAUSE is set: a test hook holds step %s (%s)", pause.step, pause.phase)
    pool = psycopg_pool.AsyncConnectionPool(
        args.database_url, min_size=1, max_size=args.concurrency + 2, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True, timeout=10)
    inventory = Inventory(pool, pause)
    await inventory.setup()

    tls = os.environ.get("OUTBOXD_TLS_CA")
    subscriber = outboxd.Subscriber(
        args.outboxd, args.consumer, inventory.handle, concurrency=args.concurrency,
        token=os.environ.get("OUTBOXD_TOKEN") or None, tls={"ca": tls} if tls else None,
    )
    runner = web.AppRunner(http_app(inventory), access_log=None)
    await runner.setup()
    host, port = args.listen
    await web.TCPSite(runner, host, port).start()
    log.info("inventory serving on %s:%d, subscribed to %s as %s", host, port, args.outboxd, args.consumer)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, subscriber.stop)
    try:
        await subscriber.run()
    finally:
        await runner.cleanup()
        await pool.close()
        log.info("stopped")


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(main())

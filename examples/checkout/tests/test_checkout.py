"""The checkout saga end to end, in both styles (the `checkout` fixture runs every test once per
style, each style on a database of its own): outcomes, the exactly-once of every step, the
Idempotency-Key, and every service SIGKILLed while its step is in flight.

Exactly once is checked where it shows: in the services' own tables (one reservation, one
payment, one final status per order; stock that adds up) and in the messages the saga wrote
(each step's message exactly once, found by the order id that is every message's ordering key).
"""

from __future__ import annotations

import concurrent.futures
import uuid
from typing import Any

import pytest
from conftest import LIMIT, SEEDED, Checkout, poll

# The messages each outcome's saga writes, once each.
SAGAS: dict[tuple[str, str], dict[str, int]] = {
    ("orchestration", "confirmed"): {"ReserveStock": 1, "StockReserved": 1, "ChargePayment": 1,
                                     "PaymentCharged": 1, "OrderConfirmed": 1},
    ("choreography", "confirmed"): {"OrderPlaced": 1, "StockReserved": 1, "PaymentCharged": 1, "OrderConfirmed": 1},
    ("orchestration", "declined"): {"ReserveStock": 1, "StockReserved": 1, "ChargePayment": 1, "PaymentFailed": 1,
                                    "ReleaseStock": 1, "StockReleased": 1, "OrderCancelled": 1},
    ("choreography", "declined"): {"OrderPlaced": 1, "StockReserved": 1, "PaymentFailed": 1, "StockReleased": 1,
                                   "OrderCancelled": 1},
    ("orchestration", "out_of_stock"): {"ReserveStock": 1, "OutOfStock": 1, "OrderCancelled": 1},
    ("choreography", "out_of_stock"): {"OrderPlaced": 1, "OutOfStock": 1, "OrderCancelled": 1},
}


def check_invariants(c: Checkout) -> None:
    """Over every order so far: one final status, and the other services' rows that match it;
    and stock that adds up to what was seeded."""
    c.quiet()
    orders = c.db.execute("SELECT id::text, status, reason, sku, quantity FROM orders.orders").fetchall()
    reservations = {r[0]: r[1:] for r in c.db.execute(
        "SELECT order_id::text, status, sku, quantity FROM inventory.reservations").fetchall()}
    payments = {r[0]: r[1:] for r in c.db.execute(
        "SELECT order_id::text, status, amount FROM payments.payments").fetchall()}
    for order_id, status, reason, sku, quantity in orders:
        assert status in ("CONFIRMED", "CANCELLED"), (order_id, status)
        r, p = reservations.get(order_id), payments.get(order_id)
        if status == "CONFIRMED":
            assert r == ("reserved", sku, quantity) and p is not None and p[0] == "charged", (order_id, r, p)
        elif reason.startswith("payment declined"):
            assert r == ("released", sku, quantity) and p is not None and p[0] == "declined", (order_id, r, p)
        else:
            assert reason.startswith(("out of stock", "unknown SKU")), reason
            assert r is not None and r[0] == "rejected" and p is None, (order_id, r, p)
        final = c.messages(order_id)
        assert final.get("OrderConfirmed", 0) + final.get("OrderCancelled", 0) == 1, (order_id, final)
    for sku, available, reserved in c.db.execute("SELECT sku, available, reserved FROM inventory.stock"):
        held = sum(q for st, s, q in reservations.values() if st == "reserved" and s == sku)
        assert available + reserved == SEEDED and reserved == held, (sku, available, reserved, held)


def place(c: Checkout, sku: str, quantity: int, amount: int, key: str | None = None) -> str:
    status, headers, body = c.place(sku, quantity, amount, key)
    assert status == 202, body
    assert headers["location"] == f"/orders/{body['id']}"
    return str(body["id"])


def test_the_happy_path_confirms_with_stock_reserved_and_a_payment_recorded_once(checkout: Checkout) -> None:
    before = checkout.stock("SKU-1")
    order_id = place(checkout, "SKU-1", 2, 100)
    assert checkout.order(order_id)["status"] in ("PENDING", "CONFIRMED")
    order = checkout.settled(order_id)
    assert (order["status"], order["reason"]) == ("CONFIRMED", None)
    checkout.quiet()
    stock = checkout.stock("SKU-1")
    assert (stock["available"], stock["reserved"]) == (before["available"] - 2, before["reserved"] + 2)
    assert checkout.payment(order_id) == (200, {"order_id": order_id, "amount": 100, "status": "CHARGED",
                                                "reason": None})
    assert checkout.messages(order_id) == SAGAS[(checkout.style, "confirmed")]
    if checkout.style == "orchestration":
        saga = checkout.db.execute("SELECT state FROM orders.sagas WHERE order_id = %s", (order_id,)).fetchone()
        assert saga == ("DONE",)
    else:
        assert checkout.db.execute("SELECT count(*) FROM orders.sagas").fetchone() == (0,), \
            "the choreography keeps no saga state"
    check_invariants(checkout)


def test_an_amount_over_the_limit_cancels_with_the_stock_released(checkout: Checkout) -> None:
    before = checkout.stock("SKU-2")
    order_id = place(checkout, "SKU-2", 3, LIMIT + 1)
    order = checkout.settled(order_id)
    assert order["status"] == "CANCELLED"
    assert order["reason"] == f"payment declined: amount {LIMIT + 1} exceeds the limit of {LIMIT}"
    # Cancelled only once the stock is back, in both styles.
    assert checkout.stock("SKU-2") == before
    status, payment = checkout.payment(order_id)
    assert (status, payment["status"]) == (200, "DECLINED")
    checkout.quiet()
    assert checkout.messages(order_id) == SAGAS[(checkout.style, "declined")]
    row = checkout.db.execute("SELECT status FROM inventory.reservations WHERE order_id = %s", (order_id,)).fetchone()
    assert row == ("released",)
    check_invariants(checkout)


def test_out_of_stock_cancels_with_that_reason_and_charges_nothing(checkout: Checkout) -> None:
    before = checkout.stock("SKU-5")
    order_id = place(checkout, "SKU-5", before["available"] + 1, 10)
    order = checkout.settled(order_id)
    assert order["status"] == "CANCELLED"
    assert order["reason"] == (f"out of stock: SKU-5 has {before['available']} available, "
                               f"{before['available'] + 1} requested")
    assert checkout.stock("SKU-5") == before
    assert checkout.payment(order_id)[0] == 404
    unknown = checkout.settled(place(checkout, "SKU-404", 1, 10))
    assert (unknown["status"], unknown["reason"]) == ("CANCELLED", "unknown SKU 'SKU-404'")
    checkout.quiet()
    assert checkout.messages(order_id) == SAGAS[(checkout.style, "out_of_stock")]
    check_invariants(checkout)


def test_the_same_idempotency_key_returns_the_same_order(checkout: Checkout) -> None:
    key = f"key-{uuid.uuid4()}"
    first = place(checkout, "SKU-3", 1, 10, key)
    status, headers, body = checkout.place("SKU-3", 1, 10, key)
    assert (status, body["id"], headers.get("idempotent-replayed")) == (202, first, "true")
    # Concurrent retries with a new key: one order for all of them.
    key2 = f"key-{uuid.uuid4()}"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: checkout.place("SKU-3", 1, 10, key2), range(8)))
    assert {a[0] for a in answers} == {202}
    ids = {a[2]["id"] for a in answers}
    assert len(ids) == 1, ids
    # The same key for a different order is refused, naming the key.
    status, _, body = checkout.place("SKU-3", 2, 10, key)
    assert status == 422 and key in body["error"], body
    rows = checkout.db.execute("SELECT count(*) FROM orders.orders WHERE idempotency_key IN (%s, %s)",
                               (key, key2)).fetchone()
    assert rows == (2,)
    for order_id in (first, ids.pop()):
        assert checkout.settled(order_id)["status"] == "CONFIRMED"
        checkout.quiet()
        assert checkout.messages(order_id) == SAGAS[(checkout.style, "confirmed")]
    check_invariants(checkout)


@pytest.mark.parametrize("body, status, words", [
    ({"sku": "SKU-1", "quantity": 0, "amount": 10}, 422, "quantity must be between 1 and 10000, got 0"),
    ({"sku": "SKU-1", "quantity": 1, "amount": 0}, 422, "amount must be between 1 and 1000000000"),
    ({"sku": "", "quantity": 1, "amount": 10}, 422, "sku must be 1 to 64 characters"),
    ({"sku": "SKU-1", "quantity": 1}, 400, "missing field `amount`"),
    ({"sku": "SKU-1", "quantity": "2", "amount": 10}, 400, "quantity"),
    ({"sku": "SKU-1", "quantity": 1, "amount": 10, "coupon": "x"}, 400, "unknown field `coupon`"),
])
def test_bad_orders_are_refused_naming_the_field(checkout: Checkout, body: dict[str, Any], status: int,
                                                  words: str) -> None:
    from conftest import http
    got, _, answer = http("POST", checkout.url("orders", "/orders"), body)
    assert got == status and words in answer["error"], answer
    got, _, answer = http("GET", checkout.url("orders", "/orders/not-a-uuid"))
    assert got == 400 and "UUID" in answer["error"]
    got, _, answer = http("GET", checkout.url("orders", f"/orders/{uuid.uuid4()}"))
    assert got == 404


# (service, step, amount): the step of that service held in flight, then SIGKILLed.
KILLS = [
    ("orders", "place", 100),
    ("orders", "handle", 100),
    ("inventory", "reserve", 100),
    ("payments", "charge", 100),
    ("inventory", "release", LIMIT + 1),
]
CASES = [(*k, phase) for k in KILLS for phase in ("before-commit", "after-commit")]


def visible(c: Checkout, step: str, order_id: str) -> bool:
    """Whether the effect of `step` for `order_id` is committed."""
    queries = {
        "place": "SELECT count(*) FROM orders.orders WHERE id = %s",
        "handle": "SELECT count(*) FROM orders.sagas WHERE order_id = %s AND state <> 'RESERVING_STOCK' "
                  "UNION ALL SELECT count(*) FROM orders.orders WHERE id = %s AND status <> 'PENDING'",
        "reserve": "SELECT count(*) FROM inventory.reservations WHERE order_id = %s",
        "release": "SELECT count(*) FROM inventory.reservations WHERE order_id = %s AND status = 'released'",
        "charge": "SELECT count(*) FROM payments.payments WHERE order_id = %s",
    }
    q = queries[step]
    rows = c.db.execute(q, (order_id,) * q.count("%s")).fetchall()
    return sum(r[0] for r in rows) > 0


@pytest.mark.parametrize("service, step, amount, phase", CASES,
                         ids=[f"{s}-{p}-{ph}" for s, p, _, ph in CASES])
def test_a_service_killed_mid_step_and_restarted_does_every_step_once(
        checkout: Checkout, service: str, step: str, amount: int, phase: str) -> None:
    """Killed with the step's effect and message written and uncommitted (before-commit: the
    redelivery must do it), or committed with the delivery's ack not yet sent (after-commit:
    the redelivery, if any, must not do it again)."""
    for marker in checkout.pause_dir.iterdir():
        marker.unlink()
    checkout.restart(service, pause=step, phase=phase)
    key = f"kill-{service}-{step}-{phase}-{uuid.uuid4()}"
    sku = "SKU-4"
    if step == "place":
        # The request itself is held; the client sees the connection drop.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(checkout.place, sku, 1, amount, key, 60.0)
            marker = poll("the order's transaction held", lambda: next(checkout.pause_dir.glob("place.*"), None))
            held = marker.name.split(".", 1)[1]
            assert visible(checkout, step, held) == (phase == "after-commit")
            checkout.kill(service)
            with pytest.raises(OSError):
                pending.result(timeout=30)
        checkout.start(service)
        order_id = place(checkout, sku, 1, amount, key)  # the client's retry with the same key
        if phase == "before-commit":
            assert order_id != held, "the killed transaction never committed"
        else:
            assert order_id == held, "the committed order is the one the key returns"
    else:
        order_id = place(checkout, sku, 1, amount, key)
        poll(f"{service} holding {step} ({phase})",
             lambda: (checkout.pause_dir / f"{step}.{order_id}").exists() or None)
        assert visible(checkout, step, order_id) == (phase == "after-commit")
        checkout.kill(service)
        checkout.start(service)
    order = checkout.settled(order_id)
    outcome = "confirmed" if amount <= LIMIT else "declined"
    assert order["status"] == ("CONFIRMED" if outcome == "confirmed" else "CANCELLED"), order
    checkout.quiet()
    assert checkout.messages(order_id) == SAGAS[(checkout.style, outcome)]
    assert checkout.db.execute("SELECT count(*) FROM orders.orders WHERE idempotency_key = %s",
                               (key,)).fetchone() == (1,)
    if step != "place" and phase == "before-commit":
        # The killed delivery came again and did its step then, once.
        counts = checkout.db.execute(
            "SELECT max(d.delivery_count) FROM outbox.inbox d JOIN outbox.messages m USING (message_id) "
            "WHERE m.ordering_key = %s AND d.consumer = %s", (order_id, service)).fetchone()
        assert counts is not None and counts[0] >= 2, counts
    check_invariants(checkout)


def test_a_burst_of_orders_survives_each_service_killed_in_turn(checkout: Checkout) -> None:
    """Sixty orders from four clients while Inventory, Payments and Orders are SIGKILLed and
    restarted one after the other, each once the saga has made some progress past the last
    kill; a client whose request fails retries with the same Idempotency-Key. Every order
    settles, with each step exactly once."""
    n = 60
    keys = [f"burst-{uuid.uuid4()}" for _ in range(n)]
    amounts = [LIMIT + 50 if i % 4 == 0 else 100 for i in range(n)]

    def submit(i: int) -> str:
        def attempt() -> str | None:
            status, _, body = checkout.place("SKU-3", 1, amounts[i], keys[i], timeout=10)
            return str(body["id"]) if status == 202 else None
        return poll(f"order {i} accepted", attempt, bound=60)

    def count(sql: str) -> int:
        row = checkout.db.execute(sql).fetchone()
        return int(row[0]) if row else 0

    reservations = "SELECT count(*) FROM inventory.reservations"
    payments = "SELECT count(*) FROM payments.payments"
    settled = "SELECT count(*) FROM orders.orders WHERE status <> 'PENDING' AND idempotency_key LIKE 'burst-%'"
    in_flight: list[int] = []
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(submit, i) for i in range(n)]
        for service, progress in (("inventory", reservations), ("payments", payments), ("orders", settled)):
            start = count(progress)
            poll(f"progress before killing {service}", lambda: count(progress) >= start + 5 or None)
            checkout.kill(service)
            in_flight.append(n - count(settled))
            checkout.start(service)
        ids = [f.result(timeout=90) for f in futures]
    # The kills landed while the burst flowed: orders were unsettled at each.
    assert all(unsettled > 0 for unsettled in in_flight), in_flight
    assert len(set(ids)) == n
    for order_id, amount in zip(ids, amounts):
        order = checkout.settled(order_id)
        assert order["status"] == ("CONFIRMED" if amount <= LIMIT else "CANCELLED"), order
    checkout.quiet()
    for order_id, amount in zip(ids, amounts):
        outcome = "confirmed" if amount <= LIMIT else "declined"
        assert checkout.messages(order_id) == SAGAS[(checkout.style, outcome)], order_id
    rows = checkout.db.execute("SELECT count(*) FROM orders.orders WHERE idempotency_key = ANY(%s)", (keys,))
    assert rows.fetchone() == (n,)
    check_invariants(checkout)


def test_run_sh_stops_before_anything_when_a_port_is_in_use(tmp_path: Any) -> None:
    """The README's outboxd (or an earlier demo) may still hold a port: run.sh says which and
    what to do, at once, before it builds, starts or changes anything (it once created its
    consumers on whichever outboxd answered on its port)."""
    import socket
    import subprocess
    import time

    from conftest import CHECKOUT, free_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        others = [str(free_port()) for _ in range(3)]
        began = time.monotonic()
        # CHECKOUT_BUILD=never and no binaries: it would fail there if it got that far.
        env = {k: v for k, v in __import__("os").environ.items()
               if k not in ("OUTBOXD_BIN", "OUTBOXCTL_BIN", "ORDERS_BIN")}
        env.update({"CHECKOUT_BUILD": "never", "CARGO_TARGET_DIR": str(tmp_path / "no-builds"),
                    "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"})
        done = subprocess.run(
            ["bash", str(CHECKOUT / "run.sh"), "--grpc-port", str(port), "--orders-port", others[0],
             "--inventory-port", others[1], "--payments-port", others[2]],
            env=env, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert done.returncode == 2, done.stderr
        assert f"127.0.0.1:{port} (--grpc-port) is in use" in done.stderr, done.stderr
        assert "Nothing was started or changed" in done.stderr, done.stderr
        assert "checkout: " not in done.stderr, f"it got as far as preparing: {done.stderr}"
        assert time.monotonic() - began < 10

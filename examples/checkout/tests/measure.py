"""Measures the checkout saga on this machine, per style: N orders placed by 8 clients at
once against the same processes as the end-to-end test (debug builds unless CHECKOUT_PROFILE
is release), then the latency from an order's insert to its final status (orders.orders
created_at -> updated_at, both stamped by PostgreSQL) and the throughput from the first
insert to the last settlement. Run it with `examples/checkout/test.sh --measure [N]`.
"""

from __future__ import annotations

import concurrent.futures
import pathlib
import statistics
import sys
import tempfile
import uuid

from conftest import Checkout, poll


def measure(style: str, n: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        c = Checkout(style, pathlib.Path(tmp))
        try:
            def order(i: int) -> str:
                status, _, body = c.place(f"SKU-{i % 5 + 1}", 1, 100 if i % 10 else 5000, f"m-{uuid.uuid4()}")
                assert status == 202, body
                return str(body["id"])

            for i in range(20):  # warm-up: connections, pools, prepared statements
                order(i)
            poll("warm-up settled", lambda: c.db.execute(
                "SELECT count(*) = 0 FROM orders.orders WHERE status = 'PENDING'").fetchone()[0] or None, 60)
            c.db.execute("DELETE FROM orders.sagas")
            c.db.execute("DELETE FROM orders.orders")
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                list(pool.map(order, range(n)))
            poll("all settled", lambda: c.db.execute(
                "SELECT count(*) = 0 FROM orders.orders WHERE status = 'PENDING'").fetchone()[0] or None, 300)
            rows = c.db.execute(
                "SELECT extract(epoch FROM updated_at - created_at) * 1000, status FROM orders.orders").fetchall()
            span = c.db.execute(
                "SELECT extract(epoch FROM max(updated_at) - min(created_at)) FROM orders.orders").fetchone()[0]
            ms = sorted(float(r[0]) for r in rows)
            q = statistics.quantiles(ms, n=100)
            return (f"{style:13} {n} orders in {float(span):.1f} s = {n / float(span):.0f} orders/s; "
                    f"insert to final status p50 {q[49]:.0f} ms, p95 {q[94]:.0f} ms, max {ms[-1]:.0f} ms")
        finally:
            c.close()


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    for style in ("orchestration", "choreography"):
        print(measure(style, n), flush=True)

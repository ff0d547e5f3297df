"""Every Python example of docs/clients/python.md runs as written, in order, each as its own
script (`python example.py`), against this session's outboxd and database: OUTBOXD_SERVER and
DATABASE_URL point the examples there, as the page says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from support import REPO, Outboxd

DOC = REPO / "docs" / "clients" / "python.md"


def examples() -> list[str]:
    blocks = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(), flags=re.M | re.S)
    assert blocks, f"{DOC} has Python examples"
    return blocks


def test_every_example_of_the_python_page_runs_in_order(server: Outboxd, database_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "OUTBOXD_SERVER": server.endpoint, "DATABASE_URL": database_url}
    for k in ("OUTBOXD_TOKEN", "OUTBOXD_TLS_CA"):
        env.pop(k, None)
    outputs = []
    for i, code in enumerate(examples(), 1):
        path = tmp_path / f"example_{i}.py"
        path.write_text(code)
        run = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, f"example {i} failed:\n{code}\n--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}"
        outputs.append(run.stdout)
    setup, produce, consume, watch = outputs[:4]
    assert setup.startswith("Consumer(name='py-billing', topics=('py.orders.*',), max_deliveries=5, ")
    m = re.search(r"order (\d+): message ([0-9a-f-]{36})", produce)
    assert m, produce
    assert f"charged order {m[1]} (message {m[2]}, delivery 1)" in consume
    assert "py-billing: backlog 0, acked 1, dead 0" in watch
    assert "ConsumerStats(consumer='py-billing', backlog=0" in watch

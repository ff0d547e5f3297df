"""The client contract (contract/, ADR 0084): this package's topic validation runs the
grammar's test vectors, and its statements are the contract's (scripts/contract.py --check
keeps the generated copy in step)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import outboxd
from outboxd import _contract

CONTRACT = Path(__file__).resolve().parents[3] / "contract"
GRAMMAR: dict[str, Any] = json.loads((CONTRACT / "topics.json").read_text())


def outbox_file() -> sqlite3.Connection:
    """An in-memory stand-in for outboxd's SQLite file: the columns the contract's enqueue writes."""
    conn = sqlite3.connect(":memory:")
    conn.execute(
        "CREATE TABLE outbox_messages (topic TEXT, type TEXT, payload BLOB, headers TEXT, "
        "message_id TEXT UNIQUE, ordering_key TEXT)"
    )
    return conn


@pytest.mark.parametrize("topic", GRAMMAR["topics"]["valid"] + ["a" * GRAMMAR["max_length"]])
def test_valid_topics_are_enqueued(topic: str) -> None:
    conn = outbox_file()
    outboxd.enqueue(conn, topic, "T", b"")
    assert conn.execute("SELECT topic FROM outbox_messages").fetchall() == [(topic,)]


@pytest.mark.parametrize("topic", GRAMMAR["topics"]["invalid"] + ["a" * (GRAMMAR["max_length"] + 1)])
def test_invalid_topics_raise_before_any_sql(topic: str) -> None:
    conn = outbox_file()
    with pytest.raises(outboxd.InvalidMessage, match="invalid topic"):
        outboxd.enqueue(conn, topic, "T", b"")
    assert conn.execute("SELECT count(*) FROM outbox_messages").fetchone() == (0,)


def test_the_limit_is_the_contracts() -> None:
    assert _contract.TOPIC_MAX_LEN == GRAMMAR["max_length"]
    assert _contract.TOPIC_REGEX == GRAMMAR["topic_regex"]

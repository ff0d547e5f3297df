"""Fixtures: one PostgreSQL database per test session (`outboxd_test_py_<random>`, dropped at
the end), an outboxd serving it, and clients."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest

import outboxd
from support import ADMIN_URL, Outboxd
import tracing  # noqa: F401  (sets the session's tracer provider)


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    name = f"outboxd_test_py_{secrets.token_hex(6)}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    yield url
    with psycopg.connect(ADMIN_URL, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def server(database_url: str) -> Iterator[Outboxd]:
    s = Outboxd(database_url).start()
    yield s
    s.stop()


@pytest.fixture
async def admin(server: Outboxd) -> AsyncIterator[outboxd.AdminClient]:
    async with outboxd.AdminClient(server.endpoint) as a:
        yield a


@pytest.fixture
def pg(database_url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(database_url) as c:
        yield c

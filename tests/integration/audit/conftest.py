"""Fixtures of the audit suite: every test runs on SQLite and on PostgreSQL.

Each test gets a database of its own, migrated to head (whatever revisions exist), because some
tests change the schema to make a violation possible at all (dropping a UNIQUE constraint).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.persistence.db import create_engine
from controlplane.persistence.migrate import upgrade
from controlplane.persistence.repository import Store
from tests.integration.audit.history import History, build_history
from tests.integration.audit.tamper import Tamper

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The database backend under test."""
    return str(request.param)


# Synchronous on purpose: `fresh_postgres_url` runs asyncio.run, which must not happen inside
# the test's event loop, and it is requested lazily so a SQLite run never needs the server.
@pytest.fixture
def empty_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of the backend, removed after the test."""
    if backend == "postgresql":
        return str(request.getfixturevalue("fresh_postgres_url"))
    return f"sqlite+aiosqlite:///{tmp_path / 'audit.db'}"


@pytest_asyncio.fixture
async def database_url(empty_url: str) -> str:
    """The test's database, migrated to head."""
    await upgrade(empty_url)
    return empty_url


@pytest_asyncio.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """The engine the checker and the store use, disposed afterwards."""
    eng = create_engine(database_url)
    try:
        yield eng
    finally:
        await eng.dispose()


@pytest.fixture
def store(engine: AsyncEngine) -> Store:
    """The public repository that writes the clean history."""
    return Store(engine)


@pytest_asyncio.fixture
async def tamper(database_url: str, backend: str) -> AsyncIterator[Tamper]:
    """Direct SQL that bypasses the store (and foreign keys) to inject violations."""
    t = Tamper(database_url, backend)
    try:
        yield t
    finally:
        await t.close()


@pytest_asyncio.fixture
async def history(store: Store) -> History:
    """The clean history, written without leases."""
    return await build_history(store)

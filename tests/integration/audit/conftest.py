"""Fixtures of the audit suite: every test runs on SQLite and on PostgreSQL.

Each test gets a database of its own, migrated to head (whatever revisions exist), because some
tests change the schema to make a violation possible at all (dropping a UNIQUE constraint):
`backend`, `empty_url`, `database_url` and `engine` are tests/integration/conftest.py's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.persistence.repository import Store
from tests.integration.audit.history import History, build_history
from tests.integration.audit.tamper import Tamper

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

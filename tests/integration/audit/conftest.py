"""Fixtures of the audit suite: every test runs on SQLite and on PostgreSQL.

Each test gets a database of its own, migrated to head (whatever revisions exist), because some
tests change the schema to make a violation possible at all (dropping a UNIQUE constraint):
`backend`, `empty_url`, `database_url`, `engine` and `db` (the clean history is written through
its units of work) are tests/integration/conftest.py's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio

from controlplane.persistence.database import Database
from tests.integration.audit.history import History, build_history
from tests.integration.audit.tamper import Tamper


@pytest_asyncio.fixture
async def tamper(database_url: str, backend: str) -> AsyncIterator[Tamper]:
    """Direct SQL that bypasses the store (and foreign keys) to inject violations."""
    t = Tamper(database_url, backend)
    try:
        yield t
    finally:
        await t.close()


@pytest_asyncio.fixture
async def history(db: Database) -> History:
    """The clean history, written without leases."""
    return await build_history(db)

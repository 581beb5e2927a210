"""A PostgreSQL server that refuses a connection for lack of slots is an outage, not a bug.

The server answers SQLSTATE 53300 (too many connections) when it is full; through SQLAlchemy's
asyncpg adapter that arrives as a generic DBAPIError, which was taken for a bug (INTERNAL at
CreateTask). A role limited to no connections makes the real server give that same answer.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from controlplane.persistence.errors import StoreUnavailable, is_outage, translate_outage
from tests.conftest import PostgresServer

pytestmark = pytest.mark.postgres


@pytest.fixture
async def full_server_url(postgres_server: PostgresServer) -> AsyncIterator[str]:
    """A URL whose role may open no connection: the server answers as when it is full."""
    role = f"vidroute_full_{secrets.token_hex(4)}"
    admin = create_async_engine(
        postgres_server.maintenance_url, isolation_level="AUTOCOMMIT", poolclass=NullPool
    )
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 0'))
        url = postgres_server.maintenance_url.set(username=role, password=None)
        yield url.render_as_string(hide_password=False)
    finally:
        async with admin.connect() as conn:
            await conn.execute(text(f'DROP ROLE IF EXISTS "{role}"'))
        await admin.dispose()


async def test_too_many_connections_is_store_unavailable(full_server_url: str) -> None:
    """SQLSTATE 53300 from the real server is an outage and becomes StoreUnavailable."""
    engine = create_async_engine(full_server_url, poolclass=NullPool)

    async def select_one() -> None:
        with translate_outage():
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))

    try:
        with pytest.raises(StoreUnavailable) as raised:
            await select_one()
        cause = raised.value.__cause__
        assert cause is not None
        assert is_outage(cause)
        assert "too many connections" in raised.value.detail
    finally:
        await engine.dispose()

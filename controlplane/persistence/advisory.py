"""A PostgreSQL session-level advisory lock on a dedicated connection (leader election).

The connection is autocommit and outside any pool, so the lock lives exactly as long as this
session: PostgreSQL releases it when the connection dies. `scheduling.leader` decides what
holding it means; this module only speaks SQL. `DatabaseUnavailable` is what every failure of
the connection surfaces as, so the caller needs no driver or SQLAlchemy types.
"""

from __future__ import annotations

import asyncio
import contextlib

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import NullPool

from controlplane.persistence.db import create_engine
from controlplane.persistence.errors import PersistenceError

__all__ = ["AdvisoryLockSession", "DatabaseUnavailable"]


class DatabaseUnavailable(PersistenceError):
    """The lock's connection could not be opened or used (network, server, timeout)."""


_FAILURES = (OSError, TimeoutError, DBAPIError, SQLAlchemyError)


class AdvisoryLockSession:
    """``pg_try_advisory_lock(key)`` held on one dedicated autocommit connection."""

    def __init__(self, url: str, key: int) -> None:
        self._key = key
        self._engine: AsyncEngine = create_engine(
            url, poolclass=NullPool, isolation_level="AUTOCOMMIT"
        )
        self._conn: AsyncConnection | None = None
        self.backend_pid: int | None = None

    async def try_lock(self) -> bool:
        """Open a fresh connection and try the lock on it; False (connection closed) if taken."""
        await self.drop()
        try:
            self._conn = await self._engine.connect()
            got = await self._conn.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": self._key})
            self.backend_pid = await self._conn.scalar(text("SELECT pg_backend_pid()"))
        except _FAILURES as exc:
            await self.drop()
            raise DatabaseUnavailable(repr(exc)) from exc
        if not got:
            await self.drop()
        return bool(got)

    async def ping(self, timeout_s: float = 5.0) -> None:
        """Prove the session is alive; `DatabaseUnavailable` (connection dropped) if not."""
        if self._conn is None:
            raise DatabaseUnavailable("no lock session")
        try:
            async with asyncio.timeout(timeout_s):
                await self._conn.execute(text("SELECT 1"))
        except _FAILURES as exc:
            await self.drop()
            raise DatabaseUnavailable(repr(exc)) from exc

    async def unlock(self) -> None:
        """Release the lock and close the session (closing alone would release it too)."""
        if self._conn is not None:
            with contextlib.suppress(*_FAILURES):
                await self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
        await self.drop()

    async def drop(self) -> None:
        """Close the session (which releases the lock if it was held)."""
        conn, self._conn, self.backend_pid = self._conn, None, None
        if conn is not None:
            try:
                await conn.close()
            except (OSError, SQLAlchemyError):
                await conn.invalidate()

    async def dispose(self) -> None:
        await self.drop()
        await self._engine.dispose()

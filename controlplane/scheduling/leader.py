"""Leader election for the dispatcher: one leader per shard.

On PostgreSQL the leader holds a session-level ``pg_try_advisory_lock(shard key)`` on a
dedicated connection (autocommit, outside any pool). PostgreSQL releases the lock when that
session ends, so a crashed or partitioned leader loses leadership as soon as its connection
dies, and another replica's next ``try_acquire`` wins. The leader checks its connection before
every dispatch round (`still_held`), so it stops dispatching when it can no longer prove it
holds the lock.

On SQLite (single node, development) `LocalLock` is a process-local lock: one replica only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from typing import Protocol

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import NullPool

from controlplane.persistence.db import create_engine, is_sqlite

log = logging.getLogger(__name__)


class LeaderLock(Protocol):
    """Leadership of one shard."""

    name: str

    async def try_acquire(self) -> bool:
        """Take leadership if free; True when this process now leads (idempotent)."""
        ...

    async def still_held(self) -> bool:
        """Whether leadership is still provably ours (False after the connection died)."""
        ...

    async def release(self) -> None:
        """Give leadership up (idempotent)."""
        ...


def lock_key(name: str) -> int:
    """A stable signed 64-bit advisory lock key for a shard name."""
    digest = hashlib.sha256(f"vidroute.dispatcher:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PostgresAdvisoryLock:
    """``pg_try_advisory_lock`` held on a dedicated autocommit connection."""

    def __init__(self, url: str, name: str = "shard-0") -> None:
        self.name = name
        self._key = lock_key(name)
        self._engine: AsyncEngine = create_engine(
            url, poolclass=NullPool, isolation_level="AUTOCOMMIT"
        )
        self._conn: AsyncConnection | None = None
        self._held = False
        self._pid: int | None = None

    @property
    def backend_pid(self) -> int | None:
        """The server process id of the lock's session (for operators and tests)."""
        return self._pid

    async def try_acquire(self) -> bool:
        if self._held and await self.still_held():
            return True
        await self._drop_connection()
        try:
            self._conn = await self._engine.connect()
            got = await self._conn.scalar(text("SELECT pg_try_advisory_lock(:k)"), {"k": self._key})
            self._pid = await self._conn.scalar(text("SELECT pg_backend_pid()"))
        except (OSError, SQLAlchemyError) as exc:
            log.warning("leader lock %s: cannot reach PostgreSQL: %r", self.name, exc)
            await self._drop_connection()
            return False
        self._held = bool(got)
        if not self._held:
            await self._drop_connection()
        else:
            log.info("leader lock %s acquired (backend pid %s)", self.name, self._pid)
        return self._held

    async def still_held(self) -> bool:
        if not self._held or self._conn is None:
            return False
        try:
            async with asyncio.timeout(5):
                await self._conn.execute(text("SELECT 1"))
        except (OSError, TimeoutError, DBAPIError, SQLAlchemyError) as exc:
            log.warning("leader lock %s lost: %r", self.name, exc)
            self._held = False
            await self._drop_connection()
            return False
        return True

    async def release(self) -> None:
        if self._held and self._conn is not None:
            # The session is closed right after, which releases the lock anyway.
            with contextlib.suppress(OSError, SQLAlchemyError):
                await self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
        self._held = False
        await self._drop_connection()

    async def close(self) -> None:
        await self.release()
        await self._engine.dispose()

    async def _drop_connection(self) -> None:
        conn, self._conn, self._pid = self._conn, None, None
        if conn is not None:
            try:
                await conn.close()
            except (OSError, SQLAlchemyError):
                await conn.invalidate()


class LocalLock:
    """Process-local leadership (SQLite, tests): the first holder of a name leads."""

    _holders: dict[str, int] = {}  # noqa: RUF012 - deliberately shared by every instance

    def __init__(self, name: str = "shard-0") -> None:
        self.name = name

    async def try_acquire(self) -> bool:
        holder = LocalLock._holders.setdefault(self.name, id(self))
        return holder == id(self)

    async def still_held(self) -> bool:
        return LocalLock._holders.get(self.name) == id(self)

    async def release(self) -> None:
        if LocalLock._holders.get(self.name) == id(self):
            del LocalLock._holders[self.name]

    async def close(self) -> None:
        await self.release()


def leader_lock_for(url: str, name: str = "shard-0") -> PostgresAdvisoryLock | LocalLock:
    """The right lock for the database behind `url`."""
    return LocalLock(name) if is_sqlite(url) else PostgresAdvisoryLock(url, name)

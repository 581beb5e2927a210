"""PostgreSQL advisory locks: a session-level one on a dedicated connection (leader election),
and `xact_lock`, a transaction-scoped one named by a string (serialising writers of one thing).

The connection is autocommit and outside any pool, so the lock lives exactly as long as this
session: PostgreSQL releases it when the connection dies. `scheduling.leader` decides what
holding it means; this module only speaks SQL. `DatabaseUnavailable` is what every failure of
the connection surfaces as, so the caller needs no driver or SQLAlchemy types.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib

from sqlalchemy import func, select, text
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import NullPool

from controlplane.persistence.db import create_engine
from controlplane.persistence.errors import PersistenceError

__all__ = ["AdvisoryLockSession", "DatabaseUnavailable", "ReplicaLockSession", "xact_lock"]


async def xact_lock(conn: AsyncConnection, name: str) -> None:
    """Hold the advisory lock named `name` until this transaction ends (PostgreSQL; the key is
    a 64-bit hash of the name). On SQLite nothing: its ``BEGIN IMMEDIATE`` already serialises
    writers."""
    if conn.dialect.name != "postgresql":
        return
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    key = int.from_bytes(digest, "big", signed=True)
    await conn.execute(select(func.pg_advisory_xact_lock(key)))


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


# Two-key advisory locks of the sharded dispatcher (`scheduling.leader.ShardLeadership`):
# (MEMBER_CLASS, member) marks a live replica, (SHARD_CLASS, shard) leads a shard. Both are held
# on one session per replica, so `pg_locks` shows who is alive and who leads what by backend pid.
MEMBER_CLASS = 0x56520001
SHARD_CLASS = 0x56520002


class ReplicaLockSession:
    """One replica's dedicated autocommit session holding its member lock and shard locks.

    Statements are serialized (one connection, several dispatchers). Every failure is
    `DatabaseUnavailable` and drops the session, which releases all its locks at once.
    """

    def __init__(self, url: str, member: int) -> None:
        self.member = member
        self._engine: AsyncEngine = create_engine(
            url, poolclass=NullPool, isolation_level="AUTOCOMMIT"
        )
        self._conn: AsyncConnection | None = None
        self._lock = asyncio.Lock()
        self.backend_pid: int | None = None
        self.held: set[int] = set()

    async def _connected(self) -> AsyncConnection:
        if self._conn is None:
            conn = await self._engine.connect()
            try:
                got = await conn.scalar(
                    text("SELECT pg_try_advisory_lock(:c, :m)"),
                    {"c": MEMBER_CLASS, "m": self.member},
                )
                if not got:
                    raise DatabaseUnavailable(f"member id {self.member} already in use")
                self.backend_pid = await conn.scalar(text("SELECT pg_backend_pid()"))
            except BaseException:
                await conn.close()
                raise
            self._conn, self.held = conn, set()
        return self._conn

    async def _run(self, sql: str, params: dict[str, int], timeout_s: float = 5.0) -> object:
        async with self._lock:
            try:
                async with asyncio.timeout(timeout_s):
                    conn = await self._connected()
                    return await conn.scalar(text(sql), params)
            except _FAILURES as exc:
                await self._drop()
                raise DatabaseUnavailable(repr(exc)) from exc

    async def try_shard(self, shard: int) -> bool:
        if shard in self.held and self._conn is not None:
            return True  # advisory locks nest: never take one twice (one unlock must free it)
        got = bool(
            await self._run("SELECT pg_try_advisory_lock(:c, :s)", {"c": SHARD_CLASS, "s": shard})
        )
        if got:
            self.held.add(shard)
        return got

    async def release_shard(self, shard: int) -> None:
        if shard in self.held:
            self.held.discard(shard)
            await self._run("SELECT pg_advisory_unlock(:c, :s)", {"c": SHARD_CLASS, "s": shard})

    async def ping(self) -> None:
        if self._conn is None:
            raise DatabaseUnavailable("no lock session")
        await self._run("SELECT 1", {})

    async def view(self) -> tuple[set[int], dict[int, int]]:
        """(backend pids of live members, shard -> backend pid of its leader) in this database."""
        async with self._lock:
            try:
                async with asyncio.timeout(5.0):
                    conn = await self._connected()
                    rows = (
                        await conn.execute(
                            text(
                                "SELECT classid::bigint, objid::bigint, pid FROM pg_locks"
                                " WHERE locktype = 'advisory' AND granted AND objsubid = 2"
                                " AND classid::bigint IN (:mc, :sc) AND database ="
                                " (SELECT oid FROM pg_database WHERE datname = current_database())"
                            ),
                            {"mc": MEMBER_CLASS, "sc": SHARD_CLASS},
                        )
                    ).all()
            except _FAILURES as exc:
                await self._drop()
                raise DatabaseUnavailable(repr(exc)) from exc
        members = {int(pid) for cls, _, pid in rows if int(cls) == MEMBER_CLASS}
        shards = {int(obj): int(pid) for cls, obj, pid in rows if int(cls) == SHARD_CLASS}
        return members, shards

    async def _drop(self) -> None:
        conn, self._conn, self.backend_pid, self.held = self._conn, None, None, set()
        if conn is not None:
            try:
                await conn.close()
            except (OSError, SQLAlchemyError):
                await conn.invalidate()

    async def close(self) -> None:
        async with self._lock:
            await self._drop()
        await self._engine.dispose()

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

import hashlib
import logging
from typing import Protocol

from controlplane.persistence.advisory import AdvisoryLockSession, DatabaseUnavailable
from controlplane.persistence.db import is_sqlite

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
        self._session = AdvisoryLockSession(url, lock_key(name))
        self._held = False

    @property
    def backend_pid(self) -> int | None:
        """The server process id of the lock's session (for operators and tests)."""
        return self._session.backend_pid

    async def try_acquire(self) -> bool:
        if self._held and await self.still_held():
            return True
        try:
            self._held = await self._session.try_lock()
        except DatabaseUnavailable as exc:
            log.warning("leader lock %s: cannot reach PostgreSQL: %s", self.name, exc)
            self._held = False
            return False
        if self._held:
            log.info("leader lock %s acquired (backend pid %s)", self.name, self.backend_pid)
        return self._held

    async def still_held(self) -> bool:
        if not self._held:
            return False
        try:
            await self._session.ping()
        except DatabaseUnavailable as exc:
            log.warning("leader lock %s lost: %s", self.name, exc)
            self._held = False
            return False
        return True

    async def release(self) -> None:
        if self._held:
            await self._session.unlock()
        else:
            await self._session.drop()
        self._held = False

    async def close(self) -> None:
        await self.release()
        await self._session.dispose()


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

"""Leader election for the dispatcher: one leader per shard.

On PostgreSQL the leader holds a session-level ``pg_try_advisory_lock(shard key)`` on a
dedicated connection (autocommit, outside any pool). PostgreSQL releases the lock when that
session ends, so a crashed or partitioned leader loses leadership as soon as its connection
dies, and another replica's next ``try_acquire`` wins. The leader checks its connection before
every dispatch round (`still_held`), so it stops dispatching when it can no longer prove it
holds the lock.

With ``shard_count`` > 1 on PostgreSQL, `ShardLeadership` holds one replica's shard locks and
balances the shards over the live replicas (see its docstring); tenants are hashed to shards
(`controlplane.domain.scoring.bucket`, sha256), so each task has one shard and one leader.

On SQLite (single node, development) `LocalLock` is a process-local lock: one replica only.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import time
from collections.abc import Callable
from typing import Protocol

from controlplane.persistence.advisory import (
    AdvisoryLockSession,
    DatabaseUnavailable,
    ReplicaLockSession,
)
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


class ShardLeadership:
    """One replica's leadership of the dispatcher shards (``shard_count`` > 1, PostgreSQL).

    Every replica holds a member lock and the locks of the shards it leads on one dedicated
    session (`ReplicaLockSession`), so ``pg_locks`` tells each replica how many replicas are
    alive and who leads which shard; a replica that dies (or loses its connection) releases
    everything at once and the others' next `try_acquire` takes its shards. Balance: a replica
    takes a free shard while it leads fewer than its fair share ``ceil(shards / replicas)``
    (or when the shard has stayed free for `orphan_grace_s`, so no shard waits on a slow
    peer), and gives one up, after that shard's round, when it leads more than its share while
    another replica leads less: two replicas with four shards lead two each.
    """

    def __init__(
        self,
        url: str,
        shard_count: int,
        *,
        orphan_grace_s: float = 6.0,
        member: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.shard_count = shard_count
        self.session = ReplicaLockSession(url, member or secrets.randbelow(2**31 - 2) + 1)
        self._orphan_grace_s = orphan_grace_s
        self._free_since: dict[int, float] = {}
        self._clock = clock
        # Between rounds a leader only pings; who is alive and who leads (the balance) is read
        # at most this often, so a busy dispatcher does not scan pg_locks every round.
        self._view_every_s = orphan_grace_s / 6
        self._viewed_at = -float("inf")

    @property
    def led(self) -> set[int]:
        return set(self.session.held)

    def lock(self, shard: int) -> ShardLock:
        return ShardLock(self, shard)

    async def try_acquire(self, shard: int) -> bool:
        session = self.session
        if shard in session.held:
            return await self.still_held(shard)
        try:
            members, holders = await session.view()
            if shard in holders:
                self._free_since.pop(shard, None)
                return False
            first_free = self._free_since.setdefault(shard, self._clock())
            mine = len(session.held)
            orphaned = self._clock() - first_free >= self._orphan_grace_s
            if mine >= self._share(members) and not orphaned:
                return False
            got = await session.try_shard(shard)
        except DatabaseUnavailable as exc:
            log.warning("shard %s: cannot reach PostgreSQL: %s", shard, exc)
            return False
        if got:
            self._free_since.pop(shard, None)
            log.info("shard %s: leading (backend pid %s)", shard, session.backend_pid)
        return got

    async def still_held(self, shard: int) -> bool:
        session = self.session
        if shard not in session.held:
            return False
        try:
            if self._clock() - self._viewed_at < self._view_every_s:
                await session.ping()  # alive session: its session-level locks are still ours
                return shard in session.held
            members, holders = await session.view()
            self._viewed_at = self._clock()
            if holders.get(shard) != session.backend_pid:
                session.held.discard(shard)
                return False
            if self._should_give_up(shard, members, holders):
                log.info(
                    "shard %s: handing over (leading %d of %d shards, %d replicas)",
                    shard,
                    len(session.held),
                    self.shard_count,
                    len(members),
                )
                await session.release_shard(shard)
                return False
        except DatabaseUnavailable as exc:
            log.warning("shard %s: leadership lost: %s", shard, exc)
            return False
        return True

    def _share(self, members: set[int]) -> int:
        return -(-self.shard_count // max(1, len(members)))

    def _should_give_up(self, shard: int, members: set[int], holders: dict[int, int]) -> bool:
        mine = sorted(self.session.held)
        share = self._share(members)
        if len(mine) <= share:
            return False
        led: dict[int, int] = dict.fromkeys(members, 0)
        for pid in holders.values():
            led[pid] = led.get(pid, 0) + 1
        if not any(n < share for pid, n in led.items() if pid != self.session.backend_pid):
            return False  # nobody to take it: keep leading it
        return shard in mine[share:]  # the highest-numbered beyond the share go

    async def release(self, shard: int) -> None:
        with contextlib.suppress(DatabaseUnavailable):  # the session is gone, locks with it
            await self.session.release_shard(shard)

    async def close(self) -> None:
        await self.session.close()


class ShardLock:
    """`LeaderLock` of one shard under a replica's `ShardLeadership`."""

    def __init__(self, leadership: ShardLeadership, shard: int) -> None:
        self.leadership = leadership
        self.shard = shard
        self.name = f"shard-{shard}"

    async def try_acquire(self) -> bool:
        return await self.leadership.try_acquire(self.shard)

    async def still_held(self) -> bool:
        return await self.leadership.still_held(self.shard)

    async def release(self) -> None:
        await self.leadership.release(self.shard)

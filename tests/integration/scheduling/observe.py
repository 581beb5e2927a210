"""Test helpers for scale-out and wake-up tests: watch attempts appear in the database, and
finish provider work at once (free the leases of dispatched attempts) so capacity never
holds a task back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable

from sqlalchemy import func, select

from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence.database import Database
from controlplane.persistence.models import task_attempts


async def eventually(check: Callable[[], Awaitable[bool] | bool], timeout_s: float = 30.0) -> None:
    """Wait until `check` holds (a condition with a deadline, not a sleep)."""
    async with asyncio.timeout(timeout_s):
        while True:
            result = check()
            if await result if isinstance(result, Awaitable) else result:
                return
            await asyncio.sleep(0.02)


async def attempt_counts(db: Database) -> Counter[int]:
    async with db.reading() as conn:
        rows = await conn.execute(
            select(task_attempts.c.task_id, func.count()).group_by(task_attempts.c.task_id)
        )
        return Counter({int(t): int(n) for t, n in rows})


class AttemptWatch:
    """Polls the attempts table (every 20 ms) and notes when each task's first attempt showed;
    with `leases`, frees every held lease too, as if each provider job ended at once."""

    def __init__(self, db: Database, leases: MemoryLeaseStore | None = None) -> None:
        self.db, self.leases = db, leases
        self.first_seen: dict[int, float] = {}
        self.counts: Counter[int] = Counter()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> AttemptWatch:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            self.counts = await attempt_counts(self.db)
            now = time.monotonic()
            for task_id in self.counts:
                self.first_seen.setdefault(task_id, now)
            if self.leases is not None:
                for account in await self.leases.accounts():
                    for lease in (await self.leases.snapshot(account)).leases:
                        await self.leases.release(lease)
            await asyncio.sleep(0.02)

"""A Redis loss never admits a second budget: the windows come back from PostgreSQL (9.11).

The dispatcher and upkeep over a real Redis lease store (fail closed) and a real database, as in
`test_rebuild_before_admission`; "Redis lost its data" is every key of the test's namespace gone.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from redis.asyncio import Redis

from controlplane.leases.redis_store import RedisLeaseStore
from controlplane.leases.windows import MINUTE
from controlplane.persistence.database import Database
from controlplane.persistence.models import task_attempts
from controlplane.scheduling.dispatcher import Dispatcher
from tests.integration.leases.test_rebuild_before_admission import leases, wired
from tests.integration.scheduling.conftest import (
    DispatcherFactory,
    adapter,
    catalogs,
    make_dispatcher,
    monitor,
    published,
)
from tests.integration.scheduling.support import make_spec, strict
from tests.integration.scheduling.test_batch_dispatch import count, state_of
from tests.integration.scheduling.test_dispatcher import new_task
from tests.integration.scheduling.test_window_dispatch import (
    GEN45,
    WINDOWED,
    runway_limit,
    verdict,
)

__all__ = ["adapter", "catalogs", "leases", "make_dispatcher", "monitor", "published"]

pytestmark = pytest.mark.redis


async def test_a_lost_store_gets_its_windows_back_before_admitting(
    db: Database,
    leases: RedisLeaseStore,
    make_dispatcher: DispatcherFactory,
    redis_client: Redis,
    redis_namespace: str,
) -> None:
    """After Redis loses every key, the round rebuilds the account's window from PostgreSQL's
    attempts before it admits anything: a second task finds the minute spent and waits, though
    a slot is free."""

    def make(**wiring: Any) -> Dispatcher:
        return make_dispatcher(
            leases=leases,
            config=dataclasses.replace(WINDOWED, window_minute_ms=60_000),
            limits_for=runway_limit(1),
            clock=lambda: datetime.now(UTC),  # attempts stamped now: inside the windows' minute
            **wiring,
        )

    dispatcher, upkeep = wired(db, leases, make)
    first = await new_task(db, make_spec(**strict("gen4.5")), "r1")
    assert await dispatcher.tick() == 1
    assert await state_of(db, first.id) == "SUBMITTING"
    keys = [key async for key in redis_client.scan_iter(match=f"{redis_namespace}*")]
    await redis_client.delete(*keys)
    assert (await leases.window_usage("runway:prod-us"))[0].used == 0

    second = await new_task(db, make_spec(**strict("gen4.5")), "r2")
    await dispatcher.tick()
    assert upkeep.rebuilds == 2
    assert await state_of(db, second.id) == "QUEUED"
    assert await count(db, task_attempts) == 1
    usage = {u.window: u.used for u in await leases.window_usage("runway:prod-us")}
    assert usage[MINUTE] == 1
    assert "submits_per_minute window full" in (await verdict(db, second.id, GEN45))["detail"]

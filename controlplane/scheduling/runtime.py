"""Wiring of the scheduler for the composition root: one call to start, one to stop.

    runtime = build_scheduling(engine=engine, database_url=url, leases=lease_store,
                               adapters={"runway": runway_client, ...},
                               redis_client=redis_or_none, policy=example_policy("router-v1"))
    await runtime.publish_capabilities(directories, accounts)   # optional, at start-up
    runtime.start()                    # dispatcher loop (leader-elected) as a background task
    servicer = SchedulerServicer(tasks, runtime.admin)
    execution -> runtime.monitor.record_outcome(key, error_class | None, latency_s)
    task.queued / task.requeue consumers -> runtime.dispatcher.wake()
    await runtime.stop()

Nothing here reads the environment; `controlplane.bootstrap` passes configuration in.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controlplane.adapters.grpc_client import AdapterClient
from controlplane.capabilities.publish import (
    AccountConfig,
    documents_from_directory,
    publish_documents,
)
from controlplane.domain.breaker import BreakerConfig, BreakerRegistry
from controlplane.domain.routing.selection import RouterConfig
from controlplane.domain.scoring import RoutingPolicy
from controlplane.leases.base import LeaseStore
from controlplane.persistence.catalog import CatalogQueries, PublishCounts
from controlplane.persistence.database import Database
from controlplane.scheduling.dispatcher import Dispatcher, DispatcherConfig
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.leader import leader_lock_for
from controlplane.scheduling.shared_state import InProcessSharedState, RedisSharedState
from controlplane.scheduling.upkeep import Upkeep, UpkeepConfig
from controlplane.service.providers import ProviderAdminService


@dataclass
class SchedulingRuntime:
    """The scheduler's long-lived parts for one process."""

    dispatcher: Dispatcher
    monitor: HealthMonitor
    admin: ProviderAdminService
    db: Database
    upkeep: Upkeep
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        """Run the dispatcher loop (it waits for leadership itself) and upkeep in the background."""
        if not self._tasks:
            self._stop.clear()
            self._tasks = [
                asyncio.create_task(self.dispatcher.run(self._stop), name="dispatcher"),
                asyncio.create_task(self.upkeep.run(self._stop), name="scheduler-upkeep"),
            ]

    async def stop(self) -> None:
        """Stop dispatching and upkeep and release leadership; idempotent."""
        self._stop.set()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        close = getattr(self.dispatcher.leader, "close", None)
        if close is not None:
            await close()

    async def publish_capabilities(
        self, directories: Sequence[Path], accounts: Iterable[AccountConfig]
    ) -> PublishCounts:
        """Publish the capability YAML of `directories` as one batch; refreshes the catalog."""
        docs = [d for directory in directories for d in documents_from_directory(directory)]
        counts = await publish_documents(
            self.db, docs, accounts, now=datetime.now(UTC), source="startup"
        )
        await self.dispatcher.catalog(refresh=True)
        return counts


def build_scheduling(
    *,
    db: Database,
    database_url: str,
    leases: LeaseStore,
    adapters: Mapping[str, AdapterClient],
    policy: RoutingPolicy,
    shadow_policy: RoutingPolicy | None = None,
    redis_client: Any | None = None,
    breaker_config: BreakerConfig | None = None,
    config: DispatcherConfig | None = None,
    worker_id: str = "scheduler",
    upkeep_config: UpkeepConfig | None = None,
) -> SchedulingRuntime:
    """Wire queries, breakers (shared through Redis when given), leader lock and dispatcher."""
    config = config or DispatcherConfig()
    catalogs = CatalogQueries(db)
    shared = RedisSharedState(redis_client) if redis_client is not None else InProcessSharedState()
    monitor = HealthMonitor(
        BreakerRegistry(breaker_config or BreakerConfig(), time.time),
        db=db,
        shared=shared,
    )
    dispatcher = Dispatcher(
        db=db,
        catalogs=catalogs,
        leases=leases,
        adapters=adapters,
        monitor=monitor,
        router=RouterConfig(policy=policy, shadow_policy=shadow_policy),
        leader=leader_lock_for(database_url, f"shard-{config.shard}"),
        config=config,
    )
    upkeep = Upkeep(
        db=db,
        leases=leases,
        catalog=dispatcher.catalog,
        is_leader=lambda: dispatcher.leading,
        wake=dispatcher.wake,
        worker_id=worker_id,
        # Rebuilt leases live as long as the dispatcher's own, whatever the upkeep config says.
        config=dataclasses.replace(
            upkeep_config or UpkeepConfig(default_concurrency=config.default_concurrency),
            lease_ttl_ms=config.lease_ttl_ms,
            lease_max_term_ms=config.lease_max_term_ms,
        ),
    )
    # No round admits work while the lease store has lost an account (9.11.2): the store refuses
    # acquires there (fail closed) and the dispatcher rebuilds before its round. Fail closed is
    # switched on here because this is what runs the rebuild that lifts it.
    leases.fail_closed = True
    leases.on_not_live = upkeep.kick
    dispatcher.before_admit = upkeep.ensure_leases_live
    return SchedulingRuntime(
        dispatcher, monitor, ProviderAdminService(catalogs, monitor), db, upkeep
    )

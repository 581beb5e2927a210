"""Wiring of the scheduler for the composition root: one call to start, one to stop.

    runtime = build_scheduling(engine=engine, database_url=url, leases=lease_store_factory,
                               adapters={"runway": runway_client, ...},
                               redis_client=redis_or_none, policy=example_policy("router-v1"))
    await runtime.publish_capabilities(directories, accounts)   # optional, at start-up
    runtime.start()                    # dispatcher loop (leader-elected) as a background task
    servicer = SchedulerServicer(tasks, runtime.admin)
    execution -> runtime.monitor.record_outcome(key, error_class | None, latency_s)
    task.queued / task.requeue consumers -> runtime.wake()   (wired to the wake-up bus)
    execution, metrics, console -> runtime.leases   (the store built with the runtime's hooks)
    await runtime.stop()

Scale-out: with ``config.shard_count`` N > 1 the runtime holds one dispatcher per shard, all
under one `ShardLeadership` (PostgreSQL advisory locks on one session): each dispatcher waits
for its shard's leadership, which the replicas balance among themselves, and dispatches only
the tenants hashed to its shard. `dispatcher` is shard 0's (catalog, readiness and metrics
are shared by all of them). Every replica must run the same ``shard_count``.

Nothing here reads the environment; `controlplane.bootstrap` passes configuration in.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controlplane.adapters.grpc_client import AdapterClient
from controlplane.capabilities.catalog import CapabilityCatalog
from controlplane.capabilities.publish import (
    AccountConfig,
    documents_from_directory,
    publish_documents,
)
from controlplane.domain.accounts import AccountLimits
from controlplane.domain.breaker import BreakerConfig, BreakerRegistry, BreakerTransition
from controlplane.domain.routing.policy_document import PolicyDocument
from controlplane.domain.routing.selection import RouterConfig
from controlplane.domain.scoring import RoutingPolicy
from controlplane.leases.base import LeaseStore, LeaseStoreFactory
from controlplane.metrics import ControlPlaneMetrics
from controlplane.metrics_state import drift_deltas
from controlplane.persistence.catalog import CatalogQueries, PublishCounts
from controlplane.persistence.database import Database
from controlplane.persistence.db import is_sqlite
from controlplane.scheduling.canary_gates import CanaryGateConfig, CanaryGatekeeper
from controlplane.scheduling.dispatcher import Dispatcher, DispatcherConfig
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.leader import LeaderLock, ShardLeadership, leader_lock_for
from controlplane.scheduling.load_book import LoadBook, LoadConfig, RedisLoadShare
from controlplane.scheduling.policy_book import PolicyBook
from controlplane.scheduling.quality_book import QualityBook
from controlplane.scheduling.reachability import AdapterReachability
from controlplane.scheduling.readiness import CatalogReadiness
from controlplane.scheduling.shared_state import InProcessSharedState, RedisSharedState
from controlplane.scheduling.upkeep import QUEUE_TOPICS, Upkeep, UpkeepConfig
from controlplane.scheduling.windows import LimitsFor
from controlplane.service.accounts import AccountBook
from controlplane.service.providers import ProviderAdminService
from controlplane.service.tenants import TenantBook
from controlplane.wakeups import WakeBus


@dataclass
class SchedulingRuntime:
    """The scheduler's long-lived parts for one process."""

    dispatcher: Dispatcher
    monitor: HealthMonitor
    admin: ProviderAdminService
    db: Database
    upkeep: Upkeep
    leases: LeaseStore  # built here, fail closed, with the dispatchers' and upkeep's hooks
    dispatchers: list[Dispatcher] = field(default_factory=list)  # one per shard
    leadership: ShardLeadership | None = None
    loads: LoadBook | None = None  # model-server load (GetLoad per adapter per interval)
    policies: PolicyBook | None = None  # the published routing policy, per round
    canaries: CanaryGatekeeper | None = None  # the leader's live canary gates
    # Whether each adapter's sidecar answers (per-provider readiness, issue 20).
    reachability: AdapterReachability = field(default_factory=lambda: AdapterReachability(()))
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.dispatchers:
            self.dispatchers = [self.dispatcher]

    @property
    def leading(self) -> bool:
        """Whether this replica leads any shard."""
        return any(d.leading for d in self.dispatchers)

    @property
    def led_shards(self) -> list[int]:
        return [d.config.shard for d in self.dispatchers if d.leading]

    def wake(self) -> None:
        """A dispatch round now on every shard this replica leads (new or requeued work)."""
        for d in self.dispatchers:
            d.wake()

    def wake_canaries(self) -> None:
        """Evaluate the canaries now (a publish or rollback changed them)."""
        if self.canaries is not None:
            self.canaries.kick()

    def subscribe(self, bus: WakeBus) -> None:
        """Wake the dispatchers on the bus's queue wake-ups (``task.queued``/``task.requeue``)."""
        for topic in QUEUE_TOPICS:
            bus.subscribe(topic, self.wake)

    def start(self) -> None:
        """Run the dispatcher loops (each waits for its shard's leadership) and upkeep."""
        if not self._tasks:
            self._stop.clear()
            self._tasks = [
                asyncio.create_task(d.run(self._stop), name=f"dispatcher-{d.config.shard}")
                for d in self.dispatchers
            ]
            self._tasks.append(
                asyncio.create_task(self.upkeep.run(self._stop), name="scheduler-upkeep")
            )
            if self.loads is not None:
                self._tasks.append(
                    asyncio.create_task(self.loads.run(self._stop), name="model-load")
                )
            if self.canaries is not None:
                self._tasks.append(
                    asyncio.create_task(self.canaries.run(self._stop), name="canary-gates")
                )

    async def stop(self) -> None:
        """Stop dispatching and upkeep and release leadership; idempotent."""
        self._stop.set()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.leadership is not None:
            await self.leadership.close()
            return
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
    leases: LeaseStoreFactory,
    adapters: Mapping[str, AdapterClient],
    policy: RoutingPolicy,
    shadow_policy: RoutingPolicy | None = None,
    redis_client: Any | None = None,
    breaker_config: BreakerConfig | None = None,
    config: DispatcherConfig | None = None,
    worker_id: str = "scheduler",
    upkeep_config: UpkeepConfig | None = None,
    quality: QualityBook | None = None,
    load_config: LoadConfig | None = None,
    policy_file: PolicyDocument | None = None,
    policy_transform: Callable[[RoutingPolicy], RoutingPolicy] | None = None,
    canary_config: CanaryGateConfig | None = None,
    tenants: TenantBook | None = None,
    time_scale: float = 1.0,
    limits_for: LimitsFor | None = None,
    accounts: AccountBook | None = None,
    readiness: CatalogReadiness | None = None,
    metrics: ControlPlaneMetrics | None = None,
) -> SchedulingRuntime:
    """Wire queries, breakers (shared through Redis when given), leader locks and dispatchers.

    `time_scale` scales the router's own durations (its latency thresholds) like every other
    timing; `policy`, `config` and the other configs arrive already scaled. `readiness` (the
    adapters the catalog must cover) and `metrics` (the process's) are every shard's.

    Each part gets its collaborators at construction: the upkeep, the load book, the health
    monitor and the lease store (built here by `leases`, a `LeaseStoreFactory`, as
    `runtime.leases`) reach the dispatchers and the upkeep through closures over what they are
    built into (shard 0's catalog and leadership), so nothing is assigned onto any part
    afterwards."""
    config = config or DispatcherConfig()
    if config.shard_count < 1 or not 0 <= config.shard < config.shard_count:
        raise ValueError(f"shard {config.shard} of shard_count {config.shard_count}")
    catalogs = CatalogQueries(db)
    shared = RedisSharedState(redis_client) if redis_client is not None else InProcessSharedState()
    dispatchers: list[Dispatcher] = []  # filled below; the closures read it when they run
    upkeep: Upkeep | None = None  # likewise
    # No round admits work while the lease store has lost an account (9.11.2): the store refuses
    # acquires there (fail closed) and the dispatcher rebuilds before its round; a refusal kicks
    # the upkeep. Fail closed is switched on here because this is what runs the rebuild that
    # lifts it. Released or expired slots wake the tasks parked on them (9.12), in process; each
    # round's own reads are the safety net.
    store = leases(
        fail_closed=True,
        on_not_live=lambda account: upkeep.kick(account) if upkeep is not None else None,
        on_freed=lambda account: _each(dispatchers, lambda d: d.capacity_freed(account)),
    )
    monitor = HealthMonitor(
        BreakerRegistry(breaker_config or BreakerConfig(), time.time),
        db=db,
        shared=shared,
        on_transition=None if metrics is None else _transitions_to(metrics),
        # Parked capacity waits (9.12): a recovered breaker wakes the tasks parked on it, in
        # process; each round's own reads are the safety net.
        on_recovered=lambda key: _each(dispatchers, lambda d: d.breaker_recovered(key)),
    )
    defaults = RouterConfig(policy=policy, shadow_policy=shadow_policy)
    router = dataclasses.replace(
        defaults,
        latency_good_s=defaults.latency_good_s * time_scale,
        latency_bad_s=defaults.latency_bad_s * time_scale,
    )
    reachability = AdapterReachability(adapters)
    leadership = None
    locks: list[tuple[DispatcherConfig, LeaderLock]]
    if config.shard_count > 1 and not is_sqlite(database_url):
        leadership = ShardLeadership(
            database_url, config.shard_count, orphan_grace_s=3 * config.leader_retry_s
        )
        locks = [
            (dataclasses.replace(config, shard=n), leadership.lock(n))
            for n in range(config.shard_count)
        ]
    elif is_sqlite(database_url):  # one process: it dispatches every tenant
        locks = [
            (dataclasses.replace(config, shard=0, shard_count=1), leader_lock_for(database_url))
        ]
    else:  # one shard: the one named by the config
        locks = [(config, leader_lock_for(database_url, f"shard-{config.shard}"))]
    readiness = readiness or CatalogReadiness()

    async def catalog() -> CapabilityCatalog:
        return await dispatchers[0].catalog()

    def account_limits(provider: str, account: str) -> AccountLimits:
        return dispatchers[0].limits_for(provider, account)

    # Model-server load (9.21): one GetLoad per adapter per interval, by shard 0's leader when
    # Redis shares the reports (the others read them), else by each replica; every shard's
    # dispatcher reads the same book once per round.
    loads = LoadBook(
        adapters,
        load_config,
        share=RedisLoadShare(redis_client) if redis_client is not None else None,
        is_leader=lambda: dispatchers[0].leading,
    )
    upkeep = Upkeep(
        db=db,
        leases=store,
        catalog=catalog,
        # Lease reconciliation is one replica's job: shard 0's leader (the only leader unsharded).
        is_leader=lambda: dispatchers[0].leading,
        wake=lambda: _wake_all(dispatchers),
        worker_id=worker_id,
        # Rebuilt leases live as long as the dispatcher's own, whatever the upkeep config says.
        config=dataclasses.replace(
            upkeep_config or UpkeepConfig(default_concurrency=config.default_concurrency),
            lease_ttl_ms=config.lease_ttl_ms,
            lease_max_term_ms=config.lease_max_term_ms,
            window_horizon_ms=config.window_day_ms + config.window_send_allowance_ms,
        ),
        limits_for=account_limits,
        on_drifts=(
            None if metrics is None else lambda drifts: metrics.reconcile_pass(drift_deltas(drifts))
        ),
    )
    # The published policy (else `policy_file`, else `policy`) and canary stages, per round;
    # shard 0's leader evaluates the canaries' gates.
    policies = PolicyBook(
        db, router, fallback=policy_file, transform=policy_transform or (lambda p: p)
    )
    dispatchers += [
        Dispatcher(
            db=db,
            catalogs=catalogs,
            leases=store,
            adapters=adapters,
            monitor=monitor,
            router=router,
            leader=lock,
            config=shard_config,
            quality=quality,
            reachability=reachability,
            tenants=tenants,
            limits_for=limits_for,
            accounts=accounts,
            loads=loads,
            policies=policies,
            readiness=readiness,
            before_admit=upkeep.ensure_leases_live,
            metrics=metrics,
        )
        for shard_config, lock in locks
    ]
    dispatcher = dispatchers[0]
    canaries = CanaryGatekeeper(db, is_leader=lambda: dispatchers[0].leading, config=canary_config)
    return SchedulingRuntime(
        dispatcher,
        monitor,
        ProviderAdminService(catalogs, monitor),
        db,
        upkeep,
        store,
        dispatchers=dispatchers,
        leadership=leadership,
        loads=loads,
        policies=policies,
        canaries=canaries,
        reachability=reachability,
    )


def _transitions_to(metrics: ControlPlaneMetrics) -> Callable[[BreakerTransition], None]:
    """Count each breaker transition in the metrics."""

    def count(t: BreakerTransition) -> None:
        metrics.circuit_transition(t.key.provider, t.key.model, t.key.operation.value, t.new.value)

    return count


def _wake_all(dispatchers: Sequence[Dispatcher]) -> None:
    for d in dispatchers:
        d.wake()


def _each(dispatchers: Sequence[Dispatcher], call: Callable[[Dispatcher], None]) -> None:
    for d in dispatchers:
        call(d)

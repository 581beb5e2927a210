"""The leader-elected dispatcher: fair queue -> route -> lease -> Attempt (design 9.10, 9.20).

One dispatcher per shard leads (`controlplane.scheduling.leader`); the others wait and take
over when the leader's database session dies. Each round (`tick`):

1. refresh the capability catalog when stale and sync breaker state with the other replicas;
   while the catalog is not ready (`CatalogReadiness`: empty, or lacking what a configured
   adapter described) the round is skipped and every task stays QUEUED;
2. rebuild the fair queue from PostgreSQL (QUEUED tasks are the facts; the DRR state carried
   over from the last round only accelerates, 9.12.4): the due heads of the (class, tenant,
   user, priority) groups of this shard's tenants, of each tenant a window of users from its
   cursor on, and the in-flight count per tenant (`persistence.queue`), never a scan of the
   oldest rows, so a light tenant behind any flood is served in the next round; the DRR state
   and the user cursors are checkpointed per shard after each round, and a new leader starts
   from them;
3. the round's take is dispatched as ONE batch (`dispatch_batch`): compile verdicts for the
   whole batch first (cached per candidate, capability/price version and normalized spec hash;
   the misses called concurrently), then each task routed in memory on the round's single read
   of lease counters and breaker refusals (`gather.RoundCapacity`, moved as the batch is
   assigned), every lease acquired in one round trip (`LeaseStore.acquire_many`; a refused one
   falls through to the task's next candidate), and every outcome written in one transaction
   (`persistence.batch`: SKIP LOCKED claims on the routed versions, one UPDATE and one
   multi-row INSERT per table). A task whose claim is lost (another dispatcher, a slow old
   leader) gets nothing and its lease goes back; a failed transaction releases every lease of
   the batch and leaves its tasks QUEUED.
4. NO_CAPACITY parks the task (`scheduling.parking`): it is passed over, unrouted, until a
   release or expiry in one of its accounts, a breaker recovery, a catalog change, the round's
   own counter read or the recheck interval wakes it; its decision row is written only when
   the outcome changed (QUEUED -> SCHEDULING -> QUEUED with the decision).
   NO_ELIGIBLE_CANDIDATE records the decision and fails the task with every candidate's reason.
   A candidate whose account's rate or budget window is full (9.11: the store refuses it at
   acquire, `scheduling.windows`) is skipped like a full one; a task left with nothing but
   closed windows is parked until the earliest reopening, and a timer wakes the round then.

A batch of one (`dispatch_batch([task], ...)`) is the way to dispatch a single task: there is
one path.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import functools
import heapq
import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from controlplane.adapters.grpc_client import AdapterClient
from controlplane.capabilities.catalog import CapabilityCatalog, load_catalog
from controlplane.domain import fairqueue as fq
from controlplane.domain.accounts import AccountLimits, Accounts
from controlplane.domain.breaker import BreakerKey, BreakerState, account_key
from controlplane.domain.quality import QualityEvidence, QualityTable, bucket_key
from controlplane.domain.requeue import RequeueFacts
from controlplane.domain.routing.candidates import Candidate, Incumbent, RoutingContext
from controlplane.domain.routing.decision import Outcome, RouteDecisionSnapshot
from controlplane.domain.routing.filters import Reason, screen
from controlplane.domain.routing.load import LoadView
from controlplane.domain.routing.selection import RouterConfig, route
from controlplane.domain.states import IN_FLIGHT_TASK_STATES, TaskState
from controlplane.domain.tenants import Tenants
from controlplane.leases.base import Dimension, Lease, LeaseRequest, LeaseStore
from controlplane.leases.windows import WindowRefusal
from controlplane.metrics import ControlPlaneMetrics
from controlplane.persistence import batch
from controlplane.persistence import leases as lease_facts
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.persistence.queue import GroupKey, QueueHead, QueueHeads, QueueQueries
from controlplane.persistence.queue import oldest_by_class as queue_ages
from controlplane.persistence.records import Failure, NewAttempt, NewRouteDecision, TaskRecord
from controlplane.scheduling.dispatch_metrics import count_decision
from controlplane.scheduling.expiry import settle_overdue
from controlplane.scheduling.gather import (
    NO_LIMITS,
    CompileCache,
    CompileJob,
    RoundCapacity,
    candidate_dimensions,
    compile_key,
    compile_many,
)
from controlplane.scheduling.health import HealthMonitor, submit_key
from controlplane.scheduling.leader import LeaderLock
from controlplane.scheduling.load_book import LoadBook
from controlplane.scheduling.parking import Parking, Signature
from controlplane.scheduling.policy_book import PolicyBook
from controlplane.scheduling.quality_book import QualityBook
from controlplane.scheduling.reachability import AdapterReachability
from controlplane.scheduling.readiness import CatalogReadiness
from controlplane.scheduling.round_charges import RoundPops
from controlplane.scheduling.windows import (
    LimitsFor,
    WindowBook,
    full_window,
    window_request,
)
from controlplane.service.accounts import DISPATCH_MAX_AGE_S as ACCOUNTS_MAX_AGE_S
from controlplane.service.accounts import AccountBook
from controlplane.service.tenants import DISPATCH_MAX_AGE_S, TenantBook
from vidroute_core import tracing
from vidroute_core.logs import bind_ids
from vidroute_core.spec import GenerationSpec

log = logging.getLogger(__name__)
_Tenanted = TypeVar("_Tenanted", TaskRecord, QueueHead)


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class DispatcherConfig:
    """Tuning of one dispatcher; the defaults are the shipped ones (`bootstrap`)."""

    shard: int = 0
    shard_count: int = 1
    # Tasks one round routes, leases and writes in one transaction (VIDROUTE_DISPATCH_BATCH_SIZE).
    # 256: a round's fixed cost (~14 statements, ~16 Redis round trips, the queue read) spread
    # over 4x the tasks of 64, about 0.6 ms less CPU per task (bench/RESULTS.md).
    batch_size: int = 256
    # Rows of QUEUED group heads one round reads in all (each group gets scan_limit // groups,
    # at least 1, at most batch_size): the round's cost, whatever the backlog (9.12.4).
    scan_limit: int = 512
    poll_interval_s: float = 1.0
    leader_retry_s: float = 2.0
    catalog_refresh_s: float = 10.0
    compile_timeout_s: float = 10.0
    compile_cache_size: int = 4096  # compile verdicts kept (gather.CompileCache)
    compile_cache_bytes: int = 24 * 1024 * 1024  # and at most about this much memory
    # A parked NO_CAPACITY task is routed again after this long even if no wake came (9.12).
    park_recheck_s: float = 30.0
    default_concurrency: int = 4
    lease_ttl_ms: int = 600_000
    lease_max_term_ms: int = 6 * 3_600_000
    # The rolling spans of the accounts' rate windows (9.11; scaled with every duration), and how
    # long after its admission a submit still counts in them (it leaves later: `leases.windows`).
    window_minute_ms: int = 60_000
    window_day_ms: int = 86_400_000
    window_send_allowance_ms: int = 5_000
    fair_queue: fq.FairQueueConfig = field(default_factory=fq.FairQueueConfig)
    allowed_regions: Mapping[str, frozenset[str]] = field(default_factory=dict)  # per tenant
    canary_stages: Mapping[str, int] = field(default_factory=dict)  # candidate id -> stage


class DispatchOutcome(enum.Enum):
    SELECTED = "SELECTED"
    NO_CAPACITY = "NO_CAPACITY"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"  # another writer moved the task first


@dataclass(frozen=True, slots=True)
class DispatchResult:
    task_id: int
    outcome: DispatchOutcome
    decision: RouteDecisionSnapshot | None = None
    attempt_id: int | None = None


_MOVED_ON = (DispatchOutcome.SELECTED, DispatchOutcome.FAILED)
# A round's view reuses the accounts document its tick read a moment before (about 2 ms a read
# on PostgreSQL); a batch dispatched on its own reads it when older than this (a publication
# in this process invalidates it at once).
VIEW_ACCOUNTS_MAX_AGE_S = 1.0
_WAITS_ON_BREAKER = frozenset({Reason.CIRCUIT_OPEN.value, Reason.COMPILE_UNAVAILABLE.value})


class Dispatcher:
    """Routes queued tasks into attempts; run one per shard under a `LeaderLock`."""

    def __init__(
        self,
        *,
        db: Database,
        catalogs: CatalogQueries,
        leases: LeaseStore,
        adapters: Mapping[str, AdapterClient],
        monitor: HealthMonitor,
        router: RouterConfig,
        leader: LeaderLock,
        config: DispatcherConfig | None = None,
        clock: Callable[[], datetime] = utcnow,
        quality: QualityBook | None = None,
        reachability: AdapterReachability | None = None,
        tenants: TenantBook | None = None,
        accounts: AccountBook | None = None,
        limits_for: LimitsFor | None = None,
        loads: LoadBook | None = None,
        policies: PolicyBook | None = None,
        readiness: CatalogReadiness | None = None,
        before_admit: Callable[[], Awaitable[object]] | None = None,
        metrics: ControlPlaneMetrics | None = None,
    ) -> None:
        """Every collaborator is a keyword here; nothing is assigned after construction.

        `loads`: model-server load (9.21), read once per round. `policies`: the published
        routing policy and canary stages, re-read once per round (None: `router` and
        ``config.canary_stages`` as given). `readiness`: the adapters the catalog must cover
        before a round admits anything (None: none named). `before_admit`: run before each
        round admits anything (the lease rebuild of 9.11.2). `metrics`: the process's (None:
        a private set)."""
        self._db, self._catalogs, self._leases = db, catalogs, leases
        # Each provider account's limits injected as a lookup (a test's); None: the accounts
        # document's (`limits_for`), asked per lease request so a change counts from the next.
        self._limits_for = limits_for
        # Told whether each Compile got an answer (per-provider readiness); None: not kept.
        self.reachability = reachability
        # The published tenants document (per-class weights and caps, project priorities,
        # allowed and preferred regions), re-read every round so a publish or rollback counts from
        # the next one; None: ``config.fair_queue`` and ``config.allowed_regions`` as given.
        self._tenants = tenants
        self._round_tenants: Tenants | None = None
        # The published accounts document (limits, enabled, regions), re-read every round like
        # the tenants one; None: every account as before accounts were configuration.
        self._accounts = accounts
        self._round_accounts: Accounts | None = None
        # The quality aggregates (9.14), read at most once per refresh, never per task.
        self.quality = quality
        # Model-server load (9.21), refreshed by its own loop; read once per round.
        self.loads = loads
        self._adapters, self.monitor, self.router = adapters, monitor, router
        self.leader, self.config, self._clock = leader, config or DispatcherConfig(), clock
        # The published routing policy and canary stages, re-read once per round (PolicyBook);
        # None: `router` and ``config.canary_stages`` as given.
        self.policies = policies
        self.canary_stages: Mapping[str, int] = self.config.canary_stages
        self._catalog: CapabilityCatalog | None = None
        self._catalog_at = 0.0
        self._fq_snapshot: fq.FairQueueSnapshot | None = None
        self._fq_loaded = False  # the shard's DRR checkpoint is read once per leadership
        # Per (class, tenant): the last user its window of users went past (persistence.queue).
        self._cursors: dict[tuple[str, str], tuple[str, int]] = {}
        self._next_cursors: dict[tuple[str, str], tuple[str, int]] = {}
        self._queue = QueueQueries(db)
        # Shared with the other replicas through the monitor's shared state (scale-out).
        self._incumbents: dict[tuple[str, str, str], Incumbent] = monitor.incumbents
        self._wake = asyncio.Event()
        self.parking = Parking(time.monotonic, recheck_s=self.config.park_recheck_s)
        self.windows = WindowBook(time.monotonic, clock, recheck_s=self.config.park_recheck_s)
        self._window_timer: tuple[float, asyncio.TimerHandle] | None = None
        self._reopenings: list[float] = []  # heap of parked windows' reopenings (monotonic)
        self.compile_cache = CompileCache(
            self.config.compile_cache_size, self.config.compile_cache_bytes
        )
        self._catalog_version = ""
        self.leading = False
        self.dispatched = 0
        self.progressed = 0  # tasks the last round moved on (an attempt or a failure)
        self.readiness = readiness or CatalogReadiness()  # the composition root names them
        self.skipped_rounds = 0
        self._unready_reason: str | None = None
        # Runs before each round admits anything: the lease rebuild (9.11.2).
        self.before_admit = before_admit
        self.metrics = metrics or ControlPlaneMetrics()

    @property
    def adapters(self) -> Mapping[str, AdapterClient]:
        """The sidecar clients this dispatcher compiles on (a release's sample check uses them)."""
        return self._adapters

    def now(self) -> datetime:
        """The dispatcher's clock (injected; tests fix it)."""
        return self._clock()

    # ---- loop ---------------------------------------------------------------------------------

    def wake(self) -> None:
        """Ask for a round now (new task, requeue, released capacity)."""
        self._wake.set()

    def capacity_freed(self, account: str) -> None:
        """Slots came back in a lease account (the lease store's `on_freed`): the tasks parked
        on it are routed in the next round, which starts now if any were."""
        if self.parking.freed(account):
            self.wake()

    def breaker_recovered(self, key: BreakerKey) -> None:
        """A breaker closed or went HALF_OPEN (the health monitor's `on_recovered`): the tasks
        parked on a candidate behind it (its own breaker or its account's) are routed again."""
        if self._catalog is None:
            return
        woken = 0
        for c in self._catalog.candidates:
            own = submit_key(c)
            if key in (own, account_key(own), compile_key(c)):
                woken += self.parking.breaker_moved(c.id)
        if woken:
            self.wake()

    async def run(self, stop: asyncio.Event) -> None:
        """Lead when possible and dispatch until `stop` is set; leadership is released on exit."""
        try:
            while not stop.is_set():
                if not self.leading:
                    self.leading = await self.leader.try_acquire()
                    if not self.leading:
                        await self._pause(stop, self.config.leader_retry_s)
                        continue
                    await self.recover_orphans()
                    self._fq_loaded = False  # another leader may have served since
                if not await self.leader.still_held():
                    self.leading = False
                    continue
                try:
                    done = await self.tick()
                except Exception:  # a bad round must not kill the leader; log and retry
                    log.exception("dispatch round failed")
                    done = 0
                # A round that moved nothing on (empty, or every task still waiting for
                # capacity) waits for a wake or the poll interval instead of spinning.
                if done == 0 or not self.progressed:
                    await self._pause(stop, self.config.poll_interval_s)
        finally:
            self.leading = False
            await self.leader.release()

    async def _pause(self, stop: asyncio.Event, seconds: float) -> None:
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await w
            self._wake.clear()

    async def recover_orphans(self) -> int:
        """On taking leadership: tasks left in SCHEDULING by a dead leader go back to QUEUED.

        Safe against a previous leader that is still mid-dispatch: its attempt transaction CASes
        on the task version this bumps, loses, and releases its lease.
        """
        moved = 0
        for task in self._mine(await self._catalogs.tasks_in_states([TaskState.SCHEDULING])):
            if await self._move_task(
                task.id, task.status_version, TaskState.QUEUED, "leader_takeover", self._clock()
            ):
                moved += 1
        return moved

    # ---- one round ----------------------------------------------------------------------------

    async def catalog(self, *, refresh: bool = False) -> CapabilityCatalog:
        """The current catalog, re-read from the database when stale."""
        stale = time.monotonic() - self._catalog_at > self.config.catalog_refresh_s
        if self._catalog is None or refresh or stale:
            self._catalog = await load_catalog(self._catalogs, self._clock())
            self._catalog_at = time.monotonic()
            if self._catalog.version != self._catalog_version:
                self._catalog_version = self._catalog.version
                self.compile_cache.clear()  # bounded anyway; old versions' keys never hit again
                if self.parking.catalog_changed(self._catalog.version):
                    self.wake()
            self.monitor.set_account_ids(
                ((c.provider, c.account, c.region), c.account_id) for c in self._catalog.candidates
            )
        return self._catalog

    def not_ready(self) -> str | None:
        """Why this dispatcher must not route now (see `CatalogReadiness`), or None."""
        return self.readiness.problem(self._catalog)

    async def tick(self) -> int:
        """One dispatch round; returns how many tasks it took off the queue."""
        await self.catalog()
        if self.not_ready() is not None:
            await self.catalog(refresh=True)  # publication may have just finished
        reason = self.not_ready()
        if reason != self._unready_reason:
            log.log(logging.WARNING if reason else logging.INFO, "dispatch %s", reason or "ready")
            self._unready_reason = reason
        if reason is not None:
            self.skipped_rounds += 1
            log.debug("dispatch round skipped: %s", reason)
            return 0
        # The round's one read of the accounts document, before the lease rebuild that leases
        # by its limits; the round's view below reuses it.
        await self._read_accounts(ACCOUNTS_MAX_AGE_S)
        if self.before_admit is not None:
            await self.before_admit()
        await self.monitor.sync()
        cfg = self.config
        catalog = await self.catalog()
        view = await self._round_view(catalog)
        planned = await self._plan_round()
        if planned is None:
            return 0
        picked, by_id, facts, queue, pops = planned
        throttled = Counter[tuple[str, str]]()
        tasks = [by_id[item.task_id] for item in picked]
        results = await self.dispatch_batch(tasks, facts, catalog=catalog, view=view)
        self.progressed = sum(r.outcome in _MOVED_ON for r in results)
        for result in results:
            task_facts = facts.get(result.task_id, RequeueFacts())
            count_decision(self.metrics, result.decision, task_facts, catalog, throttled)
        done = len(tasks)
        self.metrics.throttled_round(throttled)
        went = {str(r.task_id) for r in results if r.outcome in _MOVED_ON}
        if len(went) < len(picked):  # some stay queued (parked): their tenants do not pay
            queue = pops.charged_for(went)
        self._fq_snapshot = queue.snapshot()
        self._cursors = self._next_cursors
        if done:
            state = dict(self._fq_snapshot) | {"user_cursors": _dump_cursors(self._cursors)}
            try:
                await self._queue.save_state(cfg.shard, state, self._clock())
            except Exception:  # only the checkpoint is lost: the next leader starts afresh
                log.warning("fair queue checkpoint not saved", exc_info=True)
        self.dispatched += done
        return done

    async def next_round(self) -> list[int]:
        """The ids the next round would take, in order: a dry run (nothing is dispatched or
        checkpointed; overdue tasks are settled as in any round)."""
        planned = await self._plan_round()
        return [] if planned is None else [int(t.task_id) for t in planned[0]]

    async def _plan_round(
        self,
    ) -> (
        tuple[
            list[fq.QueuedTask],
            dict[str, TaskRecord],
            dict[int, RequeueFacts],
            fq.FairQueue,
            RoundPops,
        ]
        | None
    ):
        """Read the group heads (9.12.4), settle the overdue, and pop this round's take."""
        cfg = self.config
        if not self._fq_loaded:  # a new leader serves on from the shard's checkpoint
            state = await self._queue.load_state(cfg.shard)
            self._fq_snapshot = fq.parse_snapshot(state)
            self._cursors = _parse_cursors(state)
            self._fq_loaded = True
        # Only this shard's tenants, and of each only its window of users (persistence.queue).
        heads = await self._queue.heads(
            now=self._clock(),
            rows=cfg.scan_limit,
            per_group_max=cfg.batch_size,
            in_flight_states=IN_FLIGHT_TASK_STATES,
            shard=cfg.shard,
            shard_count=cfg.shard_count,
            cursors=self._cursors,
        )
        at = self._clock()
        queued = await self._settle(heads.tasks, at)
        self.metrics.queue_ages(queue_ages(queued, at))
        if not queued:
            return None
        # One read for the round; a task never moved (version 0) was never requeued.
        facts = await self._catalogs.requeue_facts([t.id for t in queued if t.status_version > 0])
        items = [_queued(t) for t in queued]
        fair_queue = cfg.fair_queue
        if self._tenants is not None:
            self._round_tenants = await self._tenants.current(DISPATCH_MAX_AGE_S)
            fair_queue = dataclasses.replace(fair_queue, tenants=self._round_tenants)
        pops = RoundPops(
            functools.partial(
                fq.FairQueue.rebuild,
                fair_queue,
                time.time,
                items,
                snapshot=self._fq_snapshot,
                in_flight_counts=heads.in_flight,
                class_in_flight_counts=heads.in_flight_by_class,
                partial=heads.partial,
            )
        )
        queue = pops.rebuild()
        now = self._clock()

        parking = self.parking

        def eligible(item: fq.QueuedTask) -> bool:
            task_id = int(item.task_id)
            nb = facts.get(task_id, RequeueFacts()).not_before
            return (nb is None or nb <= now) and not parking.waiting(task_id, now)

        picked = await self._pop_round(queue, queued, facts, eligible, now, pops=pops)
        ready = {h.group for h, item in zip(queued, items, strict=True) if eligible(item)}
        self._next_cursors = _advance_cursors(self._cursors, heads, ready, picked)
        # Full rows (the spec) only for the take; one cancelled meanwhile is just left out.
        records = await self._queue.tasks([int(t.task_id) for t in picked])
        take = [t for t in picked if int(t.task_id) in records]
        return take, {str(i): r for i, r in records.items()}, facts, queue, pops

    async def _pop_round(
        self,
        queue: fq.FairQueue,
        queued: list[QueueHead],
        facts: dict[int, RequeueFacts],
        eligible: fq.Eligible,
        now: datetime,
        *,
        pops: RoundPops,
    ) -> list[fq.QueuedTask]:
        """Pop the round; a drained partial group gets its next rows read and pushed (at most
        one read per pop), so its tenant keeps its share instead of the round ending early."""
        size = self.config.batch_size
        last: dict[tuple[str, str, str, float], int] = {}
        for h in queued:
            last[h.group] = max(last.get(h.group, 0), h.id)
        picked = queue.pop_batch(size, eligible)
        while (group := queue.drained) is not None and len(picked) < size:
            limit = size - len(picked)
            while True:
                more = await self._queue.more(group, after_id=last[group], now=now, limit=limit)
                if more:
                    last[group] = more[-1].id
                kept = await self._settle(more, now)
                if kept or len(more) < limit:
                    break
            facts.update(
                await self._catalogs.requeue_facts([t.id for t in kept if t.status_version > 0])
            )
            rows, partial = [_queued(t) for t in kept], len(more) >= limit
            pops.refilled(group, rows, partial)
            queue.refill(group, rows, partial=partial)
            picked += queue.pop_batch(size - len(picked), eligible)
        return picked

    async def _settle(self, heads: list[QueueHead], at: datetime) -> list[QueueHead]:
        """Past a task or queue deadline: FAILED here, never dispatched (domain.deadlines)."""
        if not (overdue := [h.id for h in heads if _past_a_deadline(h, at)]):
            return heads
        full = await self._queue.tasks(overdue)
        kept = await settle_overdue(self._db, self._catalogs, list(full.values()), at)
        settled = set(full) - {t.id for t in kept}
        return [h for h in heads if h.id not in settled]

    def _mine(self, tasks: list[_Tenanted]) -> list[_Tenanted]:
        n = self.config.shard_count
        if n <= 1:
            return tasks
        from controlplane.domain.scoring import bucket

        return [t for t in tasks if bucket(t.tenant_id, n) == self.config.shard]

    # ---- one batch (a round's take) ---------------------------------------------------------

    async def _round_view(self, catalog: CapabilityCatalog) -> _RoundView:
        """The round's one read of breaker refusals and lease counters; parked tasks whose waits
        read differently now are woken (the safety net under the in-process wakes)."""
        if self.policies is not None:  # a publish or rollback counts from this round on
            self.router, self.canary_stages = await self.policies.refresh()
        circuit_open: dict[str, str] = {}
        for c in catalog.candidates:
            if (reason := await self.monitor.refusal(submit_key(c))) is not None:
                circuit_open[c.id] = reason
            elif (reason := await self.monitor.refusal(compile_key(c))) is not None:
                # Its sidecar did not answer Compile lately: no call until a probe may go.
                circuit_open[c.id] = f"COMPILE {reason}: the {c.provider} sidecar did not answer"
        await self._read_accounts(VIEW_ACCOUNTS_MAX_AGE_S)
        capacity = await RoundCapacity.read(
            self._leases,
            catalog.candidates,
            self.config.default_concurrency,
            self.limits_for,
            {account: c.detail for account, c in self.windows.closed().items()},
        )
        if len(self.parking):
            by_id = {c.id: c for c in catalog.candidates}

            def has_room(cid: str) -> bool:
                c = by_id.get(cid)
                return c is None or ((v := capacity.view(c)).available > 0 and v.accepting_new)

            self.parking.wake_changed(has_room, circuit_open, catalog.version)
        table = None if self.quality is None else await self.quality.table()
        loads = (
            {} if self.loads is None else self.loads.views(catalog.candidates, self._mean_latency)
        )
        return _RoundView(capacity, circuit_open, table, loads)

    def _mean_latency(self, candidate_id: str) -> float | None:
        h = self.monitor.health_view(candidate_id)
        return None if h is None else h.mean_latency_s

    async def dispatch_batch(
        self,
        tasks: list[TaskRecord],
        facts: Mapping[int, RequeueFacts],
        *,
        catalog: CapabilityCatalog | None = None,
        view: _RoundView | None = None,
    ) -> list[DispatchResult]:
        """Route, lease and commit a batch of QUEUED tasks (design 9.10, 9.20): compile what is
        not cached for the whole batch concurrently, route each task in memory on the round's
        capacity, acquire every lease in one round trip, and write every task's outcome in ONE
        transaction (`persistence.batch`: SKIP LOCKED claims and version CAS, so another
        dispatcher's concurrent round never doubles a task). If that transaction fails every
        lease it took is released (one round trip) and the tasks stay QUEUED. NO_CAPACITY parks
        the task (`parking`), storing a decision only when its outcome changed."""
        if not tasks:
            return []
        catalog = catalog or await self.catalog()
        if self.not_ready() is not None:
            return [DispatchResult(t.id, DispatchOutcome.SKIPPED) for t in tasks]
        view = view or await self._round_view(catalog)
        now = self._clock()
        async with self._db.reads() as r:
            numbers = await r.task_numbers([t.id for t in tasks])
        prepared: list[tuple[TaskRecord, RequeueFacts, RoutingContext, Any, list[Any]]] = []
        jobs: list[CompileJob] = []
        for task in tasks:
            f = facts.get(task.id, RequeueFacts())
            spec = task.spec
            group = (task.tenant_id, spec.service_class.value, spec.mode.value)
            ctx = RoutingContext(
                now=now,
                circuit_open=view.circuit_open,
                excluded=f.excluded,
                soft_excluded=f.soft_excluded,
                same_model_only=f.same_model_only,
                allowed_regions=self._allowed_regions(task.tenant_id),
                preferred_regions=(
                    ()
                    if self._round_tenants is None
                    else self._round_tenants.preferred_regions(task.tenant_id)
                ),
                incumbent=self._incumbents.get(group),
                canary_stages=self.canary_stages,
                scenario=(
                    ""
                    if self._round_tenants is None
                    else self._round_tenants.routing_scenario(task.tenant_id)
                ),
                accounts=self._round_accounts,
            )
            screened = screen(spec, catalog.candidates, ctx, catalog.version)
            survivors = screened.survivors()
            mode = spec.mode.value
            start = {c.id: view.capacity.view(c, mode) for c in survivors}
            jobs.append((spec, task.spec_hash, screened.survivors(start)))
            prepared.append((task, f, ctx, screened, survivors))
        compiled = await compile_many(
            self._adapters,
            jobs,
            self.compile_cache,
            timeout_s=self.config.compile_timeout_s,
            breakers=self.monitor,
            reachability=self.reachability,
        )
        picks: list[_Pick] = []
        others: list[_Other] = []
        for item, answer in zip(prepared, compiled, strict=True):
            task = item[0]
            # The task's dispatch span stays open until the batch commits (its attempt and
            # decision ids are known only then); the submit message carries it as the parent.
            span = tracing.open_span("dispatch", task.trace_context)
            span.annotate(task_id=task.id)
            try:
                with bind_ids(task_id=task.id), span.current():
                    n = numbers.get(task.id, batch.Numbers())
                    outcome = await self._route_in_round(item, answer, n, catalog, view)
            except Exception:  # one bad task must not stop the round; it stays QUEUED
                span.end()
                log.exception("routing task %s failed", task.id)
                continue
            if isinstance(outcome, _Pick):
                outcome.span = span
                picks.append(outcome)
            else:
                span.end()
                others.append(outcome)
        try:
            await self._lease_batch(picks, catalog, view)
            for p in picks:
                if p.lease is None:
                    d = p.decision.after_leasing(None, p.refused, p.why)
                    others.append(_Other(p.task, d, TaskState.QUEUED, p.facts))
            leased = [p for p in picks if p.lease is not None]
            return await self._commit_batch(leased, others, catalog)
        finally:
            for p in picks:
                p.span.end()

    async def _read_accounts(self, max_age_s: float) -> None:
        if self._accounts is not None:
            self._round_accounts = await self._accounts.current(max_age_s)

    async def attempt_mode(self, client_request_key: str) -> str:
        """An attempt's task's generation mode (the modality it leases); "" when unknown."""
        rows = await lease_facts.attempts_with_keys(self._db, [client_request_key])
        return rows[0].mode if rows else ""

    def limits_for(self, provider: str, account: str) -> AccountLimits:
        """The account's limits in the accounts document this round read (`LimitsFor`), or the
        injected lookup's."""
        if self._limits_for is not None:
            return self._limits_for(provider, account)
        if self._round_accounts is None:
            return NO_LIMITS
        return self._round_accounts.limits(provider, account)

    def _allowed_regions(self, tenant_id: str) -> frozenset[str] | None:
        """The tenants document's regions for the tenant when it names any, else the config's."""
        if self._round_tenants is not None:
            regions = self._round_tenants.allowed_regions(tenant_id)
            if regions is not None:
                return regions
        return self.config.allowed_regions.get(tenant_id)

    async def _route_in_round(
        self,
        prepared: tuple[TaskRecord, RequeueFacts, RoutingContext, Any, list[Any]],
        compiled: tuple[Mapping[str, Any], Mapping[str, Any]],
        numbers: batch.Numbers,
        catalog: CapabilityCatalog,
        view: _RoundView,
    ) -> _Pick | _Other:
        task, facts, ctx, screened, survivors = prepared
        verdicts, plans = compiled
        spec = task.spec
        mode = spec.mode.value
        capacity = {c.id: view.capacity.view(c, mode) for c in survivors}
        health = {c.id: h for c in survivors if (h := self.monitor.health_view(c.id)) is not None}
        quality, evidence, bucket = _quality_of(
            view.quality, survivors, spec, self.router.default_quality
        )
        ctx = _with(
            ctx,
            capacity=capacity,
            health=health,
            circuit_open=view.circuit_open,
            quality=quality,
            quality_evidence=evidence,
            quality_bucket=bucket,
        )
        if view.load:
            ctx = _with(ctx, load=view.load)
        decision = route(
            str(task.id),
            spec,
            catalog.candidates,
            verdicts,
            cfg=self.router,
            ctx=ctx,
            catalog_version=catalog.version,
            screened=screened,
        )
        if decision.outcome is Outcome.NO_CAPACITY:
            return _Other(task, decision, TaskState.QUEUED, facts)
        if decision.outcome is not Outcome.SELECTED:
            return _Other(task, decision, TaskState.FAILED, facts)
        key = f"{task.id}-{numbers.attempt_no + 1}-{secrets.token_hex(6)}"
        group = (task.tenant_id, spec.service_class.value, spec.mode.value)
        pick = _Pick(task, facts, decision, plans, group, key, numbers, tracing.carrier())
        pick.rest = list(decision.ranked)
        await self._next_candidate(pick, catalog, view)
        return pick

    async def _next_candidate(
        self, pick: _Pick, catalog: CapabilityCatalog, view: _RoundView
    ) -> bool:
        """Walk the pick's ranked list on: the first candidate with room in the round whose
        breaker admits it (taking the round's slot); False when none is left."""
        while pick.rest:
            cid = pick.rest.pop(0)
            c = catalog.by_id(cid)
            if c is None:
                continue
            mode = pick.task.spec.mode.value
            room = view.capacity.view(c, mode)
            if room.available <= 0 or not room.accepting_new:
                pick.refused.append(cid)
                continue
            breaker = submit_key(c)
            admitted = await self.monitor.admit(breaker, pick.key)
            if self._probing(breaker):  # a HALF_OPEN slot taken (or refused): re-read it
                await self._refresh_refusal(view, c)
            if not admitted:
                pick.refused.append(cid)
                continue
            view.capacity.take(c, mode=mode)
            pick.cid = cid
            return True
        pick.cid = None
        return False

    def _probing(self, breaker: BreakerKey) -> bool:
        registry = self.monitor.registry
        return any(
            registry.get(k).state is not BreakerState.CLOSED
            for k in (breaker, account_key(breaker))
        )

    async def _refresh_refusal(self, view: _RoundView, c: Any) -> None:
        reason = await self.monitor.refusal(submit_key(c))
        if view.circuit_open.get(c.id) != reason:
            fresh = dict(view.circuit_open)  # a new mapping: screens taken on the old one differ
            if reason is None:
                fresh.pop(c.id, None)
            else:
                fresh[c.id] = reason
            view.circuit_open = fresh

    async def _lease_batch(
        self, picks: list[_Pick], catalog: CapabilityCatalog, view: _RoundView
    ) -> None:
        """Every pick's lease in one `acquire_many`; a refused one (another process took the
        slot) falls through to its next candidate in one more round trip per fall."""
        pending = [p for p in picks if p.cid is not None]
        try:
            while pending:
                requests = []
                for p in pending:
                    c = catalog.by_id(p.cid or "")
                    assert c is not None
                    plan = p.plans[c.id]
                    requests.append(
                        self.lease_request(
                            c,
                            p.key,
                            p.task.spec.output.sample_count,
                            plan.estimated_cost_micros,
                            dimensions=view.capacity.dimensions(c, p.task.spec.mode.value),
                        )
                    )
                got = await self._leases.admit_many(requests)
                again = []
                for p, lease in zip(pending, got, strict=True):
                    if isinstance(lease, Lease):
                        p.lease = lease
                        continue
                    c = catalog.by_id(p.cid or "")
                    assert c is not None
                    await self.monitor.release(submit_key(c), p.key)
                    if isinstance(lease, WindowRefusal):  # skipped like a full one, and waited for
                        closure = self.windows.refused(lease)
                        self.metrics.window_refused(c.provider, c.account, lease.window)
                        view.capacity.window_closed(c, closure.detail)
                        p.why[c.id] = closure.detail
                    else:
                        view.capacity.full(c, p.task.spec.mode.value)
                    p.refused.append(c.id)
                    if await self._next_candidate(p, catalog, view):
                        again.append(p)
                pending = again
        except BaseException:
            await self._give_back(picks, catalog)
            raise

    async def _give_back(self, picks: list[_Pick], catalog: CapabilityCatalog) -> None:
        """Release the picks' leases (one round trip) and breaker admissions: 9.20, a lease
        without an attempt is a leak."""
        held = [p for p in picks if p.lease is not None]
        try:
            if held:  # no attempt was written: nothing was sent, the window use goes back too
                leases = [p.lease for p in held if p.lease is not None]
                await self._leases.release_many(leases, unsent=True)
        finally:
            for p in picks:
                c = catalog.by_id(p.cid or "")
                if c is not None:
                    await self.monitor.release(submit_key(c), p.key)
                p.lease = None

    async def _commit_batch(
        self, picks: list[_Pick], others: list[_Other], catalog: CapabilityCatalog
    ) -> list[DispatchResult]:
        """ONE transaction for the batch's outcomes (see `dispatch_batch`)."""
        now = self._clock()
        writes: list[_Other] = []
        for o in others:
            if o.target is TaskState.QUEUED and self.parking.outcome(o.task.id) == _signature(
                o.decision
            ):
                continue  # the same wait as the stored one: nothing to write
            writes.append(o)
        expected = {p.task.id: p.task.status_version for p in picks}
        expected.update({o.task.id: o.task.status_version for o in writes})
        selected = self._selected_rows(picks, catalog)
        try:
            async with self._db.unit(now) as u:
                claimed = await u.claim_queued(expected)
                written_ids = await u.write_selected([s for s in selected if s.task_id in claimed])
                for o in writes:
                    if o.task.id in claimed:
                        await self._write_other(u, o)
        except BaseException:
            await self._give_back(picks, catalog)
            raise
        lost = [p for p in picks if p.task.id not in claimed]
        if lost:  # another dispatcher holds or moved them: their leases go back at once
            await self._give_back(lost, catalog)
        results: list[DispatchResult] = []
        for p in picks:
            if p.task.id not in claimed:
                results.append(DispatchResult(p.task.id, DispatchOutcome.SKIPPED, p.final))
                continue
            assert p.cid is not None
            self._remember(p.group, p.cid)
            self.parking.done(p.task.id)
            ids = written_ids[p.task.id]
            p.span.annotate(
                attempt_id=ids.attempt_id,
                client_request_key=p.key,
                route_decision_id=ids.route_decision_id,
            )
            with bind_ids(task_id=p.task.id, attempt_id=ids.attempt_id, client_request_key=p.key):
                log.info(
                    "task %s: attempt %s on %s (key %s)", p.task.id, ids.attempt_id, p.cid, p.key
                )
            results.append(
                DispatchResult(p.task.id, DispatchOutcome.SELECTED, p.final, ids.attempt_id)
            )
        written = {o.task.id for o in writes}
        for o in others:
            if o.task.id in written and o.task.id not in claimed:
                results.append(DispatchResult(o.task.id, DispatchOutcome.SKIPPED, o.decision))
                continue
            if o.target is TaskState.FAILED:
                self.parking.done(o.task.id)
                results.append(DispatchResult(o.task.id, DispatchOutcome.FAILED, o.decision))
                continue
            if o.task.id in written:
                self.parking.stored(o.task.id, _signature(o.decision))
            self._park(o, catalog)
            results.append(DispatchResult(o.task.id, DispatchOutcome.NO_CAPACITY, o.decision))
        return results

    def _selected_rows(
        self, picks: list[_Pick], catalog: CapabilityCatalog
    ) -> list[batch.SelectedTask]:
        """The rows of the leased picks: attempt, decision (after leasing), submit payload."""
        selected: list[batch.SelectedTask] = []
        policy = self.router.policy.version
        for p in picks:
            c = catalog.by_id(p.cid or "")
            assert c is not None
            assert p.lease is not None
            p.final = p.decision.after_leasing(c.id, p.refused, p.why)
            plan = p.plans[c.id]
            selected.append(
                batch.SelectedTask(
                    task_id=p.task.id,
                    expected_version=p.task.status_version,
                    numbers=p.numbers,
                    attempt=NewAttempt(
                        provider_account_id=c.account_id,
                        provider_model=c.model,
                        provider_model_version=plan.model_version or c.model_version,
                        capability_version=plan.capability_version or c.capability_version,
                        price_version=plan.price_version or c.price.price_version,
                        routing_policy_version=policy,
                        client_request_key=p.key,
                        normalized_spec_hash=p.task.spec_hash,
                        compile_plan=dict(plan.plan_json),
                        estimated_cost_micros=plan.estimated_cost_micros,
                        currency=plan.currency,
                        request_hash=plan.request_hash or None,
                        lease_token=p.lease.token,
                        fencing_token=p.lease.fencing_token,
                    ),
                    decision=NewRouteDecision(
                        policy, p.final.outcome.value, p.final, selected_candidate=c.id
                    ),
                    outbox_payload={
                        "lease_account": c.lease_account,
                        "supports_idempotency_key": c.capability.operations.client_idempotency_key,
                        **p.carrier,  # the submit worker continues the task's trace
                    },
                )
            )
        return selected

    async def _write_other(self, u: Any, o: _Other) -> None:
        """A decision without an attempt: QUEUED -> SCHEDULING -> QUEUED (a changed wait) or
        FAILED (no eligible candidate), with the decision row, in the batch's transaction."""
        v = o.task.status_version
        await u.move_task_at(o.task.id, v, TaskState.SCHEDULING, "dispatch")
        failure = None
        if o.target is TaskState.FAILED:
            failure = Failure(
                _ending_class(o.decision, o.facts.error_class),
                o.decision.outcome.value,
                o.decision.failure_message()[:4000],
            )
        await u.record_decision(
            o.task.id,
            v + 1,
            o.target,
            NewRouteDecision(self.router.policy.version, o.decision.outcome.value, o.decision),
            reason=o.decision.outcome.value,
            failure=failure,
        )

    def _park(self, o: _Other, catalog: CapabilityCatalog) -> None:
        full, breakers, accounts = [], [], set()
        reopens: list[float] = []
        for v in o.decision.verdicts:
            if v.reason == Reason.NO_CAPACITY.value and (
                (until := self.windows.until(v.candidate.lease_account)) is not None
            ):
                reopens.append(until)  # a release does not reopen a window: no wake on it
            elif v.reason == Reason.NO_CAPACITY.value:
                full.append(v.candidate.id)
                accounts.add(v.candidate.lease_account)
            elif v.reason in _WAITS_ON_BREAKER:
                # A sidecar without an answer is waited for like an open breaker: its COMPILE
                # breaker's moves (and each round's refusal read) wake the task.
                breakers.append(v.candidate.id)
        now = self._clock()
        later = [t for t in o.facts.soft_excluded.values() if t is not None and t > now]
        self.parking.park(
            o.task.id,
            accounts=accounts,
            full=full,
            breakers=breakers,
            catalog_version=catalog.version,
            until=min(later) if later else None,
            reopens=min(reopens) if reopens else None,
        )
        if reopens:
            self._wake_at(min(reopens))

    def _wake_at(self, at: float) -> None:
        """A round when a parked window reopens (monotonic `at`), not a poll later: one timer,
        for the earliest of the pending reopenings (a heap, so each is served in turn)."""
        if at not in self._reopenings:
            heapq.heappush(self._reopenings, at)
        self._arm_window_timer()

    def _arm_window_timer(self) -> None:
        if not self._reopenings:
            return
        first = self._reopenings[0]
        if self._window_timer is not None:
            if self._window_timer[0] == first:
                return
            self._window_timer[1].cancel()
        delay = max(0.0, first - time.monotonic())
        handle = asyncio.get_running_loop().call_later(delay, self._window_due)
        self._window_timer = (first, handle)

    def _window_due(self) -> None:
        self._window_timer = None
        now = time.monotonic()
        while self._reopenings and self._reopenings[0] <= now:
            heapq.heappop(self._reopenings)
        self.wake()
        self._arm_window_timer()

    def lease_request(
        self,
        c: Candidate,
        key: str,
        generations: int = 1,
        cost_micros: int = 0,
        *,
        mode: str = "",
        dimensions: tuple[Dimension, ...] | None = None,
    ) -> LeaseRequest:
        """The lease an attempt on `c` keyed `key` for a task of generation `mode` asks for: its
        dimensions (`dimensions` when the round already built them) and, where the account
        limits any, its windows (also the re-let of a lease lost before the send)."""
        cfg = self.config
        if dimensions is None:
            dimensions = candidate_dimensions(c, cfg.default_concurrency, self.limits_for, mode)
        return LeaseRequest(
            attempt_id=key,
            account=c.lease_account,
            dimensions=dimensions,
            ttl_ms=cfg.lease_ttl_ms,
            max_term_ms=cfg.lease_max_term_ms,
            windows=window_request(
                self.limits_for(c.provider, c.account),
                generations=generations,
                cost_micros=cost_micros,
                minute_ms=cfg.window_minute_ms,
                day_ms=cfg.window_day_ms,
                send_allowance_ms=cfg.window_send_allowance_ms,
            ),
        )

    def _remember(self, group: tuple[str, str, str], chosen: str) -> None:
        current = self._incumbents.get(group)
        if current is None or current.candidate_id != chosen:
            self._incumbents[group] = Incumbent(chosen, self._clock().timestamp())

    async def _move_task(
        self, task_id: int, version: int, target: TaskState, reason: str, now: datetime
    ) -> bool:
        """One task CAS in a unit of its own; True if it applied."""
        async with self._db.unit(now) as u:
            return await u.move_task_at(task_id, version, target, reason)


def _ending_class(decision: RouteDecisionSnapshot, error_class: str) -> str:
    """The class a NO_ELIGIBLE_CANDIDATE ending reports.

    When a failover exclusion took a candidate away, the task failed because of that earlier
    failure (its class, e.g. INTERNAL_PERMANENT), not for a capability it never lacked."""
    by_failover = any(v.reason == Reason.EXCLUDED_BY_FAILOVER.value for v in decision.verdicts)
    return error_class if by_failover and error_class else "UNSUPPORTED_CAPABILITY"


def _quality_of(
    table: QualityTable | None, survivors: Iterable[Candidate], spec: GenerationSpec, default: float
) -> tuple[dict[str, float], dict[str, QualityEvidence], str]:
    """Each survivor's quality in the task's bucket (9.14): its evidence there shrunk toward its
    model's prior (the capability document's ``quality_prior``, else `default`), the prior
    alone without evidence (empty, everyone at `default`, when there is nothing to say); what
    each was made of, and the bucket (the explain record's)."""
    rows = [
        (c.id, c.provider, c.model, default if (q := c.capability.quality_prior) is None else q, q)
        for c in survivors
    ]
    bucket = bucket_key(spec)
    if table is not None and table.counts:
        evidence = table.evidence(
            [(cid, p, m, prior, q is not None) for cid, p, m, prior, q in rows],
            spec.mode.value,
            bucket,
        )
        return {cid: e.score for cid, e in evidence.items()}, evidence, bucket
    evidence = {
        cid: QualityEvidence(prior, q is not None, 0, 0, prior) for cid, _, _, prior, q in rows
    }
    return {cid: prior for cid, _, _, prior, _ in rows if prior != default}, evidence, bucket


def _with(ctx: RoutingContext, **changes: Any) -> RoutingContext:
    from dataclasses import replace

    return replace(ctx, **changes)


def _past_a_deadline(head: QueueHead, now: datetime) -> bool:
    """Worth `settle_overdue`'s look (which decides, with the attempt count)."""
    return (head.deadline_at is not None and now >= head.deadline_at) or (
        head.queue_deadline_at is not None and now >= head.queue_deadline_at
    )


def _advance_cursors(
    old: Mapping[tuple[str, str], tuple[str, int]],
    heads: QueueHeads,
    ready: set[GroupKey],
    picked: list[fq.QueuedTask],
) -> dict[tuple[str, str], tuple[str, int]]:
    """Each tenant's window moves past its leading groups that were served or could not be
    (parked, backing off); it stops at the first one that could have been served and was not,
    so every user of a tenant with more users than a window gets its turn in index order. A
    tenant whose users all fit in the window needs no cursor."""
    served = {(t.service_class.value, t.tenant_id, t.user_id, int(t.priority)) for t in picked}
    windows: dict[tuple[str, str], list[tuple[int, GroupKey]]] = {}
    for group, rank in heads.ranks.items():
        windows.setdefault((group[0], group[1]), []).append((rank, group))
    out: dict[tuple[str, str], tuple[str, int]] = {}
    for tenant, window in windows.items():
        window.sort()
        if window[-1][0] < heads.window_cap:
            continue  # every user of the tenant was read
        last = old.get(tenant)
        for _, group in window:
            if group in ready and group not in served:
                break
            last = (group[2], int(group[3]))
        if last is not None:
            out[tenant] = last
    return out


def _dump_cursors(cursors: Mapping[tuple[str, str], tuple[str, int]]) -> list[list[Any]]:
    return [[sc, te, us, pr] for (sc, te), (us, pr) in sorted(cursors.items())]


def _parse_cursors(state: Mapping[str, Any] | None) -> dict[tuple[str, str], tuple[str, int]]:
    """The checkpoint's user cursors; anything malformed is dropped (windows start afresh)."""
    out: dict[tuple[str, str], tuple[str, int]] = {}
    for row in (state or {}).get("user_cursors") or []:
        if isinstance(row, list) and len(row) == 4:
            sc, te, us, pr = row
            if all(isinstance(v, str) for v in (sc, te, us)) and isinstance(pr, int):
                out[(sc, te)] = (us, pr)
    return out


def _queued(task: QueueHead) -> fq.QueuedTask:
    cost = fq.estimate_cost_units(
        max(task.duration_ms, 1) / 1000,
        max(task.width, 1),
        max(task.height, 1),
        max(task.sample_count, 1),
    )
    return fq.QueuedTask(
        task_id=str(task.id),
        tenant_id=task.tenant_id,
        user_id=task.user_id,
        project_id=task.project_id,
        service_class=fq.ServiceClass(task.service_class.value),
        priority=float(task.priority),
        cost_units=cost,
        enqueued_at=task.created_at.timestamp(),
    )


@dataclass(slots=True)
class _RoundView:
    """A round's reads: the lease counters (moved as the batch is assigned) and refusals."""

    capacity: RoundCapacity
    circuit_open: dict[str, str]
    quality: QualityTable | None = None  # the aggregates of this round (QualityBook)
    load: Mapping[str, LoadView] = field(default_factory=dict)  # model-server load (LoadBook)


@dataclass(slots=True)
class _Pick:
    """A SELECTED task of the batch on its way to an attempt."""

    task: TaskRecord
    facts: RequeueFacts
    decision: RouteDecisionSnapshot
    plans: Mapping[str, Any]
    group: tuple[str, str, str]
    key: str  # the client request key, fixed before the transaction
    numbers: batch.Numbers
    carrier: dict[str, str]
    rest: list[str] = field(default_factory=list)  # ranked candidates not tried yet
    refused: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)  # refused candidate -> a full window
    cid: str | None = None
    lease: Lease | None = None
    final: RouteDecisionSnapshot | None = None
    span: tracing.OpenSpan = field(default_factory=lambda: tracing.OpenSpan(None))


@dataclass(frozen=True, slots=True)
class _Other:
    """A task of the batch without an attempt: waiting (QUEUED) or failed."""

    task: TaskRecord
    decision: RouteDecisionSnapshot
    target: TaskState
    facts: RequeueFacts


def _signature(decision: RouteDecisionSnapshot) -> Signature:
    return (
        decision.outcome.value,
        tuple((v.candidate.id, v.reason + full_window(v.detail)) for v in decision.verdicts),
    )

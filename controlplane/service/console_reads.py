"""What the web console reads (`controlplane.console`), transport-neutral and scoped by caller.

Every read goes through the same scoping rules as the API (`controlplane.service.access`):
a tenant lists and opens only its own tasks (another tenant's is `NotFound`, exactly like a
missing id); the provider, lease and breaker views need the admin role. The console holds no
SQL: tasks come from `TaskService`, providers and breakers from `ProviderAdminService`, the
capacity picture from the lease store's snapshots, reconciliation from `BillingService`.

The task list filters by tenant and state in the database (`TaskService.list_tasks`); the
provider and time filters apply to the pages read, whose tasks' attempts are read anyway to name
their providers, in one statement per page (`list_tasks` says how far it reads).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from controlplane.domain.scoring import Window, WindowStats
from controlplane.domain.states import TaskState
from controlplane.leases.base import AccountSnapshot, LeaseStore
from controlplane.persistence.catalog import CatalogQueries, HealthEvent
from controlplane.persistence.database import Database
from controlplane.persistence.provider_observations import (
    ProviderObservation,
    ProviderObservations,
)
from controlplane.persistence.records import TaskDetail, TaskEventRecord, TaskRecord
from controlplane.persistence.tasks import TaskQueries
from controlplane.scheduling.health import BreakerStatus, HealthMonitor
from controlplane.service.access import SYSTEM, Caller, ensure_admin
from controlplane.service.providers import ProviderAccountView, ProviderAdminService
from controlplane.service.tasks import ListTasksInput, TaskService

MAX_PAGE = 50
MAX_SCAN_PAGES = 10  # pages read per list call when the time or provider filter drops rows
MAX_EVENTS = 2000  # one timeline; a task has a few dozen


@dataclass(frozen=True, slots=True)
class TaskFilter:
    tenant_id: str | None = None
    state: TaskState | None = None
    provider: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    page_token: str | None = None


@dataclass(frozen=True, slots=True)
class TaskRow:
    task: TaskRecord
    providers: tuple[str, ...]  # of its attempts, in attempt order


@dataclass(frozen=True, slots=True)
class Timeline:
    detail: TaskDetail
    events: tuple[TaskEventRecord, ...]
    account_names: dict[int, str]  # provider_account_id -> "provider/account/region"
    observations: tuple[ProviderObservation, ...] = ()  # every poll and callback stored


@dataclass(frozen=True, slots=True)
class CandidateHealth:
    candidate_id: str
    windows: tuple[tuple[Window, WindowStats], ...]


@dataclass(frozen=True, slots=True)
class ProvidersPage:
    accounts: tuple[ProviderAccountView, ...]
    prices: dict[tuple[str, str, str], tuple[str, int | None, str]]  # (prov, acct, model)
    health: tuple[CandidateHealth, ...]
    leases: tuple[AccountSnapshot, ...]


@dataclass(frozen=True, slots=True)
class BreakersPage:
    breakers: tuple[BreakerStatus, ...]
    history: tuple[tuple[str, HealthEvent], ...]  # (account name, event), newest first


class ConsoleReads:
    """The console's reads; `providers`, `monitor` and `leases` are None on an API-only replica."""

    def __init__(
        self,
        tasks: TaskService,
        db: Database,
        *,
        providers: ProviderAdminService | None = None,
        monitor: HealthMonitor | None = None,
        leases: LeaseStore | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._tasks = tasks
        # Reads the API has no RPC for; the scoping check is always `tasks.get_task` first.
        self._queries, self._catalog = TaskQueries(db), CatalogQueries(db)
        self._observations = ProviderObservations(db)
        self._providers, self._monitor, self._leases = providers, monitor, leases
        self._clock = clock

    async def account_names(self) -> dict[int, str]:
        return {
            a.id: "/".join(p for p in (a.provider, a.account_name, a.region) if p)
            for a in await self._catalog.accounts()
        }

    async def list_tasks(
        self, query: TaskFilter, caller: Caller = SYSTEM
    ) -> tuple[list[TaskRow], str | None]:
        """Up to `MAX_PAGE` matching tasks, newest first, and the token to continue after them.

        Tenant and state filter in the database; time and provider on the pages read, at most
        `MAX_SCAN_PAGES` of them per call (ids ascend with creation: a task created before
        `since` ends the scan)."""
        rows: list[TaskRow] = []
        token = query.page_token
        provider_of = {a.id: a.provider for a in await self._catalog.accounts()}
        for _ in range(MAX_SCAN_PAGES):
            records, token = await self._tasks.list_tasks(
                ListTasksInput(query.tenant_id, query.state, MAX_PAGE, token), caller
            )
            older = query.since is not None and any(r.created_at < query.since for r in records)
            records = [
                r
                for r in records
                if (query.since is None or r.created_at >= query.since)
                and (query.until is None or r.created_at < query.until)
            ]
            # One read for the page's attempts, whatever its size (not one `get_task` per row);
            # `list_tasks` has scoped the page to the caller already.
            attempts = await self._queries.attempts_of_tasks([r.id for r in records])
            for r in records:
                providers = tuple(
                    provider_of.get(a.provider_account_id, "?") for a in attempts.get(r.id, ())
                )
                if not query.provider or query.provider in providers:
                    rows.append(TaskRow(r, providers))
            if token is None or older or len(rows) >= MAX_PAGE:
                return rows, None if older else token
        return rows, token

    async def timeline(self, task_id: int, caller: Caller = SYSTEM) -> Timeline:
        detail = await self._tasks.get_task(task_id, caller)  # NotFound for another tenant's
        events = await self._queries.task_events(task_id, limit=MAX_EVENTS)
        seen = await self._observations.for_attempts([a.id for a in detail.attempts])
        return Timeline(detail, tuple(events), await self.account_names(), tuple(seen))

    async def visible(self, task_id: int, caller: Caller = SYSTEM) -> None:
        """NotFound unless the task exists in the caller's scope."""
        await self._tasks.get_task(task_id, caller)

    def watch(
        self, task_id: int, after_seq: int, caller: Caller = SYSTEM
    ) -> AsyncIterator[TaskEventRecord]:
        """The task's events after `after_seq`, live, until it is terminal (WatchTask's)."""
        return self._tasks.watch(task_id, after_seq, caller)

    async def providers(self, caller: Caller = SYSTEM) -> ProvidersPage:
        ensure_admin(caller, "console providers")
        accounts = await self._providers.list_providers(caller) if self._providers else []
        prices: dict[tuple[str, str, str], tuple[str, int | None, str]] = {}
        for rec in await self._catalog.effective_capabilities(self._clock()):
            key = (rec.account.provider, rec.account.account_name, rec.model)
            prices[key] = (rec.price_version or "", rec.price_micros_per_unit, rec.currency or "")
        snapshots: list[AccountSnapshot] = []
        if self._leases is not None:
            for account in sorted(await self._leases.accounts()):
                snapshots.append(await self._leases.snapshot(account))
        return ProvidersPage(tuple(accounts), prices, self._health(), tuple(snapshots))

    def _health(self) -> tuple[CandidateHealth, ...]:
        if self._monitor is None:
            return ()
        held = self._monitor.window_stats()  # this replica's EWMA windows, on its clock
        return tuple(
            CandidateHealth(candidate_id, tuple((w, held[candidate_id][w]) for w in Window))
            for candidate_id in sorted(held)
        )

    async def breakers(
        self, caller: Caller = SYSTEM, provider: str = "", history: int = 200
    ) -> BreakersPage:
        """Every breaker this replica knows (of `provider` when given) and the recorded
        transitions, newest first (of that provider's accounts)."""
        ensure_admin(caller, "console breakers")
        statuses: Sequence[BreakerStatus] = ()
        if self._providers is not None:
            statuses = await self._providers.provider_health(provider, caller)
        accounts = await self._catalog.accounts()
        names = {
            a.id: "/".join(p for p in (a.provider, a.account_name, a.region) if p) for a in accounts
        }
        if provider:
            ids = [a.id for a in accounts if a.provider == provider]
            events = [
                e
                for i in ids
                for e in await self._catalog.health_events(provider_account_id=i, limit=history)
            ]
            events.sort(key=lambda e: e.occurred_at, reverse=True)
        else:
            events = await self._catalog.health_events(limit=history)
        return BreakersPage(
            tuple(statuses),
            tuple(
                (names.get(e.provider_account_id, str(e.provider_account_id)), e) for e in events
            ),
        )

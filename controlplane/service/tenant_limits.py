"""Each tenant's limits beside its current use (design 9.12.1-9.12.3): what the console's
``/tenants`` page and the ``tenant_limit`` / ``tenant_use`` gauges show.

Limits come from the active tenants document (`TenantBook`): per class the entitlement, DRR
weight, ``max_in_flight`` and ``max_queued``, and the CreateTask rate. Use comes from PostgreSQL
(`tenant_configs.tenant_use`): tasks in flight and queued per class, as the dispatcher counts
them, and tasks created over the last minute.

Which tenants: every tenant the document names, then every other tenant with tasks in flight or
queued (under the document's default entry). The console lists up to `MAX_ROWS` tenants. The
gauges keep label cardinality bounded by the document, not by traffic: a tenant the document
does not name is summed into ``tenant="(default)"``, and past `MAX_GAUGE_TENANTS` named tenants
the rest into ``tenant="(other)"``; classes and limit names are closed sets.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from controlplane.domain.tenants import TenantEntry, Tenants
from controlplane.persistence import tenant_configs as store
from controlplane.persistence.database import Database
from controlplane.service.access import SYSTEM, Caller, ensure_admin
from controlplane.service.tenants import CREATE_MAX_AGE_S, TenantBook
from vidroute_core.spec import ServiceClass

RATE_WINDOW = timedelta(minutes=1)
MAX_ROWS = 500
MAX_GAUGE_TENANTS = 100
DEFAULT_LABEL = "(default)"
OTHER_LABEL = "(other)"


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class ClassLimits:
    """One class of one tenant: entitled or not, its limits, and its use now."""

    service_class: str
    entitled: bool
    weight: float
    max_in_flight: int | None
    max_queued: int | None
    in_flight: int
    queued: int


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """One tenant's row: `named` False when the document's default entry applies to it."""

    tenant: str
    named: bool
    classes: tuple[ClassLimits, ...]
    create_per_second: float | None  # None: no CreateTask limit
    create_burst: int | None
    created_last_minute: int

    @property
    def create_rate(self) -> float:
        """CreateTask's observed rate over the last minute, per second."""
        return self.created_last_minute / RATE_WINDOW.total_seconds()


@dataclass(frozen=True, slots=True)
class TenantLimitsPage:
    version: str
    tenants: tuple[TenantLimits, ...]
    more: int = 0  # tenants left off past MAX_ROWS
    creates_capped: bool = False  # created counts are lower bounds (see `tenant_use`)
    at: datetime = field(default_factory=_utcnow)


def _row(tenant: str, entry: TenantEntry, named: bool, use: store.TenantUse) -> TenantLimits:
    classes = []
    for sc in ServiceClass:
        share = entry.service_classes.get(sc)
        key = (tenant, sc.value)
        classes.append(
            ClassLimits(
                sc.value,
                share is not None,
                share.weight if share else 0.0,
                share.max_in_flight if share else None,
                share.max_queued if share else None,
                use.in_flight.get(key, 0),
                use.queued.get(key, 0),
            )
        )
    rate = entry.create_rate
    return TenantLimits(
        tenant,
        named,
        tuple(classes),
        rate.per_second if rate else None,
        rate.burst if rate else None,
        use.created.get(tenant, 0),
    )


def limits_page(
    tenants: Tenants, use: store.TenantUse, at: datetime, max_rows: int | None = MAX_ROWS
) -> TenantLimitsPage:
    """Named tenants first (document order), then the others with use, busiest first; at most
    `max_rows` (None: all, as the gauges need every tenant's use summed)."""
    active = {t for t, _ in use.in_flight} | {t for t, _ in use.queued} | set(use.created)
    others = sorted(active - set(tenants.tenants), key=lambda t: (-_load(t, use), t))
    rows = [_row(t, e, True, use) for t, e in tenants.tenants.items()]
    rows += [_row(t, tenants.default, False, use) for t in others]
    shown = rows if max_rows is None else rows[:max_rows]
    return TenantLimitsPage(
        tenants.version, tuple(shown), len(rows) - len(shown), use.creates_capped, at
    )


def _load(tenant: str, use: store.TenantUse) -> int:
    inside = sum(n for (t, _), n in use.in_flight.items() if t == tenant)
    return inside + sum(n for (t, _), n in use.queued.items() if t == tenant)


# (tenant label, class or "", limit/use name) -> value
GaugeRows = Mapping[tuple[str, str, str], float]


def gauge_rows(page: TenantLimitsPage) -> tuple[dict[tuple[str, str, str], float], GaugeRows]:
    """``(limits, uses)`` with bounded labels (module docstring): limits are those of the named
    tenant or the default entry; use is summed over the tenants a label stands for."""
    limits: dict[tuple[str, str, str], float] = {}
    uses: dict[tuple[str, str, str], float] = {}
    named = 0
    for row in page.tenants:
        if row.named:
            named += 1
        label = (
            row.tenant
            if row.named and named <= MAX_GAUGE_TENANTS
            else (DEFAULT_LABEL if not row.named else OTHER_LABEL)
        )
        if label != OTHER_LABEL:
            for c in row.classes:
                if c.entitled:
                    limits[(label, c.service_class, "weight")] = c.weight
                    if c.max_in_flight is not None:
                        limits[(label, c.service_class, "max_in_flight")] = c.max_in_flight
                    if c.max_queued is not None:
                        limits[(label, c.service_class, "max_queued")] = c.max_queued
            if row.create_per_second is not None:
                limits[(label, "", "create_per_second")] = row.create_per_second
        for c in row.classes:
            for name, n in (("in_flight", c.in_flight), ("queued", c.queued)):
                key = (label, c.service_class, name)
                uses[key] = uses.get(key, 0.0) + n
        key = (label, "", "create_per_second")
        uses[key] = uses.get(key, 0.0) + row.create_rate
    return limits, uses


class TenantLimitsService:
    """Reads the limits page (admin) from the active document and the database's use."""

    def __init__(
        self, db: Database, book: TenantBook, *, clock: Callable[[], datetime] = _utcnow
    ) -> None:
        self._db, self._book, self._clock = db, book, clock

    async def page(
        self, caller: Caller = SYSTEM, *, max_rows: int | None = MAX_ROWS
    ) -> TenantLimitsPage:
        ensure_admin(caller, "TenantLimits")
        tenants = await self._book.current(CREATE_MAX_AGE_S)
        now = self._clock()
        async with self._db.reads() as reads:
            use = await reads.tenant_use(now - RATE_WINDOW)
        return limits_page(tenants, use, now, max_rows)


def gauge_refresh(
    service: TenantLimitsService,
    sink: Callable[[GaugeRows, GaugeRows], None],
) -> Callable[[], Awaitable[None]]:
    """One metrics pass: read the page as the system and hand its bounded rows to `sink`
    (`ControlPlaneMetrics.tenant_limits`)."""

    async def refresh() -> None:
        sink(*gauge_rows(await service.page(max_rows=None)))

    return refresh

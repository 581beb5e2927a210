"""Scrape-time state of the control plane's metrics (design 9.24): leases, windows, account
limits and breakers.

Capacity, active leases, unknown slots, each provider account's limit and use per lease
dimension (`scheduling.account_usage`) and breaker states are read when Prometheus scrapes, by
`StateCollector` (registered by `ControlPlaneMetrics`), from the lease store and the breaker
registry, so a gauge is never stale or forgotten. The scrape runs on the HTTP server's thread;
the lease store is async, so it is read on the control plane's loop with a deadline, and the
last good answer stands in when that is impossible or slow.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controlplane.leases.base import LeaseStore
from controlplane.leases.reconciler import Drift

if TYPE_CHECKING:  # read at scrape time through `StateSources.accounts`
    from controlplane.scheduling.account_usage import AccountUsage

T = TypeVar("T")

__all__ = [
    "CIRCUIT_VALUES",
    "CircuitGauge",
    "LeaseGauge",
    "StateCollector",
    "StateSources",
    "WindowGauge",
    "circuit_gauges",
    "drift_deltas",
    "lease_gauges",
    "split_lease_account",
    "window_gauges",
]

log = logging.getLogger(__name__)

# Breaker states as numbers an alert can compare (0 closed, 1 half open, 2 open).
CIRCUIT_VALUES = {"CLOSED": 0.0, "HALF_OPEN": 1.0, "OPEN": 2.0}


@dataclass(frozen=True, slots=True)
class LeaseGauge:
    """One (provider, model) row of lease state read at scrape time."""

    provider: str
    model: str
    capacity: int
    active: int
    unknown: int


@dataclass(frozen=True, slots=True)
class WindowGauge:
    """One account window's use and limit read at scrape time (9.11; limit None: not set)."""

    provider: str
    account: str
    window: str
    used: int
    limit: int | None


@dataclass(frozen=True, slots=True)
class CircuitGauge:
    provider: str
    model: str
    operation: str
    state: str


@dataclass(frozen=True)
class StateSources:
    """Where the scrape-time gauges come from; each is optional (an API-only replica has none).

    Whole when built (frozen): the composition root builds it once the parts it reads exist
    and registers a `StateCollector` over it; nothing assigns a source afterwards."""

    leases: Callable[[], Awaitable[Sequence[LeaseGauge]]] | None = None
    windows: Callable[[], Awaitable[Sequence[WindowGauge]]] | None = None
    circuits: Callable[[], Sequence[CircuitGauge]] | None = None
    accounts: Callable[[], Awaitable[Sequence[AccountUsage]]] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    timeout_s: float = 2.0


class StateCollector(Collector):
    """Reads lease and breaker state when Prometheus scrapes (on the HTTP server's thread)."""

    def __init__(self, sources: StateSources) -> None:
        self.sources = sources
        self._last: dict[str, Sequence[Any]] = {"leases": (), "windows": (), "accounts": ()}

    def describe(self) -> Iterable[Any]:
        # names only, so registration checks duplicates
        return [*self._families([], [], []), *self._account_families([])]

    def collect(self) -> Iterable[Any]:
        leases = self._read("leases", self.sources.leases)
        windows = self._read("windows", self.sources.windows)
        accounts = self._read("accounts", self.sources.accounts)
        return [
            *self._families(leases, windows, self._circuits()),
            *self._account_families(accounts),
        ]

    def _read(self, name: str, source: Callable[[], Awaitable[Sequence[T]]] | None) -> Sequence[T]:
        """`source`'s answer, read on the control plane's loop with a deadline; the last good
        one when it cannot be read now."""
        src = self.sources
        if source is None or src.loop is None or src.loop.is_closed():
            return self._last[name]
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is src.loop:  # scraped from the loop itself: cannot wait on it, use the last
            return self._last[name]
        try:
            future = asyncio.run_coroutine_threadsafe(_call(source), src.loop)
            self._last[name] = future.result(src.timeout_s)
        except Exception:  # a slow or failing store never fails the scrape
            log.warning("%s state for metrics unavailable", name, exc_info=True)
        return self._last[name]

    @staticmethod
    def _account_families(rows: Sequence[AccountUsage]) -> Iterator[GaugeMetricFamily]:
        labels = ["provider", "account", "dimension"]
        limit = GaugeMetricFamily(
            "provider_account_limit_slots",
            "An account's concurrency limit per lease dimension (account, model:, modality:,"
            " region:)",
            labels=labels,
        )
        used = GaugeMetricFamily(
            "provider_account_used_slots",
            "Slots held now in an account's lease dimension (-1: the store was unreadable)",
            labels=labels,
        )
        for row in rows:
            limit.add_metric([row.provider, row.account, row.dimension], row.limit)
            used.add_metric([row.provider, row.account, row.dimension], row.used)
        yield from (limit, used)

    def _circuits(self) -> Sequence[CircuitGauge]:
        if self.sources.circuits is None:
            return ()
        try:
            return self.sources.circuits()
        except Exception:
            log.warning("breaker state for metrics unavailable", exc_info=True)
            return ()

    @staticmethod
    def _families(
        leases: Sequence[LeaseGauge],
        windows: Sequence[WindowGauge],
        circuits: Sequence[CircuitGauge],
    ) -> Iterator[GaugeMetricFamily]:
        pm = ["provider", "model"]
        capacity = GaugeMetricFamily(
            "provider_capacity_slots", "Concurrency slots configured", labels=pm
        )
        active = GaugeMetricFamily("provider_active_leases", "Leases held now", labels=pm)
        unknown = GaugeMetricFamily(
            "provider_unknown_submission_slots", "Slots held by SUBMIT_UNKNOWN attempts", labels=pm
        )
        for row in leases:
            capacity.add_metric([row.provider, row.model], row.capacity)
            active.add_metric([row.provider, row.model], row.active)
            unknown.add_metric([row.provider, row.model], row.unknown)
        circuit = GaugeMetricFamily(
            "provider_circuit_state",
            "Breaker state: 0 closed, 1 half open, 2 open",
            labels=["provider", "model", "operation"],
        )
        for c in circuits:
            circuit.add_metric([c.provider, c.model, c.operation], CIRCUIT_VALUES.get(c.state, 2.0))
        paw = ["provider", "account", "window"]
        used = GaugeMetricFamily(
            "provider_window_used", "Use of an account's rate or budget window now", labels=paw
        )
        limit = GaugeMetricFamily(
            "provider_window_limit", "Limit of an account's rate or budget window", labels=paw
        )
        for w in windows:
            used.add_metric([w.provider, w.account, w.window], w.used)
            if w.limit is not None:
                limit.add_metric([w.provider, w.account, w.window], w.limit)
        yield from (capacity, active, unknown, circuit, used, limit)


async def _call(source: Callable[[], Awaitable[Sequence[T]]]) -> Sequence[T]:
    return await source()


def split_lease_account(account: str) -> str:
    """The provider of a lease account scope ``provider:account``."""
    return account.partition(":")[0]


def _model_of(dimension: str) -> str | None:
    """The model of a lease dimension ``model:<name>``; None for the account total."""
    kind, sep, model = dimension.partition(":")
    return model if sep and kind == "model" else None


def drift_deltas(drifts: Iterable[Drift]) -> dict[tuple[str, str], int]:
    """A reconciliation pass's model-dimension corrections by (provider, model)."""
    out: dict[tuple[str, str], int] = defaultdict(int)
    for d in drifts:
        model = _model_of(d.dimension)
        if model is not None:
            out[(split_lease_account(d.account), model)] += d.delta
    return dict(out)


async def lease_gauges(store: LeaseStore) -> list[LeaseGauge]:
    """Capacity, held and unknown slots per (provider, model), summed over the accounts."""
    rows: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for account in await store.accounts():
        snap = await store.snapshot(account)
        provider = split_lease_account(account)
        for dimension, capacity in snap.capacity.items():
            if (model := _model_of(dimension)) is not None:
                row = rows[(provider, model)]
                row[0] += capacity
                row[1] += snap.used.get(dimension, 0)
        for lease in snap.leases:
            if lease.unknown:
                for dim in lease.dimensions:
                    if (model := _model_of(dim.key)) is not None:
                        rows[(provider, model)][2] += lease.slots
    return [LeaseGauge(p, m, c, a, u) for (p, m), (c, a, u) in sorted(rows.items())]


async def window_gauges(store: LeaseStore) -> list[WindowGauge]:
    """Every account's window use and limit, for the accounts that ever carried windows."""
    rows: list[WindowGauge] = []
    for account in await store.accounts():
        uses = await store.window_usage(account)
        if all(u.used == 0 and u.limit is None for u in uses):
            continue  # an account without windows: no series
        provider, _, name = account.partition(":")
        rows += [WindowGauge(provider, name, u.window, u.used, u.limit) for u in uses]
    return rows


def circuit_gauges(statuses: Iterable[Any]) -> list[CircuitGauge]:
    """`HealthMonitor.statuses()` rows -> provider_circuit_state rows (worst state per labels)."""
    worst: dict[tuple[str, str, str], str] = {}
    for status in statuses:
        key = (status.key.provider, status.key.model, status.key.operation.value)
        state = str(status.state.value)
        if CIRCUIT_VALUES.get(state, 2.0) >= CIRCUIT_VALUES.get(worst.get(key, "CLOSED"), 0.0):
            worst[key] = state
    return [CircuitGauge(p, m, o, s) for (p, m, o), s in sorted(worst.items())]

"""The cost families of design 9.24, computed from the ledgers, refreshed in the background.

``provider_cost_per_success{provider,model}`` and ``provider_retry_cost_micros{provider,model}``
come from the unit-cost aggregate of the provider usage ledger over a rolling window
(`controlplane.persistence.cost_reads`, rules in `controlplane.domain.unit_cost`);
``provider_reconciliation_delta_micros{provider}`` from the latest daily reconciliation (billed
minus expected micros, `controlplane.reconciliation.delta_by_provider`), and the counter
``provider_reconciliation_discrepancies_total{provider,kind}`` from the discrepancy rows written
since the last pass (`controlplane.reconciliation.DiscrepancyCounter`).

`CostGaugeRefresher` reads both once per period (one grouped query each, whatever the traffic)
and hands the figures to a `CostSink` (`ControlPlaneMetrics`), so a scrape only reads the last
values: Prometheus never causes a database query, and a database outage keeps the last figures
(logged) instead of failing the scrape. Every replica computes the same figures from the same
ledger, so the series agree across replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Protocol

from controlplane.domain.unit_cost import gauge_figures
from controlplane.persistence.database import Database

log = logging.getLogger(__name__)

DEFAULT_WINDOW = timedelta(hours=24)
DEFAULT_INTERVAL_S = 60.0


class CostSink(Protocol):
    """Where the figures go (`controlplane.metrics.ControlPlaneMetrics`)."""

    def unit_costs(self, figures: Mapping[tuple[str, str], tuple[int, int]]) -> None:
        """``(provider, model) -> (cost per success, retry cost)`` micros of the window."""

    def reconciliation_deltas(self, deltas: Mapping[str, int]) -> None:
        """``provider -> billed - expected`` micros of the latest reconciled day."""

    def reconciliation_discrepancies_written(self, counts: Mapping[tuple[str, str], int]) -> None:
        """``(provider, kind) -> discrepancy rows`` written since the last call."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


class CostGaugeRefresher:
    """Refreshes the cost gauges every `interval_s` from the ledgers (module docstring)."""

    def __init__(
        self,
        db: Database,
        sink: CostSink,
        *,
        window: timedelta = DEFAULT_WINDOW,
        interval_s: float = DEFAULT_INTERVAL_S,
        deltas: Callable[[], Awaitable[Mapping[str, int]]] | None = None,
        discrepancies: Callable[[], Awaitable[Mapping[tuple[str, str], int]]] | None = None,
        clock: Callable[[], datetime] = _utcnow,
        also: Sequence[Callable[[], Awaitable[None]]] = (),
    ) -> None:
        self._db, self._sink = db, sink
        self._window, self._interval = window, interval_s
        self._deltas, self._clock = deltas, clock
        # Other gauges refreshed on the same period (e.g. the tenants' limits and use).
        self._also = tuple(also)
        self._discrepancies = discrepancies
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        """One pass; a failing source keeps its last figures (logged), never raises."""
        end = self._clock()
        try:
            async with self._db.reads() as reads:
                rows = await reads.unit_costs(end - self._window, end)
            self._sink.unit_costs(gauge_figures(rows))
        except Exception:  # an outage must not stop the loop; the next pass retries
            log.warning("unit costs for metrics unavailable", exc_info=True)
        if self._deltas is not None:
            try:
                self._sink.reconciliation_deltas(await self._deltas())
            except Exception:
                log.warning("reconciliation deltas for metrics unavailable", exc_info=True)
        for refresh in self._also:
            try:
                await refresh()
            except Exception:
                log.warning("gauges for metrics unavailable", exc_info=True)
        if self._discrepancies is not None:
            try:
                self._sink.reconciliation_discrepancies_written(await self._discrepancies())
            except Exception:  # the counter source keeps its place: the next pass catches up
                log.warning("reconciliation discrepancies for metrics unavailable", exc_info=True)

    async def _loop(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self._interval)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="cost-gauges")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

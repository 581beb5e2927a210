"""The cost families of 9.24 come from the ledgers, refreshed in the background (SQLite and
PostgreSQL): provider_cost_per_success / provider_retry_cost_micros equal the unit-cost table of
a scripted usage ledger, provider_reconciliation_delta_micros the latest reconciled day, and an
unreachable database keeps the last figures instead of failing."""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from controlplane.bootstrap import Settings, start_control_plane
from controlplane.metrics import ControlPlaneMetrics
from controlplane.persistence.database import Database
from controlplane.reconciliation import DiscrepancyCounter, delta_by_provider, run_day
from controlplane.service.cost_gauges import CostGaugeRefresher
from tests.integration.api.test_billing_api import CLOCK, _Bill, _script_usage

pytestmark = pytest.mark.timeout(60)


def _value(m: ControlPlaneMetrics, name: str, **labels: str) -> float | None:
    for family in m.registry.collect():
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None


async def test_gauges_equal_the_unit_cost_table_and_the_reconciled_delta(db: Database) -> None:
    """After one refresh: runway/gen4_turbo 450000 per success and 100000 retry, veo 3200000;
    the reconciliation delta of runway is the 250000 charged for a job nobody made."""
    await _script_usage(db)
    await run_day(db, {"runway": _Bill()}, CLOCK.date() - timedelta(days=1), now=CLOCK)
    metrics = ControlPlaneMetrics()
    refresher = CostGaugeRefresher(
        db, metrics, deltas=lambda: delta_by_provider(db), clock=lambda: CLOCK
    )
    await refresher.refresh()
    rw = {"provider": "runway", "model": "gen4_turbo"}
    assert _value(metrics, "provider_cost_per_success", **rw) == 450_000
    assert _value(metrics, "provider_retry_cost_micros", **rw) == 100_000
    veo = {"provider": "veo", "model": "veo-3.1"}
    assert _value(metrics, "provider_cost_per_success", **veo) == 3_200_000
    assert _value(metrics, "provider_reconciliation_delta_micros", provider="runway") == 250_000


async def test_the_loop_refreshes_and_an_outage_keeps_the_last_figures(db: Database) -> None:
    """The started loop sets the gauges (polled with a deadline); a pass against an unreachable
    database logs and leaves them as they were; stop() ends the loop."""
    await _script_usage(db)
    metrics = ControlPlaneMetrics()
    refresher = CostGaugeRefresher(db, metrics, interval_s=0.05, clock=lambda: CLOCK)
    refresher.start()
    rw = {"provider": "runway", "model": "gen4_turbo"}
    async with asyncio.timeout(10):
        while _value(metrics, "provider_cost_per_success", **rw) != 450_000:  # noqa: ASYNC110 - a gauge has no event to wait on
            await asyncio.sleep(0.02)
    await refresher.stop()
    gone = Database.from_url("postgresql+asyncpg://postgres@127.0.0.1:9/nowhere")
    try:
        await CostGaugeRefresher(gone, metrics, clock=lambda: CLOCK).refresh()
    finally:
        await gone.dispose()
    assert _value(metrics, "provider_cost_per_success", **rw) == 450_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_control_plane_process_serves_the_ledger_figures(tmp_path: Path) -> None:
    """start_control_plane with /metrics on: usage written to its database shows up as
    provider_cost_per_success on a later scrape (the refresher's period, time-scaled)."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'vidroute.db'}"
    port = _free_port()
    server = await start_control_plane(
        Settings(
            database_url=url,
            listen="127.0.0.1:0",
            api_only=True,  # no adapters: the ledger figures need none
            metrics_listen=f"127.0.0.1:{port}",
            # The 60 s refresh period becomes 1.2 s. Not less: every periodic loop of the
            # control plane scales alike, and on SQLite each of their reads takes the file's
            # write lock, which this test's own writer then has to win (it lost for 30 s at 0.005).
            time_scale=0.02,
        )
    )
    db = Database.from_url(url)
    try:
        await _script_usage(db, now=datetime.now(UTC))
        wanted = 'provider_cost_per_success{model="gen4_turbo",provider="runway"} 450000.0'
        async with httpx.AsyncClient() as http, asyncio.timeout(20):
            while wanted not in (await http.get(f"http://127.0.0.1:{port}/metrics")).text:  # noqa: ASYNC110 - polled over HTTP
                await asyncio.sleep(0.1)
    finally:
        await db.dispose()
        await server.stop(grace=1.0)


async def test_discrepancy_rows_are_counted_once_by_provider_and_kind(db: Database) -> None:
    """The counter adds each stored discrepancy row once (by the run's provider and the row's
    kind), however many passes read it; a new day's rows add to it."""
    await _script_usage(db)
    await run_day(db, {"runway": _Bill()}, CLOCK.date() - timedelta(days=1), now=CLOCK)
    metrics = ControlPlaneMetrics()
    refresher = CostGaugeRefresher(
        db, metrics, discrepancies=DiscrepancyCounter(db), clock=lambda: CLOCK
    )
    name, labels = (
        "provider_reconciliation_discrepancies_total",
        {
            "provider": "runway",
            "kind": "CHARGE_WITHOUT_LOCAL_JOB",
        },
    )
    await refresher.refresh()
    await refresher.refresh()
    assert _value(metrics, name, **labels) == 1
    await run_day(db, {"runway": _Bill()}, CLOCK.date() - timedelta(days=2), now=CLOCK)
    await refresher.refresh()
    assert _value(metrics, name, **labels) == 2

"""The providers page shows this replica's health windows through HealthMonitor's public read."""

from __future__ import annotations

import httpx
import pytest

from controlplane.api.auth import Authenticator
from controlplane.console.app import Console
from controlplane.domain.breaker import BreakerConfig, BreakerKey, BreakerRegistry, Operation
from controlplane.domain.scoring import Window
from controlplane.persistence.database import Database
from controlplane.scheduling.health import HealthMonitor
from controlplane.service.console_reads import ConsoleReads
from controlplane.service.tasks import TaskService

pytestmark = pytest.mark.timeout(60)

SUBMIT = BreakerKey("runway", "prod-us", "us", "gen4.5", Operation.SUBMIT)
AT = 1_000.0  # the monitor's clock, far from the wall clock the console's reads run on


async def test_the_providers_page_reads_every_window_on_the_monitors_clock(db: Database) -> None:
    """Four finished jobs and one refused submit show as 5 samples at 0.8 success in each of
    the four windows, read at the monitor's own time (not decayed to the wall clock)."""
    monitor = HealthMonitor(BreakerRegistry(BreakerConfig(), lambda: AT), clock=lambda: AT)
    for _ in range(4):
        monitor.observe_generation(SUBMIT, succeeded=True, duration_s=40.0, cost_micros=500_000)
    await monitor.record_outcome(SUBMIT, "PROVIDER_OVERLOADED", 0.2)
    reads = ConsoleReads(TaskService(db), db, monitor=monitor)
    page = await reads.providers()
    (health,) = page.health
    assert health.candidate_id == "runway/gen4.5/prod-us"
    assert [w for w, _ in health.windows] == list(Window)
    for _, stats in health.windows:
        assert stats.effective_samples == pytest.approx(5.0)
        assert stats.success_rate == pytest.approx(0.8)
        assert stats.mean_latency_s == pytest.approx(40.0)
    console = Console(Authenticator({}), reads)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=console.app), base_url="http://console.test"
    ) as browser:
        html = (await browser.get("/providers")).text
    assert "runway/gen4.5/prod-us" in html
    assert html.count("<td>0.800</td>") == len(Window)

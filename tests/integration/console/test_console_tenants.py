"""The console's tenants page and the tenant gauges: each tenant's entitlements, weights and
caps from the active tenants document beside its use now (in flight and queued per class,
CreateTask over the last minute), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import select, update

from controlplane.api.auth import Authenticator
from controlplane.console.app import Console
from controlplane.domain.states import TaskState
from controlplane.metrics import ControlPlaneMetrics
from controlplane.persistence.database import Database
from controlplane.persistence.models import generation_tasks as T
from controlplane.service.console_reads import ConsoleReads
from controlplane.service.tasks import TaskService
from controlplane.service.tenant_limits import TenantLimitsService, gauge_refresh
from controlplane.service.tenants import TenantBook, TenantConfigService
from tests.integration.scheduling.support import NOW
from tests.integration.scheduling.test_fair_dispatch import bulk_queue

pytestmark = pytest.mark.timeout(60)

DOCUMENT = json.dumps(
    {
        "version": "t-console",
        "default": {"service_classes": {"STANDARD": {"weight": 1}}},
        "tenants": {
            "acme": {
                "service_classes": {
                    "STANDARD": {"weight": 2, "max_in_flight": 3},
                    "BATCH": {"weight": 1, "max_queued": 5},
                },
                "create_rate": {"per_second": 5, "burst": 10},
            }
        },
    }
)


async def seeded(db: Database) -> TenantLimitsService:
    """acme: 4 STANDARD tasks, one of them RUNNING; zed (not in the document): 2 queued; all
    created at NOW, and the page read 30 s after."""
    book = TenantBook(db)
    await TenantConfigService(db, book).publish(DOCUMENT)
    await bulk_queue(db, "acme", 4)
    await bulk_queue(db, "zed", 2)
    async with db.unit(NOW) as u:
        first = (await u.conn.execute(select(T.c.id).where(T.c.tenant_id == "acme"))).scalar()
        await u.conn.execute(
            update(T).where(T.c.id == first).values(status=TaskState.RUNNING.value)
        )
    return TenantLimitsService(db, book, clock=lambda: NOW + timedelta(seconds=30))


async def test_the_page_lists_limits_beside_use(db: Database) -> None:
    """acme's row shows its entitlements and weights, 1 / 3 in flight and 3 queued in STANDARD,
    INTERACTIVE not entitled, 4 creates in the last minute against 5/s; zed appears under the
    default entry with its 2 queued."""
    service = await seeded(db)
    console = Console(Authenticator({}), ConsoleReads(TaskService(db), db), tenants=service)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=console.app), base_url="http://console.test"
    ) as browser:
        page = await browser.get("/tenants")
    assert page.status_code == 200
    html = page.text
    assert "document t-console" in html

    def row(tenant: str, cls: str) -> str:
        found = re.search(
            rf'<tr[^>]*data-tenant="{tenant}" data-class="{cls}">(.*?)</tr>', html, re.S
        )
        assert found is not None, html
        return re.sub(r"\s+", " ", found.group(1))

    assert '<td class="weight">2</td>' in row("acme", "STANDARD")
    assert '<td class="in-flight">1 / 3</td>' in row("acme", "STANDARD")
    assert '<td class="queued">3</td>' in row("acme", "STANDARD")
    assert '<td class="entitled">no</td>' in row("acme", "INTERACTIVE")
    assert '<td class="queued">0 / 5</td>' in row("acme", "BATCH")
    assert "0.07 / 5 (burst 10)" in row("acme", "INTERACTIVE")  # 4 creates / 60 s
    assert "(default entry)" in row("zed", "INTERACTIVE")
    assert '<td class="queued">2</td>' in row("zed", "STANDARD")


async def test_the_gauges_carry_limits_and_use_with_bounded_tenants(db: Database) -> None:
    """One metrics pass sets acme's limits and use by name and sums every tenant the document
    does not name under "(default)"; after a document without acme is published, the next pass
    drops acme's series (its use now counts under "(default)") instead of freezing them."""
    service = await seeded(db)
    metrics = ControlPlaneMetrics()
    refresh = gauge_refresh(service, metrics.tenant_limits)
    await refresh()
    limit, use = metrics.tenant_limit, metrics.tenant_use
    assert limit.labels("acme", "STANDARD", "max_in_flight")._value.get() == 3
    assert limit.labels("acme", "", "create_per_second")._value.get() == 5
    assert use.labels("acme", "STANDARD", "in_flight")._value.get() == 1
    assert use.labels("(default)", "STANDARD", "queued")._value.get() == 2
    assert limit.labels("(default)", "STANDARD", "weight")._value.get() == 1
    tenants = {s.labels["tenant"] for f in metrics.registry.collect() for s in f.samples
               if f.name in {"tenant_limit", "tenant_use"}}  # fmt: skip
    assert tenants == {"acme", "(default)"}
    plain = json.dumps({"version": "t-plain", "default": json.loads(DOCUMENT)["default"]})
    await TenantConfigService(db, TenantBook(db)).publish(plain)
    fresh = TenantLimitsService(db, TenantBook(db), clock=lambda: NOW + timedelta(seconds=30))
    await gauge_refresh(fresh, metrics.tenant_limits)()
    labels = {s.labels["tenant"] for f in metrics.registry.collect() for s in f.samples
              if f.name in {"tenant_limit", "tenant_use"}}  # fmt: skip
    assert labels == {"(default)"}
    assert use.labels("(default)", "STANDARD", "queued")._value.get() == 5

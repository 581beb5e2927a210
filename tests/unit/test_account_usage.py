"""Each account's limits against its use (controlplane.scheduling.account_usage) as the
operators' surfaces read it, and its per-account gauges at scrape time."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence

import pytest

from controlplane.domain.accounts import parse_accounts_document
from controlplane.leases.base import LeaseRequest
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.metrics import ControlPlaneMetrics, StateSources
from controlplane.scheduling.account_usage import AccountUsage, account_usage
from controlplane.scheduling.gather import candidate_dimensions
from controlplane.scheduling.windows import no_limits, window_request
from tests.unit.domain.test_accounts_document import EXAMPLE, runway_candidate

pytestmark = pytest.mark.timeout(30)


async def test_usage_lists_every_dimension_with_its_limit_and_use() -> None:
    """The account total, each model, each limited modality and region, then each rate and
    budget window: the document's limit where it sets one (the model's the smaller with its
    capability), the store's use now."""
    accounts = parse_accounts_document(EXAMPLE)
    store = MemoryLeaseStore()
    gen45, veo = runway_candidate(region="eu", cap=5), runway_candidate("veo3.1", "eu", 2)
    dims = candidate_dimensions(gen45, 4, accounts.limits, "IMAGE_TO_VIDEO")
    windows = window_request(
        accounts.limits("runway", "prod-us"),
        generations=2,
        cost_micros=40,
        minute_ms=60_000,
        day_ms=86_400_000,
        send_allowance_ms=5_000,
    )
    await store.acquire(LeaseRequest("a-1", gen45.lease_account, dims, windows=windows))
    rows = await account_usage(store, [gen45, veo], 4, accounts.limits)
    assert [(r.dimension, r.limit, r.used, r.configured) for r in rows] == [
        ("account", 3, 1, True),
        ("modality:IMAGE_TO_VIDEO", 1, 1, True),
        ("model:gen4.5", 2, 1, True),
        ("model:veo3.1", 2, 0, False),
        ("region:eu", 1, 1, True),
        ("window:submits_per_minute", 60, 1, True),
        ("window:generations_per_day", 1000, 2, True),
        ("window:spend_per_month", 500_000_000, 40, True),
    ]


async def test_without_a_document_the_total_is_the_largest_a_candidate_asks() -> None:
    """An unlisted account reports the defaults' total (max over its models) as not set."""
    rows = await account_usage(
        MemoryLeaseStore(),
        [runway_candidate(cap=2), runway_candidate("veo3.1", cap=6)],
        4,
        no_limits,
    )
    assert [(r.dimension, r.limit, r.configured) for r in rows] == [
        ("account", 6, False),
        ("model:gen4.5", 2, False),
        ("model:veo3.1", 6, False),
    ]


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop on its own thread, as the control plane's is to the scrape thread."""
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, daemon=True)
    thread.start()
    yield running
    running.call_soon_threadsafe(running.stop)
    thread.join(timeout=5)
    running.close()


def test_gauges_show_each_accounts_limit_and_use(loop: asyncio.AbstractEventLoop) -> None:
    """provider_account_limit_slots / provider_account_used_slots per (provider, account,
    dimension), read from the usage source when Prometheus scrapes."""

    async def usage() -> Sequence[AccountUsage]:
        return [AccountUsage("runway", "prod-us", "account", 3, 2, True)]

    m = ControlPlaneMetrics(state=StateSources(loop=loop, accounts=usage))
    labels = {"provider": "runway", "account": "prod-us", "dimension": "account"}
    values = {
        s.name: s.value
        for family in m.registry.collect()
        for s in family.samples
        if s.labels == labels
    }
    assert values == {"provider_account_limit_slots": 3, "provider_account_used_slots": 2}

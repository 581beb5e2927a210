"""The long-lived per-process collections of the scheduler hold at most their bound however many
tasks pass through (issue 20 item 4: the control plane's memory stays flat)."""

from __future__ import annotations

from controlplane.domain.routing.candidates import CompileResult
from controlplane.scheduling.gather import CompileCache
from controlplane.scheduling.parking import Parking
from vidroute_core.adapter import CompiledPlan


def _plan(i: int) -> CompiledPlan:
    return CompiledPlan(
        provider="runway",
        account="prod-us",
        model="gen4.5",
        model_version="1",
        capability_version="cap-1",
        price_version="price-1",
        request_hash=f"h{i}",
        estimated_cost_micros=1_000,
        currency="USD",
        submittable=True,
        transformations=(),
        native_request_json=f'{{"promptText": "take {i}"}}',
    )


def test_the_compile_cache_keeps_at_most_its_size_and_the_newest() -> None:
    """After 10,000 distinct specs through a 256-entry cache it holds 256: the newest."""
    cache = CompileCache(size=256)
    for i in range(10_000):
        cache.put(
            ("runway:prod-us:gen4.5", "cap-1", "price-1", f"spec-{i}"),
            CompileResult(True),
            _plan(i),
        )
    assert len(cache) == 256
    assert cache.get(("runway:prod-us:gen4.5", "cap-1", "price-1", "spec-9999")) is not None
    assert cache.get(("runway:prod-us:gen4.5", "cap-1", "price-1", "spec-0")) is None


def test_parking_remembers_at_most_its_limit_of_outcomes() -> None:
    """100,000 tasks routed and never done leave at most `limit` outcomes, the latest kept."""
    parking = Parking(lambda: 0.0, recheck_s=30.0, limit=1_000)
    signature = ("NO_CAPACITY", (("c1", "NO_CAPACITY"),))
    for task_id in range(100_000):
        parking.stored(task_id, signature)
    assert parking.remembered <= 1_000
    assert parking.outcome(99_999) == signature

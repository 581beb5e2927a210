"""A price below a delivery's expected provider cost is flagged at publication (issue 23)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controlplane.capabilities.publish import AccountConfig, documents_from_file, plan_publication
from controlplane.capabilities.release import Entry, diff
from controlplane.domain.price_floor import price_flags
from controlplane.service.capability_checks import Force, check_release
from vidroute_core.capabilities.loader import Capability


def selfhosted(base_milli: int = 10_000) -> dict[str, Any]:
    """The shipped self-hosted price: 2 800 micros per output second, 8 GPU s per output second
    at 350 micros each, plus `base_milli` thousandths of a GPU second per generation."""
    return {
        "output": {"durations_seconds": [4, 8]},
        "commercial": {
            "currency": "USD",
            "price_version": "gpu-l40s-2026-06",
            "price_micros_per_output_second": 2800,
            "provider_unit": "gpu_seconds",
            "provider_milliunits_per_output_second": 8000,
            "micros_per_provider_unit": 350,
            "provider_milliunits_per_generation": base_milli,
        },
    }


def test_a_base_gpu_time_nobody_priced_is_flagged_per_duration() -> None:
    """4 s: 11 200 estimated against 42 GPU s = 14 700 micros; 8 s: 22 400 against 25 900."""
    assert price_flags(selfhosted()) == (
        "4 s: estimate 11200 micros is below the expected provider cost 14700 micros "
        "(42 gpu_seconds at 350 micros each)",
        "8 s: estimate 22400 micros is below the expected provider cost 25900 micros "
        "(74 gpu_seconds at 350 micros each)",
    )


def test_a_price_that_covers_the_cost_or_no_rate_is_not_flagged() -> None:
    """Without a base time the shipped price equals its cost; no rate, nothing to compare."""
    assert price_flags(selfhosted(0)) == ()
    no_rate = selfhosted()
    no_rate["commercial"]["micros_per_provider_unit"] = 0
    assert price_flags(no_rate) == ()
    covered = selfhosted()
    # 4 s: 14 800 >= 14 700 and 8 s: 29 600 >= 25 900
    covered["commercial"]["price_micros_per_output_second"] = 3700
    assert price_flags(covered) == ()


def test_a_release_diff_carries_the_flags() -> None:
    """The release's change of the model names the flags (publication shows them)."""
    entry = Entry("self_hosted", "gpu", "wan2.2-t2v", "v1", "ga", selfhosted(), "p1", 2800)
    [change] = diff([], [entry])
    assert len(change.price_flags) == 2
    assert change.to_json()["price_flags"] == list(change.price_flags)
    assert type(change).from_json(change.to_json()) == change


ROOT = Path(__file__).resolve().parents[3]
SELF_HOSTED = ROOT / "adapter_sidecars/selfhosted/capabilities/selfhosted-2026-06.yaml"
ACCOUNT = AccountConfig("self_hosted", "gpu", "us", "sidecar:self_hosted")


async def _compiles(caps: Sequence[Capability]) -> list[list[str]]:
    """A sidecar on which every sample compiles (the floor is what is under test)."""
    return [[] for _ in caps]


def _released(docs: list[dict[str, Any]]) -> dict[str, tuple[str, ...]]:
    """The model -> price flags a release of `docs` shows, through the publication's checks."""
    plan = plan_publication(docs, [ACCOUNT], effective_from=datetime(2026, 12, 1, tzinfo=UTC))
    writes = [
        (i, cap, price)
        for i, (cap, price) in enumerate(zip(plan.capabilities, plan.prices, strict=True))
    ]
    checked = asyncio.run(check_release([], writes, (), _compiles, Force()))
    return {c.model: c.price_flags for c in checked.changes}


def test_the_shipped_self_hosted_entries_are_flagged_through_publication() -> None:
    """The shipped entries declare their 10 GPU s base: publishing the file flags every
    duration of both models (4 s: 11 200 estimated against 42 GPU s = 14 700), though
    Describe, which the diff compares, drops the base and the unit rate."""
    flags = _released(documents_from_file(SELF_HOSTED))
    assert set(flags) == {"wan2.2-t2v", "wan2.2-i2v"}
    for model, lines in flags.items():
        assert len(lines) == 9, (model, lines)  # 2..10 s
        assert (
            "4 s: estimate 11200 micros is below the expected provider cost 14700 micros "
            "(42 gpu_seconds at 350 micros each)"
        ) in lines


def test_a_self_hosted_price_covering_the_base_flags_only_the_durations_still_under() -> None:
    """At 3 700 micros per output second the 2 s and 3 s clips (7 400 against 26 GPU s =
    9 100; 11 100 against 11 900) are still under, every longer one covered."""
    docs = documents_from_file(SELF_HOSTED)
    for doc in docs:
        doc["commercial"]["price_micros_per_output_second"] = 3700
        doc["commercial"]["price_version"] = "gpu-l40s-2027-01"
        doc["capability_version"] += "-repriced"
    flags = _released(docs)
    assert flags["wan2.2-t2v"] == (
        "2 s: estimate 7400 micros is below the expected provider cost 9100 micros "
        "(26 gpu_seconds at 350 micros each)",
        "3 s: estimate 11100 micros is below the expected provider cost 11900 micros "
        "(34 gpu_seconds at 350 micros each)",
    )

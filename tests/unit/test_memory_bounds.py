"""The long-lived per-process collections of the scheduler hold at most their bound however many
tasks pass through (issue 20 item 4: the control plane's memory stays flat)."""

from __future__ import annotations

import gc
import json
import tracemalloc

from controlplane.domain.routing.candidates import CompileResult
from controlplane.scheduling.gather import CompileCache, compile_result
from controlplane.scheduling.parking import Parking
from vidroute.adapter.v1 import adapter_pb2 as pb
from vidroute.common.v1 import money_pb2
from vidroute_core.adapter import CompiledPlan
from vidroute_core.wire.adapter import plan_from_proto


def _compiled(i: int, prompt_chars: int) -> pb.CompilePlan:
    """A sidecar's CompilePlan reply as the control plane receives it."""
    body = {"model": "gen4.5", "promptText": f"take {i} " + "x" * prompt_chars, "duration": 5}
    return pb.CompilePlan(
        provider="runway",
        account="prod-us",
        model="gen4.5",
        model_version="2026-06",
        capability_version="runway-2026-06",
        price_version="p-2026-06",
        endpoint="POST /v1/text_to_video",
        native_request_json=json.dumps(body),
        request_hash=f"sha256:{i:064d}",
        transformations=[
            pb.Transformation(
                field=f"output.f{k}", kind=pb.TRANSFORMATION_KIND_EXACT, detail="clamped"
            )
            for k in range(3)
        ],
        estimated_cost=money_pb2.Money(amount_micros=250_000, currency_code="USD"),
        submittable=True,
    )


def _key(i: int) -> tuple[str, str, str, str]:
    return ("runway:prod-us:gen4.5", "runway-2026-06", "p-2026-06", f"sha256:{i:064d}")


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


def test_the_compile_cache_keeps_at_most_its_bytes_whatever_the_prompts() -> None:
    """10,000 plans of 4,000-character prompts through a 1 MiB cache leave at most 1 MiB by its
    own accounting, and the newest entry in it."""
    cache = CompileCache(size=100_000, max_bytes=1024 * 1024)
    for i in range(10_000):
        plan = plan_from_proto(_compiled(i, 4_000))
        cache.put(_key(i), compile_result(plan), plan)
    assert cache.bytes <= 1024 * 1024
    assert 0 < len(cache) < 100
    assert cache.get(_key(9_999)) is not None


def test_the_compile_caches_byte_accounting_matches_what_it_holds() -> None:
    """What 1,000 cached plans really keep alive (tracemalloc) is within 30% of `bytes`, for
    short and for 4,000-character prompts: the byte bound is a bound on memory."""
    for prompt_chars in (100, 4_000):
        replies = [_compiled(i, prompt_chars) for i in range(1_000)]
        cache = CompileCache(size=100_000, max_bytes=1 << 40)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i, reply in enumerate(replies):
                plan = plan_from_proto(reply)
                cache.put(_key(i), compile_result(plan), plan)
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert 0.7 * cache.bytes <= held <= 1.3 * cache.bytes, (prompt_chars, held, cache.bytes)
